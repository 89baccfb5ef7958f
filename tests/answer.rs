//! One answer that holds (issue 12), over every text and snapshot fixture:
//! `diagnose`, `recommend` and `validate` give the same headline cause and
//! the same line, or say in one sentence which evidence overrides which; no
//! command recommends a value `conf check` rejects or flags as ignored, for
//! PyTorch 1.10, 2.0, 2.1, 2.4 and 2.6 on Linux and Windows; every
//! comparison word in a verdict or finding agrees with the figures it relates;
//! and no exit code contradicts its JSON verdict, nor the text either (issue 26,
//! `support/verdicts.rs`).

use allocdoc::advise::{self, Setup, Space};
use allocdoc::app::Format;
use allocdoc::app::diagnose::{DiagnoseOptions, context, read_one};
use allocdoc::app::validate::ValidateOptions;
use allocdoc::conf::{Platform, TorchVersion};
use allocdoc::evidence::fills::Grouping;
use allocdoc::ingest::InputKind;
use allocdoc::rules::RuleSet;
use allocdoc::trial::recommend::{Search, recommend};
use allocdoc::trial::workload::Loaded;
use serde_json::Value;
use std::path::{Path, PathBuf};

#[path = "support/comparisons.rs"]
mod comparisons;
use crate::verdicts::contradictions as contradicts;
use crate::verdicts::{category_contradictions, diagnose_texts, false_claims};
use comparisons::contradictions;

/// Fails with every contradiction found in `texts`.
fn assert_true(what: &str, texts: &[&str]) {
    let bad: Vec<String> = texts.iter().flat_map(|t| contradictions(t)).collect();
    assert!(
        bad.is_empty(),
        "{what}: a comparison word disagrees with its figures:\n{}",
        bad.join("\n")
    );
}

/// Every fixture that holds text or a snapshot (trace CSVs and RMM logs hold
/// no evidence the rules read), the eval corpus included.
fn fixtures() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_none_or(|x| x != "md") {
                let data = std::fs::read(&p).unwrap();
                if matches!(
                    allocdoc::ingest::detect(&data),
                    InputKind::Text | InputKind::Pickle
                ) {
                    out.push(p);
                }
            }
        }
    }
    let mut v = Vec::new();
    walk(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures"),
        &mut v,
    );
    v.sort();
    assert!(v.len() > 150, "only {} fixtures", v.len());
    v
}

fn json(out: &str) -> Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// A recommendation's value, `None` when there is none.
fn line(v: &Value) -> Option<String> {
    v.as_object()
        .map(|_| v["value"].as_str().unwrap_or("").to_string())
}

/// What `diagnose --format json` says: (cause, line).
fn diagnosed(path: &str) -> (String, Option<String>) {
    let out = allocdoc::app::diagnose::run(&DiagnoseOptions {
        inputs: vec![path.into()],
        common: allocdoc::app::Common {
            format: Format::Json,
            ..Default::default()
        },
        ..DiagnoseOptions::default()
    })
    .unwrap();
    let v = json(&out.stdout);
    (
        v["cause"].as_str().unwrap().to_string(),
        line(&v["recommendation"]),
    )
}

/// A command's answer agrees with diagnose's: the same cause; the same line,
/// or one sentence that names the rules' line and the line given instead.
fn agrees(what: &str, path: &str, diagnose: &(String, Option<String>), answer: &Value) {
    let (cause, rules) = diagnose;
    assert_eq!(
        answer["cause"].as_str(),
        Some(cause.as_str()),
        "{what} {path}: another cause than diagnose's"
    );
    let given = line(&answer["recommendation"]);
    assert!(answer["setup"].is_object(), "{what} {path}: no setup");
    if given == *rules {
        return;
    }
    let sentence = answer["overrides"].as_str().unwrap_or_else(|| {
        panic!("{what} {path}: line {given:?} differs from diagnose's {rules:?} without a sentence")
    });
    match rules {
        Some(r) => assert!(
            sentence.starts_with(&format!("the rules suggest {r};")),
            "{what} {path}: {sentence}"
        ),
        None => assert!(
            sentence.starts_with("the rules suggest no setting;")
                || sentence.starts_with(&format!("the rules find {cause}:")),
            "{what} {path}: {sentence}"
        ),
    }
    if let Some(g) = &given {
        let shown = if g.is_empty() {
            "PyTorch's defaults"
        } else {
            g
        };
        assert!(sentence.contains(shown), "{what} {path}: {sentence}");
    }
}

/// One fixture, read and diagnosed once and its probe fitted once (the
/// costly part): what both tests below run their commands on.
struct Prepared {
    path: String,
    p: allocdoc::app::input::Prepared,
}

