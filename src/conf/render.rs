//! The canonical `PYTORCH_CUDA_ALLOC_CONF` value for a [`Settings`]: only the
//! keys that differ from PyTorch's defaults, in PyTorch's syntax for
//! `settings.version`, in a fixed order, so that `parse(render(s)) == s`.

use super::{MIB, Settings, TorchVersion};
use crate::evidence::Backend;
use std::fmt::Write;

/// Renders the modelled settings (unmodelled keys are not part of
/// [`Settings`] and are not rendered).
pub fn render(s: &Settings) -> String {
    let d = Settings {
        version: s.version,
        ..Settings::default()
    };
    // Every parse starts max_non_split_rounding_mb at the large segment size.
    let non_split_default = s.large_segment_size;
    let mut items: Vec<String> = Vec::new();
    if s.backend != d.backend {
        items.push(format!("backend:{}", backend_name(s.backend)));
    }
    if s.large_segment_size != d.large_segment_size {
        items.push(format!(
            "large_segment_size_mb:{}",
            s.large_segment_size / MIB
        ));
    }
    if s.max_split_size != d.max_split_size {
        items.push(format!("max_split_size_mb:{}", s.max_split_size / MIB));
    }
    if s.max_non_split_rounding_size != non_split_default {
        items.push(format!(
            "max_non_split_rounding_mb:{}",
            s.max_non_split_rounding_size / MIB
        ));
    }
    if s.roundup_power2_divisions != d.roundup_power2_divisions {
        items.push(format!(
            "roundup_power2_divisions:{}",
            divisions(&s.roundup_power2_divisions)
        ));
    }
    if s.roundup_bypass_threshold != d.roundup_bypass_threshold {
        items.push(format!(
            "roundup_bypass_threshold_mb:{}",
            s.roundup_bypass_threshold / MIB
        ));
    }
    if s.garbage_collection_threshold != d.garbage_collection_threshold {
        items.push(format!(
            "garbage_collection_threshold:{}",
            s.garbage_collection_threshold
        ));
    }
    if s.expandable_segments != d.expandable_segments {
        items.push(format!(
            "expandable_segments:{}",
            py_bool(s.expandable_segments)
        ));
    }
    if s.release_lock_on_cudamalloc != d.release_lock_on_cudamalloc {
        items.push(format!(
            "release_lock_on_cudamalloc:{}",
            py_bool(s.release_lock_on_cudamalloc)
        ));
    }
    if let Some(f) = s.per_process_memory_fraction
        && s.version >= TorchVersion::new(2, 10)
    {
        items.push(format!("per_process_memory_fraction:{f}"));
    }
    items.join(",")
}

pub fn backend_name(b: Backend) -> &'static str {
    match b {
        Backend::Native => "native",
        Backend::CudaMallocAsync => "cudaMallocAsync",
    }
}

fn py_bool(b: bool) -> &'static str {
    if b { "True" } else { "False" }
}

/// The shortest list that rebuilds `table` under both list semantics of
/// §6.4: the first pair fills the buckets below it; a middle bucket needs a
/// pair of its own; a trailing run is an explicit pair for its first bucket
/// plus `>` (2.0–2.9 refill that bucket, 2.10+ start after it: same table).
/// A uniform table is the scalar form.
pub fn divisions(table: &[u64; 16]) -> String {
    let first = table[0];
    if table.iter().all(|&d| d == first) {
        return first.to_string();
    }
    let tail_value = table[15];
    let tail_start = (0..16)
        .rev()
        .take_while(|&i| table[i] == tail_value)
        .last()
        .unwrap_or(15);
    let head_end = table.iter().take_while(|&&d| d == first).count() - 1;
    let mut out = String::from("[");
    let _ = write!(out, "{}:{}", 1u64 << head_end, first);
    for (i, d) in table.iter().enumerate().take(tail_start).skip(head_end + 1) {
        let _ = write!(out, ",{}:{}", 1u64 << i, d);
    }
    if tail_start > head_end {
        let _ = write!(out, ",{}:{}", 1u64 << tail_start, tail_value);
        if tail_start < 15 {
            let _ = write!(out, ",>:{tail_value}");
        }
    }
    out.push(']');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn divisions_lists_are_short() {
        let mut t = [8u64; 16];
        for d in t.iter_mut().skip(7) {
            *d = 2;
        }
        for d in t.iter_mut().skip(10) {
            *d = 1;
        }
        assert_eq!(divisions(&t), "[64:8,128:2,256:2,512:2,1024:1,>:1]");
        assert_eq!(divisions(&[4; 16]), "4");
        let mut t = [1u64; 16];
        t[15] = 2;
        assert_eq!(divisions(&t), "[16384:1,32768:2]");
    }
}
