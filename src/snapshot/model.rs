//! The snapshot model over the decoded pickle: segments, blocks and trace
//! entries with typed fields; frames stay arena ids (never expanded per block).
//!
//! Accepts the dict written by `_dump_snapshot()` / `pickle.dump(_snapshot())`
//! and the pickled list `memory_snapshot()` returns; old schemas (no frames,
//! no `is_expandable`, legacy `history` on blocks) and new ones (extra keys are
//! ignored) alike (allocator.md §9).

use super::grow::Prefault;
use super::pickle::{Pickle, V};
use std::ops::Range;
use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{path}: {problem}")]
pub struct ModelError {
    pub path: String,
    pub problem: String,
}

/// Why a snapshot model could not be built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BuildError {
    /// A field is missing or of the wrong type.
    Model(ModelError),
    /// The segments list this many blocks in all, over the limit (a block
    /// list shared by several segments counts once per segment).
    Blocks(u64),
    /// The system refused this many bytes for the model.
    Memory(usize),
}

impl From<ModelError> for BuildError {
    fn from(e: ModelError) -> Self {
        BuildError::Model(e)
    }
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

/// A block's state (`active_pending_free`: freed by the user but still in use by
/// a stream; the docstring's `active_awaiting_free` is accepted too when reading).
pub use crate::allocator::BlockState;

/// The frames list of a block, segment or trace entry: its arena id
/// ([`Frames::NONE`] when not recorded). Equal ids are the same recorded list;
/// an id that is not a list reads as no frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Frames(pub u32);

impl Frames {
    pub const NONE: Frames = Frames(u32::MAX);

    /// Not checked here: reading every block's list would cost a cache miss
    /// per block, and [`Snapshot::frame_entries`] checks it anyway.
    fn of(v: V) -> Frames {
        v.id().map_or(Frames::NONE, Frames)
    }
}

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

/// A trace entry's action: the allocator's own `TraceAction`.
pub use crate::allocator::TraceAction as Action;

#[derive(Debug, Clone, PartialEq)]
pub struct TraceEntry {
    pub action: Action,
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
    /// `oom` entries: what cudaMemGetInfo reported free (0 for other actions).
    pub device_free: u64,
    /// µs since the epoch; 0 when not recorded (before about 2.2).
    pub time_us: i64,
    pub frames: Frames,
}

/// A decoded snapshot; borrows strings from the input bytes.
#[derive(Debug, Clone)]
pub struct Snapshot<'a> {
    pub pickle: Pickle<'a>,
    pub form: Form,
    pub segments: Vec<Segment>,
    pub blocks: Vec<Block>,
    /// The trace list of each device allocator, index = device ordinal; its
    /// entries are read on demand ([`Snapshot::trace`]), not kept twice.
    device_traces: Vec<V>,
    pub allocator_settings: Option<V>,
    pub external_annotations: Option<usize>,
}

/// One frame as recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Frame<'s> {
    pub filename: &'s str,
    pub line: i64,
    pub name: &'s str,
}

impl<'a> Snapshot<'a> {
    /// Builds the model over a decoded pickle, expanding at most
    /// `max_blocks` blocks. A pickle stores a shared object once, so a small
    /// file whose segments all share one long block list would expand
    /// quadratically: the blocks are counted before any is built.
    pub fn from_pickle(pickle: Pickle<'a>, max_blocks: u64) -> Result<Snapshot<'a>, BuildError> {
        let root = pickle.root;
        let (form, segs_v, traces_v, settings, annotations) = if pickle.dict(root).is_some() {
            let segs = pickle
                .get(root, "segments")
                .ok_or_else(|| err("snapshot", "no 'segments' key"))?;
            let annotations = pickle
                .get(root, "external_annotations")
                .and_then(|v| pickle.items(v))
                .map(<[V]>::len);
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
            )
            .into());
        };

