//! A real GPU behind the [`Device`] trait, through cudarc's driver API with
//! dynamic loading. This is the only module that touches cudarc.
//!
//! cudarc panics (it does not return an error) when libcuda cannot be loaded,
//! so [`CudaDevice::open`] checks `is_culib_present()` before any other call
//! and maps every "no usable GPU" case to [`Error::NoDevice`] (exit 3).
//!
//! Every allocation this device hands out is recorded, so that dropping the
//! device (after an error, at the end of a run, or when a Ctrl-C stopped the
//! replay through [`INTERRUPTED`]) returns all of it to the driver.

use super::{Device, DeviceCounters, DeviceError};
use crate::Error;
use cudarc::driver::{DriverError, result, sys};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// Set by the binary's Ctrl-C handler. Every driver call checks it first and
/// fails once it is set, so the replay stops at its next device call and the
/// device's `Drop` releases everything it holds.
pub static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// PyTorch's expandable-segment page for the large pool (`kLargeBuffer`); the
/// physical handle size when a mapped range is made of whole such pages.
const LARGE_PAGE: u64 = 20 << 20;

/// One physical handle mapped into a reservation (cuMemCreate + cuMemMap).
#[derive(Debug, Clone, Copy)]
struct Mapping {
    size: u64,
    handle: sys::CUmemGenericAllocationHandle,
}

/// A CUDA device used by the bundled allocator, with `capacity` as a hard cap
/// on the bytes it holds (native segments plus mapped pages).
pub struct CudaDevice {
    ordinal: i32,
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
    capacity: u64,
    /// Bytes currently held: live native segments plus mapped pages.
    held: u64,
    /// The driver's minimum granularity for cuMemCreate on this device.
    granularity: u64,
    /// Live native segments (cuMemAlloc), base → size.
    segments: HashMap<u64, u64>,
    /// Live virtual reservations (cuMemAddressReserve), base → size.
    reservations: HashMap<u64, u64>,
    /// Mapped physical handles by address, so an unmap can find the handles of a range.
    mappings: BTreeMap<u64, Mapping>,
    counters: DeviceCounters,
}

fn describe(e: DriverError) -> String {
    let name = e
        .error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("CUresult {}", e.0 as i32));
    let text = e
        .error_string()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    if text.is_empty() {
        name
    } else {
        format!("{name}: {text}")
    }
}

/// Turns a failure while opening the device into the exit-3 error with a reason.
fn no_device(ordinal: i32, e: DriverError) -> Error {
    let why = match e.0 {
        sys::CUresult::CUDA_ERROR_NO_DEVICE => "the driver found no CUDA-capable GPU".to_string(),
        sys::CUresult::CUDA_ERROR_SYSTEM_DRIVER_MISMATCH
        | sys::CUresult::CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE => format!(
            "the NVIDIA kernel driver does not match the libcuda that was loaded ({})",
            describe(e)
        ),
        sys::CUresult::CUDA_ERROR_SYSTEM_NOT_READY => {
            "the GPU is not ready (is the fabric manager running?)".to_string()
        }
        _ => describe(e),
    };
    Error::NoDevice(format!("--device cuda:{ordinal}: {why}"))
}

fn driver_error(e: DriverError) -> DeviceError {
    if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        DeviceError::OutOfMemory
    } else {
        DeviceError::Other(describe(e))
    }
}

fn to_usize(n: u64) -> Result<usize, DeviceError> {
    usize::try_from(n)
        .map_err(|_| DeviceError::Other(format!("{n} bytes exceeds the address width")))
}

/// Whether a CUDA driver library can be loaded on this machine. Safe to call
/// anywhere; nothing else in cudarc is safe to call when this is false.
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library by its candidate names.
    unsafe { sys::is_culib_present() }
}

