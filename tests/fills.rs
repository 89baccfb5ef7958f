//! What fills the card (`top`, `diff`, diagnose's section): the figures on the
//! real traced snapshots and Mosaic's test snapshot checked against
//! `scripts/attribution_oracle.py`, an independent computation in Python
//! whose outputs are committed in `fixtures/attribution/` (and re-run here
//! when python3 is there, so the files stay the oracle's); categories and
//! what must go on a generated run whose answer is known; growth on leaking
//! and control snapshots; the inputs Mosaic crashes on.

use crate::cli::allocdoc;
use serde_json::Value;
use std::path::Path;
use std::process::Command;

const REAL: [&str; 4] = [
    "magma27-assignment2-systems_memory_snapshot",
    "wedsonlin-assignment2-systems_medium_128_inference_memory_snapshot",
    "maphsge4-select_n_snapshot_traced",
    "mosaic-test-output",
];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn json(args: &[&str]) -> Value {
    let (code, out, err) = allocdoc(args);
    assert_eq!(code, 0, "{args:?}: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}\n{out}"))
}

fn oracle(name: &str) -> Value {
    let path = root().join("fixtures/attribution").join(name);
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn snap(name: &str) -> String {
    format!("fixtures/snapshots/{name}.pickle")
}

fn moment<'v>(doc: &'v Value, kind: &str) -> &'v Value {
    doc["devices"][0]["moments"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["moment"] == kind)
        .unwrap_or_else(|| panic!("no {kind} moment"))
}

#[test]
fn peaks_sites_and_pre_trace_memory_are_the_oracles() {
    for name in REAL {
        let want = oracle(&format!("{name}.site.json"));
        let got = json(&["top", &snap(name), "-n", "5", "--format", "json"]);
        for kind in ["peak", "end"] {
            let (o, m) = (&want["devices"][0]["moments"][kind], moment(&got, kind));
            let at = format!("{name} {kind}");
            assert_eq!(m["event_index"], o["event_index"], "{at}: event index");
            assert_eq!(
                m["allocated_bytes"], o["allocated_bytes"],
                "{at}: allocated"
            );
            for f in ["bytes", "live_at_end_bytes", "freed_in_trace_bytes"] {
                assert_eq!(m["pre_trace"][f], o["pre_trace"][f], "{at}: pre_trace.{f}");
            }
            // The sites in order, then the pre-trace row as its own row.
            let rows = m["rows"].as_array().unwrap();
            let sites: Vec<(&Value, &Value, &Value)> = rows
                .iter()
                .filter(|r| r["key"] != "<live before the trace began>")
                .map(|r| (&r["key"], &r["bytes"], &r["count"]))
                .collect();
            let expected: Vec<(&Value, &Value, &Value)> = o["top"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| (&r["site"], &r["bytes"], &r["count"]))
                .collect();
            assert_eq!(sites, expected, "{at}: top 5 sites");
            let pre = rows
                .iter()
                .find(|r| r["key"] == "<live before the trace began>");
            match o["pre_trace_row"].as_object() {
                Some(p) => {
                    let pre = pre.unwrap_or_else(|| panic!("{at}: no pre-trace row"));
                    assert_eq!(pre["bytes"], p["bytes"], "{at}: pre-trace row");
                    assert_eq!(pre["count"], p["count"], "{at}: pre-trace row");
                }
                None => assert!(pre.is_none(), "{at}: a pre-trace row"),
            }
            let rest = m["rest"].as_object();
            assert_eq!(
                rest.map_or(0, |r| r["bytes"].as_u64().unwrap()),
                o["rest"]["bytes"].as_u64().unwrap(),
                "{at}: the rest"
            );
        }
        // Categories, by the same rules.
        let want = oracle(&format!("{name}.category.json"));
        let got = json(&["top", &snap(name), "--at", "peak", "--format", "json"]);
        let cats = |v: &Value, key: &str| -> Vec<(String, u64)> {
            v.as_array()
                .unwrap()
                .iter()
                .map(|c| {
                    (
                        c["category"].as_str().unwrap().to_string(),
                        c[key].as_u64().unwrap(),
                    )
                })
                .collect()
        };
        assert_eq!(
            cats(&moment(&got, "peak")["categories"], "bytes"),
            cats(
                &want["devices"][0]["moments"]["peak"]["categories"],
                "bytes"
            ),
            "{name}: categories"
        );
    }
}

