//! The `replay` pipeline: a trace (CSV, RMM log, or a snapshot's trace from
//! the state it started in) run through the bundled caching allocator under
//! one or more configs, on the simulated card or a GPU (one fresh device per
//! run, released when the run ends). The `--fidelity` comparison and the
//! report's segment map always come from the simulated card.

use super::placement::Ooms;
use super::run::{DeviceOpener, conf_name, parse_native_conf};
use super::views::{SegmentsAt, segment_map};
use super::workload::DEFAULT_CAPACITY;
use crate::Error;
use crate::allocator::summary::{NoMemorySummary, memory_summary, summary_exists};
use crate::conf::{Platform, Settings, TorchVersion};
use crate::device::sim::{Placement, SimDevice};
use crate::device::{Device, DeviceSpec};
use crate::units::human;
use crate::workload::{ReplayOptions, RunResult, replay_with};

/// What to replay, and how: the command's options, parsed.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The input's name as given (`-` or empty for standard input).
    pub input: String,
    /// One run per config, in order; empty means the default config (for a
    /// snapshot: the config it recorded).
    pub confs: Vec<String>,
    pub capacity: Option<u64>,
    pub device: DeviceSpec,
    pub torch_version: TorchVersion,
    /// Where PyTorch runs: a setting it ignores there is replayed as ignored.
    pub platform: Platform,
    /// Compare a snapshot's replay with its recorded addresses.
    pub fidelity: bool,
    /// `memory_summary()` per run at its peak and at the end.
    pub summary: bool,
    /// Keep each run's per-event timeline, and pick the segment map (for `--report`).
    pub pictures: bool,
    /// Keep the last run's trace entries (for `--emit-snapshot`).
    pub history: bool,
    pub limits: crate::limits::Limits,
}

/// One config's run.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayRun {
    /// The config as given ('' = PyTorch's defaults).
    pub conf: String,
    pub result: RunResult,
    /// `memory_summary()` when allocated memory peaked and at the end (with `--summary`).
    pub summary_at_peak: Option<String>,
    pub summary_at_end: Option<String>,
    /// On the simulated card, for a run that ran out of memory or came
    /// within [`PLACEMENT_EDGE`] of the card: whether it runs out under each
    /// placement policy.
    pub placement: Option<Ooms>,
}

/// A run whose peak reserved reaches this share of the card is replayed
/// under every placement policy (a run that ran out of memory always is):
/// near the edge, which equal-sized block the allocator picks (by address)
/// can decide the outcome.
pub const PLACEMENT_EDGE: f64 = 0.9;

/// Everything `replay` found, for the renderers.
#[derive(Debug, Clone, PartialEq)]
pub struct Replay {
    pub input: String,
    pub events: u64,
    pub capacity_bytes: u64,
    /// `--capacity` was not given: the default card was used.
    pub capacity_defaulted: bool,
    /// The device the runs replayed on.
    pub device: DeviceSpec,
    pub torch_version: TorchVersion,
    pub runs: Vec<ReplayRun>,
    /// `--fidelity` on a snapshot: the recorded config's replay compared with the recording.
    pub fidelity: Option<crate::workload::snapshot_trace::Fidelity>,
    /// With [`Plan::pictures`]: the segment map worth drawing.
    pub map: Option<SegmentsAt>,
    /// Notes for standard error (how the input was read, how capacity was chosen).
    pub notes: Vec<String>,
}

impl Plan {
    /// A `--conf` value's settings for this plan's version, as they take
    /// effect on its platform; what the platform ignores is noted.
    fn settings(&self, conf: &str, notes: &mut Vec<String>) -> Result<Settings, Error> {
        let parsed = parse_native_conf(conf, self.torch_version)?;
        // What the version says of the value (1.8 reads no config at all),
        // as `conf check` says it (issue 34).
        for w in &parsed.warnings {
            notes.push(format!("note: --conf {conf:?}: {}", w.text));
        }
        let s = parsed.settings;
        for w in self.platform.ignored(&s) {
            notes.push(format!(
                "note: --conf {conf:?}: {}; replayed without it",
                w.text
            ));
        }
        Ok(self.platform.effective(&s))
    }

