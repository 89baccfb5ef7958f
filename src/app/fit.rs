//! The `fit` command: how large a size (a batch, a sequence length) fits.
//! Two or more snapshots of one workload recorded at small sizes of one
//! knob are read ([`crate::snapshot::fit`]), paired and given size laws;
//! the trace predicted at each size asked for is replayed as a fresh
//! process under each config ([`crate::trial::fit`]), and with `--capacity`
//! the largest size that fits the card is found by bisection over replays.

use super::{Format, Outcome};
use crate::Error;
use crate::conf::{Settings, TorchVersion};
use crate::ingest::InputKind;
use crate::snapshot::fit::{Recording, Series};
use crate::trial::answer::Strength;
use crate::trial::fit::{FitAsk, fit};
use rayon::prelude::*;
use std::path::PathBuf;

#[derive(Debug, Clone)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct FitOptions {
    /// Torch memory snapshots of one workload (`_dump_snapshot()` with a trace), one per
    /// size of the knob, e.g. batch 8 and batch 16.
    #[cfg_attr(feature = "cli", arg(required = true, num_args = 2..))]
    pub inputs: Vec<String>,
    /// The knob's value each input was recorded at, in the inputs' order: `--sizes 8,16`.
    #[cfg_attr(
        feature = "cli",
        arg(
            long,
            value_delimiter = ',',
            required = true,
            allow_hyphen_values = true
        )
    )]
    pub sizes: Vec<String>,
    /// Sizes to predict: `--at 32,64` (default: twice the largest recorded size, unless
    /// --capacity asks for the largest size that fits).
    #[cfg_attr(
        feature = "cli",
        arg(long, value_delimiter = ',', allow_hyphen_values = true)
    )]
    pub at: Vec<String>,
    /// A config to predict under besides PyTorch's defaults (repeatable).
    #[cfg_attr(feature = "cli", arg(long = "conf"))]
    pub confs: Vec<String>,
    /// The card, e.g. 80GiB or 79.11GiB: whether each size runs out of memory on it,
    /// and the largest size that fits it under each config.
    #[cfg_attr(feature = "cli", arg(long, value_parser = crate::units::parse_device_size))]
    pub capacity: Option<u64>,
    /// The largest size that fits is a multiple of this (a batch that must divide
    /// evenly across 8 GPUs: --step 8).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 1))]
    pub step: u64,
    /// The knob's name in the output (`batch`, `seq_len`).
    #[cfg_attr(feature = "cli", arg(long, default_value = "size"))]
    pub knob: String,
    /// Also write a self-contained HTML report: predicted peaks against the size.
    #[cfg_attr(feature = "cli", arg(long))]
    pub report: Option<PathBuf>,
    /// The output format, the inputs' limits, inputs held in memory.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub common: super::Common,
}

impl Default for FitOptions {
    fn default() -> Self {
        FitOptions {
            inputs: Vec::new(),
            sizes: Vec::new(),
            at: Vec::new(),
            confs: Vec::new(),
            capacity: None,
            step: 1,
            knob: "size".into(),
            report: None,
            common: super::Common::default(),
        }
    }
}

/// A knob value: a whole number above 0.
pub(crate) fn knob_value(flag: &str, v: &str) -> Result<u64, Error> {
    let t = v.trim();
    match t.parse::<u64>() {
        Ok(0) => Err(Error::Usage(format!("{flag} {t}: sizes start at 1"))),
        Ok(n) => Ok(n),
        Err(_) if t.starts_with('-') => Err(Error::Usage(format!(
            "{flag} {t}: sizes are whole numbers above 0"
        ))),
        Err(_) => Err(Error::Usage(format!(
            "{flag} {t:?}: expected a whole number (the knob's value: a batch size, a sequence length)"
        ))),
    }
}

/// Reads one input's recording.
fn recording(common: &super::Common, input: &str, size: u64) -> Result<Recording, Error> {
    let name = crate::ingest::input_name(input);
    let data = common.buffers.read(input, &common.limits)?;
    if crate::ingest::detect(&data) != InputKind::Pickle {
        return Err(Error::Input(format!(
            "{name}: not a snapshot pickle: fit reads torch memory snapshots with a trace, one per size ({})",
            crate::snapshot::attribute::RECORD_STACKS
        )));
    }
    let snap = crate::snapshot::load_with(name, &data, &common.limits)?;
    Recording::read(name, size, &snap)
        .map_err(|e| Error::Input(format!("{name}: not a torch memory snapshot: {e}")))?
        .ok_or_else(|| {
            Error::Input(format!(
                "{name}: the snapshot records no trace (no alloc or free_completed entries): record the step with torch.cuda.memory._record_memory_history() before it, then _dump_snapshot()"
            ))
        })
}

