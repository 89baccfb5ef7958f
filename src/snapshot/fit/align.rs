//! Pairs the allocations of two recordings of one workload. Two recordings
//! are rarely identical call for call: a workspace appears above some size,
//! a benchmark loop records another number of iterations, another shape
//! takes another kernel. So the two key sequences are aligned (the longest
//! common subsequence, Myers' O((N+M)·D) greedy diff, which is linear when
//! the recordings agree), and a run of unpaired allocations that has a run
//! of the same length facing it on the other side is paired in order: the
//! same calls, keyed differently.

use std::ops::Range;

/// No partner.
pub const UNPAIRED: u32 = u32::MAX;

/// What pairs a stretch of `a` with the stretch of `b` facing it.
type Gap<'g> = dyn FnMut(Range<usize>, Range<usize>, &mut [u32]) + 'g;

/// Past this many insertions and deletions the diff of two whole sequences
/// stops (its trace-back would hold about D² entries), and they are aligned
/// window by window instead ([`windowed`]).
const MAX_EDITS: usize = 2048;
/// Past this many key comparisons the diff stops too: its worst case is
/// (N+M)·D, seconds on two long traces that differ throughout.
const MAX_COMPARISONS: u64 = 20_000_000;
/// Allocations of `a` per window of [`windowed`]; `b`'s window is a quarter
/// longer, so an insertion there still finds its match.
const WINDOW: usize = 1024;

/// How two sequences were paired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// The same keys in the same order.
    Identical,
    /// The longest common subsequence, and runs facing each other in order.
    Aligned,
    /// Too many differences to align at once (every iteration of a long
    /// trace differs a little): aligned window by window.
    Windowed,
}

impl Method {
    /// As JSON and the text name it.
    pub fn name(self) -> &'static str {
        match self {
            Method::Identical => "identical",
            Method::Aligned => "aligned",
            Method::Windowed => "windowed",
        }
    }
}

/// For each index of `a`, the index of `b` it pairs with ([`UNPAIRED`] for
/// none), from each side's keys with lines and without (`(fine, coarse)`):
/// aligned on the fine keys, each stretch between two matched runs aligned
/// again on the coarse keys (a call site whose line moved), and what still
/// faces a stretch of the same length paired in order. Pairs never cross.
pub fn align(a: (&[u64], &[u64]), b: (&[u64], &[u64])) -> (Vec<u32>, Method) {
    let ((fa, ca), (fb, cb)) = (a, b);
    if fa == fb {
        return ((0..fa.len()).map(index).collect(), Method::Identical);
    }
    let mut pairs = vec![UNPAIRED; fa.len()];
    let mut coarse_gap = |ra: Range<usize>, rb: Range<usize>, pairs: &mut [u32]| {
        let (oa, ob) = (ra.start, rb.start);
        let fitted = diff_pairs(
            &ca[ra.clone()],
            &cb[rb.clone()],
            (oa, ob),
            pairs,
            &mut in_order,
            MAX_EDITS,
        );
        if !fitted {
            in_order(ra, rb, pairs);
        }
    };
    if diff_pairs(fa, fb, (0, 0), &mut pairs, &mut coarse_gap, MAX_EDITS) {
        return (pairs, Method::Aligned);
    }
    // Lines moved throughout (an edited script): the keys without them.
    pairs.fill(UNPAIRED);
    if diff_pairs(ca, cb, (0, 0), &mut pairs, &mut in_order, MAX_EDITS) {
        return (pairs, Method::Aligned);
    }
    pairs.fill(UNPAIRED);
    windowed(ca, cb, &mut pairs, &mut in_order);
    (pairs, Method::Windowed)
}

