//! Multi-rank view: one row per rank (or per input when no rank prefixes),
//! with the ranks that stand out flagged. Distributed jobs usually fail on
//! one rank first; the rank whose reserved memory is far off the others, or
//! the only one that ran out, is where to look.

use super::html::{Table, TableRow};
use crate::evidence::{Evidence, Kind, Observation};
use crate::units::human;
use serde::Serialize;

/// A rank whose reserved or allocated bytes differ from the median by more
/// than this fraction is flagged.
pub const DEVIATION: f64 = 0.10;
/// …and by at least this many bytes, so small figures (a few MiB of gap) do not flag.
pub const MIN_DEVIATION_BYTES: f64 = 256.0 * 1024.0 * 1024.0;

/// One rank's memory at its failure (or, without an OOM, at its last table).
/// Serialised with the contract's `_bytes` names, for `diagnose --format json`'s `ranks`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RankRow {
    /// `None` when the rows are told apart by input file only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    pub input: String,
    pub oom: bool,
    #[serde(rename = "requested_bytes", skip_serializing_if = "Option::is_none")]
    pub requested: Option<u64>,
    #[serde(rename = "allocated_bytes", skip_serializing_if = "Option::is_none")]
    pub allocated: Option<u64>,
    #[serde(rename = "reserved_bytes", skip_serializing_if = "Option::is_none")]
    pub reserved: Option<u64>,
    #[serde(
        rename = "reserved_unallocated_bytes",
        skip_serializing_if = "Option::is_none"
    )]
    pub reserved_unallocated: Option<u64>,
    #[serde(rename = "free_bytes", skip_serializing_if = "Option::is_none")]
    pub free: Option<u64>,
    #[serde(
        rename = "total_capacity_bytes",
        skip_serializing_if = "Option::is_none"
    )]
    pub capacity: Option<u64>,
    /// Why this rank stands out, empty when it does not.
    pub flags: Vec<String>,
}

/// How many rows the table shows; the others are counted (a log of a
/// 512-rank job holds 512).
pub const MAX_ROWS: usize = 32;

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(transparent)]
pub struct RankTable {
    /// The rows shown, by rank: the ones that stand out most, at most [`MAX_ROWS`].
    pub rows: Vec<RankRow>,
    /// The rows beyond `rows`, counted.
    #[serde(skip)]
    pub omitted: Omitted,
}

/// The rows a [`RankTable`] does not show.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Omitted {
    pub count: usize,
    /// How many of them hold an OOM.
    pub ooms: usize,
    /// How many of them stand out.
    pub flagged: usize,
}

/// The per-rank table, or `None` when the evidence holds fewer than two ranks
/// (or, without rank prefixes, fewer than two inputs).
pub fn rank_table(evidence: &Evidence) -> Option<RankTable> {
    let by_rank = evidence.observations.iter().any(|o| o.rank.is_some());
    // Group in first-seen order; observations are in input then line order.
    let mut groups: Vec<(Option<u32>, String, Vec<&Observation>)> = Vec::new();
    let mut at: std::collections::HashMap<(Option<u32>, &str), usize> = Default::default();
    for o in &evidence.observations {
        if by_rank && o.rank.is_none() {
            continue;
        }
        let key = if by_rank {
            (o.rank, "")
        } else {
            (None, o.input.as_str())
        };
        match at.get(&key).and_then(|&i| groups.get_mut(i)) {
            Some(g) => g.2.push(o),
            None => {
                at.insert(key, groups.len());
                groups.push((o.rank.filter(|_| by_rank), o.input.clone(), vec![o]));
            }
        }
    }
    if groups.len() < 2 {
        return None;
    }
    groups.sort_by_key(|g| g.0);
    let mut rows: Vec<RankRow> = groups
        .into_iter()
        .filter_map(|(rank, input, obs)| row(rank, input, &obs))
        .collect();
    if rows.len() < 2 {
        return None;
    }
    flag(&mut rows);
    let mut omitted = Omitted::default();
    if rows.len() > MAX_ROWS {
        // The rows that stand out most, then the lowest ranks; shown by rank.
        let mut order: Vec<usize> = (0..rows.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(rows.get(i).map_or(0, |r| r.flags.len())));
        let mut keep = vec![false; rows.len()];
        for &i in order.iter().take(MAX_ROWS) {
            if let Some(k) = keep.get_mut(i) {
                *k = true;
            }
        }
        let mut kept = keep.iter();
        rows.retain(|r| {
            let shown = kept.next().copied().unwrap_or(false);
            if !shown {
                omitted.count += 1;
                omitted.ooms += usize::from(r.oom);
                omitted.flagged += usize::from(!r.flags.is_empty());
            }
            shown
        });
    }
    Some(RankTable { rows, omitted })
}

