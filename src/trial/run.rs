//! One run of a workload under one config on one device, and its figures
//! ([`Run`]): what validate's verdict, recommend's ranking and the reports
//! read.

use super::workload::{Source, Workload, with_snapshot_trace};
use crate::Error;
use crate::conf::{Settings, TorchVersion};
use crate::device::sim::{Placement, SimDevice};
use crate::device::{Device, DeviceSpec};
use crate::evidence::Backend;
use crate::workload::snapshot_trace::SnapshotTrace;
use crate::workload::{
    Fork, OomEvent, ReplayOptions, RunFigures, RunResult, StreamedReplay, Trace,
};
use serde::Serialize;
use std::sync::{Arc, Mutex, OnceLock};

/// One config's run: the config as given ('' = PyTorch's defaults) and the
/// run's figures (the contract's replay fields plus the driver work the
/// ranking and the verdict weigh).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Run {
    pub conf: String,
    #[serde(flatten)]
    pub figures: RunFigures,
}

impl Run {
    fn new(conf: &str, run: RunResult) -> Self {
        Run {
            conf: conf.to_string(),
            figures: run.figures,
        }
    }
}

/// One replay of a workload on the simulated card: `(settings, conf,
/// capacity, stop_above_reserved, placement)`; the bound
/// ([`ReplayOptions::stop_above_reserved`]) is kept by trace replays and
/// ignored by snapshot replays, which run to the end.
pub type Replayer<'r> = dyn Fn(&Settings, &str, u64, Option<u64>, Placement) -> Run + Sync + 'r;

/// Replays `trace` on the simulated card under `settings` at `capacity`
/// (first-fit placement).
pub fn replay(trace: &Trace, settings: &Settings, conf: &str, capacity: u64) -> Run {
    replay_bounded(trace, settings, conf, capacity, None)
}

/// [`replay`], stopping once reserved memory passes `stop_above_reserved`.
pub fn replay_bounded(
    trace: &Trace,
    settings: &Settings,
    conf: &str,
    capacity: u64,
    stop_above_reserved: Option<u64>,
) -> Run {
    replay_on_card(
        trace,
        settings,
        conf,
        SimDevice::new(capacity),
        stop_above_reserved,
    )
}

/// First-fit trace replays on the simulated card that start a run under a
/// power-of-two `max_split_size` from the run without it, where one is kept
/// ([`Fork`]): the config search replays that run first (its waves,
/// [`super::search::search`]), and what both runs share, up to the event at
/// which the threshold first turns a decision, is not replayed again. The
/// figures are those of the whole replay ([`Fork::run_under`]).
pub(crate) struct ForkingReplays<'t> {
    trace: &'t Trace,
    /// [`Trace::allocates_each_id_once`], read once, at the first run that forks.
    ids_once: OnceLock<bool>,
    kept: Mutex<Vec<Kept>>,
}

/// The forks of a run without a threshold, by its settings and capacity.
struct Kept {
    settings: Settings,
    capacity: u64,
    forks: Arc<Vec<Fork<SimDevice>>>,
}

impl<'t> ForkingReplays<'t> {
    pub fn new(trace: &'t Trace) -> Self {
        ForkingReplays {
            trace,
            ids_once: OnceLock::new(),
            kept: Mutex::new(Vec::new()),
        }
    }

