//! The trace CSV of the CLI contract: a header `action,id,size,stream`, then
//! one event a line (`alloc`, `free`, `empty_cache`), `#` comments. Ids are
//! interned to dense `u32`s at parse time, so a replay indexes a `Vec`.
//!
//! Extension (not in the contract): `record_stream,ID,,STREAM` marks the live
//! allocation ID as used on STREAM (its free then waits for that stream), and
//! `synchronize,,,STREAM` says the work queued on STREAM so far has finished.

use super::csv;
use crate::Error;
use crate::snapshot::grow::{Prefault, advise_huge, populate_all, reserved, zeroed_table};
use rustc_hash::FxHashMap;

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

    /// Random allocations (small, 1–10 MiB, up to 300 MiB) freed in random
    /// order, so that free blocks of every size meet requests: for tests of
    /// the allocator's decisions.
    #[cfg(test)]
    pub(crate) fn random(seed: u64, events: usize) -> Trace {
        const MIB: u64 = 1 << 20;
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let (mut out, mut live, mut id) = (Vec::new(), Vec::new(), 0u32);
        for _ in 0..events {
            if live.is_empty() || next() % 100 < 55 {
                let size = match next() % 10 {
                    0..4 => 1 + next() % MIB,
                    4..7 => MIB + next() % (9 * MIB),
                    _ => 10 * MIB + next() % (290 * MIB),
                };
                out.push(Event::Alloc {
                    id,
                    size,
                    stream: 0,
                });
                live.push(id);
                id += 1;
            } else {
                let at = (next() % live.len() as u64) as usize;
                out.push(Event::Free {
                    id: live.swap_remove(at),
                });
            }
        }
        Trace::from_events(out).expect("ids stay live")
    }

    /// Whether no id is allocated twice (a free does not end an id; a trace
    /// CSV may reuse one).
    pub fn allocates_each_id_once(&self) -> bool {
        let mut seen = vec![0u64; (self.ids as usize).div_ceil(64)];
        self.events.iter().all(|e| match *e {
            Event::Alloc { id, .. } => {
                let (word, bit) = (id as usize / 64, 1u64 << (id % 64));
                if word >= seen.len() {
                    seen.resize(word + 1, 0);
                }
                let fresh = seen[word] & bit == 0;
                seen[word] |= bit;
                fresh
            }
            _ => true,
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
    /// A UTF-8 byte order mark and RFC 4180 quoting are read (see [`super::csv`]).
    pub fn parse(name: &str, data: &[u8]) -> Result<Trace, Error> {
        Self::parse_streaming(name, data, usize::MAX, |_| {})
    }

    /// [`Trace::parse`], handing over the events as it goes: `publish` gets
    /// every `chunk` validated events in order (the last call may be shorter),
    /// so a replay can run while the rest is read. On an error the events
    /// published so far are a valid prefix; the error is returned.
    pub fn parse_streaming(
        name: &str,
        data: &[u8],
        chunk: usize,
        mut publish: impl FnMut(&[Event]),
    ) -> Result<Trace, Error> {
        // A chunk holds one event at least: nothing empty is handed over.
        let chunk = chunk.max(1);
        let mut published = 0;
        let reader = read_rows(name, data, Events::All, chunk, |events| {
            publish(&events[published..]);
            published = events.len();
            published.saturating_add(chunk)
        })?;
        if reader.events.len() > published {
            publish(&reader.events[published..]);
        }
        Ok(Trace {
            ids: reader.ids.live.len() as u32,
            events: reader.events,
            capacity_hint: None,
        })
    }

    /// [`Trace::parse_streaming`] keeping no events: `hand_over` gets each
    /// full buffer of `chunk` events (the last may be shorter) and returns an
    /// empty one to fill next, so a run that needs the events once touches a
    /// few buffers' memory instead of the whole trace's. Returns how many
    /// events the trace has.
    pub fn stream(
        name: &str,
        data: &[u8],
        chunk: usize,
        mut hand_over: impl FnMut(Vec<Event>) -> Vec<Event>,
    ) -> Result<u64, Error> {
        let chunk = chunk.max(1);
        let mut handed = 0u64;
        let mut hand_over = |events: &mut Vec<Event>| {
            handed += events.len() as u64;
            *events = hand_over(std::mem::take(events));
        };
        let mut reader = read_rows(name, data, Events::Chunk, chunk, |events| {
            hand_over(events);
            chunk
        })?;
        if !reader.events.is_empty() {
            hand_over(&mut reader.events);
        }
        Ok(handed)
    }
}

/// Where [`read_rows`] puts the events.
#[derive(Clone, Copy)]
enum Events {
    /// One vector for the whole trace, reserved from the line count.
    All,
    /// Buffers of a chunk each, handed over as they fill.
    Chunk,
}

/// Reads the rows of the trace CSV `data` into a [`Reader`]; `full` is called
/// with the events read so far once they reach the length it last returned
/// (`chunk` at first) and may take them.
fn read_rows<'a>(
    name: &str,
    data: &'a [u8],
    events: Events,
    chunk: usize,
    mut full: impl FnMut(&mut Vec<Event>) -> usize,
) -> Result<Reader<'a>, Error> {
    let data = csv::strip_bom(data);
    let fail = |line: usize, what: &str, text: &[u8]| {
        Error::Input(format!(
            "{name}:{line}: {what}, found {:?}",
            String::from_utf8_lossy(text)
        ))
    };
    let mut records = csv::Records::new(data);
    let header = match records.next_record::<4>() {
        Some(Ok(header)) => header,
        Some(Err(e)) => return Err(fail(e.line, e.what, e.text(data))),
        None => {
            return Err(Error::Input(format!(
                "{name}: expected a trace CSV starting with the header {HEADER:?}"
            )));
        }
    };
    if !csv::is_header(&header, &COLUMNS) {
        let what = format!("expected the header line {HEADER:?}");
        return Err(fail(header.line, &what, header.text));
    }
    // One event a line at most: the line count bounds the events and the dense ids.
    let lines = memchr::memchr_iter(b'\n', data).count() + 1;
    let mut reader = Reader::new(lines, data.len(), events, chunk);
    let mut next = chunk;
    loop {
        if reader.events.len() >= next {
            next = full(&mut reader.events);
        }
        let (pos, line) = records.position();
        match reader.canonical_row(data, pos) {
            Some(Ok(next)) => records.skip_line(next),
            Some(Err(e)) => {
                let id = canonical_id(data, pos);
                return Err(fail(line, &e.describe(id), csv::line_at(data, pos)));
            }
            None => {
                let Some(record) = records.next_record::<4>() else {
                    break;
                };
                let record = record.map_err(|e| fail(e.line, e.what, e.text(data)))?;
                reader.row(&record).map_err(|e| {
                    let [_, id, ..] = record.fields;
                    fail(record.line, &e.describe(id), record.text)
                })?;
            }
        }
    }
    Ok(reader)
}

