//! Findings, the cause, the combined recommendation, and the config search.
pub mod search;
