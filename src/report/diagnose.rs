//! Rendering: diagnose. The verdict first, then the evidence it rests on, the
//! findings, the one environment line (or why there is none), what to check
//! next, and with `-v` the rules that could not be evaluated.

use crate::advise::{Diagnosis, Finding, NotEvaluated, Recommendation, ReplayCheck, Withheld};
use crate::evidence::{Kind, Observation};
use crate::rules::Fact;
use crate::rules::catalog::{MetricKind, lookup};
use crate::rules::expr::format_number;
use crate::units::format_size;
use crate::workload::RunFigures;
use comfy_table::{ContentArrangement, Table, presets};
use serde::Serialize;
use std::fmt::Write;

/// Widest the findings table gets: longer message lines are hard to read.
const TABLE_WIDTH: u16 = 110;

pub fn text(d: &Diagnosis, verbose: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", d.verdict);
    if let Some(p) = primary(d) {
        let _ = writeln!(out, "\nEvidence: {}", describe(p));
        let sizes = sizes(p);
        if !sizes.is_empty() {
            let _ = writeln!(out, "  {}", sizes.join(" · "));
        }
        let others = d.evidence.observations.len() - 1;
        if others > 0 {
            let _ = writeln!(
                out,
                "  (+{others} more observation{} in the input; series from every summary/stats dump)",
                if others == 1 { "" } else { "s" }
            );
        }
    }
    if let Some((value, source)) = &d.current_conf {
        let _ = writeln!(out, "  current config ({source}): {value}");
    }
    let _ = writeln!(out, "Setup: {}", d.setup.describe());
    for line in incident_lines(d) {
        let _ = writeln!(out, "{line}");
    }
    if let Some(ranks) = super::ranks::rank_table(&d.evidence) {
        let _ = write!(out, "\n{}", ranks.table().to_text());
    }
    if !d.findings.is_empty() {
        let mut t = Table::new();
        t.load_style(presets::UTF8_FULL_CONDENSED)
            .force_no_tty()
            .set_content_arrangement(ContentArrangement::Dynamic)
            .set_width(TABLE_WIDTH.min(super::common::text_width()))
            .set_header(["severity", "rule", "finding"]);
        for f in &d.findings {
            t.add_row([f.severity.as_str(), f.rule.as_str(), &finding_text(f)]);
        }
        let _ = writeln!(out, "\nFindings\n{t}");
    }
    match &d.recommendation {
        Some(r) => recommendation_text(&mut out, r),
        None => {
            let _ = writeln!(out, "\n{}", d.no_line().unwrap_or_default());
        }
    }
    if let Some(f) = &d.fills {
        let _ = write!(out, "\n{}", super::top::fills_text(f, false));
    }
    let next = next_steps(d);
    if !next.is_empty() {
        let _ = writeln!(out, "\nWhat to check next");
        for n in next {
            let _ = writeln!(out, "  - {n}");
        }
    }
    if verbose {
        verbose_text(&mut out, d);
    } else if !d.not_evaluated.is_empty() {
        let _ = writeln!(
            out,
            "\n{} rule{} could not be evaluated for lack of evidence (-v lists them).",
            d.not_evaluated.len(),
            if d.not_evaluated.len() == 1 { "" } else { "s" }
        );
    }
    out
}

/// A finding's message, then where it points in the program and what the
/// replay of its suggestion showed.
fn finding_text(f: &Finding) -> String {
    let mut text = f.message.clone();
    if let Some(site) = &f.site {
        let _ = write!(text, "\nAt {site}.");
    }
    if let Some(c) = &f.replay_check {
        let _ = write!(text, "\nReplayed with {}: {}.", c.settings, c.finding);
    }
    text
}

