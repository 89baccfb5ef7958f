//! `torch.cuda.memory_stats()` dumps: the `OrderedDict([('key', n), …])` repr,
//! a plain dict repr, JSON, pretty-printed over several (prefixed) lines, or
//! cut off. Flattened keys `stat.pool.metric` go to `metrics`.

use super::scan::Found;
use super::text::{clean, line_end, line_start, rank_in, shared_prefix};
use crate::evidence::{Kind, Metrics, Observation, StatValues};
use std::borrow::Cow;

/// A dump has at most a few hundred keys; stop reading after this many bytes.
const MAX_DUMP: usize = 256 * 1024;
/// How far back on the first key's line a rank prefix is looked for.
const PREFIX: usize = 256;
/// Junk allowed between two pairs when it starts a new line (a log prefix).
const MAX_GAP: usize = 160;

const STATS: [&str; 9] = [
    "active",
    "active_bytes",
    "allocated_bytes",
    "allocation",
    "inactive_split",
    "inactive_split_bytes",
    "requested_bytes",
    "reserved_bytes",
    "segment",
];

/// Where a flattened key goes.
enum Key<'a> {
    Stat(&'a str, &'a str, &'a str),
    Scalar(&'a str),
}

fn classify(key: &str) -> Option<Key<'_>> {
    let metric_ok = |m: &str| matches!(m, "current" | "peak" | "allocated" | "freed");
    let parts: Vec<&str> = key.split('.').collect();
    match parts.as_slice() {
        [stat, pool, metric]
            if STATS.contains(stat)
                && matches!(*pool, "all" | "small_pool" | "large_pool")
                && metric_ok(metric) =>
        {
            Some(Key::Stat(stat, pool, metric))
        }
        [stat, metric]
            if matches!(*stat, "oversize_allocations" | "oversize_segments")
                && metric_ok(metric) =>
        {
            Some(Key::Stat(stat, "all", metric))
        }
        // 2.13+: reserved_bytes_by_private_pools.<a>_<b>.<pool>.<metric>.
        ["reserved_bytes_by_private_pools", id, pool, metric]
            if matches!(*pool, "all" | "small_pool" | "large_pool") && metric_ok(metric) =>
        {
            let at = "reserved_bytes_by_private_pools.".len() + id.len();
            Some(Key::Stat(&key[..at], pool, metric))
        }
        [scalar] if scalar.starts_with("num_") || *scalar == "max_split_size" => {
            Some(Key::Scalar(scalar))
        }
        _ => None,
    }
}

/// One `'key': value` / `"key": value` / `('key', value)` pair at `pos`:
/// returns the key, the value and the offset after the value. A value that
/// runs into the end of the data may be cut and is not returned. A hard wrap
/// may have broken the key or the number over two lines (`'inactive_split.all.al`
/// / `located'`): the pieces are joined.
fn pair(d: &[u8], pos: usize) -> Option<(Cow<'_, str>, i64, usize)> {
    let q = *d.get(pos)?;
    if q != b'\'' && q != b'"' {
        return None;
    }
    let ks = pos + 1;
    let klen = d.get(ks..)?.iter().take(96).position(|&b| b == q)?;
    let raw = std::str::from_utf8(&d[ks..ks + klen]).ok()?;
    let key = match raw.find('\n') {
        // One wrap inside the key: the rest follows the prefix the lines share.
        Some(at) => {
            let rest = wrap_resume(d, ks + at).checked_sub(ks)?;
            Cow::Owned(format!(
                "{}{}",
                raw[..at].trim_end_matches('\r'),
                raw.get(rest..)?
            ))
        }
        None => Cow::Borrowed(raw),
    };
    if key.is_empty()
        || !key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
    {
        return None;
    }
    let mut i = ks + klen + 1;
    // Whitespace, and across a line break the log prefix both lines carry.
    let skip_ws = |i: &mut usize| {
        while let Some(&b) = d.get(*i).filter(|b| b.is_ascii_whitespace()) {
            *i = if b == b'\n' {
                wrap_resume(d, *i)
            } else {
                *i + 1
            };
        }
    };
    skip_ws(&mut i);
    if !matches!(d.get(i), Some(b':' | b',')) {
        return None;
    }
    i += 1;
    skip_ws(&mut i);
    let (value, after) = number(d, i)?;
    i = after;
    // JSON floats of integral values ("3.0").
    if d.get(i) == Some(&b'.') && d.get(i + 1) == Some(&b'0') {
        i += 2;
    }
    match d.get(i) {
        Some(b',' | b'}' | b')' | b']' | b' ' | b'\n' | b'\r' | b'\t') => Some((key, value, i)),
        _ => None,
    }
}

