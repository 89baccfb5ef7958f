//! Calibrated synthetic probes: when the evidence is text only (an OOM message,
//! `memory_summary()` tables) there is no trace to replay, so deterministic
//! workload shapes are fitted to the observed figures, and the set of those
//! that reproduce them is the [`Ensemble`] a config is judged on.
//!
//! Reproduction means reproduction: with the message's request appended, the
//! probe replayed under the current config at the card's room must run out of
//! memory on that request (the same rounded size, "Tried to allocate" as
//! printed) with allocated and reserved within [`TOLERANCE`] of the message's
//! figures at that moment. Only such probes are plausible. Everything a probe
//! says is synthetic, and every member's fit is part of the result.

use super::replay::{ReplayOptions, RunFigures, StreamedReplay};
use super::trace::{Event, Trace};
use crate::allocator::sizes::{
    LARGE_BUFFER, MIN_BLOCK_SIZE, MIN_LARGE_ALLOC, SMALL_BUFFER, SMALL_SIZE, get_allocation_size,
    round_size,
};
use crate::conf::Settings;
use crate::device::sim::SimDevice;
use crate::units::format_size;
use rayon::prelude::*;

/// The workload shapes behind most fragmentation reports. Each generator
/// keeps more memory live the more steps it runs, so the steps can be fitted
/// to an allocated figure.
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
    /// holes between long-lived blocks.
    InterleavedLongLived,
    /// Dynamic batches with `empty_cache()` every few steps, which returns
    /// whole free segments and makes the next steps allocate them anew.
    PeriodicEmptyCache,
    /// Long-lived 11–19 MiB tensors pinned between freed ones (segments of
    /// their own without expandable segments; unmappable only in whole pages
    /// with them), and transient larger requests that need the holes merged.
    PinnedMidSize,
    /// Large buffers freed and carved up by a few smaller tensors, one of
    /// which stays: a little live memory pins whole segments (reserved far
    /// above allocated, in holes smaller than the buffers).
    SplitPinned,
}

impl Family {
    pub const ALL: [Family; 8] = [
        Family::VariableLength,
        Family::GrowingKvCache,
        Family::DynamicBatch,
        Family::MixedSmallLarge,
        Family::InterleavedLongLived,
        Family::PeriodicEmptyCache,
        Family::PinnedMidSize,
        Family::SplitPinned,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Family::VariableLength => "variable-length training",
            Family::GrowingKvCache => "KV-cache inference",
            Family::DynamicBatch => "dynamic batch",
            Family::MixedSmallLarge => "many small tensors plus a few huge ones",
            Family::InterleavedLongLived => "interleaved short- and long-lived tensors",
            Family::PeriodicEmptyCache => "periodic empty_cache",
            Family::PinnedMidSize => "long-lived 11-19 MiB tensors pinned between freed ones",
            Family::SplitPinned => "freed large buffers carved up by small long-lived tensors",
        }
    }
}

/// A family's parameters: `steps` scales how much stays live, `unit` the size
/// of its tensors, `seed` the (deterministic) variation, `ballast` bytes
/// allocated before the first step and live to the end: the live memory
/// beyond what [`MAX_PROBE_STEPS`] steps hold, so that a probe of small
/// tensors on a large card stays a model of the figures with a bounded
/// number of events, not a replay of every byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    pub steps: u32,
    pub unit: u64,
    pub seed: u64,
    pub ballast: u64,
}

impl Params {
    /// `steps` of tensors of `unit` bytes, without ballast.
    pub fn new(steps: u32, unit: u64, seed: u64) -> Self {
        Params {
            steps,
            unit,
            seed,
            ballast: 0,
        }
    }
}

/// The most steps a fitted probe runs: past it, ballast stands for the rest
/// of the live memory (about 6 events a step; with the search's replays and
/// every config's judgement, a text-only `recommend` stays within 2 s on 2
/// cores whatever the figures, BENCHMARKS.md).
pub const MAX_PROBE_STEPS: u32 = 8192;

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

/// Hands out ids (dense, never reused) and writes the events, all on stream 0
/// (the probes' families here, and the test suite's trace families).
#[derive(Debug, Default)]
pub struct Builder {
    pub events: Vec<Event>,
    next: u32,
    /// The index of each step's first event.
    starts: Vec<usize>,
}

