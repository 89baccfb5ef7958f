//! What fills the card: which code holds the live memory of a snapshot at
//! its peak, at its OOM, at its end or at a moment asked for, and in which
//! category (parameters, gradients, optimizer state, activations,
//! temporaries); what was live before the trace began; what grows from step
//! to step.
//!
//! An allocation is live from its `alloc` entry to the `free_completed` at
//! its address, as `torch.cuda._memory_viz` and the allocator count active
//! memory (`DeviceCachingAllocator::free_block` records FREE_COMPLETED when a
//! block stops being active; a free waiting for other streams is still
//! active). Its bytes are the entry's `size`, the bytes the tensor asked for
//! (`record_trace(TraceEntry::ALLOC, …, orig_size)`), with the block bytes
//! beside them: the request rounded as `round_size` rounds it under the
//! recorded settings, or the block's own size where the snapshot's segments
//! still hold it. Memory live before the trace's first entry (a ring buffer
//! starts mid-run) is counted from the segments (active blocks that no
//! `alloc` of the trace made) and from frees of allocations the trace never
//! saw allocated; it is its own row, never hidden, never negative.
//!
//! Fed one trace entry at a time by the loop that reads the trace for the
//! evidence ([`Attributor::entry`]), so a trace is read once; per entry it
//! costs a hash lookup or two and, for a frames list it has not seen, a
//! walk over its frames with a verdict cached per frame dict.

use super::live_map::LiveMap;
use super::model::{Action, BlockState, Frames, Segment, Snapshot, TraceEntry};
use super::pickle::V;
use super::trace_metrics::{Feed, StepScan};
use crate::allocator::sizes::round_size;
use crate::conf::Settings;
pub use crate::evidence::fills::{
    Attribution, Category, CategoryPart, CategoryRow, Diff, DiffRow, FreeReserved, Grouping,
    Growth, Moment, MomentKind, PreTrace, RankFill, Ranks, Rest, Row, Side, Stacks, Timeline,
};
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;

/// A moment asked for besides the peak, the OOM and the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum At {
    /// The state after this trace entry.
    Event(u64),
    /// The state after the last entry recorded at most this many µs after
    /// the first entry that records a time.
    Time(i64),
}

/// What to compute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask {
    pub by: Grouping,
    /// Rows listed before the rest is summed.
    pub top: usize,
    pub at: Option<At>,
    /// Points of the category timeline (0: none).
    pub timeline_points: usize,
    /// Only the moment a diagnosis is about: the OOM, else the peak, else the end.
    pub headline_only: bool,
}

impl Default for Ask {
    fn default() -> Self {
        Ask {
            by: Grouping::Site,
            top: 5,
            at: None,
            timeline_points: 0,
            headline_only: false,
        }
    }
}

/// The row of memory live before the trace began whose blocks carry no stack.
pub const PRE_TRACE_ROW: &str = "<live before the trace began>";
/// Allocations recorded without frames.
pub const NO_STACK_ROW: &str = "<no stack recorded>";
/// Stacks with C++ frames only.
pub const NO_PYTHON_ROW: &str = "<no Python frame>";

/// How to record the stacks this module reads.
pub const RECORD_STACKS: &str = "torch.cuda.memory._record_memory_history(max_entries=100_000) before the work, then torch.cuda.memory._dump_snapshot(\"snapshot.pickle\")";

/// Site ids reserved for the special rows.
const SITE_NO_STACK: u32 = 0;
const SITE_NO_PYTHON: u32 = 1;
const SITE_PRE_TRACE: u32 = 2;
const SPECIAL_SITES: u32 = 3;

/// `born` of an allocation live before the trace; `died` of one never freed.
const PRE: u32 = u32::MAX;
const NEVER: u32 = u32::MAX;

/// An entry index as stored (a trace of 4 G entries cannot be held).
fn index32(i: usize) -> u32 {
    u32::try_from(i).unwrap_or(NEVER - 1)
}

/// The rule class of a stack, in the order the rules are tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Optimizer,
    Backward,
    Parameters,
    Forward,
    Unknown,
}

// What one frame shows, as bits.
pub(crate) const PY: u16 = 1;
const TORCH: u16 = 1 << 1;
const STDLIB: u16 = 1 << 2;
const PACKAGE: u16 = 1 << 3;
const OPTIM: u16 = 1 << 4;
const BACKWARD: u16 = 1 << 5;
const ACCUMULATE: u16 = 1 << 6;
const PARAM: u16 = 1 << 7;
const FORWARD: u16 = 1 << 8;
/// Not a frame dict: skipped.
const SKIP: u16 = 1 << 15;

/// A frame's verdict, cached per frame dict.
#[derive(Clone, Copy)]
struct FrameInfo {
    flags: u16,
    /// Interned site of a Python frame.
    site: u32,
}

/// A stack's verdict, cached per frames list.
#[derive(Clone, Copy)]
struct StackInfo {
    site: u32,
    user: u32,
    class: Class,
    accumulate: bool,
    python: bool,
    cpp: bool,
}

/// One allocation's life.
#[derive(Clone, Copy)]
struct Life {
    addr: u64,
    bytes: u64,
    block: u64,
    /// Live in the states after entry `born` ([`PRE`]: before the trace).
    born: u32,
    /// Not live from the state after entry `died` on ([`NEVER`]: still live).
    died: u32,
    /// Index into [`Attributor::stacks`].
    stack: u32,
    category: Category,
}

impl Life {
    /// Live in the state after entry `s` (`-1`: before the first entry).
    fn alive(&self, s: i64) -> bool {
        (self.born == PRE || i64::from(self.born) <= s)
            && (self.died == NEVER || s < i64::from(self.died))
    }

    fn pre_trace(&self) -> bool {
        self.born == PRE
    }
}

/// A frame's site key: borrowed from the snapshot's strings.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct SiteKey<'s> {
    filename: &'s str,
    line: i64,
    name: &'s str,
}

/// Feeds on one device's trace entries in order; [`Attributor::finish`]
/// gives the [`Attribution`].
pub struct Attributor<'s, 'a> {
    snap: &'s Snapshot<'a>,
    device: u32,
    settings: Settings,
    ask: Ask,
    frames: FxHashMap<u32, FrameInfo>,
    lists: FxHashMap<u32, u32>,
    stacks: Vec<StackInfo>,
    /// The frames list of each stack (for the stack grouping).
    stack_frames: Vec<Frames>,
    sites: Vec<SiteKey<'s>>,
    site_ids: FxHashMap<SiteKey<'s>, u32>,
    /// Traced allocations, in `alloc` order.
    lives: Vec<Life>,
    /// Allocations live before the trace.
    pre: Vec<Life>,
    /// Address → index in `lives` of the allocation live there.
    /// (its size beside it: a free then reads no `Life`, a cache miss on a long trace).
    live: FxHashMap<u64, (u32, u64)>,
    /// Σ alloc sizes − Σ freed sizes so far; its highest value and entry.
    running: i128,
    best: i128,
    /// The entry after which allocated memory peaked; -1 before the first
    /// (a trace that begins by freeing memory allocated before it).
    peak: Option<i64>,
    /// The last `oom` entry: index, request, device free; and how many.
    oom: Option<(usize, u64, u64)>,
    ooms: u64,
    /// Segment entries: index, action, addr, size.
    segment_events: Vec<(u32, Action, u64, u64)>,
    /// Indices into `lives` in the order they died: entries come in order,
    /// so this is `lives` sorted by `died` without a sort.
    deaths: Vec<u32>,
    entries: usize,
    at_time: Option<usize>,
    first_time: Option<i64>,
    last_time: i64,
    out_of_order: u64,
    replaced: u64,
    /// Memory refused while growing a table.
    refused: bool,
    /// The trace records allocations (known once it ends): without it
    /// nothing is "before the trace".
    traced: bool,
    settled: bool,
    /// What matching the end state found, for the notes.
    end_notes: Vec<String>,
    /// Only the allocated peak is wanted ([`Attributor::peak_only`]): the
    /// live sizes by address then, in place of `live`.
    peak_only: Option<LiveMap>,
}

impl<'s, 'a> Attributor<'s, 'a> {
    /// An attribution of `device`; `settings` are the recorded ones (block sizes follow them).
    pub fn new(snap: &'s Snapshot<'a>, device: u32, settings: Settings, ask: Ask) -> Self {
        Self::with(snap, device, settings, ask, false)
    }

    fn with(
        snap: &'s Snapshot<'a>,
        device: u32,
        settings: Settings,
        ask: Ask,
        peak_only: bool,
    ) -> Self {
        let special = SiteKey {
            filename: "",
            line: 0,
            name: "",
        };
        // Room for the allocs of the trace (at most half its entries; untouched
        // capacity costs no memory), so the tables are not copied as they grow.
        let n = snap.trace_len(device);
        let mut lives = Vec::new();
        let mut live = FxHashMap::default();
        // Room for half the entries live at once (a trace whose allocations
        // last to its end), so the map is not rehashed as it grows.
        let peak_only = peak_only.then(|| LiveMap::with_room(n / 2));
        if peak_only.is_none() {
            let _ = lives.try_reserve_exact(n / 2);
            let _ = live.try_reserve(n / 16);
        }
        Attributor {
            snap,
            device,
            settings,
            ask,
            frames: FxHashMap::default(),
            lists: FxHashMap::default(),
            stacks: vec![
                StackInfo {
                    site: SITE_NO_STACK,
                    user: SITE_NO_STACK,
                    class: Class::Unknown,
                    accumulate: false,
                    python: false,
                    cpp: false,
                },
                StackInfo {
                    site: SITE_PRE_TRACE,
                    user: SITE_PRE_TRACE,
                    class: Class::Unknown,
                    accumulate: false,
                    python: false,
                    cpp: false,
                },
            ],
            stack_frames: vec![Frames::NONE, Frames::NONE],
            sites: vec![special; SPECIAL_SITES as usize],
            site_ids: FxHashMap::default(),
            lives,
            pre: Vec::new(),
            live,
            running: 0,
            best: 0,
            peak: None,
            oom: None,
            ooms: 0,
            segment_events: Vec::new(),
            entries: 0,
            at_time: None,
            first_time: None,
            last_time: i64::MIN,
            out_of_order: 0,
            replaced: 0,
            deaths: Vec::new(),
            refused: false,
            traced: false,
            settled: false,
            end_notes: Vec::new(),
            peak_only,
        }
    }

