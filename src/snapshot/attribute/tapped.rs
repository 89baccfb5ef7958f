//! A snapshot's trace attributed while its pickle is decoded (`top` and
//! `diff`). The decoder tells a `TraceTap` of each dict as it builds it
//! ([`Tap`]); the tap reads the trace entries among them, hands them to a
//! thread that feeds the `Lives` and the steps, and has their values
//! dropped from the pickle. So the trace pass runs beside the decoding
//! instead of after it, and the trace's values are never kept: on the
//! 1 M-entry tiled snapshot the pass was about a third of `top`'s time,
//! and its entries' values 7.99 M of the pool's 8.16 M (64 MB), half of
//! `top`'s peak RSS (BENCHMARKS.md, issue 41).
//!
//! What was fed is used only where the decoded snapshot confirms it: one
//! device's whole trace, entry for entry, and nothing reading a dropped
//! dict afterwards ([`Pickle::consumed_read`]). Anything else (a snapshot
//! with several traced devices, a pickle that adds items to a dict later or
//! refers to a trace entry twice) is decoded and attributed again the usual
//! way ([`super::attribute`]): the answer is the same either way. What
//! follows the trace in torch's dict is given once it is decoded: the step
//! annotations ([`StepScan::annotate`]) and the recorded settings the block
//! sizes follow ([`Attributor::settle`](super::Attributor::settle)).

use super::passes::{Batches, Fed};
use super::{Ask, Attribution, Attributor, Lives};
use crate::Error;
use crate::limits::Limits;
use crate::snapshot::model::{ModelError, Snapshot, TraceReader};
use crate::snapshot::pickle::{Pickle, Release, Tap, V};
use crate::snapshot::trace_metrics::StepScan;

/// Pickle bytes per trace entry, about, for sizing the tables before the
/// trace's length is known (the tiled snapshot of a real trace holds 78 per
/// entry; a table sized too small grows, one too large costs address space).
const BYTES_PER_ENTRY: usize = 48;

/// Decodes the snapshot `data` and attributes its devices (`devices`, or
/// every one) as [`super::attribute`] does, its trace fed as it is decoded;
/// the snapshot comes with them.
pub fn attribute_input<'a>(
    input_name: &str,
    data: &'a [u8],
    limits: &Limits,
    release: Option<Release<'_>>,
    devices: Option<&[u32]>,
    ask: Ask,
) -> Result<(Snapshot<'a>, Vec<Attribution>), Error> {
    if let Some(done) = attribute_as_decoded(input_name, data, limits, release, devices, ask)? {
        return Ok(done);
    }
    // What was fed cannot stand for the trace: read it the usual way.
    let snap = crate::snapshot::load_with(input_name, data, limits)?;
    let out = super::attribute(&snap, devices, ask).map_err(|e| model(input_name, e))?;
    Ok((snap, out))
}

fn model(input_name: &str, e: ModelError) -> Error {
    Error::Input(format!("{input_name}: not a torch memory snapshot: {e}"))
}

/// [`attribute_input`] from what was fed as the snapshot was decoded;
/// `None` where that cannot stand for the trace (see the module's notes).
fn attribute_as_decoded<'a>(
    input_name: &str,
    data: &'a [u8],
    limits: &Limits,
    release: Option<Release<'_>>,
    devices: Option<&[u32]>,
    ask: Ask,
) -> Result<Option<(Snapshot<'a>, Vec<Attribution>)>, Error> {
    let (snap, fed) = load(input_name, data, limits, release, ask);
    let snap = match snap {
        Ok(snap) => snap,
        // Nothing was dropped: the plain read finds the same fault.
        Err(e) if fed.as_ref().is_some_and(|f| f.ids.is_empty()) => return Err(e),
        // Modelling may have read a dropped dict: the plain read says.
        Err(_) => return Ok(None),
    };
    let attributed = fed.map(|fed| attribute_fed(&snap, devices, ask, fed));
    Ok(match attributed {
        _ if snap.pickle.consumed_read() => None,
        Some(Ok(Some(out))) => Some((snap, out)),
        Some(Err(e)) => return Err(model(input_name, e)),
        Some(Ok(None)) | None => None,
    })
}

/// The attribution of the devices of `snap` with `fed` standing for the
/// trace it is; `None` where it cannot (see the module's notes).
fn attribute_fed(
    snap: &Snapshot,
    devices: Option<&[u32]>,
    ask: Ask,
    fed: Fed,
) -> Result<Option<Vec<Attribution>>, ModelError> {
    if fed.ids.is_empty() {
        // Nothing was taken from the pickle.
        return super::attribute(snap, devices, ask).map(Some);
    }
    let all = snap.devices();
    let Some(traced) = all.iter().copied().find(|&d| snap.trace_is(d, &fed.ids)) else {
        return Ok(None);
    };
    let Some(mut steps) = fed.steps else {
        return Ok(None);
    };
    steps.annotate(snap, traced);
    let settings = super::super::evidence::recorded_settings(snap);
    let mut lives = Some((fed.lives, steps));
    let mut out = Vec::new();
    for device in all {
        if devices.is_some_and(|d| !d.contains(&device)) {
            continue;
        }
        match lives.take_if(|_| device == traced) {
            Some((fed, steps)) => {
                let fills = Attributor::fed(snap, device, settings.clone(), ask, fed);
                out.push(fills.finish(&steps.finish()));
            }
            None => out.push(super::attribute_device(snap, device, &settings, ask)?),
        }
    }
    Ok(Some(out))
}

