//! Snapshot evidence on arbitrary bytes: never a panic.
#![no_main]

use allocdoc::snapshot;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = snapshot::observations("fuzz", data);
});
