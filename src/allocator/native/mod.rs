//! `DeviceCachingAllocator` (c10/cuda/CUDACachingAllocator.cpp, 2.6.0): malloc
//! with its slow path, free, deferred frees through stream events, release of
//! cached blocks and garbage collection. Spec: allocator.md §2–§3.

mod fingerprint;
mod free;
mod malloc;
mod release;
mod streams;

use super::block::{AddrMap, Arena, BlockId, BlockPool};
use super::events::{TraceAction, TraceEntry};
use super::expandable::ExpandableSegment;
use super::stats::DeviceStats;
use crate::conf::Settings;
use crate::device::Device;
use std::collections::{BTreeMap, VecDeque};
use streams::PendingEvent;
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

    /// Whether `bytes` more from the device keep the total within `i64::MAX`, the
    /// most PyTorch's int64 stats count; only an unbounded simulated card (or a
    /// request past 2^62 bytes) reaches it, and it fails like a cudaMalloc would.
    #[inline]
    pub(super) fn may_hold(&self, bytes: u64) -> bool {
        self.total_allocated_memory
            .checked_add(bytes)
            .is_some_and(|total| total <= i64::MAX as u64)
    }
}
