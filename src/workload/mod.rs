//! Workloads the allocator replays: trace CSV, RMM logs, snapshot traces, probes.

pub(crate) mod csv;
pub mod predicted;
pub mod probe;
pub mod replay;
pub mod rmm;
pub mod run;
pub mod snapshot_trace;
pub mod trace;

pub use replay::{
    Fork, OomEvent, ReplayOptions, RunFigures, RunResult, StreamedReplay, TimelinePoint, replay,
    replay_with,
};
pub use trace::{Event, Trace};

/// The trace in `data` if it is one (a trace CSV), `None` if it is something else.
pub fn detect_trace(name: &str, data: &[u8]) -> Result<Option<Trace>, crate::Error> {
    if trace::is_trace_csv(data) {
        Trace::parse(name, data).map(Some)
    } else {
        Ok(None)
    }
}
