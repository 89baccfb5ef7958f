//! Out-of-memory messages: the caching allocator's (every era of
//! `c10/cuda/CUDACachingAllocator.cpp`, the cudaMallocAsync backend, HIP, XPU)
//! and everything else that runs out of memory (CUDA runtime, cuBLAS, cuDNN,
//! NCCL, MPS, host RAM, legacy THC).
//!
//! A message is assembled from its first line plus the lines a hard wrap
//! pushed down (joined without a separator, so a number cut by the wrap is
//! whole again), and every figure is read with a pattern that needs its unit
//! complete: a message cut off yields the figures it holds and no others.

use super::scan::Found;
use super::text::{
    self, clean, exception_before, has_process_prefix, line_end, line_start, shared_prefix,
};
use crate::evidence::{Backend, DeviceKind, Kind, Observation, OomSource, ProcessUse};
use crate::units::printed_size;
use regex::{Captures, Regex};
use std::sync::LazyLock;

/// How far back on the hit's line a prefix is read (lines with lost newlines
/// can be huge; a vLLM worker prefix and an exception class take ~130 bytes).
const LOOKBACK: usize = 512;
/// Limits on one assembled message.
const MAX_LINES: usize = 40;
const MAX_TEXT: usize = 8192;
/// Length of the `message` field.
const MESSAGE_CHARS: usize = 200;

/// Compiles a message pattern: a space matches any run of whitespace or of
/// literal `\n` escapes (a hard wrap may have eaten it; a repr or JSON string
/// escapes newlines), `SIZE` is a figure as `format_size` prints it,
/// `MPS_SIZE` one as the MPS allocator's `format_size` does (binary KB/MB/GB,
/// GiB-style labels in later versions).
fn pattern(p: &str) -> Regex {
    let p = p
        .replace(' ', r"(?:\s|\\[nrt])*")
        .replace(
            "MPS_SIZE",
            r"(\d+(?:\.\d+)?)\s*(bytes|KB|MB|GB|KiB|MiB|GiB)",
        )
        .replace("SIZE", r"(\d+(?:\.\d+)?)\s*(bytes|KiB|MiB|GiB|TiB)");
    Regex::new(&p).expect("built-in OOM pattern")
}

macro_rules! patterns {
    ($($name:ident = $p:expr;)*) => {
        $(static $name: LazyLock<Regex> = LazyLock::new(|| pattern($p));)*
    };
}

