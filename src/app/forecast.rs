//! The `forecast` command: a whole run of steps whose size varies, from the
//! same recordings `fit` reads. The run is a file of step sizes (`--run`),
//! or is built from a file of per-sample sizes shuffled into padded batches
//! (`--lengths`, as a DataLoader makes them); it is replayed as one process
//! under each config ([`crate::trial::forecast`]) and rendered by
//! [`crate::report::forecast`].

use super::{Format, Outcome};
use crate::Error;
use crate::trial::answer::Strength;
use crate::trial::forecast::{BatchSearch, ForecastAsk, forecast};
use crate::trial::search::Progress;
use crate::workload::run::RunPlan;
use std::path::PathBuf;

#[derive(Debug, Clone)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct ForecastOptions {
    /// The recordings and where each was made, as `fit` takes them; with --points the
    /// first knob is the batch and the run's sizes are the second's, at --batch.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub recordings: super::fit::Recordings,
    /// The run: a text file with one step's size per line, in the knob's unit (`#` starts a
    /// comment).
    #[cfg_attr(feature = "cli", arg(long, conflicts_with = "lengths"))]
    pub run: Option<String>,
    /// Build the run from a file of per-sample sizes (a dataset's token lengths, one a
    /// line): shuffled into batches of --batch, each step's size the batch's longest
    /// sample rounded up to --pad-to.
    #[cfg_attr(feature = "cli", arg(long, requires = "batch"))]
    pub lengths: Option<String>,
    /// Samples per batch (with --lengths; with --points, the first knob's value for the
    /// run's steps). `max` (with --points, --lengths and --capacity): per config, the
    /// largest batch whose whole run survives the card.
    #[cfg_attr(feature = "cli", arg(long))]
    pub batch: Option<String>,
    /// Steps to build (with --lengths; default: one epoch, the last partial batch included;
    /// more than an epoch reshuffles for each).
    #[cfg_attr(feature = "cli", arg(long))]
    pub steps: Option<u64>,
    /// The shuffle's seed (with --lengths).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 0))]
    pub seed: u64,
    /// Each step's size is rounded up to a multiple of this (with --lengths: padding to a
    /// multiple of 8 or 64).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 1))]
    pub pad_to: u64,
    /// Write the run that --lengths built to this file (one size per line).
    #[cfg_attr(feature = "cli", arg(long))]
    pub write_run: Option<PathBuf>,
    /// A config to replay the run under besides PyTorch's defaults (repeatable; default:
    /// expandable_segments:True).
    #[cfg_attr(feature = "cli", arg(long = "conf"))]
    pub confs: Vec<String>,
    /// The card, e.g. 80GiB: the step that runs out of memory on it under each config, and
    /// the largest cap on the size that carries the run.
    #[cfg_attr(feature = "cli", arg(long, value_parser = crate::units::parse_device_size))]
    pub capacity: Option<u64>,
    /// The cap on the size is a multiple of this (default: --pad-to).
    #[cfg_attr(feature = "cli", arg(long))]
    pub cap_step: Option<u64>,
    /// The knob's name in the output (`seq_len`, `context_length`).
    #[cfg_attr(feature = "cli", arg(long, default_value = "size"))]
    pub knob: String,
    /// Also write a self-contained HTML report: reserved memory against the step.
    #[cfg_attr(feature = "cli", arg(long))]
    pub report: Option<PathBuf>,
    /// Replay every step event by event, without looking up steps seen before (the
    /// answer is the same; slower).
    #[cfg_attr(feature = "cli", arg(long))]
    pub no_skip: bool,
    /// The output format, the inputs' limits, inputs held in memory.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub common: super::Common,
}

impl Default for ForecastOptions {
    fn default() -> Self {
        ForecastOptions {
            recordings: super::fit::Recordings::default(),
            run: None,
            lengths: None,
            batch: None,
            steps: None,
            seed: 0,
            pad_to: 1,
            write_run: None,
            confs: Vec::new(),
            capacity: None,
            cap_step: None,
            knob: "size".into(),
            report: None,
            no_skip: false,
            common: super::Common::default(),
        }
    }
}

