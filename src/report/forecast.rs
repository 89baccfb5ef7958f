//! `forecast`'s output: the answer (the step that runs out of memory, the
//! config and the cap that carry the run), the table of configs, the
//! ratchet and what strands the memory in words, leak or cache; as text,
//! Markdown, JSON and the HTML report's chart of reserved memory against the
//! step.

use super::common::{Grid, json, size};
use super::html::{self, Figure, ReportData, Tone, Verdict};
use super::svg::{SizeLine, line_chart};
use crate::conf::Shell;
use crate::trial::answer::Strength;
use crate::trial::forecast::{BatchFit, ConfForecast, Forecast};
use crate::trial::run::conf_name;
use crate::units::human;

/// The knob's name in sentences ("context_length"; "size" by default).
pub use super::fit::Knob;

/// A run's peak past this ratio of its largest step's is a ratchet worth
/// a sentence.
const RATCHET: f64 = 1.001;

/// The environment variable the recommendation sets.
const VAR: &str = "PYTORCH_CUDA_ALLOC_CONF";

pub fn json_doc(f: &Forecast, knob: &Knob) -> String {
    #[derive(serde::Serialize)]
    struct Doc<'a> {
        knob: &'a str,
        #[serde(flatten)]
        forecast: &'a Forecast,
        line: Option<String>,
        cap_sentence: Option<String>,
        batch_sentence: Option<String>,
        findings: Vec<String>,
        headline: String,
    }
    json(&Doc {
        knob: knob.0,
        forecast: f,
        line: f.recommended.as_deref().map(|c| Shell::Posix.line(VAR, c)),
        cap_sentence: cap_sentence(f, knob),
        batch_sentence: batch_sentence(f),
        findings: findings(f, knob),
        headline: headline(f, knob),
    })
}

/// "PyTorch's defaults" or the config.
fn named(conf: &str) -> String {
    if conf.is_empty() {
        "PyTorch's defaults".into()
    } else {
        conf.to_string()
    }
}

fn pct_above(ratio: f64) -> String {
    let p = 100.0 * (ratio - 1.0);
    if p >= 0.0 {
        format!("{p:.1} % above")
    } else {
        format!("{:.1} % below", -p)
    }
}

/// The one sentence that answers: where the run runs out of memory and
/// what carries it, or how high it ratchets; said to be uncertain when it is.
pub fn headline(f: &Forecast, knob: &Knob) -> String {
    let answer = match batch_sentence(f) {
        Some(b) => format!("{b}. {}", answer(f, knob)),
        None => answer(f, knob),
    };
    match f.strength {
        Strength::Uncertain => format!("Uncertain (the reasons are below the tables): {answer}"),
        _ => answer,
    }
}

