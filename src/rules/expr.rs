//! The rule expression language: a Pratt parser over numbers with size units
//! (`512MiB`), version literals (`v2.1`), metric names, `+ - * /`, comparisons,
//! `and`/`or`/`not` and a few functions. Evaluation uses three-valued logic: a
//! metric the evidence lacks makes the result [`EvalError::Missing`] unless the
//! other side of `and`/`or` already decides it, so nothing is silently false.

use super::catalog::{self, MetricKind};
use std::fmt;

/// Byte offsets into the source text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub start: usize,
    pub end: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ParseError {
    pub message: String,
    pub span: Span,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (at column {})", self.message, self.span.start + 1)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
    And,
    Or,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Func {
    Min,
    Max,
    Abs,
    Ratio,
    Rising,
    Slope,
    Count,
    Last,
    First,
    Round,
    Floor,
    Ceil,
    FloorPow2,
    Mib,
    Log2,
    /// `cmp(a, b)`: -1, 0 or 1 as a is less than, equal to or more than b
    /// (for templates' comparison words: `{cmp(free, requested)|than}`).
    Cmp,
}

impl Func {
    fn from_name(name: &str) -> Option<Func> {
        Some(match name {
            "min" => Func::Min,
            "max" => Func::Max,
            "abs" => Func::Abs,
            "ratio" => Func::Ratio,
            "rising" => Func::Rising,
            "slope" => Func::Slope,
            "count" => Func::Count,
            "last" => Func::Last,
            "first" => Func::First,
            "round" => Func::Round,
            "floor" => Func::Floor,
            "ceil" => Func::Ceil,
            "floor_pow2" => Func::FloorPow2,
            "mib" => Func::Mib,
            "log2" => Func::Log2,
            "cmp" => Func::Cmp,
            _ => return None,
        })
    }

    /// (minimum, maximum) argument count.
    fn arity(self) -> (usize, usize) {
        match self {
            Func::Min | Func::Max => (2, usize::MAX),
            Func::Ratio | Func::Cmp => (2, 2),
            _ => (1, 1),
        }
    }

    /// Functions whose single argument is a series metric.
    fn takes_series(self) -> bool {
        matches!(
            self,
            Func::Rising | Func::Slope | Func::Count | Func::Last | Func::First
        )
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    Num(f64),
    Bool(bool),
    Metric(String),
    Neg(Box<Expr>),
    Not(Box<Expr>),
    Binary(BinOp, Box<Expr>, Box<Expr>),
    Call(Func, Vec<Expr>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Expr {
    pub node: Node,
    pub span: Span,
}

/// A metric's value as the evaluator sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MetricValue<'a> {
    Num(f64),
    Bool(bool),
    Series(&'a [f64]),
}

/// Where metric values come from.
pub trait Env {
    fn metric(&self, name: &str) -> Option<MetricValue<'_>>;
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    Num(f64),
    Bool(bool),
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Num(n) => write!(f, "{}", format_number(*n)),
            Value::Bool(b) => write!(f, "{b}"),
        }
    }
}

impl serde::Serialize for Value {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            // Byte counts and counters are integers; ratios keep their fraction.
            Value::Num(n) if n.fract() == 0.0 && n.abs() < 9.0e15 => s.serialize_i64(*n as i64),
            Value::Num(n) => s.serialize_f64(*n),
            Value::Bool(b) => s.serialize_bool(*b),
        }
    }
}

/// Why an expression has no value.
#[derive(Debug, Clone, PartialEq)]
pub enum EvalError {
    /// The evidence lacks these metrics.
    Missing(Vec<String>),
    /// A type mismatch the load-time check could not see (e.g. a boolean metric in arithmetic).
    Type(String),
}

// ---------------------------------------------------------------- lexer

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Num(f64),
    Ident(String),
    Op(&'static str),
    LParen,
    RParen,
    Comma,
    End,
}

