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

/// The figures an OOM report can state, as (name, value) pairs.
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

/// Whether two OOM reports can be the same event.
fn same_event(a: &Observation, b: &Observation) -> bool {
    let agree = |x: Option<u64>, y: Option<u64>| x.is_none() || y.is_none() || x == y;
    a.kind == b.kind
        && a.rank == b.rank
        && a.device_index == b.device_index
        && a.source == b.source
        && figures(a)
            .iter()
            .zip(figures(b).iter())
            .all(|(x, y)| agree(*x, *y))
        && (a.other_processes.is_empty()
            || b.other_processes.is_empty()
            || a.other_processes == b.other_processes)
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

/// The OOM incidents of `evidence` (allocator and other out-of-memory
/// errors, and every device of a snapshot whose trace records one).
pub fn incidents(evidence: &Evidence) -> Vec<Incident> {
    let obs = &evidence.observations;
    let mut out: Vec<Incident> = Vec::new();
    for (i, o) in obs.iter().enumerate() {
        if !is_oom(o) {
            continue;
        }
        let joined = out.iter_mut().find(|inc| {
            inc.observations
                .iter()
                .all(|&j| obs.get(j).is_some_and(|p| same_event(p, o)))
        });
        match joined {
            Some(inc) => inc.observations.push(i),
            None => out.push(Incident {
                observations: vec![i],
            }),
        }
    }
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

/// The order of incidents, greatest = headline (see the module docs).
pub fn headline_key(
    o: &Observation,
    weight: Weight,
) -> (
    usize,
    Weight,
    u64,
    std::cmp::Reverse<u32>,
    std::cmp::Reverse<(String, u64)>,
) {
    (
        completeness(o),
        weight,
        request(o).unwrap_or(0),
        std::cmp::Reverse(o.rank.unwrap_or(u32::MAX)),
        std::cmp::Reverse((o.input.clone(), o.line.unwrap_or(0))),
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
