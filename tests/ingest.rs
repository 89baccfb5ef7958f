//! Ingest tests: every fixture under `fixtures/text/` is parsed and each of
//! its `# expect.N.field: value` header lines is checked exactly; insta
//! snapshots pin what users read; proptest feeds random and mutated input.

use allocdoc::app::{self, Format};
use allocdoc::ingest;
use proptest::prelude::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn fixtures() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/text");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("fixtures/text")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    v.sort();
    v
}

/// A printed size ("186.00 MiB", "0 bytes", "2721 MB") in bytes, computed
/// here independently of `units`: round(value × binary unit).
fn printed(v: &str) -> Option<u64> {
    let (num, unit) = v.split_once(' ')?;
    let mult: f64 = match unit {
        "B" | "bytes" => 1.0,
        "KiB" | "KB" => 1024.0,
        "MiB" | "MB" => 1048576.0,
        "GiB" | "GB" => 1073741824.0,
        "TiB" | "TB" => 1099511627776.0,
        _ => return None,
    };
    Some((num.parse::<f64>().ok()? * mult).round() as u64)
}

/// The JSON value at a dotted path (`metrics.allocated_bytes.all.current`,
/// `other_processes.0.pid`); metric names never contain a dot except the
/// private-pool ones, matched greedily against the object's keys.
fn lookup<'a>(mut v: &'a Value, path: &str) -> Option<&'a Value> {
    let mut rest = path;
    while !rest.is_empty() {
        v = match v {
            Value::Array(a) => {
                let (i, r) = rest.split_once('.').unwrap_or((rest, ""));
                rest = r;
                a.get(i.parse::<usize>().ok()?)?
            }
            Value::Object(o) => {
                let key = o
                    .keys()
                    .filter(|k| rest == k.as_str() || rest.starts_with(&format!("{k}.")))
                    .max_by_key(|k| k.len())?;
                rest = rest[key.len()..].trim_start_matches('.');
                &o[key]
            }
            _ => return None,
        };
    }
    Some(v)
}

fn expected(v: &str) -> Value {
    if let Ok(n) = v.parse::<i64>() {
        return Value::from(n);
    }
    if let Some(b) = printed(v) {
        return Value::from(b);
    }
    match v {
        "true" => Value::Bool(true),
        "false" => Value::Bool(false),
        _ => Value::from(v),
    }
}

