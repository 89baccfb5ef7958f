//! `DeviceStats` (c10/core/CachingDeviceAllocator.h) and the flat
//! `torch.cuda.memory_stats()` view of it. Spec: allocator.md §4.

use crate::conf::TorchVersion;
use std::collections::BTreeMap;

/// `Stat`: current, peak, and the accumulated increases / decreases.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stat {
    pub current: i64,
    pub peak: i64,
    pub allocated: i64,
    pub freed: i64,
}

impl Stat {
    /// `Stat::increase`. `current` is bounded by the reserved total (at most
    /// `i64::MAX`, see `may_hold`); the accumulated totals are not, and where
    /// PyTorch's int64 arithmetic would overflow (undefined behaviour) they
    /// saturate.
    #[inline]
    pub fn increase(&mut self, amount: u64) {
        debug_assert!(amount <= i64::MAX as u64);
        let amount = amount as i64;
        self.current += amount;
        self.peak = self.peak.max(self.current);
        self.allocated = self.allocated.saturating_add(amount);
    }
    /// `Stat::decrease`.
    #[inline]
    pub fn decrease(&mut self, amount: u64) {
        debug_assert!(amount <= i64::MAX as u64);
        let amount = amount as i64;
        self.current -= amount;
        self.freed = self.freed.saturating_add(amount);
    }
    pub fn reset_accumulated(&mut self) {
        self.allocated = 0;
        self.freed = 0;
    }
    pub fn reset_peak(&mut self) {
        self.peak = self.current;
    }
}

/// `StatType`: index into a [`StatArray`].
pub const AGGREGATE: usize = 0;
pub const SMALL_POOL: usize = 1;
pub const LARGE_POOL: usize = 2;
/// The key names of the three entries, in `StatType` order.
pub const STAT_TYPE_NAMES: [&str; 3] = ["all", "small_pool", "large_pool"];

/// `StatArray`: one Stat for all pools, the small pool and the large pool.
///
/// On the hot path (every malloc and free updates five of these) the
/// aggregate keeps only `current` and `peak`: its `allocated` / `freed` are
/// the sums of the pools' (saturating, as the pools' are), computed on read.
/// Amounts are block sizes and counts, bounded by the reserved total, which
/// `may_hold` keeps within `i64::MAX`, so `current` needs no saturation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatArray([Stat; 3]);

impl StatArray {
    /// Updates "all" and the block's pool type (`for_each_selected_stat_type`).
    #[inline]
    pub fn increase(&mut self, small: bool, amount: u64) {
        debug_assert!(amount <= i64::MAX as u64);
        let all = &mut self.0[AGGREGATE];
        all.current += amount as i64;
        all.peak = all.peak.max(all.current);
        self.0[pool_index(small)].increase(amount);
    }
    #[inline]
    pub fn decrease(&mut self, small: bool, amount: u64) {
        debug_assert!(amount <= i64::MAX as u64);
        self.0[AGGREGATE].current -= amount as i64;
        self.0[pool_index(small)].decrease(amount);
    }
    /// The entry of `StatType` `index` ([`AGGREGATE`], [`SMALL_POOL`], [`LARGE_POOL`]).
    pub fn get(&self, index: usize) -> Stat {
        if index != AGGREGATE {
            return self.0[index];
        }
        let (small, large) = (&self.0[SMALL_POOL], &self.0[LARGE_POOL]);
        Stat {
            allocated: small.allocated.saturating_add(large.allocated),
            freed: small.freed.saturating_add(large.freed),
            ..self.0[AGGREGATE]
        }
    }
    pub fn all(&self) -> Stat {
        self.get(AGGREGATE)
    }
    pub fn pool(&self, small: bool) -> Stat {
        self.get(pool_index(small))
    }
    /// The three entries in `StatType` order.
    pub fn entries(&self) -> [Stat; 3] {
        [0, 1, 2].map(|i| self.get(i))
    }
    fn each_mut(&mut self, f: fn(&mut Stat)) {
        self.0.iter_mut().for_each(f);
    }
}

#[inline]
fn pool_index(small: bool) -> usize {
    if small { SMALL_POOL } else { LARGE_POOL }
}

/// `DeviceStats` of one device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceStats {
    pub allocation: StatArray,
    pub segment: StatArray,
    pub active: StatArray,
    pub inactive_split: StatArray,
    pub allocated_bytes: StatArray,
    pub reserved_bytes: StatArray,
    pub active_bytes: StatArray,
    pub inactive_split_bytes: StatArray,
    pub requested_bytes: StatArray,
    pub num_alloc_retries: i64,
    pub num_ooms: i64,
    pub oversize_allocations: Stat,
    pub oversize_segments: Stat,
    pub num_sync_all_streams: i64,
    pub num_device_alloc: i64,
    pub num_device_free: i64,
    /// Copied from the config once when the allocator is built (SIZE_MAX → −1).
    pub max_split_size: i64,
}

impl DeviceStats {
    fn arrays_mut(&mut self) -> [&mut StatArray; 9] {
        [
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ]
    }

