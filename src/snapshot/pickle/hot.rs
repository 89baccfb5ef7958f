//! The tight loop: memo gets and inline ints, most of a snapshot, decoded
//! with no error plumbing; anything unusual is left to the checked
//! dispatch in `run`.

use super::V;
use super::decoder::Decoder;
use super::memo::Memo;

impl Decoder<'_> {
    /// The bulk of a snapshot: memo gets and ints (dict keys and values),
    /// decoded with the input position in a register and no error plumbing
    /// (BENCHMARKS.md, "Snapshot decoding"). Stops at any other opcode, when
    /// the stack is out of room, and at anything unusual (fewer than 10 bytes
    /// left, a memo miss, an int that needs boxing): the dispatch in `run`
    /// then decodes or reports it.
    #[inline(always)]
    pub(super) fn hot(&mut self) {
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
}

/// The value of a memo get or an inline int at `data[pos..]`, and the
/// opcode's length; `None` for any other opcode, a memo miss or an int that
/// needs boxing (which the checked dispatch decodes or reports).
#[inline(always)]
pub(super) fn simple_at(data: &[u8], pos: usize, memo: &Memo) -> Option<(V, usize)> {
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
