//! RMM replay logs (`rmm::mr::logging_resource_adaptor`): a CSV with the header
//! `Thread,Time,Action,Pointer,Size,Stream` and one row per `allocate`,
//! `free` (some RMM versions write `deallocate`) or `allocate failure`.
//!
//! The log is read into [`RmmLog`]: allocations keyed by pointer, streams
//! numbered densely in order of appearance (0 stays the default stream), and
//! pointers freed without a logged allocation (the log started while they were
//! live) listed so the replay can place them before the first event.

use super::trace::{Event, Trace};
use crate::Error;
use std::collections::HashMap;

/// The header RMM writes (`logging_resource_adaptor::header()`).
pub const HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RmmAction {
    Allocate,
    Free,
    /// The upstream resource refused the request (the pointer is null).
    AllocateFailure,
}

/// One row of the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RmmEvent {
    pub action: RmmAction,
    pub pointer: u64,
    pub size: u64,
    /// Dense stream number: 0 for the default stream, then 1, 2, … by first use.
    pub stream: u32,
    /// 1-based line in the input.
    pub line: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RmmLog {
    pub events: Vec<RmmEvent>,
    /// `(pointer, size, stream)` of blocks freed without a logged allocation:
    /// live when the log started.
    pub live_at_start: Vec<(u64, u64, u32)>,
    /// The recorded stream handles, index = dense stream number.
    pub streams: Vec<u64>,
}

/// True when `text` starts with RMM's log header (after blank and `#` comment
/// lines, which the parser skips as trace CSVs do).
pub fn is_rmm_log(text: &[u8]) -> bool {
    text.split(|&b| b == b'\n')
        .map(<[u8]>::trim_ascii)
        .find(|l| !l.is_empty() && !l.starts_with(b"#"))
        .is_some_and(|first| first == HEADER.as_bytes())
}

/// `0x7f8a40000000`, `7f8a40000000` (hex as RMM prints pointers) or a decimal stream id.
fn parse_handle(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None if s.is_empty() || s == "(nil)" => Some(0),
        None => s.parse().ok().or_else(|| u64::from_str_radix(s, 16).ok()),
    }
}

/// Parses a whole log. Errors name the input and the line.
pub fn parse(input_name: &str, text: &[u8]) -> Result<RmmLog, Error> {
    let bad = |line: u64, what: &str| Error::Input(format!("{input_name}:{line}: {what}"));
    let mut log = RmmLog {
        streams: vec![0],
        ..RmmLog::default()
    };
    let mut live: std::collections::HashSet<u64> = std::collections::HashSet::new();
    let mut seen: std::collections::HashSet<u64> = std::collections::HashSet::new();
    let mut header = false;
    for (i, raw) in text.split(|&b| b == b'\n').enumerate() {
        let line = i as u64 + 1;
        let raw = raw.trim_ascii();
        if raw.is_empty() || raw.starts_with(b"#") {
            continue;
        }
        if !header {
            header = true;
            if raw != HEADER.as_bytes() {
                return Err(bad(
                    line,
                    &format!("expected the RMM log header `{HEADER}`"),
                ));
            }
            continue;
        }
        let row = std::str::from_utf8(raw).map_err(|_| bad(line, "not UTF-8 text"))?;
        let mut cols = row.split(',');
        let (Some(_thread), Some(_time), Some(action), Some(ptr), Some(size), stream) = (
            cols.next(),
            cols.next(),
            cols.next(),
            cols.next(),
            cols.next(),
            cols.next(),
        ) else {
            return Err(bad(line, "expected 6 comma-separated columns"));
        };
        let action = match action.trim() {
            "allocate" => RmmAction::Allocate,
            "free" | "deallocate" => RmmAction::Free,
            "allocate failure" => RmmAction::AllocateFailure,
            other => return Err(bad(line, &format!("unknown action `{other}`"))),
        };
        let pointer = parse_handle(ptr).ok_or_else(|| bad(line, "bad pointer"))?;
        let size = size
            .trim()
            .parse::<u64>()
            .map_err(|_| bad(line, "size is not a byte count"))?;
        let handle = parse_handle(stream.unwrap_or("0")).ok_or_else(|| bad(line, "bad stream"))?;
        let stream = match log.streams.iter().position(|&s| s == handle) {
            Some(n) => n,
            None => {
                log.streams.push(handle);
                log.streams.len() - 1
            }
        };
        let stream = u32::try_from(stream).map_err(|_| bad(line, "too many streams"))?;
        match action {
            RmmAction::Allocate => {
                live.insert(pointer);
                seen.insert(pointer);
            }
            RmmAction::Free => {
                if !live.remove(&pointer) && seen.insert(pointer) {
                    log.live_at_start.push((pointer, size, stream));
                }
            }
            RmmAction::AllocateFailure => {}
        }
        log.events.push(RmmEvent {
            action,
            pointer,
            size,
            stream,
            line,
        });
    }
    Ok(log)
}

