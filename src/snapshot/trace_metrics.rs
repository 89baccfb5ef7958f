//! Metrics read from a snapshot's recorded trace (`device_traces`), fed one
//! entry at a time by the loop that already reads each device's trace for the
//! evidence (so the trace is read once): cache misses, segment traffic
//! (cudaMalloc/cudaFree), `empty_cache()` releases, frees deferred by other
//! streams, request-size churn per step, and the memory stranded in split
//! segments when reserved memory peaked.
//!
//! What each action means, from PyTorch's allocator
//! (`c10/cuda/CUDACachingAllocator.{h,cpp}`, `TraceEntry::Action`, 2.6):
//! - `alloc`: `alloc_found_block`. When the cache had no block, `malloc`'s
//!   `alloc_block` cudaMalloc'd a segment first and recorded `segment_alloc`
//!   (or, with expandable segments, mapped pages: `segment_map`) just before
//!   it: that alloc is a cache miss.
//! - `free_requested`: `free()`. `free_completed`: `free_block()`, recorded
//!   right after the request unless the block has stream uses
//!   (`record_stream`): then `insert_events` defers it and `process_events`
//!   completes it once the other streams' events have fired.
//! - `segment_free` / `segment_unmap`: `release_block` (cudaFree) /
//!   `unmap_block`. They come in runs from `release_cached_blocks`, which is
//!   what `emptyCache()` calls and also what `malloc` calls when cudaMalloc
//!   failed (followed there by its retry: a `segment_alloc` or an `oom`);
//!   `release_available_cached_blocks` (oversize blocks) and
//!   `garbage_collect_cached_blocks` also release inside `malloc`, right
//!   before its cudaMalloc. All of them run only after `get_free_block` found
//!   no cached block for the request, so a run that gave back a block the
//!   next request could have had (same pool and stream, within the oversize
//!   rule) came before that request: an `empty_cache()` call.
//!   `emptyCache()` gathers its context at
//!   `RecordContext::ALL`, so with `_record_memory_history(context="all")`
//!   its `segment_free` entries carry the stack of the `empty_cache()` call.
//! - `oom`: recorded before OutOfMemoryError; `device_free` is what
//!   cudaMemGetInfo reported then.
//!
//! `torch/cuda/_memory_viz.py` reads the same actions (`trace`, `segsum`).
//!
//! Steps: the START times of `external_annotations` whose name contains
//! "step" (`ProfilerStep#N`, `record_function("train_step")`), when present
//! and the trace records `time_us`; otherwise the cycles of allocated memory:
//! a step ends where allocated memory, having risen above the middle of its
//! usual range (5th to 95th percentile), comes back to within a tenth of it
//! from the bottom (what a training step frees at its end). A trace with no
//! such cycle is one step.

use super::evidence::frame_text;
use super::model::{Action, Frames, Segment, Snapshot, TraceEntry};
use crate::allocator::sizes::{SMALL_BUFFER, SMALL_SIZE, max_non_split_rounding_size, round_size};
use crate::conf::Settings;
pub use crate::evidence::{
    Peak, Releases, Site, SizeChurn, StepSource, StreamDeferred, TraceMetrics,
};
use std::collections::{BTreeMap, HashMap};

/// Frames kept for a site (innermost first).
const SITE_FRAMES: usize = 8;

/// A cudaMalloc'd segment as the trace walks it: made when the trace first
/// touches it (a snapshot may hold hundreds of thousands it never touches).
struct Seg {
    start: u64,
    size: u64,
    /// Rounded live bytes, relative to the trace start (or to its creation).
    live: i64,
    /// `live` as it was at the peak epoch ([`TraceScan::epoch`]).
    saved: i64,
    /// For a segment of the final snapshot: its active bytes then.
    final_live: i64,
    /// Entry index that created it; [`NONE`]: there before the trace.
    born: u32,
    /// Entry index that released it; [`NONE`]: still there.
    died: u32,
    saved_epoch: u32,
    small: bool,
}

/// No entry index (in [`Seg`]).
const NONE: u32 = u32::MAX;
/// Slots of [`TraceScan::seg_cache`].
const SEG_CACHE: usize = 1024;

