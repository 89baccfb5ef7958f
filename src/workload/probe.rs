//! Calibrated synthetic probes: when the evidence is text only (an OOM message,
//! `memory_summary()` tables) there is no trace to replay, so a deterministic
//! workload family is fitted until, replayed under the current config, it
//! reproduces the observed allocated and reserved figures; the failing request
//! is then appended. Everything a probe says is synthetic, and the fit (observed
//! vs reproduced) is part of the result.

use super::trace::{Event, Trace};
use rayon::prelude::*;

/// The workload shapes behind most fragmentation reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// Sequences of varying length: per-step activations sized by the length,
    /// a small per-step output kept.
    VariableLength,
    /// Concurrent sequences whose KV buffers are regrown (alloc larger, free old).
    GrowingKvCache,
    /// Batches of varying size: input and hidden tensors per step, a small
    /// accumulator kept.
    DynamicBatch,
    /// Many sub-MiB tensors around occasional large ones.
    MixedSmallLarge,
    /// Pairs of equal blocks of which one is freed and one lives on, leaving
    /// holes between long-lived blocks (what expandable segments cannot merge).
    InterleavedLongLived,
}

impl Family {
    pub const ALL: [Family; 5] = [
        Family::VariableLength,
        Family::GrowingKvCache,
        Family::DynamicBatch,
        Family::MixedSmallLarge,
        Family::InterleavedLongLived,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Family::VariableLength => "variable-length sequences",
            Family::GrowingKvCache => "growing KV cache",
            Family::DynamicBatch => "dynamic batch",
            Family::MixedSmallLarge => "mixed small and large",
            Family::InterleavedLongLived => "interleaved long-lived blocks",
        }
    }
}

/// A family's parameters: `steps` scales how much stays live, `unit` the size
/// of its tensors, `seed` the (deterministic) variation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    pub steps: u32,
    pub unit: u64,
    pub seed: u64,
}

/// xorshift64*: deterministic and dependency-free; quality is irrelevant here.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let r = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        lo + r % (hi - lo + 1)
    }
}

/// Hands out ids (dense, never reused) and writes the events, all on stream 0.
struct Builder {
    events: Vec<Event>,
    next: u32,
}

impl Builder {
    fn alloc(&mut self, size: u64) -> u32 {
        let id = self.next;
        self.next += 1;
        self.events.push(Event::Alloc {
            id,
            size: size.max(1),
            stream: 0,
        });
        id
    }
    fn free(&mut self, id: u32) {
        self.events.push(Event::Free { id });
    }
}

/// The family's events for `p`. Deterministic: the same inputs give the same events.
pub fn generate(family: Family, p: &Params) -> Vec<Event> {
    let mut b = Builder {
        events: Vec::with_capacity(p.steps as usize * 6),
        next: 0,
    };
    let mut rng = Rng::new(p.seed);
    // Saturating: the unit comes from evidence, which may state absurd sizes.
    let u = p.unit.max(1);
    match family {
        Family::VariableLength => {
            let mut prev = None;
            for _ in 0..p.steps {
                let len = rng.range(1, 8);
                let act = b.alloc(u.saturating_mul(len));
                b.alloc(u.saturating_mul(len) / 4);
                if let Some(a) = prev.replace(act) {
                    b.free(a);
                }
            }
        }
        Family::GrowingKvCache => {
            // Four sequences; each step one grows by a unit (realloc and copy).
            let mut seqs: [(Option<u32>, u64); 4] = [(None, 0); 4];
            for step in 0..p.steps {
                let s = &mut seqs[(step as usize + rng.range(0, 3) as usize) % 4];
                s.1 = s.1.saturating_add(u);
                let grown = b.alloc(s.1);
                if let Some(old) = s.0.replace(grown) {
                    b.free(old);
                }
            }
        }
        Family::DynamicBatch => {
            for _ in 0..p.steps {
                let batch = rng.range(1, 8);
                let input = b.alloc(u.saturating_mul(batch));
                let hidden = b.alloc(u.saturating_mul(2 * batch));
                b.free(input);
                b.alloc(u.saturating_mul(batch) / 8);
                b.free(hidden);
            }
        }
        Family::MixedSmallLarge => {
            for step in 0..p.steps {
                for i in 0..8 {
                    let small = b.alloc(rng.range(4, 512) << 10);
                    if i % 4 != 0 {
                        b.free(small);
                    }
                }
                let large = b.alloc(u.saturating_mul(rng.range(1, 4)));
                if step % 2 == 1 {
                    b.free(large);
                }
            }
        }
        Family::InterleavedLongLived => {
            for _ in 0..p.steps {
                let gone = b.alloc(u);
                b.alloc(u);
                b.free(gone);
            }
        }
    }
    b.events
}