fn lex(src: &str) -> Result<Vec<(Tok, Span)>, ParseError> {
    let bytes = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let start = i;
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if c.is_ascii_digit() || (c == b'.' && bytes.get(i + 1).is_some_and(u8::is_ascii_digit)) {
            while i < bytes.len()
                && (bytes[i].is_ascii_digit() || bytes[i] == b'.' || bytes[i] == b'_')
            {
                i += 1;
            }
            let digits: String = src[start..i].chars().filter(|&c| c != '_').collect();
            let value: f64 = digits.parse().map_err(|_| ParseError {
                message: format!("invalid number '{}'", &src[start..i]),
                span: Span { start, end: i },
            })?;
            let unit_start = i;
            while i < bytes.len() && bytes[i].is_ascii_alphabetic() {
                i += 1;
            }
            let unit = &src[unit_start..i];
            let value = if unit.is_empty() {
                value
            } else {
                match size_unit(unit) {
                    Some(m) => value * m,
                    None => {
                        return Err(ParseError {
                            message: format!(
                                "unknown size unit '{unit}' (use B, KiB, MiB, GiB, TiB, PiB, EiB)"
                            ),
                            span: Span {
                                start: unit_start,
                                end: i,
                            },
                        });
                    }
                }
            };
            out.push((Tok::Num(value), Span { start, end: i }));
            continue;
        }
        if c == b'v' && bytes.get(i + 1).is_some_and(u8::is_ascii_digit) {
            // Version literal v2.1 → 201 (major × 100 + minor), the encoding of `torch_version`.
            i += 1;
            let major_start = i;
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                i += 1;
            }
            let major: u32 = src[major_start..i].parse().unwrap_or(0);
            let mut minor = 0u32;
            if bytes.get(i) == Some(&b'.') {
                i += 1;
                let minor_start = i;
                while i < bytes.len() && bytes[i].is_ascii_digit() {
                    i += 1;
                }
                minor = src[minor_start..i].parse().unwrap_or(0);
            }
            if minor >= 100 || major >= 1000 {
                return Err(ParseError {
                    message: format!("invalid version literal '{}'", &src[start..i]),
                    span: Span { start, end: i },
                });
            }
            out.push((
                Tok::Num(f64::from(major * 100 + minor)),
                Span { start, end: i },
            ));
            continue;
        }
        if c.is_ascii_alphabetic() || c == b'_' {
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            let word = &src[start..i];
            let tok = match word {
                "and" => Tok::Op("and"),
                "or" => Tok::Op("or"),
                "not" => Tok::Op("not"),
                _ => Tok::Ident(word.to_string()),
            };
            out.push((tok, Span { start, end: i }));
            continue;
        }
        let two = src.get(i..i + 2).unwrap_or("");
        let (tok, len) = match two {
            "<=" => (Tok::Op("<="), 2),
            ">=" => (Tok::Op(">="), 2),
            "==" => (Tok::Op("=="), 2),
            "!=" => (Tok::Op("!="), 2),
            "&&" => (Tok::Op("and"), 2),
            "||" => (Tok::Op("or"), 2),
            _ => match c {
                b'+' => (Tok::Op("+"), 1),
                b'-' => (Tok::Op("-"), 1),
                b'*' => (Tok::Op("*"), 1),
                b'/' => (Tok::Op("/"), 1),
                b'<' => (Tok::Op("<"), 1),
                b'>' => (Tok::Op(">"), 1),
                b'!' => (Tok::Op("not"), 1),
                b'(' => (Tok::LParen, 1),
                b')' => (Tok::RParen, 1),
                b',' => (Tok::Comma, 1),
                _ => {
                    let ch = src[i..].chars().next().unwrap_or('?');
                    return Err(ParseError {
                        message: format!("unexpected character '{ch}'"),
                        span: Span {
                            start,
                            end: i + ch.len_utf8(),
                        },
                    });
                }
            },
        };
        i += len;
        out.push((tok, Span { start, end: i }));
    }
    out.push((
        Tok::End,
        Span {
            start: src.len(),
            end: src.len(),
        },
    ));
    Ok(out)
}

fn size_unit(unit: &str) -> Option<f64> {
    Some(match unit {
        "B" => 1.0,
        "KiB" | "KB" | "K" => 1024.0,
        "MiB" | "MB" | "M" => 1048576.0,
        "GiB" | "GB" | "G" => 1073741824.0,
        "TiB" | "TB" | "T" => 1099511627776.0,
        "PiB" | "PB" => 1125899906842624.0,
        "EiB" | "EB" => 1152921504606846976.0,
        _ => return None,
    })
}

// ---------------------------------------------------------------- parser

struct Parser {
    toks: Vec<(Tok, Span)>,
    pos: usize,
}

/// Binding power of an infix operator (left, right); higher binds tighter.
fn infix_power(op: &str) -> Option<(u8, u8, BinOp)> {
    Some(match op {
        "or" => (1, 2, BinOp::Or),
        "and" => (3, 4, BinOp::And),
        "<" => (5, 6, BinOp::Lt),
        "<=" => (5, 6, BinOp::Le),
        ">" => (5, 6, BinOp::Gt),
        ">=" => (5, 6, BinOp::Ge),
        "==" => (5, 6, BinOp::Eq),
        "!=" => (5, 6, BinOp::Ne),
        "+" => (7, 8, BinOp::Add),
        "-" => (7, 8, BinOp::Sub),
        "*" => (9, 10, BinOp::Mul),
        "/" => (9, 10, BinOp::Div),
        _ => return None,
    })
}

