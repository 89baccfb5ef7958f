//! Detects what each input is and parses it into the one evidence model
//! ([`crate::evidence`]): OOM messages, `memory_summary()` tables and
//! `memory_stats()` dumps from text; snapshots through [`crate::snapshot`].
//!
//! Inputs are read as bytes (files are memory-mapped, so a multi-GB log is
//! never copied); text is decoded lossily only around what the scanner finds.
//!
//! Decisions worth knowing when reading the evidence:
//! - `truncated` means the text ends before the message's fixed ending (the
//!   documentation hint of 2.1+, the closing parenthesis of 1.x, the fraction
//!   line of cudaMallocAsync) or a table's closing border; the figures that are
//!   whole are still reported, a figure cut anywhere (number or unit) is not.
//! - The same OOM message printed again for a chained exception ("During
//!   handling of the above exception", "The above exception was the direct
//!   cause") is one observation, even re-raised under another class; identical
//!   messages without such a line between (ranks, retries) are all kept.
//! - `format_era` for OOMs: "1.0-1.3" (cached), "1.10-2.0" (reserved in total
//!   and the max_split_size_mb hint), "1.4-2.0" (reserved in total, no hint),
//!   "1.0-2.0" (cut before telling), "2.1" (the "capacty" typo), "2.2-2.3"
//!   (`torch.cuda.OutOfMemoryError`), "2.4+" (`torch.OutOfMemoryError`, the
//!   private-pool clause or the docs.pytorch.org link), "2.2+" (2.2 wording
//!   without those clues), "cudaMallocAsync", "pre-1.0" (THC's "cuda runtime
//!   error (2)"); none for XPU and the 1EB message.
//!   For summaries: "1.x" (KB/MB units) or "2.0+" (KiB/MiB units or Requested rows).
//! - A `[rankN]` prefix sets `rank`; a `(VllmWorkerProcess pid=N)` prefix is
//!   stripped from wrapped lines but names no rank.

mod buffers;
mod clues;
mod input;
mod oom;
mod scan;
mod stats;
mod summary;
mod text;

pub use buffers::Buffers;
pub use input::{Body, Bytes, Layer, Opened, Stream, layer_of, open, open_stream};
pub use summary::SUMMARY_ROWS;

use crate::evidence::{Evidence, Observation, TextClues};
use crate::limits::Limits;
use crate::snapshot::Fills;
use crate::{Error, snapshot};

/// What an input holds, decided from its content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputKind {
    /// A snapshot pickle (`_dump_snapshot`, `pickle.dump(_snapshot())`).
    Pickle,
    /// Our trace CSV (`action,id,size,stream`).
    TraceCsv,
    /// A RAPIDS RMM replay log (`Thread,Time,Action,Pointer,Size,Stream`).
    RmmLog,
    /// Anything else: scanned as text.
    Text,
}

/// The first line that is neither blank nor a `#` comment, trimmed.
fn first_content_line(data: &[u8]) -> &[u8] {
    data.split(|&b| b == b'\n')
        .take(64)
        .map(|l| l.trim_ascii())
        .find(|l| !l.is_empty() && !l.starts_with(b"#"))
        .unwrap_or(b"")
}

/// Whether `data` read as text holds an observation (or more than the
/// limits let it keep).
fn holds_evidence(data: &[u8]) -> bool {
    let mut clues = TextClues::default();
    scan::scan_with_clues(data, "", &mut clues, &Limits::default())
        .map_or(true, |obs| !obs.is_empty())
}

/// Whether a CSV header line names `columns`, its fields quoted or not
/// (RFC 4180 writers quote every field).
fn header_is(line: &[u8], columns: &[u8]) -> bool {
    let mut unquoted = line.iter().filter(|&&b| b != b'"');
    columns
        .iter()
        .all(|c| unquoted.next().is_some_and(|b| b.eq_ignore_ascii_case(c)))
        && unquoted.next().is_none()
}

