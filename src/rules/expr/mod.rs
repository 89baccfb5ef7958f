//! The rule expression language: a Pratt parser over numbers with size units
//! (`512MiB`), version literals (`v2.1`), metric names, `+ - * /`, comparisons,
//! `and`/`or`/`not` and a few functions. Evaluation uses three-valued logic: a
//! metric the evidence lacks makes the result [`EvalError::Missing`] unless the
//! other side of `and`/`or` already decides it, so nothing is silently false.

mod eval;
mod lexer;
mod parser;
#[cfg(test)]
mod tests;

pub use eval::{format_number, rising, slope};
pub use parser::parse;

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