patterns! {
    // Native caching allocator, all eras (allocator.md §7.2).
    REQUESTED = "Tried to allocate SIZE";
    DEVICE_OLD = r"\(GPU (\d+) ;";
    DEVICE_NEW = "GPU (\\d+) has a total";
    TOTAL_OLD = "SIZE total capacity";
    TOTAL_NEW = "total capac(?:i)?ty of SIZE";
    ALLOCATED_OLD = "SIZE already allocated";
    ALLOCATED_NEW = "Of the allocated memory SIZE";
    FREE_OLD = "SIZE free";
    FREE_NEW = "of which SIZE";
    RESERVED_OLD = "SIZE reserved in total by PyTorch";
    CACHED = "SIZE cached";
    RESERVED_UNALLOCATED = "SIZE is reserved by PyTorch but unallocated";
    PRIVATE_POOLS = "with SIZE allocated in private pools";
    ALLOWED = "SIZE allowed ;";
    THIS_PROCESS = "this process has SIZE";
    OTHER_PROCESS = r"Process (\d+) has SIZE";
    // cudaMallocAsync backend (c10/cuda/CUDAMallocAsyncAllocator.cpp, mallocAsync).
    ASYNC_DEVICE = "Allocation on device (\\d+) would exceed";
    ASYNC_ALLOCATED = "Currently allocated : SIZE";
    ASYNC_REQUESTED = "Requested : SIZE";
    ASYNC_LIMIT = "Device limit : SIZE";
    ASYNC_FREE = r"Free \(according to CUDA\) : SIZE";
    ASYNC_FRACTION = r"PyTorch limit \(set by user-supplied memory fraction\) : SIZE";
    // The end of each era's message: its absence means the text was cut.
    COMPLETE = r"cached \)|Memory Management (?:and PYTORCH_\w*ALLOC_CONF|\( https?://[^\s)]*\))|unoccupied cached memory\.|more than 1EB memory\.";
    // What sits right before "out of memory" decides who ran out.
    LEAD_ALLOCATOR = r"(CUDA|HIP|XPU) $";
    LEAD_RETYPED = r"(?i)\b(cuda|hip|xpu) $";
    LEAD_RUNTIME = r"(CUDA|HIP) (?:driver )?error : $";
    LEAD_NCCL = r"Cuda failure (?:\d+ )?'$";
    LEAD_MPS = r"MPS backend $";
    LEAD_THC = r"cuda runtime error \( ?2 ?\) : $";
    // THC's THCudaCheck line (THCGeneral), printed before it raises LEAD_THC.
    LEAD_THC_CHECK = r"THCudaCheck FAIL file=(\S+) line=(\d+) error=2 : $";
    // MPSAllocator.mm (its format_size prints binary "KB/MB/GB").
    MPS_ALLOCATED = "MPS allocated : MPS_SIZE";
    MPS_ALLOWED = "max allowed : MPS_SIZE";
    MPS_OTHER = "other allocations : MPS_SIZE";
    MPS_REQUESTED = "Tried to allocate MPS_SIZE";
    // c10/core/impl/alloc_cpu.cpp prints bytes; TH's THAlloc/THRealloc before it
    // printed `size / 1073741824` as "%dGB" (whole GiB, rounded down).
    HOST_REQUESTED = r"you tried to (?:re)?allocate (\d+) (bytes|GB)";
    // A head retyped by hand ("Cuda out of the memory."), which LEAD_ALLOCATOR misses.
    RETYPED_HEAD = r"(?i)\b(cuda|hip|xpu) out of (?:the )?memory [.!:,]? $";
    // IPEX's XPU allocator (csrc/gpu/runtime/CachingDeviceAllocator.cpp) refuses a
    // block over 4 GB on platforms without 2D block arrays, then prints its figures.
    IPEX_LIMIT = r"Current platform can NOT allocate memory block with size larger than \d+GB ! $";
    // The parenthesised figures of a 1.x message quoted without their head.
    FRAGMENT_OPEN = r"\(GPU \d+ ; SIZE $";
    // cudaMallocAsync's message after its head (wrapped or not).
    ASYNC_EXCEED = "would exceed allowed memory";
}

/// Reads the size captured as groups `i` (number) and `i + 1` (unit).
fn size_at(c: &Captures, i: usize) -> Option<u64> {
    let v: f64 = c.get(i)?.as_str().parse().ok()?;
    printed_size(v, c.get(i + 1)?.as_str())
}

/// The one figure of a pattern whose words hold no digit. Only the DFA runs
/// (`find`); the number and unit are read from the match by hand, which in an
/// ASCII match gives what the captures give (its first digit starts the
/// number, `\d` and `\s` are ASCII there) at a fraction of the capture
/// engine's cost. A match with other characters takes the captures.
fn size(re: &Regex, text: &str) -> Option<u64> {
    let m = re.find(text)?;
    let s = m.as_str();
    if !s.is_ascii() {
        return size_at(&re.captures_at(text, m.start())?, 1);
    }
    let (number, rest) = leading_number(s)?;
    let rest = rest.trim_start();
    let unit = UNITS.iter().find(|u| rest.starts_with(*u))?;
    printed_size(number.parse().ok()?, unit)
}

/// Every unit `SIZE` and `MPS_SIZE` take; none starts another, so after a
/// match's number exactly one of them follows.
const UNITS: [&str; 8] = ["bytes", "KiB", "MiB", "GiB", "TiB", "KB", "MB", "GB"];

/// The `\d+(?:\.\d+)?` at the first digit of an ASCII `s`, and what follows it.
fn leading_number(s: &str) -> Option<(&str, &str)> {
    let b = s.as_bytes();
    let start = b.iter().position(u8::is_ascii_digit)?;
    let digits = |from: usize| from + b[from..].iter().take_while(|c| c.is_ascii_digit()).count();
    let mut end = digits(start);
    if b.get(end) == Some(&b'.') && b.get(end + 1).is_some_and(u8::is_ascii_digit) {
        end = digits(end + 1);
    }
    Some((&s[start..end], &s[end..]))
}

