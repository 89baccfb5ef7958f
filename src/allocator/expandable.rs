//! Expandable segments (`ExpandableSegment` and the allocator's
//! `find_expandable_block` / `map_block` / `unmap_block` /
//! `try_allocate_expandable_block`): one virtual reservation per (pool, stream)
//! grown page by page. Spec: allocator.md §5.

use super::block::{Block, BlockId, NIL};
use super::events::TraceAction;
use super::native::{AllocParams, CachingAllocator};
use super::sizes::expandable_page_size;
use crate::device::Device;

/// `ExpandableSegment`: a reservation of `pages × page` bytes of address space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpandableSegment {
    pub base: u64,
    pub page: u64,
    pub pages: u64,
    pub stream: u64,
}

impl ExpandableSegment {
    pub fn size(&self) -> u64 {
        self.page * self.pages
    }
    /// `segmentLeft`: the page holding `addr`.
    fn left(&self, addr: u64) -> u64 {
        (addr - self.base) / self.page
    }
    /// `segmentRight`: the first page boundary at or after `addr`.
    fn right(&self, addr: u64) -> u64 {
        (addr - self.base).div_ceil(self.page)
    }
}

impl<D: Device> CachingAllocator<D> {
    fn segment_of(&self, id: BlockId) -> Option<ExpandableSegment> {
        let index = self.arena.get(id).expandable;
        self.expandable_segments
            .get(index as usize)
            .copied()
            .flatten()
    }

    /// Free, event-free and not shared with other streams (mapped or not).
    fn allocatable(&self, id: BlockId) -> bool {
        if id == NIL {
            return false;
        }
        let b = self.arena.get(id);
        !b.allocated && b.event_count == 0 && !b.has_stream_uses
    }

    /// `ExpandableSegment::ExpandableSegment`: `max_handles_` pages of `page`
    /// bytes, 9/8 of the card; a card too large for that (an unbounded
    /// simulated one) gets 2^62 bytes, so the reservation fits a 64-bit address space.
    pub(super) fn reservation_pages(&self, page: u64) -> u64 {
        let total = self.device.total_memory();
        let Some(most) = (1u64 << 62).checked_div(page) else {
            return 0;
        };
        total.saturating_add(total / 8).div_ceil(page).min(most)
    }

    /// The search of `find_expandable_block` over the existing segments: the
    /// lowest-address unmapped range of `p`'s stream (or the free block just
    /// before it) followed by `p.size` bytes of room; `None` where a new segment
    /// would be reserved.
    pub(super) fn expandable_candidate(&self, p: &AllocParams) -> Option<BlockId> {
        let pool = self.pool(p.small);
        for (&(stream, _), &unmapped) in pool.unmapped.range((p.stream, 0)..) {
            if stream != p.stream {
                break;
            }
            let prev = self.arena.get(unmapped).prev;
            let candidate = if self.allocatable(prev) {
                prev
            } else {
                unmapped
            };
            // has_available_address_space
            let mut bytes = 0u64;
            let mut b = candidate;
            while bytes < p.size && self.allocatable(b) {
                bytes += self.arena.get(b).size;
                b = self.arena.get(b).next;
            }
            if bytes >= p.size {
                return Some(candidate);
            }
        }
        None
    }

    /// `find_expandable_block`: the lowest-address unmapped range of this stream
    /// (or the free block just before it) with `size` bytes of room, else a new
    /// segment reserving 9/8 of the card.
    fn find_expandable_block(&mut self, p: &AllocParams) -> Option<BlockId> {
        if let Some(candidate) = self.expandable_candidate(p) {
            return Some(candidate);
        }
        let page = expandable_page_size(p.small, &self.settings);
        let pages = self.reservation_pages(page);
        if pages == 0 {
            // A card without memory: nothing could ever be mapped.
            return None;
        }
        let segment = ExpandableSegment {
            base: 0,
            page,
            pages,
            stream: p.stream,
        };
        let base = self.device.reserve_address(segment.size()).ok()?;
        let segment = ExpandableSegment { base, ..segment };
        let index = self.expandable_segments.len() as u32;
        self.expandable_segments.push(Some(segment));
        let mut block = Block::new(base, segment.size(), p.stream, p.small);
        block.mapped = false;
        block.expandable = index;
        let id = self.arena.insert(block);
        self.pool_mut(p.small).insert_unmapped(&block, id);
        Some(id)
    }

