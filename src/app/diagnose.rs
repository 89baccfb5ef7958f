//! The `diagnose` command: parse every input, run the rules, and render the
//! cause, the findings and one environment line.

use super::{Format, Outcome};
use crate::Error;
use crate::advise::{self, Context, Diagnosis};
use crate::evidence::Evidence;
use crate::rules::{RuleSet, VersionRange};
use std::path::PathBuf;

#[derive(Debug, Clone, Default)]
pub struct DiagnoseOptions {
    pub inputs: Vec<String>,
    pub format: Format,
    /// List rules that were not evaluated and why.
    pub verbose: bool,
    /// Extra rule files that add to or override the embedded ones.
    pub rules_dir: Option<PathBuf>,
    /// The user's PyTorch version when the evidence does not say.
    pub torch_version: Option<String>,
    /// The PYTORCH_CUDA_ALLOC_CONF in effect when the evidence was taken.
    pub conf: Option<String>,
    /// Write a self-contained HTML report here.
    pub report: Option<PathBuf>,
}

pub fn run(opts: &DiagnoseOptions) -> Result<Outcome, Error> {
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
    let evidence = read_inputs(&opts.inputs, &mut ctx)?;
    let d = advise::diagnose(evidence, &ctx, &rules);
    if let Some(path) = &opts.report {
        std::fs::write(
            path,
            crate::report::diagnose::html(&d, pictures(&opts.inputs)),
        )
        .map_err(|e| Error::Usage(format!("{}: cannot write the report: {e}", path.display())))?;
    }
    let mut out = Outcome::ok(render(&d, opts.format, opts.verbose));
    notes.extend(d.evidence.notes.iter().map(|n| format!("note: {n}")));
    out.stderr = notes;
    Ok(out)
}

/// The snapshot pickles among the inputs, read again for the report's
/// timeline and segment map (standard input was consumed by the diagnosis).
fn pictures(inputs: &[String]) -> crate::report::diagnose::Pictures {
    let mut pictures = crate::report::diagnose::Pictures::default();
    for name in inputs.iter().filter(|n| n.as_str() != "-") {
        let Ok(data) = crate::ingest::read_input(name) else {
            continue;
        };
        if crate::snapshot::is_pickle(&data)
            && let Ok(snap) = crate::snapshot::load(name, &data)
        {
            pictures.add_snapshot(name, &snap);
        }
    }
    pictures
}

pub fn render(d: &Diagnosis, format: Format, verbose: bool) -> String {
    match format {
        Format::Text => crate::report::diagnose::text(d, verbose),
        Format::Json => crate::report::diagnose::json(d),
        Format::Markdown => crate::report::diagnose::markdown(d),
    }
}

/// Reads each input once: `ingest` parses it and gathers the clues the
/// surrounding text gives (versions, configs, platform) on the same pass.
pub fn read_inputs(inputs: &[String], ctx: &mut Context) -> Result<Evidence, Error> {
    let mut clues = crate::evidence::TextClues::default();
    let evidence = crate::ingest::load_with(inputs, &crate::Limits::default(), &mut clues)?;
    ctx.absorb(&clues);
    Ok(evidence)
}