impl Builder {
    /// Marks the start of a step.
    pub fn step(&mut self) {
        self.starts.push(self.events.len());
    }
    /// An allocation of `size` bytes (at least 1) under a new id.
    pub fn alloc(&mut self, size: u64) -> u32 {
        let id = self.next;
        self.next += 1;
        self.events.push(Event::Alloc {
            id,
            size: size.max(1),
            stream: 0,
        });
        id
    }
    pub fn free(&mut self, id: u32) {
        self.events.push(Event::Free { id });
    }
}

/// The family's events for `p`. Deterministic: the same inputs give the same
/// events, and the events of fewer steps are a prefix of them.
pub fn generate(family: Family, p: &Params) -> Vec<Event> {
    generate_steps(family, p).0
}

/// [`generate`], and the index of each step's first event.
pub fn generate_steps(family: Family, p: &Params) -> (Vec<Event>, Vec<usize>) {
    let mut b = Builder {
        events: Vec::with_capacity(p.steps as usize * 6),
        next: 0,
        starts: Vec::with_capacity(p.steps as usize),
    };
    let mut rng = Rng::new(p.seed);
    if p.ballast > 0 {
        // Before the first step, so that fewer steps' events stay a prefix.
        b.alloc(p.ballast);
    }
    // Saturating: the unit comes from evidence, which may state absurd sizes.
    let u = p.unit.max(1);
    match family {
        Family::VariableLength => {
            let mut prev = None;
            for _ in 0..p.steps {
                b.step();
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
                b.step();
                let s = &mut seqs[(step as usize + rng.range(0, 3) as usize) % 4];
                s.1 = s.1.saturating_add(u);
                let grown = b.alloc(s.1);
                if let Some(old) = s.0.replace(grown) {
                    b.free(old);
                }
            }
        }
        Family::DynamicBatch | Family::PeriodicEmptyCache => {
            for step in 0..p.steps {
                b.step();
                let batch = rng.range(1, 8);
                let input = b.alloc(u.saturating_mul(batch));
                let hidden = b.alloc(u.saturating_mul(2 * batch));
                b.free(input);
                b.alloc(u.saturating_mul(batch) / 8);
                b.free(hidden);
                if family == Family::PeriodicEmptyCache && step % 4 == 3 {
                    b.events.push(Event::EmptyCache);
                }
            }
        }
        Family::MixedSmallLarge => {
            for step in 0..p.steps {
                b.step();
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
                b.step();
                let gone = b.alloc(u);
                b.alloc(u);
                b.free(gone);
            }
        }
        Family::PinnedMidSize => {
            // Sizes in quarter MiBs: 11–19 MiB whatever the unit; the unit
            // sizes the transient request that needs the holes merged.
            const QUARTER: u64 = 1 << 18;
            for _ in 0..p.steps {
                b.step();
                let a = b.alloc(rng.range(44, 76) * QUARTER);
                b.alloc(rng.range(44, 76) * QUARTER);
                let c = b.alloc(rng.range(44, 76) * QUARTER);
                b.free(a);
                b.free(c);
                let t = b.alloc(u.saturating_mul(rng.range(1, 3)));
                b.free(t);
            }
        }
        Family::SplitPinned => {
            for _ in 0..p.steps {
                b.step();
                let buffer = b.alloc(u.saturating_mul(rng.range(4, 16)));
                b.free(buffer);
                let pieces = rng.range(2, 6);
                let kept = rng.range(0, pieces - 1);
                for i in 0..pieces {
                    let piece = b.alloc(u.saturating_mul(rng.range(2, 6)) / 4);
                    if i != kept {
                        b.free(piece);
                    }
                }
            }
        }
    }
    (b.events, b.starts)
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
    /// The request as the message prints it ("Tried to allocate"): the size of
    /// the segment the allocator would have created.
    pub requested_bytes: Option<u64>,
}

/// What the evidence says, and the room the allocator had.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub observed: Figures,
    /// Bytes the allocator could use: reserved + free at the OOM (the card's
    /// total minus other processes and the CUDA context), or the user's
    /// `--capacity`.
    pub capacity: u64,
    /// The config in use when the evidence was printed.
    pub settings: Settings,
}

/// The relative error the fit must reach on allocated and reserved bytes.
pub const TOLERANCE: f64 = 0.05;

