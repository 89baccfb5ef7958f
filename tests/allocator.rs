//! Conformance of the bundled caching allocator with PyTorch: the numbers of
//! shared/spec/allocator.md §1.5, §8, §11 and the devlog cases of anchors.md §3.3,
//! plus property tests of its invariants over random traces and configs.

use allocdoc::allocator::summary::memory_summary;
use allocdoc::allocator::{CachingAllocator, TraceAction};
use allocdoc::conf::{Settings, TorchVersion};
use allocdoc::device::Device;
use allocdoc::device::sim::SimDevice;
use proptest::prelude::*;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn allocator(settings: Settings, capacity: u64) -> CachingAllocator<SimDevice> {
    CachingAllocator::new(settings, SimDevice::new(capacity))
}

fn reserved(a: &CachingAllocator<SimDevice>) -> u64 {
    a.stats().reserved_bytes.all().current as u64
}

fn expandable() -> Settings {
    Settings {
        expandable_segments: true,
        ..Settings::default()
    }
}

// ---- allocator.md §8: memory_summary() byte for byte --------------------------------

/// The §8 sequence: 3 × 4000 B, 3 MiB+100 B, 200 MiB, 64 MiB; free the second
/// 4000-B block, the 3 MiB block and the 64 MiB block; allocate 30 MiB.
fn section_8_allocator() -> CachingAllocator<SimDevice> {
    let mut a = allocator(Settings::default(), 80 * GIB);
    let small: Vec<u64> = (0..3).map(|_| a.malloc(4000, 0).unwrap()).collect();
    let medium = a.malloc(3 * MIB + 100, 0).unwrap();
    a.malloc(200 * MIB, 0).unwrap();
    let big = a.malloc(64 * MIB, 0).unwrap();
    a.free(small[1]).unwrap();
    a.free(medium).unwrap();
    a.free(big).unwrap();
    a.malloc(30 * MIB, 0).unwrap();
    a
}

#[test]
fn section_8_stats() {
    let stats = section_8_allocator().memory_stats();
    assert_eq!(stats["allocated_bytes.all.current"], 241180672);
    assert_eq!(stats["reserved_bytes.all.current"], 299892736);
    assert_eq!(stats["inactive_split_bytes.all.current"], 37740544);
    assert_eq!(stats["segment.all.current"], 4);
    assert_eq!(stats["requested_bytes.all.current"], 241180480);
    assert_eq!(stats["max_split_size"], -1);
}

#[test]
fn section_8_summary_2x_layout() {
    let stats = section_8_allocator().memory_stats();
    let expected = include_str!("../fixtures/allocator/summary_2x.txt");
    assert_eq!(
        memory_summary(&stats, 0, false, TorchVersion::new(2, 6)).unwrap(),
        expected
    );
}

#[test]
fn section_8_summary_1x_abbreviated_layout() {
    let stats = section_8_allocator().memory_stats();
    let expected = include_str!("../fixtures/allocator/summary_1x_abbreviated.txt");
    assert_eq!(
        memory_summary(&stats, 0, true, TorchVersion::new(1, 13)).unwrap(),
        expected
    );
}

/// PyTorch 1.4.0 through 1.9.0 print no "Oversize" rows (they came with
/// max_split_size_mb in 1.10); the fixture is 1.9.0's own memory_summary run on
/// these stats, and 1.4.0's function is the same.
#[test]
fn section_8_summary_before_1_10_has_no_oversize_rows() {
    let stats = section_8_allocator().memory_stats();
    let expected = include_str!("../fixtures/allocator/summary_1_4_to_1_9.txt");
    for minor in 4..=9 {
        let version = TorchVersion::new(1, minor);
        assert_eq!(
            memory_summary(&stats, 0, false, version).unwrap(),
            expected,
            "{version:?}"
        );
    }
    let with_oversize = memory_summary(&stats, 0, false, TorchVersion::new(1, 10)).unwrap();
    assert!(with_oversize.contains("| Oversize allocations  |       0    |"));
    assert_eq!(with_oversize.lines().count(), expected.lines().count() + 4);
}

// ---- anchors.md §3.3: the devlog's lab cases ----------------------------------------

#[test]
fn devlog_small_then_large_requests_do_not_reuse_segments() {
    let mut a = allocator(Settings::default(), 80 * GIB);
    let blocks: Vec<u64> = (0..8).map(|_| a.malloc(16 * MIB, 0).unwrap()).collect();
    blocks.into_iter().for_each(|p| a.free(p).unwrap());
    for _ in 0..4 {
        a.malloc(32 * MIB, 0).unwrap();
    }
    assert_eq!(reserved(&a), 256 * MIB);
}

#[test]
fn devlog_large_then_small_requests_split_cached_segments() {
    let mut a = allocator(Settings::default(), 80 * GIB);
    let blocks: Vec<u64> = (0..4).map(|_| a.malloc(32 * MIB, 0).unwrap()).collect();
    blocks.into_iter().for_each(|p| a.free(p).unwrap());
    for _ in 0..8 {
        a.malloc(16 * MIB, 0).unwrap();
    }
    assert_eq!(reserved(&a), 128 * MIB);
}

#[test]
fn devlog_expandable_segments_map_20_mib_pages_and_merge() {
    let mut a = allocator(expandable(), 80 * GIB);
    a.record_history();
    let blocks: Vec<u64> = (0..8).map(|_| a.malloc(16 * MIB, 0).unwrap()).collect();
    assert_eq!(reserved(&a), 140 * MIB);
    blocks.into_iter().for_each(|p| a.free(p).unwrap());
    let maps_before = a.stats().num_device_alloc;
    for _ in 0..4 {
        a.malloc(32 * MIB, 0).unwrap();
    }
    assert_eq!(a.stats().num_device_alloc, maps_before);
    assert_eq!(reserved(&a), 140 * MIB);
    // Expandable segments are never counted as segments.
    assert_eq!(a.stats().segment.all().current, 0);
    let trace = a.take_trace();
    let maps: Vec<u64> = trace
        .iter()
        .filter(|e| e.action == TraceAction::SegmentMap)
        .map(|e| e.size)
        .collect();
    assert_eq!(maps, vec![20 * MIB; 7]);
}

