//! The rule set against real evidence: the labelled evaluation set from public
//! issues (fixtures/eval), snapshots of what `diagnose` prints, and the
//! `rules test` command.

use allocdoc::advise::{self, Context, Diagnosis};
use allocdoc::app::Format;
use allocdoc::app::diagnose::{self, DiagnoseOptions};
use allocdoc::rules::{Cause, RuleSet};
use std::path::{Path, PathBuf};

fn eval_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/eval");
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "txt"))
        .collect();
    v.sort();
    v
}

fn label(path: &Path) -> (String, String) {
    let text = std::fs::read_to_string(path).unwrap();
    let url = text
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("# source: "))
        .unwrap_or_else(|| panic!("{}: first line must be '# source: URL'", path.display()))
        .to_string();
    let cause = text
        .lines()
        .find_map(|l| l.strip_prefix("# label.cause: "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("{}: no '# label.cause:' line", path.display()))
        .to_string();
    (url, cause)
}

fn diagnose_file(path: &Path) -> Diagnosis {
    let mut ctx = Context::default();
    let name = path.to_string_lossy().into_owned();
    let limits = allocdoc::Limits::default();
    let evidence = diagnose::read_inputs(&[name], &Default::default(), &limits, &mut ctx).unwrap();
    advise::diagnose(evidence, &ctx, &RuleSet::embedded().unwrap())
}

#[test]
fn evaluation_set_agreement() {
    let files = eval_files();
    assert!(files.len() >= 50, "only {} labelled texts", files.len());
    let mut agree = 0;
    let mut disagreements = Vec::new();
    for f in &files {
        let (url, want) = label(f);
        let d = diagnose_file(f);
        if d.cause.as_str() == want {
            agree += 1;
        } else {
            disagreements.push(format!(
                "{} ({url}): labelled {want}, diagnosed {}",
                f.display(),
                d.cause.as_str()
            ));
        }
        // Never an allocator setting for a request larger than the card or a
        // failure outside the allocator, whatever the rules concluded.
        if matches!(want.as_str(), "request_exceeds_capacity" | "not_allocator")
            || matches!(d.cause, Cause::RequestExceedsCapacity | Cause::NotAllocator)
        {
            assert_eq!(
                d.recommendation,
                None,
                "{}: recommended a setting",
                f.display()
            );
        }
    }
    let rate = agree as f64 / files.len() as f64;
    assert!(
        rate >= 0.95,
        "agreement {agree}/{} = {:.1}%:\n{}",
        files.len(),
        rate * 100.0,
        disagreements.join("\n")
    );
}

/// The contract's `cause` values.
const CAUSES: [&str; 7] = [
    "fragmentation",
    "capacity",
    "request_exceeds_capacity",
    "other_processes",
    "memory_fraction_cap",
    "not_allocator",
    "unknown",
];

#[test]
fn every_label_is_a_contract_cause() {
    for f in eval_files() {
        let (url, cause) = label(&f);
        assert!(url.starts_with("https://github.com/"), "{}", f.display());
        assert!(CAUSES.contains(&cause.as_str()), "{}: {cause}", f.display());
    }
}

fn render(input: &str, format: Format) -> String {
    let out = diagnose::run(&DiagnoseOptions {
        inputs: vec![input.to_string()],
        common: allocdoc::app::Common {
            format,
            ..Default::default()
        },
        ..DiagnoseOptions::default()
    })
    .unwrap();
    out.stdout
}

/// Fragmentation on 2.4+ with the container's own PID listed: expandable segments.
const FRAGMENTED: &str = "fixtures/eval/tianhao-qi-mask2dit-4.txt";
/// A 1.x message where expandable segments do not exist: max_split_size_mb.
const OLD_FRAGMENTED: &str = "fixtures/eval/2kangho-vdsr-pytorch-2.txt";
/// A request larger than the card: no setting.
const TOO_LARGE: &str = "fixtures/eval/qwenlm-qwen25-omni-240.txt";
/// Host RAM: not the allocator at all.
const HOST: &str = "fixtures/eval/jingyunliang-vrt-49.txt";
/// The README's main-job example: a training log with a summary, then the OOM.
const README: &str = "fixtures/text/readme_example.log";

#[test]
fn diagnose_text() {
    for (name, input) in [
        ("fragmented", FRAGMENTED),
        ("old_fragmented", OLD_FRAGMENTED),
        ("too_large", TOO_LARGE),
        ("host", HOST),
        ("readme", README),
    ] {
        insta::assert_snapshot!(format!("text_{name}"), render(input, Format::Text));
    }
}

