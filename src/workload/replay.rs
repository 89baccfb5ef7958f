//! Replaying a [`Trace`] through the bundled caching allocator on a device.

use super::trace::{Event, Trace};
use crate::allocator::block::{BlockId, NIL};
use crate::allocator::{CachingAllocator, DeviceStats, SegmentInfo};
use crate::conf::Settings;
use crate::device::{Device, DeviceCounters};
use serde::Serialize;
use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The OOM that ended a run (the contract's `oom` object).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OomEvent {
    /// The failing event, counting the trace's events from 0.
    pub event_index: u64,
    /// The request as the trace made it.
    pub requested_bytes: u64,
    /// The message PyTorch would raise.
    pub message: String,
    /// A snapshot replay whose start state does not fit the card: the live
    /// and the reserved bytes at the trace start (no request failed).
    #[serde(skip)]
    pub before_trace: Option<(u64, u64)>,
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
    /// Stop once reserved memory passes this many bytes: the run then ranks
    /// below one that already finished with that peak (the config search's
    /// bound, [`RunFigures::stopped_early_at_event`]).
    pub stop_above_reserved: Option<u64>,
}

/// A replayed run's figures: what every command reports, and what the
/// config search ranks by ([`RunFigures::rank`]).
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct RunFigures {
    pub oom: Option<OomEvent>,
    /// Events in the trace.
    pub events: u64,
    pub peak_reserved_bytes: u64,
    pub peak_allocated_bytes: u64,
    pub device_allocs: u64,
    pub device_frees: u64,
    pub alloc_retries: u64,
    /// `release_cached_blocks`' all-stream syncs (`num_sync_all_streams`,
    /// where the version exposes it) plus event and stream syncs.
    pub synchronizations: u64,
    /// Modelled (sim) or measured (cuda) time in driver calls.
    pub driver_time_us: f64,
    /// The device's capacity for this run (the cap on a GPU).
    #[serde(skip)]
    pub capacity_bytes: u64,
    /// Allocated and reserved bytes when the run ended (at the OOM, if any).
    #[serde(skip)]
    pub end_allocated_bytes: u64,
    #[serde(skip)]
    pub end_reserved_bytes: u64,
    /// The event after which allocated memory first reached its peak.
    #[serde(skip)]
    pub peak_event_index: Option<u64>,
    /// Allocated bytes when reserved memory first reached its peak.
    #[serde(skip)]
    pub allocated_at_peak_reserved: u64,
    /// The event after which the run stopped because reserved memory passed
    /// [`ReplayOptions::stop_above_reserved`]: the figures are those of the
    /// events up to it (the peak reserved already above the bound).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped_early_at_event: Option<u64>,
    /// Allocation events replayed (requests the configs could decide
    /// differently on).
    #[serde(skip)]
    pub alloc_events: u64,
    /// Bit `k`: under a `max_split_size` of `2^k` bytes some decision of the
    /// run would have gone the other way
    /// ([`crate::allocator::CachingAllocator::max_split_flips`]); `None`
    /// when not known.
    #[serde(skip)]
    pub max_split_flips: Option<u64>,
}

impl RunFigures {
    /// Best first: no OOM, then lowest peak reserved, then the least driver
    /// work (cudaMalloc + cudaFree, retries, synchronisations: the time cost).
    /// Of two OOMs, the one that got further is better.
    pub fn rank(&self, other: &RunFigures) -> Ordering {
        match (&self.oom, &other.oom) {
            (None, Some(_)) => Ordering::Less,
            (Some(_), None) => Ordering::Greater,
            (Some(a), Some(b)) if a.event_index != b.event_index => {
                b.event_index.cmp(&a.event_index)
            }
            _ => self
                .peak_reserved_bytes
                .cmp(&other.peak_reserved_bytes)
                .then(
                    (self.device_allocs + self.device_frees)
                        .cmp(&(other.device_allocs + other.device_frees)),
                )
                .then(self.alloc_retries.cmp(&other.alloc_retries))
                .then(self.synchronizations.cmp(&other.synchronizations)),
        }
    }