/// Every fixture prepared once for both tests (they run in one process).
fn prepared() -> &'static [Prepared] {
    use rayon::prelude::*;
    static ALL: std::sync::OnceLock<Vec<Prepared>> = std::sync::OnceLock::new();
    ALL.get_or_init(|| {
        fixtures()
            .par_iter()
            .map(|f| {
                let path = f.to_string_lossy().into_owned();
                let p = allocdoc::app::input::prepare(
                    &path,
                    (None, None),
                    None,
                    (None, &allocdoc::Limits::default()),
                    &Default::default(),
                )
                .unwrap_or_else(|e| panic!("{path}: {e}"));
                Prepared { path, p }
            })
            .collect()
    })
}

/// One command's result: its JSON, its text and its exit code.
struct Doc {
    json: Value,
    text: String,
    exit: i32,
}

/// `recommend` and `validate` (JSON, text, exit code) as the commands
/// render them, on a prepared fixture (the same steps as `app::recommend`
/// and `app::validate`, with the probe fitted once); `validate` is `None`
/// where there is nothing to replay.
fn recommend_and_validate(f: &Prepared, candidate: &str) -> (Doc, Option<Doc>) {
    let p = &f.p;
    let Loaded::Ready(w) = &p.loaded else {
        let Loaded::Nothing(why) = &p.loaded else {
            unreachable!()
        };
        let only =
            allocdoc::trial::recommend::RulesOnly::new(p.diagnosis.as_ref(), &p.setup, why.clone());
        let render = |format| allocdoc::report::recommend::rules_only("recommend", &only, format);
        let doc = Doc {
            json: json(&render(Format::Json)),
            text: render(Format::Text),
            exit: allocdoc::error::EXIT_NOTHING_TO_REPLAY,
        };
        return (doc, None);
    };
    let space = Space::for_setup(&p.setup, p.current.per_process_memory_fraction.is_some());
    let search = Search {
        space: &space,
        current_conf: &p.current_conf,
        current: &p.current,
        diagnosis: p.diagnosis.as_ref(),
        bisect: true,
    };
    let r = recommend(w, w.capacity(None), &search, &|_| {}).unwrap();
    let r = Doc {
        json: json(&allocdoc::report::recommend::recommendation(
            &r,
            Format::Json,
        )),
        text: allocdoc::report::recommend::recommendation(&r, Format::Text),
        exit: r.exit_code(),
    };
    let settings = allocdoc::app::input::conf_at("--conf", candidate, &p.setup).unwrap();
    let v = allocdoc::trial::validate::validate(
        w,
        (allocdoc::device::DeviceSpec::Sim, "sim"),
        (&p.current_conf, &p.current),
        (candidate, &settings),
        w.capacity(None),
        (p.diagnosis.as_ref(), &p.setup),
    )
    .unwrap();
    let v = Doc {
        json: json(&allocdoc::report::recommend::validation(&v, Format::Json)),
        text: allocdoc::report::recommend::validation(&v, Format::Text),
        exit: v.verdict.exit_code,
    };
    (r, Some(v))
}

