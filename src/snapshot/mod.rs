//! Torch memory snapshots: a pickle decoder that never executes anything
//! ([`pickle`]), the snapshot model ([`model`]), and the evidence drawn from
//! it ([`evidence`]).

pub mod evidence;
mod grow;
pub mod model;
pub mod pickle;
pub mod trace_metrics;

use crate::Error;
use crate::evidence::Observation;
pub use model::Snapshot;

/// True when `data` is a pickle: the PROTO opcode with protocol 2..=5, or,
/// protocols 0 and 1 having no PROTO opcode, a dict or list opened as
/// `pickle.dump` opens them (`(d` / `(l` in protocol 0; `}` / `]` then a memo
/// put or MARK in protocol 1) that also decodes completely, so that a text
/// log starting with `(` or `]` stays text.
pub fn is_pickle(data: &[u8]) -> bool {
    match data {
        [0x80, protocol, ..] => (2..=5).contains(protocol),
        [b'(', b'd' | b'l', ..] | [b'}' | b']', b'q' | b'r' | b'(', ..] => {
            pickle::decode(data).is_ok()
        }
        _ => false,
    }
}

/// Decodes and models a snapshot; errors name the input and the byte offset or
/// the path of the bad field.
pub fn load<'a>(input_name: &str, data: &'a [u8]) -> Result<Snapshot<'a>, Error> {
    let p = pickle::decode(data)
        .map_err(|e| Error::Input(format!("{input_name}: not a readable snapshot pickle: {e}")))?;
    Snapshot::from_pickle(p)
        .map_err(|e| Error::Input(format!("{input_name}: not a torch memory snapshot: {e}")))
}

/// One `snapshot` observation per device present in the snapshot.
pub fn observations(input_name: &str, data: &[u8]) -> Result<Vec<Observation>, Error> {
    let snap = load(input_name, data)?;
    evidence::device_observations(input_name, &snap)
        .map_err(|e| Error::Input(format!("{input_name}: not a torch memory snapshot: {e}")))
}
pub mod writer;
