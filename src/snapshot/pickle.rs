//! A pickle decoder for data-only pickles (protocols 0–5) that never executes
//! anything.
//!
//! Objects live in an arena ([`Pickle::obj`]) and values refer to them by
//! index, so the memo keeps shared references shared (torch dedupes frame
//! objects: the result must stay a DAG, not be expanded). Values are 8 bytes
//! ([`V`]: small ints, None and bools inline, everything else an arena index);
//! container items live in one pool, so a dict costs no allocation of its own;
//! strings borrow from the input.
//!
//! Anything that would call code (GLOBAL, REDUCE, BUILD, …) makes the input
//! invalid: the error names the opcode, its byte offset and the callable.
//! The decoder is iterative (no recursion), checks every declared length
//! against the remaining input before slicing, and never sizes an allocation
//! from a length read from the input.

use super::grow::{Prefault, reserved};
use std::collections::HashMap;
use thiserror::Error;

/// A compact value: the low 3 bits are a tag; ints in [-2^60, 2^60) are inline,
/// other numbers and every object are arena indices.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct V(u64);

const TAG_REF: u64 = 0;
const TAG_INT: u64 = 1;
const INLINE_INT: std::ops::Range<i64> = -(1 << 60)..(1 << 60);

impl V {
    pub const NONE: V = V(2);
    pub const FALSE: V = V(3);
    pub const TRUE: V = V(4);

    /// The value of arena object `id`.
    #[inline]
    pub fn object(id: u32) -> V {
        V(u64::from(id) << 3 | TAG_REF)
    }
    #[inline]
    fn int(i: i64) -> Option<V> {
        INLINE_INT
            .contains(&i)
            .then_some(V(((i << 3) as u64) | TAG_INT))
    }
    #[inline]
    fn small(u: u32) -> V {
        V((u64::from(u) << 3) | TAG_INT)
    }
    /// The arena index, for objects.
    #[inline]
    pub fn id(self) -> Option<u32> {
        (self.0 & 7 == TAG_REF).then_some((self.0 >> 3) as u32)
    }
}

impl std::fmt::Debug for V {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 & 7 {
            TAG_REF => write!(f, "#{}", self.0 >> 3),
            TAG_INT => write!(f, "{}", (self.0 as i64) >> 3),
            _ => match *self {
                V::NONE => f.write_str("None"),
                V::TRUE => f.write_str("True"),
                _ => f.write_str("False"),
            },
        }
    }
}

/// A value as callers see it, numbers unboxed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    /// An int in [2^63, 2^64): torch writes `MAX_UINT64` this way (pytorch#115234).
    UInt(u64),
    Float(f64),
    /// Any other object: an arena index.
    Ref(u32),
}

/// Which Python container an object is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    List,
    Tuple,
    /// Items are flattened `key, value, key, value, …`.
    Dict,
    Set,
    FrozenSet,
}

/// Where a container's items are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// `len` items at `start` in [`Pickle::pool`].
    Pool,
    /// A vector of its own (`start` indexes [`Pickle::owned`]): it grew in
    /// several batches while other objects were being built.
    Owned,
    /// A dict whose keys are shape `len` ([`Pickle::shapes`]); its values
    /// are at `start` in the pool. Torch's dicts share a handful of key
    /// sequences, so each stores only its values.
    Shaped,
}

/// A container's kind and where its items are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Container {
    pub kind: Kind,
    layout: Layout,
    len: u32,
    start: u64,
}

/// An arena object as callers see it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Obj<'p> {
    Str(&'p str),
    Bytes(&'p [u8]),
    /// An int outside [-2^60, 2^64): little-endian two's complement, wider
    /// than 64 bits.
    BigInt(&'p [u8]),
    Int(i64),
    UInt(u64),
    Float(f64),
    Container(Container),
}

/// An arena slot: 16 bytes (a snapshot holds millions of containers), so
/// text and wide ints live in side tables.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Slot {
    /// Index into [`Pickle::texts`].
    Str(u32),
    /// Index into [`Pickle::bytes`].
    Bytes(u32),
    /// Index into [`Pickle::bigints`].
    BigInt(u32),
    Int(i64),
    UInt(u64),
    Float(f64),
    Container(Container),
}

const _: () = assert!(std::mem::size_of::<Slot>() == 16);
/// Why decoding stopped.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    #[error(
        "byte {offset}: opcode {opcode} would call {callable}; this file holds code, not data, and is refused (nothing was run)"
    )]
    Code {
        offset: usize,
        opcode: &'static str,
        callable: String,
    },
    #[error("byte {offset}: input ends inside {what}")]
    Truncated { offset: usize, what: &'static str },
    #[error("byte {offset}: unknown opcode 0x{opcode:02x}")]
    UnknownOpcode { offset: usize, opcode: u8 },
    #[error("byte {offset}: unsupported pickle protocol {protocol} (0 to 5 are known)")]
    Protocol { offset: usize, protocol: u8 },
    #[error("byte {offset}: {opcode}: {problem}")]
    Malformed {
        offset: usize,
        opcode: &'static str,
        problem: String,
    },
    #[error("byte {offset}: {what} exceeds the decoder's limit of {limit}")]
    Limit {
        offset: usize,
        what: &'static str,
        limit: u64,
    },
    /// The system refused memory the input asked for (never an abort).
    #[error(
        "byte {offset}: not enough memory for the {what} (the system refused {bytes} more bytes)"
    )]
    Memory {
        offset: usize,
        what: &'static str,
        bytes: usize,
    },
}

impl DecodeError {
    /// The byte offset the error refers to.
    pub fn offset(&self) -> usize {
        match self {
            DecodeError::Code { offset, .. }
            | DecodeError::Truncated { offset, .. }
            | DecodeError::UnknownOpcode { offset, .. }
            | DecodeError::Protocol { offset, .. }
            | DecodeError::Malformed { offset, .. }
            | DecodeError::Limit { offset, .. }
            | DecodeError::Memory { offset, .. } => *offset,
        }
    }
}

/// Bounds on what one input may make the decoder hold.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Open MARKs at once (the nesting depth of MARK-built containers).
    pub max_marks: usize,
    /// What the decoder may hold, in values of 8 bytes: what each thing costs
    /// in bytes, so that the limit bounds resident memory: two per arena
    /// object, one per container item and memo entry (five out of order),
    /// stack room, three per string entry and two per byte string or wide
    /// int, plus the bytes of decoded strings and wide ints and of items
    /// copied into a vector of their own.
    pub max_values: u64,
    /// Also hold the values within what an input of its size may decode to
    /// ([`sized_values`]), naming [`SIZED_VALUES`] when it binds.
    pub sized: bool,
}

impl Default for Limits {
    fn default() -> Self {
        // Real snapshots nest about 6 deep and hold roughly one value per
        // 3 input bytes; these bounds leave room for 100 GB inputs.
        Limits {
            max_marks: 1 << 16,
            max_values: 1 << 34,
            sized: true,
        }
    }
}

/// The values an input of `len` bytes may decode to while [`Limits::sized`]:
/// 3/4 of a value (6 bytes) per input byte, and 64 MiB for any input. Torch
/// snapshots decode to 0.24 to 0.58 values per byte (the fixtures, the
/// generated and tiled benchmark snapshots: BENCHMARKS.md, "Opcode floods"),
/// while a flood of one-byte opcodes that each make an object holds 3 (a
/// 16-byte slot and its stack entry), so a 128 MiB flood stops at 832 MiB.
pub fn sized_values(len: usize) -> u64 {
    const FLOOR: u64 = 8 << 20;
    FLOOR.saturating_add((len as u64).saturating_mul(3) / 4)
}

/// What a [`DecodeError::Limit`] on [`sized_values`] names.
pub const SIZED_VALUES: &str = "number of values for an input of this size";

/// A decoded pickle: the arena, the item pool and the root value.
#[derive(Debug, Clone)]
pub struct Pickle<'a> {
    slots: Vec<Slot>,
    /// Strings: borrowed from the input, or decoded (protocol 0 escapes,
    /// invalid UTF-8 made lossy).
    texts: Vec<std::borrow::Cow<'a, str>>,
    bytes: Vec<&'a [u8]>,
    bigints: Vec<Box<[u8]>>,
    /// Items of containers that were built in one go.
    pool: Vec<V>,
    /// Items of containers that grew in several batches between other objects.
    owned: Vec<Vec<V>>,
    /// Key sequences shared by dicts (see [`Layout::Shaped`]).
    shapes: Vec<Box<[V]>>,
    pub root: V,
    /// The protocol named by the PROTO opcode (0 when absent).
    pub protocol: u8,
}

/// What a [`DecodeError::Limit`] on [`Limits::max_values`] names.
pub const VALUES: &str = "number of values";

/// Decodes with the default [`Limits`].
pub fn decode(data: &[u8]) -> Result<Pickle<'_>, DecodeError> {
    decode_with(data, Limits::default())
}

/// Decodes `data` (one pickle; trailing bytes after STOP are ignored, as
/// `pickle.loads` does).
pub fn decode_with(data: &[u8], limits: Limits) -> Result<Pickle<'_>, DecodeError> {
    decoder(data, limits, false).run().map_err(|e| *e)
}

/// Input bytes between calls of a [`Release`] hook.
const RELEASE_STEP: usize = 16 << 20;

/// Told how far the decoder has read (a byte offset, every 16 MiB): the
/// input before it is read again only for the strings the result borrows.
pub type Release<'r> = &'r mut dyn FnMut(usize);

/// [`decode_with`], calling `release` as the input is read.
pub fn decode_releasing<'a>(
    data: &'a [u8],
    limits: Limits,
    release: Release<'_>,
) -> Result<Pickle<'a>, DecodeError> {
    let mut d = decoder(data, limits, false);
    d.release_at = RELEASE_STEP;
    d.run_releasing(Some(release)).map_err(|e| *e)
}

/// Decodes `data` to its STOP, stepping over the opcodes that would call
/// code instead of refusing at the first: protocols 0 and 1 have no header,
/// so only a whole decode tells a pickle from text that starts like one.
/// A pickle that holds code is still an error, [`DecodeError::Code`] for its
/// first such opcode, but only once the input proved to be a pickle.
pub fn decode_whole(data: &[u8], limits: Limits) -> Result<(), DecodeError> {
    decoder(data, limits, true).run().map(drop).map_err(|e| *e)
}

