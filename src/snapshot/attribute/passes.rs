//! One read of a trace feeds the attribution and a scan: on this thread,
//! or, for a long trace, the attribution on a second one handed the
//! entries in batches while the scan stays beside the reading.

use super::{Attributor, Lives, index32};
use crate::snapshot::model::{ModelError, TraceEntry};
use crate::snapshot::trace_metrics::{Feed, StepScan};

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

impl Lives {
    /// A batch's entries in order, the first entry `i`, [`WARM`] at a time
    /// after their addresses are looked up ([`Lives::warm`]).
    fn batch(&mut self, mut i: usize, batch: &[(u32, TraceEntry)]) {
        for window in batch.chunks(WARM) {
            self.warm(window);
            for (_, e) in window {
                self.entry(i, e);
                i += 1;
            }
        }
    }
}

/// Entries whose addresses are looked up together before they are fed.
const WARM: usize = 16;

/// Where a trace's passes are fed: on this thread, entry by entry, or the
/// attribution's [`Lives`] on a thread of its own, in batches of the entries this
/// thread has read ([`Batches`]), the scan here. Reading an entry out of the
/// decoded pickle costs about what the scan costs, and the attribution (an
/// address lookup per entry) about both: with the scan on the second thread
/// too, this one waited on it for 60 % of the trace pass (`parse` of a
/// 185 MB snapshot, BENCHMARKS.md, issue 33).
pub(crate) enum Feeding<'t, 's, 'a, S> {
    Inline(Box<Passes<'s, 'a, S>>),
    Thread {
        scan: Option<S>,
        /// The attribution, its lives away on the worker.
        fills: Box<Attributor<'s, 'a>>,
        batches: Batches<'t>,
    },
}

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
        let Passes { scan, mut fills } = passes;
        let fed = std::mem::replace(&mut fills.fed, Lives::new(0, None));
        Feeding::Thread {
            scan,
            fills: Box::new(fills),
            batches: Batches::spawn(threads, fed, None, None),
        }
    }

    pub(crate) fn entry(&mut self, i: usize, e: &TraceEntry) {
        match self {
            Feeding::Inline(a) => a.entry(i, e),
            Feeding::Thread { scan, batches, .. } => {
                if let Some(scan) = scan {
                    scan.entry(i, e);
                }
                batches.entry(index32(i), e.clone());
            }
        }
    }

    pub(crate) fn finish(self, device: u32) -> Result<Passes<'s, 'a, S>, ModelError> {
        match self {
            Feeding::Inline(p) => Ok(*p),
            Feeding::Thread {
                scan,
                mut fills,
                batches,
            } => {
                fills.fed = batches
                    .finish()
                    .ok_or_else(|| ModelError {
                        path: format!("device_traces[{device}]"),
                        problem: "its attribution failed".to_string(),
                    })?
                    .lives;
                Ok(Passes {
                    scan,
                    fills: *fills,
                })
            }
        }
    }
}

/// A thread that feeds a trace's [`Lives`], and its [`StepScan`] when it is
/// given one, the entries handed to it in batches (each entry is read once;
/// the batches' buffers go back and forth). Each entry comes with a number,
/// its dict's arena id, which the thread keeps in order when asked to
/// ([`Fed::ids`]).
pub(crate) struct Batches<'t> {
    batch: Vec<(u32, TraceEntry)>,
    full: std::sync::mpsc::SyncSender<Vec<(u32, TraceEntry)>>,
    empty: std::sync::mpsc::Receiver<Vec<(u32, TraceEntry)>>,
    worker: std::thread::ScopedJoinHandle<'t, Fed>,
}

/// What a [`Batches`] thread fed.
pub(crate) struct Fed {
    pub(crate) lives: Lives,
    pub(crate) steps: Option<StepScan>,
    /// The entries' numbers, in order (empty unless asked for).
    pub(crate) ids: Vec<u32>,
}

/// Entries handed to the attribution's thread at a time.
const FEED_BATCH: usize = 4096;

impl<'t> Batches<'t> {
    /// `ids`: room for the entries' numbers, or `None` not to keep them.
    pub(crate) fn spawn(
        threads: &'t std::thread::Scope<'t, '_>,
        lives: Lives,
        steps: Option<StepScan>,
        ids: Option<Vec<u32>>,
    ) -> Self {
        // Two batches in flight: one being read here, one fed there.
        let (full, batches) = std::sync::mpsc::sync_channel::<Vec<(u32, TraceEntry)>>(2);
        let (back, empty) = std::sync::mpsc::channel();
        let keep = ids.is_some();
        let mut fed = Fed {
            lives,
            steps,
            ids: ids.unwrap_or_default(),
        };
        let worker = threads.spawn(move || {
            let mut i = 0;
            for mut batch in batches {
                if let Some(steps) = &mut fed.steps {
                    for (k, (_, e)) in batch.iter().enumerate() {
                        steps.entry(i + k, e);
                    }
                }
                if keep {
                    fed.ids.extend(batch.iter().map(|&(id, _)| id));
                }
                fed.lives.batch(i, &batch);
                i += batch.len();
                batch.clear();
                // This side may have stopped early (an error): nothing to hand back to.
                let _ = back.send(batch);
            }
            fed
        });
        Batches {
            batch: Vec::with_capacity(FEED_BATCH),
            full,
            empty,
            worker,
        }
    }

    /// The next entry, numbered `id`. Inlined, so an entry read just before
    /// is written straight into the batch (called apart, the copy of a
    /// freshly written entry stalled on store forwarding: 18 % of the
    /// decoding thread's samples in `top` of the 1 M-entry tiled snapshot).
    #[inline(always)]
    pub(crate) fn entry(&mut self, id: u32, e: TraceEntry) {
        self.batch.push((id, e));
        if self.batch.len() == FEED_BATCH {
            self.send();
        }
    }

    #[cold]
    #[inline(never)]
    fn send(&mut self) {
        let next = self
            .empty
            .try_recv()
            .unwrap_or_else(|_| Vec::with_capacity(FEED_BATCH));
        // A send fails only when the worker is gone (it panicked): finish says so.
        let _ = self.full.send(std::mem::replace(&mut self.batch, next));
    }

    /// What the thread fed, once it has every entry; `None` when it failed.
    pub(crate) fn finish(self) -> Option<Fed> {
        if !self.batch.is_empty() {
            let _ = self.full.send(self.batch);
        }
        drop(self.full);
        self.worker.join().ok()
    }
}

/// Trace entries from which a device's trace is attributed on a second
/// thread (below, the thread would cost more than it saves).
const THREADED_TRACE: usize = 100_000;

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::allocator::CachingAllocator;
    use crate::device::sim::SimDevice;
    use crate::snapshot::Snapshot;
    use crate::snapshot::attribute::Ask;
    use crate::snapshot::trace_metrics::TraceScan;

    /// A recorded snapshot of about 30 000 trace entries (several feeding
    /// batches), from random allocations and frees on a simulated card.
    pub(in crate::snapshot::attribute) fn recorded() -> Vec<u8> {
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
