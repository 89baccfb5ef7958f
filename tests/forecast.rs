//! `allocdoc forecast`: runs of many steps whose size varies, replayed as
//! one process. Synthetic workloads with known laws and a known hand-over
//! between steps are checked against the run written out as a trace CSV
//! from shared/forecast/README.md's semantics and replayed by
//! `allocdoc replay` (an independent path: no forecast code builds it): a
//! known ratchet (short steps, then a long one), a run that repeats one
//! size (its peak is fit's fresh one-step peak), a leak carried forward,
//! state made at the first step kept. Also: the cap's bisection (the cap
//! survives, the next size up does not), skipping seen steps equals
//! replaying every one, the real runs of fixtures/forecast/ exactly, and the
//! refusals.

use crate::cli::{allocdoc, conf, json, replay_csv};
use crate::written::Written;
use allocdoc::snapshot::writer::{Action, Frame};
use serde_json::Value;
use std::fmt::Write as _;
use std::path::Path;

const MIB: u64 = 1 << 20;
const WEIGHTS: [u64; 2] = [64 * MIB, 32 * MIB];
const WEIGHTS_AT: u64 = 0x7f00_0000_0000;
/// Where the previous step's output was (above the weights).
const HANDED_AT: u64 = 0x7f20_0000_0000;

/// What a recording's step does besides its temporaries.
#[derive(Clone, Copy, Default)]
struct Shape {
    /// Steps in the recording's trace.
    steps: usize,
    /// The step frees the previous step's output and leaves its own.
    hand_over: bool,
    /// Every step leaves a block nothing frees.
    leak: bool,
    /// The first step makes optimizer state nothing frees.
    state: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Temp,
    Output,
    Leak,
    State,
}

/// One op of a recording, by key (unique within it).
#[derive(Clone, Copy, Debug)]
enum Op {
    Alloc {
        key: usize,
        size: u64,
        site: usize,
        kind: Kind,
    },
    Free {
        key: usize,
    },
    /// The free of the previous step's output (live before the trace).
    FreeHanded,
}

const SITES: [(&str, i64, &str); 7] = [
    ("model.py", 10, "embed"),
    ("model.py", 20, "attention_scores"),
    ("model.py", 30, "norm"),
    ("model.py", 40, "output"),
    ("model.py", 50, "leaky_cache"),
    ("optim.py", 60, "exp_avg"),
    ("optim.py", 70, "exp_avg_sq"),
];

fn output(n: u64) -> u64 {
    MIB + 4096 * n
}

/// The attention scores: quadratic, and the most of a step.
fn scores(n: u64) -> u64 {
    256 * n * n
}

fn leaked(n: u64) -> u64 {
    2 * MIB + 1024 * n
}

/// The ops of a recording at size `n`.
fn ops(shape: Shape, n: u64) -> Vec<Op> {
    let mut out = Vec::new();
    let mut key = 0;
    let mut alloc = |out: &mut Vec<Op>, size, site, kind| {
        key += 1;
        out.push(Op::Alloc {
            key,
            size,
            site,
            kind,
        });
        key
    };
    let mut prev_output = None;
    for s in 0..shape.steps.max(1) {
        let embed = alloc(&mut out, 3072 * n, 0, Kind::Temp);
        if shape.hand_over {
            match prev_output {
                None => out.push(Op::FreeHanded),
                Some(k) => out.push(Op::Free { key: k }),
            }
        }
        let scores = alloc(&mut out, self::scores(n), 1, Kind::Temp);
        let norm = alloc(&mut out, MIB, 2, Kind::Temp);
        out.push(Op::Free { key: scores });
        if shape.hand_over {
            prev_output = Some(alloc(&mut out, output(n), 3, Kind::Output));
        }
        if shape.leak {
            alloc(&mut out, leaked(n), 4, Kind::Leak);
        }
        if shape.state && s == 0 {
            alloc(&mut out, 48 * MIB, 5, Kind::State);
            alloc(&mut out, 48 * MIB, 6, Kind::State);
        }
        out.push(Op::Free { key: norm });
        out.push(Op::Free { key: embed });
    }
    out
}

