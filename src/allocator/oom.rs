//! The native allocator's out-of-memory message per PyTorch version
//! (`DeviceCachingAllocator::malloc`'s TORCH_CHECK_WITH(OutOfMemoryError, …)).
//! Spec: allocator.md §3.1, §7.2.

use crate::conf::TorchVersion;
use crate::evidence::ProcessUse;
use crate::units::format_size;

/// What the message is built from, read after the failed retries.
#[derive(Debug, Clone, PartialEq)]
pub struct OomFigures<'a> {
    /// The would-be segment size (`alloc_size`): what "Tried to allocate" prints.
    pub alloc_size: u64,
    pub device_index: u32,
    /// cudaMemGetInfo's total and free.
    pub total: u64,
    pub free: u64,
    /// `allowed_memory_maximum` when a memory fraction is set.
    pub allowed: Option<u64>,
    /// NVML's per-process use (`reportProcessMemoryInfo`), in NVML order.
    pub processes: &'a [ProcessUse],
    /// `allocated_bytes.all.current` and `reserved_bytes.all.current`.
    pub allocated: u64,
    pub reserved: u64,
    /// Free bytes in private pools (CUDA graphs); 0 without them.
    pub private_pools: u64,
}

const HINT_1_10: &str = " If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF";
const HINT_2_1: &str = " If reserved but unallocated memory is large try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF";
const HINT_2_2: &str = " If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  ";
const URL_OLD: &str = "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)";
const URL_NEW: &str = "(https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)";

/// UNVERIFIED: the hint's documentation URL changed somewhere in 2.10–2.12; the
/// old one (2.9.1 bin) is kept through 2.11, the new one (2.12.1 bin) from 2.12.
fn docs_url(version: TorchVersion) -> &'static str {
    if version >= TorchVersion::new(2, 12) {
        URL_NEW
    } else {
        URL_OLD
    }
}

/// The message PyTorch `version` raises (the text after `OutOfMemoryError: `).
pub fn oom_message(version: TorchVersion, f: &OomFigures<'_>) -> String {
    let a = format_size(f.alloc_size);
    let t = format_size(f.total);
    let free = format_size(f.free);
    let al = format_size(f.allocated);
    let r = format_size(f.reserved);
    let w = match f.allowed {
        Some(allowed) => format!("{} allowed; ", format_size(allowed)),
        None => String::new(),
    };
    let d = f.device_index;
    if version < TorchVersion::new(1, 4) {
        // THCCachingAllocator (1.0-1.3) prints amount_cached - amount_allocated as
        // "cached", not the reserved total (the spec's §7.2 reading is wrong here).
        let cached = format_size(f.reserved.saturating_sub(f.allocated));
        return format!(
            "CUDA out of memory. Tried to allocate {a} (GPU {d}; {t} total capacity; {al} already allocated; {free} free; {cached} cached)"
        );
    }
    if version < TorchVersion::new(2, 1) {
        let hint = if version >= TorchVersion::new(1, 10) {
            HINT_1_10
        } else {
            ""
        };
        return format!(
            "CUDA out of memory. Tried to allocate {a} (GPU {d}; {t} total capacity; {al} already allocated; {free} free; {w}{r} reserved in total by PyTorch){hint}"
        );
    }
    let p: String = f
        .processes
        .iter()
        .map(|p| {
            let who = match p.pid {
                None => "Including non-PyTorch memory, this process".to_string(),
                Some(pid) => format!("Process {pid}"),
            };
            format!("{who} has {} memory in use. ", format_size(p.bytes))
        })
        .collect();
    let capacity = if version < TorchVersion::new(2, 2) {
        "capacty"
    } else {
        "capacity"
    };
    let head = format!(
        "CUDA out of memory. Tried to allocate {a}. GPU {d} has a total {capacity} of {t} of which {free} is free. {p}{w}"
    );
    if version < TorchVersion::new(2, 2) {
        let unallocated = format_size(f.reserved.wrapping_sub(f.allocated));
        return format!(
            "{head}Of the allocated memory {al} is allocated by PyTorch, and {unallocated} is reserved by PyTorch but unallocated.{HINT_2_1}"
        );
    }
    if version < TorchVersion::new(2, 4) {
        let unallocated = format_size(f.reserved.wrapping_sub(f.allocated));
        return format!(
            "{head}Of the allocated memory {al} is allocated by PyTorch, and {unallocated} is reserved by PyTorch but unallocated.{HINT_2_2}{URL_OLD}"
        );
    }
    // 2.4+: the private-pool clause; PyTorch's arithmetic is unsigned.
    let allocated = format_size(f.allocated.wrapping_add(f.private_pools));
    let private = if f.private_pools > 0 {
        format!(
            "with {} allocated in private pools (e.g., CUDA Graphs), ",
            format_size(f.private_pools)
        )
    } else {
        String::new()
    };
    let unallocated = format_size(
        f.reserved
            .wrapping_sub(f.allocated)
            .wrapping_sub(f.private_pools),
    );
    format!(
        "{head}Of the allocated memory {allocated} is allocated by PyTorch, {private}and {unallocated} is reserved by PyTorch but unallocated.{HINT_2_2}{}",
        docs_url(version)
    )
}

