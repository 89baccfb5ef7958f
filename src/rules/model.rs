//! A rule file as written (serde-saphyr, with source locations) and the
//! checked [`Rule`] it becomes: expressions parsed, metric names known.

use super::expr::{self, Expr};
use super::template::{Message, Template, ValueTemplate};
use super::{Facts, RuleError, Verdict, VersionRange};
use crate::conf::TorchVersion;
use crate::evidence::{Backend, Kind};
use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Info,
    Warning,
    Error,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Error => "error",
        }
    }
}

/// The contract's causes (`diagnose --format json`, field `cause`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    Fragmentation,
    Capacity,
    RequestExceedsCapacity,
    OtherProcesses,
    MemoryFractionCap,
    NotAllocator,
    Unknown,
}

impl Cause {
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Fragmentation => "fragmentation",
            Cause::Capacity => "capacity",
            Cause::RequestExceedsCapacity => "request_exceeds_capacity",
            Cause::OtherProcesses => "other_processes",
            Cause::MemoryFractionCap => "memory_fraction_cap",
            Cause::NotAllocator => "not_allocator",
            Cause::Unknown => "unknown",
        }
    }

    /// Causes no allocator setting can fix; the contract makes the recommendation null.
    pub fn rules_out_settings(self) -> bool {
        matches!(
            self,
            Cause::RequestExceedsCapacity
                | Cause::Capacity
                | Cause::NotAllocator
                | Cause::OtherProcesses
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum KindName {
    Oom,
    NonAllocatorOom,
    MemorySummary,
    MemoryStats,
    Snapshot,
    DeviceError,
}

impl From<KindName> for Kind {
    fn from(k: KindName) -> Kind {
        match k {
            KindName::Oom => Kind::Oom,
            KindName::NonAllocatorOom => Kind::NonAllocatorOom,
            KindName::MemorySummary => Kind::MemorySummary,
            KindName::MemoryStats => Kind::MemoryStats,
            KindName::Snapshot => Kind::Snapshot,
            KindName::DeviceError => Kind::DeviceError,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
enum BackendName {
    #[serde(rename = "native")]
    Native,
    #[serde(rename = "cudaMallocAsync")]
    CudaMallocAsync,
}

impl From<BackendName> for Backend {
    fn from(b: BackendName) -> Backend {
        match b {
            BackendName::Native => Backend::Native,
            BackendName::CudaMallocAsync => Backend::CudaMallocAsync,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawAppliesTo {
    #[serde(default)]
    kinds: Vec<KindName>,
    torch: Option<Spanned<String>>,
    backend: Option<BackendName>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawRule {
    id: String,
    title: String,
    severity: Severity,
    cause: Option<Cause>,
    #[serde(default)]
    priority: i32,
    #[serde(default)]
    applies_to: Option<RawAppliesTo>,
    when: Spanned<String>,
    #[serde(default)]
    recommend: BTreeMap<String, Spanned<String>>,
    because: RawMessage,
    next: Option<RawMessage>,
    /// A text metric naming where in the program the finding points.
    site: Option<Spanned<String>>,
    reference: String,
    #[serde(default)]
    tests: Vec<RawCase>,
}

/// `because` (and `next`): one template, or cases (`- when: expr` /
/// `text: template`), the last without `when`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawMessage {
    One(Spanned<String>),
    Cases(Vec<RawMessageCase>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMessageCase {
    when: Option<Spanned<String>>,
    text: Spanned<String>,
}

/// A value in a test case's `given`: a number, a size (`2GiB`), a boolean or a series.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum Given {
    Bool(bool),
    Num(f64),
    Text(String),
    List(Vec<GivenItem>),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum GivenItem {
    Num(f64),
    Text(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawCase {
    name: String,
    #[serde(default)]
    given: BTreeMap<String, Spanned<Given>>,
    #[serde(default)]
    kinds: Vec<KindName>,
    torch: Option<String>,
    backend: Option<BackendName>,
    fires: bool,
    recommends: Option<BTreeMap<String, String>>,
    says: Option<String>,
    site: Option<String>,
}

/// `>=2.1`, `<2.1`, `>=1.10, <2.1`: every clause must hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionReq {
    pub text: String,
    clauses: Vec<(Cmp, TorchVersion)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cmp {
    Ge,
    Gt,
    Le,
    Lt,
    Eq,
}

impl VersionReq {
    pub fn parse(text: &str) -> Result<VersionReq, String> {
        let mut clauses = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (cmp, rest) = if let Some(r) = part.strip_prefix(">=") {
                (Cmp::Ge, r)
            } else if let Some(r) = part.strip_prefix("<=") {
                (Cmp::Le, r)
            } else if let Some(r) = part.strip_prefix('>') {
                (Cmp::Gt, r)
            } else if let Some(r) = part.strip_prefix('<') {
                (Cmp::Lt, r)
            } else if let Some(r) = part.strip_prefix("==") {
                (Cmp::Eq, r)
            } else {
                (Cmp::Eq, part)
            };
            let v = TorchVersion::parse(rest.trim()).ok().ok_or_else(|| {
                format!(
                    "invalid version '{}' in '{text}' (expected e.g. >=2.1, <2.1)",
                    rest.trim()
                )
            })?;
            clauses.push((cmp, v));
        }
        if clauses.is_empty() {
            return Err(format!("empty version requirement '{text}'"));
        }
        Ok(VersionReq {
            text: text.to_string(),
            clauses,
        })
    }

    fn holds(&self, v: TorchVersion) -> bool {
        self.clauses.iter().all(|&(cmp, x)| match cmp {
            Cmp::Ge => v >= x,
            Cmp::Gt => v > x,
            Cmp::Le => v <= x,
            Cmp::Lt => v < x,
            Cmp::Eq => v == x,
        })
    }

    /// Whether every version in `range` satisfies this requirement: `Some(true)`
    /// all do, `Some(false)` none do, `None` the range straddles it or is unknown.
    pub fn check(&self, range: VersionRange) -> Option<bool> {
        // Versions are discrete (major.minor); checking the ends plus each clause's
        // boundary inside the range is exact for conjunctions of comparisons.
        let lo = range.lo.unwrap_or(TorchVersion::new(0, 0));
        let hi = range.hi.unwrap_or(TorchVersion::new(u16::MAX, u16::MAX));
        let mut probes = vec![lo, hi];
        for &(_, x) in &self.clauses {
            for p in [
                Some(x),
                x.minor
                    .checked_sub(1)
                    .map(|m| TorchVersion::new(x.major, m)),
                Some(TorchVersion::new(x.major, x.minor.saturating_add(1))),
            ]
            .into_iter()
            .flatten()
            {
                if p >= lo && p <= hi {
                    probes.push(p);
                }
            }
        }
        let all = probes.iter().all(|&p| self.holds(p));
        let none = probes.iter().all(|&p| !self.holds(p));
        match (all, none) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        }
    }
}

/// Where a rule applies.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AppliesTo {
    /// Evidence kinds of which at least one must be present; empty = any.
    pub kinds: Vec<Kind>,
    pub torch: Option<VersionReq>,
    pub backend: Option<Backend>,
}

impl AppliesTo {
    /// `None` when the rule applies; otherwise the verdict that says why not.
    pub(super) fn excludes(&self, facts: &Facts) -> Option<Verdict> {
        if !self.kinds.is_empty() && !self.kinds.iter().any(|k| facts.kinds.contains(k)) {
            return Some(Verdict::NotApplicable(
                "no evidence of the kind it reads".into(),
            ));
        }
        if let Some(b) = self.backend {
            // An unstated backend is the default: native.
            if facts.backend.unwrap_or(Backend::Native) != b {
                return Some(Verdict::NotApplicable("another allocator backend".into()));
            }
        }
        if let Some(req) = &self.torch {
            match req.check(facts.torch) {
                Some(true) => {}
                Some(false) => {
                    return Some(Verdict::NotApplicable(format!(
                        "PyTorch version outside {}",
                        req.text
                    )));
                }
                None => return Some(Verdict::NotEvaluated(vec!["torch_version".into()])),
            }
        }
        None
    }
}

/// A checked rule.
#[derive(Debug, Clone)]
pub struct Rule {
    pub id: String,
    pub title: String,
    pub severity: Severity,
    pub cause: Option<Cause>,
    pub priority: i32,
    pub applies_to: AppliesTo,
    pub when_text: String,
    pub when: Expr,
    pub recommend: BTreeMap<String, ValueTemplate>,
    pub because: Message,
    pub next: Option<Message>,
    /// The text metric the finding's source location comes from.
    pub site: Option<String>,
    pub reference: String,
    pub tests: Vec<TestCase>,
    /// The file it came from (`rules/<id>.yaml` for embedded rules).
    pub source: String,
}

/// One of a rule's own test cases, checked.
#[derive(Debug, Clone)]
pub struct TestCase {
    pub name: String,
    pub facts: Facts,
    pub fires: bool,
    pub recommends: Option<BTreeMap<String, String>>,
    pub says: Option<String>,
    /// The site the finding must point to.
    pub site: Option<String>,
}

fn located<T>(file: &str, at: &Spanned<T>, message: String) -> RuleError {
    RuleError {
        file: file.to_string(),
        line: at.defined.line(),
        column: at.defined.column(),
        message,
    }
}

/// An expression error inside a YAML scalar: the scalar's position plus the column inside it.
fn expr_error(file: &str, at: &Spanned<String>, what: &str, e: &expr::ParseError) -> RuleError {
    located(
        file,
        at,
        format!(
            "{what}: {} (column {} of `{}`)",
            e.message,
            e.span.start + 1,
            at.value
        ),
    )
}

pub(super) fn parse_rule(file: &str, text: &str) -> Result<Rule, RuleError> {
    let raw: RawRule = serde_saphyr::from_str(text).map_err(|e| {
        let (line, column) = e.location().map_or((0, 0), |l| (l.line(), l.column()));
        RuleError {
            file: file.to_string(),
            line,
            column,
            message: e.to_string(),
        }
    })?;
    let when = expr::parse(&raw.when.value).map_err(|e| expr_error(file, &raw.when, "when", &e))?;
    let because = message(file, &raw.because, "because")?;
    let next = match &raw.next {
        Some(n) => Some(message(file, n, "next")?),
        None => None,
    };
    if let Some(site) = &raw.site {
        let text = super::catalog::lookup(&site.value)
            .is_some_and(|d| d.kind == super::catalog::MetricKind::Text);
        if !text {
            return Err(located(
                file,
                site,
                format!("site: '{}' is not a text metric", site.value),
            ));
        }
    }
    let mut recommend = BTreeMap::new();
    for (key, value) in &raw.recommend {
        let v = ValueTemplate::parse(&value.value)
            .map_err(|e| expr_error(file, value, &format!("recommend.{key}"), &e))?;
        recommend.insert(key.clone(), v);
    }
    let mut applies_to = AppliesTo::default();
    if let Some(a) = raw.applies_to {
        applies_to.kinds = a.kinds.into_iter().map(Kind::from).collect();
        applies_to.backend = a.backend.map(Backend::from);
        if let Some(t) = a.torch {
            applies_to.torch = Some(VersionReq::parse(&t.value).map_err(|m| located(file, &t, m))?);
        }
    }
    let default_kind = applies_to.kinds.first().copied().unwrap_or(Kind::Oom);
    let mut tests = Vec::with_capacity(raw.tests.len());
    for case in raw.tests {
        tests.push(check_case(file, case, default_kind)?);
    }
    Ok(Rule {
        id: raw.id,
        title: raw.title,
        severity: raw.severity,
        cause: raw.cause,
        priority: raw.priority,
        applies_to,
        when_text: raw.when.value,
        when,
        recommend,
        because,
        next,
        site: raw.site.map(|s| s.value),
        reference: raw.reference,
        tests,
        source: file.to_string(),
    })
}

fn message(file: &str, raw: &RawMessage, field: &str) -> Result<Message, RuleError> {
    let template =
        |t: &Spanned<String>| Template::parse(&t.value).map_err(|e| expr_error(file, t, field, &e));
    match raw {
        RawMessage::One(t) => Ok(Message::single(template(t)?)),
        RawMessage::Cases(cases) => {
            let mut out = Vec::with_capacity(cases.len());
            for (i, c) in cases.iter().enumerate() {
                let when = match &c.when {
                    Some(w) => Some((
                        expr::parse(&w.value)
                            .map_err(|e| expr_error(file, w, &format!("{field}.when"), &e))?,
                        w.value.clone(),
                    )),
                    None if i + 1 < cases.len() => {
                        return Err(located(
                            file,
                            &c.text,
                            format!("{field}: only the last case may omit `when`"),
                        ));
                    }
                    None => None,
                };
                out.push((when, template(&c.text)?));
            }
            if out.last().is_none_or(|(w, _)| w.is_some()) {
                return Err(RuleError {
                    file: file.to_string(),
                    line: 0,
                    column: 0,
                    message: format!(
                        "{field}: the last case must have no `when` (it is the fallback)"
                    ),
                });
            }
            Ok(Message::cases(out))
        }
    }
}

fn check_case(file: &str, case: RawCase, default_kind: Kind) -> Result<TestCase, RuleError> {
    let mut facts = Facts {
        kinds: if case.kinds.is_empty() {
            vec![default_kind]
        } else {
            case.kinds.into_iter().map(Kind::from).collect()
        },
        backend: case.backend.map(Backend::from),
        ..Facts::default()
    };
    if let Some(t) = &case.torch {
        let v = TorchVersion::parse(t).map_err(|_| RuleError {
            file: file.to_string(),
            line: 0,
            column: 0,
            message: format!("test '{}': invalid torch version '{t}'", case.name),
        })?;
        facts.torch = VersionRange::exact(v);
    }
    facts.set(
        "cuda_context",
        super::Fact::Num(super::catalog::CUDA_CONTEXT as f64),
    );
    for (name, value) in case.given {
        let bad = |m: String| located(file, &value, format!("test '{}': {m}", case.name));
        let def =
            super::catalog::lookup(&name).ok_or_else(|| bad(format!("unknown metric '{name}'")))?;
        use super::catalog::MetricKind as K;
        if let (K::Text, Given::Text(t)) = (def.kind, &value.value) {
            facts.set_text(&name, t.clone());
            continue;
        }
        let fact = match (def.kind, &value.value) {
            (K::Bool, Given::Bool(b)) => super::Fact::Bool(*b),
            (K::Bytes | K::Number, Given::Num(n)) => super::Fact::Num(*n),
            (K::Bytes, Given::Text(s)) => super::Fact::Num(size(s).map_err(&bad)?),
            (K::Series, Given::List(items)) => super::Fact::Series(
                items
                    .iter()
                    .map(|i| match i {
                        GivenItem::Num(n) => Ok(*n),
                        GivenItem::Text(s) => size(s),
                    })
                    .collect::<Result<_, _>>()
                    .map_err(&bad)?,
            ),
            (kind, _) => return Err(bad(format!("'{name}' needs a {kind:?} value"))),
        };
        if name == "torch_version" {
            return Err(bad("give the version with `torch:`, not as a metric".into()));
        }
        facts.set(&name, fact);
    }
    Ok(TestCase {
        name: case.name,
        facts,
        fires: case.fires,
        recommends: case.recommends,
        says: case.says,
        site: case.site,
    })
}

fn size(s: &str) -> Result<f64, String> {
    crate::units::parse_size(s).map(|v| v as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_requirements_against_ranges() {
        let req = VersionReq::parse(">=2.1").unwrap();
        let v = |a, b| Some(TorchVersion::new(a, b));
        assert_eq!(
            req.check(VersionRange {
                lo: v(2, 4),
                hi: None
            }),
            Some(true)
        );
        assert_eq!(
            req.check(VersionRange {
                lo: v(1, 10),
                hi: v(2, 0)
            }),
            Some(false)
        );
        assert_eq!(
            req.check(VersionRange {
                lo: v(1, 10),
                hi: v(2, 3)
            }),
            None
        );
        assert_eq!(req.check(VersionRange::default()), None);
        let old = VersionReq::parse(">=1.10, <2.1").unwrap();
        assert_eq!(
            old.check(VersionRange::exact(TorchVersion::new(2, 0))),
            Some(true)
        );
        assert_eq!(
            old.check(VersionRange::exact(TorchVersion::new(2, 10))),
            Some(false)
        );
        assert!(VersionReq::parse(">=two").is_err());
    }

    const MINIMAL: &str = "id: demo\ntitle: Demo\nseverity: warning\nwhen: requested > 1GiB\nbecause: \"{requested|size} asked\"\nreference: https://example.org\n";

    #[test]
    fn errors_name_file_line_and_column() {
        let bad = MINIMAL.replace("warning", "fatal");
        let e = parse_rule("rules/demo.yaml", &bad).unwrap_err();
        assert_eq!((e.file.as_str(), e.line), ("rules/demo.yaml", 3), "{e}");
        assert!(e.message.contains("fatal"), "{e}");
        let bad = MINIMAL.replace("requested > 1GiB", "requested > 1 GB and bogus");
        let e = parse_rule("r.yaml", &bad).unwrap_err();
        assert_eq!((e.line, e.column), (4, 7), "{e}");
        assert!(
            e.to_string()
                .starts_with("r.yaml:4:7: when: expected an operator"),
            "{e}"
        );
        let bad = MINIMAL.replace("{requested|size}", "{requestd|size}");
        let e = parse_rule("r.yaml", &bad).unwrap_err();
        assert!(e.message.contains("unknown metric 'requestd'"), "{e}");
        let e = parse_rule("r.yaml", &format!("{MINIMAL}colour: red\n")).unwrap_err();
        assert!(e.message.contains("colour"), "{e}");
    }

    #[test]
    fn a_site_names_a_text_metric_that_expressions_cannot_read() {
        let with_site = format!("{MINIMAL}site: empty_cache_site\n");
        let rule = parse_rule("r.yaml", &with_site).unwrap();
        let mut facts = Facts {
            kinds: vec![Kind::Oom],
            ..Facts::default()
        };
        facts.set("requested", super::super::Fact::Num(2147483648.0));
        let site = |facts: &Facts| match rule.evaluate(facts) {
            Verdict::Fired(f) => f.site,
            other => panic!("{other:?}"),
        };
        assert_eq!(site(&facts), None);
        facts.set_text("empty_cache_site", "train.py:88:train".into());
        assert_eq!(site(&facts).as_deref(), Some("train.py:88:train"));

        let e = parse_rule("r.yaml", &format!("{MINIMAL}site: requested\n")).unwrap_err();
        assert_eq!(e.line, 7, "{e}");
        assert!(
            e.message.contains("'requested' is not a text metric"),
            "{e}"
        );
        let bad = MINIMAL.replace("requested > 1GiB", "empty_cache_site > 1");
        let e = parse_rule("r.yaml", &bad).unwrap_err();
        assert!(e.message.contains("is a source location"), "{e}");
    }

    #[test]
    fn minimal_rule_loads_and_fires() {
        let rule = parse_rule("r.yaml", MINIMAL).unwrap();
        let mut facts = Facts {
            kinds: vec![Kind::Oom],
            ..Facts::default()
        };
        assert_eq!(
            rule.evaluate(&facts),
            Verdict::NotEvaluated(vec!["requested".into()])
        );
        facts.set("requested", super::super::Fact::Num(2147483648.0));
        match rule.evaluate(&facts) {
            Verdict::Fired(f) => assert_eq!(f.message, "2.00 GiB asked"),
            other => panic!("{other:?}"),
        }
    }
}
