//! Stream uses and the frees they defer: `record_stream`, the per-stream events
//! (`cuda_events`) and their completion.

use super::{CachingAllocator, PointerError};
use crate::allocator::block::{BlockId, NIL};
use crate::device::Device;

/// A (block, event ready?) pair of `cuda_events`: a deferred free waiting for a
/// stream's work. Events complete when the caller says the stream caught up
/// ([`CachingAllocator::synchronize_stream`]) or at a full synchronisation.
#[derive(Debug, Clone, Copy)]
pub(super) struct PendingEvent {
    pub(super) block: BlockId,
    pub(super) ready: bool,
}

impl<D: Device> CachingAllocator<D> {
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
    pub(super) fn insert_events(&mut self, id: BlockId) {
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
    pub(super) fn process_events(&mut self) {
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
    pub(super) fn synchronize_and_free_events(&mut self) {
        self.stats.num_sync_all_streams += 1;
        let events = std::mem::take(&mut self.cuda_events);
        for e in events.into_values().flatten() {
            // cudaEventSynchronize
            self.device.synchronize();
            self.event_completed(e.block);
        }
    }
}
