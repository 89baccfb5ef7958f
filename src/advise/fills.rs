//! What fills the card, for a diagnosis: the moment of a snapshot's trace
//! that matters (its OOM, else its peak; `snapshot::attribute` computed it
//! with the evidence) and, for a capacity OOM from a snapshot or from text,
//! what must go: the shortfall and the levers the largest category calls for.

use crate::evidence::fills::{Category, Growth, Moment, MomentKind, Stacks};
use crate::evidence::{Evidence, Kind, Observation};
use crate::rules::{Fact, Facts};
use serde::Serialize;

/// Rows `diagnose` shows in its "What fills the card" section.
pub const DIAGNOSE_ROWS: usize = 5;

/// The "What fills the card" part of a diagnosis.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fills {
    /// The snapshot it comes from, and its device.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_index: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stacks: Option<Stacks>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub moment: Option<Moment>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub growth: Vec<Growth>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub must_go: Option<MustGo>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// An OOM late in a run of steps (also in `notes`): `forecast`'s recipe.
    #[serde(skip)]
    pub late_oom: Option<String>,
}

/// How much must go for the request to fit: the request less what the
/// allocator could have used at best (the device's free memory and the
/// reserved memory no live tensor holds, as if it were one range). Freeing
/// less cannot make room: a cached block grows by at most what is freed, and
/// the device's free memory by what the allocator gives back, which is at
/// most the freed bytes and the cached free memory.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MustGo {
    pub request_bytes: u64,
    pub device_free_bytes: u64,
    pub reserved_free_bytes: u64,
    /// request − (device free + reserved free); 0 when it would have fitted.
    /// After a spill, at least what brings the cache and the request back
    /// onto the card.
    pub shortfall_bytes: u64,
    /// Reserved memory past the card's capacity (a Windows driver's spill
    /// into shared system memory); 0 without one.
    #[serde(skip_serializing_if = "is_zero")]
    pub spilled_bytes: u64,
    /// What live tensors held then.
    pub allocated_bytes: u64,
    /// shortfall / allocated.
    pub share_of_allocated: f64,
    /// The smallest card the trace runs on (filled by `top`, which replays it).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub smallest_card: Vec<SmallestCard>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub levers: Vec<Lever>,
    /// When live memory must go (a full card): how to find the largest
    /// batch or sequence that fits, without another OOM.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fit_recipe: Option<String>,
}

/// The recipe a full card calls for: two small recordings and `fit`.
pub const FIT_RECIPE: &str = "to find the largest batch (or sequence length) that fits without another OOM, record one step at two small sizes (allocdoc.capture.record_sizes(step, sizes=[1, 2]) in Python) and run `allocdoc fit size1.pickle size2.pickle --sizes 1,2 --capacity <the card>`";

/// The smallest card a config runs the trace on, by bisection.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SmallestCard {
    /// `current` or `recommended`.
    pub config: &'static str,
    pub conf: String,
    /// `None`: it runs out of memory on any card up to the one bisected from.
    pub capacity_bytes: Option<u64>,
}

/// A way to cut what the largest category holds, with the figure behind it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Lever {
    pub category: Category,
    /// What the category holds at the moment, and its share of live memory.
    pub bytes: u64,
    pub share: f64,
    pub lever: String,
}

/// The fills of a diagnosis of `evidence` diagnosed through `primary`, with
/// `facts` its figures and `capacity` whether the cause is a full card.
pub fn fills(
    evidence: &Evidence,
    primary: Option<&Observation>,
    facts: &Facts,
    capacity: bool,
) -> Option<Fills> {
    let source = snapshot_source(evidence, primary);
    let attribution = source.and_then(|o| o.detail.as_ref()?.fills.as_deref());
    // Computed with `Ask::default()`: five rows and the pre-trace one.
    let moment = attribution.and_then(|a| a.headline()).cloned();
    let must_go = (capacity && super::claims::must_go_bounded(facts))
        .then(
            || match moment.as_ref().filter(|m| m.moment == MomentKind::Oom) {
                Some(m) => from_moment(m),
                None => from_text(facts),
            },
        )
        .flatten()
        .map(|mut g| {
            if let Some(m) = &moment {
                g.levers = levers(m);
            }
            g
        });
    if moment.is_none() && must_go.is_none() {
        return None;
    }
    Some(Fills {
        input: source.map(|o| o.input.clone()),
        device_index: attribution.map(|a| a.device_index),
        stacks: attribution.map(|a| a.stacks),
        moment,
        growth: attribution.map(|a| a.growth.clone()).unwrap_or_default(),
        must_go,
        notes: attribution.map(|a| a.notes.clone()).unwrap_or_default(),
        late_oom: attribution.and_then(|a| a.late_oom.clone()),
    })
}

/// The snapshot whose attribution a diagnosis shows: the one diagnosed,
/// else one whose trace records an OOM, else the last with a trace, else
/// the last snapshot.
fn snapshot_source<'e>(
    evidence: &'e Evidence,
    primary: Option<&'e Observation>,
) -> Option<&'e Observation> {
    let attributed = |o: &&Observation| {
        o.kind == Kind::Snapshot && o.detail.as_ref().is_some_and(|d| d.fills.is_some())
    };
    let has = |o: &Observation, f: &dyn Fn(&crate::evidence::fills::Attribution) -> bool| {
        o.detail
            .as_ref()
            .and_then(|d| d.fills.as_deref())
            .is_some_and(f)
    };
    let snaps = || evidence.observations.iter().filter(attributed);
    primary
        .filter(attributed)
        .or_else(|| snaps().rfind(|o| has(o, &|a| a.moment(MomentKind::Oom).is_some())))
        .or_else(|| snaps().rfind(|o| has(o, &|a| a.traced)))
        .or_else(|| snaps().next_back())
}

