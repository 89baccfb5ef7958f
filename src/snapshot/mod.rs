//! Torch memory snapshots: a pickle decoder that never executes anything, the
//! snapshot model, and the evidence drawn from it.

use crate::Error;
use crate::evidence::Observation;

/// True when `data` starts like a pickle (PROTO opcode with protocol 2..=5).
pub fn is_pickle(data: &[u8]) -> bool {
    data.len() >= 2 && data[0] == 0x80 && (2..=5).contains(&data[1])
}

/// One `snapshot` observation per device present in the snapshot.
pub fn observations(input_name: &str, data: &[u8]) -> Result<Vec<Observation>, Error> {
    let _ = (input_name, data);
    Err(Error::Usage("snapshot support is not built yet".into()))
}
pub mod writer;
