//! Seeding: a segment laid out as a recording says it was (live blocks at their
//! offsets, free blocks between them), so a replay can continue from the state
//! a snapshot's trace started in. PyTorch has no such entry point; the state
//! is what `malloc`/`free` would have left, with the stats counted as if the
//! blocks had been allocated (`alloc_found_block`) and split (`free_block`).
//! Seeding is not driver work of the replay: `num_device_alloc` is not counted.

use super::block::{Block, BlockId, NIL};
use super::expandable::ExpandableSegment;
use super::native::CachingAllocator;
use super::sizes::expandable_page_size;
use crate::device::{Device, DeviceError};

/// One block of a seeded segment, in address order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeedBlock {
    pub size: u64,
    /// For allocated blocks: the unrounded request.
    pub requested_size: u64,
    pub allocated: bool,
}

/// One mapped range of a seeded expandable segment: `offset` bytes from the
/// reservation's base, tiled by `blocks`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeedRange {
    pub offset: u64,
    pub blocks: Vec<SeedBlock>,
}

impl SeedRange {
    /// The bytes of its blocks (saturating: sizes are untrusted).
    pub fn size(&self) -> u64 {
        self.blocks
            .iter()
            .fold(0u64, |sum, b| sum.saturating_add(b.size))
    }
}

impl<D: Device> CachingAllocator<D> {
    /// Adds a cudaMalloc'd segment (the device picks the address, e.g. the
    /// next recorded one) tiled by `blocks`; returns the segment's address.
    /// Adjacent free blocks are merged, as `free_block` would have.
    pub fn seed_segment(
        &mut self,
        stream: u64,
        small: bool,
        blocks: &[SeedBlock],
    ) -> Result<u64, DeviceError> {
        // Recorded sizes are untrusted: the segment must fit the stats' int64.
        let total = blocks
            .iter()
            .try_fold(0u64, |sum, b| sum.checked_add(b.size))
            .filter(|&total| self.may_hold(total))
            .ok_or(DeviceError::OutOfMemory)?;
        if total == 0 {
            return Err(DeviceError::Other("a seeded segment needs blocks".into()));
        }
        let base = self.device.malloc(total)?;
        // alloc_block's cudaMalloc path.
        self.total_allocated_memory += total;
        self.stats.segment.increase(small, 1);
        self.stats.reserved_bytes.increase(small, total);
        if total >= self.settings.max_split_size {
            self.stats.oversize_segments.increase(1);
        }
        self.seed_blocks(base, stream, small, NIL, blocks, NIL);
        Ok(base)
    }

    /// Adds an expandable segment: a reservation (the device picks its base,
    /// e.g. the next recorded address) of 9/8 of the card, or less where
    /// `limit` bytes reach the next reservation, but at least up to the last
    /// range; `ranges` (page-aligned, in address order) are mapped and tiled
    /// by their blocks, the rest is unmapped. Returns the reservation's base.
    pub fn seed_expandable_segment(
        &mut self,
        stream: u64,
        small: bool,
        ranges: &[SeedRange],
        limit: Option<u64>,
    ) -> Result<u64, DeviceError> {
        let page = expandable_page_size(small, &self.settings);
        let invalid = |why: &str| {
            Err(DeviceError::Other(format!(
                "a seeded expandable segment {why}"
            )))
        };
        if ranges.is_empty() || page == 0 {
            return invalid("needs mapped ranges");
        }
        let mut extent = 0u64;
        let mut mapped = 0u64;
        for (i, r) in ranges.iter().enumerate() {
            let size = r.size();
            // Touching ranges would be one range (its free blocks merged).
            let after = i > 0 && r.offset <= extent;
            if size == 0 || after || !r.offset.is_multiple_of(page) || !size.is_multiple_of(page) {
                return invalid("needs whole pages in separate ranges, in address order");
            }
            extent = match r.offset.checked_add(size) {
                Some(end) => end,
                None => return invalid("ends past the address space"),
            };
            mapped = mapped.saturating_add(size);
        }
        // Recorded sizes are untrusted: the mapped bytes must fit the stats' int64.
        if !self.may_hold(mapped) {
            return Err(DeviceError::OutOfMemory);
        }
        let limit_pages = limit.map_or(u64::MAX, |l| l / page);
        let pages = self
            .reservation_pages(page)
            .min(limit_pages)
            .max(extent / page);
        let segment = ExpandableSegment {
            base: 0,
            page,
            pages,
            stream,
        };
        // ExpandableSegment::ExpandableSegment (cuMemAddressReserve), then map for each range.
        let base = self.device.reserve_address(segment.size())?;
        for (i, r) in ranges.iter().enumerate() {
            if let Err(e) = self.device.map(base + r.offset, r.size()) {
                for done in &ranges[..i] {
                    let _ = self.device.unmap(base + done.offset, done.size());
                }
                let _ = self.device.release_address(base, segment.size());
                return Err(e);
            }
        }
        let index = self.expandable_segments.len() as u32;
        self.expandable_segments
            .push(Some(ExpandableSegment { base, ..segment }));
        let mut prev = NIL;
        let mut cursor = 0u64;
        for r in ranges {
            if r.offset > cursor {
                prev = self.seed_unmapped(
                    base + cursor,
                    r.offset - cursor,
                    stream,
                    small,
                    index,
                    prev,
                );
            }
            prev = self.seed_blocks(base + r.offset, stream, small, index, &r.blocks, prev);
            cursor = r.offset + r.size();
        }
        if cursor < segment.size() {
            self.seed_unmapped(
                base + cursor,
                segment.size() - cursor,
                stream,
                small,
                index,
                prev,
            );
        }
        // map_block: reserved_bytes counts mapped bytes; no segment count.
        self.total_allocated_memory += mapped;
        self.stats.reserved_bytes.increase(small, mapped);
        Ok(base)
    }