fn decoder(data: &[u8], limits: Limits, defer_code: bool) -> Decoder<'_> {
    // Reserve from the input's actual size (not a declared length): torch
    // snapshots hold up to one pooled value per 3 bytes and one object per
    // 16. Only touched pages count, so an overestimate costs address space,
    // not memory, while an underestimate costs a copy of the whole pool; if
    // the address space is refused, start from a smaller guess and grow.
    let n = data.len();
    let sized = sized_values(n);
    let (max_values, values_what) = if limits.sized && sized < limits.max_values {
        (sized, SIZED_VALUES)
    } else {
        (limits.max_values, VALUES)
    };
    Decoder {
        data,
        pos: 0,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: Memo::default(),
        pool_ahead: Prefault::default(),
        slots_ahead: Prefault::default(),
        p: Pickle {
            slots: reserved(n / 16),
            texts: Vec::new(),
            bytes: Vec::new(),
            bigints: Vec::new(),
            pool: reserved(n / 3),
            owned: Vec::new(),
            shapes: Vec::new(),
            root: V::NONE,
            protocol: 0,
        },
        shape_ids: HashMap::new(),
        last_shape: u32::MAX,
        values: 0,
        limits: Limits {
            max_values,
            ..limits
        },
        values_what,
        defer_code,
        code: None,
        release_at: usize::MAX,
    }
}

/// An index into a side table (texts, bytes, big ints).
fn side_index(len: usize, at: usize) -> Res<u32> {
    u32::try_from(len).map_err(|_| {
        Box::new(DecodeError::Limit {
            offset: at,
            what: "number of strings, byte strings and wide ints",
            limit: u64::from(u32::MAX),
        })
    })
}

/// Errors inside the decoder are boxed: a pointer-sized `Err` keeps every
/// hot `Result` in registers.
type Fail = Box<DecodeError>;
type Res<T> = Result<T, Fail>;

/// Arena objects at most (ids fit in [`V`] and leave [`MEMO_VALUE`] free).
const MAX_OBJECTS: usize = 1 << 29;

/// Marks a dense memo entry as an index into [`Memo::values`] (arena ids
/// stay below 2^29).
const MEMO_VALUE: u32 = 1 << 31;

/// Runs kept before the memo turns dense (a binary search over them takes
/// at most 10 steps).
const MAX_MEMO_RUNS: usize = 1024;

/// The memo. Picklers memoize objects as they create them, so memo index i
/// is nearly always arena object i + k, with k changing only after an
/// object that is not memoized (a float, an empty tuple). Such runs are kept
/// as their first index and first id and read by arithmetic: no memory per
/// entry and no cache miss per BINGET. An entry that breaks the pattern (an
/// overwrite, a memoized int, too many runs) turns the memo dense.
#[derive(Default)]
struct Memo {
    /// Entries `0..len` are stored (in `runs` or `dense`).
    len: u64,
    /// `(first index, first arena id)`, ascending; used while `dense` is empty.
    runs: Vec<(u64, u32)>,
    /// The first [`EARLY`] entries while in runs (emptied when the memo
    /// turns dense), read without a run search: the dict keys, memoized
    /// first, and the frames the first steps share with later ones (grown as
    /// entries come, so a small pickle pays nothing).
    early: Vec<V>,
    /// One entry per index: an arena id, or an index into `values` with
    /// [`MEMO_VALUE`] set.
    dense: Vec<u32>,
    values: Vec<V>,
    /// Indices stored out of order (past `len`), so a huge declared index
    /// cannot size an allocation.
    sparse: HashMap<u64, V>,
}

/// Why the memo could not take an entry.
#[derive(Debug)]
enum MemoFull {
    /// Its table of non-object values is full (the limit).
    Values(u64),
    /// The system refused this many more bytes.
    Memory(usize),
}

/// Memo entries kept in [`Memo::early`] (512 KiB at most). A run search
/// is a chain of dependent loads; on a trace of 1 M entries, the load that
/// ends it drew 18 % of `run_releasing`'s samples (BENCHMARKS.md, "top
/// against Mosaic").
const EARLY: usize = 1 << 16;

impl Memo {
    #[inline(always)]
    fn put(&mut self, idx: u64, v: V) -> Result<(), MemoFull> {
        if idx > self.len {
            self.sparse
                .try_reserve(1)
                .map_err(|_| MemoFull::Memory(size_of::<(u64, V)>()))?;
            self.sparse.insert(idx, v);
            return Ok(());
        }
        if idx == self.len
            && self.dense.is_empty()
            && let Some(id) = v.id()
        {
            let follows = self.runs.last().is_some_and(|&(first, first_id)| {
                u64::from(first_id) + (idx - first) == u64::from(id)
            });
            if !follows {
                if self.runs.len() == MAX_MEMO_RUNS {
                    return self.densify_then_put(idx, v);
                }
                self.runs.push((idx, id));
            }
            if self.early.len() < EARLY {
                // `early` holds entries `0..len` while it is not full.
                self.early.push(v);
            }
            self.len += 1;
            return Ok(());
        }
        self.densify_then_put(idx, v)
    }

    #[cold]
    fn densify_then_put(&mut self, idx: u64, v: V) -> Result<(), MemoFull> {
        let refused = |more: usize| MemoFull::Memory(more * size_of::<u32>());
        if self.dense.is_empty() {
            self.early = Vec::new();
            let all = self.len as usize + 1;
            self.dense.try_reserve(all).map_err(|_| refused(all))?;
            for (i, &(first, id)) in self.runs.iter().enumerate() {
                let end = self.runs.get(i + 1).map_or(self.len, |r| r.0);
                self.dense.extend((0..end - first).map(|j| id + j as u32));
            }
            self.runs.clear();
        }
        let entry = match v.id() {
            Some(id) => id,
            None => {
                let i = u32::try_from(self.values.len())
                    .ok()
                    .filter(|&i| i < MEMO_VALUE)
                    .ok_or(MemoFull::Values(u64::from(MEMO_VALUE)))?;
                self.values.try_reserve(1).map_err(|_| refused(2))?;
                self.values.push(v);
                i | MEMO_VALUE
            }
        };
        if idx < self.len {
            self.dense[idx as usize] = entry;
        } else {
            self.dense.try_reserve(1).map_err(|_| refused(1))?;
            self.dense.push(entry);
            self.len += 1;
        }
        Ok(())
    }

    #[inline(always)]
    fn get(&self, idx: u64) -> Option<V> {
        // `early` holds entries below `len` only, and is emptied when the memo turns dense.
        if let Some(&v) = self.early.get(idx as usize) {
            return Some(v);
        }
        if idx >= self.len {
            return self.sparse.get(&idx).copied();
        }
        if self.dense.is_empty() {
            let k = self.runs.partition_point(|r| r.0 <= idx).checked_sub(1)?;
            let (first, id) = self.runs[k];
            return Some(V::object(id + (idx - first) as u32));
        }
        match self.dense[idx as usize] {
            e if e & MEMO_VALUE == 0 => Some(V::object(e)),
            e => self.values.get((e & !MEMO_VALUE) as usize).copied(),
        }
    }
}

struct Decoder<'a> {
    data: &'a [u8],
    pos: usize,
    stack: Vec<V>,
    marks: Vec<usize>,
    memo: Memo,
    pool_ahead: Prefault,
    slots_ahead: Prefault,
    p: Pickle<'a>,
    shape_ids: HashMap<Box<[V]>, u32>,
    /// The shape matched last, tried first.
    last_shape: u32,
    /// Values counted so far against [`Limits::max_values`].
    values: u64,
    /// The limits, `max_values` already the lesser of it and [`sized_values`].
    limits: Limits,
    /// What the values limit is named in its error ([`VALUES`] or [`SIZED_VALUES`]).
    values_what: &'static str,
    /// Step over code opcodes (see [`decode_whole`]), keeping the first in `code`.
    defer_code: bool,
    code: Option<DecodeError>,
    /// The input offset at which a [`Release`] hook is called next.
    release_at: usize,
}

/// Opcode names as `pickletools` spells them (used in errors).
fn opcode_name(op: u8) -> &'static str {
    match op {
        b'(' => "MARK",
        b'.' => "STOP",
        b'0' => "POP",
        b'1' => "POP_MARK",
        b'2' => "DUP",
        b'F' => "FLOAT",
        b'I' => "INT",
        b'J' => "BININT",
        b'K' => "BININT1",
        b'L' => "LONG",
        b'M' => "BININT2",
        b'N' => "NONE",
        b'P' => "PERSID",
        b'Q' => "BINPERSID",
        b'R' => "REDUCE",
        b'S' => "STRING",
        b'T' => "BINSTRING",
        b'U' => "SHORT_BINSTRING",
        b'V' => "UNICODE",
        b'X' => "BINUNICODE",
        b'a' => "APPEND",
        b'b' => "BUILD",
        b'c' => "GLOBAL",
        b'd' => "DICT",
        b'}' => "EMPTY_DICT",
        b'e' => "APPENDS",
        b'g' => "GET",
        b'h' => "BINGET",
        b'i' => "INST",
        b'j' => "LONG_BINGET",
        b'l' => "LIST",
        b']' => "EMPTY_LIST",
        b'o' => "OBJ",
        b'p' => "PUT",
        b'q' => "BINPUT",
        b'r' => "LONG_BINPUT",
        b's' => "SETITEM",
        b't' => "TUPLE",
        b')' => "EMPTY_TUPLE",
        b'u' => "SETITEMS",
        b'G' => "BINFLOAT",
        0x80 => "PROTO",
        0x81 => "NEWOBJ",
        0x82 => "EXT1",
        0x83 => "EXT2",
        0x84 => "EXT4",
        0x85 => "TUPLE1",
        0x86 => "TUPLE2",
        0x87 => "TUPLE3",
        0x88 => "NEWTRUE",
        0x89 => "NEWFALSE",
        0x8a => "LONG1",
        0x8b => "LONG4",
        b'B' => "BINBYTES",
        b'C' => "SHORT_BINBYTES",
        0x8c => "SHORT_BINUNICODE",
        0x8d => "BINUNICODE8",
        0x8e => "BINBYTES8",
        0x8f => "EMPTY_SET",
        0x90 => "ADDITEMS",
        0x91 => "FROZENSET",
        0x92 => "NEWOBJ_EX",
        0x93 => "STACK_GLOBAL",
        0x94 => "MEMOIZE",
        0x95 => "FRAME",
        0x96 => "BYTEARRAY8",
        0x97 => "NEXT_BUFFER",
        0x98 => "READONLY_BUFFER",
        _ => "unknown",
    }
}

