//! The `diagnose` command: parse every input, run the rules, and render the
//! cause, the findings and one environment line.

use super::{Format, Outcome};
use crate::Error;
use crate::advise::{self, Context, Diagnosis};
use crate::evidence::Evidence;
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
    /// The platform PyTorch runs on (default: what the evidence shows, else linux).
    #[cfg_attr(feature = "cli", arg(long, value_enum))]
    pub platform: Option<crate::conf::Platform>,
    /// The PYTORCH_CUDA_ALLOC_CONF in effect when the OOM happened (read from the text when it shows one).
    #[cfg_attr(feature = "cli", arg(long))]
    pub conf: Option<String>,
    /// Also write a self-contained HTML report.
    #[cfg_attr(feature = "cli", arg(long))]
    pub report: Option<PathBuf>,
    /// Output format.
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value_t, global = true))]
    pub format: Format,
    /// How much one input may make allocdoc read and hold.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub limits: crate::limits::Limits,
}

pub fn run(opts: &DiagnoseOptions) -> Result<Outcome, Error> {
    let rules = RuleSet::with_dir(opts.rules_dir.as_deref())?;
    let mut ctx = context(opts.torch_version.as_deref(), opts.platform)?;
    let mut notes = Vec::new();
    if let Some(c) = &opts.conf
        && let Err(why) = ctx.set_current(c, "--conf")
    {
        notes.push(format!("allocdoc: warning: {why}"));
    }
    let evidence = read_inputs(&opts.inputs, &opts.limits, &mut ctx)?;
    let d = diagnose(evidence, &ctx, &rules, &opts.limits);
    if let Some(path) = &opts.report {
        std::fs::write(
            path,
            crate::report::diagnose::html(&d, pictures(&opts.inputs, &opts.limits)),
        )
        .map_err(|e| Error::Usage(format!("{}: cannot write the report: {e}", path.display())))?;
    }
    let mut out = Outcome::ok(render(&d, opts.format, opts.verbose));
    notes.extend(d.evidence.notes.iter().map(|n| format!("note: {n}")));
    out.stderr = notes;
    Ok(out)
}

/// The diagnosis every command starts from (`recommend` and `validate` too):
/// the snapshot whose trace the trace rules read checks their settings by
/// replay, read again when a check is asked for, as for the report.
pub fn diagnose(
    evidence: Evidence,
    ctx: &Context,
    rules: &RuleSet,
    limits: &crate::limits::Limits,
) -> Diagnosis {
    let traced = advise::facts::trace_source(&evidence).map(|o| o.input.clone());
    let mut checker = traced.map(|name| TraceChecker::new(&name, *limits));
    let mut check = |facts: &_, settings: &_| match &mut checker {
        Some(c) => c.check(facts, settings),
        None => Err("no snapshot with a trace among the inputs".to_string()),
    };
    advise::diagnose_checked(evidence, ctx, rules, Some(&mut check))
}

/// The snapshot pickles among the inputs, read again for the report's
/// timeline and segment map (standard input was consumed by the diagnosis).
fn pictures(inputs: &[String], limits: &crate::limits::Limits) -> ReportViews {
    let mut views = ReportViews::of_snapshots();
    for name in inputs.iter().filter(|n| n.as_str() != "-") {
        let Ok(data) = crate::ingest::read_input_with(name, limits) else {
            continue;
        };
        if crate::snapshot::is_pickle(&data)
            && let Ok(snap) = crate::snapshot::load_with(name, &data, limits)
        {
            views.add_snapshot(name, &snap);
        }
    }
    views
}

pub fn render(d: &Diagnosis, format: Format, verbose: bool) -> String {
    match format {
        Format::Text => crate::report::diagnose::text(d, verbose),
        Format::Json => crate::report::diagnose::json(d),
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
    limits: &crate::limits::Limits,
    ctx: &mut Context,
) -> Result<(crate::ingest::Bytes, Evidence), Error> {
    let data = crate::ingest::read_input_with(name, limits)?;
    let mut clues = crate::evidence::TextClues::default();
    let ev = crate::ingest::parse_with_clues(name, &data, limits, &mut clues)?;
    ctx.absorb(&clues);
    Ok((data, ev))
}

/// Reads each input once: `ingest` parses it and gathers the clues the
/// surrounding text gives (versions, configs, platform) on the same pass.
pub fn read_inputs(
    inputs: &[String],
    limits: &crate::limits::Limits,
    ctx: &mut Context,
) -> Result<Evidence, Error> {
    let mut clues = crate::evidence::TextClues::default();
    let evidence = crate::ingest::load_with(inputs, limits, &mut clues)?;
    ctx.absorb(&clues);
    Ok(evidence)
}