/// The most steps a run may hold.
pub const MAX_STEPS: usize = 1_000_000;
/// Bytes the copies of seen states may hold, over the configs replayed at once.
const MEMO_BUDGET: usize = 768 << 20;
/// No card holds more than this (`--capacity`'s bound): a step whose laws
/// predict more is outside what they can hold.
const MAX_BYTES: u64 = 1 << 50;

/// The sizes of a file of one whole number above 0 per line, `#` comments
/// and blank lines allowed; `what` names them in errors.
fn read_sizes(opts: &ForecastOptions, path: &str, what: &str) -> Result<Vec<u64>, Error> {
    let data = opts.common.buffers.read(path, &opts.common.limits)?;
    parse_sizes(crate::ingest::input_name(path), &data, what)
}

/// [`read_sizes`] on bytes already read: errors name `name` and the line.
pub fn parse_sizes(name: &str, data: &[u8], what: &str) -> Result<Vec<u64>, Error> {
    let text = std::str::from_utf8(data)
        .map_err(|e| Error::Input(format!("{name}: not UTF-8 text ({e}): {what}")))?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let v = line.split('#').next().unwrap_or("").trim();
        if v.is_empty() {
            continue;
        }
        match v.parse::<u64>() {
            Ok(z) if z > 0 => out.push(z),
            _ => {
                return Err(Error::Input(format!(
                    "{name}:{}: {v:?} is not a whole number above 0 ({what})",
                    n + 1
                )));
            }
        }
        if out.len() > MAX_STEPS {
            return Err(Error::Input(format!(
                "{name}:{}: more than {MAX_STEPS} {what}: the most a run holds",
                n + 1
            )));
        }
    }
    if out.is_empty() {
        return Err(Error::Input(format!(
            "{name}: no {what} (one whole number above 0 per line; # starts a comment)"
        )));
    }
    Ok(out)
}

/// `--batch`: samples per batch, or `max` (two knobs: the largest batch
/// that carries the run, searched).
#[derive(Debug, Clone, Copy, PartialEq)]
enum BatchArg {
    Fixed(u64),
    Max,
}

fn batch_arg(opts: &ForecastOptions) -> Result<Option<BatchArg>, Error> {
    let Some(b) = opts.batch.as_deref().map(str::trim) else {
        return Ok(None);
    };
    if b.eq_ignore_ascii_case("max") {
        return Ok(Some(BatchArg::Max));
    }
    match b.parse::<u64>() {
        Ok(0) => Err(Error::Usage(
            "--batch 0: a batch holds 1 sample or more".into(),
        )),
        Ok(n) => Ok(Some(BatchArg::Fixed(n))),
        Err(_) => Err(Error::Usage(format!(
            "--batch {b:?}: samples per batch, a whole number above 0, or `max` (with --points: the largest batch that carries the run)"
        ))),
    }
}

/// The per-sample sizes of `--lengths`, checked against a batch of `batch`.
fn read_lengths(opts: &ForecastOptions, path: &str, batch: u64) -> Result<Vec<u64>, Error> {
    if opts.steps == Some(0) {
        return Err(Error::Usage("--steps 0: a run has 1 step or more".into()));
    }
    if opts.steps.is_some_and(|s| s > MAX_STEPS as u64) {
        return Err(Error::Usage(format!(
            "--steps {}: more than {MAX_STEPS} steps, the most a run holds",
            opts.steps.unwrap_or(0)
        )));
    }
    let lengths = read_sizes(opts, path, "sample sizes")?;
    if (lengths.len() as u64) < batch {
        return Err(Error::Input(format!(
            "{}: {} sample sizes, fewer than one batch of {batch}",
            crate::ingest::input_name(path),
            lengths.len()
        )));
    }
    // The most steps a run of them holds: batches of 1 (one epoch).
    let epoch = lengths.len().div_ceil(batch as usize);
    if opts.steps.is_none() && epoch > MAX_STEPS {
        return Err(Error::Usage(format!(
            "{}: one epoch is {epoch} steps, more than {MAX_STEPS}, the most a run holds: give --steps",
            crate::ingest::input_name(path),
        )));
    }
    Ok(lengths)
}

