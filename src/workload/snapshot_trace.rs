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
//!   never serve a request of that pool, and merges back on free); (b) blocks
//!   still `active_allocated` at the end that the trace never allocated, with
//!   their exact size;
//! - everything else in a start segment is one free block per gap.
//!
//! The start state is seeded at the recorded addresses, then the trace runs
//! forward: `alloc` → `malloc`, `free_requested` → `free` (a `free_completed`
//! that comes later is modelled as a use on a side stream that completes
//! then), a `segment_free` the allocator did not make itself → `empty_cache()`.
//!
//! With fidelity, the device hands out the recorded `segment_alloc` addresses
//! in order, and every alloc's address, every trace entry and the final
//! segments are compared with the recording. Under another config (a what-if
//! replay) the live-at-start blocks keep their recorded segments, offsets and
//! sizes; only the allocations made during the replay follow the new config,
//! and new segments are laid out by the simulated device.

use crate::Error;
use crate::allocator::seed::SeedBlock;
use crate::allocator::sizes::round_size;
use crate::allocator::{CachingAllocator, TraceAction, TraceEntry};
use crate::conf::Settings;
use crate::device::sim::SimDevice;
use crate::device::{Device, DeviceCounters};
use crate::snapshot::Snapshot;
use crate::snapshot::model::{Action, BlockState, Segment, TraceEntry as TraceRecord};
use crate::workload::replay::{OomEvent, Peaks, ReplayOptions, RunResult, TimelinePoint};
use serde::Serialize;
use std::collections::{HashMap, HashSet};

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

/// The allocator state at the start of a device's trace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StartState {
    pub segments: Vec<StartSegment>,
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

pub use crate::snapshot::evidence::recorded_settings;

/// The first device with trace entries.
pub fn traced_device(snap: &Snapshot) -> Option<u32> {
    (0..snap.trace_lists())
        .filter_map(|d| u32::try_from(d).ok())
        .find(|&d| snap.trace_len(d) > 0)
}

/// A snapshot's trace on one device, with the state it started from.
pub struct SnapshotTrace<'s, 'a> {
    snap: &'s Snapshot<'a>,
    device: u32,
    /// The device's trace entries, read once.
    pub trace: Vec<TraceRecord>,
    pub start: StartState,
    /// `segment_alloc` addresses in trace order.
    segment_allocs: Vec<u64>,
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
        if segs.iter().any(|s| s.is_expandable == Some(true))
            || trace
                .iter()
                .any(|e| matches!(e.action, Action::SegmentMap | Action::SegmentUnmap))
        {
            // Its start state would be expandable segments (a reserved range with
            // mapped pages, `segment_map`/`segment_unmap` in the trace), and the
            // bundled allocator can seed only cudaMalloc'd segments (allocator::seed).
            return Err(Error::Input(
                "the snapshot was recorded with expandable_segments:True: replaying its trace \
                 needs its expandable segments rebuilt at the trace start, which the bundled \
                 allocator cannot seed yet (only cudaMalloc segments); `allocdoc diagnose` \
                 still reads it"
                    .into(),
            ));
        }