/// `metrics[stat]["all"].current` of a summary or stats observation.
fn current(o: &Observation, stat: &str) -> Option<u64> {
    let v = o.metrics.as_ref()?.get(stat)?.get("all")?.current?;
    u64::try_from(v).ok()
}

fn row(rank: Option<u32>, input: String, obs: &[&Observation]) -> Option<RankRow> {
    // The failure is the most telling; else the latest table of numbers.
    let oom = obs.iter().rev().find(|o| o.kind == Kind::Oom);
    let pick = oom.or_else(|| {
        obs.iter().rev().find(|o| {
            matches!(
                o.kind,
                Kind::MemorySummary | Kind::MemoryStats | Kind::Snapshot
            )
        })
    })?;
    let allocated = pick
        .allocated_bytes
        .or_else(|| current(pick, "allocated_bytes"));
    // PyTorch ≥ 2.4 prints allocated and reserved-but-unallocated, not reserved.
    let reserved = pick
        .reserved_bytes
        .or_else(|| current(pick, "reserved_bytes"))
        .or_else(|| Some(allocated? + pick.reserved_unallocated_bytes?));
    let reserved_unallocated = pick
        .reserved_unallocated_bytes
        .or_else(|| Some(reserved?.saturating_sub(allocated?)));
    let capacity = obs.iter().find_map(|o| o.total_capacity_bytes);
    Some(RankRow {
        rank,
        input,
        oom: oom.is_some(),
        requested: pick.requested_bytes,
        allocated,
        reserved,
        reserved_unallocated,
        free: pick.free_bytes,
        capacity,
        flags: Vec::new(),
    })
}

fn flag(rows: &mut [RankRow]) {
    type Get = fn(&RankRow) -> Option<u64>;
    let metrics: [(&str, Get); 3] = [
        ("reserved", |r| r.reserved),
        ("allocated", |r| r.allocated),
        ("reserved − allocated", |r| r.reserved_unallocated),
    ];
    for (name, get) in metrics {
        let values: Vec<u64> = rows.iter().filter_map(get).collect();
        if values.len() < 2 {
            continue;
        }
        let Some(med) = crate::snapshot::attribute::median(values).filter(|m| *m > 0.0) else {
            continue;
        };
        for r in rows.iter_mut() {
            let Some(v) = get(r) else { continue };
            let dev = (v as f64 - med) / med;
            if dev.abs() > DEVIATION && (v as f64 - med).abs() >= MIN_DEVIATION_BYTES {
                let dir = if dev > 0.0 { "above" } else { "below" };
                r.flags.push(format!(
                    "{name} {:.0} % {dir} the median ({})",
                    dev.abs() * 100.0,
                    human(med.round() as u64)
                ));
            }
        }
    }
    let ooms = rows.iter().filter(|r| r.oom).count();
    if ooms > 0 && ooms < rows.len() {
        let total = rows.len();
        let others = total - ooms;
        for r in rows.iter_mut().filter(|r| r.oom) {
            r.flags
                .push(format!("ran out of memory; {others} of {total} did not"));
        }
    }
    // A rank on a smaller card explains a lone OOM without any allocator story.
    // The most common capacity; of equally common ones the one seen last.
    let mut caps: std::collections::HashMap<u64, (usize, usize)> = Default::default();
    for (i, c) in rows
        .iter()
        .enumerate()
        .filter_map(|(i, r)| Some((i, r.capacity?)))
    {
        let e = caps.entry(c).or_default();
        *e = (e.0 + 1, i);
    }
    if let Some((&most, _)) = caps.iter().max_by_key(|&(_, n)| *n) {
        for r in rows.iter_mut() {
            if let Some(c) = r.capacity.filter(|c| *c != most) {
                r.flags.push(format!(
                    "capacity {} differs from the others' {}",
                    human(c),
                    human(most)
                ));
            }
        }
    }
}

fn size(v: Option<u64>) -> String {
    v.map(human).unwrap_or_else(|| "—".into())
}

impl RankTable {
    /// The ranks that stand out.
    pub fn flagged(&self) -> impl Iterator<Item = &RankRow> {
        self.rows.iter().filter(|r| !r.flags.is_empty())
    }

