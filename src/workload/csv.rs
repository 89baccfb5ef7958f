//! The record reader under the trace CSV and RMM log parsers: RFC 4180
//! records read straight from the (memory-mapped) input, no copy and no
//! allocation per record.
//!
//! - A UTF-8 byte order mark before the first record is skipped ([`strip_bom`]).
//! - Lines that are blank or start with `#` (after spaces) are skipped, as the
//!   contract's trace CSV allows comments.
//! - Unquoted fields are trimmed of ASCII white space (older traces pad them).
//! - A field may be quoted (`"a,b"`); a quote inside is doubled (`"a""b"`), and
//!   a quoted field may hold commas and line breaks. A quote inside an unquoted
//!   field, or anything but spaces between a closing quote and the next comma,
//!   is an error, as RFC 4180 says.
//!
//! Speed: a record is found with `memchr` on its line end and split at its
//! commas; only a record in which a field holds a quote is re-read by the
//! quoted path, so files without quotes never pay for quoting. Parsers that
//! read most lines themselves (the trace CSV's canonical rows) take lines past
//! the reader with [`Records::position`] and [`Records::skip_line`].
//!
//! A quoted field is handed over as the bytes between its quotes with doubled
//! quotes left doubled. The parsers read numbers and keywords, where a quote is
//! invalid anyway, and ids, for which the escaped form names a value as uniquely
//! as the unescaped one (an unquoted id has no quote, a quoted id's quotes are
//! all doubled), so no field is ever copied.

use memchr::memchr;

/// The UTF-8 byte order mark some editors and Windows tools write first.
const BOM: &[u8] = b"\xef\xbb\xbf";

/// `data` without a leading UTF-8 byte order mark.
pub fn strip_bom(data: &[u8]) -> &[u8] {
    data.strip_prefix(BOM).unwrap_or(data)
}

/// One record with up to `N` fields kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a, const N: usize> {
    /// 1-based line on which the record starts.
    pub line: usize,
    /// The record as written, trimmed (for messages).
    pub text: &'a [u8],
    /// The first `N` fields; those past `count` are empty.
    pub fields: [&'a [u8]; N],
    /// How many fields the record has (may exceed `N`).
    pub count: usize,
}

/// A record that breaks RFC 4180's quoting: the line and what was expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuoteError {
    pub line: usize,
    pub what: &'static str,
    /// Where the record starts and where the problem ends, in the input.
    span: (usize, usize),
}

impl QuoteError {
    /// The record as written up to the problem, trimmed (for messages).
    pub fn text<'a>(&self, data: &'a [u8]) -> &'a [u8] {
        data.get(self.span.0..self.span.1.min(data.len()))
            .unwrap_or(b"")
            .trim_ascii()
    }
}

/// The records of a CSV, in order.
pub struct Records<'a> {
    data: &'a [u8],
    pos: usize,
    /// The line of the byte at `pos`.
    line: usize,
}

impl<'a> Records<'a> {
    /// Records of `data` (strip a byte order mark first with [`strip_bom`]).
    pub fn new(data: &'a [u8]) -> Self {
        Records {
            data,
            pos: 0,
            line: 1,
        }
    }

    /// Where the next line starts, and its number: for a caller that reads
    /// some lines itself (then [`Records::skip_line`]).
    pub fn position(&self) -> (usize, usize) {
        (self.pos, self.line)
    }

    /// Moves past a line the caller read itself, to `next`, the start of the line after it.
    #[inline]
    pub fn skip_line(&mut self, next: usize) {
        self.pos = next;
        self.line += 1;
    }

