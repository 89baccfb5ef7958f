//! Several recordings of one workload, paired, and the model of any size:
//! the recording nearest to it (the larger when extrapolating above), each
//! allocation at its law's size.

use super::align::{self, Method, UNPAIRED};
use super::law::{self, Powers, SizeLaw, Terms};
use super::{Recording, Step};

/// Inputs that do not make one series.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SeriesError {
    #[error("{0} and {1} were both recorded at size {2}: each input needs its own size")]
    EqualSizes(String, String, u64),
    #[error(
        "{a} and {b} are not one workload: {paired} of {smaller} allocations pair by call site and order, and {shared:.0} % of the call sites of {a} appear in {b} (fit needs one workload recorded at several sizes)"
    )]
    NotOneWorkload {
        a: String,
        b: String,
        paired: usize,
        smaller: usize,
        shared: f64,
    },
}

/// The least share of allocations that pair, or of call sites that two
/// recordings share, for them to be one workload: two recordings of one
/// workload share nearly every call site; two models share at most the
/// training loop's.
const ONE_WORKLOAD_PAIRED: f64 = 0.3;
const ONE_WORKLOAD_SHARED: f64 = 0.5;
/// Series of up to this many recordings fit each distinct set of sizes once.
const MEMO_INPUTS: usize = 8;

/// Recordings of one workload, by ascending size, and how each pairs with
/// each other.
#[derive(Debug, Clone)]
pub struct Series {
    pub recordings: Vec<Recording>,
    /// `pairs[r][o]`: for each allocation of `r`, its partner in `o`.
    pairs: Vec<Vec<Vec<u32>>>,
    /// `pre_pairs[r][o]`: the same for the memory live before the trace.
    pre_pairs: Vec<Vec<Vec<u32>>>,
    /// `methods[r][o]`: how `r` and `o` were paired.
    methods: Vec<Vec<Method>>,
}

/// Allocations of one call site that appear in one recording only.
#[derive(Debug, Clone, PartialEq)]
pub struct Unpaired {
    /// The recording, an index into [`Series::recordings`].
    pub recording: usize,
    pub site: String,
    pub count: usize,
    /// The largest of them.
    pub largest_bytes: u64,
    pub bytes: u64,
}

/// The law of a call site's largest allocation.
#[derive(Debug, Clone, PartialEq)]
pub struct SiteLaw<L = SizeLaw> {
    pub site: String,
    pub law: L,
    /// Its size in each recording (`None` where it did not pair).
    pub sizes: Vec<Option<u64>>,
    /// Allocations of the site.
    pub count: usize,
}

impl Series {
    /// Pairs the recordings; refuses two at one size and two that are not
    /// one workload.
    pub fn new(mut recordings: Vec<Recording>) -> Result<Series, SeriesError> {
        recordings.sort_by_key(|r| r.size);
        for w in recordings.windows(2) {
            if w[0].size == w[1].size {
                return Err(SeriesError::EqualSizes(
                    w[0].input.clone(),
                    w[1].input.clone(),
                    w[0].size,
                ));
            }
        }
        let n = recordings.len();
        let keys: Vec<(Vec<u64>, Vec<u64>)> = recordings.iter().map(Recording::keys).collect();
        let pre_sizes: Vec<Vec<u64>> = recordings
            .iter()
            .map(|r| r.pre.iter().map(|p| p.size).collect())
            .collect();
        let mut pairs = vec![vec![Vec::new(); n]; n];
        let mut pre_pairs = vec![vec![Vec::new(); n]; n];
        let mut methods = vec![vec![Method::Identical; n]; n];
        for r in 0..n {
            for o in r + 1..n {
                let (kr, ko) = (&keys[r], &keys[o]);
                let (p, method) = align::align((&kr.0, &kr.1), (&ko.0, &ko.1));
                check_one_workload(&recordings[r], &recordings[o], &p, &kr.1, &ko.1)?;
                pairs[o][r] = invert(&p, ko.0.len());
                pairs[r][o] = p;
                methods[r][o] = method;
                methods[o][r] = method;
                let pp = align::by_size(&pre_sizes[r], &pre_sizes[o]);
                pre_pairs[o][r] = invert(&pp, pre_sizes[o].len());
                pre_pairs[r][o] = pp;
            }
        }
        Ok(Series {
            recordings,
            pairs,
            pre_pairs,
            methods,
        })
    }

