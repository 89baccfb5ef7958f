//! A pickle decoder for data-only pickles (protocols 0–5) that never executes
//! anything.
//!
//! Objects live in an arena ([`Pickle::objs`]); values refer to them by index,
//! so the memo keeps shared references shared (torch dedupes frame objects, and
//! the result must stay a DAG, not be expanded). Strings borrow from the input.
//!
//! Anything that would call code (GLOBAL, REDUCE, BUILD, …) makes the input
//! invalid: the error names the opcode, its byte offset and the callable.
//! The decoder is iterative (no recursion), checks every declared length
//! against the remaining input before slicing, and never sizes an allocation
//! from a length read from the input.

use std::borrow::Cow;
use std::collections::HashMap;
use thiserror::Error;

/// A decoded value: small scalars inline, everything else an arena index.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    /// An int in [2^63, 2^64): torch writes `MAX_UINT64` this way (pytorch#115234).
    UInt(u64),
    Float(f64),
    Ref(u32),
}

/// A heap object in the arena.
#[derive(Debug, Clone, PartialEq)]
pub enum Obj<'a> {
    Str(Cow<'a, str>),
    Bytes(Cow<'a, [u8]>),
    /// An int outside the u64/i64 range: little-endian two's complement.
    BigInt(Box<[u8]>),
    List(Vec<Value>),
    Tuple(Box<[Value]>),
    /// Key/value pairs in insertion order; a later duplicate key wins on lookup.
    Dict(Vec<(Value, Value)>),
    Set(Vec<Value>),
    FrozenSet(Box<[Value]>),
}

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
            | DecodeError::Limit { offset, .. } => *offset,
        }
    }
}

/// Bounds on what one input may make the decoder hold.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Open MARKs at once (the nesting depth of MARK-built containers).
    pub max_marks: usize,
    /// Values held in total (stack, memo and containers), 16 bytes each.
    pub max_values: u64,
}

impl Default for Limits {
    fn default() -> Self {
        // Real snapshots nest about 6 deep and hold roughly one value per
        // 3 input bytes; these bounds leave room for 100 GB inputs.
        Limits {
            max_marks: 1 << 16,
            max_values: 1 << 34,
        }
    }
}

/// A decoded pickle: the arena and the root value.
#[derive(Debug, Clone)]
pub struct Pickle<'a> {
    pub objs: Vec<Obj<'a>>,
    pub root: Value,
    /// The protocol named by the PROTO opcode (0 when absent).
    pub protocol: u8,
}

/// Decodes with the default [`Limits`].
pub fn decode(data: &[u8]) -> Result<Pickle<'_>, DecodeError> {
    decode_with(data, Limits::default())
}

/// Decodes `data` (one pickle; trailing bytes after STOP are ignored, as
/// `pickle.loads` does).
pub fn decode_with(data: &[u8], limits: Limits) -> Result<Pickle<'_>, DecodeError> {
    Decoder {
        data,
        pos: 0,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: Vec::new(),
        sparse_memo: HashMap::new(),
        objs: Vec::new(),
        values: 0,
        limits,
        protocol: 0,
    }
    .run()
}

