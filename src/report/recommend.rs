//! Rendering: `recommend` and `validate` (text, JSON, Markdown, HTML).

use super::Format;
use super::html::{Figure, ReportData, Table, TableRow, Tone, Verdict};
use super::markdown;
use super::views::ReportViews;
use crate::advise::Recommendation;
use crate::conf::TorchVersion;
use crate::trial::answer::{Answer, same_config};
use crate::trial::compare::TorchComparison;
use crate::trial::ensemble::{EnsembleSearch, WorkloadJudgement};
use crate::trial::placement::Fate;
use crate::trial::recommend::{RecommendResult, RulesOnly};
use crate::trial::run::Run;
use crate::trial::validate::{Outcome, Strength, Validation, Verdict as Judgement};
use crate::trial::views::RunViews;
use crate::trial::workload::CapacitySource;
use crate::units::{format_size, human};
use crate::workload::probe::Ensemble;
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

/// The evidence the workloads were fitted to, in one line.
fn observed_text(e: &Ensemble) -> String {
    let o = &e.observed;
    let mut s = format!(
        "allocated {}, reserved {}",
        human(o.allocated_bytes),
        human(o.reserved_bytes)
    );
    if let Some(r) = o.requested_bytes {
        let _ = write!(s, ", a {} request", format_size(r));
    }
    if e.capacity != crate::device::NO_LIMIT {
        let _ = write!(s, " failing with {} of room", human(e.capacity));
    }
    s
}

/// Every workload fitted to the evidence: its fit, how the current config's
/// run of it ended, and (validate) what the candidate did on it.
fn workloads_table(e: &Ensemble, judged: &[WorkloadJudgement]) -> Table {
    let with_candidate = judged.iter().any(|j| j.candidate.is_some());
    let mut headers = vec![
        "workload".to_string(),
        "fit error".to_string(),
        "current config".to_string(),
    ];
    if with_candidate {
        headers.push("candidate".to_string());
    }
    let rows = judged
        .iter()
        .map(|j| {
            let mut cells = vec![
                j.family.to_string(),
                format!("{:.1} %", 100.0 * j.fit_error),
                j.current.clone(),
            ];
            if with_candidate {
                cells.push(match (j.candidate, crate::trial::ensemble::peak_words(j)) {
                    (Some(Fate::Avoids), Some(peak)) if e.observed.requested_bytes.is_none() => {
                        peak
                    }
                    (Some(Fate::Avoids), _) => format!(
                        "avoids the OOM (peak reserved {})",
                        j.candidate_peak_reserved_bytes
                            .map_or_else(String::new, human)
                    ),
                    (Some(Fate::AvoidsNarrowly), _) => format!(
                        "avoids the OOM, narrowly (peak reserved {})",
                        j.candidate_peak_reserved_bytes
                            .map_or_else(String::new, human)
                    ),
                    (Some(Fate::Fails), _) => "runs out of memory".to_string(),
                    (Some(Fate::DependsOnPlacement), _) => {
                        "runs out of memory under some placements only".to_string()
                    }
                    (None, _) => "-".to_string(),
                });
            }
            TableRow {
                cells,
                flag: (!j.reproduces).then(|| "does not reproduce".to_string()),
            }
        })
        .collect();
    Table {
        title: "Workloads fitted to the evidence (SYNTHETIC)".into(),
        headers,
        rows,
        note: Some(format!(
            "SYNTHETIC: no trace was given, so these workload shapes were fitted to the evidence \
             ({}). Only those that reproduce it count: under the current config they {} with \
             allocated and reserved within {:.0} %.",
            observed_text(e),
            if e.observed.requested_bytes.is_some() {
                "run out of memory on the message's request"
            } else {
                "run without an OOM"
            },
            100.0 * crate::workload::probe::TOLERANCE
        )),
    }
}

