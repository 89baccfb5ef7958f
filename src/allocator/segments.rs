//! The snapshot view of the allocator (`DeviceCachingAllocator::snapshot`:
//! one `SegmentInfo` per cudaMalloc'd segment or contiguous mapped range of an
//! expandable segment) and a full consistency check of the internal state.

use super::block::{Block, BlockId, NIL};
use super::native::CachingAllocator;
use super::stats::{DeviceStats, Stat, StatArray};
use crate::device::Device;
use std::collections::BTreeSet;

/// A block's state as a snapshot names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockState {
    ActiveAllocated,
    ActivePendingFree,
    Inactive,
}

impl BlockState {
    pub fn as_str(self) -> &'static str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::ActivePendingFree => "active_pending_free",
            BlockState::Inactive => "inactive",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockInfo {
    pub address: u64,
    pub size: u64,
    /// The last allocation's requested size (stale for inactive blocks).
    pub requested_size: u64,
    pub state: BlockState,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentInfo {
    pub address: u64,
    pub total_size: u64,
    pub allocated_size: u64,
    pub active_size: u64,
    pub requested_size: u64,
    pub stream: u64,
    /// `segment_type == "small"`.
    pub small: bool,
    pub is_expandable: bool,
    pub blocks: Vec<BlockInfo>,
}

fn state_of(b: &Block) -> BlockState {
    if b.allocated {
        BlockState::ActiveAllocated
    } else if b.event_count > 0 || b.has_stream_uses {
        BlockState::ActivePendingFree
    } else {
        BlockState::Inactive
    }
}

impl<D: Device> CachingAllocator<D> {
    /// The segments with their blocks, sorted by address (`memory_snapshot()`).
    pub fn segments(&self) -> Vec<SegmentInfo> {
        let mut out: Vec<SegmentInfo> = self
            .arena
            .iter()
            .filter(|(_, b)| b.mapped && (b.prev == NIL || !self.arena.get(b.prev).mapped))
            .map(|(head, b)| {
                let mut segment = SegmentInfo {
                    address: b.addr,
                    total_size: 0,
                    allocated_size: 0,
                    active_size: 0,
                    requested_size: 0,
                    stream: b.stream,
                    small: b.small,
                    is_expandable: b.is_expandable(),
                    blocks: Vec::new(),
                };
                let mut id = head;
                while id != NIL && self.arena.get(id).mapped {
                    let b = self.arena.get(id);
                    let state = state_of(b);
                    segment.total_size += b.size;
                    if state == BlockState::ActiveAllocated {
                        segment.allocated_size += b.size;
                    }
                    if state != BlockState::Inactive {
                        segment.active_size += b.size;
                        segment.requested_size += b.requested_size;
                    }
                    segment.blocks.push(BlockInfo {
                        address: b.addr,
                        size: b.size,
                        requested_size: b.requested_size,
                        state,
                    });
                    id = b.next;
                }
                segment
            })
            .collect();
        out.sort_by_key(|s| s.address);
        out
    }

    /// Checks every structural invariant and recounts every `current` stat from
    /// the blocks (the snapshot-vs-stats checks of test_cuda_multigpu's
    /// `_check_memory_stat_consistency`, and more). For tests and debugging.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut expected_free: BTreeSet<(bool, (u64, u64, u64), BlockId)> = BTreeSet::new();
        let mut expected_unmapped: BTreeSet<(bool, (u64, u64), BlockId)> = BTreeSet::new();
        let mut recount = DeviceStats::default();
        let mut mapped_total = 0u64;
        for (id, b) in self.arena.iter() {
            if b.next != NIL {
                let n = self.arena.get(b.next);
                if !n.live || n.prev != id || n.addr != b.addr + b.size {
                    return Err(format!(
                        "block {:#x}+{} does not tile with its next",
                        b.addr, b.size
                    ));
                }
            }
            if b.prev != NIL {
                let p = self.arena.get(b.prev);
                if !p.live || p.next != id || p.addr + p.size != b.addr {
                    return Err(format!("block {:#x} does not tile with its prev", b.addr));
                }
            }
            if b.size == 0 || (b.mapped && b.size % 512 != 0) {
                return Err(format!("block {:#x} has size {}", b.addr, b.size));
            }
            if !b.mapped {
                expected_unmapped.insert((b.small, (b.stream, b.addr), id));
                continue;
            }
            mapped_total += b.size;
            let state = state_of(b);
            if state == BlockState::Inactive {
                expected_free.insert((b.small, (b.stream, b.size, b.addr), id));
                // Two free neighbours with the same mapped state would have merged.
                for n in [b.prev, b.next] {
                    if n != NIL {
                        let nb = self.arena.get(n);
                        if nb.mapped && state_of(nb) == BlockState::Inactive {
                            return Err(format!(
                                "free block {:#x} has an unmerged free neighbour",
                                b.addr
                            ));
                        }
                    }
                }
            }
            if state == BlockState::ActiveAllocated {
                recount.allocation.increase(b.small, 1);
                recount.allocated_bytes.increase(b.small, b.size);
            }
            if state != BlockState::Inactive {
                recount.active.increase(b.small, 1);
                recount.active_bytes.increase(b.small, b.size);
                recount.requested_bytes.increase(b.small, b.requested_size);
            } else if !b.is_expandable() && b.is_split() {
                recount.inactive_split.increase(b.small, 1);
                recount.inactive_split_bytes.increase(b.small, b.size);
            }
            if !b.is_expandable() && b.prev == NIL {
                recount.segment.increase(b.small, 1);
            }
            recount.reserved_bytes.increase(b.small, b.size);
        }
        let actual_free: BTreeSet<_> = [(true, &self.small_blocks), (false, &self.large_blocks)]
            .iter()
            .flat_map(|(small, pool)| pool.blocks.iter().map(move |(k, id)| (*small, k, id)))
            .collect();
        if actual_free != expected_free {
            return Err(format!(
                "free set {actual_free:?} differs from the inactive blocks {expected_free:?}"
            ));
        }
        let actual_unmapped: BTreeSet<_> =
            [(true, &self.small_blocks), (false, &self.large_blocks)]
                .iter()
                .flat_map(|(small, pool)| {
                    pool.unmapped.iter().map(move |(k, &id)| (*small, *k, id))
                })
                .collect();
        if actual_unmapped != expected_unmapped {
            return Err("unmapped set differs from the unmapped blocks".into());
        }
        // Every allocated block is in the address map or held by the caller, not both.
        let by_address = self
            .arena
            .iter()
            .filter(|(_, b)| b.allocated && !b.held)
            .count();
        if self.arena.iter().any(|(_, b)| b.held && !b.allocated)
            || by_address != self.allocated_blocks.len()
            || self.allocated_blocks.iter().any(|(&addr, &id)| {
                let b = self.arena.get(id);
                !b.allocated || b.held || b.addr != addr
            })
        {
            return Err("the address map differs from the allocated blocks".into());
        }
        if mapped_total != self.total_allocated_memory {
            return Err(format!(
                "blocks cover {mapped_total} bytes but total_allocated_memory is {}",
                self.total_allocated_memory
            ));
        }
        let s = &self.stats;
        let pairs: [(&str, &StatArray, &StatArray); 9] = [
            ("allocation", &s.allocation, &recount.allocation),
            (
                "allocated_bytes",
                &s.allocated_bytes,
                &recount.allocated_bytes,
            ),
            ("active", &s.active, &recount.active),
            ("active_bytes", &s.active_bytes, &recount.active_bytes),
            (
                "requested_bytes",
                &s.requested_bytes,
                &recount.requested_bytes,
            ),
            ("inactive_split", &s.inactive_split, &recount.inactive_split),
            (
                "inactive_split_bytes",
                &s.inactive_split_bytes,
                &recount.inactive_split_bytes,
            ),
            ("segment", &s.segment, &recount.segment),
            ("reserved_bytes", &s.reserved_bytes, &recount.reserved_bytes),
        ];
        for (name, kept, counted) in pairs {
            for i in 0..3 {
                let (k, c): (Stat, Stat) = (kept.get(i), counted.get(i));
                if k.current != c.current || k.current > k.peak {
                    return Err(format!(
                        "{name}[{i}]: kept {k:?}, recounted current {}",
                        c.current
                    ));
                }
            }
        }
        Ok(())
    }
}
