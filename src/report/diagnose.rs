//! Rendering: diagnose.
