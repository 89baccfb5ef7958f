//! `PYTORCH_CUDA_ALLOC_CONF` parsing per PyTorch era, rendering, and the
//! `conf check` command.

use allocdoc::conf::{
    ConfError, ErrorOrigin, MIB, PyException, Settings, TorchVersion, parse, render,
};

fn v(s: &str) -> TorchVersion {
    TorchVersion::parse(s).unwrap()
}

fn err(value: &str, version: &str) -> ConfError {
    parse(value, v(version)).expect_err(value)
}

fn ok(value: &str, version: &str) -> Settings {
    parse(value, v(version))
        .unwrap_or_else(|e| panic!("{value} @ {version}: {e}"))
        .settings
}

fn table(value: &str, version: &str) -> [u64; 16] {
    ok(value, version).roundup_power2_divisions
}

#[test]
fn torch_versions_parse_from_what_users_write() {
    assert_eq!(v("2.4.1+cu121"), TorchVersion::new(2, 4));
    assert_eq!(v("2.4"), TorchVersion::new(2, 4));
    assert_eq!(v("1.13.1"), TorchVersion::new(1, 13));
    assert_eq!(v("2.10.0a0"), TorchVersion::new(2, 10));
    assert_eq!(v("2.6.0.dev20241112"), TorchVersion::new(2, 6));
    assert_eq!(v("v2.6"), TorchVersion::new(2, 6));
    for bad in ["", "2", "two.six", "2.x", "2.6.x", "2..6"] {
        assert!(TorchVersion::parse(bad).is_err(), "{bad}");
    }
}

/// §11 item 1, `test_allocator_settings`: every must-raise value, with the
/// message PyTorch 2.6 raises (RuntimeError) and the 2.10+ one.
#[test]
fn test_allocator_settings_must_raise_cases() {
    let cases: [(&str, &str, &str, &str, PyException); 7] = [
        (
            "foo:1,bar:2",
            "Unrecognized CachingAllocator option: foo",
            "Unrecognized key 'foo' in CUDA allocator config.",
            "ValueError",
            PyException::ValueError,
        ),
        (
            "garbage_collection_threshold:1.2",
            "garbage_collect_threshold too big, set it 0.0~1.0",
            "garbage_collect_threshold is invalid, set it in (0.0, 1.0)",
            "ValueError",
            PyException::ValueError,
        ),
        (
            "max_split_size_mb:2",
            "CachingAllocator option max_split_size_mb too small, must be > 20",
            "CachingAllocator option max_split_size_mb too small, must be >= 20",
            "ValueError",
            PyException::ValueError,
        ),
        (
            "release_lock_on_cudamalloc:none",
            "Expected a single True/False argument for release_lock_on_cudamalloc",
            "Expected 'True' or 'False' at index 2 in ConfigTokenizer but got 'none'",
            "ValueError",
            PyException::ValueError,
        ),
        (
            "pinned_use_cuda_host_register:none",
            "Expected a single True/False argument for pinned_use_cuda_host_register",
            "Expected 'True' or 'False' at index 2 in ConfigTokenizer but got 'none'",
            "ValueError",
            PyException::ValueError,
        ),
        (
            "pinned_num_register_threads:none",
            "stoi",
            "stoull",
            "RuntimeError",
            PyException::RuntimeError,
        ),
        (
            "pinned_num_register_threads:1024",
            "Number of register threads should be less than or equal to 128",
            "Number of register threads should be less than or equal to 128, got 1024",
            "ValueError",
            PyException::ValueError,
        ),
    ];
    for (value, msg_26, msg_210, class_210, exc_210) in cases {
        let e = err(value, "2.6");
        assert_eq!(e.exception, Some(PyException::RuntimeError), "{value}");
        assert_eq!(e.message, msg_26, "{value} @ 2.6");
        for version in ["2.10", "2.12", "2.15"] {
            let e = err(value, version);
            assert_eq!(e.message, msg_210, "{value} @ {version}");
            assert_eq!(e.exception, Some(exc_210), "{value} @ {version}");
            assert_eq!(e.to_string(), format!("{class_210}: {msg_210}"));
        }
    }
    assert_eq!(
        err("pinned_num_register_threads:none", "2.6").origin,
        ErrorOrigin::CppException
    );
}