/// How many incidents, which one the verdict is about, and the others whose
/// cause differs.
fn incident_lines(d: &Diagnosis) -> Vec<String> {
    if d.incident_count < 2 {
        return Vec::new();
    }
    let mut v = vec![format!(
        "Incidents: {} separate OOMs in the input; the verdict is about the one above, chosen by \
         the most complete evidence, then severity.",
        d.incident_count
    )];
    for i in d.differing_incidents() {
        if let Some(o) = d.evidence.observations.get(i.observation) {
            v.push(format!("  also: {}: {}", describe(o), i.verdict));
        }
    }
    if !d.other_incidents.is_empty() {
        let counts: Vec<String> = d
            .other_incidents
            .iter()
            .map(|c| format!("{} {}", c.count, c.cause.as_str()))
            .collect();
        v.push(format!(
            "  and {} more, by cause: {}",
            d.incident_count - d.incidents.len(),
            counts.join(", ")
        ));
    }
    v
}

fn recommendation_text(out: &mut String, r: &Recommendation) {
    let _ = writeln!(out, "\nRecommended");
    for l in &r.lines {
        let _ = writeln!(out, "  {}", l.line);
    }
    let _ = writeln!(out, "  or in Python:");
    for l in r.python.lines() {
        let _ = writeln!(out, "    {l}");
    }
    if let Some(n) = &r.note {
        let _ = writeln!(out, "  Note: {n}");
    }
    for d in &r.dropped {
        let _ = writeln!(out, "  Not included: {d}");
    }
}

fn verbose_text(out: &mut String, d: &Diagnosis) {
    if !d.not_evaluated.is_empty() {
        let _ = writeln!(out, "\nNot evaluated");
        for n in &d.not_evaluated {
            let _ = writeln!(out, "  - {}: needs {}", n.rule, n.needs.join(", "));
        }
    }
    if !d.facts.values.is_empty() {
        let _ = writeln!(out, "\nMetrics the rules saw");
        for (name, fact) in &d.facts.values {
            let _ = writeln!(out, "  {name:<30} {}", fact_text(name, fact));
        }
    }
    for (rule, why) in &d.failed {
        let _ = writeln!(out, "  - {rule}: failed: {why}");
    }
    if !d.withheld.is_empty() {
        let _ = writeln!(
            out,
            "\nNot shown: trace findings whose settings the replay did not support"
        );
        for w in &d.withheld {
            let settings: Vec<String> =
                w.settings.iter().map(|(k, v)| format!("{k}:{v}")).collect();
            let _ = writeln!(
                out,
                "  - {} ({}): {}",
                w.rule,
                settings.join(","),
                w.message
            );
            if let Some(why) = &w.unchecked {
                let _ = writeln!(out, "    not checked: {why}");
            }
            if let Some(c) = &w.replay_check {
                let _ = writeln!(out, "    replay: {}", c.finding);
                let _ = writeln!(out, "{}", replay_figures(c));
            }
        }
    }
    if !d.findings.is_empty() {
        let _ = writeln!(out, "\nReferences");
        for f in &d.findings {
            let _ = writeln!(out, "  - {} ({}): {}", f.rule, f.title, f.reference);
        }
    }
}

/// A replay check's two runs side by side.
fn replay_figures(c: &ReplayCheck) -> String {
    let run = |label: &str, conf: &str, r: &RunFigures| {
        format!(
            "    {label:<8} {:<40} peak reserved {:>10}  cudaMalloc {:>5}  cudaFree {:>5}  retries {:>3}  syncs {:>3}{}",
            conf,
            format_size(r.peak_reserved_bytes),
            r.device_allocs,
            r.device_frees,
            r.alloc_retries,
            r.synchronizations,
            r.oom.as_ref().map_or(String::new(), |o| format!(
                "  OOM at event {}",
                o.event_index
            )),
        )
    };
    format!(
        "{}\n{}\n    (simulated card of {})",
        run("without", &c.without, &c.without_figures),
        run("with", &c.with, &c.with_figures),
        format_size(c.capacity_bytes)
    )
}

