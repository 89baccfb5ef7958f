//! The workload a command runs: a trace CSV, an RMM log or a snapshot's
//! trace as recorded, or, for text-only evidence (an OOM message, summaries),
//! an ensemble of probes fitted to its figures ([`crate::workload::probe`]);
//! where the capacity of its runs comes from; and the config it is compared
//! against.

use super::run::{ForkingReplays, Replayer, replay, replay_placed, replay_snapshot};
use crate::Error;
use crate::advise::Diagnosis;
use crate::conf::Settings;
use crate::device::sim::Placement;
use crate::evidence::{Kind, Observation};
use crate::ingest::Bytes;
use crate::workload::Trace;
use crate::workload::probe::{self, Ensemble, Figures, Target};
use crate::workload::snapshot_trace::{SnapshotTrace, recorded_settings, traced_device};
use serde::Serialize;

/// The card replays run on when nothing says otherwise (an 80 GiB A100/H100).
pub const DEFAULT_CAPACITY: u64 = 80 << 30;

/// What a workload replays.
pub enum Source {
    /// A trace CSV, or the generated trace of the probe closest to text evidence.
    Trace(Trace),
    /// A snapshot pickle with a trace, kept as bytes (the decoded snapshot
    /// borrows them) with the limits it is decoded within; replayed from the
    /// state the trace started in.
    Snapshot(Bytes, crate::limits::Limits),
}

/// What loading an input gave: a workload, or why there is nothing to
/// replay (no trace, and no figures a probe could be fitted to).
pub enum Loaded {
    Ready(Box<Workload>),
    Nothing(String),
}

/// What gets replayed for an input.
pub struct Workload {
    pub input: String,
    pub source: Source,
    /// The capacity the evidence implies (a snapshot's card, a probe's fit).
    pub implied_capacity: Option<u64>,
    /// Set for text evidence: the probes fitted to its figures (`source` is
    /// the closest one's trace).
    pub ensemble: Option<Ensemble>,
    /// The rule engine's recommended value for the evidence (`None` for a
    /// trace CSV, which holds no observations, or when no setting would help).
    pub advice: Option<String>,
    /// The settings a snapshot recorded in its `allocator_settings`.
    pub recorded: Option<Settings>,
}

/// Where the capacity of the runs came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CapacitySource {
    /// `--capacity`.
    Given,
    /// The evidence: a snapshot's recorded OOM, a probe's fit, an RMM log's failure.
    Evidence,
    /// Nothing said: the simulated card of [`DEFAULT_CAPACITY`].
    Default,
}

impl CapacitySource {
    /// How a capacity was chosen, for text output.
    pub fn describe(self) -> &'static str {
        match self {
            CapacitySource::Given => "from --capacity",
            CapacitySource::Evidence => "implied by the evidence",
            CapacitySource::Default => "the default card: set --capacity",
        }
    }
}

impl Workload {
    /// The capacity to replay at: `--capacity`, else what the evidence
    /// implies, else the default card (as `replay` does).
    pub fn capacity(&self, given: Option<u64>) -> (u64, CapacitySource) {
        match (given, self.implied_capacity) {
            (Some(c), _) => (c, CapacitySource::Given),
            (None, Some(c)) => (c, CapacitySource::Evidence),
            (None, None) => (DEFAULT_CAPACITY, CapacitySource::Default),
        }
    }

    /// The config to compare against: `--current` when given, else what a
    /// snapshot recorded, else PyTorch's defaults. Returns (value, settings, note).
    pub fn current(
        &self,
        given: Option<&str>,
        parsed: Settings,
    ) -> (String, Settings, Option<String>) {
        match (given, &self.recorded) {
            (Some(value), _) => (value.to_string(), parsed, None),
            (None, Some(recorded)) => {
                let value = crate::conf::render(recorded);
                let note = format!(
                    "current config: {} (as the snapshot recorded it)",
                    if value.is_empty() {
                        "PyTorch's defaults"
                    } else {
                        &value
                    }
                );
                (value, recorded.clone(), Some(note))
            }
            (None, None) => (String::new(), parsed, None),
        }
    }
}

