//! The Pratt parser: tokens to an `Expr`, every metric name checked against the catalogue.

use super::lexer::{Tok, lex};
use super::{BinOp, Expr, Func, Node, ParseError, Span};
use crate::rules::catalog::{self, MetricKind};

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
