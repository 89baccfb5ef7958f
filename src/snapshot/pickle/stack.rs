//! The stack and its MARKs: pushes (room counted as the stack grows),
//! pops that never reach below the innermost MARK, and MARK itself.

use super::V;
use super::decoder::Decoder;
use super::error::{DecodeError, Res};
use super::limits::room;

impl Decoder<'_> {
    /// Pushes onto the stack; its room is counted when it grows, not per push.
    #[inline(always)]
    pub(super) fn push(&mut self, v: V, at: usize) -> Res<()> {
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
    pub(super) fn floor(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    /// The top of the stack, above the innermost MARK (CPython refuses to
    /// reach below it too).
    #[inline]
    pub(super) fn top(&self, at: usize, op: u8) -> Res<V> {
        match self.stack.last() {
            Some(&v) if self.stack.len() > self.floor() => Ok(v),
            _ => Err(self.empty(at, op)),
        }
    }

    pub(super) fn pop(&mut self, at: usize, op: u8) -> Res<V> {
        let v = self.top(at, op)?;
        self.stack.pop();
        Ok(v)
    }

    pub(super) fn pop_mark(&mut self, at: usize, op: u8) -> Res<usize> {
        self.marks
            .pop()
            .ok_or_else(|| self.malformed(at, op, "no MARK open"))
    }

    #[inline(always)]
    pub(super) fn mark(&mut self, at: usize) -> Res<()> {
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
    pub(super) fn then_memoize_and_mark(&mut self) -> Res<()> {
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
}
