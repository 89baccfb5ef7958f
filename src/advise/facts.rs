//! From evidence to [`Facts`]: the metric values rules read (see
//! `rules::catalog` for their definitions), for one observation (the
//! incident being diagnosed, [`super::incident`]) plus series from every
//! summary and stats dump, in the user's [`Setup`].

use super::context::Context;
use super::setup::Setup;
use crate::conf::{Platform, TorchVersion};
use crate::evidence::{Backend, Evidence, Kind, Observation, OomSource, PoolDetail};
use crate::rules::{Fact, Facts, VersionRange};

/// The observation diagnosed when the evidence holds no OOM: the last
/// summary or stats dump (the latest state of the run), else the last snapshot.
pub fn fallback(evidence: &Evidence) -> Option<&Observation> {
    let obs = &evidence.observations;
    obs.iter()
        .rev()
        .find(|o| matches!(o.kind, Kind::MemorySummary | Kind::MemoryStats))
        .or_else(|| obs.last())
}

/// What the facts of every incident share (the kinds present, the series,
/// the trace, the setup, the latest dump, how many messages), read from the
/// evidence once, so that diagnosing n incidents does not read it n times.
pub struct Shared<'e> {
    base: Facts,
    /// The last summary or stats dump (the latest state of the run).
    latest: Option<&'e Observation>,
    /// How many allocator OOM messages and snapshot `oom` entries the evidence holds.
    messages: u64,
    /// The first device error of each input.
    first_device_error: std::collections::HashMap<&'e str, &'e Observation>,
}

impl<'e> Shared<'e> {
    pub fn new(evidence: &'e Evidence, ctx: &Context, setup: &Setup) -> Self {
        let mut f = Facts::default();
        for o in &evidence.observations {
            if !f.kinds.contains(&o.kind) {
                f.kinds.push(o.kind);
            }
        }
        f.torch = setup.torch.value;
        f.backend = Some(setup.backend.value);
        series(&mut f, evidence);
        trace_facts(&mut f, evidence);
        context_facts(&mut f, ctx, setup, recorded_settings(evidence));
        let obs = &evidence.observations;
        Shared {
            base: f,
            latest: obs
                .iter()
                .rev()
                .find(|o| matches!(o.kind, Kind::MemorySummary | Kind::MemoryStats)),
            messages: obs
                .iter()
                .map(|o| match o.kind {
                    Kind::Oom => 1,
                    Kind::Snapshot => o.detail.as_ref().map_or(0, |d| d.oom_events.len() as u64),
                    _ => 0,
                })
                .sum(),
            first_device_error: obs.iter().filter(|o| o.kind == Kind::DeviceError).fold(
                std::collections::HashMap::new(),
                |mut m, o| {
                    m.entry(o.input.as_str()).or_insert(o);
                    m
                },
            ),
        }
    }

    /// The facts for `primary` (the observation diagnosed) within the
    /// evidence, plus what the surrounding text, the user and the setup say.
    pub fn facts(&self, primary: Option<&Observation>) -> Facts {
        let mut f = self.base.clone();
        if let Some(p) = primary {
            scalars(&mut f, p, self);
        }
        f
    }
}

fn bytes(f: &mut Facts, name: &str, v: Option<u64>) {
    if let Some(v) = v {
        f.set(name, Fact::Num(v as f64));
    }
}

/// §7.2: "Tried to allocate more than 1EB memory." states a lower bound only.
const ONE_EIB: u64 = 1 << 60;

