//! Dicts that share a key sequence (a "shape"): finding a dict's shape,
//! and building a dict of the shape matched last in one step from its
//! EMPTY_DICT to its SETITEMS.

use super::decoder::Decoder;
use super::decoder::simple_at;
use super::error::Res;
use super::{Container, Kind, Layout, Slot, V};

impl Decoder<'_> {
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
    pub(super) fn shaped_dict(&mut self, at: usize) -> Res<bool> {
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
        self.shaped = v;
        self.pos = pos + 1;
        Ok(true)
    }

    /// The shape id of the keys at `stack[from..]` (every other item), when
    /// they are all objects (str keys); new shapes are added up to a bound.
    pub(super) fn shape_of(&mut self, from: usize) -> Option<u32> {
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
}
