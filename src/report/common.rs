//! Rendering helpers every command's output shares: a [`Grid`] (a titled table
//! rendered as a comfy-table for text or as a Markdown table), JSON, and the
//! cell formatting of sizes and optional values.

use comfy_table::{Cell, CellAlignment, ContentArrangement, Table, presets};
use serde::Serialize;
use std::fmt::Display;
use std::sync::atomic::{AtomicU16, Ordering};

/// Width text tables are laid out for when no terminal says otherwise (piped
/// output, CI logs, tests): wide enough for the summary tables, stable.
pub const TEXT_WIDTH: u16 = 120;

/// Narrowest and widest layout accepted from a terminal: below 60 columns the
/// tables stop being readable, beyond 200 lines get too long to follow.
const WIDTH_RANGE: std::ops::RangeInclusive<u16> = 60..=200;

static WIDTH: AtomicU16 = AtomicU16::new(TEXT_WIDTH);

/// Lays text tables out for a terminal `columns` wide (the binary calls this
/// when standard output is a terminal), clamped to a readable range.
pub fn set_text_width(columns: u16) {
    WIDTH.store(
        columns.clamp(*WIDTH_RANGE.start(), *WIDTH_RANGE.end()),
        Ordering::Relaxed,
    );
}

/// The width text tables are laid out for: [`TEXT_WIDTH`] unless
/// [`set_text_width`] was called.
pub fn text_width() -> u16 {
    WIDTH.load(Ordering::Relaxed)
}

/// Placeholder for a value the evidence does not state.
pub const ABSENT: &str = "—";

/// A titled table, rendered the same way in text and Markdown.
#[derive(Debug, Clone, Default)]
pub struct Grid {
    pub title: String,
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
    /// Columns holding numbers (right-aligned in text).
    pub numeric: Vec<usize>,
}

impl Grid {
    pub fn new(title: impl Into<String>, header: &[&str]) -> Self {
        Grid {
            title: title.into(),
            header: header.iter().map(|h| (*h).to_owned()).collect(),
            ..Grid::default()
        }
    }

    /// Marks columns as numeric.
    pub fn numeric(mut self, cols: &[usize]) -> Self {
        self.numeric = cols.to_vec();
        self
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// Drops the columns (after the first) in which no row states a value.
    pub fn drop_empty_columns(mut self) -> Self {
        let keep: Vec<bool> = (0..self.header.len())
            .map(|i| {
                i == 0
                    || self
                        .rows
                        .iter()
                        .any(|r| r.get(i).is_some_and(|c| c != ABSENT))
            })
            .collect();
        let filter = |v: &mut Vec<String>| {
            let mut i = 0;
            v.retain(|_| {
                i += 1;
                keep.get(i - 1).copied().unwrap_or(true)
            });
        };
        filter(&mut self.header);
        self.rows.iter_mut().for_each(filter);
        let mut new_index = 0;
        let mut numeric = Vec::new();
        for (i, k) in keep.iter().enumerate() {
            if *k {
                if self.numeric.contains(&i) {
                    numeric.push(new_index);
                }
                new_index += 1;
            }
        }
        self.numeric = numeric;
        self
    }

    /// Title line, then a comfy-table (UTF-8 borders, no colour, stable layout).
    pub fn to_text(&self) -> String {
        let mut t = Table::new();
        t.load_style(presets::UTF8_FULL_CONDENSED)
            .force_no_tty()
            .set_content_arrangement(ContentArrangement::Dynamic)
            .set_width(text_width())
            .set_header(self.header.iter().map(Cell::new));
        for r in &self.rows {
            t.add_row(r.iter().enumerate().map(|(i, c)| {
                let cell = Cell::new(c);
                if self.numeric.contains(&i) {
                    cell.set_alignment(CellAlignment::Right)
                } else {
                    cell
                }
            }));
        }
        let mut s = String::new();
        if !self.title.is_empty() {
            s.push_str(&self.title);
            s.push('\n');
        }
        s.push_str(&t.to_string());
        s.push('\n');
        s
    }

    /// `### title` and a GitHub-flavoured Markdown table.
    pub fn to_markdown(&self) -> String {
        let mut s = String::new();
        if !self.title.is_empty() {
            s.push_str(&format!("### {}\n\n", markdown_escape(&self.title)));
        }
        s.push_str(&markdown_table(&self.header, &self.rows, &self.numeric));
        s
    }
}

/// Escapes what would break a Markdown table cell or heading.
pub fn markdown_escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('|', "\\|")
        .replace('\n', " ")
        .replace('<', "&lt;")
}

