//! The README's console examples are what the binary prints: every line a
//! block shows (a `...` line stands for lines cut, a line ending in `…` for
//! its own end cut) appears in the command's output, in order, and the first
//! shown line is the output's first line.

use std::process::Command;

/// `$ allocdoc ARGS` blocks of README.md: (args, shown lines).
fn examples(readme: &str) -> Vec<(Vec<String>, Vec<String>)> {
    let mut out = Vec::new();
    let mut lines = readme.lines();
    while let Some(l) = lines.next() {
        if l.trim() != "```console" {
            continue;
        }
        let Some(cmd) = lines.next().and_then(|c| c.strip_prefix("$ allocdoc ")) else {
            continue;
        };
        let shown: Vec<String> = lines
            .by_ref()
            .take_while(|l| l.trim() != "```")
            .map(str::to_string)
            .collect();
        out.push((words(cmd), shown));
    }
    out
}

/// A command line split as a POSIX shell would split these (single quotes only).
fn words(cmd: &str) -> Vec<String> {
    let mut v = Vec::new();
    let mut cur = String::new();
    let (mut quoted, mut any) = (false, false);
    for c in cmd.chars() {
        match c {
            '\'' => {
                quoted = !quoted;
                any = true;
            }
            ' ' if !quoted => {
                if any || !cur.is_empty() {
                    v.push(std::mem::take(&mut cur));
                }
                any = false;
            }
            c => cur.push(c),
        }
    }
    if any || !cur.is_empty() {
        v.push(cur);
    }
    v
}

#[test]
fn readme_console_examples_are_what_the_binary_prints() {
    let readme = std::fs::read_to_string("README.md").expect("README.md");
    let all = examples(&readme);
    assert!(all.len() >= 5, "only {} console examples", all.len());
    for (args, shown) in all {
        let out = Command::new(env!("CARGO_BIN_EXE_allocdoc"))
            .args(&args)
            .output()
            .expect("allocdoc runs");
        let printed = String::from_utf8_lossy(&out.stdout);
        let printed: Vec<&str> = printed.lines().map(str::trim_end).collect();
        let shown: Vec<&str> = shown.iter().map(|l| l.trim_end()).collect();
        assert_eq!(
            printed.first(),
            shown.first(),
            "allocdoc {}: first line",
            args.join(" ")
        );
        let mut at = 0;
        for line in shown.iter().filter(|l| l.trim() != "..." && !l.is_empty()) {
            let same = |p: &&str| match line.strip_suffix('…') {
                Some(head) => p.starts_with(head),
                None => p == line,
            };
            match printed[at..].iter().position(same) {
                Some(i) => at += i + 1,
                None => panic!(
                    "allocdoc {}: the README shows a line the binary does not print (in that order):\n{line}\n--- printed:\n{}",
                    args.join(" "),
                    printed.join("\n")
                ),
            }
        }
    }
}