/// Detects the kind of an input from its first bytes. A header-less start
/// that decodes as a pickle is only a guess: text that holds evidence wins
/// (`(GPU 0; 15.75 GiB total capacity; …)` reads as MARK, BINFLOAT, STOP).
pub fn detect(data: &[u8]) -> InputKind {
    if snapshot::is_pickle(data) && (snapshot::opens_certainly(data) || !holds_evidence(data)) {
        return InputKind::Pickle;
    }
    let head = &data[..data.len().min(64 * 1024)];
    let first = first_content_line(head);
    let first = first.strip_prefix(b"\xef\xbb\xbf").unwrap_or(first);
    if header_is(first, b"action,id,size,stream") {
        InputKind::TraceCsv
    } else if header_is(first, b"Thread,Time,Action,Pointer,Size,Stream") {
        InputKind::RmmLog
    } else {
        InputKind::Text
    }
}

/// Parses one input already in memory into observations and notes.
pub fn parse_input(input_name: &str, data: &[u8]) -> Result<Evidence, Error> {
    let mut ev = Evidence::default();
    let kind = detect(data);
    parse_whole(
        input_name,
        data,
        kind,
        &Limits::default(),
        &mut TextClues::default(),
        &mut ev,
    )?;
    Ok(ev)
}

/// Parses one whole input already in memory within `limits`, gathering what
/// its text says about the environment into `clues` (for commands that keep
/// the bytes to replay them: `recommend`, `validate`).
pub fn parse_with_clues(
    input_name: &str,
    data: &[u8],
    limits: &Limits,
    clues: &mut TextClues,
) -> Result<Evidence, Error> {
    let mut ev = Evidence::default();
    parse_whole(input_name, data, detect(data), limits, clues, &mut ev)?;
    Ok(ev)
}

/// Adds what one whole input of `kind` holds to `ev`.
fn parse_whole(
    input_name: &str,
    data: &[u8],
    kind: InputKind,
    limits: &Limits,
    clues: &mut TextClues,
    ev: &mut Evidence,
) -> Result<(), Error> {
    match kind {
        InputKind::Pickle => ev
            .observations
            .extend(snapshot::observations_with(input_name, data, limits)?),
        InputKind::TraceCsv | InputKind::RmmLog => ev.notes.push(not_evidence(input_name, kind)),
        InputKind::Text => {
            binary_note(input_name, data, ev);
            let start = ev.observations.len();
            ev.observations
                .extend(scan::scan_with_clues(data, input_name, clues, limits)?);
            let unread: Vec<String> = ev.observations[start..]
                .iter()
                .filter(|o| o.requested_bytes.is_none())
                .filter_map(|o| {
                    let figure = overflowing_request(o.message.as_deref()?)?;
                    Some(format!(
                        "{input_name}:{}: the request \"{figure}\" is past what a 64-bit byte count holds; the message is read without it",
                        o.line.unwrap_or(0)
                    ))
                })
                .collect();
            ev.notes.extend(unread);
        }
    }
    Ok(())
}

fn not_evidence(input_name: &str, kind: InputKind) -> String {
    let what = match kind {
        InputKind::RmmLog => "an RMM replay log",
        _ => "a trace CSV (alloc/free events)",
    };
    format!(
        "{input_name}: {what} holds no observations; replay it with `allocdoc replay` or `allocdoc recommend`"
    )
}

/// The "Tried to allocate" figure of `message` when it is whole (a number
/// and a known unit) but past 2^64 bytes, so the parser could not keep it.
fn overflowing_request(message: &str) -> Option<&str> {
    let rest = message.split("Tried to allocate ").nth(1)?;
    let mut words = rest.split_whitespace();
    let (value, unit) = (words.next()?, words.next()?);
    let unit = unit.trim_end_matches(['.', ',', ')', ';']);
    let n: f64 = value.parse().ok()?;
    let figure = rest.get(..value.len() + 1 + unit.len())?;
    (crate::units::unit_multiplier(unit).is_some() && crate::units::printed_size(n, unit).is_none())
        .then_some(figure)
}

fn binary_note(input_name: &str, head: &[u8], ev: &mut Evidence) {
    if looks_binary(head) {
        ev.notes.push(format!(
            "{input_name}: does not look like text (many control bytes); scanned as text anyway"
        ));
    }
}

/// Parses one input already in memory (text of any encoding, or a snapshot pickle).
pub fn parse_bytes(input_name: &str, data: &[u8]) -> Result<Vec<Observation>, Error> {
    parse_input(input_name, data).map(|ev| ev.observations)
}

/// More than 1 in 16 of the first 4 KiB being control bytes (not tab/CR/LF/ESC).
fn looks_binary(data: &[u8]) -> bool {
    let head = &data[..data.len().min(4096)];
    let ctrl = head
        .iter()
        .filter(|&&b| b < 0x20 && !matches!(b, b'\t' | b'\n' | b'\r' | 0x1b))
        .count();
    !head.is_empty() && ctrl * 16 > head.len()
}

