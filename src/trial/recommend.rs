//! `recommend`'s judgement: search the candidate space by replay
//! ([`super::search`]), rank, bisect the winner's smallest capacity, and set
//! the rule engine's advice beside it. A recorded workload's best configs are
//! checked under every placement policy, and a config that avoids the OOM
//! under all of them is preferred; text evidence is searched on every
//! plausible workload of its ensemble ([`super::ensemble::search`]).

use super::answer::{Answer, Replays, decide, same_config};
use super::ensemble::{self, EnsembleSearch};
use super::placement::{self, Fate, PolicyOutcome};
use super::run::{Replayer, Run};
use super::search::{self, Progress, Pruning};
use super::validate::{
    Basis, EXIT_UNCERTAIN, Strength, Verdict, config_name, indistinct, indistinct_sentence,
    start_does_not_fit,
};
use super::workload::{CapacitySource, Workload};
use crate::Error;
use crate::advise::{Diagnosis, Recommendation, Space};
use crate::conf::Settings;
use crate::device::sim::Placement::FirstFit;
use crate::error::{EXIT_OK, EXIT_STILL_OOM};
use crate::units::human;
use crate::workload::RunFigures;
use serde::Serialize;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};

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
    /// What the search found, how sure, and the exit code.
    pub verdict: Verdict,
    /// How sure the verdict is (a field of its own for scripts).
    pub strength: Strength,
    /// Text evidence: the search across the plausible workloads.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ensemble: Option<EnsembleSearch>,
    /// A recorded workload: the best configs under each placement policy.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub placement: Vec<PlacedConfig>,
    #[serde(skip)]
    pub probe: Option<crate::workload::probe::Ensemble>,
    /// The PyTorch version the current config was read for (the trace
    /// recording lines depend on it).
    #[serde(skip)]
    pub torch_version: crate::conf::TorchVersion,
}

impl RecommendResult {
    /// The exit code: the verdict's (settled with the answer, so never 0
    /// without a line to set).
    pub fn exit_code(&self) -> i32 {
        self.verdict.exit_code
    }
}

/// One of the best configs of a recorded workload under each placement policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlacedConfig {
    pub conf: String,
    pub outcomes: Vec<PolicyOutcome>,
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
    // The current config runs in full: it is reported beside the winner.
    let replay_current = || {
        let mut run = replay(current, current_conf, cap, None, FirstFit);
        run.conf = current_conf.to_string();
        run
    };
    let (found, current_run) = match &workload.ensemble {
        Some(e) => {
            let current_run = replay_current();
            let found =
                ensemble::search(e, s.space.candidates.clone(), current, s.bisect, progress);
            let (rec, verdict) = found.verdict(e);
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
            let found = Found {
                min_capacity_bytes: rec.and(found.needed_capacity_bytes),
                candidates: runs,
                verdict,
                pruning: found.pruning,
                ensemble: Some(found),
                placement: Vec::new(),
            };
            (found, current_run)
        }
        None => {
            let sizes = workload.request_sizes();
            let result = search::search(
                s.space.candidates.clone(),
                current,
                cap,
                sizes.as_deref(),
                (
                    |settings: &Settings, cap, stop_above| {
                        replay(settings, "", cap, stop_above, FirstFit).figures
                    },
                    false,
                ),
                progress,
            );
            // The search ran the current config in full (its bound spares it),
            // unless an equivalent candidate stood in for it.
            let current_run = result
                .ranked
                .iter()
                .find(|(c, f)| {
                    c.settings(current) == *current && f.stopped_early_at_event.is_none()
                })
                .map(|(_, figures)| Run {
                    conf: current_conf.to_string(),
                    figures: figures.clone(),
                })
                .unwrap_or_else(replay_current);
            let found = recorded_verdict(
                result,
                replay,
                (current, &current_run),
                cap,
                (s.bisect, progress),
            );
            (found, current_run)
        }
    };
    let candidates = found.candidates;
    let advice = match &workload.advice {
        Some(value) => crate::conf::parse(value, current.version)
            .ok()
            .map(|p| replay(&p.settings, value, cap, None, FirstFit)),
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
            strength: found.verdict.strength,
            current: &current_run,
            ranked: &candidates,
            rules: advice.as_ref(),
        }),
    );
    let mut verdict = found.verdict;
    settle(&mut verdict, &answer, &candidates);
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
            found.min_capacity_bytes
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
                    |c| replay(&settings, "", c, None, FirstFit).figures,
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
        search: found.pruning,
        strength: verdict.strength,
        verdict,
        ensemble: found.ensemble,
        placement: found.placement,
        probe: workload.ensemble.clone(),
        torch_version: current.version,
    }
}

