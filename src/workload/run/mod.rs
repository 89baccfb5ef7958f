//! The trace of a whole run: many steps whose size varies, replayed as one
//! process (shared/forecast/README.md, "What a run is"). Step 1 is `fit`'s
//! fresh run at its size: the memory live before its recording's trace,
//! in address order, then its timeline. Each later step is the timeline
//! predicted at its size, except that a free of memory the step before left
//! (an F free, [`Carry`]) frees instead the block of the previous step's L
//! that it stands for, and what the previous step left and nothing freed is
//! freed at the end of the step. The first step's persistent memory (P) is
//! never made again. Leftovers read as state or a leak
//! ([`Leftover`]) are kept.
//!
//! [`replay`] replays a run on a device, skipping a step whose start state
//! it has seen before with the same sizes (see there); [`allocated_peak`]
//! is the run's peak of requested bytes, which no config changes.

mod replay;

pub use replay::{Memo, RunOom, RunReplay, StepFigures, at_step, replay};

use super::trace::Event;
use crate::conf::Settings;
use crate::device::NO_LIMIT;
use crate::device::sim::SimDevice;
use crate::snapshot::fit::carry::{Carry, Leftover, NO_ROLE};
use crate::snapshot::fit::grid::{Grid, GridModel};
use crate::snapshot::fit::{Model, Series, Step};
use rustc_hash::FxHashMap;
use std::sync::Arc;

/// The laws a run's steps are sized by.
#[derive(Clone)]
pub enum Laws<'s> {
    /// One knob, a step's size its value: per recording, its laws
    /// ([`Series::model`]).
    One(Vec<Model<'s>>),
    /// Two knobs, the first (the batch) held at `batch`, a step's size the
    /// second's value: per recording, its laws in both ([`Grid::model`]).
    Two {
        grid: &'s Grid,
        models: Vec<GridModel<'s>>,
        batch: u64,
    },
}

/// A series ready to be run: each recording's laws and hand-over.
#[derive(Clone)]
pub struct RunPlan<'s> {
    pub series: &'s Series,
    pub laws: Laws<'s>,
    /// Per recording: what it hands to the next step.
    pub carries: Vec<Carry>,
    /// Per recording, per allocation: a leftover of state that a step after
    /// the first does not make again.
    skip_later: Vec<Vec<bool>>,
    /// The most allocations of one recording (the width of an id bank).
    bank: u32,
}

/// Where an event of a step comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Pre-trace allocation `j` of the first step's recording.
    Pre(u32),
    /// Step `k` of the recording's timeline.
    Step(u32),
    /// The free, at the end of a step, of what the step before left.
    EndOfStep,
}

/// The step before, as the next step's events need it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prev {
    /// Its size.
    pub size: u64,
    /// Its recording.
    pub rec: usize,
    /// The id bank its allocations used.
    pub bank: u32,
}

impl<'s> RunPlan<'s> {
    /// A run of one knob's sizes.
    pub fn new(series: &'s Series) -> Self {
        let models = (0..series.recordings.len())
            .map(|r| series.model(r, None))
            .collect();
        Self::of(series, Laws::One(models))
    }

    /// A run of the second knob's sizes at `batch` of the first.
    pub fn on_grid(grid: &'s Grid, batch: u64) -> Self {
        let models = (0..grid.points.len())
            .map(|r| grid.model(r, None))
            .collect();
        Self::of(
            &grid.series,
            Laws::Two {
                grid,
                models,
                batch,
            },
        )
    }

    /// The same run at another batch (two knobs; one knob: itself).
    pub fn at_batch(&self, b: u64) -> Self {
        let mut plan = self.clone();
        if let Laws::Two { batch, .. } = &mut plan.laws {
            *batch = b;
        }
        plan
    }