#[test]
fn devlog_expandable_segments_do_not_fix_interleaved_live_blocks() {
    let mut a = allocator(expandable(), 80 * GIB);
    let blocks: Vec<u64> = (0..4).map(|_| a.malloc(16 * MIB, 0).unwrap()).collect();
    assert_eq!(reserved(&a), 80 * MIB);
    a.free(blocks[0]).unwrap();
    a.free(blocks[2]).unwrap();
    a.malloc(32 * MIB, 0).unwrap();
    assert_eq!(reserved(&a), 100 * MIB);
}

#[test]
fn devlog_one_mib_boundary() {
    let mut a = allocator(Settings::default(), 80 * GIB);
    let p = a.malloc(2 * MIB, 0).unwrap();
    a.free(p).unwrap();
    a.malloc(MIB / 2, 0).unwrap();
    assert_eq!(reserved(&a), 22 * MIB);

    let mut a = allocator(Settings::default(), 80 * GIB);
    a.malloc(2 * MIB, 0).unwrap();
    a.malloc(2 * MIB, 0).unwrap();
    assert_eq!(reserved(&a), 20 * MIB);
}

// ---- allocator.md §11: upstream tests ------------------------------------------------

/// test_allocator_settings: the delta of `active_bytes.all.allocated` for 84 MiB.
#[test]
fn test_allocator_settings_deltas() {
    let delta = |settings: Settings, bytes: u64| {
        let mut a = allocator(settings, 80 * GIB);
        let before = a.memory_stats();
        a.malloc(bytes, 0).unwrap();
        let after = a.memory_stats();
        (
            after["active_bytes.all.allocated"] - before["active_bytes.all.allocated"],
            after["requested_bytes.all.allocated"] - before["requested_bytes.all.allocated"],
        )
    };
    let nelems = 21 * MIB;
    assert_eq!(delta(Settings::default(), nelems * 4), (88080384, 88080384));
    let div4 = Settings {
        roundup_power2_divisions: [4; 16],
        ..Settings::default()
    };
    assert_eq!(delta(div4, nelems * 4), (100663296, 88080384));
    let list = Settings {
        garbage_collection_threshold: 0.5,
        roundup_power2_divisions: [8, 8, 8, 8, 8, 8, 8, 2, 2, 2, 1, 1, 1, 1, 1, 1],
        ..Settings::default()
    };
    assert_eq!(delta(list.clone(), nelems * 4).0, 92274688);
    assert_eq!(delta(list, 100 * MIB * 4).0, 536870912);
    let with_max_split = Settings {
        garbage_collection_threshold: 0.5,
        max_split_size: 40 * MIB,
        ..Settings::default()
    };
    assert_eq!(delta(with_max_split, nelems * 4).0, 88080384);
    let release_lock = Settings {
        release_lock_on_cudamalloc: true,
        ..Settings::default()
    };
    assert_eq!(delta(release_lock, nelems * 4).0, 88080384);
}

#[test]
fn test_out_of_memory() {
    let mut a = allocator(Settings::default(), 80 * GIB);
    let err = a.malloc(GIB * 800000000, 0).unwrap_err();
    assert!(
        err.message
            .contains("Tried to allocate 800000000.00 GiB. GPU 0 has a total capacity of"),
        "{}",
        err.message
    );
    assert_eq!(a.stats().num_ooms, 1);
    let err = a.malloc(GIB * 8000000000, 0).unwrap_err();
    assert_eq!(
        err.message,
        "CUDA out of memory. Tried to allocate more than 1EB memory."
    );
    assert_eq!(a.stats().num_ooms, 1);
    // The allocator is still usable.
    assert!(a.malloc(MIB, 0).is_ok());
    a.check_invariants().unwrap();
}