/// A metric's value as a rule author wants to read it: sizes as sizes.
fn fact_text(name: &str, fact: &Fact) -> String {
    // Every series but the retry counts holds byte sizes.
    let bytes_series = name.ends_with("_series") && name != "retries_series";
    let is_bytes = bytes_series || lookup(name).is_some_and(|d| d.kind == MetricKind::Bytes);
    let one = |v: f64| {
        if is_bytes {
            format_size(v.max(0.0) as u64)
        } else {
            format_number(v)
        }
    };
    match fact {
        Fact::Num(v) => one(*v),
        Fact::Bool(b) => b.to_string(),
        Fact::Series(s) => format!(
            "[{}]",
            s.iter().map(|v| one(*v)).collect::<Vec<_>>().join(", ")
        ),
    }
}

/// Each fired rule's advice once, highest priority first.
fn next_steps(d: &Diagnosis) -> Vec<&str> {
    let mut v: Vec<&str> = Vec::new();
    for f in &d.findings {
        if let Some(n) = f.next.as_deref()
            && !v.contains(&n)
        {
            v.push(n);
        }
    }
    v
}

fn primary(d: &Diagnosis) -> Option<&Observation> {
    d.primary.and_then(|i| d.evidence.observations.get(i))
}

fn kind_name(k: Kind) -> &'static str {
    match k {
        Kind::Oom => "caching-allocator OOM",
        Kind::NonAllocatorOom => "out of memory outside the caching allocator",
        Kind::MemorySummary => "memory_summary()",
        Kind::MemoryStats => "memory_stats()",
        Kind::Snapshot => "snapshot",
        Kind::DeviceError => "device error",
    }
}

/// `train.log:812: caching-allocator OOM (PyTorch 2.4+ format), cuda:0, rank 3`.
fn describe(o: &Observation) -> String {
    let mut s = o.input.clone();
    if let Some(l) = o.line {
        let _ = write!(s, ":{l}");
    }
    let _ = write!(s, ": {}", kind_name(o.kind));
    if let Some(e) = &o.format_era {
        let _ = write!(s, " (PyTorch {e} format)");
    }
    if let Some(dk) = o.device_kind {
        let name = serde_json::to_value(dk).ok();
        let name = name.as_ref().and_then(|v| v.as_str()).unwrap_or("device");
        match o.device_index {
            Some(i) => {
                let _ = write!(s, ", {name}:{i}");
            }
            None => {
                let _ = write!(s, ", {name}");
            }
        }
    }
    if let Some(r) = o.rank {
        let _ = write!(s, ", rank {r}");
    }
    if let Some(src) = o.source
        && let Some(v) = serde_json::to_value(src)
            .ok()
            .as_ref()
            .and_then(|v| v.as_str().map(str::to_string))
    {
        let _ = write!(s, ", from {v}");
    }
    s
}

fn sizes(o: &Observation) -> Vec<String> {
    // An OOM states the one request that failed; summaries, stats and
    // snapshots state what the live blocks asked for in total.
    let requested = match o.kind {
        Kind::Oom | Kind::NonAllocatorOom => "requested",
        _ => "requested by live tensors",
    };
    let fields: [(&str, Option<u64>); 9] = [
        (requested, o.requested_bytes),
        ("capacity", o.total_capacity_bytes),
        ("free", o.free_bytes),
        ("allocated", o.allocated_bytes),
        ("reserved", o.reserved_bytes),
        ("reserved but unallocated", o.reserved_unallocated_bytes),
        ("cached (reserved but unallocated)", o.cached_bytes),
        ("allowed", o.allowed_bytes),
        ("private pools", o.private_pools_bytes),
    ];
    fields
        .iter()
        .filter_map(|(n, v)| v.map(|v| format!("{n} {}", super::common::size(Some(v)))))
        .collect()
}

