//! Snapshots: the real fixtures load with the figures their README states, the
//! decoder refuses code and survives hostile input, and traced snapshots replay
//! at the recorded addresses.

use allocdoc::Error;
use allocdoc::allocator::CachingAllocator;
use allocdoc::device::sim::SimDevice;
use allocdoc::snapshot;
use allocdoc::snapshot::pickle::{self, DecodeError, Limits, Obj, Value};
use allocdoc::workload::snapshot_trace::{self, Fidelity, SnapshotTrace};
use std::path::Path;

fn fixture(name: &str) -> Vec<u8> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/snapshots")
        .join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The figures fixtures/snapshots/README.md (from the shared README) states for a file.
struct Expected {
    name: &'static str,
    devices: &'static [u32],
    segments: u64,
    reserved: u64,
    allocated: u64,
    blocks: u64,
    /// Entries in each `device_traces` list.
    traces: &'static [usize],
}

#[rustfmt::skip]
const REAL: &[Expected] = &[
    Expected { name: "muduard-layoutediting_memory_snapshot.pkl", devices: &[1], segments: 255, reserved: 3649044480, allocated: 3353639424, blocks: 2140, traces: &[] },
    Expected { name: "muduard-layoutediting_dump_snapshot.pickle", devices: &[0], segments: 368, reserved: 5475663872, allocated: 3848104960, blocks: 2530, traces: &[0, 0] },
    Expected { name: "maphsge4-select_n_snapshot_traced.pickle", devices: &[0], segments: 82, reserved: 2776629248, allocated: 1875182080, blocks: 415, traces: &[4496, 0, 0, 0] },
    Expected { name: "magma27-assignment2-systems_memory_snapshot.pickle", devices: &[0], segments: 216, reserved: 14180941824, allocated: 1377753600, blocks: 455, traces: &[5163] },
    Expected { name: "yiyi-llm-inference_oom_snapshot.pickle", devices: &[0], segments: 176, reserved: 11844714496, allocated: 11840159744, blocks: 463, traces: &[1] },
    Expected { name: "maphsge4-select_n_snapshot_dev1.pickle", devices: &[1], segments: 40, reserved: 5559549952, allocated: 545266688, blocks: 213, traces: &[0, 0, 0, 0] },
    Expected { name: "wedsonlin-assignment2-systems_medium_128_inference_memory_snapshot.pickle", devices: &[0], segments: 98, reserved: 1763704832, allocated: 1703276544, blocks: 230, traces: &[3840] },
];

#[test]
fn every_real_snapshot_loads_with_the_readme_figures() {
    for e in REAL {
        let &Expected {
            name,
            devices,
            segments,
            reserved,
            allocated,
            blocks,
            traces,
        } = e;
        let data = fixture(name);
        let snap = snapshot::load(name, &data).unwrap();
        let lens: Vec<usize> = (0..snap.trace_lists() as u32)
            .map(|d| snap.trace_len(d))
            .collect();
        assert_eq!(lens, traces, "{name}");
        let obs = snapshot::observations(name, &data).unwrap();
        let got: Vec<u32> = obs.iter().map(|o| o.device_index.unwrap()).collect();
        assert_eq!(got, devices, "{name}");
        let o = &obs[0];
        assert_eq!(o.segments, Some(segments), "{name}");
        assert_eq!(o.reserved_bytes, Some(reserved), "{name}");
        assert_eq!(o.allocated_bytes, Some(allocated), "{name}");
        assert_eq!(o.blocks, Some(blocks), "{name}");
        let dev = devices[0] as usize;
        assert_eq!(
            o.trace_events,
            Some(traces.get(dev).copied().unwrap_or(0) as u64),
            "{name}"
        );
        let d = o.detail.as_ref().unwrap();
        assert!(d.segsum.balanced, "{name}");
        assert_eq!(d.segsum.reserved_bytes, reserved, "{name}");
    }
}

#[test]
fn generated_snapshots_read_the_same_under_every_protocol() {
    // Everything but the recorded protocol number must agree.
    let read = |name: &str| {
        let mut obs = snapshot::observations("p", &fixture(name)).unwrap();
        for o in &mut obs {
            o.detail.as_mut().unwrap().protocol = 0;
        }
        obs
    };
    let reference = read("gen-small-p4.pickle");
    // Written by scripts/gen_snapshot.py (see fixtures/snapshots/README.md); figures from
    // Python's own pickle.load of the same file.
    assert_eq!(reference.len(), 2);
    let d0 = &reference[0];
    assert_eq!((d0.segments, d0.blocks), (Some(8), Some(26)));
    assert_eq!(d0.reserved_bytes, Some(1673596928));
    assert_eq!(d0.allocated_bytes, Some(1101008896));
    assert_eq!(d0.active_bytes, Some(1453330432));
    assert_eq!(d0.requested_bytes, Some(1453324558));
    assert_eq!(d0.trace_events, Some(40));
    let d1 = &reference[1];
    assert_eq!(
        (d1.segments, d1.blocks, d1.reserved_bytes),
        (Some(7), Some(34), Some(2510290944))
    );
    for p in [0, 1, 2, 3, 5] {
        let name = format!("gen-small-p{p}.pickle");
        assert_eq!(read(&name), reference, "protocol {p}");
        let decoded = pickle::decode(&fixture(&name)).unwrap().protocol;
        assert_eq!(decoded, if p >= 2 { p } else { 0 });
    }
    let plain = snapshot::observations("plain", &fixture("gen-small-plain.pickle")).unwrap();
    assert_eq!(plain[0].blocks, Some(60));
    assert_eq!(plain[0].reserved_bytes, Some(4183887872));
    assert_eq!(plain[0].allocated_bytes, Some(2495614976));
}

#[test]
fn shared_frames_stay_shared() {
    let data = fixture("gen-small-p4.pickle");
    let snap = snapshot::load("p4", &data).unwrap();
    let with_frames: Vec<_> = snap
        .blocks
        .iter()
        .filter(|b| snap.frames(b.frames).next().is_some())
        .collect();
    let ids: std::collections::HashSet<_> = with_frames.iter().map(|b| b.frames).collect();
    // 10 shared tracebacks in the generator: blocks reuse those list objects.
    assert!(ids.len() <= 10, "{} distinct frame lists", ids.len());
    assert!(with_frames.len() > 40, "{}", with_frames.len());
}

