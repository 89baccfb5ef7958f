//! Judging configs on the ensemble of probes fitted to text evidence
//! ([`Ensemble`]): only the members that reproduce the evidence (the
//! plausible workloads) count; a verdict says on how many of them a config
//! avoids the OOM, under every placement policy, and its strength follows
//! from how many agree ([`super::validate::ensemble_strength`]).

use super::placement::{self, Fate};
use super::run::{ForkingReplays, replay, replay_placed};
use super::search::{self, Progress};
use super::validate::{Basis, EXIT_UNCERTAIN, Strength, Verdict, ensemble_strength, peak_change};
use crate::advise::space::Candidate;
use crate::conf::Settings;
use crate::units::{format_size, human};
use crate::workload::RunFigures;
use crate::workload::probe::{Calibration, Ending, Ensemble, GATE_CONTINUATION, TOLERANCE};
use rayon::prelude::*;
use serde::Serialize;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A candidate that gets past the OOM with less than this share of the room
/// (the capacity) left at its peak reserved avoids it only narrowly: a fitted
/// workload cannot tell whether the real one has that much to spare, or
/// whether its later steps need more.
pub const NARROW_MARGIN: f64 = 0.03;

/// Whether a run that fits peaks within [`NARROW_MARGIN`] of `capacity`.
fn narrow(peak_reserved: u64, capacity: u64) -> bool {
    capacity != crate::device::NO_LIMIT
        && peak_reserved as f64 > (1.0 - NARROW_MARGIN) * capacity as f64
}

/// One fitted workload and, when it is plausible, what the candidate did on it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkloadJudgement {
    pub family: &'static str,
    /// Whether it reproduces the evidence (only those count).
    pub reproduces: bool,
    /// The larger relative error on allocated and reserved bytes.
    pub fit_error: f64,
    /// How the current config's run of it ended, in words.
    pub current: String,
    /// The candidate's outcome under every placement policy (plausible workloads only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub candidate: Option<Fate>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current_peak_reserved_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub candidate_peak_reserved_bytes: Option<u64>,
}

impl WorkloadJudgement {
    /// A member's fit, before any candidate is judged on it.
    fn unjudged(m: &Calibration) -> Self {
        WorkloadJudgement {
            family: m.family.name(),
            reproduces: m.reproduces,
            fit_error: m.error,
            current: ending_text(m),
            candidate: None,
            current_peak_reserved_bytes: None,
            candidate_peak_reserved_bytes: None,
        }
    }
}

/// How the current config's run of a member ended, in words.
pub fn ending_text(m: &Calibration) -> String {
    let off = || {
        format!(
            "allocated {} and reserved {} ({:.1} % off)",
            human(m.reproduced.allocated_bytes),
            human(m.reproduced.reserved_bytes),
            100.0 * m.error
        )
    };
    match (m.ending, m.observed.requested_bytes) {
        (Ending::AtRequest, _) if m.reproduces => {
            "runs out of memory on the request, as the message says".to_string()
        }
        (Ending::AtRequest, _) => format!("runs out of memory on the request, but with {}", off()),
        (
            Ending::Earlier {
                requested,
                alloc_size,
            },
            _,
        ) => format!(
            "runs out of memory earlier, on a request of {} (\"Tried to allocate {}\")",
            human(requested),
            format_size(alloc_size)
        ),
        (Ending::NoOom, Some(_)) => "does not run out of memory on the request".to_string(),
        (Ending::NoOom, None) if m.reproduces => {
            "reproduces allocated and reserved within the tolerance".to_string()
        }
        (Ending::NoOom, None) => format!("ends with {}", off()),
    }
}

/// A replayer of one member's trace on the simulated card.
fn member_replayer(
    m: &Calibration,
) -> impl Fn(&Settings, &str, u64, Option<u64>, crate::device::sim::Placement) -> super::Run + Sync + '_
{
    move |s, conf, cap, _, placement| replay_placed(&m.judged, s, conf, cap, placement)
}

