//! Text-only answers judged against replays. For each generated trace (the
//! families of `trace_families.rs`) at a capacity where PyTorch's defaults
//! run out of memory, the OOM message the bundled allocator prints is given to
//! text-only `validate --conf expandable_segments:True` and `recommend`, and
//! their answers are compared with replaying the trace itself. Shared by
//! `tests/text_eval.rs` (a moderate set) and `examples/text_eval.rs` (the
//! larger run behind docs/EVALUATION.md).

use super::trace_families::{Rng, TraceFamily};
use allocdoc::app::recommend::RecommendOptions;
use allocdoc::app::validate::ValidateOptions;
use allocdoc::app::{Format, Outcome};
use allocdoc::conf::Settings;
use allocdoc::trial::run::replay;
use allocdoc::trial::search::min_capacity;
use allocdoc::workload::probe::trace;
use allocdoc::workload::{Event, Trace};
use std::fmt::Write;
use std::path::Path;

pub const ES: &str = "expandable_segments:True";

/// One evaluated trace.
#[derive(Debug, Clone)]
pub struct Case {
    pub family: TraceFamily,
    pub seed: u64,
    pub capacity: u64,
    /// The trace's peak of live tensors, and the smallest card the defaults run it on.
    pub live_peak: u64,
    pub default_need: u64,
    /// The trace replayed under `expandable_segments:True` avoids the OOM.
    pub es_avoids: bool,
    /// The events at which the defaults and (if it does) ES run out of memory.
    pub default_oom_at: u64,
    pub es_oom_at: Option<u64>,
    /// Configs of the search space that avoid the OOM on the trace.
    pub avoiding: Vec<String>,
    pub validate: Answer,
    pub recommend: Answer,
    /// What the recommended config does on the trace (None: nothing recommended).
    pub recommended_avoids: Option<bool>,
    pub recommended: Option<String>,
}

/// A text-only command's answer.
#[derive(Debug, Clone)]
pub struct Answer {
    pub exit_code: i32,
    /// The JSON output.
    pub json: serde_json::Value,
    /// For validate: whether the answer says the candidate avoids the OOM
    /// (None: no direction claimed, e.g. the OOM was not reproduced).
    pub says_avoids: Option<bool>,
    /// What that direction rests on: "exit" (exit code 0 or 1), "workloads"
    /// (the plausible workloads' majority), "figures" (the message's own
    /// headroom), "-" (none).
    pub lean_from: &'static str,
    /// The direction as this harness read it before validate stated one:
    /// the exit code, else the majority of the workloads' fates ("avoids"
    /// against "fails"), none without a plausible workload.
    pub by_fates: Option<bool>,
    /// Whether the output claims the OOM was reproduced.
    pub claims_reproduced: bool,
    /// Whether that claim holds: some probe it rests on fails on the
    /// message's request with the message's figures (checked independently).
    pub reproduced_really: bool,
    /// The evidence strength the answer states ("" when it states none).
    pub strength: String,
}

fn settings(conf: &str) -> Settings {
    allocdoc::conf::parse(conf, allocdoc::conf::TorchVersion::DEFAULT)
        .expect("a valid config")
        .settings
}

/// A capacity where the defaults run out of memory: in the upper four fifths
/// between the live peak and the smallest card the defaults fit on, or, for
/// about one trace in seven, a little under the live peak (no setting can
/// help there).
fn capacity_for(t: &Trace, rng: &mut Rng) -> Option<(u64, u64, u64)> {
    let defaults = Settings::default();
    let free = replay(t, &defaults, "", allocdoc::device::NO_LIMIT);
    let need = min_capacity(
        &free.figures,
        allocdoc::device::NO_LIMIT,
        true,
        |cap| replay(t, &defaults, "", cap).figures,
        &|_| {},
    );
    let lo = free.figures.peak_allocated_bytes;
    let u = if rng.chance(0.15) {
        -0.04 * rng.unit()
    } else {
        0.2 + 0.77 * rng.unit()
    };
    let cap = (lo as f64 + u * need.saturating_sub(lo) as f64) as u64;
    let cap = if u < 0.0 {
        (lo as f64 * (1.0 + u)) as u64
    } else {
        cap
    };
    replay(t, &defaults, "", cap)
        .figures
        .oom
        .is_some()
        .then_some((cap, lo, need))
}

fn run_app(outcome: Result<Outcome, allocdoc::Error>) -> (i32, serde_json::Value) {
    let out = outcome.expect("the command runs");
    let json = serde_json::from_str(&out.stdout).expect("JSON output");
    (out.exit_code, json)
}

