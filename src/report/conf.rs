//! Rendering: `conf check` (text, JSON, Markdown).

use crate::advise::conf_check::{ConfCheck, RoundingRow};
use crate::conf::{ConfError, ErrorOrigin};
use crate::units::human;
use comfy_table::{Cell, CellAlignment, ContentArrangement, Table, presets};
use std::fmt::Write;

/// Control characters shown as escapes, so a tab or newline in a value is
/// visible in the terminal.
fn visible(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

fn verdict(r: &ConfCheck) -> String {
    let state = if r.valid { "valid" } else { "INVALID" };
    let mut s = format!(
        "PYTORCH_CUDA_ALLOC_CONF=\"{}\" is {state} for PyTorch {}",
        visible(&r.value),
        r.torch_version
    );
    // Linux is where every setting takes effect: only other platforms are named.
    if r.platform != crate::conf::Platform::Linux {
        let _ = write!(s, " on {}", r.platform.as_str());
    }
    if !r.ignored.is_empty() {
        s.push_str(", but PyTorch IGNORES part of it there (see the warnings)");
    }
    s
}

/// How PyTorch reports the error, in one or two lines.
fn error_lines(e: &ConfError) -> Vec<String> {
    let message = visible(&e.message);
    match (e.origin, e.exception) {
        (ErrorOrigin::ReadsPastEnd, _) | (_, None) => {
            vec![format!("PyTorch's behaviour is undefined: {message}")]
        }
        (ErrorOrigin::Check, Some(x)) => vec![format!("PyTorch raises {x}: {message}")],
        (ErrorOrigin::InternalAssert, Some(x)) => vec![
            format!("PyTorch raises {x} from an internal assert, ending in: {message}"),
            "(the message starts with \"… INTERNAL ASSERT FAILED at …, please report a bug to PyTorch.\")".into(),
        ],
        (ErrorOrigin::CppException, Some(x)) => vec![format!(
            "PyTorch raises {x}: {message}  (std::{message} could not read the value as a number)"
        )],
    }
}

const WHEN: &str = "(raised when PyTorch first reads the variable, at CUDA initialization or the first CUDA allocation, or by torch.cuda.memory._set_allocator_settings)";

fn size_cell(bytes: u64) -> String {
    if bytes < 1024 {
        bytes.to_string()
    } else {
        format!("{bytes} ({})", human(bytes))
    }
}

fn rounding_cells(r: &RoundingRow) -> [String; 5] {
    let default = if r.default_rounded_bytes == r.rounded_bytes {
        "same".to_string()
    } else {
        size_cell(r.default_rounded_bytes)
    };
    [
        size_cell(r.request_bytes),
        size_cell(r.rounded_bytes),
        r.pool.to_string(),
        size_cell(r.segment_bytes),
        default,
    ]
}

const ROUNDING_HEADER: [&str; 5] = [
    "request",
    "round_size",
    "pool",
    "new segment",
    "default round_size",
];

fn table() -> Table {
    let mut t = Table::new();
    // The box drawing of every other table (report::common::Grid).
    t.load_style(presets::UTF8_FULL_CONDENSED)
        .force_no_tty()
        .set_content_arrangement(ContentArrangement::Disabled);
    t
}

pub fn text(r: &ConfCheck) -> String {
    let mut out = verdict(r);
    out.push('\n');
    if let Some(e) = &r.error {
        for line in error_lines(e) {
            let _ = writeln!(out, "  {line}");
        }
        let _ = writeln!(out, "  {WHEN}");
    }
    if !r.warnings.is_empty() {
        out.push_str("\nWarnings\n");
        for w in &r.warnings {
            let who = if w.from_pytorch {
                "PyTorch warns"
            } else {
                "note"
            };
            let _ = writeln!(out, "  - {who}: {}", visible(&w.text));
        }
    }
    if let Some(rows) = &r.settings {
        out.push_str("\nEffective settings\n");
        let mut t = table();
        t.set_header(["setting", "value", ""]);
        for row in rows {
            t.add_row([
                row.key,
                &row.display,
                if row.default { "default" } else { "set" },
            ]);
        }
        let _ = writeln!(out, "{t}");
    }
    if !r.unmodelled.is_empty() {
        out.push_str("\nAccepted, not modelled by the bundled allocator\n");
        for u in &r.unmodelled {
            let _ = writeln!(out, "  - {}:{}  ({})", u.key, visible(&u.value), u.note);
        }
    }
    if !r.rounding.is_empty() {
        out.push_str(
            "\nRounding: request → block (round_size) → new segment (get_allocation_size)\n",
        );
        let mut t = table();
        t.set_header(ROUNDING_HEADER);
        for row in &r.rounding {
            t.add_row(
                rounding_cells(row).map(|c| Cell::new(c).set_alignment(CellAlignment::Right)),
            );
        }
        let _ = writeln!(out, "{t}");
    }
    if let Some(c) = &r.canonical {
        let shown = if c.is_empty() {
            "(empty: all defaults)"
        } else {
            c
        };
        let _ = writeln!(out, "\nCanonical value: {shown}");
    }
    out.push_str("\nEnvironment\n");
    for n in &r.env_notes {
        let _ = writeln!(out, "  - {n}");
    }
    out
}

pub fn json(r: &ConfCheck) -> String {
    super::common::json(r)
}

fn md_escape(s: &str) -> String {
    visible(s).replace('|', "\\|")
}

pub fn markdown(r: &ConfCheck) -> String {
    let mut out = format!("## `conf check`\n\n**{}**\n", md_escape(&verdict(r)));
    if let Some(e) = &r.error {
        out.push('\n');
        for line in error_lines(e) {
            let _ = writeln!(out, "> {line}");
        }
        let _ = writeln!(out, ">\n> {WHEN}");
    }
    if !r.warnings.is_empty() {
        out.push_str("\n### Warnings\n\n");
        for w in &r.warnings {
            let who = if w.from_pytorch {
                "PyTorch warns"
            } else {
                "note"
            };
            let _ = writeln!(out, "- {who}: {}", md_escape(&w.text));
        }
    }
    if let Some(rows) = &r.settings {
        out.push_str("\n### Effective settings\n\n| setting | value | |\n|---|---|---|\n");
        for row in rows {
            let state = if row.default { "default" } else { "**set**" };
            let _ = writeln!(
                out,
                "| `{}` | {} | {state} |",
                row.key,
                md_escape(&row.display)
            );
        }
    }
    if !r.unmodelled.is_empty() {
        out.push_str("\n### Accepted, not modelled by the bundled allocator\n\n");
        for u in &r.unmodelled {
            let _ = writeln!(out, "- `{}:{}`: {}", u.key, md_escape(&u.value), u.note);
        }
    }
    if !r.rounding.is_empty() {
        out.push_str("\n### Rounding\n\n| ");
        out.push_str(&ROUNDING_HEADER.join(" | "));
        out.push_str(" |\n|---:|---:|---|---:|---:|\n");
        for row in &r.rounding {
            let _ = writeln!(out, "| {} |", rounding_cells(row).join(" | "));
        }
    }
    if let Some(c) = &r.canonical {
        let _ = writeln!(out, "\nCanonical value: `{c}`");
    }
    out.push_str("\n### Environment\n\n");
    for n in &r.env_notes {
        let _ = writeln!(out, "- {}", md_escape(n));
    }
    out
}
