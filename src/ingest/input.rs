//! Opening an input: one layer between the bytes on disk (or on a pipe) and
//! every reader, so that each command reads logs, snapshots, trace CSVs and
//! RMM logs alike through it.
//!
//! - gzip, xz, zstd and bzip2 are recognised by their magic bytes and decoded
//!   as streams (several members or frames in a row too, nested ones too);
//!   zip, 7z, lz4 and other containers allocdoc does not read are refused;
//! - UTF-16 (LE or BE, by its BOM or, without one, by the zero bytes of ASCII
//!   text) is transcoded to UTF-8 as a stream; a UTF-8 BOM is dropped;
//! - a plain regular file is memory-mapped, never copied; anything else
//!   (standard input, a pipe, a device, a decoded stream) is read in bounded
//!   chunks: text is handed to the scanner as a [`Stream`], and only the
//!   kinds that are parsed whole (pickles, trace CSVs, RMM logs) are read into
//!   memory, within [`Limits::max_input_bytes`].

use super::InputKind;
use crate::Error;
use crate::limits::{Limit, Limits};
use std::fs::File;
use std::io::{self, Read};

/// Bytes looked at to decide what an input is (and to detect its kind).
const HEAD: usize = 64 * 1024;
/// Decoding layers an input may nest (a gzip of a UTF-16 log is two).
const MAX_LAYERS: usize = 4;

/// An input's bytes held whole: a memory map for plain files (past a UTF-8
/// BOM), a buffer for everything else.
pub enum Bytes {
    Mapped { map: memmap2::Mmap, start: usize },
    Owned(Vec<u8>),
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mapped { map, start } => map.get(*start..).unwrap_or_default(),
            Bytes::Owned(v) => v,
        }
    }
}

impl Bytes {
    /// For a memory map, a hook for a decoder that reads the input once
    /// ([`crate::snapshot::pickle::Release`]): it gives the pages before the
    /// offset it is told back to the page cache (`madvise(MADV_DONTNEED)`),
    /// so they stop counting as this process's memory; what the decoder's
    /// result borrows from them is read from the file again when touched. A
    /// buffer's pages are the only copy of its bytes: `None`.
    pub fn releaser(&self) -> Option<impl FnMut(usize) + '_> {
        let Bytes::Mapped { map, .. } = self else {
            return None;
        };
        let (mut done, mut mapped) = (0usize, 0usize);
        Some(move |upto: usize| {
            // The pages ahead mapped by the decoder's populating thread, if
            // it has one, while it reads these.
            let ahead = upto.saturating_add(MAP_AHEAD).min(map.len());
            if let Some(next) = map.get(mapped.max(upto)..ahead) {
                crate::snapshot::grow::read_soon(next);
                mapped = ahead;
            }
            // A margin behind the offset: the opcodes being read stay mapped.
            const PAGE: usize = 4096;
            let end = (upto.saturating_sub(1 << 20) / PAGE) * PAGE;
            if end >= done.saturating_add(RELEASE_AT_ONCE) {
                release_pages(map, done, end);
                done = end;
            }
        })
    }
}

/// Bytes of a mapped input mapped ahead of its decoder ([`Bytes::releaser`]).
const MAP_AHEAD: usize = 8 << 20;
/// Bytes behind the decoder given back at once (fewer, longer calls).
const RELEASE_AT_ONCE: usize = 16 << 20;

/// Drops the pages of `map[from..to]` (page-aligned offsets) from the process.
#[cfg(target_os = "linux")]
fn release_pages(map: &memmap2::Mmap, from: usize, to: usize) {
    let Some(range) = map.get(from..to.min(map.len())) else {
        return;
    };
    // A shared, read-only file mapping: the dropped pages are the file's,
    // read again on the next touch, never zeroed (memmap2::Mmap::map maps
    // MAP_SHARED; the offsets are multiples of the page size from its start).
    unsafe {
        libc::madvise(
            range.as_ptr() as *mut libc::c_void,
            range.len(),
            libc::MADV_DONTNEED,
        )
    };
}