/// An entry index as stored in a [`Seg`] or an attribution's lives (a trace
/// of 4 G entries cannot be held): never `u32::MAX`, which stands for none.
pub(super) fn index32(i: usize) -> u32 {
    u32::try_from(i).unwrap_or(NONE - 1)
}

/// A segment of the final snapshot: its start, its index in
/// `Snapshot::segments`, and its [`Seg`] once touched ([`NONE`] before).
#[derive(Clone, Copy)]
struct Initial {
    start: u64,
    snap: u32,
    seg: u32,
}

/// A free request waiting for its completion.
#[derive(Clone, Copy)]
struct Request {
    addr: u64,
    size: u64,
    stream: u64,
    time_us: i64,
    index: usize,
    frames: Frames,
}

/// A run of `segment_free`/`segment_unmap` entries, and what came next.
struct Burst {
    segments: u64,
    bytes: u64,
    /// Its stack names `empty_cache` (recorded at `context="all"`).
    named: bool,
    frames: Frames,
    /// Reserved bytes (relative to the trace start) before the run.
    reserved_before: i64,
    /// The alloc index it happened at.
    at: u32,
    /// The entry after the run: action, size, frames.
    next: Option<(Action, u64, Frames)>,
    /// A block it released would have served the request that followed.
    served_next: bool,
}

impl Burst {
    /// Whether `malloc` released these itself (`release_cached_blocks` after a
    /// failed cudaMalloc, garbage collection, oversize blocks) rather than an
    /// `empty_cache()` call; `reserved_max` is the trace's highest reserved
    /// figure, `gc` whether garbage collection was on.
    fn by_malloc(&self, reserved_max: i64, gc: bool) -> bool {
        if self.named {
            return false;
        }
        match self.next {
            Some((Action::Oom, _, _)) => !self.served_next,
            Some((Action::SegmentAlloc | Action::SegmentMap, size, frames)) => {
                // malloc passes its own context to release_cached_blocks, so
                // its releases carry the stack of the segment_alloc that follows.
                if frames != Frames::NONE && self.frames != Frames::NONE {
                    return frames == self.frames;
                }
                // Without stacks: malloc releases only what get_free_block
                // could not use, and its retry follows a failed cudaMalloc, so
                // the card had no room for this segment on top of what was reserved.
                !self.served_next
                    && self.reserved_before.saturating_add(signed(size)) > reserved_max
                    || gc
            }
            _ => false,
        }
    }
}

/// Feeds on one device's trace entries in order; [`TraceScan::finish`] gives the metrics.
pub struct TraceScan<'s, 'a> {
    snap: &'s Snapshot<'a>,
    device: u32,
    settings: Settings,
    m: TraceMetrics,
    /// The previous entry (action, addr, size).
    prev: Option<(Action, u64, u64)>,
    /// The steps, and the allocated bytes they are found from.
    steps: StepScan,
    live_max: i64,
    /// Per `alloc`: its size.
    sizes: Vec<u64>,
    /// Alloc indices of misses and of empty_cache calls.
    miss_at: Vec<u32>,
    bursts: Vec<Burst>,
    /// A run still open (the last of `bursts`).
    in_burst: bool,
    /// Blocks the last run released (whole free segments): size, stream, small pool.
    released: Vec<(u64, u64, bool)>,
    /// The last run was followed by a segment_alloc: the next alloc is the request it served.
    awaiting_request: bool,
    /// The last `free_requested`, until the next entry shows whether it completed at once.
    request: Option<Request>,
    waiting: HashMap<u64, Request>,
    streams: HashMap<u64, usize>,
    /// Deferred bytes per frames id.
    deferred_sites: HashMap<Frames, (u64, u64)>,
    /// Current deferred bytes per stream (index as in `m.deferred`).
    waiting_bytes: Vec<u64>,
    last_time: i64,
    segs: Vec<Seg>,
    /// The final snapshot's segments of this device, by address.
    initial: Vec<Initial>,
    /// Start address → index in `segs` of the segments made in the trace and still there.
    born: BTreeMap<u64, usize>,
    /// Address range the segments have ever covered (a cheap miss test).
    span: (u64, u64),
    /// The segment found last for each 2 MiB stretch of addresses (by the
    /// stretch's low bits), tried before the map: a trace moves between a
    /// few segments. Entries are checked before use, never cleared.
    seg_cache: Vec<u32>,
    reserved: i64,
    reserved_max: i64,
    /// Entry index whose state is the peak's (the state before it).
    epoch: usize,
    /// Alloc indices where the steps after the first start.
    step_bounds: Vec<u32>,
}

