//! `allocdoc fit` in two knobs: synthetic grids with known laws (batch-linear
//! × length-quadratic, a product, a constant, affine, a buffer made only
//! above an element count) predicted exactly at points far from the three
//! recorded corners, checked against the point's own fresh run written as
//! a trace CSV and replayed by `allocdoc replay`; the frontier (the largest
//! length that fits fits, one more does not); the real grid of
//! fixtures/grid/; the refusals.

use crate::cli::{allocdoc, conf, json, replay_csv};
use crate::written::Written;
use allocdoc::snapshot::writer::Frame;
use serde_json::Value;
use std::fmt::Write as _;
use std::path::Path;

const MIB: u64 = 1 << 20;
const WEIGHTS: [u64; 2] = [64 * MIB, 32 * MIB];

/// One allocation of the step at (batch `n`, length `s`): call site, size,
/// whether it is made there.
struct Site {
    line: i64,
    name: &'static str,
    size: fn(u64, u64) -> u64,
    made: fn(u64, u64) -> bool,
    /// Freed right after the next allocation (else at the step's end).
    early: bool,
}

const ALWAYS: fn(u64, u64) -> bool = |_, _| true;

const STEP: [Site; 6] = [
    Site {
        line: 10,
        name: "embed",
        size: |n, s| 4096 * n * s,
        made: ALWAYS,
        early: false,
    },
    Site {
        line: 20,
        name: "scores",
        size: |n, s| 4 * n * s * s,
        made: ALWAYS,
        early: true,
    },
    Site {
        line: 30,
        name: "norm",
        size: |_, _| MIB,
        made: ALWAYS,
        early: false,
    },
    Site {
        line: 40,
        name: "pad",
        size: |n, s| 2 * MIB + 8192 * s + 1024 * n,
        made: ALWAYS,
        early: false,
    },
    // A reduction buffer PyTorch makes only above some element count.
    Site {
        line: 50,
        name: "mse_loss",
        size: |_, _| 64,
        made: |n, s| n * s >= 4096,
        early: false,
    },
    Site {
        line: 60,
        name: "head",
        size: |n, _| 2048 * n,
        made: ALWAYS,
        early: false,
    },
];

/// The events of one recording at (n, s): (alloc? , key, size, site).
fn ops(n: u64, s: u64) -> Vec<(bool, usize, u64, usize)> {
    let mut out = Vec::new();
    let mut key = 0;
    for _ in 0..2 {
        let mut live: Vec<(usize, u64)> = Vec::new();
        let mut early: Option<(usize, u64)> = None;
        for (k, site) in STEP.iter().enumerate() {
            if !(site.made)(n, s) {
                continue;
            }
            key += 1;
            let size = (site.size)(n, s);
            out.push((true, key, size, k));
            if let Some((e, es)) = early.take() {
                out.push((false, e, es, 0));
            }
            if site.early {
                early = Some((key, size));
            } else {
                live.push((key, size));
            }
        }
        if let Some((e, es)) = early {
            out.push((false, e, es, 0));
        }
        for &(k, sz) in live.iter().rev() {
            out.push((false, k, sz, 0));
        }
    }
    out
}

fn snapshot(n: u64, s: u64) -> Vec<u8> {
    snapshot_in(n, s, "/home/u/model.py")
}

/// [`snapshot`] with every site in `file` (another workload when it differs).
fn snapshot_in(n: u64, s: u64, file: &str) -> Vec<u8> {
    let mut w = Written::default();
    for (alloc, key, size, site) in ops(n, s) {
        let addr = 0x7e00_0000_0000u64 + ((key as u64) << 36);
        if !alloc {
            w.free(addr, size);
            continue;
        }
        let frames = vec![
            Frame {
                filename: file.into(),
                line: STEP[site].line,
                name: STEP[site].name.into(),
            },
            Frame {
                filename: "/home/u/train.py".into(),
                line: 200,
                name: "step".into(),
            },
        ];
        w.alloc(addr, size, frames);
    }
    w.snapshot(0x7f00_0000_0000, &WEIGHTS)
}

