//! Message templates (`"{reserved_unallocated|size} is reserved but unallocated"`),
//! messages with cases (the first case whose `when` holds), and recommended
//! values (`"True"`, or `"= max(21, floor_pow2(mib(requested)))"`).
//!
//! Comparison words come from the figures, never from the author's
//! expectation: `{cmp(a, b)|than}` prints "more than", "less than" or "as
//! much as", and `{cmp(room, request)|holds}` "could hold" or "cannot hold",
//! as the values stand.

use super::expr::{self, Env, EvalError, Expr, ParseError, Span, Value};
use crate::units::format_size;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fmt {
    /// PyTorch's `format_size`: "6.20 GiB", the way the OOM message prints sizes.
    Size,
    /// A fraction as a percentage: 0.734 → "73%".
    Pct,
    /// A fraction as a percentage with one decimal: 0.0082 → "0.8 %".
    Pct1,
    Num,
    /// A comparison's sign (`cmp(a, b)`) as words: "more than", "less than", "as much as".
    Than,
    /// A comparison's sign (`cmp(room, need)`) as words: "could hold", "cannot hold".
    Holds,
}

#[derive(Debug, Clone)]
enum Piece {
    Text(String),
    Expr(Expr, Fmt),
}

/// A parsed message template.
#[derive(Debug, Clone)]
pub struct Template {
    pieces: Vec<Piece>,
    pub source: String,
}

impl Template {
    /// `{expr}` or `{expr|size}` / `{expr|pct}` / `{expr|num}`; `{{` and `}}` are literal braces.
    pub fn parse(src: &str) -> Result<Template, ParseError> {
        let mut pieces = Vec::new();
        let mut text = String::new();
        let mut rest = src;
        let mut offset = 0;
        while let Some(i) = rest.find(['{', '}']) {
            text.push_str(&rest[..i]);
            let brace = rest.as_bytes()[i];
            if rest.as_bytes().get(i + 1) == Some(&brace) {
                text.push(brace as char);
                rest = &rest[i + 2..];
                offset += i + 2;
                continue;
            }
            if brace == b'}' {
                return Err(ParseError {
                    message: "unmatched '}' (write '}}' for a literal brace)".into(),
                    span: Span {
                        start: offset + i,
                        end: offset + i + 1,
                    },
                });
            }
            let Some(close) = rest[i..].find('}') else {
                return Err(ParseError {
                    message: "unclosed '{'".into(),
                    span: Span {
                        start: offset + i,
                        end: src.len(),
                    },
                });
            };
            let inner = &rest[i + 1..i + close];
            let (body, fmt) = match inner.rsplit_once('|') {
                Some((b, "size")) => (b, Fmt::Size),
                Some((b, "pct")) => (b, Fmt::Pct),
                Some((b, "pct1")) => (b, Fmt::Pct1),
                Some((b, "num")) => (b, Fmt::Num),
                Some((b, "than")) => (b, Fmt::Than),
                Some((b, "holds")) => (b, Fmt::Holds),
                Some((_, f)) => {
                    return Err(ParseError {
                        message: format!(
                            "unknown format '{f}' (use size, pct, pct1, num, than or holds)"
                        ),
                        span: Span {
                            start: offset + i,
                            end: offset + i + close + 1,
                        },
                    });
                }
                None => (inner, Fmt::Num),
            };
            let e = expr::parse(body).map_err(|mut e| {
                e.span.start += offset + i + 1;
                e.span.end += offset + i + 1;
                e
            })?;
            if !text.is_empty() {
                pieces.push(Piece::Text(std::mem::take(&mut text)));
            }
            pieces.push(Piece::Expr(e, fmt));
            rest = &rest[i + close + 1..];
            offset += i + close + 1;
        }
        text.push_str(rest);
        if !text.is_empty() {
            pieces.push(Piece::Text(text));
        }
        Ok(Template {
            pieces,
            source: src.to_string(),
        })
    }