    /// 1 − allocated/reserved when reserved memory peaked.
    pub fn fragmentation_at_peak(&self) -> f64 {
        if self.peak_reserved_bytes == 0 {
            0.0
        } else {
            1.0 - self.allocated_at_peak_reserved as f64 / self.peak_reserved_bytes as f64
        }
    }
}

/// One run of a trace under one config on one device: its figures and what
/// the reports draw (stats, timeline, segments, trace entries).
#[derive(Debug, Clone, PartialEq)]
pub struct RunResult {
    pub figures: RunFigures,
    /// Every `memory_stats()` key, flat, at the end of the run.
    pub stats: BTreeMap<String, i64>,
    /// Driver calls and their modelled (sim) or measured (CUDA) time.
    pub counters: DeviceCounters,
    /// Per event, when [`ReplayOptions::timeline`] asked for it.
    pub timeline: Vec<TimelinePoint>,
    /// The segments at the end of the run (snapshot view).
    pub segments: Vec<SegmentInfo>,
    /// The allocator's trace entries, when [`ReplayOptions::history`] asked for them.
    pub history: Vec<crate::allocator::TraceEntry>,
}

/// How a replay loop ended: what [`RunResult::new`] needs besides the allocator.
pub(crate) struct RunEnd {
    pub events: u64,
    /// Allocation events replayed.
    pub alloc_events: u64,
    pub oom: Option<OomEvent>,
    pub peak_event_index: Option<u64>,
    pub allocated_at_peak_reserved: u64,
    pub timeline: Vec<TimelinePoint>,
    /// The driver work of the run (without what seeding a start state took).
    pub counters: DeviceCounters,
    pub history: Vec<crate::allocator::TraceEntry>,
    /// See [`RunFigures::stopped_early_at_event`].
    pub stopped_early_at_event: Option<u64>,
}

impl RunResult {
    /// The result of a run whose allocator ended in `allocator`'s state.
    pub(crate) fn new<D: Device>(
        allocator: &CachingAllocator<D>,
        capacity_bytes: u64,
        end: RunEnd,
    ) -> Self {
        let stats = allocator.memory_stats();
        let dev = allocator.stats();
        let stat = |k: &str| stats.get(k).copied().unwrap_or(0).max(0) as u64;
        RunResult {
            figures: RunFigures {
                oom: end.oom,
                events: end.events,
                alloc_events: end.alloc_events,
                peak_reserved_bytes: dev.reserved_bytes.all().peak as u64,
                peak_allocated_bytes: dev.allocated_bytes.all().peak as u64,
                device_allocs: dev.num_device_alloc as u64,
                device_frees: dev.num_device_free as u64,
                alloc_retries: dev.num_alloc_retries as u64,
                synchronizations: stat("num_sync_all_streams") + end.counters.synchronizations,
                driver_time_us: end.counters.driver_time_us,
                capacity_bytes,
                end_allocated_bytes: stat("allocated_bytes.all.current"),
                end_reserved_bytes: stat("reserved_bytes.all.current"),
                peak_event_index: end.peak_event_index,
                allocated_at_peak_reserved: end.allocated_at_peak_reserved,
                stopped_early_at_event: end.stopped_early_at_event,
                max_split_flips: Some(allocator.max_split_flips()),
            },
            stats,
            counters: end.counters,
            timeline: end.timeline,
            segments: allocator.segments(),
            history: end.history,
        }
    }
}

/// Driver work of a run so far ([`StreamedReplay::work`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DriverWork {
    pub device_allocs: u64,
    pub device_frees: u64,
    pub alloc_retries: u64,
    pub synchronizations: u64,
    pub driver_time_us: f64,
}

