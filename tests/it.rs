//! Every integration test in one binary: one compile of the test-side code
//! (generic instantiations of serde_json, insta, proptest…) and one link,
//! where a binary per file paid both per file (BENCHMARKS.md, "The README's
//! test command from a clean clone"). Each file of `tests/` is a module here;
//! `autotests = false` in Cargo.toml keeps cargo from building them again one
//! by one, so a file missing below would never run:
//! `every_test_file_is_a_module_of_this_binary` fails then. Filter by module:
//! `cargo test --profile ci --test it ingest::` (insta names snapshots
//! `it__<module>__<name>.snap`).

mod allocator;
mod answer;
mod claims;
mod conf;
mod conventions;
mod fills;
mod fit;
mod forecast;
mod grid;
mod hostile;
mod ingest;
mod json_contract;
mod layering;
mod readme;
mod report;
mod rules;
mod snapshot;
// Its own `mod text_eval;` (tests/support/text_eval.rs) now sits in a module of that name.
#[allow(clippy::module_inception)]
mod text_eval;
mod trace_csv;
mod trace_rules;
mod validate;

// Running the binary: shared by the command-line tests.
#[path = "support/cli.rs"]
mod cli;
// Snapshots written by hand: shared by the fit, forecast and grid tests.
#[path = "support/written.rs"]
mod written;
// Shared by report and snapshot (one copy: clippy::duplicate_mod).
#[path = "support/verdicts.rs"]
mod verdicts;
#[path = "support/xorshift.rs"]
mod xorshift;

#[test]
fn every_test_file_is_a_module_of_this_binary() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let root = std::fs::read_to_string(dir.join("it.rs")).unwrap();
    let mut files = 0;
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        let p = e.path();
        let Some(stem) = p.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        if p.extension().is_some_and(|x| x == "rs") && stem != "it" {
            files += 1;
            assert!(
                root.lines().any(|l| l == format!("mod {stem};")),
                "tests/{stem}.rs is not a module of tests/it.rs: add `mod {stem};` there, or it never runs"
            );
        }
    }
    assert!(files >= 16, "only {files} test files found");
}
