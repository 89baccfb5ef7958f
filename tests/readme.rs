//! The README's console examples are what the binary prints, line for line:
//! a `...` line stands for lines cut (none or more), a line ending in `…` for
//! its own end cut; every other line, blank ones too, is the next line the
//! command prints. A block that does not end in `...` shows the output's end.

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
        let mut printed: Vec<&str> = printed.lines().map(str::trim_end).collect();
        while printed.last() == Some(&"") {
            printed.pop();
        }
        let shown: Vec<&str> = shown.iter().map(|l| l.trim_end()).collect();
        if let Err(line) = shows(&shown, &printed) {
            panic!(
                "allocdoc {}: the README shows a line the binary does not print there (cut lines need a `...` line):\n{line}\n--- printed:\n{}",
                args.join(" "),
                printed.join("\n")
            );
        }
    }
}

/// What [`shows`] answers for a block that stops before the output does.
const MORE: &str = "<the output goes on: end the block with a `...` line>";

/// Whether `shown` is `printed` with runs cut where it has `...` lines;
/// else the first shown line that does not match, where it should.
fn shows<'a>(shown: &[&'a str], printed: &[&str]) -> Result<(), &'a str> {
    let same = |line: &str, p: &str| match line.strip_suffix('…') {
        Some(head) => p.starts_with(head),
        None => p == line,
    };
    let runs: Vec<&[&str]> = shown.split(|l| l.trim() == "...").collect();
    let fits = |run: &[&str], at: usize| {
        printed
            .get(at..at + run.len())
            .is_some_and(|p| run.iter().zip(p).all(|(l, p)| same(l, p)))
    };
    let first_miss = |run: &[&'a str], at: usize| {
        run.iter()
            .enumerate()
            .find(|(k, l)| !printed.get(at + k).is_some_and(|p| same(l, p)))
            .map_or(MORE, |(_, l)| *l)
    };
    let (first, last) = (runs[0], runs[runs.len() - 1]);
    // The first run starts the output; with no `...`, it is the whole output.
    if !fits(first, 0) || (runs.len() == 1 && printed.len() != first.len()) {
        return Err(first_miss(first, 0));
    }
    let mut at = first.len();
    for run in runs.get(1..runs.len() - 1).unwrap_or_default() {
        match (at..=printed.len()).find(|&k| fits(run, k)) {
            Some(k) => at = k + run.len(),
            None => return Err(run.first().copied().unwrap_or("...")),
        }
    }
    // The last run ends the output (an empty one: the block ends in `...`).
    if runs.len() > 1 {
        let start = printed.len().checked_sub(last.len()).filter(|&s| s >= at);
        if !start.is_some_and(|s| fits(last, s)) {
            return Err(first_miss(last, start.unwrap_or(at)));
        }
    }
    Ok(())
}

#[test]
fn a_cut_must_be_marked() {
    let printed = ["verdict", "", "Evidence: x", "Setup: y", "", "Findings"];
    assert_eq!(
        shows(&["verdict", "", "Evidence: x", "", "Findings"], &printed),
        Err("")
    );
    assert_eq!(
        shows(&["verdict", "", "Evidence: x", "...", "Findings"], &printed),
        Ok(())
    );
    assert_eq!(
        shows(&["verdict", "", "Evid…", "Setup: y", "..."], &printed),
        Ok(())
    );
    assert_eq!(shows(&["verdict", "", "Evidence: x"], &printed), Err(MORE));
    assert_eq!(
        shows(&["verdict", "...", "Setup: y"], &printed),
        Err("Setup: y")
    );
    assert_eq!(shows(&["Findings", "..."], &printed), Err("Findings"));
    assert_eq!(shows(&printed, &printed), Ok(()));
}