impl<'s, 'a> TraceScan<'s, 'a> {
    /// A scan of `device`'s trace; `settings` are the recorded ones (block sizes follow them).
    pub fn new(snap: &'s Snapshot<'a>, device: u32, settings: Settings) -> Self {
        let mut initial = Vec::new();
        let mut span = (u64::MAX, 0u64);
        for (k, s) in snap.segments.iter().enumerate() {
            if s.device != device || s.is_expandable == Some(true) {
                continue;
            }
            initial.push(Initial {
                start: s.address,
                snap: index32(k),
                seg: NONE,
            });
            span = (
                span.0.min(s.address),
                span.1.max(s.address.saturating_add(s.total_size)),
            );
        }
        // Snapshots list segments by address already: the sort is one pass.
        initial.sort_unstable_by_key(|i| i.start);
        let n = snap.trace_len(device);
        TraceScan {
            snap,
            device,
            m: TraceMetrics::default(),
            prev: None,
            steps: StepScan::new(snap, device),
            live_max: 0,
            // Up to half the entries are allocs (the rest at least their
            // frees); untouched capacity costs no memory.
            sizes: Vec::with_capacity(n / 2),
            miss_at: Vec::new(),
            bursts: Vec::new(),
            in_burst: false,
            released: Vec::new(),
            awaiting_request: false,
            request: None,
            waiting: HashMap::new(),
            streams: HashMap::new(),
            deferred_sites: HashMap::new(),
            waiting_bytes: Vec::new(),
            last_time: 0,
            segs: Vec::new(),
            initial,
            born: BTreeMap::new(),
            span,
            seg_cache: vec![NONE; SEG_CACHE],
            reserved: 0,
            reserved_max: 0,
            epoch: 0,
            step_bounds: Vec::new(),
            settings,
        }
    }

    /// Entry `i` of the trace (entries come in order).
    pub fn entry(&mut self, i: usize, e: &TraceEntry) {
        self.m.entries += 1;
        self.steps.entry(e);
        if e.time_us != 0 {
            self.m.timed = true;
            self.last_time = e.time_us;
        }
        if let Some(r) = self.request.take()
            && !(e.action == Action::FreeCompleted && e.addr == r.addr)
        {
            self.defer(r);
        }
        let releases = matches!(e.action, Action::SegmentFree | Action::SegmentUnmap);
        if self.in_burst && !releases {
            self.in_burst = false;
            if let Some(b) = self.bursts.last_mut() {
                b.next = Some((e.action, e.size, e.frames));
            }
            match e.action {
                // malloc records the rounded size of the request it could not serve.
                Action::Oom => self.served(e.size, e.stream),
                Action::SegmentAlloc => self.awaiting_request = true,
                _ => {}
            }
        } else if std::mem::take(&mut self.awaiting_request) && e.action == Action::Alloc {
            self.served(round_size(e.size, &self.settings), e.stream);
        }
        match e.action {
            Action::Alloc => self.alloc(i, e),
            Action::FreeRequested => {
                self.request = Some(Request {
                    addr: e.addr,
                    size: e.size,
                    stream: e.stream,
                    time_us: e.time_us,
                    index: i,
                    frames: e.frames,
                });
            }
            Action::FreeCompleted => {
                // Most traces defer nothing: no hash per free then.
                if !self.waiting.is_empty()
                    && let Some(r) = self.waiting.remove(&e.addr)
                {
                    self.complete(&r, i, e.time_us);
                }
                self.seg_live(i, e.addr, e.size, -1);
            }
            Action::SegmentAlloc | Action::SegmentMap => {
                self.m.segment_allocs += 1;
                self.m.segment_alloc_bytes = self.m.segment_alloc_bytes.saturating_add(e.size);
                self.reserved = self.reserved.saturating_add(signed(e.size));
                if self.reserved > self.reserved_max {
                    self.reserved_max = self.reserved;
                    self.epoch = i;
                }
                if e.action == Action::SegmentAlloc {
                    self.segment_alloc(i, e);
                }
            }
            Action::SegmentFree | Action::SegmentUnmap => {
                self.m.segment_frees += 1;
                self.m.segment_free_bytes = self.m.segment_free_bytes.saturating_add(e.size);
                self.reserved = self.reserved.saturating_sub(signed(e.size));
                if !self.in_burst {
                    self.in_burst = true;
                    self.awaiting_request = false;
                    self.released.clear();
                    self.bursts.push(Burst {
                        segments: 0,
                        bytes: 0,
                        named: names_empty_cache(self.snap, e.frames),
                        frames: e.frames,
                        reserved_before: self.reserved.saturating_add(signed(e.size)),
                        at: self.alloc_index(),
                        next: None,
                        served_next: false,
                    });
                }
                if let Some(b) = self.bursts.last_mut() {
                    b.segments += 1;
                    b.bytes = b.bytes.saturating_add(e.size);
                }
                if e.action == Action::SegmentFree {
                    let small = self.segment_free(i, e.addr);
                    let small = small.unwrap_or(e.size == SMALL_BUFFER);
                    self.released.push((e.size, e.stream, small));
                }
            }
            Action::Oom => {
                self.m.ooms += 1;
                if e.device_free >= e.size {
                    self.m.ooms_with_free_device += 1;
                }
            }
            Action::Snapshot | Action::Annotate | Action::Other => {}
        }
        self.prev = Some((e.action, e.addr, e.size));
    }

