//! The config search behind `recommend`: every combination of the allocator
//! settings that change where memory goes, replayed in parallel, ranked, and
//! the smallest capacity at which the winner still runs.
//!
//! The search does not know how a run happens: the caller passes `run(settings,
//! capacity)`, so the same code drives the simulated card, a probe or a GPU.

use crate::allocator::sizes::{get_allocation_size, round_size};
use crate::conf::{MIB, Settings};
use rayon::prelude::*;
use std::cmp::Ordering;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};

/// `max_split_size_mb` values tried (PyTorch requires > 20: `kLargeBuffer`/1 MiB).
pub const MAX_SPLIT_MB: [u64; 6] = [32, 64, 128, 256, 512, 1024];
/// `roundup_power2_divisions` values tried (powers of two, as PyTorch requires).
pub const ROUNDUP_DIVISIONS: [u64; 4] = [2, 4, 8, 16];
/// `garbage_collection_threshold` values tried when a memory fraction is set
/// (PyTorch runs the collector only then: `garbage_collect_cached_blocks`).
pub const GC_THRESHOLDS: [f64; 3] = [0.6, 0.8, 0.95];

/// What the ranking looks at in one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Score {
    /// Index of the event that ran out of memory, if one did.
    pub oom_event: Option<u64>,
    pub peak_reserved_bytes: u64,
    pub peak_allocated_bytes: u64,
    pub device_allocs: u64,
    pub device_frees: u64,
    pub alloc_retries: u64,
    pub synchronizations: u64,
}

impl Score {
    /// Best first: no OOM, then lowest peak reserved, then the least driver
    /// work (cudaMalloc + cudaFree, retries, synchronisations: the time cost).
    /// Of two OOMs, the one that got further is better.
    pub fn rank(&self, other: &Score) -> Ordering {
        match (self.oom_event, other.oom_event) {
            (None, Some(_)) => Ordering::Less,
            (Some(_), None) => Ordering::Greater,
            (Some(a), Some(b)) if a != b => b.cmp(&a),
            _ => self
                .peak_reserved_bytes
                .cmp(&other.peak_reserved_bytes)
                .then(
                    (self.device_allocs + self.device_frees)
                        .cmp(&(other.device_allocs + other.device_frees)),
                )
                .then(self.alloc_retries.cmp(&other.alloc_retries))
                .then(self.synchronizations.cmp(&other.synchronizations)),
        }
    }
}

/// A run's outcome as far as the ranking is concerned.
pub trait Scored {
    fn score(&self) -> Score;
}

impl Scored for Score {
    fn score(&self) -> Score {
        *self
    }
}

/// One point of the config space.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub expandable_segments: bool,
    pub max_split_size_mb: Option<u64>,
    pub roundup_power2_divisions: Option<u64>,
    pub garbage_collection_threshold: Option<f64>,
}

impl Candidate {
    /// The settings of this candidate on top of `base` (which keeps the
    /// backend, the version, a memory fraction and the unmodelled keys).
    pub fn settings(&self, base: &Settings) -> Settings {
        let defaults = Settings::default();
        Settings {
            expandable_segments: self.expandable_segments,
            max_split_size: self
                .max_split_size_mb
                .map_or(defaults.max_split_size, |mb| mb * MIB),
            roundup_power2_divisions: self
                .roundup_power2_divisions
                .map_or(defaults.roundup_power2_divisions, |d| [d; 16]),
            garbage_collection_threshold: self
                .garbage_collection_threshold
                .unwrap_or(defaults.garbage_collection_threshold),
            ..base.clone()
        }
    }

    /// How many keys this candidate sets (fewer is simpler to explain).
    pub fn keys(&self) -> usize {
        usize::from(self.expandable_segments)
            + usize::from(self.max_split_size_mb.is_some())
            + usize::from(self.roundup_power2_divisions.is_some())
            + usize::from(self.garbage_collection_threshold.is_some())
    }
}

