//! The `validate` command: the current and a candidate config side by side on
//! the same workload, and a verdict. A trace (CSV, snapshot) is replayed as
//! recorded; text-only evidence (an OOM message, summaries) gets a probe
//! fitted to its figures ([`crate::workload::probe`]).
//!
//! Also home to what `recommend` shares with it: loading the workload and the
//! per-run summary both commands report.

use super::{Format, Outcome};
use crate::Error;
use crate::conf::Settings;
use crate::device::DeviceSpec;
use crate::evidence::{Kind, Observation};
use crate::workload::Trace;
use crate::workload::probe::{self, Calibration, Figures, ReplayFigures, Target};
use crate::workload::snapshot_trace::{SnapshotTrace, recorded_settings, traced_device};
use serde::Serialize;
use std::path::PathBuf;

#[derive(Debug, Clone, Default)]
pub struct ValidateOptions {
    pub input: String,
    /// The candidate config.
    pub conf: String,
    /// The config the user runs today (default: PyTorch's defaults).
    pub current: Option<String>,
    pub capacity: Option<u64>,
    /// `sim` or `cuda[:N]`.
    pub device: String,
    pub report: Option<PathBuf>,
    pub format: Format,
}

/// How one run under one config went: the contract's replay fields plus the
/// driver work the ranking and the verdict weigh.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunSummary {
    pub conf: String,
    pub oom: Option<OomAt>,
    pub events: u64,
    pub peak_reserved_bytes: u64,
    pub peak_allocated_bytes: u64,
    pub device_allocs: u64,
    pub device_frees: u64,
    pub alloc_retries: u64,
    pub synchronizations: u64,
    /// Modelled (sim) or measured (cuda) time in driver calls.
    pub driver_time_us: f64,
    /// The device's capacity for this run (the cap on a GPU).
    #[serde(skip)]
    pub capacity_bytes: u64,
    /// Allocated and reserved bytes when the run ended (at the OOM, if any).
    #[serde(skip)]
    pub end_allocated_bytes: u64,
    #[serde(skip)]
    pub end_reserved_bytes: u64,
}

/// Where a run ran out of memory (the contract's `oom` object).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OomAt {
    pub event_index: u64,
    pub requested_bytes: u64,
    pub message: String,
}

impl crate::advise::search::Scored for RunSummary {
    fn score(&self) -> crate::advise::search::Score {
        crate::advise::search::Score {
            oom_event: self.oom.as_ref().map(|o| o.event_index),
            peak_reserved_bytes: self.peak_reserved_bytes,
            peak_allocated_bytes: self.peak_allocated_bytes,
            device_allocs: self.device_allocs,
            device_frees: self.device_frees,
            alloc_retries: self.alloc_retries,
            synchronizations: self.synchronizations,
        }
    }
}

/// What a workload replays.
pub enum Source {
    /// A trace CSV, or a probe's generated trace.
    Trace(Trace),
    /// A snapshot pickle with a trace, kept as bytes (the decoded snapshot
    /// borrows them); replayed from the state the trace started in.
    Snapshot(crate::ingest::Bytes),
}

/// One replay of a workload on the simulated card: `(settings, conf, capacity)`.
pub type Replayer<'r> = dyn Fn(&Settings, &str, u64) -> RunSummary + Sync + 'r;

