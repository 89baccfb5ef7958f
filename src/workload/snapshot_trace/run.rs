//! Running the trace forward from its start state (`SnapshotRun`), and with fidelity
//! comparing the run with the recording (`Fidelity`, `Divergence`).

use super::SnapshotTrace;
use crate::Error;
use crate::allocator::seed::SeedBlock;
use crate::allocator::{CachingAllocator, TraceAction, TraceEntry};
use crate::device::{Device, DeviceCounters};
use crate::snapshot::model::{Action, BlockState, Segment};
use crate::workload::replay::{Peaks, ReplayOptions, TimelinePoint};
use serde::Serialize;
use std::collections::HashMap;

/// Side streams standing in for the streams a deferred free waited on.
const SIDE_STREAM_BASE: u64 = 1 << 62;

/// Where replay and recording first disagree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Divergence {
    /// Index of the recorded trace entry (0-based).
    pub event_index: usize,
    pub action: &'static str,
    pub size: u64,
    pub recorded_addr: u64,
    /// What the replay did at that point (`None`: nothing).
    pub replayed: Option<String>,
    /// The recorded entry's stack, `_memory_viz` style, innermost first.
    pub frames: Vec<String>,
}

/// The contract's `fidelity` object, plus the segment and final-state checks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Fidelity {
    pub alloc_events: u64,
    pub address_matches: u64,
    pub first_divergence: Option<Divergence>,
    /// Recorded `segment_*` entries, and how many the replay made identically.
    pub segment_events: u64,
    pub segment_matches: u64,
    /// Trace entries compared (alloc, free_*, segment_*), and equal.
    pub entries_compared: u64,
    pub entries_equal: u64,
    pub final_segments_equal: bool,
    /// The first difference between the replay's segments and the snapshot's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub final_difference: Option<String>,
    pub live_at_start_blocks: usize,
    pub start_segments: usize,
}

/// A trace entry the replay could not serve.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReplayOom {
    pub event_index: usize,
    pub requested_bytes: u64,
    pub message: String,
}

/// The outcome of one replay.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotRun {
    /// Trace entries replayed (the whole trace unless it ran out of memory).
    pub events: usize,
    pub oom: Option<ReplayOom>,
    pub fidelity: Option<Fidelity>,
    /// Recorded `oom` entries the replay served (what-if runs).
    pub recorded_ooms_avoided: u64,
    /// The entry after which allocated memory first reached its peak.
    pub peak_event_index: Option<u64>,
    /// Allocated bytes when reserved memory first reached its peak.
    pub allocated_at_peak_reserved: u64,
    /// The device's counters once the start state was seeded (the replay's
    /// own driver work is what comes after).
    pub seeded_counters: DeviceCounters,
    /// Allocated and reserved bytes after each entry, when asked for.
    pub timeline: Vec<TimelinePoint>,
    /// The replay's own trace entries (`_record_memory_history`), when asked for.
    pub history: Vec<TraceEntry>,
}

impl<'s, 'a> SnapshotTrace<'s, 'a> {
    /// Seeds `alloc` with the start state and replays the trace. With
    /// `fidelity`, `alloc`'s device must hand out [`Self::recorded_addresses`]
    /// in order.
    pub fn run<D: Device>(
        &self,
        alloc: &mut CachingAllocator<D>,
        fidelity: bool,
    ) -> Result<SnapshotRun, Error> {
        self.run_with(alloc, fidelity, ReplayOptions::default())
    }

