//! Evidence drawn from a snapshot: one `snapshot` observation per device, with
//! the per-pool/stream breakdown, `segsum`'s free-memory split, segment size
//! classes, top allocation sites, `oom` trace entries and the allocator
//! settings in its typed `detail` ([`SnapshotDetail`]).

use super::attribute::{Ask, Attributor, Feeding, Passes};
use super::model::{
    Action, Block, BlockState, Frame, Frames, ModelError, PoolKind, Segment, Snapshot,
};
use super::trace_metrics::TraceScan;
use crate::conf::{Settings, TorchVersion};
use crate::evidence::{
    AllocationSite, DeviceKind, Kind, Observation, PoolDetail, SegSumDetail, SizeClass,
    SnapshotDetail, SnapshotOom,
};
use serde_json::Value as J;
use std::collections::{BTreeMap, HashMap};

const MIB: u64 = 1 << 20;
/// How many allocation sites [`SnapshotDetail::top_sites`] lists.
const TOP_SITES: usize = 10;
/// Frames kept per listed site (innermost first; C++ stacks run to 60+).
const SITE_FRAMES: usize = 12;

/// Hashes an arena id with one multiply (Fx's constant): the ids are the
/// file's own, so SipHash's flooding resistance buys nothing at a lookup per
/// live block.
#[derive(Default, Clone, Copy)]
struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u32(&mut self, i: u32) {
        self.write_u64(u64::from(i));
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

type IdHash = std::hash::BuildHasherDefault<IdHasher>;

/// Whether a snapshot observation carries its headline attribution
/// (`detail.fills`, which `diagnose` shows) or the evidence alone (`parse`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fills {
    Headline,
    Skip,
}

/// One observation per device present (segments or trace entries).
pub fn device_observations(
    input_name: &str,
    snap: &Snapshot,
    fills: Fills,
) -> Result<Vec<Observation>, ModelError> {
    let settings_json = settings_json(snap);
    let settings_note = settings_json.as_ref().and_then(settings_mismatch);
    snap.devices()
        .into_iter()
        .map(|device| {
            let segs: Vec<&Segment> = snap
                .segments
                .iter()
                .filter(|s| s.device == device)
                .collect();
            let mut o = Observation::new(Kind::Snapshot, input_name);
            o.device_kind = Some(DeviceKind::Cuda);
            o.device_index = Some(device);
            let (detail, t) = detail(snap, device, &segs, settings_note.as_deref(), fills)?;
            o.segments = Some(t.segments);
            o.blocks = Some(t.blocks);
            o.reserved_bytes = Some(t.reserved);
            o.allocated_bytes = Some(t.allocated);
            o.active_bytes = Some(t.active);
            o.requested_bytes = Some(t.requested);
            o.trace_events = Some(snap.trace_len(device) as u64);
            o.allocator_settings = settings_json.clone();
            o.detail = Some(detail);
            Ok(o)
        })
        .collect()
}

/// Free memory as `_memory_viz.segsum` splits it (allocator.md §10):
/// allocated = requested bytes of `active_allocated` blocks, internal = their
/// rounding slack (size − requested), external = every other block.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SegSum {
    pub reserved: u64,
    pub allocated: u64,
    pub internal_free: u64,
    pub external_free: u64,
    /// The largest single `inactive` block: the biggest request the segment
    /// could serve without a new cudaMalloc. (segsum prints no such figure.)
    pub largest_free_block: u64,
}

impl SegSum {
    /// Counts one block of the segment.
    fn block(&mut self, b: &Block) {
        if b.state == BlockState::ActiveAllocated {
            // segsum trusts requested ≤ size; clamp so a corrupt file cannot underflow.
            let req = b.requested_size.min(b.size);
            self.allocated = self.allocated.saturating_add(req);
            self.internal_free = self.internal_free.saturating_add(b.size - req);
        } else {
            self.external_free = self.external_free.saturating_add(b.size);
            if b.state == BlockState::Inactive {
                self.largest_free_block = self.largest_free_block.max(b.size);
            }
        }
    }

    fn add(&mut self, o: SegSum) {
        self.reserved = self.reserved.saturating_add(o.reserved);
        self.allocated = self.allocated.saturating_add(o.allocated);
        self.internal_free = self.internal_free.saturating_add(o.internal_free);
        self.external_free = self.external_free.saturating_add(o.external_free);
        self.largest_free_block = self.largest_free_block.max(o.largest_free_block);
    }