    /// One that finds only the allocated peak's entry ([`Self::peak_event_index`]),
    /// exactly as [`Self::finish`] gives it, for evidence that shows no
    /// attribution (`parse`): the address map and the running total, without
    /// the lives, stacks, end state and moments that are most of the cost.
    pub fn peak_only(snap: &'s Snapshot<'a>, device: u32) -> Self {
        Self::with(snap, device, Settings::default(), Ask::default(), true)
    }

    /// Entry `i` of the trace (entries come in order).
    pub fn entry(&mut self, i: usize, e: &TraceEntry) {
        if self.peak_only.is_some() {
            return self.peak_entry(i, e);
        }
        self.entries = i + 1;
        if e.time_us != 0 {
            if e.time_us < self.last_time {
                self.out_of_order += 1;
            }
            self.last_time = e.time_us;
            let first = *self.first_time.get_or_insert(e.time_us);
            if let Some(At::Time(t)) = self.ask.at
                && e.time_us.saturating_sub(first) <= t
            {
                self.at_time = Some(i);
            }
        }
        match e.action {
            Action::Alloc => {
                let stack = self.stack_of(e.frames);
                let k = index32(self.lives.len());
                if let Some((old, bytes)) = self.live.insert(e.addr, (k, e.size)) {
                    // An alloc over a live one: the entries between are missing.
                    if let Some(l) = self.lives.get_mut(old as usize) {
                        l.died = index32(i);
                        self.refused |= !push(&mut self.deaths, old);
                    }
                    self.running -= i128::from(bytes);
                    self.replaced += 1;
                }
                let life = Life {
                    addr: e.addr,
                    bytes: e.size,
                    block: round_size(e.size, &self.settings),
                    born: index32(i),
                    died: NEVER,
                    stack,
                    category: Category::Unknown,
                };
                if push(&mut self.lives, life) {
                    self.running += i128::from(e.size);
                } else {
                    self.refused = true;
                }
            }
            Action::FreeCompleted => match self.live.remove(&e.addr) {
                Some((k, bytes)) => {
                    if let Some(l) = self.lives.get_mut(k as usize) {
                        l.died = index32(i);
                        self.refused |= !push(&mut self.deaths, k);
                    }
                    self.running -= i128::from(bytes);
                }
                None => {
                    // Allocated before the trace began: its free entry's
                    // frames are the free's (context "all"), not the allocation's.
                    let life = Life {
                        addr: e.addr,
                        bytes: e.size,
                        block: round_size(e.size, &self.settings),
                        born: PRE,
                        died: index32(i),
                        stack: 1,
                        category: Category::Unknown,
                    };
                    self.refused |= !push(&mut self.pre, life);
                    self.running -= i128::from(e.size);
                }
            },
            Action::SegmentAlloc
            | Action::SegmentFree
            | Action::SegmentMap
            | Action::SegmentUnmap => {
                self.refused |= !push(
                    &mut self.segment_events,
                    (index32(i), e.action, e.addr, e.size),
                );
            }
            Action::Oom => {
                self.oom = Some((i, e.size, e.device_free));
                self.ooms += 1;
            }
            Action::FreeRequested | Action::Snapshot | Action::Annotate | Action::Other => {}
        }
        self.note_peak(i);
    }

    /// After entry `i`: the peak so far, the state before the first entry
    /// (running 0, entry -1) a candidate too.
    fn note_peak(&mut self, i: usize) {
        if self.peak.is_none() && self.running < 0 {
            self.peak = Some(-1);
        } else if self.peak.is_none() || self.running > self.best {
            self.best = self.running;
            self.peak = Some(i as i64);
        }
    }

    /// Looks up the addresses of `window`'s allocs and frees in the address
    /// map, changing nothing: on a trace with a million lives the map is
    /// tens of MB, and each lookup a cache miss; made one after another
    /// (independent loads) they overlap, where [`Self::entry`]'s wait on
    /// each other (BENCHMARKS.md, "parse of the generated snapshot").
    pub fn warm(&self, window: &[(usize, TraceEntry)]) {
        let Some(live) = &self.peak_only else {
            return;
        };
        let mut sum = 0u64;
        for (_, e) in window {
            if matches!(e.action, Action::Alloc | Action::FreeCompleted) {
                sum = sum.wrapping_add(live.touch(e.addr));
            }
        }
        std::hint::black_box(sum);
    }

    /// [`Self::entry`] reduced to what moves the running total and says the
    /// trace records allocations: the same figures, so the same peak.
    fn peak_entry(&mut self, i: usize, e: &TraceEntry) {
        let Some(live) = &mut self.peak_only else {
            return;
        };
        match e.action {
            Action::Alloc => {
                if let Some(bytes) = live.insert(e.addr, e.size) {
                    self.running -= i128::from(bytes);
                }
                self.running += i128::from(e.size);
                self.traced = true;
            }
            Action::FreeCompleted => match live.remove(e.addr) {
                Some(bytes) => self.running -= i128::from(bytes),
                None => {
                    self.running -= i128::from(e.size);
                    self.traced = true;
                }
            },
            _ => {}
        }
        self.note_peak(i);
    }

    /// The allocated peak's entry of a [`Self::peak_only`] attributor fed
    /// every entry: [`Attribution::peak_event_index`] as [`Self::finish`]
    /// gives it.
    pub fn peak_event_index(&self) -> Option<u64> {
        self.peak
            .filter(|_| self.traced)
            .and_then(|p| u64::try_from(p).ok())
    }

    /// The stack id of a frames list, classified on first sight.
    fn stack_of(&mut self, f: Frames) -> u32 {
        if f == Frames::NONE {
            return 0;
        }
        if let Some(&s) = self.lists.get(&f.0) {
            return s;
        }
        let snap = self.snap;
        let (mut site, mut user, mut first_py) = (None, None, None);
        let (mut all, mut any, mut cpp) = (0u16, false, false);
        for &fr in snap.frame_list(f) {
            let info = self.frame_info(fr);
            if info.flags & SKIP != 0 {
                continue;
            }
            any = true;
            cpp |= info.flags & PY == 0;
            all |= info.flags;
            if info.flags & PY != 0 {
                first_py.get_or_insert(info.site);
                if info.flags & (TORCH | STDLIB) == 0 {
                    site.get_or_insert(info.site);
                    if info.flags & PACKAGE == 0 {
                        user.get_or_insert(info.site);
                    }
                }
            }
        }
        if !any {
            // An empty list: recorded without a stack.
            self.lists.insert(f.0, 0);
            return 0;
        }
        let fallback = first_py.unwrap_or(SITE_NO_PYTHON);
        let site = site.unwrap_or(fallback);
        let info = StackInfo {
            site,
            user: user.unwrap_or(site),
            class: class_of(all),
            accumulate: all & ACCUMULATE != 0,
            python: all & PY != 0,
            cpp,
        };
        let id = index32(self.stacks.len());
        if push(&mut self.stacks, info) && push(&mut self.stack_frames, f) {
            self.lists.insert(f.0, id);
            id
        } else {
            self.refused = true;
            0
        }
    }

    fn frame_info(&mut self, fr: V) -> FrameInfo {
        let Some(id) = fr.id() else {
            return FrameInfo {
                flags: SKIP,
                site: 0,
            };
        };
        if let Some(&info) = self.frames.get(&id) {
            return info;
        }
        let info = match self.snap.frame_at(fr) {
            None => FrameInfo {
                flags: SKIP,
                site: 0,
            },
            Some(frame) => {
                let flags = frame_flags(frame.filename, frame.name);
                let site = if flags & PY != 0 {
                    self.intern(SiteKey {
                        filename: frame.filename,
                        line: frame.line,
                        name: frame.name,
                    })
                } else {
                    0
                };
                FrameInfo { flags, site }
            }
        };
        self.frames.insert(id, info);
        info
    }

    fn intern(&mut self, key: SiteKey<'s>) -> u32 {
        if let Some(&id) = self.site_ids.get(&key) {
            return id;
        }
        let id = index32(self.sites.len());
        if push(&mut self.sites, key) {
            self.site_ids.insert(key, id);
            id
        } else {
            self.refused = true;
            SITE_NO_PYTHON
        }
    }

