//! `recommend`'s judgement: search the candidate space by replay
//! ([`super::search`]), rank, bisect the winner's smallest capacity, and set
//! the rule engine's advice beside it.

use super::run::{Replayer, Run};
use super::search::{self, Progress, Pruning};
use super::workload::{CapacitySource, Workload};
use crate::Error;
use crate::conf::Settings;
use serde::Serialize;

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
    pub candidates: Vec<Run>,
    pub recommendation: Option<Recommendation>,
    pub min_capacity_bytes: Option<u64>,
    /// Where `capacity_bytes` came from.
    pub capacity_source: CapacitySource,
    pub input: String,
    pub events: u64,
    /// The current config's run (also among the candidates when it is in the space).
    pub current: Run,
    /// The rule engine's advice (`diagnose`) replayed the same way, when it gave one.
    pub advice: Option<Run>,
    /// Why parts are missing (no rule advice, no GC thresholds, …).
    pub notes: Vec<String>,
    /// What the search replayed and what its bounds spared.
    pub search: Pruning,
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
        crate::advise::space::space(with_gc),
        current,
        cap,
        sizes.as_deref(),
        |settings, cap, stop_above| replay(settings, "", cap, stop_above).figures,
        progress,
    );
    let mut current_run = None;
    let candidates: Vec<Run> = result
        .ranked
        .into_iter()
        .map(|(c, figures)| {
            let settings = c.settings(current);
            let run = Run {
                conf: crate::conf::render(&settings),
                figures,
            };
            if settings == *current {
                current_run = Some(run.clone());
            }
            run
        })
        .collect();
    let recommendation = candidates
        .first()
        .filter(|best| best.figures.oom.is_none())
        .map(|best| Recommendation::new(best.conf.clone()));
    // The current config is in the space (and never stopped early) unless it
    // sets keys the search does not vary.
    let mut current_run = current_run.unwrap_or_else(|| replay(current, current_conf, cap, None));
    current_run.conf = current_conf.to_string();
    let advice = match &workload.advice {
        Some(value) => crate::conf::parse(value, current.version)
            .ok()
            .map(|p| replay(&p.settings, value, cap, None)),
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
        events: current_run.figures.events,
        candidates,
        recommendation,
        min_capacity_bytes: result.min_capacity_bytes,
        input: workload.input.clone(),
        current: current_run,
        notes,
        search: result.pruning,
        probe: workload.probe.clone(),
    }
}
