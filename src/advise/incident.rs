//! Several out-of-memory errors in the evidence (ranks, retries, repeated
//! prints, cut copies, several files, the devices of a snapshot whose traces
//! record `oom` entries) as incidents, and the rule that picks the one the
//! verdict is about.
//!
//! An incident is one OOM event: every OOM observation that agrees with it on
//! the rank, the device and every figure both state is a report of the same
//! event (a repeat, or a cut copy that states fewer figures). The headline
//! incident is chosen by [`headline_key`], never by input order:
//!
//! 1. the most complete evidence: its fullest report states the most figures
//!    (request, capacity, free, allocated, reserved or its gap, process
//!    lines, the fraction cap), and a whole message beats a cut one;
//! 2. then the severity of its diagnosis (error over warning over info), then
//!    the priority of the rule that decided it;
//! 3. then the larger request, the lower rank, the input name and the line,
//!    so that equal incidents still give one answer in any order.

use crate::evidence::{Evidence, Kind, Observation};
use rustc_hash::FxHashMap as HashMap;
use std::collections::BTreeSet;

/// One OOM event and the observations that report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incident {
    /// Indices into `evidence.observations`, the fullest report first.
    pub observations: Vec<usize>,
}

impl Incident {
    /// The observation that speaks for this incident (its fullest report).
    pub fn report(&self) -> usize {
        self.observations[0]
    }
}

/// The request that failed: a message's, or a snapshot's last `oom` entry's
/// (a snapshot's `requested_bytes` is what its live blocks asked for).
fn request(o: &Observation) -> Option<u64> {
    match o.kind {
        Kind::Snapshot => o.snapshot_oom().map(|e| e.size),
        _ => o.requested_bytes,
    }
}

/// Whether `o` reports an OOM: a message, or a snapshot device whose trace
/// records an `oom` entry.
pub fn is_oom(o: &Observation) -> bool {
    match o.kind {
        Kind::Oom | Kind::NonAllocatorOom => true,
        Kind::Snapshot => o.snapshot_oom().is_some(),
        Kind::MemorySummary | Kind::MemoryStats | Kind::DeviceError => false,
    }
}

/// The figures an OOM report can state.
fn figures(o: &Observation) -> [Option<u64>; 9] {
    let free = match o.kind {
        Kind::Snapshot => o.snapshot_oom().map(|e| e.device_free),
        _ => o.free_bytes,
    };
    [
        request(o),
        o.total_capacity_bytes,
        free,
        o.allocated_bytes,
        o.reserved_bytes,
        o.reserved_unallocated_bytes,
        o.cached_bytes,
        o.process_in_use_bytes,
        o.allowed_bytes,
    ]
}

/// How much of an event a report states: its figures, process lines, and
/// one more for a message that is not cut.
pub fn completeness(o: &Observation) -> usize {
    figures(o).iter().filter(|f| f.is_some()).count()
        + usize::from(!o.other_processes.is_empty())
        + usize::from(!o.truncated)
}

/// What every report of one event states alike: kind, rank, device, source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Event {
    kind: u8,
    rank: Option<u32>,
    device: Option<u32>,
    source: Option<u8>,
}

/// A report's figures, with its process lines (interned) as a tenth: two
/// reports agree when every one both state is equal.
type Figures = [Option<u64>; 10];
/// Which of the ten a report states, one bit each.
type Mask = u16;

fn mask(f: &Figures) -> Mask {
    f.iter()
        .enumerate()
        .filter(|(_, v)| v.is_some())
        .fold(0, |m, (i, _)| m | 1 << i)
}

/// `f` with only the figures in `m` stated.
fn project(f: &Figures, m: Mask) -> Figures {
    let mut out = [None; 10];
    for (i, (o, v)) in out.iter_mut().zip(f).enumerate() {
        if m & 1 << i != 0 {
            *o = *v;
        }
    }
    out
}

/// The incidents found so far, indexed so that finding the first one a
/// report agrees with costs a hash lookup per distinct figure mask, not a
/// comparison per incident. An incident is indexed by what its reports state
/// together (`merged`: they agree with one another, so each figure has one
/// value); a report agrees with every member exactly when it agrees with that.
#[derive(Default)]
struct Grouping {
    incidents: Vec<Incident>,
    merged: Vec<(Event, Figures)>,
    /// The incidents of each (event, merged mask).
    by_mask: HashMap<(Event, Mask), BTreeSet<usize>>,
    /// The masks present per event, and the sub-masks whose projections are built per (event, mask).
    masks: HashMap<Event, Vec<Mask>>,
    built: HashMap<(Event, Mask), Vec<Mask>>,
    /// (event, mask M, sub-mask T) → the incidents of mask M by their figures on T.
    projections: HashMap<(Event, Mask, Mask), HashMap<Figures, BTreeSet<usize>>>,
}