impl RmmLog {
    /// The log as a replayable [`Trace`]: the blocks live at the start are
    /// allocated first, then every `allocate` / `free` in order. Failed
    /// allocations are left out (the upstream resource refused them; the
    /// program went on without them) and so are frees of pointers not live,
    /// e.g. a second free; both are counted in the returned [`RmmSkipped`].
    pub fn to_trace(&self) -> Result<(Trace, RmmSkipped), Error> {
        let mut events = Vec::with_capacity(self.events.len() + self.live_at_start.len());
        // Pointer → dense id of the live allocation at that pointer.
        let mut live: HashMap<u64, u32> = HashMap::new();
        let mut next = 0u32;
        let mut alloc = |events: &mut Vec<Event>, size: u64, stream: u32| {
            let id = next;
            next += 1;
            events.push(Event::Alloc {
                id,
                size,
                stream: u64::from(stream),
            });
            id
        };
        for &(ptr, size, stream) in &self.live_at_start {
            let id = alloc(&mut events, size, stream);
            live.insert(ptr, id);
        }
        let mut skipped = RmmSkipped::default();
        for e in &self.events {
            match e.action {
                RmmAction::Allocate => {
                    let id = alloc(&mut events, e.size, e.stream);
                    live.insert(e.pointer, id);
                }
                RmmAction::Free => match live.remove(&e.pointer) {
                    Some(id) => events.push(Event::Free { id }),
                    None => skipped.unmatched_frees += 1,
                },
                RmmAction::AllocateFailure => skipped.failed_allocations += 1,
            }
        }
        let trace = Trace::from_events(events).map_err(Error::Input)?;
        Ok((trace, skipped))
    }
}

/// Rows of an RMM log that a trace cannot carry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RmmSkipped {
    pub failed_allocations: u64,
    pub unmatched_frees: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "Thread,Time,Action,Pointer,Size,Stream
2342727,15:47:02.841961,allocate,0x10012400000,1048576,0
2342727,15:47:02.841977,free,0x10012400000,1048576,0
1980043,14:21:19.998533,allocate,0x30a000000,256,0x2
1980043,14:21:20.000001,allocate failure,0x0,4096,0x2
1980043,14:21:32.661875,free,0x30a000000,256,0x2
1980043,14:21:33.000000,free,0x40b000000,512,0x2
";

    #[test]
    fn reads_rmm_rows() {
        assert!(is_rmm_log(LOG.as_bytes()));
        let log = parse("rmm.csv", LOG.as_bytes()).unwrap();
        assert_eq!(log.events.len(), 6);
        assert_eq!(
            log.events[2],
            RmmEvent {
                action: RmmAction::Allocate,
                pointer: 0x30a000000,
                size: 256,
                stream: 1,
                line: 4
            }
        );
        assert_eq!(log.events[3].action, RmmAction::AllocateFailure);
        assert_eq!(log.streams, vec![0, 2]);
        // Freed but never allocated in the log: live when it started.
        assert_eq!(log.live_at_start, vec![(0x40b000000, 512, 1)]);

        let (trace, skipped) = log.to_trace().unwrap();
        assert_eq!(
            trace.events(),
            &[
                Event::Alloc {
                    id: 0,
                    size: 512,
                    stream: 1
                },
                Event::Alloc {
                    id: 1,
                    size: 1048576,
                    stream: 0
                },
                Event::Free { id: 1 },
                Event::Alloc {
                    id: 2,
                    size: 256,
                    stream: 1
                },
                Event::Free { id: 2 },
                Event::Free { id: 0 },
            ]
        );
        assert_eq!(
            skipped,
            RmmSkipped {
                failed_allocations: 1,
                unmatched_frees: 0
            }
        );
    }

    #[test]
    fn errors_name_the_line() {
        let e = parse(
            "x.csv",
            b"Thread,Time,Action,Pointer,Size,Stream\n1,t,grow,0x1,5,0\n",
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "x.csv:2: unknown action `grow`");
        // Comment lines before the header are skipped; line numbers still count them.
        let commented =
            b"# from a run\n\nThread,Time,Action,Pointer,Size,Stream\n1,t,grow,0x1,5,0\n";
        assert!(is_rmm_log(commented));
        let e = parse("x.csv", commented).unwrap_err();
        assert_eq!(e.to_string(), "x.csv:4: unknown action `grow`");
        let e = parse("x.csv", b"action,id,size,stream\n").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("x.csv:1: expected the RMM log header")
        );
        let e = parse(
            "x.csv",
            b"Thread,Time,Action,Pointer,Size,Stream\n1,t,free,0x1\n",
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "x.csv:2: expected 6 comma-separated columns");
    }
}