/// A Markdown table; `numeric` columns are right-aligned.
pub fn markdown_table(header: &[String], rows: &[Vec<String>], numeric: &[usize]) -> String {
    let line = |cells: &mut dyn Iterator<Item = String>| {
        let mut s = String::from("|");
        for c in cells {
            s.push(' ');
            s.push_str(&c);
            s.push_str(" |");
        }
        s.push('\n');
        s
    };
    let mut out = line(&mut header.iter().map(|h| markdown_escape(h)));
    out.push_str(&line(&mut (0..header.len()).map(|i| {
        if numeric.contains(&i) { "---:" } else { "---" }.to_owned()
    })));
    for r in rows {
        out.push_str(&line(&mut r.iter().map(|c| markdown_escape(c))));
    }
    out
}

/// The version of the JSON documents (docs/json.md). It goes up when a
/// documented field changes meaning or type or goes away; new fields leave it.
pub const SCHEMA_VERSION: u32 = 1;

/// A JSON document: `schema_version` first, the input it is about (with
/// `--each`), then the fields of `body`.
#[derive(Serialize)]
struct Document<'a, T: ?Sized> {
    schema_version: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    input: Option<&'a str>,
    #[serde(flatten)]
    body: &'a T,
}

/// A JSON document (`value`'s fields after `schema_version`), pretty, with a
/// trailing newline. Every command's JSON output is written here.
pub fn json<T: Serialize + ?Sized>(value: &T) -> String {
    document(None, value, false)
}

/// One input's document of an `--each` run: `input` after `schema_version`;
/// on one line for `jsonl`.
pub fn json_of<T: Serialize + ?Sized>(input: &str, value: &T, one_line: bool) -> String {
    document(Some(input), value, one_line)
}

fn document<T: Serialize + ?Sized>(input: Option<&str>, body: &T, one_line: bool) -> String {
    let doc = Document {
        schema_version: SCHEMA_VERSION,
        input,
        body,
    };
    let written = if one_line {
        serde_json::to_string(&doc)
    } else {
        serde_json::to_string_pretty(&doc)
    };
    let mut s = written.unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    s.push('\n');
    s
}

/// Pretty JSON on one line, with a trailing newline: the whitespace between
/// tokens dropped, strings kept as they are (so field order is kept too).
pub fn one_line(pretty: &str) -> String {
    let mut out = String::with_capacity(pretty.len());
    let (mut in_string, mut escaped) = (false, false);
    for c in pretty.chars() {
        if in_string {
            out.push(c);
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
        } else if c == '"' {
            in_string = true;
            out.push(c);
        } else if !c.is_ascii_whitespace() {
            out.push(c);
        }
    }
    out.push('\n');
    out
}

/// A size an input states, as PyTorch's messages print it
/// ([`crate::units::format_size`]: "186.00 MiB", "1024.00 MiB", "3421.00 GiB",
/// "512 bytes"), so each figure reads as in the log it came from, and alike
/// in `parse`'s tables and `diagnose`'s evidence line; [`ABSENT`] for none.
pub fn size(bytes: Option<u64>) -> String {
    bytes.map_or_else(|| ABSENT.to_owned(), crate::units::format_size)
}

/// A signed byte count from `memory_stats()` (current values can be negative in theory).
pub fn signed_size(bytes: Option<i64>) -> String {
    match bytes {
        None => ABSENT.to_owned(),
        Some(b) if b < 0 => format!("-{}", size(Some(b.unsigned_abs()))),
        Some(b) => size(Some(b.unsigned_abs())),
    }
}

/// Any optional value, or [`ABSENT`].
pub fn opt<T: Display>(v: Option<T>) -> String {
    v.map_or_else(|| ABSENT.to_owned(), |v| v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_escapes_cells_and_aligns_numbers() {
        let md = markdown_table(
            &["a".into(), "n".into()],
            &[vec!["x|y".into(), "3".into()]],
            &[1],
        );
        assert_eq!(md, "| a | n |\n| --- | ---: |\n| x\\|y | 3 |\n");
    }

    #[test]
    fn drops_columns_without_values() {
        let mut g = Grid::new("t", &["a", "b", "c"]).numeric(&[2]);
        g.row(vec!["x".into(), ABSENT.into(), "1".into()]);
        let g = g.drop_empty_columns();
        assert_eq!(g.header, ["a", "c"]);
        assert_eq!(g.rows, [["x", "1"]]);
        assert_eq!(g.numeric, [1]);
    }

    #[test]
    fn sizes_and_absent_values() {
        assert_eq!(size(Some(2 << 30)), "2.00 GiB");
        assert_eq!(size(None), ABSENT);
        assert_eq!(size(Some(1023)), "1023 bytes");
        assert_eq!(size(Some(195_035_136)), "186.00 MiB");
        // As PyTorch prints them (a 1 GiB card: "1024.00 MiB total capacity";
        // TH's "you tried to allocate 3421GB"), not one unit up.
        assert_eq!(size(Some(1 << 30)), "1024.00 MiB");
        assert_eq!(size(Some(3421 << 30)), "3421.00 GiB");
        assert_eq!(signed_size(Some(-1025)), "-1.00 KiB");
        assert_eq!(opt(Some(3)), "3");
    }
}
