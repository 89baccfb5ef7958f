//! The layering rule of `docs/ARCHITECTURE.md`: a module may use only the
//! modules below it in [`LAYERS`]. Read from the `crate::…` paths in `src/`
//! (comments left out), so a `use` that climbs a layer fails here, naming the
//! file and line.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Every top-level module of the library, lowest first.
const LAYERS: &[&str] = &[
    // Foundations: sizes, errors, the limits of a run, the evidence model.
    "units",
    "error",
    "limits",
    "evidence",
    // Models of PyTorch: its config, devices, the allocator port, snapshots,
    // reading inputs, the rule language, the workloads the allocator replays.
    "conf",
    "device",
    "allocator",
    "snapshot",
    "ingest",
    "rules",
    "workload",
    // Decisions: facts, rules and their combination; then runs and judgements over them.
    "advise",
    "trial",
    // Rendering, then the commands.
    "report",
    "app",
];

/// The top-level modules a piece of Rust source names as `crate::module`,
/// `crate::{a, b::c}` or `crate::Error` (the root re-export of `error`).
/// Comment lines are skipped.
fn imported_modules(source: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (n, line) in source.lines().enumerate() {
        let code = line.trim_start();
        if code.starts_with("//") {
            continue;
        }
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                // Top-level names of the group, nested groups skipped.
                let mut depth = 0;
                let mut name = String::new();
                for c in group.chars() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => break,
                        '}' => depth -= 1,
                        c if depth == 0 && (c.is_alphanumeric() || c == '_') => name.push(c),
                        ',' | ':' if depth == 0 && !name.is_empty() => {
                            found.push((n + 1, std::mem::take(&mut name)));
                        }
                        _ => {}
                    }
                }
                if !name.is_empty() {
                    found.push((n + 1, name));
                }
            } else {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                found.push((n + 1, name));
            }
        }
    }
    found
        .into_iter()
        .map(|(n, m)| (n, if m == "Error" { "error".into() } else { m }))
        .filter(|(_, m)| !m.is_empty())
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file of `src/` belongs to (`None` for the crate
/// root and the binary, which may use everything).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    match first {
        "lib.rs" | "main.rs" => None,
        f => Some(f.trim_end_matches(".rs").to_string()),
    }
}

fn rank(module: &str) -> Option<usize> {
    LAYERS.iter().position(|m| *m == module)
}

#[test]
fn no_module_uses_a_higher_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut violations = Vec::new();
    let mut edges = BTreeSet::new();
    for file in &files {
        let Some(module) = module_of(&src, file) else {
            continue;
        };
        let Some(own) = rank(&module) else {
            violations.push(format!(
                "{}: module `{module}` is not in LAYERS (tests/layering.rs): place it",
                file.display()
            ));
            continue;
        };
        let text = std::fs::read_to_string(file).unwrap();
        for (line, used) in imported_modules(&text) {
            if used == module {
                continue;
            }
            match rank(&used) {
                Some(r) if r < own => {
                    edges.insert((module.clone(), used));
                }
                Some(_) => violations.push(format!(
                    "{}:{line}: `{module}` uses `{used}`, which is not below it",
                    file.display()
                )),
                None => violations.push(format!(
                    "{}:{line}: `{module}` uses `crate::{used}`, not a module in LAYERS",
                    file.display()
                )),
            }
        }
    }
    assert!(violations.is_empty(), "{}", violations.join("\n"));
    // The scan sees the real imports (it is not vacuous).
    for edge in [("app", "report"), ("report", "trial"), ("trial", "advise")] {
        assert!(
            edges.contains(&(edge.0.to_string(), edge.1.to_string())),
            "{edge:?} not found"
        );
    }
}

#[test]
fn every_library_module_has_a_layer() {
    let lib =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).unwrap();
    let declared: Vec<&str> = lib
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod "))
        .map(|l| l.trim_end_matches(';'))
        .collect();
    assert_eq!(declared.len(), LAYERS.len(), "{declared:?}");
    for m in declared {
        assert!(
            rank(m).is_some(),
            "src/lib.rs declares `{m}`, not in LAYERS"
        );
    }
}

#[test]
fn imports_are_read_from_paths_groups_and_the_error_re_export() {
    let source = "use crate::{ingest, report::{self, parse}};\n\
                  // crate::app in a comment does not count\n\
                  fn f() -> Result<(), crate::Error> { crate::trial::run::replay(); }\n";
    let found: Vec<String> = imported_modules(source)
        .into_iter()
        .map(|(_, m)| m)
        .collect();
    assert_eq!(found, ["ingest", "report", "error", "trial"]);
}
