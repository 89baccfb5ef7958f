//! `torch.cuda.memory_summary()` tables (`torch/cuda/memory.py`), 1.x and 2.x
//! layouts, full and abbreviated, behind log prefixes or written on one line
//! with literal `\n` escapes. Rows map onto `memory_stats()` names as the CLI
//! contract says; a table cut at its head or tail keeps its whole rows.

use super::scan::Found;
use super::text::{clean, line_end, line_start, rank_in, shared_prefix};
use crate::evidence::{Kind, Metrics, Observation, StatValues};
use crate::units::unit_multiplier;

/// A full 2.x summary is 45 lines; more than this many lines is not one table.
const MAX_LINES: usize = 64;
/// A summary written on one line with `\n` escapes is about 3.6 KiB.
const ESCAPED_TABLE: usize = 4096;
/// Longest physical line taken for a table line (77 characters and a prefix).
const MAX_TABLE_LINE: usize = 1024;

/// `memory_summary()` row label → `memory_stats()` stat name, and whether its
/// cells are byte sizes; in the summary's order.
pub const SUMMARY_ROWS: [(&str, &str, bool); 11] = [
    ("Allocated memory", "allocated_bytes", true),
    ("Active memory", "active_bytes", true),
    ("Requested memory", "requested_bytes", true),
    ("GPU reserved memory", "reserved_bytes", true),
    ("Non-releasable memory", "inactive_split_bytes", true),
    ("Allocations", "allocation", false),
    ("Active allocs", "active", false),
    ("GPU reserved segments", "segment", false),
    ("Non-releasable allocs", "inactive_split", false),
    ("Oversize allocations", "oversize_allocations", false),
    ("Oversize GPU segments", "oversize_segments", false),
];

/// One line of the table as found: its cleaned text and the byte range of
/// the physical line it came from.
struct TableLine {
    text: String,
    start: usize,
    end: usize,
}

/// Every printed table line is `|` + 75 characters + `|` (torch/cuda/memory.py).
const TABLE_WIDTH: usize = 77;

/// The table part of a line, prefixes dropped: its last 77 characters when
/// they are bar to bar (a prefix may hold bars too: `… | INFO | …`), else
/// everything from the first `|` (a row cut short).
fn body(text: &str) -> Option<&str> {
    let t = text.trim_end();
    if let Some(at) = t.len().checked_sub(TABLE_WIDTH)
        && t.is_char_boundary(at)
        && t[at..].starts_with('|')
        && t.ends_with('|')
    {
        return Some(&t[at..]);
    }
    text.find('|').map(|i| &text[i..])
}

fn is_border(body: &str, fill: char) -> bool {
    let inner = body.trim_end().trim_matches('|');
    inner.len() >= 20 && inner.chars().all(|c| c == fill)
}

fn is_table_line(text: &str) -> bool {
    let Some(b) = body(text) else { return false };
    is_border(b, '=')
        || is_border(b, '-')
        || b.contains("memory summary")
        || b.contains("CUDA OOMs")
        || b.contains("Cur Usage")
        || b.contains("from large pool")
        || b.contains("from small pool")
        || SUMMARY_ROWS.iter().any(|(label, _, _)| b.contains(label))
}

/// The table's lines around `hit`, never before `floor`.
fn table_lines(data: &[u8], hit: usize, floor: usize) -> Vec<TableLine> {
    let ls = line_start(data, hit).max(floor);
    let le = line_end(data, hit);
    // One line holding the whole table with literal "\n" escapes (a repr or
    // JSON string): a table is under 4 KiB, so only that much around the hit.
    let near = &data[hit.saturating_sub(ESCAPED_TABLE).max(ls)..(hit + 2 * ESCAPED_TABLE).min(le)];
    if memchr::memmem::find(near, b"|\\n|").is_some() {
        let text = clean(near);
        return text
            .split("\\n")
            .skip_while(|t| !is_table_line(t))
            .take_while(|t| is_table_line(t))
            .map(|t| TableLine {
                text: t.to_owned(),
                start: ls,
                end: le,
            })
            .collect();
    }
    // A printed table line is 77 characters plus a log prefix, and every piece
    // of one a hard wrap cut holds a bar (the last piece its closing one).
    let has_bar =
        |s: usize, e: usize| e - s <= MAX_TABLE_LINE && memchr::memchr(b'|', &data[s..e]).is_some();
    if !has_bar(ls, le) {
        return Vec::new();
    }
    // Start where the table above the hit starts (a wrapped table has up to
    // twice as many physical lines; the pieces a wrap cut off are not table
    // lines alone, but never more than three in a row), then rebuild the
    // table lines downwards.
    let mut s = ls;
    let mut pieces = 0;
    for _ in 0..2 * MAX_LINES {
        if s <= floor {
            break;
        }
        let p = line_start(data, s - 1).max(floor);
        if !has_bar(p, s - 1) {
            break;
        }
        if is_table_line(&clean(&data[p..s - 1])) {
            pieces = 0;
        } else {
            pieces += 1;
            if pieces > 3 {
                break;
            }
        }
        s = p;
    }
    let mut lines: Vec<(TableLine, bool)> = Vec::new();
    let mut at_hit = None;
    while s < data.len() && lines.len() < 3 * MAX_LINES {
        let l = logical_line(data, s);
        let is_table = is_table_line(&l.text);
        if l.start <= ls && ls <= l.end {
            at_hit = Some(lines.len());
        }
        if at_hit.is_some() && !is_table {
            break;
        }
        s = l.end + 1;
        lines.push((l, is_table));
    }
    let Some(at_hit) = at_hit.filter(|&i| lines.get(i).is_some_and(|(_, t)| *t)) else {
        return Vec::new();
    };
    // The run of table lines through the hit, from its last header on (a
    // table cut at the head may follow another one's tail), with the border
    // above that header.
    let mut first = lines[..at_hit]
        .iter()
        .rposition(|(_, t)| !t)
        .map_or(0, |i| i + 1);
    if let Some(h) = lines[first..=at_hit]
        .iter()
        .rposition(|(l, _)| l.text.contains("memory summary"))
    {
        let h = first + h;
        let top = h
            .checked_sub(1)
            .filter(|&t| t >= first && body(&lines[t].0.text).is_some_and(|b| is_border(b, '=')));
        first = top.unwrap_or(h);
    }
    lines.truncate(MAX_LINES + first);
    lines.drain(..first);
    lines.into_iter().map(|(l, _)| l).collect()
}