/// The recording at `n` as a snapshot.
fn snapshot(shape: Shape, n: u64) -> Vec<u8> {
    let mut w = Written::default();
    let mut blocks = std::collections::HashMap::new();
    for op in ops(shape, n) {
        match op {
            Op::Alloc {
                key, size, site, ..
            } => {
                let addr = 0x7e00_0000_0000u64 + ((key as u64) << 32);
                blocks.insert(key, (addr, size));
                let (file, line, name) = SITES[site];
                let frames = vec![
                    Frame {
                        filename: format!("/home/u/{file}"),
                        line,
                        name: name.into(),
                    },
                    Frame {
                        filename: "/home/u/train.py".into(),
                        line: 200,
                        name: "train_step".into(),
                    },
                ];
                w.alloc(addr, size, frames);
            }
            Op::Free { key } => {
                let (addr, size) = blocks[&key];
                w.free(addr, size);
            }
            Op::FreeHanded => w.free(HANDED_AT, output(n)),
        }
    }
    w.snapshot(WEIGHTS_AT, &WEIGHTS)
}

/// The run of `sizes` as a trace CSV, by shared/forecast/README.md: the
/// first step's live-before memory in address order (the weights, then the
/// previous output), then each step's ops, the previous output's free
/// freeing the step before's output; leaked blocks never freed; state made
/// by the first step only.
fn truth_csv(shape: Shape, sizes: &[u64]) -> String {
    let mut csv = String::from("action,id,size,stream\n");
    for (j, w) in WEIGHTS.iter().enumerate() {
        let _ = writeln!(csv, "alloc,w{j},{w},0");
    }
    if shape.hand_over {
        let _ = writeln!(csv, "alloc,handed,{},0", output(sizes[0]));
    }
    let mut handed = "handed".to_string();
    for (i, &n) in sizes.iter().enumerate() {
        let id = |key: usize| format!("s{i}k{key}");
        let mut last_output = None;
        for op in ops(shape, n) {
            match op {
                Op::Alloc {
                    key, size, kind, ..
                } => {
                    if kind == Kind::State && i > 0 {
                        continue;
                    }
                    if kind == Kind::Output {
                        last_output = Some(id(key));
                    }
                    let _ = writeln!(csv, "alloc,{},{size},0", id(key));
                }
                Op::Free { key } => {
                    let _ = writeln!(csv, "free,{},,0", id(key));
                }
                Op::FreeHanded => {
                    let _ = writeln!(csv, "free,{handed},,0");
                }
            }
        }
        if let Some(o) = last_output {
            handed = o;
        }
    }
    csv
}

const ES: &str = "expandable_segments:True";

/// The truth: the run's CSV replayed (defaults, ES) on `capacity`:
/// (peak reserved, OOM event) per config.
fn truth(dir: &Path, shape: Shape, sizes: &[u64], capacity: &str) -> Vec<(u64, Option<u64>)> {
    let v = replay_csv(&dir.join("truth.csv"), &truth_csv(shape, sizes), capacity);
    v["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["peak_reserved_bytes"].as_u64().unwrap(),
                r["oom"]["event_index"].as_u64(),
            )
        })
        .collect()
}

/// Writes the recordings at `sizes` and the run; returns the input paths
/// and the run file.
fn write(dir: &Path, shape: Shape, recorded: &[u64], run: &[u64]) -> (Vec<String>, String) {
    let inputs = recorded
        .iter()
        .map(|&n| {
            let p = dir.join(format!("r{n}.pickle"));
            std::fs::write(&p, snapshot(shape, n)).unwrap();
            p.to_string_lossy().into_owned()
        })
        .collect();
    let r = dir.join("run.txt");
    let mut text = "# a run\n".to_string();
    for z in run {
        let _ = writeln!(text, "{z}");
    }
    std::fs::write(&r, text).unwrap();
    (inputs, r.to_string_lossy().into_owned())
}

