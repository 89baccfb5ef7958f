//! What one recorded step hands to the next, for `forecast`'s runs of many
//! steps (shared/forecast/README.md, "What a run is"). A recording's memory
//! live before its trace began splits in two: **F**, freed during the trace
//! (what the step before left live), and **P**, still live at the end
//! (weights, optimizer state). **L** is what the trace's own allocations
//! leave live at its end, for the next step. Each F free gets a *role*: the
//! L block it stands for one step later, matched by exact size first, then
//! in order. What L holds that no F free stands for is the step's
//! *leftover*, read three ways ([`Leftover`]).

use super::{Recording, Step};
use crate::snapshot::trace_metrics::step_starts;

/// No role: an F free that stands for no L block, a P allocation.
pub const NO_ROLE: u32 = u32::MAX;

/// Leftovers past this share of the recording's fresh peak of reserved
/// bytes are read as state or a leak, not as memory the next step frees
/// (shared/forecast/README.md keeps series whose leftovers are within it).
pub const LEFTOVER_SHARE: f64 = 0.02;

/// How a run treats the L blocks no F free stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leftover {
    /// Freed at the end of the next step, as the recording shows nothing
    /// freeing them (shared/forecast/README.md's rule; leftovers within
    /// [`LEFTOVER_SHARE`] of the peak, or none).
    NextStep,
    /// State the first step makes and every later step keeps (optimizer
    /// state made at the first step): the recording starts with nothing
    /// left by a step before (F is empty) and leaves more than
    /// [`LEFTOVER_SHARE`] of its peak reserved. The first step's is kept for the
    /// whole run; later steps do not make it again.
    State,
    /// Memory the workload leaks: the recording holds several steps and
    /// more than one leaves blocks nothing frees. Carried forward: every
    /// step's stays live to the end of the run.
    Leak,
}

/// A recording's hand-over from step to step.
#[derive(Debug, Clone, PartialEq)]
pub struct Carry {
    /// L: the allocations live at the end of the trace, in allocation order.
    pub left: Vec<u32>,
    /// Per pre-trace allocation: the position in [`Self::left`] of the L
    /// block its free stands for ([`NO_ROLE`] for P, or an F free without one).
    pub role: Vec<u32>,
    /// Per position in [`Self::left`]: whether an F free stands for it.
    pub stood_for: Vec<bool>,
    /// |F|: pre-trace allocations freed during the trace.
    pub freed_before: usize,
    /// Bytes of the L blocks no F free stands for (recorded sizes).
    pub leftover_bytes: u64,
    pub leftover: Leftover,
    /// Steps the recording holds (1 when it shows no cycles).
    pub recorded_steps: usize,
}

impl Carry {
    /// Reads the hand-over of `rec` from its recorded sizes; `fresh_peak` is
    /// its fresh run's peak of reserved bytes under the defaults, what the
    /// leftovers are weighed against.
    pub fn of(rec: &Recording, fresh_peak: u64) -> Carry {
        let mut live = vec![false; rec.allocs.len()];
        let mut freed = Vec::new();
        for s in &rec.timeline {
            match *s {
                Step::Alloc(i) => live[i as usize] = true,
                Step::Free(i) => live[i as usize] = false,
                Step::PreFree(j) => freed.push(j),
            }
        }
        let left: Vec<u32> = (0..rec.allocs.len())
            .filter(|&i| live[i])
            .map(|i| i as u32)
            .collect();
        let mut role = vec![NO_ROLE; rec.pre.len()];
        let mut stood_for = vec![false; left.len()];
        // 1. Exact size: the same tensor one step apart has the same size.
        let mut by_size: rustc_hash::FxHashMap<u64, Vec<u32>> = Default::default();
        for (pos, &i) in left.iter().enumerate().rev() {
            by_size
                .entry(rec.allocs[i as usize].size)
                .or_default()
                .push(pos as u32);
        }
        let mut unmatched = Vec::new();
        for &j in &freed {
            let size = rec.pre.get(j as usize).map_or(0, |p| p.size);
            match by_size.get_mut(&size).and_then(Vec::pop) {
                Some(pos) => {
                    role[j as usize] = pos;
                    stood_for[pos as usize] = true;
                }
                None => unmatched.push(j),
            }
        }
        // 2. The rest in order: the first L block not yet taken.
        let mut next = 0usize;
        for j in unmatched {
            while next < left.len() && stood_for[next] {
                next += 1;
            }
            if next == left.len() {
                break;
            }
            role[j as usize] = next as u32;
            stood_for[next] = true;
        }
        let leftover_bytes: u64 = left
            .iter()
            .zip(&stood_for)
            .filter(|(_, s)| !**s)
            .map(|(&i, _)| rec.allocs[i as usize].size)
            .sum();
        let starts = recorded_step_starts(rec);
        let recorded_steps = starts.len() + 1;
        let big = leftover_bytes as f64 > LEFTOVER_SHARE * fresh_peak as f64;
        let leftover = if !big {
            Leftover::NextStep
        } else if leaks_across_steps(&left, &stood_for, &starts) {
            Leftover::Leak
        } else if freed.is_empty() {
            Leftover::State
        } else {
            Leftover::NextStep
        };
        Carry {
            left,
            role,
            stood_for,
            freed_before: freed.len(),
            leftover_bytes,
            leftover,
            recorded_steps,
        }
    }

