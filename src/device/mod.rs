//! Devices the bundled allocator runs on: the simulated card (`sim`) and a real
//! GPU through cudarc (`cuda`, the only module that touches cudarc).
//!
//! The trait mirrors the driver calls PyTorch's allocator makes: cudaMalloc /
//! cudaFree for native segments, the virtual-memory API for expandable
//! segments, cudaMemGetInfo for the OOM message, and synchronisations.

use crate::evidence::ProcessUse;
use thiserror::Error;

#[cfg(feature = "cuda")]
pub mod cuda;
pub mod sim;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DeviceError {
    /// cudaErrorMemoryAllocation: the allocator treats it as a failed attempt.
    #[error("out of memory")]
    OutOfMemory,
    /// Any other driver error: PyTorch throws immediately.
    #[error("{0}")]
    Other(String),
}

/// Counts and modelled cost of driver calls, so a comparison can say what a
/// config costs in driver work, not only in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DeviceCounters {
    pub mallocs: u64,
    pub frees: u64,
    pub maps: u64,
    pub unmaps: u64,
    pub synchronizations: u64,
    /// Modelled (sim) or measured (cuda) time spent in driver calls, in microseconds.
    pub driver_time_us: f64,
}

pub trait Device {
    /// Total memory of the card (cudaMemGetInfo's `total`).
    fn total_memory(&self) -> u64;
    /// `(free, total)` as cudaMemGetInfo reports them now.
    fn mem_get_info(&mut self) -> (u64, u64);
    /// cudaMalloc of `size` bytes; the returned address is the segment base.
    fn malloc(&mut self, size: u64) -> Result<u64, DeviceError>;
    /// cudaFree of a segment obtained from `malloc`.
    fn free(&mut self, ptr: u64, size: u64) -> Result<(), DeviceError>;
    /// cuMemAddressReserve: virtual address space for an expandable segment.
    fn reserve_address(&mut self, size: u64) -> Result<u64, DeviceError>;
    /// cuMemCreate + cuMemMap + cuMemSetAccess for `[addr, addr+size)` (whole pages).
    fn map(&mut self, addr: u64, size: u64) -> Result<(), DeviceError>;
    /// cuMemUnmap + cuMemRelease of `[addr, addr+size)`.
    fn unmap(&mut self, addr: u64, size: u64) -> Result<(), DeviceError>;
    /// cuMemAddressFree of a reservation from `reserve_address`.
    fn release_address(&mut self, addr: u64, size: u64) -> Result<(), DeviceError>;
    /// A device / stream synchronisation (counted; costed by the sim).
    fn synchronize(&mut self);
    fn counters(&self) -> DeviceCounters;
    /// Device memory in use per process as NVML lists it (`reportProcessMemoryInfo`,
    /// for the OOM message); empty when unknown.
    fn process_memory(&mut self) -> Vec<ProcessUse> {
        Vec::new()
    }
    /// A hash of the device's state that the allocator's next decisions can
    /// depend on (where its next segment goes, what it holds), counters left
    /// out; `None` when it cannot be known (a real GPU).
    fn state_hash(&self) -> Option<u64> {
        None
    }
}

/// A boxed device is a device (lets callers pick sim or CUDA at run time).
impl<T: Device + ?Sized> Device for Box<T> {
    fn total_memory(&self) -> u64 {
        (**self).total_memory()
    }
    fn mem_get_info(&mut self) -> (u64, u64) {
        (**self).mem_get_info()
    }
    fn malloc(&mut self, size: u64) -> Result<u64, DeviceError> {
        (**self).malloc(size)
    }
    fn free(&mut self, ptr: u64, size: u64) -> Result<(), DeviceError> {
        (**self).free(ptr, size)
    }
    fn reserve_address(&mut self, size: u64) -> Result<u64, DeviceError> {
        (**self).reserve_address(size)
    }
    fn map(&mut self, addr: u64, size: u64) -> Result<(), DeviceError> {
        (**self).map(addr, size)
    }
    fn unmap(&mut self, addr: u64, size: u64) -> Result<(), DeviceError> {
        (**self).unmap(addr, size)
    }
    fn release_address(&mut self, addr: u64, size: u64) -> Result<(), DeviceError> {
        (**self).release_address(addr, size)
    }
    fn synchronize(&mut self) {
        (**self).synchronize()
    }
    fn counters(&self) -> DeviceCounters {
        (**self).counters()
    }
    fn process_memory(&mut self) -> Vec<ProcessUse> {
        (**self).process_memory()
    }
    fn state_hash(&self) -> Option<u64> {
        (**self).state_hash()
    }
}

/// Which device a command runs on: `--device sim` or `--device cuda[:N]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceSpec {
    Sim,
    Cuda(i32),
}

impl DeviceSpec {
    pub fn parse(s: &str) -> Result<Self, crate::Error> {
        let bad = || {
            crate::Error::Usage(format!(
                "--device {s:?}: expected `sim`, `cuda` or `cuda:N`"
            ))
        };
        match s.trim() {
            "" | "sim" => Ok(DeviceSpec::Sim),
            "cuda" => Ok(DeviceSpec::Cuda(0)),
            other => other
                .strip_prefix("cuda:")
                .and_then(|n| n.parse::<i32>().ok())
                .filter(|n| *n >= 0)
                .map(DeviceSpec::Cuda)
                .ok_or_else(bad),
        }
    }
}

/// The capacity of a run "without a limit": far beyond any card, yet small
/// enough that the allocator's arithmetic on it (9/8 of it as virtual address
/// space for an expandable segment) cannot overflow.
pub const NO_LIMIT: u64 = 1 << 50;