impl<'a> Decoder<'a> {
    fn run(self) -> Res<Pickle<'a>> {
        self.run_releasing(None)
    }

    fn run_releasing(mut self, mut release: Option<Release<'_>>) -> Res<Pickle<'a>> {
        loop {
            self.hot();
            let at = self.pos;
            if at >= self.release_at
                && let Some(r) = release.as_mut()
            {
                r(at);
                self.release_at = at.saturating_add(RELEASE_STEP);
            }
            let Some(&op) = self.data.get(at) else {
                return Err(Box::new(DecodeError::Truncated {
                    offset: at,
                    what: "the pickle (no STOP opcode)",
                }));
            };
            self.pos += 1;
            match op {
                // What `hot` left: the same opcodes at the input's end, memo
                // misses, ints to box, a full stack; checked and reported here.
                b'h' => {
                    let idx = self.take(1, at, op)?[0].into();
                    self.get(idx, at, op)?;
                }
                b'j' => {
                    let idx = self.le_u64(4, at, op)?;
                    self.get(idx, at, op)?;
                }
                b'J' => {
                    let b = self.take(4, at, op)?;
                    let v = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                    let v = self.int(v.into(), at)?;
                    self.push(v, at)?;
                }
                0x8a => {
                    let n = self.take(1, at, op)?[0] as usize;
                    let start = self.pos;
                    let b = self.take(n, at, op)?;
                    let v = self.long_le(start, b, at)?;
                    self.push(v, at)?;
                }
                0x94 => self.memoize(at)?,
                b'K' => {
                    let v = self.take(1, at, op)?[0];
                    self.push(V::small(v.into()), at)?;
                }
                b'M' => {
                    let b = self.take(2, at, op)?;
                    let v = u16::from_le_bytes([b[0], b[1]]);
                    self.push(V::small(v.into()), at)?;
                }
                0x8c => {
                    let n = self.take(1, at, op)?[0] as usize;
                    let b = self.take(n, at, op)?;
                    self.push_utf8(b, at)?;
                }
                b'(' => self.mark(at)?,
                b'}' => {
                    if !self.shaped_dict(at)? {
                        self.new_container(Kind::Dict, at)?;
                        self.then_memoize_and_mark()?;
                    }
                }
                b']' => {
                    self.new_container(Kind::List, at)?;
                    self.then_memoize_and_mark()?;
                }
                0x8f => self.new_container(Kind::Set, at)?,
                b')' => self.new_container(Kind::Tuple, at)?,
                b'u' => self.extend_marked(Kind::Dict, at, op)?,
                b'e' => self.extend_marked(Kind::List, at, op)?,
                0x90 => self.extend_marked(Kind::Set, at, op)?,
                b's' => {
                    let n = self.stack.len();
                    if n < 3 || n - 2 <= self.floor() {
                        return Err(self.empty(at, op));
                    }
                    let target = self.stack[n - 3];
                    self.extend(target, Kind::Dict, n - 2, at, op)?;
                }
                b'a' => {
                    let n = self.stack.len();
                    if n < 2 || n - 1 <= self.floor() {
                        return Err(self.empty(at, op));
                    }
                    let target = self.stack[n - 2];
                    self.extend(target, Kind::List, n - 1, at, op)?;
                }
                0x85..=0x87 => {
                    let n = usize::from(op - 0x84);
                    let from = self
                        .stack
                        .len()
                        .checked_sub(n)
                        .filter(|&f| f >= self.floor())
                        .ok_or_else(|| self.empty(at, op))?;
                    self.build(Kind::Tuple, from, at)?;
                }
                b't' => {
                    let m = self.pop_mark(at, op)?;
                    self.build(Kind::Tuple, m, at)?;
                }
                b'l' => {
                    let m = self.pop_mark(at, op)?;
                    self.build(Kind::List, m, at)?;
                }
                0x91 => {
                    let m = self.pop_mark(at, op)?;
                    self.build(Kind::FrozenSet, m, at)?;
                }
                b'd' => {
                    let m = self.pop_mark(at, op)?;
                    if !self.stack.len().saturating_sub(m).is_multiple_of(2) {
                        return Err(self.malformed(at, op, "odd number of items"));
                    }
                    self.build(Kind::Dict, m, at)?;
                }
                0x88 => self.push(V::TRUE, at)?,
                0x89 => self.push(V::FALSE, at)?,
                b'N' => self.push(V::NONE, at)?,
                0x80 => {
                    let p = self.take(1, at, op)?[0];
                    if p > 5 {
                        return Err(Box::new(DecodeError::Protocol {
                            offset: at,
                            protocol: p,
                        }));
                    }
                    self.p.protocol = p;
                }
                0x95 => {
                    // FRAME: the input is contiguous, so only check the length fits.
                    let len = self.le_u64(8, at, op)?;
                    if len > self.remaining() as u64 {
                        return Err(self.truncated(at, op));
                    }
                }
                b'.' => {
                    self.p.root = self.pop(at, op)?;
                    if let Some(code) = self.code.take() {
                        return Err(Box::new(code));
                    }
                    return Ok(self.p);
                }
                b'0' => {
                    self.pop(at, op)?;
                }
                b'1' => {
                    let m = self.pop_mark(at, op)?;
                    self.stack.truncate(m);
                }
                b'2' => {
                    let v = self.top(at, op)?;
                    self.push(v, at)?;
                }
                0x8b => {
                    let n = self.len_i32(at, op)?;
                    let start = self.pos;
                    let b = self.take(n, at, op)?;
                    let v = self.long_le(start, b, at)?;
                    self.push(v, at)?;
                }
                b'G' => {
                    let b = self.take(8, at, op)?;
                    let mut a = [0u8; 8];
                    a.copy_from_slice(b);
                    let v = self.alloc(Slot::Float(f64::from_be_bytes(a)), at)?;
                    self.push(v, at)?;
                }
                b'I' => {
                    let line = self.line(at, op)?;
                    let v = match line {
                        b"01" => V::TRUE,
                        b"00" => V::FALSE,
                        _ => self.decimal(line, at, op)?,
                    };
                    self.push(v, at)?;
                }
                b'L' => {
                    let line = self.line(at, op)?;
                    let digits = line.strip_suffix(b"L").unwrap_or(line);
                    let v = self.decimal(digits, at, op)?;
                    self.push(v, at)?;
                }
                b'F' => {
                    let line = self.line(at, op)?;
                    let f = std::str::from_utf8(line)
                        .ok()
                        .and_then(|s| s.trim().parse::<f64>().ok())
                        .ok_or_else(|| self.malformed(at, op, "not a float"))?;
                    let v = self.alloc(Slot::Float(f), at)?;
                    self.push(v, at)?;
                }
                // Byte strings: Python 3 decodes protocol 0–2 `str` as ASCII by default.
                b'T' => {
                    let n = self.len_i32(at, op)?;
                    let b = self.take(n, at, op)?;
                    self.push_utf8(b, at)?;
                }
                b'U' => {
                    let n = self.take(1, at, op)?[0] as usize;
                    let b = self.take(n, at, op)?;
                    self.push_utf8(b, at)?;
                }
                b'S' => {
                    let line = self.line(at, op)?;
                    let s = unquote_string(line).ok_or_else(|| {
                        self.malformed(at, op, "the STRING opcode argument must be quoted")
                    })?;
                    let v = self.text(s.into(), at)?;
                    self.push(v, at)?;
                }
                b'V' => {
                    let line = self.line(at, op)?;
                    let s = raw_unicode_unescape(line);
                    let v = self.text(s.into(), at)?;
                    self.push(v, at)?;
                }
                b'X' => {
                    let n = self.len_u32(at, op)?;
                    let b = self.take(n, at, op)?;
                    self.push_utf8(b, at)?;
                }
                0x8d => {
                    let n = self.len_u64(at, op)?;
                    let b = self.take(n, at, op)?;
                    self.push_utf8(b, at)?;
                }
                b'B' => {
                    let n = self.len_u32(at, op)?;
                    let b = self.take(n, at, op)?;
                    let v = self.bytes(b, at)?;
                    self.push(v, at)?;
                }
                b'C' => {
                    let n = self.take(1, at, op)?[0] as usize;
                    let b = self.take(n, at, op)?;
                    let v = self.bytes(b, at)?;
                    self.push(v, at)?;
                }
                0x8e | 0x96 => {
                    let n = self.len_u64(at, op)?;
                    let b = self.take(n, at, op)?;
                    let v = self.bytes(b, at)?;
                    self.push(v, at)?;
                }
                0x97 => {
                    return Err(self.malformed(
                        at,
                        op,
                        "out-of-band buffer referenced, but a file carries none",
                    ));
                }
                0x98 => {
                    // READONLY_BUFFER only changes the top object's mutability.
                    self.top(at, op)?;
                }
                b'q' => {
                    let idx = self.take(1, at, op)?[0].into();
                    let v = self.top(at, op)?;
                    self.memo_put(idx, v, at)?;
                }
                b'r' => {
                    let idx = self.le_u64(4, at, op)?;
                    let v = self.top(at, op)?;
                    self.memo_put(idx, v, at)?;
                }
                b'p' => {
                    let line = self.line(at, op)?;
                    let idx =
                        parse_index(line).ok_or_else(|| self.malformed(at, op, "bad index"))?;
                    let v = self.top(at, op)?;
                    self.memo_put(idx, v, at)?;
                }
                b'g' => {
                    let line = self.line(at, op)?;
                    let idx =
                        parse_index(line).ok_or_else(|| self.malformed(at, op, "bad index"))?;
                    self.get(idx, at, op)?;
                }
                // Everything below would run code: refuse, naming what it would call.
                b'c' | b'i' => {
                    let module = self.line(at, op)?;
                    let name = self.line(at, op)?;
                    let code = DecodeError::Code {
                        offset: at,
                        opcode: opcode_name(op),
                        callable: format!(
                            "{} {}",
                            String::from_utf8_lossy(module),
                            String::from_utf8_lossy(name)
                        ),
                    };
                    // `find_class` imports a dotted module and looks a name up in
                    // it: anything else is text that happens to start with `c`.
                    if self.defer_code && !(is_dotted_name(module) && is_dotted_name(name)) {
                        return Err(self.malformed(at, op, "not a module and a name"));
                    }
                    self.step_over(
                        code,
                        if op == b'i' { Pops::Mark } else { Pops::N(0) },
                        at,
                        op,
                    )?;
                }
                0x93 => {
                    let n = self.stack.len();
                    let callable = match (
                        n.checked_sub(2).and_then(|i| self.stack.get(i)),
                        self.stack.last(),
                    ) {
                        (Some(m), Some(q)) => {
                            format!("{} {}", self.describe(*m), self.describe(*q))
                        }
                        _ => "an object missing from the stack".into(),
                    };
                    let code = DecodeError::Code {
                        offset: at,
                        opcode: opcode_name(op),
                        callable,
                    };
                    self.step_over(code, Pops::N(2), at, op)?;
                }
                b'R' | 0x81 | 0x92 | b'b' | b'o' | b'Q' => {
                    // The callable (or the object BUILD would update) sits below the
                    // arguments; for OBJ it is the first item after the MARK.
                    let slot = match op {
                        b'o' => self.marks.last().copied(),
                        0x92 => self.stack.len().checked_sub(3),
                        b'Q' => self.stack.len().checked_sub(1),
                        _ => self.stack.len().checked_sub(2),
                    };
                    let callable = slot
                        .and_then(|i| self.stack.get(i))
                        .map(|v| self.describe(*v))
                        .unwrap_or_else(|| "an object missing from the stack".into());
                    let code = DecodeError::Code {
                        offset: at,
                        opcode: opcode_name(op),
                        callable,
                    };
                    // What each leaves in place of its operands: one result,
                    // except BUILD, which updates the object below its state.
                    let pops = match op {
                        b'o' => Pops::Mark,
                        0x92 => Pops::N(3),
                        b'R' | 0x81 => Pops::N(2),
                        _ => Pops::N(1),
                    };
                    self.step_over(code, pops, at, op)?;
                    if op == b'b' {
                        self.pop(at, op)?;
                    }
                }
                b'P' => {
                    let id = self.line(at, op)?;
                    let code = DecodeError::Code {
                        offset: at,
                        opcode: opcode_name(op),
                        callable: format!("persistent_load({:?})", String::from_utf8_lossy(id)),
                    };
                    self.step_over(code, Pops::N(0), at, op)?;
                }
                0x82..=0x84 => {
                    let n = match op {
                        0x82 => 1,
                        0x83 => 2,
                        _ => 4,
                    };
                    let ext = self.le_u64(n, at, op)?;
                    let code = DecodeError::Code {
                        offset: at,
                        opcode: opcode_name(op),
                        callable: format!("the copyreg extension registered as code {ext}"),
                    };
                    self.step_over(code, Pops::N(0), at, op)?;
                }
                _ => {
                    return Err(Box::new(DecodeError::UnknownOpcode {
                        offset: at,
                        opcode: op,
                    }));
                }
            }
        }
    }

    /// An opcode that would call code: refused at once, or, decoding a whole
    /// header-less pickle, recorded and stepped over: its operands popped and
    /// a None pushed in place of what it would have made.
    #[cold]
    fn step_over(&mut self, code: DecodeError, pops: Pops, at: usize, op: u8) -> Res<()> {
        if !self.defer_code {
            return Err(Box::new(code));
        }
        match pops {
            Pops::Mark => {
                let m = self.pop_mark(at, op)?;
                self.stack.truncate(m);
            }
            Pops::N(n) => {
                for _ in 0..n {
                    self.pop(at, op)?;
                }
            }
        }
        self.code.get_or_insert(code);
        self.push(V::NONE, at)
    }

    /// The bulk of a snapshot: memo gets and ints (dict keys and values),
    /// decoded with the input position in a register and no error plumbing
    /// (BENCHMARKS.md, "Snapshot decoding"). Stops at any other opcode, when
    /// the stack is out of room, and at anything unusual (fewer than 10 bytes
    /// left, a memo miss, an int that needs boxing): the dispatch in `run`
    /// then decodes or reports it.
    #[inline(always)]
    fn hot(&mut self) {
        let data = self.data;
        let mut pos = self.pos;
        let memo = &self.memo;
        // Values are written into the stack's spare room in place, its
        // length set once at the end.
        let spare = self.stack.spare_capacity_mut();
        let mut n = 0;
        for slot in spare.iter_mut() {
            let Some((v, len)) = simple_at(data, pos, memo) else {
                break;
            };
            pos += len;
            slot.write(v);
            n += 1;
        }
        // SAFETY: the first `n` slots of the spare room were written above.
        unsafe { self.stack.set_len(self.stack.len() + n) };
        self.pos = pos;
    }

    /// After EMPTY_DICT: MEMOIZE, MARK, each key of the shape matched last
    /// with a [`simple_at`] value, SETITEMS. The dict of a run of dicts of one
    /// shape (a trace's entries) is built in one go, with the effects those
    /// opcodes have one by one (the same slot, memo entry, pool values,
    /// counts and stack); its values go straight into the pool. Anything
    /// else (another shape, a value that makes an object, too little room or
    /// budget) changes nothing and gives `false`: the opcodes then run one by
    /// one and report what they find. (The object and values limits need no
    /// check here: `alloc`, `memo_put` and `count` meet them at the offsets
    /// of EMPTY_DICT, MEMOIZE and SETITEMS, as the opcodes would. MARK
    /// pushes nothing here, so its nesting limit is checked.)
    #[inline(always)]
    fn shaped_dict(&mut self, at: usize) -> Res<bool> {
        let data = self.data;
        let shape = self.last_shape;
        let Some(keys) = self.p.shapes.get(shape as usize) else {
            return Ok(false);
        };
        let (n, items) = (keys.len(), 2 * keys.len());
        if data.get(self.pos..self.pos + 2) != Some(&[0x94, b'('][..])
            || self.stack.capacity() - self.stack.len() <= items
            || self.p.pool.capacity() - self.p.pool.len() < items
            || self.marks.len() >= self.limits.max_marks
        {
            return Ok(false);
        }
        let mut pos = self.pos + 2;
        let memo = &self.memo;
        let spare = self.p.pool.spare_capacity_mut();
        for (&key, slot) in keys.iter().zip(spare.iter_mut()) {
            match simple_at(data, pos, memo) {
                Some((k, len)) if k == key => pos += len,
                _ => return Ok(false),
            }
            let Some((v, len)) = simple_at(data, pos, memo) else {
                return Ok(false);
            };
            slot.write(v);
            pos += len;
        }
        if data.get(pos) != Some(&b'u') {
            return Ok(false);
        }
        let start = self.p.pool.len();
        // SAFETY: the spare room holds at least `items` >= `n` slots, and the
        // first `n` were written above.
        unsafe { self.p.pool.set_len(start + n) };
        // EMPTY_DICT (its slot as SETITEMS leaves it), MEMOIZE, then SETITEMS.
        let v = self.alloc(
            Slot::Container(Container {
                kind: Kind::Dict,
                layout: Layout::Shaped,
                len: shape,
                start: start as u64,
            }),
            at,
        )?;
        self.memo_put(self.memo.len, v, at + 1)?;
        self.count(items as u64, pos)?;
        self.pool_ahead.ahead(&mut self.p.pool, items);
        self.stack.push(v);
        self.pos = pos + 1;
        Ok(true)
    }

    fn remaining(&self) -> usize {
        self.data.len().saturating_sub(self.pos)
    }

    /// The next `n` bytes; `n` comes from the input, so it is checked first.
    #[inline]
    fn take(&mut self, n: usize, at: usize, op: u8) -> Res<&'a [u8]> {
        let data: &'a [u8] = self.data;
        match data.get(self.pos..).and_then(|rest| rest.get(..n)) {
            Some(s) => {
                self.pos += n;
                Ok(s)
            }
            None => Err(self.truncated(at, op)),
        }
    }

    fn le_u64(&mut self, n: usize, at: usize, op: u8) -> Res<u64> {
        let b = self.take(n, at, op)?;
        Ok(b.iter()
            .rev()
            .fold(0u64, |acc, &x| (acc << 8) | u64::from(x)))
    }

    fn len_u32(&mut self, at: usize, op: u8) -> Res<usize> {
        let n = self.le_u64(4, at, op)?;
        self.fits(n, at, op)
    }

    fn len_u64(&mut self, at: usize, op: u8) -> Res<usize> {
        let n = self.le_u64(8, at, op)?;
        self.fits(n, at, op)
    }

    fn len_i32(&mut self, at: usize, op: u8) -> Res<usize> {
        let b = self.take(4, at, op)?;
        let n = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        if n < 0 {
            return Err(self.malformed(at, op, "negative length"));
        }
        self.fits(n as u64, at, op)
    }

    /// A declared length must fit in what is left of the input.
    fn fits(&self, n: u64, at: usize, op: u8) -> Res<usize> {
        if n > self.remaining() as u64 {
            return Err(self.truncated(at, op));
        }
        Ok(n as usize)
    }

    /// A newline-terminated argument (protocol 0), without the newline.
    fn line(&mut self, at: usize, op: u8) -> Res<&'a [u8]> {
        let data: &'a [u8] = self.data;
        let rest = data.get(self.pos..).unwrap_or_default();
        let n = memchr::memchr(b'\n', rest).ok_or_else(|| self.truncated(at, op))?;
        self.pos += n + 1;
        Ok(&rest[..n])
    }

    #[cold]
    fn truncated(&self, at: usize, op: u8) -> Fail {
        Box::new(DecodeError::Truncated {
            offset: at,
            what: opcode_name(op),
        })
    }

    #[cold]
    fn malformed(&self, at: usize, op: u8, problem: &str) -> Fail {
        Box::new(DecodeError::Malformed {
            offset: at,
            opcode: opcode_name(op),
            problem: problem.into(),
        })
    }

    #[cold]
    fn empty(&self, at: usize, op: u8) -> Fail {
        self.malformed(at, op, "stack underflow")
    }

    /// Counts `n` more values held (objects, pooled items, memo entries,
    /// stack room) against the limit.
    #[inline(always)]
    fn count(&mut self, n: u64, at: usize) -> Res<()> {
        self.values += n;
        if self.values > self.limits.max_values {
            return Err(self.too_many_values(at));
        }
        Ok(())
    }

    #[cold]
    #[inline(never)]
    fn too_many_values(&self, at: usize) -> Fail {
        Box::new(DecodeError::Limit {
            offset: at,
            what: self.values_what,
            limit: self.limits.max_values,
        })
    }

    /// Pushes onto the stack; its room is counted when it grows, not per push.
    #[inline(always)]
    fn push(&mut self, v: V, at: usize) -> Res<()> {
        if self.stack.len() == self.stack.capacity() {
            self.grow_stack(at)?;
        }
        self.stack.push(v);
        Ok(())
    }

    #[cold]
    #[inline(never)]
    fn grow_stack(&mut self, at: usize) -> Res<()> {
        let more = self.stack.capacity().max(256);
        self.count(more as u64, at)?;
        room(&mut self.stack, more, at, "stack")
    }

    /// The stack index below which the innermost MARK protects the stack.
    #[inline]
    fn floor(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    /// The top of the stack, above the innermost MARK (CPython refuses to
    /// reach below it too).
    #[inline]
    fn top(&self, at: usize, op: u8) -> Res<V> {
        match self.stack.last() {
            Some(&v) if self.stack.len() > self.floor() => Ok(v),
            _ => Err(self.empty(at, op)),
        }
    }

    fn pop(&mut self, at: usize, op: u8) -> Res<V> {
        let v = self.top(at, op)?;
        self.stack.pop();
        Ok(v)
    }

    fn pop_mark(&mut self, at: usize, op: u8) -> Res<usize> {
        self.marks
            .pop()
            .ok_or_else(|| self.malformed(at, op, "no MARK open"))
    }

    #[inline(always)]
    fn alloc(&mut self, slot: Slot, at: usize) -> Res<V> {
        let id = self.p.slots.len();
        if id >= MAX_OBJECTS {
            return Err(Box::new(DecodeError::Limit {
                offset: at,
                what: "number of objects",
                limit: MAX_OBJECTS as u64,
            }));
        }
        self.count(2, at)?;
        room(&mut self.p.slots, 1, at, "objects")?;
        self.slots_ahead.ahead(&mut self.p.slots, 1);
        self.p.slots.push(slot);
        Ok(V::object(id as u32))
    }

    /// An int: inline when small, else boxed.
    fn int(&mut self, i: i64, at: usize) -> Res<V> {
        match V::int(i) {
            Some(v) => Ok(v),
            None => self.alloc(Slot::Int(i), at),
        }
    }

    #[inline(always)]
    fn memoize(&mut self, at: usize) -> Res<()> {
        let v = self.top(at, 0x94)?;
        self.memo_put(self.memo.len, v, at)
    }

    #[inline(always)]
    fn mark(&mut self, at: usize) -> Res<()> {
        if self.marks.len() >= self.limits.max_marks {
            return Err(Box::new(DecodeError::Limit {
                offset: at,
                what: "MARK nesting",
                limit: self.limits.max_marks as u64,
            }));
        }
        self.marks.push(self.stack.len());
        Ok(())
    }

    /// Pickler writes MEMOIZE, then usually MARK, after every new dict and
    /// list: taking them here saves two trips through the dispatch.
    #[inline(always)]
    fn then_memoize_and_mark(&mut self) -> Res<()> {
        if self.data.get(self.pos) == Some(&0x94) {
            self.pos += 1;
            self.memoize(self.pos - 1)?;
            if self.data.get(self.pos) == Some(&b'(') {
                self.pos += 1;
                self.mark(self.pos - 1)?;
            }
        }
        Ok(())
    }

    fn new_container(&mut self, kind: Kind, at: usize) -> Res<()> {
        let start = self.p.pool.len() as u64;
        let v = self.alloc(
            Slot::Container(Container {
                kind,
                layout: Layout::Pool,
                len: 0,
                start,
            }),
            at,
        )?;
        self.push(v, at)
    }

    /// A container of `stack[from..]` (TUPLE, LIST, DICT, FROZENSET, TUPLE1-3).
    fn build(&mut self, kind: Kind, from: usize, at: usize) -> Res<()> {
        let start = self.p.pool.len() as u64;
        let len = self.checked_len(self.stack.len().saturating_sub(from) as u64, at)?;
        self.count(len.into(), at)?;
        room(&mut self.p.pool, len as usize, at, "container items")?;
        self.pool_ahead.ahead(&mut self.p.pool, len as usize);
        self.p.pool.extend(self.stack.drain(from..));
        let v = self.alloc(
            Slot::Container(Container {
                kind,
                layout: Layout::Pool,
                len,
                start,
            }),
            at,
        )?;
        self.push(v, at)
    }

    /// APPENDS / SETITEMS / ADDITEMS: the items above the MARK go into the
    /// container just below it.
    fn extend_marked(&mut self, kind: Kind, at: usize, op: u8) -> Res<()> {
        let m = self.pop_mark(at, op)?;
        let target = m
            .checked_sub(1)
            .filter(|&i| i >= self.floor())
            .and_then(|i| self.stack.get(i).copied())
            .ok_or_else(|| self.empty(at, op))?;
        if kind == Kind::Dict && !self.stack.len().saturating_sub(m).is_multiple_of(2) {
            return Err(self.malformed(at, op, "odd number of items"));
        }
        self.extend(target, kind, m, at, op)
    }

    /// Moves `stack[from..]` into the container `target` of kind `kind`.
    fn extend(&mut self, target: V, kind: Kind, from: usize, at: usize, op: u8) -> Res<()> {
        let wrong = || match kind {
            Kind::Dict => "target is not a dict",
            Kind::Set => "target is not a set",
            _ => "target is not a list",
        };
        let Some(Slot::Container(c)) = target.id().and_then(|id| self.p.slots.get(id as usize))
        else {
            return Err(self.malformed(at, op, wrong()));
        };
        if c.kind != kind {
            return Err(self.malformed(at, op, wrong()));
        }
        let c = *c;
        let id = target.id().unwrap_or(u32::MAX) as usize;
        let n = self.stack.len().saturating_sub(from);
        self.count(n as u64, at)?;
        room(&mut self.p.pool, n, at, "container items")?;
        self.pool_ahead.ahead(&mut self.p.pool, n);
        let pool_end = self.p.pool.len() as u64;
        match c.layout {
            Layout::Owned => {
                if let Some(items) = self.p.owned.get_mut(c.start as usize) {
                    room(items, n, at, "container items")?;
                    items.extend(self.stack.drain(from..));
                }
            }
            Layout::Pool if c.len == 0 && kind == Kind::Dict && n > 0 => {
                // A dict's first items: store its values under a shared key shape.
                let start = pool_end;
                let slot = match self.shape_of(from) {
                    Some(shape) => {
                        let items = self.stack.get(from..).unwrap_or_default();
                        self.p.pool.extend(items.chunks_exact(2).map(|kv| kv[1]));
                        self.stack.truncate(from);
                        Container {
                            kind,
                            layout: Layout::Shaped,
                            len: shape,
                            start,
                        }
                    }
                    None => {
                        let len = self.checked_len(n as u64, at)?;
                        self.p.pool.extend(self.stack.drain(from..));
                        Container {
                            kind,
                            layout: Layout::Pool,
                            len,
                            start,
                        }
                    }
                };
                self.p.slots[id] = Slot::Container(slot);
            }
            Layout::Pool if c.len == 0 || c.start + u64::from(c.len) == pool_end => {
                // The container's items end the pool: grow in place.
                let len = self.checked_len(u64::from(c.len) + n as u64, at)?;
                let start = if c.len == 0 { pool_end } else { c.start };
                self.p.pool.extend(self.stack.drain(from..));
                self.p.slots[id] = Slot::Container(Container { len, start, ..c });
            }
            Layout::Pool | Layout::Shaped => {
                // Other objects were built since: give it a vector of its own.
                let mut items = Vec::new();
                let had = self.p.dict_of(&c).map_or(c.len as usize, |d| 2 * d.len());
                // The copy of the items it had (theirs in the pool stay) and the vector itself.
                self.count(had as u64 + 3, at)?;
                room(&mut items, had + n, at, "container items")?;
                match self.p.dict_of(&c) {
                    Some(pairs) => items.extend(pairs.iter().flat_map(|(k, v)| [k, v])),
                    None => items.extend_from_slice(self.p.items_of(&c)),
                }
                items.extend(self.stack.drain(from..));
                let start = self.p.owned.len() as u64;
                room(&mut self.p.owned, 1, at, "container items")?;
                self.p.owned.push(items);
                self.p.slots[id] = Slot::Container(Container {
                    kind,
                    layout: Layout::Owned,
                    len: 0,
                    start,
                });
            }
        }
        Ok(())
    }

    fn checked_len(&self, n: u64, at: usize) -> Res<u32> {
        u32::try_from(n).map_err(|_| {
            Box::new(DecodeError::Limit {
                offset: at,
                what: "container length",
                limit: u64::from(u32::MAX),
            })
        })
    }

    /// The shape id of the keys at `stack[from..]` (every other item), when
    /// they are all objects (str keys); new shapes are added up to a bound.
    fn shape_of(&mut self, from: usize) -> Option<u32> {
        const MAX_SHAPES: usize = 1 << 12;
        let items = self.stack.get(from..)?;
        if !items.len().is_multiple_of(2) || items.len() > 64 {
            return None;
        }
        let same = |shape: &[V]| {
            shape.len() * 2 == items.len()
                && shape
                    .iter()
                    .zip(items.chunks_exact(2))
                    .all(|(s, kv)| *s == kv[0])
        };
        // Runs of dicts share a shape: try the last one, then (torch writes a
        // handful) all of them, and hash only past that.
        let last = self.last_shape;
        if self.p.shapes.get(last as usize).is_some_and(|s| same(s)) {
            return Some(last);
        }
        let known = if self.p.shapes.len() <= 16 {
            self.p.shapes.iter().position(|s| same(s))
        } else {
            None
        };
        let id = match known {
            Some(id) => id as u32,
            None => {
                let key: Box<[V]> = items.iter().step_by(2).copied().collect();
                if key.iter().any(|k| k.id().is_none()) {
                    return None;
                }
                match self.shape_ids.get(&key) {
                    Some(&id) => id,
                    None if self.p.shapes.len() < MAX_SHAPES => {
                        let id = self.p.shapes.len() as u32;
                        self.p.shapes.push(key.clone());
                        self.shape_ids.insert(key, id);
                        id
                    }
                    None => return None,
                }
            }
        };
        self.last_shape = id;
        Some(id)
    }

    #[inline(always)]
    fn memo_put(&mut self, idx: u64, v: V, at: usize) -> Res<()> {
        // An entry out of order goes to a hash map: key, value, its share of
        // the table and the old table while it grows (8). In order, an object
        // is an id (1; none while the memo is in runs); any other value is
        // also kept in the memo's values (2).
        let cost = if idx > self.memo.len {
            8
        } else if v.id().is_none() {
            2
        } else {
            1
        };
        self.count(cost, at)?;
        self.memo.put(idx, v).map_err(|full| {
            Box::new(match full {
                MemoFull::Values(limit) => DecodeError::Limit {
                    offset: at,
                    what: "memoized non-object values",
                    limit,
                },
                MemoFull::Memory(bytes) => DecodeError::Memory {
                    offset: at,
                    what: "memo",
                    bytes,
                },
            })
        })
    }

    #[inline(always)]
    fn get(&mut self, idx: u64, at: usize, op: u8) -> Res<()> {
        match self.memo.get(idx) {
            Some(v) => self.push(v, at),
            None => Err(self.not_stored(idx, at, op)),
        }
    }

    #[cold]
    #[inline(never)]
    fn not_stored(&self, idx: u64, at: usize, op: u8) -> Fail {
        self.malformed(at, op, &format!("memo key {idx} was never stored"))
    }

    fn push_utf8(&mut self, b: &'a [u8], at: usize) -> Res<()> {
        // Python writes lone surrogates with "surrogatepass": keep what decodes.
        let v = self.text(String::from_utf8_lossy(b), at)?;
        self.push(v, at)
    }

    fn text(&mut self, s: std::borrow::Cow<'a, str>, at: usize) -> Res<V> {
        let i = side_index(self.p.texts.len(), at)?;
        // Its entry (a Cow, 3 values) and the bytes of a decoded copy.
        let owned = match &s {
            std::borrow::Cow::Owned(o) => o.len().div_ceil(8) as u64,
            std::borrow::Cow::Borrowed(_) => 0,
        };
        self.count(3 + owned, at)?;
        let v = self.alloc(Slot::Str(i), at)?;
        room(&mut self.p.texts, 1, at, "strings")?;
        self.p.texts.push(s);
        Ok(v)
    }

    fn bytes(&mut self, b: &'a [u8], at: usize) -> Res<V> {
        let i = side_index(self.p.bytes.len(), at)?;
        self.count(2, at)?;
        let v = self.alloc(Slot::Bytes(i), at)?;
        room(&mut self.p.bytes, 1, at, "byte strings")?;
        self.p.bytes.push(b);
        Ok(v)
    }

    fn bigint(&mut self, le: Box<[u8]>, at: usize) -> Res<V> {
        let i = side_index(self.p.bigints.len(), at)?;
        self.count(2 + le.len().div_ceil(8) as u64, at)?;
        let v = self.alloc(Slot::BigInt(i), at)?;
        room(&mut self.p.bigints, 1, at, "wide ints")?;
        self.p.bigints.push(le);
        Ok(v)
    }

    /// LONG1/LONG4 payload `b`, at `start` in the input: little-endian two's
    /// complement of any length.
    #[inline(always)]
    fn long_le(&mut self, start: usize, b: &[u8], at: usize) -> Res<V> {
        // The common case (addresses, sizes): 1 to 8 bytes, read as one word
        // when the input has 8 bytes from `start`, then sign-extended.
        let n = b.len();
        if (1..=8).contains(&n) {
            let word = match self.data.get(start..).and_then(<[u8]>::first_chunk::<8>) {
                Some(w) => u64::from_le_bytes(*w),
                None => b.iter().rev().fold(0, |acc, &x| (acc << 8) | u64::from(x)),
            };
            let shift = 64 - 8 * n as u32;
            let i = ((word << shift) as i64) >> shift;
            if let Some(v) = V::int(i) {
                return Ok(v);
            }
            return self.alloc(Slot::Int(i), at);
        }
        self.long_wide(b, at)
    }

    /// A LONG payload wider than 8 bytes (or empty).
    #[cold]
    fn long_wide(&mut self, b: &[u8], at: usize) -> Res<V> {
        match long_from_le(b) {
            Some(Value::Int(i)) => self.int(i, at),
            Some(Value::UInt(u)) => self.alloc(Slot::UInt(u), at),
            _ => self.bigint(b.into(), at),
        }
    }

    /// A protocol 0 decimal int (INT or LONG); too big for u64 becomes a BigInt.
    fn decimal(&mut self, digits: &[u8], at: usize, op: u8) -> Res<V> {
        let s = std::str::from_utf8(digits)
            .map_err(|_| self.malformed(at, op, "not a number"))?
            .trim();
        if let Ok(v) = s.parse::<i64>() {
            return self.int(v, at);
        }
        if let Ok(v) = s.parse::<u64>() {
            return self.alloc(Slot::UInt(v), at);
        }
        let le = decimal_to_le(s).ok_or_else(|| self.malformed(at, op, "not a number"))?;
        self.bigint(le.into_boxed_slice(), at)
    }

    /// A short description of a stack value for refusal messages.
    fn describe(&self, v: V) -> String {
        match self.p.value(v) {
            Value::Ref(_) => match self.p.obj(v) {
                Some(Obj::Str(s)) => s.chars().take(80).collect(),
                Some(Obj::Container(c)) => format!("a {:?}", c.kind).to_lowercase(),
                _ => "an object".into(),
            },
            Value::None => "None".into(),
            other => format!("{other:?}"),
        }
    }
}

