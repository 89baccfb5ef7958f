//! The segments as the trace walks them (made on first touch, the peak's state kept
//! copy-on-write), and the memory stranded in them when reserved memory peaked.

use super::{NONE, SEG_CACHE, TraceScan, index32, signed};
use crate::allocator::sizes::{SMALL_BUFFER, round_size};
use crate::snapshot::model::{Segment, TraceEntry};

/// A cudaMalloc'd segment as the trace walks it: made when the trace first
/// touches it (a snapshot may hold hundreds of thousands it never touches).
pub(super) struct Seg {
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

/// A segment of the final snapshot: its start, its index in
/// `Snapshot::segments`, and its [`Seg`] once touched ([`NONE`] before).
#[derive(Clone, Copy)]
pub(super) struct Initial {
    pub(super) start: u64,
    pub(super) snap: u32,
    pub(super) seg: u32,
}

impl<'s, 'a> TraceScan<'s, 'a> {
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
    pub(super) fn seg_live(&mut self, i: usize, addr: u64, requested: u64, sign: i64) {
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

    pub(super) fn segment_alloc(&mut self, i: usize, e: &TraceEntry) {
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
    pub(super) fn segment_free(&mut self, i: usize, addr: u64) -> Option<bool> {
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

    pub(super) fn peak(&mut self) {
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

fn is_small_segment(s: &Segment) -> bool {
    s.segment_type == crate::snapshot::model::PoolKind::Small
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