#[test]
fn diagnose_recommend_and_validate_agree_on_every_fixture() {
    use rayon::prelude::*;
    let all = prepared();
    let contradicted = std::sync::Mutex::new(Vec::new());
    let overridden: Vec<String> = all
        .par_iter()
        .filter_map(|f| {
            let path = &f.path;
            let d = diagnosed(path);
            let candidate = d.1.clone().unwrap_or_default();
            let (r, v) = recommend_and_validate(f, &candidate);
            // Exit codes against the JSON verdicts, text against both.
            let mut bad = contradicts("recommend", r.exit, &r.json, Some(&r.text));
            if let Some(v) = &v {
                bad.extend(contradicts("validate", v.exit, &v.json, Some(&v.text)));
                // One answer (issue 34): validate never fails the line diagnose prints.
                if d.1.is_some() && v.exit == allocdoc::error::EXIT_STILL_OOM {
                    bad.push(format!(
                        "validate --conf {candidate:?} exits 1 on the line diagnose prints"
                    ));
                }
            }
            // What recommend and validate print, held to the claims' conditions.
            if let Some(diagnosis) = &f.p.diagnosis {
                bad.extend(false_claims("recommend", diagnosis, &[&r.text]));
                if let Some(v) = &v {
                    bad.extend(false_claims("validate", diagnosis, &[&v.text]));
                }
            }
            contradicted
                .lock()
                .unwrap()
                .extend(bad.into_iter().map(|b| format!("{path}: {b}")));
            let r = r.json;
            let v = v.map(|v| v.json);
            let answer = &r["answer"];
            agrees("recommend", path, &d, answer);
            // Only a replayed trace drops the rules' line (issue 12's strengths).
            for (what, doc) in [("recommend", Some(&r)), ("validate", v.as_ref())] {
                if let Some(doc) = doc
                    && d.1.is_some()
                    && doc["answer"]["recommendation"].is_null()
                {
                    assert_eq!(
                        doc["strength"], "proven",
                        "{what} {path} drops the rules' line"
                    );
                }
            }
            assert_true(
                path,
                &[
                    answer["diagnosis"].as_str().unwrap_or(""),
                    answer["overrides"].as_str().unwrap_or(""),
                ],
            );
            // The contract's recommendation is the answer's line.
            assert_eq!(
                line(&r["recommendation"]),
                line(&answer["recommendation"]),
                "{path}"
            );
            match v {
                Some(v) => {
                    agrees("validate", path, &d, &v["answer"]);
                    assert_true(
                        path,
                        &[
                            v["verdict"].as_str().unwrap_or(""),
                            v["answer"]["overrides"].as_str().unwrap_or(""),
                        ],
                    );
                }
                None => {
                    // Nothing to replay: `validate` says so, with diagnose's
                    // answer, and exits as `recommend` does (5).
                    let run = |format| {
                        allocdoc::app::validate::run(&ValidateOptions {
                            input: path.clone(),
                            conf: candidate.clone(),
                            device: "sim".into(),
                            common: allocdoc::app::Common {
                                format,
                                ..Default::default()
                            },
                            ..ValidateOptions::default()
                        })
                        .unwrap()
                    };
                    let (out, doc) = (run(Format::Text), run(Format::Json));
                    assert_eq!(
                        out.exit_code,
                        allocdoc::error::EXIT_NOTHING_TO_REPLAY,
                        "{path}"
                    );
                    assert!(
                        out.stdout.starts_with("validate: nothing to replay: "),
                        "validate {path}: {}",
                        out.stdout
                    );
                    agrees("validate", path, &d, &json(&doc.stdout)["answer"]);
                    contradicted.lock().unwrap().extend(
                        contradicts(
                            "validate",
                            doc.exit_code,
                            &json(&doc.stdout),
                            Some(&out.stdout),
                        )
                        .into_iter()
                        .map(|b| format!("{path}: {b}")),
                    );
                    assert!(
                        r["candidates"].as_array().is_some_and(|c| c.is_empty()),
                        "{path}"
                    );
                }
            }
            answer["overrides"].is_string().then(|| path.clone())
        })
        .collect();
    let replayed = all
        .iter()
        .filter(|f| matches!(f.p.loaded, Loaded::Ready(_)))
        .count();
    assert!(replayed > 80, "only {replayed} fixtures replayed");
    let contradicted = contradicted.into_inner().unwrap();
    assert!(
        contradicted.is_empty(),
        "{} contradictions between exit codes, JSON and text:\n{}",
        contradicted.len(),
        contradicted.join("\n")
    );
    eprintln!(
        "{} of {} fixtures' lines differ from diagnose's, each with its sentence: {overridden:#?}",
        overridden.len(),
        all.len()
    );
}

/// Every claim `diagnose` prints on every fixture (the eval texts and the
/// snapshots among them), and every claim `top` prints on every snapshot,
/// holds on the diagnosis's figures, and no two contradict (issue 34,
/// `advise::claims`; docs/ARCHITECTURE.md lists what is checked).
#[test]
fn every_printed_claim_holds_on_every_fixture() {
    use allocdoc::advise::claims::Claim;
    use rayon::prelude::*;
    let made = std::sync::Mutex::new(std::collections::BTreeMap::<String, usize>::new());
    let bad: Vec<String> = prepared()
        .par_iter()
        .flat_map(|f| {
            let Some(d) = &f.p.diagnosis else {
                return Vec::new();
            };
            let mut texts = diagnose_texts(d);
            let mut bad = false_claims(
                &format!("{} diagnose", f.path),
                d,
                &texts.iter().map(String::as_str).collect::<Vec<_>>(),
            );
            if allocdoc::ingest::detect(&std::fs::read(&f.path).unwrap()) == InputKind::Pickle {
                let top = allocdoc::app::top::run(&allocdoc::app::top::TopOptions {
                    inputs: vec![f.path.clone()],
                    ..Default::default()
                })
                .unwrap()
                .stdout;
                bad.extend(false_claims(&format!("{} top", f.path), d, &[&top]));
                texts.push(top);
                for by in [Grouping::Site, Grouping::User] {
                    let json = allocdoc::app::top::run(&allocdoc::app::top::TopOptions {
                        inputs: vec![f.path.clone()],
                        by,
                        common: allocdoc::app::Common {
                            format: Format::Json,
                            ..Default::default()
                        },
                        ..Default::default()
                    })
                    .unwrap()
                    .stdout;
                    bad.extend(category_contradictions(
                        &format!("{} top --by {by:?}", f.path),
                        &serde_json::from_str(&json).unwrap(),
                    ));
                }
            }
            let mut made = made.lock().unwrap();
            for c in Claim::ALL {
                if texts.iter().any(|t| c.made_in(t)) {
                    *made.entry(format!("{c:?}")).or_default() += 1;
                }
            }
            bad
        })
        .collect();
    assert!(
        bad.is_empty(),
        "{} false or contradictory claims:\n{}",
        bad.len(),
        bad.join("\n")
    );
    let made = made.into_inner().unwrap();
    eprintln!("claims made, by fixtures: {made:?}");
    // The claims the fixtures make, so that the check is not vacuous.
    for c in [
        "CardFull",
        "NoSettingHelps",
        "SetsLine",
        "SuggestsExpandable",
        "Fragmentation",
        "Capacity",
        "CudaTools",
        "MustGo",
        "Linux",
    ] {
        assert!(
            made.get(c).copied().unwrap_or(0) >= 3,
            "{c}: made on {:?} fixtures",
            made.get(c)
        );
    }
}

