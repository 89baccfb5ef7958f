//! Rendering: `rules list`, `rules show`, `rules test`.

use super::Format;
use crate::rules::catalog::METRICS;
use crate::rules::{CaseResult, Rule};
use comfy_table::{ContentArrangement, Table, presets};
use serde_json::json;
use std::fmt::Write;

pub fn list(rules: &[Rule], format: Format) -> String {
    match format {
        Format::Json | Format::Jsonl => {
            let v: Vec<_> = rules
                .iter()
                .map(|r| json!({"id": r.id, "title": r.title, "severity": r.severity, "cause": r.cause, "priority": r.priority, "tests": r.tests.len()}))
                .collect();
            super::common::json(&json!({ "rules": v }))
        }
        Format::Markdown => {
            let mut out = String::from(
                "| rule | severity | cause | priority | title |\n|---|---|---|---|---|\n",
            );
            for r in rules {
                let _ = writeln!(
                    out,
                    "| `{}` | {} | {} | {} | {} |",
                    r.id,
                    r.severity.as_str(),
                    r.cause.map_or("-", |c| c.as_str()),
                    r.priority,
                    r.title
                );
            }
            out
        }
        Format::Text => {
            let mut t = Table::new();
            t.load_style(presets::UTF8_FULL_CONDENSED)
                .force_no_tty()
                .set_content_arrangement(ContentArrangement::Dynamic)
                .set_width(110)
                .set_header(["rule", "severity", "cause", "prio", "title"]);
            for r in rules {
                t.add_row([
                    r.id.clone(),
                    r.severity.as_str().into(),
                    r.cause.map_or("-", |c| c.as_str()).into(),
                    r.priority.to_string(),
                    r.title.clone(),
                ]);
            }
            let mut out = format!("{t}\n\nMetrics rules can read:\n");
            for m in METRICS {
                let _ = writeln!(out, "  {:<30} {}", m.name, m.definition);
            }
            out
        }
    }
}

pub fn test(results: &[CaseResult], format: Format) -> String {
    if format.is_json() {
        let v: Vec<_> = results
            .iter()
            .map(|r| json!({"rule": r.rule, "case": r.case, "passed": r.failure.is_none(), "failure": r.failure}))
            .collect();
        return super::common::json(&json!({ "results": v }));
    }
    let mut out = String::new();
    for r in results {
        match &r.failure {
            None => {
                let _ = writeln!(out, "ok    {} :: {}", r.rule, r.case);
            }
            Some(f) => {
                let _ = writeln!(out, "FAIL  {} :: {}: {f}", r.rule, r.case);
            }
        }
    }
    out
}

pub fn show(rule: &Rule, format: Format) -> String {
    let settings: Vec<(String, String)> = rule
        .recommend
        .iter()
        .map(|(k, v)| (k.clone(), v.source().to_string()))
        .collect();
    if format.is_json() {
        let value = json!({
            "id": rule.id, "title": rule.title, "severity": rule.severity,
            "cause": rule.cause, "priority": rule.priority, "when": rule.when_text,
            "recommend": settings.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
            "because": rule.because.source, "reference": rule.reference,
            "source": rule.source, "tests": rule.tests.len(),
        });
        return super::common::json(&value);
    }
    let mut out = String::new();
    let _ = writeln!(out, "{} — {}", rule.id, rule.title);
    let _ = writeln!(out, "  severity:  {}", rule.severity.as_str());
    let _ = writeln!(
        out,
        "  cause:     {}",
        rule.cause.map_or("-", |c| c.as_str())
    );
    let _ = writeln!(out, "  priority:  {}", rule.priority);
    let mut applies = Vec::new();
    if !rule.applies_to.kinds.is_empty() {
        let kinds: Vec<String> = rule
            .applies_to
            .kinds
            .iter()
            .filter_map(|k| serde_json::to_value(k).ok()?.as_str().map(str::to_string))
            .collect();
        applies.push(format!("kinds {}", kinds.join("|")));
    }
    if let Some(t) = &rule.applies_to.torch {
        applies.push(format!("torch {}", t.text));
    }
    if let Some(b) = rule.applies_to.backend {
        // The name PyTorch's config uses (`backend:native`, `backend:cudaMallocAsync`).
        let name = match b {
            crate::evidence::Backend::Native => "native",
            crate::evidence::Backend::CudaMallocAsync => "cudaMallocAsync",
        };
        applies.push(format!("backend {name}"));
    }
    if !applies.is_empty() {
        let _ = writeln!(out, "  applies:   {}", applies.join(", "));
    }
    let _ = writeln!(out, "  when:      {}", rule.when_text);
    for (k, v) in &settings {
        let _ = writeln!(out, "  recommend: {k}: {v}");
    }
    let _ = writeln!(out, "  because:   {}", rule.because.source);
    if let Some(n) = &rule.next {
        let _ = writeln!(out, "  next:      {}", n.source);
    }
    let _ = writeln!(out, "  reference: {}", rule.reference);
    let _ = writeln!(
        out,
        "  source:    {} ({} test cases)",
        rule.source,
        rule.tests.len()
    );
    out
}
