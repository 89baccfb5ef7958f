//! `fit`'s reading of snapshots: one workload recorded at several values of
//! one knob (the batch size, the sequence length). Each snapshot becomes a
//! [`Recording`]: its allocations in trace order with a pairing key and a
//! call site, its timeline of allocations and frees, and the memory live
//! before the trace began, as docs/ATTRIBUTION.md defines it. [`align`]
//! pairs the allocations of two recordings, [`law`] reads a size law from a
//! paired allocation's sizes, and [`Series`] puts them together: for any
//! size, every allocation of the recording closest to it at its law's size.

pub mod align;
pub mod carry;
pub mod grid;
pub mod law;
mod series;

pub use series::{Model, Peaks, Series, SeriesError, SiteLaw, Unpaired};

use super::attribute::{GENERATED, PY, frame_flags, site_label};
use super::model::{Action, BlockState, Frames, ModelError, Snapshot};
use crate::conf::Settings;
use rustc_hash::{FxHashMap, FxHasher};
use std::hash::{Hash, Hasher};

/// One allocation of a recorded trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Alloc {
    /// The bytes it asked for (the `alloc` entry's `size`).
    pub size: u64,
    pub stream: u64,
    /// The pairing key: its stack as file names, lines and functions,
    /// install paths left out ([`stack_keys`]).
    pub key: u64,
    /// The same without line numbers: what still pairs after the script was
    /// edited between the recordings.
    pub coarse: u64,
    /// Its call site, an index into [`Recording::sites`].
    pub site: u32,
}

/// An allocation live before the trace began: an active block of the
/// end state that no `alloc` of the trace made, or a `free_completed` of an
/// address the trace never saw allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pre {
    pub addr: u64,
    pub size: u64,
    pub site: u32,
}

/// One step of a recording's timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Allocation `i` of [`Recording::allocs`] is made.
    Alloc(u32),
    /// Allocation `i` is freed (`free_completed`, or an `alloc` over its
    /// still-live address: the entries between are missing).
    Free(u32),
    /// Pre-trace allocation `i` of [`Recording::pre`] is freed.
    PreFree(u32),
}

/// One snapshot of the series, read for `fit`.
#[derive(Debug, Clone, PartialEq)]
pub struct Recording {
    /// The input's name, for messages.
    pub input: String,
    /// The knob's value it was recorded at.
    pub size: u64,
    /// The device whose trace is read: the one with the most `alloc` entries.
    pub device: u32,
    /// Every device with trace entries.
    pub devices: Vec<u32>,
    /// The allocator settings the snapshot records as in effect.
    pub settings: Settings,
    /// Entries in the device's trace.
    pub entries: usize,
    pub allocs: Vec<Alloc>,
    /// In address order.
    pub pre: Vec<Pre>,
    pub timeline: Vec<Step>,
    /// Call-site labels (`model.py:428:forward`); index 0 is the pre-trace row.
    pub sites: Vec<String>,
}

/// The site label of memory live before the trace began, as `top` names it.
pub const PRE_TRACE_SITE: &str = "<live before the trace began>";
const NO_STACK_SITE: &str = "<no stack recorded>";
const NO_PYTHON_SITE: &str = "<no Python frame>";

/// C++ frames that every allocation's stack carries (the unwinder, the
/// caching allocator, the empty-tensor factories): no help in telling two
/// allocations apart, and where another shape takes another factory they
/// would keep two recordings of one call from pairing.
const CPP_PLUMBING: [&str; 9] = [
    "torch::unwind",
    "torch::CapturedTraceback",
    "gather_with_cpp",
    "CUDACachingAllocator",
    "c10::cuda::",
    "empty_generic",
    "empty_strided",
    "empty_cuda",
    "_empty_",
];
/// C++ frames kept in the key of a stack without a Python frame.
const CPP_KEY_FRAMES: usize = 4;

