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
    let mut stderr = Vec::new();
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
    for (flag, given) in [("--fidelity", opts.fidelity)] {
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
    let (name, data) = read_input(&opts.trace)?;
    let trace = detect_trace(&name, &data)?.ok_or_else(|| {
        Error::Input(format!(
            "{name}: expected a trace CSV starting with the header \"{}\"",
            crate::workload::trace::HEADER
        ))
    })?;
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
    let last = confs.len().saturating_sub(1);
    let runs: Vec<Run> = confs
        .into_iter()
        .zip(&settings)
        .enumerate()
        .map(|(i, (conf, settings))| {
            let options = RunOptions {
                // Per-event points only for the report; history only for the snapshot of the last run.
                timeline: opts.report.is_some(),
                history: opts.emit_snapshot.is_some() && i == last,
                ..RunOptions::default()
            };
            run_one(&trace, conf, settings, capacity, opts.summary, options)
        })
        .collect();
    let replay = Replay {
        input: name,
        events: trace.len() as u64,
        capacity_bytes: capacity,
        capacity_defaulted: opts.capacity.is_none() && trace.capacity_hint().is_none(),
        torch_version: version,
        runs,
    };
    if let Some(path) = &opts.report {
        let map = segment_map(&trace, &replay, &settings);
        write_output(path, crate::report::replay::html(&replay, map).as_bytes())?;
    }
    if let (Some(path), Some(run)) = (&opts.emit_snapshot, replay.runs.last()) {
        let snapshot = crate::snapshot::writer::Snapshot::from_allocator(
            &run.result.segments,
            &run.result.history,
            Some(run.conf.clone()),
        );
        write_output(path, &crate::snapshot::writer::to_bytes(&snapshot))?;
    }
    Ok(replay)
}

/// The segment map worth looking at: the first run that ran out, at its OOM;
/// else the last run at its allocated peak (replayed again up to there).
fn segment_map(
    trace: &Trace,
    replay: &Replay,
    settings: &[Settings],
) -> Option<crate::report::html::SegmentMap> {
    use crate::report::html::SegmentMap;
    if let Some(run) = replay.runs.iter().find(|r| r.result.oom.is_some()) {
        let index = run.result.oom.as_ref().map_or(0, |o| o.event_index);
        return Some(SegmentMap::from_allocator(
            format!("of {} at its OOM (event {index})", conf_name(&run.conf)),
            &run.result.segments,
        ));
    }
    let (run, settings) = replay.runs.iter().zip(settings).next_back()?;
    let index = run.result.peak_event_index?;
    let options = RunOptions {
        stop_after: Some(index + 1),
        ..RunOptions::default()
    };
    let prefix = replay_with(
        trace,
        settings,
        SimDevice::new(replay.capacity_bytes),
        options,
    );
    Some(SegmentMap::from_allocator(
        format!(
            "of {} at its allocated peak (event {index})",
            conf_name(&run.conf)
        ),
        &prefix.segments,
    ))
}

/// A config as shown in reports: `(defaults)` for the empty one.
pub fn conf_name(conf: &str) -> &str {
    if conf.is_empty() { "(defaults)" } else { conf }
}

fn write_output(path: &std::path::Path, bytes: &[u8]) -> Result<(), Error> {
    std::fs::write(path, bytes)
        .map_err(|e| Error::Usage(format!("{}: cannot write: {e}", path.display())))
}

fn run_one(
    trace: &Trace,
    conf: String,
    settings: &Settings,
    capacity: u64,
    summary: bool,
    options: RunOptions,
) -> Run {
    let result = replay_with(trace, settings, SimDevice::new(capacity), options);
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
