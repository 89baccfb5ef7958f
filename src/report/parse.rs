//! Renders `allocdoc parse`: the evidence alone. Text and Markdown show one
//! table for the OOM messages, one for other out-of-memory errors, one per
//! `memory_summary()` / `memory_stats()` and one for snapshots; JSON is
//! exactly `{"observations": [...]}` (cli-contract.md).

use super::Format;
use super::common::{ABSENT, Grid, json, opt, signed_size, size};
use crate::evidence::{DeviceKind, Evidence, Kind, Observation, StatValues};
use crate::ingest::{STANDARD_INPUT, SUMMARY_ROWS, input_name};
use serde::Serialize;

/// Said when the inputs hold nothing we read.
pub const NOTHING_FOUND: &str = "no PyTorch memory evidence found";

/// The fields of `parse --format json`.
#[derive(Serialize)]
pub struct ParseJson<'a> {
    observations: &'a [Observation],
}

pub fn document(ev: &Evidence) -> ParseJson<'_> {
    ParseJson {
        observations: &ev.observations,
    }
}

/// The whole output of `parse` in `format`; `inputs` names what was read.
pub fn render(ev: &Evidence, inputs: &[String], format: Format) -> String {
    match format {
        Format::Json | Format::Jsonl => json(&document(ev)),
        Format::Text => {
            let mut s =
                single_input(ev).map_or_else(String::new, |i| format!("Evidence in {i}\n\n"));
            s += &grids(ev)
                .iter()
                .map(Grid::to_text)
                .collect::<Vec<_>>()
                .join("\n");
            if ev.observations.is_empty() {
                s.push_str(&format!("{NOTHING_FOUND} in {}\n", names(inputs)));
            }
            for n in &ev.notes {
                s.push_str(&format!("note: {n}\n"));
            }
            s
        }
        Format::Markdown => {
            let mut s = match single_input(ev) {
                Some(i) => format!("## Evidence in {}\n\n", super::common::markdown_escape(i)),
                None => String::from("## Evidence\n\n"),
            };
            for g in grids(ev) {
                s.push_str(&g.to_markdown());
                s.push('\n');
            }
            if ev.observations.is_empty() {
                s.push_str(&format!("{NOTHING_FOUND} in {}.\n\n", names(inputs)));
            }
            for n in &ev.notes {
                s.push_str(&format!("> note: {n}\n"));
            }
            s
        }
    }
}

