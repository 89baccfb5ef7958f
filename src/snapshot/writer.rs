//! Writes a torch memory snapshot (`torch.cuda.memory._snapshot()` layout,
//! shared/spec/allocator.md §9.2) as a protocol-4 pickle that `pickle.load`,
//! `torch.cuda._memory_viz` and PyTorch's web viewer (MemoryViz.js, which reads
//! protocols 2–4) can open.
//!
//! The input is a plain model ([`Snapshot`]) so that any producer (the bundled
//! allocator's replay, a converted trace) can fill it without this module
//! knowing its types. Repeated strings (dict keys, actions, states) are written
//! once with MEMOIZE and referred to with BINGET afterwards, which keeps a
//! million-entry trace around 40 bytes an entry.

use std::collections::HashMap;
use std::io::{self, Write};

/// A whole snapshot: every device's segments plus one trace list per device.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    pub segments: Vec<Segment>,
    /// `device_traces[d]` holds device `d`'s trace entries, oldest first.
    pub device_traces: Vec<Vec<TraceEntry>>,
    /// Written as `allocator_settings` when set.
    pub alloc_conf: Option<RecordedSettings>,
    /// Stacks recorded with trace entries (`_record_memory_history(context=…)`).
    pub stacks: Vec<Stack>,
    /// Written as `external_annotations` when not empty.
    pub annotations: Vec<Annotation>,
}

/// One recorded stack and the trace entries that carry it (written once,
/// then shared, as torch shares a traceback between entries).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stack {
    pub device: usize,
    /// Indices into `device_traces[device]`.
    pub entries: Vec<usize>,
    /// Innermost call first.
    pub frames: Vec<Frame>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    pub filename: String,
    pub line: i64,
    pub name: String,
}

/// A `record_function` START or END (`external_annotations`).
#[derive(Debug, Clone, PartialEq)]
pub struct Annotation {
    pub name: String,
    /// "START" or "END".
    pub stage: String,
    pub device: i64,
    pub time_us: i64,
}

/// What a snapshot's `allocator_settings` records: the config string as set
/// and the values in effect, so a replay of the snapshot (`--fidelity`) runs
/// under the recorded settings.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedSettings {
    pub conf: String,
    pub settings: crate::conf::Settings,
}

/// One cudaMalloc'd segment (or one mapped range of an expandable segment).
/// The aggregates (`allocated_size`, `active_size`, `requested_size`) are
/// computed from the blocks when written, as PyTorch's `snapshot()` does.
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    pub device: i64,
    pub address: u64,
    pub stream: u64,
    pub is_large: bool,
    /// `(0, 0)` for the default pools.
    pub pool_id: (u64, u64),
    pub is_expandable: bool,
    /// Contiguous, in address order, tiling the segment.
    pub blocks: Vec<Block>,
}

impl Segment {
    /// `total_size`: the sum of the block sizes.
    pub fn total_size(&self) -> u64 {
        self.blocks.iter().map(|b| b.size).sum()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    pub size: u64,
    /// For inactive blocks, the stale value of the last allocation (0 if never allocated).
    pub requested_size: u64,
    pub state: BlockState,
}

/// Block states and trace actions are the ones the snapshot model reads, so a
/// written snapshot reads back with the same names.
pub use crate::allocator::BlockState;
pub use crate::snapshot::model::Action;

/// One `device_traces` entry. For `oom`, `addr` carries the free device
/// memory and is written under the key `device_free`, as PyTorch does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceEntry {
    pub action: Action,
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
    pub time_us: i64,
}

