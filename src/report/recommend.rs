//! Rendering: `recommend` and `validate` (text, JSON, Markdown, HTML).

use super::Format;
use super::html::{Figure, ReportData, Table, TableRow, Tone, Verdict};
use super::markdown;
use super::views::ReportViews;
use crate::advise::Recommendation;
use crate::trial::answer::{Answer, same_config};
use crate::trial::compare::TorchComparison;
use crate::trial::recommend::{RecommendResult, RulesOnly};
use crate::trial::run::Run;
use crate::trial::validate::{Outcome, Validation};
use crate::trial::views::RunViews;
use crate::trial::workload::CapacitySource;
use crate::units::human;
use crate::workload::probe::Calibration;
use std::fmt::Write;

/// How many ranked candidates the text and Markdown tables show.
const SHOWN: usize = 10;

fn conf_label(conf: &str) -> &str {
    if conf.is_empty() {
        "(PyTorch defaults)"
    } else {
        conf
    }
}

fn oom_cell(r: &Run) -> String {
    match (&r.figures.oom, r.figures.stopped_early_at_event) {
        (Some(o), _) => format!("event {} ({})", o.event_index, human(o.requested_bytes)),
        (None, Some(at)) => format!("none to event {at}, stopped"),
        (None, None) => "none".to_string(),
    }
}

/// A capacity and where it came from, e.g. `80.00 GiB (the default card: set --capacity)`.
fn capacity_text(bytes: u64, source: CapacitySource) -> String {
    format!("{} ({})", human(bytes), source.describe())
}

const RUN_HEADERS: [&str; 8] = [
    "config",
    "OOM",
    "peak reserved",
    "peak alloc.",
    "mallocs",
    "frees",
    "retries",
    "syncs",
];

fn run_row(label: String, run: &Run, flag: Option<String>) -> TableRow {
    let r = &run.figures;
    // A run stopped early shows the figures up to its stop: lower bounds.
    let at_least = |v: String| match r.stopped_early_at_event {
        Some(_) => format!("≥ {v}"),
        None => v,
    };
    TableRow {
        cells: vec![
            label,
            oom_cell(run),
            at_least(human(r.peak_reserved_bytes)),
            at_least(human(r.peak_allocated_bytes)),
            at_least(r.device_allocs.to_string()),
            at_least(r.device_frees.to_string()),
            at_least(r.alloc_retries.to_string()),
            at_least(r.synchronizations.to_string()),
        ],
        flag,
    }
}

fn runs_table(title: &str, rows: Vec<TableRow>, note: Option<String>) -> Table {
    Table {
        title: title.to_string(),
        headers: RUN_HEADERS.iter().map(|h| h.to_string()).collect(),
        rows,
        note,
    }
}

/// The probe's fit: observed vs reproduced, and what the probe is.
fn fit_table(p: &Calibration) -> Table {
    let pct = |got: u64, want: u64| {
        if want == 0 {
            "-".to_string()
        } else {
            format!("{:+.1} %", 100.0 * (got as f64 - want as f64) / want as f64)
        }
    };
    let mut rows = vec![
        TableRow {
            cells: vec![
                "allocated".into(),
                human(p.observed.allocated_bytes),
                human(p.reproduced.allocated_bytes),
                pct(p.reproduced.allocated_bytes, p.observed.allocated_bytes),
            ],
            flag: None,
        },
        TableRow {
            cells: vec![
                "reserved".into(),
                human(p.observed.reserved_bytes),
                human(p.reproduced.reserved_bytes),
                pct(p.reproduced.reserved_bytes, p.observed.reserved_bytes),
            ],
            flag: None,
        },
    ];
    if let Some(r) = p.observed.requested_bytes {
        rows.push(TableRow {
            cells: vec![
                "request".into(),
                human(r),
                if p.reproduces_oom {
                    format!("{} (OOM reproduced)", human(r))
                } else {
                    format!("{} (no OOM under the current config)", human(r))
                },
                "-".into(),
            ],
            flag: (!p.reproduces_oom).then(|| "OOM not reproduced".to_string()),
        });
    }
    Table {
        title: "Synthetic probe fit (observed in the evidence vs reproduced by replay)".into(),
        headers: vec![
            "figure".into(),
            "observed".into(),
            "reproduced".into(),
            "error".into(),
        ],
        rows,
        note: Some(format!(
            "SYNTHETIC: no trace was given, so this is a \"{}\" workload ({} steps of {} tensors) \
             fitted to the evidence; fit error {:.1} % ({} the {:.0} % tolerance). Results are \
             only as good as the fit.",
            p.family.name(),
            p.params.steps,
            human(p.params.unit),
            100.0 * p.error,
            if p.within_tolerance {
                "within"
            } else {
                "OUTSIDE"
            },
            100.0 * crate::workload::probe::TOLERANCE
        )),
    }
}