    /// The attribution, once every entry was fed. `step_starts` are the alloc
    /// indices where steps after the first begin (`StepScan::finish`).
    pub fn finish(mut self, step_starts: &[u32]) -> Attribution {
        self.settle();
        let traced = self.traced;
        let mut notes = std::mem::take(&mut self.end_notes);
        let stacks = self.stacks_recorded();
        let last = i64::try_from(self.entries).unwrap_or(i64::MAX) - 1;
        // The moments asked for, in the order they are listed.
        let mut asked: Vec<(MomentKind, i64, Option<usize>)> = Vec::new();
        let peak = self.peak.filter(|_| traced);
        let only = self.ask.headline_only;
        let oom_too = self.oom.is_some();
        if let Some(p) = peak.filter(|_| !(only && oom_too)) {
            asked.push((MomentKind::Peak, p, usize::try_from(p).ok()));
        }
        if let Some((k, ..)) = self.oom {
            asked.push((MomentKind::Oom, k as i64 - 1, Some(k)));
        }
        let end_index = (traced && self.entries > 0).then(|| self.entries - 1);
        if !only || asked.is_empty() {
            asked.push((MomentKind::End, last, end_index));
        }
        match self.ask.at {
            Some(At::Event(n)) => {
                let i = usize::try_from(n)
                    .unwrap_or(usize::MAX)
                    .min(self.entries.saturating_sub(1));
                if self.entries > 0 {
                    asked.push((MomentKind::Event, i as i64, Some(i)));
                }
                if u64::try_from(self.entries).is_ok_and(|e| n >= e) {
                    notes.push(format!(
                        "--at {n} is past the trace's last entry ({last}): the state after it is shown"
                    ));
                }
            }
            Some(At::Time(t)) => {
                let span = self.first_time.map(|f| self.last_time.saturating_sub(f));
                if span.is_some_and(|s| t > s) {
                    notes.push(format!(
                        "--at {}: past the trace's last entry, {} after its first: the state after it is shown",
                        human_us(t),
                        human_us(span.unwrap_or(0))
                    ));
                }
                let s = self.at_time.map_or(-1, |i| i as i64);
                asked.push((MomentKind::Time, s, self.at_time));
            }
            None => {}
        }
        let steps = u64::try_from(step_starts.len())
            .unwrap_or(u64::MAX)
            .saturating_add(1);
        // Each moment, the growth and the timeline read the lives apart:
        // on a long trace, on every core.
        let this = &self;
        let (mut moments, (growth, timeline)) = rayon::join(
            || {
                use rayon::prelude::*;
                asked
                    .par_iter()
                    .map(|&(kind, s, i)| this.moment(kind, s, i))
                    .collect::<Vec<_>>()
            },
            || rayon::join(|| this.growth(step_starts), || this.timeline()),
        );
        if let Some((_, request, free)) = self.oom
            && let Some(m) = moments.iter_mut().find(|m| m.moment == MomentKind::Oom)
        {
            m.request_bytes = Some(request);
            m.device_free_bytes = Some(free);
        }
        self.notes(traced, stacks, &mut notes);
        Attribution {
            device_index: self.device,
            trace_entries: self.entries as u64,
            traced,
            stacks,
            peak_event_index: peak.and_then(|p| u64::try_from(p).ok()),
            moments,
            steps: if traced { steps } else { 0 },
            growth,
            notes,
            timeline,
        }
    }

    /// The end state matched and the categories given, once every entry
    /// was fed (a second call does nothing).
    pub fn settle(&mut self) {
        if self.settled {
            return;
        }
        self.settled = true;
        if self.peak_only.is_some() {
            // `peak_entry` set `traced` as lives and `pre` would have it.
            return;
        }
        self.traced = !self.lives.is_empty() || !self.pre.is_empty();
        let mut notes = Vec::new();
        self.end_state(self.traced, &mut notes);
        self.end_notes = notes;
        self.categorise();
    }

    /// Matches the segments' active blocks with the trace's live allocations:
    /// the rest were live before the trace (or, with no trace, are the state).
    fn end_state(&mut self, traced: bool, notes: &mut Vec<String>) {
        let snap = self.snap;
        let mut matched = 0usize;
        let (mut differ, mut matched_bytes) = (0u64, 0u64);
        let device = self.device;
        // The allocations still open, by address: blocks come by address, so
        // a cursor finds each (a search where one comes out of order) instead
        // of a hash lookup per block of a large snapshot.
        let mut open: Vec<(u64, u32)> = self.live.iter().map(|(&a, &(k, _))| (a, k)).collect();
        open.sort_unstable();
        let mut cursor = 0usize;
        let mut find = |addr: u64| -> Option<u32> {
            if open.get(cursor).is_some_and(|&(a, _)| a > addr)
                || cursor
                    .checked_sub(1)
                    .and_then(|c| open.get(c))
                    .is_some_and(|&(a, _)| a >= addr)
            {
                cursor = open.partition_point(|&(a, _)| a < addr);
            }
            while open.get(cursor).is_some_and(|&(a, _)| a < addr) {
                cursor += 1;
            }
            open.get(cursor)
                .filter(|&&(a, _)| a == addr)
                .map(|&(_, k)| k)
        };
        for seg in snap.segments.iter().filter(|s| s.device == device) {
            for b in snap.blocks_of(seg) {
                if b.state == BlockState::Inactive {
                    continue;
                }
                if let Some(k) = find(b.address)
                    && let Some(l) = self.lives.get_mut(k as usize)
                {
                    matched += 1;
                    matched_bytes = matched_bytes.saturating_add(l.bytes);
                    differ += u64::from(l.bytes != b.requested_size);
                    l.block = b.size;
                    continue;
                }
                let stack = match self.stack_of(b.frames) {
                    // No stack on a block the trace never made: the pre-trace row.
                    0 if traced => 1,
                    s => s,
                };
                let life = Life {
                    addr: b.address,
                    bytes: b.requested_size,
                    block: b.size,
                    born: PRE,
                    died: NEVER,
                    stack,
                    category: Category::Unknown,
                };
                self.refused |= !push(&mut self.pre, life);
            }
        }
        let unmatched = self.live.len().saturating_sub(matched);
        if unmatched > 0 {
            let bytes = self
                .live
                .values()
                .map(|&(_, b)| b)
                .fold(0u64, u64::saturating_add)
                .saturating_sub(matched_bytes);
            notes.push(format!(
                "{unmatched} allocation{} the trace leaves live ({}) {} not in the snapshot's segments: the trace and the segments disagree, and the figures follow the trace",
                plural(unmatched as u64),
                crate::units::format_size(bytes),
                if unmatched == 1 { "is" } else { "are" },
            ));
        }
        if differ > 0 {
            notes.push(format!(
                "{differ} live block{} of the segments record{} another requested size than the trace's alloc at {} address: the trace's size is counted",
                plural(differ),
                if differ == 1 { "s" } else { "" },
                if differ == 1 { "its" } else { "their" },
            ));
        }
    }

    /// Each allocation's category: the rule class of its stack, with
    /// backward and optimizer allocations told apart by whether they outlive
    /// the run of allocations of their class (their phase).
    fn categorise(&mut self) {
        let n = index32(self.entries);
        let classes: Vec<Class> = self
            .lives
            .iter()
            .map(|l| {
                self.stacks
                    .get(l.stack as usize)
                    .map_or(Class::Unknown, |s| s.class)
            })
            .collect();
        let mut start = 0;
        while start < self.lives.len() {
            let class = classes.get(start).copied().unwrap_or(Class::Unknown);
            let end = classes
                .get(start..)
                .unwrap_or_default()
                .iter()
                .position(|&c| c != class)
                .map_or(self.lives.len(), |p| start + p);
            // The phase ends at the next alloc of another class.
            let next = self.lives.get(end).map_or(n, |l| l.born);
            for k in start..end {
                let Some(l) = self.lives.get(k) else { continue };
                let outlives = l.died == NEVER || l.died > next;
                let cat = category(class, self.accumulates(l.stack), outlives);
                if let Some(l) = self.lives.get_mut(k) {
                    l.category = cat;
                }
            }
            start = end;
        }
        for k in 0..self.pre.len() {
            let Some(&l) = self.pre.get(k) else { continue };
            let class = self
                .stacks
                .get(l.stack as usize)
                .map_or(Class::Unknown, |s| s.class);
            let cat = category(class, self.accumulates(l.stack), true);
            if let Some(l) = self.pre.get_mut(k) {
                l.category = cat;
            }
        }
    }

    fn accumulates(&self, stack: u32) -> bool {
        self.stacks
            .get(stack as usize)
            .is_some_and(|s| s.accumulate)
    }

    fn stacks_recorded(&self) -> Stacks {
        let used = |f: &dyn Fn(&StackInfo) -> bool| self.stacks.iter().skip(2).any(f);
        match (used(&|s| s.python), used(&|s| s.cpp)) {
            (true, true) => Stacks::PythonAndCpp,
            (true, false) => Stacks::Python,
            (false, true) => Stacks::Cpp,
            (false, false) => Stacks::None,
        }
    }