fn judge_member(
    m: &Calibration,
    current: &Settings,
    candidate: &Settings,
    capacity: u64,
) -> WorkloadJudgement {
    let mut j = WorkloadJudgement::unjudged(m);
    if m.reproduces {
        let before = replay(&m.judged, current, "", capacity).figures;
        let after = replay(&m.judged, candidate, "", capacity).figures;
        let replayer = member_replayer(m);
        let ooms = placement::ooms(&replayer, candidate, capacity, after.oom.is_some());
        j.candidate = Some(match ooms.fate() {
            Fate::Avoids if narrow(after.peak_reserved_bytes, capacity) => Fate::AvoidsNarrowly,
            fate => fate,
        });
        j.current_peak_reserved_bytes = Some(before.peak_reserved_bytes);
        j.candidate_peak_reserved_bytes = Some(after.peak_reserved_bytes);
    }
    j
}

/// "'a', 'b' and 'c'".
fn quoted(names: &[&str]) -> String {
    let q: Vec<String> = names.iter().map(|n| format!("'{n}'")).collect();
    match q.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
    }
}

/// "in all 6 workloads", "in 5 of 6 workloads", "in the one workload".
fn in_count(k: usize, n: usize) -> String {
    match (k, n) {
        (1, 1) => "in the one workload".to_string(),
        (k, n) if k == n => format!("in all {n} workloads"),
        (k, n) => format!("in {k} of {n} workloads"),
    }
}

/// The first words of a verdict on evidence no member reproduces.
fn not_reproduced(e: &Ensemble, what: &str) -> String {
    if let (Some(free), Some(r)) = (e.free_beyond_request, e.observed.requested_bytes) {
        return format!(
            "The OOM was not reproduced: the message says {} of the card was free, more than \
             the {} request needs, and a card with that much free memory does not run out of \
             memory on it, so no workload shape was fitted; no replay here says {what}",
            format_size(free),
            format_size(r)
        );
    }
    let fitted = e.members.len();
    let closest = e
        .best()
        .map(|m| format!("; the closest, '{}', {}", m.family.name(), ending_text(m)))
        .unwrap_or_default();
    match e.observed.requested_bytes {
        Some(r) => format!(
            "The OOM was not reproduced: none of the {fitted} workload shapes fitted to your \
             figures runs out of memory on the {} request with allocated and reserved within \
             {:.0} % of the message{closest}; no replay here says {what}",
            format_size(r),
            100.0 * TOLERANCE
        ),
        None => format!(
            "The figures were not reproduced: none of the {fitted} workload shapes fitted to them \
             comes within {:.0} % of allocated and reserved{closest}; no replay here says {what}",
            100.0 * TOLERANCE
        ),
    }
}

/// Which way a text-only verdict on a candidate leans: what its exit code
/// says when that is 0 or 1, else what the evidence favours, if anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Leaning {
    /// The candidate gets past the OOM.
    Avoids,
    /// The candidate still runs out of memory.
    Fails,
}

/// `validate` on text evidence: what the candidate did on each workload.
#[derive(Debug, Clone, PartialEq)]
pub struct Judgement {
    pub verdict: Verdict,
    pub workloads: Vec<WorkloadJudgement>,
    /// None: the evidence favours neither outcome.
    pub leaning: Option<Leaning>,
}

/// Which way the plausible workloads lean: the majority of those with a
/// clear outcome (avoiding the OOM with room to spare under every placement,
/// or failing under every placement); narrow and placement-dependent
/// outcomes are too close to count.
fn workloads_lean(avoids: usize, fails: usize) -> Option<Leaning> {
    match avoids.cmp(&fails) {
        std::cmp::Ordering::Greater => Some(Leaning::Avoids),
        std::cmp::Ordering::Less => Some(Leaning::Fails),
        std::cmp::Ordering::Equal => None,
    }
}

