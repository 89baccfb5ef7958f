//! Small text helpers shared by the parsers: line navigation on raw bytes,
//! cleaning a line (lossy UTF-8, ANSI colour codes, HTML entities) and the
//! log prefixes (`[rank3]:`, `(VllmWorkerProcess pid=N)`) in front of it.

use regex::Regex;
use std::sync::LazyLock;

/// The longest line the parsers look at. Longer lines (a log whose newlines
/// were lost, binary data) are read in windows of this size, so no hit costs
/// more than this much searching and the whole scan stays linear.
pub const MAX_LINE: usize = 16 * 1024;

/// Offset of the start of the line holding `pos`, at most [`MAX_LINE`] back.
pub fn line_start(data: &[u8], pos: usize) -> usize {
    let pos = pos.min(data.len());
    let from = pos.saturating_sub(MAX_LINE);
    memchr::memrchr(b'\n', &data[from..pos]).map_or(from, |i| from + i + 1)
}

/// Offset of the `\n` ending the line holding `pos` (or the end of data), at
/// most [`MAX_LINE`] on.
pub fn line_end(data: &[u8], pos: usize) -> usize {
    let pos = pos.min(data.len());
    let to = data.len().min(pos + MAX_LINE);
    memchr::memchr(b'\n', &data[pos..to]).map_or(to, |i| pos + i)
}

/// Appends `raw` to `out` cleaned: invalid UTF-8 replaced, ANSI escape
/// sequences (also their `[1;36m` remains when the ESC byte was lost) and
/// `\r` dropped, and the HTML entities a web page leaves in pasted text decoded.
pub fn clean_into(raw: &[u8], out: &mut String) {
    let text = String::from_utf8_lossy(raw);
    let mut rest: &str = &text;
    // A byte scan: every special character is ASCII, so `i` is a char boundary.
    while let Some(i) = rest
        .bytes()
        .position(|b| matches!(b, b'\x1b' | b'[' | b'&' | b'\r'))
    {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        let skip = match tail.as_bytes()[0] {
            b'\x1b' => ansi_len(&tail[1..]).map_or(1, |n| n + 1),
            b'[' => ansi_len(tail).filter(|_| bare_sgr(tail)).unwrap_or(0),
            b'&' => match entity(tail) {
                Some((c, n)) => {
                    out.push(c);
                    n
                }
                None => 0,
            },
            _ => 1,
        };
        if skip == 0 {
            // Not an escape: keep the character itself.
            out.push(tail.as_bytes()[0] as char);
            rest = &tail[1..];
        } else {
            rest = &tail[skip..];
        }
    }
    out.push_str(rest);
}

/// A cleaned copy of `raw`.
pub fn clean(raw: &[u8]) -> String {
    let mut s = String::with_capacity(raw.len());
    clean_into(raw, &mut s);
    s
}

/// Length of a CSI sequence `[` params final-byte starting at `s[0] == '['`.
fn ansi_len(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    if b.first() != Some(&b'[') {
        return None;
    }
    let mut i = 1;
    while i < b.len() && i < 32 {
        match b[i] {
            b'0'..=b'9' | b';' | b'?' => i += 1,
            0x40..=0x7e => return Some(i + 1),
            _ => return None,
        }
    }
    None
}

/// A bare `[1;36m` / `[0m` (SGR whose ESC byte got lost on copy).
fn bare_sgr(s: &str) -> bool {
    let b = s.as_bytes();
    let n = ansi_len(s).unwrap_or(0);
    n >= 3 && b[n - 1] == b'm' && b[1..n - 1].iter().all(|c| c.is_ascii_digit() || *c == b';')
}

/// Decodes one HTML entity at the start of `s`: returns the character and the
/// entity's length.
fn entity(s: &str) -> Option<(char, usize)> {
    const NAMED: [(&str, char); 6] = [
        ("&gt;", '>'),
        ("&lt;", '<'),
        ("&amp;", '&'),
        ("&quot;", '"'),
        ("&apos;", '\''),
        ("&nbsp;", ' '),
    ];
    for (name, c) in NAMED {
        if s.starts_with(name) {
            return Some((c, name.len()));
        }
    }
    let body = s.strip_prefix("&#")?;
    let end = body.find(';').filter(|&e| e <= 8)?;
    let num = &body[..end];
    let code = match num.strip_prefix(['x', 'X']) {
        Some(hex) => u32::from_str_radix(hex, 16).ok()?,
        None => num.parse().ok()?,
    };
    Some((char::from_u32(code)?, end + 3))
}