/// The index of a pattern whose only number is its `(\d+)`, read as [`size`] reads.
fn index(re: &Regex, text: &str) -> Option<u32> {
    let m = re.find(text)?;
    if !m.as_str().is_ascii() {
        return re
            .captures_at(text, m.start())?
            .get(1)?
            .as_str()
            .parse()
            .ok();
    }
    // In a match the digits are followed by a space or `;`, never by `.5`.
    leading_number(m.as_str())?.0.parse().ok()
}

/// One message gathered from its first line and the lines wrapped below it.
struct Message {
    /// The message from its first word, continuation lines appended.
    text: String,
    /// The cleaned text in front of the message on its first line.
    prefix: String,
    /// Byte offset of the message's first line.
    start: usize,
    /// Byte offset just past what the message used.
    end: usize,
}

impl Message {
    /// The message's first line, also ending at a literal `\n` escape.
    fn first_line(&self, first_len: usize) -> String {
        let cut = text::ceil_boundary(&self.text, first_len.min(self.text.len()));
        let first = &self.text[..cut];
        let first = first.find("\\n").map_or(first, |i| &first[..i]);
        text::head(first.trim_end(), MESSAGE_CHARS)
    }
}

/// The cleaned text of the hit's line before and after the hit. `before` is
/// bounded by [`LOOKBACK`]; `after` by the next `stop` (lost newlines put
/// several messages on one line).
struct HitLine {
    before: String,
    after: String,
    line_start: usize,
    /// End of the raw part used (the line's end, or where the next message begins).
    bound: usize,
    /// True when the line continues with another message (no continuation lines then).
    bounded: bool,
}

fn hit_line(data: &[u8], hit: usize, anchor_len: usize, stop: &[u8]) -> HitLine {
    let ls = line_start(data, hit);
    let le = line_end(data, hit);
    let from = ls.max(hit.saturating_sub(LOOKBACK));
    let search_from = (hit + anchor_len).min(le);
    let next = memchr::memmem::find(&data[search_from..le], stop).map(|i| search_from + i);
    // Back up over the word that leads the next message ("CUDA ", "HIP ").
    let bound = next.map_or(le, |n| {
        let w = data[search_from..n]
            .iter()
            .rposition(|&b| b == b' ' || b == b'.' || b == b')')
            .map_or(n, |i| search_from + i + 1);
        w.max(search_from)
    });
    HitLine {
        before: clean(&data[from..hit]),
        after: clean(&data[hit..bound]),
        line_start: ls,
        bound,
        bounded: next.is_some(),
    }
}

/// How a message's end is recognised.
struct Ending<'a> {
    /// The text read so far is the whole message.
    complete: &'a dyn Fn(&str) -> bool,
    /// A whole message may still go on with a line starting so (the 1.10-2.0
    /// hint after the closing parenthesis that 1.4-1.9 messages end with).
    resume: Option<&'a str>,
}

/// Appends the lines a hard wrap pushed below the first one, until the
/// message is whole, a line plainly belongs to something else, or the limits
/// are reached.
fn continue_lines(
    data: &[u8],
    msg: &mut Message,
    mut pos: usize,
    log_prefix: &str,
    ending: &Ending,
) {
    let log_prefix = log_prefix.trim_end();
    for _ in 0..MAX_LINES {
        let whole = (ending.complete)(&msg.text);
        if (whole && ending.resume.is_none()) || msg.text.len() > MAX_TEXT || pos >= data.len() {
            return;
        }
        let le = line_end(data, pos);
        let raw = clean(&data[pos..le]);
        let mut line = raw.as_str();
        if !log_prefix.is_empty() {
            match line.strip_prefix(log_prefix) {
                Some(rest) => line = rest,
                None if has_process_prefix(line) => return,
                None => {}
            }
        }
        let line = line.trim();
        if line.is_empty()
            || starts_other_record(line, &msg.text)
            || (whole
                && !ending
                    .resume
                    .is_some_and(|r| line.starts_with(r) || r.starts_with(line)))
        {
            return;
        }
        msg.text.push_str(line);
        msg.end = le;
        pos = le + 1;
    }
}