    fn of(series: &'s Series, laws: Laws<'s>) -> Self {
        let carries: Vec<Carry> = series
            .recordings
            .iter()
            .map(|rec| {
                // The recording's own fresh run under the defaults: what
                // its leftovers are weighed against.
                let sizes: Vec<u64> = rec.allocs.iter().map(|a| a.size).collect();
                let pre: Vec<u64> = rec.pre.iter().map(|p| p.size).collect();
                let fresh = super::predicted::replay_fresh(
                    rec,
                    (&sizes, &pre),
                    &Settings::default(),
                    SimDevice::new(NO_LIMIT),
                );
                Carry::of(rec, fresh.figures.peak_reserved_bytes)
            })
            .collect();
        let skip_later = series
            .recordings
            .iter()
            .zip(&carries)
            .map(|(rec, c)| {
                let mut skip = vec![false; rec.allocs.len()];
                if c.leftover == Leftover::State {
                    for (pos, &i) in c.left.iter().enumerate() {
                        if c.is_leftover(pos) {
                            skip[i as usize] = true;
                        }
                    }
                }
                skip
            })
            .collect();
        let bank = series
            .recordings
            .iter()
            .map(|r| r.allocs.len())
            .max()
            .unwrap_or(0);
        RunPlan {
            series,
            laws,
            carries,
            skip_later,
            bank: u32::try_from(bank).unwrap_or(u32::MAX),
        }
    }

    /// The recording a step of `size` follows.
    pub fn recording_for(&self, size: u64) -> usize {
        match &self.laws {
            Laws::One(_) => self.series.reference_for(size),
            Laws::Two { grid, batch, .. } => grid.reference_for((*batch, size)).0,
        }
    }

    /// The sizes at a step of `size` of every allocation and pre-trace
    /// allocation of its recording.
    pub fn sizes_at(&self, size: u64, allocs: &mut Vec<u64>, pre: &mut Vec<u64>) {
        let r = self.recording_for(size);
        match &self.laws {
            Laws::One(models) => models[r].sizes_at(size, allocs, pre),
            Laws::Two { models, batch, .. } => models[r].sizes_at((*batch, size), allocs, pre),
        }
    }

    /// The peak of allocated bytes of one step of `size` alone.
    pub fn peak_allocated_at(&self, size: u64) -> u64 {
        let (mut a, mut p) = (Vec::new(), Vec::new());
        self.sizes_at(size, &mut a, &mut p);
        self.series.recordings[self.recording_for(size)].peak_with(&a, &p)
    }

    /// Ids a run whose first step has `first` size uses: the first step's
    /// pre-trace allocations, then two banks of allocation ids (a step's
    /// allocations and the previous step's, still live, never share one).
    pub fn ids(&self, first: u64) -> usize {
        self.pre_ids(first) as usize + 2 * self.bank as usize
    }

    fn pre_ids(&self, first: u64) -> u32 {
        let r = self.recording_for(first);
        u32::try_from(self.series.recordings[r].pre.len()).unwrap_or(u32::MAX)
    }

    /// Whether L block `pos` of recording `rec` is kept past the next step
    /// (state or a leak): nothing frees it.
    fn kept(&self, rec: usize, pos: usize) -> bool {
        let c = &self.carries[rec];
        c.leftover != Leftover::NextStep && c.is_leftover(pos)
    }

    /// The ids of the L blocks a step hands to the next and the next may
    /// free, in allocation order: what the next step's decisions depend on
    /// besides the allocator's state.
    pub fn handed_ids(&self, first: u64, prev: &Prev) -> impl Iterator<Item = u32> + '_ {
        let base = self.pre_ids(first) + prev.bank * self.bank;
        let c = &self.carries[prev.rec];
        let rec = prev.rec;
        c.left
            .iter()
            .enumerate()
            .filter(move |&(pos, _)| !self.kept(rec, pos))
            .map(move |(_, &i)| base + i)
    }
}

/// A step's sizes: of every allocation of its recording, and of the memory
/// live before the recording's trace.
pub type StepSizes = Arc<(Vec<u64>, Vec<u64>)>;

/// The sizes of every allocation of each recording at a step's size,
/// computed once per size (up to a bound, then afresh).
pub struct SizeCache<'p, 's> {
    plan: &'p RunPlan<'s>,
    known: FxHashMap<u64, StepSizes>,
}