#[test]
fn old_schema_takes_sizes_and_frames_from_history() {
    let data = fixture("yiyi-llm-inference_oom_snapshot.pickle");
    let snap = snapshot::load("yiyi", &data).unwrap();
    let seg = &snap.segments[0];
    assert_eq!(seg.is_expandable, None);
    assert_eq!(seg.segment_pool_id, None);
    // Blocks carry no address in this schema: computed from the segment's.
    assert_eq!(snap.blocks_of(seg)[0].address, seg.address);
    let f: Vec<_> = snap.frames(snap.blocks_of(seg)[0].frames).collect();
    assert_eq!(f[0].name, "allocate");
    assert_eq!(f[0].line, 190);
    let obs = snapshot::observations("yiyi", &data).unwrap();
    let d = obs[0].detail.as_ref().unwrap();
    assert_eq!(d.trace_actions["snapshot"], 1);
    assert_eq!(d.top_sites[0].site, "pytorch_backend.py:190:allocate");
}

#[test]
fn recorded_allocator_settings_are_reported() {
    let data = fixture("magma27-assignment2-systems_memory_snapshot.pickle");
    let obs = snapshot::observations("m", &data).unwrap();
    let s = obs[0].allocator_settings.as_ref().unwrap();
    assert_eq!(s["PYTORCH_CUDA_ALLOC_CONF"], "");
    assert_eq!(s["max_split_size"], -1);
    assert_eq!(s["expandable_segments"], false);
    assert_eq!(s["roundup_power2_divisions"]["32768"], 0);
    assert!(
        obs[0]
            .detail
            .as_ref()
            .unwrap()
            .allocator_settings_note
            .is_none()
    );
}

// ---- safety ----------------------------------------------------------------

/// `os.system("touch <marker>")` as protocol 2 writes it: GLOBAL, args tuple, REDUCE.
fn os_system_pickle(marker: &str) -> Vec<u8> {
    let mut p = b"\x80\x02cos\nsystem\nq\x00X".to_vec();
    let cmd = format!("touch {marker}");
    p.extend_from_slice(&(cmd.len() as u32).to_le_bytes());
    p.extend_from_slice(cmd.as_bytes());
    p.extend_from_slice(b"q\x01\x85q\x02Rq\x03.");
    p
}

#[test]
fn a_pickle_that_calls_os_system_is_refused_and_nothing_runs() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let data = os_system_pickle(&marker.display().to_string());
    let e = pickle::decode(&data).unwrap_err();
    assert_eq!(
        e,
        DecodeError::Code {
            offset: 2,
            opcode: "GLOBAL",
            callable: "os system".into()
        }
    );
    let err = snapshot::observations("evil.pickle", &data).unwrap_err();
    assert!(matches!(err, Error::Input(_)));
    assert_eq!(err.exit_code(), 2);
    let msg = err.to_string();
    assert!(
        msg.contains("evil.pickle") && msg.contains("byte 2") && msg.contains("GLOBAL"),
        "{msg}"
    );
    assert!(msg.contains("os system"), "{msg}");
    assert!(!marker.exists());

    // Protocol 4 spells it STACK_GLOBAL; REDUCE of a non-global is refused too.
    let p4 = b"\x80\x04\x8c\x02os\x94\x8c\x06system\x94\x93\x94.";
    assert_eq!(
        pickle::decode(p4).unwrap_err(),
        DecodeError::Code {
            offset: 16,
            opcode: "STACK_GLOBAL",
            callable: "os system".into()
        }
    );
    let reduce = b"\x80\x02X\x04\x00\x00\x00evil)R.";
    let e = pickle::decode(reduce).unwrap_err();
    assert_eq!(
        e,
        DecodeError::Code {
            offset: 12,
            opcode: "REDUCE",
            callable: "evil".into()
        }
    );
    for (bytes, opcode) in [
        (&b"\x80\x02]}b."[..], "BUILD"),
        (&b"(ios\nsystem\n."[..], "INST"),
        (&b"\x80\x02(X\x01\x00\x00\x00fo."[..], "OBJ"),
        (&b"\x80\x02X\x01\x00\x00\x00f)\x81."[..], "NEWOBJ"),
        (&b"\x80\x04X\x01\x00\x00\x00f)}\x92."[..], "NEWOBJ_EX"),
        (&b"Pid\n."[..], "PERSID"),
        (&b"\x80\x02\x82\x01."[..], "EXT1"),
    ] {
        match pickle::decode(bytes) {
            Err(DecodeError::Code { opcode: o, .. }) => assert_eq!(o, opcode),
            other => panic!("{opcode}: {other:?}"),
        }
    }
}

#[test]
fn every_truncation_of_a_real_snapshot_is_an_error_with_an_offset() {
    let data = fixture("maphsge4-select_n_snapshot_dev1.pickle");
    for n in 0..data.len() {
        let e = pickle::decode(&data[..n]).expect_err("a prefix cannot decode");
        let at = e.offset();
        assert!(at <= n, "prefix {n}: offset {at}");
        assert!(snapshot::observations("cut", &data[..n]).is_err());
    }
    assert!(pickle::decode(&data).is_ok());
}

#[test]
fn unknown_protocols_and_opcodes_are_refused() {
    assert_eq!(
        pickle::decode(b"\x80\x06N.").unwrap_err(),
        DecodeError::Protocol {
            offset: 0,
            protocol: 6
        }
    );
    assert_eq!(
        pickle::decode(b"\x80\x04\xff").unwrap_err(),
        DecodeError::UnknownOpcode {
            offset: 2,
            opcode: 0xff
        }
    );
    assert!(
        snapshot::observations("x", b"\x80\x04N.").is_err(),
        "None is not a snapshot"
    );
}

#[test]
fn two_hundred_thousand_nested_marks() {
    let depth = 200_000;
    let mut data = vec![b'('; depth];
    data.extend(std::iter::repeat_n(b'l', depth));
    data.push(b'.');
    // The default limit refuses it at the first MARK past the limit.
    let e = pickle::decode(&data).unwrap_err();
    let limit = Limits::default().max_marks;
    assert_eq!(
        e,
        DecodeError::Limit {
            offset: limit,
            what: "MARK nesting",
            limit: limit as u64
        }
    );
    // With the limit raised, it decodes iteratively into 200 000 nested lists,
    // and walking it is iterative too.
    let p = pickle::decode_with(
        &data,
        Limits {
            max_marks: 1 << 20,
            ..Limits::default()
        },
    )
    .unwrap();
    assert_eq!(p.reachable_objects(), depth);
    assert!(snapshot::observations("deep", &data).is_err());
}

