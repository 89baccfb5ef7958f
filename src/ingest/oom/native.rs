//! The caching allocator's own message (native backend, every era), from its head, from
//! its request when the head is lost or retyped, or from its figures quoted alone.

use super::device_of;
use super::message::{Ending, HitLine, comfy_fold, gather, hit_line, oom_observation};
use super::patterns::{
    ALLOCATED_NEW, ALLOCATED_OLD, ALLOWED, CACHED, COMPLETE, DEVICE_NEW, DEVICE_OLD, FRAGMENT_OPEN,
    FREE_NEW, FREE_OLD, IPEX_LIMIT, OTHER_PROCESS, PRIVATE_POOLS, REQUESTED, RESERVED_OLD,
    RESERVED_UNALLOCATED, RETYPED_HEAD, THIS_PROCESS, TOTAL_NEW, TOTAL_OLD, index, pattern, size,
    size_at,
};
use crate::evidence::{Backend, DeviceKind, ProcessUse};
use crate::ingest::scan::Found;
use crate::ingest::text::{clean, line_end, line_start, shared_prefix};
use regex::Regex;
use std::sync::LazyLock;

/// A hit on "Tried to allocate" that no "out of memory" hit consumed: a wrap
/// split "CUDA out of memory." over the lines above, the head was retyped or
/// is IPEX's 4 GB refusal, or the head is lost. Also the hit on "total
/// capacity;" (see [`fragment`]), which the scanner sends here.
pub fn tried_to_allocate(data: &[u8], hit: usize, input: &str) -> Option<Found> {
    if data[hit..].starts_with(b"total capacity;") {
        return fragment(data, hit, input);
    }
    if let Some(found) = wrapped_head(data, hit, input) {
        return Some(found);
    }
    let line = hit_line(data, hit, 0, b"out of memory");
    let before = line.before.clone();
    // A head typed by hand still names the device.
    if let Some(c) = RETYPED_HEAD.captures(&before) {
        let (whole, word) = (c.get(0)?, c.get(1)?);
        let device = device_of(&word.as_str().to_ascii_uppercase());
        let at = whole.start();
        return Some(allocator(data, line, at, device, input, &before[..at]));
    }
    if let Some(m) = IPEX_LIMIT.find(&before) {
        let at = m.start();
        return Some(allocator(
            data,
            line,
            at,
            DeviceKind::Xpu,
            input,
            &before[..at],
        ));
    }
    // The head is lost: read what is there.
    let found = headless(data, line, before.len(), input);
    found.obs.requested_bytes?;
    Some(found)
}

/// A hit on "total capacity;" that no message consumed: the parenthesised
/// figures of a 1.x-layout message quoted without their head ("… (GPU 0; 15.75
/// GiB total capacity; 79.11 MiB already allocated; …)").
pub fn fragment(data: &[u8], hit: usize, input: &str) -> Option<Found> {
    if let Some(at) = request_split_above(data, hit) {
        return tried_to_allocate(data, at, input);
    }
    let line = hit_line(data, hit, 0, b"Tried to allocate");
    let at = FRAGMENT_OPEN.find(&line.before)?.start();
    let mut found = headless(data, line, at, input);
    found.obs.total_capacity_bytes?;
    // The prose around the quote is not part of the message.
    if let Some(m) = found.obs.message.as_mut()
        && let Some(close) = m.find(')')
    {
        m.truncate(close + 1);
    }
    Some(found)
}

/// Where "Tried to allocate" starts on a line above `hit` when a hard wrap
/// split it, so the figures up to `hit` are the rest of that message.
fn request_split_above(data: &[u8], hit: usize) -> Option<usize> {
    const PHRASE: &[u8] = b"Tried to allocate";
    static SPLIT: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(
            r"^Tried to allocate\s*\d+(?:\.\d+)?\s*\w+\s*\(GPU\s*\d+\s*;\s*\d+(?:\.\d+)?\s*\w+\s*$",
        )
        .unwrap()
    });
    let ls = line_start(data, hit);
    let mut start = ls;
    // A 40-column wrap spreads the phrase and the first two figures over three lines.
    for _ in 0..3 {
        start = line_start(data, start.checked_sub(1)?);
        let first_end = line_end(data, start);
        let first = &data[start..first_end];
        let first = first.strip_suffix(b"\r").unwrap_or(first);
        // The wrap left the start of the phrase at the very end of that line.
        let tail = first.len().saturating_sub(PHRASE.len());
        let Some(from) = (tail..first.len()).find(|&i| PHRASE.starts_with(&first[i..])) else {
            continue;
        };
        let mut joined: Vec<u8> = first[from..].to_vec();
        let mut p = first_end + 1;
        while p <= ls {
            let e = line_end(data, p).min(hit);
            joined.extend(data[p..e].iter().filter(|&&b| b != b'\r'));
            p = e + 1;
        }
        let joined = std::str::from_utf8(&joined).ok()?;
        return SPLIT.is_match(joined).then_some(start + from);
    }
    None
}