    /// What a run keeps: per-event points only for the report; trace history
    /// only for the snapshot of the last run.
    fn run_options(&self, is_last: bool) -> ReplayOptions {
        ReplayOptions {
            timeline: self.pictures,
            history: self.history && is_last,
            ..ReplayOptions::default()
        }
    }
}

/// Parses every config and replays the input (`data`, read by the caller)
/// under each.
pub fn replay(plan: &Plan, data: &[u8]) -> Result<Replay, Error> {
    let name = crate::ingest::input_name(&plan.input).to_string();
    let is_snapshot = crate::ingest::detect(data) == crate::ingest::InputKind::Pickle;
    if plan.fidelity && !is_snapshot {
        return Err(Error::Usage(
            "--fidelity needs a snapshot with a trace: it compares the replay with the recorded addresses".into(),
        ));
    }
    if is_snapshot {
        return snapshot_replay(plan, name, data);
    }
    let version = plan.torch_version;
    let mut notes = Vec::new();
    let confs: Vec<String> = if plan.confs.is_empty() {
        vec![String::new()]
    } else {
        plan.confs.clone()
    };
    let settings: Vec<Settings> = confs
        .iter()
        .map(|c| plan.settings(c, &mut notes))
        .collect::<Result<_, _>>()?;
    if plan.summary {
        // Before any replay: a version without memory_summary() is a usage error.
        summary_exists(version).map_err(summary_usage)?;
    }
    let last = confs.len().saturating_sub(1);
    let mut open = DeviceOpener {
        spec: plan.device,
        given: plan.capacity,
        default: DEFAULT_CAPACITY,
        start_addresses: Vec::new(),
    };
    let (trace, mut first) = if crate::workload::trace::is_trace_csv(data) {
        let trace = Reread::new(&name, data);
        // A trace CSV names no card (no capacity hint): `--capacity` or the
        // default is the card before the parse ends.
        if plan.device == DeviceSpec::Sim {
            // Runs planned after the first need the events again; a run near
            // the edge (known only at its end) reads them again.
            let keep = confs.len() > 1 || plan.summary || plan.pictures;
            let device = open.sim(Placement::FirstFit);
            let options = plan.run_options(last == 0);
            let (kept, run) = parse_and_replay(&name, data, &settings[0], device, options, keep)?;
            (trace.with(kept), Some(run))
        } else {
            trace.get()?;
            (trace, None)
        }
    } else if crate::workload::rmm::is_rmm_log(data) {
        let (trace, skipped) = crate::workload::rmm::parse(&name, data)?.to_trace()?;
        notes.push(format!(
            "note: {name}: RMM log replayed through PyTorch's caching allocator ({} failed allocations and {} unmatched frees left out)",
            skipped.failed_allocations, skipped.unmatched_frees
        ));
        (Reread::new(&name, data).with(Kept::Trace(trace)), None)
    } else {
        return Err(Error::Input(format!(
            "{name}: expected a trace CSV starting with the header \"{}\", an RMM log or a snapshot pickle",
            crate::workload::trace::HEADER
        )));
    };
    let given = plan.capacity.or(trace.capacity_hint());
    open.given = given;
    let runs: Vec<ReplayRun> = confs
        .into_iter()
        .zip(&settings)
        .enumerate()
        .map(|(i, (conf, settings))| {
            let options = plan.run_options(i == last);
            let summary = plan.summary.then_some(0);
            let replay =
                |s: &Settings, d: Box<dyn Device>, o| Ok(replay_with(trace.get()?, s, d, o));
            let result = match first.take() {
                Some(result) => result,
                None => replay(settings, open.open()?, options)?,
            };
            if more_runs(&result, &open) {
                // Read again here, not by both placement runs at once.
                trace.get()?;
            }
            run_one(conf, settings, &open, summary, result, &replay)
        })
        .collect::<Result<_, _>>()?;
    // The card the runs had: `--capacity`, else (sim) the default, else (GPU) the free memory.
    let capacity = runs.first().map_or(given.unwrap_or(DEFAULT_CAPACITY), |r| {
        r.result.figures.capacity_bytes
    });
    let map = match plan.pictures {
        true => {
            let trace = trace.get()?;
            map_of(&runs, &settings, |settings, events| {
                let options = ReplayOptions {
                    stop_after: Some(events),
                    ..ReplayOptions::default()
                };
                replay_with(trace, settings, SimDevice::new(capacity), options).segments
            })
        }
        false => None,
    };
    let events = trace.events();
    drop(trace);
    Ok(Replay {
        input: name,
        events,
        capacity_bytes: capacity,
        capacity_defaulted: given.is_none() && plan.device == DeviceSpec::Sim,
        device: plan.device,
        torch_version: version,
        runs,
        fidelity: None,
        map,
        notes,
    })
}

