//! Rendering: html.
