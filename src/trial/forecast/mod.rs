//! `forecast`'s decisions: a whole run of steps whose size varies, replayed
//! as one process ([`crate::workload::run`]) under each config, on a card
//! without limit (the peak the cache ratchets to) and on `--capacity` (the
//! step that runs out of memory); the configs ranked as `recommend` ranks
//! them; per config the largest cap on the size under which the run
//! survives the card, by bisection over runs; what strands the memory at the
//! peak; and how far the forecast can be trusted. With two knobs the
//! steps' sizes are the second's values at one batch (the first), and the
//! batch can be searched ([`batch`]): the largest that carries the run.

mod batch;

pub use batch::{BatchFit, BatchSearch};

use super::answer::Strength;
use super::fit::{self, Check, FitInput, Pairing, capacity_matters};
use super::grid as grid_fit;
use super::search::Progress;
use crate::conf::Settings;
use crate::device::NO_LIMIT;
use crate::device::sim::SimDevice;
use crate::snapshot::fit::carry::Leftover;
use crate::workload::predicted;
use crate::workload::replay::DriverWork;
use crate::workload::run::{self, Laws, Memo, Origin, RunPlan, RunReplay};
use crate::workload::{OomEvent, RunFigures};
use rayon::prelude::*;
use serde::Serialize;
use std::sync::atomic::{AtomicUsize, Ordering};

/// What `forecast` is asked.
#[derive(Debug, Clone)]
pub struct ForecastAsk {
    /// The run: each step's size, in order.
    pub steps: Vec<u64>,
    /// Configs, as given and parsed; the defaults first.
    pub confs: Vec<(String, Settings)>,
    pub capacity: Option<u64>,
    /// The cap on the size is a multiple of this.
    pub cap_step: u64,
    /// Bytes the copies of seen states may hold, per config at a time (0:
    /// replay every step).
    pub memo_budget: usize,
    /// With two knobs: their names, the batch first.
    pub knobs: Option<(String, String)>,
    /// With two knobs and a card: the batch to search, over runs built
    /// from per-sample sizes (`steps` is then the run at the batch found).
    pub search: Option<BatchSearch>,
}

/// The whole answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Forecast {
    /// With two knobs: their names, the batch first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub knobs: Option<[String; 2]>,
    /// With two knobs: the batch of the run forecast (with a search, the
    /// largest any config carries).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch: Option<u64>,
    /// The recordings, each at its size or point.
    pub inputs: Vec<FitInput>,
    pub pairing: Vec<Pairing>,
    pub steps: usize,
    pub sizes: RunSizes,
    /// What one step hands to the next beyond what the next frees, in words.
    pub carried: Vec<String>,
    pub capacity_bytes: Option<u64>,
    /// The run's peak of allocated bytes as requested (no config changes it).
    pub peak_allocated_bytes: u64,
    /// Its step, 1-based.
    pub peak_allocated_step: usize,
    /// The largest fresh one-step peak of allocated bytes among the run's
    /// largest sizes (what `fit` says of one step), and its size.
    pub step_peak_allocated_bytes: u64,
    pub step_peak_allocated_size: u64,
    /// Bytes the first step leaves live as state every later step keeps
    /// (optimizer state made at the first step; as recorded), 0 without.
    pub kept_state_bytes: u64,
    /// Allocated memory that grows from step to step: a leak.
    pub leak: Option<Leak>,
    pub configs: Vec<ConfForecast>,
    /// The config to set: the best ranked (`None` when every config runs
    /// out of memory on the card).
    pub recommended: Option<String>,
    /// `likely` when every step's size is one `fit` calls likely.
    pub strength: Strength,
    pub reasons: Vec<String>,
    /// The sizes whose laws are uncertain, and the steps at them.
    pub uncertain_sizes: Vec<u64>,
    pub uncertain_steps: usize,
    pub checks: Vec<Check>,
}

