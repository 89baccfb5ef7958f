//! Rendering: parse.