/// The table line starting at physical line `s`. A line a hard wrap cut (its
/// table part short of 77 characters) is joined with the pieces below it when
/// that makes exactly one whole line, bar to bar; otherwise it stays as it is.
fn logical_line(data: &[u8], s: usize) -> TableLine {
    let physical = |s: usize| {
        let e = line_end(data, s);
        TableLine {
            // Too long to be a table line: left empty, so it ends the table.
            text: if e - s > MAX_TABLE_LINE {
                String::new()
            } else {
                clean(&data[s..e])
            },
            start: s,
            end: e,
        }
    };
    let first = physical(s);
    if is_whole(&first.text) || !first.text.contains('|') {
        return first;
    }
    let mut joined = first.text.clone();
    let mut end = first.end;
    // A 77-character line wrapped at 20 columns or more has at most four pieces.
    for _ in 0..3 {
        if end >= data.len() {
            break;
        }
        let next = physical(end + 1);
        // A prefix written on every physical line (after the wrap) is not the table's.
        let shared = shared_prefix(&first.text, &next.text);
        let log_prefix = first.text.find('|').is_some_and(|bar| shared <= bar);
        joined.push_str(&next.text[if log_prefix { shared } else { 0 }..]);
        end = next.end;
        // The line must start in the first piece, or the pieces are not one line.
        match joined.trim_end().len().checked_sub(TABLE_WIDTH) {
            Some(at) if at >= first.text.len() => break,
            Some(_) if is_whole(&joined) => {
                return TableLine {
                    text: joined,
                    start: s,
                    end,
                };
            }
            _ => {}
        }
    }
    first
}

/// A whole printed table line: its last 77 characters run bar to bar.
fn is_whole(text: &str) -> bool {
    body(text).is_some_and(|b| b.len() == TABLE_WIDTH && b.starts_with('|') && b.ends_with('|'))
}

/// A cell: `14324 MiB`, `0 B`, `387`, `1234 K`; `None` when cut or malformed.
fn cell(text: &str, bytes: bool) -> Option<i64> {
    let t = text.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let n: i64 = t.get(..digits).filter(|d| !d.is_empty())?.parse().ok()?;
    let unit = t[digits..].trim();
    let mult = if bytes {
        // `_format_size`: B/KiB/MiB/GiB/TiB/PiB (2.x), B/KB/MB/GB/TB/PB (1.x), binary.
        match unit {
            "B" => 1,
            "KiB" | "MiB" | "GiB" | "TiB" | "PiB" | "KB" | "MB" | "GB" | "TB" | "PB" => {
                i64::try_from(unit_multiplier(unit)?).ok()?
            }
            _ => return None,
        }
    } else {
        // `_format_count`: decimal K and M.
        match unit {
            "" => 1,
            "K" => 1000,
            "M" => 1_000_000,
            _ => return None,
        }
    };
    n.checked_mul(mult)
}

/// Parses a table row's four cells after its label.
fn row_values(cells: &[&str], bytes: bool) -> Option<StatValues> {
    let [c, p, a, f, ..] = cells else { return None };
    Some(StatValues {
        current: Some(cell(c, bytes)?),
        peak: Some(cell(p, bytes)?),
        allocated: Some(cell(a, bytes)?),
        freed: Some(cell(f, bytes)?),
    })
}

fn header_numbers(b: &str, key: &str) -> Option<u64> {
    let at = b.find(key)? + key.len();
    let rest = b[at..].trim_start();
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    // A number running into the end of the text may be cut.
    if end == rest.len() {
        return None;
    }
    rest[..end].parse().ok()
}

