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
use crate::snapshot::fit::grid::{Grid, GridError, Point};
use crate::snapshot::fit::{Recording, Series};
use crate::trial::answer::Strength;
use crate::trial::fit::{FitAsk, fit};
use crate::trial::grid::{GridAsk, fit_grid};
use rayon::prelude::*;
use std::path::PathBuf;

/// What `fit` and `forecast` read: recordings of one workload, each at a
/// size of one knob (`--sizes`) or at a point of two (`--points`).
#[derive(Debug, Clone, Default)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct Recordings {
    /// Torch memory snapshots of one workload (`_dump_snapshot()` with a trace), one per
    /// size of the knob (batch 8 and batch 16), or per point of two knobs.
    #[cfg_attr(feature = "cli", arg(required = true, num_args = 2..))]
    pub inputs: Vec<String>,
    /// The knob's value each input was recorded at, in the inputs' order: `--sizes 8,16`.
    #[cfg_attr(
        feature = "cli",
        arg(
            long,
            value_delimiter = ',',
            required_unless_present = "points",
            conflicts_with = "points",
            allow_hyphen_values = true
        )
    )]
    pub sizes: Vec<String>,
    /// Two knobs: the point each input was recorded at, in the inputs' order, as
    /// `a,b` pairs separated by `;`: `--points "1,512;2,512;1,1024"` (at least three, not
    /// on one line). For `forecast` the first knob is the batch.
    #[cfg_attr(feature = "cli", arg(long, allow_hyphen_values = true))]
    pub points: Option<String>,
    /// With --points: the two knobs' names, `--knobs batch,seq_len`.
    #[cfg_attr(feature = "cli", arg(long, requires = "points"))]
    pub knobs: Option<String>,
}

#[derive(Debug, Clone)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct FitOptions {
    /// The recordings and where each was made.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub recordings: Recordings,
    /// With --points: the points to predict, `--at-points "4,2048;8,1024"` (default: both
    /// knobs at twice their largest recorded value, unless --capacity asks for the frontier).
    #[cfg_attr(
        feature = "cli",
        arg(long, requires = "points", allow_hyphen_values = true)
    )]
    pub at_points: Option<String>,
    /// With --points and --capacity: the knob held fixed and its values, `--along
    /// batch=1,2,4,8`: for each, the largest value of the other knob that fits the card
    /// (default: the first knob at its recorded values).
    #[cfg_attr(feature = "cli", arg(long, requires = "points"))]
    pub along: Option<String>,
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
            recordings: Recordings::default(),
            at_points: None,
            along: None,
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
    one_per_input(("--sizes", "value", "size"), sizes.len(), inputs.len())?;
    sizes.iter().map(|s| knob_value("--sizes", s)).collect()
}

/// `flag` gave `given` of its `unit`s for `inputs` inputs: one `what` each, or a usage error.
fn one_per_input(
    (flag, unit, what): (&str, &str, &str),
    given: usize,
    inputs: usize,
) -> Result<(), Error> {
    let s = |n: usize| if n == 1 { "" } else { "s" };
    if given == inputs {
        return Ok(());
    }
    Err(Error::Usage(format!(
        "{flag} gives {given} {unit}{} for {inputs} input{}: one {what} per input, in the same order",
        s(given),
        s(inputs)
    )))
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
    if let Some(points) = &opts.recordings.points {
        return run_grid(opts, points);
    }
    if opts.recordings.sizes.len() != opts.recordings.inputs.len() {
        recorded_sizes(&opts.recordings.inputs, &opts.recordings.sizes)?;
    }
    if opts.step == 0 {
        return Err(Error::Usage("--step 0: the step is 1 or more".into()));
    }
    recorded_sizes(&opts.recordings.inputs, &opts.recordings.sizes)?;
    let mut at = opts
        .at
        .iter()
        .map(|s| knob_value("--at", s))
        .collect::<Result<Vec<u64>, Error>>()?;
    at.sort_unstable();
    at.dedup();
    let confs = configs(&opts.confs)?;
    let series = series(
        &opts.common,
        &opts.recordings.inputs,
        &opts.recordings.sizes,
    )?;
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
    let configs = result.predictions.iter().map(|p| p.configs.as_slice());
    Ok(outcome(opts, (stdout, stderr), result.strength, configs))
}

/// The outcome of `fit`: exit 4 when uncertain, else 1 when at some point
/// asked for every config runs out of memory on the card, else 0.
fn outcome<'c>(
    opts: &FitOptions,
    (stdout, stderr): (String, Vec<String>),
    strength: Strength,
    mut predictions: impl Iterator<Item = &'c [crate::trial::fit::ConfPrediction]>,
) -> Outcome {
    let oom = predictions.any(|c| !c.is_empty() && c.iter().all(|c| c.oom.is_some()));
    let exit_code = if strength == Strength::Uncertain {
        crate::error::EXIT_UNCERTAIN
    } else if oom {
        crate::error::EXIT_STILL_OOM
    } else {
        crate::error::EXIT_OK
    };
    Outcome {
        stdout: opts.common.format.finish(stdout),
        stderr,
        exit_code,
    }
}