/// Which way the message's own figures lean when the workloads do not
/// settle it, and the clause that says why: the live tensors and the request
/// either exceed the room the allocator could reach (no config gets past the
/// request as printed), or leave at least [`NARROW_MARGIN`] of it, which a
/// config that keeps nothing cached but unused could use. The message cannot
/// tell whether the job later outgrows that room.
fn headroom_lean(e: &Ensemble, name: &str) -> Option<(Option<Leaning>, String)> {
    let headroom = e.headroom()?;
    let (request, cap) = (e.observed.requested_bytes?, e.capacity);
    let needed = e.observed.allocated_bytes.saturating_add(request);
    let reach = format!("the {} the allocator could reach", human(cap));
    if headroom < 0 {
        return Some((
            Some(Leaning::Fails),
            format!(
                "the message's own figures lean to it running out of memory: the live tensors \
                 and the {} request ({}) exceed {reach}",
                format_size(request),
                human(needed)
            ),
        ));
    }
    let share = headroom as f64 / cap.max(1) as f64;
    let left = format!(
        "the live tensors and the {} request leave {} ({:.1} %) of {reach}",
        format_size(request),
        human(headroom as u64),
        100.0 * share
    );
    Some(if share >= NARROW_MARGIN {
        (
            Some(Leaning::Avoids),
            format!(
                "the message's own figures lean to {name} getting past this request: {left}, \
                 room that a config keeping nothing cached but unused could use (whether the \
                 job outgrows it later, the message cannot tell)"
            ),
        )
    } else {
        (
            None,
            format!(
                "nor do the message's own figures: {left}, less than {:.0} %",
                100.0 * NARROW_MARGIN
            ),
        )
    })
}

/// `validate` on text evidence: the candidate on every plausible workload.
/// `name` is the candidate as a sentence names it.
pub fn judge(e: &Ensemble, current: &Settings, (name, candidate): (&str, &Settings)) -> Judgement {
    let judgements: Vec<WorkloadJudgement> = e
        .members
        .par_iter()
        .map(|m| judge_member(m, current, candidate, e.capacity))
        .collect();
    let plausible: Vec<&WorkloadJudgement> = judgements.iter().filter(|j| j.reproduces).collect();
    let n = plausible.len();
    let basis = Basis::Ensemble {
        plausible: n,
        fitted: e.members.len(),
    };
    if n == 0 {
        let what = if e.observed.requested_bytes.is_some() {
            format!("whether {name} avoids it")
        } else {
            format!("how {name} compares")
        };
        let mut finding = not_reproduced(e, &what);
        // Free memory beyond the request: the card was not full, so the room
        // left says nothing about this failure.
        let (leaning, clause) = headroom_lean(e, name)
            .filter(|_| e.free_beyond_request.is_none())
            .unwrap_or_default();
        if !clause.is_empty() {
            finding.push_str("; ");
            finding.push_str(&clause);
        }
        let verdict = Verdict {
            basis,
            strength: Strength::Uncertain,
            finding,
            exit_code: EXIT_UNCERTAIN,
        };
        return Judgement {
            verdict,
            workloads: judgements,
            leaning,
        };
    }
    let with = |fate: Fate| -> Vec<&str> {
        plausible
            .iter()
            .filter(|j| j.candidate == Some(fate))
            .map(|j| j.family)
            .collect()
    };
    let (avoids, narrowly, fails, depends) = (
        with(Fate::Avoids),
        with(Fate::AvoidsNarrowly),
        with(Fate::Fails),
        with(Fate::DependsOnPlacement),
    );
    let consistent = "consistent with your figures";
    let mut parts = Vec::new();
    if e.observed.requested_bytes.is_some() || avoids.len() < n {
        let past = avoids.len() + narrowly.len();
        if fails.len() == n {
            parts.push(format!(
                "{name} still runs out of memory {} {consistent}",
                in_count(n, n)
            ));
        } else {
            parts.push(format!(
                "{name} avoids the OOM {} {consistent}",
                if past == 0 {
                    format!("in none of the {n} workloads")
                } else {
                    in_count(past, n)
                }
            ));
            if !narrowly.is_empty() {
                parts.push(format!(
                    "{} with less than {:.0} % of the room to spare",
                    if narrowly.len() == past {
                        "always".to_string()
                    } else {
                        format!("on {}", quoted(&narrowly))
                    },
                    100.0 * NARROW_MARGIN
                ));
            }
            if !fails.is_empty() {
                parts.push(format!("it fails on {}", quoted(&fails)));
            }
        }
        if !depends.is_empty() {
            parts.push(format!(
                "on {} it depends on where segments are placed",
                quoted(&depends)
            ));
        }
    }
    if e.observed.requested_bytes.is_none() {
        // No OOM to avoid: how the peak moves on the workloads that run.
        let mut lower = Vec::new();
        let mut higher = Vec::new();
        let running: Vec<&&WorkloadJudgement> = plausible
            .iter()
            .filter(|j| matches!(j.candidate, Some(Fate::Avoids | Fate::AvoidsNarrowly)))
            .collect();
        for j in &running {
            let (c, n) = (
                j.current_peak_reserved_bytes.unwrap_or(0),
                j.candidate_peak_reserved_bytes.unwrap_or(0),
            );
            if n < c {
                lower.push(c - n);
            } else if n > c {
                higher.push(n - c);
            }
        }
        let range = |v: &[u64]| {
            let (lo, hi) = (
                v.iter().min().copied().unwrap_or(0),
                v.iter().max().copied().unwrap_or(0),
            );
            if lo == hi {
                human(lo)
            } else {
                format!("{} to {}", human(lo), human(hi))
            }
        };
        let same = running.len() - lower.len() - higher.len();
        let mut moves = Vec::new();
        if !lower.is_empty() {
            moves.push(format!(
                "lowers peak reserved {} {consistent} (by {})",
                in_count(lower.len(), n),
                range(&lower)
            ));
        }
        if !higher.is_empty() {
            moves.push(format!(
                "raises it {} (by {})",
                in_count(higher.len(), n),
                range(&higher)
            ));
        }
        if same > 0 {
            moves.push(format!("keeps it the same {}", in_count(same, n)));
        }
        parts.push(format!("{name} {}", moves.join(", ")));
    }
    let agreeing = avoids.len().max(fails.len());
    let strength = ensemble_strength(n, agreeing);
    let mut exit_code = match strength {
        Strength::Likely if avoids.len() == n => 0,
        Strength::Likely if fails.len() >= avoids.len() => 1,
        _ => EXIT_UNCERTAIN,
    };
    if exit_code == 0 && e.observed.requested_bytes.is_some() {
        let outgrown = outgrown_on(&e.plausible().collect::<Vec<_>>(), candidate);
        if !outgrown.is_empty() {
            parts.push(outgrown_clause(&outgrown));
            exit_code = EXIT_UNCERTAIN;
        }
    }
    let leaning = match exit_code {
        0 => Some(Leaning::Avoids),
        1 => Some(Leaning::Fails),
        _ => match workloads_lean(avoids.len(), fails.len()) {
            Some(lean) => {
                parts.push(format!(
                    "on balance it leans to {}: {} of the {n} avoid it with room to spare, {} \
                     {}",
                    match lean {
                        Leaning::Avoids => "avoiding the OOM",
                        Leaning::Fails => "running out of memory",
                    },
                    avoids.len(),
                    fails.len(),
                    if fails.len() == 1 { "fails" } else { "fail" }
                ));
                Some(lean)
            }
            None => {
                let (lean, clause) = headroom_lean(e, name).unwrap_or_default();
                if !clause.is_empty() {
                    parts.push(format!("the workloads do not settle it; {clause}"));
                }
                lean
            }
        },
    };
    let verdict = Verdict {
        basis,
        strength,
        finding: parts.join("; "),
        exit_code,
    }
    .settled();
    Judgement {
        verdict,
        workloads: judgements,
        leaning,
    }
}

