//! The snapshot model over the decoded pickle: segments, blocks and trace
//! entries with typed fields; frames stay arena ids (never expanded per block).
//!
//! Accepts the dict written by `_dump_snapshot()` / `pickle.dump(_snapshot())`
//! and the pickled list `memory_snapshot()` returns; old schemas (no frames,
//! no `is_expandable`, legacy `history` on blocks) and new ones (extra keys are
//! ignored) alike (allocator.md §9).

use super::pickle::{Pickle, Value};
use std::ops::Range;
use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{path}: {problem}")]
pub struct ModelError {
    pub path: String,
    pub problem: String,
}

fn err(path: impl Into<String>, problem: impl Into<String>) -> ModelError {
    ModelError {
        path: path.into(),
        problem: problem.into(),
    }
}

/// Which top-level shape the file had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// `{"segments": ..., "device_traces": ...}` (`_snapshot()`).
    Dict,
    /// A bare list of segments (`memory_snapshot()`).
    SegmentList,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PoolKind {
    Large,
    Small,
}

impl PoolKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PoolKind::Large => "large",
            PoolKind::Small => "small",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockState {
    ActiveAllocated,
    /// Freed by the user but still in use by a stream (`active_pending_free`;
    /// the docstring's `active_awaiting_free` is accepted too).
    ActivePendingFree,
    Inactive,
}

/// The frames list of a block, segment or trace entry, as an arena value.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Frames(pub Option<Value>);

#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    pub device: u32,
    pub address: u64,
    pub total_size: u64,
    pub allocated_size: u64,
    pub active_size: u64,
    /// Absent in the oldest schemas.
    pub requested_size: Option<u64>,
    pub stream: u64,
    pub segment_type: PoolKind,
    /// `(0, 0)` is the default pools; anything else a private pool (CUDA graphs, MemPool).
    pub segment_pool_id: Option<(i64, i64)>,
    pub is_expandable: Option<bool>,
    pub frames: Frames,
    /// Index range into [`Snapshot::blocks`].
    pub blocks: Range<usize>,
}