        let seg_items = pickle
            .items(segs_v)
            .ok_or_else(|| err("segments", "not a list"))?;
        let mut reader = Reader::new();
        let mut total = 0u64;
        for (i, &s) in seg_items.iter().enumerate() {
            let path = || format!("segments[{i}]");
            let listed = reader.seg.value(&pickle, s, &path, SegKey::Blocks)?;
            total = total.saturating_add(
                listed
                    .and_then(|b| pickle.items(b))
                    .map_or(0, |b| b.len() as u64),
            );
        }
        if total > max_blocks {
            return Err(BuildError::Blocks(total));
        }
        let mut segments = Vec::new();
        try_room(&mut segments, seg_items.len())?;
        let mut segments_ahead = Prefault::default();
        let mut blocks = Vec::new();
        try_room(&mut blocks, total as usize)?;
        for (i, &s) in seg_items.iter().enumerate() {
            segments_ahead.ahead(&mut segments, 1);
            segments.push(reader.segment(&pickle, s, i, &mut blocks)?);
        }

        let mut device_traces = Vec::new();
        if let Some(tv) = traces_v.filter(|v| *v != V::NONE) {
            let per_device = pickle
                .items(tv)
                .ok_or_else(|| err("device_traces", "not a list"))?;
            for (d, &list) in per_device.iter().enumerate() {
                pickle
                    .items(list)
                    .ok_or_else(|| err(format!("device_traces[{d}]"), "not a list"))?;
                device_traces.push(list);
            }
        }

        Ok(Snapshot {
            pickle,
            form,
            segments,
            blocks,
            device_traces,
            allocator_settings: settings.filter(|v| *v != V::NONE),
            external_annotations: annotations,
        })
    }

    pub fn blocks_of(&self, seg: &Segment) -> &[Block] {
        self.blocks.get(seg.blocks.clone()).unwrap_or_default()
    }

    /// Devices that have segments or trace entries, ascending.
    pub fn devices(&self) -> Vec<u32> {
        let mut d: Vec<u32> = self.segments.iter().map(|s| s.device).collect();
        for i in 0..self.device_traces.len() {
            if self.trace_len(i as u32) > 0 {
                d.push(u32::try_from(i).unwrap_or(u32::MAX));
            }
        }
        d.sort_unstable();
        d.dedup();
        d
    }

    /// How many `device_traces` lists the snapshot has (one per device allocator).
    pub fn trace_lists(&self) -> usize {
        self.device_traces.len()
    }

    /// Entries in a device's trace.
    pub fn trace_len(&self, device: u32) -> usize {
        self.trace_items(device).len()
    }

    fn trace_items(&self, device: u32) -> &[V] {
        self.device_traces
            .get(device as usize)
            .and_then(|&l| self.pickle.items(l))
            .unwrap_or_default()
    }

    /// Whether device `device`'s trace is the dicts of arena ids `ids`, in order.
    pub(crate) fn trace_is(&self, device: u32, ids: &[u32]) -> bool {
        let items = self.trace_items(device);
        items.len() == ids.len() && items.iter().zip(ids).all(|(v, &id)| v.id() == Some(id))
    }

    /// A device's trace entries, read from the pickle as they are visited.
    pub fn trace(&self, device: u32) -> impl Iterator<Item = Result<TraceEntry, ModelError>> + '_ {
        self.read_trace(device, Reader::trace_entry)
    }

    /// Entry `j` of a device's trace.
    pub fn trace_entry(&self, device: u32, j: usize) -> Option<Result<TraceEntry, ModelError>> {
        let &e = self.trace_items(device).get(j)?;
        Some(Reader::new().trace_entry(&self.pickle, e, device as usize, j))
    }

    /// `read` applied to each of a device's trace entries, with one reader.
    fn read_trace<'s, T>(
        &'s self,
        device: u32,
        mut read: impl FnMut(&mut Reader, &Pickle, V, usize, usize) -> T + 's,
    ) -> impl Iterator<Item = T> + 's {
        let mut reader = Reader::new();
        let p = &self.pickle;
        self.trace_items(device)
            .iter()
            .enumerate()
            .map(move |(j, &e)| read(&mut reader, p, e, device as usize, j))
    }

    /// The frames of a list, skipping entries that are not frame dicts.
    pub fn frames(&self, f: Frames) -> impl Iterator<Item = Frame<'_>> + '_ {
        self.frame_entries(f).map(|(_, frame)| frame)
    }

    /// [`Snapshot::frames`] with each frame dict's arena id (torch shares
    /// frame dicts between stacks, so per-frame work can be cached by id).
    pub fn frame_entries(&self, f: Frames) -> impl Iterator<Item = (u32, Frame<'_>)> + '_ {
        self.frame_list(f)
            .iter()
            .filter_map(move |&fr| Some((fr.id()?, self.frame_at(fr)?)))
    }

    /// The items of a frames list (empty when not recorded or not a list).
    pub fn frame_list(&self, f: Frames) -> &[V] {
        (f != Frames::NONE)
            .then(|| self.pickle.items(V::object(f.0)))
            .flatten()
            .unwrap_or_default()
    }

    /// One frame dict of a frames list; `None` when it is not a dict with a `name`.
    pub fn frame_at(&self, fr: V) -> Option<Frame<'_>> {
        let p = &self.pickle;
        let mut frame = Frame {
            filename: "",
            line: 0,
            name: "",
        };
        let mut named = false;
        for (k, v) in p.dict(fr)?.iter() {
            match p.str(k) {
                Some("filename") => frame.filename = p.str(v).unwrap_or(""),
                Some("line") => frame.line = p.i64(v).unwrap_or(0),
                Some("name") => {
                    frame.name = p.str(v).unwrap_or("");
                    named = true;
                }
                _ => {}
            }
        }
        named.then_some(frame)
    }
}