    /// [`Self::run`] keeping what `options` asks for: the per-entry timeline,
    /// the replay's trace entries, or stopping after some entries.
    pub fn run_with<D: Device>(
        &self,
        alloc: &mut CachingAllocator<D>,
        fidelity: bool,
        options: ReplayOptions,
    ) -> Result<SnapshotRun, Error> {
        let trace = &self.trace;
        let limit = options
            .stop_after
            .map_or(trace.len(), |n| usize::try_from(n).unwrap_or(usize::MAX));
        let mut peaks = Peaks::new(options.timeline, trace.len());
        // Recorded address → replayed address of every live allocation.
        let mut map: HashMap<u64, u64> = HashMap::new();
        let seed_error = |e| Error::Input(format!("cannot seed the start state: {e}"));
        for seg in &self.start.segments {
            let base = alloc
                .seed_segment(seg.stream, seg.small, &seg.blocks)
                .map_err(seed_error)?;
            map_live(&mut map, base, &seg.blocks, &mut seg.live.iter());
        }
        for r in &self.start.reservations {
            let base = alloc
                .seed_expandable_segment(r.stream, r.small, &r.ranges, r.limit)
                .map_err(seed_error)?;
            let mut live = r.live.iter();
            for range in &r.ranges {
                map_live(&mut map, base + range.offset, &range.blocks, &mut live);
            }
        }
        alloc.record_history();
        let _ = alloc.take_trace();
        let seeded_counters = alloc.device().counters();

        let mut ours: Vec<TraceEntry> = Vec::new();
        // Index into `ours` of the replay's entries for each recorded alloc.
        let mut alloc_events = 0u64;
        let mut address_matches = 0u64;
        let mut first_alloc_miss: Option<usize> = None;
        let mut pending: HashMap<u64, u64> = HashMap::new();
        let mut oom = None;
        let mut recorded_ooms_avoided = 0;
        let mut events = trace.len();
        let mut i = 0;
        while i < trace.len() && i < limit {
            let e = &trace[i];
            match e.action {
                Action::Alloc => {
                    alloc_events += 1;
                    match alloc.malloc(e.size, e.stream) {
                        Ok(addr) => {
                            if addr == e.addr {
                                address_matches += 1;
                            } else if first_alloc_miss.is_none() {
                                first_alloc_miss = Some(i);
                            }
                            map.insert(e.addr, addr);
                        }
                        Err(o) => {
                            oom = Some(ReplayOom {
                                event_index: i,
                                requested_bytes: e.size,
                                message: o.message,
                            });
                            events = i;
                            break;
                        }
                    }
                }
                Action::FreeRequested => {
                    if let Some(addr) = map.remove(&e.addr) {
                        let completes_now = trace
                            .get(i + 1)
                            .is_some_and(|n| n.action == Action::FreeCompleted && n.addr == e.addr);
                        if !completes_now {
                            let side = SIDE_STREAM_BASE + i as u64;
                            let _ = alloc.record_stream(addr, side);
                            pending.insert(e.addr, side);
                        }
                        let _ = alloc.free(addr);
                    }
                }
                Action::FreeCompleted => {
                    if let Some(side) = pending.remove(&e.addr) {
                        alloc.synchronize_stream(side);
                    } else if let Some(addr) = map.remove(&e.addr) {
                        // Requested before the trace started: the recording
                        // has no `free_requested` to compare ours with.
                        let _ = alloc.free(addr);
                        let mut entries = alloc.take_trace();
                        entries.retain(|o| o.action != TraceAction::FreeRequested);
                        ours.extend(entries);
                    }
                }
                Action::SegmentFree | Action::SegmentUnmap => {
                    // A cudaFree or unmap the replay did not make on its own:
                    // empty_cache() (it releases every free segment and unmaps
                    // every free page; the recording shows a run of them).
                    let made = ours
                        .iter()
                        .rev()
                        .take_while(|o| o.action != TraceAction::Alloc)
                        .any(|o| o.action == e.action && o.addr == e.addr);
                    if !made {
                        alloc.empty_cache();
                    }
                }
                Action::Oom => match alloc.malloc(e.size, e.stream) {
                    Ok(addr) => {
                        recorded_ooms_avoided += 1;
                        let _ = alloc.free(addr);
                    }
                    Err(o) if !fidelity => {
                        oom = Some(ReplayOom {
                            event_index: i,
                            requested_bytes: e.size,
                            message: o.message,
                        });
                        events = i;
                        break;
                    }
                    Err(_) => {}
                },
                _ => {}
            }
            ours.extend(alloc.take_trace());
            peaks.observe(i as u64, alloc.stats());
            i += 1;
        }
        ours.extend(alloc.take_trace());

        let fidelity = fidelity.then(|| {
            self.compare(
                &ours,
                alloc,
                alloc_events,
                address_matches,
                first_alloc_miss,
            )
        });
        Ok(SnapshotRun {
            events,
            oom,
            fidelity,
            recorded_ooms_avoided,
            peak_event_index: peaks.peak_event_index,
            allocated_at_peak_reserved: peaks.allocated_at_peak_reserved,
            seeded_counters,
            timeline: peaks.timeline,
            history: if options.history { ours } else { Vec::new() },
        })
    }

