//! The config search behind `recommend`: every candidate of the space
//! ([`crate::advise::space`]) replayed in parallel, ranked
//! ([`RunFigures::rank`]), and the smallest capacity at which the winner
//! still runs.
//!
//! The search does not know how a run happens: the caller passes `run(settings,
//! capacity)`, so the same code drives the simulated card, a probe or a GPU.

use crate::advise::space::Candidate;
use crate::allocator::sizes::{get_allocation_size, round_size};
use crate::conf::{MIB, Settings};
use crate::workload::RunFigures;
use rayon::prelude::*;
use serde::Serialize;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};

/// Where the search is, for a progress bar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// `done` of `total` candidates replayed.
    Candidates { done: usize, total: usize },
    /// One more bisection step for the smallest capacity.
    Bisect { step: usize },
}

/// A ranked search.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchResult {
    /// Candidates with their runs, best first: the runs that finished (to
    /// their end or their OOM) ranked exactly, then those stopped early
    /// ([`RunFigures::stopped_early_at_event`]), which rank below the best
    /// finished run whatever their end would have been.
    pub ranked: Vec<(Candidate, RunFigures)>,
    /// The smallest capacity (to `resolution` bytes) at which the best
    /// candidate still runs; `None` when every candidate ran out of memory.
    pub min_capacity_bytes: Option<u64>,
    /// What the search replayed and what it spared.
    pub pruning: Pruning,
}

/// How the search spent its replays (`recommend --format json`, `search`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Pruning {
    /// Configs in the space.
    pub configs: usize,
    /// Replays at the search's capacity; configs that provably behave alike share one.
    pub replays: usize,
    /// Configs whose replay ran to its end or its OOM.
    pub configs_finished: usize,
    /// Configs whose replay stopped once its reserved peak passed the best
    /// finished config's (they cannot rank above it).
    pub configs_stopped_early: usize,
    /// Replays of the capacity bisection (the winner's own run serves as its first step).
    pub bisection_replays: usize,
}

/// Bisection stops when the bracket is this narrow.
pub const CAPACITY_RESOLUTION: u64 = MIB;

/// The candidate `c` behaves exactly like: `max_split_size_mb` is dropped when
/// no segment the trace can create reaches it. Without expandable segments a
/// block is never larger than its segment, and every check on the threshold
/// (`get_free_block`, `should_split`, `release_available_cached_blocks`, the
/// oversize stats) compares a block or request against it, so a threshold
/// above the largest segment changes nothing. `request_sizes` are the trace's
/// distinct request sizes (`None` when unknown, e.g. a snapshot's start state).
fn equivalent(c: &Candidate, base: &Settings, request_sizes: Option<&[u64]>) -> Candidate {
    let mut key = c.clone();
    if let (false, Some(mb), Some(sizes)) =
        (c.expandable_segments, c.max_split_size_mb, request_sizes)
    {
        let s = c.settings(base);
        let largest = sizes
            .iter()
            .map(|&r| get_allocation_size(round_size(r, &s), &s))
            .max()
            .unwrap_or(0);
        if largest < mb * MIB {
            key.max_split_size_mb = None;
        }
    }
    key
}

/// `garbage_collect_cached_blocks` returns at once while the reserved total is
/// at most `threshold × allowed_memory_maximum`; a run whose reserved bytes
/// never exceed that is the run without the collector.
fn gc_never_runs(peak_reserved: u64, threshold: f64, base: &Settings, capacity: u64) -> bool {
    let Some(fraction) = base.per_process_memory_fraction else {
        return true; // PyTorch collects only with a memory fraction set
    };
    let allowed = (fraction * capacity as f64) as u64;
    peak_reserved <= (threshold * allowed as f64) as u64
}

/// How many candidates of a phase run before the rest, unbounded by each
/// other: the simplest expandable-segments ones, which usually set the bound.
const FIRST_WAVE: usize = 2;