/// The figures a probe must reproduce, from the most telling observation:
/// the diagnosed one (`primary`, the headline incident) when it is a
/// caching-allocator OOM with figures, else the last such OOM, else the last
/// summary or stats dump.
pub fn probe_target(
    observations: &[Observation],
    primary: Option<usize>,
    capacity: Option<u64>,
    current: &Settings,
) -> Option<Target> {
    let fit = |o: &&Observation| o.kind == Kind::Oom && o.allocated_bytes.is_some();
    let oom = primary
        .and_then(|i| observations.get(i))
        .filter(fit)
        .or_else(|| observations.iter().rev().find(fit));
    if let Some(o) = oom {
        let allocated = o.allocated_bytes?;
        // 1.0-1.3 print "cached", the same gap as reserved-but-unallocated
        // (advise::facts reads it so too).
        let reserved = o.reserved_bytes.or(o
            .reserved_unallocated_bytes
            .or(o.cached_bytes)
            .map(|r| allocated.saturating_add(r)))?;
        // What the allocator could reach: what it held plus what the card still had free.
        let room = o
            .free_bytes
            .map(|f| reserved.saturating_add(f))
            .or(o.allowed_bytes)
            .or(o.total_capacity_bytes)?;
        return Some(Target {
            observed: Figures {
                allocated_bytes: allocated,
                reserved_bytes: reserved,
                requested_bytes: o.requested_bytes,
            },
            capacity: capacity.unwrap_or(room),
            settings: current.clone(),
        });
    }
    let dump = observations.iter().rev().find(|o| {
        matches!(o.kind, Kind::MemorySummary | Kind::MemoryStats) && o.metrics.is_some()
    })?;
    let now = |stat: &str| -> Option<u64> {
        let v = dump.metrics.as_ref()?.get(stat)?.get("all")?;
        u64::try_from(v.current.or(v.peak)?).ok()
    };
    let allocated = now("allocated_bytes")?;
    let reserved = now("reserved_bytes")?;
    Some(Target {
        observed: Figures {
            allocated_bytes: allocated,
            reserved_bytes: reserved,
            requested_bytes: None,
        },
        capacity: capacity.unwrap_or(crate::device::NO_LIMIT),
        settings: current.clone(),
    })
}

impl Workload {
    /// A snapshot's trace, replayed from the state it started in, or `None`
    /// when no device has a trace. Decoded once here, so that a snapshot
    /// without a trace says so before any replay.
    pub fn snapshot(
        name: &str,
        data: crate::ingest::Bytes,
        limits: &crate::limits::Limits,
    ) -> Result<Option<Workload>, Error> {
        let Some((recorded, implied_capacity)) =
            try_snapshot_trace(name, &data, limits, |st, recorded| {
                (recorded.cloned(), st.recorded_capacity())
            })?
        else {
            return Ok(None);
        };
        Ok(Some(Workload {
            input: name.to_string(),
            implied_capacity,
            source: Source::Snapshot(data, *limits),
            ensemble: None,
            advice: None,
            recorded,
        }))
    }

    /// A recorded trace, replayed as it is.
    fn recorded(name: &str, trace: Trace) -> Workload {
        Workload {
            input: name.to_string(),
            implied_capacity: trace.capacity_hint(),
            source: Source::Trace(trace),
            ensemble: None,
            advice: None,
            recorded: None,
        }
    }

    /// Loads the workload for `input`: a trace as recorded, or a probe fitted
    /// under `current` to the figures of the text evidence `diagnosis` read
    /// (its headline incident), or why there is nothing to replay.
    pub fn load(
        input: &str,
        capacity: Option<u64>,
        current: &Settings,
        diagnosis: Option<&Diagnosis>,
        limits: &crate::limits::Limits,
    ) -> Result<Loaded, Error> {
        let data =
            crate::ingest::read_input_with(if input.is_empty() { "-" } else { input }, limits)?;
        let name = crate::ingest::input_name(input);
        Workload::from_bytes(name, data, capacity, current, (diagnosis, limits))
    }

