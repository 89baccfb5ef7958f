//! Honest evidence for text-only users: text-only `validate` and `recommend`
//! judged against replaying the trace the message came from (a moderate set
//! of generated traces; `examples/text_eval.rs` runs the larger set behind
//! docs/EVALUATION.md), the reproduction check, "no setting can help", the
//! capture lines, and verdicts checked under every placement policy.

#[path = "support/text_eval.rs"]
mod text_eval;
#[path = "support/trace_families.rs"]
mod trace_families;
use crate::verdicts;

use allocdoc::app::recommend::RecommendOptions;
use allocdoc::app::validate::ValidateOptions;
use allocdoc::app::{Format, Outcome};
use allocdoc::conf::Settings;
use allocdoc::device::sim::Placement;
use allocdoc::trial::run::replay_placed;
use allocdoc::workload::Trace;
use std::path::Path;
use trace_families::TraceFamily;

fn fixture(path: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(path)
        .to_string_lossy()
        .into_owned()
}

fn validate(input: &str, conf: &str, format: Format) -> Outcome {
    allocdoc::app::validate::run(&ValidateOptions {
        input: input.to_string(),
        conf: conf.to_string(),
        device: "sim".to_string(),
        common: allocdoc::app::Common {
            format,
            ..Default::default()
        },
        ..ValidateOptions::default()
    })
    .expect("validate runs")
}

fn recommend(input: &str, format: Format) -> Outcome {
    allocdoc::app::recommend::run(&RecommendOptions {
        input: input.to_string(),
        common: allocdoc::app::Common {
            format,
            ..Default::default()
        },
        ..RecommendOptions::default()
    })
    .expect("recommend runs")
}

fn json(o: &Outcome) -> serde_json::Value {
    serde_json::from_str(&o.stdout).expect("JSON output")
}