impl CudaDevice {
    /// Opens GPU `ordinal`. `capacity` caps what the allocator may hold; without
    /// it the cap is the memory free on the card now. Refuses to start when the
    /// card has less free memory than `capacity`.
    pub fn open(ordinal: i32, capacity: Option<u64>) -> Result<Self, Error> {
        if !driver_present() {
            return Err(Error::NoDevice(format!(
                "--device cuda:{ordinal}: no CUDA driver: libcuda.so could not be loaded \
                 (is an NVIDIA driver installed and on the loader path?); use --device sim"
            )));
        }
        result::init().map_err(|e| no_device(ordinal, e))?;
        let count = result::device::get_count().map_err(|e| no_device(ordinal, e))?;
        if ordinal < 0 || ordinal >= count {
            return Err(Error::NoDevice(format!(
                "--device cuda:{ordinal}: no such GPU (the driver sees {count})"
            )));
        }
        let dev = result::device::get(ordinal).map_err(|e| no_device(ordinal, e))?;
        // SAFETY: `dev` comes from cuDeviceGet; the context is released in Drop
        // (or below when a later step fails).
        let ctx = unsafe { result::primary_ctx::retain(dev) }.map_err(|e| no_device(ordinal, e))?;
        let mut device = CudaDevice {
            ordinal,
            dev,
            ctx,
            capacity: 0,
            held: 0,
            granularity: 0,
            segments: HashMap::new(),
            reservations: HashMap::new(),
            mappings: BTreeMap::new(),
            counters: DeviceCounters::default(),
        };
        // From here on, `device`'s Drop releases the context on every error path.
        device.bind().map_err(|e| no_device(ordinal, e))?;
        let (free, _total) = result::mem_get_info().map_err(|e| no_device(ordinal, e))?;
        let free = free as u64;
        let capacity = capacity.unwrap_or(free);
        if capacity > free {
            return Err(Error::NoDevice(format!(
                "--device cuda:{ordinal}: --capacity {} asks for more than the {} free on the card",
                crate::units::format_size(capacity),
                crate::units::format_size(free)
            )));
        }
        device.capacity = capacity;
        let prop = device.allocation_prop();
        let mut granularity = 0usize;
        // SAFETY: `prop` is a fully initialised CUmemAllocationProp.
        unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut granularity,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        }
        .result()
        .map_err(|e| no_device(ordinal, e))?;
        device.granularity = (granularity as u64).max(1);
        Ok(device)
    }

    pub fn ordinal(&self) -> i32 {
        self.ordinal
    }

    /// Bytes this device holds now (native segments plus mapped pages).
    pub fn held_bytes(&self) -> u64 {
        self.held
    }

    fn bind(&self) -> Result<(), DriverError> {
        // SAFETY: `ctx` is the retained primary context of `dev`, alive until Drop.
        unsafe { result::ctx::set_current(self.ctx) }
    }

    /// Pinned device memory on this GPU: what PyTorch's ExpandableSegment asks cuMemCreate for.
    fn allocation_prop(&self) -> sys::CUmemAllocationProp {
        // SAFETY: a plain C struct for which all-zero is a valid value.
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = self.ordinal;
        prop
    }

    /// Fails once Ctrl-C was pressed, and enforces the capacity cap, before any driver call.
    fn admit(&self, size: u64) -> Result<(), DeviceError> {
        if INTERRUPTED.load(Ordering::Relaxed) {
            return Err(DeviceError::Other("interrupted".into()));
        }
        if self.held.saturating_add(size) > self.capacity {
            return Err(DeviceError::OutOfMemory);
        }
        Ok(())
    }

    /// Runs one driver call with the context bound, adding its wall time to the counters.
    fn timed<T>(
        &mut self,
        call: impl FnOnce() -> Result<T, DriverError>,
    ) -> Result<T, DeviceError> {
        let start = Instant::now();
        let out = self.bind().and_then(|()| call());
        self.counters.driver_time_us += start.elapsed().as_secs_f64() * 1e6;
        out.map_err(driver_error)
    }

    /// The physical handle size for mapping `[addr, addr+size)`: PyTorch's
    /// 20 MiB large-pool page when the range is made of whole such pages
    /// (so unmaps, which come in whole pages, find whole handles), else the
    /// driver granularity.
    fn handle_size(&self, offset: u64, size: u64) -> u64 {
        if offset.is_multiple_of(LARGE_PAGE)
            && size.is_multiple_of(LARGE_PAGE)
            && LARGE_PAGE.is_multiple_of(self.granularity)
        {
            LARGE_PAGE
        } else {
            self.granularity
        }
    }

    /// Creates, maps and opens one physical handle at `addr`; on failure
    /// nothing of it is left behind.
    fn map_one(&mut self, addr: u64, size: u64) -> Result<(), DeviceError> {
        let prop = self.allocation_prop();
        let bytes = to_usize(size)?;
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: `prop` is initialised; `handle` receives the new allocation.
        self.timed(|| unsafe { sys::cuMemCreate(&mut handle, bytes, &prop, 0) }.result())?;
        // SAFETY: `addr` lies inside a reservation of ours (checked by `map`).
        let mapped = self.timed(|| unsafe { sys::cuMemMap(addr, bytes, 0, handle, 0) }.result());
        if let Err(e) = mapped {
            // SAFETY: the handle was created above and is mapped nowhere.
            let _ = self.timed(|| unsafe { sys::cuMemRelease(handle) }.result());
            return Err(e);
        }
        let access = sys::CUmemAccessDesc {
            location: prop.location,
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: `[addr, addr+bytes)` was just mapped.
        let opened =
            self.timed(|| unsafe { sys::cuMemSetAccess(addr, bytes, &access, 1) }.result());
        if let Err(e) = opened {
            // SAFETY: undo the map and the create of this very handle.
            let _ = self.timed(|| unsafe { sys::cuMemUnmap(addr, bytes) }.result());
            let _ = self.timed(|| unsafe { sys::cuMemRelease(handle) }.result());
            return Err(e);
        }
        self.mappings.insert(addr, Mapping { size, handle });
        self.held += size;
        Ok(())
    }

    /// Unmaps and releases the handle mapped at `addr`.
    fn unmap_one(&mut self, addr: u64) -> Result<(), DeviceError> {
        let Some(m) = self.mappings.remove(&addr) else {
            return Err(DeviceError::Other(format!(
                "unmap of {addr:#x}: nothing mapped there"
            )));
        };
        self.held -= m.size;
        let bytes = to_usize(m.size)?;
        // SAFETY: `m` was mapped at `addr` by `map_one` and is unmapped once.
        let unmapped = self.timed(|| unsafe { sys::cuMemUnmap(addr, bytes) }.result());
        // SAFETY: the handle is released whether or not the unmap succeeded, so it never leaks.
        let released = self.timed(|| unsafe { sys::cuMemRelease(m.handle) }.result());
        unmapped.and(released)
    }

    fn reservation_containing(&self, addr: u64, size: u64) -> Option<(u64, u64)> {
        self.reservations
            .iter()
            .map(|(&base, &len)| (base, len))
            .find(|&(base, len)| addr >= base && addr.saturating_add(size) <= base + len)
    }
}

