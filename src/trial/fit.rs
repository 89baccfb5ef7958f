//! `fit`'s decisions: the predicted trace at each size asked for, replayed
//! under each config as a fresh process (the peak of reserved memory, and
//! the OOM on a card of `--capacity`); the largest size that fits the card
//! under each config, by bisection over replays; and how far each
//! prediction can be trusted.

use super::answer::Strength;
use crate::conf::Settings;
use crate::device::NO_LIMIT;
use crate::device::sim::SimDevice;
use crate::snapshot::fit::align::UNPAIRED;
use crate::snapshot::fit::law::Kind;
use crate::snapshot::fit::{LiveAtPeak, Model, Peaks, Recording, Series};
use crate::workload::predicted::{self, Origin};
use rayon::prelude::*;
use serde::Serialize;

/// What `fit` is asked.
#[derive(Debug, Clone)]
pub struct FitAsk {
    /// Sizes to predict.
    pub at: Vec<u64>,
    /// Configs, as given and parsed; the defaults first.
    pub confs: Vec<(String, Settings)>,
    pub capacity: Option<u64>,
    /// The largest size is a multiple of this.
    pub step: u64,
}

/// Extrapolating further than this many times the recorded span (as a
/// ratio: 128 and 512 span 4×, so up to 16× past 512) is uncertain.
const EXTRAPOLATION_SPANS: f64 = 2.0;
/// Memory live at the predicted peak in allocations without a clean law or
/// a partner, past this share of the peak, makes a prediction uncertain.
const UNSURE_SHARE: f64 = 0.02;
/// With three recordings or more, one predicted from the others off by more
/// than this makes every prediction uncertain.
const CHECK_TOLERANCE: f64 = 0.05;
/// The largest size searched, in steps.
const MAX_STEPS: u64 = 1 << 32;

/// The whole answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fit {
    pub inputs: Vec<FitInput>,
    pub pairing: Vec<Pairing>,
    /// The laws of the largest call sites.
    pub sites: Vec<SiteRow>,
    /// What appears at one size only.
    pub unpaired: Vec<UnpairedRow>,
    /// With three recordings or more: each predicted from the others.
    pub checks: Vec<Check>,
    pub warnings: Vec<String>,
    pub capacity_bytes: Option<u64>,
    pub predictions: Vec<Prediction>,
    pub largest: Vec<Largest>,
    /// The weakest of the predictions' and the largest sizes' strengths.
    pub strength: Strength,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FitInput {
    pub input: String,
    /// Where it was recorded: `size` (one knob) or `point` (two).
    #[serde(flatten)]
    pub at: At,
    pub device: u32,
    pub trace_entries: usize,
    pub allocations: usize,
    pub pre_trace_bytes: u64,
    pub peak_allocated_bytes: u64,
}

/// The knobs' values a recording was made at, or a prediction asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum At {
    Size(u64),
    Point([u64; 2]),
}

