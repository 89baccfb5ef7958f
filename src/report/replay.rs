//! Rendering: replay. Runs side by side (one column per config), the OOM
//! messages, and PyTorch's memory_summary() per run when asked.

use super::Format;
use crate::allocator::oom::exception_name;
use crate::trial::compare::TorchComparison;
use crate::trial::replay::{Replay, ReplayRun as Run};
use crate::trial::run::conf_name;
use crate::units::human;
use comfy_table::{CellAlignment, ContentArrangement, Table, presets};
use serde_json::{Value, json};
use std::fmt::Write;

fn conf_label(conf: &str) -> String {
    conf_name(conf).to_string()
}

/// The comparison rows: a label and one cell per run.
fn rows(replay: &Replay) -> Vec<(&'static str, Vec<String>)> {
    let cells = |f: &dyn Fn(&Run) -> String| replay.runs.iter().map(f).collect::<Vec<_>>();
    vec![
        (
            "result",
            cells(&|r| match &r.result.figures.oom {
                None => "ok".to_string(),
                Some(oom) => format!("OOM at event {}", oom.event_index),
            }),
        ),
        (
            "peak reserved",
            cells(&|r| human(r.result.figures.peak_reserved_bytes)),
        ),
        (
            "peak allocated",
            cells(&|r| human(r.result.figures.peak_allocated_bytes)),
        ),
        (
            "fragmentation at peak",
            cells(&|r| format!("{:.1}%", 100.0 * r.result.figures.fragmentation_at_peak())),
        ),
        (
            "device allocs",
            cells(&|r| r.result.figures.device_allocs.to_string()),
        ),
        (
            "device frees",
            cells(&|r| r.result.figures.device_frees.to_string()),
        ),
        (
            "alloc retries",
            cells(&|r| r.result.figures.alloc_retries.to_string()),
        ),
        (
            "num_sync_all_streams",
            cells(&|r| {
                let syncs = r.result.stats.get("num_sync_all_streams").copied();
                syncs.unwrap_or(0).to_string()
            }),
        ),
        (
            "modelled driver time",
            cells(&|r| format!("{:.2} ms", r.result.counters.driver_time_us / 1000.0)),
        ),
    ]
}

