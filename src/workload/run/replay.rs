//! A run replayed step by step on one device, skipping the steps it has
//! seen: a step's events follow from its size and the size before, and the
//! allocator's decisions from its state, so a step that starts from a state
//! seen before ([`StreamedReplay::state_hash`]) with the same two sizes
//! ends in the same state with the same figures. Once the cache stops
//! growing, a run's states repeat and most of a long run is looked up, not
//! replayed. [`Memo`] holds what was seen (the figures and a copy of the end
//! state, to go on from where a lookup leaves off), within a memory budget.

use super::{Origin, Prev, RunPlan, SizeCache, StepAsk, step_events};
use crate::conf::Settings;
use crate::device::Device;
use crate::workload::replay::{DriverWork, ReplayOptions, StreamedReplay};
use crate::workload::trace::Event;
use rustc_hash::FxHashMap;
use std::sync::Arc;

/// One step's figures under one config.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepFigures {
    /// Reserved and allocated (block) bytes at their highest during the step.
    pub peak_reserved: u64,
    pub peak_allocated: u64,
    /// Reserved and allocated bytes when the step ended (at its OOM, if any).
    pub reserved_after: u64,
    pub allocated_after: u64,
    /// The step's events.
    pub events: u64,
    /// The event (from the step's first, 0) that first raised reserved
    /// memory to the step's peak; `None` when it never rose.
    pub peak_event: Option<u64>,
    /// The driver work the step did.
    pub work: DriverWork,
    /// The step's request that ran out of memory: its event (from the
    /// step's first, 0) and bytes.
    pub oom: Option<(u64, u64)>,
}

/// Where a run ran out of memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunOom {
    /// The step, from 0.
    pub step: usize,
    /// The failing event, from the step's first (0).
    pub event: u64,
    pub requested_bytes: u64,
}

/// A run's replay: every step's figures up to the end or the OOM.
#[derive(Debug, Clone, PartialEq)]
pub struct RunReplay {
    pub steps: Vec<StepFigures>,
    pub oom: Option<RunOom>,
    /// Steps replayed event by event (the rest were looked up).
    pub replayed_steps: usize,
}

impl RunReplay {
    /// Reserved bytes at their highest over the run, and the first step
    /// (from 0) that reached it.
    pub fn peak_reserved(&self) -> (u64, usize) {
        self.steps.iter().enumerate().fold((0, 0), |best, (i, s)| {
            if s.peak_reserved > best.0 {
                (s.peak_reserved, i)
            } else {
                best
            }
        })
    }

    /// Allocated (block) bytes at their highest over the run.
    pub fn peak_allocated(&self) -> u64 {
        self.steps
            .iter()
            .map(|s| s.peak_allocated)
            .max()
            .unwrap_or(0)
    }

    /// The run's driver work.
    pub fn work(&self) -> DriverWork {
        let mut w = DriverWork::default();
        for s in &self.steps {
            w.add(&s.work);
        }
        w
    }
}

/// What one step did from one state: its figures, the state it ended in
/// and the replay at that point.
struct Seen<D: Device> {
    figures: StepFigures,
    end_hash: u64,
    end: Arc<StreamedReplay<D>>,
    bank: u32,
}

/// Steps seen, by (start state, size before, size), for one config on one
/// card; shared by the runs replayed under them (a cap's bisection).
pub struct Memo<D: Device> {
    seen: FxHashMap<(u64, u64, u64), Seen<D>>,
    /// Bytes the copies of end states hold, about.
    bytes: usize,
    budget: usize,
}

impl<D: Device> Memo<D> {
    /// A memo whose copies of end states hold at most about `budget` bytes
    /// (past it the memo starts over); 0 turns skipping off.
    pub fn new(budget: usize) -> Self {
        Memo {
            seen: FxHashMap::default(),
            bytes: 0,
            budget,
        }
    }
}

/// Events handed to the replay at a time within a step.
const CHUNK: usize = 4096;

/// Replays the run of `steps` (sizes) under `settings` on a fresh `device`,
/// looking up in `memo` the steps it has seen. `progress` is told each step
/// done.
pub fn replay<D: Device + Clone>(
    plan: &RunPlan,
    steps: &[u64],
    settings: &Settings,
    device: D,
    memo: &mut Memo<D>,
    progress: &(dyn Fn(usize) + Sync),
) -> RunReplay {
    run_steps(plan, steps, settings, device, memo, progress).0
}

