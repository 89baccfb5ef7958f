//! `forecast` on arbitrary bytes: the bytes read as a run file (one size a
//! line), and as one snapshot read as two recordings of a series (the first
//! at size 2, the second at the last byte's size, its sizes scaled by the
//! bytes), run over steps of sizes the bytes give, under the defaults and
//! expandable segments on a small card with the cap's bisection; never
//! panics. Seed the corpus with fixtures/fit and fixtures/forecast
//! (decompressed).
#![no_main]

mod series_of_bytes;

use allocdoc::app::forecast::parse_sizes;
use allocdoc::conf::Settings;
use allocdoc::trial::forecast::{ForecastAsk, forecast};
use allocdoc::workload::run::RunPlan;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = parse_sizes("fuzz", data, "step sizes");
    let Some(series) = series_of_bytes::series(data) else {
        return;
    };
    let steps: Vec<u64> = data
        .iter()
        .take(64)
        .map(|&b| 1 + u64::from(b % 16))
        .collect();
    if steps.is_empty() {
        return;
    }
    let es = Settings {
        expandable_segments: true,
        ..Settings::default()
    };
    let ask = ForecastAsk {
        steps,
        confs: vec![(String::new(), Settings::default()), ("es".into(), es)],
        capacity: Some(1 << 30),
        cap_step: 1,
        memo_budget: 16 << 20,
        knobs: None,
        search: None,
    };
    let _ = forecast(&RunPlan::new(&series), &ask, &|_| {});
});