/// Evaluates one trace of `family` from `seed`; None when the defaults
/// do not run out of memory at the chosen capacity.
pub fn evaluate(family: TraceFamily, seed: u64, dir: &Path) -> Option<Case> {
    let events = family.generate(seed);
    let t = trace(events.clone());
    let mut rng = Rng::new(seed.wrapping_add(1000) ^ (family as u64) << 40);
    let (capacity, live_peak, default_need) = capacity_for(&t, &mut rng)?;
    let oom = replay(&t, &Settings::default(), "", capacity).figures.oom?;
    let message = format!("torch.OutOfMemoryError: {}\n", oom.message);
    let stem = format!("{}-{seed}", family.name().replace([' ', '/', '+'], "_"));
    let text_path = dir.join(format!("{stem}.log"));
    let csv_path = dir.join(format!("{stem}.csv"));
    std::fs::write(&text_path, &message).expect("write the message");
    std::fs::write(&csv_path, allocdoc::workload::trace::to_csv(&events)).expect("write the trace");
    let text = text_path.to_string_lossy().into_owned();

    // The truth: the trace replayed under every config of the search space.
    let (_, truth) = run_app(allocdoc::app::recommend::run(&RecommendOptions {
        input: csv_path.to_string_lossy().into_owned(),
        capacity: Some(capacity),
        common: allocdoc::app::Common {
            format: Format::Json,
            ..Default::default()
        },
        ..RecommendOptions::default()
    }));
    let avoiding: Vec<String> = truth["candidates"]
        .as_array()
        .expect("candidates")
        .iter()
        .filter(|c| c["oom"].is_null())
        .map(|c| c["conf"].as_str().unwrap_or_default().to_string())
        .collect();
    let es_oom_at = replay(&t, &settings(ES), ES, capacity)
        .figures
        .oom
        .map(|o| o.event_index);
    let es_avoids = es_oom_at.is_none();

    let (code, json) = run_app(allocdoc::app::validate::run(&ValidateOptions {
        input: text.clone(),
        conf: ES.to_string(),
        device: "sim".to_string(),
        common: allocdoc::app::Common {
            format: Format::Json,
            ..Default::default()
        },
        ..ValidateOptions::default()
    }));
    let validate = answer(code, json, true);
    let (code, json) = run_app(allocdoc::app::recommend::run(&RecommendOptions {
        input: text.clone(),
        common: allocdoc::app::Common {
            format: Format::Json,
            ..Default::default()
        },
        ..RecommendOptions::default()
    }));
    let recommend = answer(code, json, false);
    let recommended = recommend.json["recommendation"]["value"]
        .as_str()
        .map(str::to_string);
    let recommended_avoids = recommended.as_ref().map(|conf| {
        replay(&t, &settings(conf), conf, capacity)
            .figures
            .oom
            .is_none()
    });
    Some(Case {
        family,
        seed,
        capacity,
        live_peak,
        default_need,
        es_avoids,
        default_oom_at: oom.event_index,
        es_oom_at,
        avoiding,
        validate,
        recommend,
        recommended_avoids,
        recommended,
    })
}

/// Reads an answer's claims from its JSON (this release's, or the single
/// probe's of 0.1, so that the figures before and after compare), and checks
/// every reproduction claim against an independent replay of the probe.
fn answer(exit_code: i32, json: serde_json::Value, is_validate: bool) -> Answer {
    let probe = &json["probe"];
    // 0.1: one probe and `reproduces_oom`; now: `members`, each with `reproduces`.
    let claimed: Vec<&serde_json::Value> = match probe["members"].as_array() {
        Some(members) => members.iter().filter(|m| m["reproduces"] == true).collect(),
        None => [probe]
            .into_iter()
            .filter(|p| p["reproduces_oom"] == true)
            .collect(),
    };
    let claims_reproduced = !claimed.is_empty();
    let reproduced_really = claims_reproduced && claimed.iter().all(|m| reproduces(probe, m));
    let says_avoids = is_validate.then(|| {
        if json.get("strength").is_none() {
            return Some(json["candidate"]["oom"].is_null());
        }
        match (exit_code, json["leaning"].as_str()) {
            (0, _) => Some(true),
            (1, _) => Some(false),
            // Uncertain: the way the verdict says it leans, if any.
            (_, Some(lean)) => Some(lean == "avoids"),
            (_, None) => None,
        }
    });
    let by_fates = match exit_code {
        0 => Some(true),
        1 => Some(false),
        _ => {
            let fates: Vec<&str> = json["workloads"]
                .as_array()
                .map(|w| w.iter().filter_map(|w| w["candidate"].as_str()).collect())
                .unwrap_or_default();
            let avoid = fates.iter().filter(|f| **f == "avoids").count();
            let fail = fates.iter().filter(|f| **f == "fails").count();
            (avoid != fail).then_some(avoid > fail)
        }
    };
    let says_avoids = says_avoids.flatten();
    let lean_from = match (exit_code, says_avoids) {
        (_, None) => "-",
        (0 | 1, _) => "exit",
        _ if json["verdict"]
            .as_str()
            .is_some_and(|v| v.contains("the message's own figures lean")) =>
        {
            "figures"
        }
        _ => "workloads",
    };
    Answer {
        exit_code,
        strength: json["strength"].as_str().unwrap_or_default().to_string(),
        json,
        says_avoids,
        lean_from,
        by_fates,
        claims_reproduced,
        reproduced_really,
    }
}

