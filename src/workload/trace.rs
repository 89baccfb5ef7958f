//! The trace CSV of the CLI contract: a header `action,id,size,stream`, then
//! one event a line (`alloc`, `free`, `empty_cache`), `#` comments. Ids are
//! interned to dense `u32`s at parse time, so a replay indexes a `Vec`.
//!
//! Extension (not in the contract): `record_stream,ID,,STREAM` marks the live
//! allocation ID as used on STREAM (its free then waits for that stream), and
//! `synchronize,,,STREAM` says the work queued on STREAM so far has finished.

use crate::Error;
use std::collections::HashMap;

/// The header line every trace CSV starts with.
pub const HEADER: &str = "action,id,size,stream";

/// One event of a trace. `id`s are dense (0..[`Trace::ids`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    Alloc { id: u32, size: u64, stream: u64 },
    Free { id: u32 },
    EmptyCache,
    RecordStream { id: u32, stream: u64 },
    SynchronizeStream { stream: u64 },
}

/// A validated workload: every free, record_stream names a live allocation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Trace {
    events: Vec<Event>,
    ids: u32,
    capacity_hint: Option<u64>,
}

impl Trace {
    /// Checks `events` (ids dense, frees of live allocations only) and builds a trace.
    pub fn from_events(events: Vec<Event>) -> Result<Trace, String> {
        let mut live: Vec<bool> = Vec::new();
        for (index, e) in events.iter().enumerate() {
            match *e {
                Event::Alloc { id, .. } => {
                    let slot = id as usize;
                    if slot >= live.len() {
                        live.resize(slot + 1, false);
                    }
                    if live[slot] {
                        return Err(format!("event {index}: id {id} is already live"));
                    }
                    live[slot] = true;
                }
                Event::Free { id } | Event::RecordStream { id, .. } => {
                    match live.get_mut(id as usize) {
                        Some(l) if *l => *l = !matches!(e, Event::Free { .. }),
                        _ => return Err(format!("event {index}: id {id} is not live")),
                    }
                }
                Event::EmptyCache | Event::SynchronizeStream { .. } => {}
            }
        }
        Ok(Trace {
            ids: live.len() as u32,
            events,
            capacity_hint: None,
        })
    }

    /// The same trace, saying which card it was recorded on.
    pub fn with_capacity_hint(mut self, capacity: Option<u64>) -> Trace {
        self.capacity_hint = capacity;
        self
    }

    pub fn events(&self) -> &[Event] {
        &self.events
    }
    /// Number of distinct ids (`Alloc` ids are below it).
    pub fn ids(&self) -> u32 {
        self.ids
    }
    pub fn len(&self) -> usize {
        self.events.len()
    }
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }
    /// The capacity of the card the trace was recorded on, when the source says.
    pub fn capacity_hint(&self) -> Option<u64> {
        self.capacity_hint
    }

    /// Parses a trace CSV; `name` is used in error messages (`name:line: …`).
    pub fn parse(name: &str, data: &[u8]) -> Result<Trace, Error> {
        let text = std::str::from_utf8(data).map_err(|e| {
            Error::Input(format!(
                "{name}: byte {}: expected UTF-8 text in a trace CSV",
                e.valid_up_to()
            ))
        })?;
        let mut interned: HashMap<&str, u32> = HashMap::new();
        let mut live: Vec<bool> = Vec::new();
        let mut events = Vec::with_capacity(text.len() / 24);
        let mut header_seen = false;
        for (index, raw) in text.lines().enumerate() {
            let line_no = index + 1;
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let err =
                |what: &str| Error::Input(format!("{name}:{line_no}: {what}, found {line:?}"));
            if !header_seen {
                if line != HEADER {
                    return Err(err(&format!("expected the header line {HEADER:?}")));
                }
                header_seen = true;
                continue;
            }
            let mut fields = line.split(',');
            let action = fields.next().unwrap_or("").trim();
            let id = fields.next().unwrap_or("").trim();
            let size = fields.next().unwrap_or("").trim();
            let stream = fields.next().unwrap_or("").trim();
            if fields.next().is_some() {
                return Err(err("expected 4 fields (action,id,size,stream)"));
            }
            let stream = if stream.is_empty() {
                0
            } else {
                stream
                    .parse::<u64>()
                    .map_err(|_| err("expected an integer stream (or nothing for 0)"))?
            };
            let mut live_id = |must_be_live: bool| -> Result<u32, Error> {
                if id.is_empty() {
                    return Err(err("expected an id"));
                }
                let next = interned.len() as u32;
                let dense = *interned.entry(id).or_insert(next);
                if dense as usize >= live.len() {
                    live.push(false);
                }
                let is_live = live[dense as usize];
                if must_be_live && !is_live {
                    return Err(err(&format!(
                        "expected the id of a live allocation, '{id}' is not allocated"
                    )));
                }
                if !must_be_live && is_live {
                    return Err(err(&format!(
                        "expected a new id, '{id}' is still allocated (free it first)"
                    )));
                }
                Ok(dense)
            };
            let event = match action {
                "alloc" => {
                    let id = live_id(false)?;
                    let size = size
                        .parse::<u64>()
                        .map_err(|_| err("expected a size in bytes for alloc"))?;
                    live[id as usize] = true;
                    Event::Alloc { id, size, stream }
                }
                "free" => {
                    let id = live_id(true)?;
                    live[id as usize] = false;
                    Event::Free { id }
                }
                "record_stream" => Event::RecordStream {
                    id: live_id(true)?,
                    stream,
                },
                "empty_cache" => Event::EmptyCache,
                "synchronize" => Event::SynchronizeStream { stream },
                _ => {
                    return Err(err(
                        "expected an action: alloc, free, empty_cache (or record_stream, synchronize)",
                    ));
                }
            };
            events.push(event);
        }
        if !header_seen {
            return Err(Error::Input(format!(
                "{name}: expected a trace CSV starting with the header {HEADER:?}"
            )));
        }
        Ok(Trace {
            ids: live.len() as u32,
            events,
            capacity_hint: None,
        })
    }
}