/// A line that cannot be the wrapped rest of the message being read.
fn starts_other_record(line: &str, so_far: &str) -> bool {
    const OTHER: [&str; 5] = [
        "Traceback (most recent call last)",
        "During handling of the above exception",
        "The above exception was the direct cause",
        "File \"",
        "|",
    ];
    static HAS_HEAD: LazyLock<Regex> = LazyLock::new(|| pattern("out of memory"));
    OTHER.iter().any(|p| line.starts_with(p))
        || (line.contains("out of memory") && HAS_HEAD.is_match(so_far))
        || line.contains("memory summary")
        || (line.contains("Tried to allocate") && so_far.contains("Tried to allocate"))
}

/// Builds a message whose first word starts at `msg_start` in `line.before`
/// (or at the hit when `msg_start == line.before.len()`).
fn gather(data: &[u8], line: HitLine, msg_start: usize, ending: &Ending) -> (Message, usize) {
    let msg_start = text::ceil_boundary(&line.before, msg_start);
    let mut text = line.before[msg_start..].to_owned();
    text.push_str(line.after.trim_end());
    let first_len = text.len();
    let prefix_end = exception_before(&line.before[..msg_start]).map_or(msg_start, |(_, at)| at);
    let prefix = line.before[..prefix_end].to_owned();
    let mut msg = Message {
        text,
        prefix,
        start: line.line_start,
        end: line.bound,
    };
    if !line.bounded {
        let log_prefix = msg.prefix.clone();
        continue_lines(data, &mut msg, line.bound + 1, &log_prefix, ending);
    }
    (msg, first_len)
}

/// An `oom` observation with the exception class printed before the message
/// and the rank its prefix names.
fn oom_observation(data: &[u8], input: &str, before_msg: &str, msg: &Message) -> Observation {
    let mut obs = Observation::new(Kind::Oom, input);
    // The class on the message's line may be the tail of one a wrap split
    // ("torch.OutOfMemoryErr" / "or: CUDA …"); the joined name is taken only
    // when it is a class PyTorch raises for an OOM (§7.3), so a source line
    // ending in a word ("    raise") is never glued onto it.
    let on_line = exception_before(before_msg).map(|(e, _)| e);
    let wrapped = wrapped_exception(data, msg.start, before_msg)
        .filter(|w| OOM_CLASSES.contains(&w.as_str()))
        .filter(|w| {
            on_line
                .as_ref()
                .is_none_or(|t| w.ends_with(t.as_str()) && w != t)
        });
    obs.exception = wrapped.or(on_line);
    obs.rank = text::rank_in(&msg.prefix);
    obs
}

/// The classes an OOM is raised as (allocator.md §7.3; 2.8+ runtime errors).
const OOM_CLASSES: [&str; 5] = [
    "torch.OutOfMemoryError",
    "torch.cuda.OutOfMemoryError",
    "torch._C._OutOfMemoryError",
    "OutOfMemoryError",
    "RuntimeError",
];

/// The exception class a hard wrap left on the line above a message that
/// starts its line ("… torch.OutOfMemoryErr" / "or: CUDA out of memory.").
fn wrapped_exception(data: &[u8], line_start: usize, before_msg: &str) -> Option<String> {
    const SHORT: usize = 80;
    if line_start == 0 || before_msg.len() > SHORT {
        return None;
    }
    let prev_start = text::line_start(data, line_start - 1);
    let prev = clean(&data[prev_start..line_start - 1]);
    let piece = before_msg[shared_prefix(&prev, before_msg)..].trim_start();
    exception_before(&format!("{}{piece}", prev.trim_end())).map(|(e, _)| e)
}

/// The device kind a message's first word names ("CUDA", "HIP", "XPU").
fn device_of(word: &str) -> DeviceKind {
    match word {
        "HIP" => DeviceKind::Hip,
        "XPU" => DeviceKind::Xpu,
        _ => DeviceKind::Cuda,
    }
}

