//! What fills the card: the live allocations of a snapshot at a moment,
//! grouped by the code that made them (`snapshot::attribute` computes it).
//! Fields of every struct are in the order of the JSON keys (docs/json.md,
//! `top --format json`).

use serde::Serialize;

/// What an allocation holds, from its stack (`snapshot::attribute::frames`
/// gives the rules; docs/ARCHITECTURE.md says where they differ from Mosaic's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    Parameters,
    Gradients,
    OptimizerState,
    Activations,
    BackwardTemporaries,
    OptimizerTemporaries,
    Unknown,
}

impl Category {
    pub const ALL: [Category; 7] = [
        Category::Parameters,
        Category::Gradients,
        Category::OptimizerState,
        Category::Activations,
        Category::BackwardTemporaries,
        Category::OptimizerTemporaries,
        Category::Unknown,
    ];

    /// The JSON name.
    pub fn as_str(self) -> &'static str {
        match self {
            Category::Parameters => "parameters",
            Category::Gradients => "gradients",
            Category::OptimizerState => "optimizer_state",
            Category::Activations => "activations",
            Category::BackwardTemporaries => "backward_temporaries",
            Category::OptimizerTemporaries => "optimizer_temporaries",
            Category::Unknown => "unknown",
        }
    }

    /// The name in prose and tables.
    pub fn label(self) -> &'static str {
        match self {
            Category::Parameters => "parameters",
            Category::Gradients => "gradients",
            Category::OptimizerState => "optimizer state",
            Category::Activations => "activations",
            Category::BackwardTemporaries => "backward temporaries",
            Category::OptimizerTemporaries => "optimizer temporaries",
            Category::Unknown => "unknown",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }

    /// The category named `s` (JSON name or label).
    pub fn from_name(s: &str) -> Option<Category> {
        Category::ALL
            .into_iter()
            .find(|c| c.as_str() == s || c.label() == s)
    }
}

/// How live bytes are grouped (`top --by`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum Grouping {
    /// The first frame outside torch, the Python standard library and C++.
    #[default]
    Site,
    /// The first frame of your own code: also outside site-packages.
    User,
    /// The whole Python stack.
    Stack,
    /// parameters, gradients, optimizer state, activations, temporaries.
    Category,
    /// The block's size class (for snapshots that record no stacks).
    Size,
    /// The segment holding the block.
    Segment,
}

impl Grouping {
    pub fn as_str(self) -> &'static str {
        match self {
            Grouping::Site => "site",
            Grouping::User => "user",
            Grouping::Stack => "stack",
            Grouping::Category => "category",
            Grouping::Segment => "segment",
            Grouping::Size => "size",
        }
    }
}

/// Which moment of the trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MomentKind {
    /// The most allocated memory over the trace.
    Peak,
    /// The trace's last `oom` entry: the live set when the request failed.
    Oom,
    /// The end of the trace: the snapshot's segments.
    End,
    /// An event index asked for.
    Event,
    /// A time asked for.
    Time,
}

impl MomentKind {
    pub fn as_str(self) -> &'static str {
        match self {
            MomentKind::Peak => "peak",
            MomentKind::Oom => "oom",
            MomentKind::End => "end",
            MomentKind::Event => "event",
            MomentKind::Time => "time",
        }
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One group of live allocations at a moment.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// The site as shown (`einops/_backends.py:291:einsum`), the category, the
    /// size class, or one of the special rows (`<live before the trace began>`,
    /// `<no stack recorded>`, `<no Python frame>`).
    pub key: String,
    /// The frame's file as recorded (site and user groupings).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filename: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
    /// The Python frames, innermost first (stack grouping).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub frames: Vec<String>,
    /// The category holding most of the row's bytes.
    pub category: Category,
    /// Every category of the row's allocations, the largest first, when
    /// they are more than one: the row mixes categories.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mix: Vec<CategoryPart>,
    /// Σ requested bytes (the trace entries' `size`).
    pub bytes: u64,
    /// Σ block bytes: the requests as the allocator rounded them.
    pub block_bytes: u64,
    pub count: u64,
    /// bytes / the moment's allocated bytes.
    pub share: f64,
    /// The part of `bytes` live since before the trace began.
    pub pre_trace_bytes: u64,
}

/// The part of a group's bytes in one category.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CategoryPart {
    pub category: Category,
    pub bytes: u64,
}

/// Groups past the top N, summed.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Rest {
    pub groups: u64,
    pub bytes: u64,
    pub block_bytes: u64,
    pub count: u64,
    pub share: f64,
}

/// Memory live before the trace began (its ring buffer may start mid-run).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PreTrace {
    pub bytes: u64,
    pub block_bytes: u64,
    pub count: u64,
    /// Allocations still live at the end: blocks of the snapshot's segments
    /// that no `alloc` of the trace made.
    pub live_at_end_bytes: u64,
    /// Allocations the trace frees without having seen them allocated, still
    /// live at this moment.
    pub freed_in_trace_bytes: u64,
    /// The part whose blocks carry a recorded stack (shown by site in the rows).
    pub with_stack_bytes: u64,
    pub share: f64,
}

/// Reserved memory that no live allocation holds at the moment.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FreeReserved {
    /// Free bytes in segments that hold a live block (fragmentation).
    pub in_split_segments_bytes: u64,
    /// Segments that hold no live block.
    pub whole_free_segments: u64,
    pub whole_free_segments_bytes: u64,
}

/// Live bytes of one category.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CategoryRow {
    pub category: Category,
    pub bytes: u64,
    pub block_bytes: u64,
    pub count: u64,
    pub share: f64,
}

