//! `fit` in two knobs: one workload recorded at points of a grid (a batch
//! and a length, a width and a length), each allocation paired across the
//! recordings as [`Series`] pairs them, and read as a law in both knobs: a
//! constant, a product of powers `c · a^p · b^q` (each exponent on the half
//! grid), or affine in each (`c0 + c1·a + c2·b`, and with four points or
//! more `+ c3·a·b`). A prediction at a point follows the recording nearest
//! it whose allocations are the ones the point is expected to make: an
//! allocation seen in part of the grid only (a reduction buffer PyTorch skips
//! below some element count) is placed by where it was seen, along the
//! product of the knobs (what a tensor's element count follows).

use super::law::{self, SizeLaw};
use super::{LiveAtPeak, Recording, Series, SeriesError};

/// A point of the grid: the two knobs' values.
pub type Point = (u64, u64);

/// Inputs that do not make a grid.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GridError {
    #[error(
        "{0} points given: a grid needs at least three recordings, at points not on one line (two at one value of a knob and one at another of it)"
    )]
    TooFew(usize),
    #[error("the point ({0}, {1}) is given twice: each input needs its own point")]
    Twice(u64, u64),
    #[error(
        "every point lies on one line ({0}): the knobs cannot be told apart; record a third point off it"
    )]
    OneLine(String),
    #[error(transparent)]
    Series(#[from] SeriesError),
}

/// The largest exponent read in either knob, in halves.
const MAX_HALVES: i32 = 6;
/// How far a read exponent may sit from the half grid and still be on it.
const GRID_TOLERANCE: f64 = 0.03;
/// The largest relative deviation of a recorded size from a clean law.
const FIT_TOLERANCE: f64 = 0.01;

/// One allocation's law in two knobs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Law2 {
    Constant(f64),
    /// `c · a^(p/2) · b^(q/2)`.
    Power {
        c: f64,
        p: i32,
        q: i32,
    },
    /// `c0 + c1·a + c2·b + c3·a·b` (`c3` 0 from three points).
    Affine {
        c: [f64; 4],
    },
    /// No law: the size recorded at the reference, at every point.
    Unclear(u64),
}

impl Law2 {
    pub fn at(&self, (a, b): (f64, f64)) -> u64 {
        let v = match *self {
            Law2::Constant(c) => c,
            Law2::Power { c, p, q } => c * a.powf(f64::from(p) / 2.0) * b.powf(f64::from(q) / 2.0),
            Law2::Affine { c } => c[0] + c[1] * a + c[2] * b + c[3] * a * b,
            Law2::Unclear(s) => return s,
        };
        if v > 0.0 { (v + 0.5) as u64 } else { 0 }
    }

    /// Constant, a product of powers up to the square in each knob, or affine.
    pub fn is_clean(&self) -> bool {
        match *self {
            Law2::Constant(_) | Law2::Affine { .. } => true,
            Law2::Power { p, q, .. } => p <= 4 && q <= 4,
            Law2::Unclear(_) => false,
        }
    }

    /// The law in words, with the knobs' names: "constant",
    /// "d_model × seq_len²", "affine in d_model and seq_len", "unclear".
    pub fn name(&self, (ka, kb): (&str, &str)) -> String {
        let power = |k: &str, h: i32| match h {
            0 => String::new(),
            2 => k.to_string(),
            4 => format!("{k}²"),
            6 => format!("{k}³"),
            h => format!("{k}^{}", f64::from(h) / 2.0),
        };
        match *self {
            Law2::Constant(_) => "constant".into(),
            Law2::Power { p, q, .. } => {
                let parts: Vec<String> = [power(ka, p), power(kb, q)]
                    .into_iter()
                    .filter(|s| !s.is_empty())
                    .collect();
                if parts.is_empty() {
                    "constant".into()
                } else {
                    parts.join(" × ")
                }
            }
            Law2::Affine { c } if c[3] != 0.0 => format!("affine in {ka} and {kb}, with {ka}·{kb}"),
            Law2::Affine { .. } => format!("affine in {ka} and {kb}"),
            Law2::Unclear(_) => "unclear".into(),
        }
    }
}

/// Relative error of `got` against `want`.
fn rel(got: f64, want: u64) -> f64 {
    (got - want as f64).abs() / (want as f64).max(1.0)
}

