//! The claims a verdict makes, each with the one condition under which it may
//! be said (issue 34). A sentence that says "the card is full", "no allocator
//! setting will help", "set expandable_segments:True", "run nvidia-smi" or
//! "proven" rests on the condition stated here: the facts expose the figure
//! conditions to the rules (`card_full`, `room_in_pieces`, `cached_holds_request`),
//! `advise` words the no-line sentence and `trial` grades its strength through
//! them, and the claims test (tests/support/verdicts.rs) finds every claim in
//! what the commands print and fails when its condition does not hold or two
//! claims contradict each other.

use crate::evidence::DeviceKind;
use crate::rules::{Cause, Fact, Facts};
use crate::workload::RunFigures;

/// Below this share of the card free, the card is full.
pub const FULL_FREE_SHARE: f64 = 0.15;

/// A claim a printed sentence can make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// "the card is full", "a card this full".
    CardFull,
    /// "No allocator setting will help", "no allocator setting frees enough".
    NoSettingHelps,
    /// A line to set (`export PYTORCH_CUDA_ALLOC_CONF=…`).
    SetsLine,
    /// expandable_segments:True offered as a way past the OOM.
    SuggestsExpandable,
    /// The cause is fragmentation: the memory exists but is split.
    Fragmentation,
    /// The cause is capacity: live tensors leave too little room.
    Capacity,
    /// NVIDIA's tools and switches: nvidia-smi, CUDA_LAUNCH_BLOCKING, MIG.
    CudaTools,
    /// Nothing in the memory state stands out.
    NothingStandsOut,
    /// The evidence records no OOM.
    NoOomRecorded,
    /// The evidence holds no figures a probe could be fitted to.
    NoFigures,
    /// A lower bound on what must go, from an OOM's figures.
    MustGo,
    /// The setup is Linux.
    Linux,
}

/// What a claim is held to: the diagnosis's facts, its cause and device.
#[derive(Debug, Clone, Copy)]
pub struct Grounds<'a> {
    pub facts: &'a Facts,
    pub cause: Cause,
    pub device: DeviceKind,
}

fn num(facts: &Facts, name: &str) -> Option<f64> {
    match facts.values.get(name) {
        Some(Fact::Num(v)) => Some(*v),
        _ => None,
    }
}

fn flag(facts: &Facts, name: &str) -> bool {
    facts.values.get(name) == Some(&Fact::Bool(true))
}

/// Little of the card is free: under [`FULL_FREE_SHARE`] of it by the free
/// figure, or, without one, live and cached memory fill that much of it.
/// A request that alone is most of the card is not a full card. Without a
/// capacity figure (a snapshot), reserved plus free memory is a lower bound
/// on it, so a free share under that bound is under the card's too.
pub fn card_full(facts: &Facts) -> Option<bool> {
    let capacity = num(facts, "capacity")
        .or_else(|| Some(num(facts, "reserved")? + num(facts, "free")?))
        .filter(|c| *c > 0.0)?;
    if num(facts, "allocated").is_some_and(|a| a > capacity) {
        return Some(true);
    }
    match num(facts, "free") {
        Some(free) => Some(free < FULL_FREE_SHARE * capacity),
        None => {
            let held = num(facts, "allocated")? + num(facts, "reserved_unallocated").unwrap_or(0.0);
            Some(held >= (1.0 - FULL_FREE_SHARE) * capacity)
        }
    }
}

/// The request fits in free and cached memory together but in neither
/// alone: the memory exists, in two pieces (issue 34 decides this shape
/// once: fragmentation, whatever share of the card the cached part is).
pub fn room_in_pieces(facts: &Facts) -> Option<bool> {
    let (r, f) = (num(facts, "requested")?, num(facts, "free")?);
    let c = num(facts, "reserved_unallocated")?;
    Some(f < r && c < r && f + c >= r)
}

/// The cache's unused part alone is as large as the request.
pub fn cached_holds_request(facts: &Facts) -> Option<bool> {
    Some(num(facts, "reserved_unallocated")? >= num(facts, "requested")?)
}

/// Whether some setting could place the request: it fits in the cached
/// memory, or in free and cached memory together. (More free than the
/// request is not such room: cudaMalloc failed with it, and no setting
/// changes cudaMalloc.)
fn room_for_a_setting(facts: &Facts) -> bool {
    cached_holds_request(facts) == Some(true) || room_in_pieces(facts) == Some(true)
}

/// An OOM's figures bound what must go: the native allocator's, whose
/// message states what its cache holds unused; cudaMallocAsync's pool keeps
/// freed memory the message does not state.
pub fn must_go_bounded(facts: &Facts) -> bool {
    !flag(facts, "backend_async")
}