/// The value of a memo get or an inline int at `data[pos..]`, and the
/// opcode's length; `None` for any other opcode, a memo miss or an int that
/// needs boxing (which the checked dispatch decodes or reports).
#[inline(always)]
fn simple_at(data: &[u8], pos: usize, memo: &Memo) -> Option<(V, usize)> {
    let w = data.get(pos..)?.first_chunk::<10>()?;
    let get = |idx: usize| memo.get(idx as u64);
    match w[0] {
        b'h' => Some((get(w[1].into())?, 2)),
        b'j' => Some((
            get(u32::from_le_bytes([w[1], w[2], w[3], w[4]]) as usize)?,
            5,
        )),
        b'J' => Some((
            V::int(i32::from_le_bytes([w[1], w[2], w[3], w[4]]).into())?,
            5,
        )),
        b'K' => Some((V::small(w[1].into()), 2)),
        0x8a => {
            // LONG1 of 1 to 8 bytes: the word after the length, masked to
            // them and sign-extended.
            let n = u32::from(w[1]);
            if !(1..=8).contains(&n) {
                return None;
            }
            let word = u64::from_le_bytes([w[2], w[3], w[4], w[5], w[6], w[7], w[8], w[9]]);
            let shift = 64 - 8 * n;
            Some((V::int(((word << shift) as i64) >> shift)?, 2 + n as usize))
        }
        _ => None,
    }
}