/// Replays every candidate at `capacity` in parallel, ranks them, and (when
/// `bisect`) bisects the winner's smallest capacity. `run(settings, capacity,
/// stop_above)` must be deterministic and may stop once reserved memory passes
/// `stop_above`; `progress` is called from worker threads.
///
/// Candidates that provably behave alike share one replay: a
/// `max_split_size_mb` above every segment of the trace ([`equivalent`]), and a
/// `garbage_collection_threshold` the run without it never reaches. Replays
/// are bounded by the lowest peak reserved of a run that finished without an
/// OOM: a run whose reserved memory passes it ranks below that run, so it
/// stops there. The simplest expandable-segments candidates run first, as
/// they usually set the lowest bound; the result does not depend on the order.
pub fn search<R, P>(
    candidates: Vec<Candidate>,
    base: &Settings,
    capacity: u64,
    request_sizes: Option<&[u64]>,
    (run, bisect): (R, bool),
    progress: P,
) -> SearchResult
where
    R: Fn(&Settings, u64, Option<u64>) -> RunFigures + Sync,
    P: Fn(Progress) + Sync,
{
    let done = AtomicUsize::new(0);
    let replay_one = |k: Candidate, total: usize, bound: Option<u64>| -> (Candidate, RunFigures) {
        // The base config (the one in use) always runs in full: it is reported beside the winner.
        let settings = k.settings(base);
        let bound = bound.filter(|_| settings != *base);
        let out = run(&settings, capacity, bound);
        let n = done.fetch_add(1, AtomicOrdering::Relaxed) + 1;
        progress(Progress::Candidates { done: n, total });
        (k, out)
    };
    // The lowest peak reserved of the finished runs without an OOM.
    let bound_of = |runs: &[(Candidate, RunFigures)]| {
        runs.iter()
            .filter(|(_, o)| o.oom.is_none() && o.stopped_early_at_event.is_none())
            .map(|(_, o)| o.peak_reserved_bytes)
            .min()
    };
    // The bound is fixed per wave, from runs already finished, so which runs
    // stop (and where) never depends on thread timing: the output is the same
    // on every run and every machine.
    let replay_all = |mut keys: Vec<Candidate>,
                      total: usize,
                      earlier: &[(Candidate, RunFigures)]|
     -> Vec<(Candidate, RunFigures)> {
        // A first wave of a fixed size (not the thread count, so that every
        // machine gives the same output) sets the bound for the rest.
        let rest = keys.split_off(keys.len().min(FIRST_WAVE));
        let bound = bound_of(earlier);
        let mut runs: Vec<_> = keys
            .into_par_iter()
            .map(|k| replay_one(k, total, bound))
            .collect();
        let bound = bound_of(&runs).into_iter().chain(bound).min();
        runs.extend(
            rest.into_par_iter()
                .map(|k| replay_one(k, total, bound))
                .collect::<Vec<_>>(),
        );
        runs
    };
    let keys: Vec<Candidate> = candidates
        .iter()
        .map(|c| equivalent(c, base, request_sizes))
        .collect();
    // Phase 1: the distinct candidates without a collector threshold.
    let mut first: Vec<Candidate> = Vec::new();
    for k in &keys {
        let plain = Candidate {
            garbage_collection_threshold: None,
            ..k.clone()
        };
        if !first.contains(&plain) {
            first.push(plain);
        }
    }
    first.sort_by_key(|k| (!k.expandable_segments, k.keys()));
    let estimate = first.len()
        + keys
            .iter()
            .filter(|k| k.garbage_collection_threshold.is_some())
            .count();
    let mut runs = replay_all(first, estimate, &[]);
    // Phase 2: thresholds that the plain run reaches need their own replay
    // (and those whose plain run stopped early: it might have reached them).
    let mut second: Vec<Candidate> = Vec::new();
    for k in &keys {
        let Some(t) = k.garbage_collection_threshold else {
            continue;
        };
        let plain = Candidate {
            garbage_collection_threshold: None,
            ..k.clone()
        };
        let reached = runs
            .iter()
            .find(|(c, _)| *c == plain)
            .is_some_and(|(_, o)| {
                o.stopped_early_at_event.is_some()
                    || !gc_never_runs(o.peak_reserved_bytes, t, base, capacity)
            });
        if reached && !second.contains(k) {
            second.push(k.clone());
        }
    }
    let total = runs.len() + second.len();
    runs.extend(replay_all(second, total, &runs));
    let result_of = |k: &Candidate| -> Option<RunFigures> {
        let plain = Candidate {
            garbage_collection_threshold: None,
            ..k.clone()
        };
        runs.iter()
            .find(|(c, _)| c == k)
            .or_else(|| runs.iter().find(|(c, _)| *c == plain))
            .map(|(_, o)| o.clone())
    };
    let mut ranked: Vec<(Candidate, RunFigures)> = candidates
        .into_iter()
        .zip(&keys)
        .filter_map(|(c, k)| result_of(k).map(|o| (c, o)))
        .collect();
    // Stopped runs last; stable on ties: the candidate with fewer keys set wins (less to explain).
    ranked.sort_by(|a, b| {
        let stopped = |r: &RunFigures| r.stopped_early_at_event.is_some();
        stopped(&a.1)
            .cmp(&stopped(&b.1))
            .then(a.1.rank(&b.1))
            .then(a.0.keys().cmp(&b.0.keys()))
    });
    let stopped = ranked
        .iter()
        .filter(|(_, r)| r.stopped_early_at_event.is_some())
        .count();
    let mut pruning = Pruning {
        configs: ranked.len(),
        replays: runs.len(),
        configs_finished: ranked.len() - stopped,
        configs_stopped_early: stopped,
        bisection_replays: 0,
    };
    let min_capacity_bytes = match ranked.first() {
        Some((best, out)) if bisect && out.oom.is_none() => {
            let settings = best.settings(base);
            let bisected = AtomicUsize::new(0);
            let at = |cap| {
                bisected.fetch_add(1, AtomicOrdering::Relaxed);
                run(&settings, cap, None)
            };
            // Only a memory fraction makes the run depend on the capacity
            // beyond whether each cudaMalloc fits (the collector's limit).
            let reuse = base.per_process_memory_fraction.is_none();
            let min = min_capacity(out, capacity, reuse, at, &progress);
            pruning.bisection_replays = bisected.into_inner();
            Some(min)
        }
        _ => None,
    };
    SearchResult {
        ranked,
        min_capacity_bytes,
        pruning,
    }
}