/// What gets replayed for an input.
pub struct Workload {
    pub input: String,
    pub source: Source,
    /// The capacity the evidence implies (a snapshot's card, a probe's fit).
    pub implied_capacity: Option<u64>,
    /// Set when the workload is a synthetic probe fitted to text evidence.
    pub probe: Option<Calibration>,
    /// The rule engine's recommended value for the text evidence (`None` for
    /// a trace, which holds no observations, or when no setting would help).
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
    /// Nothing said: the simulated card of [`super::replay::DEFAULT_CAPACITY`].
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
            (None, None) => (super::replay::DEFAULT_CAPACITY, CapacitySource::Default),
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

/// The `--report` pictures of a workload, replayed on the simulated card of
/// `capacity` bytes (a snapshot from the state its trace started in).
pub fn report_views(
    workload: &Workload,
    runs: &[(&str, &Settings)],
    capacity: u64,
) -> Result<super::replay::ReportViews, Error> {
    use crate::workload::snapshot_trace::replay_on_sim;
    match &workload.source {
        Source::Trace(trace) => Ok(super::replay::report_views(trace, runs, capacity)),
        Source::Snapshot(data) => with_snapshot_trace(&workload.input, data, |st, _| {
            super::replay::report_views_with(runs, |settings, options| {
                Ok(replay_on_sim(st, settings, capacity, false, options)?.0)
            })
        })?,
    }
}

/// The figures a probe must reproduce, from the most telling observation:
/// the last caching-allocator OOM, else the last summary or stats dump.
pub fn probe_target(observations: &[Observation], capacity: Option<u64>) -> Option<Target> {
    let oom = observations
        .iter()
        .rev()
        .find(|o| o.kind == Kind::Oom && o.allocated_bytes.is_some());
    if let Some(o) = oom {
        let allocated = o.allocated_bytes?;
        let reserved = o.reserved_bytes.or(o
            .reserved_unallocated_bytes
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
        });
    }
    let dump = observations.iter().rev().find(|o| {
        matches!(o.kind, Kind::MemorySummary | Kind::MemoryStats) && o.metrics.is_some()
    })?;
    let current = |stat: &str| -> Option<u64> {
        let v = dump.metrics.as_ref()?.get(stat)?.get("all")?;
        u64::try_from(v.current.or(v.peak)?).ok()
    };
    let allocated = current("allocated_bytes")?;
    let reserved = current("reserved_bytes")?;
    Some(Target {
        observed: Figures {
            allocated_bytes: allocated,
            reserved_bytes: reserved,
            requested_bytes: None,
        },
        capacity: capacity.unwrap_or(crate::device::NO_LIMIT),
    })
}

/// Loads the workload for `input`: a trace as recorded, or a probe fitted
/// under `current` to the figures of text evidence.
pub fn load_workload(
    input: &str,
    capacity: Option<u64>,
    current_conf: &str,
    current: &Settings,
) -> Result<Workload, Error> {
    let data = crate::ingest::read_input(if input.is_empty() { "-" } else { input })?;
    let name = if input.is_empty() { "-" } else { input };
    match crate::ingest::detect(&data) {
        crate::ingest::InputKind::TraceCsv => {
            let trace = Trace::parse(name, &data)?;
            return Ok(Workload {
                input: name.to_string(),
                implied_capacity: trace.capacity_hint(),
                source: Source::Trace(trace),
                probe: None,
                advice: None,
                recorded: None,
            });
        }
        crate::ingest::InputKind::Pickle => {
            // Decode once now so a snapshot without a trace fails here, with its reason.
            let (recorded, implied_capacity) = with_snapshot_trace(name, &data, |st, recorded| {
                (recorded.cloned(), st.recorded_capacity())
            })?;
            return Ok(Workload {
                input: name.to_string(),
                implied_capacity,
                source: Source::Snapshot(data),
                probe: None,
                advice: None,
                recorded,
            });
        }
        crate::ingest::InputKind::RmmLog => {
            // RMM's own allocations, replayed through PyTorch's caching allocator.
            let (trace, _skipped) = crate::workload::rmm::parse(name, &data)?.to_trace()?;
            return Ok(Workload {
                input: name.to_string(),
                implied_capacity: trace.capacity_hint(),
                source: Source::Trace(trace),
                probe: None,
                advice: None,
                recorded: None,
            });
        }
        crate::ingest::InputKind::Text => {}
    }
    let observations = crate::ingest::parse_bytes(name, &data)?;
    let target = probe_target(&observations, capacity).ok_or_else(|| {
        Error::Input(format!(
            "{name}: no trace, and no OOM message or memory summary with allocated and reserved \
             figures to fit a probe to"
        ))
    })?;
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
        return Err(Error::Input(format!(
            "{name}: the evidence states {} — beyond any card, so no probe can model it; \
             run `allocdoc diagnose {name}`",
            crate::units::human(big)
        )));
    }
    let calibration = probe::calibrate(&target, 1, |trace, cap| {
        let run = replay(trace, current, "", cap);
        ReplayFigures {
            allocated_bytes: run.end_allocated_bytes,
            reserved_bytes: run.end_reserved_bytes,
            oom: run.oom.is_some(),
        }
    })
    .ok_or_else(|| {
        Error::Input(format!(
            "{name}: the evidence shows nothing allocated to fit a probe to"
        ))
    })?;
    Ok(Workload {
        input: name.to_string(),
        source: Source::Trace(calibration.trace.clone()),
        implied_capacity: (target.capacity != crate::device::NO_LIMIT).then_some(target.capacity),
        probe: Some(calibration),
        advice: rule_advice(observations, current_conf)?,
        recorded: None,
    })
}

