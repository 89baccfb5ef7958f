//! The allocator's trace entries (`TraceEntry` of CUDACachingAllocator.h): what
//! `_record_memory_history` records, used to compare our choices with a recorded trace.

/// `TraceEntry::Action` (the ones the native allocator emits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TraceAction {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Oom,
}

impl TraceAction {
    /// The action's name in a snapshot's `device_traces`.
    pub fn as_str(self) -> &'static str {
        match self {
            TraceAction::Alloc => "alloc",
            TraceAction::FreeRequested => "free_requested",
            TraceAction::FreeCompleted => "free_completed",
            TraceAction::SegmentAlloc => "segment_alloc",
            TraceAction::SegmentFree => "segment_free",
            TraceAction::SegmentMap => "segment_map",
            TraceAction::SegmentUnmap => "segment_unmap",
            TraceAction::Oom => "oom",
        }
    }
}

/// One trace entry. `addr` is the device free memory for `Oom`; `size` is the
/// requested size for alloc/free entries, bytes for segment entries and the
/// rounded request for `Oom` (allocator.md §9.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceEntry {
    pub action: TraceAction,
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
}