impl Device for CudaDevice {
    fn total_memory(&self) -> u64 {
        self.capacity
    }

    /// `(free, total)` within the cap: PyTorch's OOM message then reads like the
    /// one a card of `capacity` bytes would print.
    fn mem_get_info(&mut self) -> (u64, u64) {
        let card_free = self
            .timed(|| result::mem_get_info().map(|(f, _)| f as u64))
            .unwrap_or(0);
        let cap_free = self.capacity.saturating_sub(self.held);
        (cap_free.min(card_free), self.capacity)
    }

    fn malloc(&mut self, size: u64) -> Result<u64, DeviceError> {
        self.admit(size)?;
        let bytes = to_usize(size)?;
        // SAFETY: a plain cuMemAlloc; the pointer is recorded and freed in `free` or Drop.
        let ptr = self.timed(|| unsafe { result::malloc_sync(bytes) })?;
        self.counters.mallocs += 1;
        self.segments.insert(ptr, size);
        self.held += size;
        Ok(ptr)
    }

    fn free(&mut self, ptr: u64, _size: u64) -> Result<(), DeviceError> {
        let Some(size) = self.segments.remove(&ptr) else {
            return Err(DeviceError::Other(format!(
                "cudaFree of {ptr:#x}: not a live segment"
            )));
        };
        self.held -= size;
        self.counters.frees += 1;
        // SAFETY: `ptr` came from cuMemAlloc and is freed exactly once.
        self.timed(|| unsafe { result::free_sync(ptr) })
    }

