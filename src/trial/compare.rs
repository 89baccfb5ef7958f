//! `replay --compare-with`: the bundled allocator's run next to PyTorch's own
//! figures for the same trace and config (`scripts/torch_crosscheck.py`).

use crate::Error;
use crate::workload::RunResult;
use serde::Serialize;

/// One figure of a bundled-allocator run next to PyTorch's own (from
/// `scripts/torch_crosscheck.py`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ComparedFigure {
    pub metric: &'static str,
    pub allocdoc: Option<i64>,
    pub torch: Option<i64>,
}

impl ComparedFigure {
    pub fn agrees(&self) -> bool {
        self.allocdoc == self.torch
    }
}

/// `replay --compare-with STATS.json`: where the bundled allocator and PyTorch differ.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TorchComparison {
    pub torch_version: String,
    pub device_name: String,
    pub conf: String,
    pub figures: Vec<ComparedFigure>,
}

/// Compares a run with the JSON that `scripts/torch_crosscheck.py` wrote for
/// the same trace and config.
pub fn compare_with_torch(
    run: &RunResult,
    path: &std::path::Path,
) -> Result<TorchComparison, Error> {
    let stats = &run.stats;
    let bad = |what: String| Error::Input(format!("{}: {what}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| bad(format!("not the JSON of torch_crosscheck.py: {e}")))?;
    let torch_stats = json
        .get("memory_stats")
        .and_then(|v| v.as_object())
        .ok_or_else(|| {
            bad("no `memory_stats` object (expected torch_crosscheck.py output)".into())
        })?;
    let torch = |key: &str| torch_stats.get(key).and_then(|v| v.as_i64());
    let ours = |key: &str| stats.get(key).copied();
    let both = |metric: &'static str, key: &str| ComparedFigure {
        metric,
        allocdoc: ours(key),
        torch: torch(key),
    };
    let torch_oom = json
        .get("oom")
        .and_then(|o| o.get("event_index"))
        .and_then(|v| v.as_i64());
    let figures = vec![
        ComparedFigure {
            metric: "OOM at event",
            allocdoc: run
                .figures
                .oom
                .as_ref()
                .and_then(|o| i64::try_from(o.event_index).ok()),
            torch: torch_oom,
        },
        both("peak reserved bytes", "reserved_bytes.all.peak"),
        both("peak allocated bytes", "allocated_bytes.all.peak"),
        both("reserved bytes at the end", "reserved_bytes.all.current"),
        both("segments at the end", "segment.all.current"),
        both("peak segments", "segment.all.peak"),
        both("cudaMalloc calls (num_device_alloc)", "num_device_alloc"),
        both("cudaFree calls (num_device_free)", "num_device_free"),
        both("alloc retries", "num_alloc_retries"),
        both("OOMs", "num_ooms"),
        both(
            "synchronisations (num_sync_all_streams)",
            "num_sync_all_streams",
        ),
    ];
    let text_of = |k: &str| {
        json.get(k)
            .and_then(|v| v.as_str())
            .unwrap_or("?")
            .to_string()
    };
    Ok(TorchComparison {
        torch_version: text_of("torch_version"),
        device_name: text_of("device_name"),
        conf: text_of("conf"),
        figures,
    })
}
