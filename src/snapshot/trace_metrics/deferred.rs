//! Frees deferred by other streams: each request until its completion, per stream.

use super::{StreamDeferred, TraceScan};
use crate::snapshot::model::Frames;

/// A free request waiting for its completion.
#[derive(Clone, Copy)]
pub(super) struct Request {
    pub(super) addr: u64,
    pub(super) size: u64,
    pub(super) stream: u64,
    pub(super) time_us: i64,
    pub(super) index: usize,
    pub(super) frames: Frames,
}

impl<'s, 'a> TraceScan<'s, 'a> {
    /// A request that did not complete at once: it waits for other streams.
    pub(super) fn defer(&mut self, r: Request) {
        let k = self.stream_slot(r.stream);
        if let (Some(d), Some(w)) = (self.m.deferred.get_mut(k), self.waiting_bytes.get_mut(k)) {
            d.frees += 1;
            d.bytes = d.bytes.saturating_add(r.size);
            *w = w.saturating_add(r.size);
            d.peak_bytes = d.peak_bytes.max(*w);
        }
        let site = self.deferred_sites.entry(r.frames).or_default();
        *site = (site.0 + 1, site.1.saturating_add(r.size));
        self.waiting.insert(r.addr, r);
    }

    fn stream_slot(&mut self, stream: u64) -> usize {
        let next = self.m.deferred.len();
        let k = *self.streams.entry(stream).or_insert(next);
        if k == next {
            self.m.deferred.push(StreamDeferred {
                stream,
                ..StreamDeferred::default()
            });
            self.waiting_bytes.push(0);
        }
        k
    }

    /// A deferred request completed at entry `i` (or is still waiting at the end).
    pub(super) fn complete(&mut self, r: &Request, i: usize, time_us: i64) {
        let k = self.stream_slot(r.stream);
        if let (Some(d), Some(w)) = (self.m.deferred.get_mut(k), self.waiting_bytes.get_mut(k)) {
            *w = w.saturating_sub(r.size);
            let held = if r.time_us != 0 && time_us >= r.time_us {
                time_us.abs_diff(r.time_us)
            } else {
                0
            };
            d.held_us = d.held_us.saturating_add(held);
            d.max_held_us = d.max_held_us.max(held);
            d.held_entries = d.held_entries.saturating_add((i - r.index) as u64);
        }
    }
}
