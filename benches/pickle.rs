//! Snapshot decoding: the arena pickle decoder alone, and decode + model +
//! evidence (what `allocdoc parse` does per snapshot), on the committed small
//! fixtures and on a ~200 MB torch-shaped snapshot generated at run time into
//! target/bench/ by scripts/gen_snapshot.py (skipped when python3 is missing).
//!
//! `cargo bench --features bench --bench pickle`; scripts/pickle_bench.sh compares with Python.

use allocdoc::snapshot::{self, pickle};
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    divan::main();
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The large generated snapshot, created on first use.
fn large() -> Option<PathBuf> {
    let path = root().join("target/bench/snap-200mb.pickle");
    if !path.exists() {
        std::fs::create_dir_all(path.parent()?).ok()?;
        let status = Command::new("python3")
            .arg(root().join("scripts/gen_snapshot.py"))
            .args(["--blocks", "1850000", "--trace", "1850000", "-o"])
            .arg(&path)
            .status()
            .ok()?;
        if !status.success() {
            return None;
        }
    }
    Some(path)
}

fn map(path: &Path) -> memmap2::Mmap {
    let f = std::fs::File::open(path).expect("bench input");
    // SAFETY: the bench's own file, not modified while mapped.
    unsafe { memmap2::Mmap::map(&f) }.expect("mmap")
}

const SMALL: &[&str] = &[
    "maphsge4-select_n_snapshot_traced.pickle",
    "wedsonlin-assignment2-systems_medium_128_inference_memory_snapshot.pickle",
    "muduard-layoutediting_memory_snapshot.pkl",
];

#[divan::bench(args = SMALL)]
fn decode_fixture(bencher: divan::Bencher, name: &str) {
    let data = std::fs::read(root().join("fixtures/snapshots").join(name)).expect("fixture");
    bencher
        .counter(divan::counter::BytesCount::new(data.len()))
        .bench(|| pickle::decode(divan::black_box(&data)).map(|p| p.object_count()));
}

#[divan::bench(args = SMALL)]
fn observations_fixture(bencher: divan::Bencher, name: &str) {
    let data = std::fs::read(root().join("fixtures/snapshots").join(name)).expect("fixture");
    bencher
        .counter(divan::counter::BytesCount::new(data.len()))
        .bench(|| snapshot::observations(name, divan::black_box(&data)).map(|o| o.len()));
}

#[divan::bench(sample_count = 3, sample_size = 1)]
fn decode_200mb(bencher: divan::Bencher) {
    let Some(path) = large() else { return };
    let data = map(&path);
    bencher
        .counter(divan::counter::BytesCount::new(data.len()))
        .bench(|| pickle::decode(divan::black_box(&data[..])).map(|p| p.object_count()));
}

#[divan::bench(sample_count = 3, sample_size = 1)]
fn observations_200mb(bencher: divan::Bencher) {
    let Some(path) = large() else { return };
    let data = map(&path);
    bencher
        .counter(divan::counter::BytesCount::new(data.len()))
        .bench(|| snapshot::observations("bench", divan::black_box(&data[..])).map(|o| o.len()));
}