/// The law of one allocation from its sizes at points (`((a, b), bytes)`,
/// at least one); `own` is the reference's size, kept when no law fits.
pub fn fit(points: &[((f64, f64), u64)], own: u64) -> Law2 {
    let Some(&(_, s0)) = points.first() else {
        return Law2::Unclear(own);
    };
    if points.iter().all(|&(_, s)| s == s0) {
        return Law2::Constant(s0 as f64);
    }
    if points.len() < 3 || points.iter().any(|&(_, s)| s == 0) {
        return along_one_knob(points, own);
    }
    let residual = |law: &Law2| {
        points
            .iter()
            .map(|&(x, s)| rel(law.at(x) as f64, s))
            .fold(0.0, f64::max)
    };
    let fits = |law: &Law2| residual(law) <= FIT_TOLERANCE;
    // The shapes to try, the likeliest first (as in one knob): integer
    // powers, affine (growth no faster than linear in either knob, no part
    // that shrinks), then half powers.
    let (power, exponents) = powers(points);
    if let Some(law @ Law2::Power { p, q, .. }) = power
        && p % 2 == 0
        && q % 2 == 0
        && fits(&law)
    {
        return law;
    }
    let sub_linear =
        exponents.is_some_and(|(p, q)| p <= 1.0 + GRID_TOLERANCE && q <= 1.0 + GRID_TOLERANCE);
    if sub_linear {
        // Of the affine shapes that fit, the closest (with four points the
        // product term, when it is there, fits them exactly).
        let best = [3usize, 4]
            .into_iter()
            .filter(|&terms| points.len() >= terms)
            .filter_map(|terms| affine(points, terms))
            .filter(|c| c.iter().all(|&v| v >= -1e-6 * (s0 as f64).max(1.0)))
            .map(|c| Law2::Affine { c })
            .filter(|law| fits(law))
            .min_by(|x, y| residual(x).total_cmp(&residual(y)));
        if let Some(law) = best {
            return law;
        }
    }
    match power {
        Some(law) if fits(&law) => law,
        _ => Law2::Unclear(own),
    }
}

/// Points that vary along one knob only (or two points): the law along that
/// knob, the other taken as not moving it.
fn along_one_knob(points: &[((f64, f64), u64)], own: u64) -> Law2 {
    let same_b = points.iter().all(|p| p.0.1 == points[0].0.1);
    let same_a = points.iter().all(|p| p.0.0 == points[0].0.0);
    let one: Vec<(f64, u64)> = match (same_a, same_b) {
        (false, true) => points.iter().map(|&((a, _), s)| (a, s)).collect(),
        (true, false) => points.iter().map(|&((_, b), s)| (b, s)).collect(),
        _ => return Law2::Unclear(own),
    };
    let law = law::fit(&one, own);
    match law.kind {
        law::Kind::Power(h) => {
            // c·x^h through the points.
            let (x, s) = one[0];
            let c = s as f64 / x.powf(f64::from(h) / 2.0);
            if same_b {
                Law2::Power {
                    c,
                    p: i32::from(h),
                    q: 0,
                }
            } else {
                Law2::Power {
                    c,
                    p: 0,
                    q: i32::from(h),
                }
            }
        }
        law::Kind::Affine => {
            let slope = line(&one);
            match slope {
                Some((c0, c1)) if same_b => Law2::Affine {
                    c: [c0, c1, 0.0, 0.0],
                },
                Some((c0, c1)) => Law2::Affine {
                    c: [c0, 0.0, c1, 0.0],
                },
                None => Law2::Unclear(own),
            }
        }
        _ => Law2::Unclear(own),
    }
    .clean_or(own, &law)
}

impl Law2 {
    /// `self`, unless the one-knob law it came from is no law.
    fn clean_or(self, own: u64, from: &SizeLaw) -> Law2 {
        if from.kind == law::Kind::Unclear {
            Law2::Unclear(own)
        } else {
            self
        }
    }
}

/// `c0 + c1·x` through the points (least squares).
fn line(points: &[(f64, u64)]) -> Option<(f64, f64)> {
    let n = points.len() as f64;
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), &(x, s)| (a + x, b + s as f64));
    let (mx, my) = (sx / n, sy / n);
    let (mut sxx, mut sxy) = (0.0, 0.0);
    for &(x, s) in points {
        sxx += (x - mx) * (x - mx);
        sxy += (x - mx) * (s as f64 - my);
    }
    (sxx > 0.0).then(|| {
        let c1 = sxy / sxx;
        (my - c1 * mx, c1)
    })
}