/// Settles the verdict with the answer, so that the exit code says what the
/// output says: a verdict that would pass (exit 0) while the answer sets no
/// line (the rules rule settings out and the replay evidence is not proven)
/// is uncertain; one that finds every config failing while the answer keeps
/// the rules' line (not replayed, or replayed on evidence too weak to drop
/// it) is uncertain too.
fn settle(verdict: &mut Verdict, answer: &Answer, replayed: &[Run]) {
    if verdict.exit_code == EXIT_UNCERTAIN {
        // What the line below the verdict is, when the replays do not give it.
        let said = match (&answer.recommendation, &answer.rules_line) {
            (None, _) => "nothing is recommended",
            (Some(r), Some(rules)) if same_config(&r.value, rules) => {
                "the line below is the rules' own, which no replay here confirms"
            }
            (Some(_), _) => return,
        };
        verdict.finding.push_str("; ");
        verdict.finding.push_str(said);
        return;
    }
    let why = match (verdict.exit_code, &answer.recommendation) {
        (EXIT_OK, None) => "but the answer sets no line: the rules and the replays disagree",
        (EXIT_STILL_OOM, Some(r))
            if replayed.iter().any(|run| same_config(&run.conf, &r.value)) =>
        {
            "but the answer keeps the rules' line: these replays are not evidence enough to drop it"
        }
        (EXIT_STILL_OOM, Some(_)) => {
            "but the answer keeps the rules' line, which was not replayed here"
        }
        _ => return,
    };
    verdict.finding.push_str("; ");
    verdict.finding.push_str(why);
    verdict.strength = Strength::Uncertain;
    verdict.exit_code = EXIT_UNCERTAIN;
}

/// What a search found: the configs ranked best first, the first one's
/// smallest capacity, the verdict, and how it was found.
struct Found {
    candidates: Vec<Run>,
    min_capacity_bytes: Option<u64>,
    verdict: Verdict,
    ensemble: Option<EnsembleSearch>,
    placement: Vec<PlacedConfig>,
    pruning: Pruning,
}