/// What must go at a snapshot's recorded OOM.
pub fn from_moment(m: &Moment) -> Option<MustGo> {
    let request = m.request_bytes?;
    let reserved_free = m.reserved_bytes.saturating_sub(m.allocated_block_bytes);
    Some(must_go(
        request,
        m.device_free_bytes.unwrap_or(0),
        reserved_free,
        m.allocated_bytes,
    ))
}

/// What must go by an OOM message's figures. After a spill (more reserved
/// than the card holds) the cache and the request must come back onto the
/// card: at least reserved + request − capacity must go.
fn from_text(facts: &Facts) -> Option<MustGo> {
    let num = |n: &str| match facts.values.get(n) {
        Some(Fact::Num(v)) if *v >= 0.0 => Some(*v as u64),
        _ => None,
    };
    let request = num("requested")?;
    let mut g = must_go(
        request,
        num("free")?,
        num("reserved_unallocated").unwrap_or(0),
        num("allocated")?,
    );
    if let (Some(reserved), Some(capacity)) = (num("reserved"), num("capacity"))
        && reserved > capacity
    {
        g.spilled_bytes = reserved - capacity;
        let back = reserved.saturating_add(request) - capacity;
        g.shortfall_bytes = g.shortfall_bytes.max(back);
        g.share_of_allocated = share(g.shortfall_bytes, g.allocated_bytes);
    }
    Some(g)
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// `part / whole`, rounded to six places; 0 of nothing.
fn share(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        (part as f64 / whole as f64 * 1e6).round() / 1e6
    }
}

fn must_go(request: u64, device_free: u64, reserved_free: u64, allocated: u64) -> MustGo {
    let shortfall = request.saturating_sub(device_free.saturating_add(reserved_free));
    MustGo {
        request_bytes: request,
        device_free_bytes: device_free,
        reserved_free_bytes: reserved_free,
        shortfall_bytes: shortfall,
        spilled_bytes: 0,
        allocated_bytes: allocated,
        share_of_allocated: share(shortfall, allocated),
        smallest_card: Vec::new(),
        levers: Vec::new(),
        fit_recipe: (shortfall > 0).then(|| FIT_RECIPE.to_string()),
    }
}

/// The levers of the largest category that is not `unknown` (and of
/// `unknown` when it holds most: then the first lever is to see it).
pub fn levers(m: &Moment) -> Vec<Lever> {
    let Some(top) = m.categories.first() else {
        return Vec::new();
    };
    let known = m
        .categories
        .iter()
        .find(|c| c.category != Category::Unknown);
    let mut out = Vec::new();
    let mut add = |c: Category, bytes: u64, share: f64| {
        for &lever in levers_of(c) {
            out.push(Lever {
                category: c,
                bytes,
                share,
                lever: lever.to_string(),
            });
        }
    };
    if top.category == Category::Unknown {
        add(Category::Unknown, top.bytes, top.share);
    }
    if let Some(k) = known {
        add(k.category, k.bytes, k.share);
    }
    out
}

/// What cuts each category's memory.
fn levers_of(c: Category) -> &'static [&'static str] {
    match c {
        Category::Activations => &[
            "activation checkpointing (torch.utils.checkpoint) on the blocks whose forward allocates them: their activations are recomputed in backward instead of kept",
            "a smaller micro-batch or sequence length (activations grow with both), with gradient accumulation to keep the effective batch",
            "bf16 autocast (torch.autocast(\"cuda\", dtype=torch.bfloat16)): half the bytes per activation",
            "fused attention (torch.nn.functional.scaled_dot_product_attention) instead of materialised attention scores",
        ],
        Category::OptimizerState => &[
            "an 8-bit optimizer (bitsandbytes.optim.AdamW8bit): 2 bytes of state per parameter instead of Adam's 8",
            "sharded optimizer state across data-parallel ranks (ZeroRedundancyOptimizer, FSDP, DeepSpeed ZeRO-1)",
            "an optimizer with less state (SGD with momentum keeps one tensor per parameter, Adam two; Adafactor factors its second moment)",
        ],
        Category::OptimizerTemporaries => &[
            "foreach=False on the optimizer: the multi-tensor kernels allocate temporaries for a whole group of parameters at once",
        ],
        Category::Parameters => &[
            "parameters in bf16, or quantized weights (bitsandbytes, torchao) where accuracy allows",
            "sharded parameters (FSDP, tensor parallelism), or CPU offload of parameters not in use",
        ],
        Category::Gradients => &[
            "sharded gradients (FSDP, DeepSpeed ZeRO-2)",
            "optimizer.zero_grad(set_to_none=True) (the default from 2.0) so gradients are freed between steps",
        ],
        Category::BackwardTemporaries => &[
            "a smaller micro-batch: backward's temporaries grow with the activations they are computed from",
        ],
        Category::Unknown => &[
            "record the memory history from the start of the program (before the model is built), with stacks, so that what is live before the trace began or without a stack can be attributed",
        ],
    }
}
