//! Request rounding, pool choice and segment sizes
//! (c10/cuda/CUDACachingAllocator.cpp: `round_size`, `get_allocation_size`,
//! `CUDAAllocatorConfig::roundup_power2_divisions`). Spec: allocator.md §1.

use crate::conf::{Settings, TorchVersion};

/// `kMinBlockSize`: every request is rounded to a multiple of 512, at least 512.
pub const MIN_BLOCK_SIZE: u64 = 512;
/// `kSmallSize`: the largest request served from the small pool.
pub const SMALL_SIZE: u64 = 1 << 20;
/// `kSmallBuffer`: segment size of the small pool; expandable page size of the small pool.
pub const SMALL_BUFFER: u64 = 2 << 20;
/// `kLargeBuffer`: segment size for 1–10 MiB requests; expandable page size of the
/// large pool; the oversize reuse tolerance before 2.6.
pub const LARGE_BUFFER: u64 = 20 << 20;
/// `kMinLargeAlloc`: requests of at least 10 MiB get a segment of their own.
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// `kRoundLarge`: large segments are rounded to 2 MiB.
pub const ROUND_LARGE: u64 = 2 << 20;
/// `kRoundUpPowerOfTwoIntervals`: buckets of the `roundup_power2_divisions` table.
pub const ROUNDUP_POWER2_INTERVALS: usize = 16;
/// `allocate()` refuses requests of 2^60 bytes or more before touching the allocator.
pub const ONE_EXA_BYTES: u64 = 1 << 60;

/// Pool choice (`get_pool`): requests up to 1 MiB (after rounding) use the small pool.
pub fn is_small(size: u64) -> bool {
    size <= SMALL_SIZE
}

/// `CUDAAllocatorConfig::roundup_power2_divisions(size)`: the table bucket of
/// `[2^i MiB, 2^(i+1) MiB)`, bucket 0 also covering everything below 2 MiB.
pub fn divisions_for(size: u64, settings: &Settings) -> u64 {
    let log2 = 63 - size.max(1).leading_zeros() as i64;
    let index = (log2 - 20).clamp(0, ROUNDUP_POWER2_INTERVALS as i64 - 1) as usize;
    settings.roundup_power2_divisions[index]
}

/// `roundup_power2_next_division(size, divisions)` (2.0+): the next of `divisions`
/// equal steps between the powers of two around `size`.
pub fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> (63 - divisions.max(1).leading_zeros());
    if step == 0 {
        return floor.saturating_mul(2);
    }
    let rounded_down = size & !(step - 1);
    if rounded_down == size {
        size
    } else {
        rounded_down.saturating_add(step)
    }
}

/// `round_size(size)`: the block size a request occupies.
pub fn round_size(size: u64, settings: &Settings) -> u64 {
    if size < MIN_BLOCK_SIZE {
        return MIN_BLOCK_SIZE;
    }
    let plain = size.div_ceil(MIN_BLOCK_SIZE).saturating_mul(MIN_BLOCK_SIZE);
    let version = settings.version;
    if version < TorchVersion::new(1, 12) {
        // 1.10/1.11: no power-of-two rounding at all.
        return plain;
    }
    let divisions = divisions_for(size, settings);
    if version < TorchVersion::new(2, 0) {
        // 1.12–1.13 scalar form: `divisions > 0` and a next_division that leaves the
        // size unrounded for divisions <= 1 (so `roundup_power2_divisions:1` disables
        // 512-rounding above 512 bytes).
        if divisions > 0 && size > MIN_BLOCK_SIZE * divisions {
            if divisions <= 1 {
                return size;
            }
            return roundup_power2_next_division(size, divisions);
        }
        return plain;
    }
    if divisions_apply(divisions) && size > MIN_BLOCK_SIZE * divisions {
        return roundup_power2_next_division(size, divisions);
    }
    plain
}

/// UNVERIFIED (2.0 only): whether 2.0's `round_size` tests `divisions > 0` or
/// `divisions > 1`; the 2.1+ test (`> 1`, verified in 2.6.0) is used for every 2.x.
fn divisions_apply(divisions: u64) -> bool {
    divisions > 1
}

/// The segment size for 1–10 MiB requests and the large pool's expandable page.
/// UNVERIFIED (2.11+): how `large_segment_size_mb` replaces `kLargeBuffer`. Taken
/// to set these two sizes (as third-party code built against the 2.11+
/// `AcceleratorAllocatorConfig::large_segment_size()` describes it: "2 MiB small
/// pool, large_segment_size() -- 20 MiB default -- large pool"), not the oversize
/// tolerance (`max_non_split_rounding_mb` is its own key).
pub fn large_segment_size(settings: &Settings) -> u64 {
    if settings.version >= TorchVersion::new(2, 11) {
        settings.large_segment_size
    } else {
        LARGE_BUFFER
    }
}