fn answer(f: &Forecast, knob: &Knob) -> String {
    let k = knob.0;
    let Some(defaults) = f.configs.first() else {
        return "No config to replay".into();
    };
    // "200 steps", "200 steps at batch 8" with two knobs.
    let steps = match (&f.knobs, f.batch) {
        (Some([b, _]), Some(n)) => format!("{} at {b} {n}", steps_of(f.steps)),
        _ => steps_of(f.steps),
    };
    let best = f
        .recommended
        .as_deref()
        .and_then(|c| f.configs.iter().find(|x| x.conf == c));
    if let Some(cap) = f.capacity_bytes {
        let card = format!("the {} card", human(cap));
        let oom_at = |c: &ConfForecast| {
            c.oom.as_ref().map(|o| {
                let alone = if o.fits_alone {
                    ", where one step of that size alone fits: earlier steps of other sizes filled the cache"
                } else {
                    ""
                };
                format!("at step {} ({k} {}{alone})", o.step, o.size)
            })
        };
        let others = |skip: &str| {
            let v: Vec<String> = f
                .configs
                .iter()
                .filter(|c| c.conf != skip && !c.conf.is_empty())
                .map(|c| match oom_at(c) {
                    Some(at) => format!("{} runs out {at}", c.conf),
                    None => format!(
                        "{} survives ({} left)",
                        c.conf,
                        human(c.margin_bytes.unwrap_or(0))
                    ),
                })
                .collect();
            if v.is_empty() {
                String::new()
            } else {
                format!("; {}", v.join("; "))
            }
        };
        return match (oom_at(defaults), best) {
            (None, _) => format!(
                "The run of {steps} survives {card} under PyTorch's defaults (peak {}, {} left){}",
                human(on_card(defaults)),
                human(defaults.margin_bytes.unwrap_or(0)),
                others("")
            ),
            (Some(at), Some(b)) if b.oom.is_none() => format!(
                "The run of {steps} runs out of memory on {card} {at} under PyTorch's defaults; {} carries it (peak {}, {} left)",
                named(&b.conf),
                human(on_card(b)),
                human(b.margin_bytes.unwrap_or(0))
            ),
            (Some(at), _) => {
                let mut s = format!(
                    "The run of {steps} runs out of memory on {card} under every config replayed: under PyTorch's defaults {at}"
                );
                if let Some(c) = cap_sentence(f, knob) {
                    s.push_str("; ");
                    s.push_str(&c);
                }
                s
            }
        };
    }
    let mut s = format!(
        "Over the {steps} reserved memory peaks at {} at step {} under PyTorch's defaults, {} the largest single step ({} at {k} {})",
        human(defaults.peak_reserved_bytes),
        defaults.peak_reserved_step,
        pct_above(defaults.ratchet),
        human(defaults.step_peak_reserved_bytes),
        defaults.step_peak_size
    );
    for c in &f.configs[1..] {
        s.push_str(&format!(
            "; {} peaks at {}",
            c.conf,
            human(c.peak_reserved_bytes)
        ));
    }
    s
}

/// With a batch search: "The largest batch whose whole run survives the 24
/// GiB card is 12 under expandable_segments:True (…); 10 under PyTorch's
/// defaults (batch 11 runs out at step 340)".
pub fn batch_sentence(f: &Forecast) -> Option<String> {
    let name = f.knobs.as_ref().map_or("batch", |k| k[0].as_str());
    let mut fits: Vec<(&ConfForecast, &BatchFit)> = f
        .configs
        .iter()
        .filter_map(|c| Some((c, c.batch.as_ref()?)))
        .collect();
    if fits.is_empty() {
        return None;
    }
    // The largest first; the defaults first among equals.
    fits.sort_by_key(|(_, b)| std::cmp::Reverse(b.largest));
    let parts: Vec<String> = fits
        .iter()
        .map(|(c, b)| {
            let next = match (b.next_batch, b.next_oom_step) {
                (Some(n), Some(s)) => format!(", {name} {n} runs out of memory at step {s}"),
                (None, _) => format!(", every sample in one {name}"),
                _ => String::new(),
            };
            match b.largest {
                Some(n) => format!(
                    "{n} under {} ({}, peak {}{next})",
                    named(&c.conf),
                    steps_of(b.steps),
                    human(b.peak_reserved_bytes.unwrap_or(0))
                ),
                None => format!(
                    "none under {} ({name} 1 runs out of memory{})",
                    named(&c.conf),
                    b.next_oom_step
                        .map_or(String::new(), |s| format!(" at step {s}"))
                ),
            }
        })
        .collect();
    Some(format!(
        "The largest {name} whose whole run survives the {} card: {}",
        human(f.capacity_bytes.unwrap_or(0)),
        parts.join("; ")
    ))
}

/// "1 step", "200 steps".
fn steps_of(n: usize) -> String {
    format!("{n} step{}", if n == 1 { "" } else { "s" })
}

/// The run's peak reserved on the card (without limit when none was given).
fn on_card(c: &ConfForecast) -> u64 {
    c.card_peak_reserved_bytes.unwrap_or(c.peak_reserved_bytes)
}

/// "cap the context_length at 3584 and the run survives under PyTorch's
/// defaults; at 4096 under expandable_segments:True" (only where some
/// config needs a cap).
pub fn cap_sentence(f: &Forecast, knob: &Knob) -> Option<String> {
    let k = knob.0;
    if !f
        .configs
        .iter()
        .any(|c| c.cap.as_ref().is_some_and(|c| c.needed))
    {
        return None;
    }
    let parts: Vec<String> = f
        .configs
        .iter()
        .filter_map(|c| {
            let cap = c.cap.as_ref()?;
            Some(match (cap.needed, cap.size) {
                (false, _) => format!("{} needs no cap", named(&c.conf)),
                (true, Some(s)) => format!("at {s} under {}", named(&c.conf)),
                (true, None) => format!("no cap carries it under {}", named(&c.conf)),
            })
        })
        .collect();
    Some(format!(
        "cap the {k} (truncate or bucket longer steps) and the run survives: {}",
        parts.join("; ")
    ))
}

