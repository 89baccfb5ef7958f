//! Rendering: recommend.