fn forecast(inputs: &[String], sizes: &str, run: &str, extra: &[&str]) -> (i32, Value) {
    let mut args = vec!["forecast", "--format", "json"];
    args.extend(inputs.iter().map(String::as_str));
    args.extend(["--sizes", sizes, "--run", run, "--conf", ES]);
    args.extend(extra);
    json(&args)
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

const HAND_OVER: Shape = Shape {
    steps: 1,
    hand_over: true,
    leak: false,
    state: false,
};

#[test]
fn a_long_step_after_short_ones_ratchets_above_its_own_peak_as_the_replayed_run_does() {
    let dir = tempfile::tempdir().unwrap();
    // Recorded at 512 and 1024; the run's 2048 is predicted by the laws.
    let run = [512, 512, 1024, 512, 1024, 1024, 2048, 512, 2048];
    let (inputs, runf) = write(dir.path(), HAND_OVER, &[512, 1024], &run);
    let (code, v) = forecast(&inputs, "512,1024", &runf, &[]);
    assert_eq!(code, 0, "{v}");
    let t = truth(dir.path(), HAND_OVER, &run, "1PiB");
    assert_eq!(u(&conf(&v, "")["peak_reserved_bytes"]), t[0].0);
    assert_eq!(u(&conf(&v, ES)["peak_reserved_bytes"]), t[1].0);
    // The ratchet: under the defaults the run peaks above its largest step
    // alone (fit's fresh run at 2048), at the first long step.
    let d = conf(&v, "");
    let (_, f) = json(&[
        "fit", "--format", "json", &inputs[0], &inputs[1], "--sizes", "512,1024", "--at", "2048",
    ]);
    let alone = u(&f["predictions"][0]["configs"][0]["peak_reserved_bytes"]);
    assert_eq!(u(&d["step_peak_reserved_bytes"]), alone);
    assert!(u(&d["peak_reserved_bytes"]) > alone, "{d}");
    assert!(d["ratchet"].as_f64().unwrap() > 1.0);
    assert_eq!(d["peak_reserved_step"], 7);
    // What strands it: the scores of the shorter steps, cached free when
    // the long step's scores were asked for.
    let st = &d["stranded"];
    assert_eq!(u(&st["requested_bytes"]), scores(2048));
    assert!(st["site"].as_str().unwrap().ends_with("attention_scores"));
    assert!(u(&st["largest_free_bytes"]) >= scores(1024), "{st}");
    // Allocated memory comes with the sizes, it does not grow: the cache.
    assert!(v["leak"].is_null());
    assert_eq!(v["peak_allocated_step"], 7);
    let findings = v["findings"].to_string();
    assert!(findings.contains("no leak"), "{findings}");
    assert!(findings.contains("ratchets"), "{findings}");
    // One reserved figure per step, on a card without limit.
    assert_eq!(
        d["reserved_after_step"].as_array().unwrap().len(),
        run.len()
    );
}

#[test]
fn the_oom_step_is_the_replayed_runs_and_the_cap_carries_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let run = [512, 1024, 512, 1024, 2048, 1024, 2048];
    let (inputs, runf) = write(dir.path(), HAND_OVER, &[512, 1024], &run);
    // A card between the largest step alone and the run's peak.
    let (_, free) = forecast(&inputs, "512,1024", &runf, &[]);
    let d = conf(&free, "");
    let (alone, peak) = (
        u(&d["step_peak_reserved_bytes"]),
        u(&d["peak_reserved_bytes"]),
    );
    assert!(peak > alone + 2 * MIB, "{d}");
    let cap = (alone + peak) / 2;
    let capacity = cap.to_string();
    let (code, v) = forecast(&inputs, "512,1024", &runf, &["--capacity", &capacity]);
    let t = truth(dir.path(), HAND_OVER, &run, &capacity);
    let oom = &conf(&v, "")["oom"];
    match t[0].1 {
        Some(event) => {
            assert_eq!(u(&oom["event_index"]), event, "{oom}");
            assert_eq!(u(&oom["size"]), 2048);
        }
        None => assert!(oom.is_null(), "{oom}"),
    }
    assert_eq!(conf(&v, ES)["oom"].is_null(), t[1].1.is_none());
    // Below the largest step alone every config runs out of memory at the
    // first 2048 step; the cap's bisection finds where the run survives.
    let small = (alone - alone / 50).to_string();
    let (code_small, v) = forecast(&inputs, "512,1024", &runf, &["--capacity", &small]);
    let d = conf(&v, "");
    assert_eq!(d["oom"]["step"], 5, "{d}");
    let (_, f) = json(&[
        "fit",
        "--format",
        "json",
        &inputs[0],
        &inputs[1],
        "--sizes",
        "512,1024",
        "--at",
        "2048",
        "--capacity",
        &small,
    ]);
    let alone_fits = f["predictions"][0]["configs"][0]["oom"].is_null();
    assert_eq!(d["oom"]["fits_alone"], alone_fits);
    let cap = &d["cap"];
    assert_eq!(cap["needed"], true);
    let l = u(&cap["size"]);
    assert!((1024..2048).contains(&l), "{cap}");
    assert_eq!(u(&cap["steps_capped"]), 2);
    // The capped run survives; one more and it does not.
    for (at, survives) in [(l, true), (l + 1, false)] {
        let capped: Vec<u64> = run.iter().map(|&z| z.min(at)).collect();
        let (_, runc) = write(dir.path(), HAND_OVER, &[], &capped);
        let (_, c) = forecast(&inputs, "512,1024", &runc, &["--capacity", &small]);
        assert_eq!(conf(&c, "")["oom"].is_null(), survives, "cap {at}: {c}");
    }
    assert!(
        v["cap_sentence"]
            .as_str()
            .unwrap()
            .contains(&format!("at {l} under PyTorch's defaults"))
    );
    // Exit 1 only when every config runs out of memory.
    let every = v["configs"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| !c["oom"].is_null());
    assert_eq!(code_small, if every { 1 } else { 0 });
    assert!(code == 0 || code == 1);
}