/// The run's sizes at a glance.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunSizes {
    pub distinct: usize,
    pub smallest: u64,
    pub largest: u64,
    /// Steps at the largest size, and the first (1-based).
    pub largest_count: usize,
    pub largest_first_step: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Leak {
    /// Bytes each step of the run (the whole recording) leaves live that
    /// nothing frees, at the largest recorded size that leaks.
    pub bytes_per_step: u64,
    /// Where the leaked memory is allocated, the most bytes first.
    pub sites: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConfForecast {
    pub conf: String,
    /// The run's peak reserved bytes on a card without limit.
    pub peak_reserved_bytes: u64,
    /// Its step, 1-based.
    pub peak_reserved_step: usize,
    /// The run's peak of allocated bytes (requested; as the top level's).
    pub peak_allocated_bytes: u64,
    /// The largest fresh one-step peak among the run's sizes (what `fit`
    /// says of one step), and its size.
    pub step_peak_reserved_bytes: u64,
    pub step_peak_size: u64,
    /// peak_reserved_bytes / step_peak_reserved_bytes.
    pub ratchet: f64,
    /// What the free cached blocks were when reserved memory peaked.
    pub stranded: Option<Stranded>,
    /// On the card of `--capacity` (else without limit): cudaMalloc calls,
    /// cudaFree calls, retries after a failed cudaMalloc.
    pub device_allocs: u64,
    pub device_frees: u64,
    pub alloc_retries: u64,
    /// On the card of `--capacity`: the step that runs out of memory
    /// (`None`: the run survives, or no capacity was given).
    pub oom: Option<ForecastOom>,
    /// With `--capacity`: the run's peak reserved on the card (up to its OOM).
    pub card_peak_reserved_bytes: Option<u64>,
    /// On the card, when the run survives it: the card less the run's peak
    /// reserved there.
    pub margin_bytes: Option<u64>,
    /// Reserved bytes after each step, on a card without limit.
    pub reserved_after_step: Vec<u64>,
    /// With `--capacity`: the largest cap on the size that carries the run.
    pub cap: Option<Cap>,
    /// Steps replayed event by event over every run of this config (the
    /// rest were looked up: the same start state and sizes seen before).
    pub replayed_steps: usize,
    pub strength: Strength,
    /// With a batch search: the largest batch that carries the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch: Option<BatchFit>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ForecastOom {
    /// 1-based.
    pub step: usize,
    pub size: u64,
    pub requested_bytes: u64,
    /// The call site of the request.
    pub site: String,
    /// Whether one step of this size alone, as a fresh process, fits the
    /// card (what a one-step answer, `fit`'s included, says).
    pub fits_alone: bool,
    /// The failing event of the run (the first step's pre-trace allocations
    /// count first).
    pub event_index: u64,
    /// Reserved bytes when it failed.
    pub reserved_bytes: u64,
}

/// The free cached blocks when reserved memory first reached the run's peak,
/// on a card without limit: just before the request that raised it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Stranded {
    /// 1-based.
    pub step: usize,
    pub size: u64,
    /// The request that made the peak (a new segment).
    pub requested_bytes: u64,
    pub site: String,
    pub free_blocks: usize,
    pub free_bytes: u64,
    pub largest_free_bytes: u64,
    /// Free blocks smaller than the request.
    pub smaller_blocks: usize,
    /// The sizes of the largest free blocks, largest first (up to 5).
    pub largest_blocks: Vec<u64>,
}

/// The largest cap on the size under which the run survives the card.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Cap {
    /// The run survives as it is: no cap needed.
    pub needed: bool,
    /// The largest cap found (`None`: not even the smallest size carries it).
    pub size: Option<u64>,
    /// Steps the cap shortens.
    pub steps_capped: usize,
    /// The capped run's peak reserved on the card.
    pub peak_reserved_bytes: Option<u64>,
    /// The next cap up and its step that runs out of memory.
    pub next_size: Option<u64>,
    pub next_oom_step: Option<usize>,
    /// Whole runs the bisection replayed.
    pub runs: u32,
}

/// Where `forecast` is: steps replayed over every config's runs.
fn step_progress(done: &AtomicUsize, total: usize, progress: &(dyn Fn(Progress) + Sync)) {
    let d = done.fetch_add(1, Ordering::Relaxed) + 1;
    if d.is_multiple_of(64) || d == total {
        progress(Progress::Steps {
            done: d.min(total),
            total,
        });
    }
}

/// The memo budget a run of `confs` configs gives each when they run at once.
pub fn memo_budget_per_config(total: usize, confs: usize) -> usize {
    total / confs.clamp(1, rayon::current_num_threads().max(1))
}