/// `a,b;a,b;…` (`flag` names them in errors): whole numbers above 0, two
/// to a point.
fn parse_points(flag: &str, text: &str) -> Result<Vec<Point>, Error> {
    text.split(';')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            let v: Vec<&str> = p.split(',').collect();
            match v.as_slice() {
                [a, b] => Ok((knob_value(flag, a)?, knob_value(flag, b)?)),
                _ => Err(Error::Usage(format!(
                    "{flag} {p:?}: a point is two values, one per knob, `a,b` (points are separated by `;`)"
                ))),
            }
        })
        .collect()
}

/// The recordings at their points (`--points`, one per input), paired, and
/// the knobs' names (`--knobs`; `a` and `b` without).
pub(crate) fn grid(
    common: &super::Common,
    inputs: &[String],
    points: &str,
    knobs: Option<&str>,
) -> Result<(Grid, (String, String)), Error> {
    let points = parse_points("--points", points)?;
    one_per_input(("--points", "point", "point"), points.len(), inputs.len())?;
    let knobs = match knobs {
        Some(k) => {
            let names: Vec<String> = k.split(',').map(|n| n.trim().to_string()).collect();
            match names.as_slice() {
                [a, b] if !a.is_empty() && !b.is_empty() && a != b => (a.clone(), b.clone()),
                _ => {
                    return Err(Error::Usage(format!(
                        "--knobs {k:?}: two different names, one per value of a point (`batch,seq_len`)"
                    )));
                }
            }
        }
        None => ("a".to_string(), "b".to_string()),
    };
    let recordings = inputs
        .par_iter()
        .enumerate()
        .map(|(i, input)| recording(common, input, i as u64 + 1))
        .collect::<Result<Vec<_>, Error>>()?;
    let grid = Grid::new(recordings, points).map_err(|e| match e {
        GridError::Series(s) => Error::Input(s.to_string()),
        other => Error::Usage(format!("--points: {other}")),
    })?;
    Ok((grid, knobs))
}

/// `fit` in two knobs ([`crate::trial::grid`]).
fn run_grid(opts: &FitOptions, points: &str) -> Result<Outcome, Error> {
    if !opts.at.is_empty() {
        return Err(Error::Usage(
            "--at predicts sizes of one knob: with --points, give --at-points \"a,b;…\"".into(),
        ));
    }
    let mut at = match &opts.at_points {
        Some(t) => parse_points("--at-points", t)?,
        None => Vec::new(),
    };
    at.sort_unstable();
    at.dedup();
    let confs = configs(&opts.confs)?;
    let (grid, knobs) = grid(
        &opts.common,
        &opts.recordings.inputs,
        points,
        opts.recordings.knobs.as_deref(),
    )?;
    let points = &grid.points;
    let top = |k: usize| {
        points
            .iter()
            .map(|p| if k == 0 { p.0 } else { p.1 })
            .max()
            .unwrap_or(1)
    };
    if at.is_empty() && opts.capacity.is_none() {
        at.push((top(0).saturating_mul(2), top(1).saturating_mul(2)));
    }
    let along = match (&opts.along, opts.capacity) {
        (Some(a), _) => {
            let (name, values) = a.split_once('=').ok_or_else(|| {
                Error::Usage(format!(
                    "--along {a:?}: the knob held fixed and its values, `{}=1,2,4`",
                    knobs.0
                ))
            })?;
            let k = if name.trim() == knobs.0 {
                0
            } else if name.trim() == knobs.1 {
                1
            } else {
                return Err(Error::Usage(format!(
                    "--along {a:?}: {name:?} is neither knob ({} or {})",
                    knobs.0, knobs.1
                )));
            };
            let values = values
                .split(',')
                .map(|v| knob_value("--along", v))
                .collect::<Result<Vec<u64>, Error>>()?;
            Some((k, values))
        }
        (None, Some(_)) => {
            let mut v: Vec<u64> = points.iter().map(|p| p.0).collect();
            v.sort_unstable();
            v.dedup();
            Some((0, v))
        }
        (None, None) => None,
    };
    if along.is_some() && opts.capacity.is_none() {
        return Err(Error::Usage(
            "--along finds the largest value that fits a card: give --capacity".into(),
        ));
    }
    let ask = GridAsk {
        knobs,
        at,
        confs,
        capacity: opts.capacity,
        along,
    };
    let result = fit_grid(&grid, &ask);
    let stdout = match opts.common.format {
        Format::Text => crate::report::grid::text(&result),
        Format::Json | Format::Jsonl => crate::report::grid::json_doc(&result),
        Format::Markdown => crate::report::grid::markdown(&result),
    };
    let mut stderr = Vec::new();
    if let Some(path) = &opts.report {
        stderr.push(super::write_report(
            path,
            &crate::report::grid::html(&result),
        )?);
    }
    let configs = result.predictions.iter().map(|p| p.configs.as_slice());
    Ok(outcome(opts, (stdout, stderr), result.strength, configs))
}