    fn all_lives(&self) -> impl Iterator<Item = &Life> + '_ {
        self.lives.iter().chain(self.pre.iter())
    }

    /// The live set after entry `s`, grouped; `index` is the entry named.
    fn moment(&self, kind: MomentKind, s: i64, index: Option<usize>) -> Moment {
        let ranges: Vec<(u64, u64)> = self.reserved_at(s).into_iter().collect();
        // Groups: by site, category or size class a dense table (their keys
        // are small); by stack or segment a map.
        let dense = match self.ask.by {
            Grouping::Site | Grouping::User => self.sites.len(),
            Grouping::Category => Category::ALL.len(),
            Grouping::Size => SIZE_CLASSES.len(),
            Grouping::Stack | Grouping::Segment => 0,
        };
        let mut table = vec![Acc::default(); dense];
        let mut groups: FxHashMap<u32, Acc> = FxHashMap::default();
        let mut pre = PreTrace::default();
        let mut cats = [Acc::default(); 7];
        let (mut total, mut total_block, mut count) = (0u64, 0u64, 0u64);
        let mut in_range = vec![0u64; ranges.len()];
        let mut stack_keys: FxHashMap<Vec<u32>, u32> = FxHashMap::default();
        let mut stack_of_key: FxHashMap<u32, u32> = FxHashMap::default();
        let mut outside = 0u64;
        let mut last_range = 0usize;
        for l in self.all_lives().filter(|l| l.alive(s)) {
            total = total.saturating_add(l.bytes);
            total_block = total_block.saturating_add(l.block);
            count += 1;
            if let Some(c) = cats.get_mut(l.category.index()) {
                c.add(l, self.traced);
            }
            if l.pre_trace() && self.traced {
                pre.bytes = pre.bytes.saturating_add(l.bytes);
                pre.block_bytes = pre.block_bytes.saturating_add(l.block);
                pre.count += 1;
                if l.died == NEVER {
                    pre.live_at_end_bytes = pre.live_at_end_bytes.saturating_add(l.bytes);
                } else {
                    pre.freed_in_trace_bytes = pre.freed_in_trace_bytes.saturating_add(l.bytes);
                }
                if l.stack > 1 {
                    pre.with_stack_bytes = pre.with_stack_bytes.saturating_add(l.bytes);
                }
            }
            // Blocks come in address runs: the range of the last one first.
            let range = range_of(&ranges, l.addr, last_range);
            match range {
                Some(r) => {
                    last_range = r;
                    if let Some(b) = in_range.get_mut(r) {
                        *b = b.saturating_add(l.block);
                    }
                }
                None => outside = outside.saturating_add(l.bytes),
            }
            let key = match self.ask.by {
                Grouping::Site | Grouping::User => self.site_of(l),
                Grouping::Category => l.category.index() as u32,
                Grouping::Size => size_class(l.block) as u32,
                Grouping::Segment => range.map_or(u32::MAX, index32),
                Grouping::Stack => {
                    let next = stack_keys.len() as u32;
                    let sites = self.python_sites(l.stack);
                    let k = *stack_keys.entry(sites).or_insert(next);
                    stack_of_key.entry(k).or_insert(l.stack);
                    k
                }
            };
            match table.get_mut(key as usize) {
                Some(acc) => acc.add(l, self.traced),
                None => groups.entry(key).or_default().add(l, self.traced),
            }
        }
        let share = |b: u64| if total == 0 { 0.0 } else { ratio(b, total) };
        pre.share = share(pre.bytes);
        let accs = table
            .iter()
            .enumerate()
            .filter(|(_, a)| a.count > 0)
            .map(|(k, a)| (index32(k), a))
            .chain(groups.iter().map(|(&k, a)| (k, a)));
        // By bytes, ties by the site's (file as recorded, line, function),
        // else by the key; only the rows listed are formatted.
        let mut ranked: Vec<(u32, &Acc, (&str, i64, &str))> = accs
            .map(|(key, acc)| {
                let tie = match self.ask.by {
                    Grouping::Site | Grouping::User if key >= SPECIAL_SITES => self
                        .sites
                        .get(key as usize)
                        .map_or(("", 0, ""), |s| (s.filename, s.line, s.name)),
                    _ => ("", i64::from(key), ""),
                };
                (key, acc, tie)
            })
            .collect();
        ranked.sort_by(|(_, a, ta), (_, b, tb)| b.bytes.cmp(&a.bytes).then_with(|| ta.cmp(tb)));
        // The top N groups, and the pre-trace row beside them wherever it ranks.
        let is_pre = |key: u32| {
            matches!(self.ask.by, Grouping::Site | Grouping::User) && key == SITE_PRE_TRACE
        };
        let top = self.ask.top.max(1);
        let mut kept = Vec::with_capacity(top.min(ranked.len()) + 1);
        let mut rest = Rest::default();
        let mut listed = 0;
        for (key, acc, _) in ranked {
            if is_pre(key) || listed < top {
                listed += usize::from(!is_pre(key));
                kept.push(self.row(key, acc, (&stack_of_key, &ranges), share(acc.bytes)));
            } else {
                rest.groups += 1;
                rest.bytes = rest.bytes.saturating_add(acc.bytes);
                rest.block_bytes = rest.block_bytes.saturating_add(acc.block);
                rest.count += acc.count;
            }
        }
        rest.share = share(rest.bytes);
        let mut categories: Vec<CategoryRow> = Category::ALL
            .iter()
            .zip(cats.iter())
            .filter(|(_, a)| a.count > 0)
            .map(|(&category, a)| CategoryRow {
                category,
                bytes: a.bytes,
                block_bytes: a.block,
                count: a.count,
                share: share(a.bytes),
            })
            .collect();
        categories.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.category.cmp(&b.category)));
        let mut free = FreeReserved::default();
        let mut reserved = 0u64;
        for (&(_, len), &live) in ranges.iter().zip(&in_range) {
            reserved = reserved.saturating_add(len);
            match Some(live).filter(|&b| b > 0) {
                Some(live) => {
                    free.in_split_segments_bytes = free
                        .in_split_segments_bytes
                        .saturating_add(len.saturating_sub(live));
                }
                None => {
                    free.whole_free_segments += 1;
                    free.whole_free_segments_bytes =
                        free.whole_free_segments_bytes.saturating_add(len);
                }
            }
        }
        let time_us = index
            .and_then(|i| self.snap.trace_entry(self.device, i))
            .and_then(Result::ok)
            .map(|e| e.time_us)
            .filter(|&t| t != 0);
        Moment {
            moment: kind,
            event_index: index.map(|i| i as u64),
            time_us,
            allocated_bytes: total,
            allocated_block_bytes: total_block,
            live_allocations: count,
            reserved_bytes: reserved,
            outside_segments_bytes: outside,
            request_bytes: None,
            device_free_bytes: None,
            by: self.ask.by,
            rows: kept,
            rest: (rest.groups > 0).then_some(rest),
            pre_trace: pre,
            free_reserved: free,
            categories,
        }
    }

    /// The site id a life is grouped under (site or user grouping).
    fn site_of(&self, l: &Life) -> u32 {
        match self.ask.by {
            Grouping::User => self
                .stacks
                .get(l.stack as usize)
                .map_or(SITE_NO_STACK, |s| s.user),
            _ => self.site(l),
        }
    }

    /// A life's site under the site grouping (growth is read by it).
    fn site(&self, l: &Life) -> u32 {
        self.stacks
            .get(l.stack as usize)
            .map_or(SITE_NO_STACK, |s| s.site)
    }

    /// The interned sites of a stack's Python frames, innermost first.
    fn python_sites(&self, stack: u32) -> Vec<u32> {
        let f = self
            .stack_frames
            .get(stack as usize)
            .copied()
            .unwrap_or(Frames::NONE);
        let sites: Vec<u32> = self
            .snap
            .frame_list(f)
            .iter()
            .filter_map(|fr| self.frames.get(&fr.id()?))
            .filter(|i| i.flags & PY != 0 && i.flags & SKIP == 0)
            .map(|i| i.site)
            .collect();
        if sites.is_empty() {
            vec![
                self.stacks
                    .get(stack as usize)
                    .map_or(SITE_NO_STACK, |s| s.site),
            ]
        } else {
            sites
        }
    }

    fn row(
        &self,
        key: u32,
        acc: &Acc,
        (stack_of_key, ranges): (&FxHashMap<u32, u32>, &[(u64, u64)]),
        share: f64,
    ) -> Row {
        let (category, mix) = acc.categories();
        let mut row = Row {
            key: String::new(),
            filename: None,
            line: None,
            function: None,
            frames: Vec::new(),
            category,
            mix,
            bytes: acc.bytes,
            block_bytes: acc.block,
            count: acc.count,
            share,
            pre_trace_bytes: acc.pre,
        };
        match self.ask.by {
            Grouping::Site | Grouping::User => {
                row.key = self.site_text(key);
                if key >= SPECIAL_SITES
                    && let Some(s) = self.sites.get(key as usize)
                {
                    row.filename = Some(s.filename.to_string());
                    row.line = Some(s.line);
                    row.function = Some(s.name.to_string());
                }
            }
            Grouping::Category => {
                row.key = Category::ALL
                    .get(key as usize)
                    .map_or("unknown", |c| c.as_str())
                    .to_string();
            }
            Grouping::Size => {
                row.key = SIZE_CLASSES
                    .get(key as usize)
                    .copied()
                    .unwrap_or("")
                    .to_string()
            }
            Grouping::Segment => {
                row.key = match ranges.get(key as usize) {
                    Some((start, len)) => format!(
                        "segment at {start:#x} ({})",
                        crate::units::format_size(*len)
                    ),
                    None => "<outside every segment>".to_string(),
                };
            }
            Grouping::Stack => {
                let stack = stack_of_key.get(&key).copied().unwrap_or(0);
                row.frames = self
                    .python_sites(stack)
                    .into_iter()
                    .map(|s| self.site_text(s))
                    .collect();
                row.key = row.frames.first().cloned().unwrap_or_default();
            }
        }
        row
    }

    fn site_text(&self, site: u32) -> String {
        match site {
            SITE_NO_STACK => NO_STACK_ROW.to_string(),
            SITE_NO_PYTHON => NO_PYTHON_ROW.to_string(),
            SITE_PRE_TRACE => PRE_TRACE_ROW.to_string(),
            _ => self
                .sites
                .get(site as usize)
                .map(|s| format!("{}:{}:{}", short_path(s.filename), s.line, s.name))
                .unwrap_or_default(),
        }
    }

    /// The reserved address ranges after entry `s`: the segments at the end
    /// with the segment entries after `s` undone (start → length).
    fn reserved_at(&self, s: i64) -> BTreeMap<u64, u64> {
        let mut ranges: BTreeMap<u64, u64> = self
            .snap
            .segments
            .iter()
            .filter(|g: &&Segment| g.device == self.device && g.total_size > 0)
            .map(|g| (g.address, g.total_size))
            .collect();
        for &(i, action, addr, size) in self.segment_events.iter().rev() {
            if i64::from(i) <= s {
                break;
            }
            match action {
                Action::SegmentAlloc | Action::SegmentMap => cut(&mut ranges, addr, size),
                _ => {
                    let len = ranges.entry(addr).or_default();
                    *len = (*len).max(size);
                }
            }
        }
        ranges
    }

    /// Sites whose live bytes at the start of each step rise at every one
    /// of at least three consecutive step starts.
    fn growth(&self, step_starts: &[u32]) -> Vec<Growth> {
        const MAX_BOUNDARIES: usize = 4096;
        if self.lives.is_empty() || step_starts.is_empty() {
            return Vec::new();
        }
        // The state before each step's first alloc.
        let mut states: Vec<i64> = std::iter::once(0u32)
            .chain(step_starts.iter().copied())
            .filter_map(|a| self.lives.get(a as usize))
            .map(|l| i64::from(l.born) - 1)
            .collect();
        states.dedup();
        let every = states.len().div_ceil(MAX_BOUNDARIES).max(1);
        let states: Vec<i64> = states.into_iter().step_by(every).collect();
        // Live bytes per site at each state, by a sweep over births and deaths.
        // Each site's live bytes, and its longest rise read state by state:
        // only the sites whose bytes changed since the last state are looked
        // at (a site left alone repeats its value, which ends a rise).
        let mut live = vec![0i128; self.sites.len()];
        let mut rises = vec![Rise::NEW; self.sites.len()];
        let mut touched: Vec<u32> = Vec::new();
        let mut is_touched = vec![false; self.sites.len()];
        let touch = |sid: u32, touched: &mut Vec<u32>, is_touched: &mut [bool]| {
            if let Some(t) = is_touched.get_mut(sid as usize)
                && !*t
            {
                *t = true;
                touched.push(sid);
            }
        };
        let (mut born, mut died) = (0usize, 0usize);
        for (j, &s) in states.iter().enumerate() {
            while let Some(l) = self.lives.get(born).filter(|l| i64::from(l.born) <= s) {
                let sid = self.site(l);
                if let Some(v) = live.get_mut(sid as usize) {
                    *v += i128::from(l.bytes);
                    touch(sid, &mut touched, &mut is_touched);
                }
                born += 1;
            }
            while let Some(l) = self
                .deaths
                .get(died)
                .and_then(|&k| self.lives.get(k as usize))
                .filter(|l| i64::from(l.died) <= s)
            {
                {
                    let sid = self.site(l);
                    if let Some(v) = live.get_mut(sid as usize) {
                        *v -= i128::from(l.bytes);
                        touch(sid, &mut touched, &mut is_touched);
                    }
                }
                died += 1;
            }
            for sid in touched.drain(..) {
                let at = sid as usize;
                if let (Some(r), Some(&v)) = (rises.get_mut(at), live.get(at)) {
                    r.observe(j, u64::try_from(v).unwrap_or(0));
                }
                if let Some(t) = is_touched.get_mut(at) {
                    *t = false;
                }
            }
        }
        let step = |j: usize| (j * every) as u64;
        let mut out: Vec<(u32, i64, Growth)> = rises
            .into_iter()
            .enumerate()
            .skip(SPECIAL_SITES as usize)
            .filter_map(|(sid, r)| {
                let (from, to, a, b) = r.finish()?;
                let spanned = step(to) - step(from);
                let sid = index32(sid);
                Some((
                    sid,
                    states.get(to).copied().unwrap_or(-1),
                    Growth {
                        site: self.site_text(sid),
                        category: Category::Unknown,
                        mix: Vec::new(),
                        first_step: step(from),
                        last_step: step(to),
                        first_bytes: a,
                        last_bytes: b,
                        bytes_per_step: (b - a) / spanned.max(1),
                    },
                ))
            })
            .collect();
        out.sort_by(|(_, _, a), (_, _, b)| {
            let total = |g: &Growth| g.last_bytes - g.first_bytes;
            total(b).cmp(&total(a)).then_with(|| a.site.cmp(&b.site))
        });
        out.truncate(10);
        // Each listed site's category as the peak's table gives it, by the
        // same rule over the same allocations (what it holds then); one that
        // holds nothing at the peak, by what it holds at its last step start.
        // Each reads every life: only for those listed.
        let peak = self.peak.unwrap_or(-1);
        out.into_iter()
            .map(|(sid, last, g)| {
                let mut acc = self.site_at(sid, peak);
                if acc.count == 0 {
                    acc = self.site_at(sid, last);
                }
                let (category, mix) = acc.categories();
                Growth { category, mix, ..g }
            })
            .collect()
    }

    /// What the site `site` (site grouping) holds after entry `s`.
    fn site_at(&self, site: u32, s: i64) -> Acc {
        let mut acc = Acc::default();
        for l in self
            .all_lives()
            .filter(|l| l.alive(s) && self.site(l) == site)
        {
            acc.add(l, self.traced);
        }
        acc
    }

    /// Allocated bytes by category over the trace, at most
    /// `ask.timeline_points` points (each the fullest state of its stretch).
    fn timeline(&self) -> Timeline {
        let points = self.ask.timeline_points;
        if points == 0 || self.entries == 0 {
            return Timeline::default();
        }
        // Deaths in order: the trace's lives and the pre-trace ones that it
        // frees each died in entry order, so a merge orders them.
        let mut traced = self
            .deaths
            .iter()
            .filter_map(|&k| self.lives.get(k as usize))
            .peekable();
        let mut pre = self.pre.iter().filter(|l| l.died != NEVER).peekable();
        let deaths: Vec<(u32, Category, u64)> = std::iter::from_fn(|| {
            let take_pre = match (traced.peek(), pre.peek()) {
                (Some(t), Some(p)) => p.died < t.died,
                (t, _) => t.is_none(),
            };
            if take_pre { pre.next() } else { traced.next() }
        })
        .map(|l| (l.died, l.category, l.bytes))
        .collect();
        let mut cur = [0u64; 7];
        for l in self.pre.iter() {
            if let Some(c) = cur.get_mut(l.category.index()) {
                *c = c.saturating_add(l.bytes);
            }
        }
        let stretch = self.entries.div_ceil(points).max(1);
        let mut out = Vec::with_capacity(points + 1);
        let (mut born, mut died) = (0usize, 0usize);
        let mut best: Option<(u64, u64, [u64; 7])> = None;
        for s in 0..self.entries {
            let s32 = index32(s);
            while let Some(l) = self.lives.get(born).filter(|l| l.born <= s32) {
                if let Some(c) = cur.get_mut(l.category.index()) {
                    *c = c.saturating_add(l.bytes);
                }
                born += 1;
            }
            while let Some(&(_, cat, bytes)) = deaths.get(died).filter(|d| d.0 <= s32) {
                if let Some(c) = cur.get_mut(cat.index()) {
                    *c = c.saturating_sub(bytes);
                }
                died += 1;
            }
            let total: u64 = cur.iter().sum();
            if best.is_none_or(|(t, _, _)| total > t) {
                best = Some((total, s as u64, cur));
            }
            if ((s + 1) % stretch == 0 || s + 1 == self.entries)
                && let Some((_, at, c)) = best.take()
            {
                out.push((at, c));
            }
        }
        Timeline { points: out }
    }

    fn notes(&self, traced: bool, stacks: Stacks, notes: &mut Vec<String>) {
        let freed: Vec<&Life> = self.pre.iter().filter(|l| l.died != NEVER).collect();
        if !freed.is_empty() {
            let bytes = freed
                .iter()
                .map(|l| l.bytes)
                .fold(0u64, u64::saturating_add);
            notes.push(format!(
                "the trace starts mid-run: it frees {} allocation{} ({}) it never saw allocated; they count as live from before the trace began until their free",
                freed.len(),
                plural(freed.len() as u64),
                crate::units::format_size(bytes)
            ));
        }
        if self.replaced > 0 {
            notes.push(format!(
                "{} alloc entr{} land on an address still live with no free in between (entries are missing): the earlier allocation counts as freed there",
                self.replaced,
                if self.replaced == 1 { "y" } else { "ies" }
            ));
        }
        if self.out_of_order > 0 {
            notes.push(format!(
                "{} trace entr{} recorded earlier than the entry before {}: the entries are taken in file order",
                self.out_of_order,
                if self.out_of_order == 1 { "y is" } else { "ies are" },
                if self.out_of_order == 1 { "it" } else { "them" }
            ));
        }
        if self.ooms > 1 {
            notes.push(format!(
                "the trace records {} OOMs; the last is shown",
                self.ooms
            ));
        }
        if !traced {
            notes.push(
                "this snapshot holds no recorded allocations (no trace, or a trace without alloc and free entries): only the state at its end can be attributed"
                    .to_string(),
            );
        }
        if stacks == Stacks::None && (traced || !self.pre.is_empty()) {
            notes.push(format!(
                "no stacks are recorded, so memory cannot be tied to code; record them with {RECORD_STACKS}"
            ));
        }
        if self.refused {
            notes.push("the system refused memory for the attribution's tables: some allocations are left out".to_string());
        }
    }
}