/// One past the largest id the events use.
fn id_span(events: &[Event]) -> u32 {
    events
        .iter()
        .filter_map(|e| match *e {
            Event::Alloc { id, .. } | Event::Free { id } | Event::RecordStream { id, .. } => {
                Some(id + 1)
            }
            Event::EmptyCache | Event::SynchronizeStream { .. } => None,
        })
        .max()
        .unwrap_or(0)
}

/// A trace of generated events (valid by construction: dense ids, frees of live ids).
pub fn trace(events: Vec<Event>) -> Trace {
    Trace::from_events(events).unwrap_or_default()
}

/// `epochs` back-to-back runs of `events`, each ending by freeing what it left
/// live (like a training loop whose steps release everything): a long trace
/// whose live set stays bounded. Ids are renumbered per epoch.
pub fn epochs(events: &[Event], epochs: u32) -> Vec<Event> {
    let span = id_span(events);
    let mut live = vec![false; span as usize];
    let mut out = Vec::with_capacity((events.len() + span as usize) * epochs as usize);
    for e in 0..epochs {
        let base = e.saturating_mul(span);
        for event in events {
            out.push(match *event {
                Event::Alloc { id, size, stream } => {
                    live[id as usize] = true;
                    Event::Alloc {
                        id: base + id,
                        size,
                        stream,
                    }
                }
                Event::Free { id } => {
                    live[id as usize] = false;
                    Event::Free { id: base + id }
                }
                Event::RecordStream { id, stream } => Event::RecordStream {
                    id: base + id,
                    stream,
                },
                other => other,
            });
        }
        for (id, l) in live.iter_mut().enumerate() {
            if std::mem::take(l) {
                out.push(Event::Free {
                    id: base + id as u32,
                });
            }
        }
    }
    out
}

/// Allocated and reserved bytes (and the failing request, when there is one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Figures {
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    pub requested_bytes: Option<u64>,
}

/// What the evidence says, and the room the allocator had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    pub observed: Figures,
    /// Bytes the allocator could use: reserved + free at the OOM (the card's
    /// total minus other processes and the CUDA context), or the user's
    /// `--capacity`.
    pub capacity: u64,
}

/// The state a replay ends in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayFigures {
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    /// Whether the replay stopped at an OOM.
    pub oom: bool,
}

/// The relative error the fit must reach on allocated and reserved bytes.
pub const TOLERANCE: f64 = 0.05;

/// A fitted probe.
#[derive(Debug, Clone, PartialEq)]
pub struct Calibration {
    pub family: Family,
    pub params: Params,
    pub observed: Figures,
    /// What the probe reproduces under the current config (before the request).
    pub reproduced: Figures,
    /// max of the relative errors on allocated and reserved bytes.
    pub error: f64,
    pub within_tolerance: bool,
    /// Whether the probe, with the request appended, runs out of memory at
    /// `capacity` under the current config (as the real job did).
    pub reproduces_oom: bool,
    pub capacity: u64,
    /// The probe itself, the request last when there is one.
    pub trace: Trace,
}

fn rel_err(got: u64, want: u64) -> f64 {
    if want == 0 {
        return if got == 0 { 0.0 } else { 1.0 };
    }
    (got as f64 - want as f64).abs() / want as f64
}

fn fit_error(got: &ReplayFigures, want: &Figures) -> f64 {
    rel_err(got.allocated_bytes, want.allocated_bytes)
        .max(rel_err(got.reserved_bytes, want.reserved_bytes))
}