fn recommendation_tables(r: &RecommendResult) -> Vec<Table> {
    let mut tables = Vec::new();
    if let Some(p) = &r.probe {
        tables.push(fit_table(p));
    }
    let ranked = r
        .candidates
        .iter()
        .take(SHOWN)
        .enumerate()
        .map(|(i, c)| run_row(format!("#{} {}", i + 1, conf_label(&c.conf)), c, None))
        .collect();
    tables.push(runs_table(
        &format!("Best {} of {} configs, ranked", SHOWN.min(r.candidates.len()), r.candidates.len()),
        ranked,
        Some(format!(
            "Ranked by: no OOM first, then lowest peak reserved, then fewest cudaMalloc+cudaFree (mallocs, frees), retries and synchronisations.{}",
            match r.search.configs_stopped_early {
                0 => String::new(),
                n => format!(
                    " {n} configs stopped once their reserved memory passed the best finished run's peak (figures marked ≥ are as of the stop); they rank after the {} that finished.",
                    r.search.configs_finished
                ),
            }
        )),
    ));
    let mut rows = vec![run_row(
        format!("current: {}", conf_label(&r.current.conf)),
        &r.current,
        None,
    )];
    let answer = r.recommendation.as_ref().map(|x| x.value.as_str());
    if let Some(best) = r.candidates.first() {
        let label = if answer.is_some_and(|a| same_config(a, &best.conf)) {
            "recommended"
        } else {
            "best replayed"
        };
        rows.push(run_row(
            format!("{label}: {}", conf_label(&best.conf)),
            best,
            None,
        ));
    }
    tables.push(runs_table("Against the current config", rows, None));
    tables
}

/// The setup, the diagnosis and the override sentence, one line each: what
/// every replaying command says before its own findings.
fn answer_lines(a: &Answer) -> Vec<String> {
    let mut v = vec![format!("Setup: {}", a.setup.describe())];
    if let Some(d) = &a.diagnosis {
        v.push(format!("Diagnosis: {d}"));
    }
    if let Some(o) = &a.overrides {
        v.push(format!("Replay vs rules: {o}."));
    }
    v
}

fn recommendation_headline(r: &RecommendResult) -> String {
    let Some(rec) = &r.recommendation else {
        return if r.candidates.len() < 2 {
            // Only the config in use ran: the setup admits no other (the notes say why).
            format!(
                "no allocator setting could be tried for this setup{}",
                if r.candidates.iter().all(|c| c.figures.oom.is_some()) {
                    format!(
                        "; the current config runs out of memory at {}",
                        human(r.capacity_bytes)
                    )
                } else {
                    String::new()
                }
            )
        } else if r.candidates.iter().all(|c| c.figures.oom.is_some()) {
            format!(
                "every one of the {} configs runs out of memory at {}: no allocator setting avoids this OOM",
                r.candidates.len(),
                human(r.capacity_bytes)
            )
        } else {
            match r.answer.cause {
                Some(c) if c.rules_out_settings() => format!(
                    "no allocator setting: the cause is {}, which no setting fixes",
                    c.as_str()
                ),
                _ => "no allocator setting to recommend from this evidence".to_string(),
            }
        };
    };
    let run = r
        .candidates
        .iter()
        .chain(r.advice.iter())
        .find(|c| same_config(&c.conf, &rec.value));
    let mut s = if rec.value.is_empty() {
        "PyTorch's defaults do best here (unset PYTORCH_CUDA_ALLOC_CONF)".to_string()
    } else if r
        .candidates
        .first()
        .is_some_and(|b| same_config(&b.conf, &rec.value))
    {
        format!("{} does best", rec.value)
    } else {
        format!("{} is the answer", rec.value)
    };
    if let Some(run) = run {
        match (
            &r.current.figures.oom,
            r.current
                .figures
                .peak_reserved_bytes
                .checked_sub(run.figures.peak_reserved_bytes),
        ) {
            (Some(_), _) => s.push_str(": it avoids the OOM the current config hits"),
            (None, Some(saved)) if saved > 0 => {
                let _ = write!(
                    s,
                    ": peak reserved {} lower than the current config",
                    human(saved)
                );
            }
            _ => {}
        }
    }
    if let Some(m) = r.min_capacity_bytes {
        let _ = write!(s, "; it still runs with {}", human(m));
    }
    s
}

/// The line to set, for every shell of the platform and in Python.
fn recommended_block(r: &Recommendation) -> String {
    let mut s = String::from("Recommended\n");
    for l in &r.lines {
        let _ = writeln!(s, "  {}", l.line);
    }
    s.push_str("  or in Python:\n");
    for l in r.python.lines() {
        let _ = writeln!(s, "    {l}");
    }
    s
}