/// A replay that exercised what configs decide: it replayed an allocation
/// (a request configs can serve differently; a trace of frees alone makes
/// every config do the same), and some run made a cudaMalloc or a cudaFree,
/// or ran out of memory. Only such a replay may be "proven" (docs/json.md),
/// in every command.
pub fn exercised(runs: &[&RunFigures]) -> bool {
    runs.iter().any(|r| r.alloc_events > 0)
        && runs
            .iter()
            .any(|r| r.device_allocs + r.device_frees > 0 || r.oom.is_some())
}

impl Claim {
    pub const ALL: [Claim; 12] = [
        Claim::CardFull,
        Claim::NoSettingHelps,
        Claim::SetsLine,
        Claim::SuggestsExpandable,
        Claim::Fragmentation,
        Claim::Capacity,
        Claim::CudaTools,
        Claim::NothingStandsOut,
        Claim::NoOomRecorded,
        Claim::NoFigures,
        Claim::MustGo,
        Claim::Linux,
    ];

    /// The words by which printed text makes the claim (case-insensitive).
    pub fn words(self) -> &'static [&'static str] {
        match self {
            Claim::CardFull => &["the card is full", "a card this full", ": it is full"],
            Claim::NoSettingHelps => &[
                "no allocator setting will help",
                "no allocator setting can help",
                "no allocator setting can free enough",
                "no allocator setting frees enough",
            ],
            Claim::SetsLine => &[
                "export pytorch_cuda_alloc_conf=",
                "set pytorch_cuda_alloc_conf=",
            ],
            Claim::SuggestsExpandable => &[
                "expandable_segments:true may",
                "set expandable_segments:true",
                "alloc_conf=expandable_segments:true",
                "turn on expandable_segments",
            ],
            Claim::Fragmentation => &["fragmentation: "],
            Claim::Capacity => &["capacity: "],
            Claim::CudaTools => &["nvidia-smi", "cuda_launch_blocking", "a mig slice"],
            Claim::NothingStandsOut => &["nothing in the memory state stands out"],
            Claim::NoOomRecorded => &["no oom to avoid", "no out-of-memory error in the evidence"],
            Claim::NoFigures => &["no oom message or memory summary with allocated"],
            Claim::MustGo => &["what must go: at least"],
            Claim::Linux => &["linux ("],
        }
    }

    /// Whether `text` makes the claim.
    pub fn made_in(self, text: &str) -> bool {
        let lower = text.to_ascii_lowercase();
        self.words().iter().any(|w| match self {
            // A cause is claimed where a verdict starts with it.
            Claim::Fragmentation | Claim::Capacity if w.ends_with(": ") => lower
                .lines()
                .any(|l| l.trim_start_matches("verdict: ").starts_with(w)),
            _ => lower.contains(w),
        })
    }

    /// Why the claim may not be made on these grounds; `None` when it may.
    pub fn refuted(self, g: &Grounds) -> Option<String> {
        let f = g.facts;
        match self {
            Claim::CardFull => match card_full(f) {
                Some(true) => None,
                Some(false) => Some(format!(
                    "{} of {} is free",
                    show(num(f, "free")),
                    show(num(f, "capacity"))
                )),
                None => Some("no capacity figure".into()),
            },
            Claim::NoSettingHelps => room_for_a_setting(f).then(|| {
                format!(
                    "the {} request fits in the {} cached unused (with {} free)",
                    show(num(f, "requested")),
                    show(num(f, "reserved_unallocated")),
                    show(num(f, "free"))
                )
            }),
            Claim::SetsLine => None,
            Claim::SuggestsExpandable => {
                if flag(f, "expandable_segments_on") {
                    Some("expandable segments are already on".into())
                } else if flag(f, "windows") {
                    Some("PyTorch ignores expandable segments on Windows".into())
                } else if f.values.get("expandable_segments_supported") == Some(&Fact::Bool(false))
                {
                    Some("expandable segments are not supported in this setup".into())
                } else {
                    None
                }
            }
            Claim::Fragmentation => {
                let oom_figures = num(f, "requested").is_some() && num(f, "free").is_some();
                (oom_figures && !room_for_a_setting(f)).then(|| {
                    format!(
                        "the {} request fits neither in the {} cached unused nor with the {} free",
                        show(num(f, "requested")),
                        show(num(f, "reserved_unallocated")),
                        show(num(f, "free"))
                    )
                })
            }
            Claim::Capacity => (room_in_pieces(f) == Some(true))
                .then(|| "free and cached memory together hold the request".into()),
            Claim::CudaTools => (g.device != DeviceKind::Cuda || flag(f, "rocm"))
                .then(|| format!("the device is {:?}, not an NVIDIA GPU", g.device)),
            // An OOM counted stands out, whatever the state after it.
            Claim::NothingStandsOut | Claim::NoOomRecorded => {
                let ooms = num(f, "ooms").unwrap_or(0.0);
                (ooms >= 1.0).then(|| format!("the evidence counts {ooms} OOM(s)"))
            }
            Claim::NoFigures => (num(f, "allocated").is_some() && num(f, "reserved").is_some())
                .then(|| "the evidence states allocated and reserved figures".into()),
            Claim::MustGo => (!must_go_bounded(f))
                .then(|| "cudaMallocAsync's figures do not bound what must go".into()),
            Claim::Linux => {
                matches!(g.device, DeviceKind::Mps).then(|| "an MPS device runs on macOS".into())
            }
        }
    }
}