static RANK: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\[[Rr]ank\s*(\d{1,6})\]").unwrap());
/// A class name right before a message: `RuntimeError: ` as a traceback
/// prints it, or `RuntimeError('` as its repr does in a logged exception.
static EXCEPTION: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"([A-Za-z_][A-Za-z0-9_.]*(?:Error|Exception))(?:\s*:\s*|\(['"])$"#).unwrap()
});
/// A per-process log prefix that marks another process's line.
static PROCESS_PREFIX: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^\s*(?:\[[Rr]ank\s*\d+\]|\([A-Za-z]\w* pid=\d+\))").unwrap());

/// The rank named by a `[rankN]` prefix.
pub fn rank_in(prefix: &str) -> Option<u32> {
    RANK.captures(prefix)?.get(1)?.as_str().parse().ok()
}

/// The exception class printed right before a message (`torch.OutOfMemoryError: `,
/// or the repr `RuntimeError('`), and where it starts in `before`.
pub fn exception_before(before: &str) -> Option<(String, usize)> {
    let m = EXCEPTION.captures(before)?.get(1)?;
    Some((m.as_str().to_owned(), m.start()))
}

/// The last exception class followed by a colon in `s` (`RuntimeError: `):
/// its name, where it starts, and where the text after the colon starts.
pub fn exception_in(s: &str) -> Option<(String, usize, usize)> {
    static ANY: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"([A-Za-z_][A-Za-z0-9_.]*(?:Error|Exception))\s*:\s*").unwrap()
    });
    let c = ANY.captures_iter(s).last()?;
    let name = c.get(1)?;
    Some((name.as_str().to_owned(), name.start(), c.get(0)?.end()))
}

/// True when a line starts with a per-process prefix (rank, worker pid).
pub fn has_process_prefix(line: &str) -> bool {
    PROCESS_PREFIX.is_match(line)
}

/// Length of the log prefix two lines share (`[rank2]: `), ending at a separator.
pub fn shared_prefix(a: &str, b: &str) -> usize {
    let mut n = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    while !b.is_char_boundary(n) {
        n -= 1;
    }
    b[..n].rfind([':', ' ', ']', ')']).map_or(0, |i| i + 1)
}

/// Index of the first char boundary at or after `i`.
pub fn ceil_boundary(s: &str, mut i: usize) -> usize {
    while i < s.len() && !s.is_char_boundary(i) {
        i += 1;
    }
    i.min(s.len())
}

/// The first `n` bytes of `s` (at a char boundary), with `…` when cut.
pub fn head(s: &str, n: usize) -> String {
    if s.len() <= n {
        return s.to_owned();
    }
    let mut i = n;
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    format!("{}…", &s[..i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cleans_ansi_entities_and_lossy_bytes() {
        assert_eq!(
            clean(b"\x1b[1;36m(Vllm pid=1)\x1b[0;0m ERROR"),
            "(Vllm pid=1) ERROR"
        );
        assert_eq!(clean(b"[1;36m(W pid=2)[0;0m x"), "(W pid=2) x");
        assert_eq!(
            clean(b"a &gt; b &#39;c&#x27; [rank0]: d\r"),
            "a > b 'c' [rank0]: d"
        );
        assert_eq!(clean(b"ok \xff end"), "ok \u{fffd} end");
        assert_eq!(clean(b"&unknown; [x] & ["), "&unknown; [x] & [");
    }

    #[test]
    fn finds_rank_and_exception() {
        assert_eq!(rank_in("[rank12]: "), Some(12));
        assert_eq!(rank_in("(VllmWorkerProcess pid=3) "), None);
        let (e, at) = exception_before("[rank0]: torch.OutOfMemoryError: ").unwrap();
        assert_eq!((e.as_str(), at), ("torch.OutOfMemoryError", 9));
        let (e, at) = exception_before("in the train loop: RuntimeError('").unwrap();
        assert_eq!((e.as_str(), at), ("RuntimeError", 19));
        assert!(exception_before("RuntimeError(x").is_none());
        assert!(has_process_prefix("[rank1]: x"));
        assert!(has_process_prefix("(VllmWorkerProcess pid=1689) ERROR"));
        assert!(!has_process_prefix("memory in use."));
    }
}