impl Grouping {
    /// The first incident (in order of appearance) `figs` agrees with.
    fn find(&mut self, ev: Event, figs: &Figures) -> Option<usize> {
        let s = mask(figs);
        let mut first: Option<usize> = None;
        for k in 0..self.masks.get(&ev).map_or(0, Vec::len) {
            let Some(&m) = self.masks.get(&ev).and_then(|ms| ms.get(k)) else {
                break;
            };
            let t = m & s;
            self.build(ev, m, t);
            let hit = self
                .projections
                .get(&(ev, m, t))
                .and_then(|p| p.get(&project(figs, t)))
                .and_then(|ids| ids.first().copied());
            first = match (first, hit) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        first
    }

    /// Indexes the incidents of mask `m` by their figures on `t`, once.
    fn build(&mut self, ev: Event, m: Mask, t: Mask) {
        let built = self.built.entry((ev, m)).or_default();
        if built.contains(&t) {
            return;
        }
        built.push(t);
        let table = self.projections.entry((ev, m, t)).or_default();
        for &i in self.by_mask.get(&(ev, m)).into_iter().flatten() {
            if let Some((_, f)) = self.merged.get(i) {
                table.entry(project(f, t)).or_default().insert(i);
            }
        }
    }

    fn index(&mut self, i: usize, ev: Event, f: &Figures, add: bool) {
        let m = mask(f);
        let ids = self.by_mask.entry((ev, m)).or_default();
        if add {
            ids.insert(i);
        } else {
            ids.remove(&i);
        }
        let empty = ids.is_empty();
        let masks = self.masks.entry(ev).or_default();
        match (masks.iter().position(|&x| x == m), empty) {
            (None, false) => masks.push(m),
            (Some(at), true) => {
                masks.swap_remove(at);
            }
            _ => {}
        }
        for &t in self.built.get(&(ev, m)).into_iter().flatten() {
            let table = self.projections.entry((ev, m, t)).or_default();
            let key = project(f, t);
            if add {
                table.entry(key).or_default().insert(i);
            } else if let Some(ids) = table.get_mut(&key) {
                ids.remove(&i);
                if ids.is_empty() {
                    table.remove(&key);
                }
            }
        }
    }

    fn add(&mut self, obs: usize, ev: Event, figs: Figures) {
        match self.find(ev, &figs) {
            Some(i) => {
                let Some(inc) = self.incidents.get_mut(i) else {
                    return;
                };
                inc.observations.push(obs);
                let Some(&(_, old)) = self.merged.get(i) else {
                    return;
                };
                let mut new = old;
                for (n, v) in new.iter_mut().zip(figs) {
                    *n = n.or(v);
                }
                if new != old {
                    self.index(i, ev, &old, false);
                    self.index(i, ev, &new, true);
                    if let Some(m) = self.merged.get_mut(i) {
                        m.1 = new;
                    }
                }
            }
            None => {
                let i = self.incidents.len();
                self.incidents.push(Incident {
                    observations: vec![obs],
                });
                self.merged.push((ev, figs));
                self.index(i, ev, &figs, true);
            }
        }
    }
}

/// The OOM incidents of `evidence` (allocator and other out-of-memory
/// errors), in order of their first report; linear in the reports.
pub fn incidents(evidence: &Evidence) -> Vec<Incident> {
    let obs = &evidence.observations;
    let mut grouping = Grouping::default();
    let mut process_lines: HashMap<Vec<(Option<u64>, u64)>, u64> = HashMap::default();
    for (i, o) in obs.iter().enumerate() {
        if !is_oom(o) {
            continue;
        }
        let ev = Event {
            kind: o.kind as u8,
            rank: o.rank,
            device: o.device_index,
            source: o.source.map(|s| s as u8),
        };
        let mut figs = [None; 10];
        for (f, v) in figs.iter_mut().zip(figures(o)) {
            *f = v;
        }
        if !o.other_processes.is_empty() {
            let lines: Vec<_> = o.other_processes.iter().map(|u| (u.pid, u.bytes)).collect();
            let next = process_lines.len() as u64;
            figs[9] = Some(*process_lines.entry(lines).or_insert(next));
        }
        grouping.add(i, ev, figs);
    }
    let mut out = grouping.incidents;
    for inc in &mut out {
        // Fullest first; among equals the earliest report (a stable sort).
        inc.observations
            .sort_by_key(|&i| std::cmp::Reverse(obs.get(i).map_or(0, completeness)));
    }
    out
}

/// What [`headline_key`] weighs besides the report itself: the severity and
/// priority of the rule that decided the incident's cause (0 when none did).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Weight {
    pub severity: u8,
    pub priority: i32,
}

