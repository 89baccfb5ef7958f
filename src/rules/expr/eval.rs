//! Evaluation under three-valued logic, and the series and number helpers it uses.

use super::{BinOp, Env, EvalError, Expr, Func, MetricValue, Node, Value};

// ---------------------------------------------------------------- evaluation

impl Expr {
    /// The metric names this expression reads, in order of first use.
    pub fn metrics(&self, out: &mut Vec<String>) {
        match &self.node {
            Node::Metric(m) => {
                if !out.contains(m) {
                    out.push(m.clone());
                }
            }
            Node::Neg(e) | Node::Not(e) => e.metrics(out),
            Node::Binary(_, a, b) => {
                a.metrics(out);
                b.metrics(out);
            }
            Node::Call(_, args) => args.iter().for_each(|a| a.metrics(out)),
            Node::Num(_) | Node::Bool(_) => {}
        }
    }

    pub fn eval(&self, env: &dyn Env) -> Result<Value, EvalError> {
        match &self.node {
            Node::Num(n) => Ok(Value::Num(*n)),
            Node::Bool(b) => Ok(Value::Bool(*b)),
            Node::Metric(name) => match env.metric(name) {
                Some(MetricValue::Num(n)) => Ok(Value::Num(n)),
                Some(MetricValue::Bool(b)) => Ok(Value::Bool(b)),
                Some(MetricValue::Series(_)) => Err(EvalError::Type(format!(
                    "'{name}' is a series; use last(), count(), rising() or slope()"
                ))),
                None => Err(EvalError::Missing(vec![name.clone()])),
            },
            Node::Neg(e) => Ok(Value::Num(-num(e.eval(env)?, "-")?)),
            Node::Not(e) => Ok(Value::Bool(!boolean(e.eval(env)?, "not")?)),
            Node::Binary(BinOp::And, a, b) => kleene(a.eval(env), || b.eval(env), false),
            Node::Binary(BinOp::Or, a, b) => kleene(a.eval(env), || b.eval(env), true),
            Node::Binary(op, a, b) => {
                let (x, y) = both(a.eval(env), b.eval(env))?;
                binary(*op, x, y)
            }
            Node::Call(func, args) => call(*func, args, env),
        }
    }

    pub fn eval_bool(&self, env: &dyn Env) -> Result<bool, EvalError> {
        boolean(self.eval(env)?, "a rule condition")
    }
}

/// `and` (decider = false) / `or` (decider = true) under Kleene logic: a
/// missing side only matters when the other side does not decide the result.
fn kleene(
    a: Result<Value, EvalError>,
    b: impl FnOnce() -> Result<Value, EvalError>,
    decider: bool,
) -> Result<Value, EvalError> {
    let a = match a {
        Ok(v) => Ok(boolean(v, if decider { "or" } else { "and" })?),
        Err(EvalError::Missing(m)) => Err(m),
        Err(e) => return Err(e),
    };
    if a == Ok(decider) {
        return Ok(Value::Bool(decider));
    }
    let b = match b() {
        Ok(v) => Ok(boolean(v, if decider { "or" } else { "and" })?),
        Err(EvalError::Missing(m)) => Err(m),
        Err(e) => return Err(e),
    };
    match (a, b) {
        (_, Ok(v)) if v == decider => Ok(Value::Bool(decider)),
        (Ok(_), Ok(v)) => Ok(Value::Bool(v)),
        (Err(m), Ok(_)) | (Ok(_), Err(m)) => Err(EvalError::Missing(m)),
        (Err(mut m), Err(n)) => {
            merge(&mut m, n);
            Err(EvalError::Missing(m))
        }
    }
}

fn merge(into: &mut Vec<String>, from: Vec<String>) {
    for m in from {
        if !into.contains(&m) {
            into.push(m);
        }
    }
}

fn both(
    a: Result<Value, EvalError>,
    b: Result<Value, EvalError>,
) -> Result<(Value, Value), EvalError> {
    match (a, b) {
        (Ok(x), Ok(y)) => Ok((x, y)),
        (Err(EvalError::Missing(mut m)), Err(EvalError::Missing(n))) => {
            merge(&mut m, n);
            Err(EvalError::Missing(m))
        }
        (Err(e), _) | (_, Err(e)) => Err(e),
    }
}

fn num(v: Value, ctx: &str) -> Result<f64, EvalError> {
    match v {
        Value::Num(n) => Ok(n),
        Value::Bool(_) => Err(EvalError::Type(format!(
            "{ctx} needs a number, got a boolean"
        ))),
    }
}

fn boolean(v: Value, ctx: &str) -> Result<bool, EvalError> {
    match v {
        Value::Bool(b) => Ok(b),
        Value::Num(_) => Err(EvalError::Type(format!(
            "{ctx} needs a boolean, got a number"
        ))),
    }
}

