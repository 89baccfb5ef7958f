//! What feeding the trace builds, entry by entry, without reading the
//! snapshot ([`Lives`]): the lives and their addresses, the segment
//! entries, the OOM, the running total of allocated bytes and its peak. So
//! it can be built on a thread of its own, even while the pickle is still
//! being decoded ([`super::tapped`]); what needs the snapshot (the stacks
//! classified, the block sizes under the recorded settings) comes at
//! [`Attributor::settle`](super::Attributor::settle).

use super::frames::Class;
use super::{
    Ask, At, Attributor, Life, LiveMap, NEVER, PRE, SITE_NO_STACK, SITE_PRE_TRACE, SPECIAL_SITES,
    SiteKey, StackInfo, index32, push,
};
use crate::conf::Settings;
use crate::evidence::fills::Category;
use crate::snapshot::model::{Action, Frames, Snapshot, TraceEntry};
use rustc_hash::FxHashMap;

/// A trace's lives as its entries are fed ([`Lives::entry`]). A life's
/// `stack` holds its frames list's arena id ([`Frames`]) and its `block`
/// nothing until [`Attributor::settle`](super::Attributor::settle) gives
/// them their stack and block size.
pub(crate) struct Lives {
    /// The moment asked for by time, found as entries come.
    at: Option<At>,
    /// Traced allocations, in `alloc` order.
    pub(super) lives: Vec<Life>,
    /// Allocations live before the trace.
    pub(super) pre: Vec<Life>,
    /// Address → index in `lives` of the allocation live there
    /// (its size beside it: a free then reads no `Life`, a cache miss on a long trace).
    pub(super) live: FxHashMap<u64, (u32, u64)>,
    /// Σ alloc sizes − Σ freed sizes so far; its highest value and entry.
    running: i128,
    best: i128,
    /// The entry after which allocated memory peaked; -1 before the first
    /// (a trace that begins by freeing memory allocated before it).
    pub(super) peak: Option<i64>,
    /// The last `oom` entry: index, request, device free; and how many.
    pub(super) oom: Option<(usize, u64, u64)>,
    pub(super) ooms: u64,
    /// Segment entries: index, action, addr, size.
    pub(super) segment_events: Vec<(u32, Action, u64, u64)>,
    /// Indices into `lives` in the order they died: entries come in order,
    /// so this is `lives` sorted by `died` without a sort.
    pub(super) deaths: Vec<u32>,
    pub(super) entries: usize,
    pub(super) at_time: Option<usize>,
    pub(super) first_time: Option<i64>,
    pub(super) last_time: i64,
    pub(super) out_of_order: u64,
    pub(super) replaced: u64,
    /// Memory refused while growing a table.
    pub(super) refused: bool,
    /// The trace records allocations (known once it ends): without it
    /// nothing is "before the trace".
    pub(super) traced: bool,
    /// Only the allocated peak is wanted ([`Attributor::peak_only`]): the
    /// live sizes by address then, in place of `live`.
    pub(super) peak_only: Option<LiveMap>,
    /// The times recorded in the entries a moment can be after, so that a
    /// moment reads no entry again.
    times: Times,
}

/// See [`Lives::time_of`].
#[derive(Default)]
struct Times {
    peak: i64,
    oom: i64,
    at_time: i64,
    event: i64,
    last: i64,
}

impl Lives {
    /// For a trace of about `entries` entries (room is reserved for them;
    /// more only costs the tables' growing).
    pub(crate) fn new(entries: usize, at: Option<At>) -> Self {
        Self::with(entries, at, false)
    }

    fn with(n: usize, at: Option<At>, peak_only: bool) -> Self {
        // Room for the allocs of the trace (at most half its entries; untouched
        // capacity costs no memory), so the tables are not copied as they grow.
        let mut lives = Vec::new();
        let mut live = FxHashMap::default();
        // Room for half the entries live at once (a trace whose allocations
        // last to its end), so the map is not rehashed as it grows.
        let peak_only = peak_only.then(|| LiveMap::with_room(n / 2));
        if peak_only.is_none() {
            let _ = lives.try_reserve_exact(n / 2);
            let _ = live.try_reserve(n / 16);
        }
        Lives {
            at,
            lives,
            pre: Vec::new(),
            live,
            running: 0,
            best: 0,
            peak: None,
            oom: None,
            ooms: 0,
            segment_events: Vec::new(),
            deaths: Vec::new(),
            entries: 0,
            at_time: None,
            first_time: None,
            last_time: i64::MIN,
            out_of_order: 0,
            replaced: 0,
            refused: false,
            traced: false,
            peak_only,
            times: Times::default(),
        }
    }

