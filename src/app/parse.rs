//! The `parse` command: read every input and show the evidence found, nothing inferred.

use super::{Format, Outcome};
use crate::Error;
use crate::{ingest, report};

#[derive(Debug, Clone, Default)]
pub struct ParseOptions {
    /// Paths (or `-` for standard input); empty means standard input.
    pub inputs: Vec<String>,
    pub format: Format,
}

pub fn run(opts: &ParseOptions) -> Result<Outcome, Error> {
    let ev = ingest::load(&opts.inputs)?;
    let mut out = Outcome::ok(report::parse::render(&ev, &opts.inputs, opts.format));
    // In JSON the notes cannot go to stdout (the contract fixes its shape).
    if opts.format == Format::Json {
        out.stderr = ev.notes.iter().map(|n| format!("note: {n}")).collect();
    }
    Ok(out)
}