#[test]
fn test_out_of_memory_retry_and_exact_message() {
    let total = 80 * GIB;
    let mut a = allocator(Settings::default(), total);
    let half = a.malloc(total / 2, 0).unwrap();
    let err = a.malloc(total / 2 + MIB, 0).unwrap_err();
    assert_eq!(
        err.message,
        "CUDA out of memory. Tried to allocate 40.00 GiB. GPU 0 has a total capacity of 80.00 GiB \
         of which 40.00 GiB is free. Of the allocated memory 40.00 GiB is allocated by PyTorch, and \
         0 bytes is reserved by PyTorch but unallocated. If reserved but unallocated memory is large \
         try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See \
         documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    );
    assert_eq!(err.alloc_size, 40 * GIB + 2 * MIB);
    let stats = a.memory_stats();
    assert_eq!(stats["num_alloc_retries"], 1);
    assert_eq!(stats["num_sync_all_streams"], 1);
    a.free(half).unwrap();
    assert!(a.malloc(total / 2, 0).is_ok());
    a.check_invariants().unwrap();
}

/// test_set_per_process_memory_fraction: with 0.5, `int(total*0.499) - max_memory_reserved()`
/// bytes fit, `int(total*0.5)` does not ("out of memory", with the allowed amount): its
/// segment is rounded up to 2 MiB, past the cap, on a card whose total (an H100's
/// 85029158912 bytes) is not a multiple of 4 MiB.
#[test]
fn test_set_per_process_memory_fraction() {
    let total = 85_029_158_912;
    let mut a = allocator(Settings::default(), total);
    a.set_memory_fraction(0.5);
    let tmp = a.malloc(2 * MIB, 0).unwrap();
    a.free(tmp).unwrap();
    let max_reserved = a.stats().reserved_bytes.all().peak as u64;
    let fits = (total as f64 * 0.499) as u64 - max_reserved;
    let p = a.malloc(fits, 0).unwrap();
    a.free(p).unwrap();
    let err = a.malloc((total as f64 * 0.5) as u64, 0).unwrap_err();
    assert!(err.message.contains("out of memory"));
    assert!(
        err.message.contains("39.59 GiB allowed; "),
        "{}",
        err.message
    );
}

/// test_memory_allocation / test_cachingAllocator_raw_alloc.
#[test]
fn test_small_allocation_and_raw_alloc_accounting() {
    let mut a = allocator(Settings::default(), 80 * GIB);
    let p = a.malloc(1, 0).unwrap();
    assert_eq!(a.stats().allocated_bytes.all().current, 512);
    a.free(p).unwrap();
    assert_eq!(a.stats().allocated_bytes.all().current, 0);
    let before = a.stats().requested_bytes.all().allocated;
    a.malloc(MIB, 0).unwrap();
    assert_eq!(
        a.stats().requested_bytes.all().allocated - before,
        MIB as i64
    );
}

/// test_memory_stats: peaks, empty_cache counters, zero-size allocations.
#[test]
fn test_memory_stats_invariants() {
    let mut a = allocator(Settings::default(), 80 * GIB);
    let mut live = Vec::new();
    for (i, size) in [4000u64, 3 * MIB, 30 * MIB, 700, 12 * MIB, 2 * MIB]
        .iter()
        .enumerate()
    {
        live.push(a.malloc(*size, 0).unwrap());
        if i % 2 == 1 {
            a.free(live.remove(0)).unwrap();
        }
        let s = a.memory_stats();
        assert!(s["allocated_bytes.all.current"] <= s["allocated_bytes.all.peak"]);
        a.check_invariants().unwrap();
        let before = a.memory_stats();
        a.empty_cache();
        let after = a.memory_stats();
        assert_eq!(
            after["num_sync_all_streams"],
            before["num_sync_all_streams"] + 1
        );
        assert!(after["num_device_alloc"] >= before["num_device_alloc"]);
        assert!(after["num_device_free"] >= before["num_device_free"]);
        assert!(after["reserved_bytes.all.current"] <= before["reserved_bytes.all.current"]);
        assert_eq!(
            after["reserved_bytes.all.peak"],
            before["reserved_bytes.all.peak"]
        );
    }
    let before = a.memory_stats();
    assert_eq!(a.malloc(0, 0), Ok(0));
    assert_eq!(a.memory_stats(), before);
    a.reset_peak_stats();
    let s = a.memory_stats();
    assert_eq!(
        s["allocated_bytes.all.peak"],
        s["allocated_bytes.all.current"]
    );
    a.reset_accumulated_stats();
    assert_eq!(a.memory_stats()["num_sync_all_streams"], 0);
}

/// The graph-free part of test_max_split_expandable: a fraction allowing exactly
/// 120 MiB; three 40 MiB allocations (expandable off/on/off) fit, a fourth does not;
/// after freeing them a 120 MiB allocation succeeds (release copes with
/// expandable blocks in the free list).
#[test]
fn test_max_split_expandable() {
    let total = 80 * GIB;
    let fraction = (120 * MIB) as f64 / total as f64;
    let conf = |expandable_segments| Settings {
        expandable_segments,
        max_split_size: 40 * MIB,
        per_process_memory_fraction: Some(fraction),
        ..Settings::default()
    };
    let mut a = allocator(conf(false), total);
    let first = a.malloc(40 * MIB, 0).unwrap();
    a.set_settings(conf(true));
    let second = a.malloc(40 * MIB, 0).unwrap();
    a.set_settings(conf(false));
    let third = a.malloc(40 * MIB, 0).unwrap();
    let err = a.malloc(40 * MIB, 0).unwrap_err();
    assert!(
        err.message.contains("120.00 MiB allowed; "),
        "{}",
        err.message
    );
    for p in [first, second, third] {
        a.free(p).unwrap();
    }
    a.malloc(120 * MIB, 0).unwrap();
    a.check_invariants().unwrap();
}

/// The graph-free part of test_garbage_collect_expandable (threshold 0.5): after
/// freeing a plain and an expandable 40 MiB block, 80 MiB fits through GC.
#[test]
fn test_garbage_collect_expandable() {
    let total = 80 * GIB;
    let conf = |expandable_segments| Settings {
        expandable_segments,
        garbage_collection_threshold: 0.5,
        per_process_memory_fraction: Some((120 * MIB) as f64 / total as f64),
        ..Settings::default()
    };
    let mut a = allocator(conf(false), total);
    let first = a.malloc(40 * MIB, 0).unwrap();
    a.set_settings(conf(true));
    let second = a.malloc(40 * MIB, 0).unwrap();
    a.free(first).unwrap();
    a.free(second).unwrap();
    a.malloc(80 * MIB, 0).unwrap();
    // GC released the plain segment without a full synchronisation.
    assert_eq!(a.stats().num_sync_all_streams, 0);
    assert_eq!(a.stats().num_device_free, 1);
    a.check_invariants().unwrap();
}

/// garbage_collect_cached_blocks: ages count get_free_block calls on the pool since a
/// block was cached; each pass frees every unsplit block at or above the average age,
/// until the target is reclaimed.
#[test]
fn garbage_collection_frees_the_oldest_blocks_first() {
    let total = 80 * GIB;
    let settings = Settings {
        garbage_collection_threshold: 0.5,
        per_process_memory_fraction: Some((100 * MIB) as f64 / total as f64),
        ..Settings::default()
    };
    let mut a = allocator(settings, total);
    a.record_history();
    let old = a.malloc(30 * MIB, 0).unwrap(); // get_free_block call 1
    let young = a.malloc(30 * MIB, 0).unwrap(); // call 2
    a.free(old).unwrap(); // cached at count 2
    let third = a.malloc(35 * MIB, 0).unwrap(); // call 3: a new 35 MiB segment
    a.free(third).unwrap(); // cached at count 3
    a.free(young).unwrap(); // cached at count 3
    // call 4: ages old=2, young=1, third=1. 95 MiB > 50 MiB: reclaim 45 MiB. The
    // first pass (average 4/3) frees `old` only; the second (average 1) the rest.
    a.malloc(40 * MIB, 0).unwrap();
    let freed: Vec<u64> = a
        .take_trace()
        .iter()
        .filter(|e| e.action == TraceAction::SegmentFree)
        .map(|e| e.addr)
        .collect();
    assert_eq!(freed, vec![old, young, third]);
    assert_eq!(reserved(&a), 40 * MIB);
    assert_eq!(a.stats().num_sync_all_streams, 0);
    a.check_invariants().unwrap();
}

/// release_available_cached_blocks: with max_split_size set, the largest cached oversize
/// blocks of the stream are freed until the request fits, without a synchronisation.
#[test]
fn release_available_cached_blocks_frees_largest_oversize_first() {
    let settings = Settings {
        max_split_size: 50 * MIB,
        ..Settings::default()
    };
    let mut a = allocator(settings, 200 * MIB);
    a.record_history();
    let small = a.malloc(60 * MIB, 0).unwrap();
    let large = a.malloc(70 * MIB, 0).unwrap();
    a.free(small).unwrap();
    a.free(large).unwrap();
    a.malloc(100 * MIB, 0).unwrap();
    let freed: Vec<u64> = a
        .take_trace()
        .iter()
        .filter(|e| e.action == TraceAction::SegmentFree)
        .map(|e| e.addr)
        .collect();
    assert_eq!(freed, vec![large, small]);
    assert_eq!(a.stats().num_sync_all_streams, 0);
    assert_eq!(a.stats().num_alloc_retries, 0);
    assert_eq!(reserved(&a), 100 * MIB);
}

/// test_caching_allocator_record_stream_oom: frees deferred by record_stream must
/// not cause an OOM, because the release retry synchronizes events first.
#[test]
fn record_stream_deferred_frees_are_synchronized_before_oom() {
    let mut a = allocator(Settings::default(), 2 * GIB);
    for _ in 0..100 {
        let p = a.malloc(160_000_000, 0).unwrap();
        a.record_stream(p, 1).unwrap();
        a.free(p).unwrap();
        a.check_invariants().unwrap();
    }
    assert!(a.stats().num_sync_all_streams > 0);
}

#[test]
fn deferred_free_completes_after_the_stream_catches_up() {
    let mut a = allocator(Settings::default(), 80 * GIB);
    let p = a.malloc(MIB, 0).unwrap();
    a.record_stream(p, 7).unwrap();
    a.free(p).unwrap();
    let segments = a.segments();
    assert_eq!(segments[0].blocks[0].state.as_str(), "active_pending_free");
    assert_eq!(a.stats().active.all().current, 1);
    // Not ready yet: a new request cannot reuse the block.
    let q = a.malloc(MIB, 0).unwrap();
    assert_ne!(q, p);
    a.synchronize_stream(7);
    let r = a.malloc(MIB, 0).unwrap();
    assert_eq!(r, p);
    a.check_invariants().unwrap();
}

#[test]
fn oversize_blocks_follow_max_split_size() {
    let settings = Settings {
        max_split_size: 100 * MIB,
        ..Settings::default()
    };
    let mut a = allocator(settings, 80 * GIB);
    let big = a.malloc(200 * MIB, 0).unwrap();
    a.free(big).unwrap();
    // A normal request never takes an oversize block.
    let small = a.malloc(50 * MIB, 0).unwrap();
    assert_ne!(small, big);
    // An oversize request takes it only within 20 MiB.
    let near = a.malloc(185 * MIB, 0).unwrap();
    assert_eq!(near, big);
    let s = a.memory_stats();
    assert_eq!(s["oversize_allocations.current"], 1);
    assert_eq!(s["oversize_segments.current"], 1);
    assert_eq!(s["max_split_size"], 100 * MIB as i64);
    a.check_invariants().unwrap();
}

#[test]
fn snapshot_view_tiles_segments() {
    let a = section_8_allocator();
    let segments = a.segments();
    assert_eq!(segments.len(), 4);
    for s in &segments {
        let mut next = s.address;
        for b in &s.blocks {
            assert_eq!(b.address, next);
            next += b.size;
        }
        assert_eq!(next - s.address, s.total_size);
    }
    let total: u64 = segments.iter().map(|s| s.total_size).sum();
    assert_eq!(total, 299892736);
}

// ---- property tests ------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Op {
    Alloc(u64, u64),
    Free(usize),
    RecordStream(usize, u64),
    SyncStream(u64),
    EmptyCache,
    /// `_set_allocator_settings("expandable_segments:…")` mid-run.
    SetExpandable(bool),
}