/// Sizes remembered at once; past it the cache starts over.
const SIZES_KEPT: usize = 64;

impl<'p, 's> SizeCache<'p, 's> {
    pub fn new(plan: &'p RunPlan<'s>) -> Self {
        SizeCache {
            plan,
            known: FxHashMap::default(),
        }
    }

    pub fn at(&mut self, size: u64) -> StepSizes {
        if let Some(s) = self.known.get(&size) {
            return Arc::clone(s);
        }
        if self.known.len() >= SIZES_KEPT {
            self.known.clear();
        }
        let (mut a, mut p) = (Vec::new(), Vec::new());
        self.plan.sizes_at(size, &mut a, &mut p);
        let s = Arc::new((a, p));
        self.known.insert(size, Arc::clone(&s));
        s
    }
}

/// One step to generate: its size, the run's first size (the pre-trace ids),
/// the bank its allocations use, and the step before (`None`: the first).
#[derive(Debug, Clone, Copy)]
pub struct StepAsk {
    pub size: u64,
    pub first: u64,
    pub bank: u32,
    pub prev: Option<Prev>,
}

/// Appends the events of one step to `out` (and where each comes from to
/// `origins`, when given). `freed` is scratch space.
pub fn step_events(
    plan: &RunPlan,
    sizes: &mut SizeCache,
    ask: StepAsk,
    out: &mut Vec<Event>,
    mut origins: Option<&mut Vec<Origin>>,
    freed: &mut Vec<bool>,
) {
    let r = plan.recording_for(ask.size);
    let rec = &plan.series.recordings[r];
    let carry = &plan.carries[r];
    let at = sizes.at(ask.size);
    let (allocs, pre) = (&at.0, &at.1);
    let pre_ids = plan.pre_ids(ask.first);
    let base = pre_ids + ask.bank * plan.bank;
    let mut push = |e: Event, o: Origin| {
        out.push(e);
        if let Some(origins) = origins.as_deref_mut() {
            origins.push(o);
        }
    };
    if ask.prev.is_none() {
        // shared/series/README.md's fresh process: pre-trace memory first.
        for (j, &size) in pre.iter().enumerate() {
            let id = j as u32;
            push(
                Event::Alloc {
                    id,
                    size,
                    stream: 0,
                },
                Origin::Pre(id),
            );
        }
    }
    let prev = ask.prev.map(|p| (p, &plan.carries[p.rec]));
    freed.clear();
    if let Some((_, pc)) = prev {
        freed.resize(pc.left.len(), false);
    }
    let skip = if ask.prev.is_some() {
        &plan.skip_later[r][..]
    } else {
        &[]
    };
    for (k, s) in rec.timeline.iter().enumerate() {
        let origin = Origin::Step(k as u32);
        match *s {
            Step::Alloc(i) => {
                if skip.get(i as usize).copied().unwrap_or(false) {
                    continue;
                }
                let a = &rec.allocs[i as usize];
                push(
                    Event::Alloc {
                        id: base + i,
                        size: allocs[i as usize],
                        stream: a.stream,
                    },
                    origin,
                );
            }
            Step::Free(i) => push(Event::Free { id: base + i }, origin),
            Step::PreFree(j) => match prev {
                None => push(Event::Free { id: j }, origin),
                Some((p, pc)) => {
                    // The block of the step before that this free stands for.
                    let pos = carry.role.get(j as usize).copied().unwrap_or(NO_ROLE) as usize;
                    if pos < pc.left.len() && !freed[pos] && !plan.kept(p.rec, pos) {
                        freed[pos] = true;
                        let id = pre_ids + p.bank * plan.bank + pc.left[pos];
                        push(Event::Free { id }, origin);
                    }
                }
            },
        }
    }
    if let Some((p, pc)) = prev {
        for (pos, &i) in pc.left.iter().enumerate() {
            if !freed[pos] && !plan.kept(p.rec, pos) {
                let id = pre_ids + p.bank * plan.bank + i;
                push(Event::Free { id }, Origin::EndOfStep);
            }
        }
    }
}

