//! The `recommend` command: search the candidate space by replay, rank, and
//! bisect the winner's smallest capacity ([`crate::trial::recommend`]).

use super::{Format, Outcome};
use crate::Error;
use crate::report::recommend::{recommendation, recommendation_html};
use crate::trial::Workload;
use crate::trial::recommend::recommend;
use crate::trial::run::{conf_name, parse_conf};
use crate::trial::search::Progress;
use crate::trial::views;
use std::path::PathBuf;

#[derive(Debug, Clone, Default)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct RecommendOptions {
    /// A trace CSV, an RMM replay log, a snapshot pickle, or text evidence (an OOM message, memory_summary()), which gets a fitted synthetic probe.
    pub input: String,
    /// Device capacity, e.g. 24GiB (default: what the evidence implies, else an 80 GiB card).
    #[cfg_attr(feature = "cli", arg(long, value_parser = crate::units::parse_device_size))]
    pub capacity: Option<u64>,
    /// The config in use today (default: PyTorch's defaults).
    #[cfg_attr(feature = "cli", arg(long))]
    pub current: Option<String>,
    /// Also write a self-contained HTML report: the current and the recommended
    /// config's memory over the trace, the segment map, the ranked table.
    #[cfg_attr(feature = "cli", arg(long))]
    pub report: Option<PathBuf>,
    /// Output format.
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value_t, global = true))]
    pub format: Format,
    /// How much one input may make allocdoc read and hold.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub limits: crate::limits::Limits,
}

pub fn run(opts: &RecommendOptions) -> Result<Outcome, Error> {
    run_with_progress(opts, &|_| {})
}

/// [`run`] with a progress callback (the binary draws it on standard error).
pub fn run_with_progress(
    opts: &RecommendOptions,
    progress: &(dyn Fn(Progress) + Sync),
) -> Result<Outcome, Error> {
    let current_conf = opts.current.clone().unwrap_or_default();
    let current = parse_conf("--current", &current_conf)?;
    let workload = Workload::load(
        &opts.input,
        opts.capacity,
        &current_conf,
        &current,
        &opts.limits,
    )?;
    let (current_conf, current, note) = workload.current(opts.current.as_deref(), current);
    let capacity = workload.capacity(opts.capacity);
    let mut result = recommend(&workload, capacity, &current_conf, &current, progress)?;
    result.notes.extend(note);
    let stdout = recommendation(&result, opts.format);
    if let Some(path) = &opts.report {
        // The current config against the recommended one (or the best that still ran out).
        let best = result
            .candidates
            .first()
            .map(|c| (c.conf.clone(), parse_conf("--conf", &c.conf)))
            .and_then(|(conf, settings)| Some((conf, settings.ok()?)));
        let mut runs = vec![(conf_name(&current_conf), &current)];
        if let Some((conf, settings)) = &best {
            runs.push((conf_name(conf), settings));
        }
        let views = views::of_workload(&workload, &runs, capacity.0)?;
        std::fs::write(path, recommendation_html(&result, &views))
            .map_err(|e| Error::Input(format!("{}: {e}", path.display())))?;
    }
    Ok(Outcome {
        stdout,
        stderr: Vec::new(),
        exit_code: result.verdict.exit_code,
    })
}