/// Appends `x` unless the system refuses the memory.
fn push<T>(v: &mut Vec<T>, x: T) -> bool {
    if v.len() == v.capacity() && v.try_reserve(v.len().max(64)).is_err() {
        return false;
    }
    v.push(x);
    true
}

fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

fn ratio(a: u64, b: u64) -> f64 {
    (a as f64 / b as f64 * 1e6).round() / 1e6
}

/// Per-group sums.
#[derive(Default, Clone, Copy)]
struct Acc {
    bytes: u64,
    block: u64,
    count: u64,
    pre: u64,
    /// Requested bytes and allocations per category, in [`Category::ALL`] order.
    by_category: [(u64, u64); 7],
}

impl Acc {
    /// Adds a live allocation (`traced`: the trace records allocations, so
    /// a pre-trace one is told apart).
    fn add(&mut self, l: &Life, traced: bool) {
        self.bytes = self.bytes.saturating_add(l.bytes);
        self.block = self.block.saturating_add(l.block);
        self.count += 1;
        if l.pre_trace() && traced {
            self.pre = self.pre.saturating_add(l.bytes);
        }
        if let Some((bytes, count)) = self.by_category.get_mut(l.category.index()) {
            *bytes = bytes.saturating_add(l.bytes);
            *count += 1;
        }
    }

    /// The group's category, the one rule for a row of any moment and for
    /// a growing site: the category holding most of its bytes (of equal
    /// ones, the most allocations, then the first in [`Category::ALL`]),
    /// with every category's part when its allocations fall in several.
    fn categories(&self) -> (Category, Vec<CategoryPart>) {
        let mut parts: Vec<(Category, u64, u64)> = Category::ALL
            .into_iter()
            .zip(self.by_category)
            .filter(|(_, (_, count))| *count > 0)
            .map(|(c, (bytes, count))| (c, bytes, count))
            .collect();
        parts.sort_by(|a, b| b.1.cmp(&a.1).then(b.2.cmp(&a.2)).then(a.0.cmp(&b.0)));
        let category = parts.first().map_or(Category::Unknown, |p| p.0);
        let mix = if parts.len() > 1 {
            parts
                .into_iter()
                .map(|(category, bytes, _)| CategoryPart { category, bytes })
                .collect()
        } else {
            Vec::new()
        };
        (category, mix)
    }
}