#[test]
fn the_committed_oracle_outputs_are_what_the_oracle_prints() {
    let python = Command::new("python3").arg("--version").output();
    if !python.is_ok_and(|o| o.status.success()) {
        println!("skipped: no python3 to run scripts/attribution_oracle.py");
        return;
    }
    let mut runs: Vec<(String, Vec<String>)> = Vec::new();
    for name in REAL {
        runs.push((format!("{name}.site.json"), vec![snap(name)]));
        runs.push((
            format!("{name}.category.json"),
            vec![
                snap(name),
                "--by".into(),
                "category".into(),
                "--top".into(),
                "10".into(),
            ],
        ));
    }
    for name in [
        "gen-growth-leak",
        "gen-growth-control",
        "gen-growth-leak-cycles",
    ] {
        runs.push((
            format!("{name}.growth.json"),
            vec![snap(name), "--growth".into()],
        ));
    }
    for (file, args) in runs {
        let out = Command::new("python3")
            .arg("scripts/attribution_oracle.py")
            .args(&args)
            .current_dir(root())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{file}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            printed,
            oracle(&file),
            "fixtures/attribution/{file} is stale"
        );
    }
}

#[test]
fn the_text_tables_read_as_pinned() {
    for name in REAL {
        let (code, out, _) = allocdoc(&["top", &snap(name), "-n", "5"]);
        assert_eq!(code, 0);
        insta::assert_snapshot!(format!("top_{name}"), out);
    }
}

