//! The one builder of a report's pictures: memory timelines and a segment
//! map, from replayed runs ([`crate::trial::views`]) or from the snapshots a
//! diagnosis read, and what is live in that map.

use super::html::{ReportData, SegmentMap, Timeline};
use crate::trial::views::{RunViews, SegmentsAt};
use crate::workload::RunResult;

/// What a report draws: timelines overlaid on one chart, and one segment map.
#[derive(Debug, Default)]
pub struct ReportViews {
    pub timelines: Vec<Timeline>,
    pub map: Option<SegmentMap>,
    /// What the timelines' x axis counts.
    pub x_label: &'static str,
}

impl ReportViews {
    /// Replayed runs (each with its per-event timeline), named by config, and
    /// the segment map the decision layer chose.
    pub fn of_runs<'r>(
        runs: impl IntoIterator<Item = (&'r str, &'r RunResult)>,
        map: Option<&SegmentsAt>,
    ) -> Self {
        ReportViews {
            timelines: runs
                .into_iter()
                .map(|(name, run)| Timeline::from_run(name, run))
                .collect(),
            map: map.map(|m| SegmentMap::from_allocator(m.label.clone(), &m.segments)),
            x_label: "event",
        }
    }

    /// [`ReportViews::of_runs`] over runs replayed for the report.
    pub fn of_run_views(views: &RunViews) -> Self {
        Self::of_runs(
            views.runs.iter().map(|(name, run)| (name.as_str(), run)),
            views.map.as_ref(),
        )
    }

    /// Nothing drawn yet, for recorded snapshots ([`ReportViews::add_snapshot`]).
    pub fn of_snapshots() -> Self {
        ReportViews {
            x_label: "trace entry",
            ..ReportViews::default()
        }
    }

    /// Adds one decoded snapshot: a timeline per traced device, the map of
    /// its first device when no map was taken yet.
    pub fn add_snapshot(&mut self, input: &str, snap: &crate::snapshot::Snapshot<'_>) {
        for device in snap.devices() {
            if snap.trace_len(device) > 0 {
                self.timelines.push(Timeline::from_snapshot_trace(
                    format!("{input}, device {device} (requested)"),
                    snap,
                    device,
                ));
            }
            if self.map.is_none() && snap.segments.iter().any(|s| s.device == device) {
                self.map = Some(SegmentMap::from_snapshot(
                    format!("in {input}, device {device}, when it was taken"),
                    snap,
                    device,
                ));
            }
        }
    }

    /// The timelines, the segment map and what is live there, for `..` in a
    /// [`ReportData`].
    pub fn into_data(self) -> ReportData {
        ReportData {
            top_sites: self
                .map
                .as_ref()
                .map(|m| m.live_by_size(10))
                .unwrap_or_default(),
            sites_title: Some("Live blocks in the segment map, by size".into()),
            timelines: self.timelines,
            x_label: self.x_label.into(),
            segment_map: self.map,
            ..ReportData::default()
        }
    }
}
