//! Replaying a snapshot's trace through the bundled allocator.
//!
//! The trace is a ring buffer: it may start mid-run, with segments and live
//! blocks already there. The state at its start is rebuilt by walking the
//! trace against the final segments (replay-notes.md):
//! - start segments: the final segments not created by a `segment_alloc` in the
//!   trace, plus those a `segment_free` in the trace released before any
//!   `segment_alloc` of theirs;
//! - live blocks at the start: (a) addresses freed in the trace before any
//!   `alloc` of theirs, sized `round_size(requested)` under the recorded config
//!   (the unknown tail left unsplit is ≤ 1 MiB in the large pool, so it can
//!   never serve a request of that pool, and merges back on free). Under
//!   `max_split_size_mb`, a request at or above the split limit takes a whole
//!   free block up to `max_non_split_rounding` (20 MiB) larger (`get_free_block`,
//!   `should_split`), and that tail is not in the trace: the gap after such a
//!   block is seeded as its tail when it is under the tolerance and no recorded
//!   alloc lands in it before the block's free (seeded as free space instead,
//!   it served a request the recording placed elsewhere: 139 of 140 allocs);
//!   a longer gap stays free space; (b) blocks
//!   still `active_allocated` at the end that the trace never allocated, with
//!   their exact size;
//! - everything else in a start segment is one free block per gap;
//! - expandable segments (one reservation per stream and pool): the pages
//!   mapped at the start are the final segments' ranges less what the trace's
//!   `segment_map` entries mapped, plus what its `segment_unmap` entries
//!   unmapped, walked back from the end; the reservation starts at the lowest
//!   address the recording shows for it (pages below it that were never mapped
//!   in the recording cannot be seen), and a `segment_map`'s pool is the pool
//!   of the `alloc` (or `oom`) that follows it, as `malloc` records them. A
//!   second reservation of one stream and pool (PyTorch makes one only when
//!   9/8 of the card has no room left) is read as part of the first.
//!
//! The start state is seeded at the recorded addresses, then the trace runs
//! forward: `alloc` → `malloc`, `free_requested` → `free` (a `free_completed`
//! that comes later is modelled as a use on a side stream that completes
//! then), a `segment_free` or `segment_unmap` the allocator did not make
//! itself → `empty_cache()`.
//!
//! With fidelity, the device hands out the recorded `segment_alloc` addresses
//! and the bases of reservations made during the trace, in order, and every
//! alloc's address, every trace entry and the final segments are compared
//! with the recording. Under another config (a what-if replay) the
//! live-at-start blocks keep their recorded segments, offsets and sizes; only
//! the allocations made during the replay follow the new config, and new
//! segments are laid out by the simulated device.

use crate::Error;
use crate::allocator::seed::{SeedBlock, SeedRange};
use crate::allocator::sizes::{
    expandable_page_size, is_small, max_non_split_rounding_size, round_size,
};
use crate::allocator::{CachingAllocator, TraceAction, TraceEntry};
use crate::conf::Settings;
use crate::device::sim::SimDevice;
use crate::device::{Device, DeviceCounters};
use crate::snapshot::Snapshot;
use crate::snapshot::model::{Action, BlockState, Segment, TraceEntry as TraceRecord};
use crate::workload::replay::{OomEvent, Peaks, ReplayOptions, RunEnd, RunResult, TimelinePoint};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet};

const MIB: u64 = 1 << 20;
/// Side streams standing in for the streams a deferred free waited on.
const SIDE_STREAM_BASE: u64 = 1 << 62;

/// A segment as it was when the trace started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartSegment {
    pub address: u64,
    pub stream: u64,
    pub small: bool,
    pub blocks: Vec<SeedBlock>,
    /// Recorded addresses of the live blocks, in `blocks` order.
    pub live: Vec<u64>,
}