/// The plausible workloads on which `settings` runs out of memory when the
/// job runs on [`GATE_CONTINUATION`] of its steps past the request.
fn outgrown_on(plausible: &[&Calibration], settings: &Settings) -> Vec<&'static str> {
    plausible
        .par_iter()
        .filter(|m| {
            replay(&m.continued(GATE_CONTINUATION), settings, "", m.capacity)
                .figures
                .oom
                .is_some()
        })
        .map(|m| m.family.name())
        .collect()
}

/// Why a verdict that would pass a gate does not.
fn outgrown_clause(outgrown: &[&str]) -> String {
    format!(
        "but on {} it runs out of memory within {:.0} % more steps past the request, so the \
         job may outgrow it",
        quoted(outgrown),
        100.0 * GATE_CONTINUATION
    )
}

/// A config of the search space judged across the plausible workloads.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RankedConfig {
    pub conf: String,
    /// On how many plausible workloads it avoids the OOM (first-fit placement).
    pub avoids: usize,
    /// On how many of those with at least [`NARROW_MARGIN`] of the room to spare.
    pub avoids_with_margin: usize,
    /// On how many it avoids the OOM with that margin under every placement
    /// policy (checked for the best few configs only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub avoids_under_every_placement: Option<usize>,
    /// The plausible workloads it runs out of memory on.
    pub fails_on: Vec<&'static str>,
    #[serde(skip)]
    pub candidate: Candidate,
    /// Its run on each plausible workload, in the ensemble's order.
    #[serde(skip)]
    pub runs: Vec<RunFigures>,
}

