//! The one evidence model every input is parsed into. Field names and presence
//! rules follow `shared/spec/cli-contract.md` (`parse --format json`): a field
//! is present only when the input states it; nothing is derived here.

pub mod fills;

use serde::Serialize;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Raised by the caching allocator (any PyTorch era, native or cudaMallocAsync).
    Oom,
    /// Out of memory, but not the caching allocator's message (CUDA runtime,
    /// cuBLAS, cuDNN, NCCL, MPS, host RAM, legacy THC).
    NonAllocatorOom,
    MemorySummary,
    MemoryStats,
    Snapshot,
    /// An error the device runtime or a custom allocator printed that is not
    /// an out-of-memory error (vLLM's `CUDA Error: invalid argument at
    /// …/cumem_allocator.cpp:278`): what made a later OOM with free memory.
    DeviceError,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceKind {
    Cuda,
    Hip,
    Xpu,
    Mps,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Backend {
    #[serde(rename = "native")]
    Native,
    #[serde(rename = "cudaMallocAsync")]
    CudaMallocAsync,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProcessUse {
    /// `None` for "this process" ("Including non-PyTorch memory, this process has …").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u64>,
    pub bytes: u64,
}

/// One `Stat {current, peak, allocated, freed}` as printed; absent columns stay `None`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct StatValues {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocated: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub freed: Option<i64>,
}

/// `metrics[stat_name][pool]`, stat names as in `memory_stats()` (`allocated_bytes`,
/// `segment`, …), pools `all`, `large_pool`, `small_pool`.
pub type Metrics = BTreeMap<String, BTreeMap<String, StatValues>>;

/// Which source raised a `non_allocator_oom`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OomSource {
    CudaRuntime,
    Cublas,
    Cudnn,
    Nccl,
    Mps,
    Host,
    LegacyThc,
    Xpu,
}

/// One piece of evidence. `kind` says which fields can appear.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Observation {
    pub kind: Kind,
    /// The input's name as given (`-` for standard input).
    pub input: String,
    /// 1-based line where the observation starts (text inputs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_kind: Option<DeviceKind>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_index: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exception: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requested_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_capacity_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub free_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocated_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reserved_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reserved_unallocated_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cached_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process_in_use_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub other_processes: Vec<ProcessUse>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed_bytes: Option<u64>,
    /// MPS messages' "other allocations": what the Metal device holds beyond live tensors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub other_allocations_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub private_pools_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend: Option<Backend>,
    /// The message or table was cut off; only what it holds is reported.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    /// The PyTorch era the text's format identifies, e.g. "1.10-2.0", "2.1", "2.4+".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub format_era: Option<String>,
    /// `non_allocator_oom` only: which library ran out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<OomSource>,
    /// The first line of the message as found (for display), without prefixes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,

    // memory_summary / memory_stats
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cuda_ooms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alloc_retries: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_ooms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_alloc_retries: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics: Option<Metrics>,
    /// Scalar `memory_stats()` keys other than the two above
    /// (`num_sync_all_streams`, `num_device_alloc`, `max_split_size`, …).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub counters: BTreeMap<String, i64>,

    // snapshot
    #[serde(skip_serializing_if = "Option::is_none")]
    pub segments: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocks: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub active_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_events: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocator_settings: Option<serde_json::Value>,
    /// Snapshot-only analysis (per pool/stream breakdown, free extents, sites).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<SnapshotDetail>,
}

/// What a snapshot states beyond the contract's figures (`detail` in
/// `parse --format json`), as `snapshot::evidence` reads it. Fields of every
/// struct here are in alphabetical order: the order of the JSON keys.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SnapshotDetail {
    /// Set when the recorded `PYTORCH_CUDA_ALLOC_CONF` did not take effect.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocator_settings_note: Option<String>,
    /// How many segments are expandable.
    pub expandable_segments: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub external_annotations: Option<usize>,
    /// The snapshot's layout: `dict` (`_snapshot()`) or `segment_list` (`memory_snapshot()`).
    pub form: &'static str,
    /// The trace's `oom` entries.
    pub oom_events: Vec<SnapshotOom>,
    /// Per (pool, segment type, stream).
    pub pools: Vec<PoolDetail>,
    /// The pickle protocol.
    pub protocol: u8,
    pub segments_by_size: Vec<SizeClass>,
    /// `_memory_viz.segsum`'s free-memory split over every segment.
    pub segsum: SegSumDetail,
    /// Segments whose blocks do not add up to their size (segsum's assertion).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub segsum_mismatch_segments: Vec<u64>,
    /// The largest allocation sites of live blocks, by bytes.
    pub top_sites: Vec<AllocationSite>,
    /// What the recorded trace shows, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceMetrics>,
    /// What fills the card (the peak, the OOM and the end, five rows each):
    /// for `diagnose`, not part of `parse`'s evidence.
    #[serde(skip)]
    pub fills: Option<Box<fills::Attribution>>,
    /// Trace entries per action.
    pub trace_actions: BTreeMap<&'static str, u64>,
}

