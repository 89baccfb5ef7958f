//! `recommend`'s judgement: search the candidate space by replay
//! ([`super::search`]), rank, bisect the winner's smallest capacity, and set
//! the rule engine's advice beside it. A recorded workload's best configs are
//! checked under every placement policy, and a config that avoids the OOM
//! under all of them is preferred; text evidence is searched on every
//! plausible workload of its ensemble ([`super::ensemble::search`]).

use super::ensemble::{self, EnsembleSearch};
use super::placement::{self, Fate, PolicyOutcome};
use super::run::{Replayer, Run};
use super::search::{self, Progress, Pruning};
use super::validate::{Basis, EXIT_UNCERTAIN, Strength, Verdict, config_name};
use super::workload::{CapacitySource, Workload};
use crate::Error;
use crate::conf::Settings;
use crate::units::human;
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
    /// Ranked best first (for text evidence: ranked across the ensemble, with
    /// each config's run on the plausible workload closest to the evidence).
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
    /// What was found, how sure, and the exit code.
    pub verdict: Verdict,
    /// How sure the verdict is (a field of its own for scripts).
    pub strength: Strength,
    /// Text evidence: the search across the plausible workloads.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ensemble: Option<EnsembleSearch>,
    /// A recorded workload: the best configs under each placement policy.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub placement: Vec<PlacedConfig>,
    /// Why parts are missing (no rule advice, no GC thresholds, …).
    pub notes: Vec<String>,
    /// What the search replayed and what its bounds spared.
    pub search: Pruning,
    #[serde(skip)]
    pub probe: Option<crate::workload::probe::Ensemble>,
    /// The PyTorch version the current config was read for (the trace
    /// recording lines depend on it).
    #[serde(skip)]
    pub torch_version: crate::conf::TorchVersion,
}