/// A recorded workload's search, its best configs checked under every
/// placement policy: the first that avoids the OOM under all of them is
/// recommended (and moved to the front); when none does, the first-fit
/// winner is, with an uncertain verdict.
fn recorded_verdict(
    mut result: search::SearchResult,
    replay: &Replayer,
    (current, current_run): (&Settings, &Run),
    cap: u64,
    (bisect, progress): (bool, &(dyn Fn(Progress) + Sync)),
) -> Found {
    let mut runs: Vec<Run> = result
        .ranked
        .iter()
        .map(|(c, figures)| Run {
            conf: crate::conf::render(&c.settings(current)),
            figures: figures.clone(),
        })
        .collect();
    // The smallest capacity of the config ranked `i` (only a memory fraction
    // makes a run depend on the capacity beyond whether each cudaMalloc fits).
    let bisections = AtomicUsize::new(0);
    let min_of = |i: usize| {
        let (c, figures) = &result.ranked[i];
        let settings = c.settings(current);
        search::min_capacity(
            figures,
            cap,
            current.per_process_memory_fraction.is_none(),
            |c| {
                bisections.fetch_add(1, AtomicOrdering::Relaxed);
                replay(&settings, "", c, None, FirstFit).figures
            },
            &progress,
        )
    };
    let finished = |f: &RunFigures| f.oom.is_none() && f.stopped_early_at_event.is_none();
    // In rank order until one avoids the OOM under every placement: that one
    // is recommended, so the configs ranked below it need no check. The
    // first-fit winner is bisected meanwhile: it is usually the one.
    let check = || {
        let mut placed: Vec<(usize, PlacedConfig, Fate)> = Vec::new();
        let avoiding = result
            .ranked
            .iter()
            .take(ensemble::PLACEMENT_CHECKED)
            .take_while(|(_, f)| finished(f));
        for (i, (c, _)) in avoiding.enumerate() {
            let ooms = placement::ooms(replay, &c.settings(current), cap, false);
            let placed_config = PlacedConfig {
                conf: runs[i].conf.clone(),
                outcomes: ooms.by_policy(),
            };
            placed.push((i, placed_config, ooms.fate()));
            if ooms.fate() == Fate::Avoids {
                break;
            }
        }
        placed
    };
    let winner_runs = result.ranked.first().is_some_and(|(_, f)| finished(f));
    let (placed, first_min) = rayon::join(check, || (bisect && winner_runs).then(|| min_of(0)));
    let Some(top) = runs.first().filter(|r| r.figures.oom.is_none()).cloned() else {
        let start = runs
            .first()
            .and_then(|r| r.figures.oom.as_ref().map(|o| (o, &r.figures)))
            .filter(|(o, _)| o.before_trace.is_some());
        if let Some((o, figures)) = start {
            let fits_live = o.before_trace.is_some_and(|(live, _)| live <= cap);
            let verdict = Verdict {
                basis: Basis::StartDoesNotFit,
                strength: if fits_live {
                    Strength::Uncertain
                } else {
                    Strength::Proven
                },
                finding: start_does_not_fit("every config", o, figures),
                exit_code: if fits_live {
                    EXIT_UNCERTAIN
                } else {
                    EXIT_STILL_OOM
                },
            };
            return Found {
                candidates: runs,
                min_capacity_bytes: None,
                verdict,
                ensemble: None,
                placement: Vec::new(),
                pruning: result.pruning,
            };
        }
        let finding = if runs.len() < 2 {
            // Only the config in use ran: the setup admits no other (the notes say why).
            format!(
                "no allocator setting could be tried for this setup; the current config runs out \
                 of memory at {}",
                human(cap)
            )
        } else {
            format!(
                "every one of the {} configs runs out of memory at {}: no allocator setting \
                 avoids this OOM",
                runs.len(),
                human(cap)
            )
        };
        let verdict = Verdict {
            basis: Basis::Recorded,
            strength: Strength::Proven,
            finding,
            exit_code: EXIT_STILL_OOM,
        };
        return Found {
            candidates: runs,
            min_capacity_bytes: None,
            verdict,
            ensemble: None,
            placement: Vec::new(),
            pruning: result.pruning,
        };
    };
    let robust = placed.iter().find(|(_, _, fate)| *fate == Fate::Avoids);
    let (pick, strength) = match robust {
        Some(&(i, _, _)) => (i, Strength::Proven),
        None => (0, Strength::Uncertain),
    };
    let chosen = runs.remove(pick);
    runs.insert(0, chosen.clone());
    let min = match pick {
        0 => first_min,
        _ => bisect.then(|| min_of(pick)),
    };
    result.pruning.bisection_replays = bisections.into_inner();
    let mut finding = headline(current_run, &chosen, min);
    // The policies under which the first-fit winner runs out of memory.
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
    if pick != 0 {
        finding.push_str(&format!(
            "; {} ranks first with first-fit placement but runs out of memory under {flipped}, \
             while {} avoids the OOM under every placement",
            config_name(&top.conf),
            config_name(&chosen.conf)
        ));
    } else if strength == Strength::Uncertain {
        finding.push_str(&format!(
            "; this depends on where the driver places segments: under {flipped} it runs out of memory"
        ));
    }
    // The answer's config and the current one, which the replay cannot tell
    // apart when neither exercised what configs decide: the rule `validate`
    // applies to its two runs (advise::claims::exercised).
    let blind = indistinct(&[&current_run.figures, &chosen.figures]);
    if blind {
        finding.push_str("; ");
        finding.push_str(&indistinct_sentence(&current_run.figures));
    }
    let strength = if blind { Strength::Uncertain } else { strength };
    let verdict = Verdict {
        basis: if blind {
            Basis::Indistinct
        } else {
            Basis::Recorded
        },
        strength,
        finding,
        exit_code: if strength == Strength::Proven {
            EXIT_OK
        } else {
            EXIT_UNCERTAIN
        },
    };
    Found {
        candidates: runs,
        min_capacity_bytes: min,
        verdict,
        ensemble: None,
        placement: placed.into_iter().map(|(_, p, _)| p).collect(),
        pruning: result.pruning,
    }
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
