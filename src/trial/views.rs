//! What a `--report` draws from replays: each run's memory over the events
//! and the segments at the moment worth looking at. The replays happen here;
//! `report::views` turns them into pictures.

use super::workload::{Source, Workload, with_snapshot_trace};
use crate::Error;
use crate::allocator::SegmentInfo;
use crate::conf::Settings;
use crate::device::sim::SimDevice;
use crate::workload::{ReplayOptions, RunResult, replay_with};

/// One run's segments at one moment, for the report's segment map.
#[derive(Debug, Clone, PartialEq)]
pub struct SegmentsAt {
    /// Which run and when, e.g. "of (defaults) at its OOM (event 15)".
    pub label: String,
    pub segments: Vec<SegmentInfo>,
}

/// Runs replayed with a per-event timeline, named by config, and their
/// segment map.
#[derive(Debug, Clone, Default)]
pub struct RunViews {
    pub runs: Vec<(String, RunResult)>,
    pub map: Option<SegmentsAt>,
}

/// The segment map of the first run that ran out (at its OOM), else of the
/// last run at its allocated peak: `segments_after(settings, n)` replays the
/// first `n` events again (replays are deterministic) and returns the
/// segments then.
pub fn segment_map(
    runs: &[(&str, &RunResult, &Settings)],
    segments_after: impl Fn(&Settings, u64) -> Vec<SegmentInfo>,
) -> Option<SegmentsAt> {
    let oom = runs.iter().find_map(|(name, result, _)| {
        let index = result.figures.oom.as_ref()?.event_index;
        Some(SegmentsAt {
            label: format!("of {name} at its OOM (event {index})"),
            segments: result.segments.clone(),
        })
    });
    oom.or_else(|| {
        let (name, result, settings) = runs.last()?;
        let index = result.figures.peak_event_index?;
        Some(SegmentsAt {
            label: format!("of {name} at its allocated peak (event {index})"),
            segments: segments_after(settings, index + 1),
        })
    })
}

/// Replays `workload` under each named config on the simulated card of
/// `capacity` bytes (a snapshot from the state its trace started in),
/// keeping every event's figures, for the `--report` of commands whose own
/// runs do not.
pub fn of_workload(
    workload: &Workload,
    runs: &[(&str, &Settings)],
    capacity: u64,
) -> Result<RunViews, Error> {
    use crate::workload::snapshot_trace::replay_on_sim;
    match &workload.source {
        Source::Trace(trace) => replayed(runs, |settings, options| {
            Ok(replay_with(
                trace,
                settings,
                SimDevice::new(capacity),
                options,
            ))
        }),
        Source::Snapshot(data, limits) => {
            with_snapshot_trace(&workload.input, data, limits, |st, _| {
                replayed(runs, |settings, options| {
                    Ok(replay_on_sim(st, settings, capacity, false, options)?.0)
                })
            })?
        }
    }
}

/// [`of_workload`] for any replay: `replay(settings, options)` runs the
/// workload on the simulated card.
fn replayed(
    runs: &[(&str, &Settings)],
    replay: impl Fn(&Settings, ReplayOptions) -> Result<RunResult, Error>,
) -> Result<RunViews, Error> {
    let options = ReplayOptions {
        timeline: true,
        ..ReplayOptions::default()
    };
    let results: Vec<RunResult> = runs
        .iter()
        .map(|(_, settings)| replay(settings, options))
        .collect::<Result<_, _>>()?;
    let named: Vec<(&str, &RunResult, &Settings)> = runs
        .iter()
        .zip(&results)
        .map(|((name, settings), result)| (*name, result, *settings))
        .collect();
    let map = segment_map(&named, |settings, events| {
        let options = ReplayOptions {
            stop_after: Some(events),
            ..ReplayOptions::default()
        };
        replay(settings, options)
            .map(|run| run.segments)
            .unwrap_or_default()
    });
    Ok(RunViews {
        runs: runs
            .iter()
            .map(|(name, _)| name.to_string())
            .zip(results)
            .collect(),
        map,
    })
}