/// The sentences that explain: the ratchet and what strands the memory,
/// leak or cache.
pub fn findings(f: &Forecast, knob: &Knob) -> Vec<String> {
    let k = knob.0;
    let mut out = Vec::new();
    for c in &f.configs {
        let mut s = format!(
            "{}: the run's reserved peak is {} at step {} ({k} {}), {} its largest single step ({} at {k} {})",
            named(&c.conf),
            human(c.peak_reserved_bytes),
            c.peak_reserved_step,
            c.stranded.as_ref().map_or(0, |s| s.size),
            pct_above(c.ratchet),
            human(c.step_peak_reserved_bytes),
            c.step_peak_size
        );
        if let Some(st) = &c.stranded
            && st.free_blocks > 0
        {
            s.push_str(&format!(
                ": there a {} request ({}) found no free cached block to take it, while {} sat free in {} cached block{} (the largest {}; {} smaller than the request)",
                human(st.requested_bytes),
                if st.site.is_empty() { "?" } else { &st.site },
                human(st.free_bytes),
                st.free_blocks,
                if st.free_blocks == 1 { "" } else { "s" },
                human(st.largest_free_bytes),
                st.smaller_blocks
            ));
        }
        out.push(s);
    }
    match &f.leak {
        Some(l) => out.push(format!(
            "Allocated memory grows by {} every step ({}): a leak no allocator setting fixes",
            human(l.bytes_per_step),
            l.sites.join(", ")
        )),
        None => {
            // What earlier steps leave live raises later peaks (state made
            // at the first step); what the cache adds on top.
            let grown = f
                .peak_allocated_bytes
                .saturating_sub(f.step_peak_allocated_bytes);
            let mut s = if grown as f64 > (RATCHET - 1.0) * f.step_peak_allocated_bytes as f64 {
                format!(
                    "Allocated memory peaks at {} at step {}, {} above the largest step alone ({} at {k} {}): {}; no allocator setting lowers it",
                    human(f.peak_allocated_bytes),
                    f.peak_allocated_step,
                    human(grown),
                    human(f.step_peak_allocated_bytes),
                    f.step_peak_allocated_size,
                    if f.kept_state_bytes > 0 {
                        "the state made at the first step is live through every later step"
                    } else {
                        "what earlier steps leave live is still held then"
                    }
                )
            } else {
                format!(
                    "Allocated memory does not grow from step to step (its peak, {} at step {}, comes with the step's size): no leak",
                    human(f.peak_allocated_bytes),
                    f.peak_allocated_step
                )
            };
            if let Some(d) = f.configs.first() {
                let over = d
                    .peak_reserved_bytes
                    .saturating_sub(d.step_peak_reserved_bytes);
                let cache = over.saturating_sub(grown);
                if d.ratchet > RATCHET
                    && cache as f64 > (RATCHET - 1.0) * d.step_peak_reserved_bytes as f64
                {
                    s.push_str(&format!(
                        "; reserved memory ratchets {} above the largest step's own peak under the defaults, {} of it the cache: blocks kept between steps that a later, larger step cannot use, which an allocator setting can fix",
                        human(over),
                        human(cache)
                    ));
                } else {
                    s.push_str("; the cache adds nothing to it: reserved memory peaks no higher above allocated than the largest step alone does");
                }
            }
            out.push(s);
        }
    }
    out
}

