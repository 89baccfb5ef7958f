//! One read of a trace feeds the attribution and a scan: on this thread,
//! or, for a long trace, on a second one handed the entries in batches.

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

    /// A batch's entries in order, [`WARM`] at a time after their addresses
    /// are looked up ([`Attributor::warm`]).
    fn batch(&mut self, batch: &[(usize, TraceEntry)]) {
        for window in batch.chunks(WARM) {
            self.fills.warm(window);
            for (i, e) in window {
                self.entry(*i, e);
            }
        }
    }
}

/// Entries whose addresses are looked up together before they are fed.
const WARM: usize = 16;

/// Where a trace's passes are fed: on this thread, entry by entry, or on a
/// thread of their own, in batches of the entries this thread has read
/// (each entry is decoded once; the batches' buffers go back and forth).
/// Reading an entry out of the decoded pickle costs about what the passes
/// cost, so this thread only reads.
pub(crate) enum Feeding<'t, 's, 'a, S> {
    Inline(Box<Passes<'s, 'a, S>>),
    Thread {
        batch: Vec<(usize, TraceEntry)>,
        full: std::sync::mpsc::SyncSender<Vec<(usize, TraceEntry)>>,
        empty: std::sync::mpsc::Receiver<Vec<(usize, TraceEntry)>>,
        worker: std::thread::ScopedJoinHandle<'t, Passes<'s, 'a, S>>,
    },
}

/// Entries handed to the passes' thread at a time.
const FEED_BATCH: usize = 4096;

impl<'t, 's, 'a, S: Feed + Send + 's> Feeding<'t, 's, 'a, S> {
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
        let worker = threads.spawn(move || {
            let mut passes = passes;
            for mut batch in batches {
                passes.batch(&batch);
                batch.clear();
                // This side may have stopped early (an error): nothing to hand back to.
                let _ = back.send(batch);
            }
            passes.fills.settle();
            passes
        });
        Feeding::Thread {
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
                batch, full, empty, ..
            } => {
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
                batch,
                full,
                worker,
                ..
            } => {
                if !batch.is_empty() {
                    let _ = full.send(batch);
                }
                drop(full);
                worker.join().map_err(|_| ModelError {
                    path: format!("device_traces[{device}]"),
                    problem: "its attribution or step scan failed".to_string(),
                })
            }
        }
    }
}

/// Trace entries from which a device's trace is attributed on a second
/// thread (below, the thread would cost more than it saves).
const THREADED_TRACE: usize = 100_000;