impl DriverWork {
    /// What was done between `before` and `self`.
    pub fn since(&self, before: &DriverWork) -> DriverWork {
        DriverWork {
            device_allocs: self.device_allocs - before.device_allocs,
            device_frees: self.device_frees - before.device_frees,
            alloc_retries: self.alloc_retries - before.alloc_retries,
            synchronizations: self.synchronizations - before.synchronizations,
            driver_time_us: self.driver_time_us - before.driver_time_us,
        }
    }

    /// `self` followed by `more`.
    pub fn add(&mut self, more: &DriverWork) {
        self.device_allocs += more.device_allocs;
        self.device_frees += more.device_frees;
        self.alloc_retries += more.alloc_retries;
        self.synchronizations += more.synchronizations;
        self.driver_time_us += more.driver_time_us;
    }
}

/// What a replay loop keeps after every event: the event where allocated
/// memory first peaked, the allocated figure at the reserved peak, and the
/// optional per-event timeline.
#[derive(Clone)]
pub(crate) struct Peaks {
    peak_allocated: i64,
    peak_reserved: i64,
    pub peak_event_index: Option<u64>,
    /// The event after which reserved memory first reached its peak.
    pub peak_reserved_event_index: Option<u64>,
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
            peak_reserved_event_index: None,
            allocated_at_peak_reserved: 0,
            record_timeline,
            timeline: Vec::with_capacity(if record_timeline { events } else { 0 }),
        }
    }

    /// Peaks from here on, starting at the state now.
    pub fn restart(&mut self, allocated: u64, reserved: u64) {
        self.peak_allocated = allocated as i64;
        self.peak_reserved = reserved as i64;
        self.peak_event_index = None;
        self.peak_reserved_event_index = None;
        self.allocated_at_peak_reserved = allocated;
    }

    /// Takes the figures after event `index`; returns the reserved peak so far.
    #[inline]
    pub fn observe(&mut self, index: u64, stats: &DeviceStats) -> u64 {
        let allocated = stats.allocated_bytes.all().current;
        let reserved = stats.reserved_bytes.all().current;
        if allocated > self.peak_allocated {
            self.peak_allocated = allocated;
            self.peak_event_index = Some(index);
        }
        if reserved > self.peak_reserved {
            self.peak_reserved = reserved;
            self.peak_reserved_event_index = Some(index);
            self.allocated_at_peak_reserved = allocated as u64;
        }
        if self.record_timeline {
            self.timeline.push(TimelinePoint {
                allocated: allocated as u64,
                reserved: reserved as u64,
            });
        }
        self.peak_reserved as u64
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
    let mut replayer =
        StreamedReplay::new(settings, device, options, trace.len(), trace.ids() as usize);
    replayer.feed(trace.events());
    replayer.finish(trace.len() as u64)
}

/// A replay fed its events in pieces ([`Trace::parse_streaming`]), so it can
/// run while the trace is still being read; [`replay_with`] feeds it whole.
/// A clone is a checkpoint: the run so far, to be continued two ways.
#[derive(Clone)]
pub struct StreamedReplay<D: Device> {
    allocator: CachingAllocator<D>,
    capacity_bytes: u64,
    /// Per trace id, its allocation's block (grown when a piece brings a
    /// higher id). Ids are dense, so the replay holds blocks as PyTorch's
    /// `NativeCachingAllocator` does, with no address map
    /// ([`CachingAllocator::malloc_block`]).
    blocks: Vec<BlockId>,
    peaks: Peaks,
    stop_above: u64,
    limit: u64,
    /// Index of the next event.
    index: u64,
    /// Allocation events fed.
    allocs: u64,
    oom: Option<OomEvent>,
    stopped_early_at_event: Option<u64>,
}

