//! The library's top-level error and its mapping onto the CLI exit codes of
//! `shared/spec/cli-contract.md`.

use thiserror::Error;

/// Exit code for usage errors and unreadable or invalid input.
pub const EXIT_INPUT: i32 = 2;
/// Exit code when `--device cuda` was asked for but no usable driver/GPU exists.
pub const EXIT_NO_DEVICE: i32 = 3;

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
