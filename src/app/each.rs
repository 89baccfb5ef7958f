//! `--each` (`parse`, `diagnose`): every input its own incident. The inputs
//! are expanded (directories walked, wildcard patterns matched, in the order
//! docs/json.md gives), run in parallel across files (rayon), and written in
//! that order whatever the threads: with `--format jsonl` one document a line
//! naming its input, with `--format json` those documents under `results`. An
//! input that fails gets an `error` document; the others still run and the
//! exit code is then 2.

use super::{Format, Outcome};
use crate::Error;
use crate::report::common::json_of;
use rayon::prelude::*;
use serde::Serialize;
use std::path::Path;

/// What one input came to: its output in the run's format and its notes for
/// standard error.
pub struct Done {
    pub stdout: String,
    pub notes: Vec<String>,
}

/// Runs `one` on every input `inputs` expands to, in parallel, and puts the
/// outputs together in input order.
pub fn run(
    inputs: &[String],
    format: Format,
    one: impl Fn(&str) -> Result<Done, Error> + Sync,
) -> Outcome {
    let files = expand(inputs);
    let results: Vec<(&str, Result<Done, Error>)> =
        files.par_iter().map(|f| (f.as_str(), one(f))).collect();
    let mut parts = Vec::with_capacity(results.len());
    let mut stderr = Vec::new();
    let mut failed = false;
    for (name, result) in results {
        match result {
            Ok(done) => {
                parts.push(done.stdout);
                stderr.extend(done.notes);
            }
            Err(e) => {
                failed = true;
                stderr.push(format!("allocdoc: error: {e}"));
                parts.push(failure(name, &e, format));
            }
        }
    }
    Outcome {
        stdout: join(&files, parts, format),
        stderr,
        exit_code: if failed { crate::error::EXIT_INPUT } else { 0 },
    }
}

/// The error document of one input (`error.kind` names the Python exception:
/// `input` is `allocdoc.InputError`, and so on).
fn failure(name: &str, e: &Error, format: Format) -> String {
    #[derive(Serialize)]
    struct Failed<'a> {
        error: Failure<'a>,
    }
    #[derive(Serialize)]
    struct Failure<'a> {
        kind: &'a str,
        message: String,
    }
    let kind = match e {
        Error::Input(_) => "input",
        Error::Usage(_) => "usage",
        Error::NoDevice(_) => "no_device",
    };
    match format {
        Format::Json | Format::Jsonl => json_of(
            name,
            &Failed {
                error: Failure {
                    kind,
                    message: e.to_string(),
                },
            },
            format == Format::Jsonl,
        ),
        Format::Text | Format::Markdown => format!("allocdoc: error: {e}\n"),
    }
}

/// The whole output: lines as they are for `jsonl`, the documents under
/// `results` for `json`, each input under its name for text and Markdown.
fn join(files: &[String], parts: Vec<String>, format: Format) -> String {
    match format {
        Format::Jsonl => parts.concat(),
        Format::Json => {
            // Each part is a pretty document; JSON strings hold no raw
            // newlines, so indenting every line nests it as it stands.
            let items: Vec<String> = parts
                .iter()
                .map(|p| {
                    p.trim_end()
                        .lines()
                        .map(|l| format!("    {l}"))
                        .collect::<Vec<_>>()
                        .join("\n")
                })
                .collect();
            let body = if items.is_empty() {
                "[]".to_owned()
            } else {
                format!("[\n{}\n  ]", items.join(",\n"))
            };
            format!(
                "{{\n  \"schema_version\": {},\n  \"results\": {body}\n}}\n",
                crate::report::common::SCHEMA_VERSION
            )
        }
        Format::Text | Format::Markdown => files
            .iter()
            .zip(parts)
            .map(|(f, p)| match format {
                Format::Markdown => format!("### `{f}`\n\n{p}"),
                _ => format!("== {f} ==\n{p}"),
            })
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

/// The files `inputs` name, each expanded in place: a directory walked (each
/// directory's entries sorted by name, a subdirectory where it sorts, names
/// starting with `.` skipped, links to directories not followed); a path that
/// does not exist and holds `*`, `?` or `[` matched as a wildcard pattern;
/// anything else as given. No inputs is standard input.
pub fn expand(inputs: &[String]) -> Vec<String> {
    if inputs.is_empty() {
        return vec!["-".to_owned()];
    }
    let mut files = Vec::new();
    for input in inputs {
        let path = Path::new(input);
        if input != "-" && path.is_dir() {
            walk(path, &mut files);
        } else if !path.exists() && input.contains(['*', '?', '[']) {
            expand_pattern(input, &mut files);
        } else {
            files.push(input.clone());
        }
    }
    files
}

fn walk(dir: &Path, files: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        // Reading it as a file then says what is wrong with it.
        files.push(dir.to_string_lossy().into_owned());
        return;
    };
    let mut entries: Vec<_> = entries.filter_map(Result::ok).collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        if e.file_name().as_encoded_bytes().starts_with(b".") {
            continue;
        }
        let path = e.path();
        match e.file_type() {
            Ok(t) if t.is_dir() => walk(&path, files),
            // A link is followed to a file, never to a directory.
            Ok(t) if t.is_symlink() && path.is_dir() => {}
            _ => files.push(path.to_string_lossy().into_owned()),
        }
    }
}

fn expand_pattern(pattern: &str, files: &mut Vec<String>) {
    let options = glob::MatchOptions {
        require_literal_leading_dot: true,
        ..glob::MatchOptions::new()
    };
    let Ok(paths) = glob::glob_with(pattern, options) else {
        files.push(pattern.to_owned());
        return;
    };
    let before = files.len();
    for path in paths.filter_map(Result::ok) {
        if path.is_dir() {
            walk(&path, files);
        } else {
            files.push(path.to_string_lossy().into_owned());
        }
    }
    if files.len() == before {
        // Matching nothing: reading the pattern as a file says so.
        files.push(pattern.to_owned());
    }
}