#[test]
fn diagnose_json() {
    for (name, input) in [("fragmented", FRAGMENTED), ("too_large", TOO_LARGE)] {
        let out = render(input, Format::Json);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        // The contract's fields, with the contract's types.
        assert!(v["observations"].is_array());
        assert!(v["cause"].is_string());
        assert!(
            v["findings"]
                .as_array()
                .is_some_and(|f| f.iter().all(|x| x["rule"].is_string()
                    && x["severity"].is_string()
                    && x["message"].is_string()
                    && x["evidence"].is_object()))
        );
        insta::assert_snapshot!(format!("json_{name}"), out);
    }
}

#[test]
fn diagnose_markdown() {
    insta::assert_snapshot!("markdown_fragmented", render(FRAGMENTED, Format::Markdown));
    insta::assert_snapshot!("markdown_host", render(HOST, Format::Markdown));
}

#[test]
fn fragmentation_recommendation_per_version() {
    let json = |input: &str| -> serde_json::Value {
        serde_json::from_str(&render(input, Format::Json)).unwrap()
    };
    let new = json(FRAGMENTED);
    assert_eq!(new["cause"], "fragmentation");
    assert_eq!(new["recommendation"]["value"], "expandable_segments:True");
    assert_eq!(
        new["recommendation"]["line"],
        "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    );
    let old = json(OLD_FRAGMENTED);
    assert_eq!(old["cause"], "fragmentation");
    // 1.x: no expandable segments; a 512 MiB request → blocks ≥ 512 MiB stay whole,
    // but the version (1.4-1.9 vs 1.10+) decides whether the key exists at all.
    let too_large = json(TOO_LARGE);
    assert_eq!(too_large["cause"], "request_exceeds_capacity");
    assert!(too_large["recommendation"].is_null());
}

#[test]
fn expandable_segments_already_on_is_not_repeated() {
    let out = diagnose::run(&DiagnoseOptions {
        inputs: vec![FRAGMENTED.to_string()],
        conf: Some("expandable_segments:True".into()),
        common: allocdoc::app::Common {
            format: Format::Json,
            ..Default::default()
        },
        ..DiagnoseOptions::default()
    })
    .unwrap();
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["cause"], "fragmentation");
    assert!(v["recommendation"].is_null(), "{}", out.stdout);
    let rules: Vec<&str> = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["rule"].as_str())
        .collect();
    assert!(rules.contains(&"expandable-already-on"), "{rules:?}");
    assert!(!rules.contains(&"use-expandable-segments"), "{rules:?}");
}

#[test]
fn windows_gets_max_split_size_instead_of_expandable_segments() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("win.log");
    let text = std::fs::read_to_string(FRAGMENTED).unwrap();
    std::fs::write(
        &path,
        format!("  File \"C:\\Users\\me\\train.py\", line 3, in <module>\n{text}"),
    )
    .unwrap();
    let d = diagnose_file(&path);
    let r = d.recommendation.expect("a recommendation");
    // 35.60 GiB request → floor_pow2(36454 MiB) capped at 512.
    assert_eq!(r.value, "max_split_size_mb:512");
}

#[test]
fn rules_test_command_passes() {
    assert_cmd::Command::cargo_bin("allocdoc")
        .unwrap()
        .args(["rules", "test"])
        .assert()
        .success()
        .stdout(predicates::str::contains(" 0 failed"));
}

#[test]
fn user_rules_cannot_recommend_a_setting_for_a_request_larger_than_the_card() {
    let dir = tempfile::tempdir().unwrap();
    // A user rule that outranks everything and recommends a setting regardless.
    std::fs::write(
        dir.path().join("always.yaml"),
        "id: always\ntitle: t\nseverity: info\ncause: fragmentation\npriority: 1000\n\
         when: requested > 0\nrecommend: {expandable_segments: \"True\"}\nbecause: b\nreference: x\n",
    )
    .unwrap();
    let out = diagnose::run(&DiagnoseOptions {
        inputs: vec![TOO_LARGE.to_string()],
        rules_dir: Some(dir.path().to_path_buf()),
        common: allocdoc::app::Common {
            format: Format::Json,
            ..Default::default()
        },
        ..DiagnoseOptions::default()
    })
    .unwrap();
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["cause"], "fragmentation");
    assert!(v["recommendation"].is_null(), "{}", out.stdout);
}