/// The live set at one moment, grouped.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Moment {
    pub moment: MomentKind,
    /// The trace entry after which the state holds (for `oom`, the `oom`
    /// entry itself: the state when it was recorded); `None` with no trace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_index: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_us: Option<i64>,
    /// Σ requested bytes of every live allocation, pre-trace ones included.
    pub allocated_bytes: u64,
    pub allocated_block_bytes: u64,
    pub live_allocations: u64,
    pub reserved_bytes: u64,
    /// Live bytes at addresses outside every segment the snapshot records at
    /// this moment (the trace and the segments disagree).
    #[serde(skip_serializing_if = "is_zero")]
    pub outside_segments_bytes: u64,
    /// `oom`: the request that failed and what cudaMemGetInfo reported free.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_free_bytes: Option<u64>,
    pub by: Grouping,
    pub rows: Vec<Row>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rest: Option<Rest>,
    pub pre_trace: PreTrace,
    pub free_reserved: FreeReserved,
    pub categories: Vec<CategoryRow>,
}

/// A call site whose live bytes rose at every step boundary of a run of steps.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Growth {
    pub site: String,
    /// The site's category as the peak's table gives it (what it holds
    /// then), so the two tables never name it differently.
    pub category: Category,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mix: Vec<CategoryPart>,
    /// Steps are numbered from 0, the first step of the trace.
    pub first_step: u64,
    pub last_step: u64,
    /// Live bytes at the start of `first_step` and of `last_step`.
    pub first_bytes: u64,
    pub last_bytes: u64,
    pub bytes_per_step: u64,
}

/// What the snapshot's stacks hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stacks {
    /// Python and C++ frames (`_record_memory_history(stacks="all")`).
    PythonAndCpp,
    Python,
    Cpp,
    /// No frames anywhere.
    None,
}

/// Allocated memory stacked by category over the trace (the HTML timeline):
/// at most a few thousand points, each the state of its stretch of entries
/// where the most was allocated.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Timeline {
    /// Per point: the entry index and the bytes of each category, in
    /// [`Category::ALL`] order.
    pub points: Vec<(u64, [u64; 7])>,
}

/// What fills one device's memory.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Attribution {
    pub device_index: u32,
    pub trace_entries: u64,
    /// The trace records allocations (`alloc` or `free_completed` entries).
    pub traced: bool,
    pub stacks: Stacks,
    /// The entry after which allocated memory first reached its peak.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_event_index: Option<u64>,
    pub moments: Vec<Moment>,
    pub steps: u64,
    pub growth: Vec<Growth>,
    /// What the reader must know to trust the figures (a trace that starts
    /// mid-run, entries that contradict the segments, …).
    pub notes: Vec<String>,
    /// The note of an OOM late in a run of steps that do not grow (also in
    /// `notes`): what `forecast` answers.
    #[serde(skip)]
    pub late_oom: Option<String>,
    #[serde(skip)]
    pub timeline: Timeline,
}

impl Attribution {
    /// The moment of `kind`, if computed.
    pub fn moment(&self, kind: MomentKind) -> Option<&Moment> {
        self.moments.iter().find(|m| m.moment == kind)
    }

    /// The moment a diagnosis is about: the OOM when the trace records one,
    /// else the peak, else the end.
    pub fn headline(&self) -> Option<&Moment> {
        self.moment(MomentKind::Oom)
            .or_else(|| self.moment(MomentKind::Peak))
            .or_else(|| self.moments.first())
    }
}

/// One side of a `diff`: the moment compared and its totals.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Side {
    pub input: String,
    pub device_index: u32,
    pub moment: MomentKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_index: Option<u64>,
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    pub live_allocations: u64,
    pub pre_trace_bytes: u64,
    /// What `pre_trace_bytes` holds, as `top` splits it: a part may be
    /// shown by site, so the `<live before the trace began>` row can be less.
    pub pre_trace: PreTrace,
    /// The side's peak of allocated memory (its trace's), when it has a trace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_allocated_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_event_index: Option<u64>,
}

/// One group compared: what it holds before and after.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DiffRow {
    pub key: String,
    pub category: Category,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mix: Vec<CategoryPart>,
    pub before_bytes: u64,
    pub after_bytes: u64,
    /// after − before.
    pub delta_bytes: i64,
    pub before_count: u64,
    pub after_count: u64,
}

/// Two snapshots' moments compared group by group (`allocdoc diff`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Diff {
    pub before: Side,
    pub after: Side,
    pub by: Grouping,
    /// The groups with the largest change first (at most the top N).
    pub rows: Vec<DiffRow>,
    /// The groups past the top N, summed (key: how many).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rest: Option<DiffRow>,
    pub categories: Vec<DiffRow>,
    pub notes: Vec<String>,
}

/// One rank's (or input's) memory in a several-rank view.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RankFill {
    /// From the file name (`rank3.pickle`, `snapshot_rank_3_…`), when it names one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    pub input: String,
    pub device_index: u32,
    /// The moment shown: the OOM when recorded, else the peak, else the end.
    pub moment: MomentKind,
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_site: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_site_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_category: Option<Category>,
    /// Off the median by more than 10 % and 256 MiB.
    pub outlier: bool,
}

/// The several-rank view: a row per rank and how uneven they are.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Ranks {
    pub rows: Vec<RankFill>,
    /// The largest allocated figure over the smallest (0 when one is 0).
    pub imbalance: f64,
    /// The row furthest from the median, when it is an outlier.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outlier_rank: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outlier_input: Option<String>,
}