/// A hit on "out of memory": decides who ran out from the words before it.
pub fn out_of_memory(data: &[u8], hit: usize, input: &str) -> Option<Found> {
    const ANCHOR: &[u8] = b"out of memory";
    let line = hit_line(data, hit, ANCHOR.len(), ANCHOR);
    let before = line.before.clone();
    let exact = LEAD_ALLOCATOR.captures(&before);
    if let Some(m) = exact.as_ref().or(LEAD_RETYPED.captures(&before).as_ref()) {
        let lead = m.get(1)?;
        let device = device_of(&lead.as_str().to_ascii_uppercase());
        let after = line.after.as_str();
        // "CUDA out of memory." (or cut right there); prose like "CUDA out of memory errors" is not PyTorch's.
        let rest = after.get(ANCHOR.len()..).unwrap_or("");
        let plain = rest.is_empty() || rest.starts_with('.');
        if !plain && !rest.starts_with([':', ',']) {
            return None;
        }
        let at = lead.start();
        let found = allocator(data, line, at, device, input, &before[..at]);
        // A head retyped by hand ("Cuda out of memory:") counts when its figures follow.
        if (exact.is_none() || !plain) && found.obs.requested_bytes.is_none() {
            return None;
        }
        return Some(found);
    }
    let (source, lead) = if let Some(m) = LEAD_RUNTIME.captures(&before) {
        let device = if m.get(1)?.as_str() == "HIP" {
            DeviceKind::Hip
        } else {
            DeviceKind::Cuda
        };
        ((OomSource::CudaRuntime, Some(device)), m.get(0)?.start())
    } else if let Some(m) = LEAD_NCCL.find(&before) {
        (
            (OomSource::Nccl, Some(DeviceKind::Cuda)),
            nccl_start(&before, m.start()),
        )
    } else if let Some(m) = LEAD_MPS.find(&before) {
        ((OomSource::Mps, Some(DeviceKind::Mps)), m.start())
    } else if let Some(m) = LEAD_THC.find(&before) {
        ((OomSource::LegacyThc, Some(DeviceKind::Cuda)), m.start())
    } else if let Some(c) = LEAD_THC_CHECK.captures(&before) {
        // The raise that follows the check names the same place: it is the report.
        if thc_raised_later(data, hit, c.get(1)?.as_str(), c.get(2)?.as_str()) {
            return None;
        }
        (
            (OomSource::LegacyThc, Some(DeviceKind::Cuda)),
            c.get(0)?.start(),
        )
    } else {
        return None;
    };
    Some(non_allocator(data, line, lead, source, input))
}

/// Whether "cuda runtime error (2) : out of memory at FILE:LINE" follows a
/// THCudaCheck line for FILE and LINE (THCudaCheck prints the check, then
/// raises; a traceback may stand between).
fn thc_raised_later(data: &[u8], hit: usize, file: &str, line: &str) -> bool {
    const RAISE: &[u8] = b"cuda runtime error (2) : out of memory at ";
    let window = &data[hit..data.len().min(hit + 64 * 1024)];
    let place = format!("{file}:{line}");
    memchr::memmem::find_iter(window, RAISE).any(|at| {
        window[at + RAISE.len()..]
            .strip_prefix(place.as_bytes())
            .is_some_and(|rest| !rest.first().is_some_and(u8::is_ascii_digit))
    })
}

