//! The expandable segments at the start of a trace: one reservation per stream and pool,
//! its mapped ranges walked back from the end (the parent module's doc has the rules).

use super::start::is_small_pool;
use crate::allocator::sizes::{expandable_page_size, is_small, round_size};
use crate::conf::Settings;
use crate::snapshot::model::{Action, Segment, TraceEntry as TraceRecord};
use std::collections::BTreeMap;

/// Address ranges `[begin, end)`, merged where they touch.
#[derive(Debug, Clone, Default)]
struct Ranges(BTreeMap<u64, u64>);

impl Ranges {
    fn insert(&mut self, mut begin: u64, mut end: u64) {
        if begin >= end {
            return;
        }
        let touching: Vec<(u64, u64)> = self
            .0
            .range(..=end)
            .rev()
            .take_while(|&(_, &e)| e >= begin)
            .map(|(&b, &e)| (b, e))
            .collect();
        for (b, e) in touching {
            self.0.remove(&b);
            begin = begin.min(b);
            end = end.max(e);
        }
        self.0.insert(begin, end);
    }

    fn remove(&mut self, begin: u64, end: u64) {
        let overlapping: Vec<(u64, u64)> = self
            .0
            .range(..end)
            .rev()
            .take_while(|&(_, &e)| e > begin)
            .map(|(&b, &e)| (b, e))
            .collect();
        for (b, e) in overlapping {
            self.0.remove(&b);
            if b < begin {
                self.0.insert(b, begin);
            }
            if e > end {
                self.0.insert(end, e);
            }
        }
    }
}

/// One reservation as the trace started: its base and its mapped ranges
/// (absolute addresses).
pub(super) struct Reservation {
    pub(super) base: u64,
    pub(super) stream: u64,
    pub(super) small: bool,
    pub(super) ranges: Vec<(u64, u64)>,
    pub(super) limit: Option<u64>,
}

/// The expandable segments at the start of the trace, and the (entry index,
/// base) of each reservation the recording made during the trace.
pub(super) struct ExpandableStart {
    pub(super) reservations: Vec<Reservation>,
    pub(super) created: Vec<(usize, u64)>,
}

/// A (stream, pool): its mapped ranges (walked back to the start) and its
/// `segment_map` / `segment_unmap` entries (entry index, address, size, map?).
#[derive(Default)]
struct PoolWalk {
    ranges: Ranges,
    events: Vec<(usize, u64, u64, bool)>,
}