/// The header's column names.
const COLUMNS: [&str; 4] = ["action", "id", "size", "stream"];

/// What is wrong with a row (turned into a message only on the error path).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RowError {
    Fields,
    Stream,
    Size,
    NoId,
    NotLive,
    StillLive,
    TooManyIds,
    Action,
}

impl RowError {
    fn describe(self, id: &[u8]) -> String {
        let id = String::from_utf8_lossy(id);
        match self {
            RowError::Fields => "expected 4 fields (action,id,size,stream)".into(),
            RowError::Stream => "expected an integer stream (or nothing for 0)".into(),
            RowError::Size => "expected a size in bytes for alloc".into(),
            RowError::NoId => "expected an id".into(),
            RowError::NotLive => {
                format!("expected the id of a live allocation, '{id}' is not allocated")
            }
            RowError::StillLive => {
                format!("expected a new id, '{id}' is still allocated (free it first)")
            }
            RowError::TooManyIds => format!("expected fewer than {} distinct ids", u32::MAX),
            RowError::Action => {
                "expected an action: alloc, free, empty_cache (or record_stream, synchronize)"
                    .into()
            }
        }
    }
}

/// Turns rows into events, checking liveness as it goes.
struct Reader<'a> {
    ids: Ids<'a>,
    events: Vec<Event>,
    /// Faults the events' pages in 2 MiB at a time (a 1 M-event trace is 24
    /// MB of them); off for chunk buffers, which are reused.
    ahead: Prefault,
}