/// One `oom` entry of a snapshot's trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SnapshotOom {
    pub device_free: u64,
    pub event_index: u64,
    pub size: u64,
    pub stream: u64,
}

/// A snapshot's segments of one (pool, segment type, stream).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PoolDetail {
    pub active_bytes: u64,
    pub allocated_bytes: u64,
    pub blocks: u64,
    pub inactive_bytes: u64,
    /// Inactive bytes in segments split into several blocks (PyTorch's
    /// `inactive_split_bytes`: what fragmentation holds).
    pub inactive_split_bytes: u64,
    /// `default` or `private(a,b)`.
    pub pool: String,
    pub requested_bytes: u64,
    pub reserved_bytes: u64,
    /// `small` or `large`.
    pub segment_type: &'static str,
    pub segments: u64,
    pub segsum: SegSumDetail,
    pub stream: u64,
}

/// Free memory as `_memory_viz.segsum` splits it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SegSumDetail {
    pub allocated_bytes: u64,
    pub balanced: bool,
    pub external_free_bytes: u64,
    pub free_bytes: u64,
    pub internal_free_bytes: u64,
    /// Internal free bytes as a percentage of the free bytes, to 0.1.
    pub internal_free_pct: f64,
    /// The largest single inactive block.
    pub largest_free_block_bytes: u64,
    pub reserved_bytes: u64,
}

/// Segments of one size class.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SizeClass {
    pub bytes: u64,
    pub class: &'static str,
    pub segments: u64,
}

/// Where live blocks were allocated: the shown frames of their stack.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AllocationSite {
    pub blocks: u64,
    pub bytes: u64,
    /// `file:line:name`, innermost first.
    pub frames: Vec<String>,
    /// The first frame, or `<non-python>`.
    pub site: String,
}

/// What a snapshot's recorded trace shows (`snapshot::trace_metrics`),
/// read in the pass over `device_traces` that counts the actions.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TraceMetrics {
    /// `alloc` entries.
    pub allocs: u64,
    /// Runs of releases `malloc` made itself before a cudaMalloc or an OOM
    /// (its retry after a failed cudaMalloc, garbage collection, oversize blocks).
    pub allocator_releases: Releases,
    /// Allocations served by a segment cudaMalloc'd (or pages mapped) for them.
    pub cache_misses: u64,
    /// Frees that waited for other streams, per allocation stream.
    pub deferred: Vec<StreamDeferred>,
    /// Where the most deferred bytes were freed (or allocated), when recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deferred_site: Option<Site>,
    /// Runs of releases that `malloc` did not make: `empty_cache()` calls.
    pub empty_cache: Releases,
    /// Where `empty_cache()` was called, when the trace recorded its stack.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub empty_cache_site: Option<Site>,
    /// Steps with at least one `empty_cache()` call.
    pub empty_cache_steps: u64,
    /// Trace entries read.
    pub entries: u64,
    pub ooms: u64,
    /// `oom` entries with at least the request free on the device: the
    /// allocator refused memory the card had (a memory fraction cap).
    pub ooms_with_free_device: u64,
    pub peak: Peak,
    /// `segment_alloc` + `segment_map` entries (cudaMalloc calls, expandable maps).
    pub segment_alloc_bytes: u64,
    pub segment_allocs: u64,
    /// `segment_free` + `segment_unmap` entries (cudaFree calls, expandable unmaps).
    pub segment_free_bytes: u64,
    pub segment_frees: u64,
    /// Request sizes per step (needs two steps).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sizes: Option<SizeChurn>,
    /// Allocations after the first step, and how many of them missed.
    pub steady_allocs: u64,
    pub steady_cache_misses: u64,
    pub step_source: StepSource,
    pub steps: u64,
    /// The trace records `time_us`.
    pub timed: bool,
}

/// How a trace was cut into steps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StepSource {
    /// `external_annotations` named like a step.
    Annotations,
    /// Cycles of allocated memory.
    AllocatedCycles,
    /// No cycle: the whole trace is one step.
    #[default]
    WholeTrace,
}

/// Runs of segment releases.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Releases {
    pub bytes: u64,
    pub calls: u64,
    pub segments: u64,
}

/// A source location from recorded frames.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Site {
    /// Entries recorded with this stack.
    pub entries: u64,
    /// The shown stack from `site` outwards.
    pub frames: Vec<String>,
    /// The first frame outside PyTorch (`file:line:name`, `_memory_viz` style).
    pub site: String,
}