/// Whether `conf check` accepts `value` for `version` on `platform` without
/// flagging part of it as ignored.
fn checks(value: &str, version: TorchVersion, platform: Platform) -> Result<(), String> {
    let c = advise::conf_check::check(value, version, platform);
    if !c.valid {
        return Err(format!("invalid: {:?}", c.error.map(|e| e.message)));
    }
    if !c.ignored.is_empty() {
        return Err(format!("ignored: {:?}", c.ignored));
    }
    Ok(())
}

/// The versions and platforms of the show.
const VERSIONS: [(u16, u16); 5] = [(1, 10), (2, 0), (2, 1), (2, 4), (2, 6)];
const PLATFORMS: [Platform; 2] = [Platform::Linux, Platform::Windows];

/// For every fixture × version × platform, the lines `diagnose`, `recommend`
/// (with a small budget: three candidates, no bisection) and
/// `validate` (of expandable segments) would print are valid there and not
/// ignored. The probe of a text fixture is fitted once and searched per context.
#[test]
fn no_command_recommends_what_pytorch_rejects_or_ignores() {
    use rayon::prelude::*;
    let rules = RuleSet::embedded().unwrap();
    let checked: usize = prepared()
        .par_iter()
        .map(|f| {
            let path = &f.path;
            let mut checked = 0;
            for (major, minor) in VERSIONS {
                let version = TorchVersion::new(major, minor);
                for platform in PLATFORMS {
                    let mut ctx = context(Some(&version.to_string()), Some(platform)).unwrap();
                    let (_, ev) = read_one(
                        path,
                        &Default::default(),
                        &allocdoc::Limits::default(),
                        &mut ctx,
                    )
                    .unwrap();
                    let d = advise::diagnose(ev, &ctx, &rules);
                    let at = format!("{path} at PyTorch {version} on {platform:?}");
                    if let Some(r) = &d.recommendation {
                        checks(&r.value, version, platform)
                            .unwrap_or_else(|e| panic!("diagnose {at}: {} {e}", r.value));
                    }
                    checked += 1;
                    let Loaded::Ready(w) = &f.p.loaded else {
                        continue;
                    };
                    let setup: &Setup = &d.setup;
                    let current = allocdoc::conf::Settings {
                        version: setup.replay_version(),
                        ..allocdoc::conf::Settings::default()
                    };
                    // The small budget: PyTorch's defaults, expandable segments and
                    // max_split_size_mb:512, where the context's space admits them.
                    let mut space = Space::for_setup(setup, false);
                    space.candidates.retain(|c| {
                        c.keys() == 0
                            || (c.keys() == 1
                                && (c.expandable_segments || c.max_split_size_mb == Some(512)))
                    });
                    let search = Search {
                        space: &space,
                        current_conf: "",
                        current: &current,
                        diagnosis: Some(&d),
                        bisect: false,
                    };
                    let r = recommend(w, w.capacity(None), &search, &|_| {}).unwrap();
                    if let Some(rec) = &r.recommendation {
                        checks(&rec.value, version, platform)
                            .unwrap_or_else(|e| panic!("recommend {at}: {} {e}", rec.value));
                        assert!(
                            platform != Platform::Windows || rec.line.starts_with("set "),
                            "{at}: {}",
                            rec.line
                        );
                    }
                    // validate of expandable segments, where PyTorch accepts the key.
                    if let Ok(es) =
                        allocdoc::app::input::conf_at("--conf", "expandable_segments:True", setup)
                    {
                        let v = allocdoc::trial::validate::validate(
                            w,
                            (allocdoc::device::DeviceSpec::Sim, "sim"),
                            ("", &current),
                            ("expandable_segments:True", &es),
                            w.capacity(None),
                            (Some(&d), setup),
                        )
                        .unwrap();
                        if let Some(rec) = &v.answer.recommendation {
                            checks(&rec.value, version, platform)
                                .unwrap_or_else(|e| panic!("validate {at}: {} {e}", rec.value));
                        }
                    }
                }
            }
            checked
        })
        .sum();
    assert!(checked > 1500, "only {checked} contexts checked");
}

