//! What fills the card: which code holds the live memory of a snapshot at
//! its peak, at its OOM, at its end or at a moment asked for, and in which
//! category (parameters, gradients, optimizer state, activations,
//! temporaries); what was live before the trace began; what grows from step
//! to step.
//!
//! An allocation is live from its `alloc` entry to the `free_completed` at
//! its address, as `torch.cuda._memory_viz` and the allocator count active
//! memory (`DeviceCachingAllocator::free_block` records FREE_COMPLETED when a
//! block stops being active; a free waiting for other streams is still
//! active). Its bytes are the entry's `size`, the bytes the tensor asked for
//! (`record_trace(TraceEntry::ALLOC, …, orig_size)`), with the block bytes
//! beside them: the request rounded as `round_size` rounds it under the
//! recorded settings, or the block's own size where the snapshot's segments
//! still hold it. Memory live before the trace's first entry (a ring buffer
//! starts mid-run) is counted from the segments (active blocks that no
//! `alloc` of the trace made) and from frees of allocations the trace never
//! saw allocated; it is its own row, never hidden, never negative.
//!
//! Fed one trace entry at a time by the loop that reads the trace for the
//! evidence ([`Attributor::entry`]), or as the pickle is decoded
//! ([`tapped`]), so a trace is read once; per entry it costs a hash lookup
//! or two. Each frames list is classified once, after the last entry, with
//! a verdict cached per frame dict.
//!
//! The files, by concept: `feed.rs` the attributor's construction and its
//! per-entry pass (`Lives`: the live set, the running total and the peak,
//! none of it reading the snapshot); `frames.rs`
//! what a frame and a stack show (site, rule class, the categories' rules);
//! `finish.rs` what follows the last entry (the end state matched, the
//! categories given, the moments, the notes); `moment.rs` the live set at one
//! moment, grouped and ranked, with the reserved ranges then; `growth.rs` the
//! sites that grow across steps and the category timeline; `passes.rs` how a
//! trace's one read feeds the attribution and a scan, on a second thread for
//! a long trace; `tapped.rs` the trace attributed while the pickle is
//! decoded; `compare.rs` `diff` and the per-rank view.

mod compare;
mod feed;
mod finish;
mod frames;
mod growth;
mod moment;
mod passes;
pub mod tapped;

pub use compare::{diff, median, rank_in_name, ranks};
pub(crate) use feed::Lives;
pub use frames::site_label;
pub(crate) use frames::{GENERATED, PY, frame_flags};
pub(crate) use passes::{Feeding, Passes};

use super::live_map::LiveMap;
use super::model::{Frames, Snapshot};
use super::trace_metrics::{StepScan, index32};
use crate::conf::Settings;
pub use crate::evidence::fills::{
    Attribution, Category, CategoryPart, CategoryRow, Diff, DiffRow, FreeReserved, Grouping,
    Growth, Moment, MomentKind, PreTrace, RankFill, Ranks, Rest, Row, Side, Stacks, Timeline,
};
use frames::{FrameInfo, SiteKey, StackInfo};
use rustc_hash::FxHashMap;

/// A moment asked for besides the peak, the OOM and the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum At {
    /// The state after this trace entry.
    Event(u64),
    /// The state after the last entry recorded at most this many µs after
    /// the first entry that records a time.
    Time(i64),
}

/// What to compute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask {
    pub by: Grouping,
    /// Rows listed before the rest is summed.
    pub top: usize,
    pub at: Option<At>,
    /// Points of the category timeline (0: none).
    pub timeline_points: usize,
    /// Only the moment a diagnosis is about: the OOM, else the peak, else the end.
    pub headline_only: bool,
    /// A device whose trace records no stacks gets each moment grouped by
    /// block size and by segment instead of by code (`by` site, user or stack).
    pub blocks_without_stacks: bool,
}

impl Default for Ask {
    fn default() -> Self {
        Ask {
            by: Grouping::Site,
            top: 5,
            at: None,
            timeline_points: 0,
            headline_only: false,
            blocks_without_stacks: false,
        }
    }
}

/// The row of memory live before the trace began whose blocks carry no stack.
pub const PRE_TRACE_ROW: &str = "<live before the trace began>";
/// Allocations recorded without frames.
pub const NO_STACK_ROW: &str = "<no stack recorded>";
/// Stacks with C++ frames only.
pub const NO_PYTHON_ROW: &str = "<no Python frame>";

