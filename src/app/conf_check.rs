//! The `conf check` command.

use super::{Format, Outcome};
use crate::Error;

#[derive(Debug, Clone, Default)]
pub struct ConfCheckOptions {
    pub conf: String,
    pub torch_version: Option<String>,
    pub format: Format,
}

pub fn run(opts: &ConfCheckOptions) -> Result<Outcome, Error> {
    let _ = opts;
    Err(Error::Usage("`conf check` is not built yet".into()))
}
