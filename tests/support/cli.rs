//! Running the binary from the checkout's root, as the command-line tests do.

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

/// What `allocdoc ARGS` did, run from the checkout's root.
pub fn output(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_allocdoc"))
        .args(args)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")))
        .output()
        .expect("run allocdoc")
}

/// (exit code, standard output, standard error) of `allocdoc ARGS`.
pub fn allocdoc(args: &[&str]) -> (i32, String, String) {
    let out = output(args);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// (exit code, the JSON printed) of `allocdoc ARGS`.
pub fn json(args: &[&str]) -> (i32, Value) {
    let (code, out, err) = allocdoc(args);
    let v = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out} {err}"));
    (code, v)
}

/// `csv` (a trace CSV) written to `path` and replayed on a card of
/// `capacity` under the defaults and `expandable_segments:True`: the JSON.
pub fn replay_csv(path: &Path, csv: &str, capacity: &str) -> Value {
    std::fs::write(path, csv).unwrap();
    let path = path.to_string_lossy();
    let (_, v) = json(&[
        "replay",
        &path,
        "--conf",
        "",
        "--conf",
        "expandable_segments:True",
        "--capacity",
        capacity,
        "--format",
        "json",
    ]);
    v
}

/// The config named `name` in a JSON answer's `configs` (`""` for the defaults).
pub fn conf<'v>(v: &'v Value, name: &str) -> &'v Value {
    v["configs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["conf"] == name)
        .unwrap_or_else(|| panic!("no config {name:?}: {v}"))
}