impl Segment {
    pub fn is_private_pool(&self) -> bool {
        self.segment_pool_id.is_some_and(|p| p != (0, 0))
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Block {
    pub address: u64,
    pub size: u64,
    /// What `_memory_viz._block_extra` takes as the allocated size: the
    /// block's `requested_size`, or `history[0].real_size` in the legacy schema.
    pub requested_size: u64,
    pub state: BlockState,
    pub frames: Frames,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
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

impl Action {
    fn parse(s: &str) -> Action {
        match s {
            "alloc" => Action::Alloc,
            "free_requested" => Action::FreeRequested,
            "free_completed" => Action::FreeCompleted,
            "segment_alloc" => Action::SegmentAlloc,
            "segment_free" => Action::SegmentFree,
            "segment_map" => Action::SegmentMap,
            "segment_unmap" => Action::SegmentUnmap,
            "snapshot" => Action::Snapshot,
            "oom" => Action::Oom,
            "annotate" => Action::Annotate,
            _ => Action::Other,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct TraceEntry {
    pub action: Action,
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
    /// `oom` entries only: what cudaMemGetInfo reported free.
    pub device_free: Option<u64>,
    pub time_us: Option<i64>,
    pub frames: Frames,
}

/// A decoded snapshot; borrows strings from the input bytes.
#[derive(Debug, Clone)]
pub struct Snapshot<'a> {
    pub pickle: Pickle<'a>,
    pub form: Form,
    pub segments: Vec<Segment>,
    pub blocks: Vec<Block>,
    /// One list per device allocator, index = device ordinal.
    pub device_traces: Vec<Vec<TraceEntry>>,
    pub allocator_settings: Option<Value>,
    pub external_annotations: Option<usize>,
}

/// One frame as recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'s> {
    pub filename: &'s str,
    pub line: i64,
    pub name: &'s str,
}

impl<'a> Snapshot<'a> {
    /// Builds the model over a decoded pickle.
    pub fn from_pickle(pickle: Pickle<'a>) -> Result<Snapshot<'a>, ModelError> {
        let root = pickle.root;
        let (form, segs_v, traces_v, settings, annotations) = if pickle.dict(root).is_some() {
            let segs = pickle
                .get(root, "segments")
                .ok_or_else(|| err("snapshot", "no 'segments' key"))?;
            let annotations = pickle
                .get(root, "external_annotations")
                .and_then(|v| pickle.items(v))
                .map(<[Value]>::len);
            (
                Form::Dict,
                segs,
                pickle.get(root, "device_traces"),
                pickle.get(root, "allocator_settings"),
                annotations,
            )
        } else if pickle.items(root).is_some() {
            (Form::SegmentList, root, None, None, None)
        } else {
            return Err(err(
                "snapshot",
                "the pickle holds neither a snapshot dict nor a list of segments",
            ));
        };

        let seg_items = pickle
            .items(segs_v)
            .ok_or_else(|| err("segments", "not a list"))?;
        let mut segments = Vec::with_capacity(seg_items.len());
        let mut blocks = Vec::new();
        for (i, &s) in seg_items.iter().enumerate() {
            segments.push(read_segment(&pickle, s, i, &mut blocks)?);
        }

        let mut device_traces = Vec::new();
        if let Some(tv) = traces_v.filter(|v| *v != Value::None) {
            let per_device = pickle
                .items(tv)
                .ok_or_else(|| err("device_traces", "not a list"))?;
            for (d, &list) in per_device.iter().enumerate() {
                let entries = pickle
                    .items(list)
                    .ok_or_else(|| err(format!("device_traces[{d}]"), "not a list"))?;
                let mut out = Vec::with_capacity(entries.len());
                for (j, &e) in entries.iter().enumerate() {
                    out.push(read_trace_entry(&pickle, e, d, j)?);
                }
                device_traces.push(out);
            }
        }

        Ok(Snapshot {
            pickle,
            form,
            segments,
            blocks,
            device_traces,
            allocator_settings: settings.filter(|v| *v != Value::None),
            external_annotations: annotations,
        })
    }

    pub fn blocks_of(&self, seg: &Segment) -> &[Block] {
        self.blocks.get(seg.blocks.clone()).unwrap_or_default()
    }

    /// Devices that have segments or trace entries, ascending.
    pub fn devices(&self) -> Vec<u32> {
        let mut d: Vec<u32> = self.segments.iter().map(|s| s.device).collect();
        for (i, t) in self.device_traces.iter().enumerate() {
            if !t.is_empty() {
                d.push(u32::try_from(i).unwrap_or(u32::MAX));
            }
        }
        d.sort_unstable();
        d.dedup();
        d
    }

    pub fn trace(&self, device: u32) -> &[TraceEntry] {
        self.device_traces
            .get(device as usize)
            .map(Vec::as_slice)
            .unwrap_or_default()
    }

    /// The frames of a list, skipping entries that are not frame dicts.
    pub fn frames(&self, f: Frames) -> impl Iterator<Item = Frame<'_>> + '_ {
        let items = f.0.and_then(|v| self.pickle.items(v)).unwrap_or_default();
        items.iter().filter_map(|&fr| {
            let p = &self.pickle;
            Some(Frame {
                filename: p.get(fr, "filename").and_then(|v| p.str(v)).unwrap_or(""),
                line: p.get(fr, "line").and_then(Pickle::i64).unwrap_or(0),
                name: p.get(fr, "name").and_then(|v| p.str(v))?,
            })
        })
    }

    /// The arena id of a frames list (equal ids = the same recorded stack).
    pub fn frames_id(f: Frames) -> Option<u32> {
        match f.0 {
            Some(Value::Ref(r)) => Some(r),
            _ => None,
        }
    }
}

fn req_u64(p: &Pickle, d: Value, key: &str, path: &dyn Fn() -> String) -> Result<u64, ModelError> {
    let v = p
        .get(d, key)
        .ok_or_else(|| err(path(), format!("missing '{key}'")))?;
    Pickle::u64(v).ok_or_else(|| err(path(), format!("'{key}' is not a non-negative int")))
}

fn opt_u64(p: &Pickle, d: Value, key: &str) -> Option<u64> {
    p.get(d, key).and_then(Pickle::u64)
}

/// A `cudaStream_t` as recorded: an int (pointer value), 0 for the default stream.
fn stream_of(p: &Pickle, d: Value) -> u64 {
    p.get(d, "stream")
        .and_then(|v| Pickle::u64(v).or_else(|| Pickle::i64(v).map(|i| i as u64)))
        .unwrap_or(0)
}

fn frames_of(p: &Pickle, d: Value, key: &str) -> Frames {
    Frames(p.get(d, key).filter(|v| p.items(*v).is_some()))
}

fn read_segment(
    p: &Pickle,
    s: Value,
    i: usize,
    blocks: &mut Vec<Block>,
) -> Result<Segment, ModelError> {
    let path = || format!("segments[{i}]");
    if p.dict(s).is_none() {
        return Err(err(path(), "not a dict"));
    }
    let address = req_u64(p, s, "address", &path)?;
    let total_size = req_u64(p, s, "total_size", &path)?;
    let device = p
        .get(s, "device")
        .and_then(Pickle::u64)
        .and_then(|d| u32::try_from(d).ok())
        .unwrap_or(0);
    let segment_type = match p.get(s, "segment_type").and_then(|v| p.str(v)) {
        Some("small") => PoolKind::Small,
        _ => PoolKind::Large,
    };
    let segment_pool_id = p.get(s, "segment_pool_id").and_then(|v| {
        let t = p.items(v)?;
        Some((Pickle::i64(*t.first()?)?, Pickle::i64(*t.get(1)?)?))
    });
    let blist = p
        .get(s, "blocks")
        .and_then(|v| p.items(v))
        .ok_or_else(|| err(path(), "missing 'blocks' list"))?;
    let start = blocks.len();
    let mut offset = 0u64;
    for (j, &b) in blist.iter().enumerate() {
        let bpath = || format!("segments[{i}].blocks[{j}]");
        if p.dict(b).is_none() {
            return Err(err(bpath(), "not a dict"));
        }
        let size = req_u64(p, b, "size", &bpath)?;
        let state = match p.get(b, "state").and_then(|v| p.str(v)) {
            Some("active_allocated") => BlockState::ActiveAllocated,
            Some("active_pending_free" | "active_awaiting_free") => BlockState::ActivePendingFree,
            Some("inactive") => BlockState::Inactive,
            Some(other) => return Err(err(bpath(), format!("unknown state '{other}'"))),
            None => return Err(err(bpath(), "missing 'state'")),
        };
        // _memory_viz._block_extra: frames and requested size, from history[0] in
        // the legacy schema (no 'frames' key on blocks).
        let (requested_size, frames) = if p.get(b, "frames").is_some() {
            (
                opt_u64(p, b, "requested_size").unwrap_or(size),
                frames_of(p, b, "frames"),
            )
        } else {
            let h0 = p
                .get(b, "history")
                .and_then(|h| p.items(h))
                .and_then(|h| h.first().copied());
            match h0 {
                Some(h) => (
                    opt_u64(p, h, "real_size").unwrap_or(size),
                    frames_of(p, h, "frames"),
                ),
                None => (
                    opt_u64(p, b, "requested_size").unwrap_or(size),
                    Frames(None),
                ),
            }
        };
        let block_address =
            opt_u64(p, b, "address").unwrap_or_else(|| address.saturating_add(offset));
        offset = offset.saturating_add(size);
        blocks.push(Block {
            address: block_address,
            size,
            requested_size,
            state,
            frames,
        });
    }
    let seg_blocks = blocks.get(start..).unwrap_or_default();
    // Old dumps may lack the aggregates; they are sums over the blocks (§9.2).
    let sum = |f: &dyn Fn(&Block) -> bool| seg_blocks.iter().filter(|b| f(b)).map(|b| b.size).sum();
    let allocated_size = opt_u64(p, s, "allocated_size")
        .unwrap_or_else(|| sum(&|b| b.state == BlockState::ActiveAllocated));
    let active_size =
        opt_u64(p, s, "active_size").unwrap_or_else(|| sum(&|b| b.state != BlockState::Inactive));
    Ok(Segment {
        device,
        address,
        total_size,
        allocated_size,
        active_size,
        requested_size: opt_u64(p, s, "requested_size"),
        stream: stream_of(p, s),
        segment_type,
        segment_pool_id,
        is_expandable: p.get(s, "is_expandable").and_then(Pickle::bool),
        frames: frames_of(p, s, "frames"),
        blocks: start..blocks.len(),
    })
}

fn read_trace_entry(p: &Pickle, e: Value, d: usize, j: usize) -> Result<TraceEntry, ModelError> {
    let path = || format!("device_traces[{d}][{j}]");
    if p.dict(e).is_none() {
        return Err(err(path(), "not a dict"));
    }
    let action = p
        .get(e, "action")
        .and_then(|v| p.str(v))
        .map(Action::parse)
        .ok_or_else(|| err(path(), "missing 'action'"))?;
    Ok(TraceEntry {
        action,
        addr: opt_u64(p, e, "addr").unwrap_or(0),
        size: opt_u64(p, e, "size").unwrap_or(0),
        stream: stream_of(p, e),
        device_free: opt_u64(p, e, "device_free"),
        time_us: p.get(e, "time_us").and_then(Pickle::i64),
        frames: frames_of(p, e, "frames"),
    })
}
