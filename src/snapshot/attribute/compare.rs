//! Attributions compared: two snapshots' moments group by group (`diff`),
//! and several ranks' headline moments side by side.

use super::{
    Attribution, Category, Diff, DiffRow, Moment, MomentKind, RankFill, Ranks, Side, ratio,
};
use crate::evidence::fills::CategoryPart;
use std::collections::BTreeMap;

/// Compares the moment `kind` of two attributions group by group (the
/// rows of each side were computed with every group kept); `top` rows are
/// listed by the size of their change, the rest summed.
pub fn diff(
    (before_input, before): (&str, &Attribution),
    (after_input, after): (&str, &Attribution),
    kind: MomentKind,
    top: usize,
) -> Option<Diff> {
    let pick = |a: &Attribution| {
        a.moment(kind)
            .or_else(|| a.moment(MomentKind::End))
            .cloned()
    };
    let (b, a) = (pick(before)?, pick(after)?);
    let side = |input: &str, at: &Attribution, m: &Moment| {
        let peak = at.moment(MomentKind::Peak);
        Side {
            input: input.to_string(),
            device_index: at.device_index,
            moment: m.moment,
            event_index: m.event_index,
            allocated_bytes: m.allocated_bytes,
            reserved_bytes: m.reserved_bytes,
            live_allocations: m.live_allocations,
            pre_trace_bytes: m.pre_trace.bytes,
            pre_trace: m.pre_trace.clone(),
            peak_allocated_bytes: peak.map(|p| p.allocated_bytes),
            peak_event_index: peak.and_then(|p| p.event_index),
        }
    };
    // A group's key, category (and mix), bytes and count on one side.
    type Group = (String, Category, Vec<CategoryPart>, u64, u64);
    let compare = |left: Vec<Group>, right: Vec<Group>| {
        let mut rows: BTreeMap<String, DiffRow> = BTreeMap::new();
        for (side, list) in [(0, left), (1, right)] {
            for (key, category, mix, bytes, count) in list {
                let r = rows
                    .entry(key.clone())
                    .or_insert_with(|| empty_row(key, category));
                if side == 0 {
                    r.before_bytes = bytes;
                    r.before_count = count;
                    r.mix = mix;
                } else {
                    r.after_bytes = bytes;
                    r.after_count = count;
                    r.category = category;
                    r.mix = mix;
                }
            }
        }
        let mut rows: Vec<DiffRow> = rows
            .into_values()
            .map(|mut r| {
                r.delta_bytes = (i128::from(r.after_bytes) - i128::from(r.before_bytes))
                    .clamp(i128::from(i64::MIN), i128::from(i64::MAX))
                    as i64;
                r
            })
            .collect();
        rows.sort_by(|x, y| {
            y.delta_bytes
                .unsigned_abs()
                .cmp(&x.delta_bytes.unsigned_abs())
                .then_with(|| x.key.cmp(&y.key))
        });
        rows
    };
    let groups = |m: &Moment| {
        m.rows
            .iter()
            .map(|r| (r.key.clone(), r.category, r.mix.clone(), r.bytes, r.count))
            .collect::<Vec<_>>()
    };
    let cats = |m: &Moment| {
        m.categories
            .iter()
            .map(|c| {
                (
                    c.category.as_str().to_string(),
                    c.category,
                    Vec::new(),
                    c.bytes,
                    c.count,
                )
            })
            .collect::<Vec<_>>()
    };
    let mut rows = compare(groups(&b), groups(&a));
    let mut rest = None;
    if rows.len() > top.max(1) {
        let cut = rows.split_off(top.max(1));
        let mut r = empty_row(format!("{} other groups", cut.len()), Category::Unknown);
        for c in &cut {
            r.before_bytes = r.before_bytes.saturating_add(c.before_bytes);
            r.after_bytes = r.after_bytes.saturating_add(c.after_bytes);
            r.before_count += c.before_count;
            r.after_count += c.after_count;
            r.delta_bytes = r.delta_bytes.saturating_add(c.delta_bytes);
        }
        rest = Some(r);
    }
    let mut notes = Vec::new();
    if before.device_index != after.device_index {
        notes.push(format!(
            "the two sides are different devices (cuda:{} and cuda:{}): compared as they are",
            before.device_index, after.device_index
        ));
    }
    if b.moment != a.moment {
        notes.push(format!(
            "the {} side has no {} moment: its {} is compared",
            if b.moment != kind { "before" } else { "after" },
            kind.as_str(),
            if b.moment != kind {
                b.moment.as_str()
            } else {
                a.moment.as_str()
            }
        ));
    }
    Some(Diff {
        before: side(before_input, before, &b),
        after: side(after_input, after, &a),
        by: b.by,
        rows,
        rest,
        categories: compare(cats(&b), cats(&a)),
        notes,
    })
}