#[test]
fn huge_declared_lengths_are_checked_before_anything_is_allocated() {
    let mut d = b"\x80\x04\x8d".to_vec(); // BINUNICODE8 of 2^60 bytes
    d.extend_from_slice(&(1u64 << 60).to_le_bytes());
    d.extend_from_slice(b"abc.");
    assert_eq!(
        pickle::decode(&d).unwrap_err(),
        DecodeError::Truncated {
            offset: 2,
            what: "BINUNICODE8"
        }
    );
    for (op, name) in [(0x8eu8, "BINBYTES8"), (0x96, "BYTEARRAY8"), (0x95, "FRAME")] {
        let mut d = vec![0x80, 5, op];
        d.extend_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(
            pickle::decode(&d).unwrap_err(),
            DecodeError::Truncated {
                offset: 2,
                what: name
            }
        );
    }
    // LONG4 and BINUNICODE with 2^31-1 / 2^32-1 bytes declared.
    assert!(matches!(
        pickle::decode(b"\x80\x02\x8b\xff\xff\xff\x7f\x00.").unwrap_err(),
        DecodeError::Truncated { offset: 2, .. }
    ));
    assert!(matches!(
        pickle::decode(b"\x80\x02X\xff\xff\xff\xff.").unwrap_err(),
        DecodeError::Truncated { offset: 2, .. }
    ));
}

#[test]
fn memo_bombs_stay_bounded() {
    // A GET of an index never stored.
    let e = pickle::decode(b"\x80\x02j\xff\xff\xff\xff.").unwrap_err();
    assert!(
        matches!(
            e,
            DecodeError::Malformed {
                offset: 2,
                opcode: "LONG_BINGET",
                ..
            }
        ),
        "{e}"
    );
    // A PUT at index 2^32-1 does not size a 64 GiB memo, and the GET finds it.
    let p = pickle::decode(b"\x80\x02Nr\xff\xff\xff\xff0j\xff\xff\xff\xff.").unwrap();
    assert_eq!(p.value(p.root), Value::None);
    // A million DUPs: fine within the default limits, refused under a small one.
    let mut d = b"\x80\x02]".to_vec();
    d.extend(std::iter::repeat_n(b'2', 1_000_000));
    d.push(b'.');
    assert!(pickle::decode(&d).is_ok());
    let small = Limits {
        max_values: 10_000,
        ..Limits::default()
    };
    assert!(matches!(
        pickle::decode_with(&d, small).unwrap_err(),
        DecodeError::Limit {
            what: "number of values",
            ..
        }
    ));
    // Doubling a shared list 60 times: 2^60 leaves as a tree, 61 objects as a DAG.
    let mut d = b"\x80\x02]".to_vec();
    for _ in 0..60 {
        d.extend_from_slice(b"2\x86"); // DUP, TUPLE2
    }
    d.push(b'.');
    let p = pickle::decode(&d).unwrap();
    assert_eq!(p.reachable_objects(), 61);
}

/// Found by the `decode` fuzz target: shared lists written out as JSON at each
/// use (the recorded `allocator_settings` path) grew to gigabytes from 10 kB.
#[test]
fn json_of_a_shared_list_bomb_stays_bounded() {
    // a = ["x" * 1000]; b = [a] * 200; c = [b] * 200; d = [c] * 200: 8 TB as a tree.
    let mut d = b"\x80\x04]\x94(X\xe8\x03\x00\x00".to_vec();
    d.extend(std::iter::repeat_n(b'x', 1000));
    d.extend_from_slice(b"\x94e");
    for memo in [0u8, 2, 3] {
        d.extend_from_slice(b"]\x94(");
        for _ in 0..200 {
            d.extend_from_slice(&[b'h', memo]);
        }
        d.push(b'e');
    }
    d.push(b'.');
    let p = pickle::decode(&d).unwrap();
    let j = p.to_json(p.root, 8);
    let text = serde_json::to_string(&j).unwrap();
    assert!(text.len() < 4 << 20, "{} bytes", text.len());
    assert_eq!(j[0][0][0][0].as_str().map(str::len), Some(1000));
    assert_eq!(j[199], serde_json::Value::Null, "past the budget");
}

#[test]
fn ints_up_to_u64_max_and_beyond() {
    // MAX_UINT64 as torch writes it: LONG1 with 9 bytes (pytorch#115234).
    let p = pickle::decode(b"\x80\x02\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00.").unwrap();
    assert_eq!(p.value(p.root), Value::UInt(u64::MAX));
    assert_eq!(p.u64(p.root), Some(u64::MAX));
    let p = pickle::decode(b"\x80\x02\x8a\x01\xff.").unwrap();
    assert_eq!(p.value(p.root), Value::Int(-1));
    // 2^70 stays a big int, not a wrong u64.
    let p = pickle::decode(b"\x80\x02\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x40.").unwrap();
    assert!(matches!(p.obj(p.root), Some(Obj::BigInt(_))));
    assert_eq!(p.u64(p.root), None);
    // Protocol 0 text ints; inline ints end at 2^60, larger ones are boxed.
    for (text, value) in [
        (&b"L18446744073709551615L\n."[..], Value::UInt(u64::MAX)),
        (b"I-7\n.", Value::Int(-7)),
        (b"I1152921504606846976\n.", Value::Int(1 << 60)),
        (b"I-1152921504606846977\n.", Value::Int(-(1 << 60) - 1)),
        (b"I1152921504606846975\n.", Value::Int((1 << 60) - 1)),
    ] {
        let p = pickle::decode(text).unwrap();
        assert_eq!(p.value(p.root), value);
    }
}

// ---- replay fidelity -------------------------------------------------------

fn fidelity(name: &str) -> Fidelity {
    let data = fixture(name);
    let snap = snapshot::load(name, &data).unwrap();
    let settings = snapshot_trace::recorded_settings(&snap);
    let device = snapshot_trace::traced_device(&snap).unwrap();
    let trace = SnapshotTrace::new(&snap, device, &settings).unwrap();
    let sim = SimDevice::new(1 << 50).with_recorded_addresses(trace.recorded_addresses(true));
    let mut alloc = CachingAllocator::new(settings, sim);
    let run = trace.run(&mut alloc, true).unwrap();
    assert_eq!(run.oom, None, "{name}");
    alloc.check_invariants().unwrap();
    run.fidelity.unwrap()
}

#[test]
fn traced_snapshots_replay_at_the_recorded_addresses() {
    for (name, allocs) in [
        ("maphsge4-select_n_snapshot_traced.pickle", 1497),
        ("magma27-assignment2-systems_memory_snapshot.pickle", 1721),
        (
            "wedsonlin-assignment2-systems_medium_128_inference_memory_snapshot.pickle",
            1280,
        ),
    ] {
        let f = fidelity(name);
        assert_eq!(f.alloc_events, allocs, "{name}");
        assert_eq!(f.address_matches, allocs, "{name}: {f:#?}");
        assert_eq!(f.first_divergence, None, "{name}");
        assert_eq!(f.entries_equal, f.entries_compared, "{name}");
        assert_eq!(f.segment_matches, f.segment_events, "{name}");
        assert!(f.final_segments_equal, "{name}: {:?}", f.final_difference);
    }
}