/// An expandable segment (one address reservation) as it was when the trace
/// started: its mapped ranges, offsets from `address`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartReservation {
    pub address: u64,
    pub stream: u64,
    pub small: bool,
    pub ranges: Vec<SeedRange>,
    /// Recorded addresses of the live blocks, in address order.
    pub live: Vec<u64>,
    /// Bytes up to the next reservation the recording shows, if any.
    pub limit: Option<u64>,
}

/// The allocator state at the start of a device's trace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StartState {
    pub segments: Vec<StartSegment>,
    pub reservations: Vec<StartReservation>,
    /// Live blocks of kind (a) and (b) placed.
    pub live_blocks: usize,
    /// Live-at-start addresses that fall in no start segment (inconsistent input).
    pub unplaced: usize,
}

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

/// The settings the recording ran under (`allocator_settings`, PyTorch's
/// defaults for what it does not record), with expandable segments on where
/// `allocator_settings` does not say but the recording shows them (expandable
/// segments or `segment_map` entries; e.g. a snapshot from before 2.6).
pub fn recorded_settings(snap: &Snapshot) -> Settings {
    let mut s = crate::snapshot::evidence::recorded_settings(snap);
    let said = crate::snapshot::evidence::settings_json(snap)
        .is_some_and(|j| j.get("expandable_segments").is_some());
    if !said {
        s.expandable_segments |= snap.segments.iter().any(|g| g.is_expandable == Some(true))
            || (0..snap.trace_lists())
                .filter_map(|d| u32::try_from(d).ok())
                .any(|d| {
                    snap.trace(d)
                        .any(|e| e.is_ok_and(|e| e.action == Action::SegmentMap))
                });
    }
    s
}

/// The device whose trace is replayed: the first whose trace records an
/// `oom` entry (the OOM a diagnosis is about), else the first with entries.
pub fn traced_device(snap: &Snapshot) -> Option<u32> {
    let traced = || {
        (0..snap.trace_lists())
            .filter_map(|d| u32::try_from(d).ok())
            .filter(|&d| snap.trace_len(d) > 0)
    };
    traced()
        .find(|&d| {
            snap.trace(d)
                .any(|e| e.is_ok_and(|e| e.action == Action::Oom))
        })
        .or_else(|| traced().next())
}

/// A snapshot's trace on one device, with the state it started from.
pub struct SnapshotTrace<'s, 'a> {
    snap: &'s Snapshot<'a>,
    device: u32,
    /// The device's trace entries, read once.
    pub trace: Vec<TraceRecord>,
    pub start: StartState,
    /// Addresses the device handed out during the trace, in order:
    /// `segment_alloc`s and the bases of reservations made then.
    device_addresses: Vec<u64>,
}

impl<'s, 'a> SnapshotTrace<'s, 'a> {
    /// `recorded` are the settings the recording ran under (sizes of blocks
    /// live at the start follow them).
    pub fn new(snap: &'s Snapshot<'a>, device: u32, recorded: &Settings) -> Result<Self, Error> {
        let trace = snap
            .trace(device)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| Error::Input(format!("not a torch memory snapshot: {e}")))?;
        if trace.is_empty() {
            return Err(Error::Input(format!(
                "the snapshot has no trace for device {device}: record it with torch.cuda.memory._record_memory_history()"
            )));
        }
        let segs: Vec<&Segment> = snap
            .segments
            .iter()
            .filter(|s| s.device == device)
            .collect();