fn scalars(f: &mut Facts, p: &Observation, shared: &Shared) {
    let over_1eb = p
        .message
        .as_deref()
        .is_some_and(|m| m.contains("more than 1EB"));
    // A snapshot's requested_bytes is what its live blocks asked for, not a
    // failed request: that one comes from the trace's `oom` entries.
    let requested = match p.kind {
        Kind::Snapshot => None,
        _ => p.requested_bytes.or(over_1eb.then_some(ONE_EIB)),
    };
    bytes(f, "requested", requested);
    bytes(f, "capacity", p.total_capacity_bytes);
    bytes(f, "free", p.free_bytes);
    bytes(f, "private_pools", p.private_pools_bytes);
    bytes(f, "cuda_context", Some(crate::rules::catalog::CUDA_CONTEXT));
    let (allocated, reserved) = match p.kind {
        Kind::MemorySummary | Kind::MemoryStats => (
            stat(p, "allocated_bytes", "all").or(p.allocated_bytes),
            stat(p, "reserved_bytes", "all").or(p.reserved_bytes),
        ),
        _ => (p.allocated_bytes, p.reserved_bytes),
    };
    // 2.1+ messages print reserved-but-unallocated; 1.0-1.3 print "cached", which
    // is the same quantity (`stats.amount_cached - stats.amount_allocated` in
    // THCCachingAllocator's message), not the reserved total.
    let gap = p.reserved_unallocated_bytes.or(p.cached_bytes);
    let reserved = reserved.or_else(|| Some(allocated? + gap?));
    let unallocated = gap.or_else(|| Some(reserved?.saturating_sub(allocated?)));
    bytes(f, "allocated", allocated);
    bytes(f, "reserved", reserved);
    bytes(f, "reserved_unallocated", unallocated);
    if let (Some(c), Some(fr), Some(r)) = (p.total_capacity_bytes, p.free_bytes, reserved) {
        bytes(
            f,
            "non_pytorch",
            Some(c.saturating_sub(fr).saturating_sub(r)),
        );
    }
    // Process lines (NVML, 2.1+): `reportProcessMemoryInfo` lists every compute
    // process on the device, this one included, and words it "this process"
    // only when NVML's PID is getpid(). In a container NVML reports host PIDs,
    // so this process is printed as "Process <pid> has …" like the others.
    let listed: Vec<u64> = p
        .other_processes
        .iter()
        .filter(|u| u.pid.is_some())
        .map(|u| u.bytes)
        .collect();
    // "this process has 0 bytes memory in use" beside a cache that holds
    // memory: NVML did not see the process (a container), so the line says
    // nothing about what this process holds (issue 34).
    let unseen = p.process_in_use_bytes == Some(0) && reserved.is_some_and(|r| r > 0);
    f.set("process_line_zero", Fact::Bool(unseen));
    let stated = p.process_in_use_bytes.filter(|_| !unseen);
    let mut in_use = stated;
    let mut self_at = None;
    if let (None, Some(r)) = (in_use, reserved) {
        // The listed process that holds this cache (every byte PyTorch
        // reserved is inside its usage) is this one; of several, the one
        // closest to the cache.
        self_at = listed
            .iter()
            .enumerate()
            .filter(|&(_, &b)| b >= r)
            .min_by_key(|&(_, &b)| b)
            .map(|(i, _)| i);
        in_use = self_at.and_then(|i| listed.get(i).copied());
    }
    bytes(f, "process_in_use", in_use);
    if let (Some(u), Some(r)) = (in_use, reserved) {
        bytes(f, "non_pytorch_in_process", Some(u.saturating_sub(r)));
    }
    if !listed.is_empty() || in_use.is_some() {
        let others: u64 = listed
            .iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != self_at)
            .map(|(_, b)| b)
            .sum();
        bytes(f, "other_processes_bytes", Some(others));
    }
    // A device error printed before the OOM in the same input: what made
    // an allocation fail with memory free.
    let error = shared
        .first_device_error
        .get(p.input.as_str())
        .filter(|e| e.line <= p.line);
    f.set("device_error", Fact::Bool(error.is_some()));
    if let Some(text) = error.and_then(|e| e.message.clone()) {
        f.set_text("device_error_site", text);
    }
    f.set(
        "xpu",
        Fact::Bool(p.device_kind == Some(crate::evidence::DeviceKind::Xpu)),
    );
    // IPEX's XPU allocator refuses any block over 4 GB on platforms without
    // 2D block arrays, whatever is free (csrc/gpu/runtime/CachingDeviceAllocator.cpp).
    let block_limit = p
        .message
        .as_deref()
        .is_some_and(|m| m.contains("can NOT allocate memory block with size larger than"));
    f.set("xpu_block_limit", Fact::Bool(block_limit));
    if p.kind == Kind::Oom {
        let listed = !p.other_processes.is_empty() || stated.is_some();
        f.set("process_info", Fact::Bool(listed));
        bytes(f, "allowed", p.allowed_bytes);
        // A native OOM message prints "… allowed;" exactly when a fraction is set.
        f.set("fraction_set", Fact::Bool(p.allowed_bytes.is_some()));
    }
    let non_allocator = p.kind == Kind::NonAllocatorOom;
    f.set("non_allocator_oom", Fact::Bool(non_allocator));
    if non_allocator {
        let src = p.source;
        let is = |s: &[OomSource]| Fact::Bool(src.is_some_and(|x| s.contains(&x)));
        f.set("source_cublas", is(&[OomSource::Cublas]));
        f.set("source_cudnn", is(&[OomSource::Cudnn]));
        f.set("source_nccl", is(&[OomSource::Nccl]));
        f.set("source_host", is(&[OomSource::Host]));
        f.set("source_mps", is(&[OomSource::Mps]));
        bytes(f, "allowed", p.allowed_bytes);
        bytes(f, "other_allocations", p.other_allocations_bytes);
        f.set(
            "source_runtime",
            Fact::Bool(src.is_none_or(|x| {
                matches!(
                    x,
                    OomSource::CudaRuntime | OomSource::Mps | OomSource::LegacyThc | OomSource::Xpu
                )
            })),
        );
    }
    let latest = shared.latest;
    if let Some(s) = latest {
        bytes(f, "inactive_split", stat(s, "inactive_split_bytes", "all"));
        bytes(
            f,
            "inactive_split_small",
            stat(s, "inactive_split_bytes", "small_pool"),
        );
        bytes(
            f,
            "inactive_split_large",
            stat(s, "inactive_split_bytes", "large_pool"),
        );
        bytes(
            f,
            "small_pool_reserved",
            stat(s, "reserved_bytes", "small_pool"),
        );
        bytes(f, "oversize_segments", stat(s, "oversize_segments", "all"));
        bytes(f, "retries", retries(s));
    }
    if latest.is_none() && p.kind == Kind::Snapshot {
        snapshot_facts(f, p);
    }
    f.set(
        "snapshot_at_oom",
        Fact::Bool(p.kind == Kind::Snapshot && snapshot_at_oom(p)),
    );
    // A summary printed before the OOM does not count it; the messages and
    // the snapshots' `oom` entries (every device's trace) do.
    let messages = shared.messages;
    let counted = latest.and_then(|s| s.cuda_ooms.or(s.num_ooms)).unwrap_or(0);
    let ooms = counted.max(messages);
    f.set("ooms", Fact::Num(ooms as f64));
    // The figure conditions of the claims a verdict makes, for the rules.
    if let Some(full) = super::claims::card_full(f) {
        f.set("card_full", Fact::Bool(full));
    }
    let pieces = super::claims::room_in_pieces(f) == Some(true);
    f.set("room_in_pieces", Fact::Bool(pieces));
    let cached = super::claims::cached_holds_request(f) == Some(true);
    f.set("cached_holds_request", Fact::Bool(cached));
}

