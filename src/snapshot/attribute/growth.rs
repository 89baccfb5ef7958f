//! What grows across steps (the sites whose live bytes rise at every step
//! start of a run) and the allocated memory by category over the trace.

use super::moment::Acc;
use super::{Attributor, Growth, NEVER, SPECIAL_SITES, Timeline, index32};
use crate::evidence::fills::Category;

impl<'s, 'a> Attributor<'s, 'a> {
    /// Sites whose live bytes at the start of each step rise at every one
    /// of at least three consecutive step starts, and that still hold what
    /// they rose to when the trace ends.
    pub(super) fn growth(&self, step_starts: &[u32]) -> Vec<Growth> {
        const MAX_BOUNDARIES: usize = 4096;
        if self.fed.lives.is_empty() || step_starts.is_empty() {
            return Vec::new();
        }
        // The state before each step's first alloc.
        let mut states: Vec<i64> = std::iter::once(0u32)
            .chain(step_starts.iter().copied())
            .filter_map(|a| self.fed.lives.get(a as usize))
            .map(|l| i64::from(l.born) - 1)
            .collect();
        states.dedup();
        let every = states.len().div_ceil(MAX_BOUNDARIES).max(1);
        let states: Vec<i64> = states.into_iter().step_by(every).collect();
        // Live bytes per site at each state, by a sweep over births and deaths.
        // Each site's live bytes, and its longest rise read state by state:
        // only the sites whose bytes changed since the last state are looked
        // at (a site left alone repeats its value, which ends a rise).
        let mut live = vec![0i128; self.sites.len()];
        let mut rises = vec![Rise::NEW; self.sites.len()];
        let mut touched: Vec<u32> = Vec::new();
        let mut is_touched = vec![false; self.sites.len()];
        let touch = |sid: u32, touched: &mut Vec<u32>, is_touched: &mut [bool]| {
            if let Some(t) = is_touched.get_mut(sid as usize)
                && !*t
            {
                *t = true;
                touched.push(sid);
            }
        };
        let (mut born, mut died) = (0usize, 0usize);
        for (j, &s) in states.iter().enumerate() {
            while let Some(l) = self.fed.lives.get(born).filter(|l| i64::from(l.born) <= s) {
                let sid = self.site(l);
                if let Some(v) = live.get_mut(sid as usize) {
                    *v += i128::from(l.bytes);
                    touch(sid, &mut touched, &mut is_touched);
                }
                born += 1;
            }
            while let Some(l) = self
                .fed
                .deaths
                .get(died)
                .and_then(|&k| self.fed.lives.get(k as usize))
                .filter(|l| i64::from(l.died) <= s)
            {
                {
                    let sid = self.site(l);
                    if let Some(v) = live.get_mut(sid as usize) {
                        *v -= i128::from(l.bytes);
                        touch(sid, &mut touched, &mut is_touched);
                    }
                }
                died += 1;
            }
            for sid in touched.drain(..) {
                let at = sid as usize;
                if let (Some(r), Some(&v)) = (rises.get_mut(at), live.get(at)) {
                    r.observe(j, u64::try_from(v).unwrap_or(0));
                }
                if let Some(t) = is_touched.get_mut(at) {
                    *t = false;
                }
            }
        }
        // What each site still holds when the trace ends: memory that rose
        // at every step start but is gone by then grew inside one step (a
        // loop over layers whose outputs the step frees), not from step to
        // step.
        let last = i64::try_from(self.fed.entries).unwrap_or(i64::MAX) - 1;
        let mut at_end = vec![0u64; self.sites.len()];
        for l in self.fed.lives.iter().filter(|l| l.alive(last)) {
            if let Some(v) = at_end.get_mut(self.site(l) as usize) {
                *v = v.saturating_add(l.bytes);
            }
        }
        let step = |j: usize| (j * every) as u64;
        let mut out: Vec<(u32, i64, Growth)> = rises
            .into_iter()
            .enumerate()
            .skip(SPECIAL_SITES as usize)
            .filter_map(|(sid, r)| {
                let (from, to, a, b) = r.finish()?;
                if at_end.get(sid).copied().unwrap_or(0) < b {
                    return None;
                }
                let spanned = step(to) - step(from);
                let sid = index32(sid);
                Some((
                    sid,
                    states.get(to).copied().unwrap_or(-1),
                    Growth {
                        site: self.site_text(sid),
                        category: Category::Unknown,
                        mix: Vec::new(),
                        first_step: step(from),
                        last_step: step(to),
                        first_bytes: a,
                        last_bytes: b,
                        bytes_per_step: (b - a) / spanned.max(1),
                    },
                ))
            })
            .collect();
        out.sort_by(|(_, _, a), (_, _, b)| {
            let total = |g: &Growth| g.last_bytes - g.first_bytes;
            total(b).cmp(&total(a)).then_with(|| a.site.cmp(&b.site))
        });
        out.truncate(10);
        // Each listed site's category as the peak's table gives it, by the
        // same rule over the same allocations (what it holds then); one that
        // holds nothing at the peak, by what it holds at its last step start.
        // Each reads every life: only for those listed.
        let peak = self.fed.peak.unwrap_or(-1);
        out.into_iter()
            .map(|(sid, last, g)| {
                let mut acc = self.site_at(sid, peak);
                if acc.count == 0 {
                    acc = self.site_at(sid, last);
                }
                let (category, mix) = acc.categories();
                Growth { category, mix, ..g }
            })
            .collect()
    }

