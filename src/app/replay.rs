//! The `replay` command: run a trace through the bundled caching allocator
//! under one or more configs, on the simulated card or a GPU (`--device
//! cuda[:N]`: one fresh device per run, released when the run ends). The
//! `--report` pictures and `--fidelity` always come from the simulated card.

use super::{Format, Outcome};
use crate::Error;
use crate::allocator::summary::memory_summary;
use crate::conf::{Settings, TorchVersion};
use crate::device::sim::SimDevice;
use crate::device::{Device, DeviceSpec};
use crate::evidence::Backend;
use crate::units::human;
use crate::workload::{ReplayOptions as RunOptions, RunResult, Trace, detect_trace, replay_with};
use std::path::PathBuf;

/// The card replays run on when `--capacity` is not given (an 80 GiB A100/H100).
pub const DEFAULT_CAPACITY: u64 = 80 << 30;

#[derive(Debug, Clone, Default)]
pub struct ReplayOptions {
    pub trace: String,
    /// One run per config, in order; empty means the default config.
    pub confs: Vec<String>,
    pub capacity: Option<u64>,
    /// `sim` or `cuda[:N]`.
    pub device: String,
    pub fidelity: bool,
    /// Print PyTorch's memory_summary() per run at its peak and at the end.
    pub summary: bool,
    pub torch_version: Option<String>,
    pub compare_with: Option<PathBuf>,
    pub emit_snapshot: Option<PathBuf>,
    pub report: Option<PathBuf>,
    pub format: Format,
}

/// One config's run.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// The config as given ('' = PyTorch's defaults).
    pub conf: String,
    pub result: RunResult,
    /// `memory_summary()` when allocated memory peaked and at the end (with `--summary`).
    pub summary_at_peak: Option<String>,
    pub summary_at_end: Option<String>,
}

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
    pub runs: Vec<Run>,
    /// `--fidelity` on a snapshot: the recorded config's replay compared with the recording.
    pub fidelity: Option<crate::workload::snapshot_trace::Fidelity>,
    /// Notes for standard error (how the input was read, how capacity was chosen).
    pub notes: Vec<String>,
}

/// What a run keeps: per-event points only for the report; trace history only
/// for the snapshot of the last run.
fn run_options(opts: &ReplayOptions, is_last: bool) -> RunOptions {
    RunOptions {
        timeline: opts.report.is_some(),
        history: opts.emit_snapshot.is_some() && is_last,
        ..RunOptions::default()
    }
}

pub fn run(opts: &ReplayOptions) -> Result<Outcome, Error> {
    let replay = execute(opts)?;
    let mut stdout = match opts.format {
        Format::Text => crate::report::replay::text(&replay),
        Format::Json => crate::report::replay::json(&replay),
        Format::Markdown => crate::report::replay::markdown(&replay),
    };
    if let (Some(path), Some(last)) = (&opts.compare_with, replay.runs.last()) {
        super::validate::append_torch_comparison(&mut stdout, &last.result, path, opts.format)?;
    }
    let mut stderr = replay.notes.clone();
    if replay.capacity_defaulted {
        stderr.push(format!(
            "note: no --capacity given: replaying on a simulated {} card",
            human(replay.capacity_bytes)
        ));
    }
    let exit_code = match replay.runs.last() {
        Some(run) if run.result.oom.is_some() => 1,
        _ => 0,
    };
    Ok(Outcome {
        stdout,
        stderr,
        exit_code,
    })
}

