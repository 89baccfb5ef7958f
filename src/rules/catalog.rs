//! The metric names rule expressions may use, with their definitions. The
//! values are derived from the evidence by `advise::facts`; this list is what
//! the parser checks names against and what `allocdoc rules list -v` and
//! rules/README.md document.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// A size in bytes.
    Bytes,
    /// A plain number (a count, a version).
    Number,
    Bool,
    /// One value per `memory_summary()`/`memory_stats()` observation, in input order.
    Series,
    /// A source location (`file:line:function`), named by a rule's `site:`.
    Text,
}

#[derive(Debug, Clone, Copy)]
pub struct MetricDef {
    pub name: &'static str,
    pub kind: MetricKind,
    pub definition: &'static str,
    /// Read from a snapshot's recorded trace: a rule that reads one has its
    /// settings checked by replaying that trace before they are shown.
    pub trace: bool,
}

const fn m(name: &'static str, kind: MetricKind, definition: &'static str) -> MetricDef {
    MetricDef {
        name,
        kind,
        definition,
        trace: false,
    }
}

/// A trace metric ([`MetricDef::trace`]).
const fn t(name: &'static str, kind: MetricKind, definition: &'static str) -> MetricDef {
    MetricDef {
        trace: true,
        ..m(name, kind, definition)
    }
}

use MetricKind::{Bool, Bytes, Number, Series, Text};

/// The value of `cuda_context`: what the CUDA context and the libraries'
/// handles usually hold outside PyTorch's cache is 0.3-1 GiB (the card, the
/// CUDA version and lazy module loading decide); memory outside the cache up
/// to this much is no sign of another user. Rules' test cases get it too.
pub const CUDA_CONTEXT: u64 = 1 << 30;