/// What `diagnose` would recommend for these observations, with the built-in rules.
fn rule_advice(
    observations: Vec<Observation>,
    current_conf: &str,
) -> Result<Option<String>, Error> {
    let rules = crate::rules::RuleSet::with_dir(None)?;
    let mut ctx = crate::advise::Context::default();
    if !current_conf.is_empty() {
        ctx.set_current(current_conf, "--current")
            .map_err(|why| Error::Usage(format!("--current {current_conf:?}: {why}")))?;
    }
    let evidence = crate::evidence::Evidence {
        observations,
        notes: Vec::new(),
    };
    Ok(crate::advise::diagnose(evidence, &ctx, &rules)
        .recommendation
        .map(|r| r.value))
}

/// Decodes the snapshot in `data` and hands its trace (first traced device) to `f`.
fn with_snapshot_trace<T>(
    name: &str,
    data: &[u8],
    f: impl FnOnce(&SnapshotTrace, Option<&Settings>) -> T,
) -> Result<T, Error> {
    let snap = crate::snapshot::load(name, data)?;
    let device = traced_device(&snap).ok_or_else(|| {
        Error::Input(format!(
            "{name}: the snapshot has no trace to replay: record it with \
             torch.cuda.memory._record_memory_history() before the workload runs"
        ))
    })?;
    let recorded = recorded_settings(&snap);
    let st = SnapshotTrace::new(&snap, device, &recorded)
        .map_err(|e| Error::Input(format!("{name}: {e}")))?;
    // Only a snapshot with `allocator_settings` says which config it ran under.
    let said = crate::snapshot::evidence::settings_json(&snap).map(|_| &recorded);
    Ok(f(&st, said))
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
            Source::Snapshot(_) => None,
        }
    }

    /// Calls `f` with this workload's replayer on the simulated card.
    pub fn with_replayer<T>(&self, f: impl FnOnce(&Replayer) -> T) -> Result<T, Error> {
        match &self.source {
            Source::Trace(trace) => Ok(f(&|s, conf, cap| replay(trace, s, conf, cap))),
            Source::Snapshot(data) => with_snapshot_trace(&self.input, data, |st, _| {
                f(&|s, conf, cap| {
                    let device = crate::device::sim::SimDevice::new(cap)
                        .with_recorded_addresses(st.recorded_addresses(false));
                    replay_snapshot(st, s, conf, device)
                })
            }),
        }
    }
}

/// Replays `trace` on the simulated card under `settings` at `capacity`.
pub fn replay(trace: &Trace, settings: &Settings, conf: &str, capacity: u64) -> RunSummary {
    let device = crate::device::sim::SimDevice::new(capacity);
    summarize(conf, crate::workload::replay(trace, settings, device))
}

/// Replays a snapshot's trace from the state it started in; a start state that
/// does not fit the device counts as an OOM at event 0.
fn replay_snapshot<D: crate::device::Device>(
    st: &SnapshotTrace,
    settings: &Settings,
    conf: &str,
    device: D,
) -> RunSummary {
    use crate::workload::{ReplayOptions, snapshot_trace};
    let capacity_bytes = device.total_memory();
    match snapshot_trace::replay_on(st, settings, device, false, ReplayOptions::default()) {
        Ok((run, _)) => summarize(conf, run),
        Err(e) => RunSummary {
            conf: conf.to_string(),
            oom: Some(OomAt {
                event_index: 0,
                requested_bytes: 0,
                message: format!("the state at the trace start does not fit: {e}"),
            }),
            events: st.trace.len() as u64,
            peak_reserved_bytes: 0,
            peak_allocated_bytes: 0,
            device_allocs: 0,
            device_frees: 0,
            alloc_retries: 0,
            synchronizations: 0,
            driver_time_us: 0.0,
            capacity_bytes,
            end_allocated_bytes: 0,
            end_reserved_bytes: 0,
        },
    }
}

/// Replays on the device `spec` names; a CUDA device is opened per run and
/// released (every allocation returned) when the run ends. `capacity` caps
/// the card; without it the simulated card has no limit and a GPU is capped
/// at its free memory.
pub fn replay_on(
    spec: DeviceSpec,
    workload: &Workload,
    settings: &Settings,
    conf: &str,
    capacity: Option<u64>,
) -> Result<RunSummary, Error> {
    match spec {
        DeviceSpec::Sim => {
            let cap = capacity.unwrap_or(crate::device::NO_LIMIT);
            workload.with_replayer(|run| run(settings, conf, cap))
        }
        #[cfg(feature = "cuda")]
        DeviceSpec::Cuda(ordinal) => {
            let device = crate::device::cuda::CudaDevice::open(ordinal, capacity)?;
            match &workload.source {
                Source::Trace(trace) => Ok(summarize(
                    conf,
                    crate::workload::replay(trace, settings, device),
                )),
                Source::Snapshot(data) => with_snapshot_trace(&workload.input, data, |st, _| {
                    replay_snapshot(st, settings, conf, device)
                }),
            }
        }
        #[cfg(not(feature = "cuda"))]
        DeviceSpec::Cuda(ordinal) => Err(Error::NoDevice(format!(
            "--device cuda:{ordinal}: this allocdoc was built without the `cuda` feature"
        ))),
    }
}