/// Loads the trace, parses every config and replays the trace under each.
pub fn execute(opts: &ReplayOptions) -> Result<Replay, Error> {
    let spec = DeviceSpec::parse(&opts.device)?;
    let data = crate::ingest::read_input(&opts.trace)?;
    let name = match opts.trace.as_str() {
        "" | "-" => "<stdin>".to_string(),
        path => path.to_string(),
    };
    let is_snapshot = crate::snapshot::is_pickle(&data);
    if opts.fidelity && !is_snapshot {
        return Err(Error::Usage(
            "--fidelity needs a snapshot with a trace: it compares the replay with the recorded addresses".into(),
        ));
    }
    let version = match &opts.torch_version {
        Some(v) => {
            TorchVersion::parse(v).map_err(|e| Error::Usage(format!("--torch-version: {e}")))?
        }
        None => TorchVersion::DEFAULT,
    };
    if is_snapshot {
        return snapshot_replay(opts, spec, name, &data, version);
    }
    let mut notes = Vec::new();
    let trace = match detect_trace(&name, &data)? {
        Some(trace) => trace,
        None if crate::workload::rmm::is_rmm_log(&data) => {
            let (trace, skipped) = crate::workload::rmm::parse(&name, &data)?.to_trace()?;
            notes.push(format!(
                "note: {name}: RMM log replayed through PyTorch's caching allocator ({} failed allocations and {} unmatched frees left out)",
                skipped.failed_allocations, skipped.unmatched_frees
            ));
            trace
        }
        None => {
            return Err(Error::Input(format!(
                "{name}: expected a trace CSV starting with the header \"{}\", an RMM log or a snapshot pickle",
                crate::workload::trace::HEADER
            )));
        }
    };
    let confs: Vec<String> = if opts.confs.is_empty() {
        vec![String::new()]
    } else {
        opts.confs.clone()
    };
    let settings: Vec<Settings> = confs
        .iter()
        .map(|c| parse_conf(c, version))
        .collect::<Result<_, _>>()?;
    let given = opts.capacity.or(trace.capacity_hint());
    let open = DeviceOpener {
        spec,
        given,
        default: DEFAULT_CAPACITY,
        start_addresses: Vec::new(),
    };
    let last = confs.len().saturating_sub(1);
    let runs: Vec<Run> = confs
        .into_iter()
        .zip(&settings)
        .enumerate()
        .map(|(i, (conf, settings))| {
            let options = run_options(opts, i == last);
            let summary = opts.summary.then_some(0);
            run_one(conf, settings, &open, summary, options, &|s, d, o| {
                Ok(replay_with(&trace, s, d, o))
            })
        })
        .collect::<Result<_, _>>()?;
    // The card the runs had: `--capacity`, else (sim) the default, else (GPU) the free memory.
    let capacity = runs.first().map_or(given.unwrap_or(DEFAULT_CAPACITY), |r| {
        r.result.capacity_bytes
    });
    let replay = Replay {
        input: name,
        events: trace.len() as u64,
        capacity_bytes: capacity,
        capacity_defaulted: given.is_none() && spec == DeviceSpec::Sim,
        device: spec,
        torch_version: version,
        runs,
        fidelity: None,
        notes,
    };
    if let Some(path) = &opts.report {
        let runs: Vec<(&str, &RunResult, &Settings)> = replay
            .runs
            .iter()
            .zip(&settings)
            .map(|(r, s)| (conf_name(&r.conf), &r.result, s))
            .collect();
        let views = views_from(&runs, |settings, events| {
            let options = RunOptions {
                stop_after: Some(events),
                ..RunOptions::default()
            };
            replay_with(&trace, settings, SimDevice::new(capacity), options).segments
        });
        write_output(path, crate::report::replay::html(&replay, views).as_bytes())?;
    }
    emit_snapshot(opts, &replay)?;
    Ok(replay)
}

/// `--emit-snapshot`: the last run's segments and trace entries as a snapshot pickle.
fn emit_snapshot(opts: &ReplayOptions, replay: &Replay) -> Result<(), Error> {
    if let (Some(path), Some(run)) = (&opts.emit_snapshot, replay.runs.last()) {
        let recorded = crate::snapshot::writer::RecordedSettings {
            conf: run.conf.clone(),
            settings: parse_conf(&run.conf, replay.torch_version)?,
        };
        let snapshot = crate::snapshot::writer::Snapshot::from_allocator(
            &run.result.segments,
            &run.result.history,
            Some(recorded),
        );
        write_output(path, &crate::snapshot::writer::to_bytes(&snapshot))?;
    }
    Ok(())
}

/// Opens a fresh device for each run: the simulated card (`given`, else
/// `default`), or GPU N capped at `given` (else at its free memory).
struct DeviceOpener {
    spec: DeviceSpec,
    given: Option<u64>,
    default: u64,
    /// Where the simulated card puts a snapshot's start segments (recorded addresses).
    start_addresses: Vec<u64>,
}

impl DeviceOpener {
    fn open(&self) -> Result<Box<dyn Device>, Error> {
        match self.spec {
            DeviceSpec::Sim => Ok(Box::new(
                SimDevice::new(self.given.unwrap_or(self.default))
                    .with_recorded_addresses(self.start_addresses.iter().copied()),
            )),
            #[cfg(feature = "cuda")]
            DeviceSpec::Cuda(ordinal) => Ok(Box::new(crate::device::cuda::CudaDevice::open(
                ordinal, self.given,
            )?)),
            #[cfg(not(feature = "cuda"))]
            DeviceSpec::Cuda(ordinal) => Err(Error::NoDevice(format!(
                "--device cuda:{ordinal}: this allocdoc was built without the `cuda` feature"
            ))),
        }
    }
}