/// The smallest capacity (to [`CAPACITY_RESOLUTION`]) at which `run` has no
/// OOM, between the peak allocated bytes (nothing smaller can hold the live
/// tensors) and the peak reserved bytes of the run at `capacity` (which
/// reproduces that run exactly). Returns `capacity` when even that OOMs.
/// With `reuse`, the run at `capacity` (no OOM) stands for the run at its
/// peak reserved: every cudaMalloc it made fits there too, and nothing else
/// in the run depends on the capacity.
pub fn min_capacity(
    at_capacity: &RunFigures,
    capacity: u64,
    reuse: bool,
    run: impl Fn(u64) -> RunFigures,
    progress: &impl Fn(Progress),
) -> u64 {
    let mut hi = at_capacity.peak_reserved_bytes.min(capacity).max(1);
    let mut lo = at_capacity.peak_allocated_bytes.min(hi);
    let known = reuse && at_capacity.oom.is_none() && hi == at_capacity.peak_reserved_bytes;
    if !known && run(hi).oom.is_some() {
        return capacity;
    }
    let mut step = 0;
    while hi - lo > CAPACITY_RESOLUTION {
        let mid = lo + (hi - lo) / 2;
        step += 1;
        progress(Progress::Bisect { step });
        if run(mid).oom.is_none() {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::advise::space::all as space;
    use crate::workload::OomEvent;

    /// Thresholds above every segment of the trace, and collector thresholds
    /// the run never reaches, share a replay; everything is still ranked.
    #[test]
    fn provably_equal_candidates_share_a_replay() {
        use std::sync::atomic::AtomicUsize;
        let base = Settings {
            per_process_memory_fraction: Some(0.9),
            ..Settings::default()
        };
        // Largest request 40 MiB: segments up to 40 MiB, so 64..1024 act as unset.
        let sizes = [4 << 10, 3 * MIB, 40 * MIB];
        let count = |cap: u64| {
            // Replays at the search's capacity (the bisection's come on top).
            let replays = AtomicUsize::new(0);
            let run = |_: &Settings, c: u64, _: Option<u64>| {
                if c == cap {
                    replays.fetch_add(1, AtomicOrdering::Relaxed);
                }
                RunFigures {
                    peak_reserved_bytes: 100 * MIB,
                    ..RunFigures::default()
                }
            };
            let r = search(space(true), &base, cap, Some(&sizes), (run, true), |_| {});
            assert_eq!(r.ranked.len(), 280, "every candidate is ranked");
            replays.load(AtomicOrdering::Relaxed)
        };
        // Without ES: splits {unset, 32} × 5 divisions; with ES: 7 × 5; no GC reached.
        assert_eq!(count(8 << 30), 2 * 5 + 7 * 5);
        // allowed = 0.9 × 150 MiB = 135 MiB: 0.6 (81 MiB) is reached, 0.8 and 0.95 are not.
        assert_eq!(count(150 * MIB), 2 * (2 * 5 + 7 * 5));
    }

    /// A fake workload whose need depends on the settings: the search must
    /// pick the one that fits and bisect its threshold to the resolution.
    #[test]
    fn search_picks_the_fitting_candidate_and_bisects() {
        let need = |s: &Settings| {
            if s.expandable_segments {
                700 * MIB
            } else if s.max_split_size == 128 * MIB {
                800 * MIB
            } else {
                1000 * MIB
            }
        };
        let run = |s: &Settings, cap: u64, _: Option<u64>| RunFigures {
            oom: (need(s) > cap).then(|| OomEvent {
                event_index: 3,
                requested_bytes: 0,
                message: String::new(),
            }),
            peak_reserved_bytes: need(s).min(cap),
            peak_allocated_bytes: 600 * MIB,
            ..RunFigures::default()
        };
        let r = search(
            space(false),
            &Settings::default(),
            900 * MIB,
            None,
            (run, true),
            |_| {},
        );
        let (best, score) = &r.ranked[0];
        assert!(best.expandable_segments && best.keys() == 1, "{best:?}");
        assert_eq!(score.peak_reserved_bytes, 700 * MIB);
        let min = r.min_capacity_bytes.expect("winner runs");
        assert!(
            min >= 700 * MIB && min - 700 * MIB <= CAPACITY_RESOLUTION,
            "{min}"
        );
        let r = search(
            space(false),
            &Settings::default(),
            600 * MIB,
            None,
            (run, true),
            |_| {},
        );
        assert_eq!(r.min_capacity_bytes, None, "everything OOMs");
    }

    /// A small trace of training-like steps: activations of step-dependent
    /// sizes, temporaries, a slowly growing set of long-lived tensors.
    fn step_trace(seed: u64, steps: u32) -> crate::workload::Trace {
        use crate::workload::{Event, Trace};
        let mut x = seed | 1;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let (mut events, mut id) = (Vec::new(), 0u32);
        let mut alloc = |events: &mut Vec<Event>, size: u64| {
            events.push(Event::Alloc {
                id,
                size,
                stream: 0,
            });
            id += 1;
            id - 1
        };
        for step in 0..steps {
            let len = 1 + next() % 8;
            let acts: Vec<u32> = (0..6)
                .map(|_| alloc(&mut events, len * (1 + next() % 4) * 3 * MIB / 2))
                .collect();
            let temps: Vec<u32> = (0..8)
                .map(|_| alloc(&mut events, 1 + next() % (2 * MIB)))
                .collect();
            for id in acts[2..].iter().rev().chain(&temps).chain(&acts[..2]) {
                events.push(Event::Free { id: *id });
            }
            if step % 7 == 0 {
                alloc(&mut events, len * 5 * MIB);
            }
        }
        Trace::from_events(events).expect("ids stay live")
    }

    /// Bounded replays change nothing a user reads: the same recommendation,
    /// the same smallest capacity, the finished runs in the unbounded order
    /// with the same figures, and every stopped config ranked below the winner
    /// by the unbounded search too.
    #[test]
    fn pruned_search_agrees_with_the_unpruned_one() {
        use crate::device::sim::SimDevice;
        use crate::workload::{ReplayOptions, replay_with};
        let mut stopped_somewhere = 0;
        for (seed, base) in [
            (1, Settings::default()),
            (7, Settings::default()),
            (
                42,
                Settings {
                    per_process_memory_fraction: Some(0.8),
                    ..Settings::default()
                },
            ),
        ] {
            let trace = step_trace(seed, 40);
            let sizes = crate::trial::workload::distinct_request_sizes(&trace);
            for capacity in [8 << 30, 400 * MIB, 150 * MIB] {
                let replay = |s: &Settings, cap: u64, stop: Option<u64>| {
                    let options = ReplayOptions {
                        stop_above_reserved: stop,
                        ..ReplayOptions::default()
                    };
                    replay_with(&trace, s, SimDevice::new(cap), options).figures
                };
                let with_gc = base.per_process_memory_fraction.is_some();
                let pruned = search(
                    space(with_gc),
                    &base,
                    capacity,
                    Some(&sizes),
                    (replay, true),
                    |_| {},
                );
                let full = search(
                    space(with_gc),
                    &base,
                    capacity,
                    Some(&sizes),
                    (|s: &Settings, cap, _| replay(s, cap, None), true),
                    |_| {},
                );
                assert_eq!(full.pruning.configs_stopped_early, 0);
                assert_eq!(pruned.min_capacity_bytes, full.min_capacity_bytes);
                assert_eq!(
                    pruned.ranked[0], full.ranked[0],
                    "seed {seed} at {capacity}"
                );
                let finished: Vec<_> = pruned
                    .ranked
                    .iter()
                    .filter(|(_, r)| r.stopped_early_at_event.is_none())
                    .collect();
                let full_order: Vec<_> = full
                    .ranked
                    .iter()
                    .filter(|(c, _)| finished.iter().any(|(f, _)| f == c))
                    .collect();
                assert_eq!(finished.len(), pruned.pruning.configs_finished);
                assert_eq!(finished, full_order, "seed {seed} at {capacity}");
                for (c, r) in &pruned.ranked[pruned.pruning.configs_finished..] {
                    let at = full
                        .ranked
                        .iter()
                        .position(|(f, _)| f == c)
                        .expect("ranked");
                    assert!(at > 0, "{c:?} stopped at {r:?} but wins unbounded");
                }
                stopped_somewhere += pruned.pruning.configs_stopped_early;
            }
        }
        assert!(
            stopped_somewhere > 0,
            "the bound stopped no run: the test checks nothing"
        );
    }
}
