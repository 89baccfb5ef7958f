//! How one allocation's size follows the knob. A tensor's size is a product
//! of its dimensions, so an allocation is constant (weights), proportional
//! to a power of the knob (activations: linear in the batch, quadratic in
//! the sequence length for attention scores) or affine (a fixed part beside
//! a scaled one). From two sizes the law is read from their ratio: the
//! exponent `ln(s2/s1) / ln(x2/x1)`. An exponent off the half grid is a
//! warning, not a law; one that shrinks or climbs past x³ is no law at all
//! (the pairing is the likelier culprit) and the size is kept as recorded.

/// The largest exponent read as a law, in halves (x³).
const MAX_HALVES: u8 = 6;
/// How far a read exponent may sit from the grid and still be on it.
const GRID_TOLERANCE: f64 = 0.02;
/// With three sizes or more: the largest relative deviation of a recorded
/// size from a clean law.
const FIT_TOLERANCE: f64 = 0.01;

/// `x^(h/2)` for `h` in `0..=MAX_HALVES`: a law's terms at one size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Powers([f64; MAX_HALVES as usize + 1]);

impl Powers {
    pub fn of(x: f64) -> Powers {
        let mut p = [1.0; MAX_HALVES as usize + 1];
        let root = x.sqrt();
        for h in 1..p.len() {
            p[h] = p[h - 1] * root;
        }
        Powers(p)
    }
}

/// A sum of laws: the coefficient of `x^(h/2)` at index `h`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Terms(pub [f64; MAX_HALVES as usize + 1]);

impl Terms {
    pub fn at(&self, p: &Powers) -> f64 {
        self.0.iter().zip(&p.0).map(|(c, x)| c * x).sum()
    }
}

/// A law's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Constant,
    /// Proportional to `x^(h/2)` (`h` halves; a constant part of at most
    /// 1 % of the size allowed).
    Power(u8),
    /// A fixed part plus one proportional to the knob.
    Affine,
    /// Between two powers (halves `lo` < `hi`): the exponent read is off the
    /// half grid. A warning; sizes follow `a·x^lo + b·x^hi`.
    Mixed {
        lo: u8,
        hi: u8,
    },
    /// The size shrinks as the knob grows, or climbs faster than x³: kept
    /// at the size recorded nearest.
    Unclear,
}

/// One allocation's size law: `a·x^(ea/2) + b·x^(eb/2)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SizeLaw {
    pub kind: Kind,
    /// The exponent the two outermost sizes show (`0.0` for a constant).
    pub exponent: f64,
    a: f64,
    ea: u8,
    b: f64,
    eb: u8,
    /// The largest relative deviation of a recorded size from the law (0
    /// from two sizes, which every law meets).
    pub residual: f64,
}

impl SizeLaw {
    pub fn constant(size: u64) -> SizeLaw {
        SizeLaw {
            kind: Kind::Constant,
            exponent: 0.0,
            a: size as f64,
            ea: 0,
            b: 0.0,
            eb: 0,
            residual: 0.0,
        }
    }

    /// The size at the knob value whose terms are `p`.
    pub fn at(&self, p: &Powers) -> u64 {
        let v = self.a * p.0[self.ea as usize] + self.b * p.0[self.eb as usize];
        // `as` saturates (NaN to 0); adding a half rounds without a libm call.
        if v > 0.0 { (v + 0.5) as u64 } else { 0 }
    }

    /// Adds the law's terms into `terms` (the coefficient of `x^(h/2)` at
    /// index `h`), scaled by `sign`: sums of laws evaluate at once.
    pub fn add_terms(&self, terms: &mut Terms, sign: f64) {
        terms.0[self.ea as usize] += sign * self.a;
        terms.0[self.eb as usize] += sign * self.b;
    }

    /// The same law for an allocation `factor` times as large: what an
    /// allocation recorded at one size only borrows from its call site.
    pub fn scaled(&self, factor: f64) -> SizeLaw {
        SizeLaw {
            a: self.a * factor,
            b: self.b * factor,
            ..*self
        }
    }

    /// A law read cleanly: constant, a power on the half grid up to x²,
    /// or affine. Past x² one knob rarely reaches (a 3-D volume's side):
    /// a pairing gone wrong is the likelier reading.
    pub fn is_clean(&self) -> bool {
        matches!(self.kind, Kind::Constant | Kind::Affine)
            || matches!(self.kind, Kind::Power(h) if h <= 4)
    }