/// Forecasts the run under every config; with a batch search, first the
/// largest batch each config carries, then the run at the largest of them.
pub fn forecast(
    plan: &RunPlan,
    ask: &ForecastAsk,
    progress: &(dyn Fn(Progress) + Sync),
) -> Forecast {
    let (Some(search), Some(capacity)) = (&ask.search, ask.capacity) else {
        return forecast_run(plan, ask, progress);
    };
    let budget = memo_budget_per_config(ask.memo_budget, ask.confs.len());
    let fits: Vec<BatchFit> = ask
        .confs
        .par_iter()
        .map(|(_, settings)| batch::largest_batch(plan, search, settings, capacity, budget))
        .collect();
    let best = fits.iter().filter_map(|f| f.largest).max().unwrap_or(1);
    let ask = ForecastAsk {
        steps: search.run(best),
        ..ask.clone()
    };
    let mut out = forecast_run(&plan.at_batch(best), &ask, progress);
    for (c, f) in out.configs.iter_mut().zip(fits) {
        c.batch = Some(f);
    }
    out
}

/// Forecasts the run of `ask.steps` under every config.
fn forecast_run(
    plan: &RunPlan,
    ask: &ForecastAsk,
    progress: &(dyn Fn(Progress) + Sync),
) -> Forecast {
    let series = plan.series;
    let (checks, inputs, pairing, batch) = match &plan.laws {
        Laws::One(_) => (
            fit::checks(series),
            fit::inputs(series),
            fit::pairing(series),
            None,
        ),
        Laws::Two { grid, batch, .. } => (
            grid_fit::checks(grid),
            grid_fit::inputs(grid),
            grid_fit::pairing(grid),
            Some(*batch),
        ),
    };
    let (peak_allocated, peak_allocated_step) = run::allocated_peak(plan, &ask.steps);
    let sizes = run_sizes(&ask.steps);
    let (reasons_, uncertain_sizes, uncertain_steps) = uncertainty(plan, ask, &checks);
    let runs_per_conf = if ask.capacity.is_some() { 2 } else { 1 };
    let total = ask.steps.len() * ask.confs.len() * runs_per_conf;
    let done = AtomicUsize::new(0);
    let tick = |_: usize| step_progress(&done, total, progress);
    let budget = memo_budget_per_config(ask.memo_budget, ask.confs.len());
    let strength = Strength::of_reasons(&reasons_);
    let largest_sizes = largest_sizes(&ask.steps);
    let step_allocated = largest_sizes
        .iter()
        .map(|&z| (plan.peak_allocated_at(z), z))
        .max_by_key(|&(p, z)| (p, std::cmp::Reverse(z)))
        .unwrap_or((0, 0));
    let mut configs: Vec<(ConfForecast, RunFigures)> = ask
        .confs
        .par_iter()
        .map(|(conf, settings)| {
            let mut c = conf_forecast(plan, ask, (conf, settings), budget, &tick);
            c.0.peak_allocated_bytes = peak_allocated;
            c.0.strength = strength;
            let (peak, size) = largest_sizes
                .iter()
                .map(|&z| (fresh_peak(plan, z, settings), z))
                .max_by_key(|&(p, z)| (p, std::cmp::Reverse(z)))
                .unwrap_or((0, 0));
            c.0.step_peak_reserved_bytes = peak;
            c.0.step_peak_size = size;
            c.0.ratchet = c.0.peak_reserved_bytes as f64 / (peak as f64).max(1.0);
            c
        })
        .collect();
    // No line when every config runs out of memory on the card.
    let recommended = configs
        .iter()
        .min_by(|a, b| a.1.rank(&b.1))
        .filter(|c| c.0.oom.is_none())
        .map(|c| c.0.conf.clone());
    Forecast {
        knobs: ask.knobs.clone().map(|(a, b)| [a, b]),
        batch,
        inputs,
        pairing,
        steps: ask.steps.len(),
        sizes,
        carried: carried(plan),
        capacity_bytes: ask.capacity,
        peak_allocated_bytes: peak_allocated,
        peak_allocated_step: peak_allocated_step + 1,
        step_peak_allocated_bytes: step_allocated.0,
        step_peak_allocated_size: step_allocated.1,
        kept_state_bytes: ask
            .steps
            .first()
            .map(|&z| &plan.carries[plan.recording_for(z)])
            .filter(|c| c.leftover == Leftover::State)
            .map_or(0, |c| c.leftover_bytes),
        leak: leak(plan),
        configs: configs.drain(..).map(|c| c.0).collect(),
        recommended,
        strength,
        reasons: reasons_,
        uncertain_sizes,
        uncertain_steps,
        checks,
    }
}

