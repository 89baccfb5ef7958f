//! `recommend` and `validate` end to end on the CPU: the search finds a config
//! that avoids the OOM whenever one exists, probes reproduce the figures they
//! were fitted to, and `--device cuda` without a driver exits 3. The `gpu_*`
//! tests run on a GPU machine (bench/gpu/run.sh) and skip, saying why, elsewhere.

use allocdoc::advise::space::all as space;
use allocdoc::advise::{Setup, Space};
use allocdoc::conf::{MIB, Settings};
use allocdoc::trial::recommend::recommend;
use allocdoc::trial::run::replay;
use allocdoc::trial::workload::{Source, Workload};
use allocdoc::workload::probe::{self, Ending, Family, Figures, Params, Target, epochs, generate};
use allocdoc::workload::{Event, Trace};
use assert_cmd::Command;
use std::path::Path;

fn workload(family: Family, steps: u32, unit: u64) -> (Trace, Workload) {
    let events = epochs(&generate(family, &Params::new(steps, unit, 9)), 2);
    let trace = probe::trace(events);
    let w = Workload {
        input: family.name().into(),
        source: Source::Trace(trace.clone()),
        implied_capacity: None,
        ensemble: None,
        advice: None,
        recorded: None,
    };
    (trace, w)
}

/// Over several families and capacities where the default config runs out of
/// memory: whenever any config of the space avoids the OOM (checked by
/// replaying each one independently), the recommendation avoids it too and
/// has the lowest peak reserved of those that do; and the bisected smallest
/// capacity really runs.
#[test]
fn recommendation_avoids_the_oom_whenever_any_config_does() {
    let defaults = Settings::default();
    let mut rescued = 0;
    let cases = [
        (Family::InterleavedLongLived, 60, 13 * MIB),
        (Family::GrowingKvCache, 60, 7 * MIB),
        (Family::VariableLength, 120, 6 * MIB),
        (Family::MixedSmallLarge, 80, 9 * MIB),
        (Family::DynamicBatch, 150, 5 * MIB),
    ];
    for (family, steps, unit) in cases {
        let (trace, w) = workload(family, steps, unit);
        let free = replay(&trace, &defaults, "", allocdoc::device::NO_LIMIT);
        assert!(free.figures.oom.is_none());
        let (lo, hi) = (
            free.figures.peak_allocated_bytes,
            free.figures.peak_reserved_bytes,
        );
        for frac in [0.6, 0.2] {
            let capacity = lo + ((hi - lo) as f64 * frac) as u64;
            let default_run = replay(&trace, &defaults, "", capacity);
            if default_run.figures.oom.is_none() {
                continue; // the default still fits here: not a case for this test
            }
            let brute: Vec<_> = space(false)
                .iter()
                .map(|c| replay(&trace, &c.settings(&defaults), "", capacity))
                .collect();
            let best_ok = brute
                .iter()
                .filter(|r| r.figures.oom.is_none())
                .map(|r| r.figures.peak_reserved_bytes)
                .min();
            let setup = Setup::of_flags(&Default::default());
            let space = Space::for_setup(&setup, false);
            let search = allocdoc::trial::recommend::Search {
                space: &space,
                current_conf: "",
                current: &defaults,
                diagnosis: None,
                bisect: true,
            };
            let r = recommend(&w, w.capacity(Some(capacity)), &search, &|_| {}).expect("search");
            assert_eq!(r.candidates.len(), brute.len());
            match best_ok {
                Some(best) => {
                    rescued += 1;
                    let rec = r.recommendation.as_ref().unwrap_or_else(|| {
                        panic!("{family:?} at {capacity}: a config avoids the OOM but none was recommended")
                    });
                    let winner = &r.candidates[0];
                    assert_eq!(winner.conf, rec.value);
                    assert!(winner.figures.oom.is_none());
                    assert_eq!(
                        winner.figures.peak_reserved_bytes, best,
                        "{family:?}: not the lowest peak reserved"
                    );
                    let min = r
                        .min_capacity_bytes
                        .expect("a winner has a smallest capacity");
                    assert!(
                        min <= capacity && min >= winner.figures.peak_allocated_bytes,
                        "{min}"
                    );
                    let settings =
                        allocdoc::conf::parse(&rec.value, allocdoc::conf::TorchVersion::DEFAULT)
                            .expect("the recommendation parses")
                            .settings;
                    assert!(
                        replay(&trace, &settings, "", min).figures.oom.is_none(),
                        "runs at its smallest capacity"
                    );
                }
                None => {
                    assert!(
                        r.recommendation.is_none(),
                        "{family:?}: nothing avoids the OOM"
                    );
                    assert_eq!(r.min_capacity_bytes, None);
                }
            }
        }
    }
    assert!(
        rescued >= 3,
        "only {rescued} cases where a config rescues the default: the test lost its teeth"
    );
}

