//! The text scanner. One Aho-Corasick pass (SIMD "Teddy" prefilter) over the
//! input finds the anchor strings; only the few bytes around a hit are
//! decoded and handed to the parser for that kind of evidence, or checked for
//! a clue about the environment ([`super::clues`]). Lines are counted only up
//! to each hit, so a log without evidence costs one pass.
//!
//! Each parser sees only the window of [`REACH`] bytes on either side of its
//! hit. A mapped file is scanned in one span; a stream (standard input, a
//! pipe, a decompressed file) is scanned in chunks that keep [`BACK`] bytes
//! behind the scan and [`REACH`] ahead of it, so both see the same windows
//! and find the same evidence, and a stream costs a bounded buffer.

use super::clues::{self, Clue};
use super::input::Stream;
use super::{oom, stats, summary};
use crate::Error;
use crate::evidence::{Kind, Observation, TextClues};
use crate::limits::{Limit, Limits};
use aho_corasick::{AhoCorasick, Input, MatchKind};
use std::sync::LazyLock;

/// How far from its hit a parser may read: 40 hard-wrapped lines of an OOM
/// message, a 64-line table, a 256 KiB `memory_stats()` dump, each line at
/// most `MAX_LINE` (16 KiB), all fit.
pub const REACH: usize = 1 << 20;
/// Bytes a stream keeps behind the scan position: a parser's window, and the
/// 64 KiB a chained exception may put between two copies of a message.
const BACK: usize = REACH + (128 << 10);
/// Bytes a stream reads ahead per step.
const CHUNK: usize = 16 << 20;

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
    DeviceError,
    Summary,
    /// A `memory_stats()` key; the parser's hit is the quote before it.
    Stats,
    Clue(Clue),
}

/// Stat families and scalar keys of `memory_stats()` (allocator.md §4.2); a
/// quote must stand before the name, which keeps prose ("segment.") out.
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
    for p in ["CUDA Error: ", "CUDA error: ", "HIP error: "] {
        add(p, Anchor::DeviceError);
    }
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
        add(key, Anchor::Stats);
    }
    // Clues last: where an evidence anchor starts at the same byte, it wins.
    for (p, clue) in clues::ANCHORS {
        add(p, Anchor::Clue(clue));
    }
    // Teddy, the SIMD prefilter, takes at most 64 patterns; past that the
    // scan runs several times slower.
    debug_assert!(patterns.len() <= 64, "{} anchors", patterns.len());
    let ac = AhoCorasick::builder()
        .match_kind(MatchKind::LeftmostFirst)
        .build(&patterns)
        .expect("built-in anchors");
    (ac, kinds)
});

/// Every observation in a text buffer, in order; the clues of the text go
/// into `clues`.
pub fn scan_with_clues(
    data: &[u8],
    input: &str,
    clues: &mut TextClues,
    limits: &Limits,
) -> Result<Vec<Observation>, Error> {
    let mut s = Scanner::new(input, clues, limits);
    s.span(data, 0, data.len());
    s.finish()
}

/// Every observation in a stream, read in chunks (see the module doc).
pub fn scan_stream(
    stream: &mut Stream,
    input: &str,
    clues: &mut TextClues,
    limits: &Limits,
) -> Result<Vec<Observation>, Error> {
    scan_chunks(stream, input, clues, limits, CHUNK)
}

/// [`scan_stream`] reading `chunk` bytes ahead per step.
fn scan_chunks(
    stream: &mut Stream,
    input: &str,
    clues: &mut TextClues,
    limits: &Limits,
    chunk: usize,
) -> Result<Vec<Observation>, Error> {
    let mut s = Scanner::new(input, clues, limits);
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let from = s.next - s.base;
        let more = stream.fill(&mut buf, from + REACH + chunk)?;
        let limit = if more { buf.len() - REACH } else { buf.len() };
        s.span(&buf, s.base, s.base + limit.max(from));
        if !more || s.over.is_some() {
            return s.finish();
        }
        // Keep BACK bytes behind where the next search starts.
        let keep = s.next.saturating_sub(BACK).max(s.base);
        s.lines.advance(&buf, s.base, keep);
        let drop = keep - s.base;
        buf.copy_within(drop.., 0);
        buf.truncate(buf.len() - drop);
        s.base = keep;
    }
}