/// Aligns two long sequences a window at a time: the diff of `WINDOW`
/// allocations of `a` against a quarter more of `b`; the pairs in the first
/// half of the window are kept (near its end the diff cannot see what
/// follows), and the next window starts after the last of them.
fn windowed(a: &[u64], b: &[u64], pairs: &mut [u32], gap: &mut Gap) {
    let (mut ia, mut ib) = (0usize, 0usize);
    while ia < a.len() && ib < b.len() {
        let wa = (a.len() - ia).min(WINDOW);
        let wb = (b.len() - ib).min(WINDOW + WINDOW / 4);
        let last = ia + wa == a.len() || ib + wb == b.len();
        let Some(snakes) = myers(&a[ia..ia + wa], &b[ib..ib + wb], 2 * WINDOW) else {
            // Nothing alike here: step over half of each window.
            ia += wa.div_ceil(2);
            ib += wb.div_ceil(2);
            continue;
        };
        let cut = if last { wa } else { wa / 2 };
        let (mut ea, mut eb) = (0usize, 0usize);
        for (sa, sb, len) in snakes {
            if sa >= cut {
                break;
            }
            if sa > ea || sb > eb {
                gap(ia + ea..ia + sa, ib + eb..ib + sb, pairs);
            }
            for t in 0..len {
                pairs[ia + sa + t] = index(ib + sb + t);
            }
            (ea, eb) = (sa + len, sb + len);
        }
        if last {
            if wa > ea || wb > eb {
                gap(ia + ea..ia + wa, ib + eb..ib + wb, pairs);
            }
            break;
        }
        if ea == 0 {
            // No match in the first half: its allocations stay unpaired.
            ia += cut.max(1);
        } else {
            ia += ea;
            ib += eb;
        }
    }
}

/// The longest stretch paired in order for want of keys: longer ones (two
/// recordings with nothing in common, say) stay unpaired.
const IN_ORDER_MAX: usize = 64;

/// Pairs a stretch of `a` with the stretch of `b` facing it, in order, when
/// they are as long, and short.
fn in_order(ra: Range<usize>, rb: Range<usize>, pairs: &mut [u32]) {
    if ra.len() == rb.len() && ra.len() <= IN_ORDER_MAX {
        for (i, j) in ra.zip(rb) {
            pairs[i] = index(j);
        }
    }
}