/// A probe fitted to the figures of a real OOM (a workload with 1–10 MiB
/// tensors whose split segments hold unusable holes, then a large request at
/// a capacity where it fails) reproduces them within the stated tolerance and
/// runs out of memory on the same request.
#[test]
fn probe_calibration_reproduces_given_figures() {
    let defaults = Settings::default();
    let run = |trace: &Trace, cap: u64| replay(trace, &defaults, "", cap).figures;
    // The "real job": variable-length sequences (another seed than the probe's).
    let mut ops = generate(Family::VariableLength, &Params::new(300, MIB, 9));
    let before = run(&probe::trace(ops.clone()), allocdoc::device::NO_LIMIT);
    let request = 96 * MIB;
    ops.push(Event::Alloc {
        id: 300 * 2,
        size: request,
        stream: 0,
    });
    let capacity = before.end_reserved_bytes + request / 2;
    let job = run(&probe::trace(ops), capacity);
    assert!(
        job.oom.is_some(),
        "the setup must run out of memory: {before:?} {job:?}"
    );
    let target = Target {
        observed: Figures {
            allocated_bytes: job.end_allocated_bytes,
            reserved_bytes: job.end_reserved_bytes,
            requested_bytes: Some(request),
        },
        capacity,
        settings: defaults.clone(),
    };
    let e = probe::fit_ensemble(&target, 1, run).expect("a fit");
    let c = e.best().expect("a member");
    assert!(
        c.within_tolerance,
        "fit error {:.3} (family {:?})",
        c.error, c.family
    );
    let err = |a: u64, b: u64| (a as f64 - b as f64).abs() / b as f64;
    assert!(err(c.reproduced.allocated_bytes, job.end_allocated_bytes) <= probe::TOLERANCE);
    assert!(err(c.reproduced.reserved_bytes, job.end_reserved_bytes) <= probe::TOLERANCE);
    assert!(
        c.reproduces && c.ending == Ending::AtRequest,
        "the fitted probe fails on the same request: {:?}",
        c.ending
    );
    assert_eq!(c.request_bytes, Some(request));
    assert!(e.plausible().count() >= 1);
    assert_eq!(e.free_beyond_request, None);
    // The same figures with more free memory than the 96 MiB request's
    // segment plus 5 % of reserved: no workload on the card can run out of
    // memory there, so none is fitted.
    let slack = job.end_reserved_bytes / 20;
    for (extra, fitted) in [
        (request + slack - MIB, true),
        (request + slack + MIB, false),
    ] {
        let roomy = Target {
            capacity: job.end_reserved_bytes + extra,
            ..target.clone()
        };
        let e = probe::fit_ensemble(&roomy, 1, run).expect("an ensemble");
        assert_eq!(!e.members.is_empty(), fitted, "{extra} bytes free");
        assert_eq!(
            e.free_beyond_request.is_some(),
            !fitted,
            "{extra} bytes free"
        );
    }
}

fn bin() -> Command {
    Command::cargo_bin("allocdoc").expect("the allocdoc binary")
}

fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/validate")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