/// Room for `more` items in `v`, or [`DecodeError::Memory`] when the system
/// refuses it: every vector sized by the input grows through here, so an
/// input too big for the machine is an error, never an abort.
#[inline(always)]
fn room<T>(v: &mut Vec<T>, more: usize, at: usize, what: &'static str) -> Res<()> {
    if v.capacity() - v.len() >= more {
        return Ok(());
    }
    grow(v, more, at, what)
}

#[cold]
#[inline(never)]
fn grow<T>(v: &mut Vec<T>, more: usize, at: usize, what: &'static str) -> Res<()> {
    v.try_reserve(more).map_err(|_| {
        Box::new(DecodeError::Memory {
            offset: at,
            what,
            bytes: more.saturating_mul(size_of::<T>()),
        })
    })
}

/// What a code opcode takes off the stack.
#[derive(Clone, Copy)]
enum Pops {
    /// Everything down to the innermost MARK, and the MARK.
    Mark,
    N(usize),
}

/// A Python dotted name (`os`, `os.path`, `__builtin__`, `Foo.bar`), as the
/// text-form GLOBAL and INST name a module and a callable.
fn is_dotted_name(s: &[u8]) -> bool {
    !s.is_empty()
        && s.split(|&b| b == b'.').all(|part| {
            part.first()
                .is_some_and(|&c| c.is_ascii_alphabetic() || c == b'_')
                && part.iter().all(|&c| c.is_ascii_alphanumeric() || c == b'_')
        })
}