/// Exactly `n` items of room in an empty vector, or the bytes refused.
fn try_room<T>(v: &mut Vec<T>, n: usize) -> Result<(), BuildError> {
    v.try_reserve_exact(n)
        .map_err(|_| BuildError::Memory(n.saturating_mul(size_of::<T>())))
}

/// Resolves dict keys to known fields. Keys are shared str objects, so each
/// distinct key object is compared as text once and then by arena id; dicts
/// of one key shape share one resolved field list.
struct Keys<K: Copy + 'static> {
    names: &'static [(&'static str, K)],
    seen: Vec<(V, Option<K>)>,
    /// Resolved fields per key shape (identified by the shared key slice),
    /// most recently added first.
    shapes: Vec<(ShapeId, Box<[Option<K>]>)>,
}

/// A key shape: the address and length of the key slice dicts share.
type ShapeId = (*const V, usize);

/// Key shapes remembered per [`Keys`] (torch writes a handful per kind).
const CACHED_SHAPES: usize = 8;

fn resolve<K: Copy>(
    seen: &mut Vec<(V, Option<K>)>,
    names: &[(&'static str, K)],
    p: &Pickle,
    k: V,
) -> Option<K> {
    if let Some(&(_, f)) = seen.iter().find(|(s, _)| *s == k) {
        return f;
    }
    let f = p
        .str(k)
        .and_then(|s| names.iter().find(|(n, _)| *n == s).map(|(_, f)| *f));
    // Keys are few; a hostile file with many distinct key objects only loses the cache.
    if seen.len() < 64 {
        seen.push((k, f));
    }
    f
}

impl<K: Copy + 'static> Keys<K> {
    fn new(names: &'static [(&'static str, K)]) -> Self {
        Keys {
            names,
            seen: Vec::new(),
            shapes: Vec::new(),
        }
    }

    fn field(&mut self, p: &Pickle, k: V) -> Option<K> {
        resolve(&mut self.seen, self.names, p, k)
    }

    /// Calls `f` with each known field of dict `d` and its value, in order;
    /// `path` names the dict in errors.
    fn each(
        &mut self,
        p: &Pickle,
        d: V,
        path: &dyn Fn() -> String,
        mut f: impl FnMut(K, V),
    ) -> Result<(), ModelError> {
        let pairs = p.dict(d).ok_or_else(|| err(path(), "not a dict"))?;
        let Some((keys, values)) = pairs.shaped() else {
            for (k, v) in pairs.iter() {
                if let Some(key) = self.field(p, k) {
                    f(key, v);
                }
            }
            return Ok(());
        };
        for (field, &v) in self.fields(p, keys).iter().zip(values) {
            if let Some(key) = *field {
                f(key, v);
            }
        }
        Ok(())
    }

    /// The value of field `want` in dict `d` (the last, if repeated).
    fn value(
        &mut self,
        p: &Pickle,
        d: V,
        path: &dyn Fn() -> String,
        want: K,
    ) -> Result<Option<V>, ModelError>
    where
        K: PartialEq,
    {
        let pairs = p.dict(d).ok_or_else(|| err(path(), "not a dict"))?;
        Ok(match pairs.shaped() {
            Some((keys, values)) => self
                .fields(p, keys)
                .iter()
                .zip(values)
                .rev()
                .find(|(f, _)| **f == Some(want))
                .map(|(_, &v)| v),
            None => pairs
                .iter()
                .rev()
                .find(|&(k, _)| self.field(p, k) == Some(want))
                .map(|(_, v)| v),
        })
    }

    /// The resolved fields of a key shape.
    fn fields(&mut self, p: &Pickle, keys: &[V]) -> &[Option<K>] {
        let id = (keys.as_ptr(), keys.len());
        let i = match self.shapes.iter().position(|(s, _)| *s == id) {
            Some(i) => i,
            None => {
                let fields = keys.iter().map(|&k| self.field(p, k)).collect();
                self.shapes.truncate(CACHED_SHAPES - 1);
                self.shapes.insert(0, (id, fields));
                0
            }
        };
        self.shapes.get(i).map_or(&[], |(_, f)| f)
    }
}