    /// `map_block`: map whole pages covering the first `size` bytes of the
    /// unmapped block `to_map` and merge them with free mapped neighbours.
    fn map_block(&mut self, to_map: BlockId, size: u64) -> bool {
        let Some(segment) = self.segment_of(to_map) else {
            return false;
        };
        let b = *self.arena.get(to_map);
        let begin = segment.left(b.addr);
        let end = segment.right(b.addr + size);
        if begin == end {
            return false;
        }
        let mapped_addr = segment.base + begin * segment.page;
        let mapped_size = (end - begin) * segment.page;
        if !self.may_hold(mapped_size) || self.device.map(mapped_addr, mapped_size).is_err() {
            return false;
        }
        self.pool_mut(b.small).erase_unmapped(&b);
        self.arena.get_mut(to_map).mapped = true;
        if mapped_size < b.size {
            // to_map -> remaining (still unmapped) -> to_map.next
            let remaining = b.size - mapped_size;
            self.splice_block(&b, b.addr + mapped_size, remaining, false, to_map, b.next);
            self.arena.get_mut(to_map).size = mapped_size;
        }
        let prev = self.arena.get(to_map).prev;
        self.try_merge_blocks(to_map, prev);
        let next = self.arena.get(to_map).next;
        self.try_merge_blocks(to_map, next);
        self.insert_into_pool(to_map);
        self.total_allocated_memory += mapped_size;
        self.stats.reserved_bytes.increase(b.small, mapped_size);
        self.stats.num_device_alloc += 1;
        self.record(TraceAction::SegmentMap, mapped_addr, mapped_size, b.stream);
        true
    }

    /// `try_allocate_expandable_block`: map enough of a candidate range for
    /// `size` bytes and take the resulting free block out of the pool.
    pub(super) fn try_allocate_expandable_block(&mut self, p: &AllocParams) -> Option<BlockId> {
        let mut candidate = self.find_expandable_block(p)?;
        let c = *self.arena.get(candidate);
        if !c.mapped && !self.map_block(candidate, c.size.min(p.size)) {
            return None;
        }
        while self.arena.get(candidate).size < p.size {
            // invariant: free -> unmapped -> *
            let remaining = p.size - self.arena.get(candidate).size;
            let next = self.arena.get(candidate).next;
            if next == NIL {
                return None;
            }
            let next_size = self.arena.get(next).size;
            if !self.map_block(next, remaining.min(next_size)) {
                return None;
            }
            candidate = next;
        }
        let b = *self.arena.get(candidate);
        self.pool_mut(b.small).erase_block(&b);
        Some(candidate)
    }

    /// `unmap_block`: unmap the whole pages inside the free block `id`; returns
    /// the (possibly merged) unmapped block, or `id` when no whole page was free.
    pub(super) fn unmap_block(&mut self, id: BlockId) -> BlockId {
        let Some(segment) = self.segment_of(id) else {
            return id;
        };
        let b = *self.arena.get(id);
        let begin = segment.right(b.addr);
        let end = segment.left(b.addr + b.size);
        if begin >= end {
            return id;
        }
        let unmapped_addr = segment.base + begin * segment.page;
        let unmapped_size = (end - begin) * segment.page;
        // unmapHandles synchronizes the segment's stream first.
        self.device.synchronize();
        let _ = self.device.unmap(unmapped_addr, unmapped_size);
        self.pool_mut(b.small).erase_block(&b);
        let before = unmapped_addr - b.addr;
        if before > 0 {
            // prev -> before_free -> block
            self.splice_block(&b, b.addr, before, true, b.prev, id);
        }
        let after = b.size - before - unmapped_size;
        if after > 0 {
            // block -> after_free -> next
            let addr = unmapped_addr + unmapped_size;
            self.splice_block(&b, addr, after, true, id, b.next);
        }
        let m = self.arena.get_mut(id);
        m.addr = unmapped_addr;
        m.size = unmapped_size;
        m.mapped = false;
        let prev = m.prev;
        self.try_merge_blocks(id, prev);
        let next = self.arena.get(id).next;
        self.try_merge_blocks(id, next);
        let merged = *self.arena.get(id);
        self.pool_mut(b.small).insert_unmapped(&merged, id);
        self.total_allocated_memory -= unmapped_size;
        self.stats.reserved_bytes.decrease(b.small, unmapped_size);
        self.stats.num_device_free += 1;
        self.record(
            TraceAction::SegmentUnmap,
            unmapped_addr,
            unmapped_size,
            b.stream,
        );
        id
    }

    /// A new free block `[addr, addr + size)` of `like`'s segment spliced between
    /// `prev` and `next` (`Block::splice`) and put in the free or unmapped set.
    fn splice_block(
        &mut self,
        like: &Block,
        addr: u64,
        size: u64,
        mapped: bool,
        prev: BlockId,
        next: BlockId,
    ) -> BlockId {
        let mut block = Block::new(addr, size, like.stream, like.small);
        block.expandable = like.expandable;
        block.mapped = mapped;
        block.prev = prev;
        block.next = next;
        let id = self.arena.insert(block);
        if prev != NIL {
            self.arena.get_mut(prev).next = id;
        }
        if next != NIL {
            self.arena.get_mut(next).prev = id;
        }
        if mapped {
            self.insert_into_pool(id);
        } else {
            self.pool_mut(like.small).insert_unmapped(&block, id);
        }
        id
    }

    /// `release_expandable_segment`: nothing is mapped any more; give back the
    /// address space.
    pub(super) fn release_expandable_segment(&mut self, id: BlockId) {
        let b = *self.arena.get(id);
        let index = b.expandable as usize;
        if let Some(segment) = self
            .expandable_segments
            .get_mut(index)
            .and_then(Option::take)
        {
            let _ = self.device.release_address(segment.base, segment.size());
        }
        self.pool_mut(b.small).erase_unmapped(&b);
        self.arena.remove(id);
    }
}