impl RankedConfig {
    /// Avoids the OOM on every plausible workload under every placement.
    pub fn robust(&self, plausible: usize) -> bool {
        self.avoids_under_every_placement == Some(plausible)
    }
}

/// `recommend` on text evidence: every config on every plausible workload.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EnsembleSearch {
    pub plausible: usize,
    pub fitted: usize,
    /// Every fitted workload (the judgement fields unset).
    pub workloads: Vec<WorkloadJudgement>,
    /// Best first: on more plausible workloads without OOM (under every
    /// placement, for the configs checked), then the lower mean peak
    /// reserved relative to the capacity, then fewer driver calls, then
    /// fewer keys set.
    pub ranked: Vec<RankedConfig>,
    /// The smallest capacity at which the first config runs every plausible
    /// workload (bisected to 1 MiB).
    pub needed_capacity_bytes: Option<u64>,
    /// When the first config avoids the OOM on every plausible workload: those
    /// on which it runs out of memory within [`GATE_CONTINUATION`] more steps.
    pub outgrown_on: Vec<&'static str>,
    /// What the searches replayed, summed over the plausible workloads
    /// (`configs` is the space's size).
    #[serde(skip)]
    pub pruning: search::Pruning,
    #[serde(skip)]
    pub capacity: u64,
}

/// How many of the best configs are checked under every placement policy.
pub const PLACEMENT_CHECKED: usize = 5;

/// The smallest capacity at which `run` has no OOM (bisected from a run
/// without limit), and the replays it took.
fn capacity_needed(run: impl Fn(u64) -> RunFigures) -> (u64, usize) {
    let replays = AtomicUsize::new(1);
    let counted = |c| {
        replays.fetch_add(1, Ordering::Relaxed);
        run(c)
    };
    let free = run(crate::device::NO_LIMIT);
    let need = search::min_capacity(&free, crate::device::NO_LIMIT, true, counted, &|_| {});
    (need, replays.into_inner())
}

