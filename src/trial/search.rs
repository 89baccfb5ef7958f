//! The config search behind `recommend`: every candidate of the space
//! ([`crate::advise::space`]) replayed in parallel, ranked
//! ([`RunFigures::rank`]), and the smallest capacity at which the winner
//! still runs.
//!
//! The search does not know how a run happens: the caller passes `run(settings,
//! capacity)`, so the same code drives the simulated card, a probe or a GPU.

use crate::advise::space::{Candidate, ROUNDUP_DIVISIONS};
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
    /// `done` of `total` steps of a run replayed, over every config (`forecast`).
    Steps { done: usize, total: usize },
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

/// The candidate `c` behaves exactly like, judged before any replay from the
/// trace's distinct request sizes (`None` when unknown, e.g. a snapshot's
/// start state):
/// - `max_split_size_mb` is dropped when no segment the trace can create
///   reaches it. Without expandable segments a block is never larger than its
///   segment, and every check on the threshold (`get_free_block`,
///   `should_split`, `release_available_cached_blocks`, the oversize stats)
///   compares a block or request against it, so a threshold above the largest
///   segment changes nothing.
/// - `roundup_power2_divisions` is replaced by the first setting (unset, then
///   the space's values) that rounds every request size of the trace alike:
///   `round_size` is the only place the allocator reads it
///   (src/allocator/sizes.rs), so the allocator sees the same requests.
fn equivalent(c: &Candidate, base: &Settings, request_sizes: Option<&[u64]>) -> Candidate {
    let mut key = c.clone();
    let Some(sizes) = request_sizes else {
        return key;
    };
    if c.roundup_power2_divisions.is_some() {
        let s = c.settings(base);
        let alike = |d: Option<u64>| {
            let other = Candidate {
                roundup_power2_divisions: d,
                ..c.clone()
            }
            .settings(base);
            sizes
                .iter()
                .all(|&r| round_size(r, &s) == round_size(r, &other))
        };
        key.roundup_power2_divisions = std::iter::once(None)
            .chain(ROUNDUP_DIVISIONS.iter().copied().map(Some))
            .find(|&d| d == c.roundup_power2_divisions || alike(d))
            .flatten();
    }
    if let (false, Some(mb)) = (c.expandable_segments, c.max_split_size_mb) {
        let s = key.settings(base);
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

/// The replays so far and what they prove about the other candidates.
struct Runs<'a> {
    /// The distinct candidates to rank (after [`equivalent`]).
    keys: Vec<Candidate>,
    done: Vec<(Candidate, RunFigures)>,
    base: &'a Settings,
    capacity: u64,
}

impl Runs<'_> {
    /// The candidate `k` stands on: itself without its collector threshold,
    /// and itself without its `max_split_size_mb`.
    fn simpler(k: &Candidate) -> [Option<Candidate>; 2] {
        [
            k.garbage_collection_threshold.map(|_| Candidate {
                garbage_collection_threshold: None,
                ..k.clone()
            }),
            k.max_split_size_mb.map(|_| Candidate {
                max_split_size_mb: None,
                ..k.clone()
            }),
        ]
    }

    /// The run `k` provably gives: its own replay, or that of a simpler
    /// candidate whose run never reached what `k` changes. A collector
    /// threshold the run never reaches ([`gc_never_runs`]) or a
    /// `max_split_size_mb` (a power of two) that would have turned no decision
    /// of the run without it ([`RunFigures::max_split_flips`]) leaves each
    /// decision of the allocator as it was, up to the end, the OOM, or the stop at the same
    /// bound. A run stopped at an earlier wave's (higher or equal) bound still
    /// passed the best finished run's peak, so it ranks below it as `k` would.
    fn of(&self, k: &Candidate) -> Option<&RunFigures> {
        if let Some((_, o)) = self.done.iter().find(|(c, _)| c == k) {
            return Some(o);
        }
        let [without_gc, without_split] = Self::simpler(k);
        if let (Some(t), Some(o)) = (
            k.garbage_collection_threshold,
            without_gc.and_then(|p| self.of(&p)),
        ) && gc_never_runs(o.peak_reserved_bytes, t, self.base, self.capacity)
        {
            return Some(o);
        }
        if let (Some(mb), Some(o)) = (k.max_split_size_mb, without_split.and_then(|p| self.of(&p)))
            && (mb * MIB).is_power_of_two()
            && o.max_split_flips.is_some_and(|f| f & (mb * MIB) == 0)
        {
            return Some(o);
        }
        None
    }

    /// Whether `k`'s run is still to come: nothing proves it yet, and it is
    /// to be replayed or may share the run of a simpler candidate still to come.
    fn pending(&self, k: &Candidate) -> bool {
        self.of(k).is_none()
            && (self.keys.contains(k) || Self::simpler(k).iter().flatten().any(|p| self.pending(p)))
    }

    /// Whether `k` needs its own replay now: nothing proves its run, and no
    /// simpler candidate it could share one with is still to come.
    fn needs_replay(&self, k: &Candidate) -> bool {
        self.of(k).is_none() && !Self::simpler(k).iter().flatten().any(|p| self.pending(p))
    }

    /// The bound for the next wave: the lowest peak reserved of a finished run
    /// without an OOM (a run that passes it ranks below that run).
    fn bound(&self) -> Option<u64> {
        self.done
            .iter()
            .filter(|(_, o)| o.oom.is_none() && o.stopped_early_at_event.is_none())
            .map(|(_, o)| o.peak_reserved_bytes)
            .min()
    }
}

