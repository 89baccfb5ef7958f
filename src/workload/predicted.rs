//! The trace `fit` predicts at a size: a fresh process running one
//! recording's timeline (shared/series/README.md, "fresh process"): the
//! memory live before the trace began allocated first, in address order,
//! then every allocation and free of the trace in order, each allocation at
//! the size given for it. Segment events are not replayed: the allocator
//! makes its own.

use super::trace::{Event, Trace};
use crate::snapshot::fit::{Recording, Step};

/// Where an event of a predicted trace comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Pre-trace allocation `j` of the recording.
    Pre(u32),
    /// Step `k` of the recording's timeline.
    Step(u32),
}

/// The fresh run of `rec` with allocation `i` at `allocs[i]` bytes and
/// pre-trace allocation `j` at `pre[j]` bytes.
pub fn fresh_trace(rec: &Recording, allocs: &[u64], pre: &[u64]) -> Trace {
    let p = u32::try_from(rec.pre.len()).unwrap_or(u32::MAX);
    let mut events = Vec::with_capacity(rec.pre.len() + rec.timeline.len());
    events.extend(pre.iter().zip(0u32..).map(|(&size, id)| Event::Alloc {
        id,
        size,
        stream: 0,
    }));
    for s in &rec.timeline {
        events.push(match *s {
            Step::Alloc(i) => Event::Alloc {
                id: p + i,
                size: allocs.get(i as usize).copied().unwrap_or(0),
                stream: rec.allocs.get(i as usize).map_or(0, |a| a.stream),
            },
            Step::Free(i) => Event::Free { id: p + i },
            Step::PreFree(j) => Event::Free { id: j },
        });
    }
    // A recording's timeline frees only what it allocated, once.
    Trace::from_events(events).unwrap_or_default()
}

/// What event `index` of [`fresh_trace`]'s trace is.
pub fn origin(rec: &Recording, index: u64) -> Origin {
    let p = rec.pre.len() as u64;
    if index < p {
        Origin::Pre(index as u32)
    } else {
        Origin::Step(u32::try_from(index - p).unwrap_or(u32::MAX))
    }
}