impl<'a> Reader<'a> {
    fn new(lines: usize, bytes: usize, events: Events, chunk: usize) -> Self {
        let (events, ahead) = match events {
            Events::All => (huge(reserved(lines)), Prefault::default()),
            Events::Chunk => (Vec::with_capacity(chunk.min(lines)), Prefault::off()),
        };
        Reader {
            ids: Ids::new(lines, bytes),
            events,
            ahead,
        }
    }

    #[inline]
    fn push(&mut self, event: Event) {
        self.ahead.ahead(&mut self.events, 1);
        self.events.push(event);
    }

    /// A row as a record: any spacing, quoting, missing fields; the errors.
    fn row(&mut self, record: &csv::Record<'a, 4>) -> Result<(), RowError> {
        if record.count > 4 {
            return Err(RowError::Fields);
        }
        let [action, id, size, stream] = record.fields;
        let stream = if stream.is_empty() {
            0
        } else {
            csv::parse_u64(stream).ok_or(RowError::Stream)?
        };
        match action {
            b"alloc" => self.alloc(id, csv::parse_u64(size), stream),
            b"free" => self.free(id),
            b"record_stream" => {
                let id = self.ids.get(id, true)?;
                self.push(Event::RecordStream { id, stream });
                Ok(())
            }
            b"empty_cache" => {
                self.push(Event::EmptyCache);
                Ok(())
            }
            b"synchronize" => {
                self.push(Event::SynchronizeStream { stream });
                Ok(())
            }
            _ => Err(RowError::Action),
        }
    }

    /// A row at `pos` as generators write them, `alloc,ID,SIZE,STREAM` or
    /// `free,ID,,STREAM` with nothing around the fields, read in one pass over
    /// its bytes; returns where the next line starts. `None`, with nothing
    /// read, for anything else (and at the end): the record reader takes it.
    #[inline]
    fn canonical_row(&mut self, data: &'a [u8], pos: usize) -> Option<Result<usize, RowError>> {
        let alloc = data.get(pos..pos + 6) == Some(b"alloc,");
        if !alloc && data.get(pos..pos + 5) != Some(b"free,") {
            return None;
        }
        let id_start = pos + if alloc { 6 } else { 5 };
        // The id ends at a comma; a space, control byte or quote leaves the row to the record reader.
        let mut at = id_start;
        let id_end = loop {
            let word = csv::word_at(data, at);
            let stop = csv::byte_mask(word, b',')
                | csv::byte_mask(word, b'"')
                | csv::below_mask(word, b' ' + 1);
            if stop != 0 {
                break at + (stop.trailing_zeros() / 8) as usize;
            }
            at += 8;
        };
        if id_end == id_start || data.get(id_end) != Some(&b',') {
            return None;
        }
        let id = &data[id_start..id_end];
        at = id_end + 1;
        let size = if alloc {
            let (size, end) = canonical_number(data, at);
            at = end;
            Some(size?)
        } else {
            None
        };
        if data.get(at) != Some(&b',') {
            return None;
        }
        let (stream, end) = canonical_number(data, at + 1);
        let stream = if end == at + 1 { 0 } else { stream? };
        at = end;
        let next = match data.get(at) {
            None => at,
            Some(b'\n') => at + 1,
            Some(b'\r') if data.get(at + 1) == Some(&b'\n') => at + 2,
            Some(_) => return None,
        };
        Some(
            match size {
                Some(_) => self.alloc(id, size, stream),
                None => self.free(id),
            }
            .map(|()| next),
        )
    }

