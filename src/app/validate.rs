//! The `validate` command.

use super::{Format, Outcome};
use crate::Error;
use std::path::PathBuf;

#[derive(Debug, Clone, Default)]
pub struct ValidateOptions {
    pub input: String,
    /// The candidate config.
    pub conf: String,
    /// The config the user runs today (default: PyTorch's defaults).
    pub current: Option<String>,
    pub capacity: Option<u64>,
    /// `sim` or `cuda[:N]`.
    pub device: String,
    pub report: Option<PathBuf>,
    pub format: Format,
}

pub fn run(opts: &ValidateOptions) -> Result<Outcome, Error> {
    let _ = opts;
    Err(Error::Usage("`validate` is not built yet".into()))
}
