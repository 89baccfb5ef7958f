//! Memory given back to the device: `release_block`, the oversize releases of `malloc`,
//! `release_cached_blocks` (`empty_cache()`) and garbage collection.

use super::{AllocParams, CachingAllocator};
use crate::allocator::block::BlockId;
use crate::allocator::events::TraceAction;
use crate::device::Device;

impl<D: Device> CachingAllocator<D> {
    /// `release_block`: cudaFree of a whole (unsplit, non-expandable) segment.
    pub(in crate::allocator) fn release_block(&mut self, id: BlockId) {
        let b = *self.arena.get(id);
        debug_assert!(!b.is_expandable() && !b.is_split());
        self.stats.num_device_free += 1;
        self.record(TraceAction::SegmentFree, b.addr, b.size, b.stream);
        // A failing cudaFree would throw in PyTorch; the segment is gone either way.
        let _ = self.device.free(b.addr, b.size);
        self.total_allocated_memory -= b.size;
        self.stats.segment.decrease(b.small, 1);
        self.stats.reserved_bytes.decrease(b.small, b.size);
        if b.size >= self.settings.max_split_size {
            self.stats.oversize_segments.decrease(1);
        }
        self.pool_mut(b.small).erase_block(&b);
        self.arena.remove(id);
    }

    /// `release_available_cached_blocks`: with max_split_size set, free one
    /// cached oversize block large enough, or the largest ones until enough.
    pub(super) fn release_available_cached_blocks(&mut self, p: &AllocParams) -> bool {
        // Unset, this returns at once; under any threshold it may release.
        self.split_flips = u64::MAX;
        let max_split = self.settings.max_split_size;
        if max_split == u64::MAX {
            return false;
        }
        let key_size = p.size.max(max_split);
        let arena = &self.arena;
        let pool = self.pool(p.small);
        let first = pool
            .blocks
            .range_from(p.stream, key_size)
            .next()
            .map(|(k, id)| (k.0, id));
        // Only whole segments can be released. A free oversize block is always
        // one in PyTorch's own runs (oversize blocks are never split), but a
        // replay seeded from a recording under another config can hold a split
        // one: it is passed over like an expandable block.
        let releasable = |id| {
            let b = arena.get(id);
            !b.is_expandable() && !b.is_split()
        };
        if let Some((stream, id)) = first
            && stream == p.stream
            && releasable(id)
        {
            self.release_block(id);
            return true;
        }
        // No single block is large enough: free oversize blocks from the largest down.
        let mut released = 0u64;
        let mut to_release = Vec::new();
        for ((stream, size, _), id) in pool.blocks.range_below(p.stream, key_size) {
            if released >= key_size || size < max_split || stream != p.stream {
                break;
            }
            if releasable(id) {
                released += size;
                to_release.push(id);
            }
        }
        for id in to_release {
            self.release_block(id);
        }
        released >= key_size
    }

    /// `release_cached_blocks` (= `empty_cache()`): wait for all events, free
    /// every unsplit cached segment, unmap every free expandable page.
    pub fn release_cached_blocks(&mut self) -> bool {
        self.synchronize_and_free_events();
        self.release_blocks(false);
        self.release_blocks(true);
        true
    }

    /// `torch.cuda.empty_cache()`.
    pub fn empty_cache(&mut self) {
        self.release_cached_blocks();
    }

    /// `release_blocks(pool)`.
    fn release_blocks(&mut self, small: bool) {
        let arena = &self.arena;
        let pool = self.pool(small);
        let mut to_release = Vec::new();
        let mut to_unmap = Vec::new();
        for id in pool.blocks.values() {
            let b = arena.get(id);
            if b.is_expandable() {
                to_unmap.push(id);
            } else if !b.is_split() {
                to_release.push(id);
            }
        }
        for id in to_release {
            self.release_block(id);
        }
        for id in to_unmap {
            let id = self.unmap_block(id);
            let b = self.arena.get(id);
            if !b.is_split() && !b.mapped {
                self.release_expandable_segment(id);
            }
        }
    }

    /// `garbage_collect_cached_blocks`: past `threshold × allowed`, free the cached
    /// unsplit large segments at or above the average age, repeatedly.
    pub(super) fn garbage_collect_cached_blocks(&mut self) {
        let gc_threshold = self.gc_threshold_bytes();
        if self.total_allocated_memory <= gc_threshold {
            return;
        }
        let target = self.total_allocated_memory - gc_threshold;
        let mut reclaimed = 0u64;
        let mut total_age = 0u64;
        let mut freeable: u64 = 0;
        for id in self.large_blocks.blocks.values() {
            let b = self.arena.get(id);
            if !b.is_split() {
                total_age += self.large_blocks.gc_count(b);
                freeable += 1;
            }
        }
        if freeable == 0 {
            return;
        }
        let mut block_freed = true;
        let mut victims = Vec::new();
        while reclaimed < target && block_freed && freeable > 0 {
            let age_threshold = total_age as f64 / freeable as f64;
            block_freed = false;
            victims.clear();
            for id in self.large_blocks.blocks.values() {
                let b = self.arena.get(id);
                let age = self.large_blocks.gc_count(b);
                if !b.is_split() && !b.is_expandable() && age as f64 >= age_threshold {
                    block_freed = true;
                    reclaimed += b.size;
                    total_age -= age;
                    freeable -= 1;
                    victims.push(id);
                }
            }
            for &id in &victims {
                self.release_block(id);
            }
        }
    }
}
