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
    /// unless the input ends first.
    fn span(&mut self, buf: &[u8], base: usize, limit: usize) {
        let input = self.input;
        rayon::in_place_scope(|scope| {
            let mut ahead = Ahead::new(scope, buf, base, limit, input);
            self.walk(buf, base, limit, &mut ahead);
        });
        self.next = self.next.max(limit);
    }

    /// [`Self::span`]'s walk from hit to hit.
    fn walk(&mut self, buf: &[u8], base: usize, limit: usize, ahead: &mut Ahead) {
        let (ac, kinds) = &*ANCHORS;
        while self.next < limit && self.over.is_none() {
            let Some(m) = ac.find(Input::new(buf).span(self.next - base..buf.len())) else {
                break;
            };
            let at = m.start() + base;
            if at >= limit {
                break;
            }
            self.next = at + 1;
            let anchor = kinds[m.pattern().as_usize()];
            let hit = match anchor {
                // Clues count everywhere, in what a parser took too (PyTorch's
                // hints in an OOM message).
                Anchor::Clue(clue) => {
                    self.finder.hit(clue, buf, m.start(), m.len(), self.clues);
                    continue;
                }
                // A stats key counts only behind a quote the scan has not passed.
                Anchor::Stats => match m.start().checked_sub(1) {
                    Some(q) if q + base >= self.pos && matches!(buf[q], b'\'' | b'"') => q,
                    _ => continue,
                },
                // Evidence inside what a parser took is part of that evidence.
                _ if at < self.pos => continue,
                _ => m.start(),
            };
            let found = match anchor {
                Anchor::OutOfMemory => ahead.take(hit),
                _ => self.parse(buf, base, hit, m.len(), anchor),
            };
            let Some(f) = found else {
                self.pos = hit + base + 1;
                continue;
            };
            self.pos = f.end.max(hit + base + 1);
            self.push(buf, base, f);
        }
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

/// Input read ahead per batch of "out of memory" messages parsed in parallel.
const AHEAD: usize = 4 << 20;
/// Fewer hits than this in a batch are parsed on this thread, and the next
/// batch is not parsed ahead.
const AHEAD_PARALLEL: usize = 32;

/// A batch's hits with their parses, in input order.
type Parsed = std::collections::VecDeque<(usize, Option<Found>)>;

/// "out of memory" hits parsed ahead, on every core: a log aggregated from a
/// large job holds one message per rank and step, and their parsing is most
/// of its scan. While the scan walks one batch, the next is parsed. The scan
/// takes each result when it reaches the hit; a hit it skips (inside a
/// message already read) costs a parse for nothing.
struct Ahead<'s, 'b> {
    scope: &'s rayon::Scope<'b>,
    buf: &'b [u8],
    base: usize,
    /// The span's end, in `buf`.
    limit: usize,
    input: &'b str,
    /// Every hit below this offset (in `buf`) is in `found`.
    to: usize,
    found: Parsed,
    /// The next batch: its start, its end, and where its parses arrive.
    coming: Option<(usize, usize, std::sync::mpsc::Receiver<Parsed>)>,
}

impl<'s, 'b> Ahead<'s, 'b> {
    const ANCHOR: &'static [u8] = b"out of memory";

    fn new(
        scope: &'s rayon::Scope<'b>,
        buf: &'b [u8],
        base: usize,
        limit: usize,
        input: &'b str,
    ) -> Self {
        Ahead {
            scope,
            buf,
            base,
            limit: limit - base,
            input,
            to: 0,
            found: Parsed::new(),
            coming: None,
        }
    }

    /// The end of the batch from `from`, and its hits.
    fn batch(&self, from: usize) -> (usize, Vec<usize>) {
        let end = self.limit.min(from.saturating_add(AHEAD)).max(from + 1);
        let stop = self.buf.len().min(end + Self::ANCHOR.len() - 1);
        let hits = memchr::memmem::find_iter(&self.buf[from..stop], Self::ANCHOR)
            .map(|i| from + i)
            .collect();
        (end, hits)
    }

    fn parse(buf: &[u8], base: usize, input: &str, at: usize) -> (usize, Option<Found>) {
        let hit = (at, Self::ANCHOR.len());
        (
            at,
            parse_window(buf, base, hit, Anchor::OutOfMemory, 0, input),
        )
    }

    fn parse_all(buf: &[u8], base: usize, input: &str, hits: Vec<usize>) -> Parsed {
        use rayon::prelude::*;
        let parse = |at| Self::parse(buf, base, input, at);
        if hits.len() < AHEAD_PARALLEL {
            hits.into_iter().map(parse).collect()
        } else {
            hits.into_par_iter().map(parse).collect::<Vec<_>>().into()
        }
    }

    /// The parse of the "out of memory" hit at `hit` (in `buf`).
    fn take(&mut self, hit: usize) -> Option<Found> {
        if hit >= self.to {
            let (buf, base, input) = (self.buf, self.base, self.input);
            self.found = match self.coming.take() {
                Some((from, end, parsed)) if from <= hit && hit < end => {
                    self.to = end;
                    // The job sends before it ends; had it failed, the batch is parsed here.
                    parsed
                        .recv()
                        .unwrap_or_else(|_| Self::parse_all(buf, base, input, self.batch(from).1))
                }
                _ => {
                    let (end, hits) = self.batch(hit);
                    self.to = end;
                    Self::parse_all(buf, base, input, hits)
                }
            };
            if self.found.len() >= AHEAD_PARALLEL && self.to < self.limit {
                let (end, hits) = self.batch(self.to);
                let (send, parsed) = std::sync::mpsc::sync_channel(1);
                self.scope.spawn(move |_| {
                    let _ = send.send(Self::parse_all(buf, base, input, hits));
                });
                self.coming = Some((self.to, end, parsed));
            }
        }
        while self.found.front().is_some_and(|&(at, _)| at < hit) {
            self.found.pop_front();
        }
        match self.found.front() {
            Some(&(at, _)) if at == hit => self.found.pop_front().and_then(|(_, f)| f),
            _ => Self::parse(self.buf, self.base, self.input, hit).1,
        }
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
