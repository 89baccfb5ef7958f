//! Runs of `segment_free`/`segment_unmap`, told apart as `empty_cache()` calls or
//! `malloc`'s own releases.

use super::{TraceScan, signed, top_site};
use crate::allocator::sizes::{SMALL_SIZE, max_non_split_rounding_size};
use crate::snapshot::model::{Action, Frames, Snapshot};
use std::collections::HashMap;

/// A run of `segment_free`/`segment_unmap` entries, and what came next.
pub(super) struct Burst {
    pub(super) segments: u64,
    pub(super) bytes: u64,
    /// Its stack names `empty_cache` (recorded at `context="all"`).
    pub(super) named: bool,
    pub(super) frames: Frames,
    /// Reserved bytes (relative to the trace start) before the run.
    pub(super) reserved_before: i64,
    /// The alloc index it happened at.
    pub(super) at: u32,
    /// The entry after the run: action, size, frames.
    pub(super) next: Option<(Action, u64, Frames)>,
    /// A block it released would have served the request that followed.
    pub(super) served_next: bool,
}

impl Burst {
    /// Whether `malloc` released these itself (`release_cached_blocks` after a
    /// failed cudaMalloc, garbage collection, oversize blocks) rather than an
    /// `empty_cache()` call; `reserved_max` is the trace's highest reserved
    /// figure, `gc` whether garbage collection was on.
    fn by_malloc(&self, reserved_max: i64, gc: bool) -> bool {
        if self.named {
            return false;
        }
        match self.next {
            Some((Action::Oom, _, _)) => !self.served_next,
            Some((Action::SegmentAlloc | Action::SegmentMap, size, frames)) => {
                // malloc passes its own context to release_cached_blocks, so
                // its releases carry the stack of the segment_alloc that follows.
                if frames != Frames::NONE && self.frames != Frames::NONE {
                    return frames == self.frames;
                }
                // Without stacks: malloc releases only what get_free_block
                // could not use, and its retry follows a failed cudaMalloc, so
                // the card had no room for this segment on top of what was reserved.
                !self.served_next
                    && self.reserved_before.saturating_add(signed(size)) > reserved_max
                    || gc
            }
            _ => false,
        }
    }
}

impl<'s, 'a> TraceScan<'s, 'a> {
    /// Marks the last run if `get_free_block` would have served a request of
    /// `size` (rounded) bytes on `stream` from a block it released: the
    /// smallest cached block of the pool and stream at least that large,
    /// refused only when oversize (`CUDACachingAllocator.cpp`, `get_free_block`).
    pub(super) fn served(&mut self, size: u64, stream: u64) {
        let small = size <= SMALL_SIZE;
        let max_split = self.settings.max_split_size;
        let tolerance = max_non_split_rounding_size(&self.settings);
        let fits = |&(block, s, pool_small): &(u64, u64, bool)| {
            s == stream
                && pool_small == small
                && block >= size
                && !(size < max_split && block >= max_split)
                && !(size >= max_split && block >= size.saturating_add(tolerance))
        };
        if self.released.iter().any(fits)
            && let Some(b) = self.bursts.last_mut()
        {
            b.served_next = true;
        }
    }

    /// Sorts the runs of releases into `empty_cache()` calls and malloc's own.
    pub(super) fn releases(&mut self) -> Vec<u32> {
        let gc = self.settings.garbage_collection_threshold > 0.0;
        let mut calls = Vec::new();
        let mut sites: HashMap<Frames, (u64, u64)> = HashMap::new();
        for b in &self.bursts {
            let r = if b.by_malloc(self.reserved_max, gc) {
                &mut self.m.allocator_releases
            } else {
                calls.push(b.at);
                if b.named {
                    let site = sites.entry(b.frames).or_default();
                    *site = (site.0 + 1, site.1 + 1);
                }
                &mut self.m.empty_cache
            };
            r.calls += 1;
            r.segments += b.segments;
            r.bytes = r.bytes.saturating_add(b.bytes);
        }
        self.m.empty_cache_site = top_site(self.snap, &sites);
        calls
    }
}

/// Whether a stack passes through `empty_cache()` (Python) or `emptyCache` (C++).
pub(super) fn names_empty_cache(snap: &Snapshot, f: Frames) -> bool {
    snap.frames(f)
        .any(|fr| fr.name == "empty_cache" || fr.name.contains("emptyCache"))
}