/// Writes the pairs of a shortest edit script from `a` to `b` (whose first
/// items are items `offset` of the whole sequences) into `pairs`, and hands
/// each stretch between matched runs to `gap`; false (nothing written) when
/// the two differ past the diff's bounds.
fn diff_pairs(
    a: &[u64],
    b: &[u64],
    (oa, ob): (usize, usize),
    pairs: &mut [u32],
    gap: &mut Gap<'_>,
    max_edits: usize,
) -> bool {
    let prefix = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let suffix = a[prefix..]
        .iter()
        .rev()
        .zip(b[prefix..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let (ma, mb) = (&a[prefix..a.len() - suffix], &b[prefix..b.len() - suffix]);
    let Some(snakes) = myers(ma, mb, max_edits) else {
        return false;
    };
    let run = |from_a: usize, from_b: usize, len: usize, pairs: &mut [u32]| {
        for t in 0..len {
            pairs[oa + from_a + t] = index(ob + from_b + t);
        }
    };
    run(0, 0, prefix, pairs);
    run(a.len() - suffix, b.len() - suffix, suffix, pairs);
    // The middle's matched runs, and the stretches between them.
    let (mut ia, mut ib) = (prefix, prefix);
    for (sa, sb, len) in snakes {
        let (sa, sb) = (prefix + sa, prefix + sb);
        if sa > ia || sb > ib {
            gap(oa + ia..oa + sa, ob + ib..ob + sb, pairs);
        }
        run(sa, sb, len, pairs);
        (ia, ib) = (sa + len, sb + len);
    }
    let (ea, eb) = (a.len() - suffix, b.len() - suffix);
    if ea > ia || eb > ib {
        gap(oa + ia..oa + ea, ob + ib..ob + eb, pairs);
    }
    true
}

fn index(i: usize) -> u32 {
    u32::try_from(i).unwrap_or(UNPAIRED)
}

/// The matching runs `(start in a, start in b, length)` of a shortest edit
/// script from `a` to `b`, in order; `None` past `max_edits` edits or
/// [`MAX_COMPARISONS`] comparisons.
fn myers(a: &[u64], b: &[u64], max_edits: usize) -> Option<Vec<(usize, usize, usize)>> {
    let (n, m) = (a.len() as isize, b.len() as isize);
    let max = (a.len() + b.len()).min(max_edits) as isize;
    let off = max + 1;
    let mut v = vec![0isize; 2 * off as usize + 1];
    // v after each round d, for the trace-back: the diagonals -d..=d.
    let mut history: Vec<Vec<isize>> = Vec::new();
    let mut work = 0u64;
    let snake = |mut x: isize, k: isize, work: &mut u64| {
        let start = x;
        let mut y = x - k;
        while x < n && y < m && a[x as usize] == b[y as usize] {
            x += 1;
            y += 1;
        }
        *work += 1 + (x - start) as u64;
        x
    };
    for d in 0..=max {
        let mut k = -d;
        while k <= d {
            let x = if k == -d || (k != d && v[(off + k - 1) as usize] < v[(off + k + 1) as usize])
            {
                v[(off + k + 1) as usize]
            } else {
                v[(off + k - 1) as usize] + 1
            };
            let x = snake(x, k, &mut work);
            v[(off + k) as usize] = x;
            if x >= n && x - k >= m {
                history.push(v[(off - d) as usize..=(off + d) as usize].to_vec());
                return Some(trace_back(&history, n, m));
            }
            k += 2;
        }
        if work > MAX_COMPARISONS {
            return None;
        }
        history.push(v[(off - d) as usize..=(off + d) as usize].to_vec());
    }
    None
}

/// Walks the rounds back from (n, m), collecting the diagonal runs.
fn trace_back(history: &[Vec<isize>], n: isize, m: isize) -> Vec<(usize, usize, usize)> {
    let at = |d: usize, k: isize| history[d][(k + d as isize) as usize];
    let (mut x, mut y) = (n, m);
    let mut runs = Vec::new();
    for d in (0..history.len()).rev() {
        let k = x - y;
        let di = d as isize;
        let (start_x, prev_k) = if d == 0 {
            (0, 0)
        } else {
            let prev_k = if k == -di || (k != di && at(d - 1, k - 1) < at(d - 1, k + 1)) {
                k + 1
            } else {
                k - 1
            };
            let prev_x = at(d - 1, prev_k);
            // The edit of round d lands at (sx, sx - k), then the run follows.
            let sx = if prev_k == k + 1 { prev_x } else { prev_x + 1 };
            (sx, prev_k)
        };
        let start_y = start_x - k;
        if x > start_x {
            runs.push((start_x as usize, start_y as usize, (x - start_x) as usize));
        }
        if d == 0 {
            break;
        }
        x = at(d - 1, prev_k);
        y = x - prev_k;
    }
    runs.reverse();
    runs
}

/// Pairs two multisets of sizes (the memory live before each trace began,
/// which records no order that survives another size): equal sizes first,
/// in order, then what is left of each side by rank of size.
pub fn by_size(a: &[u64], b: &[u64]) -> Vec<u32> {
    let mut pairs = vec![UNPAIRED; a.len()];
    let mut free: rustc_hash::FxHashMap<u64, Vec<u32>> = rustc_hash::FxHashMap::default();
    for (j, &s) in b.iter().enumerate().rev() {
        free.entry(s).or_default().push(index(j));
    }
    let mut left_a = Vec::new();
    for (i, &s) in a.iter().enumerate() {
        match free.get_mut(&s).and_then(|stack| stack.pop()) {
            Some(j) => pairs[i] = j,
            None => left_a.push(i),
        }
    }
    let mut left_b: Vec<u32> = free.into_values().flatten().collect();
    left_b.sort_by_key(|&j| (b[j as usize], j));
    left_a.sort_by_key(|&i| (a[i], i));
    for (&i, &j) in left_a.iter().zip(&left_b) {
        pairs[i] = j;
    }
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs_of(a: &[u64], b: &[u64]) -> Vec<u32> {
        align((a, a), (b, b)).0
    }

    #[test]
    fn identical_sequences_pair_in_order() {
        assert_eq!(pairs_of(&[1, 2, 3], &[1, 2, 3]), vec![0, 1, 2]);
    }

    #[test]
    fn an_allocation_at_one_size_only_is_left_unpaired() {
        // A workspace (9) appears in the second recording only.
        let a = [1, 2, 3, 4, 5];
        let b = [1, 2, 9, 3, 4, 5];
        assert_eq!(pairs_of(&a, &b), vec![0, 1, 3, 4, 5]);
        assert_eq!(pairs_of(&b, &a), vec![0, 1, UNPAIRED, 2, 3, 4]);
    }

    #[test]
    fn runs_facing_each_other_pair_in_order() {
        // The middle two were keyed differently (another kernel path).
        let a = [1, 2, 7, 8, 3];
        let b = [1, 2, 5, 6, 3];
        assert_eq!(pairs_of(&a, &b), vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn repeated_iterations_align_on_the_common_ones() {
        let step = [10u64, 11, 12, 13];
        let a: Vec<u64> = step.iter().cycle().take(4 * 5).copied().collect();
        let b: Vec<u64> = step.iter().cycle().take(4 * 3).copied().collect();
        let p = pairs_of(&a, &b);
        let paired = p.iter().filter(|&&j| j != UNPAIRED).count();
        assert_eq!(paired, 12);
        // Every pair joins equal keys and pairs never cross.
        let mut last = None;
        for (i, &j) in p.iter().enumerate() {
            if j != UNPAIRED {
                assert_eq!(a[i], b[j as usize]);
                assert!(last.is_none_or(|l| l < j));
                last = Some(j);
            }
        }
    }

    #[test]
    fn the_diff_matches_a_quadratic_lcs_on_random_sequences() {
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut rng = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..200 {
            let la = (rng() % 40) as usize;
            let lb = (rng() % 40) as usize;
            let a: Vec<u64> = (0..la).map(|_| rng() % 4).collect();
            let b: Vec<u64> = (0..lb).map(|_| rng() % 4).collect();
            let runs = myers(&a, &b, MAX_EDITS).expect("small inputs stay under the edit bound");
            let matched: usize = runs.iter().map(|r| r.2).sum();
            assert_eq!(matched, lcs(&a, &b), "{a:?} {b:?}");
            for (sa, sb, len) in runs {
                assert_eq!(a[sa..sa + len], b[sb..sb + len]);
            }
        }
    }

    fn lcs(a: &[u64], b: &[u64]) -> usize {
        let mut t = vec![vec![0usize; b.len() + 1]; a.len() + 1];
        for i in 0..a.len() {
            for j in 0..b.len() {
                t[i + 1][j + 1] = if a[i] == b[j] {
                    t[i][j] + 1
                } else {
                    t[i][j + 1].max(t[i + 1][j])
                };
            }
        }
        t[a.len()][b.len()]
    }

    #[test]
    fn long_sequences_differing_in_every_iteration_align_window_by_window() {
        // 3000 iterations of 10 calls; the second recording makes an extra
        // call (99) in every iteration: 3000 edits, past the whole diff's bound.
        let step: Vec<u64> = (0..10).collect();
        let a: Vec<u64> = (0..3000).flat_map(|_| step.iter().copied()).collect();
        let b: Vec<u64> = (0..3000)
            .flat_map(|_| step.iter().copied().chain([99]))
            .collect();
        let (p, method) = align((&a, &a), (&b, &b));
        assert_eq!(method, Method::Windowed);
        let paired = p.iter().filter(|&&j| j != UNPAIRED).count();
        assert_eq!(paired, a.len(), "every call of a pairs");
        let mut last = None;
        for (i, &j) in p.iter().enumerate() {
            assert_eq!(a[i], b[j as usize]);
            assert!(last.is_none_or(|l| l < j), "pairs never cross");
            last = Some(j);
        }
    }

    #[test]
    fn lines_tell_sites_of_one_function_apart_and_moved_lines_still_pair() {
        // softmax at lines 172, 173 and 175 (fine keys 1, 2, 3; one coarse
        // key 9); the second recording has an extra 175 allocation, and a
        // later call (7) moved to line 8 in an edited script (coarse 70).
        let (fa, ca) = ([1u64, 2, 3, 7, 5], [9u64, 9, 9, 70, 5]);
        let (fb, cb) = ([1u64, 2, 3, 3, 8, 5], [9u64, 9, 9, 9, 70, 5]);
        let (p, method) = align((&fa, &ca), (&fb, &cb));
        assert_eq!(method, Method::Aligned);
        assert_eq!(p, vec![0, 1, 2, 4, 5]);
    }

    #[test]
    fn sizes_pair_equal_first_then_by_rank() {
        // Weights (equal) and activations left over from a warm-up step
        // (scaled), in another address order.
        let a = [100, 4096, 100, 40960];
        let b = [16384, 100, 163840, 100];
        assert_eq!(by_size(&a, &b), vec![1, 0, 3, 2]);
    }
}
