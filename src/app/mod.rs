//! One function per command. Each takes plain option structs (filled by the
//! binary from the command line), does the work through the other modules and
//! returns an [`Outcome`]: the rendered output and the exit code. Nothing here
//! prints.

pub mod conf_check;
pub mod diagnose;
pub mod parse;
pub mod recommend;
pub mod replay;
pub mod rules_cmd;
pub mod validate;

/// Output format of every command (`--format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    #[default]
    Text,
    Json,
    Markdown,
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
