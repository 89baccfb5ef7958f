//! The `parse` command.

use super::{Format, Outcome};
use crate::Error;

#[derive(Debug, Clone, Default)]
pub struct ParseOptions {
    /// Paths (or `-` for standard input); empty means standard input.
    pub inputs: Vec<String>,
    pub format: Format,
}

pub fn run(opts: &ParseOptions) -> Result<Outcome, Error> {
    let _ = opts;
    Err(Error::Usage("`parse` is not built yet".into()))
}