/// One config: the run without limit, on the card, and the cap.
fn conf_forecast(
    plan: &RunPlan,
    ask: &ForecastAsk,
    (conf, settings): (&str, &Settings),
    budget: usize,
    tick: &(dyn Fn(usize) + Sync),
) -> (ConfForecast, RunFigures) {
    let steps = &ask.steps;
    let mut free_memo = Memo::new(budget);
    let free = run::replay(
        plan,
        steps,
        settings,
        SimDevice::new(NO_LIMIT),
        &mut free_memo,
        tick,
    );
    let (peak_reserved, peak_step) = free.peak_reserved();
    let reserved_after_step = free.steps.iter().map(|s| s.reserved_after).collect();
    let stranded = stranded(plan, steps, settings, &free, &mut free_memo);
    drop(free_memo);
    let mut replayed = free.replayed_steps;
    let mut out = ConfForecast {
        conf: conf.to_string(),
        peak_reserved_bytes: peak_reserved,
        peak_reserved_step: peak_step + 1,
        peak_allocated_bytes: 0,
        step_peak_reserved_bytes: 0,
        step_peak_size: 0,
        ratchet: 0.0,
        stranded,
        device_allocs: 0,
        device_frees: 0,
        alloc_retries: 0,
        oom: None,
        card_peak_reserved_bytes: None,
        margin_bytes: None,
        reserved_after_step: Vec::new(),
        cap: None,
        replayed_steps: 0,
        strength: Strength::Likely,
        batch: None,
    };
    let card = match ask.capacity {
        None => free,
        Some(cap) if peak_reserved <= cap && !capacity_matters(settings) => {
            // A run whose peak stays within the card never meets its limit.
            (0..steps.len()).for_each(|i| tick(i + 1));
            free
        }
        Some(cap) => {
            let mut memo = Memo::new(budget);
            let card = run::replay(plan, steps, settings, SimDevice::new(cap), &mut memo, tick);
            replayed += card.replayed_steps;
            if card.oom.is_some() {
                let (c, runs) = largest_cap(plan, steps, settings, cap, ask.cap_step, &mut memo);
                replayed += runs.1;
                out.cap = Some(Cap { runs: runs.0, ..c });
            } else {
                out.cap = Some(Cap {
                    needed: false,
                    size: steps.iter().max().copied(),
                    steps_capped: 0,
                    peak_reserved_bytes: Some(card.peak_reserved().0),
                    next_size: None,
                    next_oom_step: None,
                    runs: 0,
                });
            }
            card
        }
    };
    if ask.capacity.is_some() && out.cap.is_none() {
        out.cap = Some(Cap {
            needed: false,
            size: steps.iter().max().copied(),
            steps_capped: 0,
            peak_reserved_bytes: Some(card.peak_reserved().0),
            next_size: None,
            next_oom_step: None,
            runs: 0,
        });
    }
    let work = card.work();
    out.device_allocs = work.device_allocs;
    out.device_frees = work.device_frees;
    out.alloc_retries = work.alloc_retries;
    out.reserved_after_step = reserved_after_step;
    out.oom = card.oom.map(|o| {
        let before: u64 = card.steps[..o.step].iter().map(|s| s.events).sum();
        let mut memo = Memo::new(budget);
        let site = site_at(
            plan,
            steps,
            settings,
            ask.capacity.unwrap_or(NO_LIMIT),
            (o.step, o.event),
            &mut memo,
        );
        let size = steps[o.step];
        let alone = predicted_fresh(plan, size, settings, ask.capacity.unwrap_or(NO_LIMIT));
        ForecastOom {
            step: o.step + 1,
            size,
            fits_alone: alone.oom.is_none(),
            requested_bytes: o.requested_bytes,
            site,
            event_index: before + o.event,
            reserved_bytes: card.steps[o.step].reserved_after,
        }
    });
    out.card_peak_reserved_bytes = ask.capacity.map(|_| card.peak_reserved().0);
    if let (Some(cap), None) = (ask.capacity, &out.oom) {
        out.margin_bytes = Some(cap.saturating_sub(card.peak_reserved().0));
    }
    out.replayed_steps = replayed;
    let figures = rank_figures(&card, &out, ask.capacity);
    (out, figures)
}