#[test]
fn every_fixture_yields_exactly_its_expected_numbers() {
    let files = fixtures();
    assert!(files.len() >= 60, "only {} fixtures", files.len());
    let mut failures = Vec::new();
    let mut checked = 0;
    for path in &files {
        let data = std::fs::read(path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let text = String::from_utf8_lossy(&data);
        assert!(text.starts_with("# source: "), "{name}: no source line");
        let obs = ingest::parse_bytes(&name, &data).unwrap();
        let json = serde_json::to_value(&obs).unwrap();
        let mut count = None;
        for line in text.lines().take_while(|l| *l != "# ---") {
            let Some((key, value)) = line
                .strip_prefix("# expect.")
                .and_then(|l| l.split_once(": "))
            else {
                continue;
            };
            if key == "count" {
                count = Some(value.parse::<usize>().unwrap());
                continue;
            }
            let Some((n, field)) = key.split_once('.') else {
                continue;
            };
            let Ok(n) = n.parse::<usize>() else { continue };
            checked += 1;
            let got = json.get(n - 1).and_then(|o| lookup(o, field));
            let ok = match value {
                "absent" => got.is_none(),
                v => got == Some(&expected(v)),
            };
            if !ok {
                failures.push(format!(
                    "{name}: #{n}.{field}: expected {value}, got {got:?}"
                ));
            }
        }
        let count = count.unwrap_or_else(|| panic!("{name}: no expect.count"));
        if obs.len() != count {
            failures.push(format!(
                "{name}: {} observations, expected {count}",
                obs.len()
            ));
        }
    }
    assert!(checked > 500, "only {checked} expectations");
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// `parse` output for a fixture, named by its path relative to the crate root
/// (integration tests run there) so snapshots do not depend on the checkout.
fn render(name: &str, format: Format) -> String {
    let out = app::parse::run(&app::parse::ParseOptions {
        inputs: vec![format!("fixtures/text/{name}")],
        common: allocdoc::app::Common {
            format,
            ..Default::default()
        },
        ..Default::default()
    })
    .unwrap();
    assert_eq!(out.exit_code, 0);
    out.stdout
}

#[test]
fn snapshots_of_what_users_read() {
    // Text and JSON for the first ones; JSON for the shapes of issue 15.
    let text = 6;
    for (i, name) in [
        "readme_example.log",
        "real_ranks_other_process.log",
        "constructed_async_fraction_rank.log",
        "real_summary_one_line_escaped.log",
        "issue_thc_legacy.log",
        "constructed_stats_cut.log",
        "issue_async_short_comfyui_5818.log",
        "constructed_async_short_log_then_traceback.log",
        "issue_thc_check_alone.log",
        "issue_th_host_lua_reallocate.log",
        "constructed_fragment_in_prose.log",
        "issue_ipex_xpu_repl.log",
        "issue_exception_repr_inline.log",
        "constructed_retyped_heads.log",
        "constructed_summary_wrapped_80_1_9.log",
        "constructed_summary_cut_in_active_allocs.log",
        "issue_stats_wrapped_key.log",
    ]
    .into_iter()
    .enumerate()
    {
        let stem = name.trim_end_matches(".log");
        if i < text {
            insta::assert_snapshot!(format!("{stem}.text"), render(name, Format::Text));
        }
        insta::assert_snapshot!(format!("{stem}.json"), render(name, Format::Json));
    }
    insta::assert_snapshot!(
        "readme_example.markdown",
        render("readme_example.log", Format::Markdown)
    );
    insta::assert_snapshot!(
        "nothing_found.text",
        render("plain_training_log.log", Format::Text)
    );
}

#[test]
fn bad_inputs_are_named_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_string_lossy().into_owned();
    let e = ingest::load(std::slice::from_ref(&d)).unwrap_err();
    assert_eq!(e.exit_code(), 2);
    assert!(
        e.to_string().contains(&d) && e.to_string().contains("directory"),
        "{e}"
    );
    let missing = format!("{d}/nope.log");
    let e = ingest::load(std::slice::from_ref(&missing)).unwrap_err();
    assert!(e.to_string().contains("nope.log"), "{e}");
    // Empty and binary inputs are valid and hold nothing.
    let empty = dir.path().join("empty.log");
    std::fs::write(&empty, b"").unwrap();
    let ev = ingest::load(&[empty.to_string_lossy().into_owned()]).unwrap();
    assert!(ev.observations.is_empty());
    let garbage: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 24) as u8)
        .collect();
    let ev = ingest::parse_input("garbage", &garbage).unwrap();
    assert!(ev.observations.is_empty());
    assert!(
        ev.notes
            .iter()
            .any(|n| n.contains("does not look like text")),
        "{:?}",
        ev.notes
    );
}

#[test]
fn trace_inputs_say_they_hold_no_observations() {
    let ev =
        ingest::parse_input("t.csv", b"# a trace\naction,id,size,stream\nalloc,a,1,0\n").unwrap();
    assert!(ev.observations.is_empty());
    assert!(ev.notes[0].contains("trace CSV"));
    let ev = ingest::parse_input("r.csv", b"Thread,Time,Action,Pointer,Size,Stream\n").unwrap();
    assert!(ev.notes[0].contains("RMM"));
}

fn oom_fixture_bodies() -> Vec<(String, Vec<u8>)> {
    fixtures()
        .into_iter()
        .filter_map(|p| {
            let data = std::fs::read(&p).ok()?;
            let name = p.file_name()?.to_string_lossy().into_owned();
            Some((name, data))
        })
        .collect()
}

/// The figures of every observation (and the era its wording shows), without
/// positions and display text.
fn figures(obs: &[allocdoc::evidence::Observation]) -> Vec<Value> {
    obs.iter()
        .map(|o| {
            let mut v = serde_json::to_value(o).unwrap();
            let m = v.as_object_mut().unwrap();
            for k in ["line", "input", "rank", "message", "truncated", "exception"] {
                m.remove(k);
            }
            v
        })
        .collect()
}

/// [`figures`] without the era, which a cut can narrow (a hint cut off).
fn figures_only(obs: &[allocdoc::evidence::Observation]) -> Vec<Value> {
    let mut v = figures(obs);
    v.iter_mut().for_each(|o| {
        o.as_object_mut().unwrap().remove("format_era");
    });
    v
}

