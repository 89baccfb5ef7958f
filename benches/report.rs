//! The HTML report and the snapshot writer at a million events:
//! `cargo bench --features bench --bench report`.

use allocdoc::report::html::{ReportData, Timeline, render};
use allocdoc::snapshot::writer::{self, Action, Snapshot, TraceEntry};

fn main() {
    divan::main();
}

const EVENTS: u64 = 1_000_000;

/// A sawtooth allocated series and a ratcheting reserved one, as a training run draws.
fn timeline(name: &str) -> Timeline {
    let mut t = Timeline::new(name);
    let mut reserved = 0u64;
    for i in 0..EVENTS {
        let allocated = (i % 4096) << 20;
        reserved = reserved.max(allocated + (i << 10));
        t.push(i, allocated, reserved);
    }
    t
}

/// Streaming a million (allocated, reserved) points into the envelopes.
#[divan::bench]
fn timeline_push_1m() -> Timeline {
    timeline("current")
}

/// Rendering a report with two million-event timelines overlaid.
#[divan::bench]
fn render_two_1m_timelines(bencher: divan::Bencher) {
    let data = ReportData {
        title: "bench".into(),
        timelines: vec![timeline("current"), timeline("recommended")],
        capacity: Some(80 << 30),
        ..ReportData::default()
    };
    bencher.bench(|| render(divan::black_box(&data)).len());
}

/// Writing a snapshot pickle whose trace has a million entries.
#[divan::bench]
fn snapshot_write_1m_entries(bencher: divan::Bencher) {
    let trace: Vec<TraceEntry> = (0..EVENTS)
        .map(|i| TraceEntry {
            action: if i % 2 == 0 {
                Action::Alloc
            } else {
                Action::FreeCompleted
            },
            addr: 0x7f00_0000_0000 + (i / 2 % 4096) * 512,
            size: 512 + i % 4096,
            stream: 0,
            time_us: 1_700_000_000_000_000 + i as i64,
        })
        .collect();
    let snap = Snapshot {
        segments: Vec::new(),
        device_traces: vec![trace],
        ..Snapshot::default()
    };
    bencher.bench(|| writer::to_bytes(divan::black_box(&snap)).len());
}