    fn compare<D: Device>(
        &self,
        ours: &[TraceEntry],
        alloc: &CachingAllocator<D>,
        alloc_events: u64,
        address_matches: u64,
        first_alloc_miss: Option<usize>,
    ) -> Fidelity {
        let trace = &self.trace;
        let recorded: Vec<(usize, TraceAction)> = trace
            .iter()
            .enumerate()
            .filter(|(_, e)| is_replayed(e.action))
            .map(|(i, e)| (i, e.action))
            .collect();
        let ours: Vec<&TraceEntry> = ours
            .iter()
            .filter(|o| o.action != TraceAction::Oom)
            .collect();
        let mut equal = 0u64;
        let mut first: Option<(usize, Option<&TraceEntry>)> = None;
        let mut segment_events = 0;
        let mut segment_matches = 0;
        for (k, &(i, action)) in recorded.iter().enumerate() {
            let e = &trace[i];
            let o = ours.get(k).copied();
            let same =
                o.is_some_and(|o| o.action == action && o.addr == e.addr && o.size == e.size);
            let is_segment = matches!(
                action,
                TraceAction::SegmentAlloc
                    | TraceAction::SegmentFree
                    | TraceAction::SegmentMap
                    | TraceAction::SegmentUnmap
            );
            segment_events += u64::from(is_segment);
            if same {
                equal += 1;
                segment_matches += u64::from(is_segment);
            } else if first.is_none() {
                first = Some((i, o));
            }
        }
        // The first divergence: the first differing entry, or the first alloc
        // at another address if that comes earlier.
        let first_divergence = match (first, first_alloc_miss) {
            (Some((i, o)), miss) if miss.is_none_or(|m| i <= m) => Some(self.divergence(i, o)),
            (_, Some(m)) => Some(self.divergence(m, None)),
            _ => None,
        };
        let final_difference = self.final_difference(alloc);
        Fidelity {
            alloc_events,
            address_matches,
            first_divergence,
            segment_events,
            segment_matches,
            entries_compared: recorded.len() as u64,
            entries_equal: equal,
            final_segments_equal: final_difference.is_none(),
            final_difference,
            live_at_start_blocks: self.start.live_blocks,
            start_segments: self.start.segment_count(),
        }
    }

    fn divergence(&self, i: usize, ours: Option<&TraceEntry>) -> Divergence {
        let e = &self.trace[i];
        Divergence {
            event_index: i,
            action: e.action.as_str(),
            size: e.size,
            recorded_addr: e.addr,
            replayed: ours.map(|o| format!("{} {:#x} size {}", o.action.as_str(), o.addr, o.size)),
            frames: crate::snapshot::evidence::stack_text(self.snap, e.frames),
        }
    }

    /// The first difference between the replay's segments and the snapshot's.
    fn final_difference<D: Device>(&self, alloc: &CachingAllocator<D>) -> Option<String> {
        let ours = alloc.segments();
        let theirs: Vec<&Segment> = self
            .snap
            .segments
            .iter()
            .filter(|s| s.device == self.device)
            .collect();
        if ours.len() != theirs.len() {
            return Some(format!(
                "{} segments replayed, {} recorded",
                ours.len(),
                theirs.len()
            ));
        }
        for (o, t) in ours.iter().zip(&theirs) {
            if o.address != t.address || o.total_size != t.total_size {
                return Some(format!(
                    "segment {:#x} ({} bytes) replayed where {:#x} ({} bytes) was recorded",
                    o.address, o.total_size, t.address, t.total_size
                ));
            }
            let tb = self.snap.blocks_of(t);
            if o.blocks.len() != tb.len() {
                return Some(format!(
                    "segment {:#x}: {} blocks replayed, {} recorded",
                    t.address,
                    o.blocks.len(),
                    tb.len()
                ));
            }
            for (ob, rb) in o.blocks.iter().zip(tb) {
                let state = match rb.state {
                    BlockState::ActiveAllocated => "active_allocated",
                    BlockState::ActivePendingFree => "active_pending_free",
                    BlockState::Inactive => "inactive",
                };
                if ob.address != rb.address || ob.size != rb.size || ob.state.as_str() != state {
                    return Some(format!(
                        "block {:#x}: replayed {} bytes {}, recorded {:#x} {} bytes {}",
                        rb.address,
                        ob.size,
                        ob.state.as_str(),
                        rb.address,
                        rb.size,
                        state
                    ));
                }
            }
        }
        None
    }
}

/// Records where the live blocks of `blocks` (seeded at `base`) landed.
fn map_live<'l>(
    map: &mut HashMap<u64, u64>,
    base: u64,
    blocks: &[SeedBlock],
    live: &mut impl Iterator<Item = &'l u64>,
) {
    let mut offset = 0;
    for b in blocks {
        if b.allocated
            && let Some(&recorded) = live.next()
        {
            map.insert(recorded, base + offset);
        }
        offset += b.size;
    }
}

/// The recorded actions the replay reproduces entry by entry.
fn is_replayed(a: Action) -> bool {
    matches!(
        a,
        Action::Alloc
            | Action::FreeRequested
            | Action::FreeCompleted
            | Action::SegmentAlloc
            | Action::SegmentFree
            | Action::SegmentMap
            | Action::SegmentUnmap
    )
}