/// The scan's state, in absolute input offsets.
struct Scanner<'c> {
    input: &'c str,
    clues: &'c mut TextClues,
    finder: clues::Finder,
    out: Vec<Observation>,
    lines: LineCounter,
    /// Offset of the buffer's first byte.
    base: usize,
    /// Where the scan stands: past the last hit, or past what it parsed
    /// (a summary table is never read back above it).
    pos: usize,
    /// Where the next search starts: every anchor before it has been seen.
    next: usize,
    last_oom: Option<(usize, usize)>, // (index in out, end offset)
    /// The most observations kept ([`Limits::max_observations`]).
    max: usize,
    limits: Limits,
    /// The line of the first observation past `max`; the scan stops there.
    over: Option<u64>,
}

impl<'c> Scanner<'c> {
    fn new(input: &'c str, clues: &'c mut TextClues, limits: &Limits) -> Self {
        Scanner {
            max: usize::try_from(limits.max_observations).unwrap_or(usize::MAX),
            limits: *limits,
            over: None,
            input,
            clues,
            finder: clues::Finder::default(),
            out: Vec::new(),
            lines: LineCounter { pos: 0, line: 1 },
            base: 0,
            pos: 0,
            next: 0,
            last_oom: None,
        }
    }

    /// Handles every hit that starts before `limit`; `buf` holds the input
    /// from offset `base` on, and at least [`REACH`] bytes past `limit`
    /// unless the input ends first. The input is searched a [`WINDOW`] at a
    /// time, its two halves on two threads ([`hits_in`]), then walked.
    fn span(&mut self, buf: &[u8], base: usize, limit: usize) {
        let (mut first, mut second) = (Vec::new(), Vec::new());
        let mut parsed = Parsed::new();
        let end = limit - base;
        let mut from = self.next - base;
        // The line `from` is on; each half counts its own lines.
        let mut line = self.lines.line_of(buf, base, from + base);
        while from < end && self.over.is_none() {
            let to = end.min(from.saturating_add(WINDOW));
            first.clear();
            second.clear();
            let (lines_first, lines_second) = if to - from < 2 * SPLIT_AT_LEAST {
                (hits_in(buf, from, to, &mut first), 0)
            } else {
                let mid = from + (to - from) / 2;
                rayon::join(
                    || hits_in(buf, from, mid, &mut first),
                    || hits_in(buf, mid, to, &mut second),
                )
            };
            let hits = first.iter().chain(second.iter());
            parse_ahead(buf, base, self.input, hits.clone(), &mut parsed);
            let halves = [(&first, line), (&second, line + lines_first)];
            for (hits, line) in halves {
                for &hit in hits {
                    if self.over.is_some() {
                        break;
                    }
                    self.visit(buf, base, hit, line + hit.lines, &mut parsed);
                }
            }
            line += lines_first + lines_second;
            from = to;
        }
        self.next = self.next.max(limit);
    }

    /// One hit of [`Self::span`]'s walk, in order; `line` is the hit's.
    fn visit(&mut self, buf: &[u8], base: usize, hit: Hit, line: u64, parsed: &mut Parsed) {
        let (_, kinds) = &*ANCHORS;
        let at = hit.at + base;
        self.next = at + 1;
        let anchor = kinds[hit.pattern as usize];
        let start = match anchor {
            // Clues count everywhere, in what a parser took too (PyTorch's
            // hints in an OOM message).
            Anchor::Clue(clue) => {
                self.finder
                    .hit(clue, buf, hit.at, hit.len as usize, self.clues);
                return;
            }
            // A stats key counts only behind a quote the scan has not passed.
            Anchor::Stats => match hit.at.checked_sub(1) {
                Some(q) if q + base >= self.pos && matches!(buf[q], b'\'' | b'"') => q,
                _ => return,
            },
            // Evidence inside what a parser took is part of that evidence.
            _ if at < self.pos => return,
            _ => hit.at,
        };
        let found = match anchor {
            Anchor::OutOfMemory => take_parsed(parsed, buf, base, self.input, start),
            _ => self.parse(buf, base, start, hit.len as usize, anchor),
        };
        let Some(f) = found else {
            self.pos = start + base + 1;
            return;
        };
        self.pos = f.end.max(start + base + 1);
        // The observation's line is counted from its hit's.
        self.lines = LineCounter { pos: at, line };
        self.push(buf, base, f);
    }