pub const METRICS: &[MetricDef] = &[
    m(
        "requested",
        Bytes,
        "what the OOM message says it tried to allocate (the rounded block or segment size, e.g. 20 MiB for a 1-10 MiB tensor)",
    ),
    m("capacity", Bytes, "total device memory ('total capacity')"),
    m(
        "free",
        Bytes,
        "device memory free according to cudaMemGetInfo after the allocator's retries",
    ),
    m(
        "allocated",
        Bytes,
        "memory in live tensors ('already allocated' / 'allocated by PyTorch')",
    ),
    m(
        "reserved",
        Bytes,
        "memory held by the caching allocator: allocated plus cached ('reserved in total by PyTorch'); 1.0-1.3 'cached'",
    ),
    m(
        "reserved_unallocated",
        Bytes,
        "reserved - allocated: cached memory no live tensor uses; at OOM time whole free segments were already released, so this sits in split segments",
    ),
    m(
        "process_in_use",
        Bytes,
        "this process's total device memory including non-PyTorch memory (NVML, 2.1+)",
    ),
    m(
        "other_processes_bytes",
        Bytes,
        "sum of the memory other processes hold on the device (NVML 'Process <pid> has ... in use'); 0 when only this process is listed. NVML lists every process, this one included; without a 'this process' line (a container's PID namespace), the listed process closest above this cache (it holds all of it) is this one",
    ),
    m(
        "non_pytorch",
        Bytes,
        "capacity - free - reserved: device memory outside this process's PyTorch cache (CUDA context, other libraries, other processes)",
    ),
    m(
        "cuda_context",
        Bytes,
        "what the CUDA context and the libraries' handles usually hold outside PyTorch's cache: 1 GiB, the top of the usual 0.3-1 GiB (it depends on the card, the CUDA version and lazy module loading)",
    ),
    m(
        "non_pytorch_in_process",
        Bytes,
        "process_in_use - reserved: this process's memory outside PyTorch's cache (CUDA context, NCCL, cuBLAS/cuDNN handles, other allocators)",
    ),
    m(
        "process_info",
        Bool,
        "the OOM message lists per-process memory (NVML lines, 2.1+)",
    ),
    m(
        "allowed",
        Bytes,
        "the per-process cap set with set_per_process_memory_fraction ('... allowed;')",
    ),
    m(
        "private_pools",
        Bytes,
        "free memory kept in private pools such as CUDA graph pools",
    ),
    m(
        "inactive_split",
        Bytes,
        "inactive_split_bytes (Non-releasable memory) of the latest summary/stats: free pieces of split blocks that cannot be released",
    ),
    m(
        "inactive_split_small",
        Bytes,
        "inactive_split_bytes of the small pool (latest summary/stats)",
    ),
    m(
        "inactive_split_large",
        Bytes,
        "inactive_split_bytes of the large pool (latest summary/stats)",
    ),
    m(
        "small_pool_reserved",
        Bytes,
        "reserved_bytes of the small pool (latest summary/stats)",
    ),
    m(
        "oversize_segments",
        Number,
        "oversize GPU segments currently held (latest summary/stats; exist only with max_split_size_mb)",
    ),
    m(
        "retries",
        Number,
        "cudaMalloc retries: failed cudaMalloc calls that freed the cache and tried again (latest summary/stats)",
    ),
    m(
        "ooms",
        Number,
        "OOMs: the larger of the allocator's count (latest summary/stats) and the number of OOM messages and snapshot oom trace entries (every device's) seen",
    ),
    m(
        "device_error",
        Bool,
        "the input shows a device error that is not out of memory before the OOM (vLLM's 'CUDA Error: invalid argument at …/cumem_allocator.cpp:278', PyTorch's 'CUDA error: …' / 'HIP error: …')",
    ),
    m(
        "device_error_site",
        Text,
        "that device error's line as printed",
    ),
    m("xpu", Bool, "the device diagnosed is an Intel GPU (XPU)"),
    m(
        "xpu_block_limit",
        Bool,
        "the message is IPEX's refusal of a single block over 4 GB ('Current platform can NOT allocate memory block with size larger than 4GB!')",
    ),
    m(
        "snapshot_at_oom",
        Bool,
        "the snapshot diagnosed was taken at an OOM: its device's trace records an oom entry, or its file name says oom (an OOM observer's dump, torch._C._cuda_attach_out_of_memory_observer, which records segments only)",
    ),
    m(
        "oom_entries",
        Number,
        "oom entries in the trace of the snapshot device diagnosed",
    ),
    m(
        "oom_device",
        Number,
        "the device index of the snapshot device diagnosed",
    ),
    m(
        "oom_event_index",
        Number,
        "the index in its device's trace of the last oom entry (the OOM diagnosed; requested, free, allocated and reserved are its figures)",
    ),
    m(
        "expandable_segments_on",
        Bool,
        "expandable_segments:True is in effect (from --conf, a PYTORCH_CUDA_ALLOC_CONF in the text, or the snapshot's allocator_settings)",
    ),
    m(
        "expandable_segments_supported",
        Bool,
        "expandable_segments can be used: PyTorch >= 2.1, Linux CUDA (not Windows), ROCm only from 2.12 (with ROCm >= 7.0), no 'expandable_segments not supported on this platform' warning in the text, and no IPC user that breaks with it",
    ),
    m(
        "max_split_set",
        Bool,
        "max_split_size_mb is set in the current config",
    ),
    m(
        "ipc_user",
        Bool,
        "the text shows a component that shares CUDA memory between processes (vLLM custom all-reduce/CuMemAllocator, torch_memory_saver)",
    ),
    m("windows", Bool, "the text shows Windows paths"),
    m(
        "process_line_zero",
        Bool,
        "the message says this process has 0 bytes memory in use while PyTorch's cache holds memory: NVML did not see the process (a container), so the process line is not counted",
    ),
    m(
        "card_full",
        Bool,
        "little of the card is free: under 15 % of it by the free figure (or, without one, live and cached memory hold 85 % of it), or more is allocated than the card holds (advise::claims::card_full); a request that alone is most of the card does not make it full",
    ),
    m(
        "room_in_pieces",
        Bool,
        "the request fits in free and cached-unused memory together but in neither alone: the memory exists, in two pieces (advise::claims::room_in_pieces)",
    ),
    m(
        "cached_holds_request",
        Bool,
        "reserved_unallocated alone is at least the request",
    ),
    m("rocm", Bool, "the device is an AMD GPU (HIP)"),
    m(
        "backend_async",
        Bool,
        "the cudaMallocAsync backend raised the OOM or is configured",
    ),
    m(
        "fraction_set",
        Bool,
        "a per-process memory fraction is in effect ('allowed' printed)",
    ),
    m(
        "non_allocator_oom",
        Bool,
        "the failure is out of memory outside the caching allocator",
    ),
    m(
        "source_cublas",
        Bool,
        "non-allocator OOM from cuBLAS (CUBLAS_STATUS_ALLOC_FAILED, workspace)",
    ),
    m("source_cudnn", Bool, "non-allocator OOM from cuDNN"),
    m("source_nccl", Bool, "non-allocator OOM from NCCL"),
    m(
        "source_mps",
        Bool,
        "non-allocator OOM from PyTorch's MPS allocator (Apple GPUs)",
    ),
    m(
        "other_allocations",
        Bytes,
        "MPS messages' 'other allocations': what the Metal device holds beyond live tensors (the MPS allocator's cached buffers and other Metal users)",
    ),
    m(
        "source_host",
        Bool,
        "host (CPU) RAM exhausted (DefaultCPUAllocator, pinned memory)",
    ),
    m(
        "source_runtime",
        Bool,
        "non-allocator OOM from the CUDA/HIP runtime, MPS, XPU or the pre-1.0 THC allocator",
    ),
    m(
        "torch_version",
        Number,
        "PyTorch version as major*100+minor (2.1 -> 201); compare with version literals like v2.1",
    ),
    m(
        "inactive_split_series",
        Series,
        "inactive_split_bytes.all.current of every summary/stats, in order",
    ),
    m(
        "reserved_series",
        Series,
        "reserved_bytes.all.current of every summary/stats",
    ),
    m(
        "allocated_series",
        Series,
        "allocated_bytes.all.current of every summary/stats",
    ),
    m(
        "reserved_unallocated_series",
        Series,
        "reserved - allocated of every summary/stats",
    ),
    m(
        "retries_series",
        Series,
        "cudaMalloc retries of every summary/stats",
    ),
    // From a snapshot's recorded trace (snapshot::trace_metrics), first traced device.
    t(
        "trace_allocs",
        Number,
        "alloc entries in the snapshot's trace",
    ),
    t(
        "trace_steps",
        Number,
        "steps in the trace: starts of record_function annotations named like a step (ProfilerStep#N), else cycles of allocated memory (rising from the bottom of its usual range, the 5th-95th percentile, above its middle and back); 1 when neither",
    ),
    t(
        "cache_miss_rate",
        Number,
        "fraction of the trace's allocations served by a segment cudaMalloc'd (or expandable pages mapped) for them: a segment_alloc/segment_map entry right before the alloc it holds",
    ),
    t(
        "steady_miss_rate",
        Number,
        "cache_miss_rate after the first step (needs 2 steps): in a steady loop the cache serves everything",
    ),
    t(
        "misses_per_step",
        Number,
        "cache misses (cudaMalloc calls for a request) per step after the first (needs 2 steps)",
    ),
    t(
        "segment_allocs",
        Number,
        "segment_alloc (cudaMalloc) and segment_map (expandable pages mapped) entries in the trace",
    ),
    t(
        "segment_frees",
        Number,
        "segment_free (cudaFree) and segment_unmap entries in the trace",
    ),
    t(
        "empty_cache_calls",
        Number,
        "runs of segment releases that malloc did not make: torch.cuda.empty_cache() calls (a run whose stack names empty_cache; else one that gave back a cached block the next request could have used, since malloc releases only when none fits; one not followed by malloc's own cudaMalloc or OOM; or one followed by a cudaMalloc the card had room for)",
    ),
    t(
        "empty_cache_steps",
        Number,
        "steps with at least one empty_cache() call",
    ),
    t(
        "empty_cache_released",
        Bytes,
        "bytes those empty_cache() calls released",
    ),
    t(
        "allocator_releases",
        Number,
        "runs of segment releases malloc made itself before a cudaMalloc or an OOM: its flush and retry after a failed cudaMalloc (at the card's or the fraction's limit), garbage collection, oversize blocks",
    ),
    t(
        "allocator_releases_per_step",
        Number,
        "allocator_releases per step",
    ),
    t(
        "deferred_frees",
        Number,
        "frees whose free_completed did not follow their free_requested at once: the block was used on other streams (record_stream) and waited for their events",
    ),
    t(
        "deferred_free_bytes",
        Bytes,
        "requested bytes of those frees",
    ),
    t(
        "deferred_peak",
        Bytes,
        "the most bytes freed in the code but still waiting for other streams at once (largest over the allocation streams)",
    ),
    t(
        "deferred_hold_ms",
        Number,
        "mean milliseconds between free_requested and free_completed of the deferred frees (needs time_us, 2.2+); those still waiting count up to the last entry",
    ),
    t(
        "distinct_sizes_per_step",
        Number,
        "distinct large request sizes (over 1 MiB) a step makes, mean over the steps (needs 2 steps)",
    ),
    t(
        "size_churn",
        Number,
        "of the distinct large request sizes of each step after the first, the fraction the step before did not request (0: static shapes; 1: every size new; needs 2 steps)",
    ),
    t(
        "size_spread",
        Number,
        "how far one tensor's size moves over the steps: largest / smallest of the k-th large request of the steps that make the usual number of them, median over k (1.6: the largest is 1.6 times the smallest; 1 when fewer than 2 steps make that number)",
    ),
    t(
        "trace_peak_reserved",
        Bytes,
        "reserved bytes when reserved memory first reached its highest point in the trace (the snapshot's reserved plus the segments the trace released, less those it created after that point)",
    ),
    t(
        "trace_peak_allocated",
        Bytes,
        "allocated (requested) bytes at their highest point in the trace",
    ),
    t(
        "stranded_at_peak",
        Bytes,
        "free bytes in split segments (segments holding a live block) just before reserved memory reached its peak: memory the peak holds but no request could use; live blocks are estimated from the requested sizes as the recorded config rounds them, segments created before the trace and released during it are left out",
    ),
    t(
        "stranded_large_at_peak",
        Bytes,
        "the part of stranded_at_peak in large-pool segments",
    ),
    t(
        "stranding_segment_size",
        Bytes,
        "the size of the large segments holding stranded_large_at_peak (the median, weighted by their stranded bytes)",
    ),
    t(
        "ooms_with_free_device",
        Number,
        "oom trace entries whose device_free is at least the request: the allocator refused memory the card had, as a memory fraction cap (set_per_process_memory_fraction) does",
    ),
    t(
        "empty_cache_site",
        Text,
        "where empty_cache() was called (file:line:function, the first frame outside PyTorch), when the trace recorded its stack (_record_memory_history(context='all'))",
    ),
    t(
        "growth_bytes_per_step",
        Bytes,
        "how much the live memory allocated at growth_site rose per step, over the longest run of steps in which it rose at every step start (at least 3 step starts, so 2 rises): (live bytes at the last start − at the first) / steps spanned",
    ),
    t(
        "growth_steps",
        Number,
        "the steps that run spans (last step − first step; 2 or more)",
    ),
    t(
        "growth_total",
        Bytes,
        "what the live memory allocated at growth_site grew by over those steps",
    ),
    t(
        "growth_first_step",
        Number,
        "the step (counted from 0) at whose start the rise begins",
    ),
    t(
        "growth_last_step",
        Number,
        "the step at whose start the rise ends",
    ),
    t(
        "growth_site",
        Text,
        "the call site (file:line:function, the first frame outside torch and the standard library) whose live memory grew the most over such a run",
    ),
    t(
        "deferred_free_site",
        Text,
        "where the most deferred bytes were freed (context='all') or allocated (context='alloc'), when recorded",
    ),
];

pub fn lookup(name: &str) -> Option<&'static MetricDef> {
    METRICS.iter().find(|d| d.name == name)
}

/// Whether a condition reads a trace metric.
pub fn reads_trace(when: &super::expr::Expr) -> bool {
    let mut names = Vec::new();
    when.metrics(&mut names);
    names.iter().any(|n| lookup(n).is_some_and(|d| d.trace))
}

#[cfg(test)]
mod tests {
    #[test]
    fn readme_documents_every_metric() {
        let readme = include_str!("../../rules/README.md");
        for m in super::METRICS {
            assert!(
                readme.contains(&format!("| `{}` |", m.name)),
                "rules/README.md lacks {}",
                m.name
            );
        }
    }
}