    /// segsum's assertion: "Segment size mismatch" when this fails.
    pub fn balanced(&self) -> bool {
        self.allocated
            .checked_add(self.internal_free)
            .and_then(|x| x.checked_add(self.external_free))
            == Some(self.reserved)
    }

    fn detail(&self) -> SegSumDetail {
        let free = self.internal_free.saturating_add(self.external_free);
        SegSumDetail {
            reserved_bytes: self.reserved,
            allocated_bytes: self.allocated,
            internal_free_bytes: self.internal_free,
            external_free_bytes: self.external_free,
            free_bytes: free,
            internal_free_pct: if free == 0 {
                0.0
            } else {
                (self.internal_free as f64 * 1000.0 / free as f64).round() / 10.0
            },
            largest_free_block_bytes: self.largest_free_block,
            balanced: self.balanced(),
        }
    }
}

/// (private pool id, `None` for the default pools; segment type; stream).
type PoolKey = (Option<(i64, i64)>, PoolKind, u64);

/// Per (pool, segment type, stream) totals, and their sum per device.
#[derive(Default)]
struct PoolTotals {
    segments: u64,
    blocks: u64,
    reserved: u64,
    allocated: u64,
    active: u64,
    requested: u64,
    inactive: u64,
    /// Inactive bytes in segments split into several blocks (PyTorch's
    /// `inactive_split_bytes`: what fragmentation holds).
    inactive_split: u64,
    segsum: SegSum,
}

impl PoolTotals {
    fn add(&mut self, o: &PoolTotals) {
        self.segments = self.segments.saturating_add(o.segments);
        self.blocks = self.blocks.saturating_add(o.blocks);
        self.reserved = self.reserved.saturating_add(o.reserved);
        self.allocated = self.allocated.saturating_add(o.allocated);
        self.active = self.active.saturating_add(o.active);
        self.requested = self.requested.saturating_add(o.requested);
        self.inactive = self.inactive.saturating_add(o.inactive);
        self.inactive_split = self.inactive_split.saturating_add(o.inactive_split);
        self.segsum.add(o.segsum);
    }
}

