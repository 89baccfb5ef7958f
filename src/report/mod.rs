//! Renders what the commands return: text (comfy-table), JSON, Markdown, HTML.
//! One file per command's output; shared helpers in `common`.

pub mod common;
pub mod conf;
pub mod diagnose;
pub mod html;
pub mod markdown;
pub mod parse;
pub mod ranks;
pub mod recommend;
pub mod replay;
pub mod rules;
pub mod svg;