/// [`replay`], and the replay where it stopped with the step before it
/// (the state a next step would start from).
fn run_steps<D: Device + Clone>(
    plan: &RunPlan,
    steps: &[u64],
    settings: &Settings,
    device: D,
    memo: &mut Memo<D>,
    progress: &(dyn Fn(usize) + Sync),
) -> (RunReplay, StreamedReplay<D>, Option<Prev>) {
    let mut out = RunReplay {
        steps: Vec::with_capacity(steps.len()),
        oom: None,
        replayed_steps: 0,
    };
    let first = steps.first().copied().unwrap_or(1);
    let ids = plan.ids(first);
    let mut live = StreamedReplay::new(settings, device, ReplayOptions::default(), 0, ids);
    // Where a lookup left off: the state's hash and the replay to go on
    // from (`None`: `live` is the state now).
    let mut ahead: Option<(u64, Arc<StreamedReplay<D>>)> = None;
    let mut sizes = SizeCache::new(plan);
    let (mut events, mut freed) = (Vec::new(), Vec::new());
    let mut prev: Option<Prev> = None;
    for (i, &size) in steps.iter().enumerate() {
        let bank = prev.map_or(0, |p| 1 - p.bank);
        let hash = match &ahead {
            Some((h, _)) => Some(*h),
            None => match prev {
                Some(p) => live.state_hash(plan.handed_ids(first, &p)),
                None => live.state_hash(std::iter::empty()),
            },
        };
        let key = hash.map(|h| (h, prev.map_or(0, |p| p.size), size));
        let rec = plan.recording_for(size);
        if let Some(seen) = key.and_then(|k| memo.seen.get(&k)) {
            out.steps.push(seen.figures);
            ahead = Some((seen.end_hash, Arc::clone(&seen.end)));
            prev = Some(Prev {
                size,
                rec,
                bank: seen.bank,
            });
            progress(i + 1);
            continue;
        }
        if let Some((_, from)) = ahead.take() {
            live = (*from).clone();
        }
        events.clear();
        let ask = StepAsk {
            size,
            first,
            bank,
            prev,
        };
        step_events(plan, &mut sizes, ask, &mut events, None, &mut freed);
        let figures = replay_step(&mut live, &events);
        out.steps.push(figures);
        out.replayed_steps += 1;
        progress(i + 1);
        if let Some((event, requested_bytes)) = figures.oom {
            out.oom = Some(RunOom {
                step: i,
                event,
                requested_bytes,
            });
            break;
        }
        let here = Prev { size, rec, bank };
        if let Some(key) = key
            && memo.budget > 0
            && let Some(end_hash) = live.state_hash(plan.handed_ids(first, &here))
        {
            let bytes = live.approx_bytes();
            if memo.bytes + bytes > memo.budget {
                memo.seen.clear();
                memo.bytes = 0;
            }
            memo.bytes += bytes;
            memo.seen.insert(
                key,
                Seen {
                    figures,
                    end_hash,
                    end: Arc::new(live.clone()),
                    bank,
                },
            );
        }
        prev = Some(here);
    }
    if let Some((_, from)) = ahead {
        live = (*from).clone();
    }
    (out, live, prev)
}

/// Feeds one step's events and reads its figures.
fn replay_step<D: Device>(live: &mut StreamedReplay<D>, events: &[Event]) -> StepFigures {
    live.restart_peaks();
    let work = live.work();
    let start = live.events_fed();
    for chunk in events.chunks(CHUNK) {
        if !live.feed(chunk) {
            break;
        }
    }
    let (peak_allocated, peak_reserved, peak_at) = live.peaks();
    let (allocated_after, reserved_after) = live.current();
    StepFigures {
        peak_reserved,
        peak_allocated,
        reserved_after,
        allocated_after,
        events: events.len() as u64,
        peak_event: peak_at.map(|e| e - start),
        work: live.work().since(&work),
        oom: live
            .oom()
            .map(|o| (o.event_index - start, o.requested_bytes)),
    }
}

/// The replay at the start of step `step` of the run (from 0), and the
/// step's events with where each comes from: to look inside a step (the
/// run's peak, its OOM).
pub fn at_step<D: Device + Clone>(
    plan: &RunPlan,
    steps: &[u64],
    step: usize,
    settings: &Settings,
    device: D,
    memo: &mut Memo<D>,
) -> (StreamedReplay<D>, Vec<Event>, Vec<Origin>) {
    let step = step.min(steps.len());
    let (_, live, prev) = run_steps(plan, &steps[..step], settings, device, memo, &|_| {});
    let (mut events, mut origins, mut freed) = (Vec::new(), Vec::new(), Vec::new());
    if let Some(&size) = steps.get(step) {
        let ask = StepAsk {
            size,
            first: steps.first().copied().unwrap_or(size),
            bank: prev.map_or(0, |p| 1 - p.bank),
            prev,
        };
        let mut sizes = SizeCache::new(plan);
        step_events(
            plan,
            &mut sizes,
            ask,
            &mut events,
            Some(&mut origins),
            &mut freed,
        );
    }
    (live, events, origins)
}
