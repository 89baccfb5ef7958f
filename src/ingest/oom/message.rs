//! One message assembled: its first line and the lines a hard wrap pushed down, the
//! exception class and rank before it, and ComfyUI's repeat of it under its traceback.

use super::patterns::pattern;
use crate::evidence::{Kind, Observation};
use crate::ingest::scan::Found;
use crate::ingest::text::{
    self, clean, exception_before, has_process_prefix, line_end, line_start, shared_prefix,
};
use regex::Regex;
use std::sync::LazyLock;

/// How far back on the hit's line a prefix is read (lines with lost newlines
/// can be huge; a vLLM worker prefix and an exception class take ~130 bytes).
const LOOKBACK: usize = 512;
/// Limits on one assembled message.
const MAX_LINES: usize = 40;
const MAX_TEXT: usize = 8192;
/// Length of the `message` field.
pub(super) const MESSAGE_CHARS: usize = 200;

/// One message gathered from its first line and the lines wrapped below it.
pub(super) struct Message {
    /// The message from its first word, continuation lines appended.
    pub(super) text: String,
    /// The cleaned text in front of the message on its first line.
    pub(super) prefix: String,
    /// Byte offset of the message's first line.
    pub(super) start: usize,
    /// Byte offset just past what the message used.
    pub(super) end: usize,
}

impl Message {
    /// The message's first line, also ending at a literal `\n` escape.
    pub(super) fn first_line(&self, first_len: usize) -> String {
        let cut = text::ceil_boundary(&self.text, first_len.min(self.text.len()));
        let first = &self.text[..cut];
        let first = first.find("\\n").map_or(first, |i| &first[..i]);
        text::head(first.trim_end(), MESSAGE_CHARS)
    }
}

/// The cleaned text of the hit's line before and after the hit. `before` is
/// bounded by [`LOOKBACK`]; `after` by the next `stop` (lost newlines put
/// several messages on one line).
pub(super) struct HitLine {
    pub(super) before: String,
    pub(super) after: String,
    pub(super) line_start: usize,
    /// End of the raw part used (the line's end, or where the next message begins).
    pub(super) bound: usize,
    /// True when the line continues with another message (no continuation lines then).
    pub(super) bounded: bool,
}

pub(super) fn hit_line(data: &[u8], hit: usize, anchor_len: usize, stop: &[u8]) -> HitLine {
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
pub(super) struct Ending<'a> {
    /// The text read so far is the whole message.
    pub(super) complete: &'a dyn Fn(&str) -> bool,
    /// A whole message may still go on with a line starting so (the 1.10-2.0
    /// hint after the closing parenthesis that 1.4-1.9 messages end with).
    pub(super) resume: Option<&'a str>,
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
pub(super) fn gather(
    data: &[u8],
    line: HitLine,
    msg_start: usize,
    ending: &Ending,
) -> (Message, usize) {
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
pub(super) fn oom_observation(
    data: &[u8],
    input: &str,
    before_msg: &str,
    msg: &Message,
) -> Observation {
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
pub(super) const OOM_CLASSES: [&str; 5] = [
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

/// What ComfyUI logs before a failed node's exception message.
pub(super) const COMFY_LOG: &str = "!!! Exception during processing !!!";

/// ComfyUI logs a failed node's message ("!!! Exception during processing !!!
/// <message>") and then its traceback, whose last line is the same message
/// under its class: one failure. The found message then extends over that
/// line, which also names the class.
pub(super) fn comfy_fold(data: &[u8], mut found: Found, prefix: &str) -> Found {
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