    /// As a plain table for the HTML, Markdown or text renderers.
    pub fn table(&self) -> Table {
        let by_rank = self.rows.iter().any(|r| r.rank.is_some());
        // One log with rank prefixes: the input column would repeat one name.
        let one_input = self.rows.windows(2).all(|w| w[0].input == w[1].input);
        let headers = [
            if by_rank { "rank" } else { "#" },
            "input",
            "OOM",
            "requested",
            "allocated",
            "reserved",
            "reserved − allocated",
            "free",
            "capacity",
        ];
        let rows = self
            .rows
            .iter()
            .enumerate()
            .map(|(i, r)| TableRow {
                cells: vec![
                    r.rank.map_or_else(|| i.to_string(), |k| k.to_string()),
                    r.input.clone(),
                    if r.oom { "yes" } else { "no" }.into(),
                    size(r.requested),
                    size(r.allocated),
                    size(r.reserved),
                    size(r.reserved_unallocated),
                    size(r.free),
                    size(r.capacity),
                ],
                flag: (!r.flags.is_empty()).then(|| r.flags.join("; ")),
            })
            .map(|mut row| {
                if one_input {
                    row.cells.remove(1);
                }
                row
            })
            .collect();
        let mut headers: Vec<String> = headers.iter().map(|h| (*h).to_owned()).collect();
        if one_input {
            headers.remove(1);
        }
        let flagged = self.flagged().count() + self.omitted.flagged;
        let total = self.rows.len() + self.omitted.count;
        let mut note = if flagged == 0 {
            format!("{total} ranks, none stands out.")
        } else {
            format!(
                "{flagged} of {total} ranks stand out (more than {:.0} % off the median, alone in running out of memory, or on a different card).",
                DEVIATION * 100.0
            )
        };
        let o = self.omitted;
        if o.count > 0 {
            let _ = std::fmt::Write::write_fmt(
                &mut note,
                format_args!(
                    " {} more not shown ({} with an OOM, {} standing out).",
                    o.count, o.ooms, o.flagged
                ),
            );
        }
        Table {
            title: "Ranks".into(),
            headers,
            rows,
            note: Some(note),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn oom(rank: u32, reserved: u64, allocated: u64) -> Observation {
        let mut o = Observation::new(Kind::Oom, "train.log");
        o.rank = Some(rank);
        o.reserved_bytes = Some(reserved);
        o.allocated_bytes = Some(allocated);
        o.requested_bytes = Some(2 * GIB);
        o.total_capacity_bytes = Some(80 * GIB);
        o
    }

    #[test]
    fn flags_the_rank_far_from_the_median() {
        let ev = Evidence {
            observations: vec![
                oom(2, 70 * GIB, 60 * GIB),
                oom(0, 71 * GIB, 60 * GIB),
                oom(1, 78 * GIB, 61 * GIB),
                oom(3, 60 * GIB, 59 * GIB),
            ],
            ..Default::default()
        };
        let t = rank_table(&ev).unwrap();
        let ranks: Vec<_> = t.rows.iter().map(|r| r.rank).collect();
        assert_eq!(ranks, vec![Some(0), Some(1), Some(2), Some(3)]);
        // Median reserved = (70 + 71) / 2 = 70.5 GiB: rank 1 is +10.6 %, rank 3 −14.9 %.
        let flagged: Vec<_> = t.flagged().map(|r| r.rank).collect();
        assert_eq!(flagged, vec![Some(1), Some(3)]);
        // Gaps 11, 17, 10, 1 GiB: median 10.5, so ranks 1 (+62 %) and 3 (−90 %) again.
        assert_eq!(
            t.rows[3].flags,
            vec![
                "reserved 15 % below the median (70.50 GiB)",
                "reserved − allocated 90 % below the median (10.50 GiB)"
            ]
        );
        assert_eq!(t.rows[0].reserved_unallocated, Some(11 * GIB));
        let json = serde_json::to_value(&t).unwrap();
        assert_eq!(json[3]["reserved_bytes"], 60 * GIB);
        assert_eq!(json[3]["rank"], 3);
        let text = t.table().to_text();
        assert!(text.contains("reserved 11 % above"), "{text}");
        assert!(text.contains("2 of 4 ranks stand out"), "{text}");
    }

    #[test]
    fn a_lone_oom_is_flagged_and_one_rank_is_no_table() {
        let mut summary = Observation::new(Kind::MemoryStats, "rank1.log");
        let mut metrics = crate::evidence::Metrics::new();
        for (stat, v) in [("allocated_bytes", 60 * GIB), ("reserved_bytes", 70 * GIB)] {
            metrics.entry(stat.into()).or_default().insert(
                "all".into(),
                crate::evidence::StatValues {
                    current: Some(v as i64),
                    ..Default::default()
                },
            );
        }
        summary.metrics = Some(metrics);
        let mut failed = oom(0, 70 * GIB, 60 * GIB);
        failed.rank = None;
        failed.input = "rank0.log".into();
        let ev = Evidence {
            observations: vec![failed.clone(), summary],
            ..Default::default()
        };
        let t = rank_table(&ev).unwrap();
        assert_eq!(t.rows.len(), 2);
        assert_eq!(t.rows[1].reserved, Some(70 * GIB));
        assert_eq!(t.rows[0].flags, vec!["ran out of memory; 1 of 2 did not"]);
        assert!(t.rows[1].flags.is_empty());
        assert_eq!(t.table().rows[0].cells[0], "0");
        assert_eq!(
            rank_table(&Evidence {
                observations: vec![failed],
                ..Default::default()
            }),
            None
        );
    }
}