    /// The next record, `None` at the end of the input.
    pub fn next_record<const N: usize>(&mut self) -> Option<Result<Record<'a, N>, QuoteError>> {
        let data = self.data;
        loop {
            let start = self.pos;
            let rest = data.get(start..).filter(|r| !r.is_empty())?;
            let end = memchr(b'\n', rest).map_or(data.len(), |i| start + i);
            let line = self.line;
            self.pos = end + 1;
            self.line += 1;
            let text = data[start..end].trim_ascii();
            match text.first() {
                None | Some(b'#') => continue,
                _ => {}
            }
            let mut fields = [&b""[..]; N];
            let mut count = 0;
            for field in text.split(|&b| b == b',') {
                if field.contains(&b'"') {
                    self.pos = start;
                    self.line = line;
                    return Some(self.quoted_record());
                }
                if let Some(f) = fields.get_mut(count) {
                    *f = field.trim_ascii();
                }
                count += 1;
            }
            return Some(Ok(Record {
                line,
                text,
                fields,
                count,
            }));
        }
    }

    /// Reads the record at `pos`, which has a quote somewhere (RFC 4180).
    #[cold]
    fn quoted_record<const N: usize>(&mut self) -> Result<Record<'a, N>, QuoteError> {
        let data = self.data;
        let start = self.pos;
        let first_line = self.line;
        let mut fields = [&b""[..]; N];
        let mut count = 0;
        let mut pos = start;
        let fail = |line, at, what| QuoteError {
            line,
            what,
            span: (start, at),
        };
        loop {
            while matches!(data.get(pos), Some(b' ' | b'\t')) {
                pos += 1;
            }
            let field;
            if data.get(pos) == Some(&b'"') {
                let open_line = self.line;
                let open = pos + 1;
                let mut at = open;
                let close = loop {
                    let Some(q) = data.get(at..).and_then(|r| memchr(b'"', r)) else {
                        return Err(fail(
                            open_line,
                            data.len(),
                            "expected a closing quote for the field opened on this line",
                        ));
                    };
                    if data.get(at + q + 1) == Some(&b'"') {
                        at += q + 2;
                    } else {
                        break at + q;
                    }
                };
                field = &data[open..close];
                self.line += memchr::memchr_iter(b'\n', field).count();
                pos = close + 1;
                while matches!(data.get(pos), Some(b' ' | b'\t' | b'\r')) {
                    pos += 1;
                }
                if !matches!(data.get(pos), None | Some(b',' | b'\n')) {
                    return Err(fail(
                        self.line,
                        pos + 1,
                        "expected a comma or the end of the line after a quoted field",
                    ));
                }
            } else {
                let from = pos;
                while let Some(&b) = data.get(pos) {
                    match b {
                        b',' | b'\n' => break,
                        b'"' => {
                            return Err(fail(
                                self.line,
                                pos + 1,
                                "expected a quote only around a whole field (write \"\" for a quote inside a quoted field)",
                            ));
                        }
                        _ => pos += 1,
                    }
                }
                field = data[from..pos].trim_ascii();
            }
            if let Some(f) = fields.get_mut(count) {
                *f = field;
            }
            count += 1;
            match data.get(pos) {
                Some(b',') => pos += 1,
                _ => break,
            }
        }
        self.pos = pos + 1;
        self.line += 1;
        Ok(Record {
            line: first_line,
            text: data[start..pos.min(data.len())].trim_ascii(),
            fields,
            count,
        })
    }
}

/// The line that starts at `start`, trimmed (for messages).
pub fn line_at(data: &[u8], start: usize) -> &[u8] {
    let rest = data.get(start..).unwrap_or(b"");
    rest[..memchr(b'\n', rest).unwrap_or(rest.len())].trim_ascii()
}

/// Whether a record's fields are `names`, in order (ASCII case ignored), as a header line.
pub fn is_header<const N: usize>(record: &Record<'_, N>, names: &[&str; N]) -> bool {
    record.count == N
        && record
            .fields
            .iter()
            .zip(names)
            .all(|(f, n)| f.eq_ignore_ascii_case(n.as_bytes()))
}

/// Whether the first record of `data` (after a byte order mark, blank and
/// comment lines) is the header `names`; reads at most the first 64 KiB.
pub fn starts_with_header<const N: usize>(data: &[u8], names: &[&str; N]) -> bool {
    let head = strip_bom(&data[..data.len().min(64 * 1024)]);
    matches!(Records::new(head).next_record::<N>(), Some(Ok(r)) if is_header(&r, names))
}

// Eight bytes at a time (SWAR: SIMD within a register), for parsers that
// read rows themselves: a word holds the bytes at a position in input order,
// the first byte in the low bits.

/// The eight bytes of `data` at `at` as a word, zero past the end of `data`.
#[inline]
pub fn word_at(data: &[u8], at: usize) -> u64 {
    match data.get(at..at.saturating_add(8)) {
        Some(&[a, b, c, d, e, f, g, h]) => u64::from_le_bytes([a, b, c, d, e, f, g, h]),
        _ => padded_word(data.get(at..).unwrap_or(b"")),
    }
}