        // Walk forward: what the trace allocated, freed, created and released.
        let mut live: HashSet<u64> = HashSet::new();
        let mut seen_alloc: HashSet<u64> = HashSet::new();
        // (address, requested size, index of its free) of blocks live at the start.
        let mut pre_freed: Vec<(u64, u64, usize)> = Vec::new();
        let mut alloc_at: Vec<(u64, usize)> = Vec::new();
        let mut created: HashSet<u64> = HashSet::new();
        let mut released_first: Vec<(u64, u64, u64)> = Vec::new();
        let mut device_addresses: Vec<(usize, u64)> = Vec::new();
        for (i, e) in trace.iter().enumerate() {
            match e.action {
                Action::Alloc => {
                    live.insert(e.addr);
                    seen_alloc.insert(e.addr);
                    alloc_at.push((e.addr, i));
                }
                Action::FreeRequested => {
                    let was_live = live.remove(&e.addr);
                    if !was_live && seen_alloc.insert(e.addr) {
                        pre_freed.push((e.addr, e.size, i));
                    }
                }
                // A completion whose request came before the trace started.
                Action::FreeCompleted if seen_alloc.insert(e.addr) => {
                    pre_freed.push((e.addr, e.size, i));
                }
                Action::SegmentAlloc => {
                    created.insert(e.addr);
                    device_addresses.push((i, e.addr));
                }
                Action::SegmentFree => {
                    if !created.contains(&e.addr) {
                        released_first.push((e.addr, e.size, e.stream));
                    }
                    created.remove(&e.addr);
                }
                _ => {}
            }
        }
        let created_in_trace: HashSet<u64> = device_addresses.iter().map(|&(_, a)| a).collect();

        // (address, size, stream, small) of every cudaMalloc'd segment present at the start.
        let mut start: Vec<(u64, u64, u64, bool)> = segs
            .iter()
            .filter(|s| s.is_expandable != Some(true) && !created_in_trace.contains(&s.address))
            .map(|s| (s.address, s.total_size, s.stream, is_small_pool(s)))
            .collect();
        // A released segment's pool: small segments are 2 MiB (kSmallBuffer).
        start.extend(
            released_first
                .iter()
                .map(|&(a, size, stream)| (a, size, stream, size == 2 * MIB)),
        );
        start.sort_unstable();

        let expandable = expandable_start(&trace, &segs, recorded);
        device_addresses.extend_from_slice(&expandable.created);
        device_addresses.sort_unstable();

        // Live blocks at the start: (address, size, requested, and for an
        // oversize block freed in the trace, the index of its free).
        let mut blocks: Vec<(u64, u64, u64, Option<usize>)> = Vec::new();
        for s in &segs {
            for b in snap.blocks_of(s) {
                if b.state == BlockState::ActiveAllocated && !live.contains(&b.address) {
                    blocks.push((b.address, b.size, b.requested_size, None));
                }
            }
        }
        let placed_b: HashSet<u64> = blocks.iter().map(|b| b.0).collect();
        for &(addr, requested, freed_at) in &pre_freed {
            if !placed_b.contains(&addr) {
                let size = round_size(requested, recorded);
                let oversize = size >= recorded.max_split_size;
                blocks.push((addr, size, requested, oversize.then_some(freed_at)));
            }
        }
        blocks.sort_unstable();
        // An oversize request takes a whole free block up to the tolerance larger
        // without splitting it (`get_free_block`, `should_split`): the gap after
        // such a block is taken to be its tail when it is under the tolerance and
        // no recorded alloc lands in it before the block's free (PyTorch would
        // have used a free block there that served a request best).
        // Gaps never overlap, so the scans below touch each address once.
        alloc_at.sort_unstable();
        let tolerance = max_non_split_rounding_size(recorded);
        let is_tail = |from: u64, gap: u64, freed_at: usize| {
            let first = alloc_at.partition_point(|&(a, _)| a < from);
            gap < tolerance
                && !alloc_at[first..]
                    .iter()
                    .take_while(|&&(a, _)| a - from < gap)
                    .any(|&(_, i)| i < freed_at)
        };