impl<D: Device> StreamedReplay<D> {
    /// A replay under `settings` on `device`. `events` and `ids` are what the
    /// trace holds, or 0 where unknown yet (the timeline and the address table
    /// then grow as events come).
    pub fn new(
        settings: &Settings,
        device: D,
        options: ReplayOptions,
        events: usize,
        ids: usize,
    ) -> Self {
        let capacity_bytes = device.total_memory();
        let mut allocator = CachingAllocator::new(settings.clone(), device);
        if options.history {
            allocator.record_history();
        }
        let mut blocks: Vec<BlockId> = vec![NIL; ids];
        crate::snapshot::grow::advise_huge(&mut blocks);
        StreamedReplay {
            allocator,
            capacity_bytes,
            blocks,
            peaks: Peaks::new(options.timeline, events),
            stop_above: options.stop_above_reserved.unwrap_or(u64::MAX),
            limit: options.stop_after.unwrap_or(u64::MAX),
            index: 0,
            allocs: 0,
            oom: None,
            stopped_early_at_event: None,
        }
    }

    /// Replays the next `events` (validated: every free names a live id);
    /// false once the run has ended (its OOM, the bound, `stop_after`), after
    /// which more events are ignored.
    pub fn feed(&mut self, events: &[Event]) -> bool {
        if self.ended() {
            return false;
        }
        let allocator = &mut self.allocator;
        let blocks = &mut self.blocks;
        for event in events {
            let index = self.index;
            if index >= self.limit {
                break;
            }
            self.allocs += u64::from(matches!(event, Event::Alloc { .. }));
            match *event {
                Event::Alloc { id, size, stream } => match allocator.malloc_block(size, stream) {
                    Ok(block) => {
                        let slot = id as usize;
                        if slot >= blocks.len() {
                            blocks.resize((slot + 1).max(2 * blocks.len()), NIL);
                        }
                        blocks[slot] = block;
                    }
                    Err(e) => {
                        self.oom = Some(OomEvent {
                            event_index: index,
                            requested_bytes: size,
                            message: e.message,
                            before_trace: None,
                        });
                        break;
                    }
                },
                Event::Free { id } => {
                    // A trace is validated: the id is live (NIL for a zero-byte request).
                    let block = blocks.get(id as usize).copied().unwrap_or(NIL);
                    let _ = allocator.free_held(block);
                }
                Event::RecordStream { id, stream } => {
                    let block = blocks.get(id as usize).copied().unwrap_or(NIL);
                    let _ = allocator.record_stream_held(block, stream);
                }
                Event::SynchronizeStream { stream } => allocator.synchronize_stream(stream),
                Event::EmptyCache => allocator.empty_cache(),
            }
            self.index = index + 1;
            if self.peaks.observe(index, allocator.stats()) > self.stop_above {
                self.stopped_early_at_event = Some(index);
                break;
            }
        }
        !self.ended()
    }

    /// Allocated and reserved bytes now.
    pub fn current(&self) -> (u64, u64) {
        let s = self.allocator.stats();
        (
            s.allocated_bytes.all().current.max(0) as u64,
            s.reserved_bytes.all().current.max(0) as u64,
        )
    }

    /// Starts the peaks over from the state now: [`Self::peaks`] then gives
    /// the peaks of what is fed after (one step of a run).
    pub fn restart_peaks(&mut self) {
        let (allocated, reserved) = self.current();
        self.peaks.restart(allocated, reserved);
    }

    /// Allocated and reserved bytes at their highest since the start or the
    /// last [`Self::restart_peaks`], and the event that first raised
    /// reserved memory to its peak (`None`: it did not rise).
    pub fn peaks(&self) -> (u64, u64, Option<u64>) {
        let p = &self.peaks;
        (
            p.peak_allocated.max(0) as u64,
            p.peak_reserved.max(0) as u64,
            p.peak_reserved_event_index,
        )
    }

    /// Events fed so far (the index of the next one).
    pub fn events_fed(&self) -> u64 {
        self.index
    }

    /// The OOM that ended the run, if one did.
    pub fn oom(&self) -> Option<&OomEvent> {
        self.oom.as_ref()
    }

