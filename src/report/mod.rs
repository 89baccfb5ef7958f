//! Renders what the commands return: text (comfy-table), JSON, Markdown, HTML.
//! One file per command's output; shared helpers in `common`; the pictures of
//! an HTML report in `views`. Nothing here imports `app`.

pub mod common;
pub mod conf;
pub mod diagnose;
pub mod fit;
pub mod forecast;
pub mod grid;
pub mod html;
pub mod markdown;
pub mod parse;
pub mod ranks;
pub mod recommend;
pub mod replay;
pub mod rules;
pub mod svg;
pub mod top;
pub mod views;

/// Output format of every command (`--format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum Format {
    #[default]
    Text,
    Json,
    Markdown,
    /// JSON, one document a line.
    Jsonl,
}

impl Format {
    /// Either JSON format: the renderers write the same document for both.
    pub fn is_json(self) -> bool {
        matches!(self, Format::Json | Format::Jsonl)
    }

    /// A rendered output in its final form: `jsonl` puts the document on one line.
    pub fn finish(self, out: String) -> String {
        match self {
            Format::Jsonl => common::one_line(&out),
            _ => out,
        }
    }
}