fn size_strategy() -> impl Strategy<Value = u64> {
    prop_oneof![
        1u64..=MIB,
        MIB + 1..10 * MIB,
        10 * MIB..120 * MIB,
        Just(0u64),
    ]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (size_strategy(), 0u64..2).prop_map(|(s, st)| Op::Alloc(s, st)),
        5 => any::<usize>().prop_map(Op::Free),
        1 => (any::<usize>(), 0u64..3).prop_map(|(i, st)| Op::RecordStream(i, st)),
        1 => (0u64..3).prop_map(Op::SyncStream),
        1 => Just(Op::EmptyCache),
        1 => any::<bool>().prop_map(Op::SetExpandable),
    ]
}

fn settings_strategy() -> impl Strategy<Value = Settings> {
    (
        prop::option::of(21u64..200),
        prop::sample::select(vec![0u64, 1, 2, 4, 8]),
        any::<bool>(),
        prop::option::of(0.1f64..0.9),
        prop::option::of(0.3f64..1.0),
    )
        .prop_map(|(max_split, div, expandable, gc, fraction)| Settings {
            max_split_size: max_split.map_or(u64::MAX, |m| m * MIB),
            roundup_power2_divisions: [div; 16],
            expandable_segments: expandable,
            garbage_collection_threshold: gc.unwrap_or(0.0),
            per_process_memory_fraction: fraction,
            ..Settings::default()
        })
}