    /// The driver work so far: cudaMalloc and cudaFree calls, retries after a
    /// failed cudaMalloc, synchronisations, modelled driver time.
    pub fn work(&self) -> DriverWork {
        let s = self.allocator.stats();
        let c = self.allocator.device().counters();
        DriverWork {
            device_allocs: s.num_device_alloc.max(0) as u64,
            device_frees: s.num_device_free.max(0) as u64,
            alloc_retries: s.num_alloc_retries.max(0) as u64,
            synchronizations: s.num_sync_all_streams.max(0) as u64 + c.synchronizations,
            driver_time_us: c.driver_time_us,
        }
    }

    /// The allocator's state ([`CachingAllocator::state_hash`]) with the
    /// addresses of the allocations of `ids` in that order (what the next
    /// events free by id); `None` on a device that cannot say its state.
    pub fn state_hash(&self, ids: impl Iterator<Item = u32>) -> Option<u64> {
        use std::hash::{Hash, Hasher};
        let mut h = rustc_hash::FxHasher::default();
        self.allocator.state_hash()?.hash(&mut h);
        for id in ids {
            let block = self.blocks.get(id as usize).copied().unwrap_or(NIL);
            self.allocator.block_addr(block).hash(&mut h);
        }
        Some(h.finish())
    }

    /// Bytes a copy of this replay holds, about.
    pub fn approx_bytes(&self) -> usize {
        self.allocator.approx_bytes() + self.blocks.len() * size_of::<BlockId>()
    }

    /// The segments as a snapshot shows them, now.
    pub fn segments(&self) -> Vec<SegmentInfo> {
        self.allocator.segments()
    }

    /// The run ran out of memory, passed the bound, or reached `stop_after`.
    fn ended(&self) -> bool {
        self.oom.is_some() || self.stopped_early_at_event.is_some() || self.index >= self.limit
    }

    /// The run's result; `events` is the length of the whole trace.
    pub fn finish(mut self, events: u64) -> RunResult {
        let end = RunEnd {
            events,
            alloc_events: self.allocs,
            oom: self.oom,
            peak_event_index: self.peaks.peak_event_index,
            allocated_at_peak_reserved: self.peaks.allocated_at_peak_reserved,
            timeline: self.peaks.timeline,
            counters: self.allocator.device().counters(),
            history: self.allocator.take_trace(),
            stopped_early_at_event: self.stopped_early_at_event,
        };
        RunResult::new(&self.allocator, self.capacity_bytes, end)
    }
}

impl<D: Device + Clone> StreamedReplay<D> {
    /// [`Self::feed`] that also keeps where a run under another power-of-two
    /// `max_split_size` can start: the run as it stood at most `every` events
    /// before the event at which that threshold first turned a decision
    /// ([`CachingAllocator::max_split_flips`]), one [`Fork`] per such event.
    /// Up to there the two runs take the same decisions, so the other run
    /// need not replay that prefix. Checkpoints stop once every threshold has
    /// turned one.
    ///
    /// With `share_ids`, which only a trace that allocates each id once
    /// may pass ([`Trace::allocates_each_id_once`]), a checkpoint leaves out
    /// the table from ids to blocks (most of what it would copy) and the
    /// forks share this run's last table instead: an id allocated before the
    /// checkpoint kept its block since (a free does not write the table), and
    /// one allocated after is written by the fork before it is read.
    pub fn feed_keeping_forks(
        &mut self,
        events: &[Event],
        every: usize,
        share_ids: bool,
    ) -> Vec<Fork<D>> {
        let mut forks = Vec::new();
        let mut seen = self.allocator.max_split_flips();
        let mut rest = events;
        while !rest.is_empty() && seen != u64::MAX {
            let (chunk, tail) = rest.split_at(every.max(1).min(rest.len()));
            let before = if share_ids {
                let ids = std::mem::take(&mut self.blocks);
                let before = self.clone();
                self.blocks = ids;
                before
            } else {
                self.clone()
            };
            let going = self.feed(chunk);
            let flips = self.allocator.max_split_flips();
            if flips != seen {
                forks.push(Fork {
                    thresholds: flips & !seen,
                    replay: before,
                    ids: None,
                });
                seen = flips;
            }
            if !going {
                break;
            }
            rest = tail;
        }
        // The rest, unless the run ended (`feed` then does nothing).
        self.feed(rest);
        if share_ids {
            let last = Arc::new(self.blocks.clone());
            for fork in &mut forks {
                fork.ids = Some(Arc::clone(&last));
            }
        }
        forks
    }
}

