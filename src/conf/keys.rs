//! Every `PYTORCH_CUDA_ALLOC_CONF` key PyTorch has known (spec §6.3): the
//! release that introduced it, the one that removed it, which 2.10+ parser
//! owns it, and whether the bundled allocator models it.

use super::TorchVersion;
use serde::Serialize;

/// Which parser reads a key from 2.10 on: the generic
/// `AcceleratorAllocatorConfig` (libc10) or the CUDA hook `CUDAAllocatorConfig`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    Core,
    Cuda,
}

/// What a key does to device memory, as far as allocdoc is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    /// Changes what the bundled allocator does; part of [`super::Settings`].
    Modelled,
    /// Configures the pinned host-memory allocator; device memory is unchanged.
    HostOnly,
    /// Affects device behaviour the bundled allocator does not reproduce.
    NotModelled,
}

#[derive(Debug, Clone, Copy)]
pub struct KeySpec {
    pub name: &'static str,
    /// The name PyTorch's own messages use (hip spellings are aliases).
    pub canonical: &'static str,
    pub since: TorchVersion,
    /// First release without the key.
    pub removed: Option<TorchVersion>,
    pub owner: Owner,
    pub effect: Effect,
    /// Why a non-modelled key does not matter (or what is missing).
    pub note: &'static str,
}

const fn v(major: u16, minor: u16) -> TorchVersion {
    TorchVersion::new(major, minor)
}

const fn key(name: &'static str, since: TorchVersion, owner: Owner, effect: Effect) -> KeySpec {
    KeySpec {
        name,
        canonical: name,
        since,
        removed: None,
        owner,
        effect,
        note: "",
    }
}

const fn host(name: &'static str, since: TorchVersion) -> KeySpec {
    KeySpec {
        note: "configures the pinned host-memory allocator; device memory is unchanged",
        ..key(name, since, Owner::Cuda, Effect::HostOnly)
    }
}

pub const KEYS: &[KeySpec] = &[
    key("max_split_size_mb", v(1, 10), Owner::Core, Effect::Modelled),
    key(
        "roundup_power2_divisions",
        v(1, 12),
        Owner::Core,
        Effect::Modelled,
    ),
    key(
        "garbage_collection_threshold",
        v(1, 12),
        Owner::Core,
        Effect::Modelled,
    ),
    KeySpec {
        removed: Some(v(2, 0)),
        ..key(
            "roundup_bypass_threshold_mb",
            v(1, 13),
            Owner::Core,
            Effect::Modelled,
        )
    },
    key("backend", v(2, 0), Owner::Cuda, Effect::Modelled),
    key(
        "expandable_segments",
        v(2, 1),
        Owner::Core,
        Effect::Modelled,
    ),
    KeySpec {
        note: "only unlocks the allocator mutex around cudaMalloc; memory use is unchanged",
        ..key(
            "release_lock_on_cudamalloc",
            v(2, 2),
            Owner::Cuda,
            Effect::Modelled,
        )
    },
    KeySpec {
        canonical: "release_lock_on_cudamalloc",
        note: "only unlocks the allocator mutex around cudaMalloc; memory use is unchanged",
        ..key(
            "release_lock_on_hipmalloc",
            v(2, 2),
            Owner::Cuda,
            Effect::Modelled,
        )
    },
    host("pinned_use_cuda_host_register", v(2, 2)),
    KeySpec {
        canonical: "pinned_use_cuda_host_register",
        ..host("pinned_use_hip_host_register", v(2, 2))
    },
    host("pinned_num_register_threads", v(2, 2)),
    key(
        "max_non_split_rounding_mb",
        v(2, 6),
        Owner::Core,
        Effect::Modelled,
    ),
    KeySpec {
        owner: Owner::Core,
        ..host("pinned_use_background_threads", v(2, 6))
    },
    KeySpec {
        note: "reuse of record_stream'd blocks during CUDA graph capture; graphs are not modelled",
        ..key(
            "graph_capture_record_stream_reuse",
            v(2, 9),
            Owner::Cuda,
            Effect::NotModelled,
        )
    },
    key(
        "per_process_memory_fraction",
        v(2, 10),
        Owner::Cuda,
        Effect::Modelled,
    ),
    host("pinned_reserve_segment_size_mb", v(2, 10)),
    key(
        "large_segment_size_mb",
        v(2, 11),
        Owner::Core,
        Effect::Modelled,
    ),
    host("pinned_free_catch_all", v(2, 12)),
    KeySpec {
        note: "pre-emptive OOM under a memory fraction (num_oom_rejections); not modelled",
        ..key(
            "throw_on_cudamalloc_oom",
            v(2, 12),
            Owner::Cuda,
            Effect::NotModelled,
        )
    },
    KeySpec {
        note: "expandable-segment VA reserve; the bundled allocator reserves 9/8 of capacity",
        ..key(
            "expandable_segments_reserve",
            v(2, 15),
            Owner::Cuda,
            Effect::NotModelled,
        )
    },
    KeySpec {
        note: "per stream-class expandable-segment reserve; not modelled",
        ..key(
            "expandable_segments_reserve_by_class",
            v(2, 15),
            Owner::Cuda,
            Effect::NotModelled,
        )
    },
    host("pinned_max_round_threshold_mb", v(2, 15)),
    host("pinned_max_cached_size_mb", v(2, 15)),
];

/// The key as `version` knows it, or `None` when that release rejects it.
pub fn lookup(name: &str, version: TorchVersion) -> Option<&'static KeySpec> {
    KEYS.iter()
        .find(|k| k.name == name)
        .filter(|k| k.since <= version && k.removed.is_none_or(|r| version < r))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn availability_follows_the_timeline() {
        assert!(lookup("max_split_size_mb", v(1, 10)).is_some());
        assert!(lookup("roundup_power2_divisions", v(1, 11)).is_none());
        assert!(lookup("roundup_bypass_threshold_mb", v(1, 13)).is_some());
        assert!(lookup("roundup_bypass_threshold_mb", v(2, 0)).is_none());
        assert!(lookup("expandable_segments", v(2, 0)).is_none());
        assert!(lookup("expandable_segments", v(2, 1)).is_some());
        assert!(lookup("max_non_split_rounding_mb", v(2, 5)).is_none());
        assert!(lookup("large_segment_size_mb", v(2, 10)).is_none());
        assert!(lookup("large_segment_size_mb", v(2, 11)).is_some());
        assert!(lookup("Expandable_segments", v(2, 6)).is_none());
    }
}