impl Snapshot {
    /// The bundled allocator's segments and recorded trace as a snapshot of
    /// device 0 (the replay has one device and the default pools). The
    /// simulation has no clock, so `time_us` counts trace entries from 0.
    pub fn from_allocator(
        segments: &[crate::allocator::SegmentInfo],
        trace: &[crate::allocator::TraceEntry],
        alloc_conf: Option<RecordedSettings>,
    ) -> Snapshot {
        let segments = segments
            .iter()
            .map(|s| Segment {
                device: 0,
                address: s.address,
                stream: s.stream,
                is_large: !s.small,
                pool_id: (0, 0),
                is_expandable: s.is_expandable,
                blocks: s
                    .blocks
                    .iter()
                    .map(|b| Block {
                        size: b.size,
                        requested_size: b.requested_size,
                        state: b.state,
                    })
                    .collect(),
            })
            .collect();
        let trace = trace
            .iter()
            .zip(0i64..)
            .map(|(e, t)| TraceEntry {
                action: e.action,
                addr: e.addr,
                size: e.size,
                stream: e.stream,
                time_us: t,
            })
            .collect();
        Snapshot {
            segments,
            device_traces: vec![trace],
            alloc_conf,
            ..Snapshot::default()
        }
    }
}

/// Serialises `snapshot` as a protocol-4 pickle into `out`.
pub fn write<W: Write>(snapshot: &Snapshot, out: W) -> io::Result<()> {
    let mut p = Pickler::new(out);
    p.raw(&[PROTO, 4])?;
    p.raw(&[EMPTY_DICT])?;
    p.raw(&[MARK])?;

    p.str("segments")?;
    p.raw(&[EMPTY_LIST])?;
    for chunk in snapshot.segments.chunks(BATCH) {
        p.raw(&[MARK])?;
        for seg in chunk {
            p.segment(seg)?;
        }
        p.raw(&[APPENDS])?;
    }

    // (device, entry) → index into `snapshot.stacks`.
    let stack_of: HashMap<(usize, usize), usize> = snapshot
        .stacks
        .iter()
        .enumerate()
        .flat_map(|(k, s)| s.entries.iter().map(move |&e| ((s.device, e), k)))
        .collect();
    let mut stack_memo: Vec<Option<u32>> = vec![None; snapshot.stacks.len()];
    p.str("device_traces")?;
    p.raw(&[EMPTY_LIST])?;
    for (d, trace) in snapshot.device_traces.iter().enumerate() {
        p.raw(&[EMPTY_LIST])?;
        for (c, chunk) in trace.chunks(BATCH).enumerate() {
            p.raw(&[MARK])?;
            for (j, entry) in chunk.iter().enumerate() {
                p.trace_entry(entry)?;
                if let Some(&k) = stack_of.get(&(d, c * BATCH + j))
                    && let (Some(stack), Some(memo)) =
                        (snapshot.stacks.get(k), stack_memo.get_mut(k))
                {
                    p.frames(&stack.frames, memo)?;
                }
                p.raw(&[SETITEMS])?;
            }
            p.raw(&[APPENDS])?;
        }
        p.raw(&[APPEND])?;
    }

    p.str("allocator_settings")?;
    p.raw(&[EMPTY_DICT])?;
    if let Some(recorded) = &snapshot.alloc_conf {
        p.allocator_settings(recorded)?;
    }
    if !snapshot.annotations.is_empty() {
        p.str("external_annotations")?;
        p.raw(&[EMPTY_LIST, MARK])?;
        for a in &snapshot.annotations {
            p.flat_dict(
                &[("name", &a.name), ("stage", &a.stage)],
                &[("device", a.device), ("time_us", a.time_us)],
            )?;
        }
        p.raw(&[APPENDS])?;
    }

    p.raw(&[SETITEMS, STOP])?;
    p.out.flush()
}

/// Serialises `snapshot` into a byte vector.
pub fn to_bytes(snapshot: &Snapshot) -> Vec<u8> {
    let mut buf = Vec::new();
    // Writing into a Vec cannot fail.
    let _ = write(snapshot, &mut buf);
    buf
}