fn summarize(conf: &str, run: crate::workload::RunResult) -> RunSummary {
    let stat = |k: &str| run.stats.get(k).copied().unwrap_or(0).max(0) as u64;
    RunSummary {
        capacity_bytes: run.capacity_bytes,
        conf: conf.to_string(),
        oom: run.oom.map(|o| OomAt {
            event_index: o.event_index,
            requested_bytes: o.requested_bytes,
            message: o.message,
        }),
        events: run.events,
        peak_reserved_bytes: run.peak_reserved_bytes,
        peak_allocated_bytes: run.peak_allocated_bytes,
        device_allocs: run.device_allocs,
        device_frees: run.device_frees,
        alloc_retries: run.alloc_retries,
        // release_cached_blocks' all-stream syncs plus event and stream syncs.
        synchronizations: stat("num_sync_all_streams") + run.counters.synchronizations,
        driver_time_us: run.counters.driver_time_us,
        end_allocated_bytes: stat("allocated_bytes.all.current"),
        end_reserved_bytes: stat("reserved_bytes.all.current"),
    }
}

/// Parses a config the user gave, naming the flag on error.
pub(crate) fn parse_conf(flag: &str, value: &str) -> Result<Settings, Error> {
    crate::conf::parse(value, crate::conf::TorchVersion::DEFAULT)
        .map(|parsed| parsed.settings)
        .map_err(|e| Error::Usage(format!("{flag} {value:?}: {e}")))
}

/// Everything `validate` found, for the renderers.
#[derive(Debug, Clone, Serialize)]
pub struct Validation {
    pub input: String,
    pub device: String,
    /// The capacity both runs had (a GPU's cap when `--device cuda`).
    pub capacity_bytes: u64,
    pub capacity_source: CapacitySource,
    pub current: RunSummary,
    pub candidate: RunSummary,
    pub verdict: String,
    #[serde(skip)]
    pub probe: Option<Calibration>,
}

/// The one-sentence verdict on a candidate against the current config.
pub fn verdict(current: &RunSummary, candidate: &RunSummary) -> String {
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
    let work = |r: &RunSummary| r.device_allocs + r.device_frees;
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

pub fn run(opts: &ValidateOptions) -> Result<Outcome, Error> {
    let spec = DeviceSpec::parse(&opts.device)?;
    let current_conf = opts.current.clone().unwrap_or_default();
    let current = parse_conf("--current", &current_conf)?;
    let candidate = parse_conf("--conf", &opts.conf)?;
    let workload = load_workload(&opts.input, opts.capacity, &current_conf, &current)?;
    let (current_conf, current, note) = workload.current(opts.current.as_deref(), current);
    let (capacity, source) = workload.capacity(opts.capacity);
    // A GPU without a stated capacity is capped at its free memory.
    let cap = (spec == DeviceSpec::Sim || source != CapacitySource::Default).then_some(capacity);
    let before = replay_on(spec, &workload, &current, &current_conf, cap)?;
    let after = replay_on(spec, &workload, &candidate, &opts.conf, cap)?;
    let capacity = after.capacity_bytes;
    let mut verdict = verdict(&before, &after);
    if let Some(p) = &workload.probe {
        verdict = format!("on a synthetic probe ({}), {verdict}", p.family.name());
    }
    let exit_code = i32::from(after.oom.is_some());
    let v = Validation {
        input: workload.input.clone(),
        device: opts.device.clone(),
        capacity_bytes: capacity,
        capacity_source: source,
        current: before,
        candidate: after,
        verdict,
        probe: workload.probe.clone(),
    };
    let stdout = crate::report::recommend::validation(&v, opts.format);
    if let Some(path) = &opts.report {
        // The pictures come from the simulated card, whatever --device ran the verdict.
        let views = report_views(
            &workload,
            &[
                (super::replay::conf_name(&current_conf), &current),
                (super::replay::conf_name(&opts.conf), &candidate),
            ],
            capacity,
        )?;
        std::fs::write(path, crate::report::recommend::validation_html(&v, views))
            .map_err(|e| Error::Input(format!("{}: {e}", path.display())))?;
    }
    Ok(Outcome {
        stdout,
        stderr: note.into_iter().map(|n| format!("note: {n}")).collect(),
        exit_code,
    })
}

/// One figure of a bundled-allocator run next to PyTorch's own (from
/// `scripts/torch_crosscheck.py`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ComparedFigure {
    pub metric: &'static str,
    pub allocdoc: Option<i64>,
    pub torch: Option<i64>,
}