    /// The law in words: "constant", "linear", "quadratic", "x^1.5",
    /// "affine", "between linear and quadratic (exponent 1.37)", "unclear".
    pub fn name(&self) -> String {
        match self.kind {
            Kind::Constant => "constant".into(),
            Kind::Power(h) => power_name(h),
            Kind::Affine => "affine".into(),
            Kind::Mixed { lo, hi } => format!(
                "between {} and {} (exponent {:.2})",
                power_name(lo),
                power_name(hi),
                self.exponent
            ),
            Kind::Unclear if self.exponent < 0.0 => {
                format!("unclear (shrinks, exponent {:.2})", self.exponent)
            }
            Kind::Unclear => format!("unclear (exponent {:.2})", self.exponent),
        }
    }
}

fn power_name(halves: u8) -> String {
    match halves {
        0 => "constant".into(),
        2 => "linear".into(),
        4 => "quadratic".into(),
        6 => "cubic".into(),
        h => format!("x^{}", f64::from(h) / 2.0),
    }
}

/// The law of one allocation from its sizes at several knob values
/// (`(knob, bytes)`, at least one); `nearest` is the size recorded nearest
/// the sizes asked for, kept when no law fits.
pub fn fit(points: &[(f64, u64)], nearest: u64) -> SizeLaw {
    let Some(&(x0, s0)) = points.first() else {
        return SizeLaw::constant(nearest);
    };
    if points.iter().all(|&(_, s)| s == s0) {
        return SizeLaw::constant(s0);
    }
    // The exponent between the smallest and the largest knob value.
    let (lo, hi) = points.iter().fold(((x0, s0), (x0, s0)), |(lo, hi), &p| {
        (
            if p.0 < lo.0 { p } else { lo },
            if p.0 > hi.0 { p } else { hi },
        )
    });
    let exponent = if lo.1 > 0 && hi.1 > 0 && hi.0 > lo.0 {
        (hi.1 as f64 / lo.1 as f64).ln() / (hi.0 / lo.0).ln()
    } else {
        f64::NAN
    };
    let unclear = SizeLaw {
        kind: Kind::Unclear,
        exponent,
        ..SizeLaw::constant(nearest)
    };
    if !(-GRID_TOLERANCE..=3.0 + GRID_TOLERANCE).contains(&exponent) {
        return unclear;
    }
    let e = exponent.max(0.0);
    // The shapes to try, the likeliest first: integer powers, affine, half
    // powers, then the two integer powers around the exponent.
    let int = e.round();
    let half = (2.0 * e).round() / 2.0;
    let mut shapes: Vec<(Kind, u8, u8)> = Vec::with_capacity(4);
    if (e - int).abs() <= GRID_TOLERANCE && int >= 1.0 {
        let h = 2 * int as u8;
        shapes.push((Kind::Power(h), 0, h));
    }
    if e < 1.0 {
        shapes.push((Kind::Affine, 0, 2));
    }
    if (e - half).abs() <= GRID_TOLERANCE && half > 0.0 {
        let h = (2.0 * half) as u8;
        shapes.push((Kind::Power(h), 0, h));
    }
    let below = (e.floor() as u8).min(2);
    shapes.push((
        Kind::Mixed {
            lo: 2 * below,
            hi: 2 * below + 2,
        },
        2 * below,
        2 * below + 2,
    ));
    let mut best: Option<SizeLaw> = None;
    for (kind, ea, eb) in shapes {
        let Some((a, b)) = least_squares(points, ea, eb) else {
            continue;
        };
        let mut law = SizeLaw {
            kind,
            exponent,
            a,
            ea,
            b,
            eb,
            residual: 0.0,
        };
        law.residual = points
            .iter()
            .map(|&(x, s)| {
                let got = law.at(&Powers::of(x)) as f64;
                (got - s as f64).abs() / (s as f64).max(1.0)
            })
            .fold(0.0, f64::max);
        // A power with a constant part past 1 % is affine in that power.
        if let Kind::Power(h) = kind
            && a.abs() > 0.01 * (hi.1 as f64)
        {
            law.kind = if h == 2 {
                Kind::Affine
            } else {
                Kind::Mixed { lo: 0, hi: h }
            };
        }
        if law.residual <= FIT_TOLERANCE {
            return law;
        }
        if best.is_none_or(|b| law.residual < b.residual) {
            best = Some(law);
        }
    }
    match best {
        // Three sizes or more that no two-term law meets within 1 %.
        Some(law) => SizeLaw {
            kind: match law.kind {
                Kind::Mixed { .. } => law.kind,
                _ => Kind::Mixed {
                    lo: law.ea,
                    hi: law.eb,
                },
            },
            ..law
        },
        None => unclear,
    }
}

