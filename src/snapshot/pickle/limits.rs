//! Bounds on what one input may make the decoder hold ([`Limits`], the
//! values an input of its size may decode to, the arena's size), and
//! [`room`], through which every vector sized by the input grows, so that
//! memory the system refuses is an error, never an abort.

use super::error::{DecodeError, Res};

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

/// What a [`DecodeError::Limit`] on [`Limits::max_values`] names.
pub const VALUES: &str = "number of values";

/// Arena objects at most (ids fit in [`V`](super::V) and leave the memo's
/// `MEMO_VALUE` free).
pub(super) const MAX_OBJECTS: usize = 1 << 29;

/// Room for `more` items in `v`, or [`DecodeError::Memory`] when the system
/// refuses it: every vector sized by the input grows through here, so an
/// input too big for the machine is an error, never an abort.
#[inline(always)]
pub(super) fn room<T>(v: &mut Vec<T>, more: usize, at: usize, what: &'static str) -> Res<()> {
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
