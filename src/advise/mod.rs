//! Findings, the cause, and the combined recommendation: runs the rules over
//! the facts derived from the evidence and turns what fired into one answer.
//!
//! The cause is the `cause` of the highest-priority rule that fired (rules
//! without a cause only add findings and settings); `unknown` when none did.
//! The recommendation is null whenever that cause rules out an allocator
//! setting (request larger than the card, capacity, not the allocator, other
//! processes), whatever else fired.

pub mod combine;
pub mod conf_check;
pub mod context;
pub mod facts;
pub mod space;

pub use combine::Recommendation;
pub use context::Context;

use crate::evidence::{Evidence, Kind};
use crate::rules::expr::Value;
use crate::rules::{Cause, Facts, RuleSet, Severity, Verdict};
use serde::Serialize;
use std::collections::BTreeMap;

/// One fired rule, as reported.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    pub rule: String,
    pub severity: Severity,
    pub message: String,
    /// The metric values the rule's condition read.
    pub evidence: BTreeMap<String, Value>,
    #[serde(skip)]
    pub title: String,
    #[serde(skip)]
    pub next: Option<String>,
    #[serde(skip)]
    pub reference: String,
    #[serde(skip)]
    pub cause: Option<Cause>,
    #[serde(skip)]
    pub priority: i32,
}

/// A rule that could not be evaluated, and what it needed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NotEvaluated {
    pub rule: String,
    pub needs: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Diagnosis {
    pub evidence: Evidence,
    /// Index into `evidence.observations` of the observation diagnosed.
    pub primary: Option<usize>,
    pub cause: Cause,
    /// The one-line answer.
    pub verdict: String,
    pub findings: Vec<Finding>,
    pub recommendation: Option<Recommendation>,
    pub not_evaluated: Vec<NotEvaluated>,
    /// Rules whose expression failed at run time (a rule-file bug), with why.
    pub failed: Vec<(String, String)>,
    /// The current config, when known, and where it came from.
    pub current_conf: Option<(String, &'static str)>,
    pub facts: Facts,
}

/// Runs every rule over `evidence` and combines the result.
pub fn diagnose(evidence: Evidence, ctx: &Context, rules: &RuleSet) -> Diagnosis {
    let facts = facts::facts(&evidence, ctx);
    let primary = facts::primary(&evidence).and_then(|p| {
        evidence
            .observations
            .iter()
            .position(|o| std::ptr::eq(o, p))
    });
    let mut findings = Vec::new();
    let mut fired = Vec::new();
    let mut not_evaluated = Vec::new();
    let mut failed = Vec::new();
    for rule in &rules.rules {
        match rule.evaluate(&facts) {
            Verdict::Fired(f) => {
                findings.push(Finding {
                    rule: rule.id.clone(),
                    severity: rule.severity,
                    message: f.message,
                    evidence: f.evidence,
                    title: rule.title.clone(),
                    next: f.next,
                    reference: rule.reference.clone(),
                    cause: rule.cause,
                    priority: rule.priority,
                });
                fired.push((rule, f.settings));
            }
            Verdict::NotEvaluated(needs) => not_evaluated.push(NotEvaluated {
                rule: rule.id.clone(),
                needs,
            }),
            Verdict::Failed(why) => failed.push((rule.id.clone(), why)),
            Verdict::Quiet | Verdict::NotApplicable(_) => {}
        }
    }
    // Highest priority first; ties keep rule order (stable sort).
    findings.sort_by_key(|f| std::cmp::Reverse((f.priority, f.severity)));
    let deciding = findings.iter().find(|f| f.cause.is_some());
    let cause = deciding.and_then(|f| f.cause).unwrap_or(Cause::Unknown);
    let verdict = match deciding {
        Some(f) => format!("{}: {}", cause.as_str(), f.message),
        None if evidence.observations.is_empty() => {
            "No OOM message, memory summary, stats dump or snapshot was found in the input.".into()
        }
        None if !facts.kinds.iter().any(|k| matches!(k, Kind::Oom | Kind::NonAllocatorOom))
            && !facts.values.contains_key("requested") =>
        {
            match findings.first() {
                Some(f) => format!("No out-of-memory error in the evidence; the memory state: {}", f.message),
                None => "No out-of-memory error in the evidence, and nothing in the memory state stands out.".into(),
            }
        }
        None => "Not enough evidence to name a cause.".into(),
    };
    let recommendation = if cause.rules_out_settings() || no_setting_can_help(&facts) {
        None
    } else {
        let with: Vec<_> = fired.iter().map(|(r, s)| (*r, s)).collect();
        combine::combine(&with, ctx.current.as_ref(), facts.torch)
    };
    Diagnosis {
        evidence,
        primary,
        cause,
        verdict,
        findings,
        recommendation,
        not_evaluated,
        failed,
        current_conf: ctx.current_source.clone(),
        facts,
    }
}

/// Holds whatever rules a `--rules` directory adds: no allocator setting is
/// ever recommended for a failure outside the allocator or for a request
/// larger than the whole card.
fn no_setting_can_help(facts: &Facts) -> bool {
    use crate::rules::Fact;
    let num = |n: &str| match facts.values.get(n) {
        Some(Fact::Num(v)) => Some(*v),
        _ => None,
    };
    let outside = facts.values.get("non_allocator_oom") == Some(&Fact::Bool(true));
    let too_large = matches!((num("requested"), num("capacity")), (Some(r), Some(c)) if r > c);
    outside || too_large
}