struct Decoder<'a> {
    data: &'a [u8],
    pos: usize,
    stack: Vec<Value>,
    marks: Vec<usize>,
    /// Dense memo (MEMOIZE and in-order PUTs); out-of-order indices go to `sparse_memo`
    /// so a huge declared index cannot size an allocation.
    memo: Vec<Value>,
    sparse_memo: HashMap<u64, Value>,
    objs: Vec<Obj<'a>>,
    /// Values created so far (a running bound on memory).
    values: u64,
    limits: Limits,
    protocol: u8,
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
    fn run(mut self) -> Result<Pickle<'a>, DecodeError> {
        loop {
            let at = self.pos;
            let Some(&op) = self.data.get(at) else {
                return Err(DecodeError::Truncated {
                    offset: at,
                    what: "the pickle (no STOP opcode)",
                });
            };
            self.pos += 1;
            match op {
                0x80 => {
                    let p = self.take(1, at, op)?[0];
                    if p > 5 {
                        return Err(DecodeError::Protocol {
                            offset: at,
                            protocol: p,
                        });
                    }
                    self.protocol = p;
                }
                0x95 => {
                    // FRAME: the input is contiguous, so only check the length fits.
                    let len = self.le_u64(8, at, op)?;
                    if len > self.remaining() as u64 {
                        return Err(self.truncated(at, op));
                    }
                }
                b'.' => {
                    let root = self.pop(at, op)?;
                    return Ok(Pickle {
                        objs: self.objs,
                        root,
                        protocol: self.protocol,
                    });
                }
                b'(' => {
                    if self.marks.len() >= self.limits.max_marks {
                        return Err(DecodeError::Limit {
                            offset: at,
                            what: "MARK nesting",
                            limit: self.limits.max_marks as u64,
                        });
                    }
                    self.marks.push(self.stack.len());
                }
                b'0' => {
                    self.pop(at, op)?;
                }
                b'1' => {
                    let m = self.pop_mark(at, op)?;
                    self.stack.truncate(m);
                }
                b'2' => {
                    let v = *self.stack.last().ok_or_else(|| self.empty(at, op))?;
                    self.push(v, at)?;
                }
                b'N' => self.push(Value::None, at)?,
                0x88 => self.push(Value::Bool(true), at)?,
                0x89 => self.push(Value::Bool(false), at)?,
                b'J' => {
                    let b = self.take(4, at, op)?;
                    let v = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                    self.push(Value::Int(v.into()), at)?;
                }
                b'K' => {
                    let v = self.take(1, at, op)?[0];
                    self.push(Value::Int(v.into()), at)?;
                }
                b'M' => {
                    let b = self.take(2, at, op)?;
                    self.push(Value::Int(u16::from_le_bytes([b[0], b[1]]).into()), at)?;
                }
                0x8a => {
                    let n = self.take(1, at, op)?[0] as usize;
                    let b = self.take(n, at, op)?;
                    let v = self.long_le(b, at)?;
                    self.push(v, at)?;
                }
                0x8b => {
                    let n = self.len_i32(at, op)?;
                    let b = self.take(n, at, op)?;
                    let v = self.long_le(b, at)?;
                    self.push(v, at)?;
                }
                b'G' => {
                    let b = self.take(8, at, op)?;
                    let mut a = [0u8; 8];
                    a.copy_from_slice(b);
                    self.push(Value::Float(f64::from_be_bytes(a)), at)?;
                }
                b'I' => {
                    let line = self.line(at, op)?;
                    let v = match line {
                        b"01" => Value::Bool(true),
                        b"00" => Value::Bool(false),
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
                    let v = std::str::from_utf8(line)
                        .ok()
                        .and_then(|s| s.trim().parse::<f64>().ok())
                        .ok_or_else(|| self.malformed(at, op, "not a float"))?;
                    self.push(Value::Float(v), at)?;
                }
                // Byte strings: Python 3 decodes protocol 0–2 `str` as ASCII by default.
                b'T' => {
                    let n = self.len_i32(at, op)?;
                    let b = self.take(n, at, op)?;
                    self.push_str_bytes(b, at)?;
                }
                b'U' => {
                    let n = self.take(1, at, op)?[0] as usize;
                    let b = self.take(n, at, op)?;
                    self.push_str_bytes(b, at)?;
                }
                b'S' => {
                    let line = self.line(at, op)?;
                    let s = unquote_string(line).ok_or_else(|| {
                        self.malformed(at, op, "the STRING opcode argument must be quoted")
                    })?;
                    let v = self.alloc(Obj::Str(Cow::Owned(s)), at)?;
                    self.push(v, at)?;
                }
                b'V' => {
                    let line = self.line(at, op)?;
                    let s = raw_unicode_unescape(line);
                    let v = self.alloc(Obj::Str(Cow::Owned(s)), at)?;
                    self.push(v, at)?;
                }
                b'X' => {
                    let n = self.len_u32(at, op)?;
                    let b = self.take(n, at, op)?;
                    self.push_utf8(b, at)?;
                }
                0x8c => {
                    let n = self.take(1, at, op)?[0] as usize;
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
                    let v = self.alloc(Obj::Bytes(Cow::Borrowed(b)), at)?;
                    self.push(v, at)?;
                }
                b'C' => {
                    let n = self.take(1, at, op)?[0] as usize;
                    let b = self.take(n, at, op)?;
                    let v = self.alloc(Obj::Bytes(Cow::Borrowed(b)), at)?;
                    self.push(v, at)?;
                }
                0x8e | 0x96 => {
                    let n = self.len_u64(at, op)?;
                    let b = self.take(n, at, op)?;
                    let v = self.alloc(Obj::Bytes(Cow::Borrowed(b)), at)?;
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
                    self.stack.last().ok_or_else(|| self.empty(at, op))?;
                }
                b')' => {
                    let v = self.alloc(Obj::Tuple(Box::new([])), at)?;
                    self.push(v, at)?;
                }
                b']' => {
                    let v = self.alloc(Obj::List(Vec::new()), at)?;
                    self.push(v, at)?;
                }
                b'}' => {
                    let v = self.alloc(Obj::Dict(Vec::new()), at)?;
                    self.push(v, at)?;
                }
                0x8f => {
                    let v = self.alloc(Obj::Set(Vec::new()), at)?;
                    self.push(v, at)?;
                }
                0x85..=0x87 => {
                    let n = usize::from(op - 0x84);
                    let from = self
                        .stack
                        .len()
                        .checked_sub(n)
                        .ok_or_else(|| self.empty(at, op))?;
                    let items: Box<[Value]> = self.stack.drain(from..).collect();
                    let v = self.alloc(Obj::Tuple(items), at)?;
                    self.push(v, at)?;
                }
                b't' => {
                    let m = self.pop_mark(at, op)?;
                    let items: Box<[Value]> = self.stack.drain(m..).collect();
                    let v = self.alloc(Obj::Tuple(items), at)?;
                    self.push(v, at)?;
                }
                b'l' => {
                    let m = self.pop_mark(at, op)?;
                    let items: Vec<Value> = self.stack.drain(m..).collect();
                    let v = self.alloc(Obj::List(items), at)?;
                    self.push(v, at)?;
                }
                0x91 => {
                    let m = self.pop_mark(at, op)?;
                    let items: Box<[Value]> = self.stack.drain(m..).collect();
                    let v = self.alloc(Obj::FrozenSet(items), at)?;
                    self.push(v, at)?;
                }
                b'd' => {
                    let m = self.pop_mark(at, op)?;
                    let pairs = pairs_from(&mut self.stack, m)
                        .ok_or_else(|| self.malformed(at, op, "odd number of items"))?;
                    let v = self.alloc(Obj::Dict(pairs), at)?;
                    self.push(v, at)?;
                }
                b'a' => {
                    let item = self.pop(at, op)?;
                    let target = self.top_obj(at, op)?;
                    match target {
                        Obj::List(l) => l.push(item),
                        _ => return Err(self.malformed(at, op, "target is not a list")),
                    }
                }
                b'e' => {
                    let m = self.pop_mark(at, op)?;
                    let target = m
                        .checked_sub(1)
                        .and_then(|i| self.stack.get(i).copied())
                        .ok_or_else(|| self.empty(at, op))?;
                    let Value::Ref(r) = target else {
                        return Err(self.malformed(at, op, "target is not a list"));
                    };
                    match self.objs.get_mut(r as usize) {
                        Some(Obj::List(l)) => l.extend(self.stack.drain(m..)),
                        _ => return Err(self.malformed(at, op, "target is not a list")),
                    }
                }
                0x90 => {
                    let m = self.pop_mark(at, op)?;
                    let target = m
                        .checked_sub(1)
                        .and_then(|i| self.stack.get(i).copied())
                        .ok_or_else(|| self.empty(at, op))?;
                    let Value::Ref(r) = target else {
                        return Err(self.malformed(at, op, "target is not a set"));
                    };
                    match self.objs.get_mut(r as usize) {
                        Some(Obj::Set(s)) => s.extend(self.stack.drain(m..)),
                        _ => return Err(self.malformed(at, op, "target is not a set")),
                    }
                }
                b's' => {
                    let value = self.pop(at, op)?;
                    let key = self.pop(at, op)?;
                    match self.top_obj(at, op)? {
                        Obj::Dict(d) => d.push((key, value)),
                        _ => return Err(self.malformed(at, op, "target is not a dict")),
                    }
                }
                b'u' => {
                    let m = self.pop_mark(at, op)?;
                    let target = m
                        .checked_sub(1)
                        .and_then(|i| self.stack.get(i).copied())
                        .ok_or_else(|| self.empty(at, op))?;
                    let Value::Ref(r) = target else {
                        return Err(self.malformed(at, op, "target is not a dict"));
                    };
                    let pairs = pairs_from(&mut self.stack, m);
                    match (self.objs.get_mut(r as usize), pairs) {
                        (Some(Obj::Dict(d)), Some(p)) => d.extend(p),
                        (Some(Obj::Dict(_)), None) => {
                            return Err(self.malformed(at, op, "odd number of items"));
                        }
                        _ => return Err(self.malformed(at, op, "target is not a dict")),
                    }
                }
                0x94 => {
                    let v = *self.stack.last().ok_or_else(|| self.empty(at, op))?;
                    let idx = self.memo.len() as u64;
                    self.memo_put(idx, v, at)?;
                }
                b'q' => {
                    let idx = self.take(1, at, op)?[0].into();
                    self.put_top(idx, at, op)?;
                }
                b'r' => {
                    let idx = self.le_u64(4, at, op)?;
                    self.put_top(idx, at, op)?;
                }
                b'p' => {
                    let line = self.line(at, op)?;
                    let idx =
                        parse_index(line).ok_or_else(|| self.malformed(at, op, "bad index"))?;
                    self.put_top(idx, at, op)?;
                }
                b'h' => {
                    let idx = self.take(1, at, op)?[0].into();
                    self.get(idx, at, op)?;
                }
                b'j' => {
                    let idx = self.le_u64(4, at, op)?;
                    self.get(idx, at, op)?;
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
                    return Err(DecodeError::Code {
                        offset: at,
                        opcode: opcode_name(op),
                        callable: format!(
                            "{} {}",
                            String::from_utf8_lossy(module),
                            String::from_utf8_lossy(name)
                        ),
                    });
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
                    return Err(DecodeError::Code {
                        offset: at,
                        opcode: opcode_name(op),
                        callable,
                    });
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
                    return Err(DecodeError::Code {
                        offset: at,
                        opcode: opcode_name(op),
                        callable,
                    });
                }
                b'P' => {
                    let id = self.line(at, op)?;
                    return Err(DecodeError::Code {
                        offset: at,
                        opcode: opcode_name(op),
                        callable: format!("persistent_load({:?})", String::from_utf8_lossy(id)),
                    });
                }
                0x82..=0x84 => {
                    let n = match op {
                        0x82 => 1,
                        0x83 => 2,
                        _ => 4,
                    };
                    let code = self.le_u64(n, at, op)?;
                    return Err(DecodeError::Code {
                        offset: at,
                        opcode: opcode_name(op),
                        callable: format!("the copyreg extension registered as code {code}"),
                    });
                }
                _ => {
                    return Err(DecodeError::UnknownOpcode {
                        offset: at,
                        opcode: op,
                    });
                }
            }
        }
    }

    fn remaining(&self) -> usize {
        self.data.len().saturating_sub(self.pos)
    }

    /// The next `n` bytes; `n` comes from the input, so it is checked first.
    fn take(&mut self, n: usize, at: usize, op: u8) -> Result<&'a [u8], DecodeError> {
        if n > self.remaining() {
            return Err(self.truncated(at, op));
        }
        let data: &'a [u8] = self.data;
        let s = data
            .get(self.pos..self.pos + n)
            .ok_or_else(|| self.truncated(at, op))?;
        self.pos += n;
        Ok(s)
    }

    fn le_u64(&mut self, n: usize, at: usize, op: u8) -> Result<u64, DecodeError> {
        let b = self.take(n, at, op)?;
        Ok(b.iter()
            .rev()
            .fold(0u64, |acc, &x| (acc << 8) | u64::from(x)))
    }

    fn len_u32(&mut self, at: usize, op: u8) -> Result<usize, DecodeError> {
        let n = self.le_u64(4, at, op)?;
        self.fits(n, at, op)
    }

    fn len_u64(&mut self, at: usize, op: u8) -> Result<usize, DecodeError> {
        let n = self.le_u64(8, at, op)?;
        self.fits(n, at, op)
    }

    fn len_i32(&mut self, at: usize, op: u8) -> Result<usize, DecodeError> {
        let b = self.take(4, at, op)?;
        let n = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        if n < 0 {
            return Err(self.malformed(at, op, "negative length"));
        }
        self.fits(n as u64, at, op)
    }

    /// A declared length must fit in what is left of the input.
    fn fits(&self, n: u64, at: usize, op: u8) -> Result<usize, DecodeError> {
        if n > self.remaining() as u64 {
            return Err(DecodeError::Truncated {
                offset: at,
                what: opcode_name(op),
            });
        }
        Ok(n as usize)
    }

    /// A newline-terminated argument (protocol 0), without the newline.
    fn line(&mut self, at: usize, op: u8) -> Result<&'a [u8], DecodeError> {
        let data: &'a [u8] = self.data;
        let rest = data.get(self.pos..).unwrap_or_default();
        let n = memchr::memchr(b'\n', rest).ok_or_else(|| self.truncated(at, op))?;
        self.pos += n + 1;
        Ok(&rest[..n])
    }

    fn truncated(&self, at: usize, op: u8) -> DecodeError {
        DecodeError::Truncated {
            offset: at,
            what: opcode_name(op),
        }
    }

    fn malformed(&self, at: usize, op: u8, problem: &str) -> DecodeError {
        DecodeError::Malformed {
            offset: at,
            opcode: opcode_name(op),
            problem: problem.into(),
        }
    }

    fn empty(&self, at: usize, op: u8) -> DecodeError {
        self.malformed(at, op, "stack underflow")
    }

    fn count(&mut self, n: u64, at: usize) -> Result<(), DecodeError> {
        self.values += n;
        if self.values > self.limits.max_values {
            return Err(DecodeError::Limit {
                offset: at,
                what: "number of values",
                limit: self.limits.max_values,
            });
        }
        Ok(())
    }

    fn push(&mut self, v: Value, at: usize) -> Result<(), DecodeError> {
        self.count(1, at)?;
        self.stack.push(v);
        Ok(())
    }

    fn pop(&mut self, at: usize, op: u8) -> Result<Value, DecodeError> {
        // Popping below the innermost MARK would corrupt it, as CPython also refuses.
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return Err(self.empty(at, op));
        }
        self.stack.pop().ok_or_else(|| self.empty(at, op))
    }

    fn pop_mark(&mut self, at: usize, op: u8) -> Result<usize, DecodeError> {
        self.marks
            .pop()
            .ok_or_else(|| self.malformed(at, op, "no MARK open"))
    }

    fn alloc(&mut self, obj: Obj<'a>, at: usize) -> Result<Value, DecodeError> {
        let id = u32::try_from(self.objs.len()).map_err(|_| DecodeError::Limit {
            offset: at,
            what: "number of objects",
            limit: u64::from(u32::MAX),
        })?;
        self.count(2, at)?;
        self.objs.push(obj);
        Ok(Value::Ref(id))
    }

    fn top_obj(&mut self, at: usize, op: u8) -> Result<&mut Obj<'a>, DecodeError> {
        let floor = self.marks.last().copied().unwrap_or(0);
        let top = match self.stack.last() {
            Some(Value::Ref(r)) if self.stack.len() > floor => *r,
            _ => return Err(self.malformed(at, op, "no container on the stack")),
        };
        let err = self.malformed(at, op, "no container on the stack");
        self.objs.get_mut(top as usize).ok_or(err)
    }

    fn put_top(&mut self, idx: u64, at: usize, op: u8) -> Result<(), DecodeError> {
        let v = *self.stack.last().ok_or_else(|| self.empty(at, op))?;
        self.memo_put(idx, v, at)
    }

    fn memo_put(&mut self, idx: u64, v: Value, at: usize) -> Result<(), DecodeError> {
        self.count(1, at)?;
        let len = self.memo.len() as u64;
        if idx < len {
            self.memo[idx as usize] = v;
        } else if idx == len {
            self.memo.push(v);
        } else {
            self.sparse_memo.insert(idx, v);
        }
        Ok(())
    }

    fn get(&mut self, idx: u64, at: usize, op: u8) -> Result<(), DecodeError> {
        let v = usize::try_from(idx)
            .ok()
            .and_then(|i| self.memo.get(i).copied())
            .or_else(|| self.sparse_memo.get(&idx).copied())
            .ok_or_else(|| self.malformed(at, op, &format!("memo key {idx} was never stored")))?;
        self.push(v, at)
    }

    fn push_utf8(&mut self, b: &'a [u8], at: usize) -> Result<(), DecodeError> {
        // Python writes lone surrogates with "surrogatepass": keep what decodes.
        let s = match std::str::from_utf8(b) {
            Ok(s) => Cow::Borrowed(s),
            Err(_) => Cow::Owned(String::from_utf8_lossy(b).into_owned()),
        };
        let v = self.alloc(Obj::Str(s), at)?;
        self.push(v, at)
    }

    fn push_str_bytes(&mut self, b: &'a [u8], at: usize) -> Result<(), DecodeError> {
        self.push_utf8(b, at)
    }

    /// LONG1/LONG4 payload: little-endian two's complement of any length.
    fn long_le(&mut self, b: &[u8], at: usize) -> Result<Value, DecodeError> {
        match long_from_le(b) {
            Some(v) => Ok(v),
            None => self.alloc(Obj::BigInt(b.into()), at),
        }
    }

    /// A protocol 0 decimal int (INT or LONG); too big for u64 becomes a BigInt.
    fn decimal(&mut self, digits: &[u8], at: usize, op: u8) -> Result<Value, DecodeError> {
        let s = std::str::from_utf8(digits)
            .map_err(|_| self.malformed(at, op, "not a number"))?
            .trim();
        if let Ok(v) = s.parse::<i64>() {
            return Ok(Value::Int(v));
        }
        if let Ok(v) = s.parse::<u64>() {
            return Ok(Value::UInt(v));
        }
        let le = decimal_to_le(s).ok_or_else(|| self.malformed(at, op, "not a number"))?;
        self.alloc(Obj::BigInt(le.into_boxed_slice()), at)
    }

    /// A short description of a stack value for refusal messages.
    fn describe(&self, v: Value) -> String {
        match v {
            Value::Ref(r) => match self.objs.get(r as usize) {
                Some(Obj::Str(s)) => s.chars().take(80).collect(),
                Some(Obj::Tuple(_)) => "a tuple".into(),
                Some(Obj::List(_)) => "a list".into(),
                Some(Obj::Dict(_)) => "a dict".into(),
                _ => "an object".into(),
            },
            Value::None => "None".into(),
            other => format!("{other:?}"),
        }
    }
}

