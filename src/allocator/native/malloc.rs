//! `malloc` and its slow path: `get_free_block`'s best fit under the oversize rules,
//! `alloc_block`, the split of the block found, and the OOM it ends in.

use super::{AllocParams, CachingAllocator, OutOfMemory};
use crate::allocator::block::{Block, BlockId, Cursor, NIL};
use crate::allocator::events::TraceAction;
use crate::allocator::oom::{MORE_THAN_1EB, OomFigures, oom_message};
use crate::allocator::sizes::{
    MIN_BLOCK_SIZE, ONE_EXA_BYTES, SMALL_SIZE, get_allocation_size, is_small,
    max_non_split_rounding_size, round_size,
};
use crate::device::Device;

impl<D: Device> CachingAllocator<D> {
    /// `NativeCachingAllocator::allocate` + `DeviceCachingAllocator::malloc`:
    /// the address of a block of at least `size` bytes usable on `stream`.
    /// A zero-byte request returns address 0 and changes nothing.
    pub fn malloc(&mut self, orig_size: u64, stream: u64) -> Result<u64, OutOfMemory> {
        if orig_size == 0 {
            return Ok(0);
        }
        let (addr, block) = self.device_malloc(orig_size, stream)?;
        // `add_allocated_block`
        self.allocated_blocks.insert(addr, block);
        Ok(addr)
    }

    /// [`Self::malloc`] for a caller that holds the block itself, as
    /// `NativeCachingAllocator` holds the `Block*` that
    /// `DeviceCachingAllocator::malloc` returns: the address map is not
    /// touched. [`NIL`] for a zero-byte request. Free it with [`Self::free_held`].
    pub fn malloc_block(&mut self, orig_size: u64, stream: u64) -> Result<BlockId, OutOfMemory> {
        if orig_size == 0 {
            return Ok(NIL);
        }
        let (_, block) = self.device_malloc(orig_size, stream)?;
        self.arena.get_mut(block).held = true;
        Ok(block)
    }

    /// `DeviceCachingAllocator::malloc` (`orig_size` > 0): the block's address and the block.
    fn device_malloc(
        &mut self,
        orig_size: u64,
        stream: u64,
    ) -> Result<(u64, BlockId), OutOfMemory> {
        if orig_size >= ONE_EXA_BYTES {
            return Err(OutOfMemory {
                requested: orig_size,
                rounded: orig_size,
                alloc_size: orig_size,
                message: MORE_THAN_1EB.to_string(),
            });
        }
        if !self.cuda_events.is_empty() {
            self.process_events();
        }
        let size = round_size(orig_size, &self.settings);
        let small = is_small(size);
        let p = AllocParams {
            size,
            stream,
            small,
            alloc_size: get_allocation_size(size, &self.settings),
        };
        // trigger_free_memory_callbacks: no callbacks are registered, nothing to retry.
        let mut found = self.get_free_block(&p);
        if found.is_none() {
            if self.gc_enabled() {
                self.garbage_collect_cached_blocks();
            }
            found = self.alloc_block(&p, false);
            if found.is_none() && self.release_available_cached_blocks(&p) {
                found = self.alloc_block(&p, false);
            }
            if found.is_none() {
                self.release_cached_blocks();
                found = self.alloc_block(&p, true);
            }
        }
        let Some(block) = found else {
            return Err(self.out_of_memory(orig_size, &p));
        };
        let split = self.should_split(block, size);
        Ok(self.alloc_found_block(&p, block, orig_size, split))
    }

    /// The OOM path of `malloc`: counts it, records it, builds the message.
    fn out_of_memory(&mut self, orig_size: u64, p: &AllocParams) -> OutOfMemory {
        let (free, total) = self.device.mem_get_info();
        let processes = self.device.process_memory();
        self.record(TraceAction::Oom, free, p.size, p.stream);
        self.stats.num_ooms += 1;
        let figures = OomFigures {
            alloc_size: p.alloc_size,
            device_index: 0,
            total,
            free,
            allowed: self.set_fraction.then_some(self.allowed_memory_maximum),
            processes: &processes,
            allocated: self.stats.allocated_bytes.all().current as u64,
            reserved: self.stats.reserved_bytes.all().current as u64,
            private_pools: 0,
        };
        OutOfMemory {
            requested: orig_size,
            rounded: p.size,
            alloc_size: p.alloc_size,
            message: oom_message(self.settings.version, &figures),
        }
    }

