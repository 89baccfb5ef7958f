//! The `parse` command: read every input and show the evidence found, nothing inferred.

use super::{Format, Outcome};
use crate::Error;
use crate::{ingest, report};

#[derive(Debug, Clone, Default)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct ParseOptions {
    /// Inputs; `-` or nothing reads standard input.
    pub inputs: Vec<String>,
    /// Output format.
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value_t, global = true))]
    pub format: Format,
    /// How much one input may make allocdoc read and hold.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub limits: crate::limits::Limits,
}

pub fn run(opts: &ParseOptions) -> Result<Outcome, Error> {
    let clues = &mut crate::evidence::TextClues::default();
    let ev = ingest::load_with(&opts.inputs, &opts.limits, clues)?;
    let mut out = Outcome::ok(report::parse::render(&ev, &opts.inputs, opts.format));
    // In JSON the notes cannot go to stdout (the contract fixes its shape).
    if opts.format == Format::Json {
        out.stderr = ev.notes.iter().map(|n| format!("note: {n}")).collect();
    }
    Ok(out)
}