/// How the current config's run of a probe ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// It ran out of memory on the appended request (the message's).
    AtRequest,
    /// It ran out of memory earlier, on another request (`requested` bytes,
    /// "Tried to allocate" `alloc_size`).
    Earlier { requested: u64, alloc_size: u64 },
    /// It did not run out of memory.
    NoOom,
}

/// A fitted probe.
#[derive(Debug, Clone, PartialEq)]
pub struct Calibration {
    pub family: Family,
    pub params: Params,
    pub observed: Figures,
    /// What the probe reproduces under the current config: at the OOM when it
    /// ran out of memory, else at the end of its run.
    pub reproduced: Figures,
    /// max of the relative errors on allocated and reserved bytes.
    pub error: f64,
    pub within_tolerance: bool,
    /// The request appended for the message's (None without one).
    pub request_bytes: Option<u64>,
    /// How the current config's run at `capacity` ended.
    pub ending: Ending,
    /// The evidence is reproduced: with a request, the run failed on it with
    /// the figures within tolerance; without one (a summary), the figures are
    /// within tolerance and nothing ran out of memory.
    pub reproduces: bool,
    pub capacity: u64,
    /// The probe itself, the request last when there is one.
    pub trace: Trace,
    /// What a config is judged on: [`Calibration::continued`] by
    /// [`CONTINUATION`]. Set for the ensemble's members only.
    pub judged: Trace,
}

/// The share of a probe's steps it runs on past the message's request when a
/// config is judged on it: the job did not end at the failing request, and a
/// config that gets past it only to run out of memory a few steps later has
/// not avoided the OOM. (Measured on the trace families of
/// `tests/support/trace_families.rs`: 3 % agreed with the traces more often
/// than none or 10 %; docs/EVALUATION.md.)
pub const CONTINUATION: f64 = 0.03;

/// The longer run past the request a config must also survive for a verdict
/// that passes a gate (exit 0): the message cannot tell how much more the
/// job will hold later, so a pass needs room for it to grow.
pub const GATE_CONTINUATION: f64 = 0.1;

impl Calibration {
    /// With a request: the probe, the request (freed at once) and `share`
    /// more of the family's steps; without one, the probe.
    pub fn continued(&self, share: f64) -> Trace {
        let Some(request) = self.request_bytes else {
            return self.trace.clone();
        };
        let extra = ((self.params.steps as f64 * share).ceil() as u32).max(1);
        let longer = Params {
            steps: self.params.steps.saturating_add(extra),
            ..self.params
        };
        let (events, starts) = generate_steps(self.family, &longer);
        let cut = starts
            .get(self.params.steps as usize)
            .copied()
            .unwrap_or(events.len());
        let id = id_span(&events);
        let mut out = Vec::with_capacity(events.len() + 2);
        out.extend_from_slice(&events[..cut]);
        out.push(Event::Alloc {
            id,
            size: request,
            stream: 0,
        });
        out.push(Event::Free { id });
        out.extend_from_slice(&events[cut..]);
        trace(out)
    }
}

fn rel_err(got: u64, want: u64) -> f64 {
    if want == 0 {
        return if got == 0 { 0.0 } else { 1.0 };
    }
    (got as f64 - want as f64).abs() / want as f64
}

/// A request whose segment ("Tried to allocate", `get_allocation_size` of the
/// rounded request) is the printed `alloc_size`: a printed 2 MiB is a
/// small-pool request (at most 1 MiB), a printed large-buffer size a 1–10 MiB
/// request (the largest such, the hardest to place), anything else itself.
pub fn request_for(alloc_size: u64, settings: &Settings) -> u64 {
    let large_buffer = crate::allocator::sizes::large_segment_size(settings);
    if alloc_size <= SMALL_BUFFER {
        SMALL_SIZE
    } else if alloc_size == large_buffer || alloc_size == LARGE_BUFFER {
        MIN_LARGE_ALLOC - MIN_BLOCK_SIZE
    } else {
        alloc_size
    }
}

/// "Tried to allocate …" for `request` under `settings`, as PyTorch prints it.
fn printed_alloc_size(request: u64, settings: &Settings) -> String {
    format_size(get_allocation_size(round_size(request, settings), settings))
}

