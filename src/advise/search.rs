//! The config search behind `recommend`: every combination of the allocator
//! settings that change where memory goes, replayed in parallel, ranked, and
//! the smallest capacity at which the winner still runs.
//!
//! The search does not know how a run happens: the caller passes `run(settings,
//! capacity)`, so the same code drives the simulated card, a probe or a GPU.

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

/// Replays every candidate at `capacity` in parallel, ranks them, and bisects
/// the winner's smallest capacity. `run(settings, capacity)` must be
/// deterministic; `progress` is called from worker threads.
pub fn search<O, R, P>(
    candidates: Vec<Candidate>,
    base: &Settings,
    capacity: u64,
    run: R,
    progress: P,
) -> SearchResult<O>
where
    O: Scored + Send,
    R: Fn(&Settings, u64) -> O + Sync,
    P: Fn(Progress) + Sync,
{
    let total = candidates.len();
    let done = AtomicUsize::new(0);
    let mut ranked: Vec<(Candidate, O)> = candidates
        .into_par_iter()
        .map(|c| {
            let score = run(&c.settings(base), capacity);
            let n = done.fetch_add(1, AtomicOrdering::Relaxed) + 1;
            progress(Progress::Candidates { done: n, total });
            (c, score)
        })
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
        let r = search(space(false), &Settings::default(), 900 * MIB, run, |_| {});
        let (best, score) = &r.ranked[0];
        assert!(best.expandable_segments && best.keys() == 1, "{best:?}");
        assert_eq!(score.peak_reserved_bytes, 700 * MIB);
        let min = r.min_capacity_bytes.expect("winner runs");
        assert!(
            min >= 700 * MIB && min - 700 * MIB <= CAPACITY_RESOLUTION,
            "{min}"
        );
        let r = search(space(false), &Settings::default(), 600 * MIB, run, |_| {});
        assert_eq!(r.min_capacity_bytes, None, "everything OOMs");
    }
}
