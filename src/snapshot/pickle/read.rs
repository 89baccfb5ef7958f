//! Reading opcode arguments from the input: fixed-width and declared
//! lengths (each checked against what is left before slicing), protocol
//! 0's newline-terminated lines, and the errors that name the opcode.

use super::decoder::Decoder;
use super::error::{DecodeError, Fail, Res};

/// Opcode names as `pickletools` spells them (used in errors).
pub(super) fn opcode_name(op: u8) -> &'static str {
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
    pub(super) fn remaining(&self) -> usize {
        self.data.len().saturating_sub(self.pos)
    }

    /// The next `n` bytes; `n` comes from the input, so it is checked first.
    #[inline]
    pub(super) fn take(&mut self, n: usize, at: usize, op: u8) -> Res<&'a [u8]> {
        let data: &'a [u8] = self.data;
        match data.get(self.pos..).and_then(|rest| rest.get(..n)) {
            Some(s) => {
                self.pos += n;
                Ok(s)
            }
            None => Err(self.truncated(at, op)),
        }
    }

    pub(super) fn le_u64(&mut self, n: usize, at: usize, op: u8) -> Res<u64> {
        let b = self.take(n, at, op)?;
        Ok(b.iter()
            .rev()
            .fold(0u64, |acc, &x| (acc << 8) | u64::from(x)))
    }

    pub(super) fn len_u32(&mut self, at: usize, op: u8) -> Res<usize> {
        let n = self.le_u64(4, at, op)?;
        self.fits(n, at, op)
    }

    pub(super) fn len_u64(&mut self, at: usize, op: u8) -> Res<usize> {
        let n = self.le_u64(8, at, op)?;
        self.fits(n, at, op)
    }

    pub(super) fn len_i32(&mut self, at: usize, op: u8) -> Res<usize> {
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
    pub(super) fn line(&mut self, at: usize, op: u8) -> Res<&'a [u8]> {
        let data: &'a [u8] = self.data;
        let rest = data.get(self.pos..).unwrap_or_default();
        let n = memchr::memchr(b'\n', rest).ok_or_else(|| self.truncated(at, op))?;
        self.pos += n + 1;
        Ok(&rest[..n])
    }

    #[cold]
    pub(super) fn truncated(&self, at: usize, op: u8) -> Fail {
        Box::new(DecodeError::Truncated {
            offset: at,
            what: opcode_name(op),
        })
    }

    #[cold]
    pub(super) fn malformed(&self, at: usize, op: u8, problem: &str) -> Fail {
        Box::new(DecodeError::Malformed {
            offset: at,
            opcode: opcode_name(op),
            problem: problem.into(),
        })
    }

    #[cold]
    pub(super) fn empty(&self, at: usize, op: u8) -> Fail {
        self.malformed(at, op, "stack underflow")
    }
}