/// How to record the stacks this module reads.
pub const RECORD_STACKS: &str = "torch.cuda.memory._record_memory_history(max_entries=100_000) before the work, then torch.cuda.memory._dump_snapshot(\"snapshot.pickle\")";

/// Site ids reserved for the special rows.
const SITE_NO_STACK: u32 = 0;
const SITE_NO_PYTHON: u32 = 1;
const SITE_PRE_TRACE: u32 = 2;
const SPECIAL_SITES: u32 = 3;

/// `born` of an allocation live before the trace; `died` of one never freed.
const PRE: u32 = u32::MAX;
const NEVER: u32 = u32::MAX;

/// One allocation's life.
#[derive(Clone, Copy)]
struct Life {
    addr: u64,
    bytes: u64,
    block: u64,
    /// Live in the states after entry `born` ([`PRE`]: before the trace).
    born: u32,
    /// Not live from the state after entry `died` on ([`NEVER`]: still live).
    died: u32,
    /// Index into [`Attributor::stacks`] (the frames list's arena id
    /// until [`Attributor::settle`]).
    stack: u32,
    category: Category,
}

impl Life {
    /// Live in the state after entry `s` (`-1`: before the first entry).
    fn alive(&self, s: i64) -> bool {
        (self.born == PRE || i64::from(self.born) <= s)
            && (self.died == NEVER || s < i64::from(self.died))
    }

    fn pre_trace(&self) -> bool {
        self.born == PRE
    }
}

/// Feeds on one device's trace entries in order; [`Attributor::finish`]
/// gives the [`Attribution`].
pub struct Attributor<'s, 'a> {
    snap: &'s Snapshot<'a>,
    device: u32,
    settings: Settings,
    ask: Ask,
    frames: FxHashMap<u32, FrameInfo>,
    lists: FxHashMap<u32, u32>,
    stacks: Vec<StackInfo>,
    /// The frames list of each stack (for the stack grouping).
    stack_frames: Vec<Frames>,
    sites: Vec<SiteKey<'s>>,
    site_ids: FxHashMap<SiteKey<'s>, u32>,
    /// The trace as fed.
    fed: Lives,
    settled: bool,
    /// What matching the end state found, for the notes.
    end_notes: Vec<String>,
}

/// Appends `x` unless the system refuses the memory.
fn push<T>(v: &mut Vec<T>, x: T) -> bool {
    if v.len() == v.capacity() && v.try_reserve(v.len().max(64)).is_err() {
        return false;
    }
    v.push(x);
    true
}

fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

fn ratio(a: u64, b: u64) -> f64 {
    (a as f64 / b as f64 * 1e6).round() / 1e6
}

/// Attributes each device of a snapshot (`devices`, or every device that
/// has segments or trace entries), reading each trace once; the steps are
/// the ones `trace_metrics` finds, from the same pass.
pub fn attribute(
    snap: &Snapshot,
    devices: Option<&[u32]>,
    ask: Ask,
) -> Result<Vec<Attribution>, super::model::ModelError> {
    let settings = super::evidence::recorded_settings(snap);
    snap.devices()
        .into_iter()
        .filter(|device| devices.is_none_or(|d| d.contains(device)))
        .map(|device| attribute_device(snap, device, &settings, ask))
        .collect()
}

/// One device's attribution, its trace read from the snapshot.
fn attribute_device(
    snap: &Snapshot,
    device: u32,
    settings: &Settings,
    ask: Ask,
) -> Result<Attribution, super::model::ModelError> {
    let passes = Passes {
        scan: Some(StepScan::new(snap, device)),
        fills: Attributor::new(snap, device, settings.clone(), ask),
    };
    // A long trace is scanned and attributed on a second thread, while
    // this one reads its entries.
    let passes = std::thread::scope(|threads| {
        let mut feeding = Feeding::new(threads, passes, snap.trace_len(device));
        for (i, e) in snap.trace(device).enumerate() {
            feeding.entry(i, &e?);
        }
        feeding.finish(device)
    })?;
    let steps = passes.scan.map(StepScan::finish);
    Ok(passes.fills.finish(&steps.unwrap_or_default()))
}