/// The observation's `detail`, and its totals. One pass over each
/// segment's blocks feeds the pool totals, segsum and the allocation sites.
fn detail(
    snap: &Snapshot,
    device: u32,
    segs: &[&Segment],
    settings_note: Option<&str>,
    fills: Fills,
) -> Result<(SnapshotDetail, PoolTotals), ModelError> {
    // The trace's passes are made first: their tables' pages are populated
    // (`grow::populating`) while this thread walks the segments.
    let settings = recorded_settings(snap);
    let ask = Ask {
        headline_only: true,
        ..Ask::default()
    };
    let passes = Passes {
        scan: (snap.trace_len(device) > 0).then(|| TraceScan::new(snap, device, settings.clone())),
        // The trace's peak entry is evidence; the rest of the attribution is
        // for diagnose.
        fills: match fills {
            Fills::Headline => Attributor::new(snap, device, settings, ask),
            Fills::Skip => Attributor::peak_only(snap, device),
        },
    };

    // A handful of pools, and runs of segments in the same one: a list
    // searched from the last hit beats a map.
    let mut pools: Vec<(PoolKey, PoolTotals)> = Vec::new();
    let mut last = 0;
    let mut sites = Sites::default();
    let mut unbalanced = Vec::new();
    let mut classes = [(0u64, 0u64); SIZE_CLASSES.len()];
    let mut expandable = 0u64;
    for s in segs {
        let key = (
            s.segment_pool_id.filter(|_| s.is_private_pool()),
            s.segment_type,
            s.stream,
        );
        if pools.get(last).is_none_or(|(k, _)| *k != key) {
            last = match pools.iter().position(|(k, _)| *k == key) {
                Some(i) => i,
                None => {
                    pools.push((key, PoolTotals::default()));
                    pools.len() - 1
                }
            };
        }
        let Some((_, t)) = pools.get_mut(last) else {
            continue;
        };
        let blocks = snap.blocks_of(s);
        let (mut inactive, mut requested) = (0u64, 0u64);
        let mut ss = SegSum {
            reserved: s.total_size,
            ..SegSum::default()
        };
        for b in blocks {
            if b.state == BlockState::Inactive {
                inactive = inactive.saturating_add(b.size);
            } else {
                requested = requested.saturating_add(b.requested_size);
            }
            ss.block(b);
            sites.block(snap, b);
        }
        if !ss.balanced() {
            unbalanced.push(s.address);
        }
        t.add(&PoolTotals {
            segments: 1,
            blocks: blocks.len() as u64,
            reserved: s.total_size,
            allocated: s.allocated_size,
            active: s.active_size,
            // Σ requested bytes of the active blocks, when the file does not record it.
            requested: s.requested_size.unwrap_or(requested),
            inactive,
            inactive_split: if blocks.len() > 1 { inactive } else { 0 },
            segsum: ss,
        });
        if let Some(c) = classes.get_mut(size_class(s.total_size)) {
            c.0 = c.0.saturating_add(1);
            c.1 = c.1.saturating_add(s.total_size);
        }
        expandable = expandable.saturating_add(u64::from(s.is_expandable == Some(true)));
    }

    pools.sort_by_key(|(k, _)| *k);
    let mut sum = PoolTotals::default();
    for (_, t) in &pools {
        sum.add(t);
    }
    let pools_detail: Vec<PoolDetail> = pools
        .iter()
        .map(|((pool, kind, stream), t)| PoolDetail {
            pool: match pool {
                Some((a, b)) => format!("private({a},{b})"),
                None => "default".to_string(),
            },
            segment_type: kind.as_str(),
            stream: *stream,
            segments: t.segments,
            blocks: t.blocks,
            reserved_bytes: t.reserved,
            allocated_bytes: t.allocated,
            active_bytes: t.active,
            requested_bytes: t.requested,
            inactive_bytes: t.inactive,
            inactive_split_bytes: t.inactive_split,
            segsum: t.segsum.detail(),
        })
        .collect();
    let segments_by_size: Vec<SizeClass> = SIZE_CLASSES
        .iter()
        .zip(classes)
        .filter(|(_, (n, _))| *n > 0)
        .map(|(name, (n, bytes))| SizeClass {
            class: name,
            segments: n,
            bytes,
        })
        .collect();

    // One pass over the trace: actions counted (a handful of actions,
    // millions of entries), oom entries kept, and the trace metrics fed.
    let mut counts: Vec<(Action, u64)> = Vec::new();
    let mut ooms = Vec::new();
    // A long trace is attributed on a second thread while this one reads and scans it.
    let passes = std::thread::scope(|threads| -> Result<Passes<TraceScan>, ModelError> {
        let mut feeding = Feeding::new(threads, passes, snap.trace_len(device));
        for (i, e) in snap.trace(device).enumerate() {
            let e = e?;
            match counts.iter_mut().find(|(a, _)| *a == e.action) {
                Some((_, n)) => *n += 1,
                None => counts.push((e.action, 1)),
            }
            if e.action == Action::Oom {
                ooms.push(SnapshotOom {
                    event_index: i as u64,
                    size: e.size,
                    device_free: e.device_free,
                    stream: e.stream,
                });
            }
            feeding.entry(i, &e);
        }
        feeding.finish(device)
    })?;
    let (trace, steps) = passes.scan.map(TraceScan::finish_with_steps).unzip();
    let (fills, peak_event_index) = match fills {
        Fills::Headline => {
            let f = passes.fills.finish(&steps.unwrap_or_default());
            let peak = f.peak_event_index;
            (Some(Box::new(f)), peak)
        }
        Fills::Skip => (None, passes.fills.peak_event_index()),
    };
    let trace = trace.map(|mut t| {
        // The allocated peak's entry (the stranding figures are the reserved peak's).
        t.peak.event_index = peak_event_index.unwrap_or(0);
        t
    });

    let mut actions: BTreeMap<&'static str, u64> = BTreeMap::new();
    for (action, n) in counts {
        *actions.entry(action.as_str()).or_default() += n;
    }
    let d = SnapshotDetail {
        form: match snap.form {
            super::model::Form::Dict => "dict",
            super::model::Form::SegmentList => "segment_list",
        },
        protocol: snap.pickle.protocol,
        pools: pools_detail,
        segsum: sum.segsum.detail(),
        segments_by_size,
        expandable_segments: expandable,
        top_sites: sites.top(),
        trace_actions: actions,
        trace,
        fills,
        oom_events: ooms,
        segsum_mismatch_segments: unbalanced,
        allocator_settings_note: settings_note.map(str::to_string),
        external_annotations: snap.external_annotations,
    };
    Ok((d, sum))
}

