//! One read of a trace feeds the attribution and a scan: on this thread,
//! or, for a long trace, the attribution on a second one handed the
//! entries in batches while the scan stays beside the reading.

use super::Attributor;
use crate::snapshot::model::{ModelError, TraceEntry};
use crate::snapshot::trace_metrics::Feed;

/// What one read of a trace feeds: a scan (the trace metrics, or the steps
/// alone; when there is one) and the attribution.
pub(crate) struct Passes<'s, 'a, S> {
    pub scan: Option<S>,
    pub fills: Attributor<'s, 'a>,
}

impl<S: Feed> Passes<'_, '_, S> {
    fn entry(&mut self, i: usize, e: &TraceEntry) {
        if let Some(scan) = &mut self.scan {
            scan.entry(i, e);
        }
        self.fills.entry(i, e);
    }
}

impl Attributor<'_, '_> {
    /// A batch's entries in order, [`WARM`] at a time after their addresses
    /// are looked up ([`Attributor::warm`]).
    fn batch(&mut self, batch: &[(usize, TraceEntry)]) {
        for window in batch.chunks(WARM) {
            self.warm(window);
            for (i, e) in window {
                self.entry(*i, e);
            }
        }
    }
}

/// Entries whose addresses are looked up together before they are fed.
const WARM: usize = 16;

/// Where a trace's passes are fed: on this thread, entry by entry, or the
/// attribution on a thread of its own, in batches of the entries this
/// thread has read (each entry is decoded once; the batches' buffers go back
/// and forth), the scan here. Reading an entry out of the decoded pickle
/// costs about what the scan costs, and the attribution (an address lookup
/// per entry) about both: with the scan on the second thread too, this one
/// waited on it for 60 % of the trace pass (`parse` of a 185 MB snapshot,
/// BENCHMARKS.md, issue 33).
pub(crate) enum Feeding<'t, 's, 'a, S> {
    Inline(Box<Passes<'s, 'a, S>>),
    Thread {
        scan: Option<S>,
        batch: Vec<(usize, TraceEntry)>,
        full: std::sync::mpsc::SyncSender<Vec<(usize, TraceEntry)>>,
        empty: std::sync::mpsc::Receiver<Vec<(usize, TraceEntry)>>,
        worker: std::thread::ScopedJoinHandle<'t, Attributor<'s, 'a>>,
    },
}

/// Entries handed to the attribution's thread at a time.
const FEED_BATCH: usize = 4096;

impl<'t, 's, 'a, S: Feed> Feeding<'t, 's, 'a, S> {
    /// Inline for a short trace; a trace of [`THREADED_TRACE`] entries or
    /// more is fed on a thread of `threads`.
    pub(crate) fn new(
        threads: &'t std::thread::Scope<'t, '_>,
        passes: Passes<'s, 'a, S>,
        entries: usize,
    ) -> Self
    where
        's: 't,
    {
        if entries < THREADED_TRACE {
            return Feeding::Inline(Box::new(passes));
        }
        // Two batches in flight: one being read here, one fed there.
        let (full, batches) = std::sync::mpsc::sync_channel::<Vec<(usize, TraceEntry)>>(2);
        let (back, empty) = std::sync::mpsc::channel();
        let Passes { scan, fills } = passes;
        let worker = threads.spawn(move || {
            let mut fills = fills;
            for mut batch in batches {
                fills.batch(&batch);
                batch.clear();
                // This side may have stopped early (an error): nothing to hand back to.
                let _ = back.send(batch);
            }
            fills.settle();
            fills
        });
        Feeding::Thread {
            scan,
            batch: Vec::with_capacity(FEED_BATCH),
            full,
            empty,
            worker,
        }
    }

    pub(crate) fn entry(&mut self, i: usize, e: &TraceEntry) {
        match self {
            Feeding::Inline(a) => a.entry(i, e),
            Feeding::Thread {
                scan,
                batch,
                full,
                empty,
                ..
            } => {
                if let Some(scan) = scan {
                    scan.entry(i, e);
                }
                batch.push((i, e.clone()));
                if batch.len() == FEED_BATCH {
                    let next = empty
                        .try_recv()
                        .unwrap_or_else(|_| Vec::with_capacity(FEED_BATCH));
                    // A send fails only when the worker is gone (it panicked): join says so.
                    let _ = full.send(std::mem::replace(batch, next));
                }
            }
        }
    }