#[cfg(not(target_os = "linux"))]
fn release_pages(_map: &memmap2::Mmap, _from: usize, _to: usize) {}

/// A decoding layer under the input's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layer {
    Gzip,
    Xz,
    Zstd,
    Bzip2,
    Utf16Le,
    Utf16Be,
}

impl Layer {
    pub fn name(self) -> &'static str {
        match self {
            Layer::Gzip => "gzip",
            Layer::Xz => "xz",
            Layer::Zstd => "zstd",
            Layer::Bzip2 => "bzip2",
            Layer::Utf16Le => "UTF-16LE",
            Layer::Utf16Be => "UTF-16BE",
        }
    }

    /// Its magic bytes or BOM, where it has one.
    fn bom_len(self, head: &[u8]) -> usize {
        match (self, head) {
            (Layer::Utf16Le, [0xff, 0xfe, ..]) | (Layer::Utf16Be, [0xfe, 0xff, ..]) => 2,
            _ => 0,
        }
    }

    fn decode(self, inner: Box<dyn Read>) -> io::Result<Box<dyn Read>> {
        Ok(match self {
            Layer::Gzip => Box::new(flate2::read::MultiGzDecoder::new(inner)),
            Layer::Xz => Box::new(liblzma::read::XzDecoder::new_multi_decoder(inner)),
            Layer::Zstd => Box::new(zstd::stream::read::Decoder::new(inner)?),
            Layer::Bzip2 => Box::new(bzip2::read::MultiBzDecoder::new(inner)),
            Layer::Utf16Le => Box::new(Utf16::new(inner, encoding_rs::UTF_16LE)),
            Layer::Utf16Be => Box::new(Utf16::new(inner, encoding_rs::UTF_16BE)),
        })
    }
}

/// The decoding layer `head` starts with, if any; an archive or compression
/// allocdoc cannot read is an error naming it.
pub fn layer_of(head: &[u8]) -> Result<Option<Layer>, &'static str> {
    Ok(Some(match head {
        [0x1f, 0x8b, ..] => Layer::Gzip,
        [0xfd, b'7', b'z', b'X', b'Z', 0, ..] => Layer::Xz,
        [0x28, 0xb5, 0x2f, 0xfd, ..] => Layer::Zstd,
        [
            b'B',
            b'Z',
            b'h',
            b'1'..=b'9',
            0x31,
            0x41,
            0x59,
            0x26,
            0x53,
            0x59,
            ..,
        ]
        | [
            b'B',
            b'Z',
            b'h',
            b'1'..=b'9',
            0x17,
            0x72,
            0x45,
            0x38,
            0x50,
            0x90,
            ..,
        ] => Layer::Bzip2,
        [b'P', b'K', 3, 4, ..] => return Err("a zip archive (torch.save writes these)"),
        [b'7', b'z', 0xbc, 0xaf, 0x27, 0x1c, ..] => return Err("a 7z archive"),
        [0x04, 0x22, 0x4d, 0x18, ..] => return Err("lz4-compressed"),
        [b'R', b'a', b'r', b'!', 0x1a, 0x07, ..] => return Err("a rar archive"),
        [0x1f, 0x9d, ..] => return Err("compress(1)-compressed (.Z)"),
        [0xff, 0xfe, 0, 0, ..] | [0, 0, 0xfe, 0xff, ..] => return Err("UTF-32 text"),
        [0xff, 0xfe, ..] => Layer::Utf16Le,
        [0xfe, 0xff, ..] => Layer::Utf16Be,
        _ => match utf16_without_bom(head) {
            Some(layer) => layer,
            None => return Ok(None),
        },
    }))
}

