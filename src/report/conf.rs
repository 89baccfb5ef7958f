//! Rendering: conf.
