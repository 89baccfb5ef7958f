//! Replaying a [`Trace`] through the bundled caching allocator on a device.

use super::trace::{Event, Trace};
use crate::allocator::{CachingAllocator, DeviceStats, SegmentInfo};
use crate::conf::Settings;
use crate::device::{Device, DeviceCounters};
use serde::Serialize;
use std::collections::BTreeMap;

/// The OOM that ended a run (the contract's `oom` object).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OomEvent {
    /// The failing event, counting the trace's events from 0.
    pub event_index: u64,
    /// The request as the trace made it.
    pub requested_bytes: u64,
    /// The message PyTorch would raise.
    pub message: String,
}

/// Allocated and reserved bytes after one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TimelinePoint {
    pub allocated: u64,
    pub reserved: u64,
}

/// What the replay asks for beyond the contract's figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplayOptions {
    /// Record (allocated, reserved) after every event.
    pub timeline: bool,
    /// Stop after this many events (used to look at the state at a given event).
    pub stop_after: Option<u64>,
    /// Record the allocator's trace entries (`_record_memory_history`), for
    /// `replay --emit-snapshot`.
    pub history: bool,
}

/// One run of a trace under one config on one device.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunResult {
    pub capacity_bytes: u64,
    /// Events in the trace.
    pub events: u64,
    pub oom: Option<OomEvent>,
    pub peak_reserved_bytes: u64,
    pub peak_allocated_bytes: u64,
    pub device_allocs: u64,
    pub device_frees: u64,
    pub alloc_retries: u64,
    /// Every `memory_stats()` key, flat, at the end of the run.
    pub stats: BTreeMap<String, i64>,
    /// Driver calls and their modelled (sim) or measured (CUDA) time.
    #[serde(skip)]
    pub counters: DeviceCounters,
    /// The event after which allocated memory first reached its peak.
    #[serde(skip)]
    pub peak_event_index: Option<u64>,
    /// Allocated bytes when reserved memory first reached its peak.
    #[serde(skip)]
    pub allocated_at_peak_reserved: u64,
    /// Per event, when [`ReplayOptions::timeline`] asked for it.
    #[serde(skip)]
    pub timeline: Vec<TimelinePoint>,
    /// The segments at the end of the run (snapshot view).
    #[serde(skip)]
    pub segments: Vec<SegmentInfo>,
    /// The allocator's trace entries, when [`ReplayOptions::history`] asked for them.
    #[serde(skip)]
    pub history: Vec<crate::allocator::TraceEntry>,
}

/// What a replay loop keeps after every event: the event where allocated
/// memory first peaked, the allocated figure at the reserved peak, and the
/// optional per-event timeline.
pub(crate) struct Peaks {
    peak_allocated: i64,
    peak_reserved: i64,
    pub peak_event_index: Option<u64>,
    pub allocated_at_peak_reserved: u64,
    record_timeline: bool,
    pub timeline: Vec<TimelinePoint>,
}

impl Peaks {
    pub fn new(record_timeline: bool, events: usize) -> Self {
        Peaks {
            peak_allocated: 0,
            peak_reserved: 0,
            peak_event_index: None,
            allocated_at_peak_reserved: 0,
            record_timeline,
            timeline: Vec::with_capacity(if record_timeline { events } else { 0 }),
        }
    }

    #[inline]
    pub fn observe(&mut self, index: u64, stats: &DeviceStats) {
        let allocated = stats.allocated_bytes.all().current;
        let reserved = stats.reserved_bytes.all().current;
        if allocated > self.peak_allocated {
            self.peak_allocated = allocated;
            self.peak_event_index = Some(index);
        }
        if reserved > self.peak_reserved {
            self.peak_reserved = reserved;
            self.allocated_at_peak_reserved = allocated as u64;
        }
        if self.record_timeline {
            self.timeline.push(TimelinePoint {
                allocated: allocated as u64,
                reserved: reserved as u64,
            });
        }
    }
}

/// Replays `trace` under `settings` on `device` until its end or its first OOM.
pub fn replay<D: Device>(trace: &Trace, settings: &Settings, device: D) -> RunResult {
    replay_with(trace, settings, device, ReplayOptions::default())
}