    /// How recordings `r` and `o` were paired.
    pub fn method(&self, r: usize, o: usize) -> Method {
        self.methods[r][o]
    }

    /// For each allocation of recording `r`, its partner in `o` (`UNPAIRED`
    /// for none).
    pub fn partners(&self, r: usize, o: usize) -> &[u32] {
        &self.pairs[r][o]
    }

    /// The call sites of recording `r` with the law (`law` of an allocation's
    /// index) of each one's largest allocation and its size in every
    /// recording, the largest first (`top` of them).
    pub fn site_laws<L>(&self, r: usize, top: usize, law: impl Fn(usize) -> L) -> Vec<SiteLaw<L>> {
        let rec = &self.recordings[r];
        let mut best: rustc_hash::FxHashMap<u32, (usize, usize)> = Default::default();
        for (i, a) in rec.allocs.iter().enumerate() {
            let e = best.entry(a.site).or_insert((i, 0));
            if a.size > rec.allocs[e.0].size {
                e.0 = i;
            }
            e.1 += 1;
        }
        let mut rows: Vec<SiteLaw<L>> = best
            .into_iter()
            .map(|(site, (i, count))| SiteLaw {
                site: rec.sites[site as usize].clone(),
                law: law(i),
                sizes: (0..self.recordings.len())
                    .map(|o| {
                        if o == r {
                            return Some(rec.allocs[i].size);
                        }
                        let j = self.pairs[r][o][i];
                        (j != UNPAIRED).then(|| self.recordings[o].allocs[j as usize].size)
                    })
                    .collect(),
                count,
            })
            .collect();
        rows.sort_by(|a, b| {
            let big = |s: &SiteLaw<L>| s.sizes.iter().flatten().max().copied().unwrap_or(0);
            big(b).cmp(&big(a)).then(a.site.cmp(&b.site))
        });
        rows.truncate(top);
        rows
    }

    /// For each pre-trace allocation of recording `r`, its partner in `o`.
    pub fn pre_partners(&self, r: usize, o: usize) -> &[u32] {
        &self.pre_pairs[r][o]
    }

    /// The law of each allocation of recording `reference`, then of each
    /// allocation live before its trace, with whether it paired:
    /// `fit_one(its size, its partner's size in recording o)`, in one knob
    /// or two.
    pub(crate) fn laws_by_partner<L>(
        &self,
        reference: usize,
        mut fit_one: impl FnMut(u64, &dyn Fn(usize) -> Option<u64>) -> (L, bool),
    ) -> [(Vec<L>, Vec<bool>); 2] {
        let r = &self.recordings[reference];
        let allocs = laws_of(&mut fit_one, r.allocs.iter().map(|a| a.size), |o, i| {
            let j = self.pairs[reference][o][i];
            (j != UNPAIRED).then(|| self.recordings[o].allocs[j as usize].size)
        });
        let pre = laws_of(&mut fit_one, r.pre.iter().map(|p| p.size), |o, i| {
            let j = self.pre_pairs[reference][o][i];
            (j != UNPAIRED).then(|| self.recordings[o].pre[j as usize].size)
        });
        [allocs, pre]
    }

    /// The recording whose timeline a prediction at `size` follows: the
    /// nearest by ratio, the larger of two when above both.
    pub fn reference_for(&self, size: u64) -> usize {
        self.nearest(size, None)
    }

    /// [`Self::reference_for`] among the recordings but `left_out` (the
    /// check of one recording by the others).
    pub fn nearest(&self, size: u64, left_out: Option<usize>) -> usize {
        let among = || (0..self.recordings.len()).filter(|&r| Some(r) != left_out);
        let largest = among().next_back().unwrap_or(0);
        if size >= self.recordings[largest].size {
            return largest;
        }
        let ln = |v: u64| (v.max(1) as f64).ln();
        among()
            .min_by(|&a, &b| {
                let da = (ln(self.recordings[a].size) - ln(size)).abs();
                let db = (ln(self.recordings[b].size) - ln(size)).abs();
                da.total_cmp(&db).then(b.cmp(&a))
            })
            .unwrap_or(largest)
    }