    #[inline]
    fn alloc(&mut self, id: &'a [u8], size: Option<u64>, stream: u64) -> Result<(), RowError> {
        let id = self.ids.get(id, false)?;
        let size = size.ok_or(RowError::Size)?;
        self.ids.live[id as usize] = true;
        self.push(Event::Alloc { id, size, stream });
        Ok(())
    }

    #[inline]
    fn free(&mut self, id: &'a [u8]) -> Result<(), RowError> {
        let id = self.ids.get(id, true)?;
        self.ids.live[id as usize] = false;
        self.push(Event::Free { id });
        Ok(())
    }
}

/// The digits from `from` on: their value (`None` when there are none or
/// more than 19, which could overflow) and where they end.
#[inline]
fn canonical_number(data: &[u8], from: usize) -> (Option<u64>, usize) {
    let mut n: u64 = 0;
    let mut at = from;
    while let Some(d) = data
        .get(at)
        .map(|b| b.wrapping_sub(b'0'))
        .filter(|&d| d <= 9)
    {
        n = n.wrapping_mul(10).wrapping_add(u64::from(d));
        at += 1;
    }
    (((1..=19).contains(&(at - from))).then_some(n), at)
}

/// The id of the canonical row at `pos` (for messages).
fn canonical_id(data: &[u8], pos: usize) -> &[u8] {
    let line = csv::line_at(data, pos);
    line.split(|&b| b == b',').nth(1).unwrap_or(b"")
}

/// Ids interned to dense numbers in order of first use. Ids that are a fixed
/// prefix and a decimal number (`t1`, `t2`, … or `17`: what generators and
/// recorders write) index a table by their number, without hashing; any other
/// id goes through an Fx hash map keyed by its bytes in the input.
struct Ids<'a> {
    /// What comes before the number in numbered ids: the first id that ends in a digit sets it.
    prefix: Option<&'a [u8]>,
    /// Number → dense id + 1 (0: not seen); numbers past its end are hashed,
    /// so the table stays within the input's size (an `alloc` line, 10 bytes
    /// at least, per number).
    by_number: Vec<u32>,
    /// Entries of `by_number` populated for writing (see `populate_all`).
    populated: usize,
    by_name: FxHashMap<&'a [u8], u32>,
    /// Per dense id: allocated now.
    live: Vec<bool>,
}

impl<'a> Ids<'a> {
    fn new(lines: usize, bytes: usize) -> Self {
        let mut ids = Ids {
            prefix: None,
            by_number: huge(zeroed_table(lines.min(bytes / 10) + 1024)),
            populated: 0,
            by_name: FxHashMap::default(),
            live: huge(reserved(lines)),
        };
        ids.populate_more(0);
        ids
    }

    /// Keeps the numbers a dense trace reaches next populated for writing:
    /// each is read before it is written, and a read first would map the zero
    /// page that the write then copies, flushing the TLB of every core running
    /// the process. Ahead of twice the ids so far, so the memory stays within
    /// the ids the input names.
    #[inline]
    fn populate_ahead(&mut self, ids: usize) {
        if ids.saturating_mul(2) >= self.populated && self.populated < self.by_number.len() {
            self.populate_more(ids);
        }
    }

    #[cold]
    #[inline(never)]
    fn populate_more(&mut self, ids: usize) {
        const STEP: usize = 1 << 19; // 2 MiB of entries
        let to = ids
            .saturating_mul(2)
            .saturating_add(STEP)
            .min(self.by_number.len());
        populate_all(&mut self.by_number[self.populated.min(to)..to]);
        self.populated = to;
    }

