//! The `validate` command: the current and a candidate config side by side on
//! the same workload, and a verdict ([`crate::trial::validate`]). A trace
//! (CSV, snapshot) is replayed as recorded; text-only evidence (an OOM
//! message, summaries) gets a probe fitted to its figures.

use super::{Format, Outcome};
use crate::Error;
use crate::device::DeviceSpec;
use crate::report::recommend::{validation, validation_html};
use crate::trial::run::{conf_name, parse_conf};
use crate::trial::{Workload, validate, views};
use std::path::PathBuf;

#[derive(Debug, Clone, Default)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct ValidateOptions {
    /// A trace CSV, an RMM replay log, a snapshot pickle, or text evidence (an OOM message, memory_summary()), which gets a fitted synthetic probe.
    pub input: String,
    /// The candidate config.
    #[cfg_attr(feature = "cli", arg(long))]
    pub conf: String,
    /// The config in use today (default: PyTorch's defaults).
    #[cfg_attr(feature = "cli", arg(long))]
    pub current: Option<String>,
    /// Device capacity, e.g. 24GiB (default: what the evidence implies, else an
    /// 80 GiB simulated card, or the free memory of the GPU with --device cuda).
    #[cfg_attr(feature = "cli", arg(long, value_parser = crate::units::parse_device_size))]
    pub capacity: Option<u64>,
    /// `sim` (default) or `cuda[:N]`.
    #[cfg_attr(feature = "cli", arg(long, default_value = "sim"))]
    pub device: String,
    /// Also write a self-contained HTML report: both configs' memory over the
    /// trace overlaid, the segment map at the OOM or the peak, the verdict.
    #[cfg_attr(feature = "cli", arg(long))]
    pub report: Option<PathBuf>,
    /// Output format.
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value_t, global = true))]
    pub format: Format,
    /// How much one input may make allocdoc read and hold.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub limits: crate::limits::Limits,
}

pub fn run(opts: &ValidateOptions) -> Result<Outcome, Error> {
    let spec = DeviceSpec::parse(&opts.device)?;
    let current_conf = opts.current.clone().unwrap_or_default();
    let current = parse_conf("--current", &current_conf)?;
    let candidate = parse_conf("--conf", &opts.conf)?;
    let workload = Workload::load(
        &opts.input,
        opts.capacity,
        &current_conf,
        &current,
        &opts.limits,
    )?;
    let (current_conf, current, note) = workload.current(opts.current.as_deref(), current);
    let v = validate::validate(
        &workload,
        (spec, &opts.device),
        (&current_conf, &current),
        (&opts.conf, &candidate),
        workload.capacity(opts.capacity),
    )?;
    let stdout = validation(&v, opts.format);
    if let Some(path) = &opts.report {
        // The pictures come from the simulated card, whatever --device ran the verdict.
        let runs = [
            (conf_name(&current_conf), &current),
            (conf_name(&opts.conf), &candidate),
        ];
        let views = views::of_workload(&workload, &runs, v.capacity_bytes)?;
        std::fs::write(path, validation_html(&v, &views))
            .map_err(|e| Error::Input(format!("{}: {e}", path.display())))?;
    }
    Ok(Outcome {
        stdout,
        stderr: note.into_iter().map(|n| format!("note: {n}")).collect(),
        exit_code: v.verdict.exit_code,
    })
}