/// Where a line that a hard wrap continued resumes after the `\n` at `nl`:
/// past the log prefix it shares with the line before (written on every
/// physical line after the wrap).
fn wrap_resume(d: &[u8], nl: usize) -> usize {
    let text = |r: std::ops::Range<usize>| std::str::from_utf8(&d[r]).ok();
    let shared = text(line_start(d, nl)..nl)
        .zip(text(nl + 1..line_end(d, nl + 1)))
        .map_or(0, |(a, b)| shared_prefix(a.trim_end_matches('\r'), b));
    nl + 1 + shared
}

/// An integer at `i` and the offset after it. A line break right after a
/// digit followed by a digit (past a shared log prefix) is a hard wrap inside
/// the number; followed by a closing bracket it ends a pretty-printed dump;
/// followed by anything else, or by the end of the data, it may have cut the
/// number, so nothing is returned.
fn number(d: &[u8], mut i: usize) -> Option<(i64, usize)> {
    let negative = d.get(i) == Some(&b'-');
    if negative {
        i += 1;
    }
    let mut value: i64 = 0;
    let mut digits = 0;
    loop {
        match d.get(i) {
            Some(&b) if b.is_ascii_digit() => {
                value = value.checked_mul(10)?.checked_add(i64::from(b - b'0'))?;
                digits += 1;
                i += 1;
            }
            Some(b'\r' | b'\n') if digits > 0 => {
                let nl = if d.get(i) == Some(&b'\r') { i + 1 } else { i };
                if d.get(nl) != Some(&b'\n') {
                    break;
                }
                let next = wrap_resume(d, nl);
                if d.get(next).is_some_and(u8::is_ascii_digit) {
                    i = next;
                    continue;
                }
                let closing = d.get(next..)?.iter().find(|b| !b.is_ascii_whitespace());
                if !matches!(closing, Some(b'}' | b']' | b')')) {
                    return None;
                }
                break;
            }
            _ => break,
        }
    }
    (digits > 0).then_some((if negative { -value } else { value }, i))
}

/// Skips separators between pairs; across a newline, also a log prefix.
fn next_pair_start(d: &[u8], mut i: usize) -> (usize, bool) {
    let mut newline = false;
    let start = i;
    while let Some(&b) = d.get(i) {
        match b {
            b'\'' | b'"' => return (i, false),
            b'}' => return (i, true),
            // `])` closes an OrderedDict; after a newline `]` may be a log prefix's (`[rank1]:`).
            b']' if !newline => return (i, true),
            b',' | b'(' | b')' | b' ' | b'\t' | b'\r' => i += 1,
            b'\n' => {
                newline = true;
                i += 1;
            }
            _ if newline && i - start < MAX_GAP => i += 1,
            _ => return (i, false),
        }
    }
    (i, false)
}