#[test]
fn another_config_diverges_and_the_report_says_where() {
    let name = "maphsge4-select_n_snapshot_traced.pickle";
    let data = fixture(name);
    let snap = snapshot::load(name, &data).unwrap();
    let recorded = snapshot_trace::recorded_settings(&snap);
    let trace = SnapshotTrace::new(&snap, 0, &recorded).unwrap();
    // Sizes rounded up to half powers of two (roundup_power2_divisions:2): other sizes,
    // other addresses.
    let mut settings = recorded.clone();
    settings.roundup_power2_divisions = [2; 16];
    let sim = SimDevice::new(1 << 50).with_recorded_addresses(trace.recorded_addresses(true));
    let mut alloc = CachingAllocator::new(settings, sim);
    let f = trace.run(&mut alloc, true).unwrap().fidelity.unwrap();
    assert_eq!(f.alloc_events, 1497);
    assert_eq!(f.address_matches, 1275);
    let d = f.first_divergence.unwrap();
    // The third trace entry is the first alloc placed elsewhere; the report
    // names it with its recorded stack.
    assert_eq!((d.event_index, d.action, d.size), (2, "alloc", 16));
    assert_eq!(d.recorded_addr, 140650101506560);
    assert_eq!(
        d.frames[0],
        "modeling_utils.py:3490:warn_if_padding_and_no_attention_mask"
    );
    assert!(!f.final_segments_equal);
}

#[test]
fn replay_accepts_a_snapshot_and_reports_fidelity() {
    use allocdoc::app::replay::{ReplayOptions, execute};
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/snapshots/wedsonlin-assignment2-systems_medium_128_inference_memory_snapshot.pickle");
    let opts = ReplayOptions {
        trace: path.display().to_string(),
        confs: vec![String::new(), "expandable_segments:True".into()],
        device: "sim".into(),
        fidelity: true,
        ..ReplayOptions::default()
    };
    let r = execute(&opts).unwrap();
    assert_eq!(r.events, 3840);
    assert_eq!(r.runs.len(), 2);
    assert!(r.runs.iter().all(|run| run.result.figures.oom.is_none()));
    let f = r.fidelity.as_ref().unwrap();
    assert_eq!((f.alloc_events, f.address_matches), (1280, 1280));
    let json: serde_json::Value =
        serde_json::from_str(&allocdoc::report::replay::json(&r)).unwrap();
    assert_eq!(json["fidelity"]["alloc_events"], 1280);
    assert_eq!(json["fidelity"]["address_matches"], 1280);
    assert_eq!(
        json["fidelity"]["first_divergence"],
        serde_json::Value::Null
    );
}

#[test]
fn a_recorded_conf_that_did_not_take_effect_is_noted() {
    let obs = snapshot::observations("g", &fixture("gen-ignored-conf.pickle")).unwrap();
    let note = obs[0]
        .detail
        .as_ref()
        .unwrap()
        .allocator_settings_note
        .clone()
        .unwrap();
    assert_eq!(
        note,
        "PYTORCH_CUDA_ALLOC_CONF=\"expandable_segments:True,max_split_size_mb:256\" asks for \
         \"max_split_size_mb:256,expandable_segments:True\" but the allocator ran with the defaults"
    );
}

#[test]
fn replay_text_of_a_snapshot_with_fidelity() {
    use allocdoc::app::replay::{ReplayOptions, execute};
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/snapshots/maphsge4-select_n_snapshot_traced.pickle");
    let opts = ReplayOptions {
        trace: path.display().to_string(),
        confs: vec![String::new(), "roundup_power2_divisions:2".into()],
        capacity: Some(3 << 30),
        device: "sim".into(),
        fidelity: true,
        ..ReplayOptions::default()
    };
    let mut r = execute(&opts).unwrap();
    r.input = "maphsge4-select_n_snapshot_traced.pickle".into();
    insta::assert_snapshot!(allocdoc::report::replay::text(&r));
}

#[test]
fn snapshot_evidence_as_json() {
    let obs = snapshot::observations(
        "magma27.pickle",
        &fixture("magma27-assignment2-systems_memory_snapshot.pickle"),
    )
    .unwrap();
    insta::assert_json_snapshot!(obs);
}

// ---- expandable segments ---------------------------------------------------

