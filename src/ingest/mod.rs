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

mod oom;
mod scan;
mod stats;
mod summary;
mod text;

pub use summary::SUMMARY_ROWS;

use crate::Error;
use crate::evidence::{Evidence, Observation};
use crate::snapshot;
use std::fs::File;
use std::io::Read;

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

/// Detects the kind of an input from its first bytes.
pub fn detect(data: &[u8]) -> InputKind {
    if snapshot::is_pickle(data) {
        return InputKind::Pickle;
    }
    let head = &data[..data.len().min(64 * 1024)];
    let first = first_content_line(head);
    let first = first.strip_prefix(b"\xef\xbb\xbf").unwrap_or(first);
    if first.eq_ignore_ascii_case(b"action,id,size,stream") {
        InputKind::TraceCsv
    } else if first.eq_ignore_ascii_case(b"Thread,Time,Action,Pointer,Size,Stream") {
        InputKind::RmmLog
    } else {
        InputKind::Text
    }
}

/// Parses one input already in memory into observations and notes.
pub fn parse_input(input_name: &str, data: &[u8]) -> Result<Evidence, Error> {
    let mut ev = Evidence::default();
    match detect(data) {
        InputKind::Pickle => ev.observations = snapshot::observations(input_name, data)?,
        InputKind::TraceCsv => ev.notes.push(format!(
            "{input_name}: a trace CSV (alloc/free events) holds no observations; replay it with `allocdoc replay` or `allocdoc recommend`"
        )),
        InputKind::RmmLog => ev.notes.push(format!(
            "{input_name}: an RMM replay log holds no observations; replay it with `allocdoc replay` or `allocdoc recommend`"
        )),
        InputKind::Text => {
            if looks_binary(data) {
                ev.notes.push(format!(
                    "{input_name}: does not look like text (many control bytes); scanned as text anyway"
                ));
            }
            ev.observations = scan::scan(data, input_name);
        }
    }
    Ok(ev)
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

/// An input's bytes: a memory map for files, a buffer for standard input, or
/// a buffer the caller already held (the Python API's `bytes` and `str`).
pub enum Bytes {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
    Shared(std::sync::Arc<Vec<u8>>),
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
            Bytes::Shared(v) => v,
        }
    }
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

/// Reads one input (a path, or `-` for standard input) without copying a file:
/// every command reads its inputs through here, so errors read the same everywhere.
pub fn read_input(name: &str) -> Result<Bytes, Error> {
    let fail = |e: std::io::Error| match input_name(name) {
        STANDARD_INPUT => Error::Input(format!("cannot read {STANDARD_INPUT}: {e}")),
        _ => Error::Input(format!("cannot read '{name}': {e}")),
    };
    if input_name(name) == STANDARD_INPUT {
        return read_stdin().map_err(fail);
    }
    let meta = std::fs::metadata(name).map_err(fail)?;
    if meta.is_dir() {
        return Err(Error::Input(format!(
            "cannot read '{name}': it is a directory (expected a log, a snapshot pickle or a trace CSV)"
        )));
    }
    map_or_read(File::open(name).map_err(fail)?).map_err(fail)
}

/// Maps a regular, non-empty file; reads anything else (pipes, devices,
/// empty files, which cannot be mapped).
fn map_or_read(file: File) -> std::io::Result<Bytes> {
    let meta = file.metadata()?;
    if meta.is_file() && meta.len() > 0 {
        // SAFETY: the map is read-only and private to this process; a file
        // truncated while we read it can fault, as with every mmap-based
        // reader (ripgrep makes the same trade); logs are not rewritten in place.
        let map = unsafe { memmap2::Mmap::map(&file) }?;
        // One pass front to back: let the kernel read ahead and drop behind.
        #[cfg(unix)]
        let _ = map.advise(memmap2::Advice::Sequential);
        return Ok(Bytes::Mapped(map));
    }
    let mut buf = Vec::new();
    (&file).read_to_end(&mut buf)?;
    Ok(Bytes::Owned(buf))
}

/// Standard input: mapped when it is a redirected file (`< big.log`), so a
/// multi-GB log costs no memory; a pipe is read into memory.
fn read_stdin() -> std::io::Result<Bytes> {
    #[cfg(unix)]
    {
        use std::os::fd::AsFd;
        let fd = std::io::stdin().as_fd().try_clone_to_owned()?;
        map_or_read(File::from(fd))
    }
    #[cfg(not(unix))]
    {
        let mut buf = Vec::new();
        std::io::stdin().lock().read_to_end(&mut buf)?;
        Ok(Bytes::Owned(buf))
    }
}

/// Reads every input (paths; `-` or an empty list means standard input) and
/// returns the observations found in all of them, in input order.
pub fn load(inputs: &[String]) -> Result<Evidence, Error> {
    load_with(inputs, read_input)
}

/// [`load`], reading each input with `read`.
pub fn load_with(
    inputs: &[String],
    read: impl Fn(&str) -> Result<Bytes, Error>,
) -> Result<Evidence, Error> {
    let stdin = ["-".to_owned()];
    let inputs = if inputs.is_empty() {
        &stdin[..]
    } else {
        inputs
    };
    let mut all = Evidence::default();
    for name in inputs {
        let bytes = read(name)?;
        let ev = parse_input(input_name(name), &bytes)?;
        all.observations.extend(ev.observations);
        all.notes.extend(ev.notes);
    }
    Ok(all)
}