fn names(inputs: &[String]) -> String {
    if inputs.is_empty() {
        STANDARD_INPUT.to_owned()
    } else {
        inputs
            .iter()
            .map(|i| input_name(i))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Where an observation is: `file:line`, or just the line when every
/// observation comes from one input (named once, above the tables).
fn place(o: &Observation, single: bool) -> String {
    match (o.line, single) {
        (Some(l), true) => format!("line {l}"),
        (Some(l), false) => format!("{}:{l}", o.input),
        (None, _) => o.input.clone(),
    }
}

/// The one input every observation comes from, if there is only one.
fn single_input(ev: &Evidence) -> Option<&str> {
    let first = ev.observations.first()?;
    ev.observations
        .iter()
        .all(|o| o.input == first.input)
        .then_some(first.input.as_str())
}

fn device(o: &Observation) -> String {
    let kind = match o.device_kind {
        Some(DeviceKind::Cuda) => "cuda",
        Some(DeviceKind::Hip) => "hip",
        Some(DeviceKind::Xpu) => "xpu",
        Some(DeviceKind::Mps) => "mps",
        None => "",
    };
    let mut s = match (kind, o.device_index) {
        ("", None) => ABSENT.to_owned(),
        ("", Some(i)) => format!("device {i}"),
        (k, Some(i)) => format!("{k}:{i}"),
        (k, None) => k.to_owned(),
    };
    if let Some(r) = o.rank {
        s.push_str(&format!(" (rank {r})"));
    }
    s
}

/// The figures an OOM states beyond the main columns.
fn extras(o: &Observation) -> String {
    let mut parts = Vec::new();
    if let Some(b) = o.cached_bytes {
        parts.push(format!("cached {}", size(Some(b))));
    }
    if let Some(b) = o.process_in_use_bytes {
        parts.push(format!("this process {}", size(Some(b))));
    }
    for p in &o.other_processes {
        parts.push(format!("pid {} {}", opt(p.pid), size(Some(p.bytes))));
    }
    if let Some(b) = o.allowed_bytes {
        parts.push(format!("allowed {}", size(Some(b))));
    }
    if let Some(b) = o.private_pools_bytes {
        parts.push(format!("private pools {}", size(Some(b))));
    }
    if o.truncated {
        parts.push("message cut off".to_owned());
    }
    if parts.is_empty() {
        ABSENT.to_owned()
    } else {
        parts.join("; ")
    }
}

fn grids(ev: &Evidence) -> Vec<Grid> {
    let single = single_input(ev).is_some();
    let place = |o: &Observation| place(o, single);
    let mut out = Vec::new();
    let of = |k: Kind| ev.observations.iter().filter(move |o| o.kind == k);

    let mut ooms = Grid::new(
        "Out-of-memory errors from the caching allocator",
        &[
            "Where",
            "Device",
            "Requested",
            "Capacity",
            "Free",
            "Allocated",
            "Reserved",
            "Unallocated",
            "Era",
            "Also",
        ],
    )
    .numeric(&[2, 3, 4, 5, 6, 7]);
    for o in of(Kind::Oom) {
        ooms.row(vec![
            place(o),
            device(o),
            size(o.requested_bytes),
            size(o.total_capacity_bytes),
            size(o.free_bytes),
            size(o.allocated_bytes),
            size(o.reserved_bytes),
            size(o.reserved_unallocated_bytes),
            opt(o.format_era.as_deref()),
            extras(o),
        ]);
    }
    if !ooms.rows.is_empty() {
        out.push(ooms.drop_empty_columns());
    }

    let mut other = Grid::new(
        "Out-of-memory errors from elsewhere (not the caching allocator)",
        &[
            "Where",
            "Source",
            "Device",
            "Requested",
            "Allocated",
            "Allowed",
            "Message",
        ],
    )
    .numeric(&[3, 4, 5]);
    for o in of(Kind::NonAllocatorOom) {
        let source = o
            .source
            .and_then(|s| serde_json::to_value(s).ok())
            .and_then(|v| v.as_str().map(str::to_owned));
        other.row(vec![
            place(o),
            opt(source),
            device(o),
            size(o.requested_bytes),
            size(o.allocated_bytes),
            size(o.allowed_bytes),
            opt(o.message.as_deref()),
        ]);
    }
    if !other.rows.is_empty() {
        out.push(other.drop_empty_columns());
    }
    let mut errors = Grid::new("Device errors (not out of memory)", &["Where", "Error"]);
    for o in of(Kind::DeviceError) {
        errors.row(vec![place(o), opt(o.message.as_deref())]);
    }
    if !errors.rows.is_empty() {
        out.push(errors);
    }

    for o in ev
        .observations
        .iter()
        .filter(|o| matches!(o.kind, Kind::MemorySummary | Kind::MemoryStats))
    {
        out.push(stats_grid(o, &place(o)));
    }

    let mut snaps = Grid::new(
        "Snapshots",
        &[
            "Where",
            "Device",
            "Segments",
            "Blocks",
            "Reserved",
            "Allocated",
            "Active",
            "Requested",
            "Trace events",
        ],
    )
    .numeric(&[2, 3, 4, 5, 6, 7, 8]);
    for o in of(Kind::Snapshot) {
        snaps.row(vec![
            place(o),
            device(o),
            opt(o.segments),
            opt(o.blocks),
            size(o.reserved_bytes),
            size(o.allocated_bytes),
            size(o.active_bytes),
            size(o.requested_bytes),
            opt(o.trace_events),
        ]);
    }
    if !snaps.rows.is_empty() {
        out.push(snaps.drop_empty_columns());
    }
    out
}

/// One `memory_summary()` or `memory_stats()` observation as a table in the
/// summary's row order.
fn stats_grid(o: &Observation, place: &str) -> Grid {
    let what = if o.kind == Kind::MemorySummary {
        "memory_summary()"
    } else {
        "memory_stats()"
    };
    let mut head = vec![];
    if let Some(d) = o.device_index {
        head.push(format!("device {d}"));
    }
    if let Some(r) = o.rank {
        head.push(format!("rank {r}"));
    }
    if let Some(n) = o.cuda_ooms.or(o.num_ooms) {
        head.push(format!("OOMs {n}"));
    }
    if let Some(n) = o.alloc_retries.or(o.num_alloc_retries) {
        head.push(format!("cudaMalloc retries {n}"));
    }
    for (k, v) in &o.counters {
        head.push(format!("{k} {v}"));
    }
    if o.truncated {
        head.push("cut off".to_owned());
    }
    let title = if head.is_empty() {
        format!("{what} at {place}")
    } else {
        format!("{what} at {place}: {}", head.join(", "))
    };
    let mut g = Grid::new(
        title,
        &["Metric", "Pool", "Current", "Peak", "Allocated", "Freed"],
    )
    .numeric(&[2, 3, 4, 5]);
    let Some(metrics) = &o.metrics else { return g };
    let known = SUMMARY_ROWS
        .iter()
        .map(|&(label, stat, bytes)| (label.to_owned(), stat, bytes));
    let unknown = metrics
        .keys()
        .filter(|k| !SUMMARY_ROWS.iter().any(|(_, s, _)| s == k))
        .map(|k| (k.clone(), k.as_str(), k.contains("bytes")));
    for (label, stat, bytes) in known.chain(unknown) {
        let Some(pools) = metrics.get(stat) else {
            continue;
        };
        // The label on the metric's first row, whichever pool it is: a dump
        // without an `all` row must not file its pools under the row above.
        let mut first = true;
        for pool in ["all", "large_pool", "small_pool"] {
            let Some(v) = pools.get(pool) else { continue };
            let cell = |x: Option<i64>| if bytes { signed_size(x) } else { opt(x) };
            let StatValues {
                current,
                peak,
                allocated,
                freed,
            } = *v;
            g.row(vec![
                if std::mem::take(&mut first) {
                    label.clone()
                } else {
                    String::new()
                },
                pool.to_owned(),
                cell(current),
                cell(peak),
                cell(allocated),
                cell(freed),
            ]);
        }
    }
    g
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` copies of one 2.4-era OOM message, one a line.
    fn ooms(n: usize) -> Evidence {
        let line = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. \
                    GPU 0 has a total capacity of 79.15 GiB of which 1.20 GiB is free. Process \
                    4242 has 1.00 GiB memory in use. Including non-PyTorch memory, this process \
                    has 76.93 GiB memory in use. Of the allocated memory 62.50 GiB is allocated \
                    by PyTorch, and 12.10 GiB is reserved by PyTorch but unallocated.\n";
        crate::ingest::parse_input("train.log", line.repeat(n).as_bytes()).expect("text")
    }

    /// The text output of `n` incidents is one table with `n` rows, each row
    /// as tall as the others and every line of the table as wide (at most the
    /// layout width): its size grows by one row per incident, not faster.
    #[test]
    fn text_output_grows_by_one_row_per_incident() {
        for n in [1, 9, 99, 999] {
            let ev = ooms(n);
            assert_eq!(ev.observations.len(), n);
            let text = render(&ev, &[], Format::Text);
            let title = "Out-of-memory errors from the caching allocator";
            assert_eq!(text.matches(title).count(), 1);
            // The lines between the header's rule (╞) and the bottom border (└).
            let body: Vec<&str> = text
                .lines()
                .skip_while(|l| !l.starts_with('╞'))
                .skip(1)
                .take_while(|l| !l.starts_with('└'))
                .collect();
            let starts = body.iter().filter(|l| l.starts_with("│ line ")).count();
            assert_eq!(starts, n, "one row per incident");
            let height = body.len() / n;
            assert!(
                (1..=3).contains(&height) && body.len() == n * height,
                "{text}"
            );
            for (i, l) in body.iter().enumerate() {
                assert_eq!(l.starts_with("│ line "), i % height == 0, "{text}");
            }
            let width = body[0].chars().count();
            assert!(width <= usize::from(crate::report::common::TEXT_WIDTH));
            assert!(body.iter().all(|l| l.chars().count() == width), "{text}");
            // Nothing else grows with n: title, borders, header, the input's name.
            let rest = text.len() - body.iter().map(|l| l.len() + 1).sum::<usize>();
            assert!(rest < 2_000, "{n} incidents: {rest} bytes outside the rows");
        }
    }
}