/// Completeness, weight, request, then the lower rank, input and line.
pub type HeadlineKey<'o> = (
    usize,
    Weight,
    u64,
    std::cmp::Reverse<u32>,
    std::cmp::Reverse<(&'o str, u64)>,
);

/// The order of incidents, greatest = headline (see the module docs).
pub fn headline_key(o: &Observation, weight: Weight) -> HeadlineKey<'_> {
    (
        completeness(o),
        weight,
        request(o).unwrap_or(0),
        std::cmp::Reverse(o.rank.unwrap_or(u32::MAX)),
        std::cmp::Reverse((o.input.as_str(), o.line.unwrap_or(0))),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn oom(rank: u32, requested: u64, free: Option<u64>) -> Observation {
        let mut o = Observation::new(Kind::Oom, "t.log");
        o.rank = Some(rank);
        o.requested_bytes = Some(requested);
        o.free_bytes = free;
        o
    }

    #[test]
    fn repeats_and_cut_copies_are_one_incident_ranks_are_not() {
        let full = oom(0, 2 << 30, Some(1 << 30));
        let mut cut = oom(0, 2 << 30, None);
        cut.truncated = true;
        let other_rank = oom(1, 2 << 30, Some(1 << 30));
        let retry = oom(0, 4 << 30, Some(1 << 30));
        let ev = Evidence {
            notes: Vec::new(),
            observations: vec![cut, full.clone(), other_rank, full, retry],
        };
        let inc = incidents(&ev);
        assert_eq!(inc.len(), 3, "{inc:?}");
        // The whole message speaks for the event, not the cut copy before it.
        assert_eq!(inc[0].observations, vec![1, 3, 0]);
        assert_eq!(inc[1].observations, vec![2]);
        assert_eq!(inc[2].observations, vec![4]);
    }

    /// The definition, one report against every member of every incident.
    fn by_definition(evidence: &Evidence) -> Vec<Incident> {
        let agree = |x: Option<u64>, y: Option<u64>| x.is_none() || y.is_none() || x == y;
        let same_event = |a: &Observation, b: &Observation| {
            a.kind == b.kind
                && a.rank == b.rank
                && a.device_index == b.device_index
                && a.source == b.source
                && figures(a).iter().zip(figures(b)).all(|(x, y)| agree(*x, y))
                && (a.other_processes.is_empty()
                    || b.other_processes.is_empty()
                    || a.other_processes == b.other_processes)
        };
        let obs = &evidence.observations;
        let mut out: Vec<Incident> = Vec::new();
        for (i, o) in obs.iter().enumerate() {
            let joined = out
                .iter_mut()
                .find(|inc| inc.observations.iter().all(|&j| same_event(&obs[j], o)));
            match joined {
                Some(inc) => inc.observations.push(i),
                None => out.push(Incident {
                    observations: vec![i],
                }),
            }
        }
        for inc in &mut out {
            inc.observations
                .sort_by_key(|&i| std::cmp::Reverse(completeness(&obs[i])));
        }
        out
    }

    proptest::proptest! {
        /// Few values, so that repeats, cut copies (fewer figures) and
        /// reports that agree with several incidents are common.
        #[test]
        fn the_index_groups_as_the_definition_does(
            reports in proptest::collection::vec(
                (0..3u32, proptest::collection::vec(proptest::option::of(1..3u64), 4), 0..3usize, proptest::bool::ANY),
                0..60,
            )
        ) {
            let observations = reports
                .into_iter()
                .map(|(rank, figs, procs, truncated)| {
                    let mut o = oom(rank, 0, None);
                    o.requested_bytes = figs[0];
                    o.free_bytes = figs[1];
                    o.allocated_bytes = figs[2];
                    o.reserved_unallocated_bytes = figs[3];
                    o.other_processes = (0..procs)
                        .map(|k| crate::evidence::ProcessUse { pid: Some(k as u64), bytes: 1 })
                        .collect();
                    o.truncated = truncated;
                    o
                })
                .collect();
            let ev = Evidence { notes: Vec::new(), observations };
            proptest::prop_assert_eq!(incidents(&ev), by_definition(&ev));
        }
    }

    #[test]
    fn the_headline_does_not_depend_on_input_order() {
        let a = oom(0, 1 << 30, Some(1 << 20));
        let b = oom(1, 1 << 30, Some(1 << 20));
        let w = Weight::default();
        assert!(
            headline_key(&a, w) > headline_key(&b, w),
            "lower rank wins a tie"
        );
        let heavy = Weight {
            severity: 3,
            priority: 50,
        };
        assert!(headline_key(&b, heavy) > headline_key(&a, w));
        let mut fuller = oom(1, 1 << 20, Some(1 << 20));
        fuller.total_capacity_bytes = Some(8 << 30);
        assert!(
            headline_key(&fuller, w) > headline_key(&a, heavy),
            "completeness first"
        );
    }
}