const NOT_POWER: u8 = 4;
const NEG_POWER: u8 = 11;

impl Parser {
    fn peek(&self) -> &(Tok, Span) {
        // lex() always ends with Tok::End and parsing never advances past it.
        &self.toks[self.pos.min(self.toks.len() - 1)]
    }

    fn next(&mut self) -> (Tok, Span) {
        let t = self.peek().clone();
        if t.0 != Tok::End {
            self.pos += 1;
        }
        t
    }

    fn expr(&mut self, min_power: u8) -> Result<Expr, ParseError> {
        let (tok, span) = self.next();
        let mut lhs = match tok {
            Tok::Num(n) => Expr {
                node: Node::Num(n),
                span,
            },
            Tok::Ident(name) => self.ident(name, span)?,
            Tok::Op("-") => {
                let inner = self.expr(NEG_POWER)?;
                let span = Span {
                    start: span.start,
                    end: inner.span.end,
                };
                Expr {
                    node: Node::Neg(Box::new(inner)),
                    span,
                }
            }
            Tok::Op("not") => {
                let inner = self.expr(NOT_POWER)?;
                let span = Span {
                    start: span.start,
                    end: inner.span.end,
                };
                Expr {
                    node: Node::Not(Box::new(inner)),
                    span,
                }
            }
            Tok::LParen => {
                let inner = self.expr(0)?;
                self.expect_rparen(span)?;
                inner
            }
            Tok::End => return Err(err("expected an expression, found the end", span)),
            other => {
                return Err(err(
                    format!("expected an expression, found {}", describe(&other)),
                    span,
                ));
            }
        };
        loop {
            let (tok, span) = self.peek().clone();
            let op = match &tok {
                Tok::Op(op) => *op,
                Tok::End | Tok::RParen | Tok::Comma => break,
                other => {
                    return Err(err(
                        format!("expected an operator, found {}", describe(other)),
                        span,
                    ));
                }
            };
            let Some((lp, rp, bin)) = infix_power(op) else {
                return Err(err(format!("'{op}' cannot follow an expression"), span));
            };
            if lp < min_power {
                break;
            }
            self.next();
            let rhs = self.expr(rp)?;
            let span = Span {
                start: lhs.span.start,
                end: rhs.span.end,
            };
            lhs = Expr {
                node: Node::Binary(bin, Box::new(lhs), Box::new(rhs)),
                span,
            };
        }
        Ok(lhs)
    }

    fn expect_rparen(&mut self, open: Span) -> Result<(), ParseError> {
        match self.next() {
            (Tok::RParen, _) => Ok(()),
            (_, span) => Err(err(
                format!("unclosed '(' opened at column {}", open.start + 1),
                span,
            )),
        }
    }

    fn ident(&mut self, name: String, span: Span) -> Result<Expr, ParseError> {
        match name.as_str() {
            "true" => {
                return Ok(Expr {
                    node: Node::Bool(true),
                    span,
                });
            }
            "false" => {
                return Ok(Expr {
                    node: Node::Bool(false),
                    span,
                });
            }
            _ => {}
        }
        if self.peek().0 != Tok::LParen {
            match catalog::lookup(&name) {
                None => {
                    return Err(err(
                        format!(
                            "unknown metric '{name}' (see `allocdoc rules list` and rules/README.md for the names)"
                        ),
                        span,
                    ));
                }
                Some(d) if d.kind == MetricKind::Text => {
                    return Err(err(
                        format!("'{name}' is a source location: name it with `site:`"),
                        span,
                    ));
                }
                Some(_) => {}
            }
            return Ok(Expr {
                node: Node::Metric(name),
                span,
            });
        }
        let Some(func) = Func::from_name(&name) else {
            return Err(err(format!("unknown function '{name}'"), span));
        };
        let open = self.next().1;
        let mut args = Vec::new();
        if self.peek().0 != Tok::RParen {
            loop {
                args.push(self.expr(0)?);
                if self.peek().0 == Tok::Comma {
                    self.next();
                } else {
                    break;
                }
            }
        }
        self.expect_rparen(open)?;
        let end = self
            .toks
            .get(self.pos.saturating_sub(1))
            .map_or(span.end, |t| t.1.end);
        let span = Span {
            start: span.start,
            end,
        };
        let (lo, hi) = func.arity();
        if args.len() < lo || args.len() > hi {
            return Err(err(
                format!(
                    "{name}() takes {} argument{}, got {}",
                    arity_text(lo, hi),
                    if hi == 1 { "" } else { "s" },
                    args.len()
                ),
                span,
            ));
        }
        let series_arg = args.first().and_then(|a| match &a.node {
            Node::Metric(m) => catalog::lookup(m).map(|d| d.kind == MetricKind::Series),
            _ => None,
        });
        if func.takes_series() && series_arg != Some(true) {
            return Err(err(
                format!("{name}() takes a series metric (a name ending in _series)"),
                span,
            ));
        }
        Ok(Expr {
            node: Node::Call(func, args),
            span,
        })
    }
}

