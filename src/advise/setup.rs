//! The user's setup, settled before anything is judged: the PyTorch version,
//! the platform, the allocator backend, the device kind and the config in
//! effect, each with where it came from and how sure that is. Every command
//! resolves one [`Setup`] and hands it to the candidate space
//! ([`super::space::Space`]), the rules and the replays, so that no answer
//! names a value PyTorch would reject or ignore there.
//!
//! Precedence: a flag (`--torch-version`, `--platform`, `--conf`) over what
//! the text states (a version line, a `PYTORCH_CUDA_ALLOC_CONF=` line), over
//! what the evidence implies (the message format's era, snapshot and stats
//! keys, Windows paths, a HIP device), over an assumption that is said out loud.

use super::context::Context;
use crate::conf::{Platform, Settings, TorchVersion};
use crate::evidence::{Backend, DeviceKind, Evidence, Kind, Observation};
use crate::rules::VersionRange;
use serde::Serialize;

/// How sure a part of the setup is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Certainty {
    /// Assumed: nothing in the input says it.
    Assumed,
    /// Implied by the evidence (a message format, a key, a path).
    Inferred,
    /// Stated in the text (a version line, a config line).
    Stated,
    /// Given on the command line.
    Given,
}

impl Certainty {
    pub fn as_str(self) -> &'static str {
        match self {
            Certainty::Assumed => "assumed",
            Certainty::Inferred => "inferred",
            Certainty::Stated => "stated",
            Certainty::Given => "given",
        }
    }
}

/// A part of the setup, where it came from, and how sure that is.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Known<T> {
    pub value: T,
    pub certainty: Certainty,
    /// Where it came from, e.g. "--torch-version", "the message format (2.4+)".
    pub source: String,
}

impl<T> Known<T> {
    fn new(value: T, certainty: Certainty, source: impl Into<String>) -> Self {
        Known {
            value,
            certainty,
            source: source.into(),
        }
    }
}

/// What the flags of a command say about the setup.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SetupFlags {
    /// `--torch-version`.
    pub torch: Option<TorchVersion>,
    /// `--platform`.
    pub platform: Option<Platform>,
}

/// The user's setup.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Setup {
    /// The PyTorch versions the setup allows (exact when given or stated).
    #[serde(serialize_with = "serialize_range")]
    pub torch: Known<VersionRange>,
    pub platform: Known<Platform>,
    pub backend: Known<Backend>,
    /// The device the OOM happened on; `PYTORCH_CUDA_ALLOC_CONF` governs CUDA
    /// and HIP devices only.
    pub device: DeviceKind,
    /// The config in effect (value as written) and where it came from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current: Option<Known<String>>,
    /// The settings of `current` when PyTorch accepts it.
    #[serde(skip)]
    pub current_settings: Option<Settings>,
}

fn serialize_range<S: serde::Serializer>(k: &Known<VersionRange>, s: S) -> Result<S::Ok, S::Error> {
    Known {
        value: range_text(k.value),
        certainty: k.certainty,
        source: k.source.clone(),
    }
    .serialize(s)
}

/// "2.4", "2.4+", "1.10-2.0", "up to 0.99", "unknown".
pub fn range_text(r: VersionRange) -> String {
    match (r.lo, r.hi) {
        (Some(lo), Some(hi)) if lo == hi => lo.to_string(),
        (Some(lo), Some(hi)) => format!("{lo}-{hi}"),
        (Some(lo), None) => format!("{lo}+"),
        (None, Some(hi)) => format!("up to {hi}"),
        (None, None) => "unknown".to_string(),
    }
}

impl Setup {
    /// The setup of a run with no evidence to read (a trace CSV): the flags,
    /// else PyTorch's defaults on Linux, said to be assumed.
    pub fn of_flags(flags: &SetupFlags) -> Setup {
        let ctx = Context {
            flags: flags.clone(),
            ..Context::default()
        };
        Setup::resolve(&Evidence::default(), &ctx)
    }