/// NCCL prints "NCCL WARN Cuda failure 'out of memory'"; start at "NCCL" when it is there.
fn nccl_start(before: &str, lead: usize) -> usize {
    before[..lead].rfind("NCCL").unwrap_or(lead)
}

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
/// [`continue_lines`] will.
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
fn allocator(
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

/// "Allocation on device N would exceed allowed memory. (out of memory)" and
/// its lines: the cudaMallocAsync backend. The hit is on its head or, when a
/// wrap split the head, on "would exceed allowed memory".
pub fn malloc_async(data: &[u8], hit: usize, input: &str) -> Option<Found> {
    const HEAD: &str = "Allocation on device";
    let on_head = data[hit..].starts_with(HEAD.as_bytes());
    let anchor_len = if on_head {
        HEAD.len()
    } else {
        "would exceed allowed memory".len()
    };
    let line = hit_line(data, hit, anchor_len, HEAD.as_bytes());
    let lead = if on_head {
        line.before.len()
    } else {
        line.before.rfind(HEAD)?
    };
    let before = line.before[..lead].to_owned();
    // Nothing after the head on its line: the short form, unless a wrap moved the rest down.
    let bare = on_head && line.after[HEAD.len()..].trim().is_empty();
    let line_end = line.bound;
    let complete = |t: &str| ASYNC_FRACTION.is_match(t);
    let ending = Ending {
        complete: &complete,
        resume: None,
    };
    let (msg, first_len) = gather(data, line, lead, &ending);
    let t = msg.text.as_str();
    if !ASYNC_EXCEED.is_match(t) {
        return async_short_form(data, input, &before, msg, line_end).filter(|_| bare);
    }
    let mut obs = oom_observation(data, input, &before, &msg);
    obs.device_kind = Some(DeviceKind::Cuda);
    obs.backend = Some(Backend::CudaMallocAsync);
    obs.format_era = Some("cudaMallocAsync".to_owned());
    obs.truncated = !complete(t);
    obs.device_index = index(&ASYNC_DEVICE, t);
    obs.allocated_bytes = size(&ASYNC_ALLOCATED, t);
    obs.requested_bytes = size(&ASYNC_REQUESTED, t);
    obs.total_capacity_bytes = size(&ASYNC_LIMIT, t);
    obs.free_bytes = size(&ASYNC_FREE, t);
    // Without a fraction the limit is SIZE_MAX ("17179869184.00 GiB"): no cap was set.
    obs.allowed_bytes = size(&ASYNC_FRACTION, t).filter(|&b| b < 1 << 60);
    obs.message = Some(msg.first_line(first_len));
    Some(comfy_fold(
        data,
        Found {
            obs,
            start: msg.start,
            end: msg.end,
        },
        &msg.prefix,
    ))
}

/// "Allocation on device " and nothing more: cudaMallocAsync streams the device
/// index, a `c10::DeviceIndex` (int8_t), as a character, so device 0 is a NUL
/// byte that ends the message when Python turns it into a string (pytorch#168369,
/// the native allocator's twin was pytorch#123984). No figures survive; it counts
/// only where its class, or ComfyUI's log line or error report, introduces it.
fn async_short_form(
    data: &[u8],
    input: &str,
    before: &str,
    msg: Message,
    line_end: usize,
) -> Option<Found> {
    static REPORT_TYPE: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"Exception Type:\**\s*([A-Za-z_][\w.]*OutOfMemoryError)").unwrap()
    });
    let lead_in = before.trim_end();
    let mut obs = oom_observation(data, input, before, &msg);
    let introduced = obs
        .exception
        .as_deref()
        .is_some_and(|e| OOM_CLASSES.contains(&e));
    if lead_in.ends_with("**Exception Message:**") && msg.start > 0 {
        // ComfyUI's error report names the class on the line above.
        let prev = clean(&data[line_start(data, msg.start - 1)..msg.start - 1]);
        obs.exception = Some(REPORT_TYPE.captures(&prev)?.get(1)?.as_str().to_owned());
    } else if !introduced && !lead_in.ends_with(COMFY_LOG) {
        return None;
    }
    obs.device_kind = Some(DeviceKind::Cuda);
    obs.backend = Some(Backend::CudaMallocAsync);
    obs.format_era = Some("cudaMallocAsync".to_owned());
    obs.truncated = true;
    obs.message = Some("Allocation on device".to_owned());
    let found = Found {
        obs,
        start: msg.start,
        end: line_end,
    };
    Some(comfy_fold(data, found, &msg.prefix))
}

/// What ComfyUI logs before a failed node's exception message.
const COMFY_LOG: &str = "!!! Exception during processing !!!";

/// ComfyUI logs a failed node's message ("!!! Exception during processing !!!
/// <message>") and then its traceback, whose last line is the same message
/// under its class: one failure. The found message then extends over that
/// line, which also names the class.
fn comfy_fold(data: &[u8], mut found: Found, prefix: &str) -> Found {
    const WINDOW: usize = 64 * 1024;
    if !prefix.trim_end().ends_with(COMFY_LOG) || found.end >= data.len() {
        return found;
    }
    let Some(message) = found.obs.message.clone() else {
        return found;
    };
    // Compare the start of the message (its first line may be shortened).
    let key = &message[..text::ceil_boundary(&message, message.len().min(48))];
    let key = key.trim_end_matches('…').trim_end();
    let limit = data.len().min(found.end + WINDOW);
    let mut pos = found.end + 1;
    let mut in_traceback = false;
    while pos < limit {
        let le = line_end(data, pos);
        let l = clean(&data[pos..le]);
        if !in_traceback {
            if !l.contains("Traceback (most recent call last)") {
                return found;
            }
            in_traceback = true;
        } else if let Some(at) = l.find(key)
            && let Some((class, _)) = exception_before(&l[..at])
            && OOM_CLASSES.contains(&class.as_str())
        {
            found.end = le;
            found.obs.exception.get_or_insert(class);
            return found;
        }
        pos = le + 1;
    }
    found
}

