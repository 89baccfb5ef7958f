//! Issue 34's shapes, each a fixture made in the shape of a real input with
//! other numbers, pinned by the sentence users read (not only the cause):
//! what was false or contradictory on the real input is not said.

use allocdoc::app::Format;
use allocdoc::app::diagnose::DiagnoseOptions;
use allocdoc::app::recommend::RecommendOptions;
use allocdoc::app::top::TopOptions;
use allocdoc::app::validate::ValidateOptions;

fn text(name: &str) -> String {
    format!("fixtures/text/{name}")
}

fn snapshot(name: &str) -> String {
    format!("fixtures/snapshots/{name}")
}

/// `diagnose`'s text and its exit code.
fn diagnose(input: &str) -> String {
    let out = allocdoc::app::diagnose::run(&DiagnoseOptions {
        inputs: vec![input.into()],
        common: allocdoc::app::Common {
            format: Format::Text,
            ..Default::default()
        },
        ..DiagnoseOptions::default()
    })
    .unwrap();
    out.stdout
}

fn recommend(input: &str) -> (String, i32) {
    let out = allocdoc::app::recommend::run(&RecommendOptions {
        input: input.into(),
        ..RecommendOptions::default()
    })
    .unwrap();
    (out.stdout, out.exit_code)
}

fn validate(input: &str, conf: &str) -> (String, i32) {
    let out = allocdoc::app::validate::run(&ValidateOptions {
        input: input.into(),
        conf: conf.into(),
        device: "sim".into(),
        ..ValidateOptions::default()
    })
    .unwrap();
    (out.stdout, out.exit_code)
}

/// `text` holds `want`, with the text in the failure.
#[track_caller]
fn says(text: &str, want: &str) {
    assert!(text.contains(want), "missing {want:?} in:\n{text}");
}

#[track_caller]
fn never(text: &str, unwanted: &str) {
    assert!(!text.contains(unwanted), "{unwanted:?} in:\n{text}");
}

/// Item 1: a snapshot dumped after the OOM unwound is judged at its OOM, not
/// by the state after it, and `top` says what must go and the smallest card.
#[test]
fn a_snapshot_dumped_after_the_oom_is_judged_at_the_oom() {
    let f = snapshot("gen-multidevice-oom-unwound.pickle");
    let d = diagnose(&f);
    assert!(
        d.starts_with(
            "capacity: cuda:1 ran out of memory (entry 22 of its trace): the 5.86 GiB request \
             found 80.00 MiB free on the device and 112.00 MiB cached unused"
        ),
        "{d}"
    );
    never(&d, "non-releasable");
    never(&d, "expandable_segments:True");
    says(
        &d,
        "What must go: at least 5.67 GiB of the 77.39 GiB live (7.3 %)",
    );
    let top = allocdoc::app::top::run(&TopOptions {
        inputs: vec![f],
        ..TopOptions::default()
    })
    .unwrap()
    .stdout;
    says(
        &top,
        "What must go: at least 5.67 GiB of the 77.39 GiB live (7.3 %)",
    );
    says(
        &top,
        "The smallest card this trace runs on under the current config (expandable_segments:True)",
    );
}

/// Item 2: a trace served entirely from the snapshot's segments is
/// uncertain in `recommend` as in `validate`: neither run made a cudaMalloc.
#[test]
fn a_trace_inside_its_segments_is_uncertain_in_every_command() {
    let f = snapshot("gen-cached-only-trace.pickle");
    let sentence = "neither the current config nor this one made a cudaMalloc or a cudaFree";
    let (r, code) = recommend(&f);
    assert_eq!(code, allocdoc::error::EXIT_UNCERTAIN, "{r}");
    says(&r, sentence);
    let (v, code) = validate(&f, "expandable_segments:True");
    assert_eq!(code, allocdoc::error::EXIT_UNCERTAIN, "{v}");
    says(&v, sentence);
    // A real snapshot of that shape: other configs made cudaMallocs, the
    // defaults' run did not, so "defaults do best" is not proven.
    let (r, code) = recommend(&snapshot(
        "magma27-assignment2-systems_memory_snapshot.pickle",
    ));
    assert_eq!(code, allocdoc::error::EXIT_UNCERTAIN, "{r}");
    says(&r, sentence);
}

