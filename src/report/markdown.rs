//! Markdown building blocks for `--format markdown`, made to paste into a
//! GitHub issue: a bold summary line, pipe tables, the long parts folded into
//! `<details>`. GitHub renders inline HTML, so cell text is escaped for both.

use super::html::{Finding, Table};
use std::fmt::Write;

/// Escapes text for a table cell: pipes, line breaks and HTML markup.
pub fn cell(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '|' => out.push_str("\\|"),
            '\n' => out.push_str("<br>"),
            '\r' => {}
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            _ => out.push(c),
        }
    }
    out
}

/// A one-line summary: `**title**: text`.
pub fn summary_line(title: &str, text: &str) -> String {
    format!("**{}**: {}\n", cell(title), cell(text))
}

/// A fenced code block whose fence is longer than any backtick run inside.
pub fn code_block(lang: &str, body: &str) -> String {
    let mut longest = 0;
    let mut run = 0;
    for c in body.chars() {
        run = if c == '`' { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    let fence = "`".repeat((longest + 1).max(3));
    let nl = if body.ends_with('\n') { "" } else { "\n" };
    format!("{fence}{lang}\n{body}{nl}{fence}\n")
}

/// A collapsed section; `body` is Markdown.
pub fn details(summary: &str, body: &str) -> String {
    format!(
        "<details><summary>{}</summary>\n\n{}\n</details>\n",
        cell(summary),
        body.trim_end()
    )
}

fn numeric(c: &str) -> bool {
    c.chars().next().is_some_and(|c| c.is_ascii_digit())
}

/// A GitHub pipe table. Columns whose first cell is a number are right-aligned;
/// flagged rows get their reason in a last `flag` column (bold).
pub fn table(t: &Table) -> String {
    let flagged = t.rows.iter().any(|r| r.flag.is_some());
    let mut s = String::new();
    s.push('|');
    for h in &t.headers {
        let _ = write!(s, " {} |", cell(h));
    }
    if flagged {
        s.push_str(" flag |");
    }
    s.push_str("\n|");
    let first = t.rows.first().map(|r| r.cells.as_slice()).unwrap_or(&[]);
    for i in 0..t.headers.len() {
        s.push_str(if first.get(i).is_some_and(|c| numeric(c)) {
            "---:|"
        } else {
            "---|"
        });
    }
    if flagged {
        s.push_str("---|");
    }
    s.push('\n');
    for r in &t.rows {
        s.push('|');
        for c in &r.cells {
            let _ = write!(s, " {} |", cell(c));
        }
        if flagged {
            match &r.flag {
                Some(f) => {
                    let _ = write!(s, " **{}** |", cell(f));
                }
                None => s.push_str("  |"),
            }
        }
        s.push('\n');
    }
    if let Some(note) = &t.note {
        let _ = write!(s, "\n{}\n", cell(note));
    }
    s
}

/// A table under its bold title, with its note (if any) below it.
pub fn titled_table(t: &Table) -> String {
    let mut s = format!("**{}**\n\n{}\n", cell(&t.title), table(t));
    if let Some(n) = &t.note {
        let _ = writeln!(s, "{}\n", cell(n));
    }
    s
}

/// Findings as a list: severity, rule, message, then the evidence inline.
pub fn findings(findings: &[Finding]) -> String {
    let mut s = String::new();
    for f in findings {
        let _ = write!(
            s,
            "- **{}** `{}`: {}",
            cell(&f.severity),
            f.rule.replace('`', "'"),
            cell(&f.message)
        );
        if !f.evidence.is_empty() {
            let ev: Vec<String> = f
                .evidence
                .iter()
                .map(|(k, v)| format!("{} {}", cell(k), cell(v)))
                .collect();
            let _ = write!(s, " ({})", ev.join(", "));
        }
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::html::TableRow;

    #[test]
    fn table_aligns_numbers_and_escapes_cells() {
        let t = Table {
            title: "ranks".into(),
            headers: vec!["rank".into(), "input".into(), "reserved".into()],
            rows: vec![
                TableRow {
                    cells: vec!["0".into(), "a|b.log".into(), "76.60 GiB".into()],
                    flag: None,
                },
                TableRow {
                    cells: vec!["1".into(), "<c>.log".into(), "61.20 GiB".into()],
                    flag: Some("reserved 20 % below the median".into()),
                },
            ],
            note: None,
        };
        assert_eq!(
            table(&t),
            "| rank | input | reserved | flag |\n|---:|---|---:|---|\n\
             | 0 | a\\|b.log | 76.60 GiB |  |\n\
             | 1 | &lt;c&gt;.log | 61.20 GiB | **reserved 20 % below the median** |\n"
        );
    }

    #[test]
    fn code_fence_outgrows_backticks_inside() {
        assert_eq!(code_block("sh", "a ``` b"), "````sh\na ``` b\n````\n");
        assert_eq!(code_block("", "x\n"), "```\nx\n```\n");
    }

    #[test]
    fn details_fold_markdown() {
        assert_eq!(
            details("All 12 <findings>", "- one\n\n"),
            "<details><summary>All 12 &lt;findings&gt;</summary>\n\n- one\n</details>\n"
        );
    }
}
