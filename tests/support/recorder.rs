//! Generated snapshots with a recorded trace: a training loop run through the
//! bundled allocator with `_record_memory_history` on, written by
//! `snapshot::writer` (optionally with stacks on chosen entries and step
//! annotations), the way `replay --emit-snapshot` writes its snapshots.

use allocdoc::allocator::{CachingAllocator, TraceAction, TraceEntry};
use allocdoc::conf::Settings;
use allocdoc::device::sim::SimDevice;
use allocdoc::snapshot::writer::{self, Annotation, Frame, RecordedSettings, Stack};

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// A stack, innermost call first: (file, line, function).
pub fn stack(frames: &[(&str, i64, &str)]) -> Vec<Frame> {
    frames
        .iter()
        .map(|&(filename, line, name)| Frame {
            filename: filename.into(),
            line,
            name: name.into(),
        })
        .collect()
}

/// Where `torch.cuda.empty_cache()` records its frames from (context="all").
pub fn empty_cache_stack(line: i64) -> Vec<Frame> {
    stack(&[
        (
            "/opt/conda/lib/python3.11/site-packages/torch/cuda/memory.py",
            222,
            "empty_cache",
        ),
        ("/home/user/project/train.py", line, "train_one_epoch"),
        ("/home/user/project/train.py", 140, "<module>"),
    ])
}

pub struct Recorder {
    pub a: CachingAllocator<SimDevice>,
    trace: Vec<TraceEntry>,
    stacks: Vec<Stack>,
    annotations: Vec<Annotation>,
    settings: Settings,
    conf: String,
}

impl Recorder {
    pub fn new(conf: &str, capacity: u64) -> Recorder {
        let settings = allocdoc::conf::parse(conf, allocdoc::conf::TorchVersion::DEFAULT)
            .unwrap()
            .settings;
        let mut a = CachingAllocator::new(settings.clone(), SimDevice::new(capacity));
        a.record_history();
        Recorder {
            a,
            trace: Vec::new(),
            stacks: Vec::new(),
            annotations: Vec::new(),
            settings,
            conf: conf.into(),
        }
    }

    /// Takes what the last call recorded; entries of `actions` get `frames`.
    fn take(&mut self, frames: Option<(Vec<Frame>, &[TraceAction])>) {
        let start = self.trace.len();
        self.trace.extend(self.a.take_trace());
        if let Some((frames, actions)) = frames {
            let entries: Vec<usize> = (start..self.trace.len())
                .filter(|&i| actions.contains(&self.trace[i].action))
                .collect();
            if !entries.is_empty() {
                self.stacks.push(Stack {
                    device: 0,
                    entries,
                    frames,
                });
            }
        }
    }

    pub fn malloc(&mut self, size: u64, stream: u64) -> u64 {
        let p = self.a.malloc(size, stream).unwrap();
        self.take(None);
        p
    }

    /// A malloc whose every entry (segment releases, segment_alloc, alloc)
    /// carries `frames`, as malloc's own context does.
    pub fn malloc_at(&mut self, size: u64, frames: Vec<Frame>) -> Result<u64, ()> {
        let r = self.a.malloc(size, 0).map_err(|_| ());
        let all = [
            TraceAction::SegmentFree,
            TraceAction::SegmentAlloc,
            TraceAction::Alloc,
            TraceAction::Oom,
        ];
        self.take(Some((frames, &all)));
        r
    }

    pub fn free(&mut self, p: u64) {
        self.free_at(p, None);
    }

    /// A free whose `free_requested` entry carries `frames`.
    pub fn free_at(&mut self, p: u64, frames: Option<Vec<Frame>>) {
        self.a.free(p).unwrap();
        self.take(frames.map(|f| (f, &[TraceAction::FreeRequested][..])));
    }

    pub fn record_stream(&mut self, p: u64, stream: u64) {
        self.a.record_stream(p, stream).unwrap();
    }

    pub fn synchronize_stream(&mut self, stream: u64) {
        self.a.synchronize_stream(stream);
    }

