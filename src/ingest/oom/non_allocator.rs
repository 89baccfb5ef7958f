//! What runs out of memory outside the caching allocator (cuBLAS, cuDNN, the host, Level
//! Zero, CUDA runtime, NCCL, MPS, THC), and device errors that are not out of memory.

use super::message::{Ending, HitLine, MESSAGE_CHARS, gather, hit_line};
use super::patterns::{HOST_REQUESTED, MPS_ALLOCATED, MPS_ALLOWED, MPS_OTHER, MPS_REQUESTED, size};
use crate::evidence::{DeviceKind, Kind, Observation, OomSource};
use crate::ingest::scan::Found;
use crate::ingest::text;

/// Which library a non-allocator anchor names.
#[derive(Debug, Clone, Copy)]
pub enum Library {
    Cublas,
    Cudnn,
    Host,
    LevelZero,
}

/// cuBLAS/cuDNN status codes, the host allocator, Level Zero.
pub fn library(
    data: &[u8],
    hit: usize,
    anchor_len: usize,
    lib: Library,
    input: &str,
) -> Option<Found> {
    let line = hit_line(data, hit, anchor_len, b"\n");
    let before = line.before.as_str();
    // "$ Torch: " is TH's THError prefix (THAlloc, before the c10 CPU allocator).
    let th = before.trim_end().strip_suffix("$ Torch:").map(str::len);
    if matches!(lib, Library::Host) && th.is_none() && !before.trim_end().ends_with("CPUAllocator:")
    {
        return None;
    }
    // Start after the exception class when it is close to the anchor, else at TH's prefix.
    let lead = text::exception_in(before)
        .filter(|&(_, _, end)| before.len() - end <= 80)
        .map(|(_, _, end)| end)
        .or(th)
        .unwrap_or(before.len());
    let lead = before.len() - before[lead..].trim_start().len();
    let source = match lib {
        Library::Cublas => (OomSource::Cublas, Some(DeviceKind::Cuda)),
        Library::Cudnn => (OomSource::Cudnn, Some(DeviceKind::Cuda)),
        Library::Host => (OomSource::Host, None),
        Library::LevelZero => (OomSource::Xpu, Some(DeviceKind::Xpu)),
    };
    Some(non_allocator(data, line, lead, source, input))
}

/// A device error that is not out of memory, on the line of `hit`:
/// vLLM's CuMemAllocator prints `CUDA Error: invalid argument at
/// …/cumem_allocator.cpp:278` (its `CUDA_CHECK`, hipified on ROCm with the
/// same words), PyTorch raises `CUDA error: …` / `HIP error: …`
/// (`C10_CUDA_CHECK`).
pub fn device_error(data: &[u8], hit: usize, input: &str) -> Option<Found> {
    let line = hit_line(data, hit, 0, b"\n");
    // A cut line may be the head of a memory failure (`CUDA error: CUB…`).
    if data.get(line.bound) != Some(&b'\n') {
        return None;
    }
    let text = line.after.trim();
    let what = text.split_once(": ").map_or("", |(_, w)| w.trim());
    // Memory failures (`CUDA error: out of memory`, `CUDA error:
    // CUBLAS_STATUS_ALLOC_FAILED …`) are the other parsers' to read.
    let lower = text.to_ascii_lowercase();
    if what.is_empty()
        || ["out of memory", "alloc_failed", "out_of_device_memory"]
            .iter()
            .any(|m| lower.contains(m))
    {
        return None;
    }
    let mut obs = Observation::new(Kind::DeviceError, input);
    // vLLM's hipified build on ROCm still says "CUDA Error": only PyTorch's
    // "HIP error" names the device kind.
    obs.device_kind = text.starts_with("HIP").then_some(DeviceKind::Hip);
    obs.message = Some(text::head(text, MESSAGE_CHARS));
    Some(Found {
        obs,
        start: hit,
        end: line.bound,
    })
}

pub(super) fn non_allocator(
    data: &[u8],
    line: HitLine,
    lead: usize,
    (source, device): (OomSource, Option<DeviceKind>),
    input: &str,
) -> Found {
    let before = line.before.clone();
    // The exception class sits right before the lead ("RuntimeError: CUDA error: …").
    let exception = text::exception_in(&before[..lead]).filter(|&(_, _, end)| lead - end <= 2);
    let prefix_end = exception.as_ref().map_or(lead, |&(_, start, _)| start);
    // MPS and host messages may wrap; the others are one line.
    let complete = |t: &str| match source {
        OomSource::Mps => t.contains("system failure)"),
        OomSource::Host => HOST_REQUESTED.is_match(t),
        _ => true,
    };
    let ending = Ending {
        complete: &complete,
        resume: None,
    };
    let (msg, first_len) = gather(data, line, lead, &ending);
    let t = msg.text.as_str();
    let mut obs = Observation::new(Kind::NonAllocatorOom, input);
    obs.exception = exception.map(|(e, _, _)| e);
    obs.rank = text::rank_in(&before[..prefix_end]);
    obs.source = Some(source);
    obs.device_kind = device;
    match source {
        OomSource::Mps => {
            obs.allocated_bytes = size(&MPS_ALLOCATED, t);
            obs.allowed_bytes = size(&MPS_ALLOWED, t);
            obs.other_allocations_bytes = size(&MPS_OTHER, t);
            obs.requested_bytes = size(&MPS_REQUESTED, t);
            obs.truncated = !complete(t);
        }
        // THC, the allocator before 1.0 (allocator.md §7.2).
        OomSource::LegacyThc => obs.format_era = Some("pre-1.0".to_owned()),
        OomSource::Host => {
            obs.requested_bytes = HOST_REQUESTED.captures(t).and_then(|c| {
                let n: u64 = c.get(1)?.as_str().parse().ok()?;
                match c.get(2)?.as_str() {
                    // Whole GiB rounded down: "0GB" says only "under 1 GiB".
                    "GB" => n.checked_mul(1 << 30).filter(|&b| b > 0),
                    _ => Some(n),
                }
            });
            obs.truncated = !complete(t);
        }
        _ => {}
    }
    obs.message = Some(msg.first_line(first_len));
    Found {
        obs,
        start: msg.start,
        end: msg.end,
    }
}