/// The segment map of runs replayed with a timeline ([`segment_map`]).
fn map_of(
    runs: &[ReplayRun],
    settings: &[Settings],
    segments_after: impl Fn(&Settings, u64) -> Vec<crate::allocator::SegmentInfo>,
) -> Option<SegmentsAt> {
    let named: Vec<(&str, &RunResult, &Settings)> = runs
        .iter()
        .zip(settings)
        .map(|(r, s)| (conf_name(&r.conf), &r.result, s))
        .collect();
    segment_map(&named, segments_after)
}

/// `--emit-snapshot`: the last run's segments and trace entries as a
/// snapshot pickle (protocol 4); `None` without runs.
pub fn emitted_snapshot(replay: &Replay) -> Result<Option<Vec<u8>>, Error> {
    let Some(run) = replay.runs.last() else {
        return Ok(None);
    };
    let recorded = crate::snapshot::writer::RecordedSettings {
        conf: run.conf.clone(),
        settings: parse_native_conf(&run.conf, replay.torch_version)?.settings,
    };
    let snapshot = crate::snapshot::writer::Snapshot::from_allocator(
        &run.result.segments,
        &run.result.history,
        Some(recorded),
    );
    Ok(Some(crate::snapshot::writer::to_bytes(&snapshot)))
}

/// A snapshot's trace replayed from the state it started in: once per
/// `--conf` (the recorded config when none is given), plus the `--fidelity`
/// comparison under the recorded config (on the simulated card).
fn snapshot_replay(plan: &Plan, name: String, data: &[u8]) -> Result<Replay, Error> {
    use crate::workload::snapshot_trace::{self as st, CapacitySource};
    let version = plan.torch_version;
    let snap = crate::snapshot::load_with(&name, data, &plan.limits)?;
    let device = st::traced_device(&snap).ok_or_else(|| {
        Error::Input(format!(
            "{name}: the snapshot has no trace to replay (record one with torch.cuda.memory._record_memory_history())"
        ))
    })?;
    let mut recorded = st::recorded_settings(&snap);
    recorded.version = version;
    let trace = st::SnapshotTrace::new(&snap, device, &recorded)
        .map_err(|e| Error::Input(format!("{name}: {e}")))?;
    let (capacity, source) = st::capacity(&trace, plan.capacity, DEFAULT_CAPACITY);
    let mut notes = vec![format!(
        "note: {name}: device {device}, {} segments and {} live blocks seeded at the start of the trace",
        trace.start.segment_count(),
        trace.start.live_blocks
    )];
    if source == CapacitySource::OomEntry {
        notes.push(format!(
            "note: capacity {} from the snapshot's oom entry (free memory then + reserved)",
            human(capacity)
        ));
    }
    let runs_for: Vec<(String, Settings)> = if plan.confs.is_empty() {
        let conf = crate::snapshot::evidence::settings_json(&snap)
            .and_then(|j| {
                j.get("PYTORCH_CUDA_ALLOC_CONF")?
                    .as_str()
                    .map(str::to_string)
            })
            .unwrap_or_default();
        vec![(conf, recorded.clone())]
    } else {
        plan.confs
            .iter()
            .map(|c| Ok((c.clone(), plan.settings(c, &mut notes)?)))
            .collect::<Result<_, Error>>()?
    };
    let open = DeviceOpener {
        spec: plan.device,
        given: (source != CapacitySource::Default).then_some(capacity),
        default: capacity,
        start_addresses: trace.recorded_addresses(false),
    };
    let replay = |settings: &Settings, device: Box<dyn Device>, options: ReplayOptions| {
        Ok(st::replay_on(&trace, settings, device, false, options)?.0)
    };
    let last = runs_for.len().saturating_sub(1);
    let runs: Vec<ReplayRun> = runs_for
        .iter()
        .enumerate()
        .map(|(i, (conf, settings))| {
            let options = plan.run_options(i == last);
            let summary = plan.summary.then_some(device);
            if summary.is_some() {
                summary_exists(settings.version).map_err(summary_usage)?;
            }
            let result = replay(settings, open.open()?, options)?;
            run_one(conf.clone(), settings, &open, summary, result, &replay)
        })
        .collect::<Result<_, _>>()?;
    let fidelity = if plan.fidelity {
        st::replay_on_sim(&trace, &recorded, capacity, true, ReplayOptions::default())?.1
    } else {
        None
    };
    let settings: Vec<Settings> = runs_for.into_iter().map(|(_, s)| s).collect();
    let map = plan.pictures.then(|| {
        map_of(&runs, &settings, |settings, events| {
            let options = ReplayOptions {
                stop_after: Some(events),
                ..ReplayOptions::default()
            };
            st::replay_on_sim(&trace, settings, capacity, false, options)
                .map(|(run, _)| run.segments)
                .unwrap_or_default()
        })
    });
    Ok(Replay {
        input: name,
        events: trace.trace.len() as u64,
        capacity_bytes: runs
            .first()
            .map_or(capacity, |r| r.result.figures.capacity_bytes),
        capacity_defaulted: source == CapacitySource::Default && plan.device == DeviceSpec::Sim,
        device: plan.device,
        torch_version: version,
        runs,
        fidelity,
        map: map.flatten(),
        notes,
    })
}