    /// The message with every placeholder filled; a value the evidence lacks shows as "?".
    pub fn render(&self, env: &dyn Env) -> String {
        let mut out = String::new();
        for p in &self.pieces {
            match p {
                Piece::Text(t) => out.push_str(t),
                Piece::Expr(e, fmt) => match e.eval(env) {
                    Ok(Value::Num(n)) => out.push_str(&match fmt {
                        Fmt::Size => format_size(n.max(0.0).round() as u64),
                        Fmt::Pct => format!("{:.0}%", n * 100.0),
                        Fmt::Pct1 => format!("{:.1} %", n * 100.0),
                        Fmt::Num => expr::format_number(n),
                        Fmt::Than if n > 0.0 => "more than".to_string(),
                        Fmt::Than if n < 0.0 => "less than".to_string(),
                        Fmt::Than => "as much as".to_string(),
                        Fmt::Holds if n >= 0.0 => "could hold".to_string(),
                        Fmt::Holds => "cannot hold".to_string(),
                    }),
                    Ok(v) => out.push_str(&v.to_string()),
                    Err(_) => out.push('?'),
                },
            }
        }
        out
    }
}

/// A message: one template, or cases tried in order, each with an optional
/// condition (`when`); the first whose condition holds is rendered, and the
/// last is the fallback. So a rule that fires over a band of values says
/// which part of the band the evidence is in.
#[derive(Debug, Clone)]
pub struct Message {
    cases: Vec<(Option<Expr>, Template)>,
    /// The YAML source: the template, or the cases one per line.
    pub source: String,
}

impl Message {
    /// One template, no cases.
    pub fn single(t: Template) -> Message {
        Message {
            source: t.source.clone(),
            cases: vec![(None, t)],
        }
    }

    /// Cases as `(when, template)`; the last should have no condition.
    pub fn cases(cases: Vec<(Option<(Expr, String)>, Template)>) -> Message {
        let source = cases
            .iter()
            .map(|(when, t)| match when {
                Some((_, w)) => format!("when {w}: {}", t.source),
                None => format!("otherwise: {}", t.source),
            })
            .collect::<Vec<_>>()
            .join("\n");
        Message {
            cases: cases
                .into_iter()
                .map(|(w, t)| (w.map(|(e, _)| e), t))
                .collect(),
            source,
        }
    }

    /// The first case whose condition holds (a condition that cannot be
    /// evaluated does not hold), else the last case.
    pub fn render(&self, env: &dyn Env) -> String {
        let chosen = self
            .cases
            .iter()
            .find(|(when, _)| {
                when.as_ref()
                    .is_none_or(|w| matches!(w.eval_bool(env), Ok(true)))
            })
            .or(self.cases.last());
        chosen.map(|(_, t)| t.render(env)).unwrap_or_default()
    }
}

/// A recommended setting's value: literal text, or an expression after `=`
/// (numbers are written as integers, except for the keys that take a fraction).
#[derive(Debug, Clone)]
pub enum ValueTemplate {
    Literal(String),
    Expr(Expr, String),
}

impl ValueTemplate {
    pub fn parse(src: &str) -> Result<ValueTemplate, ParseError> {
        match src.trim_start().strip_prefix('=') {
            Some(body) => expr::parse(body)
                .map(|e| ValueTemplate::Expr(e, src.to_string()))
                .map_err(|mut e| {
                    let shift = src.len() - body.len();
                    e.span.start += shift;
                    e.span.end += shift;
                    e
                }),
            None => Ok(ValueTemplate::Literal(src.to_string())),
        }
    }

    /// The value for setting `key`.
    pub fn render_value(&self, key: &str, env: &dyn Env) -> Result<String, EvalError> {
        /// Allocator keys whose value is a fraction (`CUDAAllocatorConfig`'s stod parses).
        const FRACTIONS: [&str; 2] = [
            "garbage_collection_threshold",
            "per_process_memory_fraction",
        ];
        match self {
            ValueTemplate::Literal(s) => Ok(s.clone()),
            ValueTemplate::Expr(e, _) => Ok(match e.eval(env)? {
                Value::Num(n) if FRACTIONS.contains(&key) => expr::format_number(n),
                Value::Num(n) => format!("{}", n.round() as i64),
                Value::Bool(true) => "True".into(),
                Value::Bool(false) => "False".into(),
            }),
        }
    }