/// The index of the range (sorted by start) holding `addr`, trying `hint` first.
fn range_of(ranges: &[(u64, u64)], addr: u64, hint: usize) -> Option<usize> {
    let holds = |i: usize| {
        ranges
            .get(i)
            .is_some_and(|&(start, len)| addr >= start && addr - start < len)
    };
    if holds(hint) {
        return Some(hint);
    }
    let i = ranges
        .partition_point(|&(start, _)| start <= addr)
        .checked_sub(1)?;
    holds(i).then_some(i)
}

/// Removes `[addr, addr + size)` from the ranges (a segment or mapped pages
/// made after the moment).
fn cut(ranges: &mut BTreeMap<u64, u64>, addr: u64, size: u64) {
    let end = addr.saturating_add(size);
    let hit: Vec<(u64, u64)> = ranges
        .range(..end)
        .rev()
        .take_while(|(s, l)| s.saturating_add(**l) > addr)
        .map(|(&s, &l)| (s, l))
        .collect();
    for (s, l) in hit {
        ranges.remove(&s);
        let e = s.saturating_add(l);
        if s < addr {
            ranges.insert(s, addr - s);
        }
        if e > end {
            ranges.insert(end, e - end);
        }
    }
}

/// The longest run of strictly rising values of one series, read value by
/// value; a position not observed repeats the value before it. Kept as
/// (first, last, first value, last value) when it has at least three values.
#[derive(Debug, Clone, Copy)]
struct Rise {
    /// The position observed last and its value (position 0 is 0 until observed).
    last: usize,
    value: u64,
    /// The open run's first position and value.
    start: usize,
    start_value: u64,
    best: Option<(usize, usize, u64, u64)>,
}

impl Rise {
    const NEW: Rise = Rise {
        last: 0,
        value: 0,
        start: 0,
        start_value: 0,
        best: None,
    };

    /// Ends the open run at `end`; the first longest run is kept.
    fn close(&mut self, end: usize, end_value: u64) {
        if end >= self.start + 2 && self.best.is_none_or(|(a, b, ..)| end - self.start > b - a) {
            self.best = Some((self.start, end, self.start_value, end_value));
        }
    }

    /// The value at position `j` (after every position observed so far).
    fn observe(&mut self, j: usize, v: u64) {
        if j == 0 {
            (self.value, self.start_value) = (v, v);
            return;
        }
        if j > self.last + 1 {
            // Positions last+1 .. j-1 repeated the value: the run ended at `last`.
            self.close(self.last, self.value);
            (self.start, self.start_value) = (j - 1, self.value);
        }
        if v <= self.value {
            self.close(j - 1, self.value);
            (self.start, self.start_value) = (j, v);
        }
        (self.last, self.value) = (j, v);
    }

    fn finish(mut self) -> Option<(usize, usize, u64, u64)> {
        self.close(self.last, self.value);
        self.best
    }
}

/// The category of a rule class; `outlives`: the allocation outlives its phase.
fn category(class: Class, accumulate: bool, outlives: bool) -> Category {
    match class {
        Class::Optimizer if outlives => Category::OptimizerState,
        Class::Optimizer => Category::OptimizerTemporaries,
        Class::Backward if accumulate || outlives => Category::Gradients,
        Class::Backward => Category::BackwardTemporaries,
        Class::Parameters => Category::Parameters,
        Class::Forward => Category::Activations,
        Class::Unknown => Category::Unknown,
    }
}

fn class_of(flags: u16) -> Class {
    if flags & OPTIM != 0 {
        Class::Optimizer
    } else if flags & BACKWARD != 0 {
        Class::Backward
    } else if flags & PARAM != 0 {
        Class::Parameters
    } else if flags & FORWARD != 0 {
        Class::Forward
    } else {
        Class::Unknown
    }
}

/// The verdict on one frame: where its file lives and which category rules it meets.
pub(crate) fn frame_flags(filename: &str, name: &str) -> u16 {
    let normalised;
    let path = if filename.contains('\\') {
        normalised = filename.replace('\\', "/");
        normalised.as_str()
    } else {
        filename
    };
    let mut f = 0;
    let py = path.ends_with(".py");
    let package = path.contains("/site-packages/") || path.contains("/dist-packages/");
    let is = |tail: &str| path == tail || path.strip_suffix(tail).is_some_and(|p| p.ends_with('/'));
    if py {
        f |= PY;
        if path.contains("/torch/") || path.starts_with("torch/") {
            f |= TORCH;
        }
        if package {
            f |= PACKAGE;
        } else if is_stdlib(path) {
            f |= STDLIB;
        }
    }
    const OPTIMIZER_DIRS: [&str; 6] = [
        "/torch/optim/",
        "/torch/distributed/optim/",
        "/apex/optimizers/",
        "/bitsandbytes/optim/",
        "/deepspeed/ops/adam/",
        "/torchao/optim/",
    ];
    if (py
        && (OPTIMIZER_DIRS.iter().any(|d| path.contains(d)) || is("transformers/optimization.py")))
        || (name == "step" && path.to_ascii_lowercase().contains("optim"))
    {
        f |= OPTIM;
    }
    let backward = match name {
        "backward" => is("torch/_tensor.py") || is("torch/autograd/__init__.py"),
        "grad" => is("torch/autograd/__init__.py"),
        "_engine_run_backward" => is("torch/autograd/graph.py"),
        _ => false,
    };
    if backward
        || (!py && (name.contains("torch::autograd::Engine::") || name.contains("AccumulateGrad")))
    {
        f |= BACKWARD;
    }
    if !py && name.contains("AccumulateGrad") {
        f |= ACCUMULATE;
    }
    const PARAM_FUNCTIONS: [&str; 6] = [
        "__init__",
        "reset_parameters",
        "_apply",
        "to",
        "cuda",
        "_load_from_state_dict",
    ];
    if (path.contains("/torch/nn/") && PARAM_FUNCTIONS.contains(&name))
        || name.contains("load_state_dict")
        || name.contains("from_pretrained")
        || name == "_load_pretrained_model"
        || is("torch/nn/parameter.py")
    {
        f |= PARAM;
    }
    if name == "forward"
        || (is("torch/nn/modules/module.py") && matches!(name, "_call_impl" | "_wrapped_call_impl"))
    {
        f |= FORWARD;
    }
    f
}

/// A file of the Python standard library: under `lib/pythonX.Y/` (or
/// Windows' `Lib/`) and not in site-packages (checked by the caller).
fn is_stdlib(path: &str) -> bool {
    if path.contains("/Lib/") {
        return true;
    }
    ["/lib/python", "/lib64/python", "/Lib/python"]
        .iter()
        .any(|dir| {
            path.match_indices(dir).any(|(at, _)| {
                let rest = path.get(at + dir.len()..).unwrap_or("");
                let version = rest.len()
                    - rest
                        .trim_start_matches(|c: char| c.is_ascii_digit() || c == '.')
                        .len();
                rest.get(version..).is_some_and(|r| r.starts_with('/'))
            })
        })
}

/// How a site's file is shown: the path inside site-packages, else the file name.
fn short_path(filename: &str) -> String {
    let path = filename.replace('\\', "/");
    let inside = ["/site-packages/", "/dist-packages/"]
        .iter()
        .filter_map(|d| path.rfind(d).map(|at| at + d.len()))
        .max();
    match inside {
        Some(at) => path.get(at..).unwrap_or("").to_string(),
        None => path.rsplit('/').next().unwrap_or("").to_string(),
    }
}

/// The site of a stack given as frames (innermost first), by the rule of
/// the site grouping: the first Python frame outside torch and the standard
/// library, else the first Python frame.
pub fn site_label(frames: &[super::model::Frame]) -> Option<String> {
    let shown =
        |f: &super::model::Frame| format!("{}:{}:{}", short_path(f.filename), f.line, f.name);
    let flags: Vec<u16> = frames
        .iter()
        .map(|f| frame_flags(f.filename, f.name))
        .collect();
    frames
        .iter()
        .zip(&flags)
        .find(|(_, fl)| **fl & PY != 0 && **fl & (TORCH | STDLIB) == 0)
        .or_else(|| frames.iter().zip(&flags).find(|(_, fl)| **fl & PY != 0))
        .map(|(f, _)| shown(f))
}

/// Block size classes (the size grouping), in [`size_class`] order.
const SIZE_CLASSES: [&str; 6] = [
    "under 1 MiB (small pool)",
    "1-10 MiB",
    "10-100 MiB",
    "100 MiB-1 GiB",
    "1-10 GiB",
    "10 GiB and over",
];

fn size_class(bytes: u64) -> usize {
    const MIB: u64 = 1 << 20;
    match bytes {
        b if b <= MIB => 0,
        b if b < 10 * MIB => 1,
        b if b < 100 * MIB => 2,
        b if b < 1024 * MIB => 3,
        b if b < 10 * 1024 * MIB => 4,
        _ => 5,
    }
}

/// What one read of a trace feeds: a scan (the trace metrics, or the steps
/// alone; when there is one) and the attribution.
pub(crate) struct Passes<'s, 'a, S> {
    pub scan: Option<S>,
    pub fills: Attributor<'s, 'a>,
}

impl<S: Feed> Passes<'_, '_, S> {
    fn entry(&mut self, i: usize, e: &TraceEntry) {
        if let Some(scan) = &mut self.scan {
            scan.entry(i, e);
        }
        self.fills.entry(i, e);
    }

    /// A batch's entries in order, [`WARM`] at a time after their addresses
    /// are looked up ([`Attributor::warm`]).
    fn batch(&mut self, batch: &[(usize, TraceEntry)]) {
        for window in batch.chunks(WARM) {
            self.fills.warm(window);
            for (i, e) in window {
                self.entry(*i, e);
            }
        }
    }
}

/// Entries whose addresses are looked up together before they are fed.
const WARM: usize = 16;