fn arity_text(lo: usize, hi: usize) -> String {
    if lo == hi {
        lo.to_string()
    } else {
        format!("at least {lo}")
    }
}

fn describe(t: &Tok) -> String {
    match t {
        Tok::Num(_) => "a number".into(),
        Tok::Ident(s) => format!("'{s}'"),
        Tok::Op(o) => format!("'{o}'"),
        Tok::LParen => "'('".into(),
        Tok::RParen => "')'".into(),
        Tok::Comma => "','".into(),
        Tok::End => "the end".into(),
    }
}

fn err(message: impl Into<String>, span: Span) -> ParseError {
    ParseError {
        message: message.into(),
        span,
    }
}

/// Parses one expression; every metric name must be in the catalogue.
pub fn parse(src: &str) -> Result<Expr, ParseError> {
    let mut p = Parser {
        toks: lex(src)?,
        pos: 0,
    };
    let e = p.expr(0)?;
    match p.next() {
        (Tok::End, _) => Ok(e),
        (t, span) => Err(err(
            format!("unexpected {} after the expression", describe(&t)),
            span,
        )),
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    struct Map(BTreeMap<&'static str, f64>, Vec<f64>);
    impl Env for Map {
        fn metric(&self, name: &str) -> Option<MetricValue<'_>> {
            if name == "inactive_split_series" {
                return Some(MetricValue::Series(&self.1));
            }
            if name == "expandable_segments_on" {
                return self.0.get(name).map(|v| MetricValue::Bool(*v != 0.0));
            }
            self.0.get(name).map(|v| MetricValue::Num(*v))
        }
    }

    fn env(pairs: &[(&'static str, f64)]) -> Map {
        Map(
            pairs.iter().copied().collect(),
            vec![1.0, 3.0, 2.0, 5.0, 8.0],
        )
    }

    fn eval(src: &str, e: &Map) -> Result<Value, EvalError> {
        parse(src).unwrap().eval(e)
    }

    #[test]
    fn sizes_precedence_and_comparisons() {
        let e = env(&[
            ("requested", 2147483648.0),
            ("reserved_unallocated", 6.0 * 1073741824.0),
        ]);
        assert_eq!(eval("2GiB + 512MiB", &e), Ok(Value::Num(2684354560.0)));
        assert_eq!(eval("1 + 2 * 3 - 4 / 2", &e), Ok(Value::Num(5.0)));
        assert_eq!(eval("-(1 + 2) * 2", &e), Ok(Value::Num(-6.0)));
        assert_eq!(
            eval("reserved_unallocated >= 3 * requested", &e),
            Ok(Value::Bool(true))
        );
        assert_eq!(
            eval("ratio(reserved_unallocated, requested)", &e),
            Ok(Value::Num(3.0))
        );
        assert_eq!(
            eval("max(1, 7, 3) == 7 and min(4, 2) < 3", &e),
            Ok(Value::Bool(true))
        );
        assert_eq!(eval("v2.1", &e), Ok(Value::Num(201.0)));
        assert_eq!(eval("v2.10 > v2.9", &e), Ok(Value::Bool(true)));
        assert_eq!(
            eval("floor_pow2(mib(requested) * 0.75)", &e),
            Ok(Value::Num(1024.0))
        );
        assert_eq!(eval("not 1 > 2 and true", &e), Ok(Value::Bool(true)));
    }

    #[test]
    fn missing_metrics_are_reported_not_false() {
        let e = env(&[("requested", 100.0)]);
        assert_eq!(
            eval("free > requested", &e),
            Err(EvalError::Missing(vec!["free".into()]))
        );
        assert_eq!(
            eval("free + allocated > requested", &e),
            Err(EvalError::Missing(vec!["free".into(), "allocated".into()]))
        );
        // Kleene logic: a decided side wins over a missing one.
        assert_eq!(
            eval("requested > 1000 and free > 0", &e),
            Ok(Value::Bool(false))
        );
        assert_eq!(
            eval("free > 0 or requested > 10", &e),
            Ok(Value::Bool(true))
        );
        assert_eq!(
            eval("free > 0 or requested > 1000", &e),
            Err(EvalError::Missing(vec!["free".into()]))
        );
        assert_eq!(
            eval("not expandable_segments_on", &e),
            Err(EvalError::Missing(vec!["expandable_segments_on".into()]))
        );
    }

    #[test]
    fn series_functions() {
        let e = env(&[]);
        assert_eq!(
            eval("count(inactive_split_series)", &e),
            Ok(Value::Num(5.0))
        );
        assert_eq!(
            eval("rising(inactive_split_series)", &e),
            Ok(Value::Bool(true))
        );
        assert_eq!(
            eval(
                "last(inactive_split_series) - first(inactive_split_series)",
                &e
            ),
            Ok(Value::Num(7.0))
        );
        assert_eq!(
            eval("slope(inactive_split_series)", &e),
            Ok(Value::Num(1.6))
        );
        assert!(!rising(&[5.0, 4.0, 3.0, 6.0]));
        assert!(!rising(&[1.0, 2.0]));
        assert!(rising(&[1.0, 2.0, 2.0]));
    }

    #[test]
    fn division_by_zero_is_not_nan() {
        let e = env(&[("allocated", 0.0), ("reserved_unallocated", 5.0)]);
        assert_eq!(
            eval("ratio(reserved_unallocated, allocated) > 2", &e),
            Ok(Value::Bool(true))
        );
        assert_eq!(eval("0 / 0", &e), Ok(Value::Num(0.0)));
    }

    #[test]
    fn errors_carry_spans() {
        let e = parse("requested > 2GiB and frobnicate > 1").unwrap_err();
        assert!(e.message.contains("unknown metric 'frobnicate'"), "{e}");
        assert_eq!(e.span, Span { start: 21, end: 31 });
        let e = parse("requested > 2 Gib").unwrap_err();
        assert_eq!(e.span.start, 14);
        assert!(
            parse("2QiB")
                .unwrap_err()
                .message
                .contains("unknown size unit")
        );
        assert!(
            parse("(1 + 2")
                .unwrap_err()
                .message
                .contains("unclosed '('")
        );
        assert!(parse("min(1)").unwrap_err().message.contains("at least 2"));
        assert!(
            parse("rising(requested)")
                .unwrap_err()
                .message
                .contains("series")
        );
        assert!(parse("1 +").unwrap_err().message.contains("found the end"));
        assert!(
            parse("1 $ 2")
                .unwrap_err()
                .message
                .contains("unexpected character '$'")
        );
        assert!(
            parse("requested 5")
                .unwrap_err()
                .message
                .contains("expected an operator")
        );
    }

    #[test]
    fn type_errors_are_errors() {
        let e = env(&[("expandable_segments_on", 1.0)]);
        assert!(matches!(
            eval("expandable_segments_on + 1", &e),
            Err(EvalError::Type(_))
        ));
        assert!(matches!(
            parse("1 + 2").unwrap().eval_bool(&e),
            Err(EvalError::Type(_))
        ));
    }

    #[test]
    fn numbers_format_for_messages() {
        assert_eq!(format_number(3.0), "3");
        assert_eq!(format_number(1.25), "1.25");
        assert_eq!(format_number(0.1 + 0.2), "0.3");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// Any text either parses or yields a span inside it; evaluation never panics.
        #[test]
        fn parse_and_eval_never_panic(src in "[ -~]{0,40}") {
            match parse(&src) {
                Ok(e) => {
                    let _ = e.eval(&env(&[("requested", 1.0), ("capacity", 0.0)]));
                }
                Err(err) => proptest::prop_assert!(err.span.start <= src.len()),
            }
        }

        /// Generated well-formed arithmetic agrees with f64 arithmetic.
        #[test]
        fn arithmetic_matches_f64(a in 0u32..10_000, b in 1u32..10_000, c in 0u32..100) {
            let src = format!("{a} + {b} * {c} - {a} / {b}");
            let want = f64::from(a) + f64::from(b) * f64::from(c) - f64::from(a) / f64::from(b);
            proptest::prop_assert_eq!(eval(&src, &env(&[])), Ok(Value::Num(want)));
        }
    }
}
