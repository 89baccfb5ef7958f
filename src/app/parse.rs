//! The `parse` command: read every input and show the evidence found, nothing inferred.

use super::{Format, Outcome};
use crate::Error;
use crate::{ingest, report};

#[derive(Debug, Clone, Default)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct ParseOptions {
    /// Inputs; `-` or nothing reads standard input.
    pub inputs: Vec<String>,
    /// Every input its own result: directories walked, one result per file
    /// (with --format jsonl, one JSON line naming the file), files run in parallel.
    #[cfg_attr(feature = "cli", arg(long))]
    pub each: bool,
    /// The output format, the inputs' limits, inputs held in memory.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub common: super::Common,
}

pub fn run(opts: &ParseOptions) -> Result<Outcome, Error> {
    // Clues about the environment are for diagnose; parse shows the evidence alone.
    let load = |inputs: &[String]| {
        let clues = &mut crate::evidence::TextClues::default();
        ingest::load_evidence(inputs, &opts.common.limits, clues, |name, limits| {
            opts.common.buffers.open(name, limits)
        })
    };
    if opts.each {
        return Ok(super::each::run(&opts.inputs, opts.common.format, |name| {
            let inputs = [name.to_owned()];
            let ev = load(&inputs)?;
            let stdout = match opts.common.format {
                Format::Json | Format::Jsonl => report::common::json_of(
                    name,
                    &report::parse::document(&ev),
                    opts.common.format == Format::Jsonl,
                ),
                _ => report::parse::render(&ev, &inputs, opts.common.format),
            };
            Ok(super::each::Done {
                stdout,
                notes: json_notes(&ev, opts.common.format),
            })
        }));
    }
    let ev = load(&opts.inputs)?;
    let rendered = report::parse::render(&ev, &opts.inputs, opts.common.format);
    let mut out = Outcome::ok(opts.common.format.finish(rendered));
    out.stderr = json_notes(&ev, opts.common.format);
    Ok(out)
}

/// In JSON the notes cannot go to stdout (the contract fixes its shape): they
/// go to standard error; text and Markdown show them with the evidence.
fn json_notes(ev: &crate::evidence::Evidence, format: Format) -> Vec<String> {
    if format.is_json() {
        ev.notes.iter().map(|n| format!("note: {n}")).collect()
    } else {
        Vec::new()
    }
}
