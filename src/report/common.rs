//! Rendering: common.