/// The run's step sizes, from `--run` or built from `--lengths` at a fixed
/// batch; with `--batch max`, the search to build each batch's run.
fn the_run(
    opts: &ForecastOptions,
    batch: Option<BatchArg>,
) -> Result<(Vec<u64>, Option<BatchSearch>), Error> {
    if opts.pad_to == 0 {
        return Err(Error::Usage("--pad-to 0: the padding is 1 or more".into()));
    }
    match (&opts.run, &opts.lengths, batch) {
        (Some(_), Some(_), _) => Err(Error::Usage(
            "--run and --lengths both give the run: give one".into(),
        )),
        (Some(_), None, Some(BatchArg::Max)) => Err(Error::Usage(
            "--batch max searches the batch over runs built from --lengths: give --lengths FILE, not --run".into(),
        )),
        (Some(run), None, _) => Ok((read_sizes(opts, run, "step sizes")?, None)),
        (None, Some(path), Some(BatchArg::Fixed(b))) => {
            let lengths = read_lengths(opts, path, b)?;
            let run = crate::workload::run::batches(&lengths, b, opts.steps, opts.seed, opts.pad_to);
            Ok((run, None))
        }
        (None, Some(path), Some(BatchArg::Max)) => {
            let search = BatchSearch {
                lengths: read_lengths(opts, path, 1)?,
                steps: opts.steps,
                seed: opts.seed,
                pad_to: opts.pad_to,
            };
            Ok((search.run(1), Some(search)))
        }
        (None, Some(_), None) => Err(Error::Usage(
            "--lengths needs --batch N (samples per batch)".into(),
        )),
        (None, None, _) => Err(Error::Usage(
            "forecast needs the run: --run RUN.txt (one step size per line) or --lengths FILE --batch N".into(),
        )),
    }
}

/// Writes the run `--lengths` built at `batch` to `--write-run`; the note.
fn write_run(opts: &ForecastOptions, run: &[u64], batch: u64) -> Result<Option<String>, Error> {
    let (Some(out), Some(path)) = (&opts.write_run, &opts.lengths) else {
        return Ok(None);
    };
    let mut text = format!(
        "# built by allocdoc forecast from {}: batch {batch}, seed {}, pad to {}\n",
        crate::ingest::input_name(path),
        opts.seed,
        opts.pad_to
    );
    for z in run {
        text.push_str(&z.to_string());
        text.push('\n');
    }
    std::fs::write(out, text)
        .map_err(|e| Error::Usage(format!("{}: cannot write the run: {e}", out.display())))?;
    Ok(Some(format!(
        "note: wrote the run ({} steps) to {}",
        run.len(),
        out.display()
    )))
}

pub fn run(opts: &ForecastOptions) -> Result<Outcome, Error> {
    run_with_progress(opts, &|_| {})
}