/// Segment size classes that follow the allocator's segment sizing
/// (`get_allocation_size`: 2 MiB small buffers, 20 MiB large buffers, larger
/// requests rounded to 2 MiB), in [`size_class`] order.
const SIZE_CLASSES: [&str; 6] = [
    "2 MiB (small pool buffer)",
    "under 20 MiB",
    "20 MiB (large pool buffer)",
    "20-100 MiB",
    "100 MiB-1 GiB",
    "1 GiB and over",
];

/// The index in [`SIZE_CLASSES`] of a segment size.
fn size_class(size: u64) -> usize {
    match size {
        s if s == 2 * MIB => 0,
        s if s < 20 * MIB => 1,
        s if s == 20 * MIB => 2,
        s if s < 100 * MIB => 3,
        s if s < 1024 * MIB => 4,
        _ => 5,
    }
}

/// `_memory_viz._frame_filter`: frames it hides from stacks.
fn frame_shown(f: &Frame) -> bool {
    const OMIT_FUNCTIONS: [&str; 8] = [
        "unwind::unwind",
        "CapturedTraceback::gather",
        "gather_with_cpp",
        "_start",
        "__libc_start_main",
        "PyEval_",
        "PyObject_",
        "PyFunction_",
    ];
    const OMIT_FILENAMES: [&str; 10] = [
        "core/boxing",
        "/Register",
        "/Redispatch",
        "pythonrun.c",
        "Modules/main.c",
        "Objects/call.c",
        "Objects/methodobject.c",
        "pycore_ceval.h",
        "ceval.c",
        "cpython/abstract.h",
    ];
    !OMIT_FUNCTIONS.iter().any(|o| f.name.contains(o))
        && !OMIT_FILENAMES.iter().any(|o| f.filename.contains(o))
}

/// `_memory_viz._frame_fmt`: `basename(filename):line:name`.
pub(super) fn frame_text(f: &Frame) -> String {
    let base = f.filename.rsplit(['/', '\\']).next().unwrap_or(f.filename);
    format!("{base}:{}:{}", f.line, f.name)
}

/// The allocation sites of live (`active_allocated`) blocks, by bytes. A
/// site is the shown part of the stack; identical stacks recorded as
/// different list objects are merged.
#[derive(Default)]
struct Sites<'s> {
    /// Each distinct frames list is read once (torch shares them between blocks).
    by_list: HashMap<Frames, usize, IdHash>,
    by_stack: HashMap<Vec<Frame<'s>>, usize>,
    /// Stack, bytes, blocks.
    sites: Vec<(Vec<Frame<'s>>, u64, u64)>,
    /// The frame filter's verdict per frame dict.
    shown: HashMap<u32, bool>,
}

impl<'s> Sites<'s> {
    fn block(&mut self, snap: &'s Snapshot, b: &Block) {
        if b.state != BlockState::ActiveAllocated {
            return;
        }
        let idx = match self.by_list.get(&b.frames) {
            Some(&i) => i,
            None => {
                let stack = site_frames(snap, b.frames, &mut self.shown);
                let sites = &mut self.sites;
                let i = *self.by_stack.entry(stack.clone()).or_insert_with(|| {
                    sites.push((stack, 0, 0));
                    sites.len() - 1
                });
                self.by_list.insert(b.frames, i);
                i
            }
        };
        if let Some(site) = self.sites.get_mut(idx) {
            site.1 = site.1.saturating_add(b.size);
            site.2 = site.2.saturating_add(1);
        }
    }

    /// The [`TOP_SITES`] biggest, the only ones formatted.
    fn top(mut self) -> Vec<AllocationSite> {
        self.sites
            .sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        self.sites
            .into_iter()
            .take(TOP_SITES)
            .map(|(stack, bytes, blocks)| {
                let frames: Vec<String> = stack.iter().map(frame_text).collect();
                AllocationSite {
                    site: super::attribute::site_label(&stack)
                        .unwrap_or_else(|| super::attribute::NO_STACK_ROW.into()),
                    bytes,
                    blocks,
                    frames,
                }
            })
            .collect()
    }
}

