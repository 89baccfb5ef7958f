//! The check `diagnose` runs before it shows a setting that a trace rule
//! suggested: the snapshot's trace replayed from the state it started in,
//! under the config it recorded and under that config plus the suggestion,
//! on the simulated card, judged by [`RunFigures::rank`] (no OOM first, then
//! lower peak reserved, then less driver work).
//!
//! A fraction cap set from Python (`set_per_process_memory_fraction`) is not
//! in `allocator_settings`; when the trace shows one (an `oom` entry with the
//! request free on the device), both runs are capped at the highest reserved
//! figure the trace reached, the most the recording ever got under it.

use super::run::conf_name;
use super::workload::Workload;
use crate::advise::ReplayCheck;
use crate::conf::{Settings, TorchVersion};
use crate::device::sim::Placement::FirstFit;
use crate::rules::{Fact, Facts};
use crate::units::human;
use crate::workload::RunFigures;
use std::collections::BTreeMap;

/// Replays a traced snapshot for [`crate::advise::diagnose_checked`]: read
/// and decoded again only when a check is asked for; the run without the
/// suggestions is made once and reused.
pub struct TraceChecker {
    name: String,
    /// Where `name` is read from when it is not a file (the Python API's contents).
    buffers: crate::ingest::Buffers,
    limits: crate::limits::Limits,
    workload: Option<Result<Workload, String>>,
    baseline: Option<(String, Settings, super::Run, u64)>,
}

impl TraceChecker {
    /// The checker of the snapshot input `name` (a file, or one of `buffers`).
    pub fn new(
        name: &str,
        buffers: crate::ingest::Buffers,
        limits: crate::limits::Limits,
    ) -> TraceChecker {
        TraceChecker {
            name: name.to_string(),
            buffers,
            limits,
            workload: None,
            baseline: None,
        }
    }

    /// Replays without and with `settings` (what a trace rule suggested).
    pub fn check(
        &mut self,
        facts: &Facts,
        settings: &BTreeMap<String, String>,
    ) -> Result<ReplayCheck, String> {
        let num = |n: &str| fact(facts, n);
        // Without an oom entry the replay runs on the default card; a start
        // state larger than it cannot be seeded (not worth decoding again).
        let reserved = num("reserved").unwrap_or(0.0);
        if num("free").is_none() && reserved > super::workload::DEFAULT_CAPACITY as f64 {
            return Err(format!(
                "the snapshot reserves {}, more than the {} card a replay runs on without a recorded OOM",
                human(reserved as u64),
                human(super::workload::DEFAULT_CAPACITY)
            ));
        }
        let (name, buffers, limits) = (&self.name, &self.buffers, &self.limits);
        let workload = self
            .workload
            .get_or_insert_with(|| {
                if name == "-" || name == crate::ingest::STANDARD_INPUT {
                    return Err("standard input is read once: save the snapshot to a file to have it replayed".into());
                }
                let data = buffers.read(name, limits).map_err(|e| e.to_string())?;
                Workload::snapshot(name, data, limits)
                    .map_err(|e| e.to_string())?
                    .ok_or_else(|| super::workload::no_trace(name))
            })
            .as_ref()
            .map_err(Clone::clone)?;
        let (capacity, _) = workload.capacity(None);
        if self.baseline.is_none() {
            let (conf, mut current, _) = workload.current(None, Settings::default());
            cap_at_trace_peak(&mut current, facts, capacity);
            let run = workload
                .with_replayer(|replay| replay(&current, &conf, capacity, None, FirstFit))
                .map_err(|e| e.to_string())?;
            self.baseline = Some((conf, current, run, capacity));
        }
        let Some((conf, current, without, capacity)) = &self.baseline else {
            return Err("no baseline replay".into());
        };
        let suggestion: Vec<String> = settings.iter().map(|(k, v)| format!("{k}:{v}")).collect();
        let suggestion = suggestion.join(",");
        // A key given twice takes its last value (PyTorch's parsers overwrite).
        let with_conf = if conf.is_empty() {
            suggestion.clone()
        } else {
            format!("{conf},{suggestion}")
        };
        let mut with_settings = crate::conf::parse(&with_conf, TorchVersion::DEFAULT)
            .map_err(|e| format!("{with_conf:?} does not parse: {e}"))?
            .settings;
        with_settings.per_process_memory_fraction = current.per_process_memory_fraction;
        let with = workload
            .with_replayer(|replay| replay(&with_settings, &with_conf, *capacity, None, FirstFit))
            .map_err(|e| e.to_string())?;
        let supported = with.figures.rank(&without.figures) == std::cmp::Ordering::Less;
        let mut sentence = difference(&without.figures, &with.figures);
        if let Some(f) = current.per_process_memory_fraction {
            sentence.push_str(&format!(
                " (both runs capped at {}, where the trace's reserved memory peaked)",
                human((f * *capacity as f64) as u64)
            ));
        }
        Ok(ReplayCheck {
            settings: suggestion,
            without: conf_name(conf).to_string(),
            with: with_conf,
            capacity_bytes: *capacity,
            without_figures: without.figures.clone(),
            with_figures: with.figures.clone(),
            supported,
            finding: sentence,
        })
    }
}

/// Caps `settings` at the trace's reserved peak when the trace shows a
/// fraction cap the recorded settings do not hold.
fn cap_at_trace_peak(settings: &mut Settings, facts: &Facts, capacity: u64) {
    let num = |n: &str| fact(facts, n);
    let capped = num("ooms_with_free_device").is_some_and(|n| n >= 1.0);
    if settings.per_process_memory_fraction.is_none()
        && capped
        && let Some(peak) = num("trace_peak_reserved")
        && peak > 0.0
        && capacity > 0
    {
        settings.per_process_memory_fraction = Some((peak / capacity as f64).min(1.0));
    }
}

/// What changed with the suggestion, figure by figure ("X instead of Y").
fn difference(without: &RunFigures, with: &RunFigures) -> String {
    let mut parts = Vec::new();
    if without.peak_reserved_bytes != with.peak_reserved_bytes {
        parts.push(format!(
            "peak reserved {} instead of {}",
            human(with.peak_reserved_bytes),
            human(without.peak_reserved_bytes)
        ));
    }
    let counts = [
        (
            "cudaMalloc calls",
            without.device_allocs,
            with.device_allocs,
        ),
        ("cudaFree calls", without.device_frees, with.device_frees),
        (
            "cudaMalloc retries",
            without.alloc_retries,
            with.alloc_retries,
        ),
        (
            "synchronizations",
            without.synchronizations,
            with.synchronizations,
        ),
    ];
    for (name, a, b) in counts {
        if a != b {
            parts.push(format!("{b} {name} instead of {a}"));
        }
    }
    match (&without.oom, &with.oom) {
        (Some(a), None) => parts.push(format!("no OOM (without it: at event {})", a.event_index)),
        (None, Some(b)) => parts.push(format!("an OOM at event {}", b.event_index)),
        (Some(a), Some(b)) if a.event_index == b.event_index => parts.push(format!(
            "both run out of memory at event {} (a request of {})",
            a.event_index,
            human(a.requested_bytes)
        )),
        (Some(a), Some(b)) => parts.push(format!(
            "an OOM at event {} instead of {}",
            b.event_index, a.event_index
        )),
        (None, None) => {}
    }
    if parts.is_empty() {
        "with it, the replay's figures do not change".into()
    } else {
        format!("with it, {}", parts.join(", "))
    }
}

fn fact(facts: &Facts, name: &str) -> Option<f64> {
    match facts.values.get(name) {
        Some(Fact::Num(v)) => Some(*v),
        _ => None,
    }
}