fn need(v: Option<u64>, key: &str, path: &dyn Fn() -> String) -> Result<u64, ModelError> {
    v.ok_or_else(|| err(path(), format!("missing '{key}' (a non-negative int)")))
}

/// A `cudaStream_t` as recorded: an int (pointer value), 0 for the default stream.
fn stream_of(p: &Pickle, v: V) -> u64 {
    p.u64(v).or_else(|| p.i64(v).map(|i| i as u64)).unwrap_or(0)
}

#[derive(Clone, Copy, PartialEq)]
enum SegKey {
    Address,
    TotalSize,
    Device,
    AllocatedSize,
    ActiveSize,
    RequestedSize,
    Stream,
    SegmentType,
    SegmentPoolId,
    IsExpandable,
    Frames,
    Blocks,
}

const SEG_KEYS: &[(&str, SegKey)] = &[
    ("address", SegKey::Address),
    ("total_size", SegKey::TotalSize),
    ("device", SegKey::Device),
    ("allocated_size", SegKey::AllocatedSize),
    ("active_size", SegKey::ActiveSize),
    ("requested_size", SegKey::RequestedSize),
    ("stream", SegKey::Stream),
    ("segment_type", SegKey::SegmentType),
    ("segment_pool_id", SegKey::SegmentPoolId),
    ("is_expandable", SegKey::IsExpandable),
    ("frames", SegKey::Frames),
    ("blocks", SegKey::Blocks),
];

#[derive(Clone, Copy)]
enum BlockKey {
    Size,
    Address,
    RequestedSize,
    State,
    Frames,
    History,
}

const BLOCK_KEYS: &[(&str, BlockKey)] = &[
    ("size", BlockKey::Size),
    ("address", BlockKey::Address),
    ("requested_size", BlockKey::RequestedSize),
    ("state", BlockKey::State),
    ("frames", BlockKey::Frames),
    ("history", BlockKey::History),
];

const STATES: &[(&str, BlockState)] = &[
    ("active_allocated", BlockState::ActiveAllocated),
    ("active_pending_free", BlockState::ActivePendingFree),
    // The docstring's spelling (allocator.md §9.2).
    ("active_awaiting_free", BlockState::ActivePendingFree),
    ("inactive", BlockState::Inactive),
];

/// Trace entry fields; the discriminant indexes [`Reader::trace_positions`].
#[derive(Clone, Copy, PartialEq)]
enum TraceKey {
    Action,
    Addr,
    Size,
    Stream,
    DeviceFree,
    TimeUs,
    Frames,
}