        let mut state = StartState::default();
        // Every start segment and every range mapped at the start, in address order.
        let mut containers: Vec<(u64, u64, Slot)> = Vec::new();
        for &(address, size, stream, small) in &start {
            containers.push((address, size, Slot::Segment(state.segments.len())));
            state.segments.push(StartSegment {
                address,
                stream,
                small,
                blocks: Vec::new(),
                live: Vec::new(),
            });
        }
        for (r, res) in expandable.reservations.iter().enumerate() {
            for (k, &(begin, end)) in res.ranges.iter().enumerate() {
                containers.push((begin, end - begin, Slot::Range(r, k)));
            }
            state.reservations.push(StartReservation {
                address: res.base,
                stream: res.stream,
                small: res.small,
                ranges: res
                    .ranges
                    .iter()
                    .map(|&(begin, _)| SeedRange {
                        offset: begin - res.base,
                        blocks: Vec::new(),
                    })
                    .collect(),
                live: Vec::new(),
                limit: res.limit,
            });
        }
        containers.sort_unstable_by_key(|c| c.0);

        let mut next = blocks.iter().peekable();
        for &(address, size, slot) in &containers {
            let end = address.saturating_add(size);
            let mut tiles = Vec::new();
            let mut live_here = Vec::new();
            let mut cursor = address;
            // The last live block, if its tail may be the gap after it.
            let mut open_tail: Option<usize> = None;
            let gap_to = |tiles: &mut Vec<SeedBlock>, open: Option<usize>, from: u64, to: u64| {
                let gap = to - from;
                match (open, tiles.last_mut()) {
                    (Some(freed_at), Some(last)) if is_tail(from, gap, freed_at) => {
                        last.size += gap
                    }
                    _ => tiles.push(free_block(gap)),
                }
            };
            while let Some(&&(a, bsize, requested, freed_at)) = next.peek() {
                if a >= end {
                    break;
                }
                next.next();
                if a < cursor || a.saturating_add(bsize) > end {
                    state.unplaced += 1;
                    continue;
                }
                if a > cursor {
                    gap_to(&mut tiles, open_tail, cursor, a);
                }
                tiles.push(SeedBlock {
                    size: bsize,
                    requested_size: requested,
                    allocated: true,
                });
                // Only cudaMalloc'd segments: expandable blocks split down to 512 B.
                open_tail = freed_at.filter(|_| matches!(slot, Slot::Segment(_)));
                live_here.push(a);
                state.live_blocks += 1;
                cursor = a + bsize;
            }
            if cursor < end {
                gap_to(&mut tiles, open_tail, cursor, end);
            }
            let (blocks, live) = match slot {
                Slot::Segment(i) => {
                    let seg = &mut state.segments[i];
                    (&mut seg.blocks, &mut seg.live)
                }
                Slot::Range(r, k) => {
                    let res = &mut state.reservations[r];
                    (&mut res.ranges[k].blocks, &mut res.live)
                }
            };
            *blocks = tiles;
            live.extend(live_here);
        }
        // Blocks below the first container or between containers.
        state.unplaced += blocks.len() - state.live_blocks - state.unplaced;
        Ok(SnapshotTrace {
            snap,
            device,
            trace,
            start: state,
            device_addresses: device_addresses.into_iter().map(|(_, a)| a).collect(),
        })
    }

    /// Device addresses in the order the replay asks for them: the start
    /// segments, the start reservations, then (fidelity) the addresses the
    /// device handed out during the recording.
    pub fn recorded_addresses(&self, fidelity: bool) -> Vec<u64> {
        let segments = self.start.segments.iter().map(|s| s.address);
        let reservations = self.start.reservations.iter().map(|r| r.address);
        let mut v: Vec<u64> = segments.chain(reservations).collect();
        if fidelity {
            v.extend_from_slice(&self.device_addresses);
        }
        v
    }

    /// The card the recording implies: at its last `oom` entry, the device's
    /// free memory then plus what the allocator held in the snapshot (a lower
    /// bound of the card); `None` without a recorded OOM.
    pub fn recorded_capacity(&self) -> Option<u64> {
        let last_oom = self.trace.iter().rfind(|e| e.action == Action::Oom)?;
        let reserved: u64 = self
            .snap
            .segments
            .iter()
            .filter(|s| s.device == self.device)
            .map(|s| s.total_size)
            .sum();
        Some(last_oom.device_free.saturating_add(reserved))
    }

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