/// The figures `recommend` ranks by, for the run on the card (or without
/// limit): no OOM, then the lowest peak reserved, then the least driver work.
fn rank_figures(run: &RunReplay, c: &ConfForecast, capacity: Option<u64>) -> RunFigures {
    let work: DriverWork = run.work();
    let events: u64 = run.steps.iter().map(|s| s.events).sum();
    RunFigures {
        oom: c.oom.as_ref().map(|o| OomEvent {
            event_index: o.event_index,
            requested_bytes: o.requested_bytes,
            message: String::new(),
            before_trace: None,
        }),
        events,
        peak_reserved_bytes: run.peak_reserved().0,
        peak_allocated_bytes: run.peak_allocated(),
        device_allocs: work.device_allocs,
        device_frees: work.device_frees,
        alloc_retries: work.alloc_retries,
        synchronizations: work.synchronizations,
        driver_time_us: work.driver_time_us,
        capacity_bytes: capacity.unwrap_or(NO_LIMIT),
        ..RunFigures::default()
    }
}

/// The largest multiple of `step` that, as a cap on every step's size,
/// carries the run on the card: bisection over whole runs, which share one
/// memo (a cap changes only the steps above it). Returns the cap and
/// (runs, steps replayed).
fn largest_cap(
    plan: &RunPlan,
    steps: &[u64],
    settings: &Settings,
    capacity: u64,
    step: u64,
    memo: &mut Memo<SimDevice>,
) -> (Cap, (u32, usize)) {
    let largest = steps.iter().copied().max().unwrap_or(1);
    let smallest = steps.iter().copied().min().unwrap_or(1);
    let mut runs = 0u32;
    let mut replayed = 0usize;
    let mut capped = Vec::with_capacity(steps.len());
    let mut run_at = |n: u64, memo: &mut Memo<SimDevice>| {
        let cap = n.saturating_mul(step);
        capped.clear();
        capped.extend(steps.iter().map(|&z| z.min(cap)));
        runs += 1;
        let r = run::replay(
            plan,
            &capped,
            settings,
            SimDevice::new(capacity),
            memo,
            &|_| {},
        );
        replayed += r.replayed_steps;
        r
    };
    // In steps of `step`: `hi` runs out of memory (the run as it is).
    let hi = largest.div_ceil(step).max(1);
    let mut lo = (smallest / step).max(1);
    let mut fail = None;
    let first = run_at(lo, memo);
    if first.oom.is_some() || lo >= hi {
        let cap = Cap {
            needed: true,
            size: None,
            steps_capped: 0,
            peak_reserved_bytes: None,
            next_size: Some(lo * step),
            next_oom_step: first.oom.map(|o| o.step + 1),
            runs: 0,
        };
        return (cap, (runs, replayed));
    }
    let mut best_peak = first.peak_reserved().0;
    let mut hi = hi;
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        let r = run_at(mid, memo);
        match r.oom {
            None => {
                lo = mid;
                best_peak = r.peak_reserved().0;
            }
            Some(o) => {
                hi = mid;
                fail = Some(o.step + 1);
            }
        }
    }
    let size = lo * step;
    let next = hi * step;
    if fail.is_none() {
        // `hi` is the run as it is (or its size rounded up): its OOM.
        fail = run_at(hi, memo).oom.map(|o| o.step + 1);
    }
    let cap = Cap {
        needed: true,
        size: Some(size),
        steps_capped: steps.iter().filter(|&&z| z > size).count(),
        peak_reserved_bytes: Some(best_peak),
        next_size: Some(next.min(largest.max(size + 1))),
        next_oom_step: fail,
        runs: 0,
    };
    (cap, (runs, replayed))
}