    /// [`replay_bounded`], forked where it can be.
    pub fn replay(
        &self,
        settings: &Settings,
        conf: &str,
        capacity: u64,
        stop_above_reserved: Option<u64>,
    ) -> Run {
        let trace = self.trace;
        if settings.max_split_size == u64::MAX {
            let options = ReplayOptions {
                stop_above_reserved,
                ..ReplayOptions::default()
            };
            let device = SimDevice::new(capacity);
            let mut run =
                StreamedReplay::new(settings, device, options, trace.len(), trace.ids() as usize);
            // A checkpoint every 1/64 of the trace: a fork replays at most that
            // much twice (1/16 to 1/128 measured: BENCHMARKS.md, issue 33).
            let every = (trace.len() / 64).max(1024);
            let ids_once = *self.ids_once.get_or_init(|| trace.allocates_each_id_once());
            let forks = run.feed_keeping_forks(trace.events(), every, ids_once);
            if !forks.is_empty() {
                let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
                kept.push(Kept {
                    settings: settings.clone(),
                    capacity,
                    forks: Arc::new(forks),
                });
            }
            return Run::new(conf, run.finish(trace.len() as u64));
        }
        let unset = Settings {
            max_split_size: u64::MAX,
            ..settings.clone()
        };
        let forks = {
            let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
            kept.iter()
                .find(|k| k.settings == unset && k.capacity == capacity)
                .map(|k| Arc::clone(&k.forks))
        };
        let forked = forks.and_then(|forks| {
            let fork = forks
                .iter()
                .find(|f| f.thresholds & settings.max_split_size != 0)?;
            fork.run_under(trace, settings, stop_above_reserved)
        });
        match forked {
            Some(figures) => Run {
                conf: conf.to_string(),
                figures,
            },
            None => replay_bounded(trace, settings, conf, capacity, stop_above_reserved),
        }
    }
}

/// [`replay`] with segments placed by `placement`.
pub fn replay_placed(
    trace: &Trace,
    settings: &Settings,
    conf: &str,
    capacity: u64,
    placement: Placement,
) -> Run {
    let device = SimDevice::new(capacity).with_placement(placement);
    replay_on_card(trace, settings, conf, device, None)
}

fn replay_on_card(
    trace: &Trace,
    settings: &Settings,
    conf: &str,
    device: SimDevice,
    stop_above_reserved: Option<u64>,
) -> Run {
    let options = ReplayOptions {
        stop_above_reserved,
        ..ReplayOptions::default()
    };
    Run::new(
        conf,
        crate::workload::replay_with(trace, settings, device, options),
    )
}

/// Replays a snapshot's trace from the state it started in; a start state that
/// does not fit the device counts as an OOM at event 0.
pub(crate) fn replay_snapshot<D: Device>(
    st: &SnapshotTrace,
    settings: &Settings,
    conf: &str,
    device: D,
) -> Run {
    use crate::workload::snapshot_trace;
    let capacity_bytes = device.total_memory();
    match snapshot_trace::replay_on(st, settings, device, false, ReplayOptions::default()) {
        Ok((run, _)) => Run::new(conf, run),
        Err(e) => Run {
            conf: conf.to_string(),
            figures: RunFigures {
                oom: Some(OomEvent {
                    event_index: 0,
                    requested_bytes: 0,
                    message: format!("the state at the trace start does not fit: {e}"),
                    before_trace: Some(st.start.bytes()),
                }),
                events: st.trace.len() as u64,
                capacity_bytes,
                ..RunFigures::default()
            },
        },
    }
}

/// Replays on the device `spec` names; a CUDA device is opened per run and
/// released (every allocation returned) when the run ends. `capacity` caps
/// the card; without it the simulated card has no limit and a GPU is capped
/// at its free memory.
pub fn replay_on(
    spec: DeviceSpec,
    workload: &Workload,
    settings: &Settings,
    conf: &str,
    capacity: Option<u64>,
) -> Result<Run, Error> {
    if spec == DeviceSpec::Sim {
        let cap = capacity.unwrap_or(crate::device::NO_LIMIT);
        return workload.with_replayer(|run| run(settings, conf, cap, None, Placement::FirstFit));
    }
    let device = DeviceOpener {
        spec,
        given: capacity,
        default: crate::device::NO_LIMIT,
        start_addresses: Vec::new(),
    }
    .open()?;
    match &workload.source {
        Source::Trace(trace) => Ok(Run::new(
            conf,
            crate::workload::replay(trace, settings, device),
        )),
        Source::Snapshot(data, limits) => {
            with_snapshot_trace(&workload.input, data, limits, |st, _| {
                replay_snapshot(st, settings, conf, device)
            })
        }
    }
}