/// A run under `max_split_size` unset, as it stood before the events at
/// which the thresholds in [`Fork::thresholds`] first turned one of its
/// decisions ([`StreamedReplay::feed_keeping_forks`]).
#[derive(Clone)]
pub struct Fork<D: Device> {
    /// Bit `k`: a threshold of `2^k` bytes turns its first decision after
    /// this point (the bits of [`CachingAllocator::max_split_flips`]).
    pub thresholds: u64,
    /// The run; without its table from ids to blocks where `ids` has it.
    replay: StreamedReplay<D>,
    /// The forked run's last table from ids to blocks, shared by its forks
    /// ([`StreamedReplay::feed_keeping_forks`]).
    ids: Option<Arc<Vec<BlockId>>>,
}

impl<D: Device + Clone> Fork<D> {
    /// Reserved bytes at their highest so far.
    pub fn peak_reserved(&self) -> u64 {
        self.replay.peaks.peak_reserved as u64
    }

    /// The figures of the run of `trace` (the one forked) under `settings`,
    /// which differ from the forked run's only in a `max_split_size` of a
    /// bit in [`Self::thresholds`], bounded by `stop_above_reserved`: the
    /// prefix as it was, the rest replayed. `None` when the settings differ
    /// otherwise, or the prefix already passed the bound (where it passed
    /// is not kept). Only the figures: the oversize counters of
    /// `memory_stats()` were counted under the forked run's threshold.
    pub fn run_under(
        &self,
        trace: &Trace,
        settings: &Settings,
        stop_above_reserved: Option<u64>,
    ) -> Option<RunFigures> {
        let own = self.replay.allocator.settings();
        let threshold = settings.max_split_size;
        let stop_above = stop_above_reserved.unwrap_or(u64::MAX);
        if own.max_split_size != u64::MAX
            || *own
                != (Settings {
                    max_split_size: u64::MAX,
                    ..settings.clone()
                })
            || !threshold.is_power_of_two()
            || self.thresholds & threshold == 0
            || self.peak_reserved() > stop_above
        {
            return None;
        }
        let mut replay = self.replay.clone();
        if let Some(ids) = &self.ids {
            replay.blocks = Vec::clone(ids);
        }
        replay.allocator.continue_under_threshold(threshold);
        replay.stop_above = stop_above;
        replay.feed(&trace.events()[replay.index as usize..]);
        Some(replay.finish(trace.len() as u64).figures)
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
        let oom = run.figures.oom.clone().unwrap();
        assert_eq!(oom.event_index, 1);
        assert_eq!(oom.requested_bytes, 62914560);
        assert!(
            oom.message
                .starts_with("CUDA out of memory. Tried to allocate 60.00 MiB.")
        );
        assert_eq!(run.figures.events, 4);
        assert_eq!(run.figures.peak_reserved_bytes, 60 * MIB);
        assert_eq!(run.figures.alloc_retries, 1);
        assert_eq!(run.figures.device_allocs, 1);
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
        assert!(run.figures.oom.is_none());
        assert_eq!(run.figures.peak_event_index, Some(1));
        let reserved: Vec<u64> = run.timeline.iter().map(|p| p.reserved / MIB).collect();
        assert_eq!(reserved, vec![2, 22, 22, 22, 0]);
        assert_eq!(run.stats["num_sync_all_streams"], 1);
        assert!(run.segments.is_empty());
    }

