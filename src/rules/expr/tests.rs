//! Tests of the expression language: parsing, evaluation, errors and their spans.

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
