//! The `recommend` command: search the candidate space by replay, rank, and
//! bisect the winner's smallest capacity ([`crate::trial::recommend`]).

use super::Outcome;
use super::input::{conf_at, prepare};
use crate::Error;
use crate::advise::Space;
use crate::report::recommend::{recommendation, recommendation_html, rules_only};
use crate::trial::recommend::{RulesOnly, Search, recommend};
use crate::trial::run::conf_name;
use crate::trial::search::Progress;
use crate::trial::views;
use crate::trial::workload::Loaded;
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
    /// Your PyTorch version (e.g. 2.4) when the evidence does not show it: only
    /// configs it accepts are searched, under its allocator.
    #[cfg_attr(feature = "cli", arg(long))]
    pub torch_version: Option<String>,
    /// The platform PyTorch runs on (default: what the evidence shows, else
    /// linux): settings it ignores there are not searched.
    #[cfg_attr(feature = "cli", arg(long, value_enum))]
    pub platform: Option<crate::conf::Platform>,
    /// Also write a self-contained HTML report: the current and the recommended
    /// config's memory over the trace, the segment map, the ranked table.
    #[cfg_attr(feature = "cli", arg(long))]
    pub report: Option<PathBuf>,
    /// The output format, the inputs' limits, inputs held in memory.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub common: super::Common,
}

pub fn run(opts: &RecommendOptions) -> Result<Outcome, Error> {
    run_with_progress(opts, &|_| {})
}

/// [`run`] with a progress callback (the binary draws it on standard error).
pub fn run_with_progress(
    opts: &RecommendOptions,
    progress: &(dyn Fn(Progress) + Sync),
) -> Result<Outcome, Error> {
    let p = prepare(
        &opts.input,
        (opts.torch_version.as_deref(), opts.platform),
        opts.current.as_deref(),
        (opts.capacity, &opts.common.limits),
        &opts.common.buffers,
    )?;
    let workload = match p.loaded {
        Loaded::Ready(w) => w,
        Loaded::Nothing(why) => {
            // Nothing to replay: the rules' answer alone, said to be so.
            let only = RulesOnly::new(p.diagnosis.as_ref(), &p.setup, why);
            return Ok(Outcome {
                exit_code: crate::error::EXIT_NOTHING_TO_REPLAY,
                stdout: opts.common.format.finish(rules_only(
                    "recommend",
                    &only,
                    opts.common.format,
                )),
                stderr: p.notes,
            });
        }
    };
    let space = Space::for_setup(&p.setup, p.current.per_process_memory_fraction.is_some());
    let capacity = workload.capacity(opts.capacity);
    let search = Search {
        space: &space,
        current_conf: &p.current_conf,
        current: &p.current,
        diagnosis: p.diagnosis.as_ref(),
        bisect: true,
    };
    let mut result = recommend(&workload, capacity, &search, progress)?;
    // Prepared's notes are standard-error lines; the report prefixes its own.
    result.notes.extend(
        p.notes
            .iter()
            .map(|n| n.strip_prefix("note: ").unwrap_or(n).to_string()),
    );
    let line = result.recommendation.as_ref().map(|r| r.value.as_str());
    result
        .notes
        .extend(line.and_then(|v| p.setup.rejected_in_range(v)));
    let stdout = recommendation(&result, opts.common.format);
    let mut stderr = Vec::new();
    if let Some(path) = &opts.report {
        // The current config against the recommended one (or the best that still ran out).
        let shown = result
            .recommendation
            .as_ref()
            .map(|r| r.value.clone())
            .or_else(|| result.candidates.first().map(|c| c.conf.clone()));
        let best =
            shown.and_then(|conf| Some((conf.clone(), conf_at("--conf", &conf, &p.setup).ok()?)));
        let mut runs = vec![(conf_name(&p.current_conf), &p.current)];
        if let Some((conf, settings)) = &best {
            runs.push((conf_name(conf), settings));
        }
        let views = views::of_workload(&workload, &runs, capacity.0)?;
        stderr.push(super::write_report(
            path,
            &recommendation_html(&result, &views),
        )?);
    }
    Ok(Outcome {
        stdout: opts.common.format.finish(stdout),
        stderr,
        exit_code: result.exit_code(),
    })
}
