//! `recommend`'s judgement: search the candidate space by replay
//! ([`super::search`]), rank, bisect the winner's smallest capacity, and set
//! the rule engine's advice beside it.

use super::answer::{Answer, Replays, decide, same_config};
use super::run::{Replayer, Run};
use super::search::{self, Progress, Pruning};
use super::workload::{CapacitySource, Workload};
use crate::Error;
use crate::advise::{Diagnosis, Recommendation, Space};
use crate::conf::Settings;
use serde::Serialize;

/// `recommend` when nothing can be replayed (a snapshot without a trace,
/// text without figures to fit a probe to): the rules' answer alone, and why.
/// The contract's fields keep their meaning: no candidates were replayed.
#[derive(Debug, Clone, Serialize)]
pub struct RulesOnly {
    pub candidates: Vec<Run>,
    pub recommendation: Option<Recommendation>,
    pub min_capacity_bytes: Option<u64>,
    pub answer: Answer,
    /// Why nothing was replayed.
    pub not_replayed: String,
}

impl RulesOnly {
    pub fn new(diagnosis: Option<&Diagnosis>, setup: &crate::advise::Setup, why: String) -> Self {
        let answer = decide(diagnosis, setup, None);
        RulesOnly {
            candidates: Vec::new(),
            recommendation: answer.recommendation.clone(),
            min_capacity_bytes: None,
            answer,
            not_replayed: why,
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
    /// The answer's line (the contract's `recommendation`): the search's
    /// best or the rules' line, as [`crate::trial::answer`] settles it.
    pub recommendation: Option<Recommendation>,
    pub min_capacity_bytes: Option<u64>,
    /// The cause, the rules' line, and which evidence overrode which.
    pub answer: Answer,
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

/// What `recommend` searches: the space of the user's setup, the config
/// in use today, and the diagnosis of the evidence (none for a trace CSV).
pub struct Search<'a> {
    pub space: &'a Space,
    pub current_conf: &'a str,
    pub current: &'a Settings,
    pub diagnosis: Option<&'a Diagnosis>,
    /// Bisect the recommended config's smallest capacity (`min_capacity_bytes`);
    /// off only for a quick search (tests), which leaves it `None`.
    pub bisect: bool,
}

/// Searches, ranks and bisects for an already loaded workload, and settles
/// the answer. `progress` is called from worker threads; the library never draws it.
pub fn recommend(
    workload: &Workload,
    capacity: (u64, CapacitySource),
    search: &Search,
    progress: &(dyn Fn(Progress) + Sync),
) -> Result<RecommendResult, Error> {
    workload.with_replayer(|replay| search_with(workload, replay, capacity, search, progress))
}

fn search_with(
    workload: &Workload,
    replay: &Replayer,
    (cap, capacity_source): (u64, CapacitySource),
    s: &Search,
    progress: &(dyn Fn(Progress) + Sync),
) -> RecommendResult {
    let (current_conf, current) = (s.current_conf, s.current);
    let with_gc = current.per_process_memory_fraction.is_some();
    let mut notes: Vec<String> = s.space.excluded.clone();
    if !with_gc {
        notes.push(
            "garbage_collection_threshold was not searched: PyTorch only collects with a memory \
             fraction set (per_process_memory_fraction)"
                .to_string(),
        );
    }
    let sizes = workload.request_sizes();
    let result = search::search(
        s.space.candidates.clone(),
        current,
        cap,
        sizes.as_deref(),
        (
            |settings: &Settings, cap, stop_above| replay(settings, "", cap, stop_above).figures,
            s.bisect,
        ),
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
    // The current config is in the space (and never stopped early) unless it
    // sets keys the search does not vary.
    let mut current_run = current_run.unwrap_or_else(|| replay(current, current_conf, cap, None));
    current_run.conf = current_conf.to_string();
    let advice = match &workload.advice {
        Some(value) => crate::conf::parse(value, current.version)
            .ok()
            .map(|p| replay(&p.settings, value, cap, None)),
        None => {
            notes.push(if s.diagnosis.is_some() {
                "the rule engine recommends no allocator setting for this evidence".to_string()
            } else {
                "no rule-engine row: a trace CSV or RMM log holds no evidence the rules read"
                    .to_string()
            });
            None
        }
    };
    let answer = decide(
        s.diagnosis,
        s.space.setup(),
        Some(Replays {
            strength: workload.strength(),
            current: &current_run,
            ranked: &candidates,
            rules: advice.as_ref(),
        }),
    );
    // The contract's smallest capacity is the recommended config's: bisect
    // again when the answer kept a line other than the search's best (from a
    // run that finished: a bounded one stopped short of its peak).
    let min_capacity_bytes = match &answer.recommendation {
        _ if !s.bisect => None,
        Some(r)
            if candidates
                .first()
                .is_some_and(|b| same_config(&b.conf, &r.value)) =>
        {
            result.min_capacity_bytes
        }
        Some(r) => advice
            .iter()
            .chain(candidates.iter())
            .find(|run| {
                same_config(&run.conf, &r.value)
                    && run.figures.oom.is_none()
                    && run.figures.stopped_early_at_event.is_none()
            })
            .and_then(|run| {
                let settings = crate::conf::parse(&r.value, current.version).ok()?.settings;
                Some(search::min_capacity(
                    &run.figures,
                    cap,
                    current.per_process_memory_fraction.is_none(),
                    |c| replay(&settings, "", c, None).figures,
                    &progress,
                ))
            }),
        None => None,
    };
    RecommendResult {
        recommendation: answer.recommendation.clone(),
        answer,
        capacity_bytes: cap,
        capacity_source,
        advice,
        events: current_run.figures.events,
        candidates,
        min_capacity_bytes,
        input: workload.input.clone(),
        current: current_run,
        notes,
        search: result.pruning,
        probe: workload.probe.clone(),
    }
}