/// Which library a non-allocator anchor names.
#[derive(Debug, Clone, Copy)]
pub enum Library {
    Cublas,
    Cudnn,
    Host,
    LevelZero,
}

/// cuBLAS/cuDNN status codes, the host allocator, Level Zero.
pub fn library(
    data: &[u8],
    hit: usize,
    anchor_len: usize,
    lib: Library,
    input: &str,
) -> Option<Found> {
    let line = hit_line(data, hit, anchor_len, b"\n");
    let before = line.before.as_str();
    // "$ Torch: " is TH's THError prefix (THAlloc, before the c10 CPU allocator).
    let th = before.trim_end().strip_suffix("$ Torch:").map(str::len);
    if matches!(lib, Library::Host) && th.is_none() && !before.trim_end().ends_with("CPUAllocator:")
    {
        return None;
    }
    // Start after the exception class when it is close to the anchor, else at TH's prefix.
    let lead = text::exception_in(before)
        .filter(|&(_, _, end)| before.len() - end <= 80)
        .map(|(_, _, end)| end)
        .or(th)
        .unwrap_or(before.len());
    let lead = before.len() - before[lead..].trim_start().len();
    let source = match lib {
        Library::Cublas => (OomSource::Cublas, Some(DeviceKind::Cuda)),
        Library::Cudnn => (OomSource::Cudnn, Some(DeviceKind::Cuda)),
        Library::Host => (OomSource::Host, None),
        Library::LevelZero => (OomSource::Xpu, Some(DeviceKind::Xpu)),
    };
    Some(non_allocator(data, line, lead, source, input))
}

/// A device error that is not out of memory, on the line of `hit`:
/// vLLM's CuMemAllocator prints `CUDA Error: invalid argument at
/// …/cumem_allocator.cpp:278` (its `CUDA_CHECK`, hipified on ROCm with the
/// same words), PyTorch raises `CUDA error: …` / `HIP error: …`
/// (`C10_CUDA_CHECK`).
pub fn device_error(data: &[u8], hit: usize, input: &str) -> Option<Found> {
    let line = hit_line(data, hit, 0, b"\n");
    // A cut line may be the head of a memory failure (`CUDA error: CUB…`).
    if data.get(line.bound) != Some(&b'\n') {
        return None;
    }
    let text = line.after.trim();
    let what = text.split_once(": ").map_or("", |(_, w)| w.trim());
    // Memory failures (`CUDA error: out of memory`, `CUDA error:
    // CUBLAS_STATUS_ALLOC_FAILED …`) are the other parsers' to read.
    let lower = text.to_ascii_lowercase();
    if what.is_empty()
        || ["out of memory", "alloc_failed", "out_of_device_memory"]
            .iter()
            .any(|m| lower.contains(m))
    {
        return None;
    }
    let mut obs = Observation::new(Kind::DeviceError, input);
    // vLLM's hipified build on ROCm still says "CUDA Error": only PyTorch's
    // "HIP error" names the device kind.
    obs.device_kind = text.starts_with("HIP").then_some(DeviceKind::Hip);
    obs.message = Some(text::head(text, MESSAGE_CHARS));
    Some(Found {
        obs,
        start: hit,
        end: line.bound,
    })
}

