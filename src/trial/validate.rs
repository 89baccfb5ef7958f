//! `validate`'s judgement: the current and a candidate config replayed on the
//! same workload, side by side, and a verdict that says what it rests on.

use super::answer::{Answer, Replays, decide};
use super::run::{Run, replay_on};
use super::workload::{CapacitySource, Workload};
use crate::Error;
use crate::advise::{Diagnosis, Setup};
use crate::conf::Settings;
use crate::device::DeviceSpec;
use crate::workload::RunFigures;
use crate::workload::probe::Calibration;
use serde::Serialize;

/// Everything `validate` found, for the renderers.
#[derive(Debug, Clone, Serialize)]
pub struct Validation {
    pub input: String,
    pub device: String,
    /// The capacity both runs had (a GPU's cap when `--device cuda`).
    pub capacity_bytes: u64,
    pub capacity_source: CapacitySource,
    pub current: Run,
    pub candidate: Run,
    pub verdict: Verdict,
    /// The cause, the rules' line, and what the candidate's replay changes about it.
    pub answer: Answer,
    #[serde(skip)]
    pub probe: Option<Calibration>,
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

/// What a verdict rests on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Basis {
    /// The workload as recorded (a trace, an RMM log, a snapshot's trace).
    Recorded,
    /// A synthetic probe of this family, fitted to text evidence.
    Probe(&'static str),
}

/// A judgement over runs: what was found, and on what basis. Serialized as
/// its [`sentence`](Verdict::sentence).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub basis: Basis,
    /// What the runs showed, e.g. "the candidate avoids the OOM …".
    pub finding: String,
}

impl Verdict {
    /// The verdict as the reports print it: the finding, prefixed with the
    /// probe it was found on.
    pub fn sentence(&self) -> String {
        match self.basis {
            Basis::Recorded => self.finding.clone(),
            Basis::Probe(family) => format!("on a synthetic probe ({family}), {}", self.finding),
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
    let verdict = Verdict {
        basis: match &workload.probe {
            Some(p) => Basis::Probe(p.family.name()),
            None => Basis::Recorded,
        },
        finding: finding(&before, &after),
    };
    let answer = decide(
        diagnosis,
        setup,
        Some(Replays {
            strength: workload.strength(),
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
        verdict,
        probe: workload.probe.clone(),
    })
}

/// What the candidate did against the current config, in one sentence.
fn finding(current: &Run, candidate: &Run) -> String {
    use crate::units::human;
    let name = if candidate.conf.is_empty() {
        "PyTorch's defaults"
    } else {
        "the candidate"
    };
    let delta = |c: u64, n: u64| {
        if n < c {
            format!(
                "lowers peak reserved by {} ({:.1} %)",
                human(c - n),
                100.0 * (c - n) as f64 / c.max(1) as f64
            )
        } else if n > c {
            format!(
                "raises peak reserved by {} ({:.1} %)",
                human(n - c),
                100.0 * (n - c) as f64 / c.max(1) as f64
            )
        } else {
            "keeps peak reserved the same".to_string()
        }
    };
    let (current, candidate) = (&current.figures, &candidate.figures);
    let work = |r: &RunFigures| r.device_allocs + r.device_frees;
    match (&current.oom, &candidate.oom) {
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
                delta(current.peak_reserved_bytes, candidate.peak_reserved_bytes)
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