/// A hit on a `memory_stats()` key (quoted).
pub fn stats(data: &[u8], hit: usize, input: &str) -> Option<Found> {
    let d = &data[..data.len().min(hit + MAX_DUMP)];
    // The opening `{` / `OrderedDict([` / `[(` right before the first key.
    let head_start = hit.saturating_sub(32);
    let open_at = data[head_start..hit]
        .iter()
        .rposition(|b| !matches!(b, b' ' | b'\n' | b'\r' | b'\t' | b'('))
        .map(|i| head_start + i)
        .filter(|&i| data[i] == b'{' || data[i] == b'[');
    let opened = open_at.is_some();
    let mut obs = Observation::new(Kind::MemoryStats, input);
    let ls = line_start(data, hit).max(hit.saturating_sub(PREFIX));
    obs.rank = rank_in(&clean(&data[ls..hit]));
    let mut metrics = Metrics::new();
    let mut pos = hit;
    let mut closed = false;
    let mut pairs = 0;
    let mut end = hit;
    while let Some((key, value, after)) = pair(d, pos) {
        pairs += 1;
        end = after;
        match classify(&key) {
            Some(Key::Stat(stat, pool, metric)) => {
                let v: &mut StatValues = metrics
                    .entry(stat.to_owned())
                    .or_default()
                    .entry(pool.to_owned())
                    .or_default();
                match metric {
                    "current" => v.current = Some(value),
                    "peak" => v.peak = Some(value),
                    "allocated" => v.allocated = Some(value),
                    _ => v.freed = Some(value),
                }
            }
            Some(Key::Scalar("num_ooms")) => obs.num_ooms = u64::try_from(value).ok(),
            Some(Key::Scalar("num_alloc_retries")) => {
                obs.num_alloc_retries = u64::try_from(value).ok()
            }
            Some(Key::Scalar(name)) => {
                obs.counters.insert(name.to_owned(), value);
            }
            None => {}
        }
        let (next, close) = next_pair_start(d, after);
        if close {
            closed = true;
            end = next + 1;
            break;
        }
        pos = next;
    }
    if pairs < 2
        || (metrics.is_empty() && obs.num_ooms.is_none() && obs.num_alloc_retries.is_none())
    {
        return None;
    }
    obs.truncated = !opened || !closed;
    obs.metrics = Some(metrics);
    Some(Found {
        obs,
        start: open_at.unwrap_or(hit),
        end: end.max(hit + 1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_pairs_and_refuses_cut_values() {
        let d = b"'num_ooms': 3, 'x': 4";
        assert_eq!(pair(d, 0), Some(("num_ooms".into(), 3, 13)));
        // "4" runs into the end: it may be "42" cut.
        assert_eq!(pair(d, 15), None);
        assert_eq!(pair(b"(\"a.b\", -1)", 1), Some(("a.b".into(), -1, 10)));
        // Hard wraps inside a key and inside a number.
        let d = b"('inactive_split.all.al\nlocated', 24\r\n17), ";
        assert_eq!(
            pair(d, 1),
            Some(("inactive_split.all.allocated".into(), 2417, 40))
        );
        // A line break then the end: the number may go on.
        assert_eq!(pair(b"'a': 12\n", 0), None);
        assert_eq!(pair(b"'a': 12\n}", 0), Some(("a".into(), 12, 7)));
        // The wrapped rest after a log prefix written on both lines.
        let d = b"[rank7]: ('a.b', 15440\n[rank7]: 6559744), ('c.d', 1)";
        assert_eq!(pair(d, 10), Some(("a.b".into(), 154406559744, 39)));
        let d = b"[rank7]: ('inactive_split.all.al\n[rank7]: located', 3)";
        assert_eq!(pair(d, 10).map(|p| p.1), Some(3));
    }

    #[test]
    fn classifies_keys() {
        assert!(matches!(
            classify("allocated_bytes.all.peak"),
            Some(Key::Stat("allocated_bytes", "all", "peak"))
        ));
        assert!(matches!(
            classify("oversize_segments.freed"),
            Some(Key::Stat("oversize_segments", "all", "freed"))
        ));
        assert!(matches!(
            classify("reserved_bytes_by_private_pools.1_2.large_pool.current"),
            Some(Key::Stat(
                "reserved_bytes_by_private_pools.1_2",
                "large_pool",
                "current"
            ))
        ));
        assert!(matches!(
            classify("max_split_size"),
            Some(Key::Scalar("max_split_size"))
        ));
        assert!(classify("allocated_bytes.all.bogus").is_none());
    }
}