    /// An unmapped range of expandable segment `index` after `prev`, in the
    /// pool's unmapped set (`map_block`'s `remaining`).
    fn seed_unmapped(
        &mut self,
        addr: u64,
        size: u64,
        stream: u64,
        small: bool,
        index: u32,
        prev: BlockId,
    ) -> BlockId {
        let mut block = Block::new(addr, size, stream, small);
        block.mapped = false;
        block.expandable = index;
        let id = self.link(block, prev);
        self.pool_mut(small).insert_unmapped(&block, id);
        id
    }

    /// Inserts `block` after `prev` in the arena's list.
    fn link(&mut self, mut block: Block, prev: BlockId) -> BlockId {
        block.prev = prev;
        let id = self.arena.insert(block);
        if prev != NIL {
            self.arena.get_mut(prev).next = id;
        }
        id
    }

    /// Tiles `[addr, …)` with `blocks` after `prev` (runs of free blocks merged,
    /// as `free_block` would have), counting the live ones as `alloc_found_block`
    /// does and the free ones of a split cudaMalloc'd segment as `inactive_split`
    /// (`free_block` leaves expandable blocks out of it). Returns the last block.
    fn seed_blocks(
        &mut self,
        addr: u64,
        stream: u64,
        small: bool,
        expandable: u32,
        blocks: &[SeedBlock],
        mut prev: BlockId,
    ) -> BlockId {
        let mut layout: Vec<SeedBlock> = Vec::with_capacity(blocks.len());
        for b in blocks.iter().filter(|b| b.size > 0) {
            match layout.last_mut() {
                Some(last) if !last.allocated && !b.allocated => last.size += b.size,
                _ => layout.push(*b),
            }
        }
        let split = layout.len() > 1;
        let mut addr = addr;
        for b in &layout {
            let mut block = Block::new(addr, b.size, stream, small);
            block.allocated = b.allocated;
            block.requested_size = b.requested_size.min(b.size);
            block.expandable = expandable;
            let id = self.link(block, prev);
            prev = id;
            if b.allocated {
                self.allocated_blocks.insert(addr, id);
                let s = &mut self.stats;
                s.allocation.increase(small, 1);
                s.allocated_bytes.increase(small, b.size);
                s.active.increase(small, 1);
                s.active_bytes.increase(small, b.size);
                // A request is never above its block (`round_size`).
                s.requested_bytes
                    .increase(small, b.requested_size.min(b.size));
                if b.size >= self.settings.max_split_size {
                    s.oversize_allocations.increase(1);
                }
            } else {
                self.insert_into_pool(id);
                if split && expandable == NIL {
                    self.stats.inactive_split.increase(small, 1);
                    self.stats.inactive_split_bytes.increase(small, b.size);
                }
            }
            addr += b.size;
        }
        prev
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conf::Settings;
    use crate::device::sim::SimDevice;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_seeded_segment_serves_and_merges_like_a_malloced_one() {
        let dev = SimDevice::new(1 << 40).with_recorded_addresses([0x7000_0000_0000]);
        let mut a = CachingAllocator::new(Settings::default(), dev);
        let live = |size| SeedBlock {
            size,
            requested_size: size - 100,
            allocated: true,
        };
        let free = |size| SeedBlock {
            size,
            requested_size: 0,
            allocated: false,
        };
        let base = a
            .seed_segment(
                0,
                false,
                &[live(4 * MIB), free(6 * MIB), free(2 * MIB), live(8 * MIB)],
            )
            .unwrap();
        assert_eq!(base, 0x7000_0000_0000);
        a.check_invariants().unwrap();
        let seg = &a.segments()[0];
        assert_eq!(seg.total_size, 20 * MIB);
        assert_eq!(seg.blocks.len(), 3, "the two free blocks are one gap");
        assert_eq!(
            a.stats().inactive_split_bytes.all().current,
            (8 * MIB) as i64
        );
        // Best fit lands in the 8 MiB gap, at its start.
        assert_eq!(a.malloc(5 * MIB, 0).unwrap(), base + 4 * MIB);
        // Freeing the seeded blocks merges the whole segment back into one block.
        a.free(base).unwrap();
        a.free(base + 4 * MIB).unwrap();
        a.free(base + 12 * MIB).unwrap();
        a.check_invariants().unwrap();
        assert_eq!(a.segments()[0].blocks.len(), 1);
        assert_eq!(a.stats().allocated_bytes.all().current, 0);
    }

    #[test]
    fn a_seeded_expandable_segment_maps_its_gap_and_unmaps_like_a_grown_one() {
        let dev = SimDevice::new(1 << 30).with_recorded_addresses([0x7000_0000_0000]);
        let settings = Settings {
            expandable_segments: true,
            ..Settings::default()
        };
        let mut a = CachingAllocator::new(settings, dev);
        a.record_history();
        let live = |size| SeedBlock {
            size,
            requested_size: size,
            allocated: true,
        };
        let free = |size| SeedBlock {
            size,
            requested_size: 0,
            allocated: false,
        };
        // Pages of 20 MiB: page 0 and pages 2–3 mapped, page 1 and the tail not.
        let ranges = [
            SeedRange {
                offset: 0,
                blocks: vec![live(4 * MIB), free(16 * MIB)],
            },
            SeedRange {
                offset: 40 * MIB,
                blocks: vec![free(10 * MIB), live(30 * MIB)],
            },
        ];
        let base = a.seed_expandable_segment(0, false, &ranges, None).unwrap();
        assert_eq!(base, 0x7000_0000_0000);
        a.check_invariants().unwrap();
        let s = a.stats();
        assert_eq!(s.reserved_bytes.all().current, (60 * MIB) as i64);
        assert_eq!(s.allocated_bytes.all().current, (34 * MIB) as i64);
        assert_eq!(
            s.segment.all().current,
            0,
            "expandable segments are not counted"
        );
        assert_eq!(s.inactive_split.all().current, 0);
        let segs = a.segments();
        assert_eq!(
            segs.iter()
                .map(|s| (s.address - base, s.total_size, s.is_expandable))
                .collect::<Vec<_>>(),
            [(0, 20 * MIB, true), (40 * MIB, 40 * MIB, true)]
        );
        // The 16 MiB free block plus the unmapped page can hold 30 MiB: the page
        // is mapped and the three pieces merge (find_expandable_block, map_block).
        assert_eq!(a.malloc(30 * MIB, 0).unwrap(), base + 4 * MIB);
        a.check_invariants().unwrap();
        assert_eq!(a.stats().reserved_bytes.all().current, (80 * MIB) as i64);
        assert_eq!(a.segments().len(), 1);
        let trace = a.take_trace();
        assert_eq!(
            (trace[0].action, trace[0].addr, trace[0].size),
            (
                crate::allocator::TraceAction::SegmentMap,
                base + 20 * MIB,
                20 * MIB
            )
        );
        // Everything freed and the cache emptied: nothing mapped, the reservation is gone.
        for addr in [base, base + 4 * MIB, base + 50 * MIB] {
            a.free(addr).unwrap();
        }
        a.empty_cache();
        a.check_invariants().unwrap();
        assert_eq!(a.stats().reserved_bytes.all().current, 0);
        assert!(a.segments().is_empty());
        assert_eq!(
            a.device().counters().maps,
            3,
            "two seeded ranges and one growth"
        );
    }

    #[test]
    fn misaligned_or_oversized_ranges_are_refused() {
        let mut a = CachingAllocator::new(Settings::default(), SimDevice::new(1 << 30));
        let ranges = [SeedRange {
            offset: MIB,
            blocks: vec![SeedBlock {
                size: 20 * MIB,
                requested_size: 0,
                allocated: false,
            }],
        }];
        assert!(a.seed_expandable_segment(0, false, &ranges, None).is_err());
        // Sizes past what the stats' int64 can count, in whole pages.
        let huge = SeedBlock {
            size: (1 << 62) / (20 * MIB) * (20 * MIB),
            requested_size: u64::MAX,
            allocated: true,
        };
        let ranges = [SeedRange {
            offset: 0,
            blocks: vec![huge; 3],
        }];
        assert_eq!(
            a.seed_expandable_segment(0, false, &ranges, None),
            Err(DeviceError::OutOfMemory)
        );
        a.check_invariants().unwrap();
        assert_eq!(a.stats().reserved_bytes.all().current, 0);
    }
}