    /// [`Workload::load`] for an input already read (standard input is read once).
    pub fn from_bytes(
        name: &str,
        data: Bytes,
        capacity: Option<u64>,
        current: &Settings,
        (diagnosis, limits): (Option<&Diagnosis>, &crate::limits::Limits),
    ) -> Result<Loaded, Error> {
        let advice = diagnosis
            .and_then(|d| d.recommendation.as_ref())
            .map(|r| r.value.clone());
        match crate::ingest::detect(&data) {
            crate::ingest::InputKind::TraceCsv => {
                return Ok(Loaded::Ready(Box::new(Workload::recorded(
                    name,
                    Trace::parse(name, &data)?,
                ))));
            }
            crate::ingest::InputKind::Pickle => {
                return Ok(match Workload::snapshot(name, data, limits)? {
                    Some(w) => Loaded::Ready(Box::new(Workload { advice, ..w })),
                    None => Loaded::Nothing(no_trace(name)),
                });
            }
            crate::ingest::InputKind::RmmLog => {
                // RMM's own allocations, replayed through PyTorch's caching allocator.
                let (trace, _skipped) = crate::workload::rmm::parse(name, &data)?.to_trace()?;
                return Ok(Loaded::Ready(Box::new(Workload::recorded(name, trace))));
            }
            crate::ingest::InputKind::Text => {
                // A trace CSV whose header is quoted (RFC 4180): `ingest::detect` reads only plain headers.
                if let Some(trace) = crate::workload::detect_trace(name, &data)? {
                    return Ok(Loaded::Ready(Box::new(Workload::recorded(name, trace))));
                }
            }
        }
        let parsed;
        let (observations, primary) = match diagnosis {
            Some(d) => (&d.evidence.observations[..], d.primary),
            None => {
                parsed = crate::ingest::parse_bytes(name, &data)?;
                (&parsed[..], None)
            }
        };
        let Some(target) = probe_target(observations, primary, capacity, current) else {
            return Ok(Loaded::Nothing(format!(
                "{name}: no trace, and no OOM message or memory summary with allocated and \
                 reserved figures to fit a probe to"
            )));
        };
        // No card comes near 1 PiB: such figures are a misprint or a shape bug
        // (`diagnose` says which), and a probe of that size says nothing.
        let figures = [
            Some(target.observed.allocated_bytes),
            Some(target.observed.reserved_bytes),
            target.observed.requested_bytes,
        ];
        if let Some(big) = figures
            .into_iter()
            .flatten()
            .find(|&b| b > crate::device::NO_LIMIT)
        {
            return Ok(Loaded::Nothing(format!(
                "{name}: the evidence states {}: beyond any card, so no probe can model it",
                crate::units::human(big)
            )));
        }
        let ensemble = probe::fit_ensemble(&target, 1, |trace, cap| {
            replay(trace, current, "", cap).figures
        });
        let Some(ensemble) = ensemble else {
            return Ok(Loaded::Nothing(format!(
                "{name}: the evidence shows nothing allocated to fit a probe to"
            )));
        };
        // The closest member as configs are judged on it (past the request),
        // so the runs shown beside a verdict are the runs it rests on.
        let closest = ensemble
            .best()
            .map(|m| {
                if m.judged.is_empty() {
                    m.trace.clone()
                } else {
                    m.judged.clone()
                }
            })
            .unwrap_or_default();
        Ok(Loaded::Ready(Box::new(Workload {
            input: name.to_string(),
            source: Source::Trace(closest),
            implied_capacity: (target.capacity != crate::device::NO_LIMIT)
                .then_some(target.capacity),
            ensemble: Some(ensemble),
            advice,
            recorded: None,
        })))
    }
}
/// Why a snapshot without a trace cannot be replayed.
pub(crate) fn no_trace(name: &str) -> String {
    format!(
        "{name}: the snapshot has no trace to replay: record it with \
         torch.cuda.memory._record_memory_history() before the workload runs"
    )
}

/// Decodes the snapshot in `data` and hands its trace (first traced device)
/// to `f`; `None` when no device has a trace.
fn try_snapshot_trace<T>(
    name: &str,
    data: &[u8],
    limits: &crate::limits::Limits,
    f: impl FnOnce(&SnapshotTrace, Option<&Settings>) -> T,
) -> Result<Option<T>, Error> {
    let snap = crate::snapshot::load_with(name, data, limits)?;
    let Some(device) = traced_device(&snap) else {
        return Ok(None);
    };
    let recorded = recorded_settings(&snap);
    let st = SnapshotTrace::new(&snap, device, &recorded)
        .map_err(|e| Error::Input(format!("{name}: {e}")))?;
    // Only a snapshot with `allocator_settings` says which config it ran under.
    let said = crate::snapshot::evidence::settings_json(&snap).map(|_| &recorded);
    Ok(Some(f(&st, said)))
}

