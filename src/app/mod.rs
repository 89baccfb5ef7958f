//! One function per command. Each takes its options struct, which is also
//! the command line's definition (clap derive, with the `cli` feature: the
//! binary parses straight into it), runs the pipeline below (`advise`,
//! `trial`), hands the result to `report` and returns an [`Outcome`]: the
//! rendered output and the exit code. Nothing here prints.

pub mod conf_check;
pub mod diagnose;
pub mod diff;
pub mod each;
pub mod fit;
pub mod forecast;
pub mod input;
pub mod parse;
pub mod recommend;
pub mod replay;
pub mod rules_cmd;
pub mod top;
pub mod validate;

pub use crate::report::Format;

use crate::Error;
pub use crate::ingest::Buffers;

/// Writes an HTML report (`--report`) and returns the note that says where.
pub(crate) fn write_report(path: &std::path::Path, html: &str) -> Result<String, Error> {
    std::fs::write(path, html)
        .map_err(|e| Error::Usage(format!("{}: cannot write the report: {e}", path.display())))?;
    Ok(format!("note: wrote the HTML report {}", path.display()))
}

/// What every command that reads inputs takes besides its own flags: the
/// output format, how much one input may make allocdoc read and hold, and
/// the inputs a caller already holds in memory.
#[derive(Debug, Clone, Default)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct Common {
    /// Inputs already in memory, by name (the Python API); not on the command line.
    #[cfg_attr(feature = "cli", arg(skip))]
    pub buffers: Buffers,
    /// Output format.
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value_t, global = true))]
    pub format: Format,
    /// How much one input may make allocdoc read and hold.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub limits: crate::limits::Limits,
}

/// What a command produced: text for standard output, notes for standard
/// error, and the exit code the contract assigns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    pub stdout: String,
    pub stderr: Vec<String>,
    pub exit_code: i32,
}

impl Outcome {
    pub fn ok(stdout: String) -> Self {
        Outcome {
            stdout,
            stderr: Vec::new(),
            exit_code: 0,
        }
    }
}