/// What a recording with expandable segments looked like after some event.
struct Moment {
    /// Trace entries recorded so far.
    entries: usize,
    /// (address, size, state) of every block of every segment.
    blocks: Vec<(u64, u64, &'static str)>,
    segments: usize,
    stats: [i64; 5],
}

fn moment(a: &CachingAllocator<SimDevice>, entries: usize) -> Moment {
    let segs = a.segments();
    let s = a.stats();
    Moment {
        entries,
        blocks: segs
            .iter()
            .flat_map(|g| {
                g.blocks
                    .iter()
                    .map(|b| (b.address, b.size, b.state.as_str()))
            })
            .collect(),
        segments: segs.len(),
        stats: [
            s.reserved_bytes.all().current,
            s.allocated_bytes.all().current,
            s.requested_bytes.all().current,
            s.allocation.all().current,
            s.segment.all().current,
        ],
    }
}

fn expandable_settings() -> allocdoc::conf::Settings {
    allocdoc::conf::Settings {
        expandable_segments: true,
        ..allocdoc::conf::Settings::default()
    }
}

/// A workload of small and large requests, frees and an `empty_cache()` every
/// 150 events, recorded with expandable segments on a 4 GiB card: the final
/// segments, every trace entry, and the state at the start and after every
/// 25th event but the last.
fn expandable_recording() -> (
    Vec<allocdoc::allocator::SegmentInfo>,
    Vec<allocdoc::allocator::TraceEntry>,
    Vec<Moment>,
) {
    let mut rng = crate::xorshift::Rng(0x5eed_e8a0_d4b1);
    let mut a = CachingAllocator::new(expandable_settings(), SimDevice::new(4 << 30));
    a.record_history();
    let mut live: Vec<u64> = Vec::new();
    let mut trace = Vec::new();
    let mut moments = vec![moment(&a, 0)];
    for event in 1..=600u64 {
        if event % 150 == 0 {
            a.empty_cache();
        } else if live.len() < 4 || rng.next() % 8 < 5 {
            let size = match rng.next() % 4 {
                0 => 1 + rng.next() % (1 << 20),
                1 | 2 => (1 << 20) + rng.next() % (12 << 20),
                _ => (12 << 20) + rng.next() % (90 << 20),
            };
            live.push(a.malloc(size, 0).unwrap());
        } else {
            let i = (rng.next() % live.len() as u64) as usize;
            a.free(live.swap_remove(i)).unwrap();
        }
        trace.extend(a.take_trace());
        if event % 25 == 0 && event < 600 {
            moments.push(moment(&a, trace.len()));
        }
    }
    (a.segments(), trace, moments)
}

/// The recording as a snapshot whose ring buffer kept the entries from `from` on.
fn expandable_snapshot(
    segments: &[allocdoc::allocator::SegmentInfo],
    trace: &[allocdoc::allocator::TraceEntry],
    from: usize,
) -> Vec<u8> {
    // No recorded settings: replay must infer expandable segments from the segments.
    let snap = snapshot::writer::Snapshot::from_allocator(segments, &trace[from..], None);
    snapshot::writer::to_bytes(&snap)
}

#[test]
fn emitted_snapshots_record_the_settings_they_ran_under() {
    let conf = "max_split_size_mb:64,roundup_power2_divisions:4";
    let settings = allocdoc::conf::parse(conf, allocdoc::conf::TorchVersion::DEFAULT)
        .unwrap()
        .settings;
    let mut rng = crate::xorshift::Rng(0x0dd_5eed);
    let mut a = CachingAllocator::new(settings.clone(), SimDevice::new(8 << 30));
    a.record_history();
    let mut live: Vec<u64> = Vec::new();
    for _ in 0..400 {
        if live.len() < 4 || (live.len() < 40 && rng.next().is_multiple_of(2)) {
            // Across the 64 MiB split limit: oversize requests take whole free
            // blocks up to 20 MiB larger, and a cut leaves some live at the start
            // with an unrecorded tail (before the tail rule: 139 of 140 allocs).
            let size = (1 << 20) + rng.next() % (160 << 20);
            live.push(a.malloc(size, 0).unwrap());
        } else {
            let i = (rng.next() % live.len() as u64) as usize;
            a.free(live.swap_remove(i)).unwrap();
        }
    }
    let trace = a.take_trace();
    let recorded = snapshot::writer::RecordedSettings {
        conf: conf.into(),
        settings: settings.clone(),
    };
    let cut = |from: usize| {
        let written = snapshot::writer::Snapshot::from_allocator(
            &a.segments(),
            &trace[from..],
            Some(recorded.clone()),
        );
        snapshot::writer::to_bytes(&written)
    };
    for from in (1..8).map(|k| trace.len() * k / 8) {
        let bytes = cut(from);
        let snap = snapshot::load("settings", &bytes).unwrap();
        assert_replays_exactly(&snap, from);
    }
    let from = trace.len() / 3;
    let bytes = cut(from);
    let snap = snapshot::load("settings", &bytes).unwrap();
    let read = snapshot_trace::recorded_settings(&snap);
    assert_eq!(read.max_split_size, 64 << 20);
    assert_eq!(read.roundup_power2_divisions, [4; 16]);
    assert!(!read.expandable_segments);

    // The settings matter: replayed under PyTorch's defaults, placements differ.
    let st = SnapshotTrace::new(&snap, 0, &read).unwrap();
    let sim = SimDevice::new(8 << 30).with_recorded_addresses(st.recorded_addresses(true));
    let mut d = CachingAllocator::new(allocdoc::conf::Settings::default(), sim);
    let f = st.run(&mut d, true).unwrap().fidelity.unwrap();
    assert!(f.entries_equal < f.entries_compared, "{f:#?}");
}

#[test]
fn expandable_start_states_are_rebuilt_exactly_and_replay_at_the_recorded_addresses() {
    let (segments, trace, moments) = expandable_recording();
    let maps = trace
        .iter()
        .filter(|e| e.action == allocdoc::allocator::TraceAction::SegmentMap)
        .count();
    let unmaps = trace
        .iter()
        .filter(|e| e.action == allocdoc::allocator::TraceAction::SegmentUnmap)
        .count();
    assert!(maps > 20 && unmaps > 5, "{maps} maps, {unmaps} unmaps");
    let mut seeded_nonempty = 0;
    for m in &moments {
        let bytes = expandable_snapshot(&segments, &trace, m.entries);
        let snap = snapshot::load("expandable", &bytes).unwrap();
        let settings = snapshot_trace::recorded_settings(&snap);
        assert!(settings.expandable_segments, "inferred from the segments");
        let st = SnapshotTrace::new(&snap, 0, &settings).unwrap();
        assert_eq!(st.start.unplaced, 0);
        // The seeded state is the recording's state at that moment.
        let sim = SimDevice::new(4 << 30).with_recorded_addresses(st.recorded_addresses(true));
        let mut a = CachingAllocator::new(settings.clone(), sim);
        let options = allocdoc::workload::ReplayOptions {
            stop_after: Some(0),
            ..Default::default()
        };
        st.run_with(&mut a, true, options).unwrap();
        a.check_invariants().unwrap();
        let seeded = moment(&a, m.entries);
        assert_eq!(seeded.stats, m.stats, "after {} entries", m.entries);
        assert_eq!(seeded.segments, m.segments, "after {} entries", m.entries);
        assert_eq!(seeded.blocks, m.blocks, "after {} entries", m.entries);
        seeded_nonempty += usize::from(m.stats[0] > 0);
        assert_replays_exactly(&snap, m.entries);
    }
    assert_eq!(seeded_nonempty, moments.len() - 1);
}

/// Replayed forward from its start state, the snapshot's trace matches the recording.
fn assert_replays_exactly(snap: &snapshot::Snapshot, from: usize) -> Fidelity {
    let settings = snapshot_trace::recorded_settings(snap);
    let st = SnapshotTrace::new(snap, 0, &settings).unwrap();
    let sim = SimDevice::new(4 << 30).with_recorded_addresses(st.recorded_addresses(true));
    let mut a = CachingAllocator::new(settings, sim);
    let run = st.run(&mut a, true).unwrap();
    a.check_invariants().unwrap();
    let f = run.fidelity.unwrap();
    assert_eq!(f.address_matches, f.alloc_events, "from {from}: {f:#?}");
    assert_eq!(f.entries_equal, f.entries_compared, "from {from}: {f:#?}");
    assert_eq!(f.segment_matches, f.segment_events, "from {from}");
    assert!(
        f.final_segments_equal,
        "from {from}: {:?}",
        f.final_difference
    );
    f
}

#[test]
fn expandable_traces_cut_anywhere_replay_at_the_recorded_addresses() {
    let (segments, trace, _) = expandable_recording();
    assert_eq!(trace.len(), 898);
    // Cuts between a segment_map and its alloc, inside empty_cache()'s unmaps, …
    for from in (0..trace.len()).step_by(7) {
        let bytes = expandable_snapshot(&segments, &trace, from);
        let snap = snapshot::load("expandable", &bytes).unwrap();
        assert_replays_exactly(&snap, from);
    }
    let bytes = expandable_snapshot(&segments, &trace, 0);
    let whole = snapshot::load("whole", &bytes).unwrap();
    let f = assert_replays_exactly(&whole, 0);
    assert_eq!(
        (f.alloc_events, f.segment_events, f.entries_compared),
        (378, 84, 898)
    );
}

#[test]
fn a_mid_run_expandable_snapshot_seeds_the_recorded_state_and_replays_exactly() {
    // The same recording whole and cut after 248 of its 620 entries
    // (fixtures/snapshots/README.md).
    let full_bytes = fixture("gen-expandable-full.pickle");
    let full = snapshot::load("full", &full_bytes).unwrap();
    let mid_bytes = fixture("gen-expandable-midrun.pickle");
    let mid = snapshot::load("mid", &mid_bytes).unwrap();
    let settings = snapshot_trace::recorded_settings(&mid);
    assert!(settings.expandable_segments);
    let state_after = |snap: &snapshot::Snapshot, stop_after: u64| {
        let st = SnapshotTrace::new(snap, 0, &settings).unwrap();
        let sim = SimDevice::new(4 << 30).with_recorded_addresses(st.recorded_addresses(true));
        let mut a = CachingAllocator::new(settings.clone(), sim);
        let options = allocdoc::workload::ReplayOptions {
            stop_after: Some(stop_after),
            ..Default::default()
        };
        st.run_with(&mut a, true, options).unwrap();
        a.check_invariants().unwrap();
        a
    };
    // Seeded from the cut snapshot = the whole recording replayed up to the cut.
    let seeded = state_after(&mid, 0);
    let recorded = state_after(&full, 248);
    let figures = |a: &CachingAllocator<SimDevice>| {
        let s = a.stats();
        (
            s.reserved_bytes.all().current,
            s.allocated_bytes.all().current,
            s.allocation.all().current,
            s.segment.all().current,
            a.segments().len(),
        )
    };
    assert_eq!(figures(&seeded), (908_066_816, 512_443_904, 33, 0, 4));
    assert_eq!(figures(&seeded), figures(&recorded));
    // Every block at its address, size and state (a free block's stale
    // requested size is not in the recording).
    assert_eq!(moment(&seeded, 0).blocks, moment(&recorded, 0).blocks);

    // The final state: the snapshot's 9 mapped ranges.
    let st = SnapshotTrace::new(&mid, 0, &settings).unwrap();
    assert_eq!((st.start.reservations.len(), st.start.live_blocks), (4, 33));
    let end = state_after(&mid, u64::MAX);
    let reserved: u64 = mid.segments.iter().map(|s| s.total_size).sum();
    let allocated: u64 = mid.segments.iter().map(|s| s.allocated_size).sum();
    assert_eq!(
        figures(&end),
        (reserved as i64, allocated as i64, figures(&end).2, 0, 9)
    );
    assert_eq!(reserved, 1_421_869_056);
}

#[test]
fn replay_fidelity_of_the_mid_run_expandable_fixtures() {
    use allocdoc::app::replay::{ReplayOptions, execute};
    // (file, entries, allocs, segment events, start segments, live blocks at the start)
    for (name, entries, allocs, segment_events, segments, live) in [
        ("gen-expandable-midrun.pickle", 372, 136, 38, 4, 33),
        // cudaMalloc'd start segments beside expandable ones.
        (
            "gen-expandable-maphsge4-midrun.pickle",
            2497,
            825,
            4,
            71,
            409,
        ),
    ] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/snapshots")
            .join(name);
        let opts = ReplayOptions {
            trace: path.display().to_string(),
            device: "sim".into(),
            fidelity: true,
            ..ReplayOptions::default()
        };
        let r = execute(&opts).unwrap();
        assert_eq!(r.events, entries);
        let f = r.fidelity.unwrap();
        assert_eq!(
            (f.alloc_events, f.address_matches),
            (allocs, allocs),
            "{name}"
        );
        assert_eq!(
            (f.entries_compared, f.entries_equal),
            (entries, entries),
            "{name}"
        );
        assert_eq!(
            (f.segment_events, f.segment_matches),
            (segment_events, segment_events),
            "{name}"
        );
        assert_eq!(
            (f.start_segments, f.live_at_start_blocks),
            (segments, live),
            "{name}"
        );
        assert!(f.final_segments_equal, "{name}: {:?}", f.final_difference);
        assert_eq!(
            r.notes[0],
            format!(
                "note: {}: device 0, {segments} segments and {live} live blocks seeded at the start of the trace",
                path.display()
            )
        );
    }
}