/// Runs `ops` on `a` (whose live allocations are `live`), checking every
/// invariant after each; then frees everything and empties the cache, after
/// which nothing may be left.
fn run_checked(
    mut a: CachingAllocator<SimDevice>,
    settings: &Settings,
    mut live: Vec<u64>,
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    for op in ops {
        match op {
            Op::Alloc(size, stream) => match a.malloc(size, stream) {
                Ok(0) => {}
                Ok(p) => live.push(p),
                Err(oom) => prop_assert!(oom.message.starts_with("CUDA out of memory.")),
            },
            Op::Free(i) if !live.is_empty() => {
                let p = live.swap_remove(i % live.len());
                a.free(p).unwrap();
            }
            Op::RecordStream(i, stream) if !live.is_empty() => {
                a.record_stream(live[i % live.len()], stream).unwrap();
            }
            Op::SyncStream(stream) => a.synchronize_stream(stream),
            Op::EmptyCache => a.empty_cache(),
            Op::SetExpandable(on) => a.set_settings(Settings {
                expandable_segments: on,
                ..settings.clone()
            }),
            _ => {}
        }
        if let Err(e) = a.check_invariants() {
            prop_assert!(false, "{}", e);
        }
        // allocated (requested) + internal free + external free = reserved, per
        // segment (_memory_viz.segsum's check).
        for s in a.segments() {
            let mut sum = 0u64;
            for b in &s.blocks {
                if b.state.as_str() == "inactive" {
                    sum += b.size;
                } else {
                    let internal = b.size.checked_sub(b.requested_size);
                    prop_assert!(internal.is_some(), "requested above size: {:?}", b);
                    sum += b.requested_size + internal.unwrap_or(0);
                }
            }
            prop_assert_eq!(sum, s.total_size);
        }
    }
    for p in live {
        a.free(p).unwrap();
    }
    a.empty_cache();
    prop_assert_eq!(a.stats().reserved_bytes.all().current, 0);
    prop_assert_eq!(a.total_allocated_memory(), 0);
    prop_assert!(a.segments().is_empty());
    let (free, total) = a.device_mut().mem_get_info();
    prop_assert_eq!(free, total);
    a.check_invariants().unwrap();
    Ok(())
}

/// An expandable segment's mapped ranges: per range, the unmapped pages before
/// it, its pages, and its blocks as (weight, live?) shares of its bytes.
type ExpandableLayout = Vec<(u64, u64, Vec<(u64, bool)>)>;

fn expandable_layout_strategy() -> impl Strategy<Value = (bool, ExpandableLayout)> {
    (
        any::<bool>(),
        prop::collection::vec(
            (
                0u64..3,
                1u64..4,
                prop::collection::vec((1u64..64, any::<bool>()), 1..6),
            ),
            1..4,
        ),
    )
}

/// The ranges of `layout` with `page`-byte pages: blocks 512-byte aligned,
/// at least one unmapped page between ranges.
fn seed_ranges(layout: &ExpandableLayout, page: u64) -> Vec<allocdoc::allocator::seed::SeedRange> {
    use allocdoc::allocator::seed::{SeedBlock, SeedRange};
    let mut offset = 0;
    layout
        .iter()
        .enumerate()
        .map(|(i, (gap, pages, parts))| {
            offset += if i == 0 { *gap } else { (*gap).max(1) } * page;
            let size = pages * page;
            let total: u64 = parts.iter().map(|p| p.0).sum();
            let mut left = size;
            let blocks = parts
                .iter()
                .enumerate()
                .map(|(k, &(weight, allocated))| {
                    let share = if k + 1 == parts.len() {
                        left
                    } else {
                        (size * weight / total / 512 * 512)
                            .clamp(512, left - 512 * (parts.len() - k - 1) as u64)
                    };
                    left -= share;
                    SeedBlock {
                        size: share,
                        requested_size: if allocated { share - share / 3 } else { 0 },
                        allocated,
                    }
                })
                .collect();
            let range = SeedRange { offset, blocks };
            offset += size;
            range
        })
        .collect()
}

/// A live allocation of [`same_run_held_or_by_address`]: by address in both
/// allocators, or by address in the first and held by the caller in the second.
#[derive(Debug, Clone, Copy)]
enum Live {
    Address(u64),
    Held(u64, allocdoc::allocator::block::BlockId),
}