/// §11 item 1: the accepted values and the rounding tables they produce.
#[test]
fn test_allocator_settings_accepted_values() {
    assert_eq!(table("roundup_power2_divisions:4", "2.6"), [4; 16]);
    let s = ok(
        "garbage_collection_threshold:0.5,max_split_size_mb:40",
        "2.6",
    );
    assert_eq!(s.garbage_collection_threshold, 0.5);
    assert_eq!(s.max_split_size, 40 * MIB);
    assert_eq!(
        s.roundup_power2_divisions, [0; 16],
        "every parse resets the divisions"
    );
    let list = "garbage_collection_threshold:0.5,roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]";
    for version in ["2.0", "2.6", "2.9", "2.10", "2.15"] {
        assert_eq!(
            table(list, version),
            [8, 8, 8, 8, 8, 8, 8, 2, 2, 2, 1, 1, 1, 1, 1, 1],
            "{version}"
        );
    }
    assert!(ok("release_lock_on_cudamalloc:True", "2.6").release_lock_on_cudamalloc);
}

/// §6.4: `>:V` overwrites the last explicit bucket in 2.0–2.9, not in 2.10+.
#[test]
fn greater_than_fill_differs_by_era() {
    let value = "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]";
    let old = [1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 8, 8, 8, 8, 8, 8];
    let new = [1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 4, 8, 8, 8, 8, 8];
    for version in ["2.0", "2.4", "2.6", "2.9"] {
        assert_eq!(table(value, version), old, "{version}");
    }
    for version in ["2.10", "2.11", "2.15"] {
        assert_eq!(table(value, version), new, "{version}");
    }
    let warnings = parse(value, v("2.6")).unwrap().warnings;
    assert!(
        warnings
            .iter()
            .any(|w| w.text.contains("overwrites the 1024 MB bucket (was 4)")),
        "{warnings:?}"
    );
}

#[test]
fn list_zero_divisions_need_2_4() {
    assert_eq!(
        err("roundup_power2_divisions:[64:0,>:4]", "2.3").message,
        "For roundups, the divisons has to be power of 2 "
    );
    // 2.4–2.9: '>' refills the 64 MB bucket itself; 2.10+ keep its 0.
    assert_eq!(
        table("roundup_power2_divisions:[64:0,>:4]", "2.4"),
        [0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4]
    );
    assert_eq!(
        table("roundup_power2_divisions:[64:0,>:4]", "2.10"),
        [0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4, 4]
    );
    assert_eq!(
        err("roundup_power2_divisions:[64:3]", "2.6").message,
        "For roundups, the divisons has to be power of 2 or 0 to disable roundup "
    );
    assert_eq!(
        err("roundup_power2_divisions:[64:3]", "2.9").message,
        "For roundups, the divisions has to be power of 2 or 0 to disable roundup "
    );
    assert_eq!(
        err("roundup_power2_divisions:[48:2]", "2.6").message,
        "For roundups, the intervals have to be power of 2 "
    );
}

#[test]
fn scalar_divisions_and_the_1_x_quirk() {
    assert_eq!(
        err("roundup_power2_divisions:3", "1.13").message,
        "For roundups, the divisons has to be power of 2 "
    );
    assert_eq!(
        err("roundup_power2_divisions:3", "2.9").message,
        "For roundups, the divisions has to be power of 2 "
    );
    assert_eq!(
        err("roundup_power2_divisions:0", "2.6").message,
        "For roundups, the divisons has to be power of 2 "
    );
    let p = parse("roundup_power2_divisions:1", v("1.12")).unwrap();
    assert_eq!(p.settings.roundup_power2_divisions, [1; 16]);
    assert!(p.warnings.iter().any(|w| w.text.contains("1.12–2.0 quirk")));
    assert!(
        !parse("roundup_power2_divisions:1", v("2.1"))
            .unwrap()
            .warnings
            .iter()
            .any(|w| w.text.contains("quirk"))
    );
    // The list form does not exist before 2.0: the regex parser hands "[64" to stoi.
    assert_eq!(
        err("roundup_power2_divisions:[64:8]", "1.13").message,
        "stoi"
    );
    assert_eq!(
        err("roundup_power2_divisions:4", "1.11").message,
        "Unrecognized CachingAllocator option: roundup_power2_divisions"
    );
}