#[test]
fn a_run_of_one_size_peaks_as_its_fresh_step_does() {
    let dir = tempfile::tempdir().unwrap();
    let run = [1024; 12];
    let (inputs, runf) = write(dir.path(), HAND_OVER, &[512, 1024], &run);
    let (_, v) = forecast(&inputs, "512,1024", &runf, &[]);
    let (_, f) = json(&[
        "fit", "--format", "json", &inputs[0], &inputs[1], "--sizes", "512,1024", "--at", "1024",
        "--conf", ES,
    ]);
    for (i, name) in ["", ES].iter().enumerate() {
        let fresh = u(&f["predictions"][0]["configs"][i]["peak_reserved_bytes"]);
        assert_eq!(u(&conf(&v, name)["peak_reserved_bytes"]), fresh, "{name}");
        assert_eq!(conf(&v, name)["ratchet"].as_f64().unwrap(), 1.0);
    }
    let t = truth(dir.path(), HAND_OVER, &run, "1PiB");
    assert_eq!(u(&conf(&v, "")["peak_reserved_bytes"]), t[0].0);
}

#[test]
fn a_leak_is_carried_forward_step_by_step_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let shape = Shape {
        steps: 3,
        leak: true,
        ..Shape::default()
    };
    let run = [512, 1024, 512, 1024, 1024, 512];
    let (inputs, runf) = write(dir.path(), shape, &[512, 1024], &run);
    let (_, v) = forecast(&inputs, "512,1024", &runf, &[]);
    let t = truth(dir.path(), shape, &run, "1PiB");
    assert_eq!(u(&conf(&v, "")["peak_reserved_bytes"]), t[0].0);
    assert_eq!(u(&conf(&v, ES)["peak_reserved_bytes"]), t[1].0);
    // Allocated memory grows by three leaked blocks every step: the peak is
    // the highest of a step's top over everything leaked before it.
    let leak = &v["leak"];
    assert!(
        leak["sites"][0].as_str().unwrap().ends_with("leaky_cache"),
        "{leak}"
    );
    assert_eq!(u(&leak["bytes_per_step"]), 3 * leaked(1024));
    let weights: u64 = WEIGHTS.iter().sum();
    let (mut before, mut peak) = (0, 0);
    for &n in &run {
        // The third recorded step: two leaked blocks of this step already live.
        let top = 3072 * n + scores(n) + MIB + 2 * leaked(n);
        peak = peak.max(weights + before + top);
        before += 3 * leaked(n);
    }
    assert_eq!(u(&v["peak_allocated_bytes"]), peak);
    assert!(
        v["findings"]
            .to_string()
            .contains("a leak no allocator setting fixes")
    );
    assert!(v["carried"].to_string().contains("carried forward"));
}

#[test]
fn state_made_at_the_first_step_is_kept_and_not_made_again() {
    let dir = tempfile::tempdir().unwrap();
    let shape = Shape {
        steps: 1,
        state: true,
        ..Shape::default()
    };
    let run = [512, 1024, 1024, 512, 1024];
    let (inputs, runf) = write(dir.path(), shape, &[512, 1024], &run);
    let (_, v) = forecast(&inputs, "512,1024", &runf, &[]);
    let t = truth(dir.path(), shape, &run, "1PiB");
    assert_eq!(u(&conf(&v, "")["peak_reserved_bytes"]), t[0].0);
    assert_eq!(u(&conf(&v, ES)["peak_reserved_bytes"]), t[1].0);
    // 96 MiB of state once, not once per step.
    let weights: u64 = WEIGHTS.iter().sum();
    let top = 3072 * 1024 + scores(1024) + MIB;
    assert_eq!(u(&v["peak_allocated_bytes"]), weights + 96 * MIB + top);
    assert!(v["leak"].is_null());
    assert!(
        v["carried"]
            .to_string()
            .contains("state made at the first step")
    );
}

