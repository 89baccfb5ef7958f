//! The `replay` command.

use super::{Format, Outcome};
use crate::Error;
use std::path::PathBuf;

#[derive(Debug, Clone, Default)]
pub struct ReplayOptions {
    pub trace: String,
    /// One run per config, in order; empty means the default config.
    pub confs: Vec<String>,
    pub capacity: Option<u64>,
    /// `sim` or `cuda[:N]`.
    pub device: String,
    pub fidelity: bool,
    /// Print PyTorch's memory_summary() per run at its peak and at the end.
    pub summary: bool,
    pub torch_version: Option<String>,
    pub compare_with: Option<PathBuf>,
    pub emit_snapshot: Option<PathBuf>,
    pub report: Option<PathBuf>,
    pub format: Format,
}

pub fn run(opts: &ReplayOptions) -> Result<Outcome, Error> {
    let _ = opts;
    Err(Error::Usage("`replay` is not built yet".into()))
}