    /// `get_free_block`: the best-fit free block on the stream, subject to the
    /// oversize rules; only the single best candidate is examined.
    fn get_free_block(&mut self, p: &AllocParams) -> Option<BlockId> {
        if self.gc_enabled() {
            self.pool_mut(p.small).get_free_blocks_call_count += 1;
        }
        let (at, id) = self.best_fit(p)?;
        let found = self.arena.get(id).size;
        let max_split = self.settings.max_split_size;
        let tolerance = max_non_split_rounding_size(&self.settings);
        // Thresholds in (p.size, found] would refuse this block as oversize;
        // those up to p.size would, when the fit is not near-exact.
        let mut flips = pow2_in(p.size + 1, found);
        if found >= p.size.saturating_add(tolerance) {
            flips |= pow2_in(1, p.size);
        }
        if flips & !self.split_flips != 0 && !self.refusal_changes_nothing(p, id) {
            self.split_flips |= flips;
        }
        // Never hand an oversize block to a normal request, and give an oversize
        // request only a near-exact fit.
        if p.size < max_split && found >= max_split {
            return None;
        }
        if p.size >= max_split && found >= p.size.saturating_add(tolerance) {
            return None;
        }
        self.pool_mut(p.small).blocks.remove_at(at);
        Some(id)
    }

    /// The block `get_free_block` examines for `p`, and where it sits in the pool.
    fn best_fit(&self, p: &AllocParams) -> Option<(Cursor, BlockId)> {
        let arena = &self.arena;
        let blocks = &self.pool(p.small).blocks;
        // `pool.blocks` holds only this stream's blocks from `lower_bound` on, so
        // no stream comparison is needed while walking.
        let mut at = blocks.lower_bound(p.stream, p.size)?;
        let (_, mut id) = blocks.get(at);
        if arena.get(id).is_expandable() {
            if self.settings.expandable_segments {
                // Best fit by "expandable size": a block followed by unmapped space
                // counts as large as it can grow.
                let expandable_size = |b: &Block| {
                    b.size
                        + if b.next != NIL && !arena.get(b.next).mapped {
                            arena.get(b.next).size
                        } else {
                            0
                        }
                };
                let mut grown = expandable_size(arena.get(id));
                // A block that cannot grow is never beaten: the blocks after it
                // are at least its size. Stopping there skips touching them.
                while arena.get(id).is_expandable() && grown > arena.get(id).size {
                    let Some(next_at) = blocks.next(at) else {
                        break;
                    };
                    let (_, next) = blocks.get(next_at);
                    let next_grown = expandable_size(arena.get(next));
                    if next_grown >= grown {
                        break;
                    }
                    at = next_at;
                    id = next;
                    grown = next_grown;
                }
            } else {
                // Expandable segments were turned off: only non-expandable blocks.
                loop {
                    at = blocks.next(at)?;
                    id = blocks.get(at).1;
                    if !arena.get(id).is_expandable() {
                        break;
                    }
                }
            }
        }
        Some((at, id))
    }

    /// Whether a run that refused the free block `id` to `p` as oversize would
    /// take that same block all the same: with expandable segments, `malloc`
    /// goes on to `alloc_block` (the collector, if on, returning at once;
    /// within the memory fraction), whose `try_allocate_expandable_block`
    /// picks `id` when it is `find_expandable_block`'s candidate, already
    /// mapped and large enough. `should_split` ignores the threshold there, so
    /// the run goes on as this one.
    fn refusal_changes_nothing(&self, p: &AllocParams, id: BlockId) -> bool {
        self.settings.expandable_segments
            && !(self.gc_enabled() && self.total_allocated_memory > self.gc_threshold_bytes())
            && !self.over_fraction(p)
            && self.expandable_candidate(p) == Some(id)
    }

    /// `alloc_block`'s first check: with a memory fraction set, `p`'s segment
    /// would take the allocator past it.
    fn over_fraction(&self, p: &AllocParams) -> bool {
        self.set_fraction
            && self.total_allocated_memory.saturating_add(p.alloc_size)
                > self.allowed_memory_maximum
    }

    /// `should_split`.
    fn should_split(&mut self, block: BlockId, size: u64) -> bool {
        let b = self.arena.get(block);
        let remaining = b.size - size;
        if b.small || self.settings.expandable_segments {
            remaining >= MIN_BLOCK_SIZE
        } else {
            if remaining > SMALL_SIZE {
                // Thresholds up to `size` would keep the block whole.
                self.split_flips |= pow2_in(1, size);
            }
            size < self.settings.max_split_size && remaining > SMALL_SIZE
        }
    }