fn non_allocator(
    data: &[u8],
    line: HitLine,
    lead: usize,
    (source, device): (OomSource, Option<DeviceKind>),
    input: &str,
) -> Found {
    let before = line.before.clone();
    // The exception class sits right before the lead ("RuntimeError: CUDA error: …").
    let exception = text::exception_in(&before[..lead]).filter(|&(_, _, end)| lead - end <= 2);
    let prefix_end = exception.as_ref().map_or(lead, |&(_, start, _)| start);
    // MPS and host messages may wrap; the others are one line.
    let complete = |t: &str| match source {
        OomSource::Mps => t.contains("system failure)"),
        OomSource::Host => HOST_REQUESTED.is_match(t),
        _ => true,
    };
    let ending = Ending {
        complete: &complete,
        resume: None,
    };
    let (msg, first_len) = gather(data, line, lead, &ending);
    let t = msg.text.as_str();
    let mut obs = Observation::new(Kind::NonAllocatorOom, input);
    obs.exception = exception.map(|(e, _, _)| e);
    obs.rank = text::rank_in(&before[..prefix_end]);
    obs.source = Some(source);
    obs.device_kind = device;
    match source {
        OomSource::Mps => {
            obs.allocated_bytes = size(&MPS_ALLOCATED, t);
            obs.allowed_bytes = size(&MPS_ALLOWED, t);
            obs.other_allocations_bytes = size(&MPS_OTHER, t);
            obs.requested_bytes = size(&MPS_REQUESTED, t);
            obs.truncated = !complete(t);
        }
        // THC, the allocator before 1.0 (allocator.md §7.2).
        OomSource::LegacyThc => obs.format_era = Some("pre-1.0".to_owned()),
        OomSource::Host => {
            obs.requested_bytes = HOST_REQUESTED.captures(t).and_then(|c| {
                let n: u64 = c.get(1)?.as_str().parse().ok()?;
                match c.get(2)?.as_str() {
                    // Whole GiB rounded down: "0GB" says only "under 1 GiB".
                    "GB" => n.checked_mul(1 << 30).filter(|&b| b > 0),
                    _ => Some(n),
                }
            });
            obs.truncated = !complete(t);
        }
        _ => {}
    }
    obs.message = Some(msg.first_line(first_len));
    Found {
        obs,
        start: msg.start,
        end: msg.end,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`size`] and [`index`] read what the captures read, on every line of
    /// every text fixture (and each line with its neighbours, for wraps) and
    /// on shapes made to tempt a hand parser.
    #[test]
    fn figures_read_by_hand_are_the_captured_ones() {
        let sizes: [&Regex; 22] = [
            &REQUESTED,
            &TOTAL_OLD,
            &TOTAL_NEW,
            &ALLOCATED_OLD,
            &ALLOCATED_NEW,
            &FREE_OLD,
            &FREE_NEW,
            &RESERVED_OLD,
            &CACHED,
            &RESERVED_UNALLOCATED,
            &PRIVATE_POOLS,
            &ALLOWED,
            &THIS_PROCESS,
            &ASYNC_ALLOCATED,
            &ASYNC_REQUESTED,
            &ASYNC_LIMIT,
            &ASYNC_FREE,
            &ASYNC_FRACTION,
            &MPS_ALLOCATED,
            &MPS_ALLOWED,
            &MPS_OTHER,
            &MPS_REQUESTED,
        ];
        let indices: [&Regex; 3] = [&DEVICE_NEW, &DEVICE_OLD, &ASYNC_DEVICE];
        let dirs = ["/fixtures/text", "/fixtures/eval"];
        let mut texts: Vec<String> = vec![
            "Tried to allocate 1.5.5 GiB; 12.50 GiB total capacity; 3. 2 GiB free".into(),
            "Tried to allocate\\n2.00\u{a0}GiB (GPU 0 ; 7 GiB total capacity ; 5 MiB free".into(),
            "of which ١٢ GiB is free; of which 3 MiB is free; MPS allocated: 2.5 GB, max allowed: 18.13 GB".into(),
            "Allocation on device 12 would exceed allowed memory. Currently allocated     : 7.01 GiB".into(),
        ];
        let files = dirs.iter().flat_map(|d| {
            let dir = format!("{}{d}", env!("CARGO_MANIFEST_DIR"));
            std::fs::read_dir(dir).unwrap().map(|f| f.unwrap().path())
        });
        for f in files.filter(|f| f.is_file()) {
            let data = std::fs::read(f).unwrap();
            let lines: Vec<String> = text::clean(&data).lines().map(str::to_owned).collect();
            for w in lines.windows(3) {
                texts.push(w.concat());
            }
        }
        let mut read = 0;
        for t in &texts {
            for re in sizes {
                let captured = re.captures(t).and_then(|c| size_at(&c, 1));
                assert_eq!(size(re, t), captured, "{re} on {t:?}");
                read += usize::from(captured.is_some());
            }
            for re in indices {
                let captured = re.captures(t).and_then(|c| c.get(1)?.as_str().parse().ok());
                assert_eq!(index(re, t), captured, "{re} on {t:?}");
            }
        }
        assert!(read > 1200, "only {read} figures read");
    }
}
