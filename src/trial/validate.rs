//! `validate`'s judgement: the current and a candidate config replayed on the
//! same workload, side by side, and a verdict that says what it found, what it
//! rests on and how sure it is ([`Strength`]), which decides the exit code.
//!
//! A recorded workload (trace, RMM log, snapshot trace) is replayed as it
//! happened; on the simulated card the verdict is also checked under every
//! placement policy ([`super::placement`]). Text evidence is judged on the
//! [`Ensemble`] of probes fitted to it ([`super::ensemble`]).

use super::answer::{Answer, Replays, decide};
use super::ensemble::{self, Leaning, WorkloadJudgement};
use super::placement::{self, Fate, PolicyOutcome};
use super::run::{Run, conf_name, replay_on};
use super::workload::{CapacitySource, Workload};
use crate::Error;
use crate::advise::{Diagnosis, Setup};
use crate::conf::Settings;
use crate::device::DeviceSpec;
use crate::units::human;
use crate::workload::RunFigures;
use serde::Serialize;

/// Everything `validate` found, for the renderers.
#[derive(Debug, Clone, Serialize)]
pub struct Validation {
    pub input: String,
    pub device: String,
    /// The capacity both runs had (a GPU's cap when `--device cuda`).
    pub capacity_bytes: u64,
    pub capacity_source: CapacitySource,
    /// The recorded workload's runs, or, for text evidence, the runs on the
    /// probe closest to it.
    pub current: Run,
    pub candidate: Run,
    pub verdict: Verdict,
    /// The cause, the rules' line, and what the candidate's replay changes about it.
    pub answer: Answer,
    /// How sure the verdict is (also in `verdict`; a field of its own for scripts).
    pub strength: Strength,
    /// Text evidence: every fitted workload and what the candidate did on it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub workloads: Vec<WorkloadJudgement>,
    /// Text evidence: which way the verdict leans (`None`: neither way).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leaning: Option<Leaning>,
    /// A recorded workload on the simulated card: the outcome under each
    /// placement policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement: Option<PlacementCheck>,
    #[serde(skip)]
    pub ensemble: Option<crate::workload::probe::Ensemble>,
    /// The PyTorch version the current config was read for (the trace
    /// recording lines depend on it).
    #[serde(skip)]
    pub torch_version: crate::conf::TorchVersion,
}

/// What the candidate did against the current config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// It avoids an OOM the current config hits, or lowers peak reserved.
    Helps,
    /// Neither config runs out, at the same peak.
    Same,
    /// It still runs out of memory, or raises peak reserved.
    Worse,
}

impl Validation {
    pub fn outcome(&self) -> Outcome {
        let (c, n) = (&self.current.figures, &self.candidate.figures);
        match (&c.oom, &n.oom) {
            (_, Some(_)) => Outcome::Worse,
            (Some(_), None) => Outcome::Helps,
            (None, None) if n.peak_reserved_bytes < c.peak_reserved_bytes => Outcome::Helps,
            (None, None) if n.peak_reserved_bytes == c.peak_reserved_bytes => Outcome::Same,
            (None, None) => Outcome::Worse,
        }
    }
}

/// The current and the candidate config's OOMs under each placement policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlacementCheck {
    pub current: Vec<PolicyOutcome>,
    pub candidate: Vec<PolicyOutcome>,
    /// Whether both outcomes are the same under every policy.
    pub robust: bool,
}

/// How sure a verdict is, the one scale the answer weighs replays by:
/// proven (a recorded workload replayed, the outcome the same under every
/// placement policy, or a GPU run), likely (text evidence: at least
/// [`MIN_PLAUSIBLE`] fitted workloads reproduce the figures and at least
/// [`LIKELY_SHARE`] of them agree), uncertain (anything less).
pub use super::answer::Strength;

/// The share of plausible workloads that must agree for a "likely" verdict.
pub const LIKELY_SHARE: f64 = 0.8;
/// The fewest plausible workloads a "likely" verdict rests on.
pub const MIN_PLAUSIBLE: usize = 3;

/// The exit code of a verdict that is neither proven nor unanimous.
pub use crate::error::EXIT_UNCERTAIN;
use crate::error::{EXIT_OK, EXIT_STILL_OOM};

/// "likely" when enough plausible workloads agree, else "uncertain".
pub fn ensemble_strength(plausible: usize, agreeing: usize) -> Strength {
    if plausible >= MIN_PLAUSIBLE && agreeing as f64 >= LIKELY_SHARE * plausible as f64 {
        Strength::Likely
    } else {
        Strength::Uncertain
    }
}