#[cold]
fn padded_word(tail: &[u8]) -> u64 {
    let mut word = [0u8; 8];
    for (w, &b) in word.iter_mut().zip(tail) {
        *w = b;
    }
    u64::from_le_bytes(word)
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGH: u64 = 0x8080_8080_8080_8080;
const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;

/// The high bit of each byte of `word` that is not zero, exactly (no
/// carries between bytes).
#[inline]
fn nonzero_mask(word: u64) -> u64 {
    (((word & LOW7) + LOW7) | word) & HIGH
}

/// The high bit of each byte of `word` that equals `byte`.
#[inline]
pub fn byte_mask(word: u64, byte: u8) -> u64 {
    !nonzero_mask(word ^ (ONES * u64::from(byte))) & HIGH
}

/// The high bit of each byte of `word` below `limit` (at most 128).
#[inline]
pub fn below_mask(word: u64, limit: u8) -> u64 {
    let at_least = (((word & LOW7) + ONES * u64::from(0x80 - limit)) | word) & HIGH;
    !at_least & HIGH
}

/// A decimal `u64` as Rust's `str::parse` reads one (an optional `+`, digits).
#[inline]
pub fn parse_u64(field: &[u8]) -> Option<u64> {
    let digits = field.strip_prefix(b"+").unwrap_or(field);
    if digits.is_empty() {
        return None;
    }
    let mut value: u64 = 0;
    if digits.len() < 20 {
        for &b in digits {
            let d = b.wrapping_sub(b'0');
            if d > 9 {
                return None;
            }
            value = value * 10 + u64::from(d);
        }
    } else {
        for &b in digits {
            let d = b.wrapping_sub(b'0');
            if d > 9 {
                return None;
            }
            value = value.checked_mul(10)?.checked_add(u64::from(d))?;
        }
    }
    Some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record read back (line, fields) or a quoting error (line, what).
    type Read = Result<(usize, Vec<String>), (usize, &'static str)>;

    fn all(data: &str) -> Vec<Read> {
        let mut records = Records::new(data.as_bytes());
        let mut out = Vec::new();
        while let Some(r) = records.next_record::<4>() {
            match r {
                Ok(r) => out.push(Ok((
                    r.line,
                    r.fields[..r.count.min(4)]
                        .iter()
                        .map(|f| String::from_utf8_lossy(f).into_owned())
                        .collect(),
                ))),
                Err(e) => {
                    out.push(Err((e.line, e.what)));
                    break;
                }
            }
        }
        out
    }

    fn ok(line: usize, fields: &[&str]) -> Read {
        Ok((line, fields.iter().map(|f| f.to_string()).collect()))
    }

    #[test]
    fn plain_records_skip_comments_and_blank_lines_and_trim() {
        assert_eq!(
            all("# c\n\n a , b,,\r\n  # d\nx\n"),
            vec![ok(3, &["a", "b", "", ""]), ok(5, &["x"])]
        );
    }

    #[test]
    fn quoted_fields_hold_commas_quotes_and_line_breaks() {
        assert_eq!(
            all(
                "alloc,\"a,b\",1,0\n \"free\" , \"x\"\"y\" ,,\nalloc,\"two\nlines\",2,\nfree,z,,\n"
            ),
            vec![
                ok(1, &["alloc", "a,b", "1", "0"]),
                ok(2, &["free", "x\"\"y", "", ""]),
                ok(3, &["alloc", "two\nlines", "2", ""]),
                ok(5, &["free", "z", "", ""]),
            ]
        );
        // CRLF after a closing quote, and a quoted last field at the end of the input.
        assert_eq!(
            all("a,\"b\"\r\nc,\"d\""),
            vec![ok(1, &["a", "b"]), ok(2, &["c", "d"])]
        );
    }

    #[test]
    fn quoting_errors_name_the_line() {
        assert_eq!(
            all("a,b\nalloc,\"open,1,0\nfree,x,,\n"),
            vec![
                ok(1, &["a", "b"]),
                Err((
                    2,
                    "expected a closing quote for the field opened on this line"
                ))
            ]
        );
        assert_eq!(
            all("alloc,\"a\"b,1,0\n"),
            vec![Err((
                1,
                "expected a comma or the end of the line after a quoted field"
            ))]
        );
        assert!(matches!(all("alloc,a\"b,1,0\n")[0], Err((1, _))));
    }

    #[test]
    fn counts_fields_past_the_kept_ones() {
        let mut r = Records::new(b"a,b,c,d,e,f");
        assert_eq!(r.next_record::<4>().unwrap().unwrap().count, 6);
        let mut r = Records::new(b"\"a\",b,c,d,e");
        assert_eq!(r.next_record::<4>().unwrap().unwrap().count, 5);
    }

    #[test]
    fn header_detection_strips_a_bom_and_reads_quotes() {
        let names = ["action", "id", "size", "stream"];
        assert!(starts_with_header(
            b"\xef\xbb\xbfaction,id,size,stream\n",
            &names
        ));
        assert!(starts_with_header(
            b"# c\n\"action\",\"id\",\"size\",\"stream\"\r\n",
            &names
        ));
        assert!(starts_with_header(b"Action,Id,Size,Stream", &names));
        assert!(!starts_with_header(b"action,id,size\n", &names));
        assert!(!starts_with_header(b"action,id,size,stream,x\n", &names));
    }

    #[test]
    fn parse_u64_reads_what_str_parse_reads() {
        for s in [
            "0",
            "+7",
            "18446744073709551615",
            "18446744073709551616",
            "00000000000000000000001",
            "",
            "+",
            "-1",
            "1a",
            " 1",
        ] {
            assert_eq!(parse_u64(s.as_bytes()), s.parse::<u64>().ok(), "{s:?}");
        }
    }

    #[test]
    fn word_masks_are_exact_for_every_byte_at_every_position() {
        for b in 0..=255u8 {
            for pos in 0..8 {
                let mut bytes = *b"ab,cd 9\"";
                bytes[pos] = b;
                let word = u64::from_le_bytes(bytes);
                let bit = |m: u64| m >> (8 * pos + 7) & 1 == 1;
                assert_eq!(bit(byte_mask(word, b',')), b == b',', "{b} at {pos}");
                assert_eq!(bit(below_mask(word, 0x21)), b <= b' ', "{b} at {pos}");
            }
        }
    }

    #[test]
    fn words_are_zero_past_the_end() {
        assert_eq!(
            word_at(b"x,t1234567,9", 9),
            u64::from_le_bytes(*b"7,9\0\0\0\0\0")
        );
        assert_eq!(word_at(b"ab", 5), 0);
    }
}
