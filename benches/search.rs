//! The config search of `recommend` over a 1 M-event trace: every candidate of
//! the space with garbage-collection thresholds (280 configs), and the first
//! 100 of them, replayed in parallel (rayon) on the simulated card.
//!
//!     cargo bench --features bench --bench search
//!
//! One sample each: a single search is seconds long, which is the figure
//! BENCHMARKS.md ("## Config search") reports.

use allocdoc::advise::space::all as space;
use allocdoc::conf::{MIB, Settings};
use allocdoc::trial::run::replay_bounded;
use allocdoc::trial::search;
use allocdoc::trial::workload::distinct_request_sizes;
use allocdoc::workload::Trace;
use allocdoc::workload::probe::{self, Family, Params, epochs, generate};
use std::sync::OnceLock;

fn main() {
    divan::main();
}

/// About 1 M events: a dynamic-batch epoch of 2 000 steps (10 000 events) × 100.
fn trace() -> &'static Trace {
    static TRACE: OnceLock<Trace> = OnceLock::new();
    TRACE.get_or_init(|| {
        let epoch = generate(Family::DynamicBatch, &Params::new(2_000, 3 * MIB, 1));
        let ops = epochs(&epoch, 100);
        assert!(ops.len() >= 1_000_000, "{} events", ops.len());
        probe::trace(ops)
    })
}

/// `configs` candidates of the space (with garbage-collection thresholds) at
/// `capacity`, memory fraction 0.9; returns how many were ranked.
fn run_search(configs: usize, capacity: u64) -> usize {
    let trace = trace();
    // A memory fraction makes garbage_collection_threshold part of the space.
    let base = Settings {
        per_process_memory_fraction: Some(0.9),
        ..Settings::default()
    };
    let candidates: Vec<_> = space(true).into_iter().take(configs).collect();
    let sizes = distinct_request_sizes(trace);
    let r = search::search(
        candidates,
        &base,
        capacity,
        Some(&sizes),
        (
            |s: &Settings, cap, stop| replay_bounded(trace, s, "", cap, stop).figures,
            true,
        ),
        |_| {},
    );
    r.ranked.len()
}

/// A card far larger than the trace needs: no collector threshold is reached.
#[divan::bench(sample_count = 1, sample_size = 1)]
fn search_100_configs_1m_events_64gib() -> usize {
    run_search(100, 64 << 30)
}

/// A tight card (the default config peaks at 3.6 GiB reserved): thresholds
/// are reached, OOMs cut runs short.
#[divan::bench(sample_count = 1, sample_size = 1)]
fn search_100_configs_1m_events_4gib() -> usize {
    run_search(100, 4 << 30)
}

#[divan::bench(sample_count = 1, sample_size = 1)]
fn search_280_configs_1m_events_64gib() -> usize {
    run_search(usize::MAX, 64 << 30)
}