/// Whether probe `m` (family, steps, unit, seed and the request it
/// appended), replayed under the defaults at the probe's capacity, runs out of
/// memory on its last event, a request that prints as the message's, with
/// allocated and reserved within the tolerance of the message.
fn reproduces(probe: &serde_json::Value, m: &serde_json::Value) -> bool {
    use allocdoc::allocator::sizes::{get_allocation_size, round_size};
    use allocdoc::units::format_size;
    use allocdoc::workload::probe::{Family, Params, TOLERANCE, generate};
    let int = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
    let Some(family) = Family::ALL
        .into_iter()
        .find(|f| m["family"].as_str() == Some(f.name()))
    else {
        return false;
    };
    let observed = &probe["observed"];
    let printed = int(&observed["requested_bytes"]);
    // 0.1 appended the printed figure itself.
    let request = m["request_bytes"].as_u64().unwrap_or(printed);
    let params = Params {
        ballast: int(&m["ballast_bytes"]),
        ..Params::new(
            int(&m["steps"]) as u32,
            int(&m["unit_bytes"]),
            int(&m["seed"]),
        )
    };
    let mut events = generate(family, &params);
    let next = events
        .iter()
        .filter_map(|e| match *e {
            Event::Alloc { id, .. } => Some(id + 1),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    events.push(Event::Alloc {
        id: next,
        size: request,
        stream: 0,
    });
    let defaults = Settings::default();
    let t = trace(events);
    let run = replay(&t, &defaults, "", int(&probe["capacity_bytes"])).figures;
    let near = |got: u64, want: &serde_json::Value| {
        let want = int(want);
        (got as f64 - want as f64).abs() <= TOLERANCE * want as f64
    };
    let same_size = format_size(get_allocation_size(
        round_size(request, &defaults),
        &defaults,
    )) == format_size(printed);
    run.oom
        .as_ref()
        .is_some_and(|o| o.event_index + 1 == t.len() as u64)
        && same_size
        && near(run.end_allocated_bytes, &observed["allocated_bytes"])
        && near(run.end_reserved_bytes, &observed["reserved_bytes"])
}

/// The confusion tables and target figures, in Markdown.
pub fn summary(cases: &[Case]) -> String {
    let mut s = String::new();
    let n = cases.len();
    let pct = |a: usize, b: usize| {
        if b == 0 {
            "-".to_string()
        } else {
            format!("{:.0} %", 100.0 * a as f64 / b as f64)
        }
    };
    // validate: truth × answer.
    let col = |c: &Case| match (c.validate.says_avoids, c.validate.exit_code) {
        (None, _) => 2,
        (Some(true), _) => 0,
        (Some(false), _) => 1,
    };
    let mut m = [[0usize; 3]; 2];
    for c in cases {
        m[usize::from(!c.es_avoids)][col(c)] += 1;
    }
    let agree = m[0][0] + m[1][1];
    let _ = writeln!(
        s,
        "`validate --conf {ES}` on the message alone against the trace ({n} traces):\n"
    );
    let _ = writeln!(
        s,
        "| trace, replayed | text says \"avoids\" | text says \"still OOMs\" | no direction |\n|---|---:|---:|---:|"
    );
    let _ = writeln!(
        s,
        "| ES avoids the OOM | {} | {} | {} |",
        m[0][0], m[0][1], m[0][2]
    );
    let _ = writeln!(
        s,
        "| ES still OOMs | {} | {} | {} |",
        m[1][0], m[1][1], m[1][2]
    );
    let _ = writeln!(s, "\nAgreement: {agree} of {n} ({}).", pct(agree, n));
    let directed = n - m[0][2] - m[1][2];
    let _ = writeln!(
        s,
        "Directional precision: {agree} of the {directed} answers that give a direction ({}); \
         coverage {directed} of {n}.",
        pct(agree, directed)
    );
    let by = |from: &str| {
        let on: Vec<&Case> = cases
            .iter()
            .filter(|c| c.validate.lean_from == from)
            .collect();
        let right = on
            .iter()
            .filter(|c| c.validate.says_avoids == Some(c.es_avoids))
            .count();
        format!("{right} of {}", on.len())
    };
    let _ = writeln!(
        s,
        "By what the direction rests on, agreeing: exit code 0 or 1 {}, the workloads' majority \
         {}, the message's own figures {}.",
        by("exit"),
        by("workloads"),
        by("figures")
    );
    let fates_agree = cases
        .iter()
        .filter(|c| c.validate.by_fates == Some(c.es_avoids))
        .count();
    let fates_none = cases
        .iter()
        .filter(|c| c.validate.by_fates.is_none())
        .count();
    let _ = writeln!(
        s,
        "Read as before validate stated its leaning (the exit code, else the majority of the \
         workloads' fates): agreement {fates_agree} of {n} ({}), no direction {fates_none}.",
        pct(fates_agree, n)
    );
    let exit0 = cases.iter().filter(|c| c.validate.exit_code == 0).count();
    let exit0_wrong = cases
        .iter()
        .filter(|c| c.validate.exit_code == 0 && !c.es_avoids)
        .count();
    let _ = writeln!(
        s,
        "Exit 0 (a gate would pass): {exit0}; of these the trace still runs out of memory: {exit0_wrong}."
    );
    let claims = cases
        .iter()
        .flat_map(|c| [&c.validate, &c.recommend])
        .filter(|a| a.claims_reproduced)
        .count();
    let false_claims = cases
        .iter()
        .flat_map(|c| [&c.validate, &c.recommend])
        .filter(|a| a.claims_reproduced && !a.reproduced_really)
        .count();
    let _ = writeln!(
        s,
        "\"Reproduced\" claims (validate and recommend): {claims}, of which false: {false_claims}."
    );
    // recommend.
    let helpable: Vec<&Case> = cases.iter().filter(|c| !c.avoiding.is_empty()).collect();
    let hopeless: Vec<&Case> = cases.iter().filter(|c| c.avoiding.is_empty()).collect();
    let rec_ok = helpable
        .iter()
        .filter(|c| c.recommended_avoids == Some(true))
        .count();
    let rec_none = helpable
        .iter()
        .filter(|c| c.recommended_avoids.is_none())
        .count();
    let hopeless_exit0 = hopeless
        .iter()
        .filter(|c| c.recommend.exit_code == 0 && c.recommended.is_some())
        .count();
    let hopeless_any = hopeless.iter().filter(|c| c.recommended.is_some()).count();
    let _ = writeln!(
        s,
        "\n`recommend` on the message alone: where some config avoids the OOM on the trace ({}), \
         the recommendation avoids it in {rec_ok} ({}), recommends nothing in {rec_none}; \
         where none does ({}), a config is recommended in {hopeless_any}, with exit 0 in {hopeless_exit0}.",
        helpable.len(),
        pct(rec_ok, helpable.len()),
        hopeless.len()
    );
    let mut by_exit = std::collections::BTreeMap::new();
    for c in cases {
        *by_exit
            .entry((c.validate.exit_code, c.recommend.exit_code))
            .or_insert(0) += 1;
    }
    let _ = writeln!(
        s,
        "\nExit codes (validate, recommend): {}",
        by_exit
            .iter()
            .map(|((v, r), k)| format!("({v}, {r}) × {k}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    s
}

/// One line per case, for looking into disagreements.
pub fn detail(cases: &[Case]) -> String {
    let mut s = String::from(
        "| trace | seed | live peak | capacity | defaults need | ES on trace | validate (exit, strength, from) | configs avoiding | recommended (exit) | on trace |\n|---|---:|---:|---:|---:|---|---|---:|---|---|\n",
    );
    for c in cases {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} ({}, {}, {}) | {} | {} ({}) | {} |",
            c.family.name(),
            c.seed,
            allocdoc::units::human(c.live_peak),
            allocdoc::units::human(c.capacity),
            allocdoc::units::human(c.default_need),
            match c.es_oom_at {
                None => "avoids".to_string(),
                Some(at) => format!("OOM at {at} (defaults: {})", c.default_oom_at),
            },
            match c.validate.says_avoids {
                Some(true) => "avoids",
                Some(false) => "OOM",
                None => "-",
            },
            c.validate.exit_code,
            if c.validate.strength.is_empty() {
                "-"
            } else {
                &c.validate.strength
            },
            c.validate.lean_from,
            c.avoiding.len(),
            c.recommended
                .as_deref()
                .map_or("-", |v| if v.is_empty() { "(defaults)" } else { v }),
            c.recommend.exit_code,
            match c.recommended_avoids {
                Some(true) => "avoids",
                Some(false) => "OOM",
                None => "-",
            }
        );
    }
    s
}