    pub fn source(&self) -> &str {
        match self {
            ValueTemplate::Literal(s) | ValueTemplate::Expr(_, s) => s,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::{Fact, Facts};

    fn facts() -> Facts {
        let mut f = Facts::default();
        f.set("reserved_unallocated", Fact::Num(6657199309.0));
        f.set("requested", Fact::Num(2147483648.0));
        f.set("capacity", Fact::Num(25769803776.0));
        f
    }

    #[test]
    fn renders_sizes_percentages_and_braces() {
        let t = Template::parse(
            "{reserved_unallocated|size} unallocated, {ratio(reserved_unallocated, capacity)|pct} of the card, {{x}} {requested / 1GiB}x",
        )
        .unwrap();
        assert_eq!(
            t.render(&facts()),
            "6.20 GiB unallocated, 26% of the card, {x} 2x"
        );
        assert_eq!(
            Template::parse("{free|size} free")
                .unwrap()
                .render(&facts()),
            "? free"
        );
    }

    #[test]
    fn comparison_words_come_from_the_figures() {
        let t = Template::parse(
            "{reserved_unallocated|size} is {cmp(reserved_unallocated, requested)|than} the {requested|size} request, which it {cmp(reserved_unallocated, requested)|holds}",
        )
        .unwrap();
        assert_eq!(
            t.render(&facts()),
            "6.20 GiB is more than the 2.00 GiB request, which it could hold"
        );
        let mut small = facts();
        small.set("reserved_unallocated", Fact::Num(1048576.0));
        assert_eq!(
            t.render(&small),
            "1024.00 KiB is less than the 2.00 GiB request, which it cannot hold"
        );
        small.set("reserved_unallocated", Fact::Num(2147483648.0));
        assert!(t.render(&small).contains("is as much as the"));
        let p = Template::parse("{ratio(requested, capacity)|pct1} of the card").unwrap();
        assert_eq!(p.render(&facts()), "8.3 % of the card");
    }

    #[test]
    fn message_cases_pick_the_first_that_holds() {
        let case = |w: &str, t: &str| {
            (
                Some((expr::parse(w).unwrap(), w.to_string())),
                Template::parse(t).unwrap(),
            )
        };
        let m = Message::cases(vec![
            case("free >= requested", "free covers it"),
            case("reserved_unallocated >= requested", "the cache covers it"),
            (None, Template::parse("nothing covers it").unwrap()),
        ]);
        // `free` is missing: that case does not hold; the next one does.
        assert_eq!(m.render(&facts()), "the cache covers it");
        let mut f = facts();
        f.set("reserved_unallocated", Fact::Num(0.0));
        assert_eq!(m.render(&f), "nothing covers it");
        assert!(
            m.source
                .starts_with("when free >= requested: free covers it\n")
        );
    }

    #[test]
    fn template_errors_point_into_the_text() {
        let e = Template::parse("ok {requested|bytes}").unwrap_err();
        assert!(e.message.contains("unknown format 'bytes'"));
        let e = Template::parse("ok {requested +}").unwrap_err();
        assert_eq!(e.span.start, 15);
        assert!(
            Template::parse("ok {requested")
                .unwrap_err()
                .message
                .contains("unclosed")
        );
        assert!(
            Template::parse("ok }")
                .unwrap_err()
                .message
                .contains("unmatched")
        );
    }

    #[test]
    fn values_are_literal_or_computed() {
        let v = ValueTemplate::parse("= max(21, floor_pow2(mib(requested) / 2))").unwrap();
        assert_eq!(
            v.render_value("max_split_size_mb", &facts()).unwrap(),
            "1024"
        );
        let v = ValueTemplate::parse("True").unwrap();
        assert_eq!(
            v.render_value("expandable_segments", &facts()).unwrap(),
            "True"
        );
        let v = ValueTemplate::parse("= ceil(20 * 0.7 + 1) / 20").unwrap();
        assert_eq!(
            v.render_value("garbage_collection_threshold", &facts())
                .unwrap(),
            "0.75"
        );
        assert_eq!(
            v.render_value("roundup_power2_divisions", &facts())
                .unwrap(),
            "1"
        );
        assert!(ValueTemplate::parse("= 1 +").is_err());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// Any text, any Unicode: a template or an error inside the text, never a panic.
        #[test]
        fn templates_never_panic(src in "\\PC{0,40}") {
            match Template::parse(&src) {
                Ok(t) => {
                    let _ = t.render(&facts());
                }
                Err(e) => proptest::prop_assert!(e.span.start <= src.len()),
            }
        }
    }
}
