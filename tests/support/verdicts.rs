//! The contradiction checker of issue 26: a `validate` or `recommend`
//! result's exit code against its JSON (the one exit-code table of
//! `allocdoc::error`), and its text against both. Used over every fixture
//! (tests/answer.rs) and the text-only evaluation harness (tests/text_eval.rs).
//!
//! And the claims checker of issue 34 ([`false_claims`]): every claim a
//! command prints ("the card is full", "no allocator setting will help", a
//! line to set, "run nvidia-smi", "fragmentation", "what must go"…) held to
//! the condition `advise::claims` states for it, on the diagnosis's figures,
//! and no two claims that contradict each other; and [`category_contradictions`]:
//! `top`'s categories against each other (a row of several categories names
//! them, a site has one category in the Growing table and the peak table).

use allocdoc::advise::Diagnosis;
use serde_json::Value;

/// Every contradiction between `exit`, `json` and (when given) `text` of
/// `command` ("validate" or "recommend"), one line each.
pub fn contradictions(command: &str, exit: i32, json: &Value, text: Option<&str>) -> Vec<String> {
    let mut bad = Vec::new();
    let mut say = |what: String| bad.push(format!("{command} exit {exit}: {what}"));
    let verdict = json["verdict"].as_str().unwrap_or("");
    let strength = json["strength"].as_str().unwrap_or("");
    let nothing = json.get("not_replayed").is_some();
    if ![0, 1, 4, 5].contains(&exit) {
        say("an exit code outside the table".into());
    }
    if nothing != (exit == 5) {
        say(format!("not_replayed present: {nothing}, but exit {exit}"));
    }
    if nothing {
        return bad;
    }
    if (strength == "uncertain") != (exit == 4) {
        say(format!("strength {strength:?}"));
    }
    if !["proven", "likely", "uncertain"].contains(&strength) {
        say(format!("no strength ({strength:?})"));
    }
    let oom = |run: &Value| !run["oom"].is_null();
    let ensemble = json.get("probe").is_some();
    match command {
        "recommend" => {
            let line = &json["recommendation"];
            if exit == 0 && line.is_null() {
                say("exit 0 without a recommendation".into());
            }
            if exit == 1 && !line.is_null() {
                say(format!("exit 1 with the line {line}"));
            }
            let candidates = json["candidates"].as_array().cloned().unwrap_or_default();
            if !ensemble {
                if exit == 1 && candidates.iter().any(|c| !oom(c)) {
                    say("exit 1 though a candidate runs without OOM".into());
                }
                if exit == 0
                    && let Some(value) = line["value"].as_str()
                    && let Some(c) = candidates.iter().find(|c| c["conf"] == value)
                    && oom(c)
                {
                    say(format!(
                        "exit 0 recommending {value:?}, which runs out of memory"
                    ));
                }
            }
        }
        "validate" => {
            let candidate = &json["candidate"];
            if exit == 0 && oom(candidate) {
                say("exit 0 though candidate.oom is set".into());
            }
            if exit == 1 && !ensemble && !oom(candidate) {
                say("exit 1 though candidate.oom is null".into());
            }
            if exit == 1 && ensemble && json["leaning"] != "fails" {
                say(format!("exit 1 leaning {}", json["leaning"]));
            }
            if verdict.contains("still runs out of memory in all") && !oom(candidate) {
                say("\"still runs out of memory in all\" while candidate.oom is null".into());
            }
        }
        _ => say(format!("unknown command {command}")),
    }
    // "proven" needs a replay that exercised what configs decide, in the
    // current config's run or the answer's (the first candidate of
    // `recommend`, the candidate of `validate`): one rule in both commands.
    if strength == "proven" && !ensemble {
        let runs: Vec<&Value> = [&json["current"], &json["candidate"], &json["candidates"][0]]
            .into_iter()
            .filter(|r| r.is_object())
            .collect();
        let exercised = runs.iter().any(|r| {
            oom(r)
                || r["device_allocs"].as_u64().unwrap_or(0)
                    + r["device_frees"].as_u64().unwrap_or(0)
                    > 0
        });
        if !exercised {
            say("proven, yet neither the current config nor the answer's made a cudaMalloc or a cudaFree".into());
        }
    }
    // Evidence that records no OOM has none to avoid.
    if ensemble
        && json["probe"]["observed"]["requested_bytes"].is_null()
        && verdict.contains("avoids the OOM")
    {
        say(format!(
            "\"avoids the OOM\" on evidence without one: {verdict}"
        ));
    }
    if verdict.contains("a request of 0 B") {
        say(format!("a request of 0 B: {verdict}"));
    }
    let Some(text) = text else {
        return bad;
    };
    let recommended = text.lines().any(|l| l == "Recommended");
    if text.contains("nothing is recommended") && recommended {
        say("\"nothing is recommended\" above a Recommended block".into());
    }
    if command == "recommend" && recommended == json["recommendation"].is_null() {
        say(format!(
            "a Recommended block: {recommended}, recommendation: {}",
            json["recommendation"]
        ));
    }
    let header = text.lines().next().unwrap_or("");
    if header.contains(" 1 events") || (ensemble && header.contains(" events)")) {
        say(format!("event count in the header: {header}"));
    }
    if let Some(head) = text.lines().find_map(|l| l.strip_prefix("Verdict: ")) {
        let words = head.split_whitespace().count();
        if words > 60 {
            say(format!("a {words}-word verdict headline: {head}"));
        }
    }
    bad
}