#[test]
fn max_split_size_floor_per_version() {
    assert_eq!(
        err("max_split_size_mb:20", "2.6").message,
        "CachingAllocator option max_split_size_mb too small, must be > 20"
    );
    assert_eq!(ok("max_split_size_mb:20", "2.10").max_split_size, 20 * MIB);
    assert_eq!(ok("max_split_size_mb:21", "2.6").max_split_size, 21 * MIB);
    assert_eq!(
        err("max_split_size_mb:20", "1.10").message,
        "CachingAllocator option max_split_size_mb too small, must be >= 20"
    );
    assert_eq!(
        err("max_non_split_rounding_mb:20", "2.6").message,
        "CachingAllocator option max_non_split_rounding_mb too small, must be > 20"
    );
    assert_eq!(
        err("max_non_split_rounding_mb:64", "2.5").message,
        "Unrecognized CachingAllocator option: max_non_split_rounding_mb"
    );
    // A negative stoi result wraps to a huge size_t and passes the check.
    let p = parse("max_split_size_mb:-1", v("2.6")).unwrap();
    assert_eq!(p.settings.max_split_size, (u64::MAX / MIB) * MIB);
    assert!(p.warnings.iter().any(|w| w.text.contains("negative")));
    // 2.11+: the floor is large_segment_size_mb.
    assert_eq!(
        err("large_segment_size_mb:64,max_split_size_mb:40", "2.11").message,
        "CachingAllocator option max_split_size_mb too small, must be >= 64"
    );
    let s = ok("max_split_size_mb:64,large_segment_size_mb:64", "2.11");
    assert_eq!(
        (s.large_segment_size, s.max_non_split_rounding_size),
        (64 * MIB, 64 * MIB)
    );
    assert_eq!(
        err("large_segment_size_mb:10", "2.11").message,
        "CachingAllocator option large_segment_size_mb must be > 10 MB"
    );
    assert_eq!(
        err("large_segment_size_mb:64", "2.10").message,
        "Unrecognized key 'large_segment_size_mb' in CUDA allocator config."
    );
}

#[test]
fn garbage_collection_threshold_bounds() {
    for (value, msg_26, msg_210) in [
        (
            "0",
            "garbage_collect_threshold too small, set it 0.0~1.0",
            "garbage_collect_threshold is invalid, set it in (0.0, 1.0)",
        ),
        (
            "-0.5",
            "garbage_collect_threshold too small, set it 0.0~1.0",
            "garbage_collect_threshold is invalid, set it in (0.0, 1.0)",
        ),
        (
            "1.0",
            "garbage_collect_threshold too big, set it 0.0~1.0",
            "garbage_collect_threshold is invalid, set it in (0.0, 1.0)",
        ),
        (
            "nan",
            "garbage_collect_threshold too small, set it 0.0~1.0",
            "garbage_collect_threshold is invalid, set it in (0.0, 1.0)",
        ),
    ] {
        let conf = format!("garbage_collection_threshold:{value}");
        assert_eq!(err(&conf, "2.6").message, msg_26, "{value}");
        assert_eq!(err(&conf, "2.10").message, msg_210, "{value}");
    }
    assert_eq!(
        ok("garbage_collection_threshold:0.999", "1.12").garbage_collection_threshold,
        0.999
    );
    assert_eq!(
        ok("garbage_collection_threshold:1e-3", "2.10").garbage_collection_threshold,
        0.001
    );
    assert_eq!(
        err("garbage_collection_threshold:half", "2.6").message,
        "stod"
    );
}

#[test]
fn booleans_are_case_sensitive() {
    assert!(ok("expandable_segments:True", "2.1").expandable_segments);
    assert!(!ok("expandable_segments:False", "2.6").expandable_segments);
    for bad in ["true", "TRUE", "1", "yes"] {
        let value = format!("expandable_segments:{bad}");
        assert_eq!(
            err(&value, "2.6").message,
            "Expected a single True/False argument for expandable_segments"
        );
        assert_eq!(
            err(&value, "2.10").message,
            format!("Expected 'True' or 'False' at index 2 in ConfigTokenizer but got '{bad}'")
        );
    }
    assert_eq!(
        err("expandable_segments:True", "2.0").message,
        "Unrecognized CachingAllocator option: expandable_segments"
    );
    assert_eq!(
        err("pinned_use_cuda_host_register:", "2.6").message,
        "Error, expecting pinned_use_cuda_host_register value"
    );
    assert_eq!(
        err("expandable_segments:", "2.6").message,
        "Expected a single True/False argument for expandable_segments"
    );
}

