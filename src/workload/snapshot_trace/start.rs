//! The allocator state at the start of a device's trace (`StartState`), rebuilt from the
//! trace and the final segments as the parent module's doc describes.

use super::SnapshotTrace;
use super::expandable::expandable_start;
use crate::Error;
use crate::allocator::seed::{SeedBlock, SeedRange};
use crate::allocator::sizes::{max_non_split_rounding_size, round_size};
use crate::conf::Settings;
use crate::snapshot::Snapshot;
use crate::snapshot::model::{Action, BlockState, Segment};
use std::collections::HashSet;

const MIB: u64 = 1 << 20;

/// A segment as it was when the trace started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartSegment {
    pub address: u64,
    pub stream: u64,
    pub small: bool,
    pub blocks: Vec<SeedBlock>,
    /// Recorded addresses of the live blocks, in `blocks` order.
    pub live: Vec<u64>,
}

/// An expandable segment (one address reservation) as it was when the trace
/// started: its mapped ranges, offsets from `address`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartReservation {
    pub address: u64,
    pub stream: u64,
    pub small: bool,
    pub ranges: Vec<SeedRange>,
    /// Recorded addresses of the live blocks, in address order.
    pub live: Vec<u64>,
    /// Bytes up to the next reservation the recording shows, if any.
    pub limit: Option<u64>,
}

/// The allocator state at the start of a device's trace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StartState {
    pub segments: Vec<StartSegment>,
    pub reservations: Vec<StartReservation>,
    /// Live blocks of kind (a) and (b) placed.
    pub live_blocks: usize,
    /// Live-at-start addresses that fall in no start segment (inconsistent input).
    pub unplaced: usize,
}

impl<'s, 'a> SnapshotTrace<'s, 'a> {
    /// `recorded` are the settings the recording ran under (sizes of blocks
    /// live at the start follow them).
    pub fn new(snap: &'s Snapshot<'a>, device: u32, recorded: &Settings) -> Result<Self, Error> {
        let trace = snap
            .trace(device)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| Error::Input(format!("not a torch memory snapshot: {e}")))?;
        if trace.is_empty() {
            return Err(Error::Input(format!(
                "the snapshot has no trace for device {device}: record it with torch.cuda.memory._record_memory_history()"
            )));
        }
        let segs: Vec<&Segment> = snap
            .segments
            .iter()
            .filter(|s| s.device == device)
            .collect();

        // Walk forward: what the trace allocated, freed, created and released.
        let mut live: HashSet<u64> = HashSet::new();
        let mut seen_alloc: HashSet<u64> = HashSet::new();
        // (address, requested size, index of its free) of blocks live at the start.
        let mut pre_freed: Vec<(u64, u64, usize)> = Vec::new();
        let mut alloc_at: Vec<(u64, usize)> = Vec::new();
        let mut created: HashSet<u64> = HashSet::new();
        let mut released_first: Vec<(u64, u64, u64)> = Vec::new();
        let mut device_addresses: Vec<(usize, u64)> = Vec::new();
        for (i, e) in trace.iter().enumerate() {
            match e.action {
                Action::Alloc => {
                    live.insert(e.addr);
                    seen_alloc.insert(e.addr);
                    alloc_at.push((e.addr, i));
                }
                Action::FreeRequested => {
                    let was_live = live.remove(&e.addr);
                    if !was_live && seen_alloc.insert(e.addr) {
                        pre_freed.push((e.addr, e.size, i));
                    }
                }
                // A completion whose request came before the trace started.
                Action::FreeCompleted if seen_alloc.insert(e.addr) => {
                    pre_freed.push((e.addr, e.size, i));
                }
                Action::SegmentAlloc => {
                    created.insert(e.addr);
                    device_addresses.push((i, e.addr));
                }
                Action::SegmentFree => {
                    if !created.contains(&e.addr) {
                        released_first.push((e.addr, e.size, e.stream));
                    }
                    created.remove(&e.addr);
                }
                _ => {}
            }
        }
        let created_in_trace: HashSet<u64> = device_addresses.iter().map(|&(_, a)| a).collect();

        // (address, size, stream, small) of every cudaMalloc'd segment present at the start.
        let mut start: Vec<(u64, u64, u64, bool)> = segs
            .iter()
            .filter(|s| s.is_expandable != Some(true) && !created_in_trace.contains(&s.address))
            .map(|s| (s.address, s.total_size, s.stream, is_small_pool(s)))
            .collect();
        // A released segment's pool: small segments are 2 MiB (kSmallBuffer).
        start.extend(
            released_first
                .iter()
                .map(|&(a, size, stream)| (a, size, stream, size == 2 * MIB)),
        );
        start.sort_unstable();

        let expandable = expandable_start(&trace, &segs, recorded);
        device_addresses.extend_from_slice(&expandable.created);
        device_addresses.sort_unstable();