    /// Runs the parser of `anchor` on the window around its hit at `hit` (in
    /// `buf`); the result's offsets are absolute.
    fn parse(
        &mut self,
        buf: &[u8],
        base: usize,
        hit: usize,
        len: usize,
        anchor: Anchor,
    ) -> Option<Found> {
        let floor = self.pos.max(base) - base;
        parse_window(buf, base, (hit, len), anchor, floor, self.input)
    }

    fn push(&mut self, buf: &[u8], base: usize, mut f: Found) {
        // A device error printed again (once per worker, per retry) is one.
        if f.obs.kind == Kind::DeviceError
            && self
                .out
                .iter()
                .rev()
                .find(|o| o.kind == Kind::DeviceError)
                .is_some_and(|o| o.message == f.obs.message)
        {
            return;
        }
        f.obs.line = Some(self.lines.line_of(buf, base, f.start));
        if f.obs.kind == Kind::Oom {
            if let Some((i, end)) = self.last_oom
                && is_chained_repeat(buf, base, &self.out[i], end, &f)
            {
                return;
            }
            self.last_oom = Some((self.out.len(), f.end));
        }
        if self.out.len() >= self.max {
            self.over = Some(f.obs.line.unwrap_or(0));
            return;
        }
        self.out.push(f.obs);
    }

    /// The observations, or the limit they went over.
    fn finish(self) -> Result<Vec<Observation>, Error> {
        match self.over {
            None => Ok(self.out),
            Some(line) => Err(self.limits.exceeded(
                self.input,
                Limit::Observations,
                &format!("one more starts at line {line}"),
            )),
        }
    }
}

/// The parser of `anchor` on the window of [`REACH`] bytes around its hit
/// `(offset in buf, length)`; `floor` (in `buf`) is where the scan stands.
/// It reads nothing else, so its result is the same whenever it runs.
fn parse_window(
    buf: &[u8],
    base: usize,
    (hit, len): (usize, usize),
    anchor: Anchor,
    floor: usize,
    input: &str,
) -> Option<Found> {
    let lo = hit.saturating_sub(REACH);
    let w = &buf[lo..buf.len().min(hit + REACH)];
    let h = hit - lo;
    let floor = floor.saturating_sub(lo);
    let mut f = match anchor {
        Anchor::OutOfMemory => oom::out_of_memory(w, h, input),
        Anchor::TriedToAllocate => oom::tried_to_allocate(w, h, input),
        Anchor::MallocAsync => oom::malloc_async(w, h, input),
        Anchor::Library(lib) => oom::library(w, h, len, lib, input),
        Anchor::DeviceError => oom::device_error(w, h, input),
        Anchor::Summary => summary::summary(w, h, floor, input),
        Anchor::Stats => stats::stats(w, h, input),
        Anchor::Clue(_) => None,
    }?;
    f.start += lo + base;
    f.end += lo + base;
    Some(f)
}

/// Input searched for hits at a time (its two halves in parallel) before
/// they are walked: its hits are kept in two vectors that are reused.
const WINDOW: usize = 4 << 20;
/// A window's half is at least this long, or the window is searched whole
/// on this thread (a stream's last bytes, a small file).
const SPLIT_AT_LEAST: usize = 256 << 10;
/// Fewer "out of memory" hits than this in a window are parsed as the walk
/// reaches them, on this thread.
const AHEAD_PARALLEL: usize = 32;

/// Where an anchor starts in the buffer, which one (its index in
/// [`ANCHORS`]), its length, and the newlines before it in its half.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Hit {
    at: usize,
    pattern: u32,
    len: u32,
    lines: u64,
}