// Opcodes (Lib/pickletools.py).
const PROTO: u8 = 0x80;
const STOP: u8 = b'.';
const MARK: u8 = b'(';
const EMPTY_DICT: u8 = b'}';
const EMPTY_LIST: u8 = b']';
const SETITEMS: u8 = b'u';
const APPEND: u8 = b'a';
const APPENDS: u8 = b'e';
const TUPLE2: u8 = 0x86;
const NEWTRUE: u8 = 0x88;
const NEWFALSE: u8 = 0x89;
const BININT: u8 = b'J';
const BINFLOAT: u8 = b'G';
const BININT1: u8 = b'K';
const BININT2: u8 = b'M';
const LONG1: u8 = 0x8a;
const SHORT_BINUNICODE: u8 = 0x8c;
const BINUNICODE: u8 = b'X';
const MEMOIZE: u8 = 0x94;
const BINGET: u8 = b'h';
const LONG_BINGET: u8 = b'j';

/// Items per MARK … APPENDS batch, as CPython's pickler (`_BATCHSIZE`).
const BATCH: usize = 1000;

struct Pickler<W: Write> {
    out: io::BufWriter<W>,
    /// Memo index of every string written so far.
    memo: HashMap<String, u32>,
    /// Objects memoized so far (MEMOIZE numbers them 0, 1, …).
    memoized: u32,
}

impl<W: Write> Pickler<W> {
    fn new(out: W) -> Self {
        Pickler {
            out: io::BufWriter::with_capacity(1 << 16, out),
            memo: HashMap::new(),
            memoized: 0,
        }
    }

