//! Hostile inputs, generated here, each run through the real binary under a
//! 2 GiB address-space limit (`setrlimit(RLIMIT_AS)` in the child): shared
//! objects that expand quadratically, deep nesting, memo bombs, truncations,
//! huge length fields, protocol-0/1 pickles that would call code, endless
//! inputs. Every one ends with the exit code and message it should, never an
//! abort. Also: compressed and UTF-16 variants of every text fixture parse
//! like the plain file, standard input is scanned in chunks like a file, and
//! output errors are reported.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_allocdoc");
/// The address space a hostile input may have the binary use.
const ADDRESS_SPACE: u64 = 2 << 30;

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs the binary under the address-space limit, `stdin` piped in.
fn run_limited(args: &[&str], stdin: Option<&[u8]>) -> Run {
    run_within(ADDRESS_SPACE, args, stdin)
}

/// Runs the binary with `limit` bytes of address space, `stdin` piped in.
fn run_within(limit: u64, args: &[&str], stdin: Option<&[u8]>) -> Run {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: only async-signal-safe setrlimit between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                let lim = libc::rlimit {
                    rlim_cur: limit,
                    rlim_max: limit,
                };
                if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let mut child = cmd.spawn().expect("the allocdoc binary");
    let writer = stdin.map(|data| {
        let data = data.to_vec();
        let mut pipe = child.stdin.take().expect("stdin");
        std::thread::spawn(move || {
            // The binary may stop reading early (an error): that is its answer.
            let _ = pipe.write_all(&data);
        })
    });
    let out = child.wait_with_output().expect("wait");
    if let Some(w) = writer {
        w.join().expect("writer");
    }
    Run {
        code: out.status.code().unwrap_or_else(|| {
            panic!(
                "killed by a signal: {:?}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        }),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn run(args: &[&str]) -> Run {
    run_limited(args, None)
}

/// Asserts exit 2 with a message holding every one of `says`.
fn refused(r: &Run, says: &[&str]) {
    assert_eq!(r.code, 2, "stderr: {}", r.stderr);
    for s in says {
        assert!(r.stderr.contains(s), "{s:?} not in: {}", r.stderr);
    }
    assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
}

fn write(dir: &Path, name: &str, data: &[u8]) -> String {
    let p = dir.join(name);
    std::fs::write(&p, data).unwrap();
    p.display().to_string()
}

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(rel)
}

// ---- a small pickle writer (protocol 4 opcodes) --------------------------

/// A dict value, written by a closure.
type Item<'a> = (&'a str, &'a dyn Fn(&mut Pickler));

#[derive(Default)]
struct Pickler {
    out: Vec<u8>,
    memo: u32,
}

impl Pickler {
    fn new() -> Self {
        Pickler {
            out: vec![0x80, 4],
            memo: 0,
        }
    }
    fn str(&mut self, s: &str) -> &mut Self {
        self.out.push(0x8c);
        self.out.push(s.len() as u8);
        self.out.extend_from_slice(s.as_bytes());
        self
    }
    fn int(&mut self, i: u32) -> &mut Self {
        self.out.push(b'J');
        self.out.extend_from_slice(&(i as i32).to_le_bytes());
        self
    }
    /// MEMOIZE the top; returns its memo index.
    fn memoize(&mut self) -> u32 {
        self.out.push(0x94);
        self.memo += 1;
        self.memo - 1
    }
    fn get(&mut self, idx: u32) -> &mut Self {
        match u8::try_from(idx) {
            Ok(i) => self.out.extend_from_slice(&[b'h', i]),
            Err(_) => {
                self.out.push(b'j');
                self.out.extend_from_slice(&idx.to_le_bytes());
            }
        }
        self
    }
    /// `{k: v, …}` from `(key, writer)` pairs.
    fn dict(&mut self, items: &[Item]) -> &mut Self {
        self.out.extend_from_slice(b"}(");
        for (k, v) in items {
            self.str(k);
            v(self);
        }
        self.out.push(b'u');
        self
    }
    /// A list of `n` references to memo entry `idx`.
    fn shared_list(&mut self, idx: u32, n: usize) -> &mut Self {
        self.out.extend_from_slice(b"](");
        for _ in 0..n {
            self.get(idx);
        }
        self.out.push(b'e');
        self
    }
    fn stop(&mut self) -> Vec<u8> {
        self.out.push(b'.');
        std::mem::take(&mut self.out)
    }
}

/// `{"segments": [seg] * n, "device_traces": [[]]}` where
/// `seg = {..., "blocks": [blk] * n}`: 4n bytes or so, n² blocks expanded.
fn shared_object_pickle(n: usize) -> Vec<u8> {
    let mut p = Pickler::new();
    p.dict(&[]);
    let root = p.memoize();
    let _ = root;
    // Build blk, then seg, each memoized once.
    p.dict(&[
        ("size", &|p: &mut Pickler| {
            p.int(512);
        }),
        ("state", &|p: &mut Pickler| {
            p.str("active_allocated");
        }),
    ]);
    let blk = p.memoize();
    p.out.push(b'0'); // POP: only the memo keeps it
    p.dict(&[
        ("address", &|p: &mut Pickler| {
            p.int(0);
        }),
        ("total_size", &|p: &mut Pickler| {
            p.int(512 * 1000);
        }),
        ("device", &|p: &mut Pickler| {
            p.int(0);
        }),
        ("blocks", &|p: &mut Pickler| {
            p.shared_list(blk, n);
        }),
    ]);
    let seg = p.memoize();
    p.out.push(b'0');
    // The root dict is still on the stack: fill it.
    p.out.push(b'(');
    p.str("segments");
    p.shared_list(seg, n);
    p.str("device_traces");
    p.out.extend_from_slice(b"]]a");
    p.out.push(b'u');
    p.stop()
}

#[test]
fn shared_objects_are_counted_before_they_are_expanded() {
    let dir = tempfile::tempdir().unwrap();
    // Small: fine, and every shared block is counted.
    let small = write(dir.path(), "n100.pickle", &shared_object_pickle(100));
    let r = run(&["parse", "--format", "json", &small]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["observations"][0]["segments"], 100);
    assert_eq!(v["observations"][0]["blocks"], 100 * 100);
    // The 80 KB file: 4·10^8 blocks, refused at once, for every command.
    for n in [9_000, 20_000, 60_000] {
        let data = shared_object_pickle(n);
        assert!(data.len() < 5 * n, "{n}: {} bytes", data.len());
        let path = write(dir.path(), &format!("n{n}.pickle"), &data);
        let blocks = (n * n).to_string();
        for cmd in ["parse", "diagnose", "replay"] {
            refused(
                &run(&[cmd, &path]),
                &[
                    "over the limit of 67108864 snapshot blocks",
                    &blocks,
                    "--max-blocks",
                ],
            );
        }
    }
}

#[test]
fn a_model_the_machine_cannot_hold_is_an_error_not_an_abort() {
    // 8000² = 6.4·10^7 blocks is within the default limit, but their 2 GiB
    // cannot fit in 1 GiB of address space.
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "n8000.pickle", &shared_object_pickle(8000));
    refused(
        &run_within(1 << 30, &["parse", &path], None),
        &[
            "not enough memory for the snapshot's blocks",
            "--max-blocks",
        ],
    );
}

/// An allocation the machine refuses outside the decoders' fallible paths
/// (here the trace reader's event list: 15 million events from an 18 KB
/// zstd file that decompresses to 200 MB, in 320 MiB of address space) ends
/// with exit 2 and a message naming the limits, not an abort (exit 134).
#[cfg(target_os = "linux")]
#[test]
fn a_refused_allocation_anywhere_is_exit_2_not_an_abort() {
    let dir = tempfile::tempdir().unwrap();
    let mut csv = b"action,id,size,stream\n".to_vec();
    csv.extend(b"alloc,1,512,0\nfree,1,512,0\n".repeat(7_500_000));
    let packed = zstd::encode_all(&csv[..], 1).unwrap();
    drop(csv);
    let path = write(dir.path(), "trace.csv.zst", &packed);
    // One run streams the 15 M events through a few reused buffers: it fits.
    let one = run_within(
        320 << 20,
        &["replay", &path, "--capacity", "80GiB", "--format", "json"],
        None,
    );
    assert_eq!(one.code, 0, "stderr: {}", one.stderr);
    assert!(
        one.stdout.contains("\"events\": 15000000"),
        "{}",
        one.stdout
    );
    // Two runs keep the trace for the second: 360 MB of events, refused.
    let args = [
        "replay",
        &path,
        "--capacity",
        "80GiB",
        "--conf",
        "",
        "--conf",
        "expandable_segments:True",
    ];
    let r = run_within(320 << 20, &args, None);
    refused(
        &r,
        &[
            "allocdoc: error: out of memory: the system refused an allocation of",
            "Every input limit is a flag",
        ],
    );
}

#[test]
fn deep_nesting_memo_bombs_and_huge_lengths_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(&str, Vec<u8>, Vec<&str>)> = vec![
        (
            "marks",
            [&[0x80, 4][..], &vec![b'('; 100_000]].concat(),
            vec!["MARK nesting exceeds the decoder's limit of 65536"],
        ),
        (
            // 20 million DUPs of one dict: a stack of 20 M values, 160 MB,
            // more than the bound by the input's size lets 20 MB hold.
            "dup",
            [&b"\x80\x04}"[..], &vec![b'2'; 20_000_000], b"."].concat(),
            vec!["the decoded values would pass", "--max-objects N"],
        ),
        (
            // Lists nested 10 million deep, without a MARK (24 bytes held
            // per input byte, over the bound by the input's size).
            "nested-lists",
            [
                &b"\x80\x04"[..],
                &b"]".repeat(10_000_000),
                &b"a".repeat(9_999_999),
                b".",
            ]
            .concat(),
            vec!["the decoded values would pass"],
        ),
        (
            "memo-index",
            b"\x80\x04}r\xff\xff\xff\xff0j\xff\xff\xff\xff.".to_vec(),
            vec!["not a torch memory snapshot"],
        ),
        (
            "binunicode8",
            b"\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\x7fabc.".to_vec(),
            vec!["byte 2: input ends inside BINUNICODE8"],
        ),
        (
            "binbytes",
            b"\x80\x04B\xff\xff\xff\xffabc.".to_vec(),
            vec!["byte 2: input ends inside BINBYTES"],
        ),
        (
            "frame",
            b"\x80\x04\x95\xff\xff\xff\xff\xff\xff\xff\xff}.".to_vec(),
            vec!["byte 2: input ends inside FRAME"],
        ),
    ];
    for (name, data, says) in cases {
        let path = write(dir.path(), name, &data);
        let r = run(&["parse", &path]);
        refused(&r, &says);
        assert!(r.stderr.contains(&path), "{name}: {}", r.stderr);
    }
}

/// Runs the binary under the address-space limit and returns its run and
/// its peak resident memory in bytes (`wait4`'s `ru_maxrss`). The binary is
/// started by a fresh copy of this test binary ([`rss_of_child`]): a child
/// forked from this large process would report this process's resident
/// memory, which exec keeps in `ru_maxrss`.
#[cfg(target_os = "linux")]
fn run_measured(args: &[&str]) -> (Run, u64) {
    let out = Command::new(std::env::current_exe().expect("the test binary"))
        .args([
            "--exact",
            "hostile::rss_of_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(MEASURE, args.join("\u{1f}"))
        .output()
        .expect("the test binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| -> String {
        let at = stdout
            .find(name)
            .unwrap_or_else(|| panic!("{name} in {stdout}"));
        let rest = &stdout[at + name.len()..];
        rest.split('\u{1e}').next().unwrap_or_default().to_string()
    };
    let run = Run {
        code: field("code=").parse().expect("exit code"),
        stdout: String::new(),
        stderr: field("stderr="),
    };
    (run, field("rss=").parse().expect("peak RSS"))
}

/// Where [`run_measured`] passes the arguments to [`rss_of_child`].
const MEASURE: &str = "ALLOCDOC_TEST_MEASURE";

/// Not a test: [`run_measured`]'s helper, run in a fresh copy of this binary.
#[cfg(target_os = "linux")]
#[test]
#[ignore = "run by run_measured"]
fn rss_of_child() {
    use std::os::unix::process::CommandExt;
    let Ok(args) = std::env::var(MEASURE) else {
        return;
    };
    let mut cmd = Command::new(BIN);
    cmd.args(args.split('\u{1f}'))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: only async-signal-safe setrlimit between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: ADDRESS_SPACE,
                rlim_max: ADDRESS_SPACE,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().expect("the allocdoc binary");
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the zeroed struct; the only child was reaped.
    assert_eq!(
        unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) },
        0
    );
    println!(
        "code={}\u{1e}rss={}\u{1e}stderr={}\u{1e}",
        out.status.code().unwrap_or(-1),
        usage.ru_maxrss as u64 * 1024,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Floods of cheap opcodes that each make the decoder hold many times their
/// size (64 MiB of input, no STOP): every one stops at the values limit, and
/// its resident memory stays within that limit's bytes, the input's pages
/// and a few MiB of the binary's own: the limit counts what each value costs.
#[cfg(target_os = "linux")]
#[test]
fn opcode_floods_stay_within_the_values_budget() {
    const INPUT: usize = 64 << 20;
    const VALUES: u64 = 1 << 26; // 512 MiB
    let flood = |unit: &[u8]| -> Vec<u8> {
        let mut d = b"\x80\x04".to_vec();
        d.extend(unit.repeat(INPUT / unit.len()));
        d
    };
    let shapes: Vec<(&str, Vec<u8>)> = vec![
        ("empty-lists", flood(b"]")),
        ("empty-dicts", flood(b"}")),
        ("empty-tuples", flood(b")")),
        // MARK + LIST: one empty list per MARK, the MARK closed again.
        ("mark-lists", flood(b"(l")),
        // MARK + NONE + TUPLE: a one-item tuple per MARK.
        ("mark-tuples", flood(b"(Nt")),
        ("short-binunicode", flood(b"\x8c\x01a")),
        ("binunicode", flood(b"X\x01\x00\x00\x00a")),
        ("short-binbytes", flood(b"C\x01a")),
    ];
    let dir = tempfile::tempdir().unwrap();
    let values = VALUES.to_string();
    for (name, data) in shapes {
        let path = write(dir.path(), name, &data);
        let (r, rss) = run_measured(&["parse", &path, "--max-objects", &values]);
        refused(
            &r,
            &[
                "over the limit of 67108864 decoded values",
                "--max-objects N",
            ],
        );
        let bound = VALUES * 8 + INPUT as u64 + (96 << 20);
        eprintln!("{name}: peak RSS {} MiB", rss >> 20);
        assert!(
            rss <= bound,
            "{name}: peak RSS {} MiB over {} MiB",
            rss >> 20,
            bound >> 20
        );
    }
}

/// Floods of 128 MiB, at the default limits (issue 33: 134 M `EMPTY_LIST`s
/// once reached 3.2 GB): every opcode that makes the decoder hold more than
/// its bytes, with and without a STOP after it, stops at the bound by the
/// input's size with exit 2, and stays within 1 GiB resident; `diagnose`
/// and `top` end alike on the first.
#[cfg(target_os = "linux")]
#[test]
fn floods_of_128_mib_stay_within_1_gib_at_the_default_limits() {
    const INPUT: usize = 128 << 20;
    const RESIDENT: u64 = 1 << 30;
    let flood = |head: &[u8], unit: &[u8]| -> Vec<u8> {
        let mut d = b"\x80\x04".to_vec();
        d.extend_from_slice(head);
        d.extend(unit.repeat((INPUT - d.len()) / unit.len()));
        d
    };
    let mut sparse = b"\x80\x04N".to_vec();
    for i in 1..(INPUT as u32 - 3) / 5 {
        sparse.push(b'r');
        sparse.extend_from_slice(&i.to_le_bytes());
    }
    let shapes: Vec<(&str, Vec<u8>)> = vec![
        ("empty-lists", flood(b"", b"]")),
        ("empty-dicts", flood(b"", b"}")),
        ("empty-tuples", flood(b"", b")")),
        ("empty-sets", flood(b"", b"\x8f")),
        ("empty-short-binunicode", flood(b"", b"\x8c\x00")),
        ("empty-binunicode", flood(b"", b"X\x00\x00\x00\x00")),
        // (Empty ones, `C\x00` over and over, read as UTF-16 text.)
        ("short-binbytes", flood(b"", b"C\x01a")),
        ("marks", flood(b"", b"(")),
        ("nones", flood(b"", b"N")),
        ("dups", flood(b"N", b"2")),
        // The same object memoized again and again: the memo turns dense.
        ("memoize-object", flood(b"]", b"\x94")),
        // None memoized: an id and a value per entry.
        ("memoize-none", flood(b"N", b"\x94")),
        ("memo-puts-in-order", {
            let mut d = b"\x80\x04N".to_vec();
            for i in 0..(INPUT as u32 - 3) / 5 {
                d.push(b'r');
                d.extend_from_slice(&i.to_le_bytes());
            }
            d
        }),
        // Indices past the memo's length: a hash map entry each.
        ("memo-puts-out-of-order", sparse),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (name, mut data) in shapes {
        for stop in [false, true] {
            if stop {
                data.push(b'.');
            }
            let path = write(dir.path(), &format!("{name}.pickle"), &data);
            let (r, rss) = run_measured(&["parse", &path]);
            eprintln!("{name} (STOP: {stop}): peak RSS {} MiB", rss >> 20);
            assert_eq!(r.code, 2, "{name}: {}", r.stderr);
            assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
            assert!(r.stderr.contains(&path), "{name}: {}", r.stderr);
            // MARKs stop at their nesting limit; in-order memo puts of None
            // (0.4 values a byte) decode within the bound, then are no
            // snapshot; the rest stop at the bound by the input's size.
            let says = match name {
                "marks" => "MARK nesting",
                "memo-puts-in-order" if stop => "not a torch memory snapshot",
                "memo-puts-in-order" => "input ends inside",
                _ => "the decoded values would pass",
            };
            assert!(r.stderr.contains(says), "{name}: {}", r.stderr);
            assert!(
                rss <= RESIDENT,
                "{name}: peak RSS {} MiB over 1 GiB",
                rss >> 20
            );
            if name == "empty-lists" {
                for command in ["diagnose", "top"] {
                    let (r, rss) = run_measured(&[command, &path]);
                    eprintln!(
                        "{name} ({command}, STOP: {stop}): peak RSS {} MiB",
                        rss >> 20
                    );
                    refused(&r, &["the decoded values would pass"]);
                    assert!(rss <= RESIDENT, "{command}: peak RSS {} MiB", rss >> 20);
                }
            }
        }
        std::fs::remove_file(dir.path().join(format!("{name}.pickle"))).unwrap();
    }
}

#[test]
fn truncated_snapshots_name_where_they_end() {
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "gen-small-p4.pickle",
        "gen-small-p0.pickle",
        "gen-small-p1.pickle",
    ] {
        let data = std::fs::read(fixture("snapshots").join(name)).unwrap();
        for cut in [data.len() / 3, data.len() / 2, data.len() - 1] {
            let path = write(dir.path(), &format!("{cut}-{name}"), &data[..cut]);
            refused(&run(&["parse", &path]), &[&path, "input ends inside"]);
        }
    }
}

#[test]
fn protocol_0_and_1_pickles_that_would_call_code_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&[u8], &str); 5] = [
        (
            b"cos\nsystem\n(S'echo hi'\ntR.",
            "byte 0: opcode GLOBAL would call os system",
        ),
        (
            b"cos\nsystem\nq\x00(X\x07\x00\x00\x00echo hiq\x01tq\x02Rq\x03.",
            "byte 0: opcode GLOBAL would call os system",
        ),
        (
            b"(S'echo hi'\nios\nsystem\n.",
            "byte 12: opcode INST would call os system",
        ),
        (
            b"c__builtin__\neval\n(Vprint(1)\ntR.",
            "byte 0: opcode GLOBAL would call __builtin__ eval",
        ),
        (
            b"(dp0\nS'segments'\np1\ncos\nsystem\np2\ns.",
            "byte 20: opcode GLOBAL would call os system",
        ),
    ];
    for (i, (data, says)) in cases.into_iter().enumerate() {
        let path = write(dir.path(), &format!("code{i}.pkl"), data);
        for cmd in ["parse", "diagnose", "replay"] {
            refused(&run(&[cmd, &path]), &[says, "refused (nothing was run)"]);
        }
        refused(&run_limited(&["diagnose"], Some(data)), &[says]);
    }
    // Piped text that starts like a pickle stays a stream (a bounded scan,
    // not a read of the whole input): "(T" reads as a MARK and a 1.8 GB string.
    // 300 MB through 256 MiB of address space: only a stream fits.
    let log = std::fs::read(fixture("text/constructed_2_4_every_clause.log")).unwrap();
    let noise = b"step 1200 | loss 2.3104 | lr 2.0e-05 | tokens/s 51234\n".repeat(5_800_000);
    let text = [&b"(Training started)\n"[..], &noise, &log].concat();
    assert!(text.len() > 300_000_000);
    let r = run_within(256 << 20, &["parse", "--format", "json"], Some(&text));
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("\"kind\": \"oom\""));
    // Text that starts like a GLOBAL stays text.
    let text = "cat\nfoo\nThis log has no evidence.\n";
    let path = write(dir.path(), "cat.log", text.as_bytes());
    let r = run(&["parse", &path]);
    assert_eq!(r.code, 0, "{}", r.stderr);
}