/// Every verdict and finding `diagnose` renders on every fixture, for each
/// incident: its comparison words agree with the figures they relate.
#[test]
fn comparison_words_agree_with_the_figures_on_every_fixture() {
    let rules = RuleSet::embedded().unwrap();
    let mut findings = 0;
    for f in fixtures() {
        let path = f.to_string_lossy().into_owned();
        let mut ctx = allocdoc::advise::Context::default();
        let (_, ev) = read_one(
            &path,
            &Default::default(),
            &allocdoc::Limits::default(),
            &mut ctx,
        )
        .unwrap();
        let d = advise::diagnose(ev, &ctx, &rules);
        let mut texts: Vec<&str> = vec![&d.verdict];
        texts.extend(d.findings.iter().map(|f| f.message.as_str()));
        texts.extend(d.findings.iter().filter_map(|f| f.next.as_deref()));
        texts.extend(d.incidents.iter().map(|i| i.verdict.as_str()));
        findings += d.findings.len();
        assert_true(&path, &texts);
    }
    assert!(findings > 150, "only {findings} findings rendered");
}

/// Every rule's own test cases: the message of each case that fires.
#[test]
fn comparison_words_agree_with_the_figures_in_the_rules_own_cases() {
    let rules = RuleSet::embedded().unwrap();
    let mut fired = 0;
    for rule in &rules.rules {
        for case in &rule.tests {
            if let allocdoc::rules::Verdict::Fired(f) = rule.evaluate(&case.facts) {
                fired += 1;
                assert_true(
                    &format!("{} :: {}", rule.id, case.name),
                    &[&f.message, f.next.as_deref().unwrap_or("")],
                );
            }
        }
    }
    assert!(fired > 30, "only {fired} firing cases");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

    /// Any figures at all: whatever a rule renders when it fires, its
    /// comparison words agree with the figures beside them.
    #[test]
    fn comparison_words_agree_with_any_figures(
        sizes in proptest::collection::vec(0u64..(96u64 << 30), 12),
        flags in proptest::collection::vec(proptest::bool::ANY, 12),
        series in proptest::collection::vec(0u64..(8u64 << 30), 3..6),
    ) {
        use allocdoc::rules::catalog::{METRICS, MetricKind};
        use allocdoc::rules::{Fact, Facts};
        let rules = RuleSet::embedded().unwrap();
        for rule in &rules.rules {
            let mut facts = Facts {
                kinds: rule.applies_to.kinds.clone(),
                backend: rule.applies_to.backend,
                torch: allocdoc::rules::VersionRange::exact(TorchVersion::new(2, 6)),
                ..Facts::default()
            };
            if facts.kinds.is_empty() {
                facts.kinds.push(allocdoc::evidence::Kind::Oom);
            }
            for (i, m) in METRICS.iter().enumerate() {
                let fact = match m.kind {
                    MetricKind::Bytes => Fact::Num(sizes[i % sizes.len()] as f64),
                    MetricKind::Number => Fact::Num((sizes[i % sizes.len()] % 50) as f64),
                    MetricKind::Bool => Fact::Bool(flags[i % flags.len()]),
                    MetricKind::Series => Fact::Series(series.iter().map(|&v| v as f64).collect()),
                    // Source locations: no figures to compare.
                    MetricKind::Text => {
                        facts.set_text(m.name, "train.py:12:step".into());
                        continue;
                    }
                };
                facts.set(m.name, fact);
            }
            facts.set("cuda_context", Fact::Num((1u64 << 30) as f64));
            if let allocdoc::rules::Verdict::Fired(f) = rule.evaluate(&facts) {
                let bad = contradictions(&f.message);
                proptest::prop_assert!(bad.is_empty(), "{}: {:?}", rule.id, bad);
            }
        }
    }
}