/// Events handed from the parser to the first run at a time (192 KiB, within L2).
const STREAM_CHUNK: usize = 8 * 1024;
/// Chunks the parser may read ahead of the run before it waits: it parses
/// faster than the run replays, so a few keep the run fed, and fewer buffers
/// are fewer fresh pages to fault in.
const STREAM_AHEAD: usize = 4;

/// What the streamed parse kept of a trace CSV.
enum Kept {
    /// Every event: runs after the first were planned.
    Trace(crate::workload::Trace),
    /// How many events; they were replayed and let go.
    Count(u64),
}

impl Kept {
    fn events(&self) -> u64 {
        match self {
            Kept::Trace(trace) => trace.len() as u64,
            Kept::Count(events) => *events,
        }
    }
}

/// The trace for the runs after the first: kept by the streamed parse, or
/// read again from `data` when first asked for (a run near the card's edge,
/// known only at its end, asks for two more runs).
struct Reread<'a> {
    name: &'a str,
    data: &'a [u8],
    trace: std::sync::OnceLock<crate::workload::Trace>,
    /// The events the streamed parse counted, when it kept none.
    counted: u64,
}

impl<'a> Reread<'a> {
    fn new(name: &'a str, data: &'a [u8]) -> Self {
        Reread {
            name,
            data,
            trace: std::sync::OnceLock::new(),
            counted: 0,
        }
    }

    fn with(mut self, kept: Kept) -> Self {
        match kept {
            Kept::Trace(trace) => {
                let _ = self.trace.set(trace);
            }
            Kept::Count(events) => self.counted = events,
        }
        self
    }

    /// The trace's events: counted by the streamed parse, or the trace's length.
    fn events(&self) -> u64 {
        self.trace.get().map_or(self.counted, |t| t.len() as u64)
    }

    /// The trace, read now if it was not kept.
    fn get(&self) -> Result<&crate::workload::Trace, Error> {
        if let Some(trace) = self.trace.get() {
            return Ok(trace);
        }
        let trace = crate::workload::Trace::parse(self.name, self.data)?;
        let trace = self.trace.get_or_init(|| trace);
        Ok(trace)
    }

    fn capacity_hint(&self) -> Option<u64> {
        self.trace.get().and_then(|t| t.capacity_hint())
    }
}

/// Whether [`run_one`] replays `result`'s config again under the other
/// placements: on the simulated card, when the run ran out of memory or came
/// within [`PLACEMENT_EDGE`] of the card.
fn more_runs(result: &RunResult, open: &DeviceOpener) -> bool {
    let figures = &result.figures;
    open.spec == DeviceSpec::Sim
        && (figures.oom.is_some()
            || figures.peak_reserved_bytes as f64 >= PLACEMENT_EDGE * figures.capacity_bytes as f64)
}