    #[test]
    fn ranking_prefers_no_oom_then_reserved_then_driver_work() {
        let ok = |reserved, allocs| RunFigures {
            peak_reserved_bytes: reserved,
            device_allocs: allocs,
            ..RunFigures::default()
        };
        let oom = |at| RunFigures {
            oom: Some(OomEvent {
                event_index: at,
                requested_bytes: 0,
                message: String::new(),
                before_trace: None,
            }),
            ..RunFigures::default()
        };
        assert_eq!(ok(900, 50).rank(&oom(10)), Ordering::Less);
        assert_eq!(
            oom(5).rank(&oom(10)),
            Ordering::Greater,
            "later OOM is better"
        );
        assert_eq!(ok(100, 50).rank(&ok(200, 1)), Ordering::Less);
        assert_eq!(ok(100, 2).rank(&ok(100, 3)), Ordering::Less);
    }

    /// Fed in pieces as the parser publishes them (the address table grown as
    /// ids come), a run is the run of the whole trace: to the end, to its OOM
    /// (later pieces ignored) and to the bound.
    #[test]
    fn a_run_fed_in_pieces_is_the_run_of_the_whole_trace() {
        let mut csv = String::from("action,id,size,stream\n");
        for i in 0..40u64 {
            csv += &format!("alloc,a{i},{},0\n", (1 + i % 7) * 3 * MIB + i * 4097);
            if i % 3 == 2 {
                csv += &format!("free,a{},,0\n", i - 1);
            }
        }
        let whole = trace(&csv);
        for (capacity, bound) in [
            (1 << 30, None),
            (100 * MIB, None),
            (1 << 30, Some(60 * MIB)),
        ] {
            let options = ReplayOptions {
                stop_above_reserved: bound,
                ..ReplayOptions::default()
            };
            let settings = Settings::default();
            let expected = replay_with(&whole, &settings, SimDevice::new(capacity), options);
            let mut run = StreamedReplay::new(&settings, SimDevice::new(capacity), options, 0, 0);
            let mut pieces = Vec::new();
            let parsed = Trace::parse_streaming("t.csv", csv.as_bytes(), 5, |events| {
                pieces.push(events.len());
                run.feed(events);
            })
            .unwrap();
            assert_eq!(parsed, whole);
            assert!(
                pieces.len() > 5 && pieces.iter().all(|&n| n <= 5),
                "{pieces:?}"
            );
            assert_eq!(
                run.finish(whole.len() as u64),
                expected,
                "{capacity} {bound:?}"
            );
        }
        assert!(
            replay(&whole, &Settings::default(), SimDevice::new(100 * MIB))
                .figures
                .oom
                .is_some(),
            "the 100 MiB card runs out"
        );
    }

    /// A run under a power-of-two `max_split_size` started from a fork of the
    /// run without it has the figures of its own whole replay, with and
    /// without an OOM or a bound; and forks serve most thresholds, late in
    /// the trace as often as not (so the test is not passed by declining).
    #[test]
    fn a_run_forked_from_the_run_without_a_threshold_is_its_whole_replay() {
        let (mut forked, mut late, mut declined) = (0, 0, 0);
        for seed in 1..25u64 {
            let trace = Trace::random(seed, 400);
            assert!(trace.allocates_each_id_once(), "fresh ids throughout");
            for (es, capacity, every) in [
                (false, 16 << 30, 7),
                (true, 16 << 30, 50),
                (false, 2 << 30, 1),
                (true, 2 << 30, 13),
            ] {
                let unset = Settings {
                    expandable_segments: es,
                    ..Settings::default()
                };
                for bound in [None, Some(1 << 30)] {
                    let options = ReplayOptions {
                        stop_above_reserved: bound,
                        ..ReplayOptions::default()
                    };
                    let mut base = StreamedReplay::new(
                        &unset,
                        SimDevice::new(capacity),
                        options,
                        trace.len(),
                        trace.ids() as usize,
                    );
                    // Both ways of keeping the id table: shared, and copied.
                    let share = trace.allocates_each_id_once() && seed % 2 == 0;
                    let forks = base.feed_keeping_forks(trace.events(), every, share);
                    let whole = base.finish(trace.len() as u64).figures;
                    let plain = replay_with(&trace, &unset, SimDevice::new(capacity), options);
                    assert_eq!(whole, plain.figures, "keeping forks changes nothing");
                    for k in 20..31 {
                        let t = Settings {
                            max_split_size: 1 << k,
                            ..unset.clone()
                        };
                        let expected = replay_with(&trace, &t, SimDevice::new(capacity), options);
                        let fork = forks.iter().find(|f| f.thresholds & (1 << k) != 0);
                        match fork.and_then(|f| f.run_under(&trace, &t, bound)) {
                            Some(figures) => {
                                assert_eq!(
                                    figures, expected.figures,
                                    "seed {seed} es {es} cap {capacity} bound {bound:?}: 2^{k}"
                                );
                                forked += 1;
                                late += usize::from(fork.is_some_and(|f| f.replay.index > 100));
                            }
                            None => declined += 1,
                        }
                    }
                }
            }
        }
        assert!(
            forked > 500 && late > 100 && forked > declined,
            "forked {forked} (late {late}), declined {declined}"
        );
    }