impl Recording {
    /// Reads the recording of `snap`'s busiest device; `None` when no trace
    /// of the snapshot records an `alloc` or a `free_completed`.
    pub fn read(input: &str, size: u64, snap: &Snapshot) -> Result<Option<Recording>, ModelError> {
        let devices: Vec<u32> = (0..snap.trace_lists())
            .filter_map(|d| u32::try_from(d).ok())
            .filter(|&d| snap.trace_len(d) > 0)
            .collect();
        let device = match devices.as_slice() {
            [] => return Ok(None),
            [d] => *d,
            _ => {
                let mut best = (0usize, devices[0]);
                for &d in &devices {
                    let mut n = 0usize;
                    for e in snap.trace(d) {
                        n += usize::from(e?.action == Action::Alloc);
                    }
                    if n > best.0 {
                        best = (n, d);
                    }
                }
                best.1
            }
        };
        let mut reader = Reader::new(snap);
        let mut rec = Recording {
            input: input.to_string(),
            size,
            device,
            devices,
            settings: super::evidence::recorded_settings(snap),
            entries: snap.trace_len(device),
            allocs: Vec::new(),
            pre: Vec::new(),
            timeline: Vec::new(),
            sites: vec![PRE_TRACE_SITE.to_string()],
        };
        // Address → live traced allocation.
        let mut live: FxHashMap<u64, u32> = FxHashMap::default();
        // Pre-trace allocations freed in the trace: (addr, size, step index).
        let mut pre_freed: Vec<(u64, u64, usize)> = Vec::new();
        for e in snap.trace(device) {
            let e = e?;
            match e.action {
                Action::Alloc => {
                    let i = u32::try_from(rec.allocs.len()).unwrap_or(u32::MAX);
                    if let Some(old) = live.insert(e.addr, i) {
                        rec.timeline.push(Step::Free(old));
                    }
                    let ((key, coarse), site) = reader.stack(e.frames, &mut rec.sites);
                    rec.allocs.push(Alloc {
                        size: e.size,
                        stream: e.stream,
                        key,
                        coarse,
                        site,
                    });
                    rec.timeline.push(Step::Alloc(i));
                }
                Action::FreeCompleted => match live.remove(&e.addr) {
                    Some(i) => rec.timeline.push(Step::Free(i)),
                    None => {
                        pre_freed.push((e.addr, e.size, rec.timeline.len()));
                        rec.timeline.push(Step::PreFree(u32::MAX));
                    }
                },
                _ => {}
            }
        }
        if rec.allocs.is_empty() && pre_freed.is_empty() {
            return Ok(None);
        }
        // Pre-trace allocations still live at the end: active blocks no
        // traced allocation holds.
        let mut pre: Vec<(Pre, Option<usize>)> = Vec::new();
        for seg in snap.segments.iter().filter(|s| s.device == device) {
            for b in snap.blocks_of(seg) {
                let active = matches!(
                    b.state,
                    BlockState::ActiveAllocated | BlockState::ActivePendingFree
                );
                if active && !live.contains_key(&b.address) {
                    let site = reader.stack(b.frames, &mut rec.sites).1;
                    let site = if b.frames == Frames::NONE || site == reader.no_stack {
                        0
                    } else {
                        site
                    };
                    let p = Pre {
                        addr: b.address,
                        size: b.requested_size,
                        site,
                    };
                    pre.push((p, None));
                }
            }
        }
        for &(addr, size, step) in &pre_freed {
            pre.push((
                Pre {
                    addr,
                    size,
                    site: 0,
                },
                Some(step),
            ));
        }
        pre.sort_by_key(|(p, step)| (p.addr, *step));
        for (j, (p, step)) in pre.into_iter().enumerate() {
            if let Some(step) = step
                && let Some(s) = rec.timeline.get_mut(step)
            {
                *s = Step::PreFree(u32::try_from(j).unwrap_or(u32::MAX));
            }
            rec.pre.push(p);
        }
        Ok(Some(rec))
    }

    /// The keys of the allocations, in order, and their line-free ones
    /// (what [`align::align`] pairs).
    pub fn keys(&self) -> (Vec<u64>, Vec<u64>) {
        self.allocs.iter().map(|a| (a.key, a.coarse)).unzip()
    }