/// Whether a snapshot was taken at an OOM: its trace records an `oom` entry,
/// or its file name says so (an OOM observer's dump,
/// `torch._C._cuda_attach_out_of_memory_observer`, records segments only:
/// `oom_snapshot.pickle`, `snapshot-OOM-rank3.pkl`).
fn snapshot_at_oom(p: &Observation) -> bool {
    let name = p.input.rsplit(['/', '\\']).next().unwrap_or(&p.input);
    p.snapshot_oom().is_some()
        || name.split(|c: char| !c.is_ascii_alphanumeric()).any(|w| {
            let w = w.trim_end_matches(|c: char| c.is_ascii_digit());
            w.eq_ignore_ascii_case("oom") || w.eq_ignore_ascii_case("outofmemory")
        })
}

/// The summary-like facts of a snapshot, from its `detail` (snapshot::evidence):
/// inactive split bytes per pool type, the small pool's reservation, and the
/// last `oom` trace entry (rounded request, device free), as §9.2 records
/// them, with allocated and reserved memory as they stood at that entry.
fn snapshot_facts(f: &mut Facts, p: &Observation) {
    let Some(detail) = &p.detail else {
        return;
    };
    if let Some(d) = p.device_index {
        f.set("oom_device", Fact::Num(f64::from(d)));
    }
    f.set("oom_entries", Fact::Num(detail.oom_events.len() as f64));
    let sum = |figure: fn(&PoolDetail) -> u64, kind: Option<&str>| -> Option<u64> {
        Some(
            detail
                .pools
                .iter()
                .filter(|pool| kind.is_none_or(|k| pool.segment_type == k))
                .map(figure)
                .sum(),
        )
    };
    if let Some(oom) = detail.oom_events.last() {
        bytes(f, "requested", Some(oom.size));
        bytes(f, "free", Some(oom.device_free));
        bytes(f, "oom_event_index", Some(oom.event_index));
    }
    // The trace may go on after its OOM (the exception unwound and freed
    // what it held): the state at the entry is the OOM's, the state at the
    // dump is not its cause (issue 34). The attribution's state at the entry.
    let at_oom = detail
        .fills
        .as_deref()
        .and_then(|a| a.moment(crate::evidence::fills::MomentKind::Oom));
    if let Some(m) = at_oom {
        bytes(f, "allocated", Some(m.allocated_block_bytes));
        bytes(f, "reserved", Some(m.reserved_bytes));
        bytes(
            f,
            "reserved_unallocated",
            Some(m.reserved_bytes.saturating_sub(m.allocated_block_bytes)),
        );
        bytes(
            f,
            "inactive_split",
            Some(m.free_reserved.in_split_segments_bytes),
        );
        return;
    }
    let split = |p: &PoolDetail| p.inactive_split_bytes;
    bytes(f, "inactive_split", sum(split, None));
    bytes(f, "inactive_split_small", sum(split, Some("small")));
    bytes(f, "inactive_split_large", sum(split, Some("large")));
    bytes(
        f,
        "small_pool_reserved",
        sum(|p| p.reserved_bytes, Some("small")),
    );
}