impl StartState {
    /// Segments at the start as a snapshot lists them: the cudaMalloc'd ones
    /// and every mapped range of an expandable one.
    pub fn segment_count(&self) -> usize {
        self.segments.len()
            + self
                .reservations
                .iter()
                .map(|r| r.ranges.len())
                .sum::<usize>()
    }

    /// The live (allocated) and the reserved bytes at the start, saturating
    /// (sizes are untrusted).
    pub fn bytes(&self) -> (u64, u64) {
        let blocks = self.segments.iter().flat_map(|s| s.blocks.iter()).chain(
            self.reservations
                .iter()
                .flat_map(|r| r.ranges.iter().flat_map(|g| g.blocks.iter())),
        );
        blocks.fold((0u64, 0u64), |(live, reserved), b| {
            (
                if b.allocated {
                    live.saturating_add(b.size)
                } else {
                    live
                },
                reserved.saturating_add(b.size),
            )
        })
    }
}

/// Where a container of live-at-start blocks goes: a start segment, or a
/// mapped range (reservation, range) of an expandable one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Segment(usize),
    Range(usize, usize),
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

fn is_small_pool(s: &Segment) -> bool {
    s.segment_type == crate::snapshot::model::PoolKind::Small
}

/// Address ranges `[begin, end)`, merged where they touch.
#[derive(Debug, Clone, Default)]
struct Ranges(BTreeMap<u64, u64>);

impl Ranges {
    fn insert(&mut self, mut begin: u64, mut end: u64) {
        if begin >= end {
            return;
        }
        let touching: Vec<(u64, u64)> = self
            .0
            .range(..=end)
            .rev()
            .take_while(|&(_, &e)| e >= begin)
            .map(|(&b, &e)| (b, e))
            .collect();
        for (b, e) in touching {
            self.0.remove(&b);
            begin = begin.min(b);
            end = end.max(e);
        }
        self.0.insert(begin, end);
    }

    fn remove(&mut self, begin: u64, end: u64) {
        let overlapping: Vec<(u64, u64)> = self
            .0
            .range(..end)
            .rev()
            .take_while(|&(_, &e)| e > begin)
            .map(|(&b, &e)| (b, e))
            .collect();
        for (b, e) in overlapping {
            self.0.remove(&b);
            if b < begin {
                self.0.insert(b, begin);
            }
            if e > end {
                self.0.insert(end, e);
            }
        }
    }
}

/// One reservation as the trace started: its base and its mapped ranges
/// (absolute addresses).
struct Reservation {
    base: u64,
    stream: u64,
    small: bool,
    ranges: Vec<(u64, u64)>,
    limit: Option<u64>,
}

/// The expandable segments at the start of the trace, and the (entry index,
/// base) of each reservation the recording made during the trace.
struct ExpandableStart {
    reservations: Vec<Reservation>,
    created: Vec<(usize, u64)>,
}

/// A (stream, pool): its mapped ranges (walked back to the start) and its
/// `segment_map` / `segment_unmap` entries (entry index, address, size, map?).
#[derive(Default)]
struct PoolWalk {
    ranges: Ranges,
    events: Vec<(usize, u64, u64, bool)>,
}