/// splitmix64: the shuffle's generator (allocdoc's own; not torch's).
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The run a padded DataLoader makes of `lengths`: each epoch a shuffle
/// (Fisher–Yates), cut into batches of `batch` (the last partial batch
/// kept), each step's size the batch's longest sample rounded up to a
/// multiple of `pad_to`; `steps` steps (default: one epoch).
pub fn batches(
    lengths: &[u64],
    batch: u64,
    steps: Option<u64>,
    seed: u64,
    pad_to: u64,
) -> Vec<u64> {
    let mut state = seed;
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    let per_epoch = lengths.len().div_ceil(batch as usize);
    let want = steps.map_or(per_epoch, |s| s as usize);
    let mut out = Vec::with_capacity(want);
    while out.len() < want {
        for i in (1..order.len()).rev() {
            let j = (next(&mut state) % (i as u64 + 1)) as usize;
            order.swap(i, j);
        }
        for chunk in order.chunks(batch as usize) {
            if out.len() == want {
                break;
            }
            let longest = chunk.iter().map(|&i| lengths[i]).max().unwrap_or(1);
            out.push(longest.div_ceil(pad_to).saturating_mul(pad_to));
        }
    }
    out
}

/// The run's peak of allocated bytes as requested (the sum of live requested
/// sizes after each event: docs/ATTRIBUTION.md's measure, which no config
/// changes) and the step (from 0) that first reaches it. A step's rise and
/// its net change depend only on its size and the size before, so each
/// pair is walked once.
pub fn allocated_peak(plan: &RunPlan, steps: &[u64]) -> (u64, usize) {
    let Some(&first) = steps.first() else {
        return (0, 0);
    };
    let mut sizes = SizeCache::new(plan);
    let mut known: FxHashMap<(u64, u64), (i128, i128)> = FxHashMap::default();
    let mut events = Vec::new();
    let mut freed = Vec::new();
    let pre_ids = plan.pre_ids(first);
    let first_pre = Arc::clone(&sizes.at(first));
    let (mut now, mut peak, mut peak_step): (i128, i128, usize) = (0, 0, 0);
    let mut prev: Option<Prev> = None;
    for (i, &size) in steps.iter().enumerate() {
        let bank = prev.map_or(0, |p| 1 - p.bank);
        let key = (prev.map_or(0, |p| p.size), size);
        let (rise, net) = match known.get(&key) {
            Some(&v) => v,
            None => {
                events.clear();
                let ask = StepAsk {
                    size,
                    first,
                    bank,
                    prev,
                };
                step_events(plan, &mut sizes, ask, &mut events, None, &mut freed);
                let own = sizes.at(size);
                let before = prev.map(|p| sizes.at(p.size));
                // A free names the first step's pre-trace memory, this
                // step's allocations or the step before's.
                let size_of = |id: u32| -> u64 {
                    if id < pre_ids {
                        return first_pre.1.get(id as usize).copied().unwrap_or(0);
                    }
                    let (b, k) = (
                        (id - pre_ids) / plan.bank,
                        ((id - pre_ids) % plan.bank) as usize,
                    );
                    let from = if b == bank {
                        Some(&own)
                    } else {
                        before.as_ref()
                    };
                    from.and_then(|s| s.0.get(k).copied()).unwrap_or(0)
                };
                let (mut d, mut top) = (0i128, 0i128);
                for e in &events {
                    match *e {
                        Event::Alloc { size, .. } => {
                            d += i128::from(size);
                            top = top.max(d);
                        }
                        Event::Free { id } => d -= i128::from(size_of(id)),
                        _ => {}
                    }
                }
                known.insert(key, (top, d));
                (top, d)
            }
        };
        if now + rise > peak {
            peak = now + rise;
            peak_step = i;
        }
        now += net;
        prev = Some(Prev {
            size,
            rec: plan.recording_for(size),
            bank,
        });
    }
    (u64::try_from(peak.max(0)).unwrap_or(u64::MAX), peak_step)
}
