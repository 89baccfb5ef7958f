//! The YAML rule engine: the rule model (one rule per file in `rules/`,
//! embedded in the binary; `--rules DIR` adds or overrides by id), the small
//! expression language ([`expr`]) and the metric catalogue ([`catalog`]).
//! A rule is evaluated against [`Facts`]: metric values derived from the
//! evidence (by `advise::facts`) or given by the rule's own test cases.

pub mod catalog;
mod embedded;
pub mod expr;
mod model;
mod template;
mod testing;

pub use model::{AppliesTo, Cause, Rule, Severity, TestCase, VersionReq};
pub use template::{Message, Template};
pub use testing::{CaseResult, run_tests};

use crate::conf::TorchVersion;
use crate::evidence::{Backend, Kind};
use expr::{Env, EvalError, MetricValue, Value};
use std::collections::BTreeMap;
use std::path::Path;

/// A metric's value in [`Facts`].
#[derive(Debug, Clone, PartialEq)]
pub enum Fact {
    Num(f64),
    Bool(bool),
    Series(Vec<f64>),
}

/// The range of PyTorch versions the evidence allows (from `--torch-version`
/// or the message format's era); both ends inclusive, `None` = open.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VersionRange {
    pub lo: Option<TorchVersion>,
    pub hi: Option<TorchVersion>,
}

impl VersionRange {
    pub fn exact(v: TorchVersion) -> Self {
        VersionRange {
            lo: Some(v),
            hi: Some(v),
        }
    }
}

/// What rules are evaluated against.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Facts {
    pub values: BTreeMap<String, Fact>,
    /// Text metrics (source locations), which only a rule's `site:` names.
    pub texts: BTreeMap<String, String>,
    /// Evidence kinds present in the inputs.
    pub kinds: Vec<Kind>,
    pub torch: VersionRange,
    pub backend: Option<Backend>,
}

impl Facts {
    pub fn set(&mut self, name: &str, value: Fact) {
        self.values.insert(name.to_string(), value);
    }

    pub fn set_text(&mut self, name: &str, value: String) {
        self.texts.insert(name.to_string(), value);
    }
}

impl Env for Facts {
    fn metric(&self, name: &str) -> Option<MetricValue<'_>> {
        if name == "torch_version" {
            return match (self.torch.lo, self.torch.hi) {
                (Some(lo), Some(hi)) if lo == hi => Some(MetricValue::Num(
                    f64::from(lo.major) * 100.0 + f64::from(lo.minor),
                )),
                _ => None,
            };
        }
        self.values.get(name).map(|f| match f {
            Fact::Num(n) => MetricValue::Num(*n),
            Fact::Bool(b) => MetricValue::Bool(*b),
            Fact::Series(s) => MetricValue::Series(s),
        })
    }
}

/// A rule that fired: its message, the settings it recommends and the metric
/// values it read.
#[derive(Debug, Clone, PartialEq)]
pub struct Firing {
    pub message: String,
    pub settings: BTreeMap<String, String>,
    pub evidence: BTreeMap<String, Value>,
    pub next: Option<String>,
    /// The source location the rule's `site:` metric names, when known.
    pub site: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Fired(Firing),
    /// Evaluated and false.
    Quiet,
    /// The evidence lacks what the rule needs (metric names, or `torch_version`).
    NotEvaluated(Vec<String>),
    /// The rule does not apply to this evidence (kind, version or backend), with why.
    NotApplicable(String),
    /// The expression failed at run time (a type error the loader could not see).
    Failed(String),
}

