//! Torch memory snapshots: a pickle decoder that never executes anything
//! ([`pickle`]), the snapshot model ([`model`]), and the evidence drawn from
//! it ([`evidence`]).

pub mod attribute;
pub mod evidence;
pub mod fit;
pub(crate) mod grow;
mod live_map;
pub mod model;
pub mod pickle;
pub mod trace_metrics;

use crate::Error;
use crate::evidence::Observation;
use crate::limits::{Limit, Limits};
pub use evidence::Fills;
pub use model::Snapshot;

/// How an input's first bytes read as a pickle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Opening {
    /// The PROTO opcode of protocols 2 to 5, or the exact opening
    /// `pickle.dump` writes in protocols 0 and 1: a dict or list memoized as
    /// entry 0 (`(dp0\n`, `(lp0\n`, `}q\x00`, `]q\x00`).
    Certain,
    /// A header-less start a pickle may have (a MARK, a container, a GLOBAL):
    /// only a whole decode tells it from text starting the same way.
    Possible,
    No,
}

fn opening(data: &[u8]) -> Opening {
    match data {
        [0x80, protocol, ..] if (2..=5).contains(protocol) => Opening::Certain,
        [b'}' | b']', b'q', 0, ..] => Opening::Certain,
        [b'(', b'd' | b'l', b'p', rest @ ..]
            if rest
                .iter()
                .position(|b| !b.is_ascii_digit())
                .is_some_and(|n| n > 0 && rest[n] == b'\n') =>
        {
            Opening::Certain
        }
        [b'(', ..]
        | [b'}' | b']', b'q' | b'r' | b'(', ..]
        | [b'c', b'A'..=b'Z' | b'a'..=b'z' | b'_', ..] => Opening::Possible,
        _ => Opening::No,
    }
}

/// Limits for telling a header-less pickle from text: a real one nests a
/// few levels deep, text read as opcodes opens a MARK per `(`.
fn sniff() -> pickle::Limits {
    pickle::Limits {
        max_marks: 256,
        max_values: memory_values().min(1 << 30),
        sized: true,
    }
}

/// What the decoder may hold at most, in its 8-byte values: half the memory
/// this process may use (`limits::memory_available`; the model, the evidence
/// and the input's pages need the rest), so that a memory cgroup never kills
/// it for a pickle that decodes to more.
fn memory_values() -> u64 {
    static VALUES: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *VALUES.get_or_init(|| crate::limits::memory_available().map_or(u64::MAX, |b| b / 16))
}

/// True when `data` is a pickle: its opening is certain, or it decodes to
/// its STOP (a pickle that would call code included: loading it then
/// refuses it, naming the callable), so that a text log starting with `(`,
/// `]` or `c` stays text.
pub fn is_pickle(data: &[u8]) -> bool {
    match opening(data) {
        Opening::Certain => true,
        Opening::Possible => matches!(
            pickle::decode_whole(data, sniff()),
            Ok(()) | Err(pickle::DecodeError::Code { .. })
        ),
        Opening::No => false,
    }
}

/// True when `data` opens as [`is_pickle`] is certain of (a PROTO header,
/// or the exact opening `pickle.dump` writes in protocols 0 and 1); a
/// pickle without one is a guess that text parsing as evidence must beat.
pub fn opens_certainly(data: &[u8]) -> bool {
    opening(data) == Opening::Certain
}

/// True when an input whose first bytes are `head` may be a pickle: read
/// it whole and ask [`is_pickle`]. For streams, whose end is not read yet:
/// a pickle's head decodes up to an opcode cut near its end, where text
/// that starts like one fails early (`(Training…` reads as a MARK and a
/// string of 1.8 GB).
pub fn may_be_pickle(head: &[u8]) -> bool {
    match opening(head) {
        Opening::Certain => true,
        Opening::Possible => match pickle::decode_whole(head, sniff()) {
            Ok(()) | Err(pickle::DecodeError::Code { .. }) => true,
            Err(pickle::DecodeError::Truncated { offset, .. }) => offset >= head.len() / 2,
            Err(_) => false,
        },
        Opening::No => false,
    }
}

/// Decodes and models a snapshot with the default [`Limits`].
pub fn load<'a>(input_name: &str, data: &'a [u8]) -> Result<Snapshot<'a>, Error> {
    load_with(input_name, data, &Limits::default())
}

/// Decodes and models a snapshot within `limits`; errors name the input and
/// the byte offset or the path of the bad field, or the limit and its flag.
pub fn load_with<'a>(
    input_name: &str,
    data: &'a [u8],
    limits: &Limits,
) -> Result<Snapshot<'a>, Error> {
    load_releasing(input_name, data, limits, None)
}

/// [`load_with`], telling `release` how far the decoder has read (an input
/// held as a memory map gives those pages back: [`pickle::Release`]).
pub fn load_releasing<'a>(
    input_name: &str,
    data: &'a [u8],
    limits: &Limits,
    release: Option<pickle::Release<'_>>,
) -> Result<Snapshot<'a>, Error> {
    load_tapped(input_name, data, limits, release, None)
}