    /// The peak of allocated bytes (pre-trace bytes still live plus traced
    /// bytes live), over the state before the first step and after each,
    /// with sizes given per allocation: docs/ATTRIBUTION.md's peak.
    pub fn peak_with(&self, alloc_size: &[u64], pre_size: &[u64]) -> u64 {
        let mut now: i128 = pre_size.iter().map(|&s| i128::from(s)).sum();
        let mut peak = now;
        for s in &self.timeline {
            match *s {
                Step::Alloc(i) => {
                    now += i128::from(alloc_size.get(i as usize).copied().unwrap_or(0));
                    peak = peak.max(now);
                }
                Step::Free(i) => {
                    now -= i128::from(alloc_size.get(i as usize).copied().unwrap_or(0))
                }
                Step::PreFree(j) => {
                    now -= i128::from(pre_size.get(j as usize).copied().unwrap_or(0))
                }
            }
        }
        u64::try_from(peak.max(0)).unwrap_or(u64::MAX)
    }

    /// What is live at the first peak of allocated bytes, with sizes given
    /// per allocation as in [`Self::peak_with`]: each allocation and each
    /// pre-trace allocation live then, with its bytes.
    pub fn live_at_peak(&self, alloc_size: &[u64], pre_size: &[u64]) -> LiveAtPeak {
        let size = |v: &[u64], i: u32| v.get(i as usize).copied().unwrap_or(0);
        let mut now: i128 = pre_size.iter().map(|&s| i128::from(s)).sum();
        let (mut best, mut at) = (now, None);
        for (k, s) in self.timeline.iter().enumerate() {
            match *s {
                Step::Alloc(i) => now += i128::from(size(alloc_size, i)),
                Step::Free(i) => now -= i128::from(size(alloc_size, i)),
                Step::PreFree(j) => now -= i128::from(size(pre_size, j)),
            }
            if now > best {
                best = now;
                at = Some(k);
            }
        }
        let mut pre_live = vec![true; pre_size.len()];
        let mut alloc_live = vec![false; alloc_size.len()];
        for s in &self.timeline[..at.map_or(0, |k| k + 1)] {
            let set = |v: &mut [bool], i: u32, to: bool| {
                if let Some(x) = v.get_mut(i as usize) {
                    *x = to;
                }
            };
            match *s {
                Step::Alloc(i) => set(&mut alloc_live, i, true),
                Step::Free(i) => set(&mut alloc_live, i, false),
                Step::PreFree(j) => set(&mut pre_live, j, false),
            }
        }
        let live = |flags: &[bool], sizes: &[u64]| {
            flags
                .iter()
                .zip(sizes)
                .enumerate()
                .filter(|(_, (l, _))| **l)
                .map(|(i, (_, &b))| (i, b))
                .collect()
        };
        LiveAtPeak {
            allocs: live(&alloc_live, alloc_size),
            pre: live(&pre_live, pre_size),
        }
    }

    /// The recorded peak of allocated bytes.
    pub fn peak_allocated(&self) -> u64 {
        let sizes: Vec<u64> = self.allocs.iter().map(|a| a.size).collect();
        let pre: Vec<u64> = self.pre.iter().map(|p| p.size).collect();
        self.peak_with(&sizes, &pre)
    }

    /// The call site of the allocation made at timeline step `k` (the
    /// pre-trace row for a step that allocates nothing).
    pub fn step_site(&self, k: usize) -> &str {
        let site = match self.timeline.get(k) {
            Some(Step::Alloc(i)) => self.allocs.get(*i as usize).map_or(0, |a| a.site),
            _ => 0,
        };
        self.site_label(site)
    }

    /// The call site of pre-trace allocation `j`.
    pub fn pre_site(&self, j: usize) -> &str {
        self.site_label(self.pre.get(j).map_or(0, |p| p.site))
    }

    fn site_label(&self, site: u32) -> &str {
        self.sites.get(site as usize).map_or("", String::as_str)
    }

