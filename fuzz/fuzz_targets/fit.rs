//! `fit` on arbitrary bytes: one snapshot read as two recordings of a
//! series (the first at size 2, the second with the last byte's size, so
//! laws of every shape come up), paired, fitted, predicted and searched
//! for the largest size on a small card, never panics. Seed the corpus with
//! fixtures/snapshots and fixtures/fit (decompressed).
#![no_main]

mod series_of_bytes;

use allocdoc::trial::fit::{FitAsk, fit};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some(series) = series_of_bytes::series(data) else {
        return;
    };
    let ask = FitAsk {
        at: vec![1, 7, 1000],
        confs: vec![(String::new(), allocdoc::conf::Settings::default())],
        capacity: Some(1 << 30),
        step: 1,
    };
    let _ = fit(&series, &ask);
});
