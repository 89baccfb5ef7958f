//! The `conf check` command: is a `PYTORCH_CUDA_ALLOC_CONF` value valid for a
//! PyTorch version ([`crate::advise::conf_check`]), rendered.

use super::{Format, Outcome};
use crate::Error;
use crate::conf::TorchVersion;

#[derive(Debug, Clone, Default)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct ConfCheckOptions {
    /// The value, as it would be set in the environment ('' is PyTorch's defaults).
    pub conf: String,
    /// PyTorch version whose grammar and keys apply (default 2.6).
    #[cfg_attr(feature = "cli", arg(long))]
    pub torch_version: Option<String>,
    /// The platform PyTorch runs on: settings it ignores there are flagged (default linux).
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value_t))]
    pub platform: crate::conf::Platform,
    /// Output format.
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value_t, global = true))]
    pub format: Format,
}

pub fn run(opts: &ConfCheckOptions) -> Result<Outcome, Error> {
    let version = match &opts.torch_version {
        Some(text) => TorchVersion::parse(text).map_err(|e| Error::Usage(e.to_string()))?,
        None => TorchVersion::DEFAULT,
    };
    let report = crate::advise::conf_check::check(&opts.conf, version, opts.platform);
    let stdout = match opts.format {
        Format::Text => crate::report::conf::text(&report),
        Format::Json | Format::Jsonl => crate::report::conf::json(&report),
        Format::Markdown => crate::report::conf::markdown(&report),
    };
    Ok(Outcome {
        stdout: opts.format.finish(stdout),
        stderr: Vec::new(),
        exit_code: if report.valid { 0 } else { 1 },
    })
}