#[test]
fn skipping_seen_steps_answers_as_replaying_every_step() {
    let dir = tempfile::tempdir().unwrap();
    let run: Vec<u64> = (0..120)
        .map(|i| [512, 1024, 512, 768, 2048][i % 5])
        .collect();
    let (inputs, runf) = write(dir.path(), HAND_OVER, &[512, 1024], &run);
    for extra in [&[][..], &["--capacity", "700MiB"][..]] {
        let (c1, mut a) = forecast(&inputs, "512,1024", &runf, extra);
        let mut args = extra.to_vec();
        args.push("--no-skip");
        let (c2, mut b) = forecast(&inputs, "512,1024", &runf, &args);
        assert_eq!(c1, c2);
        let (mut looked_up, mut all) = (0, 0);
        for (x, y) in a["configs"]
            .as_array_mut()
            .unwrap()
            .iter_mut()
            .zip(b["configs"].as_array_mut().unwrap())
        {
            looked_up += u(&x["replayed_steps"]);
            all += u(&y["replayed_steps"]);
            x["replayed_steps"] = Value::Null;
            y["replayed_steps"] = Value::Null;
        }
        assert!(looked_up * 4 < all, "{looked_up} of {all} steps replayed");
        assert_eq!(a, b);
    }
}

/// Calls `forecast` on a run of fixtures/forecast/runs.json.
fn fixture_run(run: &Value, capacity: Option<u64>) -> Value {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/forecast");
    let ins: Vec<String> = run["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            root.join(i["file"].as_str().unwrap())
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    let sizes: Vec<String> = run["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["size"].to_string())
        .collect();
    let runf = root
        .join(run["run"].as_str().unwrap())
        .to_string_lossy()
        .into_owned();
    let cap = capacity.map(|c| c.to_string());
    let mut extra = vec!["--knob", "context_length"];
    if let Some(c) = &cap {
        extra.extend(["--capacity", c]);
    }
    forecast(&ins, &sizes.join(","), &runf, &extra).1
}

#[test]
fn the_real_runs_are_forecast_exactly() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/forecast");
    let runs: Value =
        serde_json::from_slice(&std::fs::read(root.join("runs.json")).unwrap()).unwrap();
    let mut ooms = 0;
    for run in runs["runs"].as_array().unwrap() {
        let t = &run["truth"];
        let v = fixture_run(run, None);
        let id = run["id"].as_str().unwrap();
        assert_eq!(v["peak_allocated_bytes"], t["run_peak_allocated"], "{id}");
        assert_eq!(
            u(&v["peak_allocated_step"]),
            u(&t["run_peak_allocated_step"]),
            "{id}"
        );
        let d = conf(&v, "");
        assert_eq!(
            d["peak_reserved_bytes"], t["run_peak_reserved_defaults"],
            "{id}"
        );
        assert_eq!(
            conf(&v, ES)["peak_reserved_bytes"],
            t["run_peak_reserved_es"],
            "{id}"
        );
        assert_eq!(
            d["step_peak_reserved_bytes"], t["step_peak_max_defaults"],
            "{id}"
        );
        assert_eq!(d["step_peak_size"], t["step_peak_max_size"], "{id}");
        for c in t["capacities"].as_array().unwrap() {
            let v = fixture_run(run, Some(u(&c["capacity_bytes"])));
            for (name, key) in [("", "defaults"), (ES, "es")] {
                let (want, got) = (&c[key], &conf(&v, name)["oom"]);
                assert_eq!(
                    !got.is_null(),
                    want["oom"] == true,
                    "{id} {} {key}",
                    c["name"]
                );
                if want["oom"] == true {
                    ooms += 1;
                    assert_eq!(got["step"], want["step"], "{id}");
                    assert_eq!(got["requested_bytes"], want["requested_bytes"], "{id}");
                }
            }
        }
    }
    assert_eq!(ooms, 2, "the fixtures hold two runs that run out of memory");
}

#[test]
fn the_report_draws_reserved_memory_against_the_step() {
    let dir = tempfile::tempdir().unwrap();
    let run = [512, 1024, 2048, 1024];
    let (inputs, runf) = write(dir.path(), HAND_OVER, &[512, 1024], &run);
    let html = dir.path().join("f.html");
    let h = html.to_string_lossy().into_owned();
    let mut args = vec!["forecast"];
    args.extend(inputs.iter().map(String::as_str));
    args.extend([
        "--sizes",
        "512,1024",
        "--run",
        &runf,
        "--capacity",
        "700MiB",
        "--report",
        &h,
    ]);
    let (code, out, err) = allocdoc(&args);
    assert!(code == 0 || code == 1, "{out} {err}");
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("reserved memory after each step"));
    assert!(page.contains("OOM at step 3"), "the OOM is marked: {out}");
    assert!(err.contains("wrote the HTML report"));
    assert!(out.contains("runs out of memory"), "{out}");
    // Every config runs out of memory: no line to set, the cap instead.
    assert_eq!(code, 1, "{out}");
    assert!(!out.contains("PYTORCH_CUDA_ALLOC_CONF"), "{out}");
    assert!(out.contains("cap the size"), "{out}");
}

