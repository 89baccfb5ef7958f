//! The library's top-level error and the one exit-code table every command
//! follows (`shared/spec/cli-contract.md`'s codes 0–3, its planned 4, and 5
//! for nothing to replay), the table README.md, docs/json.md and every
//! command's `--help` ([`EXIT_CODES_HELP`]) print.

use thiserror::Error;

/// The answer holds and is proven or likely (a config runs without OOM; the
/// value is valid; every rule case passed).
pub const EXIT_OK: i32 = 0;
/// Every config tried (the candidate, for `validate`) still runs out of
/// memory; an invalid value; a failed rule case.
pub const EXIT_STILL_OOM: i32 = 1;
/// Exit code for usage errors and unreadable or invalid input.
pub const EXIT_INPUT: i32 = 2;
/// Exit code when `--device cuda` was asked for but no usable driver/GPU exists.
pub const EXIT_NO_DEVICE: i32 = 3;
/// The verdict rests on uncertain evidence; the output says why.
pub const EXIT_UNCERTAIN: i32 = 4;
/// `validate`/`recommend`: the input holds nothing to replay (a snapshot
/// without a trace, text without figures to fit a workload to); the rules'
/// answer alone is printed.
pub const EXIT_NOTHING_TO_REPLAY: i32 = 5;

/// The table as every command's `--help` ends.
pub const EXIT_CODES_HELP: &str = "Exit codes:
  0  the answer holds and is proven or likely (validate/recommend: the config runs without OOM)
  1  every config still runs out of memory (validate: the candidate does); conf check: invalid
  2  bad usage or an unreadable or invalid input
  3  --device cuda without a usable CUDA driver or GPU
  4  validate/recommend: the verdict is uncertain (the Evidence line says why)
  5  validate/recommend: nothing to replay (the rules' answer alone is printed)";

#[derive(Debug, Error)]
pub enum Error {
    /// Unreadable or invalid input: the message names the file, the line or
    /// byte offset, and what was expected.
    #[error("{0}")]
    Input(String),
    /// Bad command-line usage that clap could not catch.
    #[error("{0}")]
    Usage(String),
    /// A CUDA device was requested but cannot be used.
    #[error("{0}")]
    NoDevice(String),
}

impl Error {
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Input(_) | Error::Usage(_) => EXIT_INPUT,
            Error::NoDevice(_) => EXIT_NO_DEVICE,
        }
    }
}