/// Reads the trace CSV in `data` on a second thread while the first run
/// replays its events as they come, so the command takes about the longer of
/// the two instead of their sum. Parse errors win over the run, as when the
/// whole trace is read first. Without `keep`, the parser fills a few reused
/// buffers instead of the whole trace's events: less memory to fault in
/// beside the run.
fn parse_and_replay(
    name: &str,
    data: &[u8],
    settings: &Settings,
    device: SimDevice,
    options: ReplayOptions,
    keep: bool,
) -> Result<(Kept, RunResult), Error> {
    use crate::workload::{Event, StreamedReplay, Trace};
    use std::sync::mpsc::{SendError, channel, sync_channel};
    std::thread::scope(|scope| {
        let (send, receive) = sync_channel::<Vec<Event>>(STREAM_AHEAD);
        // Replayed chunks go back to the parser to be filled again: a fresh
        // 192 KiB buffer each time would be mapped and unmapped by the system
        // allocator, page faults and TLB shootdowns on both threads.
        let (give_back, take_back) = channel::<Vec<Event>>();
        let parser = scope.spawn(move || {
            // A run that ended stops listening; the parse goes on to validate,
            // handing nothing over and filling the buffer it has again.
            let mut listening = true;
            if keep {
                Trace::parse_streaming(name, data, STREAM_CHUNK, |events| {
                    if listening {
                        let mut chunk = take_back.try_recv().unwrap_or_default();
                        chunk.extend_from_slice(events);
                        listening = send.send(chunk).is_ok();
                    }
                })
                .map(Kept::Trace)
            } else {
                Trace::stream(name, data, STREAM_CHUNK, |full| match send.send(full) {
                    Ok(()) => take_back
                        .try_recv()
                        .unwrap_or_else(|_| Vec::with_capacity(STREAM_CHUNK)),
                    Err(SendError(mut unheard)) => {
                        unheard.clear();
                        unheard
                    }
                })
                .map(Kept::Count)
            }
        });
        let mut run = StreamedReplay::new(settings, device, options, 0, 0);
        for mut events in &receive {
            let more = run.feed(&events);
            events.clear();
            let _ = give_back.send(events);
            if !more {
                break;
            }
        }
        drop(receive);
        let kept = parser
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
        let events = kept.events();
        Ok((kept, run.finish(events)))
    })
}

/// `--summary` for a version without `memory_summary()`: a usage error.
fn summary_usage(e: NoMemorySummary) -> Error {
    Error::Usage(format!("--summary: {e}"))
}

/// One replay of the workload under some settings on a device.
type DeviceReplay<'r> =
    dyn Fn(&Settings, Box<dyn Device>, ReplayOptions) -> Result<RunResult, Error> + Sync + 'r;