/// Text evidence gets a probe, and the output says it is synthetic and shows the fit.
#[test]
fn validate_text_evidence_uses_a_labelled_probe() {
    let v = json_of(
        &[
            "validate",
            &fixture("summary_001.txt"),
            "--conf",
            "expandable_segments:True",
            "--format",
            "json",
        ],
        0,
    );
    assert_eq!(v["probe"]["synthetic"], true);
    assert_eq!(v["probe"]["observed"]["allocated_bytes"], 184_648 * 1024);
    assert_eq!(v["probe"]["observed"]["reserved_bytes"], 235_520 * 1024);
    assert_eq!(v["probe"]["members"][0]["within_tolerance"], true, "{v:#}");
    assert_eq!(v["probe"]["members"][0]["reproduces"], true, "{v:#}");
    assert!(v["probe"]["plausible"].as_u64() >= Some(1), "{v:#}");
    // No OOM in a summary to avoid: every plausible workload runs under the
    // candidate, so the verdict is "likely" and the gate passes.
    assert_eq!(v["strength"], "likely", "{v:#}");
    let text = bin()
        .args([
            "validate",
            &fixture("summary_001.txt"),
            "--conf",
            "expandable_segments:True",
        ])
        .output()
        .expect("runs");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("SYNTHETIC"), "{text}");
    assert!(
        text.contains("fit error") && text.contains("does not reproduce"),
        "{text}"
    );
    assert!(text.contains("Evidence: likely"), "{text}");
}

/// validate on a trace: exit 0 when the candidate runs, 1 when it still OOMs.
#[test]
fn validate_exit_codes_follow_the_candidate() {
    let csv = fixture("interleaved_16mib.csv");
    let validate = |capacity: &str, code: i32| {
        text_of(
            &[
                "validate",
                &csv,
                "--conf",
                "expandable_segments:True",
                "--capacity",
                capacity,
            ],
            code,
        )
    };
    assert!(validate("200MiB", 0).contains("Verdict"));
    assert!(validate("40MiB", 1).contains("still runs out of memory"));
}

/// `replay` checks a run near the card's edge under every placement policy:
/// on `placement_dependent.csv` (segments freed by `empty_cache`, then equal
/// blocks at different addresses) the outcome at 120 MiB depends on where
/// segments go; a run far below the card is not checked.
#[test]
fn replay_reports_placement_near_the_edge() {
    let csv = fixture("placement_dependent.csv");
    let v = json_of(
        &["replay", &csv, "--capacity", "120MiB", "--format", "json"],
        1,
    );
    let outcomes: Vec<(String, bool)> = v["runs"][0]["placement"]
        .as_array()
        .expect("placement checked")
        .iter()
        .map(|o| (o["policy"].as_str().unwrap().to_string(), o["oom"] == true))
        .collect();
    assert_eq!(
        outcomes,
        [
            ("first-fit".to_string(), true),
            ("rising addresses".to_string(), false),
            ("random placement".to_string(), true)
        ]
    );
    let text = text_of(&["replay", &csv, "--capacity", "120MiB"], 1);
    assert!(
        text.contains("(defaults): depends on where the driver places segments: first-fit runs out of memory, rising addresses no OOM"),
        "{text}"
    );
    // At 1 GiB the run peaks at 120 MiB, far below the card: not checked.
    let v = json_of(
        &["replay", &csv, "--capacity", "1GiB", "--format", "json"],
        0,
    );
    assert!(v["runs"][0].get("placement").is_none(), "{v:#}");
    assert!(!text_of(&["replay", &csv, "--capacity", "1GiB"], 0).contains("Placement"));
}