/// [`run`] with a progress callback (the binary draws it on standard error).
pub fn run_with_progress(
    opts: &ForecastOptions,
    progress: &(dyn Fn(Progress) + Sync),
) -> Result<Outcome, Error> {
    if opts.recordings.points.is_none() {
        super::fit::recorded_sizes(&opts.recordings.inputs, &opts.recordings.sizes)?;
    }
    if opts.write_run.is_some() && opts.lengths.is_none() {
        return Err(Error::Usage(
            "--write-run writes the run --lengths builds: give --lengths".into(),
        ));
    }
    let cap_step = opts.cap_step.unwrap_or(opts.pad_to);
    if cap_step == 0 {
        return Err(Error::Usage("--cap-step 0: the step is 1 or more".into()));
    }
    let batch = batch_arg(opts)?;
    match (&opts.recordings.points, batch) {
        (Some(_), None) => {
            return Err(Error::Usage(
                "with --points the run's sizes are the second knob's: give --batch N (the first knob's value) or --batch max".into(),
            ));
        }
        (Some(_), Some(BatchArg::Max)) if opts.capacity.is_none() => {
            return Err(Error::Usage(
                "--batch max finds the largest batch that carries the run on a card: give --capacity".into(),
            ));
        }
        (None, Some(BatchArg::Max)) => {
            return Err(Error::Usage(
                "--batch max searches the batch: it needs recordings at points of two knobs, the batch first (--points \"b,s;…\" --knobs batch,seq_len)".into(),
            ));
        }
        _ => {}
    }
    let (steps, search) = the_run(opts, batch)?;
    let given = if opts.confs.is_empty() {
        vec!["expandable_segments:True".to_string()]
    } else {
        opts.confs.clone()
    };
    let confs = super::fit::configs(&given)?;
    let (series, grid, knobs);
    let plan = match &opts.recordings.points {
        None => {
            series = super::fit::series(
                &opts.common,
                &opts.recordings.inputs,
                &opts.recordings.sizes,
            )?;
            knobs = None;
            RunPlan::new(&series)
        }
        Some(points) => {
            let (g, k) = super::fit::grid(
                &opts.common,
                &opts.recordings.inputs,
                points,
                opts.recordings.knobs.as_deref(),
            )?;
            grid = g;
            knobs = Some(k);
            let b = match batch {
                Some(BatchArg::Fixed(b)) => b,
                _ => 1,
            };
            RunPlan::on_grid(&grid, b)
        }
    };
    check_sizes(&plan, &steps, opts)?;
    let ask = ForecastAsk {
        steps,
        confs,
        capacity: opts.capacity,
        cap_step,
        memo_budget: if opts.no_skip { 0 } else { MEMO_BUDGET },
        knobs: knobs.clone(),
        search,
    };
    let result = forecast(&plan, &ask, progress);
    let run_note = match (&ask.search, result.batch) {
        (Some(search), Some(b)) => write_run(opts, &search.run(b), b)?,
        (None, _) => match batch {
            Some(BatchArg::Fixed(b)) => write_run(opts, &ask.steps, b)?,
            _ => None,
        },
        _ => None,
    };
    let knob =
        crate::report::forecast::Knob(knobs.as_ref().map_or(opts.knob.as_str(), |k| k.1.as_str()));
    let stdout = match opts.common.format {
        Format::Text => crate::report::forecast::text(&result, &knob),
        Format::Json | Format::Jsonl => crate::report::forecast::json_doc(&result, &knob),
        Format::Markdown => crate::report::forecast::markdown(&result, &knob),
    };
    let mut stderr: Vec<String> = run_note.into_iter().collect();
    if opts.confs.is_empty() {
        stderr.push(
            "note: no --conf given: the run is replayed under PyTorch's defaults and expandable_segments:True".into(),
        );
    }
    if let Some(path) = &opts.report {
        stderr.push(super::write_report(
            path,
            &crate::report::forecast::html(&result, &knob),
        )?);
    }
    // Exit 1: every config runs out of memory on the card.
    let oom = result.configs.iter().all(|c| c.oom.is_some());
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

/// Refuses a step whose laws predict more than any card holds.
fn check_sizes(plan: &RunPlan, steps: &[u64], opts: &ForecastOptions) -> Result<(), Error> {
    let Some(&largest) = steps.iter().max() else {
        return Ok(());
    };
    let peak = plan.peak_allocated_at(largest);
    if peak > MAX_BYTES {
        let source = opts
            .run
            .as_deref()
            .or(opts.lengths.as_deref())
            .unwrap_or("");
        return Err(Error::Input(format!(
            "{}: {} {largest}: the laws predict {} live at once, more than any card holds (1 PiB): a size outside what the recordings' laws can hold",
            crate::ingest::input_name(source),
            opts.knob,
            crate::units::human(peak)
        )));
    }
    Ok(())
}