/// `recommend`'s output when nothing could be replayed: the rules' answer.
pub fn rules_only(r: &RulesOnly, format: Format) -> String {
    match format {
        Format::Json | Format::Jsonl => super::common::json(r),
        Format::Text => {
            let mut s = format!("recommend: nothing to replay: {}\n", r.not_replayed);
            for l in answer_lines(&r.answer) {
                let _ = writeln!(s, "{l}");
            }
            match &r.recommendation {
                Some(rec) => {
                    s.push_str("\nThe rules' line (not replayed):\n");
                    s.push_str(&recommended_block(rec));
                }
                None => s.push_str("\nNo allocator setting to recommend.\n"),
            }
            s
        }
        Format::Markdown => {
            let mut s = markdown::summary_line(
                "allocdoc recommend",
                &format!("nothing to replay: {}", r.not_replayed),
            );
            s.push('\n');
            for l in answer_lines(&r.answer) {
                let _ = writeln!(s, "- {}", markdown::cell(&l));
            }
            if let Some(rec) = &r.recommendation {
                s.push('\n');
                s.push_str(&markdown::code_block("sh", &rec.line));
            }
            s
        }
    }
}

/// `recommend`'s output in `format`.
pub fn recommendation(r: &RecommendResult, format: Format) -> String {
    match format {
        Format::Json | Format::Jsonl => json_with_probe(r, r.probe.as_ref()),
        Format::Text => {
            let mut s = format!(
                "recommend: {} ({} events), capacity {}\n",
                r.input,
                r.events,
                capacity_text(r.capacity_bytes, r.capacity_source),
            );
            for l in answer_lines(&r.answer) {
                let _ = writeln!(s, "{l}");
            }
            let _ = writeln!(s, "{}\n", recommendation_headline(r));
            for t in recommendation_tables(r) {
                s.push_str(&t.to_text());
                s.push('\n');
            }
            if let Some(rec) = &r.recommendation {
                s.push_str(&recommended_block(rec));
            }
            for n in &r.notes {
                let _ = writeln!(s, "note: {n}");
            }
            s
        }
        Format::Markdown => {
            let mut s = markdown::summary_line("allocdoc recommend", &recommendation_headline(r));
            s.push('\n');
            for l in answer_lines(&r.answer) {
                let _ = writeln!(s, "- {}", markdown::cell(&l));
            }
            s.push('\n');
            if let Some(rec) = &r.recommendation {
                s.push_str(&markdown::code_block("sh", &rec.line));
                s.push('\n');
            }
            for t in recommendation_tables(r) {
                s.push_str(&markdown::titled_table(&t));
            }
            for n in &r.notes {
                let _ = writeln!(s, "- note: {}", markdown::cell(n));
            }
            s
        }
    }
}