// ---- input detection -------------------------------------------------------

#[test]
fn protocol_0_and_1_pickles_are_detected_and_parsed_like_protocol_2() {
    use allocdoc::app::Format;
    use allocdoc::app::parse::{ParseOptions, run};
    let parse = |name: &str| {
        let out = run(&ParseOptions {
            inputs: vec![format!("fixtures/snapshots/{name}")],
            common: allocdoc::app::Common {
                format: Format::Json,
                ..Default::default()
            },
            ..Default::default()
        })
        .unwrap();
        assert_eq!(out.exit_code, 0, "{name}");
        let json: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        json["observations"].clone()
    };
    for name in ["gen-small-p0.pickle", "gen-small-p1.pickle"] {
        let data = fixture(name);
        assert!(snapshot::is_pickle(&data), "{name}");
        assert_eq!(
            allocdoc::ingest::detect(&data),
            allocdoc::ingest::InputKind::Pickle
        );
        let obs = parse(name);
        assert_eq!(obs.as_array().unwrap().len(), 2, "two devices");
        assert_eq!(obs[0]["kind"], "snapshot");
        // Without a PROTO opcode the decoder reports protocol 0.
        assert_eq!(obs[0]["detail"]["protocol"], 0);
        // Same figures as the protocol-2 file of the same snapshot (the input
        // name and protocol aside).
        let mut p2 = parse("gen-small-p2.pickle");
        let mut obs = obs;
        for o in [&mut p2, &mut obs] {
            for d in o.as_array_mut().unwrap() {
                d.as_object_mut().unwrap().remove("input");
                d["detail"].as_object_mut().unwrap().remove("protocol");
            }
        }
        assert_eq!(obs, p2, "{name}");
    }
}

