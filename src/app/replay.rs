//! The `replay` command: run a trace through the bundled caching allocator
//! under one or more configs on the simulated card.

use super::{Format, Outcome};
use crate::Error;
use crate::allocator::summary::memory_summary;
use crate::conf::{Settings, TorchVersion};
use crate::device::sim::SimDevice;
use crate::evidence::Backend;
use crate::units::human;
use crate::workload::{ReplayOptions as RunOptions, RunResult, Trace, detect_trace, replay_with};
use std::io::Read;
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
    pub torch_version: TorchVersion,
    pub runs: Vec<Run>,
    /// `--fidelity` on a snapshot: the recorded config's replay compared with the recording.
    pub fidelity: Option<crate::workload::snapshot_trace::Fidelity>,
    /// Notes for standard error (how the input was read, how capacity was chosen).
    pub notes: Vec<String>,
}

pub fn run(opts: &ReplayOptions) -> Result<Outcome, Error> {
    let replay = execute(opts)?;
    let stdout = match opts.format {
        Format::Text => crate::report::replay::text(&replay),
        Format::Json => crate::report::replay::json(&replay),
        Format::Markdown => crate::report::replay::markdown(&replay),
    };
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
    let device = opts.device.trim();
    if device.starts_with("cuda") {
        return Err(Error::NoDevice(format!(
            "--device {device}: replay on a real GPU is not available in this build; use --device sim"
        )));
    }
    if device != "sim" && !device.is_empty() {
        return Err(Error::Usage(format!(
            "--device {device}: expected sim or cuda[:N]"
        )));
    }
    let (name, data) = read_input(&opts.trace)?;
    let is_snapshot = crate::snapshot::is_pickle(&data);
    for (flag, given) in [
        ("--fidelity", opts.fidelity && !is_snapshot),
        ("--compare-with", opts.compare_with.is_some()),
        ("--emit-snapshot", opts.emit_snapshot.is_some()),
        ("--report", opts.report.is_some()),
    ] {
        if given {
            return Err(Error::Usage(format!(
                "{flag} needs a snapshot replay, which this build of `replay` does not include"
            )));
        }
    }
    let version = match &opts.torch_version {
        Some(v) => {
            TorchVersion::parse(v).map_err(|e| Error::Usage(format!("--torch-version: {e}")))?
        }
        None => TorchVersion::DEFAULT,
    };
    if is_snapshot {
        return snapshot_replay(opts, name, &data, version);
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
    let capacity = opts
        .capacity
        .or(trace.capacity_hint())
        .unwrap_or(DEFAULT_CAPACITY);
    let runs = confs
        .into_iter()
        .zip(&settings)
        .map(|(conf, settings)| run_one(&trace, conf, settings, capacity, opts.summary))
        .collect();
    Ok(Replay {
        input: name,
        events: trace.len() as u64,
        capacity_bytes: capacity,
        capacity_defaulted: opts.capacity.is_none() && trace.capacity_hint().is_none(),
        torch_version: version,
        runs,
        fidelity: None,
        notes,
    })
}

/// A snapshot's trace replayed from the state it started in: once per
/// `--conf` (the recorded config when none is given), plus the `--fidelity`
/// comparison under the recorded config.
fn snapshot_replay(
    opts: &ReplayOptions,
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
    let (capacity, source) = st::capacity(&snap, device, opts.capacity, DEFAULT_CAPACITY);
    let mut notes = vec![format!(
        "note: {name}: device {device}, {} segments and {} live blocks seeded at the start of the trace",
        trace.start.segments.len(),
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
    let mut runs = Vec::new();
    for (conf, settings) in runs_for {
        let (result, _) = st::replay_on_sim(&trace, &settings, capacity, false)?;
        let summary_at_end = opts
            .summary
            .then(|| memory_summary(&result.stats, device, false, settings.version));
        runs.push(Run {
            conf,
            result,
            summary_at_peak: None,
            summary_at_end,
        });
    }
    let fidelity = if opts.fidelity {
        st::replay_on_sim(&trace, &recorded, capacity, true)?.1
    } else {
        None
    };
    Ok(Replay {
        input: name,
        events: trace.trace.len() as u64,
        capacity_bytes: capacity,
        capacity_defaulted: source == CapacitySource::Default,
        torch_version: version,
        runs,
        fidelity,
        notes,
    })
}

fn run_one(trace: &Trace, conf: String, settings: &Settings, capacity: u64, summary: bool) -> Run {
    let result = replay_with(
        trace,
        settings,
        SimDevice::new(capacity),
        RunOptions::default(),
    );
    let render = |stats: &std::collections::BTreeMap<String, i64>| {
        memory_summary(stats, 0, false, settings.version)
    };
    let (summary_at_peak, summary_at_end) = if summary {
        // Replaying is deterministic: re-run up to the peak to see the state there.
        let at_peak = result.peak_event_index.map(|index| {
            let options = RunOptions {
                stop_after: Some(index + 1),
                ..RunOptions::default()
            };
            let prefix = replay_with(trace, settings, SimDevice::new(capacity), options);
            render(&prefix.stats)
        });
        (at_peak, Some(render(&result.stats)))
    } else {
        (None, None)
    };
    Run {
        conf,
        result,
        summary_at_peak,
        summary_at_end,
    }
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

/// The input's display name and bytes (`-` or empty = standard input).
fn read_input(path: &str) -> Result<(String, Vec<u8>), Error> {
    if path.is_empty() || path == "-" {
        let mut data = Vec::new();
        std::io::stdin()
            .read_to_end(&mut data)
            .map_err(|e| Error::Input(format!("<stdin>: cannot read: {e}")))?;
        return Ok(("<stdin>".into(), data));
    }
    let data =
        std::fs::read(path).map_err(|e| Error::Input(format!("{path}: cannot read: {e}")))?;
    Ok((path.to_string(), data))
}