#[test]
fn lengths_are_batched_padded_and_written_out() {
    let dir = tempfile::tempdir().unwrap();
    let (inputs, _) = write(dir.path(), HAND_OVER, &[512, 1024], &[]);
    let lengths = dir.path().join("lengths.txt");
    // 10 samples of 100..1000 tokens: batches of 3 (the last of 1), padded
    // to 100.
    let text: String = (1..=10).map(|i| format!("{}\n", 100 * i)).collect();
    std::fs::write(&lengths, format!("# token lengths\n{text}")).unwrap();
    let out = dir.path().join("built.txt");
    let (l, o) = (lengths.to_string_lossy(), out.to_string_lossy());
    let mut args = vec!["forecast", "--format", "json"];
    args.extend(inputs.iter().map(String::as_str));
    args.extend([
        "--sizes",
        "512,1024",
        "--lengths",
        &l,
        "--batch",
        "3",
        "--pad-to",
        "100",
        "--seed",
        "7",
        "--write-run",
        &o,
    ]);
    let (code, v) = json(&args);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["steps"], 4);
    let built: Vec<u64> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(built.len(), 4);
    assert!(built.iter().all(|z| z % 100 == 0 && *z >= 100), "{built:?}");
    // The batch holding the 1000-token sample is the one step of 1000.
    assert_eq!(built.iter().filter(|&&z| z == 1000).count(), 1, "{built:?}");
    assert_eq!(v["sizes"]["largest"], 1000);
    // The same seed builds the same run; --steps runs past an epoch.
    let (_, again) = json(&args);
    assert_eq!(again["configs"], v["configs"]);
    let mut longer = args.clone();
    longer.extend(["--steps", "9"]);
    let (_, w) = json(&longer);
    assert_eq!(w["steps"], 9);
}