/// One config's run (`result`, on a fresh device from `open`), with what it
/// needs besides: with `summary` (the device index), `memory_summary()` at the
/// end and at the allocated peak (replayed again up to there on a fresh
/// device: replays are deterministic); near the edge, the other placements.
fn run_one(
    conf: String,
    settings: &Settings,
    open: &DeviceOpener,
    summary: Option<u32>,
    result: RunResult,
    replay: &DeviceReplay,
) -> Result<ReplayRun, Error> {
    let placement = match more_runs(&result, open) {
        true => {
            let [_, rising, random] = Placement::ALL;
            let oom = |p| -> Result<bool, Error> {
                let run = replay(settings, Box::new(open.sim(p)), ReplayOptions::default())?;
                Ok(run.figures.oom.is_some())
            };
            let (rising, random) = rayon::join(|| oom(rising), || oom(random));
            Some(Ooms([result.figures.oom.is_some(), rising?, random?]))
        }
        false => None,
    };
    let (summary_at_peak, summary_at_end) = match summary {
        Some(device) => {
            let render = |stats: &std::collections::BTreeMap<String, i64>| {
                memory_summary(stats, device, false, settings.version).map_err(summary_usage)
            };
            let at_peak = match result.figures.peak_event_index {
                Some(index) => {
                    let options = ReplayOptions {
                        stop_after: Some(index + 1),
                        ..ReplayOptions::default()
                    };
                    Some(render(&replay(settings, open.open()?, options)?.stats)?)
                }
                None => None,
            };
            (at_peak, Some(render(&result.stats)?))
        }
        None => (None, None),
    };
    Ok(ReplayRun {
        conf,
        result,
        summary_at_peak,
        summary_at_end,
        placement,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Trace;

    const MIB: u64 = 1 << 20;

    /// A trace of several stream chunks: a slowly growing live set.
    fn chunks_of_trace() -> String {
        let mut csv = String::from("action,id,size,stream\n");
        for i in 0..(2 * STREAM_CHUNK as u64 + 500) {
            csv += &format!("alloc,t{i},{},0\n", (1 + i % 13) * 512 * 1024 + i % 4096);
            if i % 5 != 0 {
                csv += &format!("free,t{i},,0\n");
            }
        }
        csv
    }

    fn plan(capacity: u64) -> Plan {
        Plan {
            input: "t.csv".into(),
            confs: Vec::new(),
            capacity: Some(capacity),
            device: DeviceSpec::Sim,
            torch_version: TorchVersion::DEFAULT,
            platform: Platform::Linux,
            fidelity: false,
            summary: false,
            pictures: false,
            history: false,
            limits: crate::limits::Limits::default(),
        }
    }

    /// Kept or let go by the parser, the streamed first run is the run of
    /// the whole trace: to the end, to its OOM, with the same event count.
    #[test]
    fn the_streamed_first_run_is_the_run_of_the_parsed_trace() {
        let csv = chunks_of_trace();
        let whole = Trace::parse("t.csv", csv.as_bytes()).unwrap();
        let settings = Settings::default();
        for capacity in [1 << 34, 1200 * MIB, 60 * MIB] {
            let expected = replay_with(
                &whole,
                &settings,
                SimDevice::new(capacity),
                ReplayOptions::default(),
            );
            for keep in [true, false] {
                let (kept, run) = parse_and_replay(
                    "t.csv",
                    csv.as_bytes(),
                    &settings,
                    SimDevice::new(capacity),
                    ReplayOptions::default(),
                    keep,
                )
                .unwrap();
                assert_eq!(run, expected, "{capacity} {keep}");
                match kept {
                    Kept::Trace(trace) => assert!(keep && trace == whole),
                    Kept::Count(events) => assert!(!keep && events == whole.len() as u64),
                }
            }
        }
    }

    /// The event count comes from the streamed parse's count, from the kept
    /// trace, or from the trace read on first use (a GPU run of a trace CSV).
    #[test]
    fn the_event_count_comes_from_whichever_read_there_was() {
        let csv = chunks_of_trace();
        let whole = Trace::parse("t.csv", csv.as_bytes()).unwrap();
        let n = whole.len() as u64;
        let read_on_use = Reread::new("t.csv", csv.as_bytes());
        assert_eq!(read_on_use.events(), 0, "nothing read yet");
        read_on_use.get().unwrap();
        assert_eq!(read_on_use.events(), n);
        let counted = Reread::new("t.csv", csv.as_bytes()).with(Kept::Count(n));
        assert_eq!(counted.events(), n);
        let kept = Reread::new("t.csv", csv.as_bytes()).with(Kept::Trace(whole));
        assert_eq!(kept.events(), n);
        assert_eq!(kept.get().unwrap().len() as u64, n);
    }

    /// A run near the card's edge is replayed under the other placements
    /// although the streamed parse kept no events: the trace is read again.
    #[test]
    fn a_run_near_the_edge_reads_the_trace_again_for_the_placements() {
        let csv = chunks_of_trace();
        let whole = Trace::parse("t.csv", csv.as_bytes()).unwrap();
        let peak = replay(&plan(1 << 34), csv.as_bytes()).unwrap().runs[0]
            .result
            .figures
            .peak_reserved_bytes;
        for capacity in [peak, peak / 2, 1 << 34] {
            let replayed = replay(&plan(capacity), csv.as_bytes()).unwrap();
            assert_eq!(replayed.events, whole.len() as u64);
            let run = &replayed.runs[0];
            assert_eq!(run.placement.is_some(), capacity != 1 << 34, "{capacity}");
            if let Some(Ooms([first_fit, rising, random])) = run.placement {
                assert_eq!(first_fit, run.result.figures.oom.is_some());
                let under = |p| {
                    let run = replay_with(
                        &whole,
                        &Settings::default(),
                        SimDevice::new(capacity).with_placement(p),
                        ReplayOptions::default(),
                    );
                    run.figures.oom.is_some()
                };
                let [_, r, q] = Placement::ALL;
                assert_eq!([rising, random], [under(r), under(q)]);
            }
        }
    }
}