    /// The laws of every allocation of recording `reference`, fitted on
    /// the recordings in `using` (all of them when `None`; the recording
    /// itself is always used).
    pub fn model(&self, reference: usize, using: Option<&[usize]>) -> Model<'_> {
        let r = &self.recordings[reference];
        let others: Vec<usize> = (0..self.recordings.len())
            .filter(|&o| o != reference && using.is_none_or(|u| u.contains(&o)))
            .collect();
        let mut points = Vec::with_capacity(others.len() + 1);
        // A trace repeats its steps: the same sizes, the same law. Keyed by
        // each input's size (`u64::MAX` where unpaired), up to MEMO_INPUTS.
        let mut memo: rustc_hash::FxHashMap<[u64; MEMO_INPUTS], SizeLaw> = Default::default();
        let fit_one = |own: u64, partner: &dyn Fn(usize) -> Option<u64>| {
            points.clear();
            points.push((r.size as f64, own));
            let mut key = [u64::MAX; MEMO_INPUTS];
            key[0] = own;
            for (k, &o) in others.iter().enumerate() {
                if let Some(s) = partner(o) {
                    points.push((self.recordings[o].size as f64, s));
                    if let Some(slot) = key.get_mut(k + 1) {
                        *slot = s;
                    }
                }
            }
            let law = if others.len() < MEMO_INPUTS {
                *memo.entry(key).or_insert_with(|| law::fit(&points, own))
            } else {
                law::fit(&points, own)
            };
            (law, points.len() > 1)
        };
        let [(mut laws, paired), (pre_laws, pre_paired)] = self.laws_by_partner(reference, fit_one);
        let borrowed = borrow_laws(r, &mut laws, &paired);
        Model {
            series: self,
            reference,
            laws,
            paired,
            borrowed,
            pre_laws,
            pre_paired,
        }
    }

    /// Allocations of each recording that pair with no other recording,
    /// grouped by call site, the most bytes first.
    pub fn unpaired(&self) -> Vec<Unpaired> {
        let mut out = Vec::new();
        for (r, rec) in self.recordings.iter().enumerate() {
            let mut by_site: rustc_hash::FxHashMap<u32, Unpaired> = Default::default();
            for (i, a) in rec.allocs.iter().enumerate() {
                let lonely = (0..self.recordings.len())
                    .filter(|&o| o != r)
                    .all(|o| self.pairs[r][o][i] == UNPAIRED);
                if lonely {
                    let u = by_site.entry(a.site).or_insert_with(|| Unpaired {
                        recording: r,
                        site: rec.sites[a.site as usize].clone(),
                        count: 0,
                        largest_bytes: 0,
                        bytes: 0,
                    });
                    u.count += 1;
                    u.bytes += a.size;
                    u.largest_bytes = u.largest_bytes.max(a.size);
                }
            }
            out.extend(by_site.into_values());
        }
        out.sort_by(|a, b| {
            b.largest_bytes
                .cmp(&a.largest_bytes)
                .then(a.recording.cmp(&b.recording))
                .then(a.site.cmp(&b.site))
        });
        out
    }
}

/// Refuses two recordings that share too little to be one workload.
fn check_one_workload(
    a: &Recording,
    b: &Recording,
    pairs: &[u32],
    ka: &[u64],
    kb: &[u64],
) -> Result<(), SeriesError> {
    let smaller = ka.len().min(kb.len());
    if smaller == 0 {
        return Ok(());
    }
    // Pairs of equal call sites: a stretch paired in order proves nothing.
    let paired = pairs
        .iter()
        .zip(ka)
        .filter(|&(&j, k)| j != UNPAIRED && kb.get(j as usize) == Some(k))
        .count();
    let in_b: rustc_hash::FxHashSet<u64> = kb.iter().copied().collect();
    let mut sites_a: Vec<u64> = ka.to_vec();
    sites_a.sort_unstable();
    sites_a.dedup();
    let shared =
        sites_a.iter().filter(|k| in_b.contains(k)).count() as f64 / sites_a.len().max(1) as f64;
    if (paired as f64) < ONE_WORKLOAD_PAIRED * smaller as f64 && shared < ONE_WORKLOAD_SHARED {
        return Err(SeriesError::NotOneWorkload {
            a: a.input.clone(),
            b: b.input.clone(),
            paired,
            smaller,
            shared: shared * 100.0,
        });
    }
    Ok(())
}