/// Rebuilds the expandable segments at the start of `trace`, one reservation
/// per (stream, pool) that has pages mapped then (see the module doc).
fn expandable_start(
    trace: &[TraceRecord],
    segs: &[&Segment],
    recorded: &Settings,
) -> ExpandableStart {
    let expandable = || segs.iter().filter(|s| s.is_expandable == Some(true));
    let mut walks: BTreeMap<(u64, bool), PoolWalk> = BTreeMap::new();
    for s in expandable() {
        let end = s.address.saturating_add(s.total_size);
        walks
            .entry((s.stream, is_small_pool(s)))
            .or_default()
            .ranges
            .insert(s.address, end);
    }
    // Without a request to go by: whole large-pool pages are the large pool's.
    let large_page = expandable_page_size(false, recorded);
    let by_size = |size: u64| !size.is_multiple_of(large_page);
    // `malloc` records its `segment_map`s just before the `alloc` (or `oom`)
    // they were for: that request's pool is theirs.
    let mut pools: Vec<Option<bool>> = vec![None; trace.len()];
    let mut next_pool = None;
    for (e, pool) in trace.iter().zip(pools.iter_mut()).rev() {
        match e.action {
            Action::Alloc => next_pool = Some(is_small(round_size(e.size, recorded))),
            Action::Oom => next_pool = Some(is_small(e.size)),
            Action::SegmentMap => *pool = Some(next_pool.unwrap_or_else(|| by_size(e.size))),
            _ => {}
        }
    }
    // An unmapped range belongs to the nearest range the recording shows on its
    // stream: (stream, address) → small pool?
    let mut known: BTreeMap<(u64, u64), bool> = expandable()
        .map(|s| ((s.stream, s.address), is_small_pool(s)))
        .collect();
    known.extend(
        trace
            .iter()
            .zip(&pools)
            .filter_map(|(e, p)| p.map(|small| ((e.stream, e.addr), small))),
    );
    let nearest = |stream: u64, addr: u64| {
        let below = known.range((stream, 0)..=(stream, addr)).next_back();
        let above = known.range((stream, addr)..=(stream, u64::MAX)).next();
        below
            .into_iter()
            .chain(above)
            .min_by_key(|((_, a), _)| a.abs_diff(addr))
            .map(|(_, &small)| small)
    };
    for (i, (e, pool)) in trace.iter().zip(&pools).enumerate() {
        let small = match e.action {
            Action::SegmentMap => pool.unwrap_or(false),
            Action::SegmentUnmap => nearest(e.stream, e.addr).unwrap_or_else(|| by_size(e.size)),
            _ => continue,
        };
        walks.entry((e.stream, small)).or_default().events.push((
            i,
            e.addr,
            e.size,
            e.action == Action::SegmentMap,
        ));
    }

    let mut out = ExpandableStart {
        reservations: Vec::new(),
        created: Vec::new(),
    };
    for ((stream, small), mut walk) in walks {
        // Backwards from the end: undo each map and unmap.
        for &(_, addr, size, map) in walk.events.iter().rev() {
            let end = addr.saturating_add(size);
            if map {
                walk.ranges.remove(addr, end);
            } else {
                walk.ranges.insert(addr, end);
            }
        }
        let ranges: Vec<(u64, u64)> = walk.ranges.0.into_iter().collect();
        let mut mapped: u64 = ranges.iter().map(|&(b, e)| e - b).sum();
        // Forwards: the base is the lowest address the first reservation shows
        // until nothing of it is mapped (release_expandable_segment); a map
        // with nothing reserved makes a new reservation at its address.
        let mut first = mapped > 0;
        let mut base = ranges.first().map_or(u64::MAX, |r| r.0);
        for &(i, addr, size, map) in &walk.events {
            if first {
                base = base.min(addr);
            }
            if map {
                if mapped == 0 {
                    out.created.push((i, addr));
                }
                mapped = mapped.saturating_add(size);
            } else {
                mapped = mapped.saturating_sub(size);
                first &= mapped > 0;
            }
        }
        if !ranges.is_empty() {
            out.reservations.push(Reservation {
                base,
                stream,
                small,
                ranges,
                limit: None,
            });
        }
    }
    // A reservation ends where the next one the recording shows begins.
    let mut bases: Vec<u64> = out.reservations.iter().map(|r| r.base).collect();
    bases.extend(out.created.iter().map(|&(_, a)| a));
    bases.sort_unstable();
    for r in &mut out.reservations {
        r.limit = bases.iter().find(|&&b| b > r.base).map(|&b| b - r.base);
    }
    out.reservations.sort_by_key(|r| r.base);
    out
}