/// Issue 41, item 3: one forward pass through 24 layers, each saving an
/// activation for backward that the pass frees at its end: allocated
/// memory cycles once per layer and the saved activations rise at every
/// cycle, but nothing is live at the end but the weights. Layers of one
/// step are not steps; it said "Memory that grows with every step runs out
/// at some step" before.
#[test]
fn a_loop_of_layers_inside_one_step_is_not_growth() {
    let f = snapshot("gen-layer-loop-forward.pickle");
    let d = diagnose(&f);
    never(&d, "grows with every step");
    never(&d, "Grows every step");
    let top = allocdoc::app::top::run(&TopOptions {
        inputs: vec![f.clone()],
        common: allocdoc::app::Common {
            format: Format::Json,
            ..Default::default()
        },
        ..TopOptions::default()
    })
    .unwrap();
    let v: serde_json::Value = serde_json::from_str(&top.stdout).unwrap();
    let device = &v["devices"][0];
    assert!(
        device["steps"].as_u64().unwrap() >= 3,
        "{}",
        device["steps"]
    );
    assert_eq!(
        device["growth"],
        serde_json::json!([]),
        "{}",
        device["growth"]
    );
}

/// Issue 41, item 3: a trace that holds no allocation (one `segment_free`:
/// every config makes the same single cudaFree) proves nothing, in
/// `recommend` as in `validate`; it said "proven" before.
#[test]
fn a_trace_without_an_allocation_is_not_proof() {
    let f = snapshot("gen-trace-one-free.pickle");
    let sentence = "the trace's 1 event holds no allocation, so every config does the same";
    let (r, code) = recommend(&f);
    assert_eq!(code, allocdoc::error::EXIT_UNCERTAIN, "{r}");
    says(&r, sentence);
    never(&r, "Evidence: proven");
    let (v, code) = validate(&f, "expandable_segments:True");
    assert_eq!(code, allocdoc::error::EXIT_UNCERTAIN, "{v}");
    says(&v, sentence);
    never(&v, "Evidence: proven");
}

/// Item 3: free and cached memory that hold the request only together are
/// fragmentation whatever share of the card the cached part is, with the
/// headroom named, and a line, not "no allocator setting will help".
#[test]
fn free_and_cached_in_two_pieces_are_one_cause_saying_one_thing() {
    for (name, head, room) in [
        (
            "issue34_split_pieces_under_3pct.log",
            "fragmentation: 1.60 GiB is free and 700.00 MiB is reserved by PyTorch but \
             unallocated: together 2.28 GiB, more than the 2.20 GiB request",
            "would leave only 85.60 MiB (0.4 % of the card)",
        ),
        (
            "issue34_split_pieces_over_3pct.log",
            "fragmentation: 3.80 GiB is free and 2.60 GiB is reserved by PyTorch but \
             unallocated: together 6.40 GiB, more than the 6.00 GiB request",
            "would leave only 409.60 MiB (0.5 % of the card)",
        ),
    ] {
        let d = diagnose(&text(name));
        assert!(d.starts_with(head), "{d}");
        says(&d, room);
        says(
            &d,
            "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
        );
        never(&d, "No allocator setting");
        never(&d, "it is full");
    }
}

/// Item 4: a request that is most of the card, with much of it free, is not
/// "a full card": the request alone is the story.
#[test]
fn a_request_most_of_the_card_is_not_a_full_card() {
    let d = diagnose(&text("issue34_request_most_of_card_1_0.log"));
    assert!(
        d.starts_with(
            "capacity: The 8.80 GiB request alone is 78.8 % of the card's 11.17 GiB: 8.86 GiB of \
             the card is free, more than the request by only 61.44 MiB"
        ),
        "{d}"
    );
    never(&d, "card this full");
    let d = diagnose(&text("issue34_request_most_of_card_2x.log"));
    assert!(
        d.starts_with(
            "capacity: The 22.50 GiB request alone is 71.7 % of the card's 31.36 GiB: 12.60 GiB \
             of the card (40.2 %) is free, but the request and the 17.80 GiB in live tensors make \
             40.30 GiB"
        ),
        "{d}"
    );
    never(&d, "The card is full");
}

/// Item 5: on synthetic evidence `validate` of the rules' line that still
/// fails does not call it failing (exit 1), as `recommend` keeps it.
#[test]
fn validate_does_not_fail_the_line_diagnose_prints() {
    let f = "fixtures/eval/ristoranterist-fastflow-4.txt";
    says(
        &diagnose(f),
        "export PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:64",
    );
    let (v, code) = validate(f, "max_split_size_mb:64");
    assert_eq!(code, allocdoc::error::EXIT_UNCERTAIN, "{v}");
    says(
        &v,
        "it is the rules' line, and synthetic workloads are not strong enough evidence to drop \
         it (only a replayed trace is)",
    );
    // Another candidate that fails is still called failing.
    let (v, code) = validate(f, "max_split_size_mb:128");
    assert_eq!(code, allocdoc::error::EXIT_STILL_OOM, "{v}");
}