/// Replays every config of `candidates` on every plausible workload of `e`,
/// ranks them by robustness, checks the best few under every placement, and
/// bisects the capacity the first needs.
pub fn search(
    e: &Ensemble,
    candidates: Vec<Candidate>,
    current: &Settings,
    bisect: bool,
    progress: &(dyn Fn(Progress) + Sync),
) -> EnsembleSearch {
    let plausible: Vec<&Calibration> = e.plausible().collect();
    let cap = e.capacity;
    let total = candidates.len() * plausible.len();
    let done = AtomicUsize::new(0);
    // Each workload's runs, in `candidates` order, and what its search replayed.
    let per_member: Vec<(Vec<RunFigures>, search::Pruning)> = plausible
        .iter()
        .map(|m| {
            let sizes = super::workload::distinct_request_sizes(&m.judged);
            let forking = ForkingReplays::new(&m.judged);
            let r = search::search(
                candidates.clone(),
                current,
                cap,
                Some(&sizes),
                // Every run to its end: a run stopped early is no verdict on
                // a workload; no bisection per workload (the capacity is
                // bisected across them below).
                (
                    |s: &Settings, c, _| forking.replay(s, "", c, None).figures,
                    false,
                ),
                |p| {
                    if let Progress::Candidates { .. } = p {
                        let d = done.fetch_add(1, Ordering::Relaxed) + 1;
                        progress(Progress::Candidates { done: d, total });
                    }
                },
            );
            let runs = candidates
                .iter()
                .map(|c| {
                    r.ranked
                        .iter()
                        .find(|(k, _)| k == c)
                        .map(|(_, f)| f.clone())
                        .unwrap_or_default()
                })
                .collect();
            (runs, r.pruning)
        })
        .collect();
    let pruning = per_member
        .iter()
        .fold(search::Pruning::default(), |sum, (_, p)| search::Pruning {
            configs: p.configs,
            replays: sum.replays + p.replays,
            configs_finished: sum.configs_finished + p.configs_finished,
            configs_stopped_early: sum.configs_stopped_early + p.configs_stopped_early,
            bisection_replays: sum.bisection_replays + p.bisection_replays,
        });
    let mut pruning = pruning;
    let mut ranked: Vec<(RankedConfig, (f64, f64), u64)> = candidates
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let runs: Vec<RunFigures> = per_member.iter().map(|(r, _)| r[i].clone()).collect();
            let fails_on = plausible
                .iter()
                .zip(&runs)
                .filter(|(_, r)| r.oom.is_some())
                .map(|(m, _)| m.family.name())
                .collect::<Vec<_>>();
            // How far the runs got (the share of events before the OOM, 1 for a
            // run without one): among failing configs, the one that got
            // further is better, whatever its peak (a run that fails early
            // peaks low). Then the mean peak reserved as a share of the card.
            let reach = runs
                .iter()
                .map(|r| {
                    r.oom
                        .as_ref()
                        .map_or(1.0, |o| o.event_index as f64 / r.events.max(1) as f64)
                })
                .sum::<f64>()
                / runs.len().max(1) as f64;
            let mean_peak = runs
                .iter()
                .map(|r| r.peak_reserved_bytes as f64 / cap.max(1) as f64)
                .sum::<f64>()
                / runs.len().max(1) as f64;
            let work = runs.iter().map(|r| r.device_allocs + r.device_frees).sum();
            let conf = crate::conf::render(&c.settings(current));
            let avoids_with_margin = runs
                .iter()
                .filter(|r| r.oom.is_none() && !narrow(r.peak_reserved_bytes, cap))
                .count();
            (
                RankedConfig {
                    conf,
                    avoids_with_margin,
                    avoids: runs.len() - fails_on.len(),
                    avoids_under_every_placement: None,
                    fails_on,
                    candidate: c,
                    runs,
                },
                (reach, mean_peak),
                work,
            )
        })
        .collect();
    type Scored = (RankedConfig, (f64, f64), u64);
    let order = |a: &Scored, b: &Scored| {
        b.0.avoids_under_every_placement
            .cmp(&a.0.avoids_under_every_placement)
            .then(b.0.avoids_with_margin.cmp(&a.0.avoids_with_margin))
            .then(b.0.avoids.cmp(&a.0.avoids))
            .then(b.1.0.total_cmp(&a.1.0))
            .then(a.1.1.total_cmp(&b.1.1))
            .then(a.2.cmp(&b.2))
            .then(a.0.candidate.keys().cmp(&b.0.candidate.keys()))
    };
    ranked.sort_by(order);
    // The best few that avoid the OOM somewhere, under every placement.
    let checked = ranked
        .iter()
        .take(PLACEMENT_CHECKED)
        .take_while(|r| r.0.avoids > 0)
        .count();
    ranked[..checked].par_iter_mut().for_each(|(r, _, _)| {
        let settings = r.candidate.settings(current);
        let robust = plausible
            .iter()
            .zip(&r.runs)
            .filter(|(m, run)| {
                run.oom.is_none() && !narrow(run.peak_reserved_bytes, cap) && {
                    let replayer = member_replayer(m);
                    placement::ooms(&replayer, &settings, cap, false).fate() == Fate::Avoids
                }
            })
            .count();
        r.avoids_under_every_placement = Some(robust);
    });
    ranked[..checked].sort_by(order);
    // The smallest card the first config runs every plausible workload on.
    // When it avoids the OOM nowhere, the workloads only up to the message's
    // request (`trace`, the request last): what the message shows the job
    // needs to get past it, not a guess at its later steps.
    let mut bisection_replays = 0;
    let needed_capacity_bytes = ranked.first().filter(|_| bisect).map(|(best, _, _)| {
        let settings = best.candidate.settings(current);
        let on = |m: &Calibration| {
            if best.avoids == 0 && m.request_bytes.is_some() {
                m.trace.clone()
            } else {
                m.judged.clone()
            }
        };
        let (need, replays) = plausible
            .par_iter()
            .map(|m| {
                let t = on(m);
                capacity_needed(|c| replay(&t, &settings, "", c).figures)
            })
            .reduce(|| (0, 0), |a, b| (a.0.max(b.0), a.1 + b.1));
        bisection_replays = replays;
        need
    });
    let outgrown_on = match ranked.first() {
        Some((best, _, _))
            if e.observed.requested_bytes.is_some() && best.robust(plausible.len()) =>
        {
            outgrown_on(&plausible, &best.candidate.settings(current))
        }
        _ => Vec::new(),
    };
    pruning.bisection_replays += bisection_replays;
    let workloads = e.members.iter().map(WorkloadJudgement::unjudged).collect();
    EnsembleSearch {
        plausible: plausible.len(),
        fitted: e.members.len(),
        workloads,
        ranked: ranked.into_iter().map(|(r, _, _)| r).collect(),
        needed_capacity_bytes: if plausible.is_empty() {
            None
        } else {
            needed_capacity_bytes
        },
        outgrown_on,
        pruning,
        capacity: cap,
    }
}

