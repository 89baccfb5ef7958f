//! The largest batch that carries a whole run on the card: with two knobs
//! (the first the batch), the run a padded DataLoader makes of per-sample
//! sizes at each batch ([`run::batches`]: the steps get fewer and each one's
//! longest sample longer as the batch grows), replayed whole on the card
//! under one config; doubled until a run runs out of memory, then bisected.

use crate::conf::Settings;
use crate::device::sim::SimDevice;
use crate::workload::run::{self, Memo, RunPlan};
use serde::Serialize;

/// What to build each batch's run from.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchSearch {
    /// Per-sample sizes, in the second knob's unit.
    pub lengths: Vec<u64>,
    /// Steps per run (`None`: one epoch at each batch).
    pub steps: Option<u64>,
    pub seed: u64,
    pub pad_to: u64,
}

impl BatchSearch {
    /// The run at `batch`.
    pub fn run(&self, batch: u64) -> Vec<u64> {
        run::batches(&self.lengths, batch, self.steps, self.seed, self.pad_to)
    }

    /// The largest batch worth searching: every sample in one.
    fn most(&self) -> u64 {
        (self.lengths.len() as u64).max(1)
    }
}

/// The largest batch whose run survives the card under one config.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BatchFit {
    /// `None`: a batch of 1 runs out of memory.
    pub largest: Option<u64>,
    /// That batch's run: its steps and its peak reserved on the card.
    pub steps: usize,
    pub peak_reserved_bytes: Option<u64>,
    /// The batch above it (`None` when every sample in one batch survives)
    /// and the step at which its run runs out of memory.
    pub next_batch: Option<u64>,
    pub next_oom_step: Option<usize>,
    /// Whole runs replayed by the search.
    pub runs: u32,
}

/// One batch's run on the card: its steps, its peak reserved, and the step
/// (1-based) that runs out of memory.
struct Tried {
    steps: usize,
    peak_reserved: u64,
    oom_step: Option<usize>,
}

/// Doubles the batch from 1 until its run runs out of memory on the card
/// (or holds every sample), then bisects between the last that survives and
/// the first that does not. Each run gets its own memo: its steps' sizes
/// depend on the batch, which a memo's key does not hold.
pub(super) fn largest_batch(
    plan: &RunPlan,
    search: &BatchSearch,
    settings: &Settings,
    capacity: u64,
    budget: usize,
) -> BatchFit {
    let mut runs = 0u32;
    let mut tried = |b: u64| {
        runs += 1;
        let steps = search.run(b);
        let r = run::replay(
            &plan.at_batch(b),
            &steps,
            settings,
            SimDevice::new(capacity),
            &mut Memo::new(budget),
            &|_| {},
        );
        Tried {
            steps: steps.len(),
            peak_reserved: r.peak_reserved().0,
            oom_step: r.oom.map(|o| o.step + 1),
        }
    };
    let most = search.most();
    let first = tried(1);
    if first.oom_step.is_some() {
        return BatchFit {
            largest: None,
            steps: 0,
            peak_reserved_bytes: None,
            next_batch: Some(1),
            next_oom_step: first.oom_step,
            runs,
        };
    }
    // `good` survives; `bad` (when found) runs out of memory.
    let (mut good, mut good_run) = (1u64, first);
    let mut bad: Option<(u64, Tried)> = None;
    while bad.is_none() && good < most {
        let b = good.saturating_mul(2).min(most);
        let t = tried(b);
        if t.oom_step.is_some() {
            bad = Some((b, t));
        } else {
            (good, good_run) = (b, t);
        }
    }
    if let Some((mut hi, mut hi_run)) = bad {
        while hi - good > 1 {
            let mid = good + (hi - good) / 2;
            let t = tried(mid);
            if t.oom_step.is_some() {
                (hi, hi_run) = (mid, t);
            } else {
                (good, good_run) = (mid, t);
            }
        }
        bad = Some((hi, hi_run));
    }
    BatchFit {
        largest: Some(good),
        steps: good_run.steps,
        peak_reserved_bytes: Some(good_run.peak_reserved),
        next_batch: bad.as_ref().map(|b| b.0),
        next_oom_step: bad.and_then(|b| b.1.oom_step),
        runs,
    }
}
