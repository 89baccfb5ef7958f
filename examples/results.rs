//! The results table of docs/RESULTS.md: each probe family at capacities where
//! PyTorch's default config runs out of memory, under the default, PyTorch's
//! own hint (expandable_segments:True), max_split_size_mb:128/256/512, and the
//! config `recommend` picks.
//!
//!     cargo run --release --example results                       # the Markdown tables
//!     cargo run --release --example results -- --write-traces DIR # also one trace CSV per family
//!     cargo run --release --example results -- --snapshots ../shared/snapshots # also every traced snapshot
//!
//! Deterministic: the same build prints the same table.

use allocdoc::conf::Settings;
use allocdoc::device::sim::Placement::FirstFit;
use allocdoc::trial::recommend::recommend;
use allocdoc::trial::run::Run;
use allocdoc::trial::search;
use allocdoc::trial::workload::{Loaded, Source, Workload};
use allocdoc::units::human;
use allocdoc::workload::Event;
use allocdoc::workload::probe::{Family, Params, epochs, generate, trace};
use std::fmt::Write;

/// The families of the published table, with steps per epoch and tensor
/// size chosen so one epoch holds a few GiB (the ensemble's later families
/// are evaluated by `examples/text_eval.rs`).
const FAMILIES: [(Family, u32, u64); 5] = [
    (Family::VariableLength, 400, 6 << 20),
    (Family::GrowingKvCache, 160, 7 << 20),
    (Family::DynamicBatch, 600, 5 << 20),
    (Family::MixedSmallLarge, 300, 9 << 20),
    (Family::InterleavedLongLived, 200, 13 << 20),
];

const COMPARED: [&str; 5] = [
    "",
    "expandable_segments:True",
    "max_split_size_mb:128",
    "max_split_size_mb:256",
    "max_split_size_mb:512",
];

fn cell(r: &Run) -> String {
    match &r.figures.oom {
        Some(o) => format!("OOM @ {}", o.event_index),
        None => format!("ok, {}", human(r.figures.peak_reserved_bytes)),
    }
}

fn settings(conf: &str) -> Settings {
    allocdoc::conf::parse(conf, allocdoc::conf::TorchVersion::DEFAULT)
        .expect("valid config")
        .settings
}

fn write_csv(path: &std::path::Path, events: &[Event], capacity: u64) -> std::io::Result<()> {
    let csv = allocdoc::workload::trace::to_csv(events);
    std::fs::write(path, format!("# capacity: {capacity}\n{csv}"))
}

/// The table rows for one workload, each config at each capacity. With
/// `where_default_fails`, the capacities are where the default config runs out
/// of memory (just under the smallest card it fits on, and halfway from there
/// down to what the tensors alone need); otherwise one row without a limit.
fn rows(out: &mut String, workload: &Workload, where_default_fails: bool) -> Vec<u64> {
    let defaults = Settings::default();
    workload
        .with_replayer(|replay| {
            let free = replay(&defaults, "", allocdoc::device::NO_LIMIT, None, FirstFit);
            let default_min = search::min_capacity(
                &free.figures,
                allocdoc::device::NO_LIMIT,
                defaults.per_process_memory_fraction.is_none(),
                |cap| replay(&defaults, "", cap, None, FirstFit).figures,
                &|_| {},
            );
            let lo = free.figures.peak_allocated_bytes.min(default_min);
            let under = default_min.saturating_sub(search::CAPACITY_RESOLUTION);
            let mut caps = if where_default_fails {
                vec![under, lo + (default_min - lo) / 2]
            } else {
                vec![allocdoc::device::NO_LIMIT]
            };
            caps.dedup();
            // Only capacities where the default really fails make a row of this kind.
            caps.retain(|&c| {
                !where_default_fails
                    || replay(&defaults, "", c, None, FirstFit)
                        .figures
                        .oom
                        .is_some()
            });
            let events = free.figures.events;
            for &capacity in &caps {
                let shown = if capacity == allocdoc::device::NO_LIMIT {
                    "no limit".to_string()
                } else {
                    human(capacity)
                };
                let _ = write!(out, "| {} | {events} | {shown} |", workload.input);
                for c in COMPARED {
                    let _ = write!(
                        out,
                        " {} |",
                        cell(&replay(&settings(c), c, capacity, None, FirstFit))
                    );
                }
                // A recorded trace: the space of PyTorch 2.6 on Linux, no rules.
                let setup = allocdoc::advise::Setup::of_flags(&Default::default());
                let space = allocdoc::advise::Space::for_setup(&setup, false);
                let search = allocdoc::trial::recommend::Search {
                    space: &space,
                    current_conf: "",
                    current: &defaults,
                    diagnosis: None,
                    bisect: true,
                };
                let r = recommend(
                    workload,
                    workload.capacity(Some(capacity)),
                    &search,
                    &|_| {},
                )
                .expect("the workload replays");
                let ours = match (&r.recommendation, r.candidates.first()) {
                    (Some(rec), Some(best)) => format!(
                        "{}: {} (runs from {})",
                        if rec.value.is_empty() {
                            "defaults".to_string()
                        } else {
                            format!("`{}`", rec.value)
                        },
                        cell(best),
                        r.min_capacity_bytes.map_or_else(|| "-".into(), human)
                    ),
                    _ => "every config OOMs".to_string(),
                };
                let _ = writeln!(out, " {ours} |");
            }
            caps
        })
        .expect("the workload replays")
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map(std::path::PathBuf::from)
    };
    let traces_dir = flag("--write-traces");
    let header = "| workload | events | capacity | default | expandable_segments:True | max_split_size_mb:128 | max_split_size_mb:256 | max_split_size_mb:512 | ours (recommend) |\n|---|---:|---:|---|---|---|---|---|---|\n";
    let mut out = format!("### Trace families (3 epochs each)\n\n{header}");
    for (family, steps, unit) in FAMILIES {
        let params = Params::new(steps, unit, 42);
        let events = epochs(&generate(family, &params), 3);
        let workload = Workload {
            input: family.name().to_string(),
            source: Source::Trace(trace(events.clone())),
            implied_capacity: None,
            ensemble: None,
            advice: None,
            recorded: None,
        };
        let caps = rows(&mut out, &workload, true);
        // One trace per family (just under the default's need) for the GPU script.
        if let (Some(dir), Some(&capacity)) = (&traces_dir, caps.first()) {
            let path = dir.join(format!("{}.csv", family.name().replace(' ', "-")));
            if let Err(e) = write_csv(&path, &events, capacity) {
                eprintln!("results: {}: {e}", path.display());
                std::process::exit(2);
            }
        }
    }
    if let Some(dir) = flag("--snapshots") {
        let _ = write!(
            out,
            "\n### Recorded snapshot traces ({}), replayed from their recorded start state\n\n{header}",
            dir.display()
        );
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
            .unwrap_or_default();
        names.sort();
        for path in names {
            let name = path.to_string_lossy().into_owned();
            // Snapshots without a trace are skipped: there is nothing to replay.
            let limits = allocdoc::Limits::default();
            if let Ok(Loaded::Ready(mut w)) =
                Workload::load(&name, None, &Settings::default(), None, &limits)
            {
                w.input = path
                    .file_name()
                    .map_or(name.clone(), |f| f.to_string_lossy().into_owned());
                rows(&mut out, &w, false);
            }
        }
    }
    print!("{out}");
}