// ---- compression and encodings --------------------------------------------

fn gzip(d: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(d).unwrap();
    e.finish().unwrap()
}
fn xz(d: &[u8]) -> Vec<u8> {
    let mut e = liblzma::write::XzEncoder::new(Vec::new(), 1);
    e.write_all(d).unwrap();
    e.finish().unwrap()
}
fn zstd(d: &[u8]) -> Vec<u8> {
    zstd::encode_all(d, 1).unwrap()
}
fn bzip2(d: &[u8]) -> Vec<u8> {
    let mut e = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::fast());
    e.write_all(d).unwrap();
    e.finish().unwrap()
}
fn utf16(text: &str, le: bool, bom: bool) -> Vec<u8> {
    let mut out = Vec::new();
    if bom {
        out.extend_from_slice(if le { &[0xff, 0xfe] } else { &[0xfe, 0xff] });
    }
    for u in text.encode_utf16() {
        out.extend_from_slice(&if le { u.to_le_bytes() } else { u.to_be_bytes() });
    }
    out
}

/// Every way an input may arrive, with its name.
fn variants(plain: &[u8]) -> Vec<(&'static str, Vec<u8>)> {
    let mut v = vec![
        ("gz", gzip(plain)),
        ("xz", xz(plain)),
        ("zst", zstd(plain)),
        ("bz2", bzip2(plain)),
        ("gz.gz", gzip(&gzip(plain))),
        ("bom8", [b"\xef\xbb\xbf", plain].concat()),
        // Two gzip members in a row, as `cat a.gz b.gz` makes.
        ("gz2", {
            let (a, b) = plain.split_at(plain.len() / 2);
            [gzip(a), gzip(b)].concat()
        }),
    ];
    if let Ok(text) = std::str::from_utf8(plain) {
        v.push(("u16le", utf16(text, true, true)));
        v.push(("u16be", utf16(text, false, true)));
        v.push(("u16le-nobom", utf16(text, true, false)));
        v.push(("u16le.zst", zstd(&utf16(text, true, true))));
    }
    v
}