/// Claims that cannot stand in one answer.
pub const CONTRADICTIONS: [(Claim, Claim); 5] = [
    (Claim::NoSettingHelps, Claim::SetsLine),
    (Claim::NoSettingHelps, Claim::SuggestsExpandable),
    (Claim::NoSettingHelps, Claim::Fragmentation),
    (Claim::Capacity, Claim::Fragmentation),
    (Claim::NothingStandsOut, Claim::MustGo),
];

/// Every claim `texts` make whose condition does not hold on `g`, and every
/// pair of claims they make that contradict each other, one line each.
pub fn check(texts: &[&str], g: &Grounds) -> Vec<String> {
    let made: Vec<Claim> = Claim::ALL
        .into_iter()
        .filter(|c| texts.iter().any(|t| c.made_in(t)))
        .collect();
    let mut bad: Vec<String> = made
        .iter()
        .filter_map(|c| c.refuted(g).map(|why| format!("{c:?} said, but {why}")))
        .collect();
    for (a, b) in CONTRADICTIONS {
        if made.contains(&a) && made.contains(&b) {
            bad.push(format!("{a:?} beside {b:?}"));
        }
    }
    bad
}

fn show(v: Option<f64>) -> String {
    v.map_or_else(
        || "?".into(),
        |v| crate::units::format_size(v.max(0.0) as u64),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(pairs: &[(&str, f64)]) -> Facts {
        let mut f = Facts::default();
        for (k, v) in pairs {
            f.set(k, Fact::Num(*v));
        }
        f
    }

    const GIB: f64 = (1u64 << 30) as f64;

    /// A capacity verdict on an NVIDIA GPU, on `f`.
    fn on_cuda(f: &Facts) -> Grounds<'_> {
        Grounds {
            facts: f,
            cause: Cause::Capacity,
            device: DeviceKind::Cuda,
        }
    }

    #[test]
    fn a_card_three_quarters_free_is_not_full() {
        // 6.10 GiB asked of a 7.92 GiB card with 6.16 GiB free.
        let f = facts(&[
            ("capacity", 7.92 * GIB),
            ("free", 6.16 * GIB),
            ("requested", 6.10 * GIB),
            ("allocated", 0.41 * GIB),
        ]);
        assert_eq!(card_full(&f), Some(false));
        let g = on_cuda(&f);
        assert_eq!(check(&["The card is full: ..."], &g).len(), 1);
        let full = facts(&[("capacity", 7.92 * GIB), ("free", 0.3 * GIB)]);
        assert_eq!(card_full(&full), Some(true));
    }

    #[test]
    fn two_pieces_are_fragmentation_and_no_setting_may_not_be_said() {
        // 3.50 GiB asked, 2.90 GiB free, 890 MiB cached unused.
        let f = facts(&[
            ("capacity", 39.39 * GIB),
            ("free", 2.90 * GIB),
            ("requested", 3.50 * GIB),
            ("reserved_unallocated", 0.869 * GIB),
        ]);
        assert_eq!(room_in_pieces(&f), Some(true));
        let g = on_cuda(&f);
        let bad = check(
            &[
                "capacity: …",
                "No allocator setting will help here (capacity).",
            ],
            &g,
        );
        assert_eq!(bad.len(), 2, "{bad:?}");
        assert!(check(&["fragmentation: …"], &g).is_empty());
    }

    #[test]
    fn only_an_exercised_replay_may_be_proven() {
        let idle = RunFigures::default();
        let busy = RunFigures {
            device_allocs: 1,
            alloc_events: 1,
            ..RunFigures::default()
        };
        assert!(!exercised(&[&idle, &idle]));
        assert!(exercised(&[&idle, &busy]));
        // A cudaFree in a trace without an allocation: every config makes it.
        let frees_only = RunFigures {
            device_frees: 1,
            ..RunFigures::default()
        };
        assert!(!exercised(&[&frees_only, &frees_only]));
    }
}
