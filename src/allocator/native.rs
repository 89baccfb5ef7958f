//! `DeviceCachingAllocator` (c10/cuda/CUDACachingAllocator.cpp, 2.6.0): malloc
//! with its slow path, free, deferred frees through stream events, release of
//! cached blocks and garbage collection. Spec: allocator.md §2–§3.

use super::block::{AddrMap, Arena, Block, BlockId, BlockPool, Cursor, NIL};
use super::events::{TraceAction, TraceEntry};
use super::expandable::ExpandableSegment;
use super::oom::{MORE_THAN_1EB, OomFigures, oom_message};
use super::sizes::{
    MIN_BLOCK_SIZE, ONE_EXA_BYTES, SMALL_SIZE, get_allocation_size, is_small,
    max_non_split_rounding_size, round_size,
};
use super::stats::DeviceStats;
use crate::conf::Settings;
use crate::device::Device;
use std::collections::{BTreeMap, VecDeque};
use thiserror::Error;

/// The allocation failed: PyTorch raises `torch.OutOfMemoryError` with `message`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{message}")]
pub struct OutOfMemory {
    /// The request as made (`orig_size`).
    pub requested: u64,
    /// `round_size(requested)`.
    pub rounded: u64,
    /// The segment size that could not be obtained (what "Tried to allocate" prints).
    pub alloc_size: u64,
    pub message: String,
}

/// Errors of `free` / `record_stream` on an address the allocator does not hold.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PointerError {
    #[error("invalid device pointer: {0:#x}")]
    InvalidDevicePointer(u64),
    #[error("block {0} is not an allocation held by the caller")]
    NotHeld(BlockId),
}

/// A (block, event ready?) pair of `cuda_events`: a deferred free waiting for a
/// stream's work. Events complete when the caller says the stream caught up
/// ([`CachingAllocator::synchronize_stream`]) or at a full synchronisation.
#[derive(Debug, Clone, Copy)]
struct PendingEvent {
    block: BlockId,
    ready: bool,
}

/// `AllocParams`: the request after rounding and pool choice.
#[derive(Debug, Clone, Copy)]
pub(super) struct AllocParams {
    pub size: u64,
    pub stream: u64,
    pub small: bool,
    pub alloc_size: u64,
}

/// PyTorch's native caching allocator for one device.
#[derive(Clone)]
pub struct CachingAllocator<D: Device> {
    pub(super) settings: Settings,
    pub(super) device: D,
    pub(super) arena: Arena,
    pub(super) large_blocks: BlockPool,
    pub(super) small_blocks: BlockPool,
    /// `allocated_blocks`: address → allocated block, for the blocks handed
    /// out by address ([`Self::malloc`]).
    pub(super) allocated_blocks: AddrMap,
    pub(super) stats: DeviceStats,
    /// Bytes obtained from the device (cudaMalloc'd plus mapped).
    pub(super) total_allocated_memory: u64,
    set_fraction: bool,
    allowed_memory_maximum: u64,
    /// `expandable_segments_`, by index (a released one leaves `None`).
    pub(super) expandable_segments: Vec<Option<ExpandableSegment>>,
    /// `cuda_events`: per stream, FIFO of deferred frees.
    cuda_events: BTreeMap<u64, VecDeque<PendingEvent>>,
    /// `Block::stream_uses` of the blocks that have any: (block, stream).
    stream_uses: Vec<(BlockId, u64)>,
    trace: Option<Vec<TraceEntry>>,
    /// See [`Self::max_split_flips`].
    split_flips: u64,
}