/// The ensemble's ranking: how many plausible workloads each config survives.
fn ensemble_table(found: &EnsembleSearch) -> Table {
    let rows = found
        .ranked
        .iter()
        .take(SHOWN)
        .enumerate()
        .map(|(i, c)| TableRow {
            cells: vec![
                format!("#{} {}", i + 1, conf_label(&c.conf)),
                format!("{} of {}", c.avoids, found.plausible),
                format!("{} of {}", c.avoids_with_margin, found.plausible),
                c.avoids_under_every_placement.map_or_else(
                    || "-".to_string(),
                    |k| format!("{k} of {}", found.plausible),
                ),
                if c.fails_on.is_empty() {
                    "-".to_string()
                } else {
                    c.fails_on.join(", ")
                },
            ],
            flag: None,
        })
        .collect();
    Table {
        title: format!(
            "Best {} of {} configs across the {} plausible workloads",
            SHOWN.min(found.ranked.len()),
            found.ranked.len(),
            found.plausible
        ),
        headers: vec![
            "config".into(),
            "runs without OOM on".into(),
            "with 3 % to spare".into(),
            "and under every placement".into(),
            "fails on".into(),
        ],
        rows,
        note: Some(
            "Ranked by: plausible workloads without OOM, with 3 % of the room to spare, under \
             every placement (checked for the best few), then with that margin, then without \
             OOM, then the lower mean peak reserved, then fewer driver calls."
                .into(),
        ),
    }
}

/// The lines that make the next run a trace, so the next answer is proven
/// (`torch.cuda.memory._record_memory_history` and `_dump_snapshot` from 2.1;
/// 2.0 has only the boolean form and no `_dump_snapshot`).
pub fn capture_lines(version: TorchVersion) -> Vec<String> {
    let mut lines = vec![
        "# Record a trace, so that the next answer is proven rather than fitted:".to_string(),
        "import torch".to_string(),
    ];
    if version >= TorchVersion::new(2, 1) {
        lines.extend([
            "torch.cuda.memory._record_memory_history(max_entries=100_000)  # at start".to_string(),
            "try:".to_string(),
            "    train()  # your workload".to_string(),
            "except torch.cuda.OutOfMemoryError:".to_string(),
            "    torch.cuda.memory._dump_snapshot(\"oom_snapshot.pickle\")".to_string(),
            "    raise".to_string(),
        ]);
    } else {
        lines.extend([
            "import pickle".to_string(),
            "torch.cuda.memory._record_memory_history(True, trace_alloc_max_entries=100_000)  # at start"
                .to_string(),
            "try:".to_string(),
            "    train()  # your workload".to_string(),
            "except RuntimeError:  # the CUDA out-of-memory error".to_string(),
            "    with open(\"oom_snapshot.pickle\", \"wb\") as f:".to_string(),
            "        pickle.dump(torch.cuda.memory._snapshot(), f)".to_string(),
            "    raise".to_string(),
        ]);
    }
    lines.push("# then: allocdoc recommend oom_snapshot.pickle".to_string());
    lines
}

/// "Verdict: …" (the answer, one sentence), its details one a line below,
/// and "Evidence: …".
fn verdict_lines(label: &str, v: &Judgement) -> String {
    let mut s = format!("{label}: {}\n", v.headline());
    for d in v.details() {
        let _ = writeln!(s, "  - {d}");
    }
    let _ = writeln!(s, "Evidence: {}", v.evidence());
    s
}

/// What was replayed, for a header: "1 event", "4496 events", or for text
/// evidence the fitted workloads (whose events are not the user's).
fn replayed_what(events: u64, probe: bool) -> String {
    match (probe, events) {
        (true, _) => "text evidence, replayed on fitted workloads".to_string(),
        (false, 1) => "1 event".to_string(),
        (false, n) => format!("{n} events"),
    }
}