/// The call site of event `event` of step `step`.
fn site_at(
    plan: &RunPlan,
    steps: &[u64],
    settings: &Settings,
    capacity: u64,
    (step, event): (usize, u64),
    memo: &mut Memo<SimDevice>,
) -> String {
    let (_, _, origins) = run::at_step(plan, steps, step, settings, SimDevice::new(capacity), memo);
    origin_site(plan, steps, step, origins.get(event as usize).copied())
}

fn origin_site(plan: &RunPlan, steps: &[u64], step: usize, origin: Option<Origin>) -> String {
    let first = plan.recording_for(steps.first().copied().unwrap_or(1));
    let rec = plan.recording_for(steps.get(step).copied().unwrap_or(1));
    let recs = &plan.series.recordings;
    match origin {
        Some(Origin::Pre(j)) => recs[first].pre_site(j as usize).to_string(),
        Some(Origin::Step(k)) => recs[rec].step_site(k as usize).to_string(),
        _ => String::new(),
    }
}

/// What the free cached blocks were just before the request that first
/// raised reserved memory to the run's peak, on a card without limit.
fn stranded(
    plan: &RunPlan,
    steps: &[u64],
    settings: &Settings,
    free: &RunReplay,
    memo: &mut Memo<SimDevice>,
) -> Option<Stranded> {
    let (_, step) = free.peak_reserved();
    let at = free.steps.get(step)?.peak_event?;
    let (mut live, events, origins) =
        run::at_step(plan, steps, step, settings, SimDevice::new(NO_LIMIT), memo);
    let upto = (at as usize).min(events.len());
    live.feed(&events[..upto]);
    let requested = match *events.get(upto)? {
        crate::workload::Event::Alloc { size, .. } => size,
        _ => return None,
    };
    let mut blocks: Vec<u64> = live
        .segments()
        .iter()
        .flat_map(|s| s.blocks.iter())
        .filter(|b| b.state == crate::allocator::BlockState::Inactive)
        .map(|b| b.size)
        .collect();
    blocks.sort_unstable_by(|a, b| b.cmp(a));
    Some(Stranded {
        step: step + 1,
        size: steps[step],
        requested_bytes: requested,
        site: origin_site(plan, steps, step, origins.get(upto).copied()),
        free_blocks: blocks.len(),
        free_bytes: blocks.iter().sum(),
        largest_free_bytes: blocks.first().copied().unwrap_or(0),
        smaller_blocks: blocks.iter().filter(|&&b| b < requested).count(),
        largest_blocks: blocks.iter().take(5).copied().collect(),
    })
}

/// One step at `size` as a fresh process on a card of `capacity` (what
/// `fit` predicts).
fn predicted_fresh(plan: &RunPlan, size: u64, settings: &Settings, capacity: u64) -> RunFigures {
    let (mut a, mut p) = (Vec::new(), Vec::new());
    plan.sizes_at(size, &mut a, &mut p);
    predicted::replay_fresh(
        &plan.series.recordings[plan.recording_for(size)],
        (&a, &p),
        settings,
        SimDevice::new(capacity),
    )
    .figures
}

/// The fresh one-step peak at `size` on a card without limit.
fn fresh_peak(plan: &RunPlan, size: u64, settings: &Settings) -> u64 {
    predicted_fresh(plan, size, settings, NO_LIMIT).peak_reserved_bytes
}

/// The sizes whose one-step peak is compared with the run's: the largest
/// few (a step's peak grows with its size).
fn largest_sizes(steps: &[u64]) -> Vec<u64> {
    const LARGEST: usize = 4;
    let mut d: Vec<u64> = steps.to_vec();
    d.sort_unstable_by(|a, b| b.cmp(a));
    d.dedup();
    d.truncate(LARGEST);
    d
}

fn run_sizes(steps: &[u64]) -> RunSizes {
    let mut d = steps.to_vec();
    d.sort_unstable();
    d.dedup();
    let largest = d.last().copied().unwrap_or(0);
    RunSizes {
        distinct: d.len(),
        smallest: d.first().copied().unwrap_or(0),
        largest,
        largest_count: steps.iter().filter(|&&z| z == largest).count(),
        largest_first_step: steps
            .iter()
            .position(|&z| z == largest)
            .map_or(0, |i| i + 1),
    }
}