        // Walk forward: what the trace allocated, freed, created and released.
        let mut live: HashSet<u64> = HashSet::new();
        let mut seen_alloc: HashSet<u64> = HashSet::new();
        let mut pre_freed: Vec<(u64, u64)> = Vec::new();
        let mut created: HashSet<u64> = HashSet::new();
        let mut released_first: Vec<(u64, u64, u64)> = Vec::new();
        let mut segment_allocs = Vec::new();
        for e in &trace {
            match e.action {
                Action::Alloc => {
                    live.insert(e.addr);
                    seen_alloc.insert(e.addr);
                }
                Action::FreeRequested => {
                    let was_live = live.remove(&e.addr);
                    if !was_live && seen_alloc.insert(e.addr) {
                        pre_freed.push((e.addr, e.size));
                    }
                }
                // A completion whose request came before the trace started.
                Action::FreeCompleted if seen_alloc.insert(e.addr) => {
                    pre_freed.push((e.addr, e.size));
                }
                Action::SegmentAlloc => {
                    created.insert(e.addr);
                    segment_allocs.push(e.addr);
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
        let created_in_trace: HashSet<u64> = segment_allocs.iter().copied().collect();

        // (address, size, stream, small) of every segment present at the start.
        let mut start: Vec<(u64, u64, u64, bool)> = segs
            .iter()
            .filter(|s| !created_in_trace.contains(&s.address))
            .map(|s| {
                let small = s.segment_type == crate::snapshot::model::PoolKind::Small;
                (s.address, s.total_size, s.stream, small)
            })
            .collect();
        // A released segment's pool: small segments are 2 MiB (kSmallBuffer).
        start.extend(
            released_first
                .iter()
                .map(|&(a, size, stream)| (a, size, stream, size == 2 * MIB)),
        );
        start.sort_unstable();

        // Live blocks at the start: (address, size, requested).
        let mut blocks: Vec<(u64, u64, u64)> = Vec::new();
        for s in &segs {
            for b in snap.blocks_of(s) {
                if b.state == BlockState::ActiveAllocated && !live.contains(&b.address) {
                    blocks.push((b.address, b.size, b.requested_size));
                }
            }
        }
        let placed_b: HashSet<u64> = blocks.iter().map(|b| b.0).collect();
        for &(addr, requested) in &pre_freed {
            if !placed_b.contains(&addr) {
                blocks.push((addr, round_size(requested, recorded), requested));
            }
        }
        blocks.sort_unstable();

        let mut state = StartState::default();
        let mut next = blocks.iter().peekable();
        for &(address, size, stream, small) in &start {
            let end = address.saturating_add(size);
            let mut seg = StartSegment {
                address,
                stream,
                small,
                blocks: Vec::new(),
                live: Vec::new(),
            };
            let mut cursor = address;
            while let Some(&&(a, bsize, requested)) = next.peek() {
                if a >= end {
                    break;
                }
                next.next();
                if a < cursor || a.saturating_add(bsize) > end {
                    state.unplaced += 1;
                    continue;
                }
                if a > cursor {
                    seg.blocks.push(free_block(a - cursor));
                }
                seg.blocks.push(SeedBlock {
                    size: bsize,
                    requested_size: requested,
                    allocated: true,
                });
                seg.live.push(a);
                state.live_blocks += 1;
                cursor = a + bsize;
            }
            if cursor < end {
                seg.blocks.push(free_block(end - cursor));
            }
            state.segments.push(seg);
        }
        // Blocks below the first segment or between segments.
        state.unplaced += blocks.len() - state.live_blocks - state.unplaced;
        Ok(SnapshotTrace {
            snap,
            device,
            trace,
            start: state,
            segment_allocs,
        })
    }

    /// Device addresses in the order the replay asks for them: the start
    /// segments, then (fidelity) the recorded `segment_alloc` addresses.
    pub fn recorded_addresses(&self, fidelity: bool) -> Vec<u64> {
        let mut v: Vec<u64> = self.start.segments.iter().map(|s| s.address).collect();
        if fidelity {
            v.extend_from_slice(&self.segment_allocs);
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
        for seg in &self.start.segments {
            let base = alloc
                .seed_segment(seg.stream, seg.small, &seg.blocks)
                .map_err(|e| Error::Input(format!("cannot seed the start state: {e}")))?;
            let mut offset = 0;
            let mut live = seg.live.iter();
            for b in &seg.blocks {
                if b.allocated
                    && let Some(&recorded) = live.next()
                {
                    map.insert(recorded, base + offset);
                }
                offset += b.size;
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
                        // Requested before the trace started.
                        let _ = alloc.free(addr);
                    }
                }
                Action::SegmentFree => {
                    // A cudaFree the replay did not make on its own: empty_cache()
                    // (it releases every free segment; the recording shows a run).
                    let made = ours
                        .iter()
                        .rev()
                        .take_while(|o| o.action != TraceAction::Alloc)
                        .any(|o| o.action == TraceAction::SegmentFree && o.addr == e.addr);
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
            .filter_map(|(i, e)| comparable(e.action).map(|a| (i, a)))
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
            let is_segment = matches!(action, TraceAction::SegmentAlloc | TraceAction::SegmentFree);
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
            start_segments: self.start.segments.len(),
        }
    }

    fn divergence(&self, i: usize, ours: Option<&TraceEntry>) -> Divergence {
        let e = &self.trace[i];
        Divergence {
            event_index: i,
            action: comparable(e.action).map_or("other", TraceAction::as_str),
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

fn free_block(size: u64) -> SeedBlock {
    SeedBlock {
        size,
        requested_size: 0,
        allocated: false,
    }
}

/// The recorded actions the replay reproduces entry by entry.
fn comparable(a: Action) -> Option<TraceAction> {
    Some(match a {
        Action::Alloc => TraceAction::Alloc,
        Action::FreeRequested => TraceAction::FreeRequested,
        Action::FreeCompleted => TraceAction::FreeCompleted,
        Action::SegmentAlloc => TraceAction::SegmentAlloc,
        Action::SegmentFree => TraceAction::SegmentFree,
        _ => return None,
    })
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
    let stats = alloc.stats();
    let result = RunResult {
        capacity_bytes: capacity,
        events: trace.trace.len() as u64,
        oom: run.oom.map(|o| OomEvent {
            event_index: o.event_index as u64,
            requested_bytes: o.requested_bytes,
            message: o.message,
        }),
        peak_reserved_bytes: stats.reserved_bytes.all().peak as u64,
        peak_allocated_bytes: stats.allocated_bytes.all().peak as u64,
        device_allocs: stats.num_device_alloc as u64,
        device_frees: stats.num_device_free as u64,
        alloc_retries: stats.num_alloc_retries as u64,
        stats: alloc.memory_stats(),
        counters: since(alloc.device().counters(), run.seeded_counters),
        peak_event_index: run.peak_event_index,
        allocated_at_peak_reserved: run.allocated_at_peak_reserved,
        timeline: run.timeline,
        segments: alloc.segments(),
        history: run.history,
    };
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