/// An allocation recorded at one size only (another iteration, a kernel
/// path taken above some size) takes the law of its call site: of the
/// paired allocations with its key (else its key without lines), the one
/// nearest in size, scaled to its size. Returns which borrowed one.
fn borrow_laws(r: &Recording, laws: &mut [SizeLaw], paired: &[bool]) -> Vec<bool> {
    use rustc_hash::FxHashMap;
    // Per key, the paired allocations as (size, index), by size.
    let mut fine: FxHashMap<u64, Vec<(u64, usize)>> = FxHashMap::default();
    let mut coarse: FxHashMap<u64, Vec<(u64, usize)>> = FxHashMap::default();
    for (i, a) in r.allocs.iter().enumerate() {
        if paired[i] && laws[i].kind != law::Kind::Unclear {
            fine.entry(a.key).or_default().push((a.size, i));
            coarse.entry(a.coarse).or_default().push((a.size, i));
        }
    }
    for v in fine.values_mut().chain(coarse.values_mut()) {
        v.sort_unstable();
    }
    let mut borrowed = vec![false; r.allocs.len()];
    for (i, a) in r.allocs.iter().enumerate() {
        if paired[i] {
            continue;
        }
        let Some(donors) = fine.get(&a.key).or_else(|| coarse.get(&a.coarse)) else {
            continue;
        };
        // The nearest size by ratio: one of the two around it.
        let at = donors.partition_point(|&(s, _)| s < a.size);
        let ratio = |k: usize| {
            let s = donors[k].0.max(1) as f64;
            (s / a.size.max(1) as f64).max(a.size.max(1) as f64 / s)
        };
        let j = match (at.checked_sub(1), (at < donors.len()).then_some(at)) {
            (Some(lo), Some(hi)) if ratio(lo) <= ratio(hi) => lo,
            (_, Some(hi)) => hi,
            (Some(lo), None) => lo,
            (None, None) => continue,
        };
        let (size, donor) = donors[j];
        if size > 0 {
            laws[i] = laws[donor].scaled(a.size as f64 / size as f64);
            borrowed[i] = true;
        }
    }
    borrowed
}

fn invert(pairs: &[u32], len: usize) -> Vec<u32> {
    let mut back = vec![UNPAIRED; len];
    for (i, &j) in pairs.iter().enumerate() {
        if let Some(slot) = back.get_mut(j as usize) {
            *slot = u32::try_from(i).unwrap_or(UNPAIRED);
        }
    }
    back
}

/// How many kept candidates a new one is compared with when pruning.
const PRUNE_WINDOW: usize = 64;

/// The peak of allocated bytes at any size without a pass over the trace:
/// the live sums (as sums of laws) after each run of allocations, those no
/// other sum beats in every term. Sizes are not rounded to bytes one by one,
/// so it may differ from [`Model::peak_allocated_at`] by a byte per live
/// allocation: a bound for searching, not a figure to print.
#[derive(Debug, Clone, PartialEq)]
pub struct Peaks(Vec<Terms>);

impl Peaks {
    pub fn at(&self, size: u64) -> u64 {
        let p = Powers::of(size as f64);
        let v = self.0.iter().map(|t| t.at(&p)).fold(0.0, f64::max);
        if v > 0.0 { (v + 0.5) as u64 } else { 0 }
    }
}

/// Each size's law (`fit_one(own, partner's size in recording o)`) and
/// whether it paired; `partner(o, i)`: the size paired with the `i`th in `o`.
fn laws_of<L>(
    fit_one: &mut impl FnMut(u64, &dyn Fn(usize) -> Option<u64>) -> (L, bool),
    sizes: impl Iterator<Item = u64>,
    partner: impl Fn(usize, usize) -> Option<u64>,
) -> (Vec<L>, Vec<bool>) {
    let n = sizes.size_hint().0;
    let (mut laws, mut paired) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for (i, own) in sizes.enumerate() {
        let (law, p) = fit_one(own, &|o| partner(o, i));
        laws.push(law);
        paired.push(p);
    }
    (laws, paired)
}