/// `--device cuda` on a machine without a driver: `validate` and `replay`
/// (trace and snapshot) exit 3 and say why.
#[test]
fn cuda_without_a_driver_exits_3() {
    #[cfg(feature = "cuda")]
    if allocdoc::device::cuda::driver_present() {
        eprintln!("skipped: this machine has a CUDA driver (the gpu_* tests cover it)");
        return;
    }
    let snapshot = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/snapshots/gen-small-plain.pickle")
        .to_string_lossy()
        .into_owned();
    let csv = fixture("interleaved_16mib.csv");
    let summary = fixture("summary_001.txt");
    let cases: [&[&str]; 4] = [
        &[
            "validate",
            &summary,
            "--conf",
            "expandable_segments:True",
            "--device",
            "cuda",
        ],
        &["replay", &csv, "--device", "cuda"],
        &[
            "replay",
            &csv,
            "--conf",
            "",
            "--device",
            "cuda:1",
            "--capacity",
            "1GiB",
        ],
        &["replay", &snapshot, "--device", "cuda:0"],
    ];
    for args in cases {
        let out = bin().args(args).output().expect("runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{args:?}: {err}");
        assert!(
            out.stdout.is_empty(),
            "{args:?}: no result without a device"
        );
        assert!(
            err.contains("--device cuda:")
                && (err.contains("no CUDA driver") || err.contains("without the `cuda` feature")),
            "{args:?}: {err}"
        );
    }
    // A device name that is neither is a usage error.
    let out = bin()
        .args(["replay", &csv, "--device", "gpu"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
}

/// recommend's JSON carries the contract's fields and exits 1 when every candidate OOMs.
#[test]
fn recommend_json_and_exit_code() {
    let csv = fixture("interleaved_16mib.csv");
    let v = json_of(
        &["recommend", &csv, "--capacity", "84MiB", "--format", "json"],
        0,
    );
    assert_eq!(v["capacity_bytes"], 84 * 1024 * 1024);
    let first = &v["candidates"][0];
    for key in [
        "conf",
        "oom",
        "peak_reserved_bytes",
        "device_allocs",
        "device_frees",
        "alloc_retries",
    ] {
        assert!(first.get(key).is_some(), "candidate lacks {key}");
    }
    assert_eq!(v["recommendation"]["env"], "PYTORCH_CUDA_ALLOC_CONF");
    // At 84 MiB PyTorch's defaults already run it with the least reserved.
    assert_eq!(v["recommendation"]["value"], "");
    assert_eq!(v["recommendation"]["line"], "unset PYTORCH_CUDA_ALLOC_CONF");
    assert!(v["min_capacity_bytes"].as_u64().expect("min capacity") <= 84 * 1024 * 1024);
    let none = bin()
        .args(["recommend", &csv, "--capacity", "40MiB", "--format", "json"])
        .output()
        .expect("runs");
    assert_eq!(none.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&none.stdout).expect("json");
    assert!(v["recommendation"].is_null());
}

/// One answer across commands: each config `recommend` ranked to its end has
/// the figures `replay --conf` gives it, synchronisations included (each
/// retry's `release_cached_blocks` syncs every stream), with and without an OOM.
#[test]
fn recommend_and_replay_give_a_config_the_same_figures() {
    let csv = fixture("interleaved_16mib.csv");
    for (capacity, code) in [("60MiB", 1), ("84MiB", 0)] {
        let v = json_of(
            &[
                "recommend",
                &csv,
                "--capacity",
                capacity,
                "--format",
                "json",
            ],
            code,
        );
        let candidates = v["candidates"].as_array().expect("candidates");
        let mut synced = 0;
        for c in candidates
            .iter()
            .filter(|c| c.get("stopped_early_at_event").is_none())
        {
            let conf = c["conf"].as_str().expect("conf");
            let ran_out = c["oom"].is_object();
            let r = json_of(
                &[
                    "replay",
                    &csv,
                    "--capacity",
                    capacity,
                    "--conf",
                    conf,
                    "--format",
                    "json",
                ],
                i32::from(ran_out),
            );
            let run = &r["runs"][0];
            for key in [
                "oom",
                "events",
                "peak_reserved_bytes",
                "peak_allocated_bytes",
                "device_allocs",
                "device_frees",
                "alloc_retries",
                "synchronizations",
            ] {
                assert_eq!(run[key], c[key], "{conf:?} at {capacity}: {key}");
            }
            synced += usize::from(int(run, "synchronizations") > 0);
        }
        assert!(synced > 10, "{synced} configs at {capacity} synchronised");
    }
}

/// On a GPU: the same trace on the CUDA device and on the simulated card makes
/// the same decisions (peak reserved, driver calls, OOM), and the device gives
/// everything back.
#[cfg(feature = "cuda")]
#[test]
fn gpu_cuda_replay_matches_the_simulated_card() {
    use allocdoc::device::DeviceSpec;
    use allocdoc::trial::run::replay_on;
    if !allocdoc::device::cuda::driver_present() {
        eprintln!(
            "skipped gpu_cuda_replay_matches_the_simulated_card: no CUDA driver (libcuda) on this machine"
        );
        return;
    }
    let (trace, w) = workload(Family::InterleavedLongLived, 40, 13 * MIB);
    for conf in ["", "expandable_segments:True", "max_split_size_mb:128"] {
        let s = allocdoc::conf::parse(conf, allocdoc::conf::TorchVersion::DEFAULT)
            .expect("conf")
            .settings;
        let cap = 2 << 30;
        let cuda = match replay_on(DeviceSpec::Cuda(0), &w, &s, conf, Some(cap)) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("skipped: driver present but no usable GPU: {e}");
                return;
            }
        };
        let sim = replay(&trace, &s, conf, cap);
        assert_eq!(
            cuda.figures.oom.is_some(),
            sim.figures.oom.is_some(),
            "{conf}"
        );
        assert_eq!(
            cuda.figures.peak_reserved_bytes, sim.figures.peak_reserved_bytes,
            "{conf}"
        );
        assert_eq!(
            (cuda.figures.device_allocs, cuda.figures.device_frees),
            (sim.figures.device_allocs, sim.figures.device_frees),
            "{conf}"
        );
        assert!(cuda.figures.driver_time_us > 0.0, "driver calls are timed");
    }
}