/// What allocdoc calls standard input wherever it names it (`input` fields,
/// tables, errors).
pub const STANDARD_INPUT: &str = "standard input";

/// How an input is named in output: `-` (or no name) is standard input.
pub fn input_name(name: &str) -> &str {
    if name == "-" || name.is_empty() {
        STANDARD_INPUT
    } else {
        name
    }
}

/// Reads one input whole (a path, or `-` for standard input), decoded
/// ([`open`]): every command that parses an input whole reads it through
/// here, so errors read the same everywhere.
pub fn read_input(name: &str) -> Result<Bytes, Error> {
    read_input_with(name, &Limits::default())
}

/// [`read_input`] within `limits`.
pub fn read_input_with(name: &str, limits: &Limits) -> Result<Bytes, Error> {
    open(name, limits)?.into_bytes()
}

/// Reads every input (paths; `-` or an empty list means standard input) and
/// returns the observations found in all of them, in input order.
pub fn load(inputs: &[String]) -> Result<Evidence, Error> {
    load_with(inputs, &Limits::default(), &mut TextClues::default())
}

/// [`load`] within `limits`, also gathering what the text says about the
/// environment into `clues` (on the same pass: text is read once).
pub fn load_with(
    inputs: &[String],
    limits: &Limits,
    clues: &mut TextClues,
) -> Result<Evidence, Error> {
    load_from(inputs, limits, clues, open)
}

/// [`load_with`], opening each input with `open` (inputs the caller holds in
/// memory are opened there).
pub fn load_from(
    inputs: &[String],
    limits: &Limits,
    clues: &mut TextClues,
    open: impl Fn(&str, &Limits) -> Result<Opened, Error>,
) -> Result<Evidence, Error> {
    load_as(inputs, limits, clues, open, Fills::Headline)
}

/// [`load_from`] for what shows the evidence alone (`parse`): snapshot
/// observations without their attribution, which is most of a traced
/// snapshot's cost after decoding.
pub fn load_evidence(
    inputs: &[String],
    limits: &Limits,
    clues: &mut TextClues,
    open: impl Fn(&str, &Limits) -> Result<Opened, Error>,
) -> Result<Evidence, Error> {
    load_as(inputs, limits, clues, open, Fills::Skip)
}

fn load_as(
    inputs: &[String],
    limits: &Limits,
    clues: &mut TextClues,
    open: impl Fn(&str, &Limits) -> Result<Opened, Error>,
    fills: Fills,
) -> Result<Evidence, Error> {
    let stdin = ["-".to_owned()];
    let inputs = if inputs.is_empty() {
        &stdin[..]
    } else {
        inputs
    };
    let mut all = Evidence::default();
    for name in inputs {
        let opened = open(name, limits)?;
        read_opened_as(input_name(name), opened, limits, clues, &mut all, fills)?;
    }
    Ok(all)
}

/// Adds what an opened input holds to `ev`: a stream is scanned chunk by
/// chunk, a whole input parsed as its kind.
pub fn read_opened(
    name: &str,
    opened: Opened,
    limits: &Limits,
    clues: &mut TextClues,
    ev: &mut Evidence,
) -> Result<(), Error> {
    read_opened_as(name, opened, limits, clues, ev, Fills::Headline)
}

fn read_opened_as(
    name: &str,
    opened: Opened,
    limits: &Limits,
    clues: &mut TextClues,
    ev: &mut Evidence,
    fills: Fills,
) -> Result<(), Error> {
    match opened.body {
        Body::Whole(bytes) if opened.kind == InputKind::Pickle => {
            let mut release = bytes.releaser();
            let release = release.as_mut().map(|r| r as &mut dyn FnMut(usize));
            ev.observations.extend(snapshot::observations_releasing(
                name, &bytes, limits, release, fills,
            )?);
            Ok(())
        }
        Body::Whole(bytes) => parse_whole(name, &bytes, opened.kind, limits, clues, ev),
        Body::Stream(mut stream) => {
            binary_note(name, stream.head(), ev);
            let found = scan::scan_stream(&mut stream, name, clues, limits)?;
            ev.observations.extend(found);
            Ok(())
        }
    }
}