    /// Settles the setup from the flags (`ctx.flags`), the text's clues
    /// (the rest of `ctx`) and the evidence.
    pub fn resolve(evidence: &Evidence, ctx: &Context) -> Setup {
        let flags = &ctx.flags;
        let torch = match (flags.torch, ctx.torch) {
            (Some(v), _) => Known::new(VersionRange::exact(v), Certainty::Given, "--torch-version"),
            (None, Some(r)) => Known::new(r, Certainty::Stated, "a version line in the text"),
            (None, None) => inferred_version(evidence, ctx),
        };
        let hip = evidence
            .observations
            .iter()
            .any(|o| o.device_kind == Some(DeviceKind::Hip));
        let platform = match flags.platform {
            Some(p) => Known::new(p, Certainty::Given, "--platform"),
            None if hip => Known::new(
                Platform::Rocm,
                Certainty::Inferred,
                "a HIP device in the OOM",
            ),
            None if ctx.windows => Known::new(
                Platform::Windows,
                Certainty::Inferred,
                "Windows paths in the text",
            ),
            // Only Windows drivers let cudaMalloc spill into shared system
            // memory ("CUDA - Sysmem Fallback Policy"): a cache larger than the card.
            None if evidence.observations.iter().any(spills) => Known::new(
                Platform::Windows,
                Certainty::Inferred,
                "more allocated than the card holds (the shared-memory fallback of Windows drivers)",
            ),
            None => Known::new(
                Platform::Linux,
                Certainty::Assumed,
                "nothing in the input names Windows or ROCm",
            ),
        };
        let device = evidence
            .observations
            .iter()
            .filter(|o| matches!(o.kind, Kind::Oom | Kind::NonAllocatorOom))
            .find_map(|o| o.device_kind)
            .unwrap_or(if hip {
                DeviceKind::Hip
            } else {
                DeviceKind::Cuda
            });
        let stated_backend = evidence.observations.iter().find_map(|o| o.backend);
        let backend = match (stated_backend, ctx.current.as_ref()) {
            (Some(b), _) => Known::new(b, Certainty::Inferred, "the OOM message"),
            (None, Some(c)) => Known::new(
                c.backend,
                Certainty::Stated,
                ctx.current_source.as_ref().map_or("the config", |s| s.1),
            ),
            (None, None) => Known::new(Backend::Native, Certainty::Assumed, "PyTorch's default"),
        };
        let current = ctx.current_source.as_ref().map(|(value, source)| {
            let certainty = if source.starts_with("--") {
                Certainty::Given
            } else {
                Certainty::Stated
            };
            Known::new(value.clone(), certainty, *source)
        });
        Setup {
            torch,
            platform,
            backend,
            device,
            current,
            current_settings: ctx.current.clone(),
        }
    }

    /// The version the bundled allocator follows for this setup: the exact
    /// version when known, else PyTorch's default clamped into the range.
    pub fn replay_version(&self) -> TorchVersion {
        let r = self.torch.value;
        let mut v = TorchVersion::DEFAULT;
        if let Some(lo) = r.lo {
            v = v.max(lo);
        }
        if let Some(hi) = r.hi {
            v = v.min(hi);
        }
        v
    }

    /// The versions a value must be valid in: the replay version alone, the
    /// one resolution of the version every command shares (`recommend`
    /// searches, `validate` reads its candidate and the answer admits its
    /// line there). Older releases the range allows are named in a note
    /// instead ([`Setup::rejected_in_range`]).
    pub fn versions(&self) -> Vec<TorchVersion> {
        vec![self.replay_version()]
    }

    /// When the evidence dates PyTorch only as a range: a note naming the
    /// oldest release in it that rejects `value` (which holds at the replay
    /// version), so a user on that release knows to pass `--torch-version`.
    pub fn rejected_in_range(&self, value: &str) -> Option<String> {
        let version = self.replay_version();
        let oldest = self
            .torch
            .value
            .lo
            .unwrap_or(TorchVersion::FIRST_ALLOC_CONF)
            .max(TorchVersion::FIRST_ALLOC_CONF);
        if oldest >= version || value.is_empty() {
            return None;
        }
        crate::conf::parse(value, version).ok()?;
        let e = crate::conf::parse(value, oldest).err()?;
        Some(format!(
            "the evidence dates PyTorch as {} and configs are read as PyTorch {version}; \
             PyTorch {oldest} rejects {value} ({e}): pass --torch-version if yours is older",
            range_text(self.torch.value)
        ))
    }

    /// Whether `PYTORCH_CUDA_ALLOC_CONF` governs the memory that ran out.
    pub fn conf_applies(&self) -> bool {
        matches!(self.device, DeviceKind::Cuda | DeviceKind::Hip)
    }

