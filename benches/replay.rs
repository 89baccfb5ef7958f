//! Replay throughput of the bundled caching allocator: a 10 M-event synthetic
//! trace (allocations of mixed sizes over a bounded live set, frees in random
//! order, an occasional empty_cache) on one core.
//!
//! Run: `cargo bench --bench replay`.

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