/// The shown frames of a stack (`_memory_viz`'s filter), innermost first,
/// starting at the first Python frame when there is one (the C++ frames above
/// it are the allocator itself), at most [`SITE_FRAMES`]. `cache` remembers
/// the filter's verdict per frame dict.
fn site_frames<'s>(
    snap: &'s Snapshot,
    frames: Frames,
    cache: &mut HashMap<u32, bool>,
) -> Vec<Frame<'s>> {
    let shown: Vec<Frame> = snap
        .frame_entries(frames)
        .filter(|(id, f)| *cache.entry(*id).or_insert_with(|| frame_shown(f)))
        .map(|(_, f)| f)
        .collect();
    let first_py = shown
        .iter()
        .position(|f| f.filename.ends_with(".py"))
        .unwrap_or(0);
    shown.into_iter().skip(first_py).take(SITE_FRAMES).collect()
}

/// [`site_frames`] formatted as `_memory_viz` does (`file:line:name`).
pub fn stack_text(snap: &Snapshot, frames: Frames) -> Vec<String> {
    site_frames(snap, frames, &mut HashMap::new())
        .iter()
        .map(frame_text)
        .collect()
}

/// Compares the `PYTORCH_CUDA_ALLOC_CONF` string recorded in
/// `allocator_settings` with the values that took effect (pytorch#183387:
/// a value can be silently ignored). Only the keys the snapshot records are
/// compared. Returns a note when they disagree.
fn settings_mismatch(settings: &J) -> Option<String> {
    let conf = settings.get("PYTORCH_CUDA_ALLOC_CONF")?.as_str()?;
    let parsed = match crate::conf::parse(conf, TorchVersion::DEFAULT) {
        Ok(p) => p.settings,
        Err(e) => {
            return Some(format!(
                "PYTORCH_CUDA_ALLOC_CONF={conf:?} does not parse ({e}); the allocator ran with {}",
                describe(&apply_recorded(Settings::default(), settings))
            ));
        }
    };
    let effective = apply_recorded(parsed.clone(), settings);
    (effective != parsed).then(|| {
        format!(
            "PYTORCH_CUDA_ALLOC_CONF={conf:?} asks for {} but the allocator ran with {}",
            describe(&parsed),
            describe(&effective)
        )
    })
}

/// A config as PyTorch would spell it, or "the defaults".
fn describe(s: &Settings) -> String {
    match crate::conf::render(s) {
        r if r.is_empty() => "the defaults".into(),
        r => format!("{r:?}"),
    }
}

/// `base` with the values `allocator_settings` records put over it.
fn apply_recorded(mut s: Settings, j: &J) -> Settings {
    if let Some(v) = j.get("max_split_size").and_then(J::as_i64) {
        // SIZE_MAX is recorded as -1.
        s.max_split_size = u64::try_from(v).unwrap_or(u64::MAX);
    }
    if let Some(v) = j.get("expandable_segments").and_then(J::as_bool) {
        s.expandable_segments = v;
    }
    if let Some(v) = j.get("garbage_collection_threshold").and_then(J::as_f64) {
        s.garbage_collection_threshold = v;
    }
    if let Some(v) = j.get("release_lock_on_cudamalloc").and_then(J::as_bool) {
        s.release_lock_on_cudamalloc = v;
    }
    if let Some(d) = j.get("roundup_power2_divisions").and_then(J::as_object) {
        for (i, slot) in s.roundup_power2_divisions.iter_mut().enumerate() {
            if let Some(v) = d.get(&(1u64 << i).to_string()).and_then(J::as_u64) {
                *slot = v;
            }
        }
    }
    s
}

/// The settings the snapshot records as in effect (`allocator_settings`),
/// PyTorch's defaults for what it does not record.
pub fn recorded_settings(snap: &Snapshot) -> Settings {
    match settings_json(snap) {
        Some(j) => apply_recorded(Settings::default(), &j),
        None => Settings::default(),
    }
}

/// The recorded allocator settings, decoded (for replay's `--fidelity`).
pub fn settings_json(snap: &Snapshot) -> Option<J> {
    snap.allocator_settings.map(|v| snap.pickle.to_json(v, 8))
}