/// Best first: stopped runs last; stable on ties: the candidate with fewer
/// keys set wins (less to explain).
fn rank(runs: &mut [(Candidate, RunFigures)]) {
    runs.sort_by(|a, b| {
        let stopped = |r: &RunFigures| r.stopped_early_at_event.is_some();
        stopped(&a.1)
            .cmp(&stopped(&b.1))
            .then(a.1.rank(&b.1))
            .then(a.0.keys().cmp(&b.0.keys()))
    });
}

/// Replays in the first wave, which runs unbounded and sets the first bound:
/// a constant, so that the bounds (and so the result) do not depend on the
/// number of threads.
const FIRST_WAVE: usize = 2;

/// Replays every candidate at `capacity` in parallel, ranks them, and (when `bisect`) bisects
/// the winner's smallest capacity. `run(settings, capacity, stop_above)` must
/// be deterministic and may stop once reserved memory passes `stop_above`;
/// `progress` is called from worker threads.
///
/// Candidates that provably behave alike share one replay ([`equivalent`]
/// before any replay, [`Runs::of`] after their simpler candidate ran).
/// Replays go in waves, each bounded by the lowest peak reserved of a run
/// that finished without an OOM in an earlier wave: a run whose reserved
/// memory passes it ranks below that run, so it stops there. Each wave's bound
/// is fixed before it starts, so the result does not depend on thread timing.
/// The simplest expandable-segments candidates make the first wave
/// ([`FIRST_WAVE`]), as they usually set the lowest bound.
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
    let keys: Vec<Candidate> = candidates
        .iter()
        .map(|c| equivalent(c, base, request_sizes))
        .collect();
    let mut distinct: Vec<Candidate> = Vec::new();
    for k in &keys {
        if !distinct.contains(k) {
            distinct.push(k.clone());
        }
    }
    distinct.sort_by_key(|k| (!k.expandable_segments, k.keys()));
    let mut runs = Runs {
        keys: distinct,
        done: Vec::new(),
        base,
        capacity,
    };
    let done = AtomicUsize::new(0);
    let mut first_wave = true;
    loop {
        let mut wave: Vec<Candidate> = runs
            .keys
            .iter()
            .filter(|k| runs.needs_replay(k))
            .cloned()
            .collect();
        if wave.is_empty() {
            break;
        }
        if first_wave {
            wave.truncate(FIRST_WAVE);
            first_wave = false;
        }
        let total = runs.done.len() + runs.keys.iter().filter(|k| runs.of(k).is_none()).count();
        let bound = runs.bound();
        let finished: Vec<(Candidate, RunFigures)> = wave
            .into_par_iter()
            .map(|k| {
                let settings = k.settings(base);
                // The base config (the one in use) always runs in full: it is reported beside the winner.
                let out = run(&settings, capacity, bound.filter(|_| settings != *base));
                let n = done.fetch_add(1, AtomicOrdering::Relaxed) + 1;
                progress(Progress::Candidates { done: n, total });
                (k, out)
            })
            .collect();
        runs.done.extend(finished);
    }
    let mut ranked: Vec<(Candidate, RunFigures)> = candidates
        .into_iter()
        .zip(&keys)
        .filter_map(|(c, k)| runs.of(k).map(|o| (c, o.clone())))
        .collect();
    rank(&mut ranked);
    let stopped = ranked
        .iter()
        .filter(|(_, r)| r.stopped_early_at_event.is_some())
        .count();
    let mut pruning = Pruning {
        configs: ranked.len(),
        replays: runs.done.len(),
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
    use crate::workload::{Event, OomEvent};

    /// An allocation of `mib` MiB on stream 0, as the hand-made traces below write them.
    fn alloc(id: u32, mib: u64) -> Event {
        Event::Alloc {
            id,
            size: mib * MIB,
            stream: 0,
        }
    }

    fn free(id: u32) -> Event {
        Event::Free { id }
    }

    /// Thresholds above every segment of the trace, divisions that round
    /// every request alike, collector thresholds the run never reaches and
    /// thresholds that would turn no decision of the run without them share a
    /// replay; everything is still ranked.
    #[test]
    fn provably_equal_candidates_share_a_replay() {
        use std::sync::atomic::AtomicUsize;
        let base = Settings {
            per_process_memory_fraction: Some(0.9),
            ..Settings::default()
        };
        // Largest request 40 MiB: segments up to 40 MiB, so 64..1024 act as
        // unset without ES. Divisions 4, 8 and 16 round 4 KiB, 3 MiB and
        // 40 MiB as unset does; 2 rounds 3 MiB to 4 MiB and 40 MiB to 48 MiB.
        let sizes = [4 << 10, 3 * MIB, 40 * MIB];
        let count = |cap: u64, flips: Option<u64>| {
            // Replays at the search's capacity (the bisection's come on top).
            let replays = AtomicUsize::new(0);
            let run = |_: &Settings, c: u64, _: Option<u64>| {
                if c == cap {
                    replays.fetch_add(1, AtomicOrdering::Relaxed);
                }
                RunFigures {
                    peak_reserved_bytes: 100 * MIB,
                    max_split_flips: flips,
                    ..RunFigures::default()
                }
            };
            let r = search(space(true), &base, cap, Some(&sizes), (run, true), |_| {});
            assert_eq!(r.ranked.len(), 280, "every candidate is ranked");
            replays.load(AtomicOrdering::Relaxed)
        };
        // Without ES: splits {unset, 32} × divisions {unset, 2}; with ES: 7 × 2; no GC reached.
        assert_eq!(count(8 << 30, None), 2 * 2 + 7 * 2);
        // allowed = 0.9 × 150 MiB = 135 MiB: 0.6 (81 MiB) is reached, 0.8 and 0.95 are not.
        assert_eq!(count(150 * MIB, None), 2 * (2 * 2 + 7 * 2));
        // Runs in which only 32 and 64 MiB would turn a decision: ES keeps
        // {unset, 32, 64}, and without ES 32 is still replayed.
        let (mib32, mib64, gib) = (1 << 25, 1 << 26, 1 << 30);
        assert_eq!(count(8 << 30, Some(mib32 | mib64)), 2 * 2 + 3 * 2);
        // Only 1 GiB would: ES keeps {unset, 1024}; without ES 32 goes too.
        assert_eq!(count(8 << 30, Some(gib)), 2 + 2 * 2);
        assert_eq!(count(8 << 30, Some(0)), 2 + 2);
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
                before_trace: None,
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

    /// A run under a power-of-two `max_split_size` whose bit the run without
    /// it left clear ([`RunFigures::max_split_flips`]) is that run; and the
    /// bits are not all set: some thresholds are proven harmless, and some
    /// that are not do change the run.
    #[test]
    fn a_threshold_that_turns_no_decision_gives_the_same_run() {
        use crate::device::sim::SimDevice;
        use crate::workload::{Trace, replay};
        let (mut proven, mut changed) = (0, 0);
        for seed in 1..40u64 {
            let trace = Trace::random(seed, 300);
            for es in [false, true] {
                for capacity in [16 << 30, 2 << 30] {
                    let unset = Settings {
                        expandable_segments: es,
                        ..Settings::default()
                    };
                    let base = replay(&trace, &unset, SimDevice::new(capacity)).figures;
                    let flips = base.max_split_flips.expect("known");
                    for mb in [32, 64, 128, 256, 512] {
                        let t = Settings {
                            max_split_size: mb * MIB,
                            ..unset.clone()
                        };
                        let run = replay(&trace, &t, SimDevice::new(capacity)).figures;
                        if flips & (mb * MIB) == 0 {
                            assert_eq!(run, base, "seed {seed} es {es} at {capacity}: {mb} MiB");
                            proven += 1;
                        } else if run != base {
                            changed += 1;
                        }
                    }
                }
            }
        }
        assert!(
            proven > 20 && changed > 20,
            "proven {proven}, changed {changed}"
        );
    }

    /// Each place where the threshold decides sets the bit of a threshold
    /// that changes the run there, and only there: a fresh 34 MiB segment
    /// for a 32.25 MiB request that 32 MiB keeps whole (`should_split`); a
    /// freed 100 MiB expandable block (not at the segment's end) that 32 MiB
    /// refuses to a 40 MiB request (`get_free_block`: not a near-exact fit); a
    /// full card where 32 MiB releases only the
    /// oversize cached blocks (`release_available_cached_blocks`). Not set
    /// where the refusal turns nothing: the same freed block at the segment's
    /// unmapped tail, which `try_allocate_expandable_block` takes all the same
    /// (mapped and large enough), so the run under 32 MiB is this run.
    #[test]
    fn each_deciding_place_sets_the_bits_it_needs() {
        use crate::device::sim::SimDevice;
        use crate::workload::{Trace, replay};
        let split = vec![Event::Alloc {
            id: 0,
            size: 32 * MIB + MIB / 4,
            stream: 0,
        }];
        let oversize = vec![alloc(0, 100), alloc(1, 20), free(0), alloc(2, 40)];
        let release = vec![
            alloc(0, 100),
            alloc(1, 60),
            alloc(2, 12),
            free(0),
            free(1),
            free(2),
            alloc(3, 150),
        ];
        let at_the_tail = vec![alloc(0, 100), free(0), alloc(1, 40)];
        for (events, es, capacity, changes) in [
            (split, false, 1 << 30, true),
            (oversize, true, 1 << 30, true),
            (release, false, 200 * MIB, true),
            (at_the_tail, true, 1 << 30, false),
        ] {
            let trace = Trace::from_events(events).expect("ids stay live");
            let unset = Settings {
                expandable_segments: es,
                ..Settings::default()
            };
            let t = Settings {
                max_split_size: 32 * MIB,
                ..unset.clone()
            };
            let base = replay(&trace, &unset, SimDevice::new(capacity)).figures;
            let run = replay(&trace, &t, SimDevice::new(capacity)).figures;
            assert_eq!(run != base, changes, "{trace:?}: {run:?} against {base:?}");
            let flips = base.max_split_flips.expect("known");
            assert_eq!(
                flips & (32 * MIB) != 0,
                changes,
                "{trace:?}: the bit of 32 MiB"
            );
        }
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

    /// Bounded and shared replays change nothing a user reads: against every
    /// candidate replayed on its own, unbounded, the same recommendation and
    /// smallest capacity, every finished run with its own run's figures and in
    /// its order, every stopped config ranked below the winner; and the same
    /// result on one thread as on three.
    #[test]
    fn pruned_search_agrees_with_the_unpruned_one() {
        use crate::device::sim::SimDevice;
        use crate::workload::{ReplayOptions, replay_with};
        let (mut stopped_somewhere, mut shared_somewhere) = (0, 0);
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
                let on = |threads: usize| {
                    rayon::ThreadPoolBuilder::new()
                        .num_threads(threads)
                        .build()
                        .expect("a thread pool")
                        .install(|| {
                            search(
                                space(with_gc),
                                &base,
                                capacity,
                                Some(&sizes),
                                (replay, true),
                                |_| {},
                            )
                        })
                };
                let pruned = on(1);
                assert_eq!(
                    pruned,
                    on(3),
                    "seed {seed} at {capacity}: thread count matters"
                );
                let mut full: Vec<(Candidate, RunFigures)> = space(with_gc)
                    .into_iter()
                    .map(|c| {
                        let run = replay(&c.settings(&base), capacity, None);
                        (c, run)
                    })
                    .collect();
                rank(&mut full);
                let full_min = full[0].1.oom.is_none().then(|| {
                    let settings = full[0].0.settings(&base);
                    min_capacity(
                        &full[0].1,
                        capacity,
                        false,
                        |cap| replay(&settings, cap, None),
                        &|_| {},
                    )
                });
                assert_eq!(pruned.min_capacity_bytes, full_min);
                assert_eq!(pruned.ranked[0], full[0], "seed {seed} at {capacity}");
                let finished: Vec<_> = pruned
                    .ranked
                    .iter()
                    .filter(|(_, r)| r.stopped_early_at_event.is_none())
                    .collect();
                let full_order: Vec<_> = full
                    .iter()
                    .filter(|(c, _)| finished.iter().any(|(f, _)| f == c))
                    .collect();
                assert_eq!(finished.len(), pruned.pruning.configs_finished);
                assert_eq!(finished, full_order, "seed {seed} at {capacity}");
                for (c, r) in &pruned.ranked[pruned.pruning.configs_finished..] {
                    let at = full.iter().position(|(f, _)| f == c).expect("ranked");
                    assert!(at > 0, "{c:?} stopped at {r:?} but wins unbounded");
                }
                stopped_somewhere += pruned.pruning.configs_stopped_early;
                shared_somewhere += pruned.pruning.configs - pruned.pruning.replays;
            }
        }
        assert!(
            stopped_somewhere > 0 && shared_somewhere > 0,
            "no run stopped or none shared: the test checks nothing"
        );
    }
}
