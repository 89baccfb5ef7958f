//! Seeding: a segment laid out as a recording says it was (live blocks at their
//! offsets, free blocks between them), so a replay can continue from the state
//! a snapshot's trace started in. PyTorch has no such entry point; the state
//! is what `malloc`/`free` would have left, with the stats counted as if the
//! blocks had been allocated (`alloc_found_block`) and split (`free_block`).

use super::block::{Block, NIL};
use super::native::CachingAllocator;
use crate::device::{Device, DeviceError};

/// One block of a seeded segment, in address order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeedBlock {
    pub size: u64,
    /// For allocated blocks: the unrounded request.
    pub requested_size: u64,
    pub allocated: bool,
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
        self.total_allocated_memory += total;
        self.stats.segment.increase(small, 1);
        self.stats.reserved_bytes.increase(small, total);
        if total >= self.settings.max_split_size {
            self.stats.oversize_segments.increase(1);
        }

        // Merge runs of free blocks first, so the layout is one free block per gap.
        let mut layout: Vec<SeedBlock> = Vec::with_capacity(blocks.len());
        for b in blocks.iter().filter(|b| b.size > 0) {
            match layout.last_mut() {
                Some(last) if !last.allocated && !b.allocated => last.size += b.size,
                _ => layout.push(*b),
            }
        }
        let split = layout.len() > 1;
        let mut addr = base;
        let mut prev = NIL;
        for b in &layout {
            let mut block = Block::new(addr, b.size, stream, small);
            block.prev = prev;
            block.allocated = b.allocated;
            block.requested_size = b.requested_size.min(b.size);
            let id = self.arena.insert(block);
            if prev != NIL {
                self.arena.get_mut(prev).next = id;
            }
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
                let pool = if small {
                    &mut self.small_blocks
                } else {
                    &mut self.large_blocks
                };
                pool.insert_into_blocks(&mut self.arena, id);
                if split {
                    self.stats.inactive_split.increase(small, 1);
                    self.stats.inactive_split_bytes.increase(small, b.size);
                }
            }
            addr += b.size;
        }
        Ok(base)
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
}
