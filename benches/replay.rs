//! Replay throughput of the bundled caching allocator: a 10 M-event synthetic
//! trace (allocations of mixed sizes over a bounded live set, frees in random
//! order, an occasional empty_cache) on one core.
//!
//! Run: `cargo bench --features bench --bench replay`.

use allocdoc::conf::Settings;
use allocdoc::device::sim::SimDevice;
use allocdoc::workload::{Event, Trace, replay};
use divan::counter::ItemsCount;

const EVENTS: usize = 10_000_000;
const LIVE: usize = 2_000;
const CAPACITY: u64 = 80 << 30;

fn main() {
    divan::main();
}

#[path = "../tests/support/xorshift.rs"]
mod xorshift;
use xorshift::Rng;

/// Sizes as a training step makes them: mostly small tensors, a quarter in the
/// 1–10 MiB band, some large activations and weights.
fn size(rng: &mut Rng) -> u64 {
    let r = rng.next();
    match r % 100 {
        0..60 => 1 + (r >> 8) % (1 << 20),
        60..85 => (1 << 20) + (r >> 8) % (9 << 20),
        _ => (10 << 20) + (r >> 8) % (90 << 20),
    }
}

fn synthetic_trace() -> Trace {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut events = Vec::with_capacity(EVENTS);
    let mut live: Vec<u32> = Vec::with_capacity(LIVE);
    let mut free_ids: Vec<u32> = (0..LIVE as u32).rev().collect();
    while events.len() < EVENTS {
        let grow = live.is_empty() || (live.len() < LIVE && rng.next().is_multiple_of(2));
        if grow {
            let id = free_ids.pop().unwrap_or(0);
            events.push(Event::Alloc {
                id,
                size: size(&mut rng),
                stream: 0,
            });
            live.push(id);
        } else {
            let i = (rng.next() % live.len() as u64) as usize;
            let id = live.swap_remove(i);
            events.push(Event::Free { id });
            free_ids.push(id);
        }
        if rng.next().is_multiple_of(1_000_000) {
            events.push(Event::EmptyCache);
        }
    }
    Trace::from_events(events).expect("the generator keeps ids live")
}

#[divan::bench(args = ["defaults", "expandable_segments:True", "max_split_size_mb:128"], sample_count = 3, sample_size = 1)]
fn replay_10m_events(bencher: divan::Bencher, conf: &str) {
    let trace = synthetic_trace();
    let settings = allocdoc::conf::parse(
        if conf == "defaults" { "" } else { conf },
        allocdoc::conf::TorchVersion::DEFAULT,
    )
    .map(|p| p.settings)
    .unwrap_or_else(|_| Settings::default());
    bencher
        .counter(ItemsCount::new(trace.len()))
        .bench_local(|| {
            let run = replay(&trace, &settings, SimDevice::new(CAPACITY));
            assert!(run.figures.oom.is_none());
            run.figures.peak_reserved_bytes
        });
}

/// The trace CSV of `shared/bench/gen_trace.py`, for comparing the in-process
/// figures below with the whole `allocdoc replay` process on the same file:
/// the file named by `ALLOCDOC_TRACE_CSV`, else a trace of the same shape made
/// here (1 M events: steps of 12 activations and 20 small temporaries, every
/// id new, a long-lived tensor every 200 steps).
fn trace_csv() -> Vec<u8> {
    if let Some(path) = std::env::var_os("ALLOCDOC_TRACE_CSV") {
        return std::fs::read(&path).expect("ALLOCDOC_TRACE_CSV names a readable file");
    }
    const MIB: u64 = 1 << 20;
    let mut rng = Rng(42);
    let mut pick = |n: u64| rng.next() % n;
    let mut out = String::from("action,id,size,stream\n");
    let (mut rows, mut n) = (0, 0u64);
    let mut alloc = |out: &mut String, rows: &mut usize, size: u64| {
        n += 1;
        *rows += 1;
        out.push_str(&format!("alloc,t{n},{size},0\n"));
        n
    };
    let free = |out: &mut String, rows: &mut usize, id: u64| {
        *rows += 1;
        out.push_str(&format!("free,t{id},,0\n"));
    };
    for _ in 0..8 {
        alloc(&mut out, &mut rows, (1 + pick(64)) * MIB);
    }
    let mut step = 0;
    while rows < 1_000_000 {
        let len = [128, 256, 384, 512, 768, 1024, 1536, 2048][pick(8) as usize];
        let acts: Vec<u64> = (0..12)
            .map(|_| {
                alloc(
                    &mut out,
                    &mut rows,
                    len * [4096, 8192, 16384][pick(3) as usize] * 2,
                )
            })
            .collect();
        let small: Vec<u64> = (0..20)
            .map(|_| alloc(&mut out, &mut rows, (1 + pick(2048)) * 512))
            .collect();
        for &id in acts[3..].iter().rev().chain(&small).chain(&acts[..3]) {
            free(&mut out, &mut rows, id);
        }
        step += 1;
        if step % 200 == 0 {
            alloc(&mut out, &mut rows, len * 8192);
        }
    }
    out.into_bytes()
}

/// `Trace::parse` of the trace CSV above (the `replay` command's reading).
#[divan::bench(sample_count = 5, sample_size = 1)]
fn parse_trace_csv(bencher: divan::Bencher) {
    let csv = trace_csv();
    let events = Trace::parse("trace.csv", &csv)
        .expect("a valid trace")
        .len();
    bencher
        .counter(ItemsCount::new(events))
        .bench_local(|| Trace::parse("trace.csv", &csv).map(|t| t.len()));
}

/// The in-process replay of the trace CSV above under the defaults on an
/// 80 GiB card: what `allocdoc replay FILE --capacity 80GiB` does after reading.
#[divan::bench(sample_count = 5, sample_size = 1)]
fn replay_trace_csv(bencher: divan::Bencher) {
    let trace = Trace::parse("trace.csv", &trace_csv()).expect("a valid trace");
    bencher
        .counter(ItemsCount::new(trace.len()))
        .bench_local(|| {
            replay(&trace, &Settings::default(), SimDevice::new(CAPACITY))
                .figures
                .peak_reserved_bytes
        });
}