/// A hit on a summary's header or one of its rows.
pub fn summary(data: &[u8], hit: usize, floor: usize, input: &str) -> Option<Found> {
    let lines = table_lines(data, hit, floor);
    let mut obs = Observation::new(Kind::MemorySummary, input);
    let mut metrics = Metrics::new();
    let mut header = false;
    let mut closed = false;
    let mut cut_row = false;
    let mut current: Option<(&str, bool)> = None;
    let mut units_1x = false;
    let mut units_2x = false;
    let mut used = 0;
    for (i, l) in lines.iter().enumerate() {
        let Some(b) = body(&l.text) else { break };
        if b.contains("memory summary") {
            if header || !metrics.is_empty() {
                break;
            }
            header = true;
            obs.device_index = header_numbers(b, "device ID").and_then(|d| u32::try_from(d).ok());
            // The table body never holds "[rankN]": the whole line can be searched.
            obs.rank = rank_in(&l.text);
        } else if b.contains("CUDA OOMs") {
            obs.cuda_ooms = header_numbers(b, "CUDA OOMs:");
            obs.alloc_retries = header_numbers(b, "cudaMalloc retries:");
        } else if is_border(b, '=') {
            if !metrics.is_empty() {
                closed = true;
                used = i + 1;
                break;
            }
        } else if !is_border(b, '-') && !b.contains("Cur Usage") {
            let cells: Vec<&str> = b.trim_start_matches('|').split('|').collect();
            let label = cells.first().map_or("", |c| c.trim());
            let pool = match label {
                "from large pool" => Some("large_pool"),
                "from small pool" => Some("small_pool"),
                _ => None,
            };
            let (stat, bytes) = match pool {
                Some(_) => match current {
                    Some(c) => c,
                    None => {
                        cut_row = true;
                        used = i + 1;
                        continue;
                    }
                },
                None => match SUMMARY_ROWS.iter().find(|(l, _, _)| *l == label) {
                    Some(&(_, stat, bytes)) => {
                        if metrics.contains_key(stat) {
                            // The same row again: a second table without a header.
                            break;
                        }
                        current = Some((stat, bytes));
                        (stat, bytes)
                    }
                    None => {
                        cut_row = true;
                        used = i + 1;
                        continue;
                    }
                },
            };
            // Four cells and the closing bar: a whole row.
            match row_values(cells.get(1..).unwrap_or(&[]), bytes).filter(|_| cells.len() >= 6) {
                Some(v) => {
                    if bytes {
                        let u = &cells[1..5];
                        let unit = |c: &&str| c.trim().rsplit(' ').next().unwrap_or("").to_owned();
                        units_1x |= u
                            .iter()
                            .map(unit)
                            .any(|x| matches!(x.as_str(), "KB" | "MB" | "GB" | "TB" | "PB"));
                        units_2x |= u.iter().map(unit).any(|x| x.ends_with("iB"));
                    }
                    metrics
                        .entry(stat.to_owned())
                        .or_default()
                        .insert(pool.unwrap_or("all").to_owned(), v);
                }
                None => cut_row = true,
            }
        }
        used = i + 1;
    }
    if metrics.is_empty() && !header {
        return None;
    }
    let used = &lines[..used.max(1)];
    let first = used.first()?;
    let last = used.last()?;
    obs.line = None;
    obs.truncated = !header || !closed || cut_row;
    obs.format_era = era(&metrics, units_1x, units_2x, closed).map(str::to_owned);
    obs.metrics = Some(metrics);
    Some(Found {
        obs,
        start: first.start,
        end: last.end.max(hit + 1).min(data.len()),
    })
}

/// The PyTorch versions a table's layout allows: memory_summary() exists from
/// 1.4; 2.0 changed the units to KiB/MiB and added "Requested memory"; 1.10
/// added the "Oversize" rows after "Non-releasable allocs" (1.9.0's
/// torch/cuda/memory.py closes the table there).
fn era(metrics: &Metrics, units_1x: bool, units_2x: bool, closed: bool) -> Option<&'static str> {
    let oversize =
        metrics.contains_key("oversize_allocations") || metrics.contains_key("oversize_segments");
    if metrics.contains_key("requested_bytes") || units_2x {
        Some("2.0+")
    } else if closed && !oversize && metrics.contains_key("inactive_split") {
        Some("1.4-1.9")
    } else if units_1x && oversize {
        Some("1.10-1.13")
    } else if units_1x {
        Some("1.4-1.13")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_follow_pytorch_formatters() {
        assert_eq!(cell(" 14324 MiB ", true), Some(14324 << 20));
        assert_eq!(cell("      0 B   ", true), Some(0));
        assert_eq!(cell("  251905 KB ", true), Some(251905 << 10));
        assert_eq!(cell("    1234 K ", false), Some(1_234_000));
        assert_eq!(cell("     387    ", false), Some(387));
        assert_eq!(cell("  143", true), None);
        assert_eq!(cell("  12 Mi", true), None);
        assert_eq!(cell("", false), None);
    }
}