/// The point's fresh run as a trace CSV: the weights first, then the step.
fn truth_csv(n: u64, s: u64) -> String {
    let mut csv = String::from("action,id,size,stream\n");
    for (j, w) in WEIGHTS.iter().enumerate() {
        let _ = writeln!(csv, "alloc,w{j},{w},0");
    }
    for (alloc, key, size, _) in ops(n, s) {
        if alloc {
            let _ = writeln!(csv, "alloc,k{key},{size},0");
        } else {
            let _ = writeln!(csv, "free,k{key},,0");
        }
    }
    csv
}

const ES: &str = "expandable_segments:True";
const CORNERS: [(u64, u64); 3] = [(1, 1024), (2, 1024), (1, 4096)];

fn write_grid(dir: &Path, points: &[(u64, u64)]) -> Vec<String> {
    points
        .iter()
        .map(|&(n, s)| {
            let p = dir.join(format!("b{n}_s{s}.pickle"));
            std::fs::write(&p, snapshot(n, s)).unwrap();
            p.to_string_lossy().into_owned()
        })
        .collect()
}

fn points(p: &[(u64, u64)]) -> String {
    p.iter()
        .map(|(a, b)| format!("{a},{b}"))
        .collect::<Vec<_>>()
        .join(";")
}

fn grid_fit(inputs: &[String], extra: &[&str]) -> (i32, Value) {
    let pts = points(&CORNERS);
    let mut args = vec!["fit", "--format", "json"];
    args.extend(inputs.iter().map(String::as_str));
    args.extend(["--points", &pts, "--knobs", "batch,seq_len", "--conf", ES]);
    args.extend(extra);
    json(&args)
}

/// (peak reserved under the defaults, under ES) of the point's own fresh run.
fn truth(dir: &Path, n: u64, s: u64) -> (u64, u64) {
    let v = replay_csv(
        &dir.join(format!("truth_{n}_{s}.csv")),
        &truth_csv(n, s),
        "1PiB",
    );
    let r = |i: usize| v["runs"][i]["peak_reserved_bytes"].as_u64().unwrap();
    (r(0), r(1))
}