/// The snapshot observation whose recorded trace the trace metrics come
/// from: the last one whose trace records an OOM, else the last one whose
/// trace has entries (a device's OOM is diagnosed with its own trace).
pub fn trace_source(evidence: &Evidence) -> Option<&Observation> {
    let traced = |o: &&Observation| {
        o.detail
            .as_ref()
            .and_then(|d| d.trace.as_ref())
            .is_some_and(|t| t.entries > 0)
    };
    let mut traces = evidence.observations.iter().filter(traced);
    traces
        .clone()
        .rfind(|o| o.snapshot_oom().is_some())
        .or_else(|| traces.next_back())
}

/// The metrics of a snapshot's recorded trace (rules/README.md, "Trace
/// metrics"), from [`trace_source`]: rates and per-step figures are derived
/// here, the counts come as read.
fn trace_facts(f: &mut Facts, evidence: &Evidence) {
    let Some(t) = trace_source(evidence).and_then(|o| o.detail.as_ref()?.trace.as_ref()) else {
        return;
    };
    let num = |f: &mut Facts, name: &str, v: f64| f.set(name, Fact::Num(v));
    let steps = t.steps.max(1) as f64;
    num(f, "trace_allocs", t.allocs as f64);
    num(f, "trace_steps", steps);
    if t.allocs > 0 {
        num(
            f,
            "cache_miss_rate",
            t.cache_misses as f64 / t.allocs as f64,
        );
    }
    if t.steps >= 2 {
        let steady = t.steady_cache_misses as f64;
        num(f, "misses_per_step", steady / (steps - 1.0));
        if t.steady_allocs > 0 {
            num(f, "steady_miss_rate", steady / t.steady_allocs as f64);
        }
    }
    num(f, "segment_allocs", t.segment_allocs as f64);
    num(f, "segment_frees", t.segment_frees as f64);
    num(f, "empty_cache_calls", t.empty_cache.calls as f64);
    num(f, "empty_cache_steps", t.empty_cache_steps as f64);
    num(f, "empty_cache_released", t.empty_cache.bytes as f64);
    num(f, "allocator_releases", t.allocator_releases.calls as f64);
    num(
        f,
        "allocator_releases_per_step",
        t.allocator_releases.calls as f64 / steps,
    );
    let frees: u64 = t.deferred.iter().map(|d| d.frees).sum();
    num(f, "deferred_frees", frees as f64);
    let freed = t
        .deferred
        .iter()
        .map(|d| d.bytes)
        .fold(0, u64::saturating_add);
    num(f, "deferred_free_bytes", freed as f64);
    let peak = t.deferred.iter().map(|d| d.peak_bytes).max().unwrap_or(0);
    num(f, "deferred_peak", peak as f64);
    if t.timed && frees > 0 {
        let held: u64 = t
            .deferred
            .iter()
            .map(|d| d.held_us)
            .fold(0, u64::saturating_add);
        num(f, "deferred_hold_ms", held as f64 / frees as f64 / 1000.0);
    }
    if let Some(sizes) = &t.sizes {
        num(f, "distinct_sizes_per_step", sizes.distinct_per_step);
        num(f, "size_churn", sizes.churn);
        num(f, "size_spread", sizes.spread);
    }
    bytes(f, "trace_peak_reserved", Some(t.peak.reserved_bytes));
    bytes(f, "trace_peak_allocated", Some(t.peak.allocated_bytes));
    bytes(f, "stranded_at_peak", Some(t.peak.stranded_bytes));
    bytes(
        f,
        "stranded_large_at_peak",
        Some(t.peak.stranded_large_bytes),
    );
    bytes(
        f,
        "stranding_segment_size",
        Some(t.peak.stranding_segment_bytes),
    );
    num(f, "ooms_with_free_device", t.ooms_with_free_device as f64);
    if let Some(site) = &t.empty_cache_site {
        f.set_text("empty_cache_site", site.site.clone());
    }
    if let Some(site) = &t.deferred_site {
        f.set_text("deferred_free_site", site.site.clone());
    }
    let fills = trace_source(evidence).and_then(|o| o.detail.as_ref()?.fills.as_deref());
    // A traced run of three steps or more that shows no growth has none.
    if fills.is_some_and(|a| a.traced && a.steps >= 3 && a.growth.is_empty()) {
        num(f, "growth_steps", 0.0);
        bytes(f, "growth_bytes_per_step", Some(0));
        bytes(f, "growth_total", Some(0));
    }
    if let Some(g) = fills.and_then(|a| a.growth.first().cloned()) {
        let steps = g.last_step.saturating_sub(g.first_step);
        num(f, "growth_steps", steps as f64);
        num(f, "growth_first_step", g.first_step as f64);
        num(f, "growth_last_step", g.last_step as f64);
        bytes(f, "growth_bytes_per_step", Some(g.bytes_per_step));
        bytes(
            f,
            "growth_total",
            Some(g.last_bytes.saturating_sub(g.first_bytes)),
        );
        f.set_text("growth_site", g.site);
    }
}