#[test]
fn text_logs_starting_like_a_pickle_stay_text() {
    use allocdoc::ingest::{InputKind, detect};
    let oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.22 GiB. GPU 0 has a \
               total capacity of 15.69 GiB of which 3.71 GiB is free. Including non-PyTorch memory, \
               this process has 11.14 GiB memory in use. Of the allocated memory 10.14 GiB is \
               allocated by PyTorch, and 771.43 MiB is reserved by PyTorch but unallocated.\n";
    let dir = tempfile::tempdir().unwrap();
    for (i, first) in [
        "(lora) user@host:~$ python train.py\n",
        "(dp0 is not a pickle\n",
        "(venv) $ torchrun train.py\n",
        "]q: the job was preempted\n",
        "](step 12) loss 0.31\n",
        "}r ended\n",
    ]
    .into_iter()
    .enumerate()
    {
        let text = format!("{first}{oom}");
        assert!(!snapshot::is_pickle(text.as_bytes()), "{first:?}");
        assert_eq!(detect(text.as_bytes()), InputKind::Text, "{first:?}");
        let path = dir.path().join(format!("log{i}.txt"));
        std::fs::write(&path, &text).unwrap();
        let ev = allocdoc::ingest::load(&[path.display().to_string()]).unwrap();
        assert_eq!(ev.observations.len(), 1, "{first:?}");
        assert_eq!(ev.observations[0].kind, allocdoc::evidence::Kind::Oom);
    }
}

// ---- OOMs a snapshot records -------------------------------------------------

fn diagnose_json(inputs: &[&str]) -> serde_json::Value {
    use allocdoc::app::Format;
    use allocdoc::app::diagnose::{DiagnoseOptions, run};
    let out = run(&DiagnoseOptions {
        inputs: inputs.iter().map(|s| s.to_string()).collect(),
        common: allocdoc::app::Common {
            format: Format::Json,
            ..Default::default()
        },
        ..Default::default()
    })
    .unwrap();
    serde_json::from_str(&out.stdout).unwrap()
}

#[test]
fn an_oom_in_the_trace_of_the_second_of_three_devices_is_the_verdict() {
    // scripts/gen_multidevice_oom_snapshot.py: cuda:1's trace ends in an oom
    // entry (2529 pages of 2 MiB asked, 95 MiB free on the device, 78.42 GiB
    // reserved, 110 MiB of it free); cuda:0 and cuda:2 end normally, and
    // cuda:2 is the last observation (what the fallback used to diagnose).
    const MIB: u64 = 1 << 20;
    let d = diagnose_json(&["fixtures/snapshots/gen-multidevice-oom-dev1.pickle"]);
    assert_eq!(d["cause"], "capacity", "{d:#}");
    assert_eq!(
        d["verdict"].as_str().unwrap(),
        "capacity: cuda:1 ran out of memory (entry 20 of its trace): the 4.94 GiB request found \
         95.00 MiB free on the device and 110.00 MiB cached unused, 205.00 MiB together, less \
         than the 4.94 GiB request, while live tensors held 78.31 GiB of the 78.42 GiB PyTorch reserved. \
         The card is full; no allocator setting frees enough."
    );
    assert_eq!(d["fills"]["device_index"], 1);
    assert_eq!(d["fills"]["moment"]["moment"], "oom");
    assert_eq!(
        d["fills"]["must_go"]["shortfall_bytes"],
        2529 * 2 * MIB - 95 * MIB - 110 * MIB
    );
    assert_eq!(d["recommendation"], serde_json::Value::Null);
}