    /// A fork serves only settings that differ from its run's in a
    /// threshold it lists.
    #[test]
    fn a_fork_declines_other_settings() {
        let trace = Trace::random(3, 300);
        let mut base = StreamedReplay::new(
            &Settings::default(),
            SimDevice::new(16 << 30),
            ReplayOptions::default(),
            trace.len(),
            trace.ids() as usize,
        );
        let forks = base.feed_keeping_forks(trace.events(), 10, true);
        let fork = forks.first().expect("some threshold turns a decision");
        let bit = 1u64 << fork.thresholds.trailing_zeros();
        let ok = Settings {
            max_split_size: bit,
            ..Settings::default()
        };
        assert!(fork.run_under(&trace, &ok, None).is_some());
        let other = [
            Settings {
                roundup_power2_divisions: [4; 16],
                ..ok.clone()
            },
            Settings {
                max_split_size: bit + MIB,
                ..ok.clone()
            },
            Settings::default(),
        ];
        for s in other {
            assert!(fork.run_under(&trace, &s, None).is_none(), "{s:?}");
        }
        assert!(fork.run_under(&trace, &ok, Some(0)).is_none() || fork.peak_reserved() == 0);
        // A fork whose prefix already reserved memory declines a bound below
        // that (where the run passed it is not kept), and serves one at it.
        let late = forks
            .iter()
            .find(|f| f.peak_reserved() > 0)
            .expect("a threshold turns a decision after the first cudaMalloc");
        let at = Settings {
            max_split_size: 1 << late.thresholds.trailing_zeros(),
            ..Settings::default()
        };
        let peak = late.peak_reserved();
        assert!(late.run_under(&trace, &at, Some(peak - 1)).is_none());
        assert!(late.run_under(&trace, &at, Some(peak)).is_some());
    }

    #[test]
    fn a_run_stops_once_reserved_passes_the_bound() {
        let t = trace(
            "action,id,size,stream\nalloc,a,1048576,0\nalloc,b,4194304,0\nalloc,c,4194304,0\nfree,c,,\n",
        );
        let options = ReplayOptions {
            stop_above_reserved: Some(10 * MIB),
            ..ReplayOptions::default()
        };
        let run = replay_with(&t, &Settings::default(), SimDevice::new(1 << 30), options);
        // 2 MiB, then 22 MiB (a 20 MiB segment for b): stopped after event 1.
        assert_eq!(run.figures.stopped_early_at_event, Some(1));
        assert_eq!(run.figures.peak_reserved_bytes, 22 * MIB);
        assert!(run.figures.oom.is_none());
        let full = replay(&t, &Settings::default(), SimDevice::new(1 << 30));
        assert_eq!(full.figures.stopped_early_at_event, None);
    }
}