fn grids(f: &Forecast, knob: &Knob) -> Vec<Grid> {
    let k = knob.0;
    let mut header = vec![
        "config".to_string(),
        "peak reserved".to_string(),
        "largest step alone".to_string(),
        "ratchet".to_string(),
    ];
    let searched = f.configs.iter().any(|c| c.batch.is_some());
    let batch_name = f.knobs.as_ref().map_or("batch", |k| k[0].as_str());
    if let Some(c) = f.capacity_bytes {
        header.push(format!("on the {} card", human(c)));
        header.push(format!("largest {k} cap"));
        if searched {
            header.push(format!("largest {batch_name}"));
        }
    }
    header.push("cudaMalloc".to_string());
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut g = Grid::new(
        "The run under each config (peaks on a card without limit)",
        &header,
    )
    .numeric(&[1, 2, 3]);
    for c in &f.configs {
        let mut row = vec![
            conf_name(&c.conf).to_string(),
            format!(
                "{} (step {})",
                size(Some(c.peak_reserved_bytes)),
                c.peak_reserved_step
            ),
            size(Some(c.step_peak_reserved_bytes)),
            format!("{:+.1} %", 100.0 * (c.ratchet - 1.0)),
        ];
        if f.capacity_bytes.is_some() {
            row.push(match &c.oom {
                None => format!("survives ({} left)", size(c.margin_bytes)),
                Some(o) => format!("OOM at step {} ({k} {})", o.step, o.size),
            });
            row.push(match &c.cap {
                Some(cap) if !cap.needed => "none needed".into(),
                Some(cap) => match cap.size {
                    Some(s) => format!("{s} ({} steps capped)", cap.steps_capped),
                    None => "none carries it".into(),
                },
                None => super::common::ABSENT.to_string(),
            });
            if searched {
                row.push(match c.batch.as_ref().map(|b| b.largest) {
                    Some(Some(n)) => n.to_string(),
                    Some(None) => "none".into(),
                    None => super::common::ABSENT.to_string(),
                });
            }
        }
        row.push(c.device_allocs.to_string());
        g.row(row);
    }
    let at = match &f.knobs {
        Some([a, b]) => format!("{a}, {b}"),
        None => k.to_string(),
    };
    let inputs = super::fit::recordings_table(&at, &f.inputs);
    vec![g, inputs]
}

/// Each OOM on the card, in a sentence.
fn oom_lines(f: &Forecast, knob: &Knob) -> Vec<String> {
    let k = knob.0;
    f.configs
        .iter()
        .filter_map(|c| {
            let o = c.oom.as_ref()?;
            Some(format!(
                "{} run{} out of memory at step {} of {} ({k} {}): a {} request at {}, with {} reserved; one step of {k} {} alone {} this card",
                named(&c.conf),
                if c.conf.is_empty() { "" } else { "s" },
                o.step,
                f.steps,
                o.size,
                human(o.requested_bytes),
                if o.site.is_empty() { "?" } else { &o.site },
                human(o.reserved_bytes),
                o.size,
                if o.fits_alone { "fits" } else { "does not fit" }
            ))
        })
        .collect()
}

/// Lines under the tables.
fn notes(f: &Forecast, knob: &Knob) -> Vec<String> {
    let k = knob.0;
    let s = &f.sizes;
    let mut out = vec![format!(
        "The run: {} steps of {k} {}–{} ({} distinct; the largest, {}, {} time{}, first at step {})",
        f.steps,
        s.smallest,
        s.largest,
        s.distinct,
        s.largest,
        s.largest_count,
        if s.largest_count == 1 { "" } else { "s" },
        s.largest_first_step
    )];
    out.extend(oom_lines(f, knob));
    out.extend(findings(f, knob));
    out.extend(f.carried.iter().cloned());
    for r in &f.reasons {
        out.push(format!("uncertain: {r}"));
    }
    out
}

fn recommendation(f: &Forecast, knob: &Knob) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(c) = &f.recommended {
        out.push(format!("  {}", Shell::Posix.line(VAR, c)));
        let replayed: usize = f.configs.iter().map(|c| c.replayed_steps).sum();
        out.push(format!(
            "  Strength {}: the whole run replayed through the allocator under {} configs ({} steps each; {replayed} step replays event by event in all, the cap searches included, the rest looked up: the same start state and sizes seen before), ranked as recommend ranks: no OOM, then the lowest peak reserved, then the fewest cudaMalloc calls",
            f.strength.name(),
            f.configs.len(),
            f.steps,
        ));
    }
    if let Some(c) = cap_sentence(f, knob) {
        let lead = if out.is_empty() { "" } else { "Or " };
        out.push(format!("  {lead}{c}"));
    }
    out
}

