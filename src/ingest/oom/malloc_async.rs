//! The cudaMallocAsync backend's message, and its short form cut at device 0's NUL byte.

use super::message::{
    COMFY_LOG, Ending, Message, OOM_CLASSES, comfy_fold, gather, hit_line, oom_observation,
};
use super::patterns::{
    ASYNC_ALLOCATED, ASYNC_DEVICE, ASYNC_EXCEED, ASYNC_FRACTION, ASYNC_FREE, ASYNC_LIMIT,
    ASYNC_REQUESTED, index, size,
};
use crate::evidence::{Backend, DeviceKind};
use crate::ingest::scan::Found;
use crate::ingest::text::{clean, line_start};
use regex::Regex;
use std::sync::LazyLock;

/// "Allocation on device N would exceed allowed memory. (out of memory)" and
/// its lines: the cudaMallocAsync backend. The hit is on its head or, when a
/// wrap split the head, on "would exceed allowed memory".
pub fn malloc_async(data: &[u8], hit: usize, input: &str) -> Option<Found> {
    const HEAD: &str = "Allocation on device";
    let on_head = data[hit..].starts_with(HEAD.as_bytes());
    let anchor_len = if on_head {
        HEAD.len()
    } else {
        "would exceed allowed memory".len()
    };
    let line = hit_line(data, hit, anchor_len, HEAD.as_bytes());
    let lead = if on_head {
        line.before.len()
    } else {
        line.before.rfind(HEAD)?
    };
    let before = line.before[..lead].to_owned();
    // Nothing after the head on its line: the short form, unless a wrap moved the rest down.
    let bare = on_head && line.after[HEAD.len()..].trim().is_empty();
    let line_end = line.bound;
    let complete = |t: &str| ASYNC_FRACTION.is_match(t);
    let ending = Ending {
        complete: &complete,
        resume: None,
    };
    let (msg, first_len) = gather(data, line, lead, &ending);
    let t = msg.text.as_str();
    if !ASYNC_EXCEED.is_match(t) {
        return async_short_form(data, input, &before, msg, line_end).filter(|_| bare);
    }
    let mut obs = oom_observation(data, input, &before, &msg);
    obs.device_kind = Some(DeviceKind::Cuda);
    obs.backend = Some(Backend::CudaMallocAsync);
    obs.format_era = Some("cudaMallocAsync".to_owned());
    obs.truncated = !complete(t);
    obs.device_index = index(&ASYNC_DEVICE, t);
    obs.allocated_bytes = size(&ASYNC_ALLOCATED, t);
    obs.requested_bytes = size(&ASYNC_REQUESTED, t);
    obs.total_capacity_bytes = size(&ASYNC_LIMIT, t);
    obs.free_bytes = size(&ASYNC_FREE, t);
    // Without a fraction the limit is SIZE_MAX ("17179869184.00 GiB"): no cap was set.
    obs.allowed_bytes = size(&ASYNC_FRACTION, t).filter(|&b| b < 1 << 60);
    obs.message = Some(msg.first_line(first_len));
    Some(comfy_fold(
        data,
        Found {
            obs,
            start: msg.start,
            end: msg.end,
        },
        &msg.prefix,
    ))
}

/// "Allocation on device " and nothing more: cudaMallocAsync streams the device
/// index, a `c10::DeviceIndex` (int8_t), as a character, so device 0 is a NUL
/// byte that ends the message when Python turns it into a string (pytorch#168369,
/// the native allocator's twin was pytorch#123984). No figures survive; it counts
/// only where its class, or ComfyUI's log line or error report, introduces it.
fn async_short_form(
    data: &[u8],
    input: &str,
    before: &str,
    msg: Message,
    line_end: usize,
) -> Option<Found> {
    static REPORT_TYPE: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"Exception Type:\**\s*([A-Za-z_][\w.]*OutOfMemoryError)").unwrap()
    });
    let lead_in = before.trim_end();
    let mut obs = oom_observation(data, input, before, &msg);
    let introduced = obs
        .exception
        .as_deref()
        .is_some_and(|e| OOM_CLASSES.contains(&e));
    if lead_in.ends_with("**Exception Message:**") && msg.start > 0 {
        // ComfyUI's error report names the class on the line above.
        let prev = clean(&data[line_start(data, msg.start - 1)..msg.start - 1]);
        obs.exception = Some(REPORT_TYPE.captures(&prev)?.get(1)?.as_str().to_owned());
    } else if !introduced && !lead_in.ends_with(COMFY_LOG) {
        return None;
    }
    obs.device_kind = Some(DeviceKind::Cuda);
    obs.backend = Some(Backend::CudaMallocAsync);
    obs.format_era = Some("cudaMallocAsync".to_owned());
    obs.truncated = true;
    obs.message = Some("Allocation on device".to_owned());
    let found = Found {
        obs,
        start: msg.start,
        end: line_end,
    };
    Some(comfy_fold(data, found, &msg.prefix))
}