/// Whether `data` is a trace CSV: its first line that is not blank or a comment is the header.
pub fn is_trace_csv(data: &[u8]) -> bool {
    data.split(|&b| b == b'\n')
        .map(|l| l.trim_ascii())
        .find(|l| !l.is_empty() && !l.starts_with(b"#"))
        .is_some_and(|l| l == HEADER.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any input parses or fails with an Input error; never a panic.
        #[test]
        fn arbitrary_input_never_panics(body in "(alloc|free|empty_cache|record_stream|synchronize|x)?,[a-c]?,[0-9]{0,3},[0-9-]{0,2}(\n|,)") {
            let text = format!("{HEADER}\n{body}\n{body}");
            let _ = Trace::parse("p.csv", text.as_bytes());
        }
    }

    #[test]
    fn parses_the_contract_example_with_reused_ids() {
        let csv = b"# a comment\naction,id,size,stream\nalloc,a,16777216,0\nfree,a,,0\nalloc,a,512,1\nalloc,b,1,\nempty_cache,,,\n";
        let t = Trace::parse("t.csv", csv).unwrap();
        assert_eq!(
            t.events(),
            &[
                Event::Alloc {
                    id: 0,
                    size: 16777216,
                    stream: 0
                },
                Event::Free { id: 0 },
                Event::Alloc {
                    id: 0,
                    size: 512,
                    stream: 1
                },
                Event::Alloc {
                    id: 1,
                    size: 1,
                    stream: 0
                },
                Event::EmptyCache,
            ]
        );
        assert_eq!(t.ids(), 2);
        assert!(is_trace_csv(csv));
    }

    #[test]
    fn errors_name_file_line_and_expectation() {
        let bad = |text: &str| match Trace::parse("w.csv", text.as_bytes()) {
            Err(Error::Input(m)) => m,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            bad("action,id,size,stream\nfree,x,,0\n"),
            "w.csv:2: expected the id of a live allocation, 'x' is not allocated, found \"free,x,,0\""
        );
        assert!(bad("id,size\n").starts_with("w.csv:1: expected the header line"));
        assert!(
            bad("action,id,size,stream\nalloc,a,big,0").starts_with("w.csv:2: expected a size")
        );
        assert!(
            bad("action,id,size,stream\nalloc,a,1,0\nalloc,a,1,0")
                .starts_with("w.csv:3: expected a new id")
        );
        assert!(
            bad("action,id,size,stream\nmalloc,a,1,0").starts_with("w.csv:2: expected an action")
        );
        assert!(bad("").starts_with("w.csv: expected a trace CSV"));
    }

    #[test]
    fn from_events_checks_liveness() {
        assert!(Trace::from_events(vec![Event::Free { id: 0 }]).is_err());
        let t = Trace::from_events(vec![
            Event::Alloc {
                id: 3,
                size: 1,
                stream: 0,
            },
            Event::Free { id: 3 },
        ])
        .unwrap();
        assert_eq!(t.ids(), 4);
    }
}