fn prediction(v: &Value, n: u64, s: u64) -> &Value {
    v["predictions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["point"] == serde_json::json!([n, s]))
        .unwrap_or_else(|| panic!("no prediction at ({n}, {s}): {v}"))
}

#[test]
fn known_laws_in_two_knobs_are_predicted_exactly_far_from_the_corners() {
    let dir = tempfile::tempdir().unwrap();
    let inputs = write_grid(dir.path(), &CORNERS);
    let targets = [(4, 4096), (8, 512), (6, 2048), (1, 512), (3, 3000)];
    let at = points(&targets);
    let (code, v) = grid_fit(&inputs, &["--at-points", &at]);
    assert_eq!(code, 0, "{v}");
    for &(n, s) in &targets {
        let p = prediction(&v, n, s);
        assert_eq!(p["strength"], "likely", "({n}, {s}): {p}");
        let (defaults, es) = truth(dir.path(), n, s);
        assert_eq!(
            p["configs"][0]["peak_reserved_bytes"], defaults,
            "({n}, {s})"
        );
        assert_eq!(p["configs"][1]["peak_reserved_bytes"], es, "({n}, {s})");
    }
    // The laws, named in the knobs.
    let law = |name: &str| {
        v["sites"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["site"].as_str().unwrap().ends_with(name))
            .unwrap_or_else(|| panic!("{name}: {}", v["sites"]))["law"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(law(":scores"), "batch × seq_len²");
    assert_eq!(law(":embed"), "batch × seq_len");
    assert_eq!(law(":norm"), "constant");
    assert_eq!(law(":pad"), "affine in batch and seq_len");
    assert_eq!(law(":head"), "batch");
    // The buffer made from 4096 elements up: (1, 512) follows (1, 1024),
    // which does not make it; (8, 512) follows (1, 4096), which does,
    // though (2, 1024) is nearer, and says so.
    assert_eq!(
        prediction(&v, 1, 512)["reference"].as_str().unwrap(),
        inputs[0]
    );
    assert_eq!(
        prediction(&v, 8, 512)["reference"].as_str().unwrap(),
        inputs[2]
    );
    let placed = v["placed"].to_string();
    assert!(placed.contains("(8, 512) follows"), "{placed}");
}

#[test]
fn the_frontier_fits_and_one_more_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let inputs = write_grid(dir.path(), &CORNERS);
    let (code, v) = grid_fit(&inputs, &["--capacity", "4GiB", "--along", "batch=1,2,4"]);
    assert!(code == 0 || code == 4, "{v}");
    let frontier = v["frontier"].as_array().unwrap();
    assert_eq!(frontier.len(), 6, "3 batches × 2 configs");
    for f in frontier {
        let (n, w) = (f["value"].as_u64().unwrap(), f["largest"].as_u64().unwrap());
        let conf = f["conf"].as_str().unwrap();
        let at = points(&[(n, w), (n, w + 1)]);
        let (_, p) = grid_fit(&inputs, &["--at-points", &at, "--capacity", "4GiB"]);
        let ooms = |s| {
            prediction(&p, n, s)["configs"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["conf"] == conf)
                .unwrap()["oom"]
                .is_null()
        };
        assert!(ooms(w), "{conf} batch {n}: seq_len {w} should fit");
        assert!(
            !ooms(w + 1),
            "{conf} batch {n}: seq_len {} should not",
            w + 1
        );
    }
    // A larger batch fits a shorter length.
    let defaults: Vec<u64> = frontier
        .iter()
        .filter(|f| f["conf"] == "")
        .map(|f| f["largest"].as_u64().unwrap())
        .collect();
    assert!(defaults.windows(2).all(|w| w[0] > w[1]), "{defaults:?}");
    // The report draws it.
    let html = dir.path().join("g.html");
    let h = html.to_string_lossy().into_owned();
    let pts = points(&CORNERS);
    let mut args = vec!["fit"];
    args.extend(inputs.iter().map(String::as_str));
    args.extend(["--points", &pts, "--capacity", "4GiB", "--report", &h]);
    let (_, out, _) = allocdoc(&args);
    assert!(out.contains("The frontier of what fits"), "{out}");
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(
        page.contains("the largest b that fits, by a"),
        "the chart, knobs unnamed: a and b"
    );
}

#[test]
fn the_real_grid_is_predicted_within_its_bounds() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/grid");
    let grid: Value =
        serde_json::from_slice(&std::fs::read(root.join("grid.json")).unwrap()).unwrap();
    let inputs: Vec<String> = ["d16_s256", "d32_s256", "d16_s1024"]
        .iter()
        .map(|p| {
            root.join(format!("attn-{p}.pickle.xz"))
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    let targets: Vec<(u64, u64)> = grid["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["at"][0].as_u64().unwrap(), t["at"][1].as_u64().unwrap()))
        .collect();
    let at = points(&targets);
    let mut args = vec!["fit", "--format", "json"];
    args.extend(inputs.iter().map(String::as_str));
    args.extend([
        "--points",
        "16,256;32,256;16,1024",
        "--knobs",
        "d_model,seq_len",
        "--at-points",
        &at,
        "--conf",
        ES,
    ]);
    let (code, v) = json(&args);
    assert_eq!(code, 0, "{v}");
    for t in grid["targets"].as_array().unwrap() {
        let (d, s) = (t["at"][0].as_u64().unwrap(), t["at"][1].as_u64().unwrap());
        let p = prediction(&v, d, s);
        let within = |got: &Value, want: &Value, bound: f64| {
            let (g, w) = (got.as_f64().unwrap(), want.as_f64().unwrap());
            assert!((g - w).abs() / w <= bound, "({d}, {s}): {g} against {w}");
        };
        within(&p["peak_allocated_bytes"], &t["peak_allocated_bytes"], 0.01);
        within(
            &p["configs"][0]["peak_reserved_bytes"],
            &t["fresh_peak_reserved_defaults"],
            0.02,
        );
        within(
            &p["configs"][1]["peak_reserved_bytes"],
            &t["fresh_peak_reserved_es"],
            0.02,
        );
    }
}

#[test]
fn bad_grids_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let inputs = write_grid(dir.path(), &CORNERS);
    let other = dir.path().join("other.pickle");
    // Another workload: every site in another file.
    std::fs::write(&other, snapshot_in(1, 4096, "/home/x/other.py")).unwrap();
    let o = other.to_string_lossy().into_owned();
    let run = |files: &[&str], extra: &[&str]| {
        let mut args = vec!["fit"];
        args.extend(files);
        args.extend(extra);
        allocdoc(&args)
    };
    let f: Vec<&str> = inputs.iter().map(String::as_str).collect();
    let cases: Vec<(Vec<&str>, Vec<&str>, &str)> = vec![
        (
            f.clone(),
            vec!["--points", "1,1024;2,1024;4,1024"],
            "on one line",
        ),
        (
            f.clone(),
            vec!["--points", "1,1024;2,2048;4,4096"],
            "on one line",
        ),
        (
            f.clone(),
            vec!["--points", "1,1024;2,1024;1,1024"],
            "given twice",
        ),
        (
            f.clone(),
            vec!["--points", "1,1024;2,1024"],
            "2 points for 3 inputs",
        ),
        (
            f.clone(),
            vec!["--points", "1,1024;2,1024,8;1,2048"],
            "a point is two values",
        ),
        (
            f.clone(),
            vec!["--points", "1,1024;2,1024;1,4096", "--knobs", "a,b,c"],
            "two different names",
        ),
        (
            f.clone(),
            vec!["--points", "1,1024;2,1024;1,4096", "--along", "c=1"],
            "neither knob",
        ),
        (
            vec![f[0], f[1], &o],
            vec!["--points", "1,1024;2,1024;1,4096"],
            "not one workload",
        ),
    ];
    for (files, extra, want) in cases {
        let (code, out, err) = run(&files, &extra);
        assert_eq!(code, 2, "{extra:?}: {out} {err}");
        assert!(err.contains(want), "{extra:?}: {err}");
    }
}

/// `forecast` on the grid with `args` (the corners, batch first).
fn grid_forecast(inputs: &[String], extra: &[&str]) -> (i32, Value) {
    let pts = points(&CORNERS);
    let mut args = vec!["forecast", "--format", "json", "--conf", ES];
    args.extend(inputs.iter().map(String::as_str));
    args.extend(["--points", &pts, "--knobs", "batch,seq_len"]);
    args.extend(extra);
    json(&args)
}

#[test]
fn a_run_at_a_fixed_batch_forecasts_as_recordings_at_that_batch_do() {
    let dir = tempfile::tempdir().unwrap();
    let inputs = write_grid(dir.path(), &CORNERS);
    // The same workload recorded at batch 4 only, at two lengths.
    let at4 = write_grid(dir.path(), &[(4, 1024), (4, 4096)]);
    let run = dir.path().join("run.txt");
    std::fs::write(
        &run,
        "1024\n2048\n1024\n4096\n1536\n4096\n2048\n3072\n1024\n",
    )
    .unwrap();
    let run = run.to_string_lossy().into_owned();
    let (code, two) = grid_forecast(
        &inputs,
        &["--run", &run, "--batch", "4", "--capacity", "1GiB"],
    );
    assert_eq!(code, 0, "{two}");
    let mut args = vec!["forecast", "--format", "json", "--conf", ES];
    args.extend(at4.iter().map(String::as_str));
    args.extend(["--sizes", "1024,4096", "--run", &run, "--capacity", "1GiB"]);
    let (code, one) = json(&args);
    assert_eq!(code, 0, "{one}");
    assert_eq!(two["batch"], 4);
    assert_eq!(two["knobs"], serde_json::json!(["batch", "seq_len"]));
    assert_eq!(two["inputs"][2]["point"], serde_json::json!([1, 4096]));
    assert_eq!(two["peak_allocated_bytes"], one["peak_allocated_bytes"]);
    for name in ["", ES] {
        let (a, b) = (conf(&two, name), conf(&one, name));
        for field in [
            "peak_reserved_bytes",
            "peak_reserved_step",
            "reserved_after_step",
            "oom",
            "device_allocs",
        ] {
            assert_eq!(a[field], b[field], "{name:?} {field}");
        }
        // The recordings' laws make a long step after short ones cost more
        // than the largest step alone: the test is not of an empty run.
        assert!(
            a["peak_reserved_bytes"].as_u64().unwrap() > 300 * MIB,
            "{a}"
        );
    }
}

#[test]
fn the_largest_batch_carries_the_run_and_one_more_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let inputs = write_grid(dir.path(), &CORNERS);
    let lengths = dir.path().join("lengths.txt");
    // 240 samples of 512 to 4096 tokens, skewed short.
    let text: String = (0..240u64)
        .map(|i| format!("{}\n", 512 + (i * i * 7919 % 3585)))
        .collect();
    std::fs::write(&lengths, text).unwrap();
    let lengths = lengths.to_string_lossy().into_owned();
    let common = [
        "--lengths",
        lengths.as_str(),
        "--pad-to",
        "256",
        "--steps",
        "30",
        "--capacity",
        "1GiB",
    ];
    let mut args = common.to_vec();
    args.extend(["--batch", "max"]);
    let (code, v) = grid_forecast(&inputs, &args);
    assert!(code == 0 || code == 4, "{v}");
    let mut largest = Vec::new();
    for name in ["", ES] {
        let fit = &conf(&v, name)["batch"];
        let b = fit["largest"].as_u64().unwrap_or_else(|| panic!("{fit}"));
        assert!(b > 1 && b < 240, "{name:?}: {fit}");
        largest.push(b);
        // The batch found survives the card under this config; one more
        // runs out of memory, at the step the search said.
        let at = |b: u64| {
            let batch = b.to_string();
            let mut a = common.to_vec();
            a.extend(["--batch", batch.as_str()]);
            let (_, r) = grid_forecast(&inputs, &a);
            conf(&r, name).clone()
        };
        let fits = at(b);
        assert!(fits["oom"].is_null(), "{name:?} at {b}: {fits}");
        assert_eq!(fits["card_peak_reserved_bytes"], fit["peak_reserved_bytes"]);
        let over = at(b + 1);
        assert_eq!(fit["next_batch"], b + 1);
        assert_eq!(
            over["oom"]["step"], fit["next_oom_step"],
            "{name:?}: {over}"
        );
    }
    // The run shown is at the largest batch any config carries.
    assert_eq!(v["batch"], *largest.iter().max().unwrap());
}

#[test]
fn bad_grid_forecasts_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let inputs = write_grid(dir.path(), &CORNERS);
    let one = write_grid(dir.path(), &[(4, 1024), (4, 4096)]);
    let file = dir.path().join("sizes.txt");
    std::fs::write(&file, "1024\n2048\n").unwrap();
    let file = file.to_string_lossy().into_owned();
    let pts = points(&CORNERS);
    let grid_args = |extra: &[&str]| {
        let mut a: Vec<String> = vec!["forecast".into()];
        a.extend(inputs.iter().cloned());
        a.extend(["--points".into(), pts.clone()]);
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let mut one_args: Vec<String> = vec!["forecast".into()];
    one_args.extend(one.iter().cloned());
    one_args.extend(
        [
            "--sizes",
            "1024,4096",
            "--lengths",
            &file,
            "--batch",
            "max",
            "--capacity",
            "1GiB",
        ]
        .map(String::from),
    );
    let cases = [
        (grid_args(&["--run", &file]), "give --batch N"),
        (
            grid_args(&["--lengths", &file, "--batch", "max"]),
            "give --capacity",
        ),
        (
            grid_args(&["--run", &file, "--batch", "max", "--capacity", "1GiB"]),
            "not --run",
        ),
        (grid_args(&["--run", &file, "--batch", "x"]), "or `max`"),
        (one_args, "needs recordings at points of two knobs"),
    ];
    for (args, want) in cases {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, out, err) = allocdoc(&a);
        assert_eq!(code, 2, "{a:?}: {out} {err}");
        assert!(err.contains(want), "{a:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}