/// Hard-wraps every line of `text` at `width` bytes (on char boundaries) the
/// way a terminal does: colour escapes and the CR take no column.
fn hard_wrap(text: &str, width: usize) -> String {
    let mut out = String::new();
    for line in text.split('\n') {
        let (line, cr) = line.strip_suffix('\r').map_or((line, ""), |l| (l, "\r"));
        let mut n = 0;
        let mut in_escape = false;
        for c in line.chars() {
            if c == '\x1b' || in_escape {
                in_escape = !(c.is_ascii_alphabetic());
                out.push(c);
                continue;
            }
            if n >= width {
                out.push('\n');
                n = 0;
            }
            out.push(c);
            n += c.len_utf8();
        }
        out.push_str(cr);
        out.push('\n');
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..4096)) {
        let _ = ingest::parse_bytes("random", &data);
    }

    #[test]
    fn mutated_fixtures_never_panic(
        pick in any::<prop::sample::Index>(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..16),
        cut in any::<prop::sample::Index>(),
    ) {
        let all = oom_fixture_bodies();
        let (_, mut data) = all[pick.index(all.len())].clone();
        for (at, b) in flips {
            if !data.is_empty() {
                let i = at.index(data.len());
                data[i] = b;
            }
        }
        data.truncate(cut.index(data.len() + 1));
        let _ = ingest::parse_bytes("mutated", &data);
    }

    /// A prefix on every line (ranks, timestamps) changes no figure and no era.
    #[test]
    fn line_prefixes_keep_the_figures(pick in any::<prop::sample::Index>(), which in 0usize..3) {
        let all = oom_fixture_bodies();
        let (name, data) = &all[pick.index(all.len())];
        let text = String::from_utf8_lossy(data);
        let prefix = ["[rank7]: ", "2024-05-01 12:00:00,001 INFO ", "    "][which];
        let prefixed: String = text.split_inclusive('\n').map(|l| format!("{prefix}{l}")).collect();
        let a = ingest::parse_bytes(name, text.as_bytes()).unwrap();
        let b = ingest::parse_bytes(name, prefixed.as_bytes()).unwrap();
        prop_assert_eq!(figures(&a), figures(&b), "{}", name);
    }

    /// A hard wrap of the OOM messages at any width from 40 on changes no
    /// figure and no era. A message without its "out of memory" head (retyped,
    /// IPEX's 4 GB refusal, a quoted fragment) has no anchor a wrap cannot
    /// split: it may be lost, but every figure read is still its own.
    #[test]
    fn hard_wraps_keep_the_oom_figures(pick in any::<prop::sample::Index>(), width in 40usize..200) {
        let all: Vec<_> = oom_fixture_bodies()
            .into_iter()
            .filter(|(n, d)| {
                let obs = ingest::parse_bytes(n, d).unwrap();
                // Wrapping a line that carries a per-process prefix splits the
                // prefix itself: no reader can undo that, so those are left out.
                !obs.is_empty()
                    && obs.iter().all(|o| o.kind == allocdoc::evidence::Kind::Oom && o.rank.is_none())
                    && !["lost_newlines", "async", "vllm"].iter().any(|x| n.contains(x))
            })
            .collect();
        let (name, data) = &all[pick.index(all.len())];
        let text = String::from_utf8_lossy(data);
        let a = ingest::parse_bytes(name, text.as_bytes()).unwrap();
        let b = ingest::parse_bytes(name, hard_wrap(&text, width).as_bytes()).unwrap();
        let headless = text.lines().any(|l| {
            (l.contains("Tried to allocate") || l.contains("total capacity;"))
                && !l.contains("out of memory")
        });
        if headless {
            let full = figures(&a);
            for p in figures(&b) {
                prop_assert!(full.iter().any(|f| subset(&p, f)), "{} at width {}:\n{}", name, width, p);
            }
        } else {
            prop_assert_eq!(figures(&a), figures(&b), "{} at width {}", name, width);
        }
    }
}

/// Every value `part` states is the one `full` states (objects by key, arrays
/// element by element from the start).
fn subset(part: &Value, full: &Value) -> bool {
    match (part, full) {
        (Value::Object(p), Value::Object(f)) => p
            .iter()
            .all(|(k, v)| f.get(k).is_some_and(|w| subset(v, w))),
        (Value::Array(p), Value::Array(f)) => {
            p.len() <= f.len() && p.iter().zip(f).all(|(a, b)| subset(a, b))
        }
        _ => part == full,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// A log cut anywhere yields, for every figure it still reports, exactly
    /// the figure the whole log gives: never a wrong number.
    #[test]
    fn a_cut_never_yields_a_wrong_number(pick in any::<prop::sample::Index>(), cut in any::<prop::sample::Index>()) {
        let all = oom_fixture_bodies();
        let (name, data) = &all[pick.index(all.len())];
        let full = figures_only(&ingest::parse_bytes(name, data).unwrap());
        let cut_at = cut.index(data.len() + 1);
        let part = figures_only(&ingest::parse_bytes(name, &data[..cut_at]).unwrap());
        // (A repeat cut short is no longer identical, so it may not be folded
        // into the message it repeats: match each against any whole one.)
        for p in &part {
            prop_assert!(full.iter().any(|f| subset(p, f)), "{} cut at {}:\n{}", name, cut_at, p);
        }
    }
}