/// Steps at which a family with this unit holds about `allocated` bytes
/// (live bytes grow about linearly with the steps): extrapolated from a short
/// run, then refined by the same ratio twice, keeping the closest. Past
/// [`MAX_PROBE_STEPS`], that many steps and ballast for the rest.
fn fit_steps(
    family: Family,
    unit: u64,
    seed: u64,
    allocated: u64,
    replay: &(impl Fn(&Trace, u64) -> RunFigures + Sync),
) -> Params {
    const PILOT: u32 = 64;
    const MAX_STEPS: u32 = 1 << 18;
    let at = |steps: u32| {
        let p = Params::new(steps, unit, seed);
        replay(&trace(generate(family, &p)), crate::device::NO_LIMIT).end_allocated_bytes
    };
    let scale = |steps: u32, got: u64| {
        (steps as f64 * allocated as f64 / got.max(1) as f64).clamp(1.0, MAX_STEPS as f64) as u32
    };
    let mut steps = scale(PILOT, at(PILOT));
    let mut best = (f64::INFINITY, steps);
    for _ in 0..3 {
        let got = at(steps.min(MAX_PROBE_STEPS));
        if steps > MAX_PROBE_STEPS {
            return Params {
                ballast: allocated.saturating_sub(got),
                ..Params::new(MAX_PROBE_STEPS, unit, seed)
            };
        }
        let err = rel_err(got, allocated);
        if err < best.0 {
            best = (err, steps);
        }
        if err <= TOLERANCE / 5.0 {
            break;
        }
        let next = scale(steps, got);
        if next == steps {
            break;
        }
        steps = next;
    }
    Params::new(best.1, unit, seed)
}

/// Fits `family` with tensors of `unit` bytes: the steps that hold the
/// observed allocated bytes, and, when the evidence has a request, the fewest
/// steps after which the request runs out of memory at the target's capacity
/// (the edge where the real job failed); keeps the better of the two.
fn fit(
    family: Family,
    unit: u64,
    seed: u64,
    target: &Target,
    replay: &(impl Fn(&Trace, u64) -> RunFigures + Sync),
) -> Calibration {
    let fitted = fit_steps(family, unit, seed, target.observed.allocated_bytes, replay);
    let steps = fitted.steps;
    let by_allocated = probe_at(family, fitted, target, replay);
    let Some(printed) = target.observed.requested_bytes else {
        return by_allocated;
    };
    if by_allocated.reproduces {
        return by_allocated;
    }
    let request = request_for(printed, &target.settings);
    let hi = Params {
        steps: steps.saturating_mul(2).max(2),
        ..fitted
    };
    let Some(lo) = first_failing_steps(family, hi, request, target) else {
        return by_allocated;
    };
    if lo == steps {
        return by_allocated;
    }
    let at_edge = probe_at(
        family,
        Params {
            steps: lo,
            ..fitted
        },
        target,
        replay,
    );
    if better(&at_edge, &by_allocated).is_lt() {
        at_edge
    } else {
        by_allocated
    }
}

/// The steps in `1..=p.steps` after which a request of `request` bytes
/// starts to run out of memory (it or an event before it) at the target's
/// capacity under its config, or `None` when `p.steps` do not: a bisection
/// over replays of each prefix with the request appended. More steps mostly
/// hold more memory; where caching makes room later, the outcome is not
/// monotone and it finds a step count where the outcome turns, not always the
/// first. Fewer steps' events are a prefix, so the replay of the longest
/// prefix known to get through is kept and continued rather than replayed again, so the bisection replays about
/// twice `p.steps` steps' events in all, not a prefix per probe.
fn first_failing_steps(family: Family, p: Params, request: u64, target: &Target) -> Option<u32> {
    let (events, starts) = generate_steps(family, &p);
    // The events of the first `k` steps (the ballast before the first).
    let end = |k: u32| match k {
        0 => 0,
        k => starts.get(k as usize).copied().unwrap_or(events.len()),
    };
    let the_request = [Event::Alloc {
        id: id_span(&events),
        size: request,
        stream: 0,
    }];
    let device = SimDevice::new(target.capacity);
    let options = ReplayOptions::default();
    // `passed`: the run of the first `through` steps, which got through them.
    let mut passed = StreamedReplay::new(&target.settings, device, options, 0, 0);
    let mut through = 0u32;
    // Whether `k` (> `through`) steps and the request run out of memory; on
    // no, `passed` moves on to `k` steps.
    let mut fails_after = |k: u32| {
        let mut run = passed.clone();
        if !run.feed(&events[end(through)..end(k)]) {
            return true;
        }
        let mut with_request = run.clone();
        if !with_request.feed(&the_request) {
            return true;
        }
        (passed, through) = (run, k);
        false
    };
    fails_after(p.steps).then(|| bisect(p.steps, fails_after))
}