/// `diagnose --format json`: the contract's fields in the contract's order,
/// then ours (`verdict`, `next_steps`, `not_evaluated`).
#[derive(Serialize)]
pub struct Json<'a> {
    observations: &'a [Observation],
    cause: &'static str,
    findings: &'a [Finding],
    recommendation: Option<&'a Recommendation>,
    verdict: &'a str,
    /// The setup the answer holds for: version, platform, backend, each with its source.
    setup: &'a crate::advise::Setup,
    /// The OOM incidents with their own causes, the headline first (when there are several):
    /// the top `MAX_INCIDENTS`.
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    incidents: &'a [crate::advise::IncidentCause],
    /// How many OOM incidents the input holds (when there are several).
    #[serde(skip_serializing_if = "Option::is_none")]
    incident_count: Option<usize>,
    /// The incidents beyond `incidents`, counted by cause.
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    other_incidents: &'a [crate::advise::CauseCount],
    /// Per-rank figures and flags, when the inputs hold two or more ranks.
    #[serde(skip_serializing_if = "Option::is_none")]
    ranks: Option<super::ranks::RankTable>,
    /// The ranks beyond `ranks`, counted (when there are more than it shows).
    #[serde(skip_serializing_if = "Option::is_none")]
    ranks_omitted: Option<super::ranks::Omitted>,
    next_steps: Vec<&'a str>,
    not_evaluated: &'a [NotEvaluated],
    /// Trace findings whose settings the replay did not support.
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    withheld: &'a [Withheld],
    /// What fills the card (a snapshot's OOM or peak) and what must go.
    #[serde(skip_serializing_if = "Option::is_none")]
    fills: Option<&'a crate::advise::fills::Fills>,
}

pub fn json(d: &Diagnosis) -> String {
    crate::report::common::json(&document(d))
}

/// The fields of `diagnose --format json`.
pub fn document(d: &Diagnosis) -> Json<'_> {
    let ranks = super::ranks::rank_table(&d.evidence);
    Json {
        observations: &d.evidence.observations,
        cause: d.cause.as_str(),
        findings: &d.findings,
        recommendation: d.recommendation.as_ref(),
        verdict: &d.verdict,
        setup: &d.setup,
        incidents: if d.incident_count > 1 {
            &d.incidents
        } else {
            &[]
        },
        incident_count: (d.incident_count > 1).then_some(d.incident_count),
        other_incidents: &d.other_incidents,
        ranks_omitted: ranks.as_ref().map(|t| t.omitted).filter(|o| o.count > 0),
        ranks,
        next_steps: next_steps(d),
        not_evaluated: &d.not_evaluated,
        withheld: &d.withheld,
        fills: d.fills.as_ref(),
    }
}

pub fn markdown(d: &Diagnosis) -> String {
    let mut out = String::from("## allocdoc diagnosis\n\n");
    let _ = writeln!(out, "**Verdict:** {}\n", d.verdict);
    if let Some(p) = primary(d) {
        let _ = writeln!(out, "Evidence: `{}`", describe(p));
        let sizes = sizes(p);
        if !sizes.is_empty() {
            let _ = writeln!(out, "({})", sizes.join(", "));
        }
        out.push('\n');
    }
    let _ = writeln!(out, "Setup: {}\n", d.setup.describe());
    for line in incident_lines(d) {
        let _ = writeln!(out, "{}\n", line.trim_start());
    }
    if let Some(ranks) = super::ranks::rank_table(&d.evidence) {
        let t = ranks.table();
        let _ = writeln!(out, "{}", super::markdown::table(&t));
    }
    if !d.findings.is_empty() {
        out.push_str("| severity | rule | finding |\n|---|---|---|\n");
        for f in &d.findings {
            let _ = writeln!(
                out,
                "| {} | [`{}`]({}) | {} |",
                f.severity.as_str(),
                f.rule,
                f.reference,
                finding_text(f).replace('|', "\\|").replace('\n', "<br>")
            );
        }
        out.push('\n');
    }
    match &d.recommendation {
        Some(r) => {
            let lines: Vec<&str> = r.lines.iter().map(|l| l.line.as_str()).collect();
            let _ = writeln!(
                out,
                "### Recommended\n\n```sh\n{}\n```\n\nOr in Python, before the first `import torch`:\n\n```python\n{}\n```\n",
                lines.join("\n"),
                r.python
            );
            if let Some(n) = &r.note {
                let _ = writeln!(out, "> {n}\n");
            }
        }
        None => {
            let _ = writeln!(
                out,
                "No allocator setting is recommended: the findings say what will help.\n"
            );
        }
    }
    if let Some(f) = &d.fills {
        let _ = writeln!(out, "{}", super::top::fills_text(f, true));
    }
    let next = next_steps(d);
    if !next.is_empty() {
        out.push_str("### What to check next\n\n");
        for n in next {
            let _ = writeln!(out, "- {n}");
        }
    }
    out
}

