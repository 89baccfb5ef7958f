//! The `diagnose` command.

use super::{Format, Outcome};
use crate::Error;
use std::path::PathBuf;

#[derive(Debug, Clone, Default)]
pub struct DiagnoseOptions {
    pub inputs: Vec<String>,
    pub format: Format,
    /// List rules that were not evaluated and why.
    pub verbose: bool,
    /// Extra rule files that add to or override the embedded ones.
    pub rules_dir: Option<PathBuf>,
    /// The user's PyTorch version when the evidence does not say.
    pub torch_version: Option<String>,
    /// Write a self-contained HTML report here.
    pub report: Option<PathBuf>,
}

pub fn run(opts: &DiagnoseOptions) -> Result<Outcome, Error> {
    let _ = opts;
    Err(Error::Usage("`diagnose` is not built yet".into()))
}