/// One of the best configs of a recorded workload under each placement policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlacedConfig {
    pub conf: String,
    pub outcomes: Vec<PolicyOutcome>,
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
    use crate::device::sim::Placement::FirstFit;
    let with_gc = current.per_process_memory_fraction.is_some();
    let mut notes = Vec::new();
    if !with_gc {
        notes.push(
            "garbage_collection_threshold was not searched: PyTorch only collects with a memory \
             fraction set (per_process_memory_fraction)"
                .to_string(),
        );
    }
    let space = crate::advise::space::space(with_gc);
    // The current config runs in full: it is reported beside the winner.
    let mut current_run = replay(current, current_conf, cap, None, FirstFit);
    current_run.conf = current_conf.to_string();
    let (candidates, recommendation, min_capacity_bytes, verdict, ensemble, placement, pruning) =
        match &workload.ensemble {
            Some(e) => {
                let found = ensemble::search(e, space, current, progress);
                let (rec, verdict) = found.verdict(e);
                let recommendation = rec.map(|r| Recommendation::new(r.conf.clone()));
                let min = rec.and(found.needed_capacity_bytes);
                // Each config's run on the closest plausible workload (the
                // replayed `source`), in the ensemble's order.
                let runs = found
                    .ranked
                    .iter()
                    .map(|r| Run {
                        conf: r.conf.clone(),
                        figures: r.runs.first().cloned().unwrap_or_default(),
                    })
                    .collect();
                let pruning = found.pruning;
                (
                    runs,
                    recommendation,
                    min,
                    verdict,
                    Some(found),
                    Vec::new(),
                    pruning,
                )
            }
            None => {
                let sizes = workload.request_sizes();
                let result = search::search(
                    space,
                    current,
                    cap,
                    sizes.as_deref(),
                    |settings, cap, stop| replay(settings, "", cap, stop, FirstFit).figures,
                    progress,
                );
                recorded_verdict(result, replay, (current, &current_run), cap)
            }
        };
    let advice = match &workload.advice {
        Some(value) => crate::conf::parse(value, current.version)
            .ok()
            .map(|p| replay(&p.settings, value, cap, None, FirstFit)),
        None => {
            notes.push(if workload.ensemble.is_some() {
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
        min_capacity_bytes,
        input: workload.input.clone(),
        current: current_run,
        strength: verdict.strength,
        verdict,
        ensemble,
        placement,
        notes,
        search: pruning,
        probe: workload.ensemble.clone(),
        torch_version: current.version,
    }
}

type Found = (
    Vec<Run>,
    Option<Recommendation>,
    Option<u64>,
    Verdict,
    Option<EnsembleSearch>,
    Vec<PlacedConfig>,
    Pruning,
);

/// A recorded workload's search, its best configs checked under every
/// placement policy: the first that avoids the OOM under all of them is
/// recommended (and moved to the front); when none does, the first-fit
/// winner is, with an uncertain verdict.
fn recorded_verdict(
    result: search::SearchResult,
    replay: &Replayer,
    (current, current_run): (&Settings, &Run),
    cap: u64,
) -> Found {
    let mut runs: Vec<Run> = result
        .ranked
        .iter()
        .map(|(c, figures)| Run {
            conf: crate::conf::render(&c.settings(current)),
            figures: figures.clone(),
        })
        .collect();
    let avoiding = result
        .ranked
        .iter()
        .take(ensemble::PLACEMENT_CHECKED)
        .take_while(|(_, f)| f.oom.is_none() && f.stopped_early_at_event.is_none());
    let placed: Vec<(usize, PlacedConfig, Fate)> = avoiding
        .enumerate()
        .map(|(i, (c, _))| {
            let ooms = placement::ooms(replay, &c.settings(current), cap, false);
            let placed = PlacedConfig {
                conf: runs[i].conf.clone(),
                outcomes: ooms.by_policy(),
            };
            (i, placed, ooms.fate())
        })
        .collect();
    let Some(top) = runs.first().filter(|r| r.figures.oom.is_none()).cloned() else {
        let finding = format!(
            "every one of the {} configs runs out of memory at {}: no allocator setting avoids \
             this OOM",
            runs.len(),
            human(cap)
        );
        let verdict = Verdict {
            basis: Basis::Recorded,
            strength: Strength::Proven,
            finding,
            exit_code: 1,
        };
        return (runs, None, None, verdict, None, Vec::new(), result.pruning);
    };
    let robust = placed.iter().find(|(_, _, fate)| *fate == Fate::Avoids);
    let (pick, strength) = match robust {
        Some(&(i, _, _)) => (i, Strength::Proven),
        None => (0, Strength::Uncertain),
    };
    let chosen = runs.remove(pick);
    runs.insert(0, chosen.clone());
    // The winner's smallest capacity: bisected by the search for the
    // first-fit winner; for another pick, bisected here.
    let min = if pick == 0 {
        result.min_capacity_bytes
    } else {
        let settings = result.ranked[pick].0.settings(current);
        Some(search::min_capacity(
            &chosen.figures,
            cap,
            true,
            |c| {
                replay(
                    &settings,
                    "",
                    c,
                    None,
                    crate::device::sim::Placement::FirstFit,
                )
                .figures
            },
            &|_| {},
        ))
    };
    let mut finding = headline(current_run, &chosen, min);
    if pick != 0 {
        let flipped = placed
            .first()
            .map(|(_, p, _)| {
                p.outcomes
                    .iter()
                    .filter(|o| o.oom)
                    .map(|o| o.policy)
                    .collect::<Vec<_>>()
                    .join(" and ")
            })
            .unwrap_or_default();
        finding.push_str(&format!(
            "; {} ranks first with first-fit placement but runs out of memory under {flipped}, \
             while {} avoids the OOM under every placement",
            config_name(&top.conf),
            config_name(&chosen.conf)
        ));
    } else if strength == Strength::Uncertain {
        let flipped: Vec<&str> = placed
            .first()
            .map(|(_, p, _)| {
                p.outcomes
                    .iter()
                    .filter(|o| o.oom)
                    .map(|o| o.policy)
                    .collect()
            })
            .unwrap_or_default();
        finding.push_str(&format!(
            "; this depends on where the driver places segments: under {} it runs out of memory",
            flipped.join(" and ")
        ));
    }
    let verdict = Verdict {
        basis: Basis::Recorded,
        strength,
        finding,
        exit_code: if strength == Strength::Proven {
            0
        } else {
            EXIT_UNCERTAIN
        },
    };
    let recommendation = Some(Recommendation::new(chosen.conf.clone()));
    let placement = placed.into_iter().map(|(_, p, _)| p).collect();
    (
        runs,
        recommendation,
        min,
        verdict,
        None,
        placement,
        result.pruning,
    )
}

/// "X does best: it avoids the OOM the current config hits; it still runs with Y".
fn headline(current: &Run, best: &Run, min: Option<u64>) -> String {
    let mut s = if best.conf.is_empty() {
        "PyTorch's defaults do best here (unset PYTORCH_CUDA_ALLOC_CONF)".to_string()
    } else {
        format!("{} does best", best.conf)
    };
    match (
        &current.figures.oom,
        current
            .figures
            .peak_reserved_bytes
            .checked_sub(best.figures.peak_reserved_bytes),
    ) {
        (Some(_), _) => s.push_str(": it avoids the OOM the current config hits"),
        (None, Some(saved)) if saved > 0 => s.push_str(&format!(
            ": peak reserved {} lower than the current config",
            human(saved)
        )),
        _ => {}
    }
    if let Some(m) = min {
        s.push_str(&format!("; it still runs with {}", human(m)));
    }
    s
}
