//! Batch runs and command-line conventions: `--each` (expansion order, one
//! result per file, stable under any number of threads), `--format jsonl`,
//! `completions`, the `--report` note, one name for standard input,
//! `--platform`.

use allocdoc::app::each::expand;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn allocdoc(args: &[&str], threads: Option<usize>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_allocdoc"));
    cmd.args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::null());
    if let Some(n) = threads {
        cmd.env("RAYON_NUM_THREADS", n.to_string());
    }
    cmd.output().expect("run allocdoc")
}

fn json_lines(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect()
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// logs/a.log, logs/b/c.log, logs/b.log, logs/.hidden/x.log, logs/.y.log, and
/// outside it top.log: the walk's order is a.log, b/c.log, b.log.
fn tree() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("logs");
    let oom = std::fs::read_to_string("fixtures/text/readme_example.log").unwrap();
    write(&root.join("a.log"), &oom);
    write(&root.join("b/c.log"), "nothing to see\n");
    write(&root.join("b.log"), &oom);
    write(&root.join(".hidden/x.log"), &oom);
    write(&root.join(".y.log"), &oom);
    write(&dir.path().join("top.log"), &oom);
    dir
}

#[test]
fn inputs_expand_in_the_documented_order() {
    let dir = tree();
    let root = dir.path().join("logs");
    let r = root.display().to_string();
    let pattern = dir.path().join("*.log").display().to_string();
    let files = expand(&[
        r.clone(),
        pattern,
        "-".into(),
        "no-such-*.log".into(),
        "given.log".into(),
    ]);
    let top = dir.path().join("top.log").display().to_string();
    assert_eq!(
        files,
        [
            format!("{r}/a.log"),
            format!("{r}/b/c.log"),
            format!("{r}/b.log"),
            top,
            "-".into(),
            // Matching nothing: kept, so reading it says so.
            "no-such-*.log".into(),
            "given.log".into(),
        ]
    );
    assert_eq!(expand(&[]), ["-"]);
}

#[cfg(unix)]
#[test]
fn links_to_directories_are_not_followed() {
    let dir = tree();
    let root = dir.path().join("logs");
    std::os::unix::fs::symlink(&root, root.join("loop")).unwrap();
    std::os::unix::fs::symlink(root.join("a.log"), root.join("link.log")).unwrap();
    let r = root.display().to_string();
    assert_eq!(
        expand(std::slice::from_ref(&r)),
        [
            format!("{r}/a.log"),
            format!("{r}/b/c.log"),
            format!("{r}/b.log"),
            format!("{r}/link.log"),
        ]
    );
}

#[test]
fn each_gives_one_line_per_file_in_order_whatever_the_threads() {
    let dir = tree();
    let root = dir.path().join("logs").display().to_string();
    let missing = dir.path().join("missing.log").display().to_string();
    let args = ["diagnose", "--each", "--format", "jsonl", &root, &missing];
    let one = allocdoc(&args, Some(1));
    // One input could not be read: exit 2, and every other line is there.
    assert_eq!(one.status.code(), Some(2));
    for threads in [2, 8] {
        let many = allocdoc(&args, Some(threads));
        assert_eq!(many.stdout, one.stdout, "{threads} threads");
        assert_eq!(many.status.code(), Some(2));
    }
    let lines = json_lines(&one);
    let inputs: Vec<&str> = lines.iter().map(|l| l["input"].as_str().unwrap()).collect();
    assert_eq!(
        inputs,
        [
            format!("{root}/a.log"),
            format!("{root}/b/c.log"),
            format!("{root}/b.log"),
            missing.clone(),
        ]
    );
    assert_eq!(lines[0]["cause"], "fragmentation");
    assert_eq!(lines[1]["cause"], "unknown");
    assert_eq!(lines[3]["error"]["kind"], "input");
    assert!(
        lines[3]["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with(&format!("cannot read '{missing}'"))
    );
    let stderr = String::from_utf8_lossy(&one.stderr);
    assert!(stderr.contains("allocdoc: error: cannot read"), "{stderr}");
}

#[test]
fn each_result_is_the_single_file_document_with_its_name() {
    for command in ["diagnose", "parse"] {
        let inputs = [
            "fixtures/text/readme_example.log",
            "fixtures/snapshots/gen-small-p2.pickle",
            "fixtures/text/constructed_nccl_failure_2.log",
        ];
        let mut args = vec![command, "--each", "--format", "jsonl"];
        args.extend(inputs);
        let lines = json_lines(&allocdoc(&args, None));
        assert_eq!(lines.len(), inputs.len());
        for (line, input) in lines.into_iter().zip(inputs) {
            let single = allocdoc(&[command, "--format", "json", input], None);
            let mut want: Value = serde_json::from_slice(&single.stdout).unwrap();
            want.as_object_mut()
                .unwrap()
                .insert("input".into(), input.into());
            assert_eq!(line, want, "{command} {input}");
        }
        // --format json: the same documents under `results`.
        let mut args = vec![command, "--each", "--format", "json"];
        args.extend(inputs);
        let all: Value = serde_json::from_slice(&allocdoc(&args, None).stdout).unwrap();
        assert_eq!(all["schema_version"], 1);
        let mut args = vec![command, "--each", "--format", "jsonl"];
        args.extend(inputs);
        assert_eq!(
            all["results"],
            Value::Array(json_lines(&allocdoc(&args, None)))
        );
    }
}

#[test]
fn each_in_text_names_every_file() {
    let out = allocdoc(
        &[
            "diagnose",
            "--each",
            "fixtures/text/readme_example.log",
            "fixtures/text/constructed_xpu.log",
        ],
        None,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let a = text.find("== fixtures/text/readme_example.log ==").unwrap();
    let b = text
        .find("== fixtures/text/constructed_xpu.log ==")
        .unwrap();
    assert!(a < b && text[a..b].contains("fragmentation"), "{text}");
}

#[test]
fn jsonl_without_each_is_the_document_on_one_line() {
    for args in [
        &["diagnose", "fixtures/text/readme_example.log"][..],
        &["conf", "check", "max_split_size_mb:20"],
        &["rules", "list"],
    ] {
        let json = allocdoc(&[args, &["--format", "json"]].concat(), None);
        let jsonl = allocdoc(&[args, &["--format", "jsonl"]].concat(), None);
        let text = String::from_utf8(jsonl.stdout).unwrap();
        assert_eq!(text.lines().count(), 1, "{args:?}");
        assert!(text.starts_with("{\"schema_version\":1,"), "{text}");
        let a: Value = serde_json::from_slice(&json.stdout).unwrap();
        let b: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(a, b, "{args:?}");
    }
}

#[test]
fn completions_for_every_shell() {
    // Each shell spells a long flag its own way (fish: `-l each`).
    for (shell, marker, each) in [
        ("bash", "complete -F _allocdoc", "--each"),
        ("zsh", "#compdef allocdoc", "--each"),
        ("fish", "complete -c allocdoc", "-l each"),
        ("powershell", "Register-ArgumentCompleter", "--each"),
    ] {
        let out = allocdoc(&["completions", shell], None);
        assert_eq!(out.status.code(), Some(0), "{shell}");
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(script.contains(marker), "{shell}");
        assert!(
            script.contains("diagnose") && script.contains(each),
            "{shell}"
        );
    }
}

#[test]
fn the_report_file_is_named_on_standard_error() {
    let dir = tempfile::tempdir().unwrap();
    let html = dir.path().join("out.html");
    let html_arg = html.display().to_string();
    for args in [
        &["diagnose", "fixtures/text/readme_example.log"][..],
        &[
            "replay",
            "fixtures/validate/interleaved_16mib.csv",
            "--capacity",
            "80MiB",
        ],
        &[
            "validate",
            "fixtures/validate/interleaved_16mib.csv",
            "--conf",
            "expandable_segments:True",
            "--capacity",
            "80MiB",
        ],
        &[
            "recommend",
            "fixtures/validate/interleaved_16mib.csv",
            "--capacity",
            "80MiB",
        ],
    ] {
        let _ = std::fs::remove_file(&html);
        let out = allocdoc(&[args, &["--report", &html_arg]].concat(), None);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!("note: wrote the HTML report {html_arg}\n")),
            "{args:?}: {stderr}"
        );
        assert!(std::fs::read_to_string(&html).unwrap().contains("<html"));
    }
}