impl EnsembleSearch {
    /// The verdict on the search: what to recommend (None: nothing), in words,
    /// how sure, and the exit code. `configs` counts the configs searched.
    pub fn verdict(&self, e: &Ensemble) -> (Option<&RankedConfig>, Verdict) {
        let n = self.plausible;
        let basis = Basis::Ensemble {
            plausible: n,
            fitted: self.fitted,
        };
        let consistent = "consistent with your figures";
        let Some(best) = self.ranked.first().filter(|_| n > 0) else {
            let verdict = Verdict {
                basis,
                strength: Strength::Uncertain,
                finding: not_reproduced(e, "which config avoids it"),
                exit_code: EXIT_UNCERTAIN,
            };
            return (None, verdict.settled());
        };
        if best.avoids == 0 && self.ranked.len() < 2 {
            // Only the config in use ran: the setup admits no other.
            let verdict = Verdict {
                basis,
                strength: ensemble_strength(n, n),
                finding: format!(
                    "No allocator setting could be tried for this setup; the current config runs \
                     out of memory on every one of the {n} workloads {consistent}"
                ),
                exit_code: 1,
            };
            return (None, verdict.settled());
        }
        if best.avoids == 0 {
            // What the message itself shows: the live tensors and the request
            // together; and the smallest card the fitted workloads get past
            // the request on, with the config that fails last.
            let floor = e
                .observed
                .requested_bytes
                .map(|r| e.observed.allocated_bytes.saturating_add(r));
            let need = match (floor, self.needed_capacity_bytes) {
                (Some(f), Some(b)) => format!(
                    "; the message's live tensors and request alone come to {}, and the fitted \
                     workloads get past the request from {} ({})",
                    human(f),
                    human(b),
                    super::validate::config_name(&best.conf)
                ),
                (Some(f), None) => format!(
                    "; the message's live tensors and request alone come to {}",
                    human(f)
                ),
                (None, Some(b)) => format!(
                    "; they would need {} ({} runs all of them from there)",
                    human(b),
                    super::validate::config_name(&best.conf)
                ),
                (None, None) => String::new(),
            };
            let verdict = Verdict {
                basis,
                strength: ensemble_strength(n, n),
                finding: format!(
                    "No allocator setting avoids this OOM in replay: every one of the {n} workloads {consistent} \
                     runs out of memory under every one of the {} configs at {}{need}",
                    self.ranked.len(),
                    human(self.capacity)
                ),
                exit_code: 1,
            };
            return (None, verdict.settled());
        }
        let name = super::validate::config_name(&best.conf);
        let mut parts = vec![if e.observed.requested_bytes.is_some() {
            format!(
                "{name} is the most robust config: it avoids the OOM {} {consistent}",
                in_count(best.avoids, n)
            )
        } else {
            // A summary records no OOM: there is none to avoid. The ranking
            // puts placement and margin before the peak, so the lowest mean
            // peak is claimed only where it holds.
            let mean_peak = |c: &RankedConfig| {
                c.runs
                    .iter()
                    .map(|r| r.peak_reserved_bytes as f64)
                    .sum::<f64>()
                    / c.runs.len().max(1) as f64
            };
            let lowest = self.ranked.iter().all(|c| mean_peak(best) <= mean_peak(c));
            format!(
                "No failed request to replay (a summary or stats dump records none, even where \
                 it counts OOMs): {name} {}, running without an OOM {} {consistent}",
                if lowest {
                    "has the lowest mean peak reserved"
                } else {
                    "ranks first"
                },
                in_count(best.avoids, n)
            )
        }];
        let robust = best.avoids_under_every_placement.unwrap_or(0);
        let tight = best.avoids - best.avoids_with_margin;
        if tight > 0 {
            parts.push(format!(
                "on {tight} of them with less than {:.0} % of the room to spare",
                100.0 * NARROW_MARGIN
            ));
        }
        if robust < best.avoids_with_margin {
            parts.push(format!(
                "on {} of them the outcome depends on where segments are placed",
                best.avoids_with_margin - robust
            ));
        }
        if !best.fails_on.is_empty() {
            parts.push(format!("it fails on {}", quoted(&best.fails_on)));
        }
        if let (Some(b), true) = (self.needed_capacity_bytes, best.avoids == n) {
            parts.push(format!("it runs them all from {}", human(b)));
        }
        if !self.outgrown_on.is_empty() {
            parts.push(outgrown_clause(&self.outgrown_on));
        }
        let strength = ensemble_strength(n, robust);
        let exit_code =
            if strength == Strength::Likely && best.robust(n) && self.outgrown_on.is_empty() {
                0
            } else {
                EXIT_UNCERTAIN
            };
        let verdict = Verdict {
            basis,
            strength,
            finding: parts.join("; "),
            exit_code,
        };
        (Some(best), verdict.settled())
    }
}

