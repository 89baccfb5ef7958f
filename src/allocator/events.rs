//! The allocator's trace entries (`TraceEntry` of CUDACachingAllocator.h): what
//! `_record_memory_history` records, used to compare our choices with a recorded trace.

/// `TraceEntry::Action`: what the native allocator records, plus what other
/// recordings carry (`snapshot`, `annotate`) and `Other` for an unknown name.
/// The snapshot model reads `device_traces` into the same enum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TraceAction {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Snapshot,
    Oom,
    Annotate,
    Other,
}

/// Each action's name in a snapshot's `device_traces` (`Other` has none).
pub const TRACE_ACTIONS: &[(&str, TraceAction)] = &[
    ("alloc", TraceAction::Alloc),
    ("free_requested", TraceAction::FreeRequested),
    ("free_completed", TraceAction::FreeCompleted),
    ("segment_alloc", TraceAction::SegmentAlloc),
    ("segment_free", TraceAction::SegmentFree),
    ("segment_map", TraceAction::SegmentMap),
    ("segment_unmap", TraceAction::SegmentUnmap),
    ("snapshot", TraceAction::Snapshot),
    ("oom", TraceAction::Oom),
    ("annotate", TraceAction::Annotate),
];

impl TraceAction {
    /// The name `device_traces` entries carry (`other` for an unknown action).
    pub fn as_str(self) -> &'static str {
        TRACE_ACTIONS
            .iter()
            .find(|(_, a)| *a == self)
            .map_or("other", |(name, _)| name)
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
