//! Snapshot replay on arbitrary bytes: rebuilding the start state from an
//! untrusted trace and segments, seeding it and replaying it (with and
//! without fidelity) never panics. Seed the corpus with fixtures/snapshots.
#![no_main]

use allocdoc::allocator::CachingAllocator;
use allocdoc::device::sim::SimDevice;
use allocdoc::snapshot;
use allocdoc::workload::snapshot_trace::{self, SnapshotTrace};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(snap) = snapshot::load("fuzz", data) else {
        return;
    };
    let settings = snapshot_trace::recorded_settings(&snap);
    let Some(device) = snapshot_trace::traced_device(&snap) else {
        return;
    };
    let Ok(st) = SnapshotTrace::new(&snap, device, &settings) else {
        return;
    };
    for fidelity in [true, false] {
        let sim = SimDevice::new(1 << 34).with_recorded_addresses(st.recorded_addresses(fidelity));
        let mut a = CachingAllocator::new(settings.clone(), sim);
        let _ = st.run(&mut a, fidelity);
    }
});