/// The contract's `diagnose --format json` shape, checked field by field on
/// every kind of input: an allocator OOM, an old-format OOM, a request larger
/// than the card, host memory, a summary-only log, a snapshot, and no evidence.
#[test]
fn diagnose_json_keeps_the_contract() {
    const KINDS: [&str; 5] = [
        "oom",
        "non_allocator_oom",
        "memory_summary",
        "memory_stats",
        "snapshot",
    ];
    let empty = tempfile::NamedTempFile::new().unwrap();
    let empty = empty.path().to_str().unwrap().to_string();
    let inputs = [
        (FRAGMENTED, "fragmentation"),
        (OLD_FRAGMENTED, "fragmentation"),
        (TOO_LARGE, "request_exceeds_capacity"),
        (HOST, "not_allocator"),
        (README, "fragmentation"),
        ("fixtures/text/real_summary_2x_mib.log", ""),
        ("fixtures/snapshots/gen-small-plain.pickle", ""),
        (empty.as_str(), "unknown"),
    ];
    for (input, want_cause) in inputs {
        let out = render(input, Format::Json);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let cause = v["cause"]
            .as_str()
            .unwrap_or_else(|| panic!("{input}: cause"));
        assert!(CAUSES.contains(&cause), "{input}: cause {cause}");
        if !want_cause.is_empty() {
            assert_eq!(cause, want_cause, "{input}");
        }
        let observations = v["observations"].as_array().unwrap();
        assert_eq!(observations.is_empty(), input == empty, "{input}");
        for o in observations {
            let kind = o["kind"].as_str().unwrap();
            assert!(KINDS.contains(&kind), "{input}: kind {kind}");
            assert_eq!(o["input"].as_str(), Some(input), "{input}");
            if kind != "snapshot" {
                assert!(o["line"].as_u64().is_some_and(|l| l >= 1), "{input}");
            }
            // Every byte field is an integer.
            for (key, value) in o.as_object().unwrap() {
                if key.ends_with("_bytes") {
                    assert!(value.is_u64(), "{input}: {key} = {value}");
                }
            }
        }
        for f in v["findings"].as_array().unwrap() {
            assert!(f["rule"].as_str().is_some_and(|r| !r.is_empty()), "{input}");
            assert!(
                ["info", "warning", "error"].contains(&f["severity"].as_str().unwrap()),
                "{input}: {f}"
            );
            assert!(
                f["message"].as_str().is_some_and(|m| !m.is_empty()),
                "{input}"
            );
            assert!(f["evidence"].is_object(), "{input}");
        }
        let r = &v["recommendation"];
        if r.is_null() {
            continue;
        }
        assert_eq!(r["env"], "PYTORCH_CUDA_ALLOC_CONF", "{input}");
        let value = r["value"].as_str().unwrap();
        assert_eq!(
            r["line"].as_str(),
            Some(format!("export PYTORCH_CUDA_ALLOC_CONF={value}").as_str()),
            "{input}"
        );
        // `settings` holds exactly the value's key:value pairs, as strings.
        let settings = r["settings"].as_object().unwrap();
        let pairs: Vec<(String, String)> = value
            .split(',')
            .map(|kv| {
                let (k, v) = kv.split_once(':').unwrap();
                (k.to_string(), v.to_string())
            })
            .collect();
        assert_eq!(settings.len(), pairs.len(), "{input}: {value}");
        for (k, want) in pairs {
            assert_eq!(settings[&k].as_str(), Some(want.as_str()), "{input}: {k}");
        }
        assert_eq!(
            allocdoc::conf::parse(value, allocdoc::conf::TorchVersion::LATEST_KNOWN)
                .map(|_| ())
                .ok(),
            Some(()),
            "{input}: the recommended value must be valid"
        );
    }
}

#[test]
fn a_snapshot_without_an_oom_separates_cached_segments_from_split_ones() {
    // magma27: 13.21 GiB reserved, 1.28 GiB allocated, 982.07 MiB in split segments.
    let d = diagnose_file(Path::new(
        "fixtures/snapshots/magma27-assignment2-systems_memory_snapshot.pickle",
    ));
    assert_eq!(d.cause.as_str(), "unknown");
    assert!(d.recommendation.is_none());
    let rules: Vec<&str> = d.findings.iter().map(|f| f.rule.as_str()).collect();
    assert_eq!(rules, ["cached-free-segments"]);
    assert!(
        d.findings[0]
            .message
            .contains("11.92 GiB of the 13.21 GiB reserved")
            && d.findings[0].message.contains("982.07 MiB"),
        "{}",
        d.findings[0].message
    );
    assert!(
        d.verdict.starts_with("No out-of-memory error"),
        "{}",
        d.verdict
    );
}
