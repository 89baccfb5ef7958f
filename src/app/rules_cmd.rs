//! The `rules list|show|test` command.

use super::{Format, Outcome};
use crate::Error;
use crate::rules::{self, RuleSet};
use std::fmt::Write;
use std::path::PathBuf;

#[derive(Debug, Clone)]
#[cfg_attr(feature = "cli", derive(clap::Subcommand))]
pub enum RulesAction {
    /// List every rule: id, severity and what it detects.
    #[cfg_attr(
        feature = "cli",
        command(
            after_help = "Examples:\n  allocdoc rules list\n  allocdoc rules list --rules my-rules/ --format markdown"
        )
    )]
    List,
    /// Show one rule in full: its condition, message and test cases.
    #[cfg_attr(
        feature = "cli",
        command(
            after_help = "Examples:\n  allocdoc rules show reserved-gap\n  allocdoc rules show capacity --format json"
        )
    )]
    Show {
        /// The rule's id, as `rules list` prints it.
        id: String,
    },
    /// Run every rule's own test cases (exit 1 when one fails).
    #[cfg_attr(
        feature = "cli",
        command(after_help = "Examples:\n  allocdoc rules test\n  allocdoc rules test my-rules/")
    )]
    Test {
        /// A directory of extra YAML rules to load and test with the built-in ones.
        dir: Option<PathBuf>,
    },
}

#[derive(Debug, Clone)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct RulesOptions {
    #[cfg_attr(feature = "cli", command(subcommand))]
    pub action: RulesAction,
    /// A directory of extra YAML rules.
    #[cfg_attr(
        feature = "cli",
        arg(long = "rules", value_name = "RULES", global = true)
    )]
    pub rules_dir: Option<PathBuf>,
    /// Output format.
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value_t, global = true))]
    pub format: Format,
}

pub fn run(opts: &RulesOptions) -> Result<Outcome, Error> {
    let dir = match &opts.action {
        RulesAction::Test { dir: Some(d) } => Some(d.as_path()),
        _ => opts.rules_dir.as_deref(),
    };
    let set = RuleSet::with_dir(dir)?;
    match &opts.action {
        RulesAction::List => Ok(Outcome::ok(
            opts.format
                .finish(crate::report::rules::list(&set.rules, opts.format)),
        )),
        RulesAction::Show { id } => {
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
            Ok(Outcome::ok(
                opts.format
                    .finish(crate::report::rules::show(rule, opts.format)),
            ))
        }
        RulesAction::Test { .. } => {
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
                stdout: opts.format.finish(out),
                stderr: Vec::new(),
                exit_code: i32::from(failed > 0),
            })
        }
    }
}