#[test]
fn bad_runs_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (inputs, _) = write(dir.path(), HAND_OVER, &[512, 1024], &[]);
    let file = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.to_string_lossy().into_owned()
    };
    let base = |extra: &[&str]| {
        let mut a = vec!["forecast".to_string()];
        a.extend(inputs.iter().cloned());
        a.extend(["--sizes".into(), "512,1024".into()]);
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let empty = file("empty.txt", "# nothing\n\n");
    let bad = file("bad.txt", "512\n1024\n12x\n");
    let zero = file("zero.txt", "512\n0\n");
    let huge = file("huge.txt", "512\n100000000000\n");
    let many = file("many.txt", &"512\n".repeat(1_000_001));
    let few = file("few.txt", "100\n200\n");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (base(&["--run", &empty]), "no step sizes"),
        (
            base(&["--run", &bad]),
            "bad.txt:3: \"12x\" is not a whole number above 0",
        ),
        (base(&["--run", &zero]), "zero.txt:2"),
        (base(&["--run", &huge]), "more than any card holds"),
        (base(&["--run", &many]), "more than 1000000 step sizes"),
        (
            base(&["--lengths", &few, "--batch", "3"]),
            "fewer than one batch of 3",
        ),
        (base(&[]), "forecast needs the run"),
        (
            base(&["--run", &bad, "--write-run", "x.txt"]),
            "--write-run",
        ),
        (base(&["--run", &empty, "--cap-step", "0"]), "--cap-step 0"),
    ];
    for (args, want) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, out, err) = allocdoc(&args);
        assert_eq!(code, 2, "{args:?}: {out} {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

/// A snapshot of `steps` steps that each allocate and free their
/// temporaries, the last one running out of memory; `grow` leaves a block
/// live at every step.
fn late_oom_snapshot(steps: usize, grow: bool) -> Vec<u8> {
    let mut w = Written::default();
    let mut addr = 0x7e00_0000_0000u64;
    let mut alloc = |w: &mut Written, size, (line, name): (i64, &str)| {
        addr += 1 << 32;
        let frames = vec![Frame {
            filename: "/home/u/model.py".into(),
            line,
            name: name.into(),
        }];
        w.alloc(addr, size, frames);
        (addr, size)
    };
    for s in 0..steps {
        let embed = alloc(&mut w, 8 * MIB, (10, "embed"));
        if s + 1 == steps {
            w.entry(Action::Oom, 2 * MIB, scores_at(s));
            break;
        }
        let scores = alloc(&mut w, scores_at(s), (20, "attention_scores"));
        let norm = alloc(&mut w, 2 * MIB, (30, "norm"));
        if grow {
            alloc(&mut w, 8 * MIB, (90, "history_append"));
        }
        for (a, size) in [scores, norm, embed] {
            w.entry(Action::FreeRequested, a, size);
            w.free(a, size);
        }
    }
    w.snapshot(0, &[])
}

/// Step `s`'s scores: sizes vary from step to step.
fn scores_at(s: usize) -> u64 {
    [64, 32, 48, 64, 40][s % 5] * MIB
}

#[test]
fn an_oom_late_in_a_run_points_to_forecast() {
    let dir = tempfile::tempdir().unwrap();
    let late = dir.path().join("late.pickle");
    std::fs::write(&late, late_oom_snapshot(6, false)).unwrap();
    let leak = dir.path().join("leak.pickle");
    std::fs::write(&leak, late_oom_snapshot(6, true)).unwrap();
    let first = dir.path().join("first.pickle");
    std::fs::write(&first, late_oom_snapshot(1, false)).unwrap();
    for cmd in ["top", "diagnose"] {
        let (_, out, err) = allocdoc(&[cmd, &late.to_string_lossy()]);
        assert!(out.contains("allocdoc forecast"), "{cmd}: {out} {err}");
        // The last step, cut by its OOM before it rose, joins the fifth.
        assert!(
            out.contains("the OOM comes in step 5 of the 5 steps"),
            "{cmd}: {out}"
        );
        // A leak is growth, named as such; an OOM in the first step is no run.
        for other in [&leak, &first] {
            let (_, out, _) = allocdoc(&[cmd, &other.to_string_lossy()]);
            assert!(!out.contains("allocdoc forecast"), "{cmd} {other:?}: {out}");
        }
    }
}

#[test]
fn steps_far_past_the_recordings_make_the_forecast_uncertain_and_say_which() {
    let dir = tempfile::tempdir().unwrap();
    // 8192 is 8× past 1024, further than the span squared (4×).
    let run = [512, 1024, 8192, 512, 8192];
    let (inputs, runf) = write(dir.path(), HAND_OVER, &[512, 1024], &run);
    let (code, v) = forecast(&inputs, "512,1024", &runf, &[]);
    assert_eq!(code, 4, "exit 4 exactly when uncertain: {v}");
    assert_eq!(v["strength"], "uncertain");
    assert_eq!(v["uncertain_sizes"], serde_json::json!([8192]));
    assert_eq!(v["uncertain_steps"], 2);
    let first = v["reasons"][0].as_str().unwrap();
    assert!(
        first.starts_with("2 of the 5 steps are at sizes whose laws are uncertain (8192)"),
        "{first}"
    );
    assert!(v["headline"].as_str().unwrap().starts_with("Uncertain"));
    // Within the span: likely, exit 0.
    let (_, near) = write(dir.path(), HAND_OVER, &[], &[512, 1024, 2048]);
    let (code, v) = forecast(&inputs, "512,1024", &near, &[]);
    assert_eq!((code, v["strength"].as_str()), (0, Some("likely")));
}