/// The OOM message each generated trace's defaults print, fed to the
/// text-only commands, against replaying the trace: no false "reproduced", no
/// recommendation with exit 0 where no config avoids the OOM, a validate exit
/// 0 only where the trace agrees, and agreement and rescue rates at least
/// those measured when validate began to state its leaning (10 of 12 and 7
/// of 7; floors 5/6 and 85 %; 9 of 12 before). The 90 % agreement
/// target is missed on the larger set: docs/EVALUATION.md.
#[test]
fn text_only_answers_agree_with_replaying_the_trace() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cases = Vec::new();
    for family in TraceFamily::ALL {
        for seed in [3, 4] {
            if let Some(c) = text_eval::evaluate(family, seed, dir.path()) {
                cases.push(c);
            }
        }
    }
    let report = text_eval::summary(&cases) + "\n" + &text_eval::detail(&cases);
    assert!(cases.len() >= 10, "{report}");
    // No exit code contradicts its JSON verdict (issue 26: 4 did on 50 cases).
    let contradicted: Vec<String> = cases
        .iter()
        .flat_map(|c| {
            let at = format!("{} seed {}", c.family.name(), c.seed);
            [("validate", &c.validate), ("recommend", &c.recommend)]
                .into_iter()
                .flat_map(move |(cmd, a)| {
                    verdicts::contradictions(cmd, a.exit_code, &a.json, None)
                        .into_iter()
                        .map(|b| format!("{at}: {b}"))
                        .collect::<Vec<_>>()
                })
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(contradicted.is_empty(), "{}", contradicted.join("\n"));
    for c in &cases {
        for a in [&c.validate, &c.recommend] {
            assert!(
                !a.claims_reproduced || a.reproduced_really,
                "a false \"reproduced\" on {} seed {}:\n{report}",
                c.family.name(),
                c.seed
            );
            assert!(!a.strength.is_empty(), "every verdict states its strength");
            assert!(
                a.json["capture"].is_array(),
                "text results end with the capture lines"
            );
        }
        if c.avoiding.is_empty() {
            assert_ne!(
                c.recommend.exit_code,
                0,
                "exit 0 where no config avoids the OOM: {} seed {}\n{report}",
                c.family.name(),
                c.seed
            );
        }
        if c.validate.exit_code == 0 {
            assert!(
                c.es_avoids,
                "validate passed a gate the trace fails:\n{report}"
            );
        }
    }
    let agree = cases
        .iter()
        .filter(|c| c.validate.says_avoids == Some(c.es_avoids))
        .count();
    let helpable: Vec<_> = cases.iter().filter(|c| !c.avoiding.is_empty()).collect();
    let rescued = helpable
        .iter()
        .filter(|c| c.recommended_avoids == Some(true))
        .count();
    eprintln!("{report}");
    assert!(
        agree * 6 >= cases.len() * 5,
        "ES verdict agreement {agree} of {}\n{report}",
        cases.len()
    );
    assert!(
        rescued * 100 >= helpable.len() * 85,
        "recommendation rescues {rescued} of {}\n{report}",
        helpable.len()
    );
}

/// `fixtures/text/readme_example.log`: no probe fails on its 2 GiB request
/// with its figures, so the verdict's first words say so, no replay's claim
/// about the candidate follows, and the exit code is 4. What it leans to
/// comes from the message's own figures, and says so: 58.12 GiB live and the
/// 2 GiB request leave 18.13 GiB of the 78.25 GiB the allocator reached.
#[test]
fn an_unreproduced_oom_claims_nothing() {
    let input = fixture("fixtures/text/readme_example.log");
    let out = validate(&input, "expandable_segments:True", Format::Text);
    assert_eq!(out.exit_code, 4, "{}", out.stdout);
    // The headline and its details (one a line below it), as one finding.
    let mut lines = out.stdout.lines();
    let head = lines
        .find_map(|l| l.strip_prefix("Verdict: "))
        .expect("a verdict line");
    let details = lines.map_while(|l| l.strip_prefix("  - "));
    let verdict = std::iter::once(head)
        .chain(details)
        .collect::<Vec<_>>()
        .join("; ");
    let verdict = verdict.as_str();
    assert!(
        verdict.starts_with("The OOM was not reproduced"),
        "{verdict}"
    );
    for claim in ["avoids the OOM", "lowers", "raises", "still runs out"] {
        assert!(!verdict.contains(claim), "{claim:?} in {verdict}");
    }
    assert!(
        verdict.contains(
            "no replay here says whether expandable_segments:True avoids it; the message's own \
             figures lean to expandable_segments:True getting past this request: the live \
             tensors and the 2.00 GiB request leave 18.13 GiB (23.2 %) of the 78.25 GiB the \
             allocator could reach"
        ),
        "{verdict}"
    );
    assert!(out.stdout.contains("Evidence: uncertain"), "{}", out.stdout);
    let v = json(&validate(&input, "expandable_segments:True", Format::Json));
    assert_eq!(v["strength"], "uncertain");
    assert_eq!(v["leaning"], "avoids");
    assert_eq!(v["probe"]["plausible"], 0);
    let r = recommend(&input, Format::Json);
    assert_eq!(r.exit_code, 4);
    // Uncertain replays never change the line: what is recommended is the
    // rules' own (diagnose's), not a replay's finding.
    let r = json(&r);
    assert_eq!(r["strength"], "uncertain");
    assert!(
        r["verdict"]
            .as_str()
            .is_some_and(|v| v.starts_with("The OOM was not reproduced"))
    );
    assert_eq!(
        r["recommendation"]["value"], r["answer"]["rules_line"],
        "{r:#}"
    );
    assert!(r["answer"]["overrides"].is_null(), "{r:#}");
}

/// Every text-only result ends with the lines that record a trace, in the
/// call form of the PyTorch version (2.1+: `max_entries`, `_dump_snapshot`).
#[test]
fn text_results_end_with_the_lines_that_make_a_trace() {
    let input = fixture("fixtures/validate/oom_fragmented_2.5.txt");
    for out in [
        validate(&input, "expandable_segments:True", Format::Text),
        recommend(&input, Format::Text),
    ] {
        let tail: Vec<&str> = out.stdout.lines().rev().take(8).collect();
        assert_eq!(tail[0], "# then: allocdoc recommend oom_snapshot.pickle");
        assert!(
            out.stdout
                .contains("torch.cuda.memory._record_memory_history(max_entries=100_000)"),
            "{}",
            out.stdout
        );
        assert!(
            out.stdout
                .contains("torch.cuda.memory._dump_snapshot(\"oom_snapshot.pickle\")"),
            "{}",
            out.stdout
        );
    }
    let old = allocdoc::report::recommend::capture_lines(allocdoc::conf::TorchVersion::new(2, 0));
    assert!(
        old.iter()
            .any(|l| l.contains("_record_memory_history(True, trace_alloc_max_entries"))
    );
    assert!(
        old.iter().all(|l| !l.contains("_dump_snapshot")),
        "2.0 has no _dump_snapshot"
    );
    // A trace is proven and gets no capture lines.
    let csv = fixture("fixtures/validate/interleaved_16mib.csv");
    let out = allocdoc::app::validate::run(&ValidateOptions {
        input: csv,
        conf: "expandable_segments:True".into(),
        capacity: Some(200 << 20),
        device: "sim".into(),
        common: allocdoc::app::Common {
            format: Format::Json,
            ..Default::default()
        },
        ..ValidateOptions::default()
    })
    .expect("runs");
    let v = json(&out);
    assert_eq!(v["strength"], "proven");
    assert!(v.get("capture").is_none());
}

/// A message where the live tensors plus the request exceed the room: every
/// plausible workload runs out of memory under every config, so nothing is
/// recommended (exit 1) and the capacity they would need is given.
#[test]
fn no_setting_can_help_from_text() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("full.log");
    std::fs::write(
        &path,
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a \
         total capacity of 8.00 GiB of which 50.00 MiB is free. Of the allocated memory 7.40 GiB \
         is allocated by PyTorch, and 120.00 MiB is reserved by PyTorch but unallocated.\n",
    )
    .expect("write");
    let input = path.to_string_lossy().into_owned();
    let out = recommend(&input, Format::Json);
    let v = json(&out);
    assert_eq!(out.exit_code, 1, "{}", out.stdout);
    assert!(v["recommendation"].is_null());
    let verdict = v["verdict"].as_str().expect("verdict");
    assert!(
        verdict.starts_with("No allocator setting avoids this OOM in replay"),
        "{verdict}"
    );
    let plausible = v["ensemble"]["plausible"].as_u64().expect("plausible");
    assert!(plausible >= 1, "{v:#}");
    let need = v["ensemble"]["needed_capacity_bytes"]
        .as_u64()
        .expect("needed capacity");
    // At least the live tensors and the request: 7.40 GiB + 1 GiB.
    assert!(
        need >= (7.4 * (1u64 << 30) as f64) as u64 + (1 << 30),
        "{need}"
    );
    assert!(
        v["ensemble"]["ranked"]
            .as_array()
            .expect("ranked")
            .iter()
            .all(|c| c["avoids"] == 0)
    );
}

