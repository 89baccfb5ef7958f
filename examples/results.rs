//! The results table of docs/RESULTS.md: each probe family at capacities where
//! PyTorch's default config runs out of memory, under the default, PyTorch's
//! own hint (expandable_segments:True), max_split_size_mb:128/256/512, and the
//! config `recommend` picks.
//!
//!     cargo run --release --example results                       # the Markdown table
//!     cargo run --release --example results -- --write-traces DIR # also one trace CSV per family
//!
//! Deterministic: the same build prints the same table.

use allocdoc::advise::search::{self, Scored};
use allocdoc::app::recommend::recommend;
use allocdoc::app::validate::{RunSummary, Source, Workload, replay};
use allocdoc::conf::Settings;
use allocdoc::units::human;
use allocdoc::workload::Event;
use allocdoc::workload::probe::{Family, Params, epochs, generate, trace};
use std::fmt::Write;

/// Steps per epoch and tensor size per family, chosen so one epoch holds a few GiB.
fn params(family: Family) -> Params {
    let (steps, unit) = match family {
        Family::VariableLength => (400, 6 << 20),
        Family::GrowingKvCache => (160, 7 << 20),
        Family::DynamicBatch => (600, 5 << 20),
        Family::MixedSmallLarge => (300, 9 << 20),
        Family::InterleavedLongLived => (200, 13 << 20),
    };
    Params {
        steps,
        unit,
        seed: 42,
    }
}

const COMPARED: [&str; 5] = [
    "",
    "expandable_segments:True",
    "max_split_size_mb:128",
    "max_split_size_mb:256",
    "max_split_size_mb:512",
];

fn cell(r: &RunSummary) -> String {
    match &r.oom {
        Some(o) => format!("OOM @ {}", o.event_index),
        None => format!("ok, {}", human(r.peak_reserved_bytes)),
    }
}

fn settings(conf: &str) -> Settings {
    allocdoc::conf::parse(conf, allocdoc::conf::TorchVersion::DEFAULT)
        .expect("valid config")
        .settings
}

fn write_csv(path: &std::path::Path, events: &[Event], capacity: u64) -> std::io::Result<()> {
    let mut s = format!("# capacity: {capacity}\naction,id,size,stream\n");
    for e in events {
        let _ = match *e {
            Event::Alloc { id, size, stream } => writeln!(s, "alloc,{id},{size},{stream}"),
            Event::Free { id } => writeln!(s, "free,{id},,0"),
            Event::EmptyCache => writeln!(s, "empty_cache,,,"),
            // The probe families make neither.
            Event::RecordStream { .. } | Event::SynchronizeStream { .. } => Ok(()),
        };
    }
    std::fs::write(path, s)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let traces_dir = args
        .iter()
        .position(|a| a == "--write-traces")
        .and_then(|i| args.get(i + 1))
        .map(std::path::PathBuf::from);
    let mut out = String::from(
        "| trace family | events | capacity | default | expandable_segments:True | max_split_size_mb:128 | max_split_size_mb:256 | max_split_size_mb:512 | ours (recommend) |\n|---|---:|---:|---|---|---|---|---|---|\n",
    );
    let defaults = Settings::default();
    for family in Family::ALL {
        let ops = epochs(&generate(family, &params(family)), 3);
        let trace = trace(ops.clone());
        // Capacities where the default config runs out of memory: just under the
        // smallest card it fits on, and halfway from there down to what the
        // tensors alone need (peak allocated).
        let free = replay(&trace, &defaults, "", allocdoc::device::NO_LIMIT);
        let default_min = search::min_capacity(
            &free.score(),
            allocdoc::device::NO_LIMIT,
            |cap| replay(&trace, &defaults, "", cap).score(),
            &|_| {},
        );
        let lo = free.peak_allocated_bytes;
        let just_under = default_min.saturating_sub(search::CAPACITY_RESOLUTION);
        for (tag, capacity) in [("under", just_under), ("half", lo + (default_min - lo) / 2)] {
            let runs: Vec<RunSummary> = COMPARED
                .iter()
                .map(|c| replay(&trace, &settings(c), c, capacity))
                .collect();
            let workload = Workload {
                input: family.name().to_string(),
                source: Source::Trace(trace.clone()),
                implied_capacity: Some(capacity),
                probe: None,
                advice: None,
            };
            let r = recommend(&workload, Some(capacity), "", &defaults, &|_| {})
                .expect("a trace replays");
            let ours = match (&r.recommendation, r.candidates.first()) {
                (Some(rec), Some(best)) => format!("`{}`: {}", rec.value, cell(best)),
                _ => "every config OOMs".to_string(),
            };
            let _ = write!(
                out,
                "| {} | {} | {} |",
                family.name(),
                ops.len(),
                human(capacity)
            );
            for run in &runs {
                let _ = write!(out, " {} |", cell(run));
            }
            let _ = writeln!(out, " {ours} |");
            // One trace per family (just under the default's need) for the GPU script.
            if let (Some(dir), "under") = (&traces_dir, tag) {
                let path = dir.join(format!("{}.csv", family.name().replace(' ', "-")));
                if let Err(e) = write_csv(&path, &ops, capacity) {
                    eprintln!("results: {}: {e}", path.display());
                    std::process::exit(2);
                }
            }
        }
    }
    print!("{out}");
}
