//! The `diagnose` command: parse every input, run the rules, and render the
//! cause, the findings and one environment line.

use super::{Format, Outcome};
use crate::Error;
use crate::advise::{self, Context, Diagnosis};
use crate::evidence::Evidence;
use crate::limits::Limits;
use crate::report::views::ReportViews;
use crate::rules::RuleSet;
use crate::trial::trace_check::TraceChecker;
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
    /// The platform PyTorch runs on (default: what the evidence shows, such as
    /// Windows paths, else linux); the flag overrides what the text suggests.
    #[cfg_attr(feature = "cli", arg(long, value_enum))]
    pub platform: Option<crate::conf::Platform>,
    /// The PYTORCH_CUDA_ALLOC_CONF in effect when the OOM happened (read from the text when it shows one).
    #[cfg_attr(feature = "cli", arg(long))]
    pub conf: Option<String>,
    /// Also write a self-contained HTML report.
    #[cfg_attr(feature = "cli", arg(long, conflicts_with = "each"))]
    pub report: Option<PathBuf>,
    /// Every input its own incident: directories walked, one result per file
    /// (with --format jsonl, one JSON line naming the file), files run in parallel.
    #[cfg_attr(feature = "cli", arg(long))]
    pub each: bool,
    /// The output format, the inputs' limits, inputs held in memory.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub common: super::Common,
}

/// What every incident of one run shares: the rules and what the flags say.
struct Shared {
    rules: RuleSet,
    ctx: Context,
    /// Warnings about the flags, for standard error.
    notes: Vec<String>,
}

impl Shared {
    fn new(opts: &DiagnoseOptions) -> Result<Shared, Error> {
        let rules = RuleSet::with_dir(opts.rules_dir.as_deref())?;
        let mut ctx = context(opts.torch_version.as_deref(), opts.platform)?;
        let mut notes = Vec::new();
        if let Some(c) = &opts.conf
            && let Err(why) = ctx.set_current(c, "--conf")
        {
            notes.push(format!("allocdoc: warning: {why}"));
        }
        Ok(Shared { rules, ctx, notes })
    }

    /// One incident: `inputs` read together.
    fn diagnose(&self, inputs: &[String], opts: &DiagnoseOptions) -> Result<Diagnosis, Error> {
        let mut ctx = self.ctx.clone();
        let evidence = read_inputs(inputs, &opts.common.buffers, &opts.common.limits, &mut ctx)?;
        Ok(diagnose(
            evidence,
            &ctx,
            &self.rules,
            (&opts.common.buffers, &opts.common.limits),
        ))
    }
}

pub fn run(opts: &DiagnoseOptions) -> Result<Outcome, Error> {
    let shared = Shared::new(opts)?;
    if opts.each {
        let mut out = super::each::run(&opts.inputs, opts.common.format, |name| {
            let d = shared.diagnose(&[name.to_owned()], opts)?;
            let stdout = match opts.common.format {
                Format::Json | Format::Jsonl => crate::report::common::json_of(
                    name,
                    &crate::report::diagnose::document(&d),
                    opts.common.format == Format::Jsonl,
                ),
                _ => render(&d, opts.common.format, opts.verbose),
            };
            Ok(super::each::Done {
                stdout,
                notes: notes(&d),
            })
        });
        out.stderr.splice(0..0, shared.notes);
        return Ok(out);
    }
    let mut notes = shared.notes.clone();
    let d = shared.diagnose(&opts.inputs, opts)?;
    if let Some(path) = &opts.report {
        let html = crate::report::diagnose::html(&d, pictures(opts));
        notes.push(super::write_report(path, &html)?);
    }
    let mut out = Outcome::ok(opts.common.format.finish(render(
        &d,
        opts.common.format,
        opts.verbose,
    )));
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

/// The diagnosis every command starts from (`recommend` and `validate` too):
/// the snapshot whose trace the trace rules read checks their settings by
/// replay, read again when a check is asked for, as for the report.
pub fn diagnose(
    evidence: Evidence,
    ctx: &Context,
    rules: &RuleSet,
    (buffers, limits): (&super::Buffers, &Limits),
) -> Diagnosis {
    let traced = advise::facts::trace_source(&evidence).map(|o| o.input.clone());
    let mut checker = traced.map(|name| TraceChecker::new(&name, buffers.clone(), *limits));
    let mut check = |facts: &_, settings: &_| match &mut checker {
        Some(c) => c.check(facts, settings),
        None => Err("no snapshot with a trace among the inputs".to_string()),
    };
    advise::diagnose_checked(evidence, ctx, rules, Some(&mut check))
}

/// The snapshot pickles among the inputs, read again for the report's
/// timeline and segment map (standard input was consumed by the diagnosis).
fn pictures(opts: &DiagnoseOptions) -> ReportViews {
    let mut views = ReportViews::of_snapshots();
    for name in opts.inputs.iter().filter(|n| n.as_str() != "-") {
        let Ok(data) = opts.common.buffers.read(name, &opts.common.limits) else {
            continue;
        };
        if crate::ingest::detect(&data) == crate::ingest::InputKind::Pickle
            && let Ok(snap) = crate::snapshot::load_with(name, &data, &opts.common.limits)
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

/// The context of a command's flags: `--torch-version` and `--platform`
/// (which win over every clue the text holds).
pub fn context(
    torch_version: Option<&str>,
    platform: Option<crate::conf::Platform>,
) -> Result<Context, Error> {
    let mut ctx = Context::default();
    if let Some(v) = torch_version {
        let v = crate::conf::TorchVersion::parse(v)
            .map_err(|e| Error::Usage(format!("--torch-version: {e}")))?;
        ctx.torch = Some(crate::rules::VersionRange::exact(v));
        ctx.flags.torch = Some(v);
    }
    ctx.flags.platform = platform;
    Ok(ctx)
}

/// Reads one whole input (kept: `recommend` and `validate` replay it), and
/// parses its evidence and the clues its text gives on the same pass.
pub fn read_one(
    name: &str,
    buffers: &super::Buffers,
    limits: &Limits,
    ctx: &mut Context,
) -> Result<(crate::ingest::Bytes, Evidence), Error> {
    let data = buffers.read(name, limits)?;
    let mut clues = crate::evidence::TextClues::default();
    let ev = crate::ingest::parse_with_clues(name, &data, limits, &mut clues)?;
    ctx.absorb(&clues);
    Ok((data, ev))
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