/// Every offset in `buf[from..to]` where an anchor starts, with the anchor
/// found there (the first in [`ANCHORS`] order), appended to `out` in order:
/// what leftmost-first searches from one past each hit find one after
/// another, so two halves searched apart give the hits of the whole. Gives
/// the newlines in `buf[from..to]`, which the walk would count otherwise.
fn hits_in(buf: &[u8], from: usize, to: usize, out: &mut Vec<Hit>) -> u64 {
    let count = |s: &[u8]| memchr::memchr_iter(b'\n', s).count() as u64;
    let (mut counted, mut lines) = (from, 0u64);
    let (ac, _) = &*ANCHORS;
    // A match that starts before `to` ends within the longest anchor after it.
    let hay = &buf[..buf.len().min(to.saturating_add(ac.max_pattern_len()))];
    let mut at = from;
    while at < to {
        let Some(m) = ac.find(Input::new(hay).span(at..hay.len())) else {
            break;
        };
        if m.start() >= to {
            break;
        }
        lines += count(&buf[counted..m.start()]);
        counted = m.start();
        out.push(Hit {
            at: m.start(),
            pattern: m.pattern().as_u32(),
            len: m.len() as u32,
            lines,
        });
        at = m.start() + 1;
    }
    lines + count(&buf[counted..to])
}

/// A window's "out of memory" hits with their parses, in input order.
type Parsed = std::collections::VecDeque<(usize, Option<Found>)>;

/// The parse of the "out of memory" hit at `at` (in `buf`).
fn parse_oom(buf: &[u8], base: usize, input: &str, at: usize) -> Option<Found> {
    let hit = (at, "out of memory".len());
    parse_window(buf, base, hit, Anchor::OutOfMemory, 0, input)
}

/// Parses a window's "out of memory" hits on every core into `parsed`
/// when there are many: a log aggregated from a large job holds one
/// message per rank and step, and their parsing is most of its scan. A
/// parse reads only its hit's window, so the walk takes the result it
/// would get itself; a hit it skips (inside a message already read) costs
/// a parse for nothing.
fn parse_ahead<'h>(
    buf: &[u8],
    base: usize,
    input: &str,
    hits: impl Iterator<Item = &'h Hit>,
    parsed: &mut Parsed,
) {
    use rayon::prelude::*;
    let (_, kinds) = &*ANCHORS;
    parsed.clear();
    let ooms: Vec<usize> = hits
        .filter(|h| matches!(kinds[h.pattern as usize], Anchor::OutOfMemory))
        .map(|h| h.at)
        .collect();
    if ooms.len() >= AHEAD_PARALLEL {
        parsed.extend(
            ooms.into_par_iter()
                .map(|at| (at, parse_oom(buf, base, input, at)))
                .collect::<Vec<_>>(),
        );
    }
}

/// The parse of the "out of memory" hit at `hit` (in `buf`): parsed ahead,
/// or here.
fn take_parsed(
    parsed: &mut Parsed,
    buf: &[u8],
    base: usize,
    input: &str,
    hit: usize,
) -> Option<Found> {
    while parsed.front().is_some_and(|&(at, _)| at < hit) {
        parsed.pop_front();
    }
    match parsed.front() {
        Some(&(at, _)) if at == hit => parsed.pop_front().and_then(|(_, f)| f),
        _ => parse_oom(buf, base, input, hit),
    }
}

/// 1-based line numbers for offsets visited mostly in increasing order.
struct LineCounter {
    pos: usize,
    line: u64,
}

impl LineCounter {
    /// The line of absolute offset `off`, which `buf` (from `base`) holds,
    /// as does everything between it and the last offset asked for.
    fn line_of(&mut self, buf: &[u8], base: usize, off: usize) -> u64 {
        let count = |s: &[u8]| memchr::memchr_iter(b'\n', s).count() as u64;
        let (a, b) = (
            self.pos.min(off).saturating_sub(base),
            self.pos.max(off).saturating_sub(base),
        );
        let n = count(buf.get(a..b).unwrap_or_default());
        if off >= self.pos {
            self.line += n;
        } else {
            self.line -= n;
        }
        self.pos = off;
        self.line
    }

    /// Counts up to `off` before the bytes below it are dropped.
    fn advance(&mut self, buf: &[u8], base: usize, off: usize) {
        if off > self.pos {
            self.line_of(buf, base, off);
        }
    }
}