/// Where a trace's passes are fed: on this thread, entry by entry, or on a
/// thread of their own, in batches of the entries this thread has read
/// (each entry is decoded once; the batches' buffers go back and forth).
/// Reading an entry out of the decoded pickle costs about what the passes
/// cost, so this thread only reads.
pub(crate) enum Feeding<'t, 's, 'a, S> {
    Inline(Box<Passes<'s, 'a, S>>),
    Thread {
        batch: Vec<(usize, TraceEntry)>,
        full: std::sync::mpsc::SyncSender<Vec<(usize, TraceEntry)>>,
        empty: std::sync::mpsc::Receiver<Vec<(usize, TraceEntry)>>,
        worker: std::thread::ScopedJoinHandle<'t, Passes<'s, 'a, S>>,
    },
}

/// Entries handed to the passes' thread at a time.
const FEED_BATCH: usize = 4096;

impl<'t, 's, 'a, S: Feed + Send + 's> Feeding<'t, 's, 'a, S> {
    /// Inline for a short trace; a trace of [`THREADED_TRACE`] entries or
    /// more is fed on a thread of `threads`.
    pub(crate) fn new(
        threads: &'t std::thread::Scope<'t, '_>,
        passes: Passes<'s, 'a, S>,
        entries: usize,
    ) -> Self
    where
        's: 't,
    {
        if entries < THREADED_TRACE {
            return Feeding::Inline(Box::new(passes));
        }
        // Two batches in flight: one being read here, one fed there.
        let (full, batches) = std::sync::mpsc::sync_channel::<Vec<(usize, TraceEntry)>>(2);
        let (back, empty) = std::sync::mpsc::channel();
        let worker = threads.spawn(move || {
            let mut passes = passes;
            for mut batch in batches {
                passes.batch(&batch);
                batch.clear();
                // This side may have stopped early (an error): nothing to hand back to.
                let _ = back.send(batch);
            }
            passes.fills.settle();
            passes
        });
        Feeding::Thread {
            batch: Vec::with_capacity(FEED_BATCH),
            full,
            empty,
            worker,
        }
    }

    pub(crate) fn entry(&mut self, i: usize, e: &TraceEntry) {
        match self {
            Feeding::Inline(a) => a.entry(i, e),
            Feeding::Thread {
                batch, full, empty, ..
            } => {
                batch.push((i, e.clone()));
                if batch.len() == FEED_BATCH {
                    let next = empty
                        .try_recv()
                        .unwrap_or_else(|_| Vec::with_capacity(FEED_BATCH));
                    // A send fails only when the worker is gone (it panicked): join says so.
                    let _ = full.send(std::mem::replace(batch, next));
                }
            }
        }
    }

    pub(crate) fn finish(self, device: u32) -> Result<Passes<'s, 'a, S>, super::model::ModelError> {
        match self {
            Feeding::Inline(p) => Ok(*p),
            Feeding::Thread {
                batch,
                full,
                worker,
                ..
            } => {
                if !batch.is_empty() {
                    let _ = full.send(batch);
                }
                drop(full);
                worker.join().map_err(|_| super::model::ModelError {
                    path: format!("device_traces[{device}]"),
                    problem: "its attribution or step scan failed".to_string(),
                })
            }
        }
    }
}

/// Trace entries from which a device's trace is attributed on a second
/// thread (below, the thread would cost more than it saves).
const THREADED_TRACE: usize = 100_000;

/// Attributes each device of a snapshot (`devices`, or every device that
/// has segments or trace entries), reading each trace once; the steps are
/// the ones `trace_metrics` finds, from the same pass.
pub fn attribute(
    snap: &Snapshot,
    devices: Option<&[u32]>,
    ask: Ask,
) -> Result<Vec<Attribution>, super::model::ModelError> {
    let settings = super::evidence::recorded_settings(snap);
    let mut out = Vec::new();
    for device in snap.devices() {
        if devices.is_some_and(|d| !d.contains(&device)) {
            continue;
        }
        let passes = Passes {
            scan: Some(StepScan::new(snap, device)),
            fills: Attributor::new(snap, device, settings.clone(), ask),
        };
        // A long trace is scanned and attributed on a second thread, while
        // this one reads its entries.
        let passes = std::thread::scope(|threads| {
            let mut feeding = Feeding::new(threads, passes, snap.trace_len(device));
            for (i, e) in snap.trace(device).enumerate() {
                feeding.entry(i, &e?);
            }
            feeding.finish(device)
        })?;
        let steps = passes.scan.map(StepScan::finish);
        out.push(passes.fills.finish(&steps.unwrap_or_default()));
    }
    Ok(out)
}

/// Compares the moment `kind` of two attributions group by group (the
/// rows of each side were computed with every group kept); `top` rows are
/// listed by the size of their change, the rest summed.
pub fn diff(
    (before_input, before): (&str, &Attribution),
    (after_input, after): (&str, &Attribution),
    kind: MomentKind,
    top: usize,
) -> Option<Diff> {
    let pick = |a: &Attribution| {
        a.moment(kind)
            .or_else(|| a.moment(MomentKind::End))
            .cloned()
    };
    let (b, a) = (pick(before)?, pick(after)?);
    let side = |input: &str, at: &Attribution, m: &Moment| {
        let peak = at.moment(MomentKind::Peak);
        Side {
            input: input.to_string(),
            device_index: at.device_index,
            moment: m.moment,
            event_index: m.event_index,
            allocated_bytes: m.allocated_bytes,
            reserved_bytes: m.reserved_bytes,
            live_allocations: m.live_allocations,
            pre_trace_bytes: m.pre_trace.bytes,
            pre_trace: m.pre_trace.clone(),
            peak_allocated_bytes: peak.map(|p| p.allocated_bytes),
            peak_event_index: peak.and_then(|p| p.event_index),
        }
    };
    // A group's key, category (and mix), bytes and count on one side.
    type Group = (String, Category, Vec<CategoryPart>, u64, u64);
    let compare = |left: Vec<Group>, right: Vec<Group>| {
        let mut rows: BTreeMap<String, DiffRow> = BTreeMap::new();
        for (side, list) in [(0, left), (1, right)] {
            for (key, category, mix, bytes, count) in list {
                let r = rows.entry(key.clone()).or_insert(DiffRow {
                    key,
                    category,
                    mix: Vec::new(),
                    before_bytes: 0,
                    after_bytes: 0,
                    delta_bytes: 0,
                    before_count: 0,
                    after_count: 0,
                });
                if side == 0 {
                    r.before_bytes = bytes;
                    r.before_count = count;
                    r.mix = mix;
                } else {
                    r.after_bytes = bytes;
                    r.after_count = count;
                    r.category = category;
                    r.mix = mix;
                }
            }
        }
        let mut rows: Vec<DiffRow> = rows
            .into_values()
            .map(|mut r| {
                r.delta_bytes = (i128::from(r.after_bytes) - i128::from(r.before_bytes))
                    .clamp(i128::from(i64::MIN), i128::from(i64::MAX))
                    as i64;
                r
            })
            .collect();
        rows.sort_by(|x, y| {
            y.delta_bytes
                .unsigned_abs()
                .cmp(&x.delta_bytes.unsigned_abs())
                .then_with(|| x.key.cmp(&y.key))
        });
        rows
    };
    let groups = |m: &Moment| {
        m.rows
            .iter()
            .map(|r| (r.key.clone(), r.category, r.mix.clone(), r.bytes, r.count))
            .collect::<Vec<_>>()
    };
    let cats = |m: &Moment| {
        m.categories
            .iter()
            .map(|c| {
                (
                    c.category.as_str().to_string(),
                    c.category,
                    Vec::new(),
                    c.bytes,
                    c.count,
                )
            })
            .collect::<Vec<_>>()
    };
    let mut rows = compare(groups(&b), groups(&a));
    let mut rest = None;
    if rows.len() > top.max(1) {
        let cut = rows.split_off(top.max(1));
        let mut r = DiffRow {
            key: format!("{} other groups", cut.len()),
            category: Category::Unknown,
            mix: Vec::new(),
            before_bytes: 0,
            after_bytes: 0,
            delta_bytes: 0,
            before_count: 0,
            after_count: 0,
        };
        for c in &cut {
            r.before_bytes = r.before_bytes.saturating_add(c.before_bytes);
            r.after_bytes = r.after_bytes.saturating_add(c.after_bytes);
            r.before_count += c.before_count;
            r.after_count += c.after_count;
            r.delta_bytes = r.delta_bytes.saturating_add(c.delta_bytes);
        }
        rest = Some(r);
    }
    let mut notes = Vec::new();
    if before.device_index != after.device_index {
        notes.push(format!(
            "the two sides are different devices (cuda:{} and cuda:{}): compared as they are",
            before.device_index, after.device_index
        ));
    }
    if b.moment != a.moment {
        notes.push(format!(
            "the {} side has no {} moment: its {} is compared",
            if b.moment != kind { "before" } else { "after" },
            kind.as_str(),
            if b.moment != kind {
                b.moment.as_str()
            } else {
                a.moment.as_str()
            }
        ));
    }
    Some(Diff {
        before: side(before_input, before, &b),
        after: side(after_input, after, &a),
        by: b.by,
        rows,
        rest,
        categories: compare(cats(&b), cats(&a)),
        notes,
    })
}

/// The rank a file name names (`rank3.pickle`, `snapshot_rank_3_x.pickle`,
/// `rank-12.pkl`), if any.
pub fn rank_in_name(input: &str) -> Option<u32> {
    let name = input
        .rsplit(['/', '\\'])
        .next()
        .unwrap_or(input)
        .to_ascii_lowercase();
    name.match_indices("rank").find_map(|(at, _)| {
        let rest = name.get(at + 4..)?;
        let rest = rest.trim_start_matches(['_', '-', '.']);
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        rest.get(..digits).filter(|d| !d.is_empty())?.parse().ok()
    })
}

