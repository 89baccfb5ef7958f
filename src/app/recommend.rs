//! The `recommend` command.

use super::{Format, Outcome};
use crate::Error;
use std::path::PathBuf;

#[derive(Debug, Clone, Default)]
pub struct RecommendOptions {
    pub input: String,
    pub capacity: Option<u64>,
    pub report: Option<PathBuf>,
    pub format: Format,
}

pub fn run(opts: &RecommendOptions) -> Result<Outcome, Error> {
    let _ = opts;
    Err(Error::Usage("`recommend` is not built yet".into()))
}
