//! Cache-hit malloc+free latency of the bundled caching allocator on a real
//! GPU, against raw cuMemAlloc+cuMemFree of the same sizes (bench/gpu/run.sh).
//!
//!     cargo run --release --example gpu_latency -- --out latency.json [--device N]
//!
//! Exits 3 with the reason when no CUDA driver or GPU is usable.

#[cfg(feature = "cuda")]
#[path = "support/gpu_args.rs"]
mod gpu_args;

#[cfg(feature = "cuda")]
fn main() -> std::process::ExitCode {
    use allocdoc::allocator::CachingAllocator;
    use allocdoc::conf::Settings;
    use allocdoc::device::cuda::{CudaDevice, raw_malloc_free_us};
    use std::time::Instant;

    let ordinal = gpu_args::ordinal();
    // Sizes from the small pool, a split large block, and a whole 20 MiB segment.
    const SIZES: [u64; 4] = [4 << 10, 512 << 10, 8 << 20, 20 << 20];
    const HITS: u32 = 100_000;
    const RAW: u32 = 200;

    let device = match CudaDevice::open(ordinal, Some(1 << 30)) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("gpu_latency: {e}");
            return std::process::ExitCode::from(3);
        }
    };
    let mut alloc = CachingAllocator::new(Settings::default(), device);
    let mut rows = Vec::new();
    for size in SIZES {
        // Warm the cache: the first malloc makes the segment, later ones hit it.
        let p = alloc
            .malloc(size, 0)
            .expect("warm-up malloc under a 1 GiB cap");
        alloc.free(p).expect("warm-up free");
        let start = Instant::now();
        for _ in 0..HITS {
            let p = alloc.malloc(size, 0).expect("cache hit");
            alloc.free(p).expect("free");
        }
        let cached_us = start.elapsed().as_secs_f64() * 1e6 / HITS as f64;
        alloc.empty_cache();
        let mut raw_total = 0.0;
        for _ in 0..RAW {
            raw_total +=
                raw_malloc_free_us(alloc.device_mut(), size).expect("raw cuMemAlloc+cuMemFree");
        }
        let raw_us = raw_total / RAW as f64;
        println!(
            "{size:>10} bytes: cache hit {cached_us:.3} µs, raw {raw_us:.1} µs, {:.0}x",
            raw_us / cached_us
        );
        rows.push(serde_json::json!({
            "size_bytes": size, "cache_hit_malloc_free_us": cached_us,
            "raw_cumemalloc_cumemfree_us": raw_us, "speedup": raw_us / cached_us,
            "cache_hit_iterations": HITS, "raw_iterations": RAW,
        }));
    }
    let json = serde_json::json!({"device": ordinal, "results": rows});
    gpu_args::write_out("gpu_latency", &json)
}

#[cfg(not(feature = "cuda"))]
fn main() -> std::process::ExitCode {
    eprintln!("gpu_latency: built without the `cuda` feature");
    std::process::ExitCode::from(3)
}