/// A group compared that holds nothing yet on either side.
fn empty_row(key: String, category: Category) -> DiffRow {
    DiffRow {
        key,
        category,
        mix: Vec::new(),
        before_bytes: 0,
        after_bytes: 0,
        delta_bytes: 0,
        before_count: 0,
        after_count: 0,
    }
}

/// The rank a file name names (`rank3.pickle`, `snapshot_rank_3_x.pickle`,
/// `rank-12.pkl`), if any.
pub fn rank_in_name(input: &str) -> Option<u32> {
    let name = input
        .rsplit(['/', '\\'])
        .next()
        .unwrap_or(input)
        .to_ascii_lowercase();
    name.match_indices("rank").find_map(|(at, _)| {
        let rest = name.get(at + 4..)?;
        let rest = rest.trim_start_matches(['_', '-', '.']);
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        rest.get(..digits).filter(|d| !d.is_empty())?.parse().ok()
    })
}

/// The median of `values`: of an even count, the mean of the two middle ones.
pub fn median(mut values: Vec<u64>) -> Option<f64> {
    values.sort_unstable();
    let n = values.len();
    let mid = values.get(n / 2).copied()? as f64;
    if n.is_multiple_of(2) {
        Some((values.get(n / 2 - 1).copied()? as f64 + mid) / 2.0)
    } else {
        Some(mid)
    }
}

/// The several-rank view of attributions (one per input: its device with
/// the most allocated at its headline moment).
pub fn ranks(inputs: &[(String, Attribution)]) -> Ranks {
    const DEVIATION: f64 = 0.10;
    const MIN_DEVIATION_BYTES: u64 = 256 << 20;
    let mut rows: Vec<RankFill> = inputs
        .iter()
        .filter_map(|(input, a)| {
            let m = a.headline()?;
            let top = m.rows.first();
            let category = m
                .categories
                .iter()
                .find(|c| c.category != Category::Unknown)
                .or(m.categories.first());
            Some(RankFill {
                rank: rank_in_name(input),
                input: input.clone(),
                device_index: a.device_index,
                moment: m.moment,
                allocated_bytes: m.allocated_bytes,
                reserved_bytes: m.reserved_bytes,
                top_site: top.map(|r| r.key.clone()),
                top_site_bytes: top.map(|r| r.bytes),
                top_category: category.map(|c| c.category),
                outlier: false,
            })
        })
        .collect();
    rows.sort_by(|a, b| a.rank.cmp(&b.rank).then_with(|| a.input.cmp(&b.input)));
    let allocated: Vec<u64> = rows.iter().map(|r| r.allocated_bytes).collect();
    let (lo, hi) = (
        allocated.iter().min().copied().unwrap_or(0),
        allocated.iter().max().copied().unwrap_or(0),
    );
    // The median as the rule is read: of an even count, the mean of the two middles.
    let median = median(allocated).unwrap_or(0.0);
    let off = |r: &RankFill| (r.allocated_bytes as f64 - median).abs();
    for r in &mut rows {
        r.outlier = off(r) > MIN_DEVIATION_BYTES as f64 && off(r) > DEVIATION * median;
    }
    let furthest = rows
        .iter()
        .filter(|r| r.outlier)
        .max_by(|a, b| off(a).total_cmp(&off(b)));
    Ranks {
        imbalance: if lo == 0 { 0.0 } else { ratio(hi, lo) },
        outlier_rank: furthest.and_then(|r| r.rank),
        outlier_input: furthest.map(|r| r.input.clone()),
        rows,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_its_middles() {
        // Ranks at 8, 10, 12 and 12 GiB: the median is 11 GiB, so the rank at
        // 10 GiB is 9 % off it and no outlier (the upper middle, 12 GiB, made it one).
        let gib = |v: u64| v << 30;
        let m = median(vec![gib(12), gib(8), gib(12), gib(10)]).unwrap();
        assert_eq!(m, gib(11) as f64);
        assert!((gib(10) as f64 - m).abs() < 0.10 * m);
        assert_eq!(median(vec![3, 1, 2]), Some(2.0));
        assert_eq!(median(Vec::new()), None);
    }

    #[test]
    fn ranks_are_read_from_file_names() {
        assert_eq!(rank_in_name("out/rank0.pickle"), Some(0));
        assert_eq!(rank_in_name("snapshot_rank_3_step9.pickle"), Some(3));
        assert_eq!(rank_in_name("C:\\runs\\Rank-12.pkl"), Some(12));
        assert_eq!(rank_in_name("rank.pickle"), None);
        assert_eq!(rank_in_name("frankly.pickle"), None);
        assert_eq!(rank_in_name("ranks/snap.pickle"), None);
    }
}