/// The exception class a traceback prints for the native OOM (allocator.md §7.3).
pub fn exception_name(version: TorchVersion) -> &'static str {
    if version < TorchVersion::new(1, 13) {
        "RuntimeError"
    } else if version < TorchVersion::new(2, 4) {
        "torch.cuda.OutOfMemoryError"
    } else {
        "torch.OutOfMemoryError"
    }
}

/// `allocate()`'s refusal of requests of 1 EB or more (no allocator state touched).
pub const MORE_THAN_1EB: &str = "CUDA out of memory. Tried to allocate more than 1EB memory.";

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(processes: &[ProcessUse]) -> OomFigures<'_> {
        // The 2.5-era user report of allocator.md §7.2.
        OomFigures {
            alloc_size: (4.22 * (1u64 << 30) as f64) as u64,
            device_index: 0,
            total: (15.69 * (1u64 << 30) as f64) as u64,
            free: (3.71 * (1u64 << 30) as f64) as u64,
            allowed: None,
            processes,
            allocated: (10.14 * (1u64 << 30) as f64) as u64,
            reserved: (10.14 * (1u64 << 30) as f64) as u64 + (771.43 * (1u64 << 20) as f64) as u64,
            private_pools: 0,
        }
    }

    #[test]
    fn matches_the_2_5_user_report() {
        let procs = [ProcessUse {
            pid: None,
            bytes: (11.14 * (1u64 << 30) as f64) as u64 + 1,
        }];
        let msg = oom_message(TorchVersion::new(2, 5), &figures(&procs));
        assert_eq!(
            msg,
            "CUDA out of memory. Tried to allocate 4.22 GiB. GPU 0 has a total capacity of 15.69 GiB of which 3.71 GiB is free. Including non-PyTorch memory, this process has 11.14 GiB memory in use. Of the allocated memory 10.14 GiB is allocated by PyTorch, and 771.43 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
        );
    }

    #[test]
    fn old_layout_and_typo_versions() {
        let f = OomFigures {
            alloc_size: 20 << 20,
            device_index: 0,
            total: 6 << 30,
            free: 0,
            allowed: None,
            processes: &[],
            allocated: (5.25 * (1u64 << 30) as f64) as u64,
            reserved: (5.31 * (1u64 << 30) as f64) as u64 + 1,
            private_pools: 0,
        };
        assert_eq!(
            oom_message(TorchVersion::new(1, 13), &f),
            "CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 6.00 GiB total capacity; 5.25 GiB already allocated; 0 bytes free; 5.31 GiB reserved in total by PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF"
        );
        assert!(
            oom_message(TorchVersion::new(2, 1), &f).contains("has a total capacty of 6.00 GiB")
        );
        assert!(oom_message(TorchVersion::new(2, 12), &f).ends_with(URL_NEW));
        // 1.0-1.3: "cached" is reserved minus allocated (5.31 - 5.25 GiB).
        assert!(
            oom_message(TorchVersion::new(1, 3), &f)
                .ends_with("5.25 GiB already allocated; 0 bytes free; 61.44 MiB cached)")
        );
    }
}
