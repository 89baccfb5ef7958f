//! The pickle decoder on arbitrary bytes: never a panic, and a successful
//! decode can always be walked.
#![no_main]

use allocdoc::snapshot::pickle;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = pickle::Limits {
        max_marks: 4096,
        max_values: 1 << 22,
        ..pickle::Limits::default()
    };
    match pickle::decode_with(data, limits) {
        Ok(p) => {
            let _ = p.reachable_objects();
            let _ = p.to_json(p.root, 8);
        }
        Err(e) => assert!(e.offset() <= data.len()),
    }
});
