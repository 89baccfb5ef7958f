//! `StepScan`, the step finder: a trace's steps from its step annotations or, without
//! them, from the cycles of allocated memory.

use super::{Feed, StepSource, signed};
use crate::snapshot::model::{Action, Snapshot, TraceEntry};

/// Finds a trace's steps, alone or inside a [`TraceScan`](super::TraceScan): from the step
/// annotations' start times or, without them, from the cycles of the
/// allocated bytes before each alloc.
pub struct StepScan {
    /// Step START times (annotations), ascending, and the next one due.
    step_times: Vec<i64>,
    next_step: usize,
    /// The alloc index at each annotated step's start.
    step_marks: Vec<u32>,
    /// Allocated (requested) bytes relative to the trace start.
    pub(super) live: i64,
    /// `live` before each alloc.
    lives: Vec<i64>,
    /// Without the annotations yet ([`StepScan::unannotated`]): the latest
    /// (nonzero) time recorded up to each alloc, and in the whole trace, so
    /// that they can be given after the trace ([`StepScan::annotate`]).
    later: Option<(Vec<i64>, i64)>,
}

impl StepScan {
    pub fn new(snap: &Snapshot, device: u32) -> Self {
        StepScan {
            step_times: step_annotations(snap, device),
            ..StepScan::with_room(snap.trace_len(device))
        }
    }

    /// One for a trace of about `entries` entries fed before its device's
    /// step annotations are known (they follow the trace in torch's dict):
    /// [`StepScan::annotate`] gives them once it is fed.
    pub fn unannotated(entries: usize) -> Self {
        StepScan {
            later: Some((Vec::with_capacity(entries / 2), i64::MIN)),
            ..Self::with_room(entries)
        }
    }

    fn with_room(entries: usize) -> Self {
        // Up to half the entries are allocs; untouched capacity costs no memory.
        StepScan {
            step_times: Vec::new(),
            next_step: 0,
            step_marks: Vec::new(),
            live: 0,
            lives: Vec::with_capacity(entries / 2),
            later: None,
        }
    }

    /// The step annotations of `device` in `snap`, for one made
    /// [`StepScan::unannotated`] and fed the whole trace: the marks
    /// [`StepScan::new`] would have set as it was fed. An annotation's step
    /// starts at the first entry whose time reaches its own, so at the
    /// number of allocs whose latest time so far falls short of it (those
    /// times never fall), and only if some entry reaches it.
    pub fn annotate(&mut self, snap: &Snapshot, device: u32) {
        let Some((latest, last)) = self.later.take() else {
            return;
        };
        self.step_times = step_annotations(snap, device);
        self.next_step = self.step_times.partition_point(|&t| t <= last);
        self.step_marks = self.step_times[..self.next_step]
            .iter()
            .map(|&t| u32::try_from(latest.partition_point(|&l| l < t)).unwrap_or(u32::MAX))
            .collect();
    }

    pub(super) fn entry(&mut self, e: &TraceEntry) {
        if let Some((latest, last)) = &mut self.later {
            if e.time_us != 0 {
                *last = (*last).max(e.time_us);
            }
            if e.action == Action::Alloc {
                latest.push(*last);
            }
        }
        if e.time_us != 0 {
            while self
                .step_times
                .get(self.next_step)
                .is_some_and(|&t| t <= e.time_us)
            {
                self.next_step += 1;
                self.step_marks
                    .push(u32::try_from(self.lives.len()).unwrap_or(u32::MAX));
            }
        }
        match e.action {
            Action::Alloc => {
                self.lives.push(self.live);
                self.live = self.live.saturating_add(signed(e.size));
            }
            Action::FreeRequested => self.live = self.live.saturating_sub(signed(e.size)),
            _ => {}
        }
    }

    /// The alloc indices that cut the trace into steps, `0` and the number
    /// of allocs included ([0, b1), [b1, b2), …, [bk, n); no empty step),
    /// and where the cuts came from.
    pub(super) fn cuts(&self) -> (Vec<usize>, StepSource) {
        let n = self.lives.len();
        // What comes before the first step annotation joins the first step.
        let marks = self.step_marks.get(1..).unwrap_or_default();
        let (bounds, source) = if marks.iter().any(|&b| b > 0 && (b as usize) < n) {
            let mut b = marks.to_vec();
            b.dedup();
            (b, StepSource::Annotations)
        } else {
            let b = step_starts(&self.lives, self.live);
            let source = if b.is_empty() {
                StepSource::WholeTrace
            } else {
                StepSource::AllocatedCycles
            };
            (b, source)
        };
        let mut cuts: Vec<usize> = std::iter::once(0)
            .chain(bounds.iter().map(|&b| b as usize))
            .chain(std::iter::once(n))
            .filter(|&c| c <= n)
            .collect();
        cuts.dedup();
        (cuts, source)
    }