    fn reserve_address(&mut self, size: u64) -> Result<u64, DeviceError> {
        if INTERRUPTED.load(Ordering::Relaxed) {
            return Err(DeviceError::Other("interrupted".into()));
        }
        // Reservations are whole pages of the driver's granularity.
        let size = size.div_ceil(self.granularity) * self.granularity;
        let bytes = to_usize(size)?;
        let mut base: sys::CUdeviceptr = 0;
        // SAFETY: asks for fresh virtual address space; recorded and freed later.
        self.timed(|| unsafe { sys::cuMemAddressReserve(&mut base, bytes, 0, 0, 0) }.result())?;
        self.reservations.insert(base, size);
        Ok(base)
    }

    fn map(&mut self, addr: u64, size: u64) -> Result<(), DeviceError> {
        self.admit(size)?;
        let Some((base, _)) = self.reservation_containing(addr, size) else {
            return Err(DeviceError::Other(format!(
                "map of {size} bytes at {addr:#x}: outside every reservation"
            )));
        };
        let page = self.handle_size(addr - base, size);
        if !size.is_multiple_of(page) || !(addr - base).is_multiple_of(page) {
            return Err(DeviceError::Other(format!(
                "map of {size} bytes at {addr:#x}: not whole {page}-byte pages"
            )));
        }
        let mut done = 0;
        while done < size {
            if let Err(e) = self.map_one(addr + done, page) {
                // PyTorch's ExpandableSegment::map releases the pages of a failed
                // call; so do we, leaving the range as it was.
                let mut undo = 0;
                while undo < done {
                    let _ = self.unmap_one(addr + undo);
                    undo += page;
                }
                return Err(e);
            }
            done += page;
        }
        self.counters.maps += 1;
        Ok(())
    }

    fn unmap(&mut self, addr: u64, size: u64) -> Result<(), DeviceError> {
        let end = addr.saturating_add(size);
        let inside: Vec<u64> = self.mappings.range(addr..end).map(|(&a, _)| a).collect();
        let covered: u64 = inside
            .iter()
            .filter_map(|a| self.mappings.get(a).map(|m| m.size))
            .sum();
        if covered != size {
            return Err(DeviceError::Other(format!(
                "unmap of {size} bytes at {addr:#x}: the range is not made of whole mapped pages"
            )));
        }
        let mut first_error = Ok(());
        for a in inside {
            let r = self.unmap_one(a);
            if first_error.is_ok() {
                first_error = r;
            }
        }
        self.counters.unmaps += 1;
        first_error
    }

    fn release_address(&mut self, addr: u64, _size: u64) -> Result<(), DeviceError> {
        let Some(size) = self.reservations.remove(&addr) else {
            return Err(DeviceError::Other(format!(
                "cuMemAddressFree of {addr:#x}: not a live reservation"
            )));
        };
        // Pages still mapped inside are released first: the driver refuses to free mapped VA.
        let mapped: Vec<u64> = self
            .mappings
            .range(addr..addr + size)
            .map(|(&a, _)| a)
            .collect();
        for a in mapped {
            let _ = self.unmap_one(a);
        }
        let bytes = to_usize(size)?;
        // SAFETY: `addr` is a reservation of ours with nothing mapped in it.
        self.timed(|| unsafe { sys::cuMemAddressFree(addr, bytes) }.result())
    }