/// What a verdict rests on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Basis {
    /// The workload as recorded (a trace, an RMM log, a snapshot's trace).
    Recorded,
    /// The recorded workload replayed, but neither the current config nor the
    /// answer's made a cudaMalloc or a cudaFree in it: nothing the configs
    /// decide differently was exercised.
    Indistinct,
    /// A snapshot whose state at the trace start does not fit the card: no
    /// config could start the replay.
    StartDoesNotFit,
    /// Text evidence: `plausible` of `fitted` probes reproduce it.
    Ensemble { plausible: usize, fitted: usize },
}

/// A judgement over runs: what was found, on what basis, how sure, and the
/// exit code that follows. Serialized as its [`sentence`](Verdict::sentence).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub basis: Basis,
    pub strength: Strength,
    /// What the runs showed, e.g. "the candidate avoids the OOM …"; for text
    /// evidence that was not reproduced, its first words say so.
    pub finding: String,
    pub exit_code: i32,
}

impl Verdict {
    /// The verdict as the reports print it.
    pub fn sentence(&self) -> String {
        self.finding.clone()
    }

    /// The verdict with its exit code and strength agreeing: exit 4 exactly
    /// when the strength is uncertain (an uncertain verdict neither passes
    /// nor fails a gate; one held back from 0 or 1 is uncertain).
    pub fn settled(mut self) -> Self {
        if self.strength == Strength::Uncertain {
            self.exit_code = EXIT_UNCERTAIN;
        } else if self.exit_code == EXIT_UNCERTAIN {
            self.strength = Strength::Uncertain;
        }
        self
    }

    /// The answer, in one sentence: the finding up to its first clause break.
    pub fn headline(&self) -> &str {
        self.finding.split("; ").next().unwrap_or_default()
    }

    /// The finding's further clauses, which reports list below the headline.
    pub fn details(&self) -> Vec<&str> {
        self.finding.split("; ").skip(1).collect()
    }

    /// What the strength rests on, in one line.
    pub fn evidence(&self) -> String {
        match self.basis {
            Basis::Recorded if self.strength == Strength::Proven => {
                "proven: the recorded workload was replayed".to_string()
            }
            Basis::Recorded => {
                "uncertain: the recorded workload was replayed, but the outcome depends on where \
                 segments are placed"
                    .to_string()
            }
            Basis::Indistinct => "uncertain: the recorded workload was replayed, but it \
                                  exercised nothing a config decides (no allocation, or neither \
                                  the current config nor the answer's made a cudaMalloc or a \
                                  cudaFree in it), so the replay cannot tell them apart"
                .to_string(),
            Basis::StartDoesNotFit => format!(
                "{}: the snapshot's state at the trace start does not fit the card, so the trace \
                 could not be replayed",
                self.strength.name()
            ),
            Basis::Ensemble { fitted: 0, .. } => format!(
                "{}: text only; no workload shape was fitted: the message shows more free memory \
                 than the request needs",
                self.strength.name()
            ),
            Basis::Ensemble { plausible, fitted } => format!(
                "{}: text only; {plausible} of {fitted} workload shapes fitted to the figures \
                 reproduce them (\"likely\" needs at least {MIN_PLAUSIBLE} that do, {:.0} % of them \
                 agreeing; exit 0 needs all to agree)",
                self.strength.name(),
                100.0 * LIKELY_SHARE
            ),
        }
    }
}

impl Serialize for Verdict {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.sentence())
    }
}