    /// Marks the last run if `get_free_block` would have served a request of
    /// `size` (rounded) bytes on `stream` from a block it released: the
    /// smallest cached block of the pool and stream at least that large,
    /// refused only when oversize (`CUDACachingAllocator.cpp`, `get_free_block`).
    fn served(&mut self, size: u64, stream: u64) {
        let small = size <= SMALL_SIZE;
        let max_split = self.settings.max_split_size;
        let tolerance = max_non_split_rounding_size(&self.settings);
        let fits = |&(block, s, pool_small): &(u64, u64, bool)| {
            s == stream
                && pool_small == small
                && block >= size
                && !(size < max_split && block >= max_split)
                && !(size >= max_split && block >= size.saturating_add(tolerance))
        };
        if self.released.iter().any(fits)
            && let Some(b) = self.bursts.last_mut()
        {
            b.served_next = true;
        }
    }

    fn alloc_index(&self) -> u32 {
        u32::try_from(self.sizes.len()).unwrap_or(u32::MAX)
    }

    fn alloc(&mut self, i: usize, e: &TraceEntry) {
        self.m.allocs += 1;
        // alloc_block records the new segment (or mapped pages) right before the alloc it serves.
        if let Some((Action::SegmentAlloc | Action::SegmentMap, at, size)) = self.prev
            && e.addr < at.saturating_add(size)
            && at < e.addr.saturating_add(e.size.max(1))
        {
            self.m.cache_misses += 1;
            self.miss_at.push(self.alloc_index());
        }
        self.sizes.push(e.size);
        self.live_max = self.live_max.max(self.steps.live);
        self.seg_live(i, e.addr, e.size, 1);
    }

    /// A request that did not complete at once: it waits for other streams.
    fn defer(&mut self, r: Request) {
        let k = self.stream_slot(r.stream);
        if let (Some(d), Some(w)) = (self.m.deferred.get_mut(k), self.waiting_bytes.get_mut(k)) {
            d.frees += 1;
            d.bytes = d.bytes.saturating_add(r.size);
            *w = w.saturating_add(r.size);
            d.peak_bytes = d.peak_bytes.max(*w);
        }
        let site = self.deferred_sites.entry(r.frames).or_default();
        *site = (site.0 + 1, site.1.saturating_add(r.size));
        self.waiting.insert(r.addr, r);
    }

    fn stream_slot(&mut self, stream: u64) -> usize {
        let next = self.m.deferred.len();
        let k = *self.streams.entry(stream).or_insert(next);
        if k == next {
            self.m.deferred.push(StreamDeferred {
                stream,
                ..StreamDeferred::default()
            });
            self.waiting_bytes.push(0);
        }
        k
    }