/// Little-endian two's complement to an inline value, when it fits in i64 or u64.
pub fn long_from_le(b: &[u8]) -> Option<Value> {
    let negative = b.last().is_some_and(|&x| x & 0x80 != 0);
    // Strip redundant sign-extension bytes so 9-byte encodings of u64 values fit.
    let mut n = b.len();
    let fill = if negative { 0xff } else { 0 };
    while n > 0 && b[n - 1] == fill {
        n -= 1;
    }
    if n > 8 {
        return None;
    }
    let mut a = [fill; 8];
    a[..n].copy_from_slice(&b[..n]);
    let u = u64::from_le_bytes(a);
    if negative {
        // The top kept byte must still carry the sign (e.g. ff 7f is not negative in 8 bytes).
        let v = u as i64;
        (v < 0).then_some(Value::Int(v))
    } else if u > i64::MAX as u64 {
        Some(Value::UInt(u))
    } else {
        Some(Value::Int(u as i64))
    }
}

fn decimal_to_le(s: &str) -> Option<Vec<u8>> {
    let (neg, digits) = match s.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if digits.is_empty() || !digits.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    // Magnitude, little-endian base 256.
    let mut mag: Vec<u8> = vec![0];
    for d in digits.bytes() {
        let mut carry = u32::from(d - b'0');
        for byte in mag.iter_mut() {
            let x = u32::from(*byte) * 10 + carry;
            *byte = (x & 0xff) as u8;
            carry = x >> 8;
        }
        while carry > 0 {
            mag.push((carry & 0xff) as u8);
            carry >>= 8;
        }
    }
    mag.push(0); // room for the sign bit
    if neg {
        let mut carry = 1u16;
        for byte in mag.iter_mut() {
            let x = u16::from(!*byte) + carry;
            *byte = (x & 0xff) as u8;
            carry = x >> 8;
        }
    }
    Some(mag)
}

fn parse_index(line: &[u8]) -> Option<u64> {
    std::str::from_utf8(line).ok()?.trim().parse().ok()
}

/// The argument of protocol 0 STRING: a quoted Python literal with escapes.
fn unquote_string(line: &[u8]) -> Option<String> {
    let q = *line.first()?;
    if !(q == b'\'' || q == b'"') || line.len() < 2 || line.last() != Some(&q) {
        return None;
    }
    let body = &line[1..line.len() - 1];
    let mut out = Vec::with_capacity(body.len());
    let mut i = 0;
    while let Some(&c) = body.get(i) {
        i += 1;
        if c != b'\\' {
            out.push(c);
            continue;
        }
        let Some(&e) = body.get(i) else {
            out.push(b'\\');
            break;
        };
        i += 1;
        match e {
            b'n' => out.push(b'\n'),
            b't' => out.push(b'\t'),
            b'r' => out.push(b'\r'),
            b'a' => out.push(7),
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'v' => out.push(11),
            b'x' => {
                let h = body.get(i..i + 2).and_then(|h| std::str::from_utf8(h).ok());
                match h.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(v) => {
                        out.push(v);
                        i += 2;
                    }
                    None => out.extend_from_slice(b"\\x"),
                }
            }
            b'0'..=b'7' => {
                let mut v = u32::from(e - b'0');
                for _ in 0..2 {
                    match body.get(i) {
                        Some(&d @ b'0'..=b'7') => {
                            v = v * 8 + u32::from(d - b'0');
                            i += 1;
                        }
                        _ => break,
                    }
                }
                out.push((v & 0xff) as u8);
            }
            b'\n' => {}
            other => out.push(other),
        }
    }
    // Python 3 decodes it as ASCII; bytes beyond ASCII are read as Latin-1 here
    // rather than failing the whole file.
    Some(out.into_iter().map(char::from).collect())
}

/// The argument of protocol 0 UNICODE (`raw-unicode-escape`): Latin-1 with
/// `\uXXXX` and `\UXXXXXXXX` escapes.
fn raw_unicode_unescape(line: &[u8]) -> String {
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    while let Some(&c) = line.get(i) {
        if c == b'\\' {
            let width = match line.get(i + 1) {
                Some(b'u') => 4,
                Some(b'U') => 8,
                _ => 0,
            };
            if width > 0 {
                let code = line
                    .get(i + 2..i + 2 + width)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u32::from_str_radix(h, 16).ok());
                if let Some(code) = code {
                    out.push(char::from_u32(code).unwrap_or(char::REPLACEMENT_CHARACTER));
                    i += 2 + width;
                    continue;
                }
            }
        }
        out.push(char::from(c));
        i += 1;
    }
    out
}