/// `c · a^p · b^q` by least squares on the logarithms, each exponent
/// snapped to the half grid (`None` when one is off it or out of range),
/// and the exponents as read.
fn powers(points: &[((f64, f64), u64)]) -> (Option<Law2>, Option<(f64, f64)>) {
    let rows: Vec<[f64; 4]> = points
        .iter()
        .map(|&((a, b), s)| [1.0, a.ln(), b.ln(), (s as f64).ln()])
        .collect();
    let Some(x) = solve(&rows, 3) else {
        return (None, None);
    };
    let snap = |e: f64| {
        let h = (2.0 * e).round();
        ((e - h / 2.0).abs() <= GRID_TOLERANCE && (0.0..=f64::from(MAX_HALVES)).contains(&h))
            .then_some(h as i32)
    };
    let read = Some((x[1], x[2]));
    let (Some(p), Some(q)) = (snap(x[1]), snap(x[2])) else {
        return (None, read);
    };
    // The coefficient again, with the exponents on the grid.
    let ln_c = rows
        .iter()
        .map(|r| r[3] - f64::from(p) / 2.0 * r[1] - f64::from(q) / 2.0 * r[2])
        .sum::<f64>()
        / rows.len() as f64;
    (
        Some(Law2::Power {
            c: ln_c.exp(),
            p,
            q,
        }),
        read,
    )
}

/// `c0 + c1·a + c2·b (+ c3·a·b)` by least squares in relative terms.
fn affine(points: &[((f64, f64), u64)], terms: usize) -> Option<[f64; 4]> {
    let rows: Vec<[f64; 5]> = points
        .iter()
        .map(|&((a, b), s)| {
            let w = 1.0 / (s as f64).max(1.0);
            [w, a * w, b * w, a * b * w, s as f64 * w]
        })
        .collect();
    let x = solve(&rows, terms)?;
    let mut c = [0.0; 4];
    c[..terms].copy_from_slice(&x[..terms]);
    Some(c)
}

/// Least squares for `rows` of `n` unknowns then the value (`row[n..]` the
/// rest; the value is the last column), by the normal equations.
fn solve<const W: usize>(rows: &[[f64; W]], n: usize) -> Option<Vec<f64>> {
    let y = W - 1;
    let mut m = vec![vec![0.0; n + 1]; n];
    for r in rows {
        for i in 0..n {
            for j in 0..n {
                m[i][j] += r[i] * r[j];
            }
            m[i][n] += r[i] * r[y];
        }
    }
    // Gaussian elimination with partial pivoting.
    for col in 0..n {
        let pivot = (col..n).max_by(|&a, &b| m[a][col].abs().total_cmp(&m[b][col].abs()))?;
        if m[pivot][col].abs() < 1e-12 * m[pivot].iter().map(|v| v.abs()).fold(0.0, f64::max) {
            return None;
        }
        m.swap(col, pivot);
        for row in 0..n {
            if row != col {
                let f = m[row][col] / m[col][col];
                let pivot_row = m[col].clone();
                for (v, p) in m[row][col..].iter_mut().zip(&pivot_row[col..]) {
                    *v -= f * p;
                }
            }
        }
    }
    let x: Vec<f64> = (0..n).map(|i| m[i][n] / m[i][i]).collect();
    x.iter().all(|v| v.is_finite()).then_some(x)
}

/// Recordings of one workload at points of a grid, paired.
#[derive(Debug, Clone)]
pub struct Grid {
    /// The recordings in the order given, paired (their `size` is their
    /// index from 1: the pairing does not use it).
    pub series: Series,
    /// Each recording's point, in the same order.
    pub points: Vec<Point>,
    /// Per recording, its allocations' call sites as a multiset (sorted
    /// coarse keys): recordings with equal ones make the same allocations.
    variants: Vec<Vec<u64>>,
}