#[test]
fn unknown_keys_per_era() {
    assert_eq!(
        err("max_split_size:128", "1.13").message,
        "Unrecognized CachingAllocator option: max_split_size"
    );
    assert_eq!(
        err("Max_split_size_mb:128", "2.6").message,
        "Unrecognized CachingAllocator option: Max_split_size_mb"
    );
    let e = err("expandable_segment:True", "2.12");
    assert_eq!(
        e.message,
        "Unrecognized key 'expandable_segment' in CUDA allocator config."
    );
    assert_eq!(e.exception, Some(PyException::ValueError));
    // The first unknown key wins, after the keys before it were applied.
    assert_eq!(
        err("max_split_size_mb:128,foo:1,bar:2", "2.6").message,
        "Unrecognized CachingAllocator option: foo"
    );
}

#[test]
fn whitespace_per_era() {
    // Era A: whitespace separates options like ','.
    assert_eq!(
        ok(
            "max_split_size_mb:128 garbage_collection_threshold:0.6",
            "1.13"
        )
        .max_split_size,
        128 * MIB
    );
    // ... and an option split from its value by whitespace is silently dropped.
    let p = parse("max_split_size_mb:\t128", v("1.13")).unwrap();
    assert_eq!(p.settings.max_split_size, u64::MAX);
    assert!(
        p.warnings
            .iter()
            .any(|w| w.text.contains("silently ignores"))
    );
    // Era B: only ' ' is dropped; a tab stays in the token.
    assert_eq!(
        ok(
            " max_split_size_mb : 128 , expandable_segments : True ",
            "2.6"
        )
        .max_split_size,
        128 * MIB
    );
    assert_eq!(
        err("expandable_segments:\tTrue", "2.6").message,
        "Expected a single True/False argument for expandable_segments"
    );
    assert_eq!(
        err("max_split_size_mb:128,\nexpandable_segments:True", "2.6").message,
        "Unrecognized CachingAllocator option: \nexpandable_segments"
    );
    // stoi skips leading whitespace of its own.
    assert_eq!(
        ok("max_split_size_mb:\t128", "2.6").max_split_size,
        128 * MIB
    );
    // A space inside a key: dropped by 2.x, a separator for 1.x.
    assert_eq!(
        ok("max_split_ size_mb:128", "2.6").max_split_size,
        128 * MIB
    );
    assert_eq!(
        err("max_split_ size_mb:128", "1.13").message,
        "Unrecognized CachingAllocator option: size_mb"
    );
    // Era C: every isspace character is dropped.
    let s = ok(
        "max_split_size_mb:128,\n\texpandable_segments:\tTrue",
        "2.10",
    );
    assert!(s.expandable_segments);
    assert_eq!(s.max_split_size, 128 * MIB);
}

