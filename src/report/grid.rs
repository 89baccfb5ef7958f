//! `fit` in two knobs: the predictions at points × configs, the frontier of
//! what fits the card, the laws of the largest call sites in both knobs and
//! where allocations seen in part of the grid are placed; as text, Markdown,
//! JSON and the HTML report's chart of the frontier.

use super::common::{Grid, json, size};
use super::fit::{
    at, file, laws_table, markdown_of, named, predictions_table, recorded, recordings_table,
    text_of,
};
use super::html::{self, Figure, ReportData, Tone, Verdict};
use super::svg::{SizeLine, frontier_chart};
use crate::trial::answer::Strength;
use crate::trial::grid::{Frontier, GridFit};
use crate::trial::run::conf_name;
use crate::units::human;

pub fn json_doc(g: &GridFit) -> String {
    #[derive(serde::Serialize)]
    struct Doc<'a> {
        #[serde(flatten)]
        fit: &'a GridFit,
        headline: String,
    }
    json(&Doc {
        fit: g,
        headline: headline(g),
    })
}

fn knobs(g: &GridFit) -> [&str; 2] {
    [&g.knobs[0], &g.knobs[1]]
}

/// The one sentence that answers, said to be uncertain when it is.
pub fn headline(g: &GridFit) -> String {
    let answer = answer(g);
    match g.strength {
        Strength::Uncertain => format!("Uncertain (the reasons are below the tables): {answer}"),
        _ => answer,
    }
}

fn answer(g: &GridFit) -> String {
    if let Some(cap) = g.capacity_bytes
        && !g.frontier.is_empty()
    {
        // The defaults' frontier, in one sentence.
        let defaults: Vec<&Frontier> = g.frontier.iter().filter(|f| f.conf.is_empty()).collect();
        let parts: Vec<String> = defaults
            .iter()
            .map(|f| {
                format!(
                    "{} {}: {}",
                    f.knob,
                    f.value,
                    match f.largest {
                        Some(w) if f.unbounded => format!("{} {w} and beyond", f.other),
                        Some(w) => format!("{} up to {w}", f.other),
                        None => format!("no {}", f.other),
                    }
                )
            })
            .collect();
        return format!(
            "On the {} card under PyTorch's defaults: {}",
            human(cap),
            parts.join("; ")
        );
    }
    g.predictions
        .iter()
        .map(|p| {
            format!(
                "{} needs {} allocated, {} reserved under the defaults",
                named(&knobs(g), &p.at),
                human(p.peak_allocated_bytes),
                human(p.configs.first().map_or(0, |c| c.peak_reserved_bytes))
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn grids(g: &GridFit) -> Vec<Grid> {
    let (ka, kb) = (g.knobs[0].as_str(), g.knobs[1].as_str());
    let mut out = Vec::new();
    let inputs = recordings_table(&format!("{ka}, {kb}"), &g.inputs);
    out.push(inputs);
    if !g.predictions.is_empty() {
        out.push(predictions_table(
            &[ka, kb],
            g.capacity_bytes,
            &g.predictions,
        ));
    }
    if let (Some(cap), Some(first)) = (g.capacity_bytes, g.frontier.first()) {
        let largest = format!("largest {}", first.other);
        let mut t = Grid::new(
            format!("The frontier of what fits {} (by replay)", human(cap)),
            &[
                "config",
                &first.knob,
                &largest,
                "strength",
                "peak reserved",
                "replays",
            ],
        )
        .numeric(&[1, 2, 4, 5]);
        for f in &g.frontier {
            t.row(vec![
                conf_name(&f.conf).to_string(),
                f.value.to_string(),
                match (f.largest, f.unbounded) {
                    (Some(w), true) => format!("{w}+"),
                    (Some(w), false) => w.to_string(),
                    (None, _) => "none".into(),
                },
                f.strength.name().to_string(),
                size(f.peak_reserved_bytes),
                f.replays.to_string(),
            ]);
        }
        out.push(t);
    }
    if !g.sites.is_empty() {
        out.push(laws_table(
            "Laws of the largest call sites in both knobs (each one's largest allocation)",
            g.inputs.iter().map(|i| format!("at {}", at(&i.at))),
            g.sites
                .iter()
                .map(|s| (s.site.as_str(), s.law.as_str(), &s.sizes[..], s.allocations)),
        ));
    }
    out
}

/// Lines under the tables.
fn notes(g: &GridFit) -> Vec<String> {
    let mut out = Vec::new();
    for p in &g.pairing {
        out.push(format!(
            "Pairing: {} of {} allocations of {} pair with {} ({})",
            p.paired,
            p.allocations,
            file(&p.input),
            file(&p.with),
            p.method
        ));
    }
    for p in &g.placed {
        out.push(format!("Placed: {p}"));
    }
    for p in &g.predictions {
        for r in &p.reasons {
            out.push(format!("{} is uncertain: {r}", named(&knobs(g), &p.at)));
        }
    }
    for w in &g.warnings {
        out.push(format!("warning: {w}"));
    }
    out
}

pub fn text(g: &GridFit) -> String {
    text_of(&headline(g), grids(g), notes(g))
}

pub fn markdown(g: &GridFit) -> String {
    markdown_of(&headline(g), grids(g), notes(g))
}

/// The HTML report: the frontier per config (the largest value of one knob
/// that fits against the other), and the tables.
pub fn html(g: &GridFit) -> String {
    let mut confs: Vec<&str> = Vec::new();
    for f in &g.frontier {
        if !confs.contains(&f.conf.as_str()) {
            confs.push(&f.conf);
        }
    }
    let lines: Vec<SizeLine> = confs
        .iter()
        .enumerate()
        .map(|(ci, conf)| SizeLine {
            name: conf_name(conf).to_string(),
            points: g
                .frontier
                .iter()
                .filter(|f| f.conf == *conf)
                .filter_map(|f| f.largest.map(|w| (f.value, w)))
                .collect(),
            allocated: false,
            colour: ci,
        })
        .collect();
    let mut data = ReportData {
        title: format!("allocdoc fit: memory by {} and {}", g.knobs[0], g.knobs[1]),
        subtitle: Some(recorded(&g.inputs)),
        verdict: Verdict {
            headline: headline(g),
            tone: match g.strength {
                Strength::Uncertain => Tone::Neutral,
                _ => Tone::Good,
            },
        },
        ..ReportData::default()
    };
    if let Some(first) = g.frontier.first() {
        data.charts.push((
            "The frontier of what fits the card".into(),
            frontier_chart(&lines, (&first.knob, &first.other)),
        ));
    }
    if let Some(c) = g.capacity_bytes {
        data.figures.push(Figure {
            label: "card".into(),
            value: human(c),
        });
    }
    data.figures.push(Figure {
        label: "strength".into(),
        value: g.strength.name().into(),
    });
    for t in grids(g) {
        data.tables.push(html::Table::of_grid(&t, &[]));
    }
    data.next_steps = notes(g);
    html::render(&data)
}
