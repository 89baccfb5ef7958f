//! Log scanning throughput: a generated training log of at least 1 GiB with
//! OOM messages and memory_summary() tables sprinkled in, scanned by
//! `ingest::parse_bytes`. Run: `cargo bench --features bench --bench scan`.

use std::sync::LazyLock;

/// Size of the generated log.
const LOG_BYTES: usize = 1 << 30;
/// One piece of evidence every this many bytes.
const EVIDENCE_EVERY: usize = 8 << 20;

const OOM: &str = "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.11 GiB of which 1.19 GiB is free. Including non-PyTorch memory, this process has 77.90 GiB memory in use. Of the allocated memory 58.12 GiB is allocated by PyTorch, and 18.94 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)\n";

/// Ordinary training-log lines (no evidence), varied so no single byte pattern repeats.
fn noise_line(i: usize, out: &mut String) {
    use std::fmt::Write;
    let _ = match i % 5 {
        0 => writeln!(
            out,
            "[rank{}]: 2024-06-11 10:{:02}:{:02} INFO  trainer: step {i} loss {:.4} lr 2.9e-05 grad_norm 0.87 tokens/s {}",
            i % 8,
            (i / 60) % 60,
            i % 60,
            3.0 - (i % 1000) as f64 / 1000.0,
            18000 + i % 977
        ),
        1 => writeln!(
            out,
            "Epoch 3:  41%|████      | {}/1000 [02:11<03:09,  3.11it/s, loss=2.31, v_num={}]",
            i % 1000,
            i % 97
        ),
        2 => writeln!(
            out,
            "wandb: WARNING Step only supports monotonically increasing values, use define_metric to set a custom x axis ({i})"
        ),
        3 => writeln!(
            out,
            "  File \"/usr/local/lib/python3.11/site-packages/torch/nn/modules/module.py\", line {}, in _call_impl",
            1700 + i % 80
        ),
        _ => writeln!(
            out,
            "[W611 10:01:{:02}.{:03} ProcessGroupNCCL.cpp:{}] Warning: allocated memory summary deferred; segment sizes {} {}",
            i % 60,
            i % 1000,
            4000 + i % 300,
            i % 4096,
            i % 333
        ),
    };
}

fn summary() -> String {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fixtures/text/constructed_summary_2x_full.log"
    );
    let text = std::fs::read_to_string(path).expect("summary fixture");
    let body = text.split_once("# ---\n").map_or(text.as_str(), |(_, b)| b);
    body.lines().map(|l| format!("[rank0]: {l}\n")).collect()
}

static LOG: LazyLock<Vec<u8>> = LazyLock::new(|| {
    let summary = summary();
    let mut log = String::with_capacity(LOG_BYTES + (1 << 20));
    let mut i = 0;
    let mut next_evidence = EVIDENCE_EVERY;
    while log.len() < LOG_BYTES {
        noise_line(i, &mut log);
        i += 1;
        if log.len() >= next_evidence {
            log.push_str(if i % 2 == 0 { OOM } else { &summary });
            next_evidence += EVIDENCE_EVERY;
        }
    }
    log.into_bytes()
});

fn main() {
    divan::main();
}

/// Scans the whole generated log once per sample; divan reports bytes/s.
#[divan::bench(sample_count = 5, sample_size = 1)]
fn scan_1gib_log(bencher: divan::Bencher) {
    let log: &[u8] = &LOG;
    let expected = LOG_BYTES / EVIDENCE_EVERY;
    bencher
        .counter(divan::counter::BytesCount::new(log.len()))
        .bench(|| {
            let obs = allocdoc::ingest::parse_bytes("bench.log", divan::black_box(log)).unwrap();
            assert_eq!(obs.len(), expected);
            obs
        });
}

/// 64 MiB without a newline, dense with anchors and near-misses: what a log
/// whose newlines were lost, or binary data, looks like. Must stay linear.
static ONE_LINE: LazyLock<Vec<u8>> = LazyLock::new(|| {
    let piece: &[u8] = b"RuntimeError: CUDA out of memory. Tried to allocate 2.5 | Allocated memory | 12 MiB | 'active.all.current': 3, CUBLAS_STATUS_ALLOC_FAILED ";
    piece.iter().copied().cycle().take(64 << 20).collect()
});

#[divan::bench(sample_count = 3, sample_size = 1)]
fn scan_64mib_single_line_of_anchors(bencher: divan::Bencher) {
    let data: &[u8] = &ONE_LINE;
    bencher
        .counter(divan::counter::BytesCount::new(data.len()))
        .bench(|| {
            allocdoc::ingest::parse_bytes("one-line.log", divan::black_box(data))
                .unwrap()
                .len()
        });
}