impl<D: Device> CachingAllocator<D> {
    pub fn new(settings: Settings, device: D) -> Self {
        let stats = DeviceStats {
            // SIZE_MAX cast to int64 is -1.
            max_split_size: settings.max_split_size as i64,
            ..DeviceStats::default()
        };
        let mut allocator = CachingAllocator {
            settings,
            device,
            arena: Arena::default(),
            large_blocks: BlockPool::default(),
            small_blocks: BlockPool::default(),
            allocated_blocks: AddrMap::default(),
            stats,
            total_allocated_memory: 0,
            set_fraction: false,
            allowed_memory_maximum: 0,
            expandable_segments: Vec::new(),
            cuda_events: BTreeMap::new(),
            stream_uses: Vec::new(),
            trace: None,
            split_flips: 0,
        };
        if let Some(fraction) = allocator.settings.per_process_memory_fraction {
            allocator.set_memory_fraction(fraction);
        }
        allocator
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }
    pub fn device(&self) -> &D {
        &self.device
    }
    pub fn device_mut(&mut self) -> &mut D {
        &mut self.device
    }
    pub fn stats(&self) -> &DeviceStats {
        &self.stats
    }
    /// `torch.cuda.memory_stats()`: the flat, sorted keys of this allocator's version.
    pub fn memory_stats(&self) -> BTreeMap<String, i64> {
        self.stats.flat(self.settings.version)
    }
    /// `torch.cuda.reset_peak_memory_stats()`.
    pub fn reset_peak_stats(&mut self) {
        self.stats.reset_peak();
    }
    /// `torch.cuda.reset_accumulated_memory_stats()`.
    pub fn reset_accumulated_stats(&mut self) {
        self.stats.reset_accumulated();
    }
    /// Bit `k` set: under a `max_split_size` of `2^k` bytes instead of this
    /// run's, some decision so far would have gone the other way. The
    /// threshold decides in three places: `get_free_block` (an oversize block
    /// refused to a normal request, a non-exact oversize fit refused),
    /// `should_split` (no split of an oversize request's block) and
    /// `release_available_cached_blocks` (sets every bit). Elsewhere it only
    /// counts the oversize stats. A refusal that turns nothing sets no bit
    /// (with expandable segments, the refused block taken all the same:
    /// `refusal_changes_nothing`). So with the bit of `T` clear, a run under
    /// `T` takes every decision this run took: the same run, but for the
    /// oversize stats and the `max_split_size` stat. Kept for the unset
    /// threshold (`u64::MAX`), which the config search compares against.
    pub fn max_split_flips(&self) -> u64 {
        self.split_flips
    }

    /// Continues this run under a `max_split_size` of `threshold` as if it
    /// had been set from the start, which holds while the threshold's bit of
    /// [`Self::max_split_flips`] is clear: no decision so far would have gone
    /// the other way. Only the oversize stats, which count blocks against the
    /// threshold, stay as this run counted them.
    pub fn continue_under_threshold(&mut self, threshold: u64) {
        self.settings.max_split_size = threshold;
        self.stats.max_split_size = threshold as i64;
    }

    /// Bytes currently obtained from the device (`total_allocated_memory`).
    pub fn total_allocated_memory(&self) -> u64 {
        self.total_allocated_memory
    }

    /// `_set_allocator_settings`: later allocations follow `settings`; existing
    /// blocks stay where they are (the `max_split_size` stat keeps its first value).
    pub fn set_settings(&mut self, settings: Settings) {
        self.settings = settings;
        self.split_flips = u64::MAX;
        if let Some(fraction) = self.settings.per_process_memory_fraction {
            self.set_memory_fraction(fraction);
        }
    }

    /// `setMemoryFraction`: caps what the allocator may obtain at
    /// `fraction × total memory`.
    pub fn set_memory_fraction(&mut self, fraction: f64) {
        self.allowed_memory_maximum = (fraction * self.device.total_memory() as f64) as u64;
        self.set_fraction = true;
    }

    /// Starts recording trace entries (`_record_memory_history("all")`).
    pub fn record_history(&mut self) {
        self.trace.get_or_insert_with(Vec::new);
    }
    /// The entries recorded since the last call.
    pub fn take_trace(&mut self) -> Vec<TraceEntry> {
        self.trace.as_mut().map(std::mem::take).unwrap_or_default()
    }

    #[inline]
    pub(super) fn record(&mut self, action: TraceAction, addr: u64, size: u64, stream: u64) {
        if let Some(trace) = &mut self.trace {
            trace.push(TraceEntry {
                action,
                addr,
                size,
                stream,
            });
        }
    }

    #[inline]
    pub(super) fn pool_mut(&mut self, small: bool) -> &mut BlockPool {
        if small {
            &mut self.small_blocks
        } else {
            &mut self.large_blocks
        }
    }

    #[inline]
    pub(super) fn pool(&self, small: bool) -> &BlockPool {
        if small {
            &self.small_blocks
        } else {
            &self.large_blocks
        }
    }

    /// `pool.insert_into_blocks(block)` into the block's own pool.
    #[inline]
    pub(super) fn insert_into_pool(&mut self, id: BlockId) {
        let pool = if self.arena.get(id).small {
            &mut self.small_blocks
        } else {
            &mut self.large_blocks
        };
        pool.insert_into_blocks(&mut self.arena, id);
    }

    #[inline]
    fn gc_enabled(&self) -> bool {
        self.set_fraction && self.settings.garbage_collection_threshold > 0.0
    }

    /// What `garbage_collect_cached_blocks` lets the device hold before it collects.
    fn gc_threshold_bytes(&self) -> u64 {
        (self.settings.garbage_collection_threshold * self.allowed_memory_maximum as f64) as u64
    }

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