/// Decodes and models a snapshot as [`crate::snapshot::load_releasing`]
/// does, feeding its trace entries to a thread as they are decoded and
/// dropping them from the pickle; with it, what the thread fed (`None` when
/// the thread failed; its `ids` are the entries dropped).
fn load<'a>(
    input_name: &str,
    data: &'a [u8],
    limits: &Limits,
    release: Option<Release<'_>>,
    ask: Ask,
) -> (Result<Snapshot<'a>, Error>, Option<Fed>) {
    let guess = data.len() / BYTES_PER_ENTRY;
    std::thread::scope(|threads| {
        let mut ids = Vec::new();
        let _ = ids.try_reserve(guess);
        let mut tap = TraceTap {
            reader: TraceReader::new(),
            batches: Batches::spawn(
                threads,
                Lives::new(guess, ask.at),
                Some(StepScan::unannotated(guess)),
                Some(ids),
            ),
        };
        let snap = crate::snapshot::load_tapped(input_name, data, limits, release, Some(&mut tap));
        (snap, tap.batches.finish())
    })
}

/// Reads the trace entries among the dicts the decoder builds and hands
/// them on, each numbered by its dict's arena id.
struct TraceTap<'t> {
    reader: TraceReader,
    batches: Batches<'t>,
}

impl<'a> Tap<'a> for TraceTap<'_> {
    fn dict(&mut self, p: &Pickle<'a>, dict: V, shape: u32, values: &[V]) -> bool {
        match (self.reader.entry(p, shape, values), dict.id()) {
            (Some(e), Some(id)) => {
                self.batches.entry(id, e);
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::attribute::{At, Grouping};

    fn asks() -> [Ask; 3] {
        [
            Ask::default(),
            Ask {
                by: Grouping::Stack,
                top: 3,
                at: Some(At::Event(40)),
                timeline_points: 50,
                ..Ask::default()
            },
            Ask {
                by: Grouping::User,
                top: usize::MAX,
                at: Some(At::Time(2_000)),
                blocks_without_stacks: true,
                ..Ask::default()
            },
        ]
    }

    /// Every bundled snapshot: attributed as it is decoded, the answer is
    /// the one the plain read gives (for every ask), and the snapshots
    /// with one traced device are attributed that way, not read again.
    #[test]
    fn attributing_as_decoded_gives_what_the_plain_read_gives() {
        let mut fed = 0;
        for (name, data) in crate::snapshot::bundled() {
            let name = name.as_str();
            let limits = Limits::default();
            let snap = crate::snapshot::load_with(name, &data, &limits).unwrap();
            let traced: Vec<u32> = (snap.devices().into_iter())
                .filter(|&d| snap.trace_len(d) > 0)
                .collect();
            let as_decoded = traced.len() == 1;
            for ask in asks() {
                let plain = super::super::attribute(&snap, None, ask).unwrap();
                let (_, tapped) = attribute_input(name, &data, &limits, None, None, ask).unwrap();
                assert_eq!(tapped, plain, "{name} {ask:?}");
                let direct = attribute_as_decoded(name, &data, &limits, None, None, ask).unwrap();
                // (Where the tap took nothing, the snapshot is whole: attributed as it is.)
                assert!(direct.is_some() || !as_decoded, "{name}");
                if let Some((_, direct)) = direct {
                    assert_eq!(direct, plain, "{name}");
                    fed += 1;
                }
            }
        }
        // 35 of the bundled snapshots, each under the three asks.
        assert!(fed >= 3 * 35, "{fed}");
    }

    /// A trace of several feeding batches, fed as decoded, with the
    /// releasing hook called as a mapped input's is: the plain answer.
    #[test]
    fn a_long_trace_fed_as_decoded_gives_the_plain_answer() {
        let data = super::super::passes::tests::recorded();
        let snap = crate::snapshot::load("t.pickle", &data).unwrap();
        let limits = Limits::default();
        let mut told = Vec::new();
        let mut release = |at: usize| told.push(at);
        for ask in asks() {
            let plain = super::super::attribute(&snap, None, ask).unwrap();
            let direct =
                attribute_as_decoded("t", &data, &limits, Some(&mut release), None, ask).unwrap();
            assert_eq!(direct.map(|(_, a)| a), Some(plain));
        }
        assert!(told.first() == Some(&0), "{told:?}");
    }

    /// A trace that refers to its entry dicts a second time
    /// (`scripts/gen_shared_entries_snapshot.py`): what the tap took is not
    /// the trace, so the snapshot is read again, to the plain answer.
    #[test]
    fn a_trace_that_repeats_its_entries_is_read_again() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/attribution/shared-trace-entries.pickle"
        );
        let data = std::fs::read(path).unwrap();
        let limits = Limits::default();
        let snap = crate::snapshot::load_with("s", &data, &limits).unwrap();
        assert_eq!(snap.trace_len(0), 4);
        for ask in asks() {
            let plain = super::super::attribute(&snap, None, ask).unwrap();
            assert_eq!(plain[0].trace_entries, 4);
            let direct = attribute_as_decoded("s", &data, &limits, None, None, ask).unwrap();
            assert!(direct.is_none());
            let (_, out) = attribute_input("s", &data, &limits, None, None, ask).unwrap();
            assert_eq!(out, plain);
        }
    }
}
