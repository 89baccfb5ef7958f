//! Workloads the allocator replays: trace CSV, RMM logs, snapshot traces, probes.

pub mod rmm;
pub mod snapshot_trace;