    /// A deferred request completed at entry `i` (or is still waiting at the end).
    fn complete(&mut self, r: &Request, i: usize, time_us: i64) {
        let k = self.stream_slot(r.stream);
        if let (Some(d), Some(w)) = (self.m.deferred.get_mut(k), self.waiting_bytes.get_mut(k)) {
            *w = w.saturating_sub(r.size);
            let held = if r.time_us != 0 && time_us >= r.time_us {
                time_us.abs_diff(r.time_us)
            } else {
                0
            };
            d.held_us = d.held_us.saturating_add(held);
            d.max_held_us = d.max_held_us.max(held);
            d.held_entries = d.held_entries.saturating_add((i - r.index) as u64);
        }
    }

    /// Sorts the runs of releases into `empty_cache()` calls and malloc's own.
    fn releases(&mut self) -> Vec<u32> {
        let gc = self.settings.garbage_collection_threshold > 0.0;
        let mut calls = Vec::new();
        let mut sites: HashMap<Frames, (u64, u64)> = HashMap::new();
        for b in &self.bursts {
            let r = if b.by_malloc(self.reserved_max, gc) {
                &mut self.m.allocator_releases
            } else {
                calls.push(b.at);
                if b.named {
                    let site = sites.entry(b.frames).or_default();
                    *site = (site.0 + 1, site.1 + 1);
                }
                &mut self.m.empty_cache
            };
            r.calls += 1;
            r.segments += b.segments;
            r.bytes = r.bytes.saturating_add(b.bytes);
        }
        self.m.empty_cache_site = top_site(self.snap, &sites);
        calls
    }

    /// The segment holding `addr` now.
    fn seg_at(&mut self, addr: u64) -> Option<usize> {
        if addr < self.span.0 || addr >= self.span.1 {
            return None;
        }
        // Live segments of a device never overlap, so a live one that holds
        // `addr` is the one the map would find.
        let slot = (addr >> 21) as usize % SEG_CACHE;
        if let Some(&k) = self.seg_cache.get(slot)
            && self.holds(k as usize, addr)
        {
            return Some(k as usize);
        }
        let made = self.born.range(..=addr).next_back().map(|(_, &k)| k);
        let k = match made.filter(|&k| self.holds(k, addr)) {
            Some(k) => k,
            None => {
                let i = self
                    .initial
                    .partition_point(|s| s.start <= addr)
                    .checked_sub(1)?;
                self.touch(i).filter(|&k| self.holds(k, addr))?
            }
        };
        if let Some(c) = self.seg_cache.get_mut(slot) {
            *c = index32(k);
        }
        Some(k)
    }

    /// Segment record `k` is there and holds `addr`.
    fn holds(&self, k: usize, addr: u64) -> bool {
        self.segs
            .get(k)
            .is_some_and(|s| s.died == NONE && addr >= s.start && addr - s.start < s.size)
    }

    /// The record of the final snapshot's segment `i`, made on first use.
    fn touch(&mut self, i: usize) -> Option<usize> {
        let init = self.initial.get(i).copied()?;
        if init.seg != NONE {
            return Some(init.seg as usize);
        }
        let s = self.snap.segments.get(init.snap as usize)?;
        let k = self.segs.len();
        self.segs.push(Seg {
            start: init.start,
            size: s.total_size,
            live: 0,
            saved: 0,
            final_live: signed(s.active_size),
            born: NONE,
            died: NONE,
            saved_epoch: NONE,
            small: is_small_segment(s),
        });
        if let Some(slot) = self.initial.get_mut(i) {
            slot.seg = index32(k);
        }
        Some(k)
    }

    /// The final snapshot's segment starting at `addr`, if still there.
    fn initial_at(&mut self, addr: u64) -> Option<usize> {
        let i = self.initial.binary_search_by_key(&addr, |s| s.start).ok()?;
        let k = self.touch(i)?;
        self.segs
            .get(k)
            .is_some_and(|s| s.died == NONE && s.size > 0)
            .then_some(k)
    }

    /// Adds (`sign` 1) or removes (-1) the block of a `requested`-byte
    /// request at `addr` to the live bytes of its segment, at entry `i`.
    fn seg_live(&mut self, i: usize, addr: u64, requested: u64, sign: i64) {
        let epoch = self.epoch;
        if let Some(k) = self.seg_at(addr)
            && let Some(s) = self.segs.get_mut(k)
        {
            let delta = sign.saturating_mul(signed(round_size(requested, &self.settings)));
            // Keep the value of the peak's moment the first time it changes after it.
            if s.saved_epoch != index32(epoch) && i >= epoch {
                s.saved = s.live;
                s.saved_epoch = index32(epoch);
            }
            s.live = s.live.saturating_add(delta);
        }
    }