impl<'a> Pickle<'a> {
    /// Arena objects (containers, strings, boxed numbers).
    pub fn object_count(&self) -> usize {
        self.slots.len()
    }

    pub fn obj(&self, v: V) -> Option<Obj<'_>> {
        Some(match *self.slots.get(v.id()? as usize)? {
            Slot::Str(i) => Obj::Str(self.texts.get(i as usize)?),
            Slot::Bytes(i) => Obj::Bytes(self.bytes.get(i as usize)?),
            Slot::BigInt(i) => Obj::BigInt(self.bigints.get(i as usize)?),
            Slot::Int(i) => Obj::Int(i),
            Slot::UInt(u) => Obj::UInt(u),
            Slot::Float(f) => Obj::Float(f),
            Slot::Container(c) => Obj::Container(c),
        })
    }

    /// The value with numbers unboxed.
    pub fn value(&self, v: V) -> Value {
        match v.0 & 7 {
            TAG_INT => Value::Int((v.0 as i64) >> 3),
            TAG_REF => match self.slots.get((v.0 >> 3) as usize) {
                Some(Slot::Int(i)) => Value::Int(*i),
                Some(Slot::UInt(u)) => Value::UInt(*u),
                Some(Slot::Float(f)) => Value::Float(*f),
                _ => Value::Ref((v.0 >> 3) as u32),
            },
            _ => match v {
                V::TRUE => Value::Bool(true),
                V::FALSE => Value::Bool(false),
                _ => Value::None,
            },
        }
    }

    pub fn str(&self, v: V) -> Option<&str> {
        match self.slots.get(v.id()? as usize)? {
            Slot::Str(i) => self.texts.get(*i as usize).map(|s| &**s),
            _ => None,
        }
    }

    /// The items of a non-dict container (the values, for a shaped dict).
    fn items_of(&self, c: &Container) -> &[V] {
        let items = match c.layout {
            Layout::Owned => self.owned.get(c.start as usize).map(Vec::as_slice),
            Layout::Pool | Layout::Shaped => {
                let len = match c.layout {
                    Layout::Shaped => self.shapes.get(c.len as usize).map_or(0, |k| k.len()),
                    _ => c.len as usize,
                };
                usize::try_from(c.start)
                    .ok()
                    .and_then(|start| self.pool.get(start..start.checked_add(len)?))
            }
        };
        items.unwrap_or_default()
    }

    /// A dict container's (key, value) pairs.
    fn dict_of(&self, c: &Container) -> Option<Pairs<'_>> {
        if c.kind != Kind::Dict {
            return None;
        }
        let values = self.items_of(c);
        Some(match c.layout {
            Layout::Shaped => Pairs {
                keys: self.shapes.get(c.len as usize).map_or(&[], |k| k),
                values,
                stride: 1,
            },
            _ => Pairs {
                keys: values,
                values: values.get(1..).unwrap_or_default(),
                stride: 2,
            },
        })
    }

    fn container_of(&self, v: V) -> Option<&Container> {
        match self.slots.get(v.id()? as usize)? {
            Slot::Container(c) => Some(c),
            _ => None,
        }
    }

    /// Which container `v` is, if it is one.
    pub fn kind(&self, v: V) -> Option<Kind> {
        self.container_of(v).map(|c| c.kind)
    }

    /// Items of a list or tuple.
    pub fn items(&self, v: V) -> Option<&[V]> {
        let c = self.container_of(v)?;
        matches!(c.kind, Kind::List | Kind::Tuple).then(|| self.items_of(c))
    }

    /// Items of a set or frozenset.
    pub fn set_items(&self, v: V) -> Option<&[V]> {
        let c = self.container_of(v)?;
        matches!(c.kind, Kind::Set | Kind::FrozenSet).then(|| self.items_of(c))
    }

    /// A dict's (key, value) pairs in insertion order.
    pub fn dict(&self, v: V) -> Option<Pairs<'_>> {
        self.dict_of(self.container_of(v)?)
    }

    /// `d[key]` for a str key (the last assignment wins, as in Python).
    pub fn get(&self, d: V, key: &str) -> Option<V> {
        self.dict(d)?
            .iter()
            .rev()
            .find(|(k, _)| self.str(*k) == Some(key))
            .map(|(_, v)| v)
    }

    pub fn u64(&self, v: V) -> Option<u64> {
        match self.value(v) {
            Value::Int(i) => u64::try_from(i).ok(),
            Value::UInt(u) => Some(u),
            Value::Bool(b) => Some(u64::from(b)),
            _ => None,
        }
    }

    pub fn i64(&self, v: V) -> Option<i64> {
        match self.value(v) {
            Value::Int(i) => Some(i),
            Value::Bool(b) => Some(i64::from(b)),
            _ => None,
        }
    }

    pub fn f64(&self, v: V) -> Option<f64> {
        match self.value(v) {
            Value::Float(f) => Some(f),
            Value::Int(i) => Some(i as f64),
            Value::UInt(u) => Some(u as f64),
            _ => None,
        }
    }

    pub fn bool(&self, v: V) -> Option<bool> {
        match v {
            V::TRUE => Some(true),
            V::FALSE => Some(false),
            _ => None,
        }
    }

    /// Distinct objects reachable from the root (each shared object counted
    /// once, so a memo bomb stays linear); iterative, for any nesting depth.
    pub fn reachable_objects(&self) -> usize {
        let mut seen = vec![false; self.slots.len()];
        let mut todo = vec![self.root];
        let mut n = 0;
        while let Some(v) = todo.pop() {
            let Some(id) = v.id() else { continue };
            match seen.get_mut(id as usize) {
                Some(s) if !*s => *s = true,
                _ => continue,
            }
            n += 1;
            match self.dict(v) {
                Some(pairs) => todo.extend(pairs.iter().flat_map(|(k, v)| [k, v])),
                None => {
                    if let Some(c) = self.container_of(v) {
                        todo.extend_from_slice(self.items_of(c));
                    }
                }
            }
        }
        n
    }

    /// The value as JSON, for small recorded dicts (`allocator_settings`).
    /// Containers nested deeper than `max_depth` become `null`; iterative.
    /// Shared objects are written out at each use, so a file could make the
    /// tree exponentially larger than itself: past [`JSON_BUDGET`] bytes,
    /// values become `null` and keys `"…"`.
    pub fn to_json(&self, v: V, max_depth: usize) -> serde_json::Value {
        use serde_json::Value as J;
        let mut frames: Vec<JsonFrame> = Vec::new();
        let mut result = J::Null;
        let mut next = Some(v);
        let mut left = JSON_BUDGET;
        // Takes an item's rough size from the budget; false once spent.
        let mut spend = |v: V| {
            let text = match self.obj(v) {
                Some(Obj::Str(s)) => s.len(),
                Some(Obj::Bytes(b)) => b.len(),
                _ => 0,
            };
            let cost = text.saturating_add(16);
            let fits = cost <= left;
            if fits {
                left -= cost;
            }
            fits
        };
        loop {
            if let Some(v) = next.take() {
                let leaf = match (self.value(v), self.obj(v)) {
                    _ if !spend(v) => Some(J::Null),
                    (Value::None, _) => Some(J::Null),
                    (Value::Bool(b), _) => Some(J::Bool(b)),
                    (Value::Int(i), _) => Some(J::from(i)),
                    (Value::UInt(u), _) => Some(J::from(u)),
                    (Value::Float(f), _) => {
                        Some(serde_json::Number::from_f64(f).map_or(J::Null, J::Number))
                    }
                    (_, Some(Obj::Str(s))) => Some(J::String(s.to_string())),
                    (_, Some(Obj::Bytes(b))) => Some(J::String(String::from_utf8_lossy(b).into())),
                    (_, Some(Obj::Container(c))) if frames.len() < max_depth => {
                        let dict = c.kind == Kind::Dict;
                        let items: Vec<V> = match self.dict_of(&c) {
                            Some(pairs) => pairs.iter().flat_map(|(k, v)| [k, v]).collect(),
                            None => self.items_of(&c).to_vec(),
                        };
                        frames.push(JsonFrame {
                            out: if dict {
                                J::Object(serde_json::Map::new())
                            } else {
                                J::Array(Vec::new())
                            },
                            dict,
                            key: None,
                            items: items.into_iter(),
                        });
                        None
                    }
                    _ => Some(J::Null),
                };
                if let Some(j) = leaf {
                    place(&mut frames, &mut result, j);
                }
            }
            // Hand out the innermost container's next child, or close it.
            let Some(top) = frames.last_mut() else { break };
            match top.items.next() {
                Some(child) if top.dict && top.key.is_none() => {
                    top.key = Some(if spend(child) {
                        self.key_text(child)
                    } else {
                        "…".into()
                    });
                    // The value follows.
                    next = top.items.next();
                    if next.is_none() {
                        top.key = None;
                    }
                }
                Some(child) => next = Some(child),
                None => {
                    if let Some(done) = frames.pop() {
                        place(&mut frames, &mut result, done.out);
                    }
                }
            }
        }
        result
    }

    /// A dict key as text (torch stringifies keys; ints are written in decimal).
    fn key_text(&self, k: V) -> String {
        match self.value(k) {
            Value::Int(i) => i.to_string(),
            Value::UInt(u) => u.to_string(),
            Value::Bool(b) => if b { "True" } else { "False" }.into(),
            Value::None => "None".into(),
            Value::Float(f) => f.to_string(),
            Value::Ref(_) => self.str(k).unwrap_or("?").to_string(),
        }
    }
}

/// Bytes of text (and 16 per value) [`Pickle::to_json`] writes at most:
/// recorded settings take a few hundred.
const JSON_BUDGET: usize = 1 << 20;

/// A JSON container being filled: whether it is a dict, the key waiting for
/// its value, and the items still to visit.
struct JsonFrame {
    out: serde_json::Value,
    dict: bool,
    key: Option<String>,
    items: std::vec::IntoIter<V>,
}

/// Puts a finished JSON value into the innermost open container (under its
/// pending key for a dict), or makes it the result.
fn place(frames: &mut [JsonFrame], result: &mut serde_json::Value, val: serde_json::Value) {
    match frames.last_mut() {
        Some(f) => match &mut f.out {
            serde_json::Value::Object(m) => {
                m.insert(f.key.take().unwrap_or_default(), val);
            }
            serde_json::Value::Array(a) => a.push(val),
            _ => {}
        },
        None => *result = val,
    }
}