/// The defaults and each config given (once each), parsed.
pub(crate) fn configs(given: &[String]) -> Result<Vec<(String, Settings)>, Error> {
    let mut confs = vec![String::new()];
    for c in given {
        let c = c.trim().to_string();
        if !confs.contains(&c) {
            confs.push(c);
        }
    }
    confs
        .into_iter()
        .map(|c| {
            let s = crate::trial::run::parse_native_conf(&c, TorchVersion::DEFAULT)?.settings;
            Ok((c, s))
        })
        .collect()
}

/// The size of each input: one each, whole numbers above 0.
pub(crate) fn recorded_sizes(inputs: &[String], sizes: &[String]) -> Result<Vec<u64>, Error> {
    if sizes.len() != inputs.len() {
        return Err(Error::Usage(format!(
            "--sizes gives {} value{} for {} input{}: one size per input, in the same order",
            sizes.len(),
            if sizes.len() == 1 { "" } else { "s" },
            inputs.len(),
            if inputs.len() == 1 { "" } else { "s" }
        )));
    }
    sizes.iter().map(|s| knob_value("--sizes", s)).collect()
}

/// The recordings of `inputs` at `sizes`, read and paired into a series.
pub(crate) fn series(
    common: &super::Common,
    inputs: &[String],
    sizes: &[String],
) -> Result<Series, Error> {
    let sizes = recorded_sizes(inputs, sizes)?;
    let recordings = inputs
        .par_iter()
        .zip(&sizes)
        .map(|(input, &size)| recording(common, input, size))
        .collect::<Result<Vec<_>, Error>>()?;
    Series::new(recordings).map_err(|e| Error::Input(e.to_string()))
}

pub fn run(opts: &FitOptions) -> Result<Outcome, Error> {
    if opts.sizes.len() != opts.inputs.len() {
        recorded_sizes(&opts.inputs, &opts.sizes)?;
    }
    if opts.step == 0 {
        return Err(Error::Usage("--step 0: the step is 1 or more".into()));
    }
    recorded_sizes(&opts.inputs, &opts.sizes)?;
    let mut at = opts
        .at
        .iter()
        .map(|s| knob_value("--at", s))
        .collect::<Result<Vec<u64>, Error>>()?;
    at.sort_unstable();
    at.dedup();
    let confs = configs(&opts.confs)?;
    let series = series(&opts.common, &opts.inputs, &opts.sizes)?;
    if at.is_empty() && opts.capacity.is_none() {
        let largest = series.recordings.iter().map(|r| r.size).max().unwrap_or(1);
        at.push(largest.saturating_mul(2));
    }
    let ask = FitAsk {
        at,
        confs,
        capacity: opts.capacity,
        step: opts.step,
    };
    let result = fit(&series, &ask);
    let knob = crate::report::fit::Knob(&opts.knob);
    let stdout = match opts.common.format {
        Format::Text => crate::report::fit::text(&result, &knob),
        Format::Json | Format::Jsonl => crate::report::fit::json_doc(&result, &knob),
        Format::Markdown => crate::report::fit::markdown(&result, &knob),
    };
    let mut stderr = Vec::new();
    if let Some(path) = &opts.report {
        stderr.push(super::write_report(
            path,
            &crate::report::fit::html(&result, &knob),
        )?);
    }
    // Exit 1: at a size asked for, every config runs out of memory on the card.
    let oom = result
        .predictions
        .iter()
        .any(|p| !p.configs.is_empty() && p.configs.iter().all(|c| c.oom.is_some()));
    let exit_code = if result.strength == Strength::Uncertain {
        crate::error::EXIT_UNCERTAIN
    } else if oom {
        crate::error::EXIT_STILL_OOM
    } else {
        crate::error::EXIT_OK
    };
    Ok(Outcome {
        stdout: opts.common.format.finish(stdout),
        stderr,
        exit_code,
    })
}