/// Frees of one allocation stream that waited for other streams.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StreamDeferred {
    /// Requested bytes of those frees.
    pub bytes: u64,
    pub frees: u64,
    /// Σ trace entries between request and completion.
    pub held_entries: u64,
    /// Σ µs between `free_requested` and `free_completed` (0 when `time_us`
    /// is not recorded); those still pending at the end: up to the last entry.
    pub held_us: u64,
    pub max_held_us: u64,
    /// The most bytes waiting at once.
    pub peak_bytes: u64,
    /// Requests still waiting when the snapshot was taken.
    pub pending_at_end: u64,
    pub stream: u64,
}

/// Request sizes step by step: only large-pool requests (> 1 MiB), where
/// differing sizes cost fresh segments and splits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct SizeChurn {
    /// Of the distinct sizes of each step after the first, the fraction the
    /// step before did not request.
    pub churn: f64,
    /// Mean number of distinct sizes a step requests.
    pub distinct_per_step: f64,
    /// How far one tensor's size moves over the steps: largest / smallest
    /// of the k-th large request of the steps that make the usual number of
    /// them, median over k (1.6: the largest is 1.6 times the smallest; 1
    /// when fewer than two steps make the usual number).
    pub spread: f64,
}

/// The peaks of the trace: of allocated memory, and of reserved memory (its
/// stranding figures are those of the moment reserved memory first reached
/// its peak, just before the segment that reached it; the trace start when
/// it never grew).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Peak {
    /// Allocated (requested) bytes at the highest point of the trace.
    pub allocated_bytes: u64,
    /// The entry after which allocated memory first reached that point.
    pub event_index: u64,
    pub reserved_bytes: u64,
    /// The entry whose state is reserved memory's peak (the state before it).
    pub reserved_event_index: u64,
    /// Segments left out: created before the trace and released during it
    /// (their content before the release is not in the trace).
    pub segments_unknown: u64,
    /// Free bytes in segments that held a live block then (split segments):
    /// estimated from the requested sizes rounded as the recorded config rounds them.
    pub stranded_bytes: u64,
    /// The part of it in large-pool segments.
    pub stranded_large_bytes: u64,
    /// The segment size (bytes-weighted median) of the large segments that held it.
    pub stranding_segment_bytes: u64,
}

impl Observation {
    /// An observation of `kind` from `input` with every optional field empty.
    pub fn new(kind: Kind, input: impl Into<String>) -> Self {
        Observation {
            kind,
            input: input.into(),
            line: None,
            device_kind: None,
            device_index: None,
            rank: None,
            exception: None,
            requested_bytes: None,
            total_capacity_bytes: None,
            free_bytes: None,
            allocated_bytes: None,
            reserved_bytes: None,
            reserved_unallocated_bytes: None,
            cached_bytes: None,
            process_in_use_bytes: None,
            other_processes: Vec::new(),
            allowed_bytes: None,
            other_allocations_bytes: None,
            private_pools_bytes: None,
            backend: None,
            truncated: false,
            format_era: None,
            source: None,
            message: None,
            cuda_ooms: None,
            alloc_retries: None,
            num_ooms: None,
            num_alloc_retries: None,
            metrics: None,
            counters: BTreeMap::new(),
            segments: None,
            blocks: None,
            active_bytes: None,
            trace_events: None,
            allocator_settings: None,
            detail: None,
        }
    }

    /// The last `oom` entry of a snapshot's trace (the OOM that device
    /// raised last), when it records one.
    pub fn snapshot_oom(&self) -> Option<&SnapshotOom> {
        self.detail.as_ref()?.oom_events.last()
    }
}

/// Everything found in all inputs, in input order then line order.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Evidence {
    pub observations: Vec<Observation>,
    /// What the inputs held besides observations (a trace CSV, binary data
    /// scanned as text, …), for the reader; not part of the JSON contract.
    #[serde(skip)]
    pub notes: Vec<String>,
}

/// What the text around the evidence says about the environment, as the
/// scanner found it (`advise::context` reads it): the first PyTorch version
/// line, the first allocator config set in the text, and a few markers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TextClues {
    /// Major and minor of the first version line (collect_env's "PyTorch
    /// version:", pip's `torch==`, "torch 2.3.1"), when its major is 1 to 9.
    pub torch_version: Option<(u16, u16)>,
    /// The first `PYTORCH_*ALLOC_CONF=value` that is not PyTorch's own OOM
    /// hint ("try setting PYTORCH_CUDA_ALLOC_CONF=…"), trailing `,`/`.` cut.
    pub alloc_conf: Option<String>,
    /// PyTorch's OOM hint "try setting max_split_size_mb" (1.10 and later).
    pub max_split_hint: bool,
    /// Windows paths (`C:\Users\…`, `\site-packages\torch`).
    pub windows_paths: bool,
    /// "expandable_segments not supported on this platform" (pytorch#122057).
    pub expandable_unsupported: bool,
    /// Components that share CUDA memory between processes (vLLM's custom
    /// all-reduce, CuMemAllocator, torch_memory_saver).
    pub ipc_user: bool,
}