/// Rebuilds the expandable segments at the start of `trace`, one reservation
/// per (stream, pool) that has pages mapped then (see the module doc).
pub(super) fn expandable_start(
    trace: &[TraceRecord],
    segs: &[&Segment],
    recorded: &Settings,
) -> ExpandableStart {
    let expandable = || segs.iter().filter(|s| s.is_expandable == Some(true));
    let mut walks: BTreeMap<(u64, bool), PoolWalk> = BTreeMap::new();
    for s in expandable() {
        let end = s.address.saturating_add(s.total_size);
        walks
            .entry((s.stream, is_small_pool(s)))
            .or_default()
            .ranges
            .insert(s.address, end);
    }
    // Without a request to go by: whole large-pool pages are the large pool's.
    let large_page = expandable_page_size(false, recorded);
    let by_size = |size: u64| !size.is_multiple_of(large_page);
    // `malloc` records its `segment_map`s just before the `alloc` (or `oom`)
    // they were for: that request's pool is theirs.
    let mut pools: Vec<Option<bool>> = vec![None; trace.len()];
    let mut next_pool = None;
    for (e, pool) in trace.iter().zip(pools.iter_mut()).rev() {
        match e.action {
            Action::Alloc => next_pool = Some(is_small(round_size(e.size, recorded))),
            Action::Oom => next_pool = Some(is_small(e.size)),
            Action::SegmentMap => *pool = Some(next_pool.unwrap_or_else(|| by_size(e.size))),
            _ => {}
        }
    }
    // An unmapped range belongs to the nearest range the recording shows on its
    // stream: (stream, address) → small pool?
    let mut known: BTreeMap<(u64, u64), bool> = expandable()
        .map(|s| ((s.stream, s.address), is_small_pool(s)))
        .collect();
    known.extend(
        trace
            .iter()
            .zip(&pools)
            .filter_map(|(e, p)| p.map(|small| ((e.stream, e.addr), small))),
    );
    let nearest = |stream: u64, addr: u64| {
        let below = known.range((stream, 0)..=(stream, addr)).next_back();
        let above = known.range((stream, addr)..=(stream, u64::MAX)).next();
        below
            .into_iter()
            .chain(above)
            .min_by_key(|((_, a), _)| a.abs_diff(addr))
            .map(|(_, &small)| small)
    };
    for (i, (e, pool)) in trace.iter().zip(&pools).enumerate() {
        let small = match e.action {
            Action::SegmentMap => pool.unwrap_or(false),
            Action::SegmentUnmap => nearest(e.stream, e.addr).unwrap_or_else(|| by_size(e.size)),
            _ => continue,
        };
        walks.entry((e.stream, small)).or_default().events.push((
            i,
            e.addr,
            e.size,
            e.action == Action::SegmentMap,
        ));
    }

    let mut out = ExpandableStart {
        reservations: Vec::new(),
        created: Vec::new(),
    };
    for ((stream, small), mut walk) in walks {
        // Backwards from the end: undo each map and unmap.
        for &(_, addr, size, map) in walk.events.iter().rev() {
            let end = addr.saturating_add(size);
            if map {
                walk.ranges.remove(addr, end);
            } else {
                walk.ranges.insert(addr, end);
            }
        }
        let ranges: Vec<(u64, u64)> = walk.ranges.0.into_iter().collect();
        let mut mapped: u64 = ranges.iter().map(|&(b, e)| e - b).sum();
        // Forwards: the base is the lowest address the first reservation shows
        // until nothing of it is mapped (release_expandable_segment); a map
        // with nothing reserved makes a new reservation at its address.
        let mut first = mapped > 0;
        let mut base = ranges.first().map_or(u64::MAX, |r| r.0);
        for &(i, addr, size, map) in &walk.events {
            if first {
                base = base.min(addr);
            }
            if map {
                if mapped == 0 {
                    out.created.push((i, addr));
                }
                mapped = mapped.saturating_add(size);
            } else {
                mapped = mapped.saturating_sub(size);
                first &= mapped > 0;
            }
        }
        if !ranges.is_empty() {
            out.reservations.push(Reservation {
                base,
                stream,
                small,
                ranges,
                limit: None,
            });
        }
    }
    // A reservation ends where the next one the recording shows begins.
    let mut bases: Vec<u64> = out.reservations.iter().map(|r| r.base).collect();
    bases.extend(out.created.iter().map(|&(_, a)| a));
    bases.sort_unstable();
    for r in &mut out.reservations {
        r.limit = bases.iter().find(|&&b| b > r.base).map(|&b| b - r.base);
    }
    out.reservations.sort_by_key(|r| r.base);
    out
}

#[cfg(test)]
mod tests {
    use super::Ranges;

    fn ranges(r: &Ranges) -> Vec<(u64, u64)> {
        r.0.iter().map(|(&b, &e)| (b, e)).collect()
    }

    #[test]
    fn ranges_merge_where_they_touch_and_split_where_cut() {
        let mut r = Ranges::default();
        r.insert(40, 60);
        r.insert(0, 20);
        r.insert(20, 30);
        assert_eq!(ranges(&r), [(0, 30), (40, 60)]);
        r.insert(25, 45);
        assert_eq!(ranges(&r), [(0, 60)]);
        r.remove(10, 20);
        r.remove(50, 70);
        assert_eq!(ranges(&r), [(0, 10), (20, 50)]);
        r.remove(0, 30);
        assert_eq!(ranges(&r), [(30, 50)]);
        r.insert(5, 5);
        assert_eq!(ranges(&r), [(30, 50)]);
    }
}