const TRACE_KEYS: &[(&str, TraceKey)] = &[
    ("action", TraceKey::Action),
    ("addr", TraceKey::Addr),
    ("size", TraceKey::Size),
    ("stream", TraceKey::Stream),
    ("device_free", TraceKey::DeviceFree),
    ("time_us", TraceKey::TimeUs),
    ("frames", TraceKey::Frames),
];

/// Reads trace entries as the decoder builds them ([`super::pickle::Tap`]).
pub(crate) struct TraceReader {
    reader: Reader,
    /// Per key shape ([`Pickle::shape_keys`]), once seen: where a trace
    /// entry's fields sit ([`Reader::trace_positions`]).
    shapes: Vec<Option<Option<[u8; TRACE_KEYS.len()]>>>,
}

impl TraceReader {
    pub(crate) fn new() -> Self {
        TraceReader {
            reader: Reader::new(),
            shapes: Vec::new(),
        }
    }

    /// A dict of key shape `shape` with `values` read as [`Snapshot::trace`]
    /// reads a trace entry, when the shape has an `action` key (torch's
    /// trace entries, not its segments, blocks or frames); `None` otherwise.
    #[inline(always)]
    pub(crate) fn entry(&mut self, p: &Pickle, shape: u32, values: &[V]) -> Option<TraceEntry> {
        let at = match self.shapes.get(shape as usize) {
            Some(&Some(at)) => at?,
            _ => self.resolve(p, shape)?,
        };
        self.reader.read_positions(p, values, &at)
    }

    /// Where shape `shape` puts a trace entry's fields (`None`: a field
    /// sits too far in), remembered.
    #[cold]
    fn resolve(&mut self, p: &Pickle, shape: u32) -> Option<[u8; TRACE_KEYS.len()]> {
        let at = self.reader.trace_positions(p, p.shape_keys(shape));
        let i = shape as usize;
        if self.shapes.len() <= i {
            self.shapes.resize(i + 1, None);
        }
        self.shapes[i] = Some(at);
        at
    }
}

/// The key resolvers of one model build.
struct Reader {
    seg: Keys<SegKey>,
    block: Keys<BlockKey>,
    state: Keys<BlockState>,
    trace: Keys<TraceKey>,
    /// The last trace-entry key shape and [`Reader::trace_positions`] in it.
    trace_at: Option<(ShapeId, [u8; TRACE_KEYS.len()])>,
    action: Keys<Action>,
    blocks_ahead: Prefault,
}

impl Reader {
    fn new() -> Self {
        Reader {
            seg: Keys::new(SEG_KEYS),
            block: Keys::new(BLOCK_KEYS),
            state: Keys::new(STATES),
            trace: Keys::new(TRACE_KEYS),
            trace_at: None,
            action: Keys::new(crate::allocator::TRACE_ACTIONS),
            blocks_ahead: Prefault::default(),
        }
    }

