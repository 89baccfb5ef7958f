//! The trace `fit` predicts at a size: a fresh process running one
//! recording's timeline (shared/series/README.md, "fresh process"): the
//! memory live before the trace began allocated first, in address order,
//! then every allocation and free of the trace in order, each allocation at
//! the size given for it. Segment events are not replayed: the allocator
//! makes its own.

use super::replay::{ReplayOptions, RunResult, StreamedReplay};
use super::trace::Event;
use crate::conf::Settings;
use crate::device::Device;
use crate::snapshot::fit::{Recording, Step};

/// Where an event of a predicted trace comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Pre-trace allocation `j` of the recording.
    Pre(u32),
    /// Step `k` of the recording's timeline.
    Step(u32),
}

/// The fresh run's events of `rec`, with allocation `i` at `allocs[i]`
/// bytes and pre-trace allocation `j` at `pre[j]` bytes, in order.
fn events<'r>(
    rec: &'r Recording,
    allocs: &'r [u64],
    pre: &'r [u64],
) -> impl Iterator<Item = Event> + 'r {
    let p = u32::try_from(rec.pre.len()).unwrap_or(u32::MAX);
    let pre_allocs = pre.iter().zip(0u32..).map(|(&size, id)| Event::Alloc {
        id,
        size,
        stream: 0,
    });
    pre_allocs.chain(rec.timeline.iter().map(move |s| match *s {
        Step::Alloc(i) => Event::Alloc {
            id: p + i,
            size: allocs.get(i as usize).copied().unwrap_or(0),
            stream: rec.allocs.get(i as usize).map_or(0, |a| a.stream),
        },
        Step::Free(i) => Event::Free { id: p + i },
        Step::PreFree(j) => Event::Free { id: j },
    }))
}

/// Events handed to the replay at a time.
const CHUNK: usize = 4096;

/// Replays the fresh run of `rec` on `device`, its events made a chunk at a
/// time as the replay takes them: a run that runs out of memory early costs
/// only its beginning.
pub fn replay_fresh<D: Device>(
    rec: &Recording,
    (allocs, pre): (&[u64], &[u64]),
    settings: &Settings,
    device: D,
) -> RunResult {
    let total = rec.pre.len() + rec.timeline.len();
    let ids = rec.pre.len() + rec.allocs.len();
    let mut replay = StreamedReplay::new(settings, device, ReplayOptions::default(), total, ids);
    let mut chunk = Vec::with_capacity(CHUNK);
    let mut all = events(rec, allocs, pre);
    loop {
        chunk.clear();
        chunk.extend(all.by_ref().take(CHUNK));
        if chunk.is_empty() || !replay.feed(&chunk) {
            break;
        }
    }
    replay.finish(total as u64)
}

/// What event `index` of [`replay_fresh`]'s run is.
pub fn origin(rec: &Recording, index: u64) -> Origin {
    let p = rec.pre.len() as u64;
    if index < p {
        Origin::Pre(index as u32)
    } else {
        Origin::Step(u32::try_from(index - p).unwrap_or(u32::MAX))
    }
}
