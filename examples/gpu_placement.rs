//! Where does the real driver put segments? Replays the probe workloads of
//! `allocdoc::workload::probe` (every family, with and without expandable
//! segments) through the bundled allocator on a GPU, recording the address of
//! every cuMemAlloc and cuMemAddressReserve (and the cuMemMap calls of
//! expandable segments), and the same on the simulated card under each
//! placement policy (`device::sim::Placement`). For each new segment it
//! compares the *shape* of the placement, which does not depend on the
//! address base: its rank among the live segments, and whether it reuses a
//! range below the highest address handed out so far. It prints which policy
//! matches the driver, per workload and overall (bench/gpu/run.sh).
//!
//!     cargo run --release --example gpu_placement -- --out placement.json [--device N]
//!
//! Exits 3 with the reason when no CUDA driver or GPU is usable. NOT YET RUN
//! on a GPU (bench/gpu/README.md).

use allocdoc::conf::Settings;
use allocdoc::device::sim::{Placement, SimDevice};
use allocdoc::device::{Device, DeviceCounters, DeviceError};
use allocdoc::workload::probe::{Family, Params, epochs, generate, trace};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

/// A driver call that places or releases address space, as recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    /// cuMemAlloc or cuMemAddressReserve: size, returned address.
    Place { size: u64, addr: u64 },
    /// cuMemFree or cuMemAddressFree.
    Release { addr: u64 },
    /// cuMemMap of `size` bytes at `addr` (expandable segments).
    Map { addr: u64, size: u64 },
}

/// A device that records every placing call of the one it wraps.
struct Recording<D> {
    inner: D,
    calls: Rc<RefCell<Vec<Call>>>,
}

impl<D: Device> Device for Recording<D> {
    fn total_memory(&self) -> u64 {
        self.inner.total_memory()
    }
    fn mem_get_info(&mut self) -> (u64, u64) {
        self.inner.mem_get_info()
    }
    fn malloc(&mut self, size: u64) -> Result<u64, DeviceError> {
        let addr = self.inner.malloc(size)?;
        self.calls.borrow_mut().push(Call::Place { size, addr });
        Ok(addr)
    }
    fn free(&mut self, ptr: u64, size: u64) -> Result<(), DeviceError> {
        self.calls.borrow_mut().push(Call::Release { addr: ptr });
        self.inner.free(ptr, size)
    }
    fn reserve_address(&mut self, size: u64) -> Result<u64, DeviceError> {
        let addr = self.inner.reserve_address(size)?;
        self.calls.borrow_mut().push(Call::Place { size, addr });
        Ok(addr)
    }
    fn map(&mut self, addr: u64, size: u64) -> Result<(), DeviceError> {
        self.calls.borrow_mut().push(Call::Map { addr, size });
        self.inner.map(addr, size)
    }
    fn unmap(&mut self, addr: u64, size: u64) -> Result<(), DeviceError> {
        self.inner.unmap(addr, size)
    }
    fn release_address(&mut self, addr: u64, size: u64) -> Result<(), DeviceError> {
        self.calls.borrow_mut().push(Call::Release { addr });
        self.inner.release_address(addr, size)
    }
    fn synchronize(&mut self) {
        self.inner.synchronize()
    }
    fn counters(&self) -> DeviceCounters {
        self.inner.counters()
    }
}

/// The base-independent shape of each placement: (rank among the live
/// ranges, whether it lies below the highest end handed out so far), and for
/// each map, its offset into its reservation.
fn shape(calls: &[Call]) -> Vec<(usize, bool)> {
    let mut live: BTreeMap<u64, u64> = BTreeMap::new();
    let mut high = 0u64;
    let mut out = Vec::new();
    for c in calls {
        match *c {
            Call::Place { size, addr } => {
                out.push((live.range(..addr).count(), addr < high));
                live.insert(addr, size);
                high = high.max(addr.saturating_add(size));
            }
            Call::Release { addr } => {
                live.remove(&addr);
            }
            Call::Map { addr, .. } => {
                let offset = live
                    .range(..=addr)
                    .next_back()
                    .map_or(0, |(&start, _)| addr - start);
                out.push(((offset >> 21) as usize, false));
            }
        }
    }
    out
}

fn record<D: Device>(
    device: D,
    settings: &Settings,
    events: &[allocdoc::workload::Event],
) -> Vec<Call> {
    let calls = Rc::new(RefCell::new(Vec::new()));
    let dev = Recording {
        inner: device,
        calls: Rc::clone(&calls),
    };
    let _ = allocdoc::workload::replay(&trace(events.to_vec()), settings, dev);
    calls.take()
}

#[cfg(feature = "cuda")]
#[path = "support/gpu_args.rs"]
mod gpu_args;

#[cfg(feature = "cuda")]
fn main() -> std::process::ExitCode {
    use allocdoc::device::cuda::CudaDevice;
    let ordinal = gpu_args::ordinal();
    // A 4 GiB cap: enough for every workload below, small enough for any GPU.
    const CAP: u64 = 4 << 30;
    let mut rows = Vec::new();
    let mut totals: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for family in Family::ALL {
        let params = Params::new(60, 7 << 20, 5);
        // Two epochs, so the second one meets the freed ranges of the first.
        let events = epochs(&generate(family, &params), 2);
        for conf in ["", "expandable_segments:True"] {
            let settings = allocdoc::conf::parse(conf, allocdoc::conf::TorchVersion::DEFAULT)
                .expect("valid config")
                .settings;
            let gpu = match CudaDevice::open(ordinal, Some(CAP)) {
                Ok(d) => record(d, &settings, &events),
                Err(e) => {
                    eprintln!("gpu_placement: {e}");
                    return std::process::ExitCode::from(3);
                }
            };
            let real = shape(&gpu);
            let mut row = serde_json::json!({
                "family": family.name(), "conf": conf, "placements": real.len(),
                "gpu_addresses": gpu.iter().filter_map(|c| match c {
                    Call::Place { addr, size } => Some(serde_json::json!([addr, size])),
                    _ => None,
                }).collect::<Vec<_>>(),
            });
            for p in Placement::ALL {
                let sim = shape(&record(
                    SimDevice::new(CAP).with_placement(p),
                    &settings,
                    &events,
                ));
                let same = real.iter().zip(&sim).filter(|(a, b)| a == b).count();
                let n = real.len().max(sim.len());
                row[p.name()] = serde_json::json!({"matching": same, "of": n});
                let t = totals.entry(p.name()).or_default();
                t.0 += same;
                t.1 += n;
                println!(
                    "{:<55} {:<26} {:<17} {same}/{n}",
                    family.name(),
                    conf,
                    p.name()
                );
            }
            rows.push(row);
        }
    }
    let best = totals
        .iter()
        .max_by(|a, b| (a.1.0 * b.1.1).cmp(&(b.1.0 * a.1.1)))
        .map(|(name, (same, n))| format!("{name}: {same} of {n} placements match"));
    println!(
        "best match: {}",
        best.as_deref().unwrap_or("nothing recorded")
    );
    let out = serde_json::json!({"workloads": rows, "totals": totals, "best_match": best});
    gpu_args::write_out("gpu_placement", &out)
}

#[cfg(not(feature = "cuda"))]
fn main() -> std::process::ExitCode {
    eprintln!("gpu_placement: built without the `cuda` feature");
    std::process::ExitCode::from(3)
}