/// The median of `values`: of an even count, the mean of the two middle ones.
pub fn median(mut values: Vec<u64>) -> Option<f64> {
    values.sort_unstable();
    let n = values.len();
    let mid = values.get(n / 2).copied()? as f64;
    if n.is_multiple_of(2) {
        Some((values.get(n / 2 - 1).copied()? as f64 + mid) / 2.0)
    } else {
        Some(mid)
    }
}

/// The several-rank view of attributions (one per input: its device with
/// the most allocated at its headline moment).
pub fn ranks(inputs: &[(String, Attribution)]) -> Ranks {
    const DEVIATION: f64 = 0.10;
    const MIN_DEVIATION_BYTES: u64 = 256 << 20;
    let mut rows: Vec<RankFill> = inputs
        .iter()
        .filter_map(|(input, a)| {
            let m = a.headline()?;
            let top = m.rows.first();
            let category = m
                .categories
                .iter()
                .find(|c| c.category != Category::Unknown)
                .or(m.categories.first());
            Some(RankFill {
                rank: rank_in_name(input),
                input: input.clone(),
                device_index: a.device_index,
                moment: m.moment,
                allocated_bytes: m.allocated_bytes,
                reserved_bytes: m.reserved_bytes,
                top_site: top.map(|r| r.key.clone()),
                top_site_bytes: top.map(|r| r.bytes),
                top_category: category.map(|c| c.category),
                outlier: false,
            })
        })
        .collect();
    rows.sort_by(|a, b| a.rank.cmp(&b.rank).then_with(|| a.input.cmp(&b.input)));
    let allocated: Vec<u64> = rows.iter().map(|r| r.allocated_bytes).collect();
    let (lo, hi) = (
        allocated.iter().min().copied().unwrap_or(0),
        allocated.iter().max().copied().unwrap_or(0),
    );
    // The median as the rule is read: of an even count, the mean of the two middles.
    let median = median(allocated).unwrap_or(0.0);
    let off = |r: &RankFill| (r.allocated_bytes as f64 - median).abs();
    for r in &mut rows {
        r.outlier = off(r) > MIN_DEVIATION_BYTES as f64 && off(r) > DEVIATION * median;
    }
    let furthest = rows
        .iter()
        .filter(|r| r.outlier)
        .max_by(|a, b| off(a).total_cmp(&off(b)));
    Ranks {
        imbalance: if lo == 0 { 0.0 } else { ratio(hi, lo) },
        outlier_rank: furthest.and_then(|r| r.rank),
        outlier_input: furthest.map(|r| r.input.clone()),
        rows,
    }
}

/// A time in microseconds as `--at` takes it back (`2.5s`, `300ms`, `120us`).
fn human_us(us: i64) -> String {
    if us >= 1_000_000 {
        format!("{}s", us as f64 / 1e6)
    } else if us >= 1_000 {
        format!("{}ms", us as f64 / 1e3)
    } else {
        format!("{us}us")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_told_apart_as_the_site_rule_says() {
        let f = |p: &str| frame_flags(p, "f");
        assert_eq!(
            f("/venv/lib/python3.12/site-packages/torch/nn/functional.py") & (PY | TORCH | PACKAGE),
            PY | TORCH | PACKAGE
        );
        assert_eq!(f("/usr/lib/python3.11/threading.py") & STDLIB, STDLIB);
        assert_eq!(f("/usr/lib64/python3/runpy.py") & STDLIB, STDLIB);
        assert_eq!(
            f("/usr/lib/python3.11/site-packages/einops/einops.py") & (STDLIB | PACKAGE),
            PACKAGE
        );
        assert_eq!(f("C:\\Python311\\Lib\\threading.py") & STDLIB, STDLIB);
        assert_eq!(
            f("D:\\x\\.venv\\Lib\\site-packages\\einops\\_backends.py") & (STDLIB | PACKAGE),
            PACKAGE
        );
        assert_eq!(f("/home/me/lib/pythonic/model.py") & STDLIB, 0);
        assert_eq!(f("??") & PY, 0);
        assert_eq!(f("RegisterCUDA_0.cpp") & PY, 0);
        assert_eq!(
            short_path("D:\\x\\.venv\\Lib\\site-packages\\einops\\_backends.py"),
            "einops/_backends.py"
        );
        assert_eq!(short_path("/home/u/proj/model.py"), "model.py");
    }

    #[test]
    fn categories_follow_their_rules_in_order() {
        let c = |path: &str, name: &str| class_of(frame_flags(path, name));
        let sp = "/v/lib/python3.10/site-packages/";
        assert_eq!(
            c(&format!("{sp}torch/optim/adamw.py"), "_single_tensor_adamw"),
            Class::Optimizer
        );
        assert_eq!(c("/home/u/my_optim.py", "step"), Class::Optimizer);
        assert_eq!(
            c(&format!("{sp}torch/_tensor.py"), "backward"),
            Class::Backward
        );
        assert_eq!(
            c(
                "??",
                "torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)"
            ),
            Class::Backward
        );
        assert_eq!(
            frame_flags("??", "torch::autograd::AccumulateGrad::apply") & ACCUMULATE,
            ACCUMULATE
        );
        assert_eq!(
            c(&format!("{sp}torch/nn/modules/module.py"), "_apply"),
            Class::Parameters
        );
        assert_eq!(c("/home/u/train.py", "load_state_dict"), Class::Parameters);
        assert_eq!(
            c(&format!("{sp}torch/nn/modules/module.py"), "_call_impl"),
            Class::Forward
        );
        assert_eq!(c("/home/u/model.py", "forward"), Class::Forward);
        assert_eq!(c("/home/u/model.py", "to"), Class::Unknown);
        // The first rule that matches wins: an optimizer step inside a forward frame is the optimizer's.
        assert_eq!(
            class_of(
                frame_flags(&format!("{sp}torch/optim/sgd.py"), "step")
                    | frame_flags("/m.py", "forward")
            ),
            Class::Optimizer
        );
        assert_eq!(category(Class::Backward, false, true), Category::Gradients);
        assert_eq!(
            category(Class::Backward, false, false),
            Category::BackwardTemporaries
        );
        assert_eq!(category(Class::Backward, true, false), Category::Gradients);
        assert_eq!(
            category(Class::Optimizer, false, true),
            Category::OptimizerState
        );
        assert_eq!(
            category(Class::Optimizer, false, false),
            Category::OptimizerTemporaries
        );
    }

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_its_middles() {
        // Ranks at 8, 10, 12 and 12 GiB: the median is 11 GiB, so the rank at
        // 10 GiB is 9 % off it and no outlier (the upper middle, 12 GiB, made it one).
        let gib = |v: u64| v << 30;
        let m = median(vec![gib(12), gib(8), gib(12), gib(10)]).unwrap();
        assert_eq!(m, gib(11) as f64);
        assert!((gib(10) as f64 - m).abs() < 0.10 * m);
        assert_eq!(median(vec![3, 1, 2]), Some(2.0));
        assert_eq!(median(Vec::new()), None);
    }

    #[test]
    fn ranks_are_read_from_file_names() {
        assert_eq!(rank_in_name("out/rank0.pickle"), Some(0));
        assert_eq!(rank_in_name("snapshot_rank_3_step9.pickle"), Some(3));
        assert_eq!(rank_in_name("C:\\runs\\Rank-12.pkl"), Some(12));
        assert_eq!(rank_in_name("rank.pickle"), None);
        assert_eq!(rank_in_name("frankly.pickle"), None);
        assert_eq!(rank_in_name("ranks/snap.pickle"), None);
    }

    /// The longest rise of a whole series, read every value.
    fn longest_rise(values: &[u64]) -> Option<(usize, usize)> {
        let mut r = Rise::NEW;
        for (j, &v) in values.iter().enumerate() {
            r.observe(j, v);
        }
        r.finish().map(|(a, b, ..)| (a, b))
    }

    #[test]
    fn a_rise_needs_three_values() {
        assert_eq!(longest_rise(&[0, 1]), None);
        assert_eq!(longest_rise(&[0, 1, 2]), Some((0, 2)));
        assert_eq!(longest_rise(&[5, 1, 2, 3, 3, 4, 5, 6, 7]), Some((4, 8)));
        assert_eq!(longest_rise(&[3, 3, 3, 3]), None);
        assert_eq!(longest_rise(&[]), None);
        assert_eq!(longest_rise(&[0, 0, 1, 2, 2, 3, 4, 5]), Some((4, 7)));
        assert_eq!(longest_rise(&[1, 2, 3, 1, 2, 3]), Some((0, 2)));
    }

    /// Observing only the positions whose value changed gives the rise that
    /// reading every value gives (the growth sweep looks only at sites
    /// touched since the last state).
    #[test]
    fn a_rise_read_at_changes_only_is_the_rise_of_the_whole_series() {
        // A small linear congruential generator: many short series of few values.
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = |m: u64| {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (x >> 33) % m
        };
        for _ in 0..5000 {
            let n = next(12) as usize;
            let values: Vec<u64> = (0..n).map(|_| next(4)).collect();
            let mut dense = Rise::NEW;
            let mut sparse = Rise::NEW;
            for (j, &v) in values.iter().enumerate() {
                dense.observe(j, v);
                let before = if j == 0 { 0 } else { values[j - 1] };
                if v != before || next(2) == 0 {
                    sparse.observe(j, v);
                }
            }
            assert_eq!(sparse.finish(), dense.finish(), "{values:?}");
        }
    }

    #[test]
    fn cutting_a_range_keeps_what_lies_outside_it() {
        let mut r = BTreeMap::from([(0u64, 100u64), (200, 50)]);
        cut(&mut r, 20, 30);
        assert_eq!(r, BTreeMap::from([(0, 20), (50, 50), (200, 50)]));
        cut(&mut r, 200, 50);
        assert_eq!(r, BTreeMap::from([(0, 20), (50, 50)]));
        let v: Vec<(u64, u64)> = r.into_iter().collect();
        assert_eq!(range_of(&v, 60, 0), Some(1));
        assert_eq!(range_of(&v, 60, 1), Some(1));
        assert_eq!(range_of(&v, 30, 5), None);
    }
}
