//! The trace CSV and RMM log readers on arbitrary bytes: never a panic, and
//! a trace they accept replays.
#![no_main]

use allocdoc::conf::Settings;
use allocdoc::device::sim::SimDevice;
use allocdoc::workload::{Trace, replay, rmm};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(trace) = Trace::parse("fuzz", data) {
        let _ = replay(&trace, &Settings::default(), SimDevice::new(1 << 30));
    }
    if let Ok(log) = rmm::parse("fuzz", data) {
        let _ = log.to_trace();
    }
});