/// Drains `stack[m..]` as key/value pairs; `None` for an odd count.
fn pairs_from(stack: &mut Vec<Value>, m: usize) -> Option<Vec<(Value, Value)>> {
    let items = stack.get(m..)?;
    if items.len() % 2 != 0 {
        return None;
    }
    let pairs = items.chunks_exact(2).map(|c| (c[0], c[1])).collect();
    stack.truncate(m);
    Some(pairs)
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
    pub fn obj(&self, v: Value) -> Option<&Obj<'a>> {
        match v {
            Value::Ref(r) => self.objs.get(r as usize),
            _ => None,
        }
    }

    pub fn str(&self, v: Value) -> Option<&str> {
        match self.obj(v)? {
            Obj::Str(s) => Some(s),
            _ => None,
        }
    }

    /// Items of a list or tuple.
    pub fn items(&self, v: Value) -> Option<&[Value]> {
        match self.obj(v)? {
            Obj::List(l) => Some(l),
            Obj::Tuple(t) => Some(t),
            _ => None,
        }
    }

    pub fn dict(&self, v: Value) -> Option<&[(Value, Value)]> {
        match self.obj(v)? {
            Obj::Dict(d) => Some(d),
            _ => None,
        }
    }

    /// `d[key]` for a str key (the last assignment wins, as in Python).
    pub fn get(&self, d: Value, key: &str) -> Option<Value> {
        self.dict(d)?
            .iter()
            .rev()
            .find(|(k, _)| self.str(*k) == Some(key))
            .map(|(_, v)| *v)
    }

    pub fn u64(v: Value) -> Option<u64> {
        match v {
            Value::Int(i) => u64::try_from(i).ok(),
            Value::UInt(u) => Some(u),
            Value::Bool(b) => Some(u64::from(b)),
            _ => None,
        }
    }

    pub fn i64(v: Value) -> Option<i64> {
        match v {
            Value::Int(i) => Some(i),
            Value::Bool(b) => Some(i64::from(b)),
            _ => None,
        }
    }

    pub fn f64(v: Value) -> Option<f64> {
        match v {
            Value::Float(f) => Some(f),
            Value::Int(i) => Some(i as f64),
            Value::UInt(u) => Some(u as f64),
            _ => None,
        }
    }

    pub fn bool(v: Value) -> Option<bool> {
        match v {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// Distinct objects reachable from the root (each shared object counted
    /// once, so a memo bomb stays linear); iterative, for any nesting depth.
    pub fn reachable_objects(&self) -> usize {
        let mut seen = vec![false; self.objs.len()];
        let mut todo = vec![self.root];
        let mut n = 0;
        while let Some(v) = todo.pop() {
            let Value::Ref(r) = v else { continue };
            match seen.get_mut(r as usize) {
                Some(s) if !*s => *s = true,
                _ => continue,
            }
            n += 1;
            match self.obj(v) {
                Some(Obj::List(l) | Obj::Set(l)) => todo.extend_from_slice(l),
                Some(Obj::Tuple(t) | Obj::FrozenSet(t)) => todo.extend_from_slice(t),
                Some(Obj::Dict(d)) => {
                    for (k, v) in d {
                        todo.push(*k);
                        todo.push(*v);
                    }
                }
                _ => {}
            }
        }
        n
    }

    /// The value as JSON, for small recorded dicts (`allocator_settings`).
    /// Containers nested deeper than `max_depth` become `null`; iterative.
    pub fn to_json(&self, v: Value, max_depth: usize) -> serde_json::Value {
        use serde_json::Value as J;
        enum Slot {
            Top,
            Arr(usize),
            Obj(usize, String),
        }
        // Frames being built: the container and where it goes when finished.
        /// A container being filled, where it goes, and its children still to visit.
        type Frame = (J, Slot, std::vec::IntoIter<(String, Value)>);
        let mut frames: Vec<Frame> = Vec::new();
        let mut result = J::Null;
        let scalar = |v: Value| -> Option<J> {
            Some(match v {
                Value::None => J::Null,
                Value::Bool(b) => J::Bool(b),
                Value::Int(i) => J::from(i),
                Value::UInt(u) => J::from(u),
                Value::Float(f) => serde_json::Number::from_f64(f).map_or(J::Null, J::Number),
                Value::Ref(_) => return None,
            })
        };
        let place = |frames: &mut Vec<Frame>, result: &mut J, slot: Slot, val: J| match slot {
            Slot::Top => *result = val,
            Slot::Arr(i) => {
                if let Some((J::Array(a), _, _)) = frames.get_mut(i) {
                    a.push(val);
                }
            }
            Slot::Obj(i, k) => {
                if let Some((J::Object(o), _, _)) = frames.get_mut(i) {
                    o.insert(k, val);
                }
            }
        };
        // Depth-first with an explicit stack: each container gets a frame that
        // hands out its children one by one, then is placed into its parent.
        let mut next: Option<(Value, Slot)> = Some((v, Slot::Top));
        loop {
            if let Some((v, slot)) = next.take() {
                if let Some(j) = scalar(v) {
                    place(&mut frames, &mut result, slot, j);
                } else {
                    let children: Option<(J, Vec<(String, Value)>)> = match self.obj(v) {
                        _ if frames.len() >= max_depth => None,
                        Some(Obj::Str(s)) => {
                            place(&mut frames, &mut result, slot, J::String(s.to_string()));
                            continue;
                        }
                        Some(Obj::Bytes(b)) => {
                            let s = String::from_utf8_lossy(b).into_owned();
                            place(&mut frames, &mut result, slot, J::String(s));
                            continue;
                        }
                        Some(Obj::List(l) | Obj::Set(l)) => Some((
                            J::Array(Vec::new()),
                            l.iter().map(|x| (String::new(), *x)).collect(),
                        )),
                        Some(Obj::Tuple(t) | Obj::FrozenSet(t)) => Some((
                            J::Array(Vec::new()),
                            t.iter().map(|x| (String::new(), *x)).collect(),
                        )),
                        Some(Obj::Dict(d)) => Some((
                            J::Object(serde_json::Map::new()),
                            d.iter().map(|(k, x)| (self.key_text(*k), *x)).collect(),
                        )),
                        Some(Obj::BigInt(_)) | None => None,
                    };
                    match children {
                        Some((container, kids)) => frames.push((container, slot, kids.into_iter())),
                        None => place(&mut frames, &mut result, slot, J::Null),
                    }
                }
            }
            // Advance the innermost frame.
            let Some(depth) = frames.len().checked_sub(1) else {
                break;
            };
            let is_obj = matches!(frames[depth].0, J::Object(_));
            match frames[depth].2.next() {
                Some((k, child)) => {
                    let slot = if is_obj {
                        Slot::Obj(depth, k)
                    } else {
                        Slot::Arr(depth)
                    };
                    next = Some((child, slot));
                }
                None => {
                    if let Some((done, slot, _)) = frames.pop() {
                        place(&mut frames, &mut result, slot, done);
                    }
                }
            }
        }
        result
    }

    /// A dict key as text (torch stringifies keys; ints are written in decimal).
    fn key_text(&self, k: Value) -> String {
        match k {
            Value::Int(i) => i.to_string(),
            Value::UInt(u) => u.to_string(),
            Value::Bool(b) => if b { "True" } else { "False" }.into(),
            Value::None => "None".into(),
            Value::Float(f) => f.to_string(),
            Value::Ref(_) => self.str(k).unwrap_or("?").to_string(),
        }
    }
}
