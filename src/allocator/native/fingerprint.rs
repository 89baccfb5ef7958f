//! The allocator's state as one number, for `forecast`'s skipping of
//! repeated steps: two states with equal fingerprints take the same
//! decisions on the same requests. Counters, peaks and trace entries are
//! left out (they decide nothing); the arena's slot numbers too (decisions
//! compare blocks by size and address, never by slot).

use super::CachingAllocator;
use crate::allocator::block::{Block, NIL};
use crate::device::Device;
use rustc_hash::FxHasher;
use std::hash::{Hash, Hasher};

impl<D: Device> CachingAllocator<D> {
    /// A hash of everything the allocator's next decisions depend on: every
    /// block (address, size, neighbours, pool, stream, state), the
    /// expandable segments, the deferred frees, the bytes obtained and the
    /// device's own state. `None` when the device cannot say its state (a
    /// real GPU): such a run is never skipped.
    pub fn state_hash(&self) -> Option<u64> {
        let device = self.device.state_hash()?;
        let mut blocks: Vec<(u64, &Block)> = self.arena.iter().map(|(_, b)| (b.addr, b)).collect();
        blocks.sort_unstable_by_key(|&(addr, b)| (addr, b.size, b.small));
        let addr_of = |id| {
            if id == NIL {
                u64::MAX
            } else {
                self.arena.get(id).addr
            }
        };
        let gc = self.gc_enabled();
        let mut h = FxHasher::default();
        device.hash(&mut h);
        blocks.len().hash(&mut h);
        for (_, b) in blocks {
            (b.addr, b.size, b.requested_size, b.stream).hash(&mut h);
            (
                addr_of(b.prev),
                addr_of(b.next),
                b.expandable,
                b.event_count,
            )
                .hash(&mut h);
            (b.small, b.allocated, b.mapped, b.has_stream_uses, b.held).hash(&mut h);
            if gc && !b.allocated {
                // The age garbage collection reads: calls since it was cached.
                self.pool(b.small)
                    .get_free_blocks_call_count
                    .wrapping_sub(b.gc_count_base)
                    .hash(&mut h);
            }
        }
        for s in &self.expandable_segments {
            s.as_ref()
                .map(|s| (s.base, s.page, s.pages, s.stream))
                .hash(&mut h);
        }
        for (stream, events) in &self.cuda_events {
            stream.hash(&mut h);
            for e in events {
                (addr_of(e.block), e.ready).hash(&mut h);
            }
        }
        for &(id, stream) in &self.stream_uses {
            (addr_of(id), stream).hash(&mut h);
        }
        (self.total_allocated_memory, self.allowed_memory_maximum).hash(&mut h);
        Some(h.finish())
    }

    /// Bytes a copy of the allocator holds, about (a memo's budget).
    pub fn approx_bytes(&self) -> usize {
        self.arena.slots() * size_of::<Block>()
            + self.large_blocks.blocks.approx_bytes()
            + self.small_blocks.blocks.approx_bytes()
            + self.expandable_segments.len() * 40
    }
}