    /// The alloc indices where the steps after the first start.
    pub fn finish(self) -> Vec<u32> {
        starts(&self.cuts().0)
    }
}

impl Feed for StepScan {
    fn entry(&mut self, _: usize, e: &TraceEntry) {
        StepScan::entry(self, e);
    }
}

/// The cuts between steps (without the trace's ends), as alloc indices.
pub(super) fn starts(cuts: &[usize]) -> Vec<u32> {
    cuts.get(1..cuts.len().saturating_sub(1))
        .unwrap_or_default()
        .iter()
        .map(|&c| u32::try_from(c).unwrap_or(u32::MAX))
        .collect()
}

/// Alloc indices where a step starts after the first: cycles of allocated
/// memory, each rising from within a tenth of its usual range above the
/// bottom to above the middle, then falling back. A step starts at the last
/// alloc made from the bottom before a rise (what comes before the first
/// rise, such as loading the weights, joins the first step). The usual range
/// runs from the 5th to the 95th percentile of the levels (at most 4096 of
/// them, evenly spaced, are sorted), so a one-time ramp does not set it.
pub(crate) fn step_starts(lives: &[i64], end: i64) -> Vec<u32> {
    const SAMPLES: usize = 4096;
    let every = (lives.len() / SAMPLES).max(1);
    let mut sample: Vec<i64> = lives
        .iter()
        .step_by(every)
        .copied()
        .chain(std::iter::once(end))
        .collect();
    sample.sort_unstable();
    let at = |q: usize| sample.get(sample.len() * q / 100).copied().unwrap_or(0);
    let (lo, hi) = (i128::from(at(5)), i128::from(at(95)));
    let range = hi - lo;
    if range <= 0 {
        return Vec::new();
    }
    let (up, down) = (lo + range / 2, lo + range / 10);
    // Rising: the alloc it started from; None: at the bottom, not yet rising.
    let (mut high, mut from_bottom, mut rises) = (false, None, 0u32);
    let mut out = Vec::new();
    for (k, &v) in lives.iter().enumerate() {
        let v = i128::from(v);
        let k = u32::try_from(k).unwrap_or(u32::MAX);
        if v <= down {
            high = false;
            from_bottom = Some(k);
        } else if !high && v >= up {
            high = true;
            if let Some(start) = from_bottom.take() {
                rises += 1;
                if rises > 1 {
                    out.push(start);
                }
            }
        }
    }
    out
}

/// The START times of this device's annotations named like a step, ascending.
fn step_annotations(snap: &Snapshot, device: u32) -> Vec<i64> {
    let p = &snap.pickle;
    let Some(list) = p
        .dict(p.root)
        .and(p.get(p.root, "external_annotations"))
        .and_then(|v| p.items(v))
    else {
        return Vec::new();
    };
    let mut times: Vec<i64> = list
        .iter()
        .filter_map(|&a| {
            let name = p.get(a, "name").and_then(|v| p.str(v))?;
            let start = p.get(a, "stage").and_then(|v| p.str(v)) == Some("START");
            let here = p
                .get(a, "device")
                .and_then(|v| p.i64(v))
                .is_none_or(|d| d == i64::from(device));
            (start && here && name.to_ascii_lowercase().contains("step"))
                .then(|| p.get(a, "time_us").and_then(|v| p.i64(v)))
                .flatten()
        })
        .collect();
    times.sort_unstable();
    times
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Annotations given after the trace mark the allocs that annotations
    /// known from the start mark, on every bundled snapshot (some annotated);
    /// and on an annotated one with its entries' times scrambled, where a
    /// time can fall back.
    #[test]
    fn annotating_after_the_trace_marks_what_annotating_before_it_marks() {
        let mut annotated = 0;
        for (path, data) in crate::snapshot::bundled() {
            let snap = crate::snapshot::load("s", &data).unwrap();
            for device in snap.devices() {
                let entries: Vec<TraceEntry> = snap.trace(device).map(Result::unwrap).collect();
                let scrambled = entries.iter().enumerate().map(|(i, e)| TraceEntry {
                    time_us: if i % 7 == 3 { e.time_us / 2 } else { e.time_us },
                    ..e.clone()
                });
                for entries in [entries.clone(), scrambled.collect()] {
                    let mut before = StepScan::new(&snap, device);
                    let mut after = StepScan::unannotated(entries.len());
                    for e in &entries {
                        before.entry(e);
                        after.entry(e);
                    }
                    after.annotate(&snap, device);
                    assert_eq!(after.step_marks, before.step_marks, "{path:?}");
                    assert_eq!(after.next_step, before.next_step, "{path:?}");
                    assert_eq!(after.cuts(), before.cuts(), "{path:?}");
                    annotated += usize::from(!before.step_marks.is_empty());
                }
            }
        }
        // 3 annotated devices, as recorded and scrambled.
        assert!(annotated >= 6, "{annotated}");
    }
}