impl Rule {
    /// Evaluates this rule against `facts`.
    pub fn evaluate(&self, facts: &Facts) -> Verdict {
        if let Some(why) = self.applies_to.excludes(facts) {
            return why;
        }
        match self.when.eval_bool(facts) {
            Ok(false) => Verdict::Quiet,
            Err(EvalError::Missing(m)) => Verdict::NotEvaluated(m),
            Err(EvalError::Type(t)) => Verdict::Failed(t),
            Ok(true) => {
                let mut settings = BTreeMap::new();
                for (key, value) in &self.recommend {
                    match value.render_value(key, facts) {
                        Ok(v) => {
                            settings.insert(key.clone(), v);
                        }
                        Err(EvalError::Missing(m)) => return Verdict::NotEvaluated(m),
                        Err(EvalError::Type(t)) => return Verdict::Failed(t),
                    }
                }
                let mut names = Vec::new();
                self.when.metrics(&mut names);
                let evidence = names
                    .into_iter()
                    .filter_map(|n| {
                        let v = match facts.metric(&n)? {
                            MetricValue::Num(x) => Value::Num(x),
                            MetricValue::Bool(b) => Value::Bool(b),
                            MetricValue::Series(s) => Value::Num(s.last().copied()?),
                        };
                        Some((n, v))
                    })
                    .collect();
                Verdict::Fired(Firing {
                    message: self.because.render(facts),
                    settings,
                    evidence,
                    next: self.next.as_ref().map(|t| t.render(facts)),
                    site: self.site.as_ref().and_then(|m| facts.texts.get(m).cloned()),
                })
            }
        }
    }
}

/// Every rule, embedded ones first, then those of the extra directory (which
/// replace an embedded rule with the same id).
#[derive(Debug, Clone, Default)]
pub struct RuleSet {
    pub rules: Vec<Rule>,
}

/// A rule file that could not be loaded, with where.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{file}:{line}:{column}: {message}")]
pub struct RuleError {
    pub file: String,
    pub line: u64,
    pub column: u64,
    pub message: String,
}

impl RuleSet {
    /// The embedded rules.
    pub fn embedded() -> Result<RuleSet, RuleError> {
        let mut set = RuleSet::default();
        for (name, text) in embedded::FILES {
            set.add(model::parse_rule(name, text)?);
        }
        Ok(set)
    }

    /// The embedded rules plus every `*.yaml`/`*.yml` file in `dir` (sorted by name).
    pub fn with_dir(dir: Option<&Path>) -> Result<RuleSet, crate::Error> {
        let mut set = Self::embedded().map_err(|e| crate::Error::Input(e.to_string()))?;
        if let Some(dir) = dir {
            for rule in load_dir(dir)? {
                set.add(rule);
            }
        }
        Ok(set)
    }

    fn add(&mut self, rule: Rule) {
        match self.rules.iter_mut().find(|r| r.id == rule.id) {
            Some(slot) => *slot = rule,
            None => self.rules.push(rule),
        }
    }

    pub fn get(&self, id: &str) -> Option<&Rule> {
        self.rules.iter().find(|r| r.id == id)
    }
}

/// The rules in `dir`, each file holding one rule.
pub fn load_dir(dir: &Path) -> Result<Vec<Rule>, crate::Error> {
    let entries = std::fs::read_dir(dir).map_err(|e| {
        crate::Error::Input(format!(
            "{}: cannot read the rules directory: {e}",
            dir.display()
        ))
    })?;
    let mut paths: Vec<_> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    paths.sort();
    let mut rules = Vec::with_capacity(paths.len());
    for path in paths {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(&path)
            .map_err(|e| crate::Error::Input(format!("{name}: cannot read: {e}")))?;
        rules
            .push(model::parse_rule(&name, &text).map_err(|e| crate::Error::Input(e.to_string()))?);
    }
    Ok(rules)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_rules_load_and_pass_their_own_tests() {
        let set = RuleSet::embedded().unwrap_or_else(|e| panic!("{e}"));
        assert!(set.rules.len() >= 20, "{} rules", set.rules.len());
        let failures: Vec<_> = run_tests(&set.rules)
            .into_iter()
            .filter(|r| r.failure.is_some())
            .collect();
        assert!(failures.is_empty(), "{failures:#?}");
    }

    #[test]
    fn a_directory_rule_overrides_by_id() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("capacity.yaml"),
            "id: capacity\ntitle: Mine\nseverity: info\nwhen: requested > 0\nbecause: mine\nreference: x\n",
        )
        .unwrap();
        let set = RuleSet::with_dir(Some(dir.path())).unwrap();
        let embedded = RuleSet::embedded().unwrap();
        assert_eq!(set.rules.len(), embedded.rules.len());
        assert_eq!(set.get("capacity").map(|r| r.title.as_str()), Some("Mine"));
        std::fs::write(dir.path().join("bad.yaml"), "id: [").unwrap();
        let err = RuleSet::with_dir(Some(dir.path())).unwrap_err().to_string();
        assert!(err.contains("bad.yaml:1:"), "{err}");
    }
}