impl At {
    /// Each knob's value, in order.
    pub fn values(&self) -> &[u64] {
        match self {
            At::Size(s) => std::slice::from_ref(s),
            At::Point(p) => p,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Pairing {
    pub input: String,
    pub with: String,
    pub paired: usize,
    pub allocations: usize,
    pub paired_bytes: u64,
    pub bytes: u64,
    /// `identical`, `aligned` or `windowed`.
    pub method: &'static str,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SiteRow {
    pub site: String,
    pub law: String,
    pub clean: bool,
    pub exponent: Option<f64>,
    /// The largest allocation's bytes in each input (`null` where it did not pair).
    pub sizes: Vec<Option<u64>>,
    pub allocations: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UnpairedRow {
    pub input: String,
    pub site: String,
    pub count: usize,
    pub largest_bytes: u64,
    pub bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Check {
    pub input: String,
    pub size: u64,
    pub recorded_peak_allocated_bytes: u64,
    pub predicted_peak_allocated_bytes: u64,
    pub error: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Prediction {
    /// Where it was asked for: `size` (one knob) or `point` (two).
    #[serde(flatten)]
    pub at: At,
    /// The input whose timeline the predicted trace follows.
    pub reference: String,
    pub strength: Strength,
    pub reasons: Vec<String>,
    pub peak_allocated_bytes: u64,
    pub configs: Vec<ConfPrediction>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConfPrediction {
    pub conf: String,
    /// On a card without limit.
    pub peak_reserved_bytes: u64,
    /// On the card of `--capacity`: the request that runs out of memory
    /// (`None` when it fits, or no capacity was given).
    pub oom: Option<FitOom>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FitOom {
    pub event_index: u64,
    pub requested_bytes: u64,
    /// The call site of the failing request.
    pub site: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Largest {
    pub conf: String,
    pub capacity_bytes: u64,
    /// `None` when even the smallest size does not fit.
    pub size: Option<u64>,
    pub strength: Strength,
    pub peak_reserved_bytes: Option<u64>,
    pub margin_bytes: Option<u64>,
    /// The next size up, what runs out of memory when it runs on the card,
    /// and what it reserves on a card without limit.
    pub next_size: Option<u64>,
    pub next_oom: Option<FitOom>,
    pub next_peak_reserved_bytes: Option<u64>,
    /// Nothing grows enough to run out of memory below [`MAX_STEPS`] steps.
    pub unbounded: bool,
    pub replays: u32,
}

/// Predicts every size asked for and the largest that fits.
pub fn fit(series: &Series, ask: &FitAsk) -> Fit {
    let recs = &series.recordings;
    let inputs = inputs(series);
    let models: Vec<Model> = (0..recs.len())
        .into_par_iter()
        .map(|r| series.model(r, None))
        .collect();
    let largest_model = &models[recs.len() - 1];
    let checks = checks(series);
    let warnings = warnings(series, largest_model);
    let mut predictions: Vec<Prediction> = ask
        .at
        .par_iter()
        .map(|&size| predict(series, &models, size, ask, &checks))
        .collect();
    predictions.sort_by_key(|p| p.at);
    let largest: Vec<Largest> = match ask.capacity {
        Some(cap) => {
            let peaks: Vec<Peaks> = models.par_iter().map(Model::peaks).collect();
            ask.confs
                .par_iter()
                .map(|(conf, settings)| {
                    largest_fitting(
                        series,
                        (&models, &peaks),
                        (conf, settings),
                        cap,
                        ask.step,
                        &checks,
                    )
                })
                .collect()
        }
        None => Vec::new(),
    };
    let strength = predictions
        .iter()
        .map(|p| p.strength)
        .chain(largest.iter().map(|l| l.strength))
        .min()
        .unwrap_or(Strength::Likely);
    Fit {
        inputs,
        pairing: pairing(series),
        sites: largest_model
            .site_laws(10)
            .into_iter()
            .map(|s| SiteRow {
                site: s.site,
                law: s.law.name(),
                clean: s.law.is_clean(),
                exponent: (s.law.kind != Kind::Constant && s.law.exponent.is_finite())
                    .then_some(s.law.exponent),
                sizes: s.sizes,
                allocations: s.count,
            })
            .collect(),
        unpaired: series
            .unpaired()
            .into_iter()
            .take(10)
            .map(|u| UnpairedRow {
                input: recs[u.recording].input.clone(),
                site: u.site,
                count: u.count,
                largest_bytes: u.largest_bytes,
                bytes: u.bytes,
            })
            .collect(),
        checks,
        warnings,
        capacity_bytes: ask.capacity,
        predictions,
        largest,
        strength,
    }
}

/// The recordings, as the output lists them.
pub(crate) fn inputs(series: &Series) -> Vec<FitInput> {
    series
        .recordings
        .iter()
        .map(|r| FitInput {
            input: r.input.clone(),
            at: At::Size(r.size),
            device: r.device,
            trace_entries: r.entries,
            allocations: r.allocs.len(),
            pre_trace_bytes: r.pre_trace_bytes(),
            peak_allocated_bytes: r.peak_allocated(),
        })
        .collect()
}

/// How each recording pairs with the largest.
pub(crate) fn pairing(series: &Series) -> Vec<Pairing> {
    let recs = &series.recordings;
    let last = recs.len() - 1;
    let r = &recs[last];
    (0..last)
        .map(|o| {
            let (mut paired, mut paired_bytes) = (0, 0);
            for (a, &j) in r.allocs.iter().zip(series.partners(last, o)) {
                if j != UNPAIRED {
                    paired += 1;
                    paired_bytes += a.size;
                }
            }
            Pairing {
                input: r.input.clone(),
                with: recs[o].input.clone(),
                paired,
                allocations: r.allocs.len(),
                paired_bytes,
                bytes: r.allocs.iter().map(|a| a.size).sum(),
                method: series.method(last, o).name(),
            }
        })
        .collect()
}

/// What the user should know about the inputs themselves.
fn warnings(series: &Series, largest: &Model) -> Vec<String> {
    let recs = &series.recordings;
    let first = &recs[0];
    let mut out = Vec::new();
    for r in &recs[1..] {
        if r.settings != first.settings {
            out.push(format!(
                "{} and {} record different allocator settings; the predictions replay each --conf given, whatever the recordings ran with",
                first.input, r.input
            ));
        }
        if r.device != first.device {
            out.push(format!(
                "{} is read on cuda:{} and {} on cuda:{} (the device with the most allocations of each)",
                first.input, first.device, r.input, r.device
            ));
        }
    }
    let grows = largest
        .paired
        .iter()
        .zip(&largest.laws)
        .any(|(&p, l)| p && l.kind != Kind::Constant);
    if !grows {
        out.push(
            "no paired allocation changes size between the inputs: nothing grows with the knob (the same step recorded twice, or a knob the recorded step did not use?)"
                .to_string(),
        );
    }
    let (n, bytes) = largest.pre_trace_varying();
    if n > 0 {
        out.push(format!(
            "memory live before the trace began differs between the inputs ({n} allocations, {} in {}): it follows the same laws as the trace",
            crate::units::human(bytes),
            largest.recording().input
        ));
    }
    out
}

/// With three recordings or more, each one's peak predicted from the others.
pub(crate) fn checks(series: &Series) -> Vec<Check> {
    let recs = &series.recordings;
    if recs.len() < 3 {
        return Vec::new();
    }
    (0..recs.len())
        .map(|i| {
            let others: Vec<usize> = (0..recs.len()).filter(|&o| o != i).collect();
            let reference = series.nearest(recs[i].size, Some(i));
            let model = series.model(reference, Some(&others));
            let predicted = model.peak_allocated_at(recs[i].size);
            let recorded = recs[i].peak_allocated();
            Check {
                input: recs[i].input.clone(),
                size: recs[i].size,
                recorded_peak_allocated_bytes: recorded,
                predicted_peak_allocated_bytes: predicted,
                error: (predicted as f64 - recorded as f64) / (recorded as f64).max(1.0),
            }
        })
        .collect()
}

/// One size's prediction under every config.
fn predict(
    series: &Series,
    models: &[Model],
    size: u64,
    ask: &FitAsk,
    checks: &[Check],
) -> Prediction {
    let model = &models[series.reference_for(size)];
    let rec = model.recording();
    let (mut allocs, mut pre) = (Vec::new(), Vec::new());
    model.sizes_at(size, &mut allocs, &mut pre);
    let peak = rec.peak_with(&allocs, &pre);
    let reasons = reasons(series, model, size, &allocs, &pre, checks);
    let configs = configs_at(rec, (&allocs, &pre), &ask.confs, ask.capacity);
    Prediction {
        at: At::Size(size),
        reference: rec.input.clone(),
        strength: Strength::of_reasons(&reasons),
        reasons,
        peak_allocated_bytes: peak,
        configs,
    }
}

/// One predicted trace under each config, replayed as a fresh process: the
/// peak reserved on a card without limit and, with a capacity, the request
/// that runs out of memory there.
pub(crate) fn configs_at(
    rec: &Recording,
    sizes: (&[u64], &[u64]),
    confs: &[(String, Settings)],
    capacity: Option<u64>,
) -> Vec<ConfPrediction> {
    let replay = |settings: &Settings, cap: u64| {
        predicted::replay_fresh(rec, sizes, settings, SimDevice::new(cap)).figures
    };
    confs
        .par_iter()
        .map(|(conf, settings)| {
            let free = replay(settings, NO_LIMIT);
            let oom = capacity.and_then(|cap| {
                let at_cap = if free.peak_reserved_bytes <= cap && !capacity_matters(settings) {
                    None
                } else {
                    replay(settings, cap).oom
                };
                at_cap.map(|o| FitOom {
                    event_index: o.event_index,
                    requested_bytes: o.requested_bytes,
                    site: site_of(rec, o.event_index),
                })
            });
            ConfPrediction {
                conf: conf.clone(),
                peak_reserved_bytes: free.peak_reserved_bytes,
                oom,
            }
        })
        .collect()
}

/// A config whose decisions depend on the card's size (the garbage
/// collection threshold, a memory fraction): replayed at the capacity even
/// when its peak fits.
pub(crate) fn capacity_matters(s: &Settings) -> bool {
    s.garbage_collection_threshold > 0.0 || s.per_process_memory_fraction.is_some()
}

/// The call site of event `index` of the predicted trace.
pub(crate) fn site_of(rec: &Recording, index: u64) -> String {
    match predicted::origin(rec, index) {
        Origin::Pre(j) => rec.pre_site(j as usize),
        Origin::Step(k) => rec.step_site(k as usize),
    }
    .to_string()
}

/// How far `v` lies outside the recorded `lo..=hi` when further than
/// `EXTRAPOLATION_SPANS` times their span (as ratios): the factor, "beyond"
/// or "below", and the factor allowed.
pub(crate) fn too_far(lo: u64, hi: u64, v: u64) -> Option<(f64, &'static str, f64)> {
    let (lo, hi, v) = (lo.max(1) as f64, hi.max(1) as f64, v.max(1) as f64);
    let (factor, side) = if v > hi {
        (v / hi, "beyond")
    } else if v < lo {
        (lo / v, "below")
    } else {
        return None;
    };
    (factor.ln() > EXTRAPOLATION_SPANS * (hi / lo).ln())
        .then(|| (factor, side, (hi / lo).powf(EXTRAPOLATION_SPANS).round()))
}

/// The bytes live at a predicted peak whose size no partner gave (lonely)
/// and those following no clean law (unclear); `alloc` and `pre` say of an
/// allocation (sized by partners, its law clean).
pub(crate) fn unsure_bytes(
    live: &LiveAtPeak,
    alloc: impl Fn(usize) -> (bool, bool),
    pre: impl Fn(usize) -> (bool, bool),
) -> (u64, u64) {
    let (mut lonely, mut unclear) = (0u64, 0u64);
    let either = live.allocs.iter().map(|&(i, b)| (alloc(i), b));
    for ((sized, clean), bytes) in either.chain(live.pre.iter().map(|&(j, b)| (pre(j), b))) {
        if !sized {
            lonely += bytes;
        } else if !clean {
            unclear += bytes;
        }
    }
    (lonely, unclear)
}

/// Why a prediction at `size` is uncertain (none: likely).
pub(crate) fn reasons(
    series: &Series,
    model: &Model,
    size: u64,
    allocs: &[u64],
    pre: &[u64],
    checks: &[Check],
) -> Vec<String> {
    let recs = &series.recordings;
    let (lo, hi) = (recs[0].size, recs[recs.len() - 1].size);
    let mut out = Vec::new();
    if let Some((factor, side, allowed)) = too_far(lo, hi, size) {
        out.push(format!(
            "{factor:.1}x {side} the recorded sizes ({}), further than {allowed}x (their span, squared)",
            recs.iter()
                .map(|r| r.size.to_string())
                .collect::<Vec<_>>()
                .join(", "),
        ));
    }
    let rec = model.recording();
    let live = rec.live_at_peak(allocs, pre);
    let peak = live.bytes();
    let (lonely, unclear) = unsure_bytes(
        &live,
        |i| {
            (
                model.paired[i] || model.borrowed[i],
                model.laws[i].is_clean(),
            )
        },
        |j| (model.pre_paired[j], model.pre_laws[j].is_clean()),
    );
    if size != rec.size {
        out.extend(unsure_lines(
            peak,
            (
                lonely,
                &format!(
                    "was recorded at {} only: its size at {size} is a guess",
                    rec.size
                ),
            ),
            (
                unclear,
                "follows no clean law (an exponent off the half grid, or sizes that shrink)",
            ),
        ));
    }
    out.extend(checks_off(checks, |c| {
        format!("{} (size {})", c.input, c.size)
    }));
    out
}

/// The sentences for memory live at a predicted peak of `peak` bytes that
/// no partner sized (`lonely`) or that follows no clean law (`unclear`),
/// each past `UNSURE_SHARE` of the peak and said with its reason.
pub(crate) fn unsure_lines(peak: u64, lonely: (u64, &str), unclear: (u64, &str)) -> Vec<String> {
    let share = |b: u64| b as f64 / (peak as f64).max(1.0);
    [lonely, unclear]
        .into_iter()
        .filter(|&(b, _)| share(b) > UNSURE_SHARE)
        .map(|(b, why)| {
            format!(
                "{} of the {} live at the predicted peak ({:.1} %) {why}",
                crate::units::human(b),
                crate::units::human(peak),
                100.0 * share(b)
            )
        })
        .collect()
}

/// The leave-one-out checks off by more than `CHECK_TOLERANCE`, said with
/// the input `name` gives.
pub(crate) fn checks_off<'a>(
    checks: &'a [Check],
    name: impl Fn(&Check) -> String + 'a,
) -> impl Iterator<Item = String> + 'a {
    checks
        .iter()
        .filter(|c| c.error.abs() > CHECK_TOLERANCE)
        .map(move |c| {
            format!(
                "{} predicted from the other inputs is off by {:+.1} %",
                name(c),
                100.0 * c.error
            )
        })
}

/// The largest multiple of `step` whose predicted fresh run fits a card of
/// `capacity` under `settings`. Bounded first by allocated bytes alone (no
/// run fits a card smaller than what it allocates: a pass over the sizes, no
/// replay), then by replays, which cost what they run: a run that fits goes
/// to the end of the trace, one that runs out of memory stops there. So the
/// run on a card without limit at that bound gives how much more than it
/// allocates the workload reserves; the size that ratio says fits is
/// replayed on the card, and its neighbours until one fits and the next
/// does not (usually the guess and the one above it).
fn largest_fitting(
    series: &Series,
    (models, peaks): (&[Model], &[Peaks]),
    (conf, settings): (&str, &Settings),
    capacity: u64,
    step: u64,
    checks: &[Check],
) -> Largest {
    let mut search = Search {
        series,
        models,
        settings,
        capacity,
        step,
        replays: 0,
        known: Vec::new(),
        peaks,
        buffers: (Vec::new(), Vec::new()),
    };
    let mut out = Largest {
        conf: conf.to_string(),
        capacity_bytes: capacity,
        size: None,
        strength: Strength::Likely,
        peak_reserved_bytes: None,
        margin_bytes: None,
        next_size: Some(step),
        next_oom: None,
        next_peak_reserved_bytes: None,
        unbounded: false,
        replays: 0,
    };
    let best = if search.allocated(1) > capacity {
        None
    } else {
        // 1. By allocated bytes alone.
        let (mut ok, mut over) = (1u64, 2u64);
        while over <= MAX_STEPS && search.allocated(over) <= capacity {
            ok = over;
            over *= 2;
        }
        out.unbounded = over > MAX_STEPS;
        let top = if out.unbounded {
            ok
        } else {
            search.bound(ok, over, capacity)
        };
        // 2. The reserve ratio at that bound, on a card without limit.
        let free = search.replay(top, NO_LIMIT);
        if !capacity_matters(settings) && free.peak_reserved_bytes <= capacity {
            // A run whose peak stays within the card never meets its limit.
            search.known.push((top, true, free.peak_reserved_bytes));
            Some(top)
        } else {
            let gap = free
                .peak_reserved_bytes
                .saturating_sub(free.allocated_at_peak_reserved);
            search.bracket(top, gap)
        }
    };
    let Some(n) = best else {
        out.next_oom = search.oom_on_card(1);
        out.next_peak_reserved_bytes = Some(search.replay(1, NO_LIMIT).peak_reserved_bytes);
        out.replays = search.replays;
        return out;
    };
    let at_n = search.fits(n).1;
    let size = n.saturating_mul(step);
    let model = &models[series.reference_for(size)];
    let (mut allocs, mut pre) = (Vec::new(), Vec::new());
    model.sizes_at(size, &mut allocs, &mut pre);
    out.strength = Strength::of_reasons(&reasons(series, model, size, &allocs, &pre, checks));
    out.size = Some(size);
    out.peak_reserved_bytes = Some(at_n);
    out.margin_bytes = Some(capacity.saturating_sub(at_n));
    out.next_size = (!out.unbounded).then(|| (n + 1).saturating_mul(step));
    if !out.unbounded {
        out.next_oom = search.oom_on_card(n + 1);
        out.next_peak_reserved_bytes = Some(search.replay(n + 1, NO_LIMIT).peak_reserved_bytes);
    }
    out.replays = search.replays;
    out
}

/// The largest size's search for one config: sizes in steps, replays
/// counted, each run on the card remembered.
struct Search<'a, 's> {
    series: &'s Series,
    models: &'a [Model<'s>],
    settings: &'a Settings,
    capacity: u64,
    step: u64,
    replays: u32,
    /// (steps, fits the card, peak reserved on it).
    known: Vec<(u64, bool, u64)>,
    /// Per recording, where its peak of allocated bytes can be.
    peaks: &'a [Peaks],
    buffers: (Vec<u64>, Vec<u64>),
}

impl Search<'_, '_> {
    /// The peak of allocated bytes at n steps, from the sums it can be at.
    fn allocated(&mut self, n: u64) -> u64 {
        let size = n.saturating_mul(self.step);
        self.peaks[self.series.reference_for(size)].at(size)
    }

    /// The largest n in (ok, bad) whose allocated bytes stay within `limit`
    /// (`ok` when none does): interpolation search (allocated bytes grow
    /// smoothly with the size), a bisection every other probe so that it
    /// never crawls.
    fn bound(&mut self, mut ok: u64, mut bad: u64, limit: u64) -> u64 {
        let mut bisect = false;
        while bad - ok > 1 {
            let (a, b) = (
                if ok == 0 { 0 } else { self.allocated(ok) },
                self.allocated(bad),
            );
            let mid = if bisect || b <= a || limit < a {
                ok + (bad - ok) / 2
            } else {
                let t = (limit - a) as f64 / (b - a) as f64;
                (ok + (t * (bad - ok) as f64) as u64).clamp(ok + 1, bad - 1)
            };
            bisect = !bisect;
            if self.allocated(mid) <= limit {
                ok = mid;
            } else {
                bad = mid;
            }
        }
        ok
    }

    fn replay(&mut self, n: u64, cap: u64) -> crate::workload::RunFigures {
        let size = n.saturating_mul(self.step);
        let model = &self.models[self.series.reference_for(size)];
        model.sizes_at(size, &mut self.buffers.0, &mut self.buffers.1);
        self.replays += 1;
        let buffers = (&self.buffers.0[..], &self.buffers.1[..]);
        predicted::replay_fresh(
            model.recording(),
            buffers,
            self.settings,
            SimDevice::new(cap),
        )
        .figures
    }

    /// The request that runs out of memory when n steps run on the card
    /// (`None`: they fit).
    fn oom_on_card(&mut self, n: u64) -> Option<FitOom> {
        let oom = self.replay(n, self.capacity).oom?;
        let size = n.saturating_mul(self.step);
        let rec = self.models[self.series.reference_for(size)].recording();
        Some(FitOom {
            event_index: oom.event_index,
            requested_bytes: oom.requested_bytes,
            site: site_of(rec, oom.event_index),
        })
    }

    /// Whether n steps run without OOM on the card, and their peak reserved.
    fn fits(&mut self, n: u64) -> (bool, u64) {
        if let Some(&(_, f, peak)) = self.known.iter().find(|k| k.0 == n) {
            return (f, peak);
        }
        let r = self.replay(n, self.capacity);
        let f = r.oom.is_none();
        self.known.push((n, f, r.peak_reserved_bytes));
        (f, r.peak_reserved_bytes)
    }

    /// The largest n ≤ `top` that fits, `None` when 1 does not. Runs that
    /// fit cost the whole trace, runs out of memory stop at it (early, for a
    /// trace whose steps repeat): so the search leans on failures. The first
    /// guess leaves the reserve the run without limit kept beyond what it
    /// allocated (`gap`); a guess that fits says how much of the card its
    /// peak left free, and the next allocates that much more (less 2 %).
    /// When that is less than one step (a config that keeps its cache close
    /// to the card), it walks down from the smallest size known not to fit,
    /// by doubling strides, to a bracket; a failure halves the bracket.
    fn bracket(&mut self, top: u64, gap: u64) -> Option<u64> {
        // The bound itself may fit: the card frees its cache and retries.
        if self.fits(top).0 {
            return Some(top);
        }
        let (mut lo, mut hi) = (0u64, top);
        let mut guess = self.bound(0, top, self.capacity.saturating_sub(gap));
        let mut down: Option<u64> = None;
        while hi - lo > 1 {
            let n = match down {
                Some(stride) => hi.saturating_sub(stride).max(lo + 1),
                None => guess.clamp(lo + 1, hi - 1),
            };
            let (fits, peak) = self.fits(n);
            if fits {
                lo = n;
                down = None;
                let free = self.capacity.saturating_sub(peak);
                let limit = self.allocated(n).saturating_add(free - free / 50);
                guess = self.bound(lo, hi, limit);
                if guess <= lo && hi - lo > 2 {
                    // Less than a step of headroom: walk down from above.
                    down = Some(1);
                }
            } else {
                hi = n;
                if let Some(stride) = down {
                    down = Some(stride.saturating_mul(2));
                } else {
                    let (a, b) = (
                        if lo == 0 { 0 } else { self.allocated(lo) },
                        self.allocated(hi),
                    );
                    // A law may shrink: allocated need not rise with n.
                    guess = self.bound(lo, hi, a.midpoint(b));
                }
            }
        }
        (lo > 0).then_some(lo)
    }
}
