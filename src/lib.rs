//! allocdoc: diagnose PyTorch CUDA out-of-memory failures, recommend a
//! `PYTORCH_CUDA_ALLOC_CONF`, and prove it by replaying the workload through a
//! faithful port of PyTorch's CUDA caching allocator.
//!
//! The library never prints: every command returns values that [`report`]
//! renders. See `docs/ARCHITECTURE.md` for the map.

pub mod advise;
pub mod allocator;
pub mod app;
pub mod conf;
pub mod device;
pub mod error;
pub mod evidence;
pub mod ingest;
pub mod limits;
pub mod report;
pub mod rules;
pub mod snapshot;
pub mod trial;
pub mod units;
pub mod workload;

pub use error::Error;
pub use limits::Limits;