/// Every allocation of one recording with its law: the predicted trace's
/// sizes at any knob value.
#[derive(Debug, Clone)]
pub struct Model<'s> {
    pub series: &'s Series,
    /// The recording whose timeline is followed.
    pub reference: usize,
    /// Per allocation of the reference.
    pub laws: Vec<SizeLaw>,
    /// Per allocation: paired with at least one other recording.
    pub paired: Vec<bool>,
    /// Per allocation: unpaired, its law borrowed from its call site.
    pub borrowed: Vec<bool>,
    /// Per pre-trace allocation of the reference.
    pub pre_laws: Vec<SizeLaw>,
    pub pre_paired: Vec<bool>,
}

impl Model<'_> {
    pub fn recording(&self) -> &Recording {
        &self.series.recordings[self.reference]
    }

    /// The sizes of every allocation and every pre-trace allocation at
    /// `size`: as recorded at the reference's own size, else by the laws.
    pub fn sizes_at(&self, size: u64, allocs: &mut Vec<u64>, pre: &mut Vec<u64>) {
        let r = self.recording();
        allocs.clear();
        pre.clear();
        if size == r.size {
            allocs.extend(r.allocs.iter().map(|a| a.size));
            pre.extend(r.pre.iter().map(|p| p.size));
            return;
        }
        let p = Powers::of(size as f64);
        allocs.extend(self.laws.iter().map(|l| l.at(&p)));
        pre.extend(self.pre_laws.iter().map(|l| l.at(&p)));
    }

    /// The live sums the peak of allocated bytes can be at, as sums of laws
    /// (see [`Peaks`]).
    pub fn peaks(&self) -> Peaks {
        let r = self.recording();
        let mut now = Terms::default();
        for l in &self.pre_laws {
            l.add_terms(&mut now, 1.0);
        }
        let mut candidates = vec![now];
        let mut rising = false;
        for s in &r.timeline {
            match *s {
                Step::Alloc(i) => {
                    self.laws[i as usize].add_terms(&mut now, 1.0);
                    rising = true;
                }
                Step::Free(i) | Step::PreFree(i) => {
                    if rising {
                        candidates.push(now);
                        rising = false;
                    }
                    let law = match *s {
                        Step::Free(_) => &self.laws[i as usize],
                        _ => &self.pre_laws[i as usize],
                    };
                    law.add_terms(&mut now, -1.0);
                }
            }
        }
        if rising {
            candidates.push(now);
        }
        // Drop a candidate another one matches or beats in every term (all
        // powers of the knob are positive, so it never is the peak).
        candidates.sort_by(|a, b| b.0.iter().sum::<f64>().total_cmp(&a.0.iter().sum::<f64>()));
        let mut kept: Vec<Terms> = Vec::new();
        for c in candidates {
            let beaten = kept
                .iter()
                .rev()
                .take(PRUNE_WINDOW)
                .any(|k| k.0.iter().zip(&c.0).all(|(a, b)| a >= b));
            if !beaten {
                kept.push(c);
            }
        }
        Peaks(kept)
    }

    /// The peak of allocated bytes at `size`.
    pub fn peak_allocated_at(&self, size: u64) -> u64 {
        let (mut a, mut p) = (Vec::new(), Vec::new());
        self.sizes_at(size, &mut a, &mut p);
        self.recording().peak_with(&a, &p)
    }

    /// The call sites of the reference with the law of each one's largest
    /// allocation, the largest first (`top` of them).
    pub fn site_laws(&self, top: usize) -> Vec<SiteLaw> {
        self.series.site_laws(self.reference, top, |i| self.laws[i])
    }

    /// Bytes of the pre-trace memory whose size differs between the
    /// recordings (leftovers of a step at that size), at the reference.
    pub fn pre_trace_varying(&self) -> (usize, u64) {
        let r = self.recording();
        self.pre_laws
            .iter()
            .zip(&r.pre)
            .filter(|(l, _)| l.kind != law::Kind::Constant)
            .fold((0, 0), |(n, b), (_, p)| (n + 1, b + p.size))
    }
}