/// Item 6: "this process has 0 bytes memory in use" (a container) does not
/// hide the memory held outside PyTorch's cache.
#[test]
fn a_containers_zero_byte_process_line_does_not_hide_memory_outside_the_cache() {
    let d = diagnose(&text("issue34_process_zero_bytes.log"));
    assert!(
        d.starts_with(
            "other_processes: The message says this process has 0 bytes in use, as a container \
             prints it when NVML cannot see the process; of the card's 47.54 GiB, PyTorch's cache \
             holds 27.10 GiB and 1.30 GiB is free, which leaves 19.14 GiB held outside the cache"
        ),
        "{d}"
    );
    // A setting could place this request in the cache: not "will help here".
    says(&d, "No allocator setting is recommended (other_processes)");
}

/// Item 7: a summary after an OOM, and a 1.0 message, say what they show.
#[test]
fn summaries_and_old_messages_say_what_they_show() {
    let f = text("issue34_summary_1_5_no_split_rows.log");
    let d = diagnose(&f);
    says(
        &d,
        "at this dump PyTorch reserves 12.00 GiB and live tensors hold 1024.00 MiB: 11.00 GiB is \
         cached unused",
    );
    never(&d, "stands out");
    let (r, _) = recommend(&f);
    says(
        &r,
        "No failed request to replay (a summary or stats dump records none, even where it counts OOMs)",
    );
    never(&r, "No OOM to avoid");
    let (r, _) = recommend(&text("issue34_cached_1_0_small.log"));
    never(
        &r,
        "no OOM message or memory summary with allocated and reserved figures",
    );
    says(&r, "on the 20.00 MiB request");
}

/// Item 8: Windows, MPS, ROCm and XPU get their own levers and tools.
#[test]
fn platforms_and_devices_get_their_own_levers() {
    for name in [
        "issue34_async_windows.log",
        "issue34_async_powershell_prompt.log",
    ] {
        let d = diagnose(&text(name));
        says(&d, "Windows (inferred");
        says(
            &d,
            "expandable_segments is ignored in this setup, so max_split_size_mb is the setting to try there",
        );
        never(&d, "set expandable_segments:True");
    }
    let d = diagnose(&text("issue34_mps_other_allocations.log"));
    assert!(
        d.starts_with(
            "memory_fraction_cap: The MPS allocator may hold at most 27.20 GiB (its high-watermark \
             cap, a share of the Mac's recommended GPU working set): live tensors hold 14.20 GiB, \
             other allocations on the device (PyTorch's cached buffers and anything else Metal \
             holds) 12.90 GiB, and with the 384.00 MiB request that makes 27.48 GiB, more than the \
             cap"
        ),
        "{d}"
    );
    says(&d, "macOS (an MPS device)");
    never(&d, "Linux");
    never(&d, "nvidia-smi");
    let d = diagnose(&text("issue34_hip_runtime_rank.log"));
    says(&d, "Check amd-smi for other processes");
    never(&d, "nvidia-smi");
    let d = diagnose(&text("issue34_xpu_4gb_free_card.log"));
    assert!(
        d.starts_with(
            "unknown: This XPU build refuses any single allocation over 4 GB, however much of the \
             card is free, and the 5.20 GiB request is over it"
        ),
        "{d}"
    );
    never(&d, "CUDA_LAUNCH_BLOCKING");
    never(&d, "MIG");
}

/// Item 9: the peak before a trace's first entry, and `--at` past the end
/// or `diff --at oom` without an OOM, said rather than silent.
#[test]
fn what_fills_the_card_says_where_its_moments_are() {
    let f = snapshot("gen-trace-frees-first.pickle");
    let top = |at: Option<&str>| {
        allocdoc::app::top::run(&TopOptions {
            inputs: vec![f.clone()],
            at: at.map(str::to_string),
            ..TopOptions::default()
        })
        .unwrap()
    };
    says(
        &top(None).stdout,
        "At the peak of allocated memory, before the trace's first entry: 8.00 MiB allocated in 2 allocations",
    );
    // The attribution's notes are part of what `top` prints.
    says(
        &top(Some("5000")).stdout,
        "--at 5000 is past the trace's last entry (18): the state after it is shown",
    );
    says(
        &top(Some("10s")).stdout,
        "--at 10s: past the trace's last entry, 450us after its first",
    );
    let diff = allocdoc::app::diff::run(&allocdoc::app::diff::DiffOptions {
        before: f.clone(),
        after: snapshot("gen-cached-only-trace.pickle"),
        at: Some("oom".into()),
        ..allocdoc::app::diff::DiffOptions::default()
    })
    .unwrap();
    says(
        &diff.stderr.join("\n"),
        "has no oom moment (--at oom): its end is compared instead",
    );
}