    /// One line for reports: "PyTorch 2.4+ (inferred from the message format (2.4+)), Linux (assumed: …)".
    pub fn describe(&self) -> String {
        let part = |what: String, certainty: Certainty, source: &str| match certainty {
            Certainty::Given => format!("{what} ({source})"),
            Certainty::Assumed => format!("{what} (assumed: {source})"),
            c => format!("{what} ({} from {source})", c.as_str()),
        };
        let torch = part(
            format!("PyTorch {}", range_text(self.torch.value)),
            self.torch.certainty,
            &self.torch.source,
        );
        let platform = part(
            self.platform.value.as_str().to_string(),
            self.platform.certainty,
            &self.platform.source,
        );
        // An MPS device runs on macOS, whatever the CUDA platform was assumed to be.
        let mut s = if self.device == DeviceKind::Mps {
            format!("{torch}, macOS (an MPS device)")
        } else {
            format!("{torch}, {platform}")
        };
        if self.backend.value == Backend::CudaMallocAsync {
            s.push_str(", backend cudaMallocAsync");
        }
        if self.device == DeviceKind::Xpu {
            s.push_str(", an XPU device");
        }
        s
    }
}

/// An OOM report with more allocated than the whole card.
pub fn spills(o: &Observation) -> bool {
    o.kind == Kind::Oom
        && matches!((o.allocated_bytes, o.total_capacity_bytes), (Some(a), Some(c)) if a > c)
}

/// The versions the evidence allows: every dated observation's range,
/// intersected while they agree (a log with a summary and an OOM of one run);
/// when they contradict (inputs from several runs), the most specific one.
/// With no date at all, PyTorch's default is assumed, and said to be.
fn inferred_version(evidence: &Evidence, ctx: &Context) -> Known<VersionRange> {
    let mut dated: Vec<(VersionRange, String)> = evidence
        .observations
        .iter()
        .filter_map(|o| {
            let (r, why) = dated(o)?;
            (r != VersionRange::default()).then_some((r, why))
        })
        .collect();
    let mut range = VersionRange::default();
    let mut sources: Vec<String> = Vec::new();
    for (r, why) in &dated {
        match intersect(range, *r) {
            Some(x) => {
                range = x;
                if !sources.contains(why) {
                    sources.push(why.clone());
                }
            }
            None => {
                // Contradicting inputs: keep the narrowest single range.
                dated.sort_by_key(|(r, _)| width(*r));
                let (r, why) = dated.swap_remove(0);
                range = r;
                sources = vec![format!("{why}; other inputs disagree")];
                break;
            }
        }
    }
    // §7.2: PyTorch's hint "try setting max_split_size_mb" appeared in 1.10.
    if let Some(floor) = ctx.torch_floor
        && range.hi.is_none_or(|hi| hi >= floor)
        && range.lo.is_none_or(|lo| lo < floor)
    {
        range.lo = Some(floor);
        sources.push("the max_split_size_mb hint (1.10+)".into());
    }
    if range == VersionRange::default() {
        return Known::new(
            VersionRange::exact(TorchVersion::DEFAULT),
            Certainty::Assumed,
            "nothing in the input dates it; pass --torch-version",
        );
    }
    Known::new(range, Certainty::Inferred, sources.join(", "))
}

/// How many releases a range spans (open ends at 0.0 and the newest known).
fn width(r: VersionRange) -> u32 {
    let n = |v: TorchVersion| u32::from(v.major) * 100 + u32::from(v.minor);
    n(r.hi.unwrap_or(TorchVersion::LATEST_KNOWN))
        .saturating_sub(n(r.lo.unwrap_or(TorchVersion::new(0, 0))))
}

fn intersect(a: VersionRange, b: VersionRange) -> Option<VersionRange> {
    let lo = match (a.lo, b.lo) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, y) => x.or(y),
    };
    let hi = match (a.hi, b.hi) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, y) => x.or(y),
    };
    match (lo, hi) {
        (Some(l), Some(h)) if l > h => None,
        _ => Some(VersionRange { lo, hi }),
    }
}