    /// `torch.cuda.empty_cache()`; its releases carry `frames` when given.
    pub fn empty_cache(&mut self, frames: Option<Vec<Frame>>) {
        self.a.empty_cache();
        self.take(frames.map(|f| (f, &[TraceAction::SegmentFree][..])));
    }

    /// A `record_function` START annotation at the next entry's time.
    pub fn annotate_start(&mut self, name: &str) {
        self.annotations.push(Annotation {
            name: name.into(),
            stage: "START".into(),
            device: 0,
            time_us: self.trace.len() as i64,
        });
    }

    /// The snapshot pickle: final segments, the trace from entry `from`.
    pub fn snapshot_from(&self, from: usize) -> Vec<u8> {
        let mut snap = writer::Snapshot::from_allocator(
            &self.a.segments(),
            self.trace.get(from..).unwrap_or_default(),
            Some(RecordedSettings {
                conf: self.conf.clone(),
                settings: self.settings.clone(),
            }),
        );
        snap.stacks = self
            .stacks
            .iter()
            .map(|s| Stack {
                device: 0,
                entries: s
                    .entries
                    .iter()
                    .filter_map(|&e| e.checked_sub(from))
                    .collect(),
                frames: s.frames.clone(),
            })
            .collect();
        snap.annotations = self.annotations.clone();
        writer::to_bytes(&snap)
    }

    pub fn snapshot(&self) -> Vec<u8> {
        self.snapshot_from(0)
    }
}

/// What varies in [`training_loop`].
#[derive(Clone, Default)]
pub struct Loop {
    pub steps: u64,
    /// Sequence length per step, in 1..=512 (512: fixed shapes).
    pub seq: Option<fn(u64) -> u64>,
    /// Call `empty_cache()` at the end of every step (with this line's stack).
    pub empty_cache_line: Option<i64>,
    /// Call `empty_cache()` at the end of every step, recorded without a
    /// stack (`_record_memory_history(context="alloc")`, or before 2.1).
    pub empty_cache_unrecorded: bool,
    /// Activations also used on side stream 7 (`record_stream`), which is
    /// synchronized only at the end of the step.
    pub side_stream: bool,
    /// `ProfilerStep#N` annotations at each step start.
    pub annotate: bool,
}

/// A training loop: 8 weights of 64 MiB, then per step 6 layers of
/// activations (24 MiB at full length) with a temporary each, a backward
/// pass that frees them in reverse with a gradient temporary, and small
/// optimizer temporaries.
pub fn training_loop(conf: &str, l: &Loop) -> Recorder {
    let mut r = Recorder::new(conf, 16 * GIB);
    let _weights: Vec<u64> = (0..8).map(|_| r.malloc(64 * MIB, 0)).collect();
    for step in 0..l.steps {
        if l.annotate {
            r.annotate_start(&format!("ProfilerStep#{step}"));
        }
        let seq = l.seq.map_or(512, |f| f(step));
        let scaled = |bytes: u64| bytes / 512 * seq;
        let mut acts = Vec::new();
        for layer in 0..6u64 {
            let act = r.malloc(scaled(24 * MIB) + layer * 4096, 0);
            if l.side_stream {
                r.record_stream(act, 7);
            }
            acts.push(act);
            let tmp = r.malloc(scaled(8 * MIB), 0);
            r.free(tmp);
        }
        for act in acts.into_iter().rev() {
            let grad = r.malloc(scaled(24 * MIB), 0);
            r.free(grad);
            let frames = l.side_stream.then(|| {
                stack(&[
                    ("/home/user/project/model.py", 57, "backward_layer"),
                    ("/home/user/project/train.py", 96, "train_one_epoch"),
                ])
            });
            r.free_at(act, frames);
        }
        for _ in 0..4 {
            let t = r.malloc(512 * 1024, 0);
            r.free(t);
        }
        if l.side_stream {
            r.synchronize_stream(7);
        }
        if let Some(line) = l.empty_cache_line {
            r.empty_cache(Some(empty_cache_stack(line)));
        }
        if l.empty_cache_unrecorded {
            r.empty_cache(None);
        }
    }
    r
}