/// Item 11: the smaller things a user trips on.
#[test]
fn smaller_things_say_one_thing_once() {
    // A Windows spill is capacity, whatever its cache holds unused.
    let d = diagnose(&text("issue34_windows_spill.log"));
    assert!(
        d.starts_with(
            "capacity: PyTorch holds 13.98 GiB in live tensors, more than the card's 8.00 GiB"
        ),
        "{d}"
    );
    says(
        &d,
        "What must go: at least 6.42 GiB of the 13.98 GiB live (45.9 %): PyTorch reserved 6.40 GiB more than the card holds",
    );
    // conf check: box drawing like every other table, the Windows warning once.
    let c = allocdoc::app::conf_check::run(&allocdoc::app::conf_check::ConfCheckOptions {
        conf: "expandable_segments:True".into(),
        torch_version: None,
        platform: allocdoc::conf::Platform::Windows,
        format: Format::Text,
    })
    .unwrap()
    .stdout;
    says(&c, "│ backend");
    never(&c, "+----");
    assert_eq!(
        c.matches("expandable_segments not supported on this platform")
            .count(),
        1,
        "{c}"
    );
    // replay says what conf check says of a version that reads no config.
    let r = allocdoc::app::replay::run(&allocdoc::app::replay::ReplayOptions {
        trace: "fixtures/validate/interleaved_16mib.csv".into(),
        confs: vec!["expandable_segments:True".into()],
        capacity: Some(4 << 30),
        torch_version: Some("1.8".into()),
        ..allocdoc::app::replay::ReplayOptions::default()
    })
    .unwrap();
    says(
        &r.stderr.join("\n"),
        "note: --conf \"expandable_segments:True\": PyTorch 1.8 does not read PYTORCH_CUDA_ALLOC_CONF",
    );
    // A mean count of calls is said to be one.
    says(
        &diagnose(&snapshot("gen-trace-growing-lengths.pickle")),
        "3.73 cudaMalloc calls a step on average",
    );
}

/// Item 11: a note says "note:" once.
#[test]
fn a_note_says_note_once() {
    let (r, _) = recommend(&snapshot("gen-ignored-conf.pickle"));
    says(
        &r,
        "\nnote: current config: PyTorch's defaults (as the snapshot recorded it)",
    );
    never(&r, "note: note:");
}

/// Item 11: a stats dump without `all` rows names each metric of its pools.
#[test]
fn a_stats_dump_without_all_rows_names_its_metrics() {
    let out = allocdoc::app::parse::run(&allocdoc::app::parse::ParseOptions {
        inputs: vec![text("issue34_stats_no_all_row.log")],
        ..Default::default()
    })
    .unwrap()
    .stdout;
    says(
        &out,
        "│ Non-releasable memory ┆ large_pool ┆  512.00 MiB ┆ 768.00 MiB",
    );
    says(
        &out,
        "│ GPU reserved memory   ┆ large_pool ┆    3.00 GiB ┆   5.00 GiB",
    );
}

/// Item 11: a request figure too large to read is named, not dropped silently.
#[test]
fn an_unreadable_request_is_named() {
    let out = allocdoc::app::diagnose::run(&DiagnoseOptions {
        inputs: vec![text("issue34_request_overflow.log")],
        ..DiagnoseOptions::default()
    })
    .unwrap();
    says(
        &out.stderr.join("\n"),
        "issue34_request_overflow.log:6: the request \"99999999999999999999.00 GiB\" is past what a 64-bit byte count holds; the message is read without it",
    );
}

/// Item 11: `parse` and `diagnose` print a figure of the input alike, as
/// PyTorch's message prints it (they once said "1.00 GiB" and "1024.00 MiB"
/// for one card), in every format that shows it.
#[test]
fn parse_and_diagnose_print_a_figure_alike() {
    let input = text("issue34_units_one_gib_card.log");
    let parse = |format| {
        allocdoc::app::parse::run(&allocdoc::app::parse::ParseOptions {
            inputs: vec![input.clone()],
            common: allocdoc::app::Common {
                format,
                ..Default::default()
            },
            ..Default::default()
        })
        .unwrap()
        .stdout
    };
    says(
        &parse(Format::Text),
        "│ line 9 ┆ cuda:0 ┆  2.00 MiB ┆ 1024.00 MiB ┆ 1024.00 KiB ┆ 785.51 MiB ┆ 812.00 MiB ┆ 1.4-2.0 │",
    );
    says(
        &parse(Format::Markdown),
        "| 2.00 MiB | 1024.00 MiB | 1024.00 KiB | 785.51 MiB | 812.00 MiB |",
    );
    says(
        &diagnose(&input),
        "requested 2.00 MiB · capacity 1024.00 MiB · free 1024.00 KiB · allocated 785.51 MiB · reserved 812.00 MiB",
    );
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report.html");
    allocdoc::app::diagnose::run(&DiagnoseOptions {
        inputs: vec![input.clone()],
        report: Some(report.clone()),
        ..DiagnoseOptions::default()
    })
    .unwrap();
    let html = std::fs::read_to_string(&report).unwrap();
    for figure in ["1024.00 MiB", "1024.00 KiB"] {
        says(&html, figure);
    }
    never(&html, "1.00 GiB");
}