    /// The dense id of `id`, which must be live (`free`, `record_stream`) or not (`alloc`).
    #[inline]
    fn get(&mut self, id: &'a [u8], must_be_live: bool) -> Result<u32, RowError> {
        if id.is_empty() {
            return Err(RowError::NoId);
        }
        let dense = match self.number(id) {
            Some(n) => match self.by_number[n] {
                0 => {
                    let dense = self.next_dense()?;
                    self.by_number[n] = dense + 1;
                    dense
                }
                known => known - 1,
            },
            None => self.named(id)?,
        };
        match (self.live[dense as usize], must_be_live) {
            (false, true) => Err(RowError::NotLive),
            (true, false) => Err(RowError::StillLive),
            _ => Ok(dense),
        }
    }

    /// The dense id of an id that is not numbered (kept out of line: the numbered path is hot).
    #[inline(never)]
    fn named(&mut self, id: &'a [u8]) -> Result<u32, RowError> {
        if let Some(&dense) = self.by_name.get(id) {
            return Ok(dense);
        }
        let dense = self.next_dense()?;
        self.by_name.insert(id, dense);
        Ok(dense)
    }

    fn next_dense(&mut self) -> Result<u32, RowError> {
        // Below u32::MAX: the number table stores dense + 1.
        let dense = u32::try_from(self.live.len())
            .ok()
            .filter(|&d| d < u32::MAX)
            .ok_or(RowError::TooManyIds)?;
        self.live.push(false);
        self.populate_ahead(self.live.len());
        Ok(dense)
    }

    /// The number of a numbered id below the table's limit. Only the shortest
    /// spelling of a number counts (`t01` is hashed), so each table slot
    /// stands for one id.
    #[inline]
    fn number(&mut self, id: &'a [u8]) -> Option<usize> {
        let prefix = match self.prefix {
            Some(prefix) => prefix,
            None => {
                let digits = id.iter().rev().take_while(|b| b.is_ascii_digit()).count();
                if digits == 0 {
                    return None;
                }
                *self.prefix.insert(&id[..id.len() - digits])
            }
        };
        // Prefixes are a few bytes: a byte loop beats a call to memcmp.
        if id.len() <= prefix.len() || prefix.iter().zip(id).any(|(p, b)| p != b) {
            return None;
        }
        let digits = &id[prefix.len()..];
        if digits.len() > 9 || (digits[0] == b'0' && digits.len() > 1) {
            return None;
        }
        let mut n: usize = 0;
        for &b in digits {
            let d = b.wrapping_sub(b'0');
            if d > 9 {
                return None;
            }
            n = n * 10 + usize::from(d);
        }
        (n < self.by_number.len()).then_some(n)
    }
}

/// `v`, backed by 2 MiB pages where it is big enough.
fn huge<T>(mut v: Vec<T>) -> Vec<T> {
    advise_huge(&mut v);
    v
}

/// Whether `data` is a trace CSV: its first record that is not blank or a
/// comment is the header (after a byte order mark, quoted or not).
pub fn is_trace_csv(data: &[u8]) -> bool {
    csv::starts_with_header(data, &COLUMNS)
}