/// `a·x^(ea/2) + b·x^(eb/2)` through `points`, least squares in relative
/// terms (each size weighs by its inverse, so a small allocation's fit
/// counts as much as a large one's); exact through two points.
fn least_squares(points: &[(f64, u64)], ea: u8, eb: u8) -> Option<(f64, f64)> {
    let (mut saa, mut sab, mut sbb, mut sa, mut sb) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for &(x, s) in points {
        let w = 1.0 / (s as f64).max(1.0);
        let p = Powers::of(x);
        let (u, v) = (p.0[ea as usize] * w, p.0[eb as usize] * w);
        let y = s as f64 * w;
        saa += u * u;
        sab += u * v;
        sbb += v * v;
        sa += u * y;
        sb += v * y;
    }
    let det = saa * sbb - sab * sab;
    if det.abs() <= f64::EPSILON * saa * sbb || !det.is_finite() {
        return None;
    }
    Some(((sa * sbb - sb * sab) / det, (saa * sb - sab * sa) / det))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(law: &SizeLaw, x: f64) -> u64 {
        law.at(&Powers::of(x))
    }

    #[test]
    fn equal_sizes_are_constant() {
        let law = fit(&[(8.0, 4096), (16.0, 4096)], 4096);
        assert_eq!(law.kind, Kind::Constant);
        assert_eq!(at(&law, 1000.0), 4096);
    }

    #[test]
    fn a_batch_linear_size_is_linear() {
        let law = fit(&[(8.0, 8 * 3072), (16.0, 16 * 3072)], 0);
        assert_eq!(law.kind, Kind::Power(2));
        assert_eq!(law.name(), "linear");
        assert_eq!(at(&law, 28.0), 28 * 3072);
    }

    #[test]
    fn attention_scores_are_quadratic_in_the_sequence() {
        // 8 heads × s × s × 4 bytes.
        let s = |n: u64| 8 * n * n * 4;
        let law = fit(&[(256.0, s(256)), (1024.0, s(1024))], 0);
        assert_eq!(law.kind, Kind::Power(4));
        assert_eq!(at(&law, 16384.0), s(16384));
    }

    #[test]
    fn a_fixed_part_beside_a_scaled_one_is_affine() {
        let s = |n: u64| 1_000_000 + 4096 * n;
        let law = fit(&[(128.0, s(128)), (256.0, s(256))], 0);
        assert_eq!(law.kind, Kind::Affine);
        assert!(law.is_clean());
        assert_eq!(at(&law, 2048.0), s(2048));
    }

    #[test]
    fn an_exponent_off_the_grid_is_a_warning_that_still_interpolates() {
        // s + s²: exponent about 1.6 between 128 and 512.
        let s = |n: u64| 4 * (1000 * n + n * n);
        let law = fit(&[(128.0, s(128)), (512.0, s(512))], 0);
        assert!(matches!(law.kind, Kind::Mixed { lo: 2, hi: 4 }), "{law:?}");
        assert!(!law.is_clean());
        assert_eq!(at(&law, 1024.0), s(1024));
        assert!(law.name().starts_with("between linear and quadratic"));
    }

    #[test]
    fn a_steep_or_shrinking_ratio_is_no_law() {
        let steep = fit(&[(128.0, 512), (256.0, 512 * 1024)], 512 * 1024);
        assert_eq!(steep.kind, Kind::Unclear);
        assert_eq!(at(&steep, 4096.0), 512 * 1024, "kept as recorded nearest");
        let shrinks = fit(&[(8.0, 4000), (16.0, 2000)], 2000);
        assert_eq!(shrinks.kind, Kind::Unclear);
        assert!(shrinks.name().contains("shrinks"));
    }

    #[test]
    fn three_sizes_fit_all_and_measure_the_residual() {
        let s = |n: u64| 2 * n * n;
        let law = fit(&[(128.0, s(128)), (256.0, s(256)), (512.0, s(512))], 0);
        assert_eq!(law.kind, Kind::Power(4));
        assert!(law.residual < 1e-9);
        // A third size that breaks the law of the other two.
        let law = fit(&[(128.0, s(128)), (256.0, s(256)), (512.0, s(512) / 3)], 0);
        assert!(!law.is_clean());
        assert!(law.residual > FIT_TOLERANCE);
    }
}