/// Why the forecast is uncertain: the reasons of every size `fit` would
/// call uncertain, each said once, with the sizes and the steps at them.
fn uncertainty(
    plan: &RunPlan,
    ask: &ForecastAsk,
    checks: &[Check],
) -> (Vec<String>, Vec<u64>, usize) {
    let mut distinct = ask.steps.clone();
    distinct.sort_unstable();
    distinct.dedup();
    let (ka, kb) = ask
        .knobs
        .as_ref()
        .map_or(("", ""), |(a, b)| (a.as_str(), b.as_str()));
    let per_size: Vec<(u64, Vec<String>)> = distinct
        .par_iter()
        .map(|&size| {
            let r = plan.recording_for(size);
            let reasons = match &plan.laws {
                Laws::One(models) => {
                    let (mut a, mut p) = (Vec::new(), Vec::new());
                    models[r].sizes_at(size, &mut a, &mut p);
                    fit::reasons(plan.series, &models[r], size, &a, &p, checks)
                }
                Laws::Two {
                    grid,
                    models,
                    batch,
                } => grid_fit::reasons(grid, &models[r], (*batch, size), (ka, kb), checks),
            };
            (size, reasons)
        })
        .collect();
    let mut out: Vec<String> = Vec::new();
    let mut sizes = Vec::new();
    for (size, reasons) in per_size {
        if reasons.is_empty() {
            continue;
        }
        sizes.push(size);
        for r in reasons {
            let line = format!("size {size}: {r}");
            if out.len() < 8 {
                out.push(line);
            }
        }
    }
    let steps = ask
        .steps
        .iter()
        .filter(|z| sizes.binary_search(z).is_ok())
        .count();
    if !sizes.is_empty() {
        out.insert(
            0,
            format!(
                "{steps} of the {} steps are at sizes whose laws are uncertain ({})",
                ask.steps.len(),
                list_sizes(&sizes)
            ),
        );
    }
    (out, sizes, steps)
}

/// Up to 8 sizes, then how many more.
fn list_sizes(sizes: &[u64]) -> String {
    let mut s: Vec<String> = sizes.iter().take(8).map(u64::to_string).collect();
    if sizes.len() > 8 {
        s.push(format!("and {} more", sizes.len() - 8));
    }
    s.join(", ")
}

/// What the run keeps beyond the next step's frees, per recording, in words.
fn carried(plan: &RunPlan) -> Vec<String> {
    let mut out = Vec::new();
    for (rec, c) in plan.series.recordings.iter().zip(&plan.carries) {
        let n = c
            .left
            .iter()
            .enumerate()
            .filter(|&(p, _)| c.is_leftover(p))
            .count();
        if n == 0 {
            continue;
        }
        let bytes = crate::units::human(c.leftover_bytes);
        out.push(match c.leftover {
            Leftover::NextStep => format!(
                "{}: {n} blocks ({bytes}) the step leaves live are freed by nothing the next step records; they are freed at the end of the next step",
                rec.input
            ),
            Leftover::State => format!(
                "{}: the recorded step starts with nothing left by a step before and leaves {n} blocks ({bytes}) live: read as state made at the first step (optimizer state?), kept for the whole run and not made again",
                rec.input
            ),
            Leftover::Leak => format!(
                "{}: {n} blocks ({bytes}) left live over the {} recorded steps are freed by nothing: a leak, carried forward step by step",
                rec.input, c.recorded_steps
            ),
        });
    }
    out
}

/// A leak in the recordings: what each step leaves that nothing frees.
fn leak(plan: &RunPlan) -> Option<Leak> {
    // The largest recording that leaks.
    let (r, c) = plan
        .carries
        .iter()
        .enumerate()
        .rfind(|(_, c)| c.leftover == Leftover::Leak)?;
    let rec = &plan.series.recordings[r];
    let mut by_site: rustc_hash::FxHashMap<u32, u64> = Default::default();
    for (pos, &i) in c.left.iter().enumerate() {
        if c.is_leftover(pos) {
            let a = &rec.allocs[i as usize];
            *by_site.entry(a.site).or_default() += a.size;
        }
    }
    let mut sites: Vec<(u32, u64)> = by_site.into_iter().collect();
    sites.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    Some(Leak {
        bytes_per_step: c.leftover_bytes,
        sites: sites
            .iter()
            .take(3)
            .map(|&(s, _)| rec.sites[s as usize].clone())
            .collect(),
    })
}
