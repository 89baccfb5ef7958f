//! Ints: LONG1/LONG4 payloads (little-endian two's complement of any
//! length) and protocol 0 decimals, inline when small, boxed when wide.

use super::decoder::Decoder;
use super::error::Res;
use super::{Slot, V, Value};

impl Decoder<'_> {
    /// LONG1/LONG4 payload `b`, at `start` in the input: little-endian two's
    /// complement of any length.
    #[inline(always)]
    pub(super) fn long_le(&mut self, start: usize, b: &[u8], at: usize) -> Res<V> {
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
    pub(super) fn decimal(&mut self, digits: &[u8], at: usize, op: u8) -> Res<V> {
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