/// Steps at which a family with this unit holds about `allocated` bytes:
/// extrapolated from a short run, then bisected (live bytes grow with steps).
fn fit_steps(
    family: Family,
    unit: u64,
    seed: u64,
    allocated: u64,
    replay: &(impl Fn(&Trace, u64) -> ReplayFigures + Sync),
) -> u32 {
    const PILOT: u32 = 64;
    const MAX_STEPS: u32 = 1 << 18;
    let at = |steps: u32| {
        let p = Params { steps, unit, seed };
        replay(&trace(generate(family, &p)), crate::device::NO_LIMIT).allocated_bytes
    };
    let pilot = at(PILOT).max(1);
    let guess =
        (PILOT as f64 * allocated as f64 / pilot as f64).clamp(1.0, MAX_STEPS as f64) as u32;
    let (mut lo, mut hi) = ((guess / 2).max(1), guess.saturating_mul(2).min(MAX_STEPS));
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if at(mid) < allocated {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// Fits every family over a range of tensor sizes and keeps the best fit.
/// `replay(trace, capacity)` runs a trace through the bundled allocator under
/// the current config and reports where it ended.
pub fn calibrate(
    target: &Target,
    seed: u64,
    replay: impl Fn(&Trace, u64) -> ReplayFigures + Sync,
) -> Option<Calibration> {
    let want = target.observed;
    if want.allocated_bytes == 0 {
        return None;
    }
    // Tensor sizes from 1/4096 to 1/16 of what is allocated, at least 64 KiB,
    // and around the failing request when there is one.
    let mut units: Vec<u64> = (4..=12)
        .map(|k| (want.allocated_bytes >> k).max(64 << 10))
        .collect();
    if let Some(r) = want.requested_bytes {
        units.extend([r / 4, r / 2, r].iter().map(|&u| u.max(64 << 10)));
    }
    units.sort_unstable();
    units.dedup();
    let candidates: Vec<(Family, u64)> = Family::ALL
        .iter()
        .flat_map(|&f| units.iter().map(move |&u| (f, u)))
        .collect();
    // Each candidate: fit the steps, measure the error, and check whether the
    // request then runs out of memory at the capacity, as it did for real.
    let best = candidates
        .par_iter()
        .map(|&(family, unit)| {
            let steps = fit_steps(family, unit, seed, want.allocated_bytes, &replay);
            let params = Params { steps, unit, seed };
            let mut events = generate(family, &params);
            let got = replay(&trace(events.clone()), crate::device::NO_LIMIT);
            let error = fit_error(&got, &want);
            let reproduces_oom = match want.requested_bytes {
                Some(size) => {
                    let id = id_span(&events);
                    events.push(Event::Alloc {
                        id,
                        size,
                        stream: 0,
                    });
                    replay(&trace(events.clone()), target.capacity).oom
                }
                None => false,
            };
            (error, reproduces_oom, family, params, got, events)
        })
        // Best: within tolerance, then reproducing the OOM, then the smallest
        // error; ties go to the first family and the smaller unit (deterministic).
        .min_by(|a, b| {
            (a.0 > TOLERANCE)
                .cmp(&(b.0 > TOLERANCE))
                .then(b.1.cmp(&a.1))
                .then(a.0.total_cmp(&b.0))
                .then(a.2.cmp(&b.2))
                .then(a.3.unit.cmp(&b.3.unit))
        })?;
    let (error, reproduces_oom, family, params, got, events) = best;
    Some(Calibration {
        family,
        params,
        observed: want,
        reproduced: Figures {
            allocated_bytes: got.allocated_bytes,
            reserved_bytes: got.reserved_bytes,
            requested_bytes: want.requested_bytes,
        },
        error,
        within_tolerance: error <= TOLERANCE,
        reproduces_oom,
        capacity: target.capacity,
        trace: trace(events),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_free_everything_between_runs() {
        let p = Params {
            steps: 50,
            unit: 1 << 20,
            seed: 3,
        };
        let one = generate(Family::DynamicBatch, &p);
        let three = epochs(&one, 3);
        let allocs = |ev: &[Event]| {
            ev.iter()
                .filter(|e| matches!(e, Event::Alloc { .. }))
                .count()
        };
        assert_eq!(allocs(&three), 3 * allocs(&one));
        // Balanced: every alloc is freed once, so nothing is live at the end.
        assert_eq!(three.len(), 2 * allocs(&three));
    }

    #[test]
    fn families_are_deterministic_and_balanced() {
        for family in Family::ALL {
            let p = Params {
                steps: 200,
                unit: 3 << 20,
                seed: 7,
            };
            let a = generate(family, &p);
            assert_eq!(a, generate(family, &p), "{family:?}");
            if family != Family::InterleavedLongLived {
                let other = generate(family, &Params { seed: 8, ..p });
                assert_ne!(a, other, "{family:?} ignores the seed");
            }
            // Every free names a live id, and ids are never reused.
            let mut live = std::collections::HashSet::new();
            for op in &a {
                match *op {
                    Event::Alloc { id, size, .. } => {
                        assert!(size > 0);
                        assert!(live.insert(id), "{family:?}: id {id} reused");
                    }
                    Event::Free { id } => {
                        assert!(live.remove(&id), "{family:?}: free of dead {id}")
                    }
                    other => panic!("{family:?}: unexpected {other:?}"),
                }
            }
            assert!(!live.is_empty(), "{family:?} keeps something live");
        }
    }
}