#[test]
fn tokenizer_quirks_of_2_10() {
    // checkToken's result is ignored: any delimiter works where ':' or ',' is due.
    let p = parse("max_split_size_mb,128:expandable_segments,True", v("2.10")).unwrap();
    assert_eq!(p.settings.max_split_size, 128 * MIB);
    assert!(p.settings.expandable_segments);
    assert!(
        p.warnings
            .iter()
            .any(|w| w.text.contains("expected ':' at token 1 but found ','"))
    );
    assert_eq!(
        err("max_split_size_mb,128", "2.6").message,
        "Error parsing CachingAllocator settings, expected :"
    );
    let e = err("expandable_segments", "2.10");
    assert_eq!(
        (e.message.as_str(), e.origin),
        (
            "Index out of bounds in ConfigTokenizer",
            ErrorOrigin::InternalAssert
        )
    );
    assert_eq!(e.exception, Some(PyException::RuntimeError));
    // An unclosed list: the CUDA parser's skipKey reaches the end first.
    for value in [
        "roundup_power2_divisions:[64:8",
        "roundup_power2_divisions:[64:8,",
    ] {
        assert_eq!(
            err(value, "2.10").message,
            "Expected closing bracket ']' in ConfigTokenizer but reached end of config"
        );
    }
    // A pair without its value: the core list parser runs off the end.
    assert_eq!(
        err("roundup_power2_divisions:[64]", "2.10").message,
        "Index out of bounds in ConfigTokenizer"
    );
    // 2.0–2.9 read past the end of the token list for "[64:8" and accept "[64:8,".
    assert_eq!(
        err("roundup_power2_divisions:[64:8", "2.6").origin,
        ErrorOrigin::ReadsPastEnd
    );
    assert_eq!(err("roundup_power2_divisions:[64:8", "2.6").exception, None);
    assert_eq!(
        table("roundup_power2_divisions:[64:8,", "2.6"),
        [8, 8, 8, 8, 8, 8, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    );
    assert_eq!(
        err("expandable_segments", "2.6").message,
        "Error parsing CachingAllocator settings, expected :"
    );
}

#[test]
fn cuda_malloc_async_warning_per_version() {
    let w = |value: &str, version: &str| -> Vec<String> {
        parse(value, v(version))
            .unwrap()
            .warnings
            .into_iter()
            .filter(|w| w.from_pytorch)
            .map(|w| w.text)
            .collect()
    };
    assert_eq!(
        w("backend:cudaMallocAsync,max_split_size_mb:100", "2.0"),
        [
            "backend:cudaMallocAsync ignores max_split_size_mb, roundup_bypass_threshold_mb,roundup_power2_divisions, and garbage_collect_threshold."
        ]
    );
    assert_eq!(
        w("backend:cudaMallocAsync,expandable_segments:True", "2.6"),
        [
            "backend:cudaMallocAsync ignores max_split_size_mb,roundup_power2_divisions, and garbage_collect_threshold."
        ]
    );
    assert!(w("backend:cudaMallocAsync", "2.6").is_empty());
    // 2.10+: only the keys the CUDA parser owns raise the flag.
    assert!(w("backend:cudaMallocAsync,max_split_size_mb:100", "2.10").is_empty());
    assert_eq!(
        w(
            "backend:cudaMallocAsync,pinned_use_cuda_host_register:True",
            "2.10"
        )
        .len(),
        1
    );
    let p = parse("backend:cudaMallocAsync", v("2.6")).unwrap();
    assert_eq!(
        p.settings.backend,
        allocdoc::evidence::Backend::CudaMallocAsync
    );
    assert!(
        p.warnings
            .iter()
            .any(|w| !w.from_pytorch && w.text.contains("not modelled"))
    );
    assert_eq!(
        err("backend:async", "2.6").message,
        "Unknown allocator backend, options are native and cudaMallocAsync"
    );
    assert_eq!(
        err("backend:native", "1.13").message,
        "Unrecognized CachingAllocator option: backend"
    );
}

#[test]
fn unmodelled_keys_are_reported() {
    let p = parse(
        "pinned_use_cuda_host_register:True,pinned_num_register_threads:8,max_split_size_mb:64",
        v("2.6"),
    )
    .unwrap();
    assert_eq!(
        p.settings.unmodelled_keys,
        [
            "pinned_use_cuda_host_register",
            "pinned_num_register_threads"
        ]
    );
    assert_eq!(p.unmodelled[1].value, "8");
    assert_eq!(p.settings.max_split_size, 64 * MIB);
    assert_eq!(
        err("pinned_num_register_threads:6", "2.6").message,
        "Number of register threads has to be power of 2 "
    );
    assert_eq!(
        err("pinned_num_register_threads:6", "2.10").message,
        "Number of register threads has to be power of 2, got 6"
    );
    assert_eq!(
        err("pinned_reserve_segment_size_mb:0", "2.10").message,
        "Pinned reserve segment size has to be greater than 0"
    );
    assert_eq!(
        err("per_process_memory_fraction:1.5", "2.10").message,
        "per_process_memory_fraction is invalid, set it in [0.0, 1.0]"
    );
    assert_eq!(
        ok("per_process_memory_fraction:0.8", "2.10").per_process_memory_fraction,
        Some(0.8)
    );
}

#[test]
fn parsed_render_keeps_unmodelled_keys() {
    let value = "pinned_use_cuda_host_register: True ,max_split_size_mb:64,expandable_segments_reserve_by_class:[a:1,b:2],pinned_num_register_threads:8";
    let p = parse(value, v("2.15")).unwrap();
    assert_eq!(
        p.render(),
        "max_split_size_mb:64,pinned_use_cuda_host_register:True,expandable_segments_reserve_by_class:[a:1,b:2],pinned_num_register_threads:8"
    );
    assert_eq!(parse(&p.render(), v("2.15")).unwrap(), p);
}

#[test]
fn every_parse_starts_from_defaults() {
    assert_eq!(
        ok("", "2.6"),
        Settings {
            version: v("2.6"),
            ..Settings::default()
        }
    );
    assert_eq!(
        ok("", "1.13"),
        Settings {
            version: v("1.13"),
            ..Settings::default()
        }
    );
    assert_eq!(ok(",", "1.13").version, v("1.13"));
    assert_eq!(
        err(",", "2.6").message,
        "Unrecognized CachingAllocator option: ,"
    );
}

mod properties {
    use super::*;
    use allocdoc::evidence::Backend;
    use proptest::prelude::*;

    const VERSIONS: [(u16, u16); 20] = [
        (1, 10),
        (1, 11),
        (1, 12),
        (1, 13),
        (2, 0),
        (2, 1),
        (2, 2),
        (2, 3),
        (2, 4),
        (2, 5),
        (2, 6),
        (2, 7),
        (2, 8),
        (2, 9),
        (2, 10),
        (2, 11),
        (2, 12),
        (2, 13),
        (2, 14),
        (2, 15),
    ];

    /// Settings that `version` can express, each field drawn independently.
    fn settings() -> impl Strategy<Value = Settings> {
        let table = prop::array::uniform16(prop::sample::select(vec![0u64, 1, 2, 4, 8, 16]));
        (
            prop::sample::select(VERSIONS.to_vec()),
            any::<[bool; 4]>(),
            (0u64..4000, 0u64..4000, 11u64..200, 0u64..5000),
            table,
            (0.0001f64..0.9999, 0.0f64..=1.0),
            prop::option::of(1u64..=16),
        )
            .prop_map(
                |(
                    (major, minor),
                    flags,
                    (split, non_split, large, bypass),
                    mut table,
                    (gc, fraction),
                    scalar,
                )| {
                    let version = TorchVersion::new(major, minor);
                    let at = |ma, mi| version >= TorchVersion::new(ma, mi);
                    let mut s = Settings {
                        version,
                        ..Settings::default()
                    };
                    if at(2, 11) && flags[3] {
                        s.large_segment_size = large * MIB;
                    }
                    s.max_non_split_rounding_size = s.large_segment_size;
                    let floor = if at(2, 10) {
                        s.large_segment_size / MIB
                    } else {
                        21
                    };
                    if flags[0] {
                        s.max_split_size = (floor + split) * MIB;
                    }
                    if at(2, 6) && flags[1] {
                        s.max_non_split_rounding_size = (floor + non_split) * MIB;
                    }
                    if at(1, 12) {
                        s.garbage_collection_threshold = if flags[2] { gc } else { 0.0 };
                        if !at(2, 0) {
                            // 1.x: scalar form only, a power of two.
                            table = [scalar.map_or(0, u64::next_power_of_two); 16];
                        } else if !at(2, 4) && table.contains(&0) {
                            table = [0; 16];
                        }
                        s.roundup_power2_divisions = table;
                    }
                    if version == TorchVersion::new(1, 13) && flags[3] {
                        s.roundup_bypass_threshold = bypass * MIB;
                    }
                    if at(2, 0) && flags[1] && flags[2] {
                        s.backend = Backend::CudaMallocAsync;
                    }
                    s.expandable_segments = at(2, 1) && flags[3];
                    s.release_lock_on_cudamalloc = at(2, 2) && flags[0] && flags[3];
                    if at(2, 10) && flags[2] {
                        s.per_process_memory_fraction = Some(fraction);
                    }
                    s
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn render_then_parse_round_trips(s in settings()) {
            let value = render(&s);
            let parsed = parse(&value, s.version).map_err(|e| TestCaseError::fail(format!("{value}: {e}")))?;
            prop_assert_eq!(parsed.settings, s, "{}", value);
        }

        #[test]
        fn parse_never_panics(value in "[a-z_:,\\[\\]>0-9. \t\n-]{0,40}", idx in 0usize..20) {
            let (major, minor) = VERSIONS[idx];
            let _ = parse(&value, TorchVersion::new(major, minor));
        }

        /// Real key names with random values and delimiters reach every parser branch.
        #[test]
        fn parse_never_panics_on_key_soup(
            parts in prop::collection::vec(prop::sample::select(vec![
                "max_split_size_mb", "roundup_power2_divisions", "garbage_collection_threshold",
                "expandable_segments", "backend", "large_segment_size_mb", "pinned_num_register_threads",
                "expandable_segments_reserve_by_class", "per_process_memory_fraction", "roundup_bypass_threshold_mb",
                ":", ",", "[", "]", ">", " ", "\t", "True", "none", "0", "1", "64", "-3", "0.5", "1e999",
            ]), 0..16),
            idx in 0usize..20,
        ) {
            let (major, minor) = VERSIONS[idx];
            let _ = parse(&parts.concat(), TorchVersion::new(major, minor));
        }
    }
}

mod command {
    use allocdoc::app::Format;
    use allocdoc::app::conf_check::{ConfCheckOptions, run};
    use assert_cmd::Command;

    fn check(conf: &str, version: &str, format: Format) -> (String, i32) {
        let out = run(&ConfCheckOptions {
            conf: conf.into(),
            torch_version: Some(version.into()),
            format,
            ..ConfCheckOptions::default()
        })
        .unwrap();
        (out.stdout, out.exit_code)
    }

    #[test]
    fn invalid_value_quotes_pytorch() {
        let (text, code) = check("max_split_size_mb:20", "2.6", Format::Text);
        assert_eq!(code, 1);
        insta::assert_snapshot!("invalid_max_split_2_6_text", text);
        let (json, _) = check("max_split_size_mb:20", "2.6", Format::Json);
        insta::assert_snapshot!("invalid_max_split_2_6_json", json);
        let (text, code) = check("max_split_size_mb:20", "2.10", Format::Text);
        assert_eq!(code, 0);
        assert!(
            text.contains("│ max_split_size_mb            ┆ 20     ┆ set"),
            "{text}"
        );
    }

    #[test]
    fn list_divisions_in_2_10() {
        let conf = "roundup_power2_divisions:[256:1,512:2,1024:4,>:8],expandable_segments:True,pinned_use_cuda_host_register:True";
        let (text, code) = check(conf, "2.10.0a0", Format::Text);
        assert_eq!(code, 0);
        insta::assert_snapshot!("list_divisions_2_10_text", text);
        let (md, _) = check(conf, "2.10.0a0", Format::Markdown);
        insta::assert_snapshot!("list_divisions_2_10_markdown", md);
    }

    #[test]
    fn scalar_divisions_rounding_table() {
        let (text, code) = check("roundup_power2_divisions:4", "2.6", Format::Text);
        assert_eq!(code, 0);
        insta::assert_snapshot!("scalar_divisions_2_6_text", text);
        let (json, _) = check("roundup_power2_divisions:4", "2.6", Format::Json);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        // §1.5: 84 MiB → 96 MiB, 1200 → 1536 under 4 divisions.
        let rounded = |request: u64| {
            v["rounding"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["request_bytes"] == request)
                .unwrap()["rounded_bytes"]
                .as_u64()
                .unwrap()
        };
        assert_eq!(rounded(88080384), 100663296);
        assert_eq!(rounded(1200), 1536);
        assert_eq!(rounded(1048577), 1310720);
    }

    /// 1.12–2.0: `roundup_power2_divisions:1` leaves sizes above 512 unrounded.
    #[test]
    fn scalar_one_quirk_in_the_rounding_table() {
        let row = |version: &str| {
            let (json, _) = check("roundup_power2_divisions:1", version, Format::Json);
            let v: serde_json::Value = serde_json::from_str(&json).unwrap();
            v["rounding"][2].clone()
        };
        assert_eq!(row("1.12")["request_bytes"], 1200);
        assert_eq!(row("1.12")["rounded_bytes"], 1200);
        assert_eq!(row("2.6")["rounded_bytes"], 1536);
    }

    #[test]
    fn cuda_malloc_async_json() {
        let (json, code) = check(
            "max_split_size_mb:128,backend:cudaMallocAsync",
            "2.4.1+cu121",
            Format::Json,
        );
        assert_eq!(code, 0);
        insta::assert_snapshot!("cuda_malloc_async_2_4_json", json);
    }

    #[test]
    fn exit_codes_from_the_binary() {
        let bin = || Command::cargo_bin("allocdoc").unwrap();
        bin()
            .args(["conf", "check", "expandable_segments:True"])
            .assert()
            .code(0);
        bin()
            .args(["conf", "check", "expandable_segments:true"])
            .assert()
            .code(1);
        bin()
            .args([
                "conf",
                "check",
                "expandable_segments:True",
                "--torch-version",
                "2.0",
            ])
            .assert()
            .code(1);
        bin()
            .args(["conf", "check", "x", "--torch-version", "two"])
            .assert()
            .code(2);
    }
}