    /// Entry `i` of the trace (entries come in order).
    pub(crate) fn entry(&mut self, i: usize, e: &TraceEntry) {
        if self.peak_only.is_some() {
            return self.peak_entry(i, e);
        }
        self.entries = i + 1;
        self.times.last = e.time_us;
        if self.at == Some(At::Event(i as u64)) {
            self.times.event = e.time_us;
        }
        if e.time_us != 0 {
            if e.time_us < self.last_time {
                self.out_of_order += 1;
            }
            self.last_time = e.time_us;
            let first = *self.first_time.get_or_insert(e.time_us);
            if let Some(At::Time(t)) = self.at
                && e.time_us.saturating_sub(first) <= t
            {
                self.at_time = Some(i);
                self.times.at_time = e.time_us;
            }
        }
        match e.action {
            Action::Alloc => {
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
                    block: 0,
                    born: index32(i),
                    died: NEVER,
                    stack: e.frames.0,
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
                        block: 0,
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
                self.times.oom = e.time_us;
                self.ooms += 1;
            }
            Action::FreeRequested | Action::Snapshot | Action::Annotate | Action::Other => {}
        }
        if self.note_peak(i) {
            self.times.peak = e.time_us;
        }
    }

    /// The time recorded in entry `i`, for the entries a moment can be
    /// after (the peak, the OOM, the last, the one asked for); 0 for others.
    pub(super) fn time_of(&self, i: usize) -> i64 {
        let t = &self.times;
        let is = |k: Option<usize>| k == Some(i);
        if is(self.peak.and_then(|p| usize::try_from(p).ok())) {
            t.peak
        } else if is(self.oom.map(|o| o.0)) {
            t.oom
        } else if is(self.at_time) {
            t.at_time
        } else if self.at == Some(At::Event(i as u64)) {
            t.event
        } else if i + 1 == self.entries {
            t.last
        } else {
            0
        }
    }

    /// After entry `i`: the peak so far, the state before the first entry
    /// (running 0, entry -1) a candidate too.
    /// True when entry `i` is the peak now.
    fn note_peak(&mut self, i: usize) -> bool {
        if self.peak.is_none() && self.running < 0 {
            self.peak = Some(-1);
        } else if self.peak.is_none() || self.running > self.best {
            self.best = self.running;
            self.peak = Some(i as i64);
            return true;
        }
        false
    }

    /// Looks up the addresses of `window`'s allocs and frees in the address
    /// map, changing nothing: on a trace with a million lives the map is
    /// tens of MB, and each lookup a cache miss; made one after another
    /// (independent loads) they overlap, where [`Self::entry`]'s wait on
    /// each other (BENCHMARKS.md, "parse of the generated snapshot").
    pub fn warm(&self, window: &[(u32, TraceEntry)]) {
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
        let _ = self.note_peak(i);
    }

    /// The allocated peak's entry of a [`Attributor::peak_only`] attributor fed
    /// every entry: [`super::Attribution::peak_event_index`] as
    /// [`Attributor::finish`] gives it.
    pub fn peak_event_index(&self) -> Option<u64> {
        self.peak
            .filter(|_| self.traced)
            .and_then(|p| u64::try_from(p).ok())
    }
}

impl<'s, 'a> Attributor<'s, 'a> {
    /// An attribution of `device`; `settings` are the recorded ones (block sizes follow them).
    pub fn new(snap: &'s Snapshot<'a>, device: u32, settings: Settings, ask: Ask) -> Self {
        let fed = Lives::new(snap.trace_len(device), ask.at);
        Self::fed(snap, device, settings, ask, fed)
    }

    /// One that finds only the allocated peak's entry ([`Self::peak_event_index`]),
    /// exactly as [`Self::finish`] gives it, for evidence that shows no
    /// attribution (`parse`): the address map and the running total, without
    /// the lives, stacks, end state and moments that are most of the cost.
    pub fn peak_only(snap: &'s Snapshot<'a>, device: u32) -> Self {
        let fed = Lives::with(snap.trace_len(device), None, true);
        Self::fed(snap, device, Settings::default(), Ask::default(), fed)
    }

    /// The attribution of `device` whose trace `fed` was fed.
    pub(crate) fn fed(
        snap: &'s Snapshot<'a>,
        device: u32,
        settings: Settings,
        ask: Ask,
        fed: Lives,
    ) -> Self {
        let special = SiteKey {
            filename: "",
            line: 0,
            name: "",
        };
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
            fed,
            settled: false,
            end_notes: Vec::new(),
        }
    }

    /// Entry `i` of the trace (entries come in order).
    pub fn entry(&mut self, i: usize, e: &TraceEntry) {
        self.fed.entry(i, e);
    }

    /// The allocated peak's entry of one made [`Self::peak_only`] and fed every entry.
    pub fn peak_event_index(&self) -> Option<u64> {
        self.fed.peak_event_index()
    }
}