/// Python prints a chained exception's message again under "During handling
/// of the above exception" / "The above exception was the direct cause": the
/// same message (every figure equal; a wrapper may re-raise it under another
/// class, and a wrap may cut its first line elsewhere) with such a line
/// between is one OOM. Identical messages without it
/// (ranks, retries, iterations) all count.
fn is_chained_repeat(
    buf: &[u8],
    base: usize,
    prev: &Observation,
    prev_end: usize,
    next: &Found,
) -> bool {
    // A chained traceback is a few dozen lines; a hard wrap may split the phrase.
    if next.start < prev_end || next.start - prev_end > 64 * 1024 {
        return false;
    }
    let gap: Vec<u8> = buf
        .get(prev_end.saturating_sub(base)..next.start - base)
        .unwrap_or_default()
        .iter()
        .copied()
        .filter(|&b| b != b'\n' && b != b'\r')
        .collect();
    let chained = memchr::memmem::find(&gap, b"During handling of the above exception").is_some()
        || memchr::memmem::find(&gap, b"The above exception was the direct cause").is_some();
    // Checked last: the copy it compares costs more than the rest.
    chained
        && Observation {
            line: prev.line,
            exception: prev.exception.clone(),
            message: prev.message.clone(),
            ..next.obs.clone()
        } == *prev
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A few MiB of log with every kind of evidence and clue, repeated at
    /// shifting offsets, so that small chunks cut through each of them.
    fn log() -> Vec<u8> {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/text/");
        let piece = |name: &str| std::fs::read(format!("{dir}{name}")).expect("fixture");
        let pieces = [
            piece("constructed_2_4_every_clause.log"),
            piece("constructed_summary_2x_full.log"),
            piece("constructed_chained_same_message.log"),
            piece("constructed_hard_wrap_80.log"),
            b"PyTorch version: 2.3.1+cu121\nPYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128\n\
              File \"C:\\Users\\me\\train.py\", line 3\nvllm custom_all_reduce\n"
                .to_vec(),
        ];
        let mut out = Vec::new();
        let mut i = 0usize;
        while out.len() < 5 << 20 {
            out.extend(std::iter::repeat_n(b'.', i * 7919 % 4093));
            out.push(b'\n');
            out.extend_from_slice(&pieces[i % pieces.len()]);
            i += 1;
        }
        out
    }

    #[test]
    fn halves_searched_apart_find_the_hits_and_lines_of_the_whole() {
        let data = log();
        let data = &data[..1 << 20];
        let mut whole = Vec::new();
        let lines = hits_in(data, 0, data.len(), &mut whole);
        assert_eq!(lines, memchr::memchr_iter(b'\n', data).count() as u64);
        assert!(whole.len() > 100, "{}", whole.len());
        // Cuts at every byte around some hits (inside an anchor too), and elsewhere.
        let mut cuts: Vec<usize> = whole
            .iter()
            .step_by(17)
            .flat_map(|h| h.at.saturating_sub(2)..h.at + 30)
            .collect();
        cuts.extend((1..64).map(|k| k * data.len() / 64));
        for mid in cuts {
            let (mut first, mut second) = (Vec::new(), Vec::new());
            let n = hits_in(data, 0, mid, &mut first);
            let m = hits_in(data, mid, data.len(), &mut second);
            assert_eq!(n + m, lines, "cut at {mid}");
            let joined: Vec<Hit> = first
                .iter()
                .copied()
                .chain(second.iter().map(|h| Hit {
                    lines: h.lines + n,
                    ..*h
                }))
                .collect();
            assert!(joined == whole, "cut at {mid}");
        }
    }

    #[test]
    fn a_stream_in_small_chunks_finds_what_one_span_finds() {
        let data = log();
        let mut whole_clues = TextClues::default();
        let limits = crate::limits::Limits::default();
        let whole = scan_with_clues(&data, "log", &mut whole_clues, &limits).unwrap();
        assert!(whole.len() > 300, "{}", whole.len());
        assert_eq!(whole_clues.torch_version, Some((2, 3)));
        assert!(whole_clues.windows_paths && whole_clues.ipc_user);
        for chunk in [4099, 65536, 3 << 20] {
            let reader = Box::new(std::io::Cursor::new(data.clone()));
            let opened =
                super::super::open_stream("log", reader, &crate::limits::Limits::default())
                    .unwrap();
            let super::super::Body::Stream(mut stream) = opened.body else {
                panic!("a stream");
            };
            let mut clues = TextClues::default();
            let got = scan_chunks(&mut stream, "log", &mut clues, &limits, chunk).unwrap();
            assert_eq!(got.len(), whole.len(), "chunk {chunk}");
            assert!(got == whole, "chunk {chunk}");
            assert_eq!(clues, whole_clues, "chunk {chunk}");
        }
    }
}