/// Runs `ops` on two allocators: the first by address only, the second
/// holding the blocks of the allocations `held` picks (the replay's way,
/// `malloc_block`) and the rest by address. After every operation both have
/// the same stats, segments and history, and the second keeps every invariant.
fn same_run_held_or_by_address(
    settings: &Settings,
    capacity: u64,
    ops: Vec<(Op, bool)>,
) -> Result<(), TestCaseError> {
    let mut a = allocator(settings.clone(), capacity);
    let mut b = allocator(settings.clone(), capacity);
    a.record_history();
    b.record_history();
    let mut live: Vec<Live> = Vec::new();
    for (op, held) in ops {
        match op {
            Op::Alloc(size, stream) => {
                let by_address = a.malloc(size, stream);
                let other = if held {
                    b.malloc_block(size, stream).map(|block| match by_address {
                        Ok(p) => Some(Live::Held(p, block)),
                        Err(_) => None,
                    })
                } else {
                    b.malloc(size, stream).map(|p| Some(Live::Address(p)))
                };
                match (by_address, other) {
                    (Ok(0), Ok(_)) => {}
                    (Ok(p), Ok(Some(l))) => {
                        if let Live::Held(_, block) = l {
                            prop_assert_eq!(b.block_addr(block), Some(p));
                        } else {
                            prop_assert!(matches!(l, Live::Address(q) if q == p));
                        }
                        live.push(l);
                    }
                    (Err(x), Err(y)) => prop_assert_eq!(x, y),
                    (x, y) => prop_assert!(false, "{:?} against {:?}", x, y),
                }
            }
            Op::Free(i) if !live.is_empty() => match live.swap_remove(i % live.len()) {
                Live::Address(p) => {
                    a.free(p).unwrap();
                    b.free(p).unwrap();
                }
                Live::Held(p, block) => {
                    a.free(p).unwrap();
                    // Not in the address map: refused there, and the run is unchanged.
                    prop_assert!(b.free(p).is_err());
                    b.free_held(block).unwrap();
                    prop_assert!(b.free_held(block).is_err(), "freed twice");
                }
            },
            Op::RecordStream(i, stream) if !live.is_empty() => match live[i % live.len()] {
                Live::Address(p) => {
                    a.record_stream(p, stream).unwrap();
                    b.record_stream(p, stream).unwrap();
                }
                Live::Held(p, block) => {
                    a.record_stream(p, stream).unwrap();
                    b.record_stream_held(block, stream).unwrap();
                }
            },
            Op::SyncStream(stream) => {
                a.synchronize_stream(stream);
                b.synchronize_stream(stream);
            }
            Op::EmptyCache => {
                a.empty_cache();
                b.empty_cache();
            }
            Op::SetExpandable(on) => {
                let s = Settings {
                    expandable_segments: on,
                    ..settings.clone()
                };
                a.set_settings(s.clone());
                b.set_settings(s);
            }
            _ => {}
        }
        if let Err(e) = b.check_invariants() {
            prop_assert!(false, "{}", e);
        }
        prop_assert_eq!(a.memory_stats(), b.memory_stats());
        prop_assert_eq!(a.segments(), b.segments());
    }
    prop_assert_eq!(a.take_trace(), b.take_trace());
    Ok(())
}

#[test]
fn a_held_block_is_freed_once_and_only_as_held() {
    let mut a = allocator(Settings::default(), GIB);
    let held = a.malloc_block(3 * MIB, 0).unwrap();
    let addr = a.block_addr(held).unwrap();
    let by_address = a.malloc(3 * MIB, 0).unwrap();
    assert_eq!(
        by_address,
        addr + 3 * MIB,
        "the next split of the same segment"
    );
    // A held block is not in the address map.
    assert!(a.free(addr).is_err());
    assert!(a.record_stream(addr, 1).is_err());
    // Zero bytes: no block, and freeing none does nothing.
    let none = a.malloc_block(0, 0).unwrap();
    assert_eq!(a.block_addr(none), None);
    a.free_held(none).unwrap();
    assert!(a.record_stream_held(none, 1).is_err());
    a.record_stream_held(held, 1).unwrap();
    a.free_held(held).unwrap();
    // Freed (its free waits on stream 1, but the caller holds it no more).
    assert!(a.free_held(held).is_err());
    assert!(a.record_stream_held(held, 1).is_err());
    a.check_invariants().unwrap();
    a.free(by_address).unwrap();
    a.synchronize_stream(1);
    a.empty_cache();
    assert_eq!(reserved(&a), 0);
    a.check_invariants().unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn held_blocks_run_as_blocks_by_address_do(
        settings in settings_strategy(),
        capacity_mib in 200u64..600,
        ops in prop::collection::vec((op_strategy(), any::<bool>()), 1..120),
    ) {
        same_run_held_or_by_address(&settings, capacity_mib * MIB, ops)?;
    }

    #[test]
    fn invariants_hold_after_every_operation(
        settings in settings_strategy(),
        capacity_mib in 200u64..600,
        ops in prop::collection::vec(op_strategy(), 1..120),
    ) {
        let a = allocator(settings.clone(), capacity_mib * MIB);
        run_checked(a, &settings, Vec::new(), ops)?;
    }

    #[test]
    fn a_seeded_expandable_segment_keeps_every_invariant(
        settings in settings_strategy(),
        (small, layout) in expandable_layout_strategy(),
        capacity_mib in 200u64..600,
        ops in prop::collection::vec(op_strategy(), 1..80),
    ) {
        let settings = Settings { expandable_segments: true, ..settings };
        let page = if small { 2 * MIB } else { 20 * MIB };
        let ranges = seed_ranges(&layout, page);
        let mut a = allocator(settings.clone(), capacity_mib * MIB);
        let base = a.seed_expandable_segment(0, small, &ranges, None).unwrap();
        a.check_invariants().unwrap();
        // The stats count what the ranges hold: mapped bytes reserved, live
        // blocks allocated, no segment (expandable segments are not counted).
        let mapped: u64 = ranges.iter().map(|r| r.size()).sum();
        let live_blocks = ranges.iter().flat_map(|r| {
            r.blocks.iter().scan(base + r.offset, |at, b| {
                let addr = *at;
                *at += b.size;
                Some((addr, *b))
            })
        }).filter(|(_, b)| b.allocated);
        let live: Vec<u64> = live_blocks.clone().map(|(addr, _)| addr).collect();
        let allocated: u64 = live_blocks.map(|(_, b)| b.size).sum();
        let s = a.stats();
        prop_assert_eq!(s.reserved_bytes.all().current, mapped as i64);
        prop_assert_eq!(s.allocated_bytes.all().current, allocated as i64);
        prop_assert_eq!(s.allocation.all().current, live.len() as i64);
        prop_assert_eq!(s.segment.all().current, 0);
        prop_assert_eq!(a.segments().len(), ranges.len());
        run_checked(a, &settings, live, ops)?;
    }
}