/// A native message whose head is lost, read from `at` in `line.before`,
/// marked truncated and with no exception. Its device is unknown ("GPU 0" is
/// printed for CUDA, HIP and XPU alike), except that only IPEX's XPU allocator
/// prints "reserved in total by PyTorch" without a free figure.
fn headless(data: &[u8], line: HitLine, at: usize, input: &str) -> Found {
    let before = line.before[..at].to_owned();
    let mut found = allocator(data, line, at, DeviceKind::Cuda, input, &before);
    let o = &mut found.obs;
    if o.reserved_bytes.is_some() && o.free_bytes.is_none() {
        o.device_kind = Some(DeviceKind::Xpu);
        o.format_era = None;
    } else {
        o.device_kind = None;
    }
    o.exception = None;
    o.truncated = true;
    found
}

/// Looks on the two lines above `hit` for a "CUDA out of memory." that a wrap
/// split (anywhere, even inside "CUDA"), joining the pieces the way
/// `message::continue_lines` will.
fn wrapped_head(data: &[u8], hit: usize, input: &str) -> Option<Found> {
    static HEAD: LazyLock<Regex> = LazyLock::new(|| pattern(r"(CUDA|HIP|XPU) out of memory \.? $"));
    let ls = line_start(data, hit);
    let mut prev_start = ls;
    for _ in 0..2 {
        if prev_start == 0 {
            return None;
        }
        prev_start = line_start(data, prev_start - 1);
        let prev_end = line_end(data, prev_start);
        let prev = clean(&data[prev_start..prev_end]);
        let mut joined = prev.trim_end().to_owned();
        let first_len = joined.len();
        let mut p = prev_end + 1;
        while p <= ls {
            let le = line_end(data, p).min(hit);
            let piece = clean(&data[p..le]);
            joined.push_str(piece[shared_prefix(&prev, &piece)..].trim());
            p = le + 1;
        }
        let Some(c) = HEAD.captures(&joined) else {
            continue;
        };
        let (whole, word) = (c.get(0)?, c.get(1)?);
        // It must start on `prev`, or a nearer line is the message's first.
        if whole.start() >= first_len {
            continue;
        }
        let pos = whole.start();
        let device = device_of(word.as_str());
        let line = HitLine {
            before: prev[..pos].to_owned(),
            after: prev[pos..].to_owned(),
            line_start: prev_start,
            bound: prev_end,
            bounded: false,
        };
        let before = line.before.clone();
        let found = allocator(data, line, pos, device, input, &before);
        if found.end > hit {
            return Some(found);
        }
    }
    None
}