    fn synchronize(&mut self) {
        self.counters.synchronizations += 1;
        let _ = self.timed(result::ctx::synchronize);
    }

    fn counters(&self) -> DeviceCounters {
        self.counters
    }
}

impl Drop for CudaDevice {
    /// Returns everything still held to the driver: after an error, an OOM, a
    /// Ctrl-C or a normal end alike.
    fn drop(&mut self) {
        if self.bind().is_err() {
            return;
        }
        let _ = result::ctx::synchronize();
        for (&ptr, _) in self.segments.iter() {
            // SAFETY: every recorded segment came from cuMemAlloc and is still live.
            let _ = unsafe { result::free_sync(ptr) };
        }
        self.segments.clear();
        for (&addr, m) in self.mappings.iter() {
            // SAFETY: each recorded mapping is live; unmap then release its handle.
            unsafe {
                let _ = sys::cuMemUnmap(addr, m.size as usize).result();
                let _ = sys::cuMemRelease(m.handle).result();
            }
        }
        self.mappings.clear();
        for (&base, &size) in self.reservations.iter() {
            // SAFETY: nothing is mapped in any reservation any more.
            let _ = unsafe { sys::cuMemAddressFree(base, size as usize) }.result();
        }
        self.reservations.clear();
        // SAFETY: balances the retain in `open`.
        let _ = unsafe { result::primary_ctx::release(self.dev) };
    }
}

/// One timed pair of raw cuMemAlloc + cuMemFree of `size` bytes, in
/// microseconds: the baseline the bundled allocator's cache hits are compared with.
pub fn raw_malloc_free_us(device: &mut CudaDevice, size: u64) -> Result<f64, DeviceError> {
    device.admit(size)?;
    let bytes = to_usize(size)?;
    device.bind().map_err(driver_error)?;
    let start = Instant::now();
    // SAFETY: allocated and freed right here.
    let ptr = unsafe { result::malloc_sync(bytes) }.map_err(driver_error)?;
    // SAFETY: `ptr` came from the cuMemAlloc just above.
    unsafe { result::free_sync(ptr) }.map_err(driver_error)?;
    Ok(start.elapsed().as_secs_f64() * 1e6)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a driver `open` must return exit 3 with the reason, never panic.
    /// With a driver (a GPU machine) it opens GPU 0 and releases it cleanly.
    #[test]
    fn open_reports_missing_driver_or_works() {
        if !driver_present() {
            let err = CudaDevice::open(0, None)
                .err()
                .expect("no driver: open must fail");
            assert_eq!(err.exit_code(), crate::error::EXIT_NO_DEVICE);
            assert!(err.to_string().contains("no CUDA driver"), "{err}");
            eprintln!("skipped the GPU half: no CUDA driver on this machine");
            return;
        }
        match CudaDevice::open(0, Some(64 << 20)) {
            Ok(mut d) => {
                let p = d.malloc(2 << 20).expect("2 MiB under a 64 MiB cap");
                assert_eq!(d.held_bytes(), 2 << 20);
                assert_eq!(
                    d.malloc(63 << 20),
                    Err(DeviceError::OutOfMemory),
                    "cap is hard"
                );
                d.free(p, 2 << 20).expect("free");
                let va = d.reserve_address(80 << 20).expect("reserve");
                d.map(va, 40 << 20).expect("map two large pages");
                assert_eq!(d.held_bytes(), 40 << 20);
                d.unmap(va + (20 << 20), 20 << 20)
                    .expect("unmap the second page");
                assert_eq!(d.held_bytes(), 20 << 20);
                d.release_address(va, 80 << 20)
                    .expect("release with a page still mapped");
                assert_eq!(d.held_bytes(), 0);
                let c = d.counters();
                assert_eq!((c.mallocs, c.frees, c.maps, c.unmaps), (1, 1, 1, 1));
                assert!(c.driver_time_us > 0.0);
            }
            Err(e) => eprintln!("skipped: driver present but no usable GPU: {e}"),
        }
    }
}