    /// Whether `bytes` more from the device keep the total within `i64::MAX`, the
    /// most PyTorch's int64 stats count; only an unbounded simulated card (or a
    /// request past 2^62 bytes) reaches it, and it fails like a cudaMalloc would.
    #[inline]
    pub(super) fn may_hold(&self, bytes: u64) -> bool {
        self.total_allocated_memory
            .checked_add(bytes)
            .is_some_and(|total| total <= i64::MAX as u64)
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
    fn held(&self, block: BlockId) -> Result<&Block, PointerError> {
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

    /// `recordStream`: the allocation is also used on `stream`, so its free waits
    /// for that stream's work.
    pub fn record_stream(&mut self, addr: u64, stream: u64) -> Result<(), PointerError> {
        let &id = self
            .allocated_blocks
            .get(&addr)
            .ok_or(PointerError::InvalidDevicePointer(addr))?;
        self.record_block_stream(id, stream);
        Ok(())
    }

    /// [`Self::record_stream`] of a block from [`Self::malloc_block`] ([`NIL`] is an error,
    /// as address 0 is).
    pub fn record_stream_held(&mut self, block: BlockId, stream: u64) -> Result<(), PointerError> {
        if block == NIL {
            return Err(PointerError::InvalidDevicePointer(0));
        }
        self.held(block)?;
        self.record_block_stream(block, stream);
        Ok(())
    }

    /// `Block::stream_uses.insert(stream)`, unless it is the block's own stream.
    fn record_block_stream(&mut self, id: BlockId, stream: u64) {
        let b = self.arena.get_mut(id);
        if b.stream == stream || self.stream_uses.contains(&(id, stream)) {
            return;
        }
        b.has_stream_uses = true;
        self.stream_uses.push((id, stream));
    }

    /// The work queued on `stream` so far has finished: its events are complete
    /// and the frees waiting on them happen at the next `malloc` (`process_events`).
    pub fn synchronize_stream(&mut self, stream: u64) {
        if let Some(queue) = self.cuda_events.get_mut(&stream) {
            queue.iter_mut().for_each(|e| e.ready = true);
        }
    }

    /// `insert_events`: one event per stream the block was used on.
    fn insert_events(&mut self, id: BlockId) {
        let mut i = 0;
        while i < self.stream_uses.len() {
            let (block, stream) = self.stream_uses[i];
            if block == id {
                self.stream_uses.swap_remove(i);
                self.arena.get_mut(id).event_count += 1;
                self.cuda_events
                    .entry(stream)
                    .or_default()
                    .push_back(PendingEvent {
                        block: id,
                        ready: false,
                    });
            } else {
                i += 1;
            }
        }
        self.arena.get_mut(id).has_stream_uses = false;
    }

    /// `process_events`: per stream, complete events in order up to the first
    /// one not ready.
    fn process_events(&mut self) {
        let mut completed = Vec::new();
        self.cuda_events.retain(|_, queue| {
            while let Some(e) = queue.front() {
                if !e.ready {
                    break;
                }
                completed.push(e.block);
                queue.pop_front();
            }
            !queue.is_empty()
        });
        for block in completed {
            self.event_completed(block);
        }
    }

    fn event_completed(&mut self, block: BlockId) {
        let b = self.arena.get_mut(block);
        b.event_count -= 1;
        if b.event_count == 0 {
            self.free_block(block);
        }
    }

    /// `synchronize_and_free_events`: wait for every outstanding event.
    fn synchronize_and_free_events(&mut self) {
        self.stats.num_sync_all_streams += 1;
        let events = std::mem::take(&mut self.cuda_events);
        for e in events.into_values().flatten() {
            // cudaEventSynchronize
            self.device.synchronize();
            self.event_completed(e.block);
        }
    }

    /// `free_block`: merge with free neighbours and return to the pool.
    pub(super) fn free_block(&mut self, id: BlockId) {
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
    pub(super) fn try_merge_blocks(&mut self, dst: BlockId, src: BlockId) -> Option<Block> {
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

    /// `release_block`: cudaFree of a whole (unsplit, non-expandable) segment.
    pub(super) fn release_block(&mut self, id: BlockId) {
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
    fn release_available_cached_blocks(&mut self, p: &AllocParams) -> bool {
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
    fn garbage_collect_cached_blocks(&mut self) {
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

fn apply_net(array: &mut super::stats::StatArray, small: bool, net: i64) {
    if net > 0 {
        array.increase(small, net as u64);
    } else if net < 0 {
        array.decrease(small, net.unsigned_abs());
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