    /// What the site `site` (site grouping) holds after entry `s`.
    fn site_at(&self, site: u32, s: i64) -> Acc {
        let mut acc = Acc::default();
        for l in self
            .all_lives()
            .filter(|l| l.alive(s) && self.site(l) == site)
        {
            acc.add(l, self.fed.traced);
        }
        acc
    }

    /// Allocated bytes by category over the trace, at most
    /// `ask.timeline_points` points (each the fullest state of its stretch).
    pub(super) fn timeline(&self) -> Timeline {
        let points = self.ask.timeline_points;
        if points == 0 || self.fed.entries == 0 {
            return Timeline::default();
        }
        // Deaths in order: the trace's lives and the pre-trace ones that it
        // frees each died in entry order, so a merge orders them.
        let mut traced = self
            .fed
            .deaths
            .iter()
            .filter_map(|&k| self.fed.lives.get(k as usize))
            .peekable();
        let mut pre = self.fed.pre.iter().filter(|l| l.died != NEVER).peekable();
        let deaths: Vec<(u32, Category, u64)> = std::iter::from_fn(|| {
            let take_pre = match (traced.peek(), pre.peek()) {
                (Some(t), Some(p)) => p.died < t.died,
                (t, _) => t.is_none(),
            };
            if take_pre { pre.next() } else { traced.next() }
        })
        .map(|l| (l.died, l.category, l.bytes))
        .collect();
        let mut cur = [0u64; 7];
        for l in self.fed.pre.iter() {
            if let Some(c) = cur.get_mut(l.category.index()) {
                *c = c.saturating_add(l.bytes);
            }
        }
        let stretch = self.fed.entries.div_ceil(points).max(1);
        let mut out = Vec::with_capacity(points + 1);
        let (mut born, mut died) = (0usize, 0usize);
        let mut best: Option<(u64, u64, [u64; 7])> = None;
        for s in 0..self.fed.entries {
            let s32 = index32(s);
            while let Some(l) = self.fed.lives.get(born).filter(|l| l.born <= s32) {
                if let Some(c) = cur.get_mut(l.category.index()) {
                    *c = c.saturating_add(l.bytes);
                }
                born += 1;
            }
            while let Some(&(_, cat, bytes)) = deaths.get(died).filter(|d| d.0 <= s32) {
                if let Some(c) = cur.get_mut(cat.index()) {
                    *c = c.saturating_sub(bytes);
                }
                died += 1;
            }
            let total: u64 = cur.iter().sum();
            if best.is_none_or(|(t, _, _)| total > t) {
                best = Some((total, s as u64, cur));
            }
            if ((s + 1) % stretch == 0 || s + 1 == self.fed.entries)
                && let Some((_, at, c)) = best.take()
            {
                out.push((at, c));
            }
        }
        Timeline { points: out }
    }
}