/// A snapshot's trace replayed from the state it started in: once per
/// `--conf` (the recorded config when none is given), plus the `--fidelity`
/// comparison under the recorded config (on the simulated card).
fn snapshot_replay(
    opts: &ReplayOptions,
    spec: DeviceSpec,
    name: String,
    data: &[u8],
    version: TorchVersion,
) -> Result<Replay, Error> {
    use crate::workload::snapshot_trace::{self as st, CapacitySource};
    let snap = crate::snapshot::load(&name, data)?;
    let device = st::traced_device(&snap).ok_or_else(|| {
        Error::Input(format!(
            "{name}: the snapshot has no trace to replay (record one with torch.cuda.memory._record_memory_history())"
        ))
    })?;
    let mut recorded = st::recorded_settings(&snap);
    recorded.version = version;
    let trace = st::SnapshotTrace::new(&snap, device, &recorded)
        .map_err(|e| Error::Input(format!("{name}: {e}")))?;
    let (capacity, source) = st::capacity(&trace, opts.capacity, DEFAULT_CAPACITY);
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
    let runs_for: Vec<(String, Settings)> = if opts.confs.is_empty() {
        let conf = crate::snapshot::evidence::settings_json(&snap)
            .and_then(|j| {
                j.get("PYTORCH_CUDA_ALLOC_CONF")?
                    .as_str()
                    .map(str::to_string)
            })
            .unwrap_or_default();
        vec![(conf, recorded.clone())]
    } else {
        opts.confs
            .iter()
            .map(|c| Ok((c.clone(), parse_conf(c, version)?)))
            .collect::<Result<_, Error>>()?
    };
    let open = DeviceOpener {
        spec,
        given: (source != CapacitySource::Default).then_some(capacity),
        default: capacity,
        start_addresses: trace.recorded_addresses(false),
    };
    let replay = |settings: &Settings, device: Box<dyn Device>, options: RunOptions| {
        Ok(st::replay_on(&trace, settings, device, false, options)?.0)
    };
    let last = runs_for.len().saturating_sub(1);
    let runs: Vec<Run> = runs_for
        .iter()
        .enumerate()
        .map(|(i, (conf, settings))| {
            let options = run_options(opts, i == last);
            let summary = opts.summary.then_some(device);
            run_one(conf.clone(), settings, &open, summary, options, &replay)
        })
        .collect::<Result<_, _>>()?;
    let fidelity = if opts.fidelity {
        st::replay_on_sim(&trace, &recorded, capacity, true, RunOptions::default())?.1
    } else {
        None
    };
    let replay = Replay {
        input: name,
        events: trace.trace.len() as u64,
        capacity_bytes: runs.first().map_or(capacity, |r| r.result.capacity_bytes),
        capacity_defaulted: source == CapacitySource::Default && spec == DeviceSpec::Sim,
        device: spec,
        torch_version: version,
        runs,
        fidelity,
        notes,
    };
    if let Some(path) = &opts.report {
        let runs: Vec<(&str, &RunResult, &Settings)> = replay
            .runs
            .iter()
            .zip(&runs_for)
            .map(|(r, (_, s))| (conf_name(&r.conf), &r.result, s))
            .collect();
        let views = views_from(&runs, |settings, events| {
            let options = RunOptions {
                stop_after: Some(events),
                ..RunOptions::default()
            };
            st::replay_on_sim(&trace, settings, capacity, false, options)
                .map(|(run, _)| run.segments)
                .unwrap_or_default()
        });
        write_output(path, crate::report::replay::html(&replay, views).as_bytes())?;
    }
    emit_snapshot(opts, &replay)?;
    Ok(replay)
}

/// What an HTML report draws from replays: one timeline per run and the
/// segment map worth looking at.
#[derive(Default)]
pub struct ReportViews {
    pub timelines: Vec<crate::report::html::Timeline>,
    pub map: Option<crate::report::html::SegmentMap>,
}

/// Replays `trace` under each named config on the simulated card, keeping
/// every event's figures, for `--report` of commands whose own runs do not.
pub fn report_views(trace: &Trace, runs: &[(&str, &Settings)], capacity: u64) -> ReportViews {
    let views = report_views_with(runs, |settings, options| {
        Ok(replay_with(
            trace,
            settings,
            SimDevice::new(capacity),
            options,
        ))
    });
    views.unwrap_or_default() // a trace replay does not fail
}

