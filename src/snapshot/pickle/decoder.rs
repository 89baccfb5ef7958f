//! The decoder: its state, the tight loop over memo gets and ints
//! ([`Decoder::hot`]), and the opcode loop that dispatches every opcode it
//! leaves, checked, refusing any that would call code (or stepping over
//! them, for [`decode_whole`](super::decode_whole)). The tight loop stays
//! beside its caller: in a module of its own it compiled to 0.45 % more
//! instructions for `parse` of a large snapshot (cachegrind).

use super::error::{DecodeError, Res};
use super::limits::{Limits, SIZED_VALUES, VALUES, sized_values};
use super::memo::Memo;
use super::proto0::{parse_index, raw_unicode_unescape, unquote_string};
use super::read::opcode_name;
use super::{Kind, Layout, Pickle, RELEASE_STEP, Release, Slot, Tap, V};
use crate::snapshot::grow::{Prefault, reserved};
use std::collections::HashMap;

pub(super) fn decoder(data: &[u8], limits: Limits, defer_code: bool) -> Decoder<'_> {
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
            consumed_read: Default::default(),
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
        shaped: V::NONE,
    }
}

pub(super) struct Decoder<'a> {
    pub(super) data: &'a [u8],
    pub(super) pos: usize,
    pub(super) stack: Vec<V>,
    pub(super) marks: Vec<usize>,
    pub(super) memo: Memo,
    pub(super) pool_ahead: Prefault,
    pub(super) slots_ahead: Prefault,
    pub(super) p: Pickle<'a>,
    pub(super) shape_ids: HashMap<Box<[V]>, u32>,
    /// The shape matched last, tried first.
    pub(super) last_shape: u32,
    /// Values counted so far against [`Limits::max_values`].
    pub(super) values: u64,
    /// The limits, `max_values` already the lesser of it and [`sized_values`].
    pub(super) limits: Limits,
    /// What the values limit is named in its error ([`VALUES`] or [`SIZED_VALUES`]).
    pub(super) values_what: &'static str,
    /// Step over code opcodes (see [`decode_whole`](super::decode_whole)), keeping the first
    /// in `code`.
    pub(super) defer_code: bool,
    pub(super) code: Option<DecodeError>,
    /// The input offset at which a [`Release`] hook is called next.
    pub(super) release_at: usize,
    /// The dict a SETITEMS or the one-step build just gave a key shape, for
    /// a [`Tap`] (else `NONE`).
    pub(super) shaped: V,
}

impl<'a> Decoder<'a> {
    pub(super) fn run(self) -> Res<Pickle<'a>> {
        self.run_releasing(None, None)
    }

    /// Tells `tap` of the dict that just took the key shape matched last
    /// (by SETITEMS or the one-step build: its values end the pool), if
    /// any, and drops its values if the tap takes them.
    fn tap_shaped(&mut self, tap: &mut Option<&mut dyn Tap<'a>>) {
        let d = std::mem::replace(&mut self.shaped, V::NONE);
        let Some(tap) = tap.as_mut().filter(|_| d != V::NONE) else {
            return;
        };
        let shape = self.last_shape;
        let n = self.p.shape_keys(shape).len();
        let (Some(id), Some(start)) = (d.id(), self.p.pool.len().checked_sub(n)) else {
            return;
        };
        let id = id as usize;
        let built = matches!(self.p.slots.get(id), Some(Slot::Container(c))
            if c.layout == Layout::Shaped && c.len == shape && c.start == start as u64);
        if built && tap.dict(&self.p, d, shape, &self.p.pool[start..]) {
            self.p.pool.truncate(start);
            self.p.slots[id] = Slot::Consumed;
        }
    }

    pub(super) fn run_releasing(
        mut self,
        mut release: Option<Release<'_>>,
        mut tap: Option<&mut dyn Tap<'a>>,
    ) -> Res<Pickle<'a>> {
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
                    if self.shaped_dict(at)? {
                        self.tap_shaped(&mut tap);
                    } else {
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
                b'u' => {
                    self.extend_marked(Kind::Dict, at, op)?;
                    self.tap_shaped(&mut tap);
                }
                b'e' => self.extend_marked(Kind::List, at, op)?,
                0x90 => self.extend_marked(Kind::Set, at, op)?,
                b's' => {
                    let n = self.stack.len();
                    if n < 3 || n - 2 <= self.floor() {
                        return Err(self.empty(at, op));
                    }
                    let target = self.stack[n - 3];
                    self.extend(target, Kind::Dict, n - 2, at, op)?;
                    // Built item by item (protocol 0): more items may come,
                    // so a tap is not told.
                    self.shaped = V::NONE;
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
