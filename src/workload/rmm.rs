//! RMM replay logs (`rmm::mr::logging_resource_adaptor`): a CSV with the header
//! `Thread,Time,Action,Pointer,Size,Stream` and one row per `allocate`,
//! `free` (some RMM versions write `deallocate`) or `allocate failure`.
//!
//! The log is read into [`RmmLog`]: allocations keyed by pointer, streams
//! numbered densely in order of appearance (0 stays the default stream), and
//! pointers freed without a logged allocation (the log started while they were
//! live) listed so the replay can place them before the first event.

use super::csv;
use super::trace::{Event, Trace};
use crate::Error;
use rustc_hash::{FxHashMap, FxHashSet};

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

/// The header's column names.
const COLUMNS: [&str; 6] = ["Thread", "Time", "Action", "Pointer", "Size", "Stream"];

/// True when `text` starts with RMM's log header (after blank and `#` comment
/// lines, which the parser skips as trace CSVs do).
pub fn is_rmm_log(text: &[u8]) -> bool {
    csv::starts_with_header(text, &COLUMNS)
}

/// `0x7f8a40000000`, `7f8a40000000` (hex as RMM prints pointers) or a decimal stream id.
fn parse_handle(s: &[u8]) -> Option<u64> {
    let hex = |h: &[u8]| {
        std::str::from_utf8(h)
            .ok()
            .and_then(|h| u64::from_str_radix(h, 16).ok())
    };
    match s.strip_prefix(b"0x").or_else(|| s.strip_prefix(b"0X")) {
        Some(digits) => hex(digits),
        None if s.is_empty() || s == b"(nil)" => Some(0),
        None => csv::parse_u64(s).or_else(|| hex(s)),
    }
}

/// Parses a whole log (a UTF-8 byte order mark and RFC 4180 quoting are
/// read, as in trace CSVs). Errors name the input and the line.
pub fn parse(input_name: &str, text: &[u8]) -> Result<RmmLog, Error> {
    let bad = |line: usize, what: &str| Error::Input(format!("{input_name}:{line}: {what}"));
    let mut log = RmmLog {
        streams: vec![0],
        ..RmmLog::default()
    };
    let mut live: FxHashSet<u64> = FxHashSet::default();
    let mut seen: FxHashSet<u64> = FxHashSet::default();
    // Stream handle → dense number (0 stays the default stream).
    let mut stream_numbers: FxHashMap<u64, u32> = FxHashMap::from_iter([(0, 0)]);
    let mut records = csv::Records::new(csv::strip_bom(text));
    match records.next_record::<6>() {
        Some(Ok(header)) if csv::is_header(&header, &COLUMNS) => {}
        Some(Ok(header)) => {
            return Err(bad(
                header.line,
                &format!("expected the RMM log header `{HEADER}`"),
            ));
        }
        Some(Err(e)) => return Err(bad(e.line, e.what)),
        None => return Ok(log),
    }
    while let Some(record) = records.next_record::<6>() {
        let record = record.map_err(|e| bad(e.line, e.what))?;
        let line = record.line;
        if record.count < 5 {
            return Err(bad(line, "expected 6 comma-separated columns"));
        }
        let [_thread, _time, action, ptr, size, stream] = record.fields;
        let action = match action {
            b"allocate" => RmmAction::Allocate,
            b"free" | b"deallocate" => RmmAction::Free,
            b"allocate failure" => RmmAction::AllocateFailure,
            other => {
                let other = String::from_utf8_lossy(other);
                return Err(bad(line, &format!("unknown action `{other}`")));
            }
        };
        let pointer = parse_handle(ptr).ok_or_else(|| bad(line, "bad pointer"))?;
        let size = csv::parse_u64(size).ok_or_else(|| bad(line, "size is not a byte count"))?;
        let handle = parse_handle(stream).ok_or_else(|| bad(line, "bad stream"))?;
        let stream = match stream_numbers.get(&handle) {
            Some(&n) => n,
            None => {
                let n =
                    u32::try_from(log.streams.len()).map_err(|_| bad(line, "too many streams"))?;
                log.streams.push(handle);
                stream_numbers.insert(handle, n);
                n
            }
        };
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
            line: line as u64,
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
        let mut live: FxHashMap<u64, u32> = FxHashMap::default();
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
    fn reads_a_byte_order_mark_and_quoted_fields() {
        let quoted = format!(
            "\u{feff}{}",
            LOG.replace("allocate failure", "\"allocate failure\"")
                .replace(",0x2\n", ",\"0x2\"\n")
        );
        assert!(quoted.contains(",\"allocate failure\",") && quoted.contains(",\"0x2\"\n"));
        assert!(is_rmm_log(quoted.as_bytes()));
        assert_eq!(
            parse("q.csv", quoted.as_bytes()).unwrap(),
            parse("rmm.csv", LOG.as_bytes()).unwrap()
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