fn retries(o: &Observation) -> Option<u64> {
    o.alloc_retries.or(o.num_alloc_retries)
}

fn stat(o: &Observation, name: &str, pool: &str) -> Option<u64> {
    let v = o.metrics.as_ref()?.get(name)?.get(pool)?.current?;
    u64::try_from(v).ok()
}

fn series(f: &mut Facts, evidence: &Evidence) {
    let dumps: Vec<&Observation> = evidence
        .observations
        .iter()
        .filter(|o| matches!(o.kind, Kind::MemorySummary | Kind::MemoryStats))
        .collect();
    if dumps.is_empty() {
        return;
    }
    let collect = |get: &dyn Fn(&Observation) -> Option<u64>| -> Vec<f64> {
        dumps
            .iter()
            .filter_map(|o| get(o))
            .map(|v| v as f64)
            .collect()
    };
    let sets: [(&str, Vec<f64>); 5] = [
        (
            "inactive_split_series",
            collect(&|o| stat(o, "inactive_split_bytes", "all")),
        ),
        (
            "reserved_series",
            collect(&|o| stat(o, "reserved_bytes", "all")),
        ),
        (
            "allocated_series",
            collect(&|o| stat(o, "allocated_bytes", "all")),
        ),
        (
            "reserved_unallocated_series",
            collect(&|o| {
                Some(stat(o, "reserved_bytes", "all")?.saturating_sub(stat(
                    o,
                    "allocated_bytes",
                    "all",
                )?))
            }),
        ),
        ("retries_series", collect(&retries)),
    ];
    for (name, values) in sets {
        if !values.is_empty() {
            f.set(name, Fact::Series(values));
        }
    }
}

