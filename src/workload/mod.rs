//! Workloads the allocator replays: trace CSV, RMM logs, snapshot traces, probes.
pub mod probe;