/// Every claim `texts` make whose condition does not hold on the diagnosis
/// `d`, and every pair of claims they make that contradict, one line each,
/// prefixed with `what`.
pub fn false_claims(what: &str, d: &Diagnosis, texts: &[&str]) -> Vec<String> {
    allocdoc::advise::claims::check(texts, &d.grounds())
        .into_iter()
        .map(|b| format!("{what}: {b}"))
        .collect()
}

/// What `diagnose` prints about its headline incident, as the claims are
/// checked: the text less the other incidents' lines (they rest on their own
/// figures), and each finding whole (the table wraps them).
pub fn diagnose_texts(d: &Diagnosis) -> Vec<String> {
    let text = allocdoc::report::diagnose::text(d, false);
    let mut v = vec![
        text.lines()
            .filter(|l| !l.starts_with("  also: "))
            .collect::<Vec<_>>()
            .join("\n"),
        d.verdict.clone(),
    ];
    v.extend(d.findings.iter().map(|f| f.message.clone()));
    v.extend(d.findings.iter().filter_map(|f| f.next.clone()));
    v
}

/// Every category `top --format json` gives that another part of the same
/// output contradicts, one line each, prefixed with `what`: a row whose
/// `mix` does not add up to its bytes or does not lead with its category (so
/// a row of several categories that names one), and a site that the Growing
/// table and the peak table name differently (grouped by site, or by your
/// code, where a row's key is the growing site's).
pub fn category_contradictions(what: &str, top: &Value) -> Vec<String> {
    let mut bad = Vec::new();
    let empty = Vec::new();
    let list = |v: &Value| v.as_array().unwrap_or(&empty).clone();
    for device in list(&top["devices"]) {
        for m in list(&device["moments"]) {
            for r in list(&m["rows"]) {
                let Some(mix) = r.get("mix").map(list) else {
                    continue;
                };
                let sum: u64 = mix.iter().filter_map(|p| p["bytes"].as_u64()).sum();
                let sorted = mix
                    .windows(2)
                    .all(|w| w[0]["bytes"].as_u64() >= w[1]["bytes"].as_u64());
                if mix.len() < 2
                    || Some(sum) != r["bytes"].as_u64()
                    || mix[0]["category"] != r["category"]
                    || !sorted
                {
                    bad.push(format!(
                        "{what}: {} row {}: category {} with mix {}",
                        m["moment"], r["key"], r["category"], r["mix"]
                    ));
                }
            }
        }
        let peak = list(&device["moments"])
            .into_iter()
            .find(|m| m["moment"] == "peak" && (m["by"] == "site" || m["by"] == "user"));
        for g in list(&device["growth"]) {
            let row = peak
                .as_ref()
                .and_then(|m| list(&m["rows"]).into_iter().find(|r| r["key"] == g["site"]));
            if let Some(r) = row
                && (r["category"] != g["category"] || r.get("mix") != g.get("mix"))
            {
                bad.push(format!(
                    "{what}: {} is {} ({}) in the peak table but {} ({}) in the Growing table",
                    g["site"], r["category"], r["mix"], g["category"], g["mix"]
                ));
            }
        }
    }
    bad
}