    fn segment(
        &mut self,
        p: &Pickle,
        s: V,
        i: usize,
        blocks: &mut Vec<Block>,
    ) -> Result<Segment, ModelError> {
        let path = || format!("segments[{i}]");
        let (mut address, mut total_size, mut device) = (None, None, 0u32);
        let (mut allocated_size, mut active_size, mut requested_size) = (None, None, None);
        let mut stream = 0;
        let mut segment_type = PoolKind::Large;
        let mut segment_pool_id = None;
        let mut is_expandable = None;
        let mut frames = Frames::NONE;
        let mut blist = None;
        self.seg.each(p, s, &path, |k, v| match k {
            SegKey::Address => address = p.u64(v),
            SegKey::TotalSize => total_size = p.u64(v),
            SegKey::Device => device = p.u64(v).and_then(|d| u32::try_from(d).ok()).unwrap_or(0),
            SegKey::AllocatedSize => allocated_size = p.u64(v),
            SegKey::ActiveSize => active_size = p.u64(v),
            SegKey::RequestedSize => requested_size = p.u64(v),
            SegKey::Stream => stream = stream_of(p, v),
            SegKey::SegmentType => {
                if p.str(v) == Some("small") {
                    segment_type = PoolKind::Small;
                }
            }
            SegKey::SegmentPoolId => {
                segment_pool_id = p
                    .items(v)
                    .and_then(|t| Some((p.i64(*t.first()?)?, p.i64(*t.get(1)?)?)))
            }
            SegKey::IsExpandable => is_expandable = p.bool(v),
            SegKey::Frames => frames = Frames::of(v),
            SegKey::Blocks => blist = p.items(v),
        })?;
        let address = need(address, "address", &path)?;
        let total_size = need(total_size, "total_size", &path)?;
        let blist = blist.ok_or_else(|| err(path(), "missing 'blocks' list"))?;
        let start = blocks.len();
        let mut offset = 0u64;
        for (j, &b) in blist.iter().enumerate() {
            let block = self.block(p, b, (i, j), address.saturating_add(offset))?;
            offset = offset.saturating_add(block.size);
            self.blocks_ahead.ahead(blocks, 1);
            blocks.push(block);
        }
        let seg_blocks = blocks.get(start..).unwrap_or_default();
        // Old dumps may lack the aggregates; they are sums over the blocks (§9.2).
        let sum = |f: &dyn Fn(&Block) -> bool| {
            seg_blocks
                .iter()
                .filter(|b| f(b))
                .map(|b| b.size)
                .fold(0, u64::saturating_add)
        };
        Ok(Segment {
            device,
            address,
            total_size,
            allocated_size: allocated_size
                .unwrap_or_else(|| sum(&|b| b.state == BlockState::ActiveAllocated)),
            active_size: active_size.unwrap_or_else(|| sum(&|b| b.state != BlockState::Inactive)),
            requested_size,
            stream,
            segment_type,
            segment_pool_id,
            is_expandable,
            frames,
            blocks: start..blocks.len(),
        })
    }

    /// Block `j` of segment `i`; `at` is its address by position (old schemas
    /// record none).
    fn block(
        &mut self,
        p: &Pickle,
        b: V,
        (i, j): (usize, usize),
        at: u64,
    ) -> Result<Block, ModelError> {
        let path = || format!("segments[{i}].blocks[{j}]");
        let (mut size, mut state, mut address, mut requested) = (None, None, None, None);
        let (mut frames, mut has_frames, mut history, mut state_v) =
            (Frames::NONE, false, None, None);
        self.block.each(p, b, &path, |k, v| match k {
            BlockKey::Size => size = p.u64(v),
            BlockKey::Address => address = p.u64(v),
            BlockKey::RequestedSize => requested = p.u64(v),
            BlockKey::State => state_v = Some(v),
            BlockKey::Frames => {
                has_frames = true;
                frames = Frames::of(v);
            }
            BlockKey::History => history = p.items(v).and_then(|h| h.first().copied()),
        })?;
        if let Some(v) = state_v {
            state = Some(self.state.field(p, v).ok_or_else(|| {
                err(
                    path(),
                    format!("unknown state '{}'", p.str(v).unwrap_or("?")),
                )
            })?);
        }
        let size = need(size, "size", &path)?;
        let state = state.ok_or_else(|| err(path(), "missing 'state'"))?;
        // _memory_viz._block_extra: frames and requested size, from history[0] in
        // the legacy schema (no 'frames' key on blocks).
        let requested_size = match history.filter(|_| !has_frames) {
            Some(h) => {
                frames = p.get(h, "frames").map_or(Frames::NONE, Frames::of);
                p.get(h, "real_size").and_then(|v| p.u64(v)).unwrap_or(size)
            }
            None => requested.unwrap_or(size),
        };
        Ok(Block {
            address: address.unwrap_or(at),
            size,
            requested_size,
            state,
            frames,
        })
    }