    /// `resetAccumulatedStats` (2.6: also the device counters).
    pub fn reset_accumulated(&mut self) {
        for array in self.arrays_mut() {
            array.each_mut(Stat::reset_accumulated);
        }
        self.oversize_allocations.reset_accumulated();
        self.oversize_segments.reset_accumulated();
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
    }

    /// `resetPeakStats`.
    pub fn reset_peak(&mut self) {
        for array in self.arrays_mut() {
            array.each_mut(Stat::reset_peak);
        }
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
    }

    /// `torch.cuda.memory_stats()` for `version`: the flattened keys
    /// (`THCPModule_memoryStats`), sorted by key as Python sorts them.
    pub fn flat(&self, version: TorchVersion) -> BTreeMap<String, i64> {
        let mut out = BTreeMap::new();
        let mut arrays: Vec<(&str, &StatArray)> = vec![
            ("allocation", &self.allocation),
            ("segment", &self.segment),
            ("active", &self.active),
            ("inactive_split", &self.inactive_split),
            ("allocated_bytes", &self.allocated_bytes),
            ("reserved_bytes", &self.reserved_bytes),
            ("active_bytes", &self.active_bytes),
            ("inactive_split_bytes", &self.inactive_split_bytes),
        ];
        if version >= TorchVersion::new(2, 0) {
            arrays.push(("requested_bytes", &self.requested_bytes));
        }
        for (name, array) in arrays {
            for (pool, stat) in STAT_TYPE_NAMES.iter().zip(array.entries()) {
                insert_stat(&mut out, &format!("{name}.{pool}"), &stat);
            }
        }
        insert_stat(&mut out, "oversize_allocations", &self.oversize_allocations);
        insert_stat(&mut out, "oversize_segments", &self.oversize_segments);
        out.insert("num_alloc_retries".into(), self.num_alloc_retries);
        out.insert("num_ooms".into(), self.num_ooms);
        out.insert("max_split_size".into(), self.max_split_size);
        if device_counters_exposed(version) {
            out.insert("num_sync_all_streams".into(), self.num_sync_all_streams);
            out.insert("num_device_alloc".into(), self.num_device_alloc);
            out.insert("num_device_free".into(), self.num_device_free);
        }
        if version >= TorchVersion::new(2, 12) {
            // `throw_on_cudamalloc_oom` rejections are not modelled: always 0.
            out.insert("num_oom_rejections".into(), 0);
        }
        out
    }
}

/// UNVERIFIED (2.3): whether `memory_stats()` already exposes
/// `num_sync_all_streams` / `num_device_alloc` / `num_device_free` (the struct
/// fields exist in the 2.3 headers; the docstring lists them from 2.4).
fn device_counters_exposed(version: TorchVersion) -> bool {
    version >= TorchVersion::new(2, 3)
}

fn insert_stat(out: &mut BTreeMap<String, i64>, prefix: &str, stat: &Stat) {
    out.insert(format!("{prefix}.current"), stat.current);
    out.insert(format!("{prefix}.peak"), stat.peak);
    out.insert(format!("{prefix}.allocated"), stat.allocated);
    out.insert(format!("{prefix}.freed"), stat.freed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_counts_per_version() {
        let stats = DeviceStats::default();
        assert_eq!(stats.flat(TorchVersion::new(1, 13)).len(), 107);
        assert_eq!(stats.flat(TorchVersion::new(2, 1)).len(), 119);
        assert_eq!(stats.flat(TorchVersion::new(2, 6)).len(), 122);
        assert_eq!(stats.flat(TorchVersion::new(2, 12)).len(), 123);
    }

    #[test]
    fn aggregate_accumulators_are_the_pools_sums() {
        let mut a = StatArray::default();
        a.increase(true, 512);
        a.increase(false, 1 << 20);
        a.decrease(true, 512);
        let all = a.all();
        assert_eq!((all.current, all.peak), (1 << 20, (1 << 20) + 512));
        assert_eq!((all.allocated, all.freed), ((1 << 20) + 512, 512));
        assert_eq!(a.pool(false).allocated, 1 << 20);
        // The accumulated totals saturate, in the pools and in their sum.
        for _ in 0..3 {
            a.increase(false, 1 << 62);
            a.decrease(false, 1 << 62);
        }
        assert_eq!(a.pool(false).allocated, i64::MAX);
        assert_eq!(a.all().allocated, i64::MAX);
        assert_eq!(a.all().freed, i64::MAX);
        let flat = DeviceStats {
            allocated_bytes: a,
            ..DeviceStats::default()
        }
        .flat(TorchVersion::DEFAULT);
        assert_eq!(flat["allocated_bytes.all.allocated"], i64::MAX);
        assert_eq!(flat["allocated_bytes.small_pool.freed"], 512);
    }

    #[test]
    fn stat_operations() {
        let mut s = Stat::default();
        s.increase(10);
        s.decrease(4);
        s.increase(1);
        assert_eq!(
            s,
            Stat {
                current: 7,
                peak: 10,
                allocated: 11,
                freed: 4
            }
        );
        s.reset_peak();
        s.reset_accumulated();
        assert_eq!(
            s,
            Stat {
                current: 7,
                peak: 7,
                allocated: 0,
                freed: 0
            }
        );
    }
}
