//! `free`: by address or of a held block, the block merged with its free neighbours
//! and returned to its pool.

use super::{CachingAllocator, PointerError};
use crate::allocator::block::{Block, BlockId, NIL};
use crate::allocator::events::TraceAction;
use crate::device::Device;

impl<D: Device> CachingAllocator<D> {
    /// `free`: the allocation ends now; the block returns to its pool now, or
    /// once the events of the streams it was used on complete.
    pub fn free(&mut self, addr: u64) -> Result<(), PointerError> {
        if addr == 0 {
            return Ok(());
        }
        let id = self
            .allocated_blocks
            .remove(&addr)
            .ok_or(PointerError::InvalidDevicePointer(addr))?;
        self.device_free(id);
        Ok(())
    }

    /// [`Self::free`] of a block from [`Self::malloc_block`] ([`NIL`] does
    /// nothing); a block that is not a held allocation is an error.
    pub fn free_held(&mut self, block: BlockId) -> Result<(), PointerError> {
        if block == NIL {
            return Ok(());
        }
        self.held(block)?;
        self.device_free(block);
        Ok(())
    }

    /// The address of `block` while the caller holds it ([`Self::malloc_block`]).
    pub fn block_addr(&self, block: BlockId) -> Option<u64> {
        self.held(block).ok().map(|b| b.addr)
    }

    /// The allocation `block`, if [`Self::malloc_block`] handed it out and it
    /// is not freed yet.
    pub(super) fn held(&self, block: BlockId) -> Result<&Block, PointerError> {
        match self.arena.try_get(block) {
            Some(b) if b.live && b.allocated && b.held => Ok(b),
            _ => Err(PointerError::NotHeld(block)),
        }
    }

    /// `DeviceCachingAllocator::free(Block*)`.
    fn device_free(&mut self, id: BlockId) {
        let b = self.arena.get_mut(id);
        b.allocated = false;
        b.held = false;
        let (addr, small, size, requested, stream, uses) = (
            b.addr,
            b.small,
            b.size,
            b.requested_size,
            b.stream,
            b.has_stream_uses,
        );
        self.stats.allocation.decrease(small, 1);
        self.stats.allocated_bytes.decrease(small, size);
        self.record(TraceAction::FreeRequested, addr, requested, stream);
        if size >= self.settings.max_split_size {
            self.stats.oversize_allocations.decrease(1);
        }
        if uses {
            self.insert_events(id);
        } else {
            self.free_block(id);
        }
    }

    /// `free_block`: merge with free neighbours and return to the pool.
    pub(in crate::allocator) fn free_block(&mut self, id: BlockId) {
        let b = *self.arena.get(id);
        self.record(
            TraceAction::FreeCompleted,
            b.addr,
            b.requested_size,
            b.stream,
        );
        let before = self.try_merge_blocks(id, b.prev);
        let after = self.try_merge_blocks(id, b.next);
        // The merged block from the absorbed ones, not read back (see
        // `insert_into_blocks_as`).
        let addr = before.map_or(b.addr, |p| p.addr);
        let absorbed = before.map_or(0, |p| p.size) + after.map_or(0, |n| n.size);
        let size = b.size + absorbed;
        let pool = if b.small {
            &mut self.small_blocks
        } else {
            &mut self.large_blocks
        };
        pool.insert_into_blocks_as(&mut self.arena, id, (b.stream, size, addr));
        let mut net_blocks = -(i64::from(before.is_some()) + i64::from(after.is_some()));
        let mut net_bytes = -(absorbed as i64);
        let is_split =
            before.map_or(b.prev, |p| p.prev) != NIL || after.map_or(b.next, |n| n.next) != NIL;
        if is_split {
            net_blocks += 1;
            net_bytes += size as i64;
        }
        let s = &mut self.stats;
        if !b.is_expandable() {
            // inactive_split counts free blocks that cannot be released; fully
            // free pages of expandable segments always can, so they are excluded.
            apply_net(&mut s.inactive_split, b.small, net_blocks);
            apply_net(&mut s.inactive_split_bytes, b.small, net_bytes);
        }
        s.active.decrease(b.small, 1);
        s.active_bytes.decrease(b.small, b.size);
        s.requested_bytes.decrease(b.small, b.requested_size);
    }

    /// `try_merge_blocks`: absorb `src` into `dst` if it is free, has no pending
    /// events and the same mapped state; returns the absorbed block as it was.
    pub(in crate::allocator) fn try_merge_blocks(
        &mut self,
        dst: BlockId,
        src: BlockId,
    ) -> Option<Block> {
        if src == NIL {
            return None;
        }
        let s = *self.arena.get(src);
        let d = self.arena.get(dst);
        if s.allocated || s.event_count > 0 || s.has_stream_uses || d.mapped != s.mapped {
            return None;
        }
        if d.prev == src {
            let d = self.arena.get_mut(dst);
            d.addr = s.addr;
            d.prev = s.prev;
            d.size += s.size;
            if s.prev != NIL {
                self.arena.get_mut(s.prev).next = dst;
            }
        } else {
            let d = self.arena.get_mut(dst);
            d.next = s.next;
            d.size += s.size;
            if s.next != NIL {
                self.arena.get_mut(s.next).prev = dst;
            }
        }
        let pool = self.pool_mut(s.small);
        if s.mapped {
            pool.erase_block(&s);
        } else {
            pool.erase_unmapped(&s);
        }
        self.arena.remove(src);
        Some(s)
    }
}

fn apply_net(array: &mut crate::allocator::stats::StatArray, small: bool, net: i64) {
    if net > 0 {
        array.increase(small, net as u64);
    } else if net < 0 {
        array.decrease(small, net.unsigned_abs());
    }
}