    fn raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)
    }

    /// A string: BINGET when already memoized, else written and memoized.
    fn str(&mut self, s: &str) -> io::Result<()> {
        if let Some(&idx) = self.memo.get(s) {
            return self.get(idx);
        }
        let bytes = s.as_bytes();
        match u8::try_from(bytes.len()) {
            Ok(n) => self.raw(&[SHORT_BINUNICODE, n])?,
            Err(_) => {
                let n = u32::try_from(bytes.len()).map_err(|_| {
                    io::Error::new(io::ErrorKind::InvalidInput, "string over 4 GiB")
                })?;
                self.raw(&[BINUNICODE])?;
                self.raw(&n.to_le_bytes())?;
            }
        }
        self.raw(bytes)?;
        let idx = self.memoize()?;
        self.memo.insert(s.to_owned(), idx);
        Ok(())
    }

    /// MEMOIZE: the object just written gets the next memo index.
    fn memoize(&mut self) -> io::Result<u32> {
        self.raw(&[MEMOIZE])?;
        let idx = self.memoized;
        self.memoized = self.memoized.saturating_add(1);
        Ok(idx)
    }

    /// BINGET / LONG_BINGET of memo entry `idx`.
    fn get(&mut self, idx: u32) -> io::Result<()> {
        match u8::try_from(idx) {
            Ok(small) => self.raw(&[BINGET, small]),
            Err(_) => {
                self.raw(&[LONG_BINGET])?;
                self.raw(&idx.to_le_bytes())
            }
        }
    }

    /// A dict of string items, then int items.
    fn flat_dict(&mut self, strs: &[(&str, &str)], ints: &[(&str, i64)]) -> io::Result<()> {
        self.raw(&[EMPTY_DICT, MARK])?;
        for (k, v) in strs {
            self.str(k)?;
            self.str(v)?;
        }
        for (k, v) in ints {
            self.str(k)?;
            self.int(i128::from(*v))?;
        }
        self.raw(&[SETITEMS])
    }

    /// A trace entry's `frames` item: the list the first time, then its memo entry.
    fn frames(&mut self, frames: &[Frame], memo: &mut Option<u32>) -> io::Result<()> {
        self.str("frames")?;
        if let Some(idx) = *memo {
            return self.get(idx);
        }
        self.raw(&[EMPTY_LIST])?;
        *memo = Some(self.memoize()?);
        if frames.is_empty() {
            return Ok(());
        }
        self.raw(&[MARK])?;
        for f in frames {
            // Key order of the C++ pickler (allocator.md §9.2): name, filename, line.
            self.flat_dict(
                &[("name", &f.name), ("filename", &f.filename)],
                &[("line", f.line)],
            )?;
        }
        self.raw(&[APPENDS])
    }

    /// An int with the smallest opcode CPython's `save_long` would pick.
    fn int(&mut self, v: i128) -> io::Result<()> {
        if (0..=0xff).contains(&v) {
            self.raw(&[BININT1, v as u8])
        } else if (0..=0xffff).contains(&v) {
            self.raw(&[BININT2])?;
            self.raw(&(v as u16).to_le_bytes())
        } else if (i32::MIN as i128..=i32::MAX as i128).contains(&v) {
            self.raw(&[BININT])?;
            self.raw(&(v as i32).to_le_bytes())
        } else {
            // LONG1: little-endian two's complement, as few bytes as keep the sign.
            let bytes = v.to_le_bytes();
            let mut n = bytes.len();
            while n > 1 {
                let top = bytes[n - 1];
                let next_sign = bytes[n - 2] & 0x80;
                if (top == 0 && next_sign == 0) || (top == 0xff && next_sign != 0) {
                    n -= 1;
                } else {
                    break;
                }
            }
            self.raw(&[LONG1, n as u8])?;
            self.raw(&bytes[..n])
        }
    }

    fn uint(&mut self, v: u64) -> io::Result<()> {
        self.int(i128::from(v))
    }

    /// The 2.6 `allocator_settings` keys in PyTorch's order
    /// (`THCPModule_memorySnapshot`); `max_split_size` SIZE_MAX is −1.
    fn allocator_settings(&mut self, r: &RecordedSettings) -> io::Result<()> {
        let s = &r.settings;
        self.raw(&[MARK])?;
        self.str("PYTORCH_CUDA_ALLOC_CONF")?;
        self.str(&r.conf)?;
        self.str("max_split_size")?;
        self.int(i128::from(i64::try_from(s.max_split_size).unwrap_or(-1)))?;
        self.str("garbage_collection_threshold")?;
        self.float(s.garbage_collection_threshold)?;
        self.str("expandable_segments")?;
        self.bool(s.expandable_segments)?;
        // Host (pinned) memory settings: not modelled, written as CUDAAllocatorConfig's
        // defaults (`m_pinned_num_register_threads(1)`, no host register).
        self.str("pinned_num_register_threads")?;
        self.int(1)?;
        self.str("release_lock_on_cudamalloc")?;
        self.bool(s.release_lock_on_cudamalloc)?;
        self.str("pinned_use_cuda_host_register")?;
        self.bool(false)?;
        self.str("roundup_power2_divisions")?;
        self.raw(&[EMPTY_DICT, MARK])?;
        for (i, &divisions) in s.roundup_power2_divisions.iter().enumerate() {
            self.str(&(1u64 << i).to_string())?;
            self.int(i128::from(divisions))?;
        }
        self.raw(&[SETITEMS, SETITEMS])
    }

    /// BINFLOAT: a big-endian IEEE double.
    fn float(&mut self, v: f64) -> io::Result<()> {
        self.raw(&[BINFLOAT])?;
        self.raw(&v.to_be_bytes())
    }

    fn bool(&mut self, v: bool) -> io::Result<()> {
        self.raw(&[if v { NEWTRUE } else { NEWFALSE }])
    }

    fn key_uint(&mut self, key: &str, v: u64) -> io::Result<()> {
        self.str(key)?;
        self.uint(v)
    }

    /// One segment dict, keys in the order of PyTorch's `snapshot()` pickler.
    fn segment(&mut self, seg: &Segment) -> io::Result<()> {
        let (mut total, mut allocated, mut active, mut requested) = (0u64, 0u64, 0u64, 0u64);
        for b in &seg.blocks {
            total += b.size;
            if b.state == BlockState::ActiveAllocated {
                allocated += b.size;
            }
            if b.state != BlockState::Inactive {
                active += b.size;
                requested += b.requested_size;
            }
        }
        self.raw(&[EMPTY_DICT, MARK])?;
        self.str("device")?;
        self.int(i128::from(seg.device))?;
        self.key_uint("address", seg.address)?;
        self.key_uint("total_size", total)?;
        self.key_uint("allocated_size", allocated)?;
        self.key_uint("active_size", active)?;
        self.key_uint("requested_size", requested)?;
        self.key_uint("stream", seg.stream)?;
        self.str("segment_type")?;
        self.str(if seg.is_large { "large" } else { "small" })?;
        self.str("segment_pool_id")?;
        self.uint(seg.pool_id.0)?;
        self.uint(seg.pool_id.1)?;
        self.raw(&[TUPLE2])?;
        self.str("is_expandable")?;
        self.bool(seg.is_expandable)?;
        self.str("frames")?;
        self.raw(&[EMPTY_LIST])?;
        self.str("blocks")?;
        self.raw(&[EMPTY_LIST])?;
        let mut address = seg.address;
        for chunk in seg.blocks.chunks(BATCH) {
            self.raw(&[MARK])?;
            for b in chunk {
                self.raw(&[EMPTY_DICT, MARK])?;
                self.key_uint("address", address)?;
                self.key_uint("size", b.size)?;
                self.key_uint("requested_size", b.requested_size)?;
                self.str("state")?;
                self.str(b.state.as_str())?;
                self.str("frames")?;
                self.raw(&[EMPTY_LIST, SETITEMS])?;
                address = address.wrapping_add(b.size);
            }
            self.raw(&[APPENDS])?;
        }
        self.raw(&[SETITEMS])
    }

    /// One trace entry dict's items: action, addr (device_free for oom),
    /// size, stream, time_us (the caller may add frames, then closes it).
    fn trace_entry(&mut self, e: &TraceEntry) -> io::Result<()> {
        self.raw(&[EMPTY_DICT, MARK])?;
        self.str("action")?;
        self.str(e.action.as_str())?;
        let addr_key = if e.action == Action::Oom {
            "device_free"
        } else {
            "addr"
        };
        self.key_uint(addr_key, e.addr)?;
        self.key_uint("size", e.size)?;
        self.key_uint("stream", e.stream)?;
        self.str("time_us")?;
        self.int(i128::from(e.time_us))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ints(v: i128) -> Vec<u8> {
        let mut buf = Vec::new();
        let mut p = Pickler::new(&mut buf);
        p.int(v).unwrap();
        drop(p);
        buf
    }

    #[test]
    fn ints_use_cpythons_opcodes() {
        // Expected bytes are what `pickle.dumps(v, 4)` emits between PROTO/FRAME and STOP.
        assert_eq!(ints(7), vec![BININT1, 7]);
        assert_eq!(ints(256), vec![BININT2, 0, 1]);
        assert_eq!(ints(-1), vec![BININT, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(ints(1 << 31), vec![LONG1, 5, 0, 0, 0, 0x80, 0]);
        assert_eq!(ints(0x7f00_0000_0000), vec![LONG1, 6, 0, 0, 0, 0, 0, 0x7f]);
        assert_eq!(ints(-(1 << 40)), vec![LONG1, 6, 0, 0, 0, 0, 0, 0xff]);
        assert_eq!(
            ints(i128::from(u64::MAX)),
            vec![LONG1, 9, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0]
        );
    }

    #[test]
    fn repeated_strings_are_fetched_from_the_memo() {
        let mut buf = Vec::new();
        let mut p = Pickler::new(&mut buf);
        p.str("alloc").unwrap();
        p.str("alloc").unwrap();
        drop(p);
        assert_eq!(
            buf,
            vec![
                SHORT_BINUNICODE,
                5,
                b'a',
                b'l',
                b'l',
                b'o',
                b'c',
                MEMOIZE,
                BINGET,
                0
            ]
        );
    }

    #[test]
    fn oom_entry_names_its_free_bytes_device_free() {
        let snap = Snapshot {
            segments: vec![],
            device_traces: vec![vec![TraceEntry {
                action: Action::Oom,
                addr: 1024,
                size: 4096,
                stream: 0,
                time_us: 0,
            }]],
            ..Snapshot::default()
        };
        let bytes = to_bytes(&snap);
        let has = |s: &[u8]| bytes.windows(s.len()).any(|w| w == s);
        assert!(has(b"device_free"));
        assert!(!has(b"addr"));
        assert_eq!(bytes.first(), Some(&PROTO));
        assert_eq!(bytes.last(), Some(&STOP));
    }
}
