//! A faithful port of PyTorch's native CUDA caching allocator
//! (c10/cuda/CUDACachingAllocator.cpp, 2.6 behaviour by default; earlier
//! versions' differences where `Settings::version` asks for them) over a
//! [`crate::device::Device`].
//!
//! - `sizes`: rounding, pool choice, segment sizes (§1).
//! - `block`: blocks in an arena, pools with their ordered free sets (§2).
//! - `native`: malloc and its slow path, free, stream events, release, GC (§2–§3).
//! - `expandable`: expandable segments (§5).
//! - `stats`, `summary`: `memory_stats()` and `memory_summary()` (§4, §8).
//! - `oom`: the OOM message per version (§7).
//! - `segments`: the snapshot view and the consistency check.

pub mod block;
pub mod events;
pub mod expandable;
pub mod native;
pub mod oom;
pub mod seed;
pub mod segments;
pub mod sizes;
pub mod stats;
pub mod summary;

pub use events::{TraceAction, TraceEntry};
pub use native::{CachingAllocator, OutOfMemory, PointerError};
pub use segments::{BlockInfo, BlockState, SegmentInfo};
pub use stats::{DeviceStats, Stat, StatArray};
