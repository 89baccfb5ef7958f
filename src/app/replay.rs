//! The `replay` command: run a trace through the bundled caching allocator
//! under one or more configs ([`crate::trial::replay`]), render the runs side
//! by side, and write the report, the emitted snapshot and the comparison
//! with PyTorch's own figures when asked.

use super::{Format, Outcome};
use crate::Error;
use crate::conf::TorchVersion;
use crate::device::DeviceSpec;
use crate::trial::replay::{Plan, Replay, emitted_snapshot};
use crate::units::human;
use std::path::PathBuf;

#[derive(Debug, Clone, Default)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct ReplayOptions {
    /// A trace CSV (action,id,size,stream), an RMM replay log or a snapshot pickle with a trace.
    pub trace: String,
    /// A config to run under (repeatable; '' is PyTorch's default).
    #[cfg_attr(feature = "cli", arg(long = "conf"))]
    pub confs: Vec<String>,
    /// Device capacity, e.g. 24GiB (default: a snapshot's recorded OOM, else an
    /// 80 GiB simulated card, or the free memory of the GPU with --device cuda).
    #[cfg_attr(feature = "cli", arg(long, value_parser = crate::units::parse_device_size))]
    pub capacity: Option<u64>,
    /// `sim` (default) or `cuda[:N]`: run the allocator on GPU N, which must have
    /// --capacity free (exit 3 when no CUDA driver or GPU is usable).
    #[cfg_attr(feature = "cli", arg(long, default_value = "sim"))]
    pub device: String,
    /// Compare every allocation with the addresses recorded in the snapshot.
    #[cfg_attr(feature = "cli", arg(long))]
    pub fidelity: bool,
    /// Print PyTorch's memory_summary() for each run at its peak and at the end.
    #[cfg_attr(feature = "cli", arg(long))]
    pub summary: bool,
    /// Follow this PyTorch version's allocator behaviour (default 2.6).
    #[cfg_attr(feature = "cli", arg(long))]
    pub torch_version: Option<String>,
    /// The platform PyTorch runs on: a setting it ignores there (expandable
    /// segments on Windows, on ROCm before 2.12) is replayed as ignored (default linux).
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value_t))]
    pub platform: crate::conf::Platform,
    /// memory_stats() JSON written by scripts/torch_crosscheck.py, to compare against.
    #[cfg_attr(feature = "cli", arg(long))]
    pub compare_with: Option<PathBuf>,
    /// Write the last config's simulated run as a torch memory snapshot pickle
    /// (protocol 4: opens in pytorch.org/memory_viz and torch.cuda._memory_viz).
    #[cfg_attr(feature = "cli", arg(long))]
    pub emit_snapshot: Option<PathBuf>,
    /// Also write a self-contained HTML report.
    #[cfg_attr(feature = "cli", arg(long))]
    pub report: Option<PathBuf>,
    /// The output format, the inputs' limits, inputs held in memory.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub common: super::Common,
}

pub fn run(opts: &ReplayOptions) -> Result<Outcome, Error> {
    let replay = execute(opts)?;
    let mut stdout = match opts.common.format {
        Format::Text => crate::report::replay::text(&replay),
        Format::Json | Format::Jsonl => crate::report::replay::json(&replay),
        Format::Markdown => crate::report::replay::markdown(&replay),
    };
    if let (Some(path), Some(last)) = (&opts.compare_with, replay.runs.last()) {
        let comparison = crate::trial::compare::compare_with_torch(&last.result, path)?;
        crate::report::replay::append_torch_comparison(
            &mut stdout,
            &comparison,
            opts.common.format,
        )?;
    }
    let mut stderr = replay.notes.clone();
    if let Some(path) = &opts.report {
        stderr.push(format!("note: wrote the HTML report {}", path.display()));
    }
    if replay.capacity_defaulted {
        stderr.push(format!(
            "note: no --capacity given: replaying on a simulated {} card",
            human(replay.capacity_bytes)
        ));
    }
    let exit_code = match replay.runs.last() {
        Some(run) if run.result.figures.oom.is_some() => 1,
        _ => 0,
    };
    Ok(Outcome {
        stdout: opts.common.format.finish(stdout),
        stderr,
        exit_code,
    })
}

/// Replays the trace under every config, and writes `--report` and
/// `--emit-snapshot` when asked.
pub fn execute(opts: &ReplayOptions) -> Result<Replay, Error> {
    let plan = Plan {
        input: opts.trace.clone(),
        confs: opts.confs.clone(),
        capacity: opts.capacity,
        device: DeviceSpec::parse(&opts.device)?,
        torch_version: match &opts.torch_version {
            Some(v) => {
                TorchVersion::parse(v).map_err(|e| Error::Usage(format!("--torch-version: {e}")))?
            }
            None => TorchVersion::DEFAULT,
        },
        platform: opts.platform,
        fidelity: opts.fidelity,
        summary: opts.summary,
        pictures: opts.report.is_some(),
        history: opts.emit_snapshot.is_some(),
        limits: opts.common.limits,
    };
    let data = opts.common.buffers.read(&opts.trace, &opts.common.limits)?;
    let replay = crate::trial::replay::replay(&plan, &data)?;
    if let Some(path) = &opts.report {
        super::write_report(path, &crate::report::replay::html(&replay))?;
    }
    if let Some(path) = &opts.emit_snapshot
        && let Some(bytes) = emitted_snapshot(&replay)?
    {
        write_output(path, &bytes)?;
    }
    Ok(replay)
}

fn write_output(path: &std::path::Path, bytes: &[u8]) -> Result<(), Error> {
    std::fs::write(path, bytes)
        .map_err(|e| Error::Usage(format!("{}: cannot write: {e}", path.display())))
}