// ---- the `replay` command ------------------------------------------------------------

fn allocdoc() -> assert_cmd::Command {
    assert_cmd::Command::cargo_bin("allocdoc").expect("the allocdoc binary")
}

const DEVLOG: &str = "fixtures/allocator/devlog_16_then_32.csv";

#[test]
fn replay_text_runs_side_by_side() {
    let out = allocdoc()
        .args(["replay", DEVLOG, "--capacity", "200MiB"])
        .args(["--conf", "", "--conf", "expandable_segments:True"])
        .assert()
        .code(0);
    let stdout = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    insta::assert_snapshot!(stdout);
}

/// `--summary` prints each version's own layout: no Oversize rows before 1.10,
/// and no summary at all before 1.4, where memory_summary() did not exist.
#[test]
fn replay_summary_follows_the_version() {
    let summary = |version: &str| {
        allocdoc()
            .args(["replay", DEVLOG, "--capacity", "200MiB", "--summary"])
            .args(["--torch-version", version])
            .assert()
    };
    for (version, oversize) in [
        ("1.4", false),
        ("1.9", false),
        ("1.10", true),
        ("2.6", true),
    ] {
        let out = summary(version).code(0);
        let stdout = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
        assert!(stdout.contains("| GPU reserved segments |"), "{version}");
        assert_eq!(
            stdout.contains("Oversize GPU segments"),
            oversize,
            "{version}"
        );
    }
    for version in ["1.0", "1.3"] {
        let out = summary(version).code(2);
        let stderr = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
        assert!(
            stderr.contains(&format!(
                "--summary: memory_summary() does not exist in PyTorch {version} (it first appeared in 1.4)"
            )),
            "{stderr}"
        );
    }
}

#[test]
fn replay_json_follows_the_contract() {
    let out = allocdoc()
        .args(["replay", DEVLOG, "--capacity", "200MiB", "--format", "json"])
        .args(["--conf", "expandable_segments:True", "--conf", ""])
        .assert()
        .code(0);
    let v: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[0]["conf"], "expandable_segments:True");
    assert_eq!(runs[0]["peak_reserved_bytes"], 140 * MIB);
    assert_eq!(runs[0]["device_allocs"], 7);
    assert_eq!(runs[1]["conf"], "");
    assert_eq!(runs[1]["capacity_bytes"], 200 * MIB);
    assert_eq!(runs[1]["events"], 20);
    assert!(runs[1]["oom"].is_null());
    // 8 × 16 MiB segments, then the 32 MiB requests force a release of all of them.
    assert_eq!(runs[1]["peak_reserved_bytes"], 192 * MIB);
    assert_eq!(runs[1]["device_frees"], 8);
    assert_eq!(runs[1]["alloc_retries"], 1);
    assert_eq!(runs[1]["stats"]["reserved_bytes.all.current"], 128 * MIB);
    assert_eq!(runs[1]["stats"].as_object().unwrap().len(), 122);
}