/// Replays `workload` under the current and the candidate config (each a
/// value as given and its settings) on `spec` and judges the candidate, then
/// settles the answer with the diagnosis of the evidence (none for a trace
/// CSV). `device` is the device as the user named it.
pub fn validate(
    workload: &Workload,
    (spec, device): (DeviceSpec, &str),
    current: (&str, &Settings),
    candidate: (&str, &Settings),
    (capacity, source): (u64, CapacitySource),
    (diagnosis, setup): (Option<&Diagnosis>, &Setup),
) -> Result<Validation, Error> {
    // A GPU without a stated capacity is capped at its free memory.
    let cap = (spec == DeviceSpec::Sim || source != CapacitySource::Default).then_some(capacity);
    let before = replay_on(spec, workload, current.1, current.0, cap)?;
    let after = replay_on(spec, workload, candidate.1, candidate.0, cap)?;
    let name = if candidate.0.is_empty() {
        "PyTorch's defaults"
    } else {
        candidate.0
    };
    let (verdict, workloads, placement, leaning) = match &workload.ensemble {
        Some(e) => {
            let mut j = ensemble::judge(e, current.1, (name, candidate.1));
            // Only a replayed trace drops the rules' line (trial::answer): the
            // rules' line failing on synthetic workloads, as the current config
            // does on every one, leaves it uncertain here as in `recommend`.
            let rules_line = diagnosis
                .and_then(|d| d.recommendation.as_ref())
                .is_some_and(|r| super::answer::same_config(&r.value, candidate.0));
            if rules_line && j.verdict.exit_code == EXIT_STILL_OOM {
                j.verdict.strength = Strength::Uncertain;
                j.verdict.exit_code = EXIT_UNCERTAIN;
                j.verdict.finding.push_str(
                    "; it is the rules' line, and synthetic workloads are not strong enough \
                     evidence to drop it (only a replayed trace is)",
                );
            }
            (j.verdict, j.workloads, None, j.leaning)
        }
        None if spec == DeviceSpec::Sim => {
            let check = workload.with_replayer(|replay| {
                let current =
                    placement::ooms(replay, current.1, capacity, before.figures.oom.is_some());
                let candidate =
                    placement::ooms(replay, candidate.1, capacity, after.figures.oom.is_some());
                (current, candidate)
            })?;
            let robust = check.0.fate() != Fate::DependsOnPlacement
                && check.1.fate() != Fate::DependsOnPlacement;
            let mut verdict = recorded_verdict(&before, &after, capacity);
            if !robust && verdict.basis == Basis::Recorded {
                verdict.finding.push_str(&placement_clause(
                    &before,
                    &after,
                    &check.0.differing(),
                    &check.1.differing(),
                ));
                verdict.strength = Strength::Uncertain;
                verdict.exit_code = EXIT_UNCERTAIN;
            }
            let placement = PlacementCheck {
                current: check.0.by_policy(),
                candidate: check.1.by_policy(),
                robust,
            };
            (verdict, Vec::new(), Some(placement), None)
        }
        // A GPU placed the segments itself: nothing to vary.
        None => (
            recorded_verdict(&before, &after, after.figures.capacity_bytes),
            Vec::new(),
            None,
            None,
        ),
    };
    let answer = decide(
        diagnosis,
        setup,
        Some(Replays {
            strength: verdict.strength,
            current: &before,
            ranked: std::slice::from_ref(&after),
            rules: None,
        }),
    );
    Ok(Validation {
        answer,
        input: workload.input.clone(),
        device: device.to_string(),
        capacity_bytes: after.figures.capacity_bytes,
        capacity_source: source,
        current: before,
        candidate: after,
        strength: verdict.strength,
        verdict,
        workloads,
        leaning,
        placement,
        ensemble: workload.ensemble.clone(),
        torch_version: current.1.version,
    })
}

/// The verdict on a recorded workload's two runs, before placement is
/// checked: proven when the replay could tell the configs apart, uncertain
/// when no config made a cudaMalloc or a cudaFree ([`indistinct`]); a start
/// state that does not fit the card is a sure failure only when its live
/// memory alone is larger than the card.
fn recorded_verdict(before: &Run, after: &Run, capacity: u64) -> Verdict {
    let finding = finding(before, after);
    let start = after.figures.oom.as_ref().and_then(|o| o.before_trace);
    let (basis, strength, exit_code) = match start {
        Some((live, _)) if live > capacity => {
            (Basis::StartDoesNotFit, Strength::Proven, EXIT_STILL_OOM)
        }
        Some(_) => (Basis::StartDoesNotFit, Strength::Uncertain, EXIT_UNCERTAIN),
        None if indistinct(&[&before.figures, &after.figures]) => {
            (Basis::Indistinct, Strength::Uncertain, EXIT_UNCERTAIN)
        }
        None if after.figures.oom.is_some() => (Basis::Recorded, Strength::Proven, EXIT_STILL_OOM),
        None => (Basis::Recorded, Strength::Proven, EXIT_OK),
    };
    let finding = if basis == Basis::Indistinct {
        format!("{finding}; {}", indistinct_sentence(&before.figures))
    } else {
        finding
    };
    Verdict {
        basis,
        strength,
        finding,
        exit_code,
    }
}

/// Whether replays of a recorded workload cannot tell configs apart: no run
/// made a cudaMalloc, a cudaFree (an expandable segment's map or unmap
/// counts) or a failed attempt, so every request was served from the
/// segments it started with, and nothing a config decides was exercised
/// (the condition of a "proven" claim, `advise::claims::exercised`).
pub(crate) fn indistinct(runs: &[&RunFigures]) -> bool {
    !runs.is_empty() && !crate::advise::claims::exercised(runs)
}