fn free_block(size: u64) -> SeedBlock {
    SeedBlock {
        size,
        requested_size: 0,
        allocated: false,
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

/// How the capacity of a snapshot replay was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapacitySource {
    /// `--capacity`.
    Given,
    /// The last recorded `oom` entry: the device's free memory then plus what
    /// the allocator held in the snapshot (a lower bound of the card).
    OomEntry,
    /// Not recorded: the caller's default.
    Default,
}

/// The capacity a snapshot's replay should use.
pub fn capacity(trace: &SnapshotTrace, given: Option<u64>, default: u64) -> (u64, CapacitySource) {
    match (given, trace.recorded_capacity()) {
        (Some(c), _) => (c, CapacitySource::Given),
        (None, Some(c)) => (c, CapacitySource::OomEntry),
        (None, None) => (default, CapacitySource::Default),
    }
}

/// Replays the trace under `settings` on a simulated card of `capacity` bytes
/// (what-if: new segments are laid out by the card; with `fidelity`, at the
/// recorded addresses and compared with the recording).
pub fn replay_on_sim(
    trace: &SnapshotTrace,
    settings: &Settings,
    capacity: u64,
    fidelity: bool,
    options: ReplayOptions,
) -> Result<(RunResult, Option<Fidelity>), Error> {
    let sim = SimDevice::new(capacity).with_recorded_addresses(trace.recorded_addresses(fidelity));
    replay_on(trace, settings, sim, fidelity, options)
}

/// Replays the trace under `settings` on `device` (the simulated card or a
/// GPU); with `fidelity`, `device` must hand out the recorded addresses.
pub fn replay_on<D: Device>(
    trace: &SnapshotTrace,
    settings: &Settings,
    device: D,
    fidelity: bool,
    options: ReplayOptions,
) -> Result<(RunResult, Option<Fidelity>), Error> {
    let capacity = device.total_memory();
    let mut alloc = CachingAllocator::new(settings.clone(), device);
    let run = trace.run_with(&mut alloc, fidelity, options)?;
    let end = RunEnd {
        events: trace.trace.len() as u64,
        oom: run.oom.map(|o| OomEvent {
            event_index: o.event_index as u64,
            requested_bytes: o.requested_bytes,
            message: o.message,
            before_trace: None,
        }),
        peak_event_index: run.peak_event_index,
        allocated_at_peak_reserved: run.allocated_at_peak_reserved,
        timeline: run.timeline,
        counters: since(alloc.device().counters(), run.seeded_counters),
        history: run.history,
        stopped_early_at_event: None,
    };
    let result = RunResult::new(&alloc, capacity, end);
    Ok((result, run.fidelity))
}

/// Driver work done after `start`.
fn since(now: DeviceCounters, start: DeviceCounters) -> DeviceCounters {
    DeviceCounters {
        mallocs: now.mallocs - start.mallocs,
        frees: now.frees - start.frees,
        maps: now.maps - start.maps,
        unmaps: now.unmaps - start.unmaps,
        synchronizations: now.synchronizations - start.synchronizations,
        driver_time_us: now.driver_time_us - start.driver_time_us,
    }
}

#[cfg(test)]
mod tests {
    use super::Ranges;

    fn ranges(r: &Ranges) -> Vec<(u64, u64)> {
        r.0.iter().map(|(&b, &e)| (b, e)).collect()
    }

    #[test]
    fn ranges_merge_where_they_touch_and_split_where_cut() {
        let mut r = Ranges::default();
        r.insert(40, 60);
        r.insert(0, 20);
        r.insert(20, 30);
        assert_eq!(ranges(&r), [(0, 30), (40, 60)]);
        r.insert(25, 45);
        assert_eq!(ranges(&r), [(0, 60)]);
        r.remove(10, 20);
        r.remove(50, 70);
        assert_eq!(ranges(&r), [(0, 10), (20, 50)]);
        r.remove(0, 30);
        assert_eq!(ranges(&r), [(30, 50)]);
        r.insert(5, 5);
        assert_eq!(ranges(&r), [(30, 50)]);
    }
}