    /// Whether L block `pos` is a leftover (no F free stands for it).
    pub fn is_leftover(&self, pos: usize) -> bool {
        !self.stood_for.get(pos).copied().unwrap_or(true)
    }
}

/// The allocation indices where the recording's steps after the first start
/// (the cycles of its allocated bytes, as `top`'s growth finds them).
fn recorded_step_starts(rec: &Recording) -> Vec<u32> {
    let mut lives = Vec::with_capacity(rec.allocs.len());
    let mut now: i64 = 0;
    for s in &rec.timeline {
        let signed = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        match *s {
            Step::Alloc(i) => {
                lives.push(now);
                now = now.saturating_add(signed(rec.allocs[i as usize].size));
            }
            Step::Free(i) => now = now.saturating_sub(signed(rec.allocs[i as usize].size)),
            Step::PreFree(j) => {
                now = now.saturating_sub(signed(rec.pre.get(j as usize).map_or(0, |p| p.size)))
            }
        }
    }
    step_starts(&lives, now)
}

/// Leftovers made in two recorded steps or more: each step leaks.
fn leaks_across_steps(left: &[u32], stood_for: &[bool], starts: &[u32]) -> bool {
    if starts.is_empty() {
        return false;
    }
    let mut steps = left
        .iter()
        .zip(stood_for)
        .filter(|(_, s)| !**s)
        .map(|(&i, _)| starts.partition_point(|&b| b <= i));
    let Some(first) = steps.next() else {
        return false;
    };
    steps.any(|s| s != first)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::fit::{Alloc, Pre};

    /// A recording whose trace frees `freed` (pre-trace sizes, in order)
    /// among allocations of `made` sizes, all of them left live.
    fn recording(freed: &[u64], made: &[u64]) -> Recording {
        let alloc = |size| Alloc {
            size,
            stream: 0,
            key: 0,
            coarse: 0,
            site: 0,
        };
        let mut timeline = Vec::new();
        for i in 0..made.len().max(freed.len()) {
            if i < made.len() {
                timeline.push(Step::Alloc(i as u32));
            }
            if i < freed.len() {
                timeline.push(Step::PreFree(i as u32));
            }
        }
        Recording {
            input: "r".into(),
            size: 1,
            device: 0,
            devices: vec![0],
            settings: crate::conf::Settings::default(),
            entries: timeline.len(),
            allocs: made.iter().map(|&s| alloc(s)).collect(),
            pre: freed
                .iter()
                .enumerate()
                .map(|(j, &size)| Pre {
                    addr: j as u64,
                    size,
                    site: 0,
                })
                .collect(),
            timeline,
            sites: vec![String::new()],
        }
    }

    #[test]
    fn roles_go_by_exact_size_first_then_in_order() {
        // Frees of 30, 10, 99 and 10; the step leaves 10, 20, 30, 10.
        let rec = recording(&[30, 10, 99, 10], &[10, 20, 30, 10]);
        let c = Carry::of(&rec, 1_000);
        assert_eq!(c.left, vec![0, 1, 2, 3]);
        // 30 → the 30 (position 2), the first 10 → position 0, the second
        // 10 → position 3; 99 matches no size and takes the first left: 20.
        assert_eq!(c.role, vec![2, 0, 1, 3]);
        assert!(c.stood_for.iter().all(|&s| s));
        assert_eq!((c.leftover_bytes, c.freed_before), (0, 4));
        assert_eq!(c.leftover, Leftover::NextStep);
    }

    #[test]
    fn leftovers_past_the_share_with_nothing_freed_are_state() {
        // Nothing left by a step before; 50 bytes left of a 1 000-byte peak.
        let rec = recording(&[], &[20, 30]);
        let c = Carry::of(&rec, 1_000);
        assert_eq!(c.leftover_bytes, 50);
        assert_eq!(c.leftover, Leftover::State);
        assert!(c.is_leftover(0) && c.is_leftover(1));
        // Within 2 % of the peak: freed at the end of the next step.
        assert_eq!(Carry::of(&rec, 2_500).leftover, Leftover::NextStep);
        // More left than freed, with a step before: the next step frees it.
        let rec = recording(&[7], &[20, 30]);
        let c = Carry::of(&rec, 1_000);
        assert_eq!(c.role, vec![0]);
        assert_eq!(c.leftover_bytes, 30);
        assert_eq!(c.leftover, Leftover::NextStep);
    }
}
