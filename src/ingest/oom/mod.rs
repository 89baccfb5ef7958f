//! Out-of-memory messages: the caching allocator's (every era of
//! `c10/cuda/CUDACachingAllocator.cpp`, the cudaMallocAsync backend, HIP, XPU)
//! and everything else that runs out of memory (CUDA runtime, cuBLAS, cuDNN,
//! NCCL, MPS, host RAM, legacy THC).
//!
//! A message is assembled from its first line plus the lines a hard wrap
//! pushed down (joined without a separator, so a number cut by the wrap is
//! whole again), and every figure is read with a pattern that needs its unit
//! complete: a message cut off yields the figures it holds and no others.

mod malloc_async;
mod message;
mod native;
mod non_allocator;
mod patterns;

use super::scan::Found;
use crate::evidence::{DeviceKind, OomSource};
pub use malloc_async::malloc_async;
use message::hit_line;
use native::allocator;
pub use native::tried_to_allocate;
use non_allocator::non_allocator;
pub use non_allocator::{Library, device_error, library};
use patterns::{
    LEAD_ALLOCATOR, LEAD_MPS, LEAD_NCCL, LEAD_RETYPED, LEAD_RUNTIME, LEAD_THC, LEAD_THC_CHECK,
};

/// The device kind a message's first word names ("CUDA", "HIP", "XPU").
fn device_of(word: &str) -> DeviceKind {
    match word {
        "HIP" => DeviceKind::Hip,
        "XPU" => DeviceKind::Xpu,
        _ => DeviceKind::Cuda,
    }
}

/// A hit on "out of memory": decides who ran out from the words before it.
pub fn out_of_memory(data: &[u8], hit: usize, input: &str) -> Option<Found> {
    const ANCHOR: &[u8] = b"out of memory";
    let line = hit_line(data, hit, ANCHOR.len(), ANCHOR);
    let before = line.before.clone();
    let exact = LEAD_ALLOCATOR.captures(&before);
    if let Some(m) = exact.as_ref().or(LEAD_RETYPED.captures(&before).as_ref()) {
        let lead = m.get(1)?;
        let device = device_of(&lead.as_str().to_ascii_uppercase());
        let after = line.after.as_str();
        // "CUDA out of memory." (or cut right there); prose like "CUDA out of memory errors" is not PyTorch's.
        let rest = after.get(ANCHOR.len()..).unwrap_or("");
        let plain = rest.is_empty() || rest.starts_with('.');
        if !plain && !rest.starts_with([':', ',']) {
            return None;
        }
        let at = lead.start();
        let found = allocator(data, line, at, device, input, &before[..at]);
        // A head retyped by hand ("Cuda out of memory:") counts when its figures follow.
        if (exact.is_none() || !plain) && found.obs.requested_bytes.is_none() {
            return None;
        }
        return Some(found);
    }
    let (source, lead) = if let Some(m) = LEAD_RUNTIME.captures(&before) {
        let device = if m.get(1)?.as_str() == "HIP" {
            DeviceKind::Hip
        } else {
            DeviceKind::Cuda
        };
        ((OomSource::CudaRuntime, Some(device)), m.get(0)?.start())
    } else if let Some(m) = LEAD_NCCL.find(&before) {
        (
            (OomSource::Nccl, Some(DeviceKind::Cuda)),
            nccl_start(&before, m.start()),
        )
    } else if let Some(m) = LEAD_MPS.find(&before) {
        ((OomSource::Mps, Some(DeviceKind::Mps)), m.start())
    } else if let Some(m) = LEAD_THC.find(&before) {
        ((OomSource::LegacyThc, Some(DeviceKind::Cuda)), m.start())
    } else if let Some(c) = LEAD_THC_CHECK.captures(&before) {
        // The raise that follows the check names the same place: it is the report.
        if thc_raised_later(data, hit, c.get(1)?.as_str(), c.get(2)?.as_str()) {
            return None;
        }
        (
            (OomSource::LegacyThc, Some(DeviceKind::Cuda)),
            c.get(0)?.start(),
        )
    } else {
        return None;
    };
    Some(non_allocator(data, line, lead, source, input))
}

/// Whether "cuda runtime error (2) : out of memory at FILE:LINE" follows a
/// THCudaCheck line for FILE and LINE (THCudaCheck prints the check, then
/// raises; a traceback may stand between).
fn thc_raised_later(data: &[u8], hit: usize, file: &str, line: &str) -> bool {
    const RAISE: &[u8] = b"cuda runtime error (2) : out of memory at ";
    let window = &data[hit..data.len().min(hit + 64 * 1024)];
    let place = format!("{file}:{line}");
    memchr::memmem::find_iter(window, RAISE).any(|at| {
        window[at + RAISE.len()..]
            .strip_prefix(place.as_bytes())
            .is_some_and(|rest| !rest.first().is_some_and(u8::is_ascii_digit))
    })
}

/// NCCL prints "NCCL WARN Cuda failure 'out of memory'"; start at "NCCL" when it is there.
fn nccl_start(before: &str, lead: usize) -> usize {
    before[..lead].rfind("NCCL").unwrap_or(lead)
}