#[test]
fn every_device_whose_trace_records_an_oom_is_an_incident() {
    use allocdoc::snapshot::writer::{self, Action, Block, BlockState, Segment, TraceEntry};
    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;
    // Device: (live, free in its segment, request, device free).
    let devices = [
        (10 * GIB, 6 * GIB, 2 * GIB, 100 * MIB), // 6 GiB split free: fragmentation
        (20 * GIB, 64 * MIB, 3 * GIB, 50 * MIB), // full, the largest request
        (20 * GIB, 64 * MIB, GIB, 50 * MIB),     // full
    ];
    let mut snap = writer::Snapshot::default();
    for (d, &(live, free, request, device_free)) in devices.iter().enumerate() {
        snap.segments.push(Segment {
            device: d as i64,
            address: 0x7f00_0000_0000 + ((d as u64) << 40),
            stream: 0,
            is_large: true,
            pool_id: (0, 0),
            is_expandable: false,
            blocks: vec![
                Block {
                    size: live,
                    requested_size: live,
                    state: BlockState::ActiveAllocated,
                },
                Block {
                    size: free,
                    requested_size: 0,
                    state: BlockState::Inactive,
                },
            ],
        });
        snap.device_traces.push(vec![TraceEntry {
            action: Action::Oom,
            addr: device_free,
            size: request,
            stream: 0,
            time_us: 1,
        }]);
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("three.pickle");
    std::fs::write(&path, writer::to_bytes(&snap)).unwrap();
    let d = diagnose_json(&[path.to_str().unwrap()]);
    let incidents = d["incidents"].as_array().expect("incidents");
    assert_eq!(incidents.len(), 3, "{d:#}");
    // The headline: a full card (an error) over the fragmented one (info),
    // then the larger request.
    assert!(
        d["verdict"].as_str().unwrap().starts_with(
            "capacity: cuda:1 ran out of memory (entry 0 of its trace): the 3.00 GiB request"
        ),
        "{}",
        d["verdict"]
    );
    let causes: Vec<&str> = incidents
        .iter()
        .map(|i| i["cause"].as_str().unwrap())
        .collect();
    assert_eq!(causes, ["capacity", "capacity", "fragmentation"]);
    let device_of = |i: &serde_json::Value| {
        d["observations"][i["observation"].as_u64().unwrap() as usize]["device_index"].clone()
    };
    let devices: Vec<serde_json::Value> = incidents.iter().map(device_of).collect();
    assert_eq!(devices, [1, 2, 0]);
}

#[test]
fn an_oom_observer_dump_with_allocated_at_reserved_is_a_full_card() {
    // The yiyi snapshot: segments only, written by an OOM observer
    // (oom_snapshot.pickle); 11 840 159 744 of 11 844 714 496 bytes allocated.
    let d = diagnose_json(&["fixtures/snapshots/yiyi-llm-inference_oom_snapshot.pickle"]);
    assert_eq!(d["cause"], "capacity", "{d:#}");
    assert_eq!(
        d["verdict"].as_str().unwrap(),
        "capacity: This snapshot of cuda:0 was written at an out-of-memory error (its file name \
         says so; an OOM observer records segments only), and live tensors held 11.03 GiB of the \
         11.03 GiB PyTorch reserved, all but 4.34 MiB (0.0 %): the card was full of live \
         tensors, not fragmented. No allocator setting frees enough."
    );
    // What fills it: the one site, every byte.
    assert_eq!(
        d["fills"]["moment"]["rows"][0]["key"],
        "pytorch_backend.py:190:allocate"
    );
    // The same bytes under a name that says nothing of an OOM: no verdict.
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("snapshot.pickle");
    std::fs::write(&plain, fixture("yiyi-llm-inference_oom_snapshot.pickle")).unwrap();
    let d = diagnose_json(&[plain.to_str().unwrap()]);
    assert_ne!(d["cause"], "capacity", "{d:#}");
    // Nor on a full cache that was not at an OOM (wedsonlin: 96.6 % allocated).
    let d = diagnose_json(&[
        "fixtures/snapshots/wedsonlin-assignment2-systems_medium_128_inference_memory_snapshot.pickle",
    ]);
    assert_ne!(d["cause"], "capacity", "{d:#}");
}

#[test]
fn pasted_text_whose_first_byte_is_a_pickle_opcode_stays_evidence() {
    use allocdoc::ingest::{InputKind, detect};
    use std::io::Write;
    use std::process::{Command, Stdio};
    // Morizeyao/GPT2-Chinese#215: a 1.x message's figures quoted alone. As
    // opcodes `(` is MARK, `G` a BINFLOAT of the next 8 bytes and `.` STOP.
    let fragment = "(GPU 0; 15.75 GiB total capacity; 79.11 MiB already allocated; \
                    3.62 MiB free; 86.00 MiB reserved in total by PyTorch)\n";
    for first in [
        &b""[..],
        b"]",
        b"}",
        b"c",
        b"N",
        b"I",
        b"S",
        b".",
        b"\x80",
        b"]\n",
        b"N.\n",
    ] {
        let text = [first, fragment.as_bytes()].concat();
        assert_eq!(detect(&text), InputKind::Text, "{first:?}");
        let mut child = Command::new(env!("CARGO_BIN_EXE_allocdoc"))
            .args(["parse", "-", "--format", "json"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(&text).unwrap();
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{first:?}: {err}");
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let o = &doc["observations"][0];
        assert_eq!(o["kind"], "oom", "{first:?}");
        assert_eq!(
            o["total_capacity_bytes"], 16911433728u64,
            "{first:?}: 15.75 GiB"
        );
        assert_eq!(o["free_bytes"], 3795845u64, "{first:?}: 3.62 MiB");
    }
    // A header-less pickle with no evidence in it stays a pickle: a
    // protocol-0 list [1, 2] (MARK, INT, INT, LIST, STOP).
    assert_eq!(detect(b"(I1\nI2\nl."), InputKind::Pickle);
    // And a real protocol-0 snapshot, whose opening is certain.
    assert_eq!(detect(&fixture("gen-small-p0.pickle")), InputKind::Pickle);
}

#[test]
fn a_device_error_before_an_oom_with_free_memory_is_the_cause() {
    // fixtures/text/real_hip_vllm_workers_ansi.log (shared/realtext/oom_031.txt):
    // vLLM's CuMemAllocator printed "CUDA Error: invalid argument" four times
    // before four HIP OOMs of 186 MiB with 188 GiB free.
    let log = "fixtures/text/real_hip_vllm_workers_ansi.log";
    let d = diagnose_json(&[log]);
    let errors: Vec<&serde_json::Value> = d["observations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["kind"] == "device_error")
        .collect();
    assert_eq!(errors.len(), 1, "the four identical lines are one");
    assert_eq!(
        errors[0]["message"],
        "CUDA Error: invalid argument at /workspace/vllm-patch/csrc/cumem_allocator.cpp:278"
    );
    assert_eq!(d["cause"], "not_allocator", "{d:#}");
    let finding = &d["findings"][0];
    assert_eq!(finding["rule"], "device-error");
    assert_eq!(
        finding["site"],
        "CUDA Error: invalid argument at /workspace/vllm-patch/csrc/cumem_allocator.cpp:278"
    );
    // ROCm: HIP's own switches, no CUDA_LAUNCH_BLOCKING, no MIG.
    let next = d["next_steps"].to_string();
    assert!(next.contains("HIP_LAUNCH_BLOCKING=1"), "{next}");
    assert!(!next.contains("CUDA_LAUNCH_BLOCKING"), "{next}");
    assert!(!next.contains("MIG"), "{next}");
    // Without the error line, the same OOM on ROCm still gets ROCm's advice,
    // and on CUDA the CUDA one.
    let dir = tempfile::tempdir().unwrap();
    let oom = |device: &str| {
        format!(
            "torch.OutOfMemoryError: {device} out of memory. Tried to allocate 186.00 MiB. GPU 5 has \
             a total capacity of 191.45 GiB of which 188.75 GiB is free. Of the allocated memory 0 \
             bytes is allocated by PyTorch, and 2.00 MiB is reserved by PyTorch but unallocated.\n"
        )
    };
    for (device, wanted, unwanted) in [
        ("HIP", "HIP_LAUNCH_BLOCKING=1", "CUDA_LAUNCH_BLOCKING"),
        ("CUDA", "CUDA_LAUNCH_BLOCKING=1", "HIP_LAUNCH_BLOCKING"),
    ] {
        let path = dir.path().join(format!("{device}.log"));
        std::fs::write(&path, oom(device)).unwrap();
        let d = diagnose_json(&[path.to_str().unwrap()]);
        assert_eq!(d["findings"][0]["rule"], "free-exceeds-request", "{device}");
        let next = d["next_steps"].to_string();
        assert!(next.contains(wanted), "{device}: {next}");
        assert!(!next.contains(unwanted), "{device}: {next}");
        assert_eq!(next.contains("MIG"), device == "CUDA", "{device}: {next}");
    }
}

#[test]
fn an_xpu_request_under_its_fraction_cap_with_the_card_free_meets_the_cap() {
    // intel/torch-xpu-ops#2392 (test_set_per_process_memory_fraction on Windows).
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("xpu.log");
    std::fs::write(
        &path,
        "torch.OutOfMemoryError: XPU out of memory. Tried to allocate 8.11 GiB. GPU 0 has a total \
         capacity of 16.54 GiB of which 16.54 GiB is free. 8.27 GiB allowed; Of the allocated \
         memory 0 bytes is allocated by PyTorch, and 0 bytes is reserved by PyTorch but \
         unallocated. Please use `empty_cache` to release all unoccupied cached memory.\n",
    )
    .unwrap();
    let d = diagnose_json(&[path.to_str().unwrap()]);
    assert_eq!(d["cause"], "memory_fraction_cap", "{d:#}");
    assert!(
        d["verdict"].as_str().unwrap().contains(
            "0 bytes reserved plus the request make 8.11 GiB, 98.1 % of the 8.27 GiB cap"
        ),
        "{}",
        d["verdict"]
    );
    assert!(
        d["next_steps"]
            .to_string()
            .contains("UR_L0_USE_RELAXED_ALLOCATION_LIMITS=1")
    );
}