impl ComparedFigure {
    pub fn agrees(&self) -> bool {
        self.allocdoc == self.torch
    }
}

/// `replay --compare-with STATS.json`: where the bundled allocator and PyTorch differ.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TorchComparison {
    pub torch_version: String,
    pub device_name: String,
    pub conf: String,
    pub figures: Vec<ComparedFigure>,
}

/// Compares a run with the JSON that `scripts/torch_crosscheck.py` wrote for
/// the same trace and config.
pub fn compare_with_torch(
    run: &crate::workload::RunResult,
    path: &std::path::Path,
) -> Result<TorchComparison, Error> {
    let stats = &run.stats;
    let bad = |what: String| Error::Input(format!("{}: {what}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| bad(format!("not the JSON of torch_crosscheck.py: {e}")))?;
    let torch_stats = json
        .get("memory_stats")
        .and_then(|v| v.as_object())
        .ok_or_else(|| {
            bad("no `memory_stats` object (expected torch_crosscheck.py output)".into())
        })?;
    let torch = |key: &str| torch_stats.get(key).and_then(|v| v.as_i64());
    let ours = |key: &str| stats.get(key).copied();
    let both = |metric: &'static str, key: &str| ComparedFigure {
        metric,
        allocdoc: ours(key),
        torch: torch(key),
    };
    let torch_oom = json
        .get("oom")
        .and_then(|o| o.get("event_index"))
        .and_then(|v| v.as_i64());
    let figures = vec![
        ComparedFigure {
            metric: "OOM at event",
            allocdoc: run
                .oom
                .as_ref()
                .and_then(|o| i64::try_from(o.event_index).ok()),
            torch: torch_oom,
        },
        both("peak reserved bytes", "reserved_bytes.all.peak"),
        both("peak allocated bytes", "allocated_bytes.all.peak"),
        both("reserved bytes at the end", "reserved_bytes.all.current"),
        both("segments at the end", "segment.all.current"),
        both("peak segments", "segment.all.peak"),
        both("cudaMalloc calls (num_device_alloc)", "num_device_alloc"),
        both("cudaFree calls (num_device_free)", "num_device_free"),
        both("alloc retries", "num_alloc_retries"),
        both("OOMs", "num_ooms"),
        both(
            "synchronisations (num_sync_all_streams)",
            "num_sync_all_streams",
        ),
    ];
    let text_of = |k: &str| {
        json.get(k)
            .and_then(|v| v.as_str())
            .unwrap_or("?")
            .to_string()
    };
    Ok(TorchComparison {
        torch_version: text_of("torch_version"),
        device_name: text_of("device_name"),
        conf: text_of("conf"),
        figures,
    })
}

/// `replay --compare-with`: adds the comparison of the last run with PyTorch's
/// figures to `stdout` (inside the JSON object for `--format json`).
pub fn append_torch_comparison(
    stdout: &mut String,
    run: &crate::workload::RunResult,
    path: &std::path::Path,
    format: Format,
) -> Result<(), Error> {
    let comparison = compare_with_torch(run, path)?;
    if format == Format::Json {
        let mut value: serde_json::Value =
            serde_json::from_str(stdout).map_err(|e| Error::Input(format!("replay JSON: {e}")))?;
        if let Some(obj) = value.as_object_mut() {
            obj.insert(
                "compare_with".into(),
                serde_json::to_value(&comparison).unwrap_or_default(),
            );
        }
        *stdout = serde_json::to_string_pretty(&value).unwrap_or_default();
        stdout.push('\n');
    } else {
        stdout.push('\n');
        stdout.push_str(&crate::report::recommend::torch_comparison(
            &comparison,
            format,
        ));
    }
    Ok(())
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
        let t = probe_target(&[o], None).expect("target");
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
        let t = probe_target(&[o], Some(1 << 30)).expect("target");
        assert_eq!(t.observed.allocated_bytes, 184_648 * 1024);
        assert_eq!(t.observed.reserved_bytes, 235_520 * 1024);
        assert_eq!(t.capacity, 1 << 30);
        assert!(probe_target(&[], None).is_none());
    }
}