/// [`load_releasing`], telling `tap` of the dicts the decoder builds with a
/// key shape ([`pickle::Tap`]).
pub(crate) fn load_tapped<'a>(
    input_name: &str,
    data: &'a [u8],
    limits: &Limits,
    release: Option<pickle::Release<'_>>,
    tap: Option<&mut dyn pickle::Tap<'a>>,
) -> Result<Snapshot<'a>, Error> {
    let memory = memory_values();
    let decode_limits = pickle::Limits {
        max_values: limits.max_objects.min(memory),
        // The bound by the input's size holds while --max-objects is left at
        // its default: naming one is the way to decode an unusual pickle.
        sized: limits.max_objects == Limits::default().max_objects,
        ..pickle::Limits::default()
    };
    let decoded = populating(data, || {
        pickle::decode_tapped(data, decode_limits, release, tap)
    });
    let p = decoded.map_err(|e| match e {
        pickle::DecodeError::Limit {
            offset,
            what,
            limit,
        } if what == pickle::SIZED_VALUES => Error::Input(format!(
            "{input_name}: at byte {offset}: the decoded values would pass {limit}, 3/4 of a \
             value per input byte and 64 MiB, more than a torch snapshot of its size holds \
             (a flood of cheap opcodes does; decode an unusual pickle with --max-objects N)"
        )),
        pickle::DecodeError::Limit { offset, what, .. }
            if what == pickle::VALUES && memory < limits.max_objects =>
        {
            Error::Input(format!(
                "{input_name}: at byte {offset}: the decoded values would pass {}, half the \
                 memory this process may use (its memory cgroup's limit or the machine's RAM); \
                 a snapshot this large needs more memory",
                crate::units::human(memory.saturating_mul(8))
            ))
        }
        pickle::DecodeError::Limit { offset, what, .. } if what == pickle::VALUES => {
            limits.exceeded(input_name, Limit::Objects, &format!("at byte {offset}"))
        }
        pickle::DecodeError::Memory { .. } => Error::Input(format!("{input_name}: {e}")),
        _ => Error::Input(format!("{input_name}: not a readable snapshot pickle: {e}")),
    })?;
    Snapshot::from_pickle(p, limits.max_blocks).map_err(|e| match e {
        model::BuildError::Model(e) => {
            Error::Input(format!("{input_name}: not a torch memory snapshot: {e}"))
        }
        model::BuildError::Blocks(n) => limits.exceeded(
            input_name,
            Limit::Blocks,
            &format!("its segments list {n} blocks"),
        ),
        model::BuildError::Memory(bytes) => {
            crate::limits::out_of_memory(input_name, "the snapshot's blocks", bytes)
        }
    })
}

/// One `snapshot` observation per device present in the snapshot.
pub fn observations(input_name: &str, data: &[u8]) -> Result<Vec<Observation>, Error> {
    observations_with(input_name, data, &Limits::default())
}

/// [`observations`] within `limits`.
pub fn observations_with(
    input_name: &str,
    data: &[u8],
    limits: &Limits,
) -> Result<Vec<Observation>, Error> {
    observations_releasing(input_name, data, limits, None, Fills::Headline)
}

/// [`observations_with`], with a [`pickle::Release`] hook; `fills` says
/// whether each observation carries its headline attribution.
pub fn observations_releasing(
    input_name: &str,
    data: &[u8],
    limits: &Limits,
    release: Option<pickle::Release<'_>>,
    fills: Fills,
) -> Result<Vec<Observation>, Error> {
    populating(data, || {
        let snap = load_releasing(input_name, data, limits, release)?;
        evidence::device_observations(input_name, &snap, fills)
            .map_err(|e| Error::Input(format!("{input_name}: not a torch memory snapshot: {e}")))
    })
}

/// Runs `f` with its pages populated on a thread of their own
/// ([`grow::populating`]) when the snapshot `data` is of
/// [`POPULATING_INPUT`] bytes or more.
fn populating<R>(data: &[u8], f: impl FnOnce() -> R) -> R {
    grow::populating(data.len() >= POPULATING_INPUT, f)
}

/// Inputs from which the pages a snapshot's decoding and model fill are
/// populated on a thread of their own: below, the thread would cost more
/// than it saves.
const POPULATING_INPUT: usize = 32 << 20;
pub mod writer;

/// Every bundled snapshot (`fixtures/snapshots`, `.pickle` and `.pkl`): its
/// file name and bytes, for the tests that hold a path against another.
#[cfg(test)]
pub(crate) fn bundled() -> Vec<(String, Vec<u8>)> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/snapshots");
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "pickle" || x == "pkl"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&p).unwrap())
        })
        .collect();
    out.sort();
    out
}