#[test]
fn standard_input_has_one_name() {
    let log = std::fs::File::open("fixtures/text/readme_example.log").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_allocdoc"))
        .args(["parse", "--format", "json"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(log)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["observations"][0]["input"], "standard input");
    let log = std::fs::File::open("fixtures/text/readme_example.log").unwrap();
    let text = Command::new(env!("CARGO_BIN_EXE_allocdoc"))
        .args(["diagnose", "-"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(log)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("Evidence: standard input:103:"), "{text}");
    // A directory on standard input cannot be read: the error names it the same way.
    let dir = std::fs::File::open("fixtures").unwrap();
    let err = Command::new(env!("CARGO_BIN_EXE_allocdoc"))
        .args(["parse"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&err.stderr);
    assert!(
        stderr.starts_with("allocdoc: error: standard input: cannot read: "),
        "{stderr}"
    );
}

/// `diagnose --format json INPUT EXTRA…`, parsed.
fn diagnose_json(input: &str, extra: &[&str]) -> Value {
    let args = [&["diagnose", "--format", "json", input][..], extra].concat();
    serde_json::from_slice(&allocdoc(&args, None).stdout).unwrap()
}

#[test]
fn the_platform_flag_rules_out_expandable_segments_on_windows() {
    let diagnose = |extra: &[&str]| diagnose_json("fixtures/text/readme_example.log", extra);
    let mut linux = diagnose(&["--platform", "linux"]);
    let mut assumed = diagnose(&[]);
    // The same answer; only where the platform came from differs.
    assert_eq!(linux["setup"]["platform"]["source"], "--platform");
    assert_eq!(assumed["setup"]["platform"]["certainty"], "assumed");
    linux["setup"]["platform"].take();
    assumed["setup"]["platform"].take();
    assert_eq!(linux, assumed);
    assert_eq!(linux["recommendation"]["value"], "expandable_segments:True");
    let windows = diagnose(&["--platform", "windows"]);
    let value = windows["recommendation"]["value"].as_str().unwrap();
    assert!(value.starts_with("max_split_size_mb:"), "{value}");
}

#[test]
fn the_platform_flag_overrides_what_the_text_suggests() {
    let platform = |extra: &[&str]| {
        diagnose_json("fixtures/text/issue_async_short_comfyui_4880.log", extra)["setup"]["platform"]
            .clone()
    };
    // Windows paths in the text say Windows; the flag wins.
    assert_eq!(platform(&[])["value"], "windows");
    assert_eq!(platform(&[])["certainty"], "inferred");
    let given = platform(&["--platform", "linux"]);
    assert_eq!(given["value"], "linux");
    assert_eq!(given["certainty"], "given");
}
