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

mod expandable;
mod run;
mod start;

use crate::Error;
use crate::allocator::CachingAllocator;
use crate::conf::Settings;
use crate::device::sim::SimDevice;
use crate::device::{Device, DeviceCounters};
use crate::snapshot::Snapshot;
use crate::snapshot::model::{Action, TraceEntry as TraceRecord};
use crate::workload::replay::{OomEvent, ReplayOptions, RunEnd, RunResult};
pub use run::{Divergence, Fidelity, ReplayOom, SnapshotRun};
pub use start::{StartReservation, StartSegment, StartState};

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
        alloc_events: trace
            .trace
            .iter()
            .filter(|e| e.action == Action::Alloc)
            .count() as u64,
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
