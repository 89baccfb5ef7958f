//! The simulated card: a capacity, memory held outside PyTorch (the CUDA
//! context, other processes), deterministic addresses, and a cost model of the
//! driver calls PyTorch's allocator makes.

use super::{Device, DeviceCounters, DeviceError};
use crate::evidence::ProcessUse;
use std::collections::{BTreeMap, VecDeque};

/// Where the simulated address space starts (a typical CUDA VA on Linux x86-64).
pub const ADDRESS_BASE: u64 = 0x7f00_0000_0000;
/// Segments and reservations are aligned to 2 MiB, as the driver aligns them.
pub const ADDRESS_ALIGN: u64 = 2 << 20;

/// The cost model, in microseconds. These are order-of-magnitude estimates for
/// comparing configs, not measurements of a particular card:
/// - `cudaMalloc` ≈ 50 µs for small sizes on a dated GPU, rising with size
///   (anchors.md §3.1, cs.virginia.edu memory_management_overhead): 50 µs plus
///   1 µs per 2 MiB page.
/// - `cudaFree` synchronises the device implicitly (pytorch PR#44742): 40 µs
///   plus one synchronisation.
/// - expandable segments call cuMemCreate + cuMemMap + cuMemSetAccess per
///   page on map and cuMemUnmap + cuMemRelease per page on unmap (allocator.md §5);
///   15 µs and 10 µs per page, plus 5 µs per call.
/// - A synchronisation of an idle device: 10 µs (the wait for queued kernels
///   is not modelled: a trace does not say how much work is queued).
pub mod cost {
    pub const MALLOC_US: f64 = 50.0;
    pub const MALLOC_PER_PAGE_US: f64 = 1.0;
    pub const FREE_US: f64 = 40.0;
    pub const MAP_CALL_US: f64 = 5.0;
    pub const MAP_PER_PAGE_US: f64 = 15.0;
    pub const UNMAP_PER_PAGE_US: f64 = 10.0;
    pub const SYNCHRONIZE_US: f64 = 10.0;
    pub const RESERVE_US: f64 = 5.0;
    /// The granule the per-page costs count in.
    pub const PAGE: u64 = 2 << 20;
}

#[derive(Debug, Clone)]
pub struct SimDevice {
    capacity: u64,
    /// Held by this process outside the allocator (CUDA context, cuBLAS workspaces…).
    context_bytes: u64,
    /// Held by other processes, in NVML order.
    other_processes: Vec<ProcessUse>,
    /// Whether `process_memory` reports anything (NVML available).
    report_processes: bool,
    /// Bytes the allocator holds: cudaMalloc'd segments plus mapped pages.
    used: u64,
    /// Occupied address ranges (segments and reservations): start → length.
    ranges: BTreeMap<u64, u64>,
    /// No gap starts below this address: the first-fit search begins here, so
    /// laying out segments in a row costs O(log n), not O(n), each (a probe on
    /// a 288 GiB card makes 100 000 segments).
    no_gap_below: u64,
    /// Addresses to hand out instead of laying segments out (fidelity replay).
    recorded: VecDeque<u64>,
    counters: DeviceCounters,
}

impl SimDevice {
    /// A card of `capacity` bytes with nothing else on it.
    pub fn new(capacity: u64) -> Self {
        SimDevice {
            capacity,
            context_bytes: 0,
            other_processes: Vec::new(),
            report_processes: false,
            used: 0,
            ranges: BTreeMap::new(),
            no_gap_below: ADDRESS_BASE,
            recorded: VecDeque::new(),
            counters: DeviceCounters::default(),
        }
    }

    /// Memory this process holds outside the caching allocator (the CUDA context).
    pub fn with_context_bytes(mut self, bytes: u64) -> Self {
        self.context_bytes = bytes;
        self
    }

    /// Other processes on the card, as NVML would list them; also turns on the
    /// per-process lines of the OOM message.
    pub fn with_other_processes(mut self, processes: Vec<ProcessUse>) -> Self {
        self.other_processes = processes;
        self.report_processes = true;
        self
    }

    /// Whether the OOM message gets NVML's per-process lines.
    pub fn with_process_report(mut self, on: bool) -> Self {
        self.report_processes = on;
        self
    }

    /// Takes segment and reservation addresses from `addresses`, in order
    /// (`malloc` and `reserve_address` each take the next one); once the queue
    /// is empty, addresses are laid out as usual.
    pub fn with_recorded_addresses(mut self, addresses: impl IntoIterator<Item = u64>) -> Self {
        self.recorded = addresses.into_iter().collect();
        self
    }

    /// Bytes held outside the allocator: the context and other processes.
    pub fn external_bytes(&self) -> u64 {
        self.context_bytes
            .saturating_add(self.other_processes.iter().map(|p| p.bytes).sum())
    }

    fn free_bytes(&self) -> u64 {
        self.capacity
            .saturating_sub(self.used)
            .saturating_sub(self.external_bytes())
    }