/// UTF-16 without a BOM, told by ASCII text's zero high bytes: in the first
/// KiB, most 2-byte units read as a printable ASCII character in one byte
/// order (the other byte zero) and few in the other. Binary data has its
/// zeros beside control bytes; text and pickles have almost no zeros.
fn utf16_without_bom(head: &[u8]) -> Option<Layer> {
    let n = head.len().min(1024) & !1;
    if n < 16 {
        return None;
    }
    let printable = |b: u8| matches!(b, b'\t' | b'\n' | b'\r' | 0x20..=0x7e);
    let (mut le, mut be) = (0, 0);
    for pair in head[..n].chunks_exact(2) {
        le += usize::from(pair[1] == 0 && printable(pair[0]));
        be += usize::from(pair[0] == 0 && printable(pair[1]));
    }
    // Box drawing and other non-ASCII text (rich tracebacks) fill the rest.
    let units = n / 2;
    let clear = |a: usize, b: usize| a * 5 >= units * 3 && b * 4 <= a;
    if clear(le, be) {
        Some(Layer::Utf16Le)
    } else if clear(be, le) {
        Some(Layer::Utf16Be)
    } else {
        None
    }
}

/// UTF-16 transcoded to UTF-8 as it is read (invalid units become U+FFFD).
struct Utf16 {
    inner: Box<dyn Read>,
    decoder: encoding_rs::Decoder,
    src: Box<[u8]>,
    src_len: usize,
    src_pos: usize,
    out: Box<[u8]>,
    out_len: usize,
    out_pos: usize,
    eof: bool,
    done: bool,
}

impl Utf16 {
    const CHUNK: usize = 64 * 1024;

    fn new(inner: Box<dyn Read>, encoding: &'static encoding_rs::Encoding) -> Self {
        Utf16 {
            inner,
            decoder: encoding.new_decoder_without_bom_handling(),
            src: vec![0; Self::CHUNK].into_boxed_slice(),
            src_len: 0,
            src_pos: 0,
            // A UTF-16 unit becomes at most 3 UTF-8 bytes.
            out: vec![0; Self::CHUNK * 3 / 2 + 16].into_boxed_slice(),
            out_len: 0,
            out_pos: 0,
            eof: false,
            done: false,
        }
    }
}

impl Read for Utf16 {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.out_pos == self.out_len && !self.done {
            if self.src_pos == self.src_len && !self.eof {
                self.src_pos = 0;
                self.src_len = read_some(&mut self.inner, &mut self.src)?;
                self.eof = self.src_len == 0;
            }
            let (_, read, written, _) = self.decoder.decode_to_utf8(
                &self.src[self.src_pos..self.src_len],
                &mut self.out,
                self.eof,
            );
            self.src_pos += read;
            self.out_pos = 0;
            self.out_len = written;
            self.done = self.eof && self.src_pos == self.src_len;
        }
        let n = buf.len().min(self.out_len - self.out_pos);
        buf[..n].copy_from_slice(&self.out[self.out_pos..self.out_pos + n]);
        self.out_pos += n;
        Ok(n)
    }
}

/// One `read`, retried when interrupted.
fn read_some(r: &mut dyn Read, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match r.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            other => return other,
        }
    }
}

/// Reads until `buf` holds `want` bytes or the input ends; false at the end.
/// The room is reserved first (fallibly); `read_to_end` then fills it
/// without zeroing it.
fn fill(r: &mut dyn Read, buf: &mut Vec<u8>, want: usize) -> io::Result<bool> {
    let more = want.saturating_sub(buf.len());
    buf.try_reserve(more)
        .map_err(|_| io::Error::new(io::ErrorKind::OutOfMemory, "no memory for the input"))?;
    r.take(more as u64).read_to_end(buf)?;
    Ok(buf.len() >= want)
}

/// An input read as it arrives: its first bytes (already decoded), then the
/// rest, counted against [`Limits::max_input_bytes`].
pub struct Stream {
    name: String,
    head: Vec<u8>,
    rest: Box<dyn Read>,
    /// The input has ended: what is left of it is in `head`.
    ended: bool,
    read: u64,
    limits: Limits,
    layers: Vec<Layer>,
}

