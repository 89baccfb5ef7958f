//! `allocdoc rules test`: every rule's own cases, plus the requirement that
//! each rule has at least one case where it fires and one where it does not.

use super::{Rule, Verdict};

#[derive(Debug, Clone, PartialEq)]
pub struct CaseResult {
    pub rule: String,
    pub case: String,
    /// `None` when the case passed; otherwise what went wrong.
    pub failure: Option<String>,
}

/// Runs every case of every rule, in rule order.
pub fn run_tests(rules: &[Rule]) -> Vec<CaseResult> {
    let mut out = Vec::new();
    for rule in rules {
        for case in &rule.tests {
            out.push(CaseResult {
                rule: rule.id.clone(),
                case: case.name.clone(),
                failure: check(rule, case),
            });
        }
        let fires = rule.tests.iter().filter(|c| c.fires).count();
        if fires == 0 || fires == rule.tests.len() {
            out.push(CaseResult {
                rule: rule.id.clone(),
                case: "has firing and non-firing cases".into(),
                failure: Some(format!(
                    "{} firing and {} non-firing cases; each rule needs at least one of both",
                    fires,
                    rule.tests.len() - fires
                )),
            });
        }
    }
    out
}

fn check(rule: &Rule, case: &super::TestCase) -> Option<String> {
    match (rule.evaluate(&case.facts), case.fires) {
        (Verdict::Fired(f), true) => {
            if let Some(want) = &case.recommends
                && want != &f.settings
            {
                return Some(format!("recommends {:?}, expected {want:?}", f.settings));
            }
            if let Some(s) = &case.says
                && !f.message.contains(s.as_str())
            {
                return Some(format!(
                    "message \"{}\" does not contain \"{s}\"",
                    f.message
                ));
            }
            if case.site.is_some() && case.site != f.site {
                return Some(format!("points to {:?}, expected {:?}", f.site, case.site));
            }
            None
        }
        (Verdict::Fired(f), false) => Some(format!("fired (\"{}\") but should not", f.message)),
        (Verdict::Quiet | Verdict::NotApplicable(_), false) => None,
        (Verdict::Quiet, true) => Some("did not fire".into()),
        (Verdict::NotApplicable(why), true) => Some(format!("not applicable: {why}")),
        (Verdict::NotEvaluated(needs), _) => {
            Some(format!("not evaluated (needs {})", needs.join(", ")))
        }
        (Verdict::Failed(e), _) => Some(format!("evaluation failed: {e}")),
    }
}