/// `parse --format json` of a file, the `input` fields dropped.
fn parse_json(path: &str) -> serde_json::Value {
    let out = allocdoc::app::parse::run(&allocdoc::app::parse::ParseOptions {
        inputs: vec![path.to_owned()],
        common: allocdoc::app::Common {
            format: allocdoc::app::Format::Json,
            ..Default::default()
        },
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    for o in v["observations"].as_array_mut().unwrap() {
        o.as_object_mut().unwrap().remove("input");
    }
    v
}

#[test]
fn compressed_and_utf16_variants_of_every_text_fixture_parse_alike() {
    let dir = tempfile::tempdir().unwrap();
    let mut texts: Vec<PathBuf> = std::fs::read_dir(fixture("text"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    texts.sort();
    assert!(texts.len() > 50, "{} fixtures", texts.len());
    let mut compared = 0;
    for path in &texts {
        let plain = std::fs::read(path).unwrap();
        let want = parse_json(&path.display().to_string());
        for (ext, data) in variants(&plain) {
            let name = path.file_name().unwrap().to_string_lossy();
            let p = write(dir.path(), &format!("{name}.{ext}"), &data);
            assert_eq!(parse_json(&p), want, "{name} as {ext}");
            compared += 1;
        }
    }
    assert!(compared > texts.len() * 10, "{compared}");
}

#[test]
fn compressed_snapshots_traces_and_rmm_logs_are_read_by_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let snap = std::fs::read(fixture("snapshots/gen-small-p4.pickle")).unwrap();
    let want = parse_json(
        &fixture("snapshots/gen-small-p4.pickle")
            .display()
            .to_string(),
    );
    for (ext, data) in [
        ("gz", gzip(&snap)),
        ("xz", xz(&snap)),
        ("zst", zstd(&snap)),
        ("bz2", bzip2(&snap)),
    ] {
        let p = write(dir.path(), &format!("s.pickle.{ext}"), &data);
        assert_eq!(parse_json(&p), want, "{ext}");
    }
    // A trace CSV: zstd, UTF-16 and a BOM replay alike.
    let csv = "action,id,size,stream\nalloc,1,1048576,0\nalloc,2,2097152,0\nfree,1,,0\nalloc,3,4194304,0\n";
    let want = run(&[
        "replay",
        &write(dir.path(), "t.csv", csv.as_bytes()),
        "--capacity",
        "1GiB",
        "--format",
        "json",
    ]);
    assert_eq!(want.code, 0, "{}", want.stderr);
    for (ext, data) in [
        ("zst", zstd(csv.as_bytes())),
        ("u16", utf16(csv, true, true)),
        ("bom", [b"\xef\xbb\xbf", csv.as_bytes()].concat()),
    ] {
        let p = write(dir.path(), &format!("t.csv.{ext}"), &data);
        let r = run(&["replay", &p, "--capacity", "1GiB", "--format", "json"]);
        assert_eq!(r.code, 0, "{ext}: {}", r.stderr);
        assert_eq!(
            r.stdout.replace(&p, "T"),
            want.stdout
                .replace(&dir.path().join("t.csv").display().to_string(), "T"),
            "{ext}"
        );
    }
    // Standard input, compressed.
    let r = run_limited(
        &["replay", "-", "--capacity", "1GiB", "--format", "json"],
        Some(&xz(csv.as_bytes())),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
}

#[test]
fn corrupt_or_unreadable_compression_is_exit_2_never_no_evidence() {
    let dir = tempfile::tempdir().unwrap();
    let log = std::fs::read(fixture("text/constructed_2_4_every_clause.log")).unwrap();
    for (ext, data, says) in [
        (
            "gz",
            gzip(&log)[..60].to_vec(),
            "cannot decode the gzip data",
        ),
        ("xz", xz(&log)[..60].to_vec(), "cannot decode the xz data"),
        (
            "zst",
            zstd(&log)[..60].to_vec(),
            "cannot decode the zstd data",
        ),
        (
            "bz2",
            bzip2(&log)[..60].to_vec(),
            "cannot decode the bzip2 data",
        ),
        (
            "zip",
            b"PK\x03\x04\x14\x00\x00\x00rest of a zip".to_vec(),
            "a zip archive",
        ),
        ("lz4", b"\x04\x22\x4d\x18rest".to_vec(), "lz4-compressed"),
    ] {
        let path = write(dir.path(), &format!("log.{ext}"), &data);
        for cmd in ["parse", "diagnose"] {
            refused(&run(&[cmd, &path]), &[&path, says]);
        }
        refused(&run_limited(&["diagnose"], Some(&data)), &[says]);
    }
}

// ---- streaming ------------------------------------------------------------

/// A log of `mib` MiB with evidence placed across the scanner's chunk
/// edges (every 8 MiB) and at random offsets.
fn chunky_log(mib: usize) -> Vec<u8> {
    let oom = std::fs::read(fixture("text/constructed_2_4_every_clause.log")).unwrap();
    let summary = std::fs::read(fixture("text/constructed_summary_2x_full.log")).unwrap();
    let noise = b"step 1200 | loss 2.3104 | lr 2.0e-05 | tokens/s 51234 | mem 61.2GiB\n";
    let mut out = Vec::new();
    let mut state = 7u64;
    let mut edge = 8 << 20;
    while out.len() < mib << 20 {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        if out.len() + 4096 > edge {
            // Put a piece of evidence across the edge, at a varying offset.
            let piece: &[u8] = if edge % (16 << 20) == 0 {
                &oom
            } else {
                &summary
            };
            let before = (state >> 33) as usize % piece.len().min(3000);
            while out.len() + before < edge {
                out.extend_from_slice(noise);
            }
            out.extend_from_slice(piece);
            out.push(b'\n');
            edge += 8 << 20;
        } else if state.is_multiple_of(5000) {
            out.extend_from_slice(&oom);
            out.push(b'\n');
        } else {
            out.extend_from_slice(noise);
        }
    }
    out
}

#[test]
fn standard_input_is_scanned_in_chunks_and_finds_what_the_file_scan_finds() {
    let dir = tempfile::tempdir().unwrap();
    let log = chunky_log(40);
    let path = write(dir.path(), "big.log", &log);
    let file = run(&["parse", "--format", "json", &path]);
    assert_eq!(file.code, 0, "{}", file.stderr);
    let n = serde_json::from_str::<serde_json::Value>(&file.stdout).unwrap()["observations"]
        .as_array()
        .unwrap()
        .len();
    assert!(n >= 8, "{n} observations");
    let strip = |s: &str, name: &str| s.replace(name, "INPUT");
    for (how, data) in [("plain", log.clone()), ("gzip", gzip(&log))] {
        let piped = run_limited(&["parse", "--format", "json", "-"], Some(&data));
        assert_eq!(piped.code, 0, "{how}: {}", piped.stderr);
        assert_eq!(
            strip(&piped.stdout, "\"standard input\""),
            strip(&file.stdout, &format!("{path:?}")),
            "{how}"
        );
    }
    // The same through diagnose, clues included.
    let d_file = run(&["diagnose", "--format", "json", &path]);
    let d_pipe = run_limited(&["diagnose", "--format", "json"], Some(&log));
    assert_eq!(d_pipe.code, d_file.code);
    assert_eq!(
        strip(&d_pipe.stdout, "\"standard input\""),
        strip(&d_file.stdout, &format!("{path:?}"))
    );
}

#[test]
fn every_limit_is_a_flag_and_named_when_passed() {
    let dir = tempfile::tempdir().unwrap();
    let snap = write(dir.path(), "n100.pickle", &shared_object_pickle(100));
    refused(
        &run(&["parse", &snap, "--max-blocks", "9999"]),
        &[
            "over the limit of 9999 snapshot blocks",
            "its segments list 10000 blocks",
            "--max-blocks N",
        ],
    );
    assert_eq!(run(&["parse", &snap, "--max-blocks", "10000"]).code, 0);
    refused(
        &run(&["diagnose", &snap, "--max-objects", "300"]),
        &["over the limit of 300 decoded values", "--max-objects N"],
    );
    refused(
        &run(&["replay", &snap, "--max-input-bytes", "100"]),
        &["over the limit of 100 bytes read", "--max-input-bytes SIZE"],
    );
    // Through a pipe, compressed: the decoded bytes count.
    let log = std::fs::read(fixture("text/constructed_2_4_every_clause.log")).unwrap();
    let big = log.repeat(2000);
    refused(
        &run_limited(&["parse", "--max-input-bytes", "1MiB"], Some(&gzip(&big))),
        &[
            "over the limit of 1048576 bytes read",
            "--max-input-bytes SIZE",
        ],
    );
    assert_eq!(
        run_limited(&["parse", "--max-input-bytes", "4MiB"], Some(&gzip(&big))).code,
        0
    );
}

/// A log of nothing but OOM messages holds about 20 times its size in
/// observations: their number is bounded, from a file and from a pipe.
#[test]
fn observations_of_one_text_input_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let one = |gib: u32| {
        format!(
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a \
             total capacity of 79.11 GiB of which 10.00 MiB is free. Of the allocated memory {gib}.00 \
             GiB is allocated by PyTorch, and 1.00 GiB is reserved by PyTorch but unallocated.\n"
        )
    };
    let text: String = (0..3000u32).map(|i| one(40 + i % 30)).collect();
    let path = write(dir.path(), "ooms.log", text.as_bytes());
    refused(
        &run(&["diagnose", &path, "--max-observations", "2000"]),
        &[
            "over the limit of 2000 observations",
            "one more starts at line 2001",
            "--max-observations N",
        ],
    );
    refused(
        &run_limited(
            &["parse", "--max-observations", "2000"],
            Some(text.as_bytes()),
        ),
        &[
            "over the limit of 2000 observations",
            "--max-observations N",
        ],
    );
    let r = run(&[
        "parse",
        &path,
        "--format",
        "json",
        "--max-observations",
        "3000",
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["observations"].as_array().map(Vec::len), Some(3000));
}

#[test]
fn endless_inputs_stop_at_the_byte_limit() {
    // /dev/zero never ends: read in chunks, it stops at the limit, not at
    // the address-space limit.
    let r = run(&["parse", "/dev/zero", "--max-input-bytes", "64MiB"]);
    refused(
        &r,
        &[
            "/dev/zero",
            "over the limit of 67108864 bytes read",
            "--max-input-bytes",
        ],
    );
}

// ---- output ---------------------------------------------------------------

#[test]
fn output_errors_are_exit_2_and_a_closed_pipe_is_quiet() {
    let log = fixture("text/constructed_2_4_every_clause.log")
        .display()
        .to_string();
    let full = || {
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .expect("/dev/full")
    };
    for args in [
        vec!["diagnose", log.as_str()],
        vec!["parse", "--format", "json", log.as_str()],
        vec!["conf", "check", "expandable_segments:True"],
        vec!["--help"],
    ] {
        let out = Command::new(BIN)
            .args(&args)
            .stdout(full())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("cannot write the output: No space left on device"),
            "{args:?}: {err}"
        );
    }
    // A report file that cannot be written.
    let out = Command::new(BIN)
        .args(["diagnose", &log, "--report", "/dev/full"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/dev/full"));
    // A reader that goes away: no message, the command's own exit code.
    let dir = tempfile::tempdir().unwrap();
    let many = String::from_utf8(std::fs::read(&log).unwrap())
        .unwrap()
        .repeat(3000);
    let path = write(dir.path(), "many.log", many.as_bytes());
    let mut child = Command::new(BIN)
        .args(["parse", "--format", "json", &path])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
}

#[test]
#[cfg(target_os = "linux")]
fn a_terminal_on_standard_input_gets_a_hint() {
    use std::os::fd::{FromRawFd, OwnedFd};
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty fills two fds that are then owned here.
    let ok = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(ok, 0);
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let child = Command::new(BIN)
        .arg("parse")
        .stdin(Stdio::from(slave))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // End of input, as a user's Ctrl-D on an empty line sends it.
    let mut m = std::fs::File::from(master);
    m.write_all(b"\x04").unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "paste the text, then press Ctrl-D on a new line (Ctrl-Z then Enter on Windows)"
        ),
        "{err}"
    );
    assert_eq!(out.status.code(), Some(0));
    // Not on a pipe or a file.
    let r = run_limited(&["parse"], Some(b"no evidence here\n"));
    assert!(!r.stderr.contains("Ctrl-D"), "{}", r.stderr);
}

#[test]
fn sizes_name_their_problem() {
    let trace = fixture("snapshots/gen-expandable-workload.csv")
        .display()
        .to_string();
    for (size, says) in [
        ("18446744073709551615", "16384 PiB is over 1 PiB"),
        // Past 2^64 is past the device limit too: it is the one named (issue 34).
        ("18446744073709551616", "'18446744073709551616': over 1 PiB"),
        ("99999999999999999999", "'99999999999999999999': over 1 PiB"),
        ("0", "a device of 0 bytes holds nothing"),
        ("2PiB", "over 1 PiB"),
    ] {
        refused(&run(&["replay", &trace, "--capacity", size]), &[says]);
    }
    let r = run(&[
        "replay",
        &trace,
        "--capacity",
        "24gb",
        "--conf",
        "",
        "--conf",
        "expandable_segments:True",
    ]);
    assert!(r.code == 0 || r.code == 1, "{}", r.stderr);
    assert_eq!(
        r.stderr.matches("is read as binary").count(),
        1,
        "{}",
        r.stderr
    );
}