impl Grid {
    /// Pairs `recordings` recorded at `points` (in the same order); refuses
    /// fewer than three, a point twice, and points on one line.
    pub fn new(mut recordings: Vec<Recording>, points: Vec<Point>) -> Result<Grid, GridError> {
        if points.len() < 3 {
            return Err(GridError::TooFew(points.len()));
        }
        for (i, p) in points.iter().enumerate() {
            if points[..i].contains(p) {
                return Err(GridError::Twice(p.0, p.1));
            }
        }
        let one_a = points.iter().all(|p| p.0 == points[0].0);
        let one_b = points.iter().all(|p| p.1 == points[0].1);
        // On one line in the logarithms: no two directions to read two exponents from.
        let logs: Vec<(f64, f64)> = points
            .iter()
            .map(|&(a, b)| ((a.max(1) as f64).ln(), (b.max(1) as f64).ln()))
            .collect();
        let (x0, y0) = logs[0];
        let far = logs
            .iter()
            .max_by(|p, q| ((p.0 - x0).hypot(p.1 - y0)).total_cmp(&(q.0 - x0).hypot(q.1 - y0)))
            .copied()
            .unwrap_or((x0, y0));
        let collinear = logs
            .iter()
            .all(|&(x, y)| ((far.0 - x0) * (y - y0) - (far.1 - y0) * (x - x0)).abs() < 1e-9);
        if one_a || one_b || collinear {
            let line = if one_a {
                format!("the first knob is {} at every point", points[0].0)
            } else if one_b {
                format!("the second knob is {} at every point", points[0].1)
            } else {
                "the knobs keep one ratio of powers at every point".into()
            };
            return Err(GridError::OneLine(line));
        }
        for (i, r) in recordings.iter_mut().enumerate() {
            r.size = i as u64 + 1;
        }
        let series = Series::new(recordings)?;
        let variants = series
            .recordings
            .iter()
            .map(|r| {
                let mut keys: Vec<u64> = r.allocs.iter().map(|a| a.coarse).collect();
                keys.sort_unstable();
                keys
            })
            .collect();
        Ok(Grid {
            series,
            points,
            variants,
        })
    }

    /// The recording a prediction at `x` follows: of those whose
    /// allocations are the ones `x` is expected to make, the nearest (in the
    /// logarithms of the knobs). The expected ones are those of the
    /// recording with the largest product of the knobs at or below `x`'s
    /// (the smallest recording's below all), so an allocation made above
    /// some element count is placed where it was seen. `None` in the second
    /// place when no recording of that kind is nearest overall.
    pub fn reference_for(&self, x: Point) -> (usize, bool) {
        let n = self.points.len();
        let dist = |r: usize| {
            let (a, b) = self.points[r];
            let l = |v: u64| (v.max(1) as f64).ln();
            (l(a) - l(x.0)).hypot(l(b) - l(x.1))
        };
        let nearest = |among: &mut dyn Iterator<Item = usize>| {
            among.min_by(|&p, &q| dist(p).total_cmp(&dist(q)).then(q.cmp(&p)))
        };
        let product = |p: Point| u128::from(p.0) * u128::from(p.1);
        let floor = (0..n)
            .filter(|&r| product(self.points[r]) <= product(x))
            .max_by_key(|&r| (product(self.points[r]), std::cmp::Reverse(r)))
            .or_else(|| (0..n).min_by_key(|&r| product(self.points[r])))
            .unwrap_or(0);
        let kind = &self.variants[floor];
        let overall = nearest(&mut (0..n)).unwrap_or(0);
        match nearest(&mut (0..n).filter(|&r| &self.variants[r] == kind)) {
            Some(r) => (r, self.variants[overall] == *kind),
            None => (overall, false),
        }
    }

    /// Whether every recording makes the same allocations.
    pub fn uniform(&self) -> bool {
        self.variants.windows(2).all(|w| w[0] == w[1])
    }

    /// The laws of every allocation of recording `reference`, from the
    /// recordings in `using` (all when `None`; the reference always).
    pub fn model(&self, reference: usize, using: Option<&[usize]>) -> GridModel<'_> {
        let recs = &self.series.recordings;
        let others: Vec<usize> = (0..recs.len())
            .filter(|&o| o != reference && using.is_none_or(|u| u.contains(&o)))
            .collect();
        let at = |o: usize| {
            let (a, b) = self.points[o];
            (a as f64, b as f64)
        };
        let mut pts = Vec::with_capacity(others.len() + 1);
        let fit_one = |own: u64, partner: &dyn Fn(usize) -> Option<u64>| {
            pts.clear();
            pts.push((at(reference), own));
            for &o in &others {
                if let Some(s) = partner(o) {
                    pts.push((at(o), s));
                }
            }
            (fit(&pts, own), pts.len() == others.len() + 1)
        };
        let [(laws, paired), (pre_laws, pre_paired)] =
            self.series.laws_by_partner(reference, fit_one);
        GridModel {
            grid: self,
            reference,
            laws,
            paired,
            pre_laws,
            pre_paired,
        }
    }
}