fn binary(op: BinOp, x: Value, y: Value) -> Result<Value, EvalError> {
    if let (BinOp::Eq | BinOp::Ne, Value::Bool(a), Value::Bool(b)) = (op, x, y) {
        return Ok(Value::Bool((a == b) == (op == BinOp::Eq)));
    }
    let sym = match op {
        BinOp::Add => "+",
        BinOp::Sub => "-",
        BinOp::Mul => "*",
        BinOp::Div => "/",
        _ => "a comparison",
    };
    let (a, b) = (num(x, sym)?, num(y, sym)?);
    Ok(match op {
        BinOp::Add => Value::Num(a + b),
        BinOp::Sub => Value::Num(a - b),
        BinOp::Mul => Value::Num(a * b),
        BinOp::Div => Value::Num(divide(a, b)),
        BinOp::Lt => Value::Bool(a < b),
        BinOp::Le => Value::Bool(a <= b),
        BinOp::Gt => Value::Bool(a > b),
        BinOp::Ge => Value::Bool(a >= b),
        BinOp::Eq => Value::Bool(a == b),
        BinOp::Ne => Value::Bool(a != b),
        // `and`/`or` never reach here: `Expr::eval` routes them to `kleene`.
        BinOp::And | BinOp::Or => return Err(EvalError::Type("logic operator on numbers".into())),
    })
}

/// Division that never yields NaN: x/0 is 0 for x = 0 and +∞ otherwise, so
/// `ratio(reserved_unallocated, allocated)` stays comparable when nothing is allocated.
fn divide(a: f64, b: f64) -> f64 {
    if b == 0.0 {
        if a == 0.0 {
            0.0
        } else {
            f64::INFINITY.copysign(a)
        }
    } else {
        a / b
    }
}

fn call(func: Func, args: &[Expr], env: &dyn Env) -> Result<Value, EvalError> {
    if func.takes_series() {
        let Some(Node::Metric(name)) = args.first().map(|a| &a.node) else {
            return Err(EvalError::Type("expected a series metric".into()));
        };
        let series = match env.metric(name) {
            Some(MetricValue::Series(s)) if !s.is_empty() => s,
            Some(MetricValue::Series(_)) | None => {
                return Err(EvalError::Missing(vec![name.clone()]));
            }
            Some(_) => return Err(EvalError::Type(format!("'{name}' is not a series"))),
        };
        return Ok(match func {
            Func::Count => Value::Num(series.len() as f64),
            Func::Last => Value::Num(series.last().copied().unwrap_or(0.0)),
            Func::First => Value::Num(series.first().copied().unwrap_or(0.0)),
            Func::Slope => Value::Num(slope(series)),
            _ => Value::Bool(rising(series)),
        });
    }
    let mut vals = Vec::with_capacity(args.len());
    let mut missing = Vec::new();
    for a in args {
        match a.eval(env) {
            Ok(v) => vals.push(num(v, "a function argument")?),
            Err(EvalError::Missing(m)) => merge(&mut missing, m),
            Err(e) => return Err(e),
        }
    }
    if !missing.is_empty() {
        return Err(EvalError::Missing(missing));
    }
    let first = vals.first().copied().unwrap_or(0.0);
    Ok(Value::Num(match func {
        Func::Min => vals.iter().copied().fold(f64::INFINITY, f64::min),
        Func::Max => vals.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        Func::Abs => first.abs(),
        Func::Ratio => divide(first, vals.get(1).copied().unwrap_or(0.0)),
        Func::Round => first.round(),
        Func::Floor => first.floor(),
        Func::Ceil => first.ceil(),
        Func::FloorPow2 if first >= 1.0 => 2f64.powi(first.log2().floor() as i32),
        Func::Mib => first / 1048576.0,
        Func::Log2 if first > 0.0 => first.log2(),
        Func::Log2 => f64::NEG_INFINITY,
        Func::Cmp => match first.partial_cmp(&vals.get(1).copied().unwrap_or(0.0)) {
            Some(std::cmp::Ordering::Less) => -1.0,
            Some(std::cmp::Ordering::Greater) => 1.0,
            _ => 0.0,
        },
        _ => 0.0,
    }))
}

/// Least-squares slope per sample.
pub fn slope(s: &[f64]) -> f64 {
    let n = s.len() as f64;
    if s.len() < 2 {
        return 0.0;
    }
    let mean_x = (n - 1.0) / 2.0;
    let mean_y = s.iter().sum::<f64>() / n;
    let (mut num, mut den) = (0.0, 0.0);
    for (i, y) in s.iter().enumerate() {
        let dx = i as f64 - mean_x;
        num += dx * (y - mean_y);
        den += dx * dx;
    }
    divide(num, den)
}

/// Three or more samples, the last above the first, and at least two thirds of
/// the steps not going down: a creeping rise, tolerant of one dip.
pub fn rising(s: &[f64]) -> bool {
    if s.len() < 3 {
        return false;
    }
    let (Some(first), Some(last)) = (s.first(), s.last()) else {
        return false;
    };
    let steps = s.len() - 1;
    let up = s.windows(2).filter(|w| w[1] >= w[0]).count();
    last > first && up * 3 >= steps * 2
}

/// A number for messages: integers without a fraction, others with up to two decimals.
pub fn format_number(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e15 {
        format!("{}", n as i64)
    } else {
        let s = format!("{n:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}
