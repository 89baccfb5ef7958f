//! The live set at one moment: grouped (by site, category, size class,
//! stack or segment), ranked, the top rows formatted and the rest summed;
//! the reserved ranges then, and the free reserved memory in them.

use super::frames::{PY, SKIP, short_path};
use super::{
    Attributor, CategoryRow, FreeReserved, Grouping, Life, Moment, MomentKind, NEVER,
    NO_PYTHON_ROW, NO_STACK_ROW, PRE_TRACE_ROW, PreTrace, Rest, Row, SITE_NO_PYTHON, SITE_NO_STACK,
    SITE_PRE_TRACE, SPECIAL_SITES, index32, ratio,
};
use crate::evidence::fills::{Category, CategoryPart};
use crate::snapshot::model::{Action, Frames, Segment};
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;

impl<'s, 'a> Attributor<'s, 'a> {
    /// The live set after entry `s`, grouped; `index` is the entry named.
    pub(super) fn moment(
        &self,
        by: Grouping,
        kind: MomentKind,
        s: i64,
        index: Option<usize>,
    ) -> Moment {
        let ranges: Vec<(u64, u64)> = self.reserved_at(s).into_iter().collect();
        // Groups: by site, category or size class a dense table (their keys
        // are small); by stack or segment a map.
        let dense = match by {
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
                c.add(l, self.fed.traced);
            }
            if l.pre_trace() && self.fed.traced {
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
            let key = match by {
                Grouping::Site | Grouping::User => self.site_of(by, l),
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
                Some(acc) => acc.add(l, self.fed.traced),
                None => groups.entry(key).or_default().add(l, self.fed.traced),
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
                let tie = match by {
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
        let is_pre =
            |key: u32| matches!(by, Grouping::Site | Grouping::User) && key == SITE_PRE_TRACE;
        let top = self.ask.top.max(1);
        let mut kept = Vec::with_capacity(top.min(ranked.len()) + 1);
        let mut rest = Rest::default();
        let mut listed = 0;
        for (key, acc, _) in ranked {
            if is_pre(key) || listed < top {
                listed += usize::from(!is_pre(key));
                kept.push(self.row(by, key, acc, (&stack_of_key, &ranges), share(acc.bytes)));
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
        let time_us = index.map(|i| self.fed.time_of(i)).filter(|&t| t != 0);
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
            by,
            rows: kept,
            rest: (rest.groups > 0).then_some(rest),
            pre_trace: pre,
            free_reserved: free,
            categories,
        }
    }

    /// The site id a life is grouped under (site or user grouping).
    fn site_of(&self, by: Grouping, l: &Life) -> u32 {
        match by {
            Grouping::User => self
                .stacks
                .get(l.stack as usize)
                .map_or(SITE_NO_STACK, |s| s.user),
            _ => self.site(l),
        }
    }

    /// A life's site under the site grouping (growth is read by it).
    pub(super) fn site(&self, l: &Life) -> u32 {
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
        by: Grouping,
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
        match by {
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

    pub(super) fn site_text(&self, site: u32) -> String {
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
        for &(i, action, addr, size) in self.fed.segment_events.iter().rev() {
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
}

/// Per-group sums.
#[derive(Default, Clone, Copy)]
pub(super) struct Acc {
    bytes: u64,
    block: u64,
    pub(super) count: u64,
    pre: u64,
    /// Requested bytes and allocations per category, in [`Category::ALL`] order.
    by_category: [(u64, u64); 7],
}

impl Acc {
    /// Adds a live allocation (`traced`: the trace records allocations, so
    /// a pre-trace one is told apart).
    pub(super) fn add(&mut self, l: &Life, traced: bool) {
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
    pub(super) fn categories(&self) -> (Category, Vec<CategoryPart>) {
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

#[cfg(test)]
mod tests {
    use super::*;

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