/// `events` as a trace CSV that [`Trace::parse`] reads back to them (ids
/// written as their numbers): the header, then one row an event.
pub fn to_csv(events: &[Event]) -> String {
    use std::fmt::Write;
    let mut s = format!("{HEADER}\n");
    for e in events {
        let _ = match *e {
            Event::Alloc { id, size, stream } => writeln!(s, "alloc,{id},{size},{stream}"),
            Event::Free { id } => writeln!(s, "free,{id},,0"),
            Event::EmptyCache => writeln!(s, "empty_cache,,,"),
            Event::RecordStream { id, stream } => writeln!(s, "record_stream,{id},,{stream}"),
            Event::SynchronizeStream { stream } => writeln!(s, "synchronize,,,{stream}"),
        };
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// An error after some events were handed over still fails the parse,
    /// naming its line; what was handed over is the valid prefix.
    #[test]
    fn a_streamed_parse_fails_where_the_whole_parse_fails() {
        let csv = "action,id,size,stream\nalloc,a,512,0\nalloc,b,512,0\nfree,a,,0\nfree,c,,0\n";
        let mut handed = Vec::new();
        let e = Trace::parse_streaming("t.csv", csv.as_bytes(), 2, |ev| {
            handed.extend_from_slice(ev)
        })
        .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("t.csv:5: expected the id of a live allocation"),
            "{e}"
        );
        assert_eq!(handed.len(), 2);
        assert_eq!(Trace::from_events(handed).map(|t| t.len()), Ok(2));
    }

    #[test]
    fn to_csv_reads_back_to_the_same_events() {
        let events = vec![
            Event::Alloc {
                id: 0,
                size: 4096,
                stream: 0,
            },
            Event::Alloc {
                id: 1,
                size: 20 << 20,
                stream: 2,
            },
            Event::RecordStream { id: 1, stream: 3 },
            Event::Free { id: 0 },
            Event::SynchronizeStream { stream: 3 },
            Event::Free { id: 1 },
            Event::EmptyCache,
        ];
        let text = to_csv(&events);
        assert!(
            text.starts_with("action,id,size,stream\nalloc,0,4096,0\n"),
            "{text}"
        );
        let back = Trace::parse("t.csv", text.as_bytes()).unwrap();
        assert_eq!(back.events(), &events[..]);
    }

    /// The id table is populated ahead of the ids a dense trace reaches, and
    /// no further than twice the ids so far and a step: a file of blank lines
    /// populates one step only.
    #[test]
    fn the_id_table_is_populated_ahead_of_dense_ids_only() {
        const STEP: usize = 1 << 19;
        let text: String = (0..2 * STEP)
            .map(|i| format!("t{i}"))
            .collect::<Vec<_>>()
            .join("\n");
        let names: Vec<&[u8]> = text.lines().map(str::as_bytes).collect();
        let mut ids = Ids::new(names.len(), names.len() * 20);
        assert_eq!(ids.populated, STEP, "one step at the start");
        for (n, name) in names.iter().enumerate() {
            assert_eq!(ids.get(name, false), Ok(n as u32));
            let seen = n + 1;
            assert!(ids.populated > seen, "{seen}: populated {}", ids.populated);
            assert!(
                ids.populated <= (2 * seen + STEP).max(STEP),
                "{seen}: {}",
                ids.populated
            );
        }
        let blank = Ids::new(1 << 30, 1 << 30);
        assert_eq!(blank.populated, STEP);
        assert_eq!(blank.by_number.len(), (1 << 30) / 10 + 1024);
    }

    proptest! {
        /// Streamed in reused buffers, a trace hands over the events the whole
        /// parse returns, in buffers of `chunk` at most, and counts them; or it
        /// fails with the same error after handing over a valid prefix.
        #[test]
        fn streaming_hands_over_what_the_parse_returns(
            rows in prop::collection::vec("(alloc|free|empty_cache|record_stream|synchronize|x),[a-d]?,[0-9]{0,3},[0-9]{0,1}", 0..40),
            chunk in 0usize..6,
        ) {
            let text = format!("{HEADER}\n{}\n", rows.join("\n"));
            let mut handed = Vec::new();
            let mut sizes = Vec::new();
            let streamed = Trace::stream("s.csv", text.as_bytes(), chunk, |mut full| {
                sizes.push(full.len());
                handed.append(&mut full);
                full
            });
            prop_assert!(sizes.iter().all(|&n| n > 0 && n <= chunk.max(1)), "{:?}", sizes);
            match (Trace::parse("s.csv", text.as_bytes()), streamed) {
                (Ok(whole), Ok(count)) => {
                    prop_assert_eq!(whole.events(), &handed[..]);
                    prop_assert_eq!(count, whole.len() as u64);
                }
                (Err(a), Err(b)) => {
                    prop_assert_eq!(a.to_string(), b.to_string());
                    prop_assert!(Trace::from_events(handed).is_ok());
                }
                (a, b) => prop_assert!(false, "{:?} against {:?}", a, b),
            }
        }

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
        assert!(
            !t.allocates_each_id_once(),
            "an id allocated, freed and allocated again"
        );
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
