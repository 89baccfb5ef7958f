//! `torch.cuda.memory_summary()` (torch/cuda/memory.py) rendered from a flat
//! `memory_stats()` map, byte for byte: the 2.x layout, or the 1.x one
//! (KB/MB units of width 7, no "Requested memory" rows), which has no
//! "Oversize" rows before 1.10. Spec: allocator.md §8.

use crate::conf::TorchVersion;
use std::collections::BTreeMap;
use std::fmt::Write;

const METRICS: [(&str, &str, bool); 9] = [
    ("allocated_bytes", "Allocated memory", true),
    ("active_bytes", "Active memory", true),
    ("requested_bytes", "Requested memory", true),
    ("reserved_bytes", "GPU reserved memory", true),
    ("inactive_split_bytes", "Non-releasable memory", true),
    ("allocation", "Allocations", false),
    ("active", "Active allocs", false),
    ("segment", "GPU reserved segments", false),
    ("inactive_split", "Non-releasable allocs", false),
];
const OVERSIZE: [(&str, &str); 2] = [
    ("oversize_allocations", "Oversize allocations"),
    ("oversize_segments", "Oversize GPU segments"),
];
const COLUMNS: [&str; 4] = ["current", "peak", "allocated", "freed"];

/// `_format_size(sz, pref_sz)`: the unit is chosen from `pref` (the "all" row's value).
fn format_size(mut sz: i64, pref: i64, modern: bool) -> String {
    let prefixes: [&str; 6] = if modern {
        ["B  ", "KiB", "MiB", "GiB", "TiB", "PiB"]
    } else {
        ["B ", "KB", "MB", "GB", "TB", "PB"]
    };
    let mut prefix = prefixes[0];
    let mut pref = pref as f64;
    for p in &prefixes[1..] {
        if pref < (768 * 1024) as f64 {
            break;
        }
        prefix = p;
        sz = sz.div_euclid(1024);
        pref /= 1024.0;
    }
    if modern {
        format!("{sz:6} {prefix}")
    } else {
        format!("{sz:7} {prefix}")
    }
}

/// `_format_count(cnt, pref_cnt)`.
fn format_count(mut cnt: i64, pref: i64) -> String {
    let mut prefix = " ";
    let mut pref = pref as f64;
    for p in ["K", "M"] {
        if pref < (750 * 1000) as f64 {
            break;
        }
        prefix = p;
        cnt = cnt.div_euclid(1000);
        pref /= 1000.0;
    }
    format!("{cnt:7} {prefix} ")
}

/// PyTorch `version` has no `memory_summary()` to render.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("memory_summary() does not exist in PyTorch {}.{} (it first appeared in 1.4)", .0.major, .0.minor)]
pub struct NoMemorySummary(pub TorchVersion);

/// Whether PyTorch `version` has `memory_summary()`: it came with the
/// allocator statistics in 1.4 (torch/cuda/memory.py; 1.3.1 has no such module).
pub fn summary_exists(version: TorchVersion) -> Result<(), NoMemorySummary> {
    if version < TorchVersion::new(1, 4) {
        return Err(NoMemorySummary(version));
    }
    Ok(())
}

/// `memory_summary(device, abbreviated)` as PyTorch `version` prints it. A key
/// missing from `stats` reads as 0 (PyTorch would raise KeyError).
pub fn memory_summary(
    stats: &BTreeMap<String, i64>,
    device: u32,
    abbreviated: bool,
    version: TorchVersion,
) -> Result<String, NoMemorySummary> {
    summary_exists(version)?;
    let modern = version >= TorchVersion::new(2, 0);
    // The oversize rows came with max_split_size_mb in 1.10 (1.9.0's
    // memory_summary ends after "Non-releasable allocs").
    let oversize: &[(&str, &str)] = if version >= TorchVersion::new(1, 10) {
        &OVERSIZE
    } else {
        &[]
    };
    let get = |key: &str| stats.get(key).copied().unwrap_or(0);
    let mut lines: Vec<String> = vec![
        "=".repeat(75),
        format!(
            " {:16} PyTorch CUDA memory summary, device ID {device:<17} ",
            ""
        ),
        "-".repeat(75),
        format!(
            "  {:9} CUDA OOMs: {:<12} | {:6} cudaMalloc retries: {:<8}  ",
            "",
            get("num_ooms"),
            "",
            get("num_alloc_retries")
        ),
        "=".repeat(75),
        "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ".to_string(),
    ];
    for (key, name, bytes) in METRICS {
        if key == "requested_bytes" && !modern {
            continue;
        }
        lines.push("-".repeat(75));
        let mut pools = vec![("all", name)];
        if !abbreviated {
            pools.push(("large_pool", "      from large pool"));
            pools.push(("small_pool", "      from small pool"));
        }
        let prefs: Vec<i64> = COLUMNS
            .iter()
            .map(|c| get(&format!("{key}.all.{c}")))
            .collect();
        for (pool, label) in pools {
            let mut row = format!(" {label:<21} ");
            for (column, pref) in COLUMNS.iter().zip(&prefs) {
                let value = get(&format!("{key}.{pool}.{column}"));
                let cell = if bytes {
                    format_size(value, *pref, modern)
                } else {
                    format_count(value, *pref)
                };
                let _ = write!(row, "| {cell} ");
            }
            lines.push(row);
        }
    }
    for &(key, name) in oversize {
        lines.push("-".repeat(75));
        let mut row = format!(" {name:<21} ");
        for column in COLUMNS {
            let value = get(&format!("{key}.{column}"));
            let _ = write!(row, "| {} ", format_count(value, value));
        }
        lines.push(row);
    }
    lines.push("=".repeat(75));
    Ok(format!("|{}|\n", lines.join("|\n|")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_switches_at_768_kib() {
        assert_eq!(format_size(786431, 786431, true), "786431 B  ");
        assert_eq!(format_size(786432, 786432, true), "   768 KiB");
        assert_eq!(format_size(786432, 786432, false), "    768 KB");
        assert_eq!(format_count(749_999, 749_999), " 749999   ");
        assert_eq!(format_count(750_000, 750_000), "    750 K ");
    }

    #[test]
    fn no_summary_before_1_4() {
        let stats = BTreeMap::new();
        let e = memory_summary(&stats, 0, false, TorchVersion::new(1, 3)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "memory_summary() does not exist in PyTorch 1.3 (it first appeared in 1.4)"
        );
        assert!(memory_summary(&stats, 0, false, TorchVersion::new(1, 4)).is_ok());
    }
}
