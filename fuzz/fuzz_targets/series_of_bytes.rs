//! A series of two recordings from arbitrary bytes, as the fit and forecast
//! targets fuzz it: one snapshot read as the first recording at size 2, the
//! second the first with its sizes scaled by the bytes, at a size the last
//! byte gives (so laws of every shape come up).

use allocdoc::snapshot::{self, fit::Recording, fit::Series};

pub fn series(data: &[u8]) -> Option<Series> {
    let snap = snapshot::load("fuzz", data).ok()?;
    let a = Recording::read("a", 2, &snap).ok()??;
    let mut b = a.clone();
    b.input = "b".into();
    b.size = 3 + u64::from(data.last().copied().unwrap_or(0));
    for (x, byte) in b.allocs.iter_mut().zip(data.iter().cycle()) {
        x.size = x.size.saturating_mul(u64::from(*byte % 5));
    }
    Series::new(vec![a, b]).ok()
}