/// The `k` in `1..=hi` where `fails` turns true, `fails(hi)` being true:
/// the first, when `fails` is monotone.
fn bisect(hi: u32, mut fails: impl FnMut(u32) -> bool) -> u32 {
    let (mut lo, mut hi) = (1u32, hi);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if fails(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

/// The probe of `params` with the request appended, replayed under the
/// current config at the target's capacity, and how it compares.
fn probe_at(
    family: Family,
    params: Params,
    target: &Target,
    replay: &(impl Fn(&Trace, u64) -> RunFigures + Sync),
) -> Calibration {
    let want = target.observed;
    let request_bytes = want
        .requested_bytes
        .map(|printed| request_for(printed, &target.settings));
    let mut events = generate(family, &params);
    if let Some(size) = request_bytes {
        events.push(Event::Alloc {
            id: id_span(&events),
            size,
            stream: 0,
        });
    }
    let trace = trace(events);
    let run = replay(&trace, target.capacity);
    let ending = match &run.oom {
        None => Ending::NoOom,
        Some(o) if request_bytes.is_some() && o.event_index + 1 == trace.len() as u64 => {
            Ending::AtRequest
        }
        Some(o) => Ending::Earlier {
            requested: o.requested_bytes,
            alloc_size: get_allocation_size(
                round_size(o.requested_bytes, &target.settings),
                &target.settings,
            ),
        },
    };
    let reproduced = Figures {
        allocated_bytes: run.end_allocated_bytes,
        reserved_bytes: run.end_reserved_bytes,
        requested_bytes: want.requested_bytes,
    };
    let error = rel_err(reproduced.allocated_bytes, want.allocated_bytes)
        .max(rel_err(reproduced.reserved_bytes, want.reserved_bytes));
    let within_tolerance = error <= TOLERANCE;
    let reproduces = within_tolerance
        && match want.requested_bytes {
            // The same rounded size as printed: the appended request is built
            // from it, but a config's rounding may still print another.
            Some(printed) => {
                ending == Ending::AtRequest
                    && request_bytes.is_some_and(|r| {
                        printed_alloc_size(r, &target.settings) == format_size(printed)
                    })
            }
            None => ending == Ending::NoOom,
        };
    Calibration {
        family,
        params,
        observed: want,
        reproduced,
        error,
        within_tolerance,
        request_bytes,
        ending,
        reproduces,
        capacity: target.capacity,
        trace,
        judged: Trace::default(),
    }
}

/// Better: reproduces, then within tolerance, then the smaller error; ties go
/// to the first family, the smaller unit and fewer steps (deterministic).
fn better(a: &Calibration, b: &Calibration) -> std::cmp::Ordering {
    let key = |c: &Calibration| (!c.reproduces, !c.within_tolerance);
    key(a)
        .cmp(&key(b))
        .then(a.error.total_cmp(&b.error))
        .then(a.family.cmp(&b.family))
        .then(a.params.unit.cmp(&b.params.unit))
        .then(a.params.steps.cmp(&b.params.steps))
}

/// Probes fitted to the same figures, one per family: the workloads a config
/// is judged on when there is no trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Ensemble {
    pub observed: Figures,
    pub capacity: u64,
    /// Each family's best fit, those that reproduce the evidence first, then
    /// by fit error.
    pub members: Vec<Calibration>,
    /// The card's free memory when the message shows more of it than the
    /// request's segment needs (beyond [`TOLERANCE`] of reserved): no workload
    /// on the card runs out of memory there, so none is fitted (`members` is
    /// empty).
    pub free_beyond_request: Option<u64>,
}

impl Ensemble {
    /// The members that reproduce the evidence: the plausible workloads.
    pub fn plausible(&self) -> impl Iterator<Item = &Calibration> {
        self.members.iter().filter(|m| m.reproduces)
    }

    /// The member closest to the evidence (a plausible one when there is one).
    pub fn best(&self) -> Option<&Calibration> {
        self.members.first()
    }

    /// The message's own headroom: the room the allocator could reach less
    /// the live tensors and the request as printed (negative when they do not
    /// fit even with nothing cached but unused). None without a request or a
    /// known room.
    pub fn headroom(&self) -> Option<i128> {
        let request = self.observed.requested_bytes?;
        (self.capacity != crate::device::NO_LIMIT).then(|| {
            i128::from(self.capacity)
                - i128::from(self.observed.allocated_bytes)
                - i128::from(request)
        })
    }
}

/// Fits every family over a range of tensor sizes and keeps each family's
/// best fit. `replay(trace, capacity)` runs a trace through the bundled
/// allocator under the current config (`target.settings`) on the simulated
/// card and returns the run's figures; the search for the steps at the edge
/// runs that same replay itself, in pieces ([`first_failing_steps`]).
pub fn fit_ensemble(
    target: &Target,
    seed: u64,
    replay: impl Fn(&Trace, u64) -> RunFigures + Sync,
) -> Option<Ensemble> {
    let want = target.observed;
    if want.allocated_bytes == 0 {
        return None;
    }
    // The simulated card fails a cudaMalloc only when its free memory is
    // smaller than the segment, so with more free than the request's segment
    // (and room for the fit's tolerance on reserved) no fit can reproduce
    // the message: the failure had another cause (`diagnose` says which).
    if let Some(printed) = want.requested_bytes
        && target.capacity != crate::device::NO_LIMIT
    {
        let request = request_for(printed, &target.settings);
        let segment = get_allocation_size(round_size(request, &target.settings), &target.settings);
        let free = target.capacity.saturating_sub(want.reserved_bytes);
        let slack = (TOLERANCE * want.reserved_bytes as f64) as u64;
        if free > segment.saturating_add(slack) {
            return Some(Ensemble {
                observed: want,
                capacity: target.capacity,
                members: Vec::new(),
                free_beyond_request: Some(free),
            });
        }
    }
    // Tensor sizes from 1/4096 to 1/2 of what is allocated, at least 64 KiB,
    // and from 1/16 of the failing request to all of it when there is one.
    let mut units: Vec<u64> = (1..=12)
        .map(|k| (want.allocated_bytes >> k).max(64 << 10))
        .collect();
    if let Some(r) = want.requested_bytes {
        units.extend((0..=4).map(|k| (r >> k).max(64 << 10)));
    }
    units.sort_unstable();
    units.dedup();
    let candidates: Vec<(Family, u64)> = Family::ALL
        .iter()
        .flat_map(|&f| units.iter().map(move |&u| (f, u)))
        .collect();
    let fits: Vec<Calibration> = candidates
        .par_iter()
        .map(|&(family, unit)| fit(family, unit, seed, target, &replay))
        .collect();
    let mut members: Vec<Calibration> = Vec::new();
    for c in fits {
        match members.iter_mut().find(|m| m.family == c.family) {
            Some(m) if better(&c, m).is_lt() => *m = c,
            Some(_) => {}
            None => members.push(c),
        }
    }
    members.sort_by(better);
    for m in &mut members {
        m.judged = m.continued(CONTINUATION);
    }
    Some(Ensemble {
        observed: want,
        capacity: target.capacity,
        members,
        free_beyond_request: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The checkpointed bisection finds what bisecting over fresh replays of
    /// each prefix with the request appended finds, for every family, on cards
    /// where the answer is early, late and never; and each family's fewer
    /// steps are a prefix of its more steps, which it relies on. (The outcome
    /// is not always monotone in the steps, caching can make room later: the
    /// bisection then finds a step count where it turns, not the first.)
    #[test]
    fn first_failing_steps_bisects_as_fresh_replays_do() {
        use crate::workload::replay;
        const MIB: u64 = 1 << 20;
        let settings = Settings::default();
        let mut answers = Vec::new();
        for family in Family::ALL {
            let p = Params::new(48, 3 * MIB, 5);
            let (all, starts) = generate_steps(family, &p);
            for k in [1, 7, 30] {
                let fewer = generate(family, &Params { steps: k, ..p });
                assert_eq!(fewer, all[..starts[k as usize]], "{family:?} at {k} steps");
            }
            for capacity in [64 * MIB, 160 * MIB, 400 * MIB, 1 << 30] {
                let target = Target {
                    observed: Figures::default(),
                    capacity,
                    settings: settings.clone(),
                };
                let request = 40 * MIB;
                let fails = |k: u32| {
                    let mut events = generate(family, &Params { steps: k, ..p });
                    events.push(Event::Alloc {
                        id: id_span(&events),
                        size: request,
                        stream: 0,
                    });
                    let run = replay(&trace(events), &settings, SimDevice::new(capacity));
                    run.figures.oom.is_some()
                };
                let expected = fails(p.steps).then(|| bisect(p.steps, fails));
                let got = first_failing_steps(family, p, request, &target);
                assert_eq!(got, expected, "{family:?} on {capacity}");
                answers.push(got);
            }
        }
        let early = answers.iter().filter(|a| a.is_some_and(|k| k <= 4)).count();
        let late = answers.iter().filter(|a| a.is_some_and(|k| k > 4)).count();
        let never = answers.iter().filter(|a| a.is_none()).count();
        assert!(early > 0 && late > 0 && never > 0, "{answers:?}");
    }

    /// A small request on a large, nearly full card: the tensor sizes follow
    /// the request, so holding what is allocated would take far more steps
    /// than a probe runs; ballast stands for the rest, every member stays
    /// within the step bound, and the figures are still reproduced.
    #[test]
    fn a_small_request_on_a_large_card_fits_with_ballast_in_bounded_steps() {
        use crate::workload::replay;
        const GIB: u64 = 1 << 30;
        let settings = Settings::default();
        let allocated = 15 * GIB + 887 * (1 << 20);
        let reserved = allocated + 787 * (1 << 20);
        let target = Target {
            observed: Figures {
                allocated_bytes: allocated,
                reserved_bytes: reserved,
                requested_bytes: Some(20 << 20),
            },
            capacity: reserved + (2 << 20),
            settings: settings.clone(),
        };
        let e = fit_ensemble(&target, 1, |t, cap| {
            replay(t, &settings, SimDevice::new(cap)).figures
        })
        .unwrap();
        // Fitted to the allocated bytes within the bound, bisected to the
        // request's edge within twice it.
        assert!(
            e.members
                .iter()
                .all(|m| m.params.steps <= 2 * MAX_PROBE_STEPS)
        );
        let ballasted: Vec<_> = e.members.iter().filter(|m| m.params.ballast > 0).collect();
        assert!(
            !ballasted.is_empty(),
            "{:?}",
            e.members.iter().map(|m| m.params).collect::<Vec<_>>()
        );
        // The ballast is live memory: a member's allocated figure counts it.
        for m in &ballasted {
            assert!(m.reproduced.allocated_bytes >= m.params.ballast);
        }
        assert!(
            e.plausible().count() > 0,
            "no member reproduces the message"
        );
    }

    #[test]
    fn epochs_free_everything_between_runs() {
        let p = Params::new(50, 1 << 20, 3);
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
            let p = Params::new(200, 3 << 20, 7);
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
                    Event::EmptyCache => assert_eq!(family, Family::PeriodicEmptyCache),
                    other => panic!("{family:?}: unexpected {other:?}"),
                }
            }
            assert!(!live.is_empty(), "{family:?} keeps something live");
        }
    }

    /// The request appended for a printed "Tried to allocate" gets that
    /// segment size back under the defaults, also for a size read back from
    /// two printed decimals ("4.42 GiB" is no whole number of 2 MiB pages).
    #[test]
    fn requests_print_as_the_message_did() {
        let s = Settings::default();
        let gib_4_42 = (4.42 * (1u64 << 30) as f64).round() as u64;
        for printed in [
            2 << 20,
            20 << 20,
            22 << 20,
            1006 << 20,
            4532 << 20,
            gib_4_42,
        ] {
            assert_eq!(
                printed_alloc_size(request_for(printed, &s), &s),
                format_size(printed),
                "{printed}"
            );
        }
        assert!(request_for(2 << 20, &s) <= SMALL_SIZE);
        assert!((SMALL_SIZE..MIN_LARGE_ALLOC).contains(&request_for(20 << 20, &s)));
    }
}