/// A trace whose outcome turns on which of two equal free blocks the
/// best-fit search takes: with first-fit placement the segment allocated
/// after an `empty_cache` reuses the lowest address, so the split lands in it
/// and no whole segment is left to release; with rising addresses it lands in
/// the other one, and the release makes room.
/// (`fixtures/validate/placement_dependent.csv`; `replay` checks it too.)
const PLACEMENT_TRACE: &str = "fixtures/validate/placement_dependent.csv";

#[test]
fn the_same_trace_under_each_placement_policy() {
    let csv = std::fs::read(fixture(PLACEMENT_TRACE)).expect("the fixture");
    let t = Trace::parse("placement.csv", &csv).expect("trace");
    let cap = 120 << 20;
    let defaults = Settings::default();
    let oom = |p: Placement| {
        replay_placed(&t, &defaults, "", cap, p)
            .figures
            .oom
            .map(|o| o.event_index)
    };
    assert_eq!(
        oom(Placement::FirstFit),
        Some(11),
        "first-fit: nothing to release"
    );
    assert_eq!(
        oom(Placement::Rising),
        None,
        "rising: the whole segment is released"
    );
    // The random policy is seeded: the same outcome every run.
    assert_eq!(
        oom(Placement::Random(0x5eed)),
        oom(Placement::Random(0x5eed))
    );
    // Without a limit, every policy runs it the same way.
    for p in Placement::ALL {
        assert!(
            replay_placed(&t, &defaults, "", 1 << 30, p)
                .figures
                .oom
                .is_none()
        );
    }
}

/// `validate` and `recommend` on that trace say the verdict depends on
/// placement, and do not pass a gate on it.
#[test]
fn a_placement_dependent_verdict_is_flagged() {
    let input = fixture(PLACEMENT_TRACE);
    let out = allocdoc::app::validate::run(&ValidateOptions {
        input: input.clone(),
        conf: "max_split_size_mb:200".into(),
        capacity: Some(120 << 20),
        device: "sim".into(),
        common: allocdoc::app::Common {
            format: Format::Json,
            ..Default::default()
        },
        ..ValidateOptions::default()
    })
    .expect("runs");
    let v = json(&out);
    assert_eq!(out.exit_code, 4, "{v:#}");
    assert_eq!(v["strength"], "uncertain");
    assert_eq!(v["placement"]["robust"], false);
    let verdict = v["verdict"].as_str().expect("verdict");
    assert!(
        verdict.contains("depends on where the driver places segments"),
        "{verdict}"
    );
    assert!(verdict.contains("rising addresses"), "{verdict}");
    // A placement-robust verdict on the same trace: the capacity where nothing fails.
    let out = allocdoc::app::validate::run(&ValidateOptions {
        input: input.clone(),
        conf: "max_split_size_mb:200".into(),
        capacity: Some(1 << 30),
        device: "sim".into(),
        common: allocdoc::app::Common {
            format: Format::Json,
            ..Default::default()
        },
        ..ValidateOptions::default()
    })
    .expect("runs");
    let v = json(&out);
    assert_eq!(out.exit_code, 0, "{v:#}");
    assert_eq!(v["strength"], "proven");
    assert_eq!(v["placement"]["robust"], true);
    // recommend prefers a config that avoids the OOM under every placement.
    let out = allocdoc::app::recommend::run(&RecommendOptions {
        input,
        capacity: Some(120 << 20),
        common: allocdoc::app::Common {
            format: Format::Json,
            ..Default::default()
        },
        ..RecommendOptions::default()
    })
    .expect("runs");
    let v = json(&out);
    let rec = v["recommendation"]["value"]
        .as_str()
        .expect("a recommendation");
    let placed = v["placement"].as_array().expect("placement checked");
    let mine = placed
        .iter()
        .find(|p| p["conf"] == rec)
        .expect("the recommendation was checked under every placement");
    let robust = mine["outcomes"]
        .as_array()
        .expect("outcomes")
        .iter()
        .all(|o| o["oom"] == false);
    assert_eq!(robust, out.exit_code == 0, "{v:#}");
}
