//! The trace CSV and RMM log readers on arbitrary bytes: never a panic, and
//! a trace they accept replays. Two differential checks ride along: the run
//! fed in pieces as the streaming parse hands them over (in reused buffers,
//! keeping none) is the run of the whole trace, with the same event count or
//! the same error, and where the expandable-segments run says a 32 MiB
//! `max_split_size` would turn none of its decisions, the run under it is the
//! same run.
#![no_main]

use allocdoc::conf::Settings;
use allocdoc::device::sim::SimDevice;
use allocdoc::workload::{ReplayOptions, StreamedReplay, Trace, replay, rmm};
use libfuzzer_sys::fuzz_target;

const CARD: u64 = 1 << 30;

fuzz_target!(|data: &[u8]| {
    let settings = Settings::default();
    let mut run = StreamedReplay::new(
        &settings,
        SimDevice::new(CARD),
        ReplayOptions::default(),
        0,
        0,
    );
    // The events handed over in reused buffers, as `allocdoc replay` reads a trace CSV.
    let streamed = Trace::stream("fuzz", data, 7, |mut full| {
        run.feed(&full);
        full.clear();
        full
    });
    match (Trace::parse("fuzz", data), streamed) {
        (Ok(trace), Ok(events)) => {
            assert_eq!(events, trace.len() as u64, "event count");
            let whole = replay(&trace, &settings, SimDevice::new(CARD));
            assert_eq!(run.finish(events), whole, "fed in pieces");
            let es = Settings {
                expandable_segments: true,
                ..Settings::default()
            };
            let base = replay(&trace, &es, SimDevice::new(CARD)).figures;
            if base.max_split_flips.is_some_and(|f| f & (32 << 20) == 0) {
                let t = Settings {
                    max_split_size: 32 << 20,
                    ..es
                };
                assert_eq!(replay(&trace, &t, SimDevice::new(CARD)).figures, base, "32 MiB");
            }
        }
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "the same error"),
        (a, b) => panic!("the whole parse gave {a:?}, the streamed one {b:?}"),
    }
    if let Ok(log) = rmm::parse("fuzz", data) {
        let _ = log.to_trace();
    }
});
