//! `fit`'s output: the inputs and how they paired, the table of sizes ×
//! configs, the largest size that fits each config, the laws of the largest
//! call sites, what appears at one size only; as text, Markdown, JSON and
//! the HTML report's chart.

use super::common::{Grid, json, size};
use super::html::{self, Figure, ReportData, Tone, Verdict};
use super::svg::{SizeLine, size_chart};
use crate::trial::answer::Strength;
use crate::trial::fit::{At, Fit, FitInput, FitOom, Largest, Prediction};
use crate::trial::run::conf_name;
use crate::units::human;

/// Where an input was recorded: "512", or "(2, 512)" with two knobs.
pub(super) fn at(at: &At) -> String {
    match *at {
        At::Size(s) => s.to_string(),
        At::Point([a, b]) => format!("({a}, {b})"),
    }
}

/// A prediction's knobs with their values: "seq_len 512", or
/// "d_model 16, seq_len 512" with two knobs.
pub(super) fn named(knobs: &[&str], at: &At) -> String {
    knobs
        .iter()
        .zip(at.values())
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The recordings, each where it was recorded (`knobs` names the column).
pub(super) fn recordings_table(knobs: &str, inputs: &[FitInput]) -> Grid {
    let mut g = Grid::new(
        "Recordings",
        &[
            knobs,
            "input",
            "device",
            "trace entries",
            "allocations",
            "live before the trace",
            "peak allocated",
        ],
    )
    .numeric(&[0, 3, 4, 5, 6]);
    for i in inputs {
        g.row(vec![
            at(&i.at),
            file(&i.input).to_string(),
            format!("cuda:{}", i.device),
            i.trace_entries.to_string(),
            i.allocations.to_string(),
            size(Some(i.pre_trace_bytes)),
            size(Some(i.peak_allocated_bytes)),
        ]);
    }
    g
}

/// The HTML report's subtitle: each input and where it was recorded.
pub(super) fn recorded(inputs: &[FitInput]) -> String {
    inputs
        .iter()
        .map(|i| format!("{} at {}", file(&i.input), at(&i.at)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// An input as tables show it: its file name.
pub(super) fn file(input: &str) -> &str {
    input.rsplit(['/', '\\']).next().unwrap_or(input)
}

/// The table of predicted peaks: a row per prediction (a column per knob
/// named by `knobs`) and config, with whether it fits `capacity`.
pub(super) fn predictions_table(
    knobs: &[&str],
    capacity: Option<u64>,
    predictions: &[Prediction],
) -> Grid {
    let fits_col = capacity.map(|c| format!("fits {}?", human(c)));
    let mut header = knobs.to_vec();
    header.extend(["strength", "config", "peak allocated", "peak reserved"]);
    if let Some(f) = &fits_col {
        header.push(f);
    }
    let n = knobs.len();
    let mut numeric: Vec<usize> = (0..n).collect();
    numeric.extend([n + 2, n + 3]);
    let mut g = Grid::new(
        "Predicted peaks of a fresh process (the memory live before the trace allocated first)",
        &header,
    )
    .numeric(&numeric);
    for p in predictions {
        for c in &p.configs {
            let mut row: Vec<String> = p.at.values().iter().map(u64::to_string).collect();
            row.extend([
                p.strength.name().to_string(),
                conf_name(&c.conf).to_string(),
                size(Some(p.peak_allocated_bytes)),
                size(Some(c.peak_reserved_bytes)),
            ]);
            if fits_col.is_some() {
                row.push(fits_cell(&c.oom));
            }
            g.row(row);
        }
    }
    g
}

/// The table of the largest call sites' laws: per site its law, its largest
/// allocation's size in each input (`at` names the columns) and its count.
pub(super) fn laws_table<'a>(
    title: &str,
    at: impl Iterator<Item = String>,
    sites: impl Iterator<Item = (&'a str, &'a str, &'a [Option<u64>], usize)>,
) -> Grid {
    let mut header: Vec<String> = vec!["call site".into(), "law".into()];
    header.extend(at);
    header.push("allocations".into());
    let n = header.len() - 3;
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut g = Grid::new(title, &header).numeric(&(2..3 + n).collect::<Vec<_>>());
    for (site, law, sizes, count) in sites {
        let mut row = vec![site.to_string(), law.to_string()];
        row.extend(sizes.iter().map(|b| size(*b)));
        row.push(count.to_string());
        g.row(row);
    }
    g
}

/// The "fits the card?" cell of a prediction: yes, or the request that fails.
fn fits_cell(oom: &Option<FitOom>) -> String {
    match oom {
        None => "yes".into(),
        Some(o) => format!(
            "no: {} at {} (event {})",
            size(Some(o.requested_bytes)),
            o.site,
            o.event_index
        ),
    }
}

/// The knob's name in sentences ("batch", "context_length"; "size" by default).
pub struct Knob<'a>(pub &'a str);

pub fn json_doc(fit: &Fit, knob: &Knob) -> String {
    #[derive(serde::Serialize)]
    struct Doc<'a> {
        knob: &'a str,
        #[serde(flatten)]
        fit: &'a Fit,
        headline: String,
    }
    json(&Doc {
        knob: knob.0,
        fit,
        headline: headline(fit, knob),
    })
}

/// The one sentence that answers the question: which config fits the
/// largest size on the card, or what each size asked for needs; said to be
/// uncertain when it is (the reasons follow the tables).
pub fn headline(fit: &Fit, knob: &Knob) -> String {
    let answer = answer(fit, knob);
    match fit.strength {
        Strength::Uncertain => format!("Uncertain (the reasons are below the tables): {answer}"),
        _ => answer,
    }
}

fn answer(fit: &Fit, knob: &Knob) -> String {
    let k = knob.0;
    let card = |c: u64| format!("the {} card", human(c));
    if let Some(cap) = fit.capacity_bytes
        && !fit.largest.is_empty()
    {
        let mut ranked: Vec<&Largest> = fit.largest.iter().collect();
        ranked.sort_by_key(|l| std::cmp::Reverse(l.size.map_or(0, |s| s + 1)));
        let best = ranked[0];
        let Some(best_size) = best.size else {
            let d = &fit.largest[0];
            return format!(
                "No config fits even {k} {} on {}: under the defaults {}",
                d.next_size.unwrap_or(1),
                card(cap),
                next_on_card(d)
            );
        };
        // "the defaults fit", "expandable_segments:True fits".
        let name = |l: &Largest| {
            if l.conf.is_empty() {
                "PyTorch's defaults fit".to_string()
            } else {
                format!("{} fits", l.conf)
            }
        };
        let fits = |l: &Largest| match l.size {
            Some(s) if l.unbounded => {
                format!("{k} {s} and beyond (nothing grows enough to fill it)")
            }
            Some(s) => format!("{k} {s}"),
            None => format!("no {k}"),
        };
        let first = format!("{} {} on {}", name(best), fits(best), card(cap));
        let others: Vec<String> = ranked[1..]
            .iter()
            .map(|l| {
                if l.size == Some(best_size) {
                    format!("{} the same", name(l))
                } else {
                    format!("{} {}", name(l), fits(l))
                }
            })
            .collect();
        return if others.is_empty() {
            first
        } else {
            format!("{first}; {}", others.join("; "))
        };
    }
    match fit.predictions.as_slice() {
        [] => "No size asked for: give --at SIZES or --capacity".to_string(),
        ps => ps
            .iter()
            .map(|p| {
                let defaults = p.configs.first().map_or(0, |c| c.peak_reserved_bytes);
                format!(
                    "{} needs {} allocated, {} reserved under the defaults",
                    named(&[k], &p.at),
                    human(p.peak_allocated_bytes),
                    human(defaults)
                )
            })
            .collect::<Vec<_>>()
            .join("; "),
    }
}

/// What the next size up does on the card: the request that runs out of
/// memory there, and what it reserves on a card without limit, so named.
fn next_on_card(l: &Largest) -> String {
    let free = l
        .next_peak_reserved_bytes
        .map(|b| format!("on a card without limit it reserves {}", size(Some(b))));
    match (&l.next_oom, free) {
        (Some(o), free) => format!(
            "runs out of memory on the card: a {} request at {} (event {}){}",
            size(Some(o.requested_bytes)),
            if o.site.is_empty() { "?" } else { &o.site },
            o.event_index,
            free.map_or(String::new(), |f| format!("; {f}"))
        ),
        (None, Some(f)) => {
            format!("fits the card too (the search's answer is not monotone here); {f}")
        }
        (None, None) => super::common::ABSENT.to_string(),
    }
}

fn grids(fit: &Fit, knob: &Knob) -> Vec<Grid> {
    let k = knob.0;
    let mut out = Vec::new();
    let inputs = recordings_table(k, &fit.inputs);
    out.push(inputs);
    if !fit.predictions.is_empty() {
        out.push(predictions_table(
            &[k],
            fit.capacity_bytes,
            &fit.predictions,
        ));
    }
    if let Some(cap) = fit.capacity_bytes
        && !fit.largest.is_empty()
    {
        let mut g = Grid::new(
            format!("The largest {k} that fits {} (by replay)", human(cap)),
            &[
                "config",
                k,
                "strength",
                "peak reserved",
                "left",
                "the next step",
                "replays",
            ],
        )
        .numeric(&[1, 3, 4, 6]);
        for l in &fit.largest {
            g.row(vec![
                conf_name(&l.conf).to_string(),
                match (l.size, l.unbounded) {
                    (Some(s), true) => format!("{s}+"),
                    (Some(s), false) => s.to_string(),
                    (None, _) => "none".into(),
                },
                l.strength.name().to_string(),
                size(l.peak_reserved_bytes),
                size(l.margin_bytes),
                match l.next_size {
                    Some(n) => format!("{k} {n}: {}", next_on_card(l)),
                    None => super::common::ABSENT.to_string(),
                },
                l.replays.to_string(),
            ]);
        }
        out.push(g);
    }
    if !fit.sites.is_empty() {
        out.push(laws_table(
            "Size laws of the largest call sites (each one's largest allocation)",
            fit.inputs.iter().map(|i| format!("at {}", at(&i.at))),
            fit.sites
                .iter()
                .map(|s| (s.site.as_str(), s.law.as_str(), &s.sizes[..], s.allocations)),
        ));
    }
    if !fit.unpaired.is_empty() {
        let mut g = Grid::new(
            "Recorded at one size only",
            &["input", "call site", "allocations", "largest", "bytes"],
        )
        .numeric(&[2, 3, 4]);
        for u in &fit.unpaired {
            g.row(vec![
                file(&u.input).to_string(),
                u.site.clone(),
                u.count.to_string(),
                size(Some(u.largest_bytes)),
                size(Some(u.bytes)),
            ]);
        }
        out.push(g);
    }
    if !fit.checks.is_empty() {
        let mut g = Grid::new(
            "Each recording predicted from the others",
            &[k, "input", "recorded peak", "predicted", "error"],
        )
        .numeric(&[0, 2, 3, 4]);
        for c in &fit.checks {
            g.row(vec![
                c.size.to_string(),
                file(&c.input).to_string(),
                size(Some(c.recorded_peak_allocated_bytes)),
                size(Some(c.predicted_peak_allocated_bytes)),
                format!("{:+.2} %", 100.0 * c.error),
            ]);
        }
        out.push(g);
    }
    out
}

/// Lines under the tables: pairing, strength reasons, warnings.
fn notes(fit: &Fit, knob: &Knob) -> Vec<String> {
    let mut out = Vec::new();
    for p in &fit.pairing {
        out.push(format!(
            "Pairing: {} of {} allocations of {} pair with {} ({} of the bytes; {})",
            p.paired,
            p.allocations,
            file(&p.input),
            file(&p.with),
            if p.bytes == 0 {
                "all".to_string()
            } else {
                format!("{:.1} %", 100.0 * p.paired_bytes as f64 / p.bytes as f64)
            },
            match p.method {
                "identical" => "the same call sites in the same order",
                "aligned" => "aligned by call site and order",
                _ => "aligned window by window (too many differences to align at once)",
            }
        ));
    }
    for p in &fit.predictions {
        for r in &p.reasons {
            out.push(format!("{} is uncertain: {r}", named(&[knob.0], &p.at)));
        }
    }
    for w in &fit.warnings {
        out.push(format!("warning: {w}"));
    }
    out
}

pub fn text(fit: &Fit, knob: &Knob) -> String {
    text_of(&headline(fit, knob), grids(fit, knob), notes(fit, knob))
}

pub fn markdown(fit: &Fit, knob: &Knob) -> String {
    markdown_of(&headline(fit, knob), grids(fit, knob), notes(fit, knob))
}

/// `fit`'s text, in one knob or two: the headline, the tables, the notes.
pub(super) fn text_of(headline: &str, grids: Vec<Grid>, notes: Vec<String>) -> String {
    let mut s = format!("{headline}\n\n");
    for g in grids {
        s.push_str(&g.to_text());
        s.push('\n');
    }
    for n in notes {
        s.push_str(&n);
        s.push('\n');
    }
    s
}

/// `fit`'s Markdown, in one knob or two.
pub(super) fn markdown_of(headline: &str, grids: Vec<Grid>, notes: Vec<String>) -> String {
    let mut s = format!("## allocdoc fit\n\n**{headline}**\n\n");
    for g in grids {
        s.push_str(&g.to_markdown());
        s.push('\n');
    }
    for n in notes {
        s.push_str(&format!("- {}\n", super::common::markdown_escape(&n)));
    }
    s
}

/// The HTML report: predicted allocated and reserved peaks against the size,
/// one line per config, the recorded and the largest fitting sizes marked.
pub fn html(fit: &Fit, knob: &Knob) -> String {
    let mut lines = Vec::new();
    let confs: Vec<&str> = fit
        .predictions
        .first()
        .map(|p| p.configs.iter().map(|c| c.conf.as_str()).collect())
        .unwrap_or_default();
    for (ci, conf) in confs.iter().enumerate() {
        lines.push(SizeLine {
            name: format!("{}: peak reserved", conf_name(conf)),
            points: fit
                .predictions
                .iter()
                .filter_map(|p| {
                    p.configs
                        .iter()
                        .find(|c| c.conf == *conf)
                        .map(|c| (p.at.values()[0], c.peak_reserved_bytes))
                })
                .collect(),
            allocated: false,
            colour: ci,
        });
    }
    lines.push(SizeLine {
        name: "peak allocated".into(),
        points: fit
            .predictions
            .iter()
            .map(|p| (p.at.values()[0], p.peak_allocated_bytes))
            .collect(),
        allocated: true,
        colour: confs.len(),
    });
    let mut marks: Vec<(u64, String)> = fit
        .inputs
        .iter()
        .filter_map(|i| match i.at {
            At::Size(s) => Some((s, format!("recorded {s}"))),
            At::Point(_) => None,
        })
        .collect();
    for l in &fit.largest {
        if let Some(s) = l.size {
            marks.push((s, format!("largest fitting: {} {s}", conf_name(&l.conf))));
        }
    }
    let chart = size_chart(&lines, &marks, fit.capacity_bytes, knob.0);
    let mut data = ReportData {
        title: format!("allocdoc fit: memory by {}", knob.0),
        subtitle: Some(recorded(&fit.inputs)),
        verdict: Verdict {
            headline: headline(fit, knob),
            tone: match fit.strength {
                Strength::Uncertain => Tone::Neutral,
                _ => Tone::Good,
            },
        },
        charts: vec![("Predicted peaks by size".into(), chart)],
        ..ReportData::default()
    };
    if let Some(c) = fit.capacity_bytes {
        data.figures.push(Figure {
            label: "card".into(),
            value: human(c),
        });
    }
    data.figures.push(Figure {
        label: "strength".into(),
        value: fit.strength.name().into(),
    });
    for g in grids(fit, knob) {
        data.tables.push(html::Table::of_grid(&g, &[]));
    }
    data.next_steps = notes(fit, knob);
    html::render(&data)
}