        // Live blocks at the start: (address, size, requested, and for an
        // oversize block freed in the trace, the index of its free).
        let mut blocks: Vec<(u64, u64, u64, Option<usize>)> = Vec::new();
        for s in &segs {
            for b in snap.blocks_of(s) {
                if b.state == BlockState::ActiveAllocated && !live.contains(&b.address) {
                    blocks.push((b.address, b.size, b.requested_size, None));
                }
            }
        }
        let placed_b: HashSet<u64> = blocks.iter().map(|b| b.0).collect();
        for &(addr, requested, freed_at) in &pre_freed {
            if !placed_b.contains(&addr) {
                let size = round_size(requested, recorded);
                let oversize = size >= recorded.max_split_size;
                blocks.push((addr, size, requested, oversize.then_some(freed_at)));
            }
        }
        blocks.sort_unstable();
        // An oversize request takes a whole free block up to the tolerance larger
        // without splitting it (`get_free_block`, `should_split`): the gap after
        // such a block is taken to be its tail when it is under the tolerance and
        // no recorded alloc lands in it before the block's free (PyTorch would
        // have used a free block there that served a request best).
        // Gaps never overlap, so the scans below touch each address once.
        alloc_at.sort_unstable();
        let tolerance = max_non_split_rounding_size(recorded);
        let is_tail = |from: u64, gap: u64, freed_at: usize| {
            let first = alloc_at.partition_point(|&(a, _)| a < from);
            gap < tolerance
                && !alloc_at[first..]
                    .iter()
                    .take_while(|&&(a, _)| a - from < gap)
                    .any(|&(_, i)| i < freed_at)
        };

        let mut state = StartState::default();
        // Every start segment and every range mapped at the start, in address order.
        let mut containers: Vec<(u64, u64, Slot)> = Vec::new();
        for &(address, size, stream, small) in &start {
            containers.push((address, size, Slot::Segment(state.segments.len())));
            state.segments.push(StartSegment {
                address,
                stream,
                small,
                blocks: Vec::new(),
                live: Vec::new(),
            });
        }
        for (r, res) in expandable.reservations.iter().enumerate() {
            for (k, &(begin, end)) in res.ranges.iter().enumerate() {
                containers.push((begin, end - begin, Slot::Range(r, k)));
            }
            state.reservations.push(StartReservation {
                address: res.base,
                stream: res.stream,
                small: res.small,
                ranges: res
                    .ranges
                    .iter()
                    .map(|&(begin, _)| SeedRange {
                        offset: begin - res.base,
                        blocks: Vec::new(),
                    })
                    .collect(),
                live: Vec::new(),
                limit: res.limit,
            });
        }
        containers.sort_unstable_by_key(|c| c.0);

        let mut next = blocks.iter().peekable();
        for &(address, size, slot) in &containers {
            let end = address.saturating_add(size);
            let mut tiles = Vec::new();
            let mut live_here = Vec::new();
            let mut cursor = address;
            // The last live block, if its tail may be the gap after it.
            let mut open_tail: Option<usize> = None;
            let gap_to = |tiles: &mut Vec<SeedBlock>, open: Option<usize>, from: u64, to: u64| {
                let gap = to - from;
                match (open, tiles.last_mut()) {
                    (Some(freed_at), Some(last)) if is_tail(from, gap, freed_at) => {
                        last.size += gap
                    }
                    _ => tiles.push(free_block(gap)),
                }
            };
            while let Some(&&(a, bsize, requested, freed_at)) = next.peek() {
                if a >= end {
                    break;
                }
                next.next();
                if a < cursor || a.saturating_add(bsize) > end {
                    state.unplaced += 1;
                    continue;
                }
                if a > cursor {
                    gap_to(&mut tiles, open_tail, cursor, a);
                }
                tiles.push(SeedBlock {
                    size: bsize,
                    requested_size: requested,
                    allocated: true,
                });
                // Only cudaMalloc'd segments: expandable blocks split down to 512 B.
                open_tail = freed_at.filter(|_| matches!(slot, Slot::Segment(_)));
                live_here.push(a);
                state.live_blocks += 1;
                cursor = a + bsize;
            }
            if cursor < end {
                gap_to(&mut tiles, open_tail, cursor, end);
            }
            let (blocks, live) = match slot {
                Slot::Segment(i) => {
                    let seg = &mut state.segments[i];
                    (&mut seg.blocks, &mut seg.live)
                }
                Slot::Range(r, k) => {
                    let res = &mut state.reservations[r];
                    (&mut res.ranges[k].blocks, &mut res.live)
                }
            };
            *blocks = tiles;
            live.extend(live_here);
        }
        // Blocks below the first container or between containers.
        state.unplaced += blocks.len() - state.live_blocks - state.unplaced;
        Ok(SnapshotTrace {
            snap,
            device,
            trace,
            start: state,
            device_addresses: device_addresses.into_iter().map(|(_, a)| a).collect(),
        })
    }
}

impl StartState {
    /// Segments at the start as a snapshot lists them: the cudaMalloc'd ones
    /// and every mapped range of an expandable one.
    pub fn segment_count(&self) -> usize {
        self.segments.len()
            + self
                .reservations
                .iter()
                .map(|r| r.ranges.len())
                .sum::<usize>()
    }

    /// The live (allocated) and the reserved bytes at the start, saturating
    /// (sizes are untrusted).
    pub fn bytes(&self) -> (u64, u64) {
        let blocks = self.segments.iter().flat_map(|s| s.blocks.iter()).chain(
            self.reservations
                .iter()
                .flat_map(|r| r.ranges.iter().flat_map(|g| g.blocks.iter())),
        );
        blocks.fold((0u64, 0u64), |(live, reserved), b| {
            (
                if b.allocated {
                    live.saturating_add(b.size)
                } else {
                    live
                },
                reserved.saturating_add(b.size),
            )
        })
    }
}

/// Where a container of live-at-start blocks goes: a start segment, or a
/// mapped range (reservation, range) of an expandable one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Segment(usize),
    Range(usize, usize),
}

pub(super) fn is_small_pool(s: &Segment) -> bool {
    s.segment_type == crate::snapshot::model::PoolKind::Small
}

fn free_block(size: u64) -> SeedBlock {
    SeedBlock {
        size,
        requested_size: 0,
        allocated: false,
    }
}
