//! `fit` on arbitrary bytes: one snapshot read as two recordings of a
//! series (the first at size 2, the second with the last byte's size, so
//! laws of every shape come up), paired, fitted, predicted and searched
//! for the largest size on a small card, never panics. Seed the corpus with
//! fixtures/snapshots and fixtures/fit (decompressed).
#![no_main]

use allocdoc::snapshot::{self, fit::Recording, fit::Series};
use allocdoc::trial::fit::{FitAsk, fit};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(snap) = snapshot::load("fuzz", data) else {
        return;
    };
    let Ok(Some(a)) = Recording::read("a", 2, &snap) else {
        return;
    };
    let mut b = a.clone();
    b.input = "b".into();
    b.size = 3 + u64::from(data.last().copied().unwrap_or(0));
    // The second recording: the first with its sizes scaled by the bytes.
    for (x, byte) in b.allocs.iter_mut().zip(data.iter().cycle()) {
        x.size = x.size.saturating_mul(u64::from(*byte % 5));
    }
    let Ok(series) = Series::new(vec![a, b]) else {
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
