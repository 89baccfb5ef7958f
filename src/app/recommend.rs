//! The `recommend` command: search the config space by replay
//! ([`crate::advise::search`]), rank, and bisect the winner's smallest capacity.

use super::validate::{CapacitySource, Replayer, RunSummary, Workload, load_workload, parse_conf};
use super::{Format, Outcome};
use crate::Error;
use crate::advise::search::{self, Progress};
use crate::conf::Settings;
use serde::Serialize;
use std::path::PathBuf;

#[derive(Debug, Clone, Default)]
pub struct RecommendOptions {
    pub input: String,
    pub capacity: Option<u64>,
    /// The config in use today (default: PyTorch's defaults).
    pub current: Option<String>,
    pub report: Option<PathBuf>,
    pub format: Format,
}

/// The contract's `recommendation` object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Recommendation {
    pub env: &'static str,
    pub value: String,
    pub line: String,
}

impl Recommendation {
    /// The shell line for `value`. PyTorch's defaults (`value` empty) are
    /// asked for by unsetting the variable, not by exporting it empty.
    pub fn new(value: String) -> Self {
        let line = if value.is_empty() {
            "unset PYTORCH_CUDA_ALLOC_CONF".to_string()
        } else {
            format!("export PYTORCH_CUDA_ALLOC_CONF={value}")
        };
        Recommendation {
            env: "PYTORCH_CUDA_ALLOC_CONF",
            value,
            line,
        }
    }
}

/// Everything `recommend` found, for the renderers. The JSON keys named in
/// the contract come first; the rest is extra.
#[derive(Debug, Clone, Serialize)]
pub struct RecommendResult {
    /// The capacity every candidate ran at.
    pub capacity_bytes: u64,
    /// Ranked best first.
    pub candidates: Vec<RunSummary>,
    pub recommendation: Option<Recommendation>,
    pub min_capacity_bytes: Option<u64>,
    /// Where `capacity_bytes` came from.
    pub capacity_source: CapacitySource,
    pub input: String,
    pub events: u64,
    /// The current config's run (also among the candidates when it is in the space).
    pub current: RunSummary,
    /// The rule engine's advice (`diagnose`) replayed the same way, when it gave one.
    pub advice: Option<RunSummary>,
    /// Why parts are missing (no rule advice, no GC thresholds, …).
    pub notes: Vec<String>,
    #[serde(skip)]
    pub probe: Option<crate::workload::probe::Calibration>,
}

/// Searches, ranks and bisects for an already loaded workload. `progress` is
/// called from worker threads; the library never draws it.
pub fn recommend(
    workload: &Workload,
    capacity: (u64, CapacitySource),
    current_conf: &str,
    current: &Settings,
    progress: &(dyn Fn(Progress) + Sync),
) -> Result<RecommendResult, Error> {
    workload.with_replayer(|replay| {
        search_with(workload, replay, capacity, current_conf, current, progress)
    })
}

fn search_with(
    workload: &Workload,
    replay: &Replayer,
    (cap, capacity_source): (u64, CapacitySource),
    current_conf: &str,
    current: &Settings,
    progress: &(dyn Fn(Progress) + Sync),
) -> RecommendResult {
    let with_gc = current.per_process_memory_fraction.is_some();
    let mut notes = Vec::new();
    if !with_gc {
        notes.push(
            "garbage_collection_threshold was not searched: PyTorch only collects with a memory \
             fraction set (per_process_memory_fraction)"
                .to_string(),
        );
    }
    let sizes = workload.request_sizes();
    let result = search::search(
        search::space(with_gc),
        current,
        cap,
        sizes.as_deref(),
        |settings, cap| replay(settings, "", cap),
        progress,
    );
    let mut current_run = None;
    let candidates: Vec<RunSummary> = result
        .ranked
        .into_iter()
        .map(|(c, mut run)| {
            let settings = c.settings(current);
            run.conf = crate::conf::render(&settings);
            if settings == *current {
                current_run = Some(run.clone());
            }
            run
        })
        .collect();
    let recommendation = candidates
        .first()
        .filter(|best| best.oom.is_none())
        .map(|best| Recommendation::new(best.conf.clone()));
    // The current config is in the space unless it sets keys the search does not vary.
    let mut current_run = current_run.unwrap_or_else(|| replay(current, current_conf, cap));
    current_run.conf = current_conf.to_string();
    let advice = match &workload.advice {
        Some(value) => crate::conf::parse(value, current.version)
            .ok()
            .map(|p| replay(&p.settings, value, cap)),
        None => {
            notes.push(if workload.probe.is_some() {
                "the rule engine recommends no allocator setting for this evidence".to_string()
            } else {
                "no rule-engine row: `diagnose` reads text evidence, and a trace or snapshot \
                 trace holds none"
                    .to_string()
            });
            None
        }
    };
    RecommendResult {
        capacity_bytes: cap,
        capacity_source,
        advice,
        events: current_run.events,
        candidates,
        recommendation,
        min_capacity_bytes: result.min_capacity_bytes,
        input: workload.input.clone(),
        current: current_run,
        notes,
        probe: workload.probe.clone(),
    }
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
    let workload = load_workload(&opts.input, opts.capacity, &current_conf, &current)?;
    let (current_conf, current, note) = workload.current(opts.current.as_deref(), current);
    let capacity = workload.capacity(opts.capacity);
    let mut result = recommend(&workload, capacity, &current_conf, &current, progress)?;
    result.notes.extend(note);
    let stdout = crate::report::recommend::recommendation(&result, opts.format);
    if let Some(path) = &opts.report {
        // The current config against the recommended one (or the best that still ran out).
        let best = result
            .candidates
            .first()
            .map(|c| (c.conf.clone(), parse_conf("--conf", &c.conf)))
            .and_then(|(conf, settings)| Some((conf, settings.ok()?)));
        let mut runs = vec![(super::replay::conf_name(&current_conf), &current)];
        if let Some((conf, settings)) = &best {
            runs.push((super::replay::conf_name(conf), settings));
        }
        let views = super::validate::report_views(&workload, &runs, capacity.0)?;
        std::fs::write(
            path,
            crate::report::recommend::recommendation_html(&result, views),
        )
        .map_err(|e| Error::Input(format!("{}: {e}", path.display())))?;
    }
    Ok(Outcome {
        stdout,
        stderr: Vec::new(),
        exit_code: i32::from(result.recommendation.is_none()),
    })
}