/// The peak-reserved change of the candidate on one workload, in words (for reports).
pub fn peak_words(j: &WorkloadJudgement) -> Option<String> {
    Some(peak_change(
        j.current_peak_reserved_bytes?,
        j.candidate_peak_reserved_bytes?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::probe::Figures;

    const GIB: u64 = 1 << 30;

    fn message(allocated: u64, requested: Option<u64>, capacity: u64) -> Ensemble {
        Ensemble {
            observed: Figures {
                allocated_bytes: allocated,
                reserved_bytes: allocated,
                requested_bytes: requested,
            },
            capacity,
            members: Vec::new(),
            free_beyond_request: None,
        }
    }

    #[test]
    fn the_clear_outcomes_decide_which_way_the_workloads_lean() {
        assert_eq!(workloads_lean(3, 1), Some(Leaning::Avoids));
        assert_eq!(workloads_lean(0, 1), Some(Leaning::Fails));
        assert_eq!(workloads_lean(2, 2), None);
        assert_eq!(workloads_lean(0, 0), None);
    }

    /// The message's headroom leans one way only when its figures say so:
    /// the live tensors and the request beyond the room (fails), or at least
    /// the narrow margin left (avoids); in between, and without a request or
    /// a room, it leans neither way.
    #[test]
    fn the_message_headroom_leans_only_when_its_figures_say_so() {
        let es = "expandable_segments:True";
        // 7 GiB live + a 1 GiB request of a 10 GiB room: 2 GiB (20 %) left.
        let (lean, clause) = headroom_lean(&message(7 * GIB, Some(GIB), 10 * GIB), es).unwrap();
        assert_eq!(lean, Some(Leaning::Avoids));
        assert!(
            clause.contains(
                "the live tensors and the 1024.00 MiB request leave 2.00 GiB (20.0 %) of the \
                 10.00 GiB the allocator could reach"
            ),
            "{clause}"
        );
        assert!(clause.contains("the message cannot tell"), "{clause}");
        // 7.5 GiB live + 1 GiB asked of an 8 GiB room: no config gets past it.
        let (lean, clause) =
            headroom_lean(&message(7 * GIB + GIB / 2, Some(GIB), 8 * GIB), es).unwrap();
        assert_eq!(lean, Some(Leaning::Fails));
        assert!(
            clause.contains("the 1024.00 MiB request (8.50 GiB) exceed the 8.00 GiB"),
            "{clause}"
        );
        // 100 MiB left of 10 GiB (1 %): under the narrow margin, no lean.
        let (lean, clause) =
            headroom_lean(&message(9 * GIB - (100 << 20), Some(GIB), 10 * GIB), es).unwrap();
        assert_eq!(lean, None);
        assert!(
            clause.contains("(1.0 %)") && clause.contains("less than 3 %"),
            "{clause}"
        );
        // A summary (no request) or an unknown room says nothing.
        assert!(headroom_lean(&message(7 * GIB, None, 10 * GIB), es).is_none());
        assert!(headroom_lean(&message(7 * GIB, Some(GIB), crate::device::NO_LIMIT), es).is_none());
    }
}