    /// First fit in the address space, 2 MiB aligned, or the next recorded address.
    fn place(&mut self, size: u64) -> Result<u64, DeviceError> {
        let align = |end: u64| {
            end.checked_next_multiple_of(ADDRESS_ALIGN)
                .ok_or(DeviceError::OutOfMemory)
        };
        let addr = match self.recorded.pop_front() {
            Some(addr) => {
                self.no_gap_below = ADDRESS_BASE;
                addr
            }
            None => {
                let from = self.no_gap_below;
                let mut candidate = from;
                if let Some((&start, &len)) = self.ranges.range(..from).next_back() {
                    candidate = candidate.max(align(start + len)?);
                }
                let first = candidate;
                for (&start, &len) in self.ranges.range(from..) {
                    if start >= candidate && start - candidate >= size {
                        break;
                    }
                    candidate = candidate.max(align(start + len)?);
                }
                if candidate == first
                    && let Some(end) = candidate.checked_add(size)
                {
                    self.no_gap_below = align(end)?;
                }
                candidate
            }
        };
        if addr.checked_add(size).is_none() {
            return Err(DeviceError::OutOfMemory);
        }
        self.ranges.insert(addr, size);
        Ok(addr)
    }

    fn pages(size: u64) -> f64 {
        size.div_ceil(cost::PAGE) as f64
    }
}

impl Device for SimDevice {
    fn total_memory(&self) -> u64 {
        self.capacity
    }

    fn mem_get_info(&mut self) -> (u64, u64) {
        (self.free_bytes(), self.capacity)
    }

    fn malloc(&mut self, size: u64) -> Result<u64, DeviceError> {
        self.counters.driver_time_us +=
            cost::MALLOC_US + cost::MALLOC_PER_PAGE_US * Self::pages(size);
        if size > self.free_bytes() {
            return Err(DeviceError::OutOfMemory);
        }
        let addr = self.place(size)?;
        self.used += size;
        self.counters.mallocs += 1;
        Ok(addr)
    }

    fn free(&mut self, ptr: u64, size: u64) -> Result<(), DeviceError> {
        if self.ranges.remove(&ptr).is_none() {
            return Err(DeviceError::Other(format!(
                "cudaFree of unknown pointer {ptr:#x}"
            )));
        }
        self.no_gap_below = self.no_gap_below.min(ptr);
        self.used = self.used.saturating_sub(size);
        self.counters.frees += 1;
        self.counters.driver_time_us += cost::FREE_US + cost::SYNCHRONIZE_US;
        Ok(())
    }

    fn reserve_address(&mut self, size: u64) -> Result<u64, DeviceError> {
        self.counters.driver_time_us += cost::RESERVE_US;
        self.place(size)
    }

    fn map(&mut self, _addr: u64, size: u64) -> Result<(), DeviceError> {
        self.counters.driver_time_us +=
            cost::MAP_CALL_US + cost::MAP_PER_PAGE_US * Self::pages(size);
        if size > self.free_bytes() {
            return Err(DeviceError::OutOfMemory);
        }
        self.used += size;
        self.counters.maps += 1;
        Ok(())
    }

    fn unmap(&mut self, _addr: u64, size: u64) -> Result<(), DeviceError> {
        self.used = self.used.saturating_sub(size);
        self.counters.unmaps += 1;
        self.counters.driver_time_us +=
            cost::MAP_CALL_US + cost::UNMAP_PER_PAGE_US * Self::pages(size);
        Ok(())
    }

    fn release_address(&mut self, addr: u64, _size: u64) -> Result<(), DeviceError> {
        self.ranges.remove(&addr);
        self.no_gap_below = self.no_gap_below.min(addr);
        self.counters.driver_time_us += cost::RESERVE_US;
        Ok(())
    }

    fn synchronize(&mut self) {
        self.counters.synchronizations += 1;
        self.counters.driver_time_us += cost::SYNCHRONIZE_US;
    }

    fn counters(&self) -> DeviceCounters {
        self.counters
    }

    fn process_memory(&mut self) -> Vec<ProcessUse> {
        if !self.report_processes {
            return Vec::new();
        }
        let mut out = vec![ProcessUse {
            pid: None,
            bytes: self.used.saturating_add(self.context_bytes),
        }];
        out.extend(self.other_processes.iter().cloned());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lays_out_first_fit_and_reuses_freed_ranges() {
        let mut d = SimDevice::new(1 << 30);
        let a = d.malloc(20 << 20).unwrap();
        let b = d.malloc(2 << 20).unwrap();
        assert_eq!(a, ADDRESS_BASE);
        assert_eq!(b, ADDRESS_BASE + (20 << 20));
        d.free(a, 20 << 20).unwrap();
        assert_eq!(d.malloc(4 << 20).unwrap(), ADDRESS_BASE);
        assert_eq!(d.malloc(18 << 20).unwrap(), ADDRESS_BASE + (22 << 20));
    }

    #[test]
    fn capacity_and_external_memory() {
        let mut d = SimDevice::new(100 << 20).with_context_bytes(30 << 20);
        assert!(d.malloc(70 << 20).is_ok());
        assert_eq!(d.malloc(2 << 20), Err(DeviceError::OutOfMemory));
        assert_eq!(d.mem_get_info(), (0, 100 << 20));
    }

    #[test]
    fn recorded_addresses_come_first() {
        let mut d = SimDevice::new(1 << 30).with_recorded_addresses([0x1000_0000]);
        assert_eq!(d.malloc(2 << 20).unwrap(), 0x1000_0000);
        assert_eq!(d.malloc(2 << 20).unwrap(), ADDRESS_BASE);
    }
}