/// Opens a fresh device for each run: the simulated card (`given`, else
/// `default`), or GPU N capped at `given` (else at its free memory).
pub(crate) struct DeviceOpener {
    pub spec: DeviceSpec,
    pub given: Option<u64>,
    pub default: u64,
    /// Where the simulated card puts a snapshot's start segments (recorded addresses).
    pub start_addresses: Vec<u64>,
}

impl DeviceOpener {
    pub fn open(&self) -> Result<Box<dyn Device>, Error> {
        match self.spec {
            DeviceSpec::Sim => Ok(Box::new(self.sim(Placement::FirstFit))),
            #[cfg(feature = "cuda")]
            DeviceSpec::Cuda(ordinal) => Ok(Box::new(crate::device::cuda::CudaDevice::open(
                ordinal, self.given,
            )?)),
            #[cfg(not(feature = "cuda"))]
            DeviceSpec::Cuda(ordinal) => Err(Error::NoDevice(format!(
                "--device cuda:{ordinal}: this allocdoc was built without the `cuda` feature"
            ))),
        }
    }
}

impl DeviceOpener {
    /// The simulated card, placing new segments by `placement`.
    pub fn sim(&self, placement: Placement) -> SimDevice {
        SimDevice::new(self.given.unwrap_or(self.default))
            .with_recorded_addresses(self.start_addresses.iter().copied())
            .with_placement(placement)
    }
}

/// Parses a config the user gave, naming the flag on error.
pub fn parse_conf(flag: &str, value: &str) -> Result<Settings, Error> {
    crate::conf::parse(value, TorchVersion::DEFAULT)
        .map(|parsed| parsed.settings)
        .map_err(|e| Error::Usage(format!("{flag} {value:?}: {e}")))
}

/// Parses a `--conf` value for `version`; the native backend only (the
/// bundled allocator models no other).
pub fn parse_native_conf(
    conf: &str,
    version: TorchVersion,
) -> Result<crate::conf::ParsedConf, Error> {
    let parsed = crate::conf::parse(conf, version)
        .map_err(|e| Error::Usage(format!("--conf {conf:?}: {e}")))?;
    if parsed.settings.backend != Backend::Native {
        return Err(Error::Usage(format!(
            "--conf {conf:?}: backend:cudaMallocAsync is not modelled by the bundled allocator (native only)"
        )));
    }
    Ok(parsed)
}

/// A config as shown in reports: `(defaults)` for the empty one.
pub fn conf_name(conf: &str) -> &str {
    if conf.is_empty() { "(defaults)" } else { conf }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::advise::space::{MAX_SPLIT_MB, all as space};
    use crate::trial::search::search;

    /// The config search gives the same ranking, figures and smallest card
    /// with forked replays as with whole ones, with and without OOMs; and
    /// forks were there to serve thresholds (the run without one kept some).
    #[test]
    fn the_search_is_the_same_with_forked_replays() {
        // The thresholds the space searches, as bits of `max_split_flips`.
        let searched: u64 = MAX_SPLIT_MB.iter().map(|mb| mb << 20).sum();
        let mut served = 0;
        for seed in [2, 5, 11] {
            let trace = Trace::random(seed, 500);
            for capacity in [16 << 30, 3 << 30] {
                let forking = ForkingReplays::new(&trace);
                let run = |s: &Settings, cap, stop| forking.replay(s, "", cap, stop).figures;
                let whole =
                    |s: &Settings, cap, stop| replay_bounded(&trace, s, "", cap, stop).figures;
                let base = Settings::default();
                let forked = search(space(false), &base, capacity, None, (run, true), |_| {});
                let plain = search(space(false), &base, capacity, None, (whole, true), |_| {});
                assert_eq!(forked, plain, "seed {seed} at {capacity}");
                let kept = forking.kept.lock().expect("not poisoned");
                served += kept
                    .iter()
                    .flat_map(|k| k.forks.iter())
                    .map(|f| (f.thresholds & searched).count_ones())
                    .sum::<u32>();
            }
        }
        assert!(served > 20, "{served} searched thresholds had a fork");
    }
}
