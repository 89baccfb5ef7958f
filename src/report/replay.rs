//! Rendering: replay.