impl Stream {
    /// The first bytes, before the first [`Stream::fill`].
    pub fn head(&self) -> &[u8] {
        &self.head
    }

    /// Appends to `buf` until it holds `want` bytes or the input ends;
    /// returns false once the input has ended.
    pub fn fill(&mut self, buf: &mut Vec<u8>, want: usize) -> Result<bool, Error> {
        if !self.head.is_empty() {
            let head = std::mem::take(&mut self.head);
            if buf.is_empty() {
                *buf = head;
            } else {
                buf.try_reserve(head.len())
                    .map_err(|_| self.memory(head.len()))?;
                buf.extend_from_slice(&head);
            }
        }
        if self.ended || buf.len() >= want {
            return Ok(!self.ended);
        }
        let before = buf.len();
        let more = fill(&mut self.rest, buf, want).map_err(|e| self.failed(&e))?;
        self.read += (buf.len() - before) as u64;
        if self.read > self.limits.max_input_bytes {
            return Err(self.limits.exceeded(&self.name, Limit::InputBytes, ""));
        }
        self.ended = !more;
        Ok(more)
    }

    /// Everything, held in memory (pickles, trace CSVs, RMM logs).
    pub fn into_bytes(mut self) -> Result<Bytes, Error> {
        let mut buf = Vec::new();
        let cap = usize::try_from(self.limits.max_input_bytes).unwrap_or(usize::MAX);
        loop {
            let want = buf
                .len()
                .saturating_add(HEAD * 16)
                .min(cap.saturating_add(1));
            if want <= buf.len() {
                return Err(self.limits.exceeded(&self.name, Limit::InputBytes, ""));
            }
            if !self.fill(&mut buf, want)? {
                return Ok(Bytes::Owned(buf));
            }
        }
    }

    fn memory(&self, bytes: usize) -> Error {
        crate::limits::out_of_memory(&self.name, "the input", bytes)
    }

    fn failed(&self, e: &io::Error) -> Error {
        if e.kind() == io::ErrorKind::OutOfMemory {
            return self.memory(HEAD);
        }
        if self.layers.is_empty() {
            return Error::Input(format!("{}: cannot read: {e}", self.name));
        }
        let names: Vec<&str> = self.layers.iter().map(|l| l.name()).collect();
        Error::Input(format!(
            "{}: cannot decode the {} data: {e} (truncated or corrupt?)",
            self.name,
            names.join(" in ")
        ))
    }
}

/// An opened input: what it is, its bytes whole or as a stream, and the
/// decoding layers it came through (outermost first).
pub struct Opened {
    pub kind: InputKind,
    pub body: Body,
    pub layers: Vec<Layer>,
}

pub enum Body {
    Whole(Bytes),
    Stream(Stream),
}

impl Opened {
    /// The whole input, read into memory if it was a stream.
    pub fn into_bytes(self) -> Result<Bytes, Error> {
        match self.body {
            Body::Whole(b) => Ok(b),
            Body::Stream(s) => s.into_bytes(),
        }
    }
}