/// A dict's (key, value) pairs: flattened `k, v, k, v` items, or a shared key
/// shape beside the values.
#[derive(Debug, Clone, Copy)]
pub struct Pairs<'p> {
    keys: &'p [V],
    values: &'p [V],
    stride: usize,
}

impl<'p> Pairs<'p> {
    pub fn len(&self) -> usize {
        if self.stride == 2 {
            self.keys.len() / 2
        } else {
            self.keys.len().min(self.values.len())
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, i: usize) -> Option<(V, V)> {
        let j = i.checked_mul(self.stride)?;
        Some((*self.keys.get(j)?, *self.values.get(j)?))
    }

    /// A shaped dict's shared key slice and its values: equal key slices mean
    /// equal key sequences, so callers can cache per shape.
    pub fn shaped(&self) -> Option<(&'p [V], &'p [V])> {
        (self.stride == 1).then_some((self.keys, self.values))
    }

    pub fn iter(self) -> impl DoubleEndedIterator<Item = (V, V)> + 'p {
        (0..self.len()).filter_map(move |i| self.get(i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A list of `n` trace-like dicts as torch pickles them (EMPTY_DICT,
    /// MEMOIZE, MARK, keys memoized by the first, SETITEMS); `frame` puts an
    /// empty-length FRAME before each SETITEMS, which the one-step build of
    /// [`Decoder::shaped_dict`] does not take, so every dict is built opcode
    /// by opcode.
    fn trace_like(n: u32, frame: bool) -> Vec<u8> {
        let mut d = b"\x80\x04]\x94(".to_vec();
        for i in 0..n {
            d.extend_from_slice(b"}\x94(");
            let keys: [&[u8]; 4] = [b"action", b"addr", b"size", b"frames"];
            for (k, key) in keys.iter().enumerate() {
                if i == 0 {
                    d.push(0x8c);
                    d.push(key.len() as u8);
                    d.extend_from_slice(key);
                    d.push(0x94);
                } else {
                    // The keys are memo entries 2, 4, 5 and 6 (entry 3 is "alloc").
                    d.extend_from_slice(&[b'h', [2, 4, 5, 6][k]]);
                }
                match k {
                    0 if i == 0 => d.extend_from_slice(b"\x8c\x05alloc\x94"),
                    0 => d.extend_from_slice(b"h\x03"),
                    1 => {
                        d.extend_from_slice(&[0x8a, 5]);
                        d.extend_from_slice(
                            &(0x70_0000_0000u64 + u64::from(i) * 512).to_le_bytes()[..5],
                        );
                    }
                    2 => {
                        d.push(b'J');
                        d.extend_from_slice(&(i as i32 * 1000 - 7).to_le_bytes());
                    }
                    _ => d.extend_from_slice(if i % 3 == 0 { b"N" } else { b"K\x07" }),
                }
            }
            if frame {
                d.push(0x95);
                d.extend_from_slice(&0u64.to_le_bytes());
            }
            d.push(b'u');
        }
        d.extend_from_slice(b"e.");
        d
    }

    #[test]
    fn dicts_built_in_one_step_are_the_dicts_built_opcode_by_opcode() {
        let (fast, slow) = (trace_like(300, false), trace_like(300, true));
        let (a, b) = (decode(&fast).unwrap(), decode(&slow).unwrap());
        assert_eq!(a.to_json(a.root, 8), b.to_json(b.root, 8));
        assert_eq!((a.slots.len(), a.pool.len()), (b.slots.len(), b.pool.len()));
        assert_eq!(a.shapes.len(), 1);
        let d = a.items(a.root).unwrap()[299];
        assert_eq!(a.get(d, "size").and_then(|v| a.i64(v)), Some(298_993));
        // The values budget runs out at the same opcode either way.
        for max_values in [50, 400, 1234, 2000] {
            let limits = Limits {
                max_values,
                ..Limits::default()
            };
            let at = |d: &[u8]| decode_with(d, limits).err().map(|e| e.offset());
            let (fa, sa) = (at(&fast), at(&slow));
            assert!(fa.is_some(), "{max_values}");
            // The slow input has 9 more bytes per dict before each SETITEMS.
            let dicts_before =
                |d: &[u8], off: usize| d[..off].windows(3).filter(|w| w == b"}\x94(").count();
            assert_eq!(
                dicts_before(&fast, fa.unwrap()),
                dicts_before(&slow, sa.unwrap()),
                "{max_values}"
            );
        }
    }

    #[test]
    fn dicts_share_shapes_and_stay_dicts_when_they_grow() {
        // [{a: 1, b: 2}, {a: 3, b: 4} then c: 5 set on it], keys memoized as torch does.
        let data = b"\x80\x04](}(\x8c\x01a\x94K\x01\x8c\x01b\x94K\x02u}(h\x00K\x03h\x01K\x04u\x8c\x01cK\x05se.";
        let p = decode(data).unwrap();
        let items = p.items(p.root).unwrap();
        assert_eq!(items.len(), 2);
        let (d0, d1) = (items[0], items[1]);
        assert_eq!(p.dict(d0).unwrap().shaped().map(|(k, _)| k.len()), Some(2));
        assert_eq!(
            p.shapes.len(),
            1,
            "both dicts were built with the one key shape"
        );
        let get = |d, k| p.get(d, k).and_then(|v| p.i64(v));
        assert_eq!(
            (get(d0, "a"), get(d0, "b"), get(d0, "c")),
            (Some(1), Some(2), None)
        );
        // The SETITEM after SETITEMS moved d1 out of its shape; all three keys remain.
        assert_eq!(
            (get(d1, "a"), get(d1, "b"), get(d1, "c")),
            (Some(3), Some(4), Some(5))
        );
        assert_eq!(p.dict(d1).unwrap().len(), 3);
        assert_eq!(p.dict(d1).unwrap().shaped(), None);
    }

    #[test]
    fn the_memo_answers_alike_in_runs_and_dense() {
        // Ids that mostly follow their index, with a jump every seventh
        // entry: more runs than MAX_MEMO_RUNS, so the memo turns dense on
        // the way; then an overwrite, a memoized int and an out-of-order index.
        let mut memo = Memo::default();
        let mut want = Vec::new();
        let mut id = 0u32;
        for i in 0..10_000u64 {
            id += if i % 7 == 0 { 3 } else { 1 };
            let v = V::object(id);
            memo.put(i, v).unwrap();
            want.push(v);
            if i == 500 {
                assert!(memo.dense.is_empty(), "still runs at {i}");
                assert!(memo.runs.len() > 1);
            }
        }
        assert!(
            !memo.dense.is_empty(),
            "over {MAX_MEMO_RUNS} runs turn the memo dense"
        );
        memo.put(17, V::object(5)).unwrap();
        want[17] = V::object(5);
        memo.put(10_000, V::small(9)).unwrap();
        want.push(V::small(9));
        memo.put(20_000, V::TRUE).unwrap();
        for (i, v) in want.iter().enumerate() {
            assert_eq!(memo.get(i as u64), Some(*v), "index {i}");
        }
        assert_eq!(memo.get(20_000), Some(V::TRUE));
        assert_eq!(memo.get(10_001), None);

        // Few runs: an overwrite in run form turns it dense too.
        let mut memo = Memo::default();
        for i in 0..10 {
            memo.put(i, V::object(i as u32 + if i < 5 { 0 } else { 1 }))
                .unwrap();
        }
        assert_eq!(memo.runs.len(), 2);
        assert_eq!(memo.get(4), Some(V::object(4)));
        assert_eq!(memo.get(5), Some(V::object(6)));
        memo.put(2, V::NONE).unwrap();
        assert_eq!(
            (0..10).map(|i| memo.get(i)).collect::<Vec<_>>(),
            [0, 1, 2, 3, 4, 6, 7, 8, 9, 10]
                .iter()
                .enumerate()
                .map(|(i, &id)| Some(if i == 2 { V::NONE } else { V::object(id) }))
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn the_tight_loop_and_the_checked_dispatch_agree() {
        // pickle.dumps([x, x[:]], 4) for x = ['k', -1, 2**40, -5, 7, -2**59, 2**60, 300]:
        // the second list's key comes from the memo, 2**60 must be boxed.
        let data = b"\x80\x04\x95i\x00\x00\x00\x00\x00\x00\x00]\x94(]\x94(\x8c\x01k\x94J\xff\xff\xff\xff\x8a\x06\x00\x00\x00\x00\x00\x01J\xfb\xff\xff\xffK\x07\x8a\x08\x00\x00\x00\x00\x00\x00\x00\xf8\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x10M,\x01e]\x94(h\x02J\xff\xff\xff\xff\x8a\x06\x00\x00\x00\x00\x00\x01J\xfb\xff\xff\xffK\x07\x8a\x08\x00\x00\x00\x00\x00\x00\x00\xf8\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x10M,\x01ee.";
        let p = decode(data).unwrap();
        let lists = p.items(p.root).unwrap();
        let ints = |l: V| -> Vec<Option<i64>> {
            p.items(l).unwrap()[1..].iter().map(|&v| p.i64(v)).collect()
        };
        let want: Vec<Option<i64>> = [-1, 1 << 40, -5, 7, -(1 << 59), 1 << 60, 300]
            .into_iter()
            .map(Some)
            .collect();
        assert_eq!(ints(lists[0]), want);
        assert_eq!(ints(lists[1]), want);
        assert_eq!(p.str(p.items(lists[1]).unwrap()[0]), Some("k"));
        // Within 10 bytes of the end the same opcodes take the checked path.
        let p = decode(b"\x80\x04]\x94(K\x01\x8a\x01\xffJ\xfe\xff\xff\xffh\x00e.").unwrap();
        let items = p.items(p.root).unwrap();
        assert_eq!(
            items[..3].iter().map(|&v| p.i64(v)).collect::<Vec<_>>(),
            [Some(1), Some(-1), Some(-2)]
        );
        assert_eq!(items[3], p.root, "the list holds itself");
        // A memo miss stops the loop and is reported at its opcode.
        let e = decode(b"\x80\x04]\x94(h\x07K\x01K\x02K\x03K\x04e.").unwrap_err();
        assert_eq!(e.offset(), 5, "{e}");
        assert!(e.to_string().contains("memo key 7"), "{e}");
    }

    #[test]
    fn a_list_appended_between_other_objects_keeps_its_order() {
        // l = []; APPENDS [1, 2]; then a dict is built; APPENDS [3] to l.
        let data = b"\x80\x04]\x94(K\x01K\x02e}(\x8c\x01k\x94K\x09u0h\x00(K\x03e.";
        let p = decode(data).unwrap();
        let items: Vec<i64> = p
            .items(p.root)
            .unwrap()
            .iter()
            .filter_map(|&v| p.i64(v))
            .collect();
        assert_eq!(items, vec![1, 2, 3]);
    }
}
