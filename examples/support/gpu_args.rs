//! The GPU examples' command line: `--device N` and `--out FILE`, and the
//! JSON results file they write (bench/gpu/run.sh runs them).

/// The value after `--name`, if given.
pub fn flag(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

/// `--device N`, default 0.
pub fn ordinal() -> i32 {
    flag("--device").and_then(|d| d.parse().ok()).unwrap_or(0)
}

/// Writes `value` to `--out` when given; exit 2 naming the file when the
/// write fails.
pub fn write_out(example: &str, value: &serde_json::Value) -> std::process::ExitCode {
    if let Some(path) = flag("--out")
        && let Err(e) = std::fs::write(
            &path,
            serde_json::to_string_pretty(value).unwrap_or_default(),
        )
    {
        eprintln!("{example}: {path}: {e}");
        return std::process::ExitCode::from(2);
    }
    std::process::ExitCode::SUCCESS
}
