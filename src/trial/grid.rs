//! `fit` in two knobs: the predicted trace at each point asked for, replayed
//! as a fresh process under each config ([`crate::workload::predicted`], as
//! one knob does), and with `--capacity` the frontier of what fits: for each
//! value of one knob, the largest value of the other that fits the card under
//! each config, by bisection over replays.

use super::answer::Strength;
use super::fit::{
    At, Check, FitInput, Pairing, Prediction, checks_off, configs_at, too_far, unsure_bytes,
    unsure_lines,
};
use crate::conf::Settings;
use crate::device::sim::SimDevice;
use crate::snapshot::fit::align::UNPAIRED;
use crate::snapshot::fit::grid::{Grid, GridModel, Point};
use crate::workload::predicted;
use rayon::prelude::*;
use serde::Serialize;

/// What `fit` in two knobs is asked.
#[derive(Debug, Clone)]
pub struct GridAsk {
    pub knobs: (String, String),
    pub at: Vec<Point>,
    /// Configs, as given and parsed; the defaults first.
    pub confs: Vec<(String, Settings)>,
    pub capacity: Option<u64>,
    /// With `capacity`: the knob held fixed (0 or 1) and its values.
    pub along: Option<(usize, Vec<u64>)>,
}

/// The largest value the frontier searches.
const MAX_VALUE: u64 = 1 << 32;