/// [`report_views`] for any workload: `replay(settings, options)` runs it on
/// the simulated card.
pub fn report_views_with(
    runs: &[(&str, &Settings)],
    replay: impl Fn(&Settings, RunOptions) -> Result<RunResult, Error>,
) -> Result<ReportViews, Error> {
    let options = RunOptions {
        timeline: true,
        ..RunOptions::default()
    };
    let results: Vec<RunResult> = runs
        .iter()
        .map(|(_, settings)| replay(settings, options))
        .collect::<Result<_, _>>()?;
    let named: Vec<(&str, &RunResult, &Settings)> = runs
        .iter()
        .zip(&results)
        .map(|((name, settings), result)| (*name, result, *settings))
        .collect();
    Ok(views_from(&named, |settings, events| {
        let options = RunOptions {
            stop_after: Some(events),
            ..RunOptions::default()
        };
        replay(settings, options)
            .map(|run| run.segments)
            .unwrap_or_default()
    }))
}

/// The timelines of runs replayed with a timeline, and the segment map of
/// the first run that ran out (at its OOM), else of the last run at its
/// allocated peak: `segments_after(settings, n)` replays the first `n`
/// events again (replays are deterministic) and returns the segments then.
pub fn views_from(
    runs: &[(&str, &RunResult, &Settings)],
    segments_after: impl Fn(&Settings, u64) -> Vec<crate::allocator::SegmentInfo>,
) -> ReportViews {
    use crate::report::html::{SegmentMap, Timeline};
    let timelines = runs
        .iter()
        .map(|(name, result, _)| Timeline::from_run(*name, result))
        .collect();
    let oom = runs.iter().find_map(|(name, result, _)| {
        let index = result.oom.as_ref()?.event_index;
        Some(SegmentMap::from_allocator(
            format!("of {name} at its OOM (event {index})"),
            &result.segments,
        ))
    });
    let map = oom.or_else(|| {
        let (name, result, settings) = runs.last()?;
        let index = result.peak_event_index?;
        Some(SegmentMap::from_allocator(
            format!("of {name} at its allocated peak (event {index})"),
            &segments_after(settings, index + 1),
        ))
    });
    ReportViews { timelines, map }
}

/// A config as shown in reports: `(defaults)` for the empty one.
pub fn conf_name(conf: &str) -> &str {
    if conf.is_empty() { "(defaults)" } else { conf }
}

fn write_output(path: &std::path::Path, bytes: &[u8]) -> Result<(), Error> {
    std::fs::write(path, bytes)
        .map_err(|e| Error::Usage(format!("{}: cannot write: {e}", path.display())))
}

/// One replay of the workload under some settings on a device.
type DeviceReplay<'r> =
    dyn Fn(&Settings, Box<dyn Device>, RunOptions) -> Result<RunResult, Error> + 'r;

/// One config's run on a fresh device from `open`; with `summary` (the
/// device index), `memory_summary()` at the end and at the allocated peak
/// (replayed again up to there on a fresh device: replays are deterministic).
fn run_one(
    conf: String,
    settings: &Settings,
    open: &DeviceOpener,
    summary: Option<u32>,
    options: RunOptions,
    replay: &DeviceReplay,
) -> Result<Run, Error> {
    let result = replay(settings, open.open()?, options)?;
    let (summary_at_peak, summary_at_end) = match summary {
        Some(device) => {
            let render = |stats: &std::collections::BTreeMap<String, i64>| {
                memory_summary(stats, device, false, settings.version)
            };
            let at_peak = match result.peak_event_index {
                Some(index) => {
                    let options = RunOptions {
                        stop_after: Some(index + 1),
                        ..RunOptions::default()
                    };
                    Some(render(&replay(settings, open.open()?, options)?.stats))
                }
                None => None,
            };
            (at_peak, Some(render(&result.stats)))
        }
        None => (None, None),
    };
    Ok(Run {
        conf,
        result,
        summary_at_peak,
        summary_at_end,
    })
}

/// Parses a `--conf` value for `version`; the native backend only.
fn parse_conf(conf: &str, version: TorchVersion) -> Result<Settings, Error> {
    let parsed = crate::conf::parse(conf, version)
        .map_err(|e| Error::Usage(format!("--conf {conf:?}: {e}")))?;
    if parsed.settings.backend != Backend::Native {
        return Err(Error::Usage(format!(
            "--conf {conf:?}: backend:cudaMallocAsync is not modelled by the bundled allocator (native only)"
        )));
    }
    Ok(parsed.settings)
}