    pub(crate) fn finish(self, device: u32) -> Result<Passes<'s, 'a, S>, ModelError> {
        match self {
            Feeding::Inline(p) => Ok(*p),
            Feeding::Thread {
                scan,
                batch,
                full,
                worker,
                ..
            } => {
                if !batch.is_empty() {
                    let _ = full.send(batch);
                }
                drop(full);
                let fills = worker.join().map_err(|_| ModelError {
                    path: format!("device_traces[{device}]"),
                    problem: "its attribution failed".to_string(),
                })?;
                Ok(Passes { scan, fills })
            }
        }
    }
}

/// Trace entries from which a device's trace is attributed on a second
/// thread (below, the thread would cost more than it saves).
const THREADED_TRACE: usize = 100_000;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocator::CachingAllocator;
    use crate::device::sim::SimDevice;
    use crate::snapshot::Snapshot;
    use crate::snapshot::attribute::Ask;
    use crate::snapshot::trace_metrics::TraceScan;

    /// A recorded snapshot of about 30 000 trace entries (several feeding
    /// batches), from random allocations and frees on a simulated card.
    fn recorded() -> Vec<u8> {
        let mut a = CachingAllocator::new(Default::default(), SimDevice::new(8 << 30));
        a.record_history();
        let (mut live, mut x) = (Vec::new(), 0x9e37_79b9_7f4a_7c15u64);
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if live.len() < 8 || (live.len() < 200 && x % 2 == 0) {
                let most = if x % 3 == 0 { 1 << 20 } else { 24 << 20 };
                live.push(a.malloc(1 + (x >> 8) % most, 0).unwrap());
            } else {
                a.free(live.swap_remove((x >> 20) as usize % live.len()))
                    .unwrap();
            }
        }
        let trace = a.take_trace();
        let written =
            crate::snapshot::writer::Snapshot::from_allocator(&a.segments(), &trace, None);
        crate::snapshot::writer::to_bytes(&written)
    }

    /// Feeds `snap`'s trace with `entries` as the trace length `Feeding`
    /// is told: 0 feeds here, `usize::MAX` on a second thread.
    fn fed<'s, 'a>(
        snap: &'s Snapshot<'a>,
        passes: Passes<'s, 'a, TraceScan<'s, 'a>>,
        entries: usize,
    ) -> Passes<'s, 'a, TraceScan<'s, 'a>> {
        std::thread::scope(|threads| {
            let mut feeding = Feeding::new(threads, passes, entries);
            assert_eq!(matches!(feeding, Feeding::Inline(_)), entries == 0);
            for (i, e) in snap.trace(0).enumerate() {
                feeding.entry(i, &e.unwrap());
            }
            feeding.finish(0).unwrap()
        })
    }

    /// The scan and the attribution come out the same whether the
    /// attribution is fed on a second thread (the scan staying on the
    /// reading one) or both here: the whole attribution and the peak alone.
    #[test]
    fn feeding_on_a_second_thread_gives_what_feeding_here_gives() {
        let bytes = recorded();
        let snap = crate::snapshot::load("t.pickle", &bytes).unwrap();
        assert!(snap.trace_len(0) > 3 * FEED_BATCH, "{}", snap.trace_len(0));
        let settings = crate::snapshot::evidence::recorded_settings(&snap);
        let whole = |entries| {
            let passes = Passes {
                scan: Some(TraceScan::new(&snap, 0, settings.clone())),
                fills: Attributor::new(&snap, 0, settings.clone(), Ask::default()),
            };
            let p = fed(&snap, passes, entries);
            let (metrics, steps) = p.scan.unwrap().finish_with_steps();
            (metrics, p.fills.finish(&steps))
        };
        let (here, there) = (whole(0), whole(usize::MAX));
        assert!(here.0.peak.allocated_bytes > 0);
        assert_eq!(here, there);
        let peak = |entries| {
            let passes = Passes {
                scan: None,
                fills: Attributor::peak_only(&snap, 0),
            };
            fed(&snap, passes, entries).fills.peak_event_index()
        };
        assert_eq!(peak(0), peak(usize::MAX));
        assert!(peak(0).is_some());
    }
}