/// Every shell's line, one a line, for a report's copy block.
fn export_lines(r: &Recommendation) -> String {
    r.lines
        .iter()
        .map(|l| l.line.as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

/// `recommend --report`: the self-contained HTML page.
pub fn recommendation_html(r: &RecommendResult, views: &RunViews) -> String {
    super::html::render(&ReportData {
        title: "allocdoc recommend".into(),
        subtitle: Some(format!("{} ({} events)", r.input, r.events)),
        verdict: Verdict {
            headline: recommendation_headline(r),
            tone: if r.recommendation.is_some() {
                Tone::Good
            } else {
                Tone::Bad
            },
        },
        export_line: r.recommendation.as_ref().map(export_lines),
        figures: vec![
            Figure {
                label: "capacity".into(),
                value: capacity_text(r.capacity_bytes, r.capacity_source),
            },
            Figure {
                label: "configs searched".into(),
                value: r.candidates.len().to_string(),
            },
            Figure {
                label: "smallest capacity".into(),
                value: r.min_capacity_bytes.map_or_else(|| "-".into(), human),
            },
        ],
        capacity: Some(r.capacity_bytes),
        tables: recommendation_tables(r),
        ..ReportViews::of_run_views(views).into_data()
    })
}

fn validation_tables(v: &Validation) -> Vec<Table> {
    let mut tables = Vec::new();
    if let Some(p) = &v.probe {
        tables.push(fit_table(p));
    }
    let flag = |r: &Run| r.figures.oom.as_ref().map(|_| "OOM".to_string());
    tables.push(runs_table(
        "Current vs candidate",
        vec![
            run_row(
                format!("current: {}", conf_label(&v.current.conf)),
                &v.current,
                flag(&v.current),
            ),
            run_row(
                format!("candidate: {}", conf_label(&v.candidate.conf)),
                &v.candidate,
                flag(&v.candidate),
            ),
        ],
        v.device.starts_with("cuda").then(|| {
            format!(
                "Measured on {}: driver time {:.0} µs (current) vs {:.0} µs (candidate).",
                v.device, v.current.figures.driver_time_us, v.candidate.figures.driver_time_us
            )
        }),
    ));
    tables
}

/// `validate`'s output in `format`.
pub fn validation(v: &Validation, format: Format) -> String {
    match format {
        Format::Json | Format::Jsonl => json_with_probe(v, v.probe.as_ref()),
        Format::Text => {
            let mut s = format!(
                "validate: {} on {}, capacity {}\n",
                v.input,
                v.device,
                capacity_text(v.capacity_bytes, v.capacity_source),
            );
            for l in answer_lines(&v.answer) {
                let _ = writeln!(s, "{l}");
            }
            let _ = writeln!(s, "Verdict: {}\n", v.verdict.sentence());
            for t in validation_tables(v) {
                s.push_str(&t.to_text());
                s.push('\n');
            }
            s
        }
        Format::Markdown => {
            let mut s = markdown::summary_line("allocdoc validate", &v.verdict.sentence());
            s.push('\n');
            for l in answer_lines(&v.answer) {
                let _ = writeln!(s, "- {}", markdown::cell(&l));
            }
            s.push('\n');
            for t in validation_tables(v) {
                s.push_str(&markdown::titled_table(&t));
            }
            s
        }
    }
}

/// `value` as pretty JSON, with the probe's fit under `probe` when there is one.
fn json_with_probe(value: &impl serde::Serialize, probe: Option<&Calibration>) -> String {
    let mut value = serde_json::to_value(value).unwrap_or_default();
    if let (Some(p), Some(obj)) = (probe, value.as_object_mut()) {
        obj.insert("probe".into(), probe_json(p));
    }
    super::common::json(&value)
}

fn probe_json(p: &Calibration) -> serde_json::Value {
    serde_json::json!({
        "synthetic": true,
        "family": p.family.name(),
        "steps": p.params.steps,
        "unit_bytes": p.params.unit,
        "seed": p.params.seed,
        "observed": {"allocated_bytes": p.observed.allocated_bytes,
                     "reserved_bytes": p.observed.reserved_bytes,
                     "requested_bytes": p.observed.requested_bytes},
        "reproduced": {"allocated_bytes": p.reproduced.allocated_bytes,
                       "reserved_bytes": p.reproduced.reserved_bytes},
        "fit_error": p.error,
        "tolerance": crate::workload::probe::TOLERANCE,
        "within_tolerance": p.within_tolerance,
        "reproduces_oom": p.reproduces_oom,
        "capacity_bytes": p.capacity,
    })
}

/// `validate --report`: the self-contained HTML page.
pub fn validation_html(v: &Validation, views: &RunViews) -> String {
    super::html::render(&ReportData {
        title: "allocdoc validate".into(),
        subtitle: Some(format!("{} on {}", v.input, v.device)),
        verdict: Verdict {
            headline: v.verdict.sentence(),
            tone: match v.outcome() {
                Outcome::Helps => Tone::Good,
                Outcome::Same => Tone::Neutral,
                Outcome::Worse => Tone::Bad,
            },
        },
        // The block to copy only for a candidate that helps and is the answer's line.
        export_line: v
            .answer
            .recommendation
            .as_ref()
            .filter(|r| v.outcome() == Outcome::Helps && same_config(&r.value, &v.candidate.conf))
            .map(export_lines),
        capacity: Some(v.capacity_bytes),
        tables: validation_tables(v),
        ..ReportViews::of_run_views(views).into_data()
    })
}

/// `replay --compare-with`: the bundled allocator next to PyTorch, differences flagged.
pub fn torch_comparison(c: &TorchComparison, format: Format) -> String {
    if format.is_json() {
        return super::common::json(c);
    }
    let show = |v: Option<i64>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
    let rows: Vec<TableRow> = c
        .figures
        .iter()
        .map(|f| TableRow {
            cells: vec![f.metric.to_string(), show(f.allocdoc), show(f.torch)],
            flag: (!f.agrees()).then(|| "differs".to_string()),
        })
        .collect();
    let differing = c.figures.iter().filter(|f| !f.agrees()).count();
    let table = Table {
        title: format!(
            "allocdoc vs PyTorch {} on {} (config: {})",
            c.torch_version,
            c.device_name,
            if c.conf.is_empty() {
                "defaults"
            } else {
                &c.conf
            }
        ),
        headers: vec!["figure".into(), "allocdoc".into(), "PyTorch".into()],
        rows,
        note: Some(if differing == 0 {
            "Every figure agrees.".to_string()
        } else {
            format!("{differing} figure(s) differ.")
        }),
    };
    match format {
        Format::Markdown => format!(
            "**{}**\n\n{}",
            markdown::cell(&table.title),
            markdown::table(&table)
        ),
        _ => table.to_text(),
    }
}