pub fn text(f: &Forecast, knob: &Knob) -> String {
    let mut s = format!("{}\n\n", headline(f, knob));
    for g in grids(f, knob) {
        s.push_str(&g.to_text());
        s.push('\n');
    }
    let rec = recommendation(f, knob);
    if !rec.is_empty() {
        s.push_str("Recommended\n");
        for l in rec {
            s.push_str(&l);
            s.push('\n');
        }
        s.push('\n');
    }
    for n in notes(f, knob) {
        s.push_str(&n);
        s.push('\n');
    }
    s
}

pub fn markdown(f: &Forecast, knob: &Knob) -> String {
    let mut s = format!("## allocdoc forecast\n\n**{}**\n\n", headline(f, knob));
    for g in grids(f, knob) {
        s.push_str(&g.to_markdown());
        s.push('\n');
    }
    if let Some(c) = &f.recommended {
        s.push_str(&format!(
            "Recommended:\n\n```sh\n{}\n```\n\n",
            Shell::Posix.line(VAR, c)
        ));
    }
    for n in notes(f, knob) {
        s.push_str(&format!("- {}\n", super::common::markdown_escape(&n)));
    }
    s
}

/// Points drawn per line at most: a long run is thinned to the highest
/// value of each stretch of steps.
const CHART_POINTS: usize = 1200;

/// The HTML report: reserved memory after each step per config, the card
/// and each config's OOM marked.
pub fn html(f: &Forecast, knob: &Knob) -> String {
    let lines: Vec<SizeLine> = f
        .configs
        .iter()
        .enumerate()
        .map(|(ci, c)| SizeLine {
            name: format!("{}: reserved after each step", conf_name(&c.conf)),
            points: thin(&c.reserved_after_step),
            allocated: false,
            colour: ci,
        })
        .collect();
    let marks: Vec<(u64, String)> = f
        .configs
        .iter()
        .filter_map(|c| {
            c.oom.as_ref().map(|o| {
                (
                    o.step as u64,
                    format!("OOM at step {}: {}", o.step, conf_name(&c.conf)),
                )
            })
        })
        .collect();
    let chart = line_chart(
        &lines,
        &marks,
        f.capacity_bytes,
        ("reserved memory after each step", "step"),
        false,
    );
    let mut data = ReportData {
        title: format!("allocdoc forecast: a run of {} steps", f.steps),
        subtitle: Some(super::fit::recorded(&f.inputs)),
        verdict: Verdict {
            headline: headline(f, knob),
            tone: match (f.strength, f.configs.iter().any(|c| c.oom.is_none())) {
                (Strength::Uncertain, _) => Tone::Neutral,
                (_, true) => Tone::Good,
                _ => Tone::Bad,
            },
        },
        charts: vec![("Reserved memory over the run".into(), chart)],
        ..ReportData::default()
    };
    if let Some(c) = f.capacity_bytes {
        data.figures.push(Figure {
            label: "card".into(),
            value: human(c),
        });
    }
    data.figures.push(Figure {
        label: "steps".into(),
        value: f.steps.to_string(),
    });
    data.figures.push(Figure {
        label: "strength".into(),
        value: f.strength.name().into(),
    });
    for g in grids(f, knob) {
        data.tables.push(html::Table::of_grid(&g, &[]));
    }
    let mut next = recommendation(f, knob)
        .into_iter()
        .map(|l| l.trim().to_string())
        .collect::<Vec<_>>();
    next.extend(notes(f, knob));
    data.next_steps = next;
    html::render(&data)
}

/// (step, bytes) 1-based, at most [`CHART_POINTS`]: each point the highest
/// of its stretch of steps.
fn thin(values: &[u64]) -> Vec<(u64, u64)> {
    let every = values.len().div_ceil(CHART_POINTS).max(1);
    values
        .chunks(every)
        .enumerate()
        .map(|(i, c)| {
            let (k, v) = c
                .iter()
                .enumerate()
                .max_by_key(|&(_, v)| *v)
                .map_or((0, 0), |(k, &v)| (k, v));
            ((i * every + k + 1) as u64, v)
        })
        .collect()
}