/// The PyTorch versions a message's format (and exception name) allows.
pub(super) fn era_range(o: &Observation) -> VersionRange {
    let mut r = o.format_era.as_deref().map(parse_era).unwrap_or_default();
    // §9.1/§9.2: snapshots record `allocator_settings` only after 2.1 (first release
    // UNVERIFIED, by 2.6); `graph_capture_record_stream_reuse` is a 2.9 key (§6.3).
    if let Some(settings) = o
        .allocator_settings
        .as_ref()
        .filter(|_| o.kind == Kind::Snapshot)
    {
        let lo = if settings.get("graph_capture_record_stream_reuse").is_some() {
            TorchVersion::new(2, 9)
        } else {
            TorchVersion::new(2, 1)
        };
        r.lo = Some(r.lo.map_or(lo, |x| x.max(lo)));
    }
    // §7.3: torch.OutOfMemoryError is 2.4+, torch.cuda.OutOfMemoryError 1.13-2.3.
    let by_exception = match o.exception.as_deref() {
        Some("torch.OutOfMemoryError") => Some((TorchVersion::new(2, 4), None)),
        Some("torch.cuda.OutOfMemoryError") => {
            Some((TorchVersion::new(1, 13), Some(TorchVersion::new(2, 3))))
        }
        _ => None,
    };
    if let Some((lo, hi)) = by_exception {
        r.lo = Some(r.lo.map_or(lo, |x| x.max(lo)));
        if let Some(hi) = hi {
            r.hi = Some(r.hi.map_or(hi, |x| x.min(hi)));
        }
        if let (Some(lo), Some(hi)) = (r.lo, r.hi)
            && lo > hi
        {
            // Contradictory hints (a re-raised exception): trust the format.
            return o.format_era.as_deref().map(parse_era).unwrap_or_default();
        }
    }
    r
}

/// "2.1" → [2.1, 2.1], "1.10-2.0" → [1.10, 2.0], "2.4+" → [2.4, …), "pre-1.0" → (…, 0.4].
pub fn parse_era(era: &str) -> VersionRange {
    let v = |s: &str| TorchVersion::parse(s).ok();
    let era = era.trim();
    if let Some(rest) = era.strip_prefix("pre-") {
        let hi = v(rest).map(|x| TorchVersion::new(x.major.saturating_sub(1), 99));
        return VersionRange { lo: None, hi };
    }
    if let Some(lo) = era.strip_suffix('+') {
        return VersionRange {
            lo: v(lo),
            hi: None,
        };
    }
    if let Some((a, b)) = era.split_once('-') {
        return VersionRange { lo: v(a), hi: v(b) };
    }
    match v(era) {
        Some(x) => VersionRange::exact(x),
        None => VersionRange::default(),
    }
}

/// What a snapshot recorded in `allocator_settings` (§9.2, 2.6+):
/// (`expandable_segments`, `max_split_size` set), from the last snapshot that has them.
fn recorded_settings(evidence: &Evidence) -> Option<(bool, bool)> {
    evidence.observations.iter().rev().find_map(|o| {
        let s = o.allocator_settings.as_ref()?;
        let es = s.get("expandable_segments")?.as_bool()?;
        // SIZE_MAX is recorded as -1.
        let max_split = s
            .get("max_split_size")
            .and_then(|v| v.as_i64())
            .is_some_and(|v| v >= 0);
        Some((es, max_split))
    })
}

