//! The `diagnose` command: parse every input, run the rules, and render the
//! cause, the findings and one environment line.

use super::{Format, Outcome};
use crate::Error;
use crate::advise::{self, Context, Diagnosis};
use crate::evidence::Evidence;
use crate::limits::Limits;
use crate::report::views::ReportViews;
use crate::rules::{RuleSet, VersionRange};
use std::path::PathBuf;

#[derive(Debug, Clone, Default)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct DiagnoseOptions {
    /// Logs, memory_summary()/memory_stats() dumps, snapshot pickles or traces; `-` or nothing reads standard input.
    pub inputs: Vec<String>,
    /// Also list rules that could not be evaluated and what they need.
    #[cfg_attr(feature = "cli", arg(short, long))]
    pub verbose: bool,
    /// A directory of extra YAML rules that add to or override the built-in ones.
    #[cfg_attr(feature = "cli", arg(long = "rules", value_name = "RULES"))]
    pub rules_dir: Option<PathBuf>,
    /// Your PyTorch version (e.g. 2.4) when the evidence does not show it.
    #[cfg_attr(feature = "cli", arg(long))]
    pub torch_version: Option<String>,
    /// The PYTORCH_CUDA_ALLOC_CONF in effect when the OOM happened (read from the text when it shows one).
    #[cfg_attr(feature = "cli", arg(long))]
    pub conf: Option<String>,
    /// The platform the OOM happened on (default: what the evidence shows, such
    /// as Windows paths; Windows has no expandable segments).
    #[cfg_attr(feature = "cli", arg(long, value_enum))]
    pub platform: Option<Platform>,
    /// Also write a self-contained HTML report.
    #[cfg_attr(feature = "cli", arg(long, conflicts_with = "each"))]
    pub report: Option<PathBuf>,
    /// Every input its own incident: directories walked, one result per file
    /// (with --format jsonl, one JSON line naming the file), files run in parallel.
    #[cfg_attr(feature = "cli", arg(long))]
    pub each: bool,
    /// Inputs already in memory, by name (the Python API); not on the command line.
    #[cfg_attr(feature = "cli", arg(skip))]
    pub buffers: super::Buffers,
    /// Output format.
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value_t, global = true))]
    pub format: Format,
    /// How much one input may make allocdoc read and hold.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub limits: Limits,
}

/// Where the OOM happened (`--platform`); it overrides what the text suggests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum Platform {
    Linux,
    Windows,
}

impl std::str::FromStr for Platform {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "linux" => Ok(Platform::Linux),
            "windows" => Ok(Platform::Windows),
            _ => Err(Error::Usage(format!(
                "--platform {s:?}: expected linux or windows"
            ))),
        }
    }
}

/// What every incident of one run shares: the rules and what the flags say.
struct Setup {
    rules: RuleSet,
    ctx: Context,
    platform: Option<Platform>,
    /// Warnings about the flags, for standard error.
    notes: Vec<String>,
}

impl Setup {
    fn new(opts: &DiagnoseOptions) -> Result<Setup, Error> {
        let rules = RuleSet::with_dir(opts.rules_dir.as_deref())?;
        let mut ctx = Context::default();
        if let Some(v) = &opts.torch_version {
            let v = crate::conf::TorchVersion::parse(v).map_err(|e| Error::Usage(e.to_string()))?;
            ctx.torch = Some(VersionRange::exact(v));
        }
        let mut notes = Vec::new();
        if let Some(c) = &opts.conf
            && let Err(why) = ctx.set_current(c, "--conf")
        {
            notes.push(format!("allocdoc: warning: {why}"));
        }
        Ok(Setup {
            rules,
            ctx,
            platform: opts.platform,
            notes,
        })
    }

    /// One incident: `inputs` read together.
    fn diagnose(&self, inputs: &[String], opts: &DiagnoseOptions) -> Result<Diagnosis, Error> {
        let mut ctx = self.ctx.clone();
        let evidence = read_inputs(inputs, &opts.buffers, &opts.limits, &mut ctx)?;
        if let Some(p) = self.platform {
            ctx.windows = p == Platform::Windows;
        }
        Ok(advise::diagnose(evidence, &ctx, &self.rules))
    }
}

pub fn run(opts: &DiagnoseOptions) -> Result<Outcome, Error> {
    let setup = Setup::new(opts)?;
    if opts.each {
        let mut out = super::each::run(&opts.inputs, opts.format, |name| {
            let d = setup.diagnose(&[name.to_owned()], opts)?;
            let stdout = match opts.format {
                Format::Json | Format::Jsonl => crate::report::common::json_of(
                    name,
                    &crate::report::diagnose::document(&d),
                    opts.format == Format::Jsonl,
                ),
                _ => render(&d, opts.format, opts.verbose),
            };
            Ok(super::each::Done {
                stdout,
                notes: notes(&d),
            })
        });
        out.stderr.splice(0..0, setup.notes);
        return Ok(out);
    }
    let mut notes = setup.notes.clone();
    let d = setup.diagnose(&opts.inputs, opts)?;
    if let Some(path) = &opts.report {
        let html = crate::report::diagnose::html(&d, pictures(opts));
        notes.push(super::write_report(path, &html)?);
    }
    let mut out = Outcome::ok(opts.format.finish(render(&d, opts.format, opts.verbose)));
    notes.extend(self::notes(&d));
    out.stderr = notes;
    Ok(out)
}

fn notes(d: &Diagnosis) -> Vec<String> {
    d.evidence
        .notes
        .iter()
        .map(|n| format!("note: {n}"))
        .collect()
}

/// The snapshot pickles among the inputs, read again for the report's
/// timeline and segment map (standard input was consumed by the diagnosis).
fn pictures(opts: &DiagnoseOptions) -> ReportViews {
    let mut views = ReportViews::of_snapshots();
    for name in opts.inputs.iter().filter(|n| n.as_str() != "-") {
        let Ok(data) = opts.buffers.read(name, &opts.limits) else {
            continue;
        };
        if crate::snapshot::is_pickle(&data)
            && let Ok(snap) = crate::snapshot::load_with(name, &data, &opts.limits)
        {
            views.add_snapshot(name, &snap);
        }
    }
    views
}

pub fn render(d: &Diagnosis, format: Format, verbose: bool) -> String {
    match format {
        Format::Text => crate::report::diagnose::text(d, verbose),
        Format::Json | Format::Jsonl => crate::report::diagnose::json(d),
        Format::Markdown => crate::report::diagnose::markdown(d),
    }
}

/// Reads each input once: `ingest` parses it and gathers the clues the
/// surrounding text gives (versions, configs, platform) on the same pass.
pub fn read_inputs(
    inputs: &[String],
    buffers: &super::Buffers,
    limits: &Limits,
    ctx: &mut Context,
) -> Result<Evidence, Error> {
    let mut clues = crate::evidence::TextClues::default();
    let evidence =
        crate::ingest::load_from(inputs, limits, &mut clues, |name, l| buffers.open(name, l))?;
    ctx.absorb(&clues);
    Ok(evidence)
}