/// [`replay`] with options.
pub fn replay_with<D: Device>(
    trace: &Trace,
    settings: &Settings,
    device: D,
    options: ReplayOptions,
) -> RunResult {
    let capacity_bytes = device.total_memory();
    let mut allocator = CachingAllocator::new(settings.clone(), device);
    if options.history {
        allocator.record_history();
    }
    let mut addresses: Vec<u64> = vec![0; trace.ids() as usize];
    crate::snapshot::grow::advise_huge(&mut addresses);
    let mut peaks = Peaks::new(options.timeline, trace.len());
    let mut oom = None;
    let limit = options.stop_after.unwrap_or(u64::MAX);
    for (index, event) in trace.events().iter().enumerate() {
        if index as u64 >= limit {
            break;
        }
        match *event {
            Event::Alloc { id, size, stream } => match allocator.malloc(size, stream) {
                Ok(addr) => {
                    if let Some(slot) = addresses.get_mut(id as usize) {
                        *slot = addr;
                    }
                }
                Err(e) => {
                    oom = Some(OomEvent {
                        event_index: index as u64,
                        requested_bytes: size,
                        message: e.message,
                    });
                    break;
                }
            },
            Event::Free { id } => {
                // A trace is validated: the id is live (address 0 for a zero-byte request).
                let addr = addresses.get(id as usize).copied().unwrap_or(0);
                let _ = allocator.free(addr);
            }
            Event::RecordStream { id, stream } => {
                let addr = addresses.get(id as usize).copied().unwrap_or(0);
                let _ = allocator.record_stream(addr, stream);
            }
            Event::SynchronizeStream { stream } => allocator.synchronize_stream(stream),
            Event::EmptyCache => allocator.empty_cache(),
        }
        peaks.observe(index as u64, allocator.stats());
    }
    let stats = allocator.stats();
    RunResult {
        capacity_bytes,
        events: trace.len() as u64,
        oom,
        peak_reserved_bytes: stats.reserved_bytes.all().peak as u64,
        peak_allocated_bytes: stats.allocated_bytes.all().peak as u64,
        device_allocs: stats.num_device_alloc as u64,
        device_frees: stats.num_device_free as u64,
        alloc_retries: stats.num_alloc_retries as u64,
        stats: allocator.memory_stats(),
        counters: allocator.device().counters(),
        peak_event_index: peaks.peak_event_index,
        allocated_at_peak_reserved: peaks.allocated_at_peak_reserved,
        timeline: peaks.timeline,
        segments: allocator.segments(),
        history: allocator.take_trace(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::sim::SimDevice;

    const MIB: u64 = 1 << 20;

    fn trace(csv: &str) -> Trace {
        Trace::parse("t.csv", csv.as_bytes()).unwrap()
    }

    #[test]
    fn replays_to_the_first_oom() {
        let t = trace(
            "action,id,size,stream\nalloc,a,62914560,0\nalloc,b,62914560,0\nfree,a,,\nalloc,c,1,0\n",
        );
        let run = replay(&t, &Settings::default(), SimDevice::new(100 * MIB));
        let oom = run.oom.unwrap();
        assert_eq!(oom.event_index, 1);
        assert_eq!(oom.requested_bytes, 62914560);
        assert!(
            oom.message
                .starts_with("CUDA out of memory. Tried to allocate 60.00 MiB.")
        );
        assert_eq!(run.events, 4);
        assert_eq!(run.peak_reserved_bytes, 60 * MIB);
        assert_eq!(run.alloc_retries, 1);
        assert_eq!(run.device_allocs, 1);
    }

    #[test]
    fn timeline_and_peak_event() {
        let t = trace(
            "action,id,size,stream\nalloc,a,1048576,0\nalloc,b,4194304,0\nfree,b,,\nfree,a,,\nempty_cache,,,\n",
        );
        let options = ReplayOptions {
            timeline: true,
            ..ReplayOptions::default()
        };
        let run = replay_with(&t, &Settings::default(), SimDevice::new(1 << 30), options);
        assert!(run.oom.is_none());
        assert_eq!(run.peak_event_index, Some(1));
        let reserved: Vec<u64> = run.timeline.iter().map(|p| p.reserved / MIB).collect();
        assert_eq!(reserved, vec![2, 22, 22, 22, 0]);
        assert_eq!(run.stats["num_sync_all_streams"], 1);
        assert!(run.segments.is_empty());
    }
}