    fn trace_entry(
        &mut self,
        p: &Pickle,
        e: V,
        d: usize,
        j: usize,
    ) -> Result<TraceEntry, ModelError> {
        let path = || trace_path(d, j);
        let mut t = TraceEntry {
            action: Action::Other,
            addr: 0,
            size: 0,
            stream: 0,
            device_free: 0,
            time_us: 0,
            frames: Frames::NONE,
        };
        // Entries share one key shape: its field positions are resolved once
        // and each entry is read by position (millions of entries).
        let shaped = p.dict(e).and_then(|pairs| pairs.shaped());
        let at = shaped.and_then(|(keys, _)| self.trace_positions(p, keys));
        if let (Some((_, values)), Some(at)) = (shaped, at) {
            return self
                .read_positions(p, values, &at)
                .ok_or_else(|| err(path(), MISSING_ACTION));
        }
        let mut action = None;
        self.trace.each(p, e, &path, |k, v| match k {
            TraceKey::Action => action = Some(v),
            TraceKey::Addr => t.addr = p.u64(v).unwrap_or(0),
            TraceKey::Size => t.size = p.u64(v).unwrap_or(0),
            TraceKey::Stream => t.stream = stream_of(p, v),
            TraceKey::DeviceFree => t.device_free = p.u64(v).unwrap_or(0),
            TraceKey::TimeUs => t.time_us = p.i64(v).unwrap_or(0),
            TraceKey::Frames => t.frames = Frames::of(v),
        })?;
        let action = action.ok_or_else(|| err(path(), MISSING_ACTION))?;
        t.action = self.action(p, action);
        Ok(t)
    }

    /// A trace entry read by position from the values of a dict whose key
    /// shape puts its fields at `at` ([`Reader::trace_positions`]; an
    /// absent field, `u8::MAX`, reads as its default); `None` without an
    /// `action`.
    #[inline(always)]
    fn read_positions(
        &mut self,
        p: &Pickle,
        values: &[V],
        at: &[u8; TRACE_KEYS.len()],
    ) -> Option<TraceEntry> {
        let get = |k: TraceKey| match at[k as usize] {
            u8::MAX => None,
            i => values.get(usize::from(i)).copied(),
        };
        let num = |k: TraceKey| get(k).and_then(|v| p.u64(v)).unwrap_or(0);
        Some(TraceEntry {
            action: self.action(p, get(TraceKey::Action)?),
            addr: num(TraceKey::Addr),
            size: num(TraceKey::Size),
            stream: get(TraceKey::Stream).map_or(0, |v| stream_of(p, v)),
            device_free: num(TraceKey::DeviceFree),
            time_us: get(TraceKey::TimeUs).and_then(|v| p.i64(v)).unwrap_or(0),
            frames: get(TraceKey::Frames).map_or(Frames::NONE, Frames::of),
        })
    }

    /// The position of each [`TraceKey`] (by discriminant) in trace-entry
    /// key shape `keys` (`u8::MAX`: absent); `None` when a field sits beyond
    /// position 254 (then the entry is read field by field).
    fn trace_positions(&mut self, p: &Pickle, keys: &[V]) -> Option<[u8; TRACE_KEYS.len()]> {
        let id = (keys.as_ptr(), keys.len());
        if let Some((shape, at)) = self.trace_at
            && shape == id
        {
            return Some(at);
        }
        let mut at = [u8::MAX; TRACE_KEYS.len()];
        for (pos, field) in self.trace.fields(p, keys).iter().enumerate() {
            if let Some(slot) = field.and_then(|k| at.get_mut(k as usize)) {
                *slot = u8::try_from(pos).ok().filter(|&b| b < u8::MAX)?;
            }
        }
        self.trace_at = Some((id, at));
        Some(at)
    }

    /// A trace entry's action from its `action` value (unknown names read as
    /// [`Action::Other`]).
    fn action(&mut self, p: &Pickle, action: V) -> Action {
        self.action.field(p, action).unwrap_or(Action::Other)
    }
}

/// The error of a trace entry without an `action`.
const MISSING_ACTION: &str = "missing 'action'";

/// Where trace entry `j` of device `d` sits, for errors.
fn trace_path(d: usize, j: usize) -> String {
    format!("device_traces[{d}][{j}]")
}
