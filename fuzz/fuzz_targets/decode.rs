//! The pickle decoder on arbitrary bytes: never a panic, and a successful
//! decode can always be walked; also with a tap that takes every other
//! shaped dict (their values dropped, what reads them reads nothing).
#![no_main]

use allocdoc::snapshot::pickle::{self, Pickle, Tap, V};
use libfuzzer_sys::fuzz_target;

/// Takes every other shaped dict it is told of.
struct EveryOther(bool);

impl Tap<'_> for EveryOther {
    fn dict(&mut self, _: &Pickle<'_>, _: V, _: u32, _: &[V]) -> bool {
        self.0 = !self.0;
        self.0
    }
}

fuzz_target!(|data: &[u8]| {
    let limits = pickle::Limits {
        max_marks: 4096,
        max_values: 1 << 22,
        ..pickle::Limits::default()
    };
    let plain = pickle::decode_with(data, limits);
    match &plain {
        Ok(p) => {
            let _ = p.reachable_objects();
            let _ = p.to_json(p.root, 8);
        }
        Err(e) => assert!(e.offset() <= data.len()),
    }
    let mut tap = EveryOther(false);
    if let Ok(p) = pickle::decode_tapped(data, limits, None, Some(&mut tap)) {
        let _ = p.reachable_objects();
        let _ = p.to_json(p.root, 8);
    }
});