#[test]
fn replay_exit_codes() {
    // The last config runs out of memory: exit 1, with PyTorch's message. Every
    // other 16 MiB block of the 32 MiB segments stays live, so a 32 MiB request
    // needs a new segment that a 150 MiB card cannot give.
    let dir = tempfile::tempdir().unwrap();
    let mut csv = String::from("action,id,size,stream\n");
    for i in 0..4 {
        csv += &format!("alloc,big{i},33554432,0\n");
    }
    for i in 0..4 {
        csv += &format!("free,big{i},,\n");
    }
    for i in 0..8 {
        csv += &format!("alloc,half{i},16777216,0\n");
    }
    for i in (0..8).step_by(2) {
        csv += &format!("free,half{i},,\n");
    }
    csv += "alloc,last,33554432,0\n";
    let fragmented = dir.path().join("fragmented.csv");
    std::fs::write(&fragmented, csv).unwrap();
    let out = allocdoc()
        .args(["replay", "--capacity", "150MiB", "--format", "json"])
        .arg(&fragmented)
        .args(["--conf", "max_split_size_mb:21", "--conf", ""])
        .assert()
        .code(1);
    let v: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    assert!(v["runs"][0]["oom"].is_null());
    // Oversize 32 MiB blocks are never split for 16 MiB requests: released instead.
    assert_eq!(v["runs"][0]["peak_reserved_bytes"], 144 * MIB);
    let oom = &v["runs"][1]["oom"];
    assert_eq!(oom["event_index"], 20);
    assert_eq!(oom["requested_bytes"], 32 * MIB);
    assert_eq!(
        oom["message"].as_str().unwrap(),
        "CUDA out of memory. Tried to allocate 32.00 MiB. GPU 0 has a total capacity of 150.00 MiB \
         of which 22.00 MiB is free. Of the allocated memory 64.00 MiB is allocated by PyTorch, and \
         64.00 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is \
         large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid \
         fragmentation.  See documentation for Memory Management  \
         (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    );
    // Bad input: exit 2, naming the file and line.
    let bad = dir.path().join("bad.csv");
    std::fs::write(&bad, "action,id,size,stream\nalloc,a,12,0\nfree,b,,0\n").unwrap();
    let out = allocdoc().args(["replay"]).arg(&bad).assert().code(2);
    let stderr = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(
        stderr.contains("bad.csv:3: expected the id of a live allocation"),
        "{stderr}"
    );
    allocdoc()
        .args(["replay", DEVLOG, "--conf", "max_split_size_mb:2"])
        .assert()
        .code(2);
    // No GPU for --device cuda: exit 3.
    allocdoc()
        .args(["replay", DEVLOG, "--device", "cuda"])
        .assert()
        .code(3);
}

#[test]
fn replay_summary_prints_pytorch_tables() {
    let out = allocdoc()
        .args(["replay", DEVLOG, "--capacity", "200MiB", "--summary"])
        .assert()
        .code(0);
    let stdout = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    assert_eq!(
        stdout
            .matches("PyTorch CUDA memory summary, device ID 0")
            .count(),
        2
    );
    assert!(
        stdout.contains("|        cudaMalloc retries: 1         |"),
        "{stdout}"
    );
}

/// Nothing overflows or panics on an unbounded card or absurd requests.
#[test]
fn extreme_sizes_do_not_panic() {
    for settings in [Settings::default(), expandable()] {
        let mut a = allocator(settings, u64::MAX);
        for size in [u64::MAX, 1 << 60] {
            assert!(a.malloc(size, 0).is_err());
        }
        // An unbounded card serves anything below 1 EB, expandable or not.
        for size in [(1 << 60) - 1, (1 << 40) + 1, 1] {
            assert!(a.malloc(size, 0).is_ok());
        }
        a.check_invariants().unwrap();
        a.empty_cache();
    }
    let div = Settings {
        roundup_power2_divisions: [8; 16],
        ..Settings::default()
    };
    assert_eq!(
        allocdoc::allocator::sizes::round_size(u64::MAX, &div),
        u64::MAX
    );
}

/// Requests and cards at the edges of `u64` (0, 2^60, u64::MAX, …): every call
/// returns (an OOM at worst) without an arithmetic overflow, which a debug build
/// (`cargo test`, overflow checks on) turns into a panic; the stats still recount.
#[test]
fn extreme_sizes_and_capacities_do_not_overflow() {
    const EDGES: [u64; 10] = [
        0,
        1,
        512,
        (1 << 60) - 1,
        1 << 60,
        1 << 62,
        1 << 63,
        u64::MAX - 1,
        u64::MAX,
        (1 << 59) + 1,
    ];
    let configs = [
        Settings::default(),
        expandable(),
        Settings {
            max_split_size: 1 << 62,
            roundup_power2_divisions: [8; 16],
            ..Settings::default()
        },
        Settings {
            garbage_collection_threshold: 0.5,
            per_process_memory_fraction: Some(1.0),
            ..expandable()
        },
    ];
    for settings in configs {
        for capacity in [0, 1 << 60, u64::MAX - 1, u64::MAX] {
            let mut a = allocator(settings.clone(), capacity);
            let mut live = Vec::new();
            // Twice over, so the big requests also stack up: the reserved and
            // allocated totals run past i64::MAX unless they saturate.
            for size in EDGES.iter().chain(&EDGES).chain(&[(1 << 60) - 1; 16]) {
                match a.malloc(*size, 0) {
                    Ok(0) => assert_eq!(*size, 0),
                    Ok(p) => live.push(p),
                    Err(oom) => assert!(oom.message.contains("out of memory"), "{}", oom.message),
                }
                a.check_invariants().unwrap();
            }
            let stats = a.memory_stats();
            assert!(
                stats.iter().all(|(k, &v)| v >= 0 || k == "max_split_size"),
                "{stats:?}"
            );
            let _ = memory_summary(&stats, 0, false, TorchVersion::DEFAULT);
            for p in live.drain(..).rev() {
                a.free(p).unwrap();
                a.check_invariants().unwrap();
            }
            a.empty_cache();
            assert_eq!(a.total_allocated_memory(), 0, "capacity {capacity}");
        }
    }
}

/// A replay seeded from a recording under another config can hold a split
/// segment with a free block above the split limit, a state PyTorch's own runs
/// never reach. `release_available_cached_blocks` must pass it over (only
/// whole segments can be freed), not free part of a segment (found by the
/// `replay` fuzz target).
#[test]
fn a_split_oversize_block_is_never_released_as_a_segment() {
    use allocdoc::allocator::seed::SeedBlock;
    let settings = Settings {
        max_split_size: 64 * MIB,
        ..Settings::default()
    };
    let mut a = allocator(settings, 110 * MIB);
    let seeded = [
        SeedBlock {
            size: 10 * MIB,
            requested_size: 10 * MIB,
            allocated: true,
        },
        SeedBlock {
            size: 100 * MIB,
            requested_size: 0,
            allocated: false,
        },
    ];
    a.seed_segment(0, false, &seeded).unwrap();
    a.check_invariants().unwrap();
    // 80 MiB is oversize: the 100 MiB block is not within the 20 MiB tolerance,
    // the card is full, and the only cached oversize block is part of a segment.
    let oom = a.malloc(80 * MIB, 0).unwrap_err();
    assert!(oom.message.contains("out of memory"), "{}", oom.message);
    a.check_invariants().unwrap();
    assert_eq!(reserved(&a), 110 * MIB);
    assert_eq!(a.stats().num_device_free, 0);
    // A request the free block serves within the tolerance still gets it.
    assert!(a.malloc(90 * MIB, 0).is_ok());
    a.check_invariants().unwrap();
}
