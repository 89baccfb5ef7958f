//! Snapshots written by hand, as the fit, forecast and grid tests make
//! them: blocks live before the trace (the weights, in one segment), then a
//! trace of allocations and frees at chosen addresses, each allocation with
//! its stack.

use allocdoc::snapshot::writer::{
    self, Action, Block, BlockState, Frame, Segment, Stack, TraceEntry,
};

#[derive(Default)]
pub struct Written {
    trace: Vec<TraceEntry>,
    stacks: Vec<Stack>,
}

impl Written {
    /// A trace entry of any action (an OOM, a free requested).
    pub fn entry(&mut self, action: Action, addr: u64, size: u64) -> usize {
        self.trace.push(TraceEntry {
            action,
            addr,
            size,
            stream: 0,
            time_us: self.trace.len() as i64,
        });
        self.trace.len() - 1
    }

    /// An allocation of `size` at `addr`, made under `frames` (innermost first).
    pub fn alloc(&mut self, addr: u64, size: u64, frames: Vec<Frame>) {
        let e = self.entry(Action::Alloc, addr, size);
        self.stacks.push(Stack {
            device: 0,
            entries: vec![e],
            frames,
        });
    }

    /// The free of the block of `size` at `addr`.
    pub fn free(&mut self, addr: u64, size: u64) {
        self.entry(Action::FreeCompleted, addr, size);
    }

    /// The snapshot, with `weights` live before the trace in one segment at
    /// `at` (none without).
    pub fn snapshot(self, at: u64, weights: &[u64]) -> Vec<u8> {
        let segments = weights.iter().take(1).map(|_| Segment {
            device: 0,
            address: at,
            stream: 0,
            is_large: true,
            pool_id: (0, 0),
            is_expandable: false,
            blocks: weights
                .iter()
                .map(|&b| Block {
                    size: b,
                    requested_size: b,
                    state: BlockState::ActiveAllocated,
                })
                .collect(),
        });
        writer::to_bytes(&writer::Snapshot {
            segments: segments.collect(),
            device_traces: vec![self.trace],
            stacks: self.stacks,
            ..writer::Snapshot::default()
        })
    }
}