fn recommendation_tables(r: &RecommendResult) -> Vec<Table> {
    let mut tables = Vec::new();
    if let (Some(e), Some(found)) = (&r.probe, &r.ensemble)
        && !e.members.is_empty()
    {
        tables.push(workloads_table(e, &found.workloads));
        if found.plausible > 0 {
            tables.push(ensemble_table(found));
        }
    }
    let on_probe = r.probe.is_some();
    if on_probe && r.ensemble.as_ref().is_none_or(|f| f.plausible == 0) {
        return tables;
    }
    let ranked = r
        .candidates
        .iter()
        .take(SHOWN)
        .enumerate()
        .map(|(i, c)| run_row(format!("#{} {}", i + 1, conf_label(&c.conf)), c, None))
        .collect();
    if !on_probe {
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
    }
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
    let title = match r
        .ensemble
        .as_ref()
        .and_then(|f| f.workloads.iter().find(|w| w.reproduces))
    {
        Some(w) => format!(
            "Against the current config, on the closest plausible workload ('{}')",
            w.family
        ),
        None => "Against the current config".to_string(),
    };
    tables.push(runs_table(&title, rows, None));
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

/// `recommend`'s or `validate`'s (`command`) output when nothing could be
/// replayed: the rules' answer.
pub fn rules_only(command: &str, r: &RulesOnly, format: Format) -> String {
    match format {
        Format::Json | Format::Jsonl => super::common::json(r),
        Format::Text => {
            let mut s = format!("{command}: nothing to replay: {}\n", r.not_replayed);
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
                &format!("allocdoc {command}"),
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
        Format::Json | Format::Jsonl => json_with_probe(r, r.probe.as_ref(), r.torch_version),
        Format::Text => {
            let mut s = format!(
                "recommend: {} ({}), capacity {}\n",
                r.input,
                replayed_what(r.events, r.probe.is_some()),
                capacity_text(r.capacity_bytes, r.capacity_source),
            );
            for l in answer_lines(&r.answer) {
                let _ = writeln!(s, "{l}");
            }
            let _ = writeln!(s, "{}", verdict_lines("Verdict", &r.verdict));
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
            if r.probe.is_some() {
                s.push('\n');
                for line in capture_lines(r.torch_version) {
                    let _ = writeln!(s, "{line}");
                }
            }
            s
        }
        Format::Markdown => {
            let mut s = markdown::summary_line("allocdoc recommend", r.verdict.headline());
            for d in r.verdict.details() {
                let _ = writeln!(s, "- {}", markdown::cell(d));
            }
            let _ = writeln!(s, "Evidence: {}\n", markdown::cell(&r.verdict.evidence()));
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
            if r.probe.is_some() {
                s.push('\n');
                s.push_str(&markdown::code_block(
                    "python",
                    &capture_lines(r.torch_version).join("\n"),
                ));
            }
            s
        }
    }
}

/// The verdict box's colour: green only for what would pass a gate (exit 0).
fn tone(v: &Judgement) -> Tone {
    match v.exit_code {
        0 => Tone::Good,
        1 => Tone::Bad,
        _ => Tone::Neutral,
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
        subtitle: Some(format!(
            "{} ({})",
            r.input,
            replayed_what(r.events, r.probe.is_some())
        )),
        verdict: Verdict {
            headline: r.verdict.sentence(),
            tone: tone(&r.verdict),
        },
        export_line: r.recommendation.as_ref().map(export_lines),
        figures: vec![
            Figure {
                label: "evidence".into(),
                value: r.verdict.evidence(),
            },
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
    if let Some(e) = &v.ensemble {
        if !e.members.is_empty() {
            tables.push(workloads_table(e, &v.workloads));
        }
        if v.verdict.strength == Strength::Uncertain && v.workloads.iter().all(|w| !w.reproduces) {
            return tables;
        }
    }
    let flag = |r: &Run| r.figures.oom.as_ref().map(|_| "OOM".to_string());
    let title = match v.workloads.iter().find(|w| w.reproduces) {
        Some(w) => format!(
            "Current vs candidate, on the closest plausible workload ('{}')",
            w.family
        ),
        None => "Current vs candidate".to_string(),
    };
    tables.push(runs_table(
        &title,
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
        Format::Json | Format::Jsonl => json_with_probe(v, v.ensemble.as_ref(), v.torch_version),
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
            let _ = writeln!(s, "{}", verdict_lines("Verdict", &v.verdict));
            for t in validation_tables(v) {
                s.push_str(&t.to_text());
                s.push('\n');
            }
            if v.ensemble.is_some() {
                for line in capture_lines(v.torch_version) {
                    let _ = writeln!(s, "{line}");
                }
            }
            s
        }
        Format::Markdown => {
            let mut s = markdown::summary_line("allocdoc validate", v.verdict.headline());
            for d in v.verdict.details() {
                let _ = writeln!(s, "- {}", markdown::cell(d));
            }
            let _ = writeln!(s, "Evidence: {}\n", markdown::cell(&v.verdict.evidence()));
            for l in answer_lines(&v.answer) {
                let _ = writeln!(s, "- {}", markdown::cell(&l));
            }
            s.push('\n');
            for t in validation_tables(v) {
                s.push_str(&markdown::titled_table(&t));
            }
            if v.ensemble.is_some() {
                s.push_str(&markdown::code_block(
                    "python",
                    &capture_lines(v.torch_version).join("\n"),
                ));
            }
            s
        }
    }
}

/// `value` as pretty JSON; for text evidence with the ensemble's summary under
/// `probe` and the lines that record a trace under `capture`.
fn json_with_probe(
    value: &impl serde::Serialize,
    ensemble: Option<&Ensemble>,
    version: TorchVersion,
) -> String {
    let mut value = serde_json::to_value(value).unwrap_or_default();
    if let (Some(e), Some(obj)) = (ensemble, value.as_object_mut()) {
        obj.insert("probe".into(), probe_json(e));
        obj.insert("capture".into(), serde_json::json!(capture_lines(version)));
    }
    super::common::json(&value)
}

fn probe_json(e: &Ensemble) -> serde_json::Value {
    let mut v = serde_json::json!({
        "synthetic": true,
        "observed": {"allocated_bytes": e.observed.allocated_bytes,
                     "reserved_bytes": e.observed.reserved_bytes,
                     "requested_bytes": e.observed.requested_bytes},
        "capacity_bytes": e.capacity,
        "tolerance": crate::workload::probe::TOLERANCE,
        "fitted": e.members.len(),
        "plausible": e.plausible().count(),
        "members": e.members.iter().map(|m| serde_json::json!({
            "family": m.family.name(),
            "steps": m.params.steps,
            "unit_bytes": m.params.unit,
            "seed": m.params.seed,
            "ballast_bytes": m.params.ballast,
            "request_bytes": m.request_bytes,
            "reproduced": {"allocated_bytes": m.reproduced.allocated_bytes,
                           "reserved_bytes": m.reproduced.reserved_bytes},
            "fit_error": m.error,
            "within_tolerance": m.within_tolerance,
            "reproduces": m.reproduces,
        })).collect::<Vec<_>>(),
    });
    // The closest member's fit at the top, as when one probe was fitted.
    if let (Some(m), Some(obj)) = (e.best(), v.as_object_mut()) {
        for (k, x) in [
            ("family", serde_json::json!(m.family.name())),
            ("steps", serde_json::json!(m.params.steps)),
            ("unit_bytes", serde_json::json!(m.params.unit)),
            ("seed", serde_json::json!(m.params.seed)),
            ("ballast_bytes", serde_json::json!(m.params.ballast)),
            (
                "reproduced",
                serde_json::json!({"allocated_bytes": m.reproduced.allocated_bytes,
                                   "reserved_bytes": m.reproduced.reserved_bytes}),
            ),
            ("fit_error", serde_json::json!(m.error)),
            ("within_tolerance", serde_json::json!(m.within_tolerance)),
            ("reproduces_oom", serde_json::json!(m.reproduces)),
        ] {
            obj.insert(k.into(), x);
        }
    }
    v
}

/// `validate --report`: the self-contained HTML page.
pub fn validation_html(v: &Validation, views: &RunViews) -> String {
    super::html::render(&ReportData {
        title: "allocdoc validate".into(),
        subtitle: Some(format!("{} on {}", v.input, v.device)),
        verdict: Verdict {
            headline: v.verdict.sentence(),
            tone: tone(&v.verdict),
        },
        // The block to copy only for a candidate that helps, is the answer's
        // line, and whose verdict would pass a gate (exit 0).
        export_line: v
            .answer
            .recommendation
            .as_ref()
            .filter(|r| {
                v.verdict.exit_code == 0
                    && v.outcome() == Outcome::Helps
                    && same_config(&r.value, &v.candidate.conf)
            })
            .map(export_lines),
        figures: vec![Figure {
            label: "evidence".into(),
            value: v.verdict.evidence(),
        }],
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
