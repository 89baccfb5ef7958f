//! What the opcodes make in the arena: objects (each counted against the
//! values limit), containers and their items in the pool (or a vector of
//! their own), and strings, byte strings and wide ints in side tables.

use super::decoder::Decoder;
use super::error::{DecodeError, Fail, Res};
use super::limits::{MAX_OBJECTS, room};
use super::{Container, Kind, Layout, Obj, Slot, V, Value};

impl<'a> Decoder<'a> {
    /// Counts `n` more values held (objects, pooled items, memo entries,
    /// stack room) against the limit.
    #[inline(always)]
    pub(super) fn count(&mut self, n: u64, at: usize) -> Res<()> {
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

    #[inline(always)]
    pub(super) fn alloc(&mut self, slot: Slot, at: usize) -> Res<V> {
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
    pub(super) fn int(&mut self, i: i64, at: usize) -> Res<V> {
        match V::int(i) {
            Some(v) => Ok(v),
            None => self.alloc(Slot::Int(i), at),
        }
    }

    pub(super) fn new_container(&mut self, kind: Kind, at: usize) -> Res<()> {
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
    pub(super) fn build(&mut self, kind: Kind, from: usize, at: usize) -> Res<()> {
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
    pub(super) fn extend_marked(&mut self, kind: Kind, at: usize, op: u8) -> Res<()> {
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
    pub(super) fn extend(
        &mut self,
        target: V,
        kind: Kind,
        from: usize,
        at: usize,
        op: u8,
    ) -> Res<()> {
        let wrong = || match kind {
            Kind::Dict => "target is not a dict",
            Kind::Set => "target is not a set",
            _ => "target is not a list",
        };
        let slot = target.id().and_then(|id| self.p.slots.get(id as usize));
        if slot == Some(&Slot::Consumed) && kind == Kind::Dict {
            // Items for a dict a tap consumed: the pickle is no longer what
            // the input holds, as its reader learns from the flag.
            self.p.consumed_read.set();
            self.stack.truncate(from);
            return Ok(());
        }
        let Some(Slot::Container(c)) = slot else {
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
                if slot.layout == Layout::Shaped {
                    self.shaped = target;
                }
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

    pub(super) fn push_utf8(&mut self, b: &'a [u8], at: usize) -> Res<()> {
        // Python writes lone surrogates with "surrogatepass": keep what decodes.
        let v = self.text(String::from_utf8_lossy(b), at)?;
        self.push(v, at)
    }

    pub(super) fn text(&mut self, s: std::borrow::Cow<'a, str>, at: usize) -> Res<V> {
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

    pub(super) fn bytes(&mut self, b: &'a [u8], at: usize) -> Res<V> {
        let i = side_index(self.p.bytes.len(), at)?;
        self.count(2, at)?;
        let v = self.alloc(Slot::Bytes(i), at)?;
        room(&mut self.p.bytes, 1, at, "byte strings")?;
        self.p.bytes.push(b);
        Ok(v)
    }

    pub(super) fn bigint(&mut self, le: Box<[u8]>, at: usize) -> Res<V> {
        let i = side_index(self.p.bigints.len(), at)?;
        self.count(2 + le.len().div_ceil(8) as u64, at)?;
        let v = self.alloc(Slot::BigInt(i), at)?;
        room(&mut self.p.bigints, 1, at, "wide ints")?;
        self.p.bigints.push(le);
        Ok(v)
    }

    /// A short description of a stack value for refusal messages.
    pub(super) fn describe(&self, v: V) -> String {
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