#[test]
fn categories_and_what_must_go_of_a_known_run() {
    // scripts/gen_fills_snapshot.py: 4 x 64 MiB parameters, 4 x 64 MiB
    // gradients, 8 x 64 MiB AdamW state, 6 x 96 MiB activations live when a
    // 1 GiB request fails with 180 MiB free and every segment full.
    const MIB: u64 = 1 << 20;
    let doc = json(&["top", &snap("gen-fills-capacity-oom"), "--format", "json"]);
    let oom = moment(&doc, "oom");
    let cats: Vec<(&str, u64)> = oom["categories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["category"].as_str().unwrap(),
                c["bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        cats,
        [
            ("activations", 576 * MIB),
            ("optimizer_state", 512 * MIB),
            ("parameters", 256 * MIB),
            ("gradients", 256 * MIB)
        ]
    );
    // At the peak of the first step, backward's temporaries and the
    // optimizer's are told apart from what outlives their phase.
    let at = |event: &str| {
        let d = json(&[
            "top",
            &snap("gen-fills-capacity-oom"),
            "--at",
            event,
            "--by",
            "category",
            "--format",
            "json",
        ]);
        d["devices"][0]["moments"][0]["categories"].clone()
    };
    let bytes_of = |cats: &Value, name: &str| {
        cats.as_array()
            .unwrap()
            .iter()
            .find(|c| c["category"] == name)
            .map_or(0, |c| c["bytes"].as_u64().unwrap())
    };
    // Entry 31: the second backward temporary just allocated.
    let in_backward = at("31");
    assert_eq!(bytes_of(&in_backward, "backward_temporaries"), 64 * MIB);
    assert_eq!(bytes_of(&in_backward, "gradients"), 256 * MIB);
    // Entry 71 (after 8 frees and 8 states): the fourth optimizer temporary.
    let in_step = at("71");
    assert_eq!(bytes_of(&in_step, "optimizer_temporaries"), 64 * MIB);
    assert_eq!(bytes_of(&in_step, "optimizer_state"), 512 * MIB);
    let g = &doc["must_go"];
    assert_eq!(
        g["shortfall_bytes"],
        844 * MIB,
        "1 GiB − 180 MiB free − 0 B cached"
    );
    assert_eq!(g["allocated_bytes"], 1600 * MIB);
    assert_eq!(g["levers"][0]["category"], "activations");
    assert_eq!(g["levers"][0]["bytes"], 576 * MIB);
    let card = &g["smallest_card"][0];
    assert_eq!(card["config"], "current");
    // The replay's own peak reserved at that card (the bisection's answer, checked both ways).
    let cap = card["capacity_bytes"].as_u64().unwrap();
    let fits = |c: u64| {
        let (code, _, _) = allocdoc(&[
            "replay",
            &snap("gen-fills-capacity-oom"),
            "--capacity",
            &c.to_string(),
        ]);
        code == 0
    };
    assert!(fits(cap) && !fits(cap - (1 << 20)), "smallest card {cap}");
}

#[test]
fn a_leaking_site_is_named_with_its_bytes_per_step_and_the_control_has_none() {
    // scripts/gen_growth_snapshot.py: train.py:88:log_metrics keeps
    // 3 MiB + 1234 B alive every step for 8 steps.
    const K: f64 = (3 * 1024 * 1024 + 1234) as f64;
    for name in ["gen-growth-leak", "gen-growth-leak-cycles"] {
        let doc = json(&["top", &snap(name), "--format", "json"]);
        let g = &doc["devices"][0]["growth"][0];
        assert_eq!(g["site"], "train.py:88:log_metrics", "{name}");
        let per_step = g["bytes_per_step"].as_u64().unwrap() as f64;
        assert!((per_step - K).abs() / K < 0.01, "{name}: {per_step} a step");
        let want =
            &oracle(&format!("{name}.growth.json"))["devices"][0]["growth"]["growing_sites"][0];
        assert_eq!(g["first_step"], want["first_step"], "{name}");
        assert_eq!(g["last_step"], want["last_step"], "{name}");
        assert_eq!(g["last_bytes"], want["last_bytes"], "{name}");
        let (_, text, _) = allocdoc(&["diagnose", &snap(name), "--format", "json"]);
        let d: Value = serde_json::from_str(&text).unwrap();
        let finding = d["findings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["rule"] == "trace-growing-site")
            .unwrap_or_else(|| panic!("{name}: no growth finding"));
        assert_eq!(finding["site"], "train.py:88:log_metrics");
    }
    let control = json(&["top", &snap("gen-growth-control"), "--format", "json"]);
    assert_eq!(control["devices"][0]["growth"], serde_json::json!([]));
    assert!(
        oracle("gen-growth-control.growth.json")["devices"][0]["growth"]["growing_sites"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    let (_, text, _) = allocdoc(&["diagnose", &snap("gen-growth-control"), "--format", "json"]);
    assert!(
        !text.contains("trace-growing-site\""),
        "the control fires no growth rule"
    );
}

#[test]
fn a_row_that_mixes_categories_says_so_and_both_tables_name_a_site_alike() {
    // gen-growth-leak's peak: train.py:66 (loss.backward()) holds a 64 MiB
    // backward temporary beside 8 MiB of gradients.
    let doc = json(&["top", &snap("gen-growth-leak"), "--format", "json"]);
    let row = moment(&doc, "peak")["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["key"] == "train.py:66:train_step")
        .unwrap()
        .clone();
    assert_eq!(row["category"], "backward_temporaries");
    assert_eq!(
        row["mix"],
        serde_json::json!([
            {"category": "backward_temporaries", "bytes": 67108864u64},
            {"category": "gradients", "bytes": 8392704u64},
        ])
    );
    let (_, text, _) = allocdoc(&["top", &snap("gen-growth-leak"), "--format", "markdown"]);
    assert!(
        text.contains(
            "| train.py:66:train_step | mixed: backward temporaries 88.9 %, gradients 11.1 % | 72.00 MiB |"
        ),
        "{text}"
    );
    // In a terminal, a part a line under "mixed:".
    let (_, text, _) = allocdoc(&["top", &snap("gen-growth-leak")]);
    let lines: Vec<&str> = text.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.contains("train.py:66:train_step"))
        .unwrap();
    assert!(lines[at].contains("┆ mixed: "), "{text}");
    assert!(
        lines[at + 1].contains("┆ backward temporaries 88.9 %, "),
        "{text}"
    );
    assert!(lines[at + 2].contains("┆ gradients 11.1 % "), "{text}");
    // A row of one category has no mix.
    let forward = &moment(&doc, "peak")["rows"][0];
    assert_eq!(forward["key"], "model.py:41:forward");
    assert!(forward.get("mix").is_none(), "{forward}");

    // gen-growth-leak-eval: log_metrics also runs an evaluation forward pass
    // (32 MiB of activations a step, freed at once) beside what it keeps.
    // Over the trace its bytes are mostly activations, at the peak it holds
    // only what it kept: the Growing table once said "activations" beside
    // the peak table's "unknown".
    let doc = json(&["top", &snap("gen-growth-leak-eval"), "--format", "json"]);
    let g = &doc["devices"][0]["growth"][0];
    assert_eq!(g["site"], "train.py:88:log_metrics");
    let peak_row = moment(&doc, "peak")["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["key"] == g["site"])
        .unwrap()
        .clone();
    assert_eq!(g["category"], "unknown");
    assert_eq!(peak_row["category"], g["category"]);
    assert_eq!(peak_row.get("mix"), g.get("mix"));
    let (_, text, _) = allocdoc(&["top", &snap("gen-growth-leak-eval"), "--format", "markdown"]);
    assert!(
        text.contains("| train.py:88:log_metrics | unknown | 3.00 MiB | 0–7 | 0 B | 21.01 MiB |"),
        "{text}"
    );
    assert!(!text.contains("log_metrics | activations"), "{text}");
}

#[test]
fn inputs_mosaic_crashes_on_are_attributed() {
    // No time_us (maphsge4), blocks without an address (yiyi), empty traces
    // and no stacks (muduard dump, maphsge4 dev1), a plain segment list (muduard .pkl).
    for (name, stacks) in [
        ("maphsge4-select_n_snapshot_traced", "python_and_cpp"),
        ("yiyi-llm-inference_oom_snapshot", "python"),
        ("muduard-layoutediting_dump_snapshot", "none"),
        ("maphsge4-select_n_snapshot_dev1", "none"),
    ] {
        let doc = json(&["top", &snap(name), "--format", "json"]);
        assert_eq!(doc["devices"][0]["stacks"], stacks, "{name}");
    }
    let list = json(&[
        "top",
        "fixtures/snapshots/muduard-layoutediting_memory_snapshot.pkl",
        "--format",
        "json",
    ]);
    let end = moment(&list, "end");
    // Σ requested bytes of the active blocks (the shared README's allocated figure is Σ block sizes).
    assert_eq!(end["allocated_block_bytes"], 3353639424u64);
    // No stacks: by block size and by segment, and how to record stacks.
    let (code, text, _) = allocdoc(&["top", &snap("muduard-layoutediting_dump_snapshot")]);
    assert_eq!(code, 0);
    assert!(text.contains("│ block size"), "{text}");
    assert!(text.contains("│ segment "), "{text}");
    assert!(
        text.contains("_record_memory_history(max_entries=100_000)"),
        "{text}"
    );
    // yiyi's blocks keep their stacks in the legacy history.
    let yiyi = json(&[
        "top",
        &snap("yiyi-llm-inference_oom_snapshot"),
        "--format",
        "json",
    ]);
    assert_eq!(
        moment(&yiyi, "end")["rows"][0]["key"],
        "pytorch_backend.py:190:allocate"
    );
    assert_eq!(
        moment(&yiyi, "end")["pre_trace"]["bytes"],
        0,
        "no trace: nothing is before it"
    );
}

#[test]
fn a_trace_that_starts_mid_run_counts_unseen_frees_as_pre_trace_memory() {
    // magma27 frees two allocations it never saw allocated (312.50 MiB):
    // live from before the trace until their free, never negative.
    let doc = json(&[
        "top",
        &snap("magma27-assignment2-systems_memory_snapshot"),
        "--at",
        "0",
        "--format",
        "json",
    ]);
    let m = &doc["devices"][0]["moments"][0];
    assert_eq!(m["pre_trace"]["freed_in_trace_bytes"], 327680004u64);
    let notes = doc["devices"][0]["notes"].to_string();
    assert!(notes.contains("never saw allocated"), "{notes}");
    for at in ["0", "1402", "5162", "0.5s", "99999999"] {
        let d = json(&[
            "top",
            &snap("magma27-assignment2-systems_memory_snapshot"),
            "--at",
            at,
            "--format",
            "json",
        ]);
        let m = &d["devices"][0]["moments"][0];
        let rows: u64 = m["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["bytes"].as_u64().unwrap())
            .sum();
        let rest = m["rest"]["bytes"].as_u64().unwrap_or(0);
        assert_eq!(
            rows + rest,
            m["allocated_bytes"].as_u64().unwrap(),
            "--at {at}: rows add up"
        );
    }
}

#[test]
fn wrong_inputs_and_options_are_named() {
    let (code, _, err) = allocdoc(&["top", "fixtures/text/readme_example.log"]);
    assert_eq!(code, 2);
    assert!(err.contains("not a snapshot pickle"), "{err}");
    let (code, _, err) = allocdoc(&[
        "top",
        &snap("wedsonlin-assignment2-systems_medium_128_inference_memory_snapshot"),
        "--device",
        "7",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("cuda:7") && err.contains("cuda:0"), "{err}");
    let (code, _, err) = allocdoc(&["top", &snap("mosaic-test-output"), "--at", "yesterday"]);
    assert_eq!(code, 2);
    assert!(err.contains("--at"), "{err}");
    let (code, _, err) = allocdoc(&[
        "diff",
        &snap("mosaic-test-output"),
        &snap("mosaic-test-output"),
        "--at",
        "12",
    ]);
    assert_eq!(code, 2, "{err}");
}

#[test]
fn diff_compares_sites_categories_and_pre_trace_memory_on_both_sides() {
    let (b, a) = (
        snap("wedsonlin-assignment2-systems_medium_128_inference_memory_snapshot"),
        snap("magma27-assignment2-systems_memory_snapshot"),
    );
    let d = json(&["diff", &b, &a, "--format", "json"]);
    assert_eq!(d["before"]["peak_allocated_bytes"], 1736962048u64);
    assert_eq!(d["after"]["peak_allocated_bytes"], 13923997700u64);
    assert_eq!(d["before"]["pre_trace_bytes"], 1701310464u64);
    let row = |key: &str| {
        d["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["key"] == key)
            .unwrap_or_else(|| panic!("no {key}"))
            .clone()
    };
    let einsum = row("einops/_backends.py:291:einsum");
    assert_eq!(einsum["before_bytes"], 10485760u64);
    assert_eq!(einsum["after_bytes"], 3045588992u64);
    assert_eq!(einsum["delta_bytes"], 3045588992i64 - 10485760);
    let pre = row("<live before the trace began>");
    assert_eq!(pre["delta_bytes"], 1046239236i64 - 1701310464);
    // Every byte of both sides is in the rows and the rest.
    let side = |f: &str| {
        let rows: u64 = d["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r[f].as_u64().unwrap())
            .sum();
        rows + d["rest"][f].as_u64().unwrap_or(0)
    };
    assert_eq!(side("before_bytes"), 1736962048);
    assert_eq!(side("after_bytes"), 13923997700);
}

#[test]
fn diff_says_what_live_before_the_trace_holds_as_top_does() {
    // gen-trace-frees-first: 8 MiB live before the trace at its peak, 4 MiB of
    // it in a block with a recorded stack (under model.py:17:forward), so the
    // `<live before the trace began>` row holds 4 MiB beside the 8 MiB total.
    let (b, a) = (snap("gen-trace-frees-first"), snap("gen-growth-leak"));
    let figures = "8.00 MiB, 100.0 % of what is allocated (2 allocations): 4.00 MiB still live at the end, 4.00 MiB freed later in the trace, 4.00 MiB of it in blocks with a recorded stack, shown by site.";
    let (code, text, err) = allocdoc(&["diff", &b, &a]);
    assert_eq!(code, 0, "{err}");
    assert!(
        text.contains(&format!("Live before the trace began, before: {figures}")),
        "{text}"
    );
    // The after side has none: no line for it.
    assert!(
        !text.contains("Live before the trace began, after"),
        "{text}"
    );
    let (_, top, _) = allocdoc(&["top", &b]);
    assert!(
        top.contains(&format!("Live before the trace began: {figures}")),
        "{top}"
    );
    let d = json(&["diff", &b, &a, "--format", "json"]);
    let pre = &d["before"]["pre_trace"];
    assert_eq!(pre["bytes"], d["before"]["pre_trace_bytes"]);
    assert_eq!(pre["with_stack_bytes"], 4u64 << 20);
    let row = d["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["key"] == "<live before the trace began>")
        .unwrap();
    assert_eq!(
        row["before_bytes"].as_u64().unwrap(),
        pre["bytes"].as_u64().unwrap() - pre["with_stack_bytes"].as_u64().unwrap()
    );
}

#[test]
fn several_snapshots_give_the_per_rank_table() {
    let dir = tempfile::tempdir().unwrap();
    let src = root().join("fixtures/snapshots");
    for (rank, name) in [
        (
            0,
            "wedsonlin-assignment2-systems_medium_128_inference_memory_snapshot",
        ),
        (
            1,
            "wedsonlin-assignment2-systems_medium_128_inference_memory_snapshot",
        ),
        (2, "magma27-assignment2-systems_memory_snapshot"),
        (
            3,
            "wedsonlin-assignment2-systems_medium_128_inference_memory_snapshot",
        ),
    ] {
        std::fs::copy(
            src.join(format!("{name}.pickle")),
            dir.path().join(format!("snapshot_rank{rank}_step9.pickle")),
        )
        .unwrap();
    }
    let d = dir.path().to_str().unwrap();
    let doc = json(&["top", "--each", d, "--format", "json"]);
    let r = &doc["ranks"];
    let ranks: Vec<u64> = r["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["rank"].as_u64().unwrap())
        .collect();
    assert_eq!(ranks, [0, 1, 2, 3]);
    assert_eq!(r["outlier_rank"], 2);
    let imbalance = r["imbalance"].as_f64().unwrap();
    assert!(
        (imbalance - 13923997700.0 / 1736962048.0).abs() < 1e-3,
        "{imbalance}"
    );
    assert_eq!(r["rows"][2]["top_site"], "einops/_backends.py:291:einsum");
    assert_eq!(r["rows"][2]["top_category"], "activations");
    let (code, text, _) = allocdoc(&["top", "--each", d]);
    assert_eq!(code, 0);
    assert!(text.contains("Out of balance: rank 2"), "{text}");
}

#[test]
fn diagnose_shows_what_fills_the_card_and_keeps_its_exit_code() {
    let magma = snap("magma27-assignment2-systems_memory_snapshot");
    let (code, text, _) = allocdoc(&["diagnose", &magma]);
    assert_eq!(code, 0);
    assert!(
        text.contains("What fills the card (cuda:0): at the peak of allocated memory (event 1402)"),
        "{text}"
    );
    assert!(text.contains("einops/_backends.py:291:einsum"), "{text}");
    assert!(text.contains("<live before the trace began>"), "{text}");
    let d = json(&["diagnose", &magma, "--format", "json"]);
    assert_eq!(d["fills"]["moment"]["allocated_bytes"], 13923997700u64);
    assert_eq!(d["fills"]["moment"]["rows"][0]["bytes"], 3045588992u64);
    // A capacity OOM from text: the shortfall by the message's figures.
    let d = json(&[
        "diagnose",
        "fixtures/eval/daitao-san-39.txt",
        "--format",
        "json",
    ]);
    if d["cause"] == "capacity" {
        let g = &d["fills"]["must_go"];
        let want = g["request_bytes"].as_u64().unwrap()
            - g["device_free_bytes"].as_u64().unwrap()
            - g["reserved_free_bytes"].as_u64().unwrap();
        assert_eq!(g["shortfall_bytes"].as_u64().unwrap(), want);
    } else {
        panic!("daitao-san-39 is a capacity OOM: {}", d["cause"]);
    }
}
