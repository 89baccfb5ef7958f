//! The attributor made, and fed the trace entry by entry: the lives and
//! their addresses, the segment entries, the OOM, the running total of
//! allocated bytes and its peak.

use super::frames::Class;
use super::{
    Ask, At, Attributor, Life, LiveMap, NEVER, PRE, SITE_NO_STACK, SITE_PRE_TRACE, SPECIAL_SITES,
    SiteKey, StackInfo, index32, push,
};
use crate::allocator::sizes::round_size;
use crate::conf::Settings;
use crate::evidence::fills::Category;
use crate::snapshot::model::{Action, Frames, Snapshot, TraceEntry};
use rustc_hash::FxHashMap;

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
    /// every entry: [`super::Attribution::peak_event_index`] as [`Self::finish`]
    /// gives it.
    pub fn peak_event_index(&self) -> Option<u64> {
        self.peak
            .filter(|_| self.traced)
            .and_then(|p| u64::try_from(p).ok())
    }
}