/// The space: expandable_segments × max_split_size_mb × roundup_power2_divisions,
/// × garbage_collection_threshold only when `with_gc` (a memory fraction is set).
/// The all-default candidate comes first.
pub fn space(with_gc: bool) -> Vec<Candidate> {
    let splits = std::iter::once(None).chain(MAX_SPLIT_MB.iter().copied().map(Some));
    let mut out = Vec::new();
    for es in [false, true] {
        for split in splits.clone() {
            for div in std::iter::once(None).chain(ROUNDUP_DIVISIONS.iter().copied().map(Some)) {
                let gcs: Vec<Option<f64>> = if with_gc {
                    std::iter::once(None)
                        .chain(GC_THRESHOLDS.iter().copied().map(Some))
                        .collect()
                } else {
                    vec![None]
                };
                for gc in gcs {
                    out.push(Candidate {
                        expandable_segments: es,
                        max_split_size_mb: split,
                        roundup_power2_divisions: div,
                        garbage_collection_threshold: gc,
                    });
                }
            }
        }
    }
    out
}

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
pub struct SearchResult<O> {
    /// Candidates with their runs, best first.
    pub ranked: Vec<(Candidate, O)>,
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
pub fn search<O, R, P>(
    candidates: Vec<Candidate>,
    base: &Settings,
    capacity: u64,
    request_sizes: Option<&[u64]>,
    run: R,
    progress: P,
) -> SearchResult<O>
where
    O: Scored + Send + Sync + Clone,
    R: Fn(&Settings, u64) -> O + Sync,
    P: Fn(Progress) + Sync,
{
    let done = AtomicUsize::new(0);
    let replay_all = |keys: Vec<Candidate>, total: usize| -> Vec<(Candidate, O)> {
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
            .is_some_and(|(_, o)| !gc_never_runs(o.score().peak_reserved_bytes, t, base, capacity));
        if reached && !second.contains(k) {
            second.push(k.clone());
        }
    }
    let total = runs.len() + second.len();
    runs.extend(replay_all(second, total));
    let result_of = |k: &Candidate| -> Option<O> {
        let plain = Candidate {
            garbage_collection_threshold: None,
            ..k.clone()
        };
        runs.iter()
            .find(|(c, _)| c == k)
            .or_else(|| runs.iter().find(|(c, _)| *c == plain))
            .map(|(_, o)| o.clone())
    };
    let mut ranked: Vec<(Candidate, O)> = candidates
        .into_iter()
        .zip(&keys)
        .filter_map(|(c, k)| result_of(k).map(|o| (c, o)))
        .collect();
    // Stable on ties: the candidate with fewer keys set wins (less to explain).
    ranked.sort_by(|a, b| {
        a.1.score()
            .rank(&b.1.score())
            .then(a.0.keys().cmp(&b.0.keys()))
    });
    let min_capacity_bytes = match ranked.first() {
        Some((best, out)) if out.score().oom_event.is_none() => {
            let settings = best.settings(base);
            let at = |cap| run(&settings, cap).score();
            Some(min_capacity(&out.score(), capacity, at, &progress))
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
    at_capacity: &Score,
    capacity: u64,
    run: impl Fn(u64) -> Score,
    progress: &impl Fn(Progress),
) -> u64 {
    let mut hi = at_capacity.peak_reserved_bytes.min(capacity).max(1);
    let mut lo = at_capacity.peak_allocated_bytes.min(hi);
    if run(hi).oom_event.is_some() {
        return capacity;
    }
    let mut step = 0;
    while hi - lo > CAPACITY_RESOLUTION {
        let mid = lo + (hi - lo) / 2;
        step += 1;
        progress(Progress::Bisect { step });
        if run(mid).oom_event.is_none() {
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

    #[test]
    fn space_sizes_and_defaults_first() {
        let plain = space(false);
        assert_eq!(plain.len(), 2 * 7 * 5);
        assert_eq!(plain[0].keys(), 0, "the default config leads");
        assert_eq!(space(true).len(), 2 * 7 * 5 * 4);
        let s = plain[0].settings(&Settings::default());
        assert_eq!(s, Settings::default());
    }

    /// Every point of the space is a config PyTorch accepts, and reads back as itself.
    #[test]
    fn every_candidate_renders_and_parses_back() {
        for c in space(true) {
            let s = c.settings(&Settings::default());
            let text = crate::conf::render(&s);
            let back = crate::conf::parse(&text, crate::conf::TorchVersion::DEFAULT)
                .unwrap_or_else(|e| panic!("{text}: {e}"))
                .settings;
            assert_eq!(back, s, "{text}");
        }
    }

    #[test]
    fn ranking_prefers_no_oom_then_reserved_then_driver_work() {
        let ok = |reserved, allocs| Score {
            peak_reserved_bytes: reserved,
            device_allocs: allocs,
            ..Score::default()
        };
        let oom = |at| Score {
            oom_event: Some(at),
            ..Score::default()
        };
        assert_eq!(ok(900, 50).rank(&oom(10)), Ordering::Less);
        assert_eq!(
            oom(5).rank(&oom(10)),
            Ordering::Greater,
            "later OOM is better"
        );
        assert_eq!(ok(100, 50).rank(&ok(200, 1)), Ordering::Less);
        assert_eq!(ok(100, 2).rank(&ok(100, 3)), Ordering::Less);
    }

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
                Score {
                    peak_reserved_bytes: 100 * MIB,
                    ..Score::default()
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
        let run = |s: &Settings, cap: u64| Score {
            oom_event: (need(s) > cap).then_some(3),
            peak_reserved_bytes: need(s).min(cap),
            peak_allocated_bytes: 600 * MIB,
            ..Score::default()
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