/// What one observation says about the version, and why.
fn dated(o: &Observation) -> Option<(VersionRange, String)> {
    if o.kind == Kind::MemoryStats {
        // Keys memory_stats() gained over time (allocator/stats.rs `flat`).
        let has = |k: &str| o.counters.contains_key(k);
        let lo = if has("num_oom_rejections") {
            TorchVersion::new(2, 12)
        } else if has("num_sync_all_streams") || has("num_device_alloc") {
            TorchVersion::new(2, 3)
        } else if o
            .metrics
            .as_ref()
            .is_some_and(|m| m.contains_key("requested_bytes"))
        {
            TorchVersion::new(2, 0)
        } else {
            return None;
        };
        return Some((
            VersionRange {
                lo: Some(lo),
                hi: None,
            },
            format!("the memory_stats() keys ({lo}+)"),
        ));
    }
    let r = super::facts::era_range(o);
    if r == VersionRange::default() {
        return None;
    }
    let what = match o.kind {
        Kind::Snapshot => "the snapshot's allocator_settings",
        Kind::MemorySummary => "the memory_summary() layout",
        _ => "the message format",
    };
    Some((r, format!("{what} ({})", range_text(r))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn oom(era: &str) -> Observation {
        let mut o = Observation::new(Kind::Oom, "t.log");
        o.format_era = Some(era.into());
        o
    }

    fn evidence(observations: Vec<Observation>) -> Evidence {
        Evidence {
            notes: Vec::new(),
            observations,
        }
    }

    #[test]
    fn flags_beat_text_beats_evidence_beats_assumption() {
        let ev = evidence(vec![oom("2.4+")]);
        let ctx = Context::default();
        let s = Setup::resolve(&ev, &ctx);
        assert_eq!(range_text(s.torch.value), "2.4+");
        assert_eq!(s.torch.certainty, Certainty::Inferred);
        assert_eq!(s.replay_version(), TorchVersion::new(2, 6));
        assert_eq!(s.platform.certainty, Certainty::Assumed);
        let flagged = Context {
            flags: SetupFlags {
                torch: Some(TorchVersion::new(2, 1)),
                platform: Some(Platform::Windows),
            },
            ..Context::default()
        };
        let s = Setup::resolve(&ev, &flagged);
        assert_eq!(s.torch.value, VersionRange::exact(TorchVersion::new(2, 1)));
        assert_eq!(
            (s.torch.certainty, s.platform.value),
            (Certainty::Given, Platform::Windows)
        );
        let none = Setup::resolve(&evidence(vec![]), &ctx);
        assert_eq!(none.torch.certainty, Certainty::Assumed);
        assert_eq!(none.replay_version(), TorchVersion::DEFAULT);
    }

    #[test]
    fn agreeing_ranges_intersect_and_contradicting_ones_keep_the_narrowest() {
        let mut stats = Observation::new(Kind::MemoryStats, "s.log");
        stats.counters.insert("num_sync_all_streams".into(), 0);
        let s = Setup::resolve(&evidence(vec![oom("2.2+"), stats]), &Context::default());
        assert_eq!(range_text(s.torch.value), "2.3+");
        let s = Setup::resolve(
            &evidence(vec![oom("1.10-2.0"), oom("2.2-2.3")]),
            &Context::default(),
        );
        assert_eq!(range_text(s.torch.value), "2.2-2.3");
        assert!(s.torch.source.contains("disagree"), "{}", s.torch.source);
        // 1.10-2.0 replays as 2.0, values are read there, and a note names 1.10's refusals.
        let s = Setup::resolve(&evidence(vec![oom("1.10-2.0")]), &Context::default());
        assert_eq!(s.replay_version(), TorchVersion::new(2, 0));
        assert_eq!(s.versions(), vec![TorchVersion::new(2, 0)]);
        // "2.0+" is read as 2.6: expandable segments hold there, and 2.0 refuses them.
        let s = Setup::resolve(&evidence(vec![oom("2.0+")]), &Context::default());
        assert_eq!(s.versions(), vec![TorchVersion::new(2, 6)]);
        let note = s.rejected_in_range("expandable_segments:True").unwrap();
        assert!(
            note.starts_with(
                "the evidence dates PyTorch as 2.0+ and configs are read as PyTorch 2.6; \
                 PyTorch 2.0 rejects expandable_segments:True"
            ),
            "{note}"
        );
        assert_eq!(s.rejected_in_range("max_split_size_mb:128"), None);
    }

    #[test]
    fn a_hip_device_means_rocm() {
        let mut o = oom("2.4+");
        o.device_kind = Some(DeviceKind::Hip);
        let s = Setup::resolve(&evidence(vec![o]), &Context::default());
        assert_eq!(s.platform.value, Platform::Rocm);
        assert!(s.conf_applies());
    }
}