/// Why an [`indistinct`] replay (`run`, the current config's) is
/// uncertain, in one sentence.
pub(crate) fn indistinct_sentence(run: &RunFigures) -> String {
    let events = run.events;
    let noun = if events == 1 { "event" } else { "events" };
    if run.alloc_events == 0 {
        return format!(
            "this is uncertain: the trace's {events} {noun} {} no allocation, so every config \
             does the same (the same frees of what the snapshot held), and the replay cannot tell \
             them apart",
            if events == 1 { "holds" } else { "hold" }
        );
    }
    format!(
        "this is uncertain: in the trace's {events} {noun} neither the current config nor this one \
         made a cudaMalloc or a cudaFree (every request was served from the segments the snapshot \
         already held), so the replay cannot tell them apart"
    )
}

/// "; this depends on where the driver places segments: under … the
/// candidate runs out of memory", for each config whose outcome flips.
fn placement_clause(before: &Run, after: &Run, current: &[&str], candidate: &[&str]) -> String {
    let part = |who: &str, run: &Run, policies: &[&str]| {
        format!(
            "under {} {who} {}",
            policies.join(" and "),
            if run.figures.oom.is_some() {
                "does not run out of memory"
            } else {
                "runs out of memory"
            }
        )
    };
    let mut parts = Vec::new();
    if !candidate.is_empty() {
        parts.push(part("the candidate", after, candidate));
    }
    if !current.is_empty() {
        parts.push(part("the current config", before, current));
    }
    format!(
        "; this depends on where the driver places segments: {}",
        parts.join(", and ")
    )
}

/// What the candidate did against the current config, in one sentence.
pub(crate) fn finding(current: &Run, candidate: &Run) -> String {
    let name = if candidate.conf.is_empty() {
        "PyTorch's defaults"
    } else {
        "the candidate"
    };
    let (current, candidate) = (&current.figures, &candidate.figures);
    let work = |r: &RunFigures| r.device_allocs + r.device_frees;
    match (&current.oom, &candidate.oom) {
        (_, Some(o)) if o.before_trace.is_some() => start_does_not_fit(name, o, candidate),
        (_, Some(o)) => format!(
            "{name} still runs out of memory at event {} (a request of {})",
            o.event_index,
            human(o.requested_bytes)
        ),
        (Some(o), None) => format!(
            "{name} avoids the OOM (the current config runs out at event {}) with peak reserved {}",
            o.event_index,
            human(candidate.peak_reserved_bytes)
        ),
        (None, None) => {
            let mut s = format!(
                "{name} {}",
                peak_change(current.peak_reserved_bytes, candidate.peak_reserved_bytes)
            );
            let (a, b) = (work(current), work(candidate));
            if a != b {
                s.push_str(&format!(
                    ", with {b} cudaMalloc/cudaFree calls instead of {a}"
                ));
            }
            s
        }
    }
}

/// "X cannot replay the trace: the snapshot's live memory … does not fit the card".
pub(crate) fn start_does_not_fit(
    name: &str,
    o: &crate::workload::OomEvent,
    r: &RunFigures,
) -> String {
    let (live, reserved) = o.before_trace.unwrap_or_default();
    let card = human(r.capacity_bytes);
    if live > r.capacity_bytes {
        format!(
            "{name} cannot run: the snapshot's live memory at the trace start ({}) does not fit \
             the {card} card, whatever the config",
            human(live)
        )
    } else {
        format!(
            "{name} cannot replay the trace: the snapshot's memory at the trace start ({} live \
             in {} reserved) does not fit the {card} card; whether a config that caches less \
             would fit, the replay cannot tell",
            human(live),
            human(reserved)
        )
    }
}

/// "lowers peak reserved by X (p %)", "raises …", "keeps peak reserved the same".
pub(crate) fn peak_change(current: u64, candidate: u64) -> String {
    if candidate < current {
        format!(
            "lowers peak reserved by {} ({:.1} %)",
            human(current - candidate),
            100.0 * (current - candidate) as f64 / current.max(1) as f64
        )
    } else if candidate > current {
        format!(
            "raises peak reserved by {} ({:.1} %)",
            human(candidate - current),
            100.0 * (candidate - current) as f64 / current.max(1) as f64
        )
    } else {
        "keeps peak reserved the same".to_string()
    }
}

/// A config's name in a sentence.
pub(crate) fn config_name(conf: &str) -> &str {
    if conf.is_empty() {
        "PyTorch's defaults"
    } else {
        conf_name(conf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strength_needs_enough_agreeing_workloads() {
        assert_eq!(ensemble_strength(6, 6), Strength::Likely);
        assert_eq!(ensemble_strength(6, 5), Strength::Likely, "5/6 = 83 %");
        assert_eq!(ensemble_strength(6, 4), Strength::Uncertain, "4/6 = 67 %");
        assert_eq!(ensemble_strength(2, 2), Strength::Uncertain, "too few");
        assert_eq!(ensemble_strength(0, 0), Strength::Uncertain);
    }
}
