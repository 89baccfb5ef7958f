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
    /// Candidates with their runs, best first.
    pub ranked: Vec<(Candidate, RunFigures)>,
    /// The smallest capacity (to `resolution` bytes) at which the best
    /// candidate still runs; `None` when every candidate ran out of memory.
    pub min_capacity_bytes: Option<u64>,
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

/// Replays every candidate at `capacity` in parallel, ranks them, and bisects
/// the winner's smallest capacity. `run(settings, capacity)` must be
/// deterministic; `progress` is called from worker threads.
///
/// Candidates that provably behave alike share one replay: a
/// `max_split_size_mb` above every segment of the trace ([`equivalent`]), and a
/// `garbage_collection_threshold` the run without it never reaches.
pub fn search<R, P>(
    candidates: Vec<Candidate>,
    base: &Settings,
    capacity: u64,
    request_sizes: Option<&[u64]>,
    run: R,
    progress: P,
) -> SearchResult
where
    R: Fn(&Settings, u64) -> RunFigures + Sync,
    P: Fn(Progress) + Sync,
{
    let done = AtomicUsize::new(0);
    let replay_all = |keys: Vec<Candidate>, total: usize| -> Vec<(Candidate, RunFigures)> {
        keys.into_par_iter()
            .map(|k| {
                let out = run(&k.settings(base), capacity);
                let n = done.fetch_add(1, AtomicOrdering::Relaxed) + 1;
                progress(Progress::Candidates { done: n, total });
                (k, out)
            })
            .collect()
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
    let estimate = first.len()
        + keys
            .iter()
            .filter(|k| k.garbage_collection_threshold.is_some())
            .count();
    let mut runs = replay_all(first, estimate);
    // Phase 2: thresholds that the plain run reaches need their own replay.
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
            .is_some_and(|(_, o)| !gc_never_runs(o.peak_reserved_bytes, t, base, capacity));
        if reached && !second.contains(k) {
            second.push(k.clone());
        }
    }
    let total = runs.len() + second.len();
    runs.extend(replay_all(second, total));
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
    // Stable on ties: the candidate with fewer keys set wins (less to explain).
    ranked.sort_by(|a, b| a.1.rank(&b.1).then(a.0.keys().cmp(&b.0.keys())));
    let min_capacity_bytes = match ranked.first() {
        Some((best, out)) if out.oom.is_none() => {
            let settings = best.settings(base);
            let at = |cap| run(&settings, cap);
            Some(min_capacity(out, capacity, at, &progress))
        }
        _ => None,
    };
    SearchResult {
        ranked,
        min_capacity_bytes,
    }
}

/// The smallest capacity (to [`CAPACITY_RESOLUTION`]) at which `run` has no
/// OOM, between the peak allocated bytes (nothing smaller can hold the live
/// tensors) and the peak reserved bytes of the run at `capacity` (which
/// reproduces that run exactly). Returns `capacity` when even that OOMs.
pub fn min_capacity(
    at_capacity: &RunFigures,
    capacity: u64,
    run: impl Fn(u64) -> RunFigures,
    progress: &impl Fn(Progress),
) -> u64 {
    let mut hi = at_capacity.peak_reserved_bytes.min(capacity).max(1);
    let mut lo = at_capacity.peak_allocated_bytes.min(hi);
    if run(hi).oom.is_some() {
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
    use crate::advise::space::space;
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
            let run = |_: &Settings, c: u64| {
                if c == cap {
                    replays.fetch_add(1, AtomicOrdering::Relaxed);
                }
                RunFigures {
                    peak_reserved_bytes: 100 * MIB,
                    ..RunFigures::default()
                }
            };
            let r = search(space(true), &base, cap, Some(&sizes), run, |_| {});
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
        let run = |s: &Settings, cap: u64| RunFigures {
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
            run,
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
            run,
            |_| {},
        );
        assert_eq!(r.min_capacity_bytes, None, "everything OOMs");
    }
}
