//! The text scanner. One Aho-Corasick pass (SIMD "Teddy" prefilter) over the
//! whole buffer finds the anchor strings; only the few bytes around a hit are
//! decoded and handed to the parser for that kind of evidence. Lines are
//! counted only up to each hit, so a log without evidence costs one pass.

use super::{oom, stats, summary};
use crate::evidence::{Kind, Observation};
use aho_corasick::{AhoCorasick, Input, MatchKind};
use std::sync::LazyLock;

/// What a parser found: the observation and the byte range it covered.
pub struct Found {
    pub obs: Observation,
    pub start: usize,
    pub end: usize,
}

#[derive(Debug, Clone, Copy)]
enum Anchor {
    OutOfMemory,
    TriedToAllocate,
    MallocAsync,
    Library(oom::Library),
    Summary,
    Stats,
}

/// Stat families and scalar keys of `memory_stats()` (allocator.md §4.2); a
/// quote before the name keeps prose ("segment.") from hitting.
const STATS_KEYS: [&str; 17] = [
    "active.",
    "active_bytes.",
    "allocated_bytes.",
    "allocation.",
    "inactive_split.",
    "inactive_split_bytes.",
    "requested_bytes.",
    "reserved_bytes.",
    "reserved_bytes_by_private_pools.",
    "segment.",
    "oversize_allocations.",
    "oversize_segments.",
    "num_ooms",
    "num_alloc_retries",
    "max_split_size",
    "num_device_alloc",
    "num_sync_all_streams",
];

static ANCHORS: LazyLock<(AhoCorasick, Vec<Anchor>)> = LazyLock::new(|| {
    use oom::Library;
    let mut patterns: Vec<String> = Vec::new();
    let mut kinds = Vec::new();
    let mut add = |p: &str, a: Anchor| {
        patterns.push(p.to_owned());
        kinds.push(a);
    };
    add("would exceed allowed memory", Anchor::MallocAsync);
    add("Allocation on device", Anchor::MallocAsync);
    add("out of memory", Anchor::OutOfMemory);
    add("Tried to allocate", Anchor::TriedToAllocate);
    add("total capacity;", Anchor::TriedToAllocate);
    add(
        "CUBLAS_STATUS_ALLOC_FAILED",
        Anchor::Library(Library::Cublas),
    );
    add("CUDNN_STATUS_ALLOC_FAILED", Anchor::Library(Library::Cudnn));
    add(
        "not enough memory: you tried",
        Anchor::Library(Library::Host),
    );
    add(
        "can't allocate memory: you tried",
        Anchor::Library(Library::Host),
    );
    add("OUT_OF_DEVICE_MEMORY", Anchor::Library(Library::LevelZero));
    add("memory summary, device ID", Anchor::Summary);
    for row in [
        "Allocated memory ",
        "GPU reserved ",
        "Non-releasable ",
        "Oversize ",
        "Cur Usage",
    ] {
        add(row, Anchor::Summary);
    }
    for key in STATS_KEYS {
        add(&format!("'{key}"), Anchor::Stats);
        add(&format!("\"{key}"), Anchor::Stats);
    }
    let ac = AhoCorasick::builder()
        .match_kind(MatchKind::LeftmostFirst)
        .build(&patterns)
        .expect("built-in anchors");
    (ac, kinds)
});

/// 1-based line numbers for offsets visited mostly in increasing order.
struct LineCounter<'a> {
    data: &'a [u8],
    pos: usize,
    line: u64,
}

impl LineCounter<'_> {
    fn line_of(&mut self, off: usize) -> u64 {
        let off = off.min(self.data.len());
        let count = |s: &[u8]| memchr::memchr_iter(b'\n', s).count() as u64;
        if off >= self.pos {
            self.line += count(&self.data[self.pos..off]);
        } else {
            self.line -= count(&self.data[off..self.pos]);
        }
        self.pos = off;
        self.line
    }
}

/// Every observation in a text buffer, in order.
pub fn scan(data: &[u8], input: &str) -> Vec<Observation> {
    let (ac, kinds) = &*ANCHORS;
    let mut out: Vec<Observation> = Vec::new();
    let mut lines = LineCounter {
        data,
        pos: 0,
        line: 1,
    };
    let mut pos = 0;
    let mut last_oom: Option<(usize, usize)> = None; // (index in out, end offset)
    while pos < data.len() {
        let Some(m) = ac.find(Input::new(data).span(pos..data.len())) else {
            break;
        };
        let hit = m.start();
        let found = match kinds[m.pattern().as_usize()] {
            Anchor::OutOfMemory => oom::out_of_memory(data, hit, input),
            Anchor::TriedToAllocate => oom::tried_to_allocate(data, hit, input),
            Anchor::MallocAsync => oom::malloc_async(data, hit, input),
            Anchor::Library(lib) => oom::library(data, hit, m.len(), lib, input),
            Anchor::Summary => summary::summary(data, hit, pos, input),
            Anchor::Stats => stats::stats(data, hit, input),
        };
        let Some(mut f) = found else {
            pos = hit + 1;
            continue;
        };
        pos = f.end.max(hit + 1);
        f.obs.line = Some(lines.line_of(f.start));
        if f.obs.kind == Kind::Oom {
            if let Some((i, end)) = last_oom
                && is_chained_repeat(data, &out[i], end, &f)
            {
                continue;
            }
            last_oom = Some((out.len(), f.end));
        }
        out.push(f.obs);
    }
    out
}

/// Python prints a chained exception's message again under "During handling
/// of the above exception" / "The above exception was the direct cause": the
/// same message (every figure equal; a wrapper may re-raise it under another
/// class, and a wrap may cut its first line elsewhere) with such a line
/// between is one OOM. Identical messages without it
/// (ranks, retries, iterations) all count.
fn is_chained_repeat(data: &[u8], prev: &Observation, prev_end: usize, next: &Found) -> bool {
    let same = Observation {
        line: prev.line,
        exception: prev.exception.clone(),
        message: prev.message.clone(),
        ..next.obs.clone()
    } == *prev;
    // A chained traceback is a few dozen lines; a hard wrap may split the phrase.
    if !same || next.start < prev_end || next.start - prev_end > 64 * 1024 {
        return false;
    }
    let gap: Vec<u8> = data[prev_end..next.start]
        .iter()
        .copied()
        .filter(|&b| b != b'\n' && b != b'\r')
        .collect();
    memchr::memmem::find(&gap, b"During handling of the above exception").is_some()
        || memchr::memmem::find(&gap, b"The above exception was the direct cause").is_some()
}