/// `replay --compare-with`: figures that match PyTorch's are not flagged, one
/// that differs is.
#[test]
fn replay_compare_with_flags_differences() {
    let csv = fixture("interleaved_16mib.csv");
    let v = json_of(
        &["replay", &csv, "--capacity", "200MiB", "--format", "json"],
        0,
    );
    let mut stats = v["runs"][0]["stats"].clone();
    let allocs = stats["num_device_alloc"]
        .as_i64()
        .expect("num_device_alloc");
    stats["num_device_alloc"] = serde_json::json!(allocs + 1);
    let torch = serde_json::json!({
        "torch_version": "2.6.0", "device_name": "fake", "conf": "", "oom": null,
        "memory_stats": stats,
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("torch.json");
    std::fs::write(&path, torch.to_string()).expect("write");
    let out = bin()
        .args(["replay", &csv, "--capacity", "200MiB", "--compare-with"])
        .arg(&path)
        .output()
        .expect("runs");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("1 figure(s) differ"), "{text}");
    let flagged: Vec<&str> = text.lines().filter(|l| l.contains("differs")).collect();
    assert_eq!(flagged.len(), 1, "{text}");
    assert!(flagged[0].contains("num_device_alloc"), "{text}");
}

/// What users read: recommend's and validate's text on fixtures (reviewed snapshots).
#[test]
fn text_output_snapshots() {
    let run = |args: &[&str]| {
        let out = bin()
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            // How many configs the search stops early depends on the order
            // parallel replays finish in; one thread makes that order fixed.
            .env("RAYON_NUM_THREADS", "1")
            .args(args)
            .output()
            .expect("runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    insta::assert_snapshot!(
        "recommend_interleaved",
        run(&[
            "recommend",
            "fixtures/validate/interleaved_16mib.csv",
            "--capacity",
            "84MiB"
        ])
    );
    insta::assert_snapshot!(
        "validate_oom_probe",
        run(&[
            "validate",
            "fixtures/validate/oom_fragmented_2.5.txt",
            "--conf",
            "expandable_segments:True"
        ])
    );
}

/// Runs the binary and parses its standard output as JSON, checking the exit code.
/// Standard output of `allocdoc ARGS`, after checking its exit code.
fn stdout_of(args: &[&str], code: i32) -> Vec<u8> {
    let out = bin().args(args).output().expect("runs");
    assert_eq!(
        out.status.code(),
        Some(code),
        "{args:?}: {}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    out.stdout
}

fn text_of(args: &[&str], code: i32) -> String {
    String::from_utf8(stdout_of(args, code)).expect("UTF-8 on standard output")
}

fn json_of(args: &[&str], code: i32) -> serde_json::Value {
    serde_json::from_slice(&stdout_of(args, code)).expect("JSON on standard output")
}

fn int(v: &serde_json::Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("`{key}` is not an integer in {v}"))
}

/// The contract's `oom` object: `{event_index, requested_bytes, message}` or null.
fn oom_of(run: &serde_json::Value) -> Option<(u64, u64)> {
    let oom = &run["oom"];
    if oom.is_null() {
        return None;
    }
    let message = oom["message"].as_str().expect("oom.message is a string");
    assert!(
        message.starts_with("CUDA out of memory. Tried to allocate"),
        "{message}"
    );
    Some((int(oom, "event_index"), int(oom, "requested_bytes")))
}

/// The contract's counters of a replay run or a recommend candidate.
fn assert_run_fields(run: &serde_json::Value) {
    assert!(run["conf"].is_string(), "conf: {run}");
    for key in [
        "peak_reserved_bytes",
        "device_allocs",
        "device_frees",
        "alloc_retries",
    ] {
        int(run, key);
    }
}

/// `replay`, `recommend` and `validate --format json` carry the contract's
/// fields with the contract's types, and the numbers of the devlog case.
#[test]
fn json_follows_the_contract() {
    const MIB: u64 = 1 << 20;
    let csv = fixture("interleaved_16mib.csv");
    // replay: 16 MiB + 16 MiB fit in 40 MiB, the third 16 MiB block (event 2) does not.
    let v = json_of(
        &[
            "replay",
            &csv,
            "--conf",
            "",
            "--conf",
            "max_split_size_mb:32",
            "--capacity",
            "40MiB",
            "--format",
            "json",
        ],
        1,
    );
    let runs = v["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[0]["conf"], "");
    assert_eq!(runs[1]["conf"], "max_split_size_mb:32");
    for run in runs {
        assert_run_fields(run);
        assert_eq!(int(run, "capacity_bytes"), 40 * MIB);
        assert_eq!(
            int(run, "events"),
            7,
            "comments and the header are not events"
        );
        assert_eq!(oom_of(run), Some((2, 16 * MIB)));
        assert_eq!(int(run, "peak_allocated_bytes"), 32 * MIB);
        let stats = run["stats"].as_object().expect("stats");
        assert_eq!(stats["reserved_bytes.all.peak"], run["peak_reserved_bytes"]);
        assert!(
            stats.values().all(serde_json::Value::is_i64),
            "flat integer stats"
        );
    }
    assert!(v.get("fidelity").is_none(), "fidelity only with --fidelity");

    // replay --fidelity on a snapshot: the fidelity object.
    let snapshot = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/snapshots/gen-small-plain.pickle")
        .to_string_lossy()
        .into_owned();
    let v = json_of(&["replay", &snapshot, "--fidelity", "--format", "json"], 0);
    let f = &v["fidelity"];
    assert_eq!(int(f, "alloc_events"), 21);
    assert!(int(f, "address_matches") <= 21);
    assert!(f["first_divergence"].is_null() || f["first_divergence"].is_object());
    let run = &v["runs"][0];
    assert_run_fields(run);
    assert_eq!(int(run, "events"), 40);
    assert_eq!(int(run, "capacity_bytes"), 80 << 30, "the default card");

    // recommend without --capacity: the capacity it searched at is the default card,
    // and PyTorch's defaults win, so the line unsets the variable.
    let v = json_of(&["recommend", &csv, "--format", "json"], 0);
    assert_eq!(int(&v, "capacity_bytes"), 80 << 30);
    let candidates = v["candidates"].as_array().expect("candidates");
    assert_eq!(candidates.len(), 70);
    for c in candidates {
        assert_run_fields(c);
        assert_eq!(oom_of(c), None);
    }
    let rec = &v["recommendation"];
    assert_eq!(rec["env"], "PYTORCH_CUDA_ALLOC_CONF");
    assert_eq!(rec["value"], "");
    assert_eq!(rec["line"], "unset PYTORCH_CUDA_ALLOC_CONF");
    // The four 16 MiB blocks and the 32 MiB one need 80 MiB under the defaults; the bisection stops within 1 MiB.
    let min = int(&v, "min_capacity_bytes");
    assert!((64 * MIB..=81 * MIB).contains(&min), "{min}");
    let text = bin().args(["recommend", &csv]).output().expect("runs");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("capacity 80.00 GiB (the default card: set --capacity)"),
        "{text}"
    );
    assert!(
        text.contains("\n  unset PYTORCH_CUDA_ALLOC_CONF\n"),
        "{text}"
    );

    // validate: the capacity as given, both runs with the contract's oom object.
    let v = json_of(
        &[
            "validate",
            &csv,
            "--conf",
            "expandable_segments:True",
            "--capacity",
            "40MiB",
            "--format",
            "json",
        ],
        1,
    );
    assert_eq!(int(&v, "capacity_bytes"), 40 * MIB);
    assert_eq!(v["capacity_source"], "given");
    for side in ["current", "candidate"] {
        assert_run_fields(&v[side]);
        assert_eq!(oom_of(&v[side]), Some((2, 16 * MIB)), "{side}");
    }
}

/// An RMM replay log is a trace to recommend and validate: the same results
/// as the trace CSV of the same allocations.
#[test]
fn rmm_logs_replay_like_their_trace() {
    let csv = fixture("interleaved_16mib.csv");
    let rmm = fixture("interleaved_16mib_rmm.csv");
    for args in [
        vec!["recommend", "--capacity", "84MiB", "--format", "json"],
        vec![
            "validate",
            "--conf",
            "max_split_size_mb:32",
            "--capacity",
            "60MiB",
            "--format",
            "json",
        ],
    ] {
        let mut of_csv = json_of(
            &[&args[..1], &[csv.as_str()], &args[1..]].concat(),
            1 - i32::from(args[0] == "recommend"),
        );
        let mut of_rmm = json_of(
            &[&args[..1], &[rmm.as_str()], &args[1..]].concat(),
            1 - i32::from(args[0] == "recommend"),
        );
        of_csv["input"] = serde_json::Value::Null;
        of_rmm["input"] = serde_json::Value::Null;
        assert_eq!(of_csv, of_rmm, "{args:?}");
    }
}

/// A snapshot's own trace gets the timelines in `--report` (replay, validate,
/// recommend) and `replay --emit-snapshot` writes a snapshot that reads back.
#[test]
fn snapshot_reports_and_emitted_snapshots() {
    let snapshot = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/snapshots/gen-small-plain.pickle")
        .to_string_lossy()
        .into_owned();
    let dir = tempfile::tempdir().expect("tempdir");
    let report = dir.path().join("r.html");
    let emitted = dir.path().join("e.pickle");
    let (report_s, emitted_s) = (report.to_string_lossy(), emitted.to_string_lossy());
    let cases: [&[&str]; 3] = [
        &[
            "replay",
            &snapshot,
            "--conf",
            "",
            "--conf",
            "expandable_segments:True",
            "--report",
            &report_s,
            "--emit-snapshot",
            &emitted_s,
        ],
        &[
            "validate",
            &snapshot,
            "--conf",
            "expandable_segments:True",
            "--report",
            &report_s,
        ],
        &["recommend", &snapshot, "--report", &report_s],
    ];
    for args in cases {
        let out = bin().args(args).output().expect("runs");
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let html = std::fs::read_to_string(&report).expect("report written");
        // One memory-over-time line pair per config, and the segment map.
        assert!(
            html.matches("<polyline").count() >= 2,
            "{args:?}: no timelines"
        );
        assert!(
            html.contains("at its allocated peak"),
            "{args:?}: no segment map"
        );
        std::fs::remove_file(&report).expect("remove");
    }
    // The emitted snapshot: the expandable-segments run's 40 replayed entries
    // (plus the segment it mapped), readable by `parse`.
    let v = json_of(&["parse", "--format", "json", &emitted_s], 0);
    let o = &v["observations"][0];
    assert_eq!(o["kind"], "snapshot");
    assert_eq!(
        o["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"],
        "expandable_segments:True"
    );
    assert!(int(o, "trace_events") >= 40, "{o}");
}
