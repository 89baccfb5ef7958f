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

mod deferred;
mod releases;
mod segments;
mod steps;

use super::evidence::frame_text;
use super::model::{Action, Frames, Snapshot, TraceEntry};
use crate::allocator::sizes::{SMALL_BUFFER, SMALL_SIZE, round_size};
use crate::conf::Settings;
pub use crate::evidence::{
    Peak, Releases, Site, SizeChurn, StepSource, StreamDeferred, TraceMetrics,
};
use deferred::Request;
use releases::{Burst, names_empty_cache};
use segments::{Initial, Seg};
use std::collections::{BTreeMap, HashMap};
pub use steps::StepScan;
use steps::starts;
pub(crate) use steps::step_starts;

/// Frames kept for a site (innermost first).
const SITE_FRAMES: usize = 8;

/// No entry index (in [`Seg`]).
const NONE: u32 = u32::MAX;
/// Slots of [`TraceScan::seg_cache`].
const SEG_CACHE: usize = 1024;

/// An entry index as stored in a [`Seg`] or an attribution's lives (a trace
/// of 4 G entries cannot be held): never `u32::MAX`, which stands for none.
pub(super) fn index32(i: usize) -> u32 {
    u32::try_from(i).unwrap_or(NONE - 1)
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

/// A byte count as a signed delta (a file's sizes can exceed `i64`).
fn signed(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
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