/// `get_allocation_size(size)`: bytes cudaMalloc'd for a new segment serving the
/// (already rounded) `size`.
pub fn get_allocation_size(size: u64, settings: &Settings) -> u64 {
    if size <= SMALL_SIZE {
        SMALL_BUFFER
    } else if size < MIN_LARGE_ALLOC {
        large_segment_size(settings)
    } else {
        size.div_ceil(ROUND_LARGE).saturating_mul(ROUND_LARGE)
    }
}

/// The oversize reuse tolerance of `get_free_block`: `kLargeBuffer` before 2.6,
/// `max_non_split_rounding_mb` since.
pub fn max_non_split_rounding_size(settings: &Settings) -> u64 {
    if settings.version >= TorchVersion::new(2, 6) {
        settings.max_non_split_rounding_size
    } else {
        LARGE_BUFFER
    }
}

/// Page size of an expandable segment (`kSmallBuffer` / `kLargeBuffer`).
pub fn expandable_page_size(small: bool, settings: &Settings) -> u64 {
    if small {
        SMALL_BUFFER
    } else {
        large_segment_size(settings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn div4() -> Settings {
        Settings {
            roundup_power2_divisions: [4; 16],
            ..Settings::default()
        }
    }

    /// allocator.md §1.5, every row: request, round_size (default), small?, segment size,
    /// round_size with 4 divisions everywhere.
    #[test]
    fn worked_examples_table() {
        let rows: [(u64, u64, bool, u64, u64); 13] = [
            (1, 512, true, 2097152, 512),
            (511, 512, true, 2097152, 512),
            (512, 512, true, 2097152, 512),
            (513, 1024, true, 2097152, 1024),
            (1000, 1024, true, 2097152, 1024),
            (1200, 1536, true, 2097152, 1536),
            (1048576, 1048576, true, 2097152, 1048576),
            (1048577, 1049088, false, 20971520, 1310720),
            (5242880, 5242880, false, 20971520, 5242880),
            (10485759, 10485760, false, 10485760, 10485760),
            (10485761, 10486272, false, 12582912, 12582912),
            (88080384, 88080384, false, 88080384, 100663296),
            (419430400, 419430400, false, 419430400, 469762048),
        ];
        let default = Settings::default();
        let div4 = div4();
        for (request, rounded, small, segment, rounded4) in rows {
            assert_eq!(
                round_size(request, &default),
                rounded,
                "round_size({request})"
            );
            assert_eq!(is_small(rounded), small, "pool of {request}");
            assert_eq!(
                get_allocation_size(rounded, &default),
                segment,
                "segment of {request}"
            );
            assert_eq!(
                round_size(request, &div4),
                rounded4,
                "div4 round_size({request})"
            );
        }
    }

    #[test]
    fn next_division_direct_call_differs_from_round_size() {
        // The docs' narrative "1200 → 1280" is the direct call; round_size gives 1536.
        assert_eq!(roundup_power2_next_division(1200, 4), 1280);
        assert_eq!(round_size(1200, &div4()), 1536);
    }

    #[test]
    fn list_table_of_test_allocator_settings() {
        // [64:8,128:2,256:2,512:2,1024:1,>:1]
        let settings = Settings {
            roundup_power2_divisions: [8, 8, 8, 8, 8, 8, 8, 2, 2, 2, 1, 1, 1, 1, 1, 1],
            ..Settings::default()
        };
        assert_eq!(round_size(84 * MIB, &settings), 92274688);
        assert_eq!(round_size(400 * MIB, &settings), 536870912);
    }

    #[test]
    fn legacy_versions() {
        let mut s = Settings {
            roundup_power2_divisions: [1; 16],
            version: TorchVersion::new(1, 13),
            ..Settings::default()
        };
        // 1.12–1.13 quirk: divisions 1 leaves sizes above 512 unrounded.
        assert_eq!(round_size(1000, &s), 1000);
        s.version = TorchVersion::new(2, 6);
        assert_eq!(round_size(1000, &s), 1024);
        s.roundup_power2_divisions = [4; 16];
        s.version = TorchVersion::new(1, 10);
        assert_eq!(round_size(88080384 + 1, &s), 88080384 + 512);
    }

    #[test]
    fn oversize_tolerance_by_version() {
        let mut s = Settings {
            max_non_split_rounding_size: 64 * MIB,
            ..Settings::default()
        };
        assert_eq!(max_non_split_rounding_size(&s), 64 * MIB);
        s.version = TorchVersion::new(2, 5);
        assert_eq!(max_non_split_rounding_size(&s), LARGE_BUFFER);
    }
}