/// The whole answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GridFit {
    pub knobs: [String; 2],
    pub inputs: Vec<FitInput>,
    pub pairing: Vec<Pairing>,
    pub sites: Vec<GridSite>,
    /// Allocations made at some points of the grid only, and where a
    /// prediction places them.
    pub placed: Vec<String>,
    pub checks: Vec<Check>,
    pub warnings: Vec<String>,
    pub capacity_bytes: Option<u64>,
    pub predictions: Vec<Prediction>,
    pub frontier: Vec<Frontier>,
    pub strength: Strength,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GridSite {
    pub site: String,
    pub law: String,
    pub clean: bool,
    /// The largest allocation's bytes at each input (`null` where unpaired).
    pub sizes: Vec<Option<u64>>,
    pub allocations: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Frontier {
    pub conf: String,
    /// The knob held fixed, and its value.
    pub knob: String,
    pub value: u64,
    /// The other knob, and its largest value that fits the card (`None`:
    /// not even 1).
    pub other: String,
    pub largest: Option<u64>,
    pub peak_reserved_bytes: Option<u64>,
    pub strength: Strength,
    /// Nothing grows enough to fill the card below 2³² of the other knob.
    pub unbounded: bool,
    pub replays: u32,
}

/// Predicts every point asked for, and the frontier on the card.
pub fn fit_grid(grid: &Grid, ask: &GridAsk) -> GridFit {
    let recs = &grid.series.recordings;
    let n = recs.len();
    let models: Vec<GridModel> = (0..n)
        .into_par_iter()
        .map(|r| grid.model(r, None))
        .collect();
    let checks = checks(grid);
    let knobs = (ask.knobs.0.as_str(), ask.knobs.1.as_str());
    let mut predictions: Vec<Prediction> = ask
        .at
        .par_iter()
        .map(|&x| predict(grid, &models, x, ask, &checks))
        .collect();
    predictions.sort_by_key(|p| p.at);
    let frontier: Vec<Frontier> = match (ask.capacity, &ask.along) {
        (Some(cap), Some((k, values))) => ask
            .confs
            .par_iter()
            .flat_map(|c| {
                values
                    .par_iter()
                    .map(|&v| frontier(grid, &models, (c, cap), (*k, v), ask, &checks))
                    .collect::<Vec<_>>()
            })
            .collect(),
        _ => Vec::new(),
    };
    let strength = predictions
        .iter()
        .map(|p| p.strength)
        .chain(frontier.iter().map(|f| f.strength))
        .min()
        .unwrap_or(Strength::Likely);
    let largest = models
        .iter()
        .max_by_key(|m| m.recording().allocs.len())
        .unwrap_or(&models[0]);
    GridFit {
        knobs: [ask.knobs.0.clone(), ask.knobs.1.clone()],
        inputs: inputs(grid),
        pairing: pairing(grid),
        sites: sites(grid, largest, knobs, 10),
        placed: placed(grid, ask),
        checks,
        warnings: warnings(grid),
        capacity_bytes: ask.capacity,
        predictions,
        frontier,
        strength,
    }
}

/// Each recording at its point.
pub(crate) fn inputs(grid: &Grid) -> Vec<FitInput> {
    let mut out = super::fit::inputs(&grid.series);
    for (i, &(a, b)) in out.iter_mut().zip(&grid.points) {
        i.at = At::Point([a, b]);
    }
    out
}

/// How each recording pairs with the first.
pub(crate) fn pairing(grid: &Grid) -> Vec<Pairing> {
    let recs = &grid.series.recordings;
    let r = &recs[0];
    (1..recs.len())
        .map(|o| {
            let (mut paired, mut bytes) = (0, 0);
            for (a, &j) in r.allocs.iter().zip(grid.series.partners(0, o)) {
                if j != UNPAIRED {
                    paired += 1;
                    bytes += a.size;
                }
            }
            Pairing {
                input: r.input.clone(),
                with: recs[o].input.clone(),
                paired,
                allocations: r.allocs.len(),
                paired_bytes: bytes,
                bytes: r.allocs.iter().map(|a| a.size).sum(),
                method: grid.series.method(0, o).name(),
            }
        })
        .collect()
}

/// The call sites of `model`'s recording with the law of each one's largest
/// allocation, the largest first.
fn sites(grid: &Grid, model: &GridModel, knobs: (&str, &str), top: usize) -> Vec<GridSite> {
    grid.series
        .site_laws(model.reference, top, |i| model.laws[i])
        .into_iter()
        .map(|s| GridSite {
            site: s.site,
            law: s.law.name(knobs),
            clean: s.law.is_clean(),
            sizes: s.sizes,
            allocations: s.count,
        })
        .collect()
}

/// What the user should know about the inputs.
fn warnings(grid: &Grid) -> Vec<String> {
    let recs = &grid.series.recordings;
    let mut out = Vec::new();
    for r in &recs[1..] {
        if r.settings != recs[0].settings {
            out.push(format!(
                "{} and {} record different allocator settings; the predictions replay each --conf given, whatever the recordings ran with",
                recs[0].input, r.input
            ));
        }
    }
    out
}

/// The allocations some recordings make and others do not, and where the
/// predictions place them: by the product of the knobs, each point follows
/// the allocations of the recording with the largest product at or below
/// its own.
fn placed(grid: &Grid, ask: &GridAsk) -> Vec<String> {
    if grid.uniform() {
        return Vec::new();
    }
    let recs = &grid.series.recordings;
    let product = |p: Point| u128::from(p.0) * u128::from(p.1);
    let mut order: Vec<usize> = (0..recs.len()).collect();
    order.sort_by_key(|&r| (product(grid.points[r]), r));
    let mut out = vec![format!(
        "the recordings do not all make the same allocations ({}): each point follows the allocations of the recording with the largest product {} × {} at or below its own (what a tensor's element count follows), the nearest recording that makes them",
        order
            .iter()
            .map(|&r| {
                let (a, b) = grid.points[r];
                format!("{} at ({a}, {b})", recs[r].allocs.len())
            })
            .collect::<Vec<_>>()
            .join(", "),
        ask.knobs.0,
        ask.knobs.1
    )];
    for &x in &ask.at {
        let (r, nearest) = grid.reference_for(x);
        if !nearest {
            let (a, b) = grid.points[r];
            out.push(format!(
                "({}, {}) follows ({a}, {b}), which makes {} allocations, not the nearer recording, which makes others",
                x.0,
                x.1,
                recs[r].allocs.len()
            ));
        }
    }
    out
}

/// With four recordings or more, each one's peak predicted from the others.
pub(crate) fn checks(grid: &Grid) -> Vec<Check> {
    let recs = &grid.series.recordings;
    if recs.len() < 4 {
        return Vec::new();
    }
    (0..recs.len())
        .map(|i| {
            let others: Vec<usize> = (0..recs.len()).filter(|&o| o != i).collect();
            let x = grid.points[i];
            // The nearest other recording, as the reference.
            let l = |v: u64| (v.max(1) as f64).ln();
            let reference = others
                .iter()
                .copied()
                .min_by(|&p, &q| {
                    let d = |r: usize| {
                        (l(grid.points[r].0) - l(x.0)).hypot(l(grid.points[r].1) - l(x.1))
                    };
                    d(p).total_cmp(&d(q))
                })
                .unwrap_or(0);
            let predicted = grid.model(reference, Some(&others)).peak_allocated_at(x);
            let recorded = recs[i].peak_allocated();
            Check {
                input: recs[i].input.clone(),
                size: i as u64 + 1,
                recorded_peak_allocated_bytes: recorded,
                predicted_peak_allocated_bytes: predicted,
                error: (predicted as f64 - recorded as f64) / (recorded as f64).max(1.0),
            }
        })
        .collect()
}

/// Why a prediction at `x` is uncertain (none: likely).
pub(crate) fn reasons(
    grid: &Grid,
    model: &GridModel,
    x: Point,
    knobs: (&str, &str),
    checks: &[Check],
) -> Vec<String> {
    let mut out = Vec::new();
    for (k, name) in [knobs.0, knobs.1].into_iter().enumerate() {
        let of = |p: &Point| if k == 0 { p.0 } else { p.1 };
        let lo = grid.points.iter().map(of).min().unwrap_or(1).max(1);
        let hi = grid.points.iter().map(of).max().unwrap_or(1).max(1);
        if let Some((factor, side, allowed)) = too_far(lo, hi, of(&x)) {
            out.push(format!(
                "{name} {} is {factor:.1}x {side} the recorded values ({lo}–{hi}), further than {allowed}x (their span, squared)",
                of(&x),
            ));
        }
    }
    let live = model.live_at_peak(x);
    let peak = live.bytes();
    let (lonely, unclear) = unsure_bytes(
        &live,
        |i| (model.paired[i], model.laws[i].is_clean()),
        |j| (model.pre_paired[j], model.pre_laws[j].is_clean()),
    );
    if x != grid.points[model.reference] {
        let guess = format!(
            "was not seen at every recorded point: its size at ({}, {}) is a guess",
            x.0, x.1
        );
        out.extend(unsure_lines(
            peak,
            (lonely, &guess),
            (unclear, "follows no clean law in the two knobs"),
        ));
    }
    out.extend(checks_off(checks, |c| c.input.clone()));
    out
}

/// One point's prediction under every config.
fn predict(
    grid: &Grid,
    models: &[GridModel],
    x: Point,
    ask: &GridAsk,
    checks: &[Check],
) -> Prediction {
    let (r, _) = grid.reference_for(x);
    let model = &models[r];
    let rec = model.recording();
    let (mut allocs, mut pre) = (Vec::new(), Vec::new());
    model.sizes_at(x, &mut allocs, &mut pre);
    let peak = rec.peak_with(&allocs, &pre);
    let knobs = (ask.knobs.0.as_str(), ask.knobs.1.as_str());
    let reasons = reasons(grid, model, x, knobs, checks);
    let configs = configs_at(rec, (&allocs, &pre), &ask.confs, ask.capacity);
    Prediction {
        at: At::Point([x.0, x.1]),
        reference: rec.input.clone(),
        strength: Strength::of_reasons(&reasons),
        reasons,
        peak_allocated_bytes: peak,
        configs,
    }
}

/// The largest value of the other knob that fits the card at `value` of
/// knob `k` under one config: bounded by allocated bytes alone (no run fits
/// a card smaller than what it allocates), then bisected over replays.
fn frontier(
    grid: &Grid,
    models: &[GridModel],
    ((conf, settings), capacity): (&(String, Settings), u64),
    (k, value): (usize, u64),
    ask: &GridAsk,
    checks: &[Check],
) -> Frontier {
    let point = |w: u64| if k == 0 { (value, w) } else { (w, value) };
    let model_at = |w: u64| &models[grid.reference_for(point(w)).0];
    let allocated = |w: u64| model_at(w).peak_allocated_at(point(w));
    let mut replays = 0u32;
    let mut run = |w: u64| {
        replays += 1;
        let m = model_at(w);
        let (mut a, mut p) = (Vec::new(), Vec::new());
        m.sizes_at(point(w), &mut a, &mut p);
        predicted::replay_fresh(m.recording(), (&a, &p), settings, SimDevice::new(capacity)).figures
    };
    let names = [ask.knobs.0.clone(), ask.knobs.1.clone()];
    let mut out = Frontier {
        conf: conf.clone(),
        knob: names[k].clone(),
        value,
        other: names[1 - k].clone(),
        largest: None,
        peak_reserved_bytes: None,
        strength: Strength::Likely,
        unbounded: false,
        replays: 0,
    };
    // 1. By allocated bytes: the first doubling past the card.
    let (mut ok, mut over) = (0u64, 1u64);
    while over <= MAX_VALUE && allocated(over) <= capacity {
        ok = over;
        over *= 2;
    }
    out.unbounded = over > MAX_VALUE;
    let mut hi = over.min(MAX_VALUE + 1);
    let mut lo = ok;
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if allocated(mid) <= capacity {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    // 2. Replays below that bound: the largest that runs without OOM.
    let top = lo;
    let best = if top == 0 {
        None
    } else {
        let first = run(top);
        if first.oom.is_none() {
            Some((top, first.peak_reserved_bytes))
        } else {
            let (mut lo, mut hi) = (0u64, top);
            let mut found = None;
            while hi - lo > 1 {
                let mid = lo + (hi - lo) / 2;
                let r = run(mid);
                if r.oom.is_none() {
                    lo = mid;
                    found = Some((mid, r.peak_reserved_bytes));
                } else {
                    hi = mid;
                }
            }
            found
        }
    };
    if let Some((w, peak)) = best {
        out.largest = Some(w);
        out.peak_reserved_bytes = Some(peak);
        let knobs = (ask.knobs.0.as_str(), ask.knobs.1.as_str());
        if !reasons(grid, model_at(w), point(w), knobs, checks).is_empty() {
            out.strength = Strength::Uncertain;
        }
    }
    out.replays = replays;
    out
}