/// Every allocation of one recording with its law in both knobs.
#[derive(Debug, Clone)]
pub struct GridModel<'g> {
    pub grid: &'g Grid,
    pub reference: usize,
    pub laws: Vec<Law2>,
    /// Paired with every other recording used.
    pub paired: Vec<bool>,
    pub pre_laws: Vec<Law2>,
    pub pre_paired: Vec<bool>,
}

impl GridModel<'_> {
    pub fn recording(&self) -> &Recording {
        &self.grid.series.recordings[self.reference]
    }

    /// The sizes of every allocation and pre-trace allocation at `x`: as
    /// recorded at the reference's own point, else by the laws.
    pub fn sizes_at(&self, x: Point, allocs: &mut Vec<u64>, pre: &mut Vec<u64>) {
        let r = self.recording();
        allocs.clear();
        pre.clear();
        if x == self.grid.points[self.reference] {
            allocs.extend(r.allocs.iter().map(|a| a.size));
            pre.extend(r.pre.iter().map(|p| p.size));
            return;
        }
        let at = (x.0 as f64, x.1 as f64);
        allocs.extend(self.laws.iter().map(|l| l.at(at)));
        pre.extend(self.pre_laws.iter().map(|l| l.at(at)));
    }

    /// The peak of allocated bytes at `x`.
    pub fn peak_allocated_at(&self, x: Point) -> u64 {
        let (mut a, mut p) = (Vec::new(), Vec::new());
        self.sizes_at(x, &mut a, &mut p);
        self.recording().peak_with(&a, &p)
    }

    /// What is live at the first peak of allocated bytes at `x`.
    pub fn live_at_peak(&self, x: Point) -> LiveAtPeak {
        let (mut allocs, mut pre) = (Vec::new(), Vec::new());
        self.sizes_at(x, &mut allocs, &mut pre);
        self.recording().live_at_peak(&allocs, &pre)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pts(f: impl Fn(f64, f64) -> f64, at: &[(f64, f64)]) -> Vec<((f64, f64), u64)> {
        at.iter()
            .map(|&x| (x, f(x.0, x.1).round() as u64))
            .collect()
    }

    const CORNERS: [(f64, f64); 3] = [(16.0, 256.0), (32.0, 256.0), (16.0, 1024.0)];

    #[test]
    fn a_product_of_powers_is_read_from_three_corners() {
        // Attention scores: 8 · s² · 4 bytes, d does not move them.
        let law = fit(&pts(|_, s| 32.0 * s * s, &CORNERS), 0);
        assert_eq!(law.name(("d", "s")), "s²");
        assert_eq!(law.at((128.0, 16384.0)), 32 * 16384 * 16384);
        // Q, K, V: 8 · s · d · 4.
        let law = fit(&pts(|d, s| 32.0 * d * s, &CORNERS), 0);
        assert!(matches!(law, Law2::Power { p: 2, q: 2, .. }), "{law:?}");
        assert_eq!(law.at((128.0, 8192.0)), 32 * 128 * 8192);
        assert!(law.is_clean());
    }

    #[test]
    fn a_fixed_part_beside_scaled_ones_is_affine() {
        let f = |d: f64, s: f64| 2e6 + 4096.0 * s + 512.0 * d;
        let law = fit(&pts(f, &CORNERS), 0);
        assert!(matches!(law, Law2::Affine { .. }), "{law:?}");
        assert_eq!(law.at((64.0, 4096.0)), f(64.0, 4096.0) as u64);
        // With four points, the product term too.
        let g = |d: f64, s: f64| 1e6 + 3.0 * d * s + 100.0 * s;
        let four = [(16.0, 256.0), (32.0, 256.0), (16.0, 1024.0), (32.0, 1024.0)];
        let law = fit(&pts(g, &four), 0);
        assert_eq!(law.at((128.0, 8192.0)), g(128.0, 8192.0) as u64);
    }

    #[test]
    fn constants_and_lawless_sizes() {
        assert_eq!(
            fit(&pts(|_, _| 8519680.0, &CORNERS), 0),
            Law2::Constant(8519680.0)
        );
        let wild = [
            ((16.0, 256.0), 100),
            ((32.0, 256.0), 9_000_000),
            ((16.0, 1024.0), 3),
        ];
        assert_eq!(fit(&wild, 3), Law2::Unclear(3));
        // One point: kept as recorded.
        assert_eq!(fit(&[((16.0, 256.0), 64)], 64), Law2::Constant(64.0));
    }
}
