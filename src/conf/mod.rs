//! `PYTORCH_CUDA_ALLOC_CONF`: the settings the bundled allocator runs under.
//! The parser (per-version grammar, ranges, PyTorch's own error texts), the
//! renderer and the linter behind `conf check` live in this module.

use crate::evidence::Backend;

pub const MIB: u64 = 1 << 20;

/// A PyTorch release as `major.minor` (patch releases do not change allocator behaviour
/// in anything this tool models).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TorchVersion {
    pub major: u16,
    pub minor: u16,
}

impl TorchVersion {
    pub const fn new(major: u16, minor: u16) -> Self {
        TorchVersion { major, minor }
    }
    /// The behaviour the spec verified line by line (2.6.0 source) is the default.
    pub const DEFAULT: TorchVersion = TorchVersion::new(2, 6);
}

/// The allocator settings in effect. Defaults are PyTorch's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub backend: Backend,
    /// `max_split_size_mb` × 1 MiB; `u64::MAX` when unset (PyTorch: SIZE_MAX).
    pub max_split_size: u64,
    /// `max_non_split_rounding_mb` × 1 MiB (2.6+); the oversize reuse tolerance.
    pub max_non_split_rounding_size: u64,
    /// The 16-bucket `roundup_power2_divisions` table (all 0 = disabled).
    pub roundup_power2_divisions: [u64; 16],
    /// `garbage_collection_threshold`; 0.0 = off. Only active with a memory fraction.
    pub garbage_collection_threshold: f64,
    pub expandable_segments: bool,
    pub release_lock_on_cudamalloc: bool,
    /// `per_process_memory_fraction` (2.10+ key) or `set_per_process_memory_fraction`.
    pub per_process_memory_fraction: Option<f64>,
    /// `large_segment_size_mb` (2.11+); 20 MiB by default.
    pub large_segment_size: u64,
    /// Keys that were accepted but do not affect device memory (pinned_* and similar).
    pub unmodelled_keys: Vec<String>,
    /// Which PyTorch version's behaviour to follow.
    pub version: TorchVersion,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            backend: Backend::Native,
            max_split_size: u64::MAX,
            max_non_split_rounding_size: 20 * MIB,
            roundup_power2_divisions: [0; 16],
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
            release_lock_on_cudamalloc: false,
            per_process_memory_fraction: None,
            large_segment_size: 20 * MIB,
            unmodelled_keys: Vec::new(),
            version: TorchVersion::DEFAULT,
        }
    }
}