/// Opens one input (a path, or `-` for standard input): decodes its layers
/// and decides its kind from the decoded content.
pub fn open(name: &str, limits: &Limits) -> Result<Opened, Error> {
    // How errors and the stream name the input: `-` is standard input.
    let shown = super::input_name(name);
    let stdin = shown == super::STANDARD_INPUT;
    let fail = |e: io::Error| match stdin {
        true => Error::Input(format!("cannot read {shown}: {e}")),
        false => Error::Input(format!("cannot read '{name}': {e}")),
    };
    let file = if stdin {
        #[cfg(not(unix))]
        return open_stream(shown, Box::new(io::stdin()), limits);
        #[cfg(unix)]
        stdin_file().map_err(fail)?
    } else {
        if std::fs::metadata(name).map_err(fail)?.is_dir() {
            return Err(Error::Input(format!(
                "cannot read '{name}': it is a directory (expected a log, a snapshot pickle or a trace CSV)"
            )));
        }
        File::open(name).map_err(fail)?
    };
    let meta = file.metadata().map_err(fail)?;
    if meta.is_file() && meta.len() > 0 {
        // SAFETY: the map is read-only and private to this process; a file
        // truncated while we read it can fault, as with every mmap-based
        // reader (ripgrep makes the same trade); logs are not rewritten in place.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(fail)?;
        match layer_of(&map).map_err(|what| refused(shown, what))? {
            None => {
                if meta.len() > limits.max_input_bytes {
                    return Err(limits.exceeded(
                        shown,
                        Limit::InputBytes,
                        &format!("the file has {} bytes", meta.len()),
                    ));
                }
                // One pass front to back: let the kernel read ahead and drop behind.
                #[cfg(unix)]
                let _ = map.advise(memmap2::Advice::Sequential);
                let start = if map.starts_with(UTF8_BOM) { 3 } else { 0 };
                let bytes = Bytes::Mapped { map, start };
                return Ok(Opened {
                    kind: super::detect(&bytes),
                    body: Body::Whole(bytes),
                    layers: Vec::new(),
                });
            }
            Some(_) => drop(map),
        }
    }
    open_stream(shown, Box::new(file), limits)
}

/// Standard input as a file, so that a redirected file (`< big.log`) is mapped.
#[cfg(unix)]
fn stdin_file() -> io::Result<File> {
    use std::os::fd::AsFd;
    Ok(File::from(io::stdin().as_fd().try_clone_to_owned()?))
}

const UTF8_BOM: &[u8] = b"\xef\xbb\xbf";

fn refused(name: &str, what: &str) -> Error {
    Error::Input(format!(
        "{name}: {what}, which allocdoc does not read; extract or convert it first \
         (gzip, xz, zstd, bzip2, UTF-8 and UTF-16 are read as they are)"
    ))
}

/// Decodes the layers at the start of `reader` and decides the kind from
/// the decoded head: text stays a stream, the rest is read whole.
pub fn open_stream(name: &str, reader: Box<dyn Read>, limits: &Limits) -> Result<Opened, Error> {
    let mut stream = Stream {
        name: name.to_owned(),
        head: Vec::new(),
        rest: reader,
        ended: false,
        read: 0,
        limits: *limits,
        layers: Vec::new(),
    };
    let mut head = Vec::new();
    loop {
        stream.fill(&mut head, HEAD)?;
        let Some(layer) = layer_of(&head).map_err(|what| refused(name, what))? else {
            break;
        };
        if stream.layers.len() == MAX_LAYERS {
            return Err(Error::Input(format!(
                "{name}: more than {MAX_LAYERS} layers of compression or encoding"
            )));
        }
        // The layer reads what was looked at, then the rest; it starts past its BOM.
        let skip = layer.bom_len(&head);
        let under = io::Cursor::new(head.split_off(skip))
            .chain(std::mem::replace(&mut stream.rest, Box::new(io::empty())));
        stream.rest = layer
            .decode(Box::new(under))
            .map_err(|e| stream.failed(&e))?;
        stream.layers.push(layer);
        stream.ended = false;
        stream.read = 0;
        head.clear();
    }
    if head.starts_with(UTF8_BOM) {
        head.drain(..3);
    }
    let kind = if stream.ended || crate::snapshot::may_be_pickle(&head) {
        None
    } else {
        Some(super::detect(&head)).filter(|&k| k == InputKind::Text)
    };
    stream.head = head;
    let layers = stream.layers.clone();
    Ok(match kind {
        Some(kind) => Opened {
            kind,
            body: Body::Stream(stream),
            layers,
        },
        // Small, or a kind that is parsed whole: held in memory.
        None => {
            let bytes = stream.into_bytes()?;
            Opened {
                kind: super::detect(&bytes),
                body: Body::Whole(bytes),
                layers,
            }
        }
    })
}
