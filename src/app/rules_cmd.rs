//! The `rules list|show|test` command.

use super::{Format, Outcome};
use crate::Error;
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
    let _ = opts;
    Err(Error::Usage("`rules` is not built yet".into()))
}