/// The caching allocator's message (native backend).
pub(super) fn allocator(
    data: &[u8],
    line: HitLine,
    msg_start: usize,
    device: DeviceKind,
    input: &str,
    before_msg: &str,
) -> Found {
    let ending = Ending {
        complete: &native_complete,
        resume: Some("If reserved memory"),
    };
    let (msg, first_len) = gather(data, line, msg_start, &ending);
    let t = msg.text.as_str();
    let mut obs = oom_observation(data, input, before_msg, &msg);
    obs.device_kind = Some(device);
    obs.backend = Some(Backend::Native);
    obs.truncated = !native_complete(t);
    obs.requested_bytes = size(&REQUESTED, t);
    obs.device_index = index(&DEVICE_NEW, t).or_else(|| index(&DEVICE_OLD, t));
    obs.total_capacity_bytes = size(&TOTAL_NEW, t).or_else(|| size(&TOTAL_OLD, t));
    obs.free_bytes = size(&FREE_NEW, t).or_else(|| size(&FREE_OLD, t));
    obs.allocated_bytes = size(&ALLOCATED_NEW, t).or_else(|| size(&ALLOCATED_OLD, t));
    obs.reserved_bytes = size(&RESERVED_OLD, t);
    obs.cached_bytes = size(&CACHED, t);
    obs.reserved_unallocated_bytes = size(&RESERVED_UNALLOCATED, t);
    obs.private_pools_bytes = size(&PRIVATE_POOLS, t);
    obs.allowed_bytes = size(&ALLOWED, t);
    obs.process_in_use_bytes = size(&THIS_PROCESS, t);
    obs.other_processes = OTHER_PROCESS
        .captures_iter(t)
        .filter_map(|c| {
            Some(ProcessUse {
                pid: Some(c.get(1)?.as_str().parse().ok()?),
                bytes: size_at(&c, 2)?,
            })
        })
        .collect();
    obs.format_era = era(t, obs.exception.as_deref(), device).map(str::to_owned);
    obs.message = Some(msg.first_line(first_len));
    let found = Found {
        obs,
        start: msg.start,
        end: msg.end,
    };
    comfy_fold(data, found, &msg.prefix)
}

/// Whether a native message is whole: 1.4-1.9 messages end at the closing
/// parenthesis, 1.10-2.0 ones go on with a hint that must then be whole too.
fn native_complete(t: &str) -> bool {
    static CLOSED: LazyLock<Regex> = LazyLock::new(|| pattern(r"reserved in total by PyTorch \)"));
    static HINT_END: LazyLock<Regex> =
        LazyLock::new(|| pattern(r"Memory Management and PYTORCH_\w*ALLOC_CONF"));
    match CLOSED.find(t) {
        Some(m) => {
            // The hint begins "If reserved memory"; a wrap may have cut even "If".
            let rest = t[m.end()..].trim_start();
            let started = !rest.is_empty() && (rest.starts_with("If") || "If".starts_with(rest));
            !started || HINT_END.is_match(rest)
        }
        None => COMPLETE.is_match(t),
    }
}

/// The PyTorch era a native message's wording identifies (allocator.md §7.2, §7.3).
fn era(t: &str, exception: Option<&str>, device: DeviceKind) -> Option<&'static str> {
    static OLD_RESERVED: LazyLock<Regex> =
        LazyLock::new(|| pattern("reserved in total by PyTorch"));
    static OLD_CACHED: LazyLock<Regex> = LazyLock::new(|| pattern(r"cached \)"));
    static TYPO: LazyLock<Regex> = LazyLock::new(|| pattern("total capacty"));
    static NEW: LazyLock<Regex> = LazyLock::new(|| pattern("has a total capac"));
    static POOLS: LazyLock<Regex> = LazyLock::new(|| pattern("in private pools"));
    if device == DeviceKind::Xpu {
        // XPU messages follow their own timeline (c10/xpu/XPUCachingAllocator.cpp).
        return None;
    }
    if t.contains("more than 1EB") {
        return None;
    }
    static SPLIT_HINT: LazyLock<Regex> = LazyLock::new(|| pattern("try setting max_split_size_mb"));
    if OLD_RESERVED.is_match(t) {
        // The max_split_size_mb hint arrived in 1.10; without it (or cut before it) 1.4 on.
        Some(if SPLIT_HINT.is_match(t) {
            "1.10-2.0"
        } else {
            "1.4-2.0"
        })
    } else if OLD_CACHED.is_match(t) || CACHED.is_match(t) {
        Some("1.0-1.3")
    } else if TYPO.is_match(t) {
        Some("2.1")
    } else if NEW.is_match(t) {
        // torch.OutOfMemoryError is the 2.4+ class name; the private-pool
        // clause and the docs.pytorch.org link are 2.4+ wording too.
        if POOLS.is_match(t)
            || t.contains("docs.pytorch.org")
            || exception == Some("torch.OutOfMemoryError")
        {
            Some("2.4+")
        } else if exception == Some("torch.cuda.OutOfMemoryError") {
            Some("2.2-2.3")
        } else {
            Some("2.2+")
        }
    } else if DEVICE_OLD.is_match(t) {
        Some("1.0-2.0")
    } else {
        None
    }
}
