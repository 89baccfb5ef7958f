//! Why decoding stopped: [`DecodeError`], and the boxed form the decoder
//! passes around inside (a pointer-sized `Err` keeps hot results in
//! registers).

use thiserror::Error;

/// Why decoding stopped.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    #[error(
        "byte {offset}: opcode {opcode} would call {callable}; this file holds code, not data, and is refused (nothing was run)"
    )]
    Code {
        offset: usize,
        opcode: &'static str,
        callable: String,
    },
    #[error("byte {offset}: input ends inside {what}")]
    Truncated { offset: usize, what: &'static str },
    #[error("byte {offset}: unknown opcode 0x{opcode:02x}")]
    UnknownOpcode { offset: usize, opcode: u8 },
    #[error("byte {offset}: unsupported pickle protocol {protocol} (0 to 5 are known)")]
    Protocol { offset: usize, protocol: u8 },
    #[error("byte {offset}: {opcode}: {problem}")]
    Malformed {
        offset: usize,
        opcode: &'static str,
        problem: String,
    },
    #[error("byte {offset}: {what} exceeds the decoder's limit of {limit}")]
    Limit {
        offset: usize,
        what: &'static str,
        limit: u64,
    },
    /// The system refused memory the input asked for (never an abort).
    #[error(
        "byte {offset}: not enough memory for the {what} (the system refused {bytes} more bytes)"
    )]
    Memory {
        offset: usize,
        what: &'static str,
        bytes: usize,
    },
}

impl DecodeError {
    /// The byte offset the error refers to.
    pub fn offset(&self) -> usize {
        match self {
            DecodeError::Code { offset, .. }
            | DecodeError::Truncated { offset, .. }
            | DecodeError::UnknownOpcode { offset, .. }
            | DecodeError::Protocol { offset, .. }
            | DecodeError::Malformed { offset, .. }
            | DecodeError::Limit { offset, .. }
            | DecodeError::Memory { offset, .. } => *offset,
        }
    }
}

/// Errors inside the decoder are boxed: a pointer-sized `Err` keeps every
/// hot `Result` in registers.
pub(super) type Fail = Box<DecodeError>;
pub(super) type Res<T> = Result<T, Fail>;
