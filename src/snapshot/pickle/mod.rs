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
//!
//! The files, by concept: this one holds the public API (the value
//! types, [`Pickle`] and its accessors, the `decode` entry points);
//! `decoder` the opcode loop and its tight loop over memo gets and ints;
//! `shapes` the dicts that share a key shape and their one-step build;
//! `read` how opcode arguments are read; `stack`, `arena` and `memo` what
//! the opcodes make; `ints` and `proto0` the arguments that need decoding;
//! `limits` and `error` what bounds a decode and why it stops; `json` the
//! JSON view of small values.

mod arena;
mod decoder;
mod error;
mod ints;
mod json;
mod limits;
mod memo;
mod proto0;
mod read;
mod shapes;
mod stack;
#[cfg(test)]
mod tests;

pub use error::DecodeError;
pub use ints::long_from_le;
pub use limits::{Limits, SIZED_VALUES, VALUES, sized_values};

use decoder::decoder;

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
    pub(super) fn int(i: i64) -> Option<V> {
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
    /// A dict a [`Tap`] took: its values are gone from the pool. Reading it
    /// reads nothing and marks the pickle ([`Pickle::consumed_read`]).
    Consumed,
}

const _: () = assert!(std::mem::size_of::<Slot>() == 16);

/// Set once a consumed dict ([`Slot::Consumed`]) was read.
#[derive(Debug, Default)]
struct ReadFlag(std::sync::atomic::AtomicBool);

impl ReadFlag {
    #[cold]
    fn set(&self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Clone for ReadFlag {
    fn clone(&self) -> Self {
        ReadFlag(self.0.load(std::sync::atomic::Ordering::Relaxed).into())
    }
}

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
    consumed_read: ReadFlag,
}

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
const RELEASE_STEP: usize = 2 << 20;

/// Told how far the decoder has read (a byte offset, at the start and every
/// 2 MiB): the input before it is read again only for the strings the
/// result borrows.
pub type Release<'r> = &'r mut dyn FnMut(usize);

/// Told of each dict as a SETITEMS (or the one-step build) gives it a key
/// shape (`Layout::Shaped`: torch's trace entries, blocks and frames), on
/// the decoding thread, with the pickle as decoded so far: a long run of
/// such dicts (a trace's entries) can be read while its values are still
/// in cache, and handed on while the rest of the input is decoded. A dict
/// it takes and that takes more items later (pickle allows it; torch never
/// does) marks the pickle as if it was read ([`Pickle::consumed_read`]).
pub trait Tap<'a> {
    /// `dict` has just taken key shape `shape` ([`Pickle::shape_keys`]) and
    /// its first items, `values`. True: the tap has taken what it needs and
    /// the dict's values are dropped from the pickle
    /// ([`Pickle::consumed_read`] says whether anything read it then).
    fn dict(&mut self, p: &Pickle<'a>, dict: V, shape: u32, values: &[V]) -> bool;
}

/// [`decode_with`], calling `release` as the input is read and telling
/// `tap` of the dicts that take a key shape.
pub fn decode_tapped<'a>(
    data: &'a [u8],
    limits: Limits,
    release: Option<Release<'_>>,
    tap: Option<&mut dyn Tap<'a>>,
) -> Result<Pickle<'a>, DecodeError> {
    let mut d = decoder(data, limits, false);
    if release.is_some() {
        d.release_at = 0;
    }
    d.run_releasing(release, tap).map_err(|e| *e)
}

/// Decodes `data` to its STOP, stepping over the opcodes that would call
/// code instead of refusing at the first: protocols 0 and 1 have no header,
/// so only a whole decode tells a pickle from text that starts like one.
/// A pickle that holds code is still an error, [`DecodeError::Code`] for its
/// first such opcode, but only once the input proved to be a pickle.
pub fn decode_whole(data: &[u8], limits: Limits) -> Result<(), DecodeError> {
    decoder(data, limits, true).run().map(drop).map_err(|e| *e)
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
            Slot::Consumed => {
                self.consumed_read.set();
                return None;
            }
        })
    }

    /// Whether a dict a [`Tap`] consumed was read since (its values were
    /// gone: what read it saw nothing where the dict was).
    pub fn consumed_read(&self) -> bool {
        self.consumed_read
            .0
            .load(std::sync::atomic::Ordering::Relaxed)
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
            Slot::Consumed => {
                self.consumed_read.set();
                None
            }
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
            Slot::Consumed => {
                self.consumed_read.set();
                None
            }
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

    /// The keys of the dicts of key shape `shape` (`Layout::Shaped`).
    pub fn shape_keys(&self, shape: u32) -> &[V] {
        self.shapes.get(shape as usize).map_or(&[], |k| k)
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