fn context_facts(f: &mut Facts, ctx: &Context, setup: &Setup, recorded: Option<(bool, bool)>) {
    let platform = setup.platform.value;
    f.set("rocm", Fact::Bool(platform == Platform::Rocm));
    f.set("windows", Fact::Bool(platform == Platform::Windows));
    f.set("ipc_user", Fact::Bool(ctx.ipc_user));
    // What the user said (--conf, a config line in the text) wins over what a
    // snapshot recorded; with neither, PyTorch's defaults.
    let (es_on, max_split) = match (ctx.current.as_ref(), recorded) {
        (Some(c), _) => (c.expandable_segments, c.max_split_size != u64::MAX),
        (None, Some(r)) => r,
        (None, None) => (false, false),
    };
    f.set("expandable_segments_on", Fact::Bool(es_on));
    f.set("max_split_set", Fact::Bool(max_split));
    f.set(
        "backend_async",
        Fact::Bool(f.backend == Some(Backend::CudaMallocAsync)),
    );
    // §5: expandable segments need 2.1+ and the CUDA driver API (Linux; ROCm
    // from 2.12: conf::Platform), and no CUDA IPC user that breaks with them.
    let version_ok = |min: TorchVersion| match (f.torch.lo, f.torch.hi) {
        (Some(lo), _) if lo >= min => Some(true),
        (_, Some(hi)) if hi < min => Some(false),
        _ => None,
    };
    let blocked = platform == Platform::Windows || ctx.ipc_user || ctx.expandable_unsupported;
    let supported = if blocked {
        Some(false)
    } else if platform == Platform::Rocm {
        version_ok(crate::conf::ROCM_EXPANDABLE_SINCE)
    } else {
        version_ok(TorchVersion::new(2, 1))
    };
    if let Some(s) = supported {
        f.set("expandable_segments_supported", Fact::Bool(s));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The facts of the last observation, in the setup the evidence implies.
    fn test_facts(ev: &Evidence) -> Facts {
        let ctx = Context::default();
        let setup = Setup::resolve(ev, &ctx);
        Shared::new(ev, &ctx, &setup).facts(ev.observations.last())
    }

    #[test]
    fn eras_become_ranges() {
        let v = |a, b| Some(TorchVersion::new(a, b));
        assert_eq!(
            parse_era("2.1"),
            VersionRange {
                lo: v(2, 1),
                hi: v(2, 1)
            }
        );
        assert_eq!(
            parse_era("1.10-2.0"),
            VersionRange {
                lo: v(1, 10),
                hi: v(2, 0)
            }
        );
        assert_eq!(
            parse_era("2.4+"),
            VersionRange {
                lo: v(2, 4),
                hi: None
            }
        );
        assert_eq!(
            parse_era("pre-1.0"),
            VersionRange {
                lo: None,
                hi: v(0, 99)
            }
        );
        assert_eq!(parse_era("whatever"), VersionRange::default());
    }

    #[test]
    fn oom_2_1_message_facts() {
        // "Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.65 GiB of which 1.20 GiB is free.
        //  Of the allocated memory 14.00 GiB is allocated by PyTorch, and 6.20 GiB is reserved by PyTorch but unallocated."
        let mut o = Observation::new(Kind::Oom, "t.log");
        o.requested_bytes = Some(2147483648);
        o.total_capacity_bytes = Some(25393692058);
        o.free_bytes = Some(1288490189);
        o.allocated_bytes = Some(15032385536);
        o.reserved_unallocated_bytes = Some(6657199309);
        o.format_era = Some("2.2-2.3".into());
        let ev = Evidence {
            notes: Vec::new(),
            observations: vec![o],
        };
        let f = test_facts(&ev);
        assert_eq!(f.values.get("reserved"), Some(&Fact::Num(21689584845.0)));
        // 23.65 − 1.20 − 20.20 GiB held outside PyTorch's cache.
        assert_eq!(f.values.get("non_pytorch"), Some(&Fact::Num(2415617024.0)));
        assert_eq!(
            f.values.get("expandable_segments_supported"),
            Some(&Fact::Bool(true))
        );
        assert_eq!(f.values.get("fraction_set"), Some(&Fact::Bool(false)));
        assert_eq!(
            f.values.get("reserved_unallocated"),
            Some(&Fact::Num(6657199309.0))
        );
        assert!(!f.values.contains_key("other_processes_bytes"));
    }

    #[test]
    fn cached_in_1_0_messages_is_the_gap_not_the_total() {
        // "Tried to allocate 26.00 MiB (GPU 0; 1024.00 MiB total capacity; 435.61 MiB
        //  already allocated; 24.17 MiB free; 26.39 MiB cached)" (pytorch/examples#621)
        let mut o = Observation::new(Kind::Oom, "t.log");
        o.allocated_bytes = Some(456769372);
        o.cached_bytes = Some(27671675);
        let ev = Evidence {
            notes: Vec::new(),
            observations: vec![o],
        };
        let f = test_facts(&ev);
        assert_eq!(
            f.values.get("reserved_unallocated"),
            Some(&Fact::Num(27671675.0))
        );
        assert_eq!(f.values.get("reserved"), Some(&Fact::Num(484441047.0)));
    }

    #[test]
    fn snapshot_settings_say_whether_expandable_segments_are_on() {
        let mut snap = Observation::new(Kind::Snapshot, "s.pickle");
        snap.allocator_settings = Some(serde_json::json!({
            "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
            "expandable_segments": true,
            "max_split_size": -1
        }));
        let ev = Evidence {
            notes: Vec::new(),
            observations: vec![snap],
        };
        let f = test_facts(&ev);
        assert_eq!(
            f.values.get("expandable_segments_on"),
            Some(&Fact::Bool(true))
        );
        assert_eq!(f.values.get("max_split_set"), Some(&Fact::Bool(false)));
    }
}