/// The longest run of strictly rising values of one series, read value by
/// value; a position not observed repeats the value before it. Kept as
/// (first, last, first value, last value) when it has at least three values.
#[derive(Debug, Clone, Copy)]
struct Rise {
    /// The position observed last and its value (position 0 is 0 until observed).
    last: usize,
    value: u64,
    /// The open run's first position and value.
    start: usize,
    start_value: u64,
    best: Option<(usize, usize, u64, u64)>,
}

impl Rise {
    const NEW: Rise = Rise {
        last: 0,
        value: 0,
        start: 0,
        start_value: 0,
        best: None,
    };

    /// Ends the open run at `end`; the first longest run is kept.
    fn close(&mut self, end: usize, end_value: u64) {
        if end >= self.start + 2 && self.best.is_none_or(|(a, b, ..)| end - self.start > b - a) {
            self.best = Some((self.start, end, self.start_value, end_value));
        }
    }

    /// The value at position `j` (after every position observed so far).
    fn observe(&mut self, j: usize, v: u64) {
        if j == 0 {
            (self.value, self.start_value) = (v, v);
            return;
        }
        if j > self.last + 1 {
            // Positions last+1 .. j-1 repeated the value: the run ended at `last`.
            self.close(self.last, self.value);
            (self.start, self.start_value) = (j - 1, self.value);
        }
        if v <= self.value {
            self.close(j - 1, self.value);
            (self.start, self.start_value) = (j, v);
        }
        (self.last, self.value) = (j, v);
    }

    fn finish(mut self) -> Option<(usize, usize, u64, u64)> {
        self.close(self.last, self.value);
        self.best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The longest rise of a whole series, read every value.
    fn longest_rise(values: &[u64]) -> Option<(usize, usize)> {
        let mut r = Rise::NEW;
        for (j, &v) in values.iter().enumerate() {
            r.observe(j, v);
        }
        r.finish().map(|(a, b, ..)| (a, b))
    }

    #[test]
    fn a_rise_needs_three_values() {
        assert_eq!(longest_rise(&[0, 1]), None);
        assert_eq!(longest_rise(&[0, 1, 2]), Some((0, 2)));
        assert_eq!(longest_rise(&[5, 1, 2, 3, 3, 4, 5, 6, 7]), Some((4, 8)));
        assert_eq!(longest_rise(&[3, 3, 3, 3]), None);
        assert_eq!(longest_rise(&[]), None);
        assert_eq!(longest_rise(&[0, 0, 1, 2, 2, 3, 4, 5]), Some((4, 7)));
        assert_eq!(longest_rise(&[1, 2, 3, 1, 2, 3]), Some((0, 2)));
    }

    /// Observing only the positions whose value changed gives the rise that
    /// reading every value gives (the growth sweep looks only at sites
    /// touched since the last state).
    #[test]
    fn a_rise_read_at_changes_only_is_the_rise_of_the_whole_series() {
        // A small linear congruential generator: many short series of few values.
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = |m: u64| {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (x >> 33) % m
        };
        for _ in 0..5000 {
            let n = next(12) as usize;
            let values: Vec<u64> = (0..n).map(|_| next(4)).collect();
            let mut dense = Rise::NEW;
            let mut sparse = Rise::NEW;
            for (j, &v) in values.iter().enumerate() {
                dense.observe(j, v);
                let before = if j == 0 { 0 } else { values[j - 1] };
                if v != before || next(2) == 0 {
                    sparse.observe(j, v);
                }
            }
            assert_eq!(sparse.finish(), dense.finish(), "{values:?}");
        }
    }
}
