//! Running the binary from the checkout's root, as the command-line tests do.

use serde_json::Value;
use std::path::Path;
use std::process::Command;

/// (exit code, standard output, standard error) of `allocdoc ARGS`.
pub fn allocdoc(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_allocdoc"))
        .args(args)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")))
        .output()
        .expect("run allocdoc");
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
