//! Protocol 0's text arguments: memo indices, quoted STRING literals with
//! their escapes, and raw-unicode-escape UNICODE lines.

pub(super) fn parse_index(line: &[u8]) -> Option<u64> {
    std::str::from_utf8(line).ok()?.trim().parse().ok()
}

/// The argument of protocol 0 STRING: a quoted Python literal with escapes.
pub(super) fn unquote_string(line: &[u8]) -> Option<String> {
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
pub(super) fn raw_unicode_unescape(line: &[u8]) -> String {
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