    fn segment_alloc(&mut self, i: usize, e: &TraceEntry) {
        // A segment of the final snapshot still standing at this address is
        // the one made here (an earlier one there was released first): it is
        // not also a segment of the start, so it drops out (size 0).
        if let Some(k) = self.initial_at(e.addr)
            && let Some(s) = self.segs.get_mut(k)
        {
            s.size = 0;
        }
        self.born.insert(e.addr, self.segs.len());
        self.span = (
            self.span.0.min(e.addr),
            self.span.1.max(e.addr.saturating_add(e.size)),
        );
        self.segs.push(Seg {
            start: e.addr,
            size: e.size,
            live: 0,
            saved: 0,
            final_live: 0,
            born: index32(i),
            died: NONE,
            saved_epoch: NONE,
            small: e.size == SMALL_BUFFER,
        });
    }

    /// The segment at `addr` is released at entry `i`; whether it was of the
    /// small pool, when known.
    fn segment_free(&mut self, i: usize, addr: u64) -> Option<bool> {
        match self.born.remove(&addr).or_else(|| self.initial_at(addr)) {
            Some(k) => self.segs.get_mut(k).map(|s| {
                s.died = index32(i);
                s.final_live = 0;
                s.small
            }),
            // Made before the trace and never seen in the final snapshot.
            None => {
                self.m.peak.segments_unknown += 1;
                None
            }
        }
    }

    /// The metrics, once every entry was fed.
    pub fn finish(self) -> TraceMetrics {
        self.finish_with_steps().0
    }

    /// [`TraceScan::finish`], and the alloc indices where the steps after
    /// the first start (what `attribute` compares step to step).
    pub fn finish_with_steps(mut self) -> (TraceMetrics, Vec<u32>) {
        if let Some(r) = self.request.take() {
            self.defer(r);
        }
        let (last_time, end) = (self.last_time, self.m.entries as usize);
        let waiting: Vec<Request> = self.waiting.values().copied().collect();
        for r in &waiting {
            self.complete(r, end, last_time);
            if let Some(d) = self
                .streams
                .get(&r.stream)
                .and_then(|&k| self.m.deferred.get_mut(k))
            {
                d.pending_at_end += 1;
            }
        }
        self.m.deferred.sort_by_key(|d| std::cmp::Reverse(d.bytes));
        self.m.deferred_site = top_site(self.snap, &self.deferred_sites);
        let calls = self.releases();
        self.steps(&calls);
        self.peak();
        (self.m, self.step_bounds)
    }

    /// Steps, and what is counted per step (`calls`: alloc indices of `empty_cache()` calls).
    fn steps(&mut self, calls: &[u32]) {
        let n = self.sizes.len();
        let (cuts, source) = self.steps.cuts();
        self.m.step_source = source;
        self.step_bounds = starts(&cuts);
        let chunks: Vec<(usize, usize)> = cuts.windows(2).map(|w| (w[0], w[1])).collect();
        self.m.steps = (chunks.len() as u64).max(1);
        // A call belongs to the step of the last alloc before it.
        let mut with_call: Vec<usize> = calls
            .iter()
            .map(|&c| {
                let k = cuts.partition_point(|&x| x < c as usize);
                k.saturating_sub(1).min(chunks.len().saturating_sub(1))
            })
            .collect();
        with_call.dedup();
        self.m.empty_cache_steps = with_call.len() as u64;
        if let Some(&(_, first_end)) = chunks.first().filter(|_| chunks.len() >= 2) {
            self.m.steady_allocs = (n - first_end) as u64;
            self.m.steady_cache_misses = self
                .miss_at
                .iter()
                .filter(|&&a| a as usize >= first_end)
                .count() as u64;
        }
        if chunks.len() >= 2 {
            self.m.sizes = size_churn(&self.sizes, &chunks);
        }
    }