/// `diagnose --report`: the verdict, the export line, the primary
/// observation's figures, the findings with the values they read, the
/// per-rank table and every observation.
pub fn html(d: &Diagnosis, views: super::views::ReportViews) -> String {
    use super::html::{self, Figure, ReportData, TableRow, Tone, Verdict};
    let tone = if d.recommendation.is_some() {
        Tone::Good
    } else if d.cause.rules_out_settings() {
        Tone::Bad
    } else {
        Tone::Neutral
    };
    let figures = primary(d)
        .map(|p| {
            let fields: [(&str, Option<u64>); 6] = [
                ("requested", p.requested_bytes),
                ("allocated", p.allocated_bytes),
                ("reserved", p.reserved_bytes.or(p.cached_bytes)),
                ("reserved − allocated", p.reserved_unallocated_bytes),
                ("free on the card", p.free_bytes),
                ("capacity", p.total_capacity_bytes),
            ];
            fields
                .iter()
                .filter_map(|(label, v)| {
                    v.map(|v| Figure {
                        label: (*label).into(),
                        value: super::common::size(Some(v)),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    let findings = d
        .findings
        .iter()
        .map(|f| html::Finding {
            rule: f.rule.clone(),
            severity: f.severity.as_str().into(),
            message: f.message.clone(),
            evidence: f
                .evidence
                .iter()
                .map(|(k, v)| {
                    // Facts carry no unit; integers of a MiB or more under a
                    // name that is not a count are byte sizes.
                    let count = ["retries", "ooms", "segments", "count", "events"]
                        .iter()
                        .any(|c| k.contains(c));
                    let shown = match v {
                        crate::rules::expr::Value::Num(n)
                            if !count && n.fract() == 0.0 && *n >= 1048576.0 =>
                        {
                            let n = *n as u64;
                            format!("{} ({n} bytes)", super::common::size(Some(n)))
                        }
                        crate::rules::expr::Value::Num(n) => format!("{n}"),
                        crate::rules::expr::Value::Bool(b) => b.to_string(),
                    };
                    (k.clone(), shown)
                })
                .collect(),
        })
        .collect();
    let mut tables = Vec::new();
    if let Some(f) = &d.fills {
        tables.extend(super::top::fills_tables(f));
    }
    if let Some(ranks) = super::ranks::rank_table(&d.evidence) {
        tables.push(ranks.table());
    }
    tables.push(html::Table {
        title: "Observations".into(),
        headers: vec!["where".into(), "figures".into()],
        rows: d
            .evidence
            .observations
            .iter()
            .map(|o| TableRow {
                cells: vec![describe(o), sizes(o).join(" · ")],
                flag: None,
            })
            .collect(),
        note: d
            .current_conf
            .as_ref()
            .map(|(value, source)| format!("Current config ({source}): {value}")),
    });
    let mut subtitle = format!("cause: {} · {}", d.cause.as_str(), d.setup.describe());
    let inputs: Vec<&str> = d
        .evidence
        .observations
        .iter()
        .map(|o| o.input.as_str())
        .fold(Vec::new(), |mut v, i| {
            if !v.contains(&i) {
                v.push(i);
            }
            v
        });
    if !inputs.is_empty() {
        let _ = write!(subtitle, " · inputs: {}", inputs.join(", "));
    }
    html::render(&ReportData {
        title: "allocdoc diagnose".into(),
        subtitle: Some(subtitle),
        verdict: Verdict {
            headline: d.verdict.clone(),
            tone,
        },
        export_line: d.recommendation.as_ref().map(|r| {
            r.lines
                .iter()
                .map(|l| l.line.as_str())
                .collect::<Vec<_>>()
                .join("\n")
        }),
        figures,
        findings,
        next_steps: next_steps(d).into_iter().map(String::from).collect(),
        tables,
        ..views.into_data()
    })
}
