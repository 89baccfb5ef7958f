//! The `rules list|show|test` command.

use super::{Format, Outcome};
use crate::Error;
use crate::rules::{self, RuleSet};
use std::fmt::Write;
use std::path::PathBuf;

#[derive(Debug, Clone)]
pub enum RulesAction {
    List,
    Show(String),
    /// Run every rule's own test cases (embedded rules plus DIR, if given).
    Test(Option<PathBuf>),
}

#[derive(Debug, Clone)]
pub struct RulesOptions {
    pub action: RulesAction,
    pub rules_dir: Option<PathBuf>,
    pub format: Format,
}

pub fn run(opts: &RulesOptions) -> Result<Outcome, Error> {
    let dir = match &opts.action {
        RulesAction::Test(Some(d)) => Some(d.as_path()),
        _ => opts.rules_dir.as_deref(),
    };
    let set = RuleSet::with_dir(dir)?;
    match &opts.action {
        RulesAction::List => Ok(Outcome::ok(crate::report::rules::list(
            &set.rules,
            opts.format,
        ))),
        RulesAction::Show(id) => {
            let rule = set.get(id).ok_or_else(|| {
                Error::Usage(format!(
                    "no rule '{id}' (known: {})",
                    set.rules
                        .iter()
                        .map(|r| r.id.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })?;
            Ok(Outcome::ok(crate::report::rules::show(rule, opts.format)))
        }
        RulesAction::Test(_) => {
            let results = rules::run_tests(&set.rules);
            let failed = results.iter().filter(|r| r.failure.is_some()).count();
            let mut out = crate::report::rules::test(&results, opts.format);
            if opts.format == Format::Text {
                let _ = writeln!(
                    out,
                    "{} rules, {} cases, {} failed",
                    set.rules.len(),
                    results.len(),
                    failed
                );
            }
            Ok(Outcome {
                stdout: out,
                stderr: Vec::new(),
                exit_code: i32::from(failed > 0),
            })
        }
    }
}