    fn peak(&mut self) {
        let p = self.epoch;
        let (mut final_reserved, mut final_allocated) = (0u64, 0u64);
        for s in self
            .snap
            .segments
            .iter()
            .filter(|s| s.device == self.device)
        {
            final_reserved = final_reserved.saturating_add(s.total_size);
            let requested = s.requested_size.unwrap_or(s.allocated_size);
            final_allocated = final_allocated.saturating_add(requested);
        }
        let at = |base: u64, end: i64, then: i64| {
            (base as i128 - i128::from(end) + i128::from(then)).clamp(0, i128::from(u64::MAX))
                as u64
        };
        let peak = &mut self.m.peak;
        peak.reserved_event_index = p as u64;
        peak.reserved_bytes = at(final_reserved, self.reserved, self.reserved_max);
        peak.allocated_bytes = at(final_allocated, self.steps.live, self.live_max);
        let mut stranding: Vec<(u64, u64)> = Vec::new();
        let p32 = index32(p);
        let mut add = |size: u64, live: i64, small: bool| {
            if live <= 0 {
                return;
            }
            let free = size.saturating_sub(live as u64);
            peak.stranded_bytes = peak.stranded_bytes.saturating_add(free);
            if !small && free > 0 {
                peak.stranded_large_bytes = peak.stranded_large_bytes.saturating_add(free);
                stranding.push((size, free));
            }
        };
        for s in &self.segs {
            let there = (s.born == NONE || s.born < p32) && (s.died == NONE || s.died >= p32);
            if !there || s.size == 0 {
                continue;
            }
            let then = if s.saved_epoch == p32 {
                s.saved
            } else {
                s.live
            };
            // Live bytes then: the known end (or creation) state less what changed after.
            let base = if s.born == NONE {
                s.final_live.saturating_sub(s.live)
            } else {
                0
            };
            add(s.size, base.saturating_add(then), s.small);
        }
        // Segments the trace never touched were as the snapshot shows them.
        for init in self.initial.iter().filter(|i| i.seg == NONE) {
            if let Some(s) = self.snap.segments.get(init.snap as usize) {
                add(s.total_size, signed(s.active_size), is_small_segment(s));
            }
        }
        peak.stranding_segment_bytes = weighted_median(&mut stranding);
    }
}

/// What a pass over a trace feeds, entry by entry and in order.
pub trait Feed {
    fn entry(&mut self, i: usize, e: &TraceEntry);
}

impl Feed for TraceScan<'_, '_> {
    fn entry(&mut self, i: usize, e: &TraceEntry) {
        TraceScan::entry(self, i, e);
    }
}

/// Finds a trace's steps, alone or inside a [`TraceScan`]: from the step
/// annotations' start times or, without them, from the cycles of the
/// allocated bytes before each alloc.
pub struct StepScan {
    /// Step START times (annotations), ascending, and the next one due.
    step_times: Vec<i64>,
    next_step: usize,
    /// The alloc index at each annotated step's start.
    step_marks: Vec<u32>,
    /// Allocated (requested) bytes relative to the trace start.
    live: i64,
    /// `live` before each alloc.
    lives: Vec<i64>,
}

impl StepScan {
    pub fn new(snap: &Snapshot, device: u32) -> Self {
        StepScan {
            step_times: step_annotations(snap, device),
            next_step: 0,
            step_marks: Vec::new(),
            live: 0,
            // Up to half the entries are allocs; untouched capacity costs no memory.
            lives: Vec::with_capacity(snap.trace_len(device) / 2),
        }
    }