/// The placement check's lines: one per run checked, after a heading; none
/// when no run was checked.
fn placement_lines(replay: &Replay) -> Vec<String> {
    use crate::trial::placement::Fate;
    let checked: Vec<String> = replay
        .runs
        .iter()
        .filter_map(|run| {
            let ooms = run.placement?;
            let label = conf_label(&run.conf);
            Some(match ooms.fate() {
                Fate::Fails => format!("{label}: runs out of memory under every placement"),
                Fate::Avoids | Fate::AvoidsNarrowly => {
                    format!("{label}: no OOM under any placement")
                }
                Fate::DependsOnPlacement => format!(
                    "{label}: depends on where the driver places segments: {}",
                    ooms.by_policy()
                        .iter()
                        .map(|o| format!(
                            "{} {}",
                            o.policy,
                            if o.oom {
                                "runs out of memory"
                            } else {
                                "no OOM"
                            }
                        ))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            })
        })
        .collect();
    if checked.is_empty() {
        return checked;
    }
    let mut lines = vec![format!(
        "Placement (runs that ran out of memory or peaked within {:.0} % of the card, replayed \
         with segments placed first-fit, at rising addresses and at random addresses):",
        100.0 * (1.0 - crate::trial::replay::PLACEMENT_EDGE)
    )];
    lines.extend(checked.into_iter().map(|l| format!("  {l}")));
    lines
}

fn heading(replay: &Replay) -> String {
    let card = match replay.device {
        crate::device::DeviceSpec::Sim => format!(
            "a simulated {} card{}",
            human(replay.capacity_bytes),
            if replay.capacity_defaulted {
                " (default; set --capacity)"
            } else {
                ""
            }
        ),
        crate::device::DeviceSpec::Cuda(n) => {
            format!("cuda:{n}, capped at {}", human(replay.capacity_bytes))
        }
    };
    format!(
        "Replay of {} ({} events) on {card}, PyTorch {} allocator",
        replay.input, replay.events, replay.torch_version
    )
}

pub fn text(replay: &Replay) -> String {
    let mut table = Table::new();
    table
        .load_style(presets::UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_width(120);
    let mut header = vec!["config".to_string()];
    header.extend(replay.runs.iter().map(|r| conf_label(&r.conf)));
    table.set_header(header);
    for (label, cells) in rows(replay) {
        let mut row = vec![label.to_string()];
        row.extend(cells);
        table.add_row(row);
    }
    for i in 1..=replay.runs.len() {
        if let Some(column) = table.column_mut(i) {
            column.set_cell_alignment(CellAlignment::Right);
        }
    }
    let mut out = format!("{}\n{table}\n", heading(replay));
    let placement = placement_lines(replay);
    if !placement.is_empty() {
        let _ = write!(out, "\n{}\n", placement.join("\n"));
    }
    if let Some(f) = &replay.fidelity {
        out.push_str(&fidelity_text(f));
    }
    for run in &replay.runs {
        if let Some(oom) = &run.result.figures.oom {
            let _ = write!(
                out,
                "\n{}: event {} (alloc of {} bytes) raises\n  {}: {}\n",
                conf_label(&run.conf),
                oom.event_index,
                oom.requested_bytes,
                exception_name(replay.torch_version),
                oom.message
            );
        }
    }
    for run in &replay.runs {
        if let Some(s) = &run.summary_at_peak {
            let _ = write!(
                out,
                "\nmemory_summary() of {} when allocated memory peaked:\n{s}",
                conf_label(&run.conf)
            );
        }
        if let Some(s) = &run.summary_at_end {
            let _ = write!(
                out,
                "\nmemory_summary() of {} at the end:\n{s}",
                conf_label(&run.conf)
            );
        }
    }
    out
}

/// For a GitHub issue: the verdict as a summary line, the comparison table,
/// then the OOM messages and summaries folded into `<details>`.
pub fn markdown(replay: &Replay) -> String {
    use super::markdown::{code_block, details, summary_line};
    let mut out = summary_line("allocdoc replay", &verdict(replay).0);
    let _ = write!(out, "\n{}\n\n| config |", heading(replay));
    for run in &replay.runs {
        let _ = write!(out, " `{}` |", conf_label(&run.conf));
    }
    out.push_str("\n|---|");
    out.push_str(&"---:|".repeat(replay.runs.len()));
    out.push('\n');
    for (label, cells) in rows(replay) {
        let _ = writeln!(out, "| {label} | {} |", cells.join(" | "));
    }
    let placement = placement_lines(replay);
    if !placement.is_empty() {
        let _ = write!(out, "\n{}\n", placement.join("\n"));
    }
    for run in &replay.runs {
        if let Some(oom) = &run.result.figures.oom {
            out.push('\n');
            out.push_str(&details(
                &format!(
                    "{} fails at event {}",
                    conf_label(&run.conf),
                    oom.event_index
                ),
                &code_block(
                    "",
                    &format!("{}: {}", exception_name(replay.torch_version), oom.message),
                ),
            ));
        }
        for (when, summary) in [
            ("when allocated memory peaked", &run.summary_at_peak),
            ("at the end", &run.summary_at_end),
        ] {
            if let Some(s) = summary {
                out.push('\n');
                out.push_str(&details(
                    &format!("memory_summary() of {} {when}", conf_label(&run.conf)),
                    &code_block("", s),
                ));
            }
        }
    }
    out
}

/// The contract's `replay --format json`, with extra per-run fields
/// (`synchronizations`, `driver_time_us`, `fragmentation_at_peak`, summaries).
pub fn json(replay: &Replay) -> String {
    let runs: Vec<Value> = replay
        .runs
        .iter()
        .map(|run| {
            let r = &run.result;
            let mut v = json!({
                "conf": run.conf,
                "capacity_bytes": r.figures.capacity_bytes,
                "events": r.figures.events,
                "oom": r.figures.oom,
                "peak_reserved_bytes": r.figures.peak_reserved_bytes,
                "peak_allocated_bytes": r.figures.peak_allocated_bytes,
                "device_allocs": r.figures.device_allocs,
                "device_frees": r.figures.device_frees,
                "alloc_retries": r.figures.alloc_retries,
                "stats": r.stats,
                "synchronizations": r.figures.synchronizations,
                "driver_time_us": r.counters.driver_time_us,
                "fragmentation_at_peak": r.figures.fragmentation_at_peak(),
            });
            if let Some(map) = v.as_object_mut() {
                if let Some(s) = &run.summary_at_peak {
                    map.insert("memory_summary_at_peak".into(), json!(s));
                }
                if let Some(s) = &run.summary_at_end {
                    map.insert("memory_summary_at_end".into(), json!(s));
                }
                if let Some(ooms) = &run.placement {
                    map.insert("placement".into(), json!(ooms.by_policy()));
                }
            }
            v
        })
        .collect();
    let mut doc = json!({ "runs": runs });
    if let (Some(f), Some(map)) = (&replay.fidelity, doc.as_object_mut()) {
        map.insert("fidelity".into(), json!(f));
    }
    super::common::json(&doc)
}

/// The one-line verdict on the last config (the candidate), naming the
/// earlier configs that ran out.
fn verdict(replay: &Replay) -> (String, super::html::Tone) {
    use super::html::Tone;
    match replay.runs.last() {
        Some(run) => match &run.result.figures.oom {
            None => {
                let mut headline = format!(
                    "{} runs the whole trace: peak reserved {}",
                    conf_label(&run.conf),
                    human(run.result.figures.peak_reserved_bytes)
                );
                for other in replay
                    .runs
                    .iter()
                    .filter(|r| r.result.figures.oom.is_some())
                {
                    let at = other
                        .result
                        .figures
                        .oom
                        .as_ref()
                        .map_or(0, |o| o.event_index);
                    let _ = write!(
                        headline,
                        "; {} runs out of memory at event {at}",
                        conf_label(&other.conf)
                    );
                }
                (headline, Tone::Good)
            }
            Some(oom) => (
                format!(
                    "{} runs out of memory at event {}: {}",
                    conf_label(&run.conf),
                    oom.event_index,
                    oom.message.lines().next().unwrap_or_default()
                ),
                Tone::Bad,
            ),
        },
        None => (String::from("no runs"), Tone::Neutral),
    }
}

/// `replay --report`: every run's timeline overlaid, the segment map the
/// decision layer picked (first OOM, else the last run at its peak), what is live there by
/// block size, and the comparison table.
pub fn html(replay: &Replay) -> String {
    use super::html::{Figure, ReportData, Table, TableRow, Verdict};
    let last = replay.runs.last();
    let (headline, tone) = verdict(replay);
    let export_line = last
        .filter(|r| r.result.figures.oom.is_none() && !r.conf.is_empty())
        .map(|r| format!("export PYTORCH_CUDA_ALLOC_CONF={}", r.conf));
    let mut figures = vec![
        Figure {
            label: "capacity".into(),
            value: human(replay.capacity_bytes),
        },
        Figure {
            label: "events".into(),
            value: replay.events.to_string(),
        },
    ];
    for run in &replay.runs {
        figures.push(Figure {
            label: format!("peak reserved, {}", conf_label(&run.conf)),
            value: human(run.result.figures.peak_reserved_bytes),
        });
    }
    let names: Vec<String> = replay.runs.iter().map(|r| conf_label(&r.conf)).collect();
    let mut headers = vec![String::new()];
    headers.extend(names.iter().cloned());
    let table = Table {
        title: "Runs".into(),
        headers,
        rows: rows(replay)
            .into_iter()
            .map(|(label, cells)| {
                let mut all = vec![label.to_string()];
                all.extend(cells);
                TableRow {
                    cells: all,
                    flag: None,
                }
            })
            .collect(),
        note: None,
    };
    let views = super::views::ReportViews::of_runs(
        replay.runs.iter().map(|r| (conf_name(&r.conf), &r.result)),
        replay.map.as_ref(),
    );
    super::html::render(&ReportData {
        title: format!("allocdoc replay: {}", replay.input),
        subtitle: Some(heading(replay)),
        verdict: Verdict { headline, tone },
        export_line,
        figures,
        capacity: Some(replay.capacity_bytes),
        tables: vec![table],
        ..views.into_data()
    })
}

/// `--fidelity` on a snapshot: how closely the replay followed the recording.
fn fidelity_text(f: &crate::workload::snapshot_trace::Fidelity) -> String {
    let pct = |n: u64, of: u64| {
        if of == 0 {
            100.0
        } else {
            n as f64 * 100.0 / of as f64
        }
    };
    let mut out = format!(
        "\nfidelity (recorded config, recorded segment addresses):\n  allocs at the recorded address: {} of {} ({:.1} %)\n  trace entries identical: {} of {}\n  segment events identical: {} of {}\n  final segments equal to the snapshot's: {}\n  start state: {} segments, {} live blocks\n",
        f.address_matches,
        f.alloc_events,
        pct(f.address_matches, f.alloc_events),
        f.entries_equal,
        f.entries_compared,
        f.segment_matches,
        f.segment_events,
        if f.final_segments_equal { "yes" } else { "no" },
        f.start_segments,
        f.live_at_start_blocks,
    );
    if let Some(d) = &f.first_divergence {
        let _ = writeln!(
            out,
            "  first divergence: entry {} ({} of {} bytes at {:#x}; replay: {})",
            d.event_index,
            d.action,
            d.size,
            d.recorded_addr,
            d.replayed.as_deref().unwrap_or("nothing")
        );
        for frame in d.frames.iter().take(5) {
            let _ = writeln!(out, "    {frame}");
        }
    }
    if let Some(diff) = &f.final_difference {
        let _ = writeln!(out, "  final state: {diff}");
    }
    out
}

/// `replay --compare-with`: adds the comparison of the last run with PyTorch's
/// figures to `stdout` (inside the JSON object for `--format json`).
pub fn append_torch_comparison(
    stdout: &mut String,
    comparison: &TorchComparison,
    format: Format,
) -> Result<(), crate::Error> {
    if format.is_json() {
        let mut value: serde_json::Value = serde_json::from_str(stdout)
            .map_err(|e| crate::Error::Input(format!("replay JSON: {e}")))?;
        if let Some(obj) = value.as_object_mut() {
            obj.remove("schema_version");
            obj.insert(
                "compare_with".into(),
                serde_json::to_value(comparison).unwrap_or_default(),
            );
        }
        *stdout = super::common::json(&value);
    } else {
        stdout.push('\n');
        stdout.push_str(&super::recommend::torch_comparison(comparison, format));
    }
    Ok(())
}