    /// `alloc_block`: a new segment (cudaMalloc) or expandable growth.
    fn alloc_block(&mut self, p: &AllocParams, is_retry: bool) -> Option<BlockId> {
        if is_retry {
            self.stats.num_alloc_retries += 1;
        }
        if self.over_fraction(p) {
            return None;
        }
        if self.settings.expandable_segments {
            return self.try_allocate_expandable_block(p);
        }
        if !self.may_hold(p.alloc_size) {
            return None;
        }
        let addr = self.device.malloc(p.alloc_size).ok()?;
        self.total_allocated_memory += p.alloc_size;
        let id = self
            .arena
            .insert(Block::new(addr, p.alloc_size, p.stream, p.small));
        self.stats.segment.increase(p.small, 1);
        self.stats.reserved_bytes.increase(p.small, p.alloc_size);
        if p.alloc_size >= self.settings.max_split_size {
            self.stats.oversize_segments.increase(1);
        }
        self.stats.num_device_alloc += 1;
        self.record(TraceAction::SegmentAlloc, addr, p.alloc_size, p.stream);
        Some(id)
    }

    /// `alloc_found_block`: split at the front if asked, mark allocated, count.
    fn alloc_found_block(
        &mut self,
        p: &AllocParams,
        found: BlockId,
        orig_size: u64,
        split: bool,
    ) -> (u64, BlockId) {
        let size = p.size;
        let small = p.small;
        let already_split = self.arena.get(found).is_split();
        let expandable = self.arena.get(found).is_expandable();
        let block = if split {
            let remaining = found;
            let r = *self.arena.get(remaining);
            let mut front = Block::new(r.addr, size, p.stream, small);
            front.expandable = r.expandable;
            front.prev = r.prev;
            front.next = remaining;
            let block = self.arena.insert(front);
            if r.prev != NIL {
                self.arena.get_mut(r.prev).next = block;
            }
            let (remaining_addr, remaining_size) = (r.addr + size, r.size - size);
            let rem = self.arena.get_mut(remaining);
            rem.prev = block;
            rem.addr = remaining_addr;
            rem.size = remaining_size;
            let pool = if r.small {
                &mut self.small_blocks
            } else {
                &mut self.large_blocks
            };
            let key = (r.stream, remaining_size, remaining_addr);
            pool.insert_into_blocks_as(&mut self.arena, remaining, key);
            if !expandable {
                if already_split {
                    // An already-split inactive block shrinks by `size`.
                    self.stats.inactive_split_bytes.decrease(small, size);
                } else {
                    // A new inactive split block is created from an unsplit one.
                    self.stats
                        .inactive_split_bytes
                        .increase(small, remaining_size);
                    self.stats.inactive_split.increase(small, 1);
                }
            }
            block
        } else {
            if already_split && !expandable {
                let bytes = self.arena.get(found).size;
                self.stats.inactive_split_bytes.decrease(small, bytes);
                self.stats.inactive_split.decrease(small, 1);
            }
            found
        };
        let b = self.arena.get_mut(block);
        b.allocated = true;
        b.requested_size = orig_size;
        let (addr, bsize, stream) = (b.addr, b.size, b.stream);
        self.record(TraceAction::Alloc, addr, orig_size, stream);
        let s = &mut self.stats;
        s.allocation.increase(small, 1);
        s.allocated_bytes.increase(small, bsize);
        s.active.increase(small, 1);
        s.active_bytes.increase(small, bsize);
        s.requested_bytes.increase(small, orig_size);
        if bsize >= self.settings.max_split_size {
            s.oversize_allocations.increase(1);
        }
        (addr, block)
    }
}

/// The bits of the powers of two in `lo..=hi` (none when `lo > hi`).
#[inline]
fn pow2_in(lo: u64, hi: u64) -> u64 {
    if lo > hi || hi == 0 {
        return 0;
    }
    // Bits up to and including floor(log2(hi)), minus those below ceil(log2(lo)).
    let top = 63 - hi.leading_zeros();
    let up_to_hi = u64::MAX >> (63 - top);
    let below_lo = if lo <= 1 {
        0
    } else {
        let bottom = 64 - (lo - 1).leading_zeros(); // ceil(log2(lo))
        if bottom >= 64 {
            return 0;
        }
        (1u64 << bottom) - 1
    };
    up_to_hi & !below_lo
}

#[cfg(test)]
mod tests {
    use super::pow2_in;

    #[test]
    fn powers_of_two_in_a_range() {
        assert_eq!(pow2_in(1, 1), 0b1);
        assert_eq!(pow2_in(3, 4), 0b100);
        assert_eq!(pow2_in(5, 7), 0, "no power of two in 5..=7");
        assert_eq!(pow2_in(4, 3), 0);
        assert_eq!(pow2_in(33 << 20, 1 << 30), 0b11111 << 26, "64 MiB to 1 GiB");
        assert_eq!(pow2_in(1, u64::MAX), u64::MAX);
        assert_eq!(pow2_in(u64::MAX, u64::MAX), 0);
    }
}