    fn entry(&mut self, e: &TraceEntry) {
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
    fn cuts(&self) -> (Vec<usize>, StepSource) {
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
fn starts(cuts: &[usize]) -> Vec<u32> {
    cuts.get(1..cuts.len().saturating_sub(1))
        .unwrap_or_default()
        .iter()
        .map(|&c| u32::try_from(c).unwrap_or(u32::MAX))
        .collect()
}

/// A byte count as a signed delta (a file's sizes can exceed `i64`).
fn signed(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

fn is_small_segment(s: &Segment) -> bool {
    s.segment_type == super::model::PoolKind::Small
}

/// Alloc indices where a step starts after the first: cycles of allocated
/// memory, each rising from within a tenth of its usual range above the
/// bottom to above the middle, then falling back. A step starts at the last
/// alloc made from the bottom before a rise (what comes before the first
/// rise, such as loading the weights, joins the first step). The usual range
/// runs from the 5th to the 95th percentile of the levels (at most 4096 of
/// them, evenly spaced, are sorted), so a one-time ramp does not set it.
fn step_starts(lives: &[i64], end: i64) -> Vec<u32> {
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

/// Distinct large request sizes per step, and how they move from step to step.
fn size_churn(sizes: &[u64], chunks: &[(usize, usize)]) -> Option<SizeChurn> {
    let large = |&(a, b): &(usize, usize)| {
        sizes
            .get(a..b)
            .unwrap_or_default()
            .iter()
            .copied()
            .filter(|&s| s > SMALL_SIZE)
    };
    let mut prev: Vec<u64> = Vec::new();
    let (mut distinct, mut later, mut new) = (0usize, 0usize, 0usize);
    let mut counts: HashMap<usize, usize> = HashMap::new();
    for (k, chunk) in chunks.iter().enumerate() {
        let mut step: Vec<u64> = large(chunk).collect();
        *counts.entry(step.len()).or_default() += 1;
        step.sort_unstable();
        step.dedup();
        distinct += step.len();
        if k > 0 {
            later += step.len();
            new += step
                .iter()
                .filter(|s| prev.binary_search(s).is_err())
                .count();
        }
        prev = step;
    }
    if distinct == 0 {
        return None;
    }
    // The spread: the k-th large request of each step that made the usual
    // number of them is taken to be the same tensor.
    let (&usual, &steps) = counts
        .iter()
        .filter(|&(&n, _)| n > 0)
        .max_by_key(|&(&n, &c)| (c, n))?;
    let mut range = vec![(u64::MAX, 0u64); usual];
    for chunk in chunks.iter().filter(|c| large(c).count() == usual) {
        for (r, s) in range.iter_mut().zip(large(chunk)) {
            *r = (r.0.min(s), r.1.max(s));
        }
    }
    let mut ratios: Vec<f64> = range
        .iter()
        .map(|&(lo, hi)| hi as f64 / lo as f64)
        .collect();
    ratios.sort_unstable_by(f64::total_cmp);
    Some(SizeChurn {
        distinct_per_step: distinct as f64 / chunks.len() as f64,
        churn: if later == 0 {
            0.0
        } else {
            new as f64 / later as f64
        },
        spread: if steps >= 2 {
            ratios.get(ratios.len() / 2).copied().unwrap_or(1.0)
        } else {
            1.0
        },
    })
}

/// The value (first) at the middle of the weights (second).
fn weighted_median(v: &mut [(u64, u64)]) -> u64 {
    v.sort_unstable();
    let total: u128 = v.iter().map(|&(_, w)| u128::from(w)).sum();
    let mut acc = 0u128;
    for &(value, w) in v.iter() {
        acc += u128::from(w);
        if acc * 2 >= total {
            return value;
        }
    }
    0
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

/// Whether a stack passes through `empty_cache()` (Python) or `emptyCache` (C++).
fn names_empty_cache(snap: &Snapshot, f: Frames) -> bool {
    snap.frames(f)
        .any(|fr| fr.name == "empty_cache" || fr.name.contains("emptyCache"))
}

/// The heaviest site of `stacks` (frames id → entries, weight): stacks are
/// told apart by their text from the first frame outside PyTorch on (each
/// call records its own traceback, so equal stacks have different ids).
fn top_site(snap: &Snapshot, stacks: &HashMap<Frames, (u64, u64)>) -> Option<Site> {
    let mut by_text: HashMap<Vec<String>, (u64, u64)> = HashMap::new();
    for (&frames, &(entries, weight)) in stacks {
        let stack: Vec<_> = snap.frames(frames).collect();
        let Some(user) = stack.iter().position(|f| {
            f.filename.ends_with(".py")
                && !f.filename.contains("/torch/")
                && !f.filename.contains("\\torch\\")
        }) else {
            continue;
        };
        let shown: Vec<String> = stack
            .get(user..)
            .unwrap_or_default()
            .iter()
            .take(SITE_FRAMES)
            .map(frame_text)
            .collect();
        let site = by_text.entry(shown).or_default();
        *site = (site.0 + entries, site.1.saturating_add(weight));
    }
    let (frames, (entries, _)) = by_text
        .into_iter()
        .max_by(|a, b| (a.1.1, &b.0).cmp(&(b.1.1, &a.0)))?;
    Some(Site {
        site: frames.first()?.clone(),
        frames,
        entries,
    })
}