    /// Bytes live before the trace began.
    pub fn pre_trace_bytes(&self) -> u64 {
        self.pre.iter().map(|p| p.size).sum()
    }
}

/// What [`Recording::live_at_peak`] finds live: (index, bytes) of each
/// allocation and each pre-trace allocation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LiveAtPeak {
    pub allocs: Vec<(usize, u64)>,
    pub pre: Vec<(usize, u64)>,
}

impl LiveAtPeak {
    /// Their bytes.
    pub fn bytes(&self) -> u64 {
        self.allocs.iter().chain(&self.pre).map(|&(_, b)| b).sum()
    }
}

/// Reads stacks once per frames list (torch shares one list between the
/// entries of a call site) and each frame once per frame dict.
struct Reader<'s, 'a> {
    snap: &'s Snapshot<'a>,
    lists: FxHashMap<u32, ((u64, u64), u32)>,
    site_ids: FxHashMap<String, u32>,
    no_stack: u32,
}

impl<'s, 'a> Reader<'s, 'a> {
    fn new(snap: &'s Snapshot<'a>) -> Self {
        Reader {
            snap,
            lists: FxHashMap::default(),
            site_ids: FxHashMap::default(),
            no_stack: u32::MAX,
        }
    }

    fn intern(&mut self, label: &str, sites: &mut Vec<String>) -> u32 {
        if let Some(&id) = self.site_ids.get(label) {
            return id;
        }
        let id = u32::try_from(sites.len()).unwrap_or(u32::MAX);
        sites.push(label.to_string());
        self.site_ids.insert(label.to_string(), id);
        id
    }

    /// The keys and site of a frames list.
    fn stack(&mut self, f: Frames, sites: &mut Vec<String>) -> ((u64, u64), u32) {
        if let Some(&known) = self.lists.get(&f.0) {
            return known;
        }
        let frames: Vec<_> = self.snap.frames(f).collect();
        let key = stack_keys(&frames);
        let label = match site_label(&frames) {
            Some(l) => l,
            None if frames.is_empty() => NO_STACK_SITE.to_string(),
            None => NO_PYTHON_SITE.to_string(),
        };
        let site = self.intern(&label, sites);
        if frames.is_empty() {
            self.no_stack = site;
        }
        self.lists.insert(f.0, (key, site));
        (key, site)
    }
}

/// The pairing keys of a stack (frames innermost first): the file's base
/// name, the line and the function of every Python frame, so that another
/// install (other paths) keeps its keys; and the same without the lines, so
/// that an edited script (lines moved) still pairs. A stack without a
/// Python frame (autograd's thread) is keyed by its first C++ functions
/// past the allocator's own, without their argument lists.
pub fn stack_keys(frames: &[super::model::Frame]) -> (u64, u64) {
    let (mut fine, mut coarse) = (FxHasher::default(), FxHasher::default());
    let mut python = false;
    for f in frames {
        let flags = frame_flags(f.filename, f.name);
        if flags & GENERATED != 0 {
            // Compiled code: its module's hash and lines change with each
            // recompile; its function's name and place in the stack do not.
            for h in [&mut fine, &mut coarse] {
                "<compiled>".hash(h);
                f.name.hash(h);
            }
            python = true;
        } else if flags & PY != 0 {
            let path = f.filename.rsplit(['/', '\\']).next().unwrap_or("");
            for h in [&mut fine, &mut coarse] {
                path.hash(h);
                f.name.hash(h);
            }
            f.line.hash(&mut fine);
            python = true;
        }
    }
    if !python {
        for h in [&mut fine, &mut coarse] {
            0xC0FFEEu32.hash(h);
            frames
                .iter()
                .filter(|f| !CPP_PLUMBING.iter().any(|p| f.name.contains(p)))
                .take(CPP_KEY_FRAMES)
                .for_each(|f| f.name.split('(').next().unwrap_or("").hash(h));
        }
    }
    (fine.finish(), coarse.finish())
}
