//! The `validate` command: the current and a candidate config side by side on
//! the same workload, and a verdict ([`crate::trial::validate`]). A trace
//! (CSV, snapshot) is replayed as recorded; text-only evidence (an OOM
//! message, summaries) gets a probe fitted to its figures.

use super::Outcome;
use super::input::{conf_at, ignored_notes, prepare};
use crate::Error;
use crate::device::DeviceSpec;
use crate::report::recommend::{rules_only, validation, validation_html};
use crate::trial::recommend::RulesOnly;
use crate::trial::run::conf_name;
use crate::trial::workload::Loaded;
use crate::trial::{validate, views};
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
    /// Your PyTorch version (e.g. 2.4) when the evidence does not show it: the
    /// configs are read and replayed as that version does.
    #[cfg_attr(feature = "cli", arg(long))]
    pub torch_version: Option<String>,
    /// The platform PyTorch runs on (default: what the evidence shows, else
    /// linux): settings it ignores there are replayed as ignored.
    #[cfg_attr(feature = "cli", arg(long, value_enum))]
    pub platform: Option<crate::conf::Platform>,
    /// Also write a self-contained HTML report: both configs' memory over the
    /// trace overlaid, the segment map at the OOM or the peak, the verdict.
    #[cfg_attr(feature = "cli", arg(long))]
    pub report: Option<PathBuf>,
    /// The output format, the inputs' limits, inputs held in memory.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub common: super::Common,
}

pub fn run(opts: &ValidateOptions) -> Result<Outcome, Error> {
    let spec = DeviceSpec::parse(&opts.device)?;
    let p = prepare(
        &opts.input,
        (opts.torch_version.as_deref(), opts.platform),
        opts.current.as_deref(),
        (opts.capacity, &opts.common.limits),
        &opts.common.buffers,
    )?;
    let candidate = conf_at("--conf", &opts.conf, &p.setup)?;
    let workload = match p.loaded {
        Loaded::Ready(w) => w,
        Loaded::Nothing(why) => {
            // Nothing to replay: the rules' answer alone, said to be so (as `recommend`).
            let only = RulesOnly::new(p.diagnosis.as_ref(), &p.setup, why);
            return Ok(Outcome {
                exit_code: crate::error::EXIT_NOTHING_TO_REPLAY,
                stdout: opts.common.format.finish(rules_only(
                    "validate",
                    &only,
                    opts.common.format,
                )),
                stderr: p.notes,
            });
        }
    };
    let v = validate::validate(
        &workload,
        (spec, &opts.device),
        (&p.current_conf, &p.current),
        (&opts.conf, &candidate),
        workload.capacity(opts.capacity),
        (p.diagnosis.as_ref(), &p.setup),
    )?;
    let stdout = validation(&v, opts.common.format);
    let mut stderr = p.notes;
    stderr.extend(ignored_notes("--conf", &opts.conf, &p.setup));
    stderr.extend(
        p.setup
            .rejected_in_range(&opts.conf)
            .map(|n| format!("note: {n}")),
    );
    if let Some(path) = &opts.report {
        // The pictures come from the simulated card, whatever --device ran the verdict.
        let runs = [
            (conf_name(&p.current_conf), &p.current),
            (conf_name(&opts.conf), &candidate),
        ];
        let views = views::of_workload(&workload, &runs, v.capacity_bytes)?;
        stderr.push(super::write_report(path, &validation_html(&v, &views))?);
    }
    Ok(Outcome {
        stdout: opts.common.format.finish(stdout),
        stderr,
        exit_code: v.verdict.exit_code,
    })
}