/// [`try_snapshot_trace`] for a snapshot known to have a trace.
pub(crate) fn with_snapshot_trace<T>(
    name: &str,
    data: &[u8],
    limits: &crate::limits::Limits,
    f: impl FnOnce(&SnapshotTrace, Option<&Settings>) -> T,
) -> Result<T, Error> {
    try_snapshot_trace(name, data, limits, f)?.ok_or_else(|| Error::Input(no_trace(name)))
}

/// The distinct request sizes of a trace, ascending.
pub fn distinct_request_sizes(trace: &Trace) -> Vec<u64> {
    let mut sizes: Vec<u64> = trace
        .events()
        .iter()
        .filter_map(|e| match *e {
            crate::workload::Event::Alloc { size, .. } => Some(size),
            _ => None,
        })
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

impl Workload {
    /// The distinct request sizes, when every segment of a replay comes from
    /// one of them (not for a snapshot, whose start state has its own segments).
    pub fn request_sizes(&self) -> Option<Vec<u64>> {
        match &self.source {
            Source::Trace(trace) => Some(distinct_request_sizes(trace)),
            Source::Snapshot(..) => None,
        }
    }

    /// Calls `f` with this workload's replayer on the simulated card.
    pub fn with_replayer<T>(&self, f: impl FnOnce(&Replayer) -> T) -> Result<T, Error> {
        match &self.source {
            // A bound is kept only with first-fit placement: the other
            // policies check a verdict, so they run to the end.
            Source::Trace(trace) => {
                let forking = ForkingReplays::new(trace);
                Ok(f(&|s, conf, cap, stop, placement| match placement {
                    Placement::FirstFit => forking.replay(s, conf, cap, stop),
                    other => replay_placed(trace, s, conf, cap, other),
                }))
            }
            Source::Snapshot(data, limits) => {
                with_snapshot_trace(&self.input, data, limits, |st, _| {
                    // The start state sits at its recorded addresses; later
                    // segments are placed by the policy.
                    f(&|s, conf, cap, _, placement| {
                        let device = crate::device::sim::SimDevice::new(cap)
                            .with_recorded_addresses(st.recorded_addresses(false))
                            .with_placement(placement);
                        replay_snapshot(st, s, conf, device)
                    })
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evidence::StatValues;

    #[test]
    fn target_from_an_oom_message_uses_reserved_plus_free() {
        let mut o = Observation::new(Kind::Oom, "x");
        o.allocated_bytes = Some(10_000);
        o.reserved_unallocated_bytes = Some(500);
        o.free_bytes = Some(2_000);
        o.total_capacity_bytes = Some(20_000);
        o.requested_bytes = Some(4_000);
        let t = probe_target(&[o], None, None, &Settings::default()).expect("target");
        assert_eq!(t.observed.reserved_bytes, 10_500);
        assert_eq!(t.capacity, 12_500);
        assert_eq!(t.observed.requested_bytes, Some(4_000));
    }

    #[test]
    fn target_from_a_summary_uses_current_figures() {
        let mut o = Observation::new(Kind::MemorySummary, "x");
        let mut m = crate::evidence::Metrics::new();
        let stat = |c| {
            let mut pools = std::collections::BTreeMap::new();
            pools.insert(
                "all".to_string(),
                StatValues {
                    current: Some(c),
                    ..StatValues::default()
                },
            );
            pools
        };
        m.insert("allocated_bytes".into(), stat(184_648 * 1024));
        m.insert("reserved_bytes".into(), stat(235_520 * 1024));
        o.metrics = Some(m);
        let t = probe_target(&[o], None, Some(1 << 30), &Settings::default()).expect("target");
        assert_eq!(t.observed.allocated_bytes, 184_648 * 1024);
        assert_eq!(t.observed.reserved_bytes, 235_520 * 1024);
        assert_eq!(t.capacity, 1 << 30);
        assert!(probe_target(&[], None, None, &Settings::default()).is_none());
    }
}
