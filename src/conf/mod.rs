//! `PYTORCH_CUDA_ALLOC_CONF`: the settings the bundled allocator runs under.
//! The parser (per-version grammar, ranges, PyTorch's own error texts), the
//! renderer and the linter behind `conf check` live in this module.

mod cpp;
mod describe;
pub mod keys;
mod parse;
mod platform;
mod render;

pub use describe::{SettingRow, describe, serialize_rows};
pub use keys::{Effect, KeySpec};
pub use parse::{Era, parse};
pub use platform::{Platform, ROCM_EXPANDABLE_SINCE, Shell};
pub use render::render;

use crate::evidence::Backend;
use serde::Serialize;
use std::fmt;
use thiserror::Error;

pub const MIB: u64 = 1 << 20;

/// A PyTorch release as `major.minor` (patch releases do not change allocator behaviour
/// in anything this tool models).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TorchVersion {
    pub major: u16,
    pub minor: u16,
}

impl TorchVersion {
    pub const fn new(major: u16, minor: u16) -> Self {
        TorchVersion { major, minor }
    }
    /// The behaviour the spec verified line by line (2.6.0 source) is the default.
    pub const DEFAULT: TorchVersion = TorchVersion::new(2, 6);
    /// The newest release whose allocator this tool knows (spec §12).
    pub const LATEST_KNOWN: TorchVersion = TorchVersion::new(2, 15);
    /// The first release that reads `PYTORCH_CUDA_ALLOC_CONF` (CUDACachingAllocator's parseArgs, 1.10).
    pub const FIRST_ALLOC_CONF: TorchVersion = TorchVersion::new(1, 10);

    /// Reads `2.4`, `2.4.1`, `2.4.1+cu121`, `2.10.0a0`, `2.6.0.dev20241112`,
    /// `v2.6` (what `torch.__version__` and users write).
    pub fn parse(text: &str) -> Result<TorchVersion, VersionError> {
        let err = || VersionError(text.to_string());
        let t = text.trim();
        let t = t.strip_prefix(['v', 'V']).unwrap_or(t);
        let mut parts = t.splitn(3, '.');
        let major = parts.next().ok_or_else(err)?;
        let minor = parts.next().ok_or_else(err)?;
        // The minor number may carry a pre-release or local suffix when there
        // is no patch number (`2.10a0`, `2.4+cu121`).
        let minor_digits = minor
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap_or("");
        if let Some(rest) = parts.next()
            && !rest.starts_with(|c: char| c.is_ascii_digit())
        {
            return Err(err());
        }
        if minor_digits.len() < minor.len()
            && !minor[minor_digits.len()..].starts_with(['a', 'b', 'r', '+', '.'])
        {
            return Err(err());
        }
        let major: u16 = major.parse().map_err(|_| err())?;
        let minor: u16 = minor_digits.parse().map_err(|_| err())?;
        Ok(TorchVersion::new(major, minor))
    }
}

impl fmt::Display for TorchVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl Serialize for TorchVersion {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error(
    "invalid PyTorch version '{0}': expected MAJOR.MINOR[.PATCH][suffix], e.g. 2.6, 2.4.1+cu121, 2.10.0a0"
)]
pub struct VersionError(pub String);

/// The Python exception a failed parse surfaces as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum PyException {
    RuntimeError,
    /// `TORCH_CHECK_VALUE` in the 2.10+ parsers.
    ValueError,
}

impl fmt::Display for PyException {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PyException::RuntimeError => "RuntimeError",
            PyException::ValueError => "ValueError",
        })
    }
}

/// Which mechanism in PyTorch produced the error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorOrigin {
    /// `TORCH_CHECK` / `TORCH_CHECK_VALUE`: the message is PyTorch's own text.
    Check,
    /// `TORCH_INTERNAL_ASSERT`: Python shows `<condition> INTERNAL ASSERT
    /// FAILED at "<file>":<line>, please report a bug to PyTorch. <message>`.
    InternalAssert,
    /// A C++ conversion (`std::stoi`, `stoul`, `stoull`, `stod`) threw; its
    /// `what()` (the function name) is the whole message.
    CppException,
    /// PyTorch 2.0–2.9 indexes past its token list: undefined behaviour, no
    /// defined message.
    ReadsPastEnd,
}

/// A value PyTorch rejects: its exception class and exact message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConfError {
    /// `None` when PyTorch's behaviour is undefined ([`ErrorOrigin::ReadsPastEnd`]).
    pub exception: Option<PyException>,
    pub message: String,
    pub origin: ErrorOrigin,
}

impl std::error::Error for ConfError {}

impl fmt::Display for ConfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.exception {
            Some(e) => write!(f, "{e}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

/// A warning about an accepted value: PyTorch's own (`TORCH_WARN`, printed
/// at the first CUDA allocation) or allocdoc's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConfWarning {
    pub text: String,
    pub from_pytorch: bool,
}

/// An accepted key the bundled allocator does not act on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unmodelled {
    pub key: String,
    /// The value as tokenized (a list keeps its brackets).
    pub value: String,
    pub effect: Effect,
    pub note: &'static str,
}

/// The result of parsing a valid value.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedConf {
    /// The effective settings, `version` set.
    pub settings: Settings,
    pub warnings: Vec<ConfWarning>,
    pub unmodelled: Vec<Unmodelled>,
}

impl ParsedConf {
    /// The canonical value of everything that was accepted: [`render`] of the
    /// settings, then the unmodelled keys as given (so an export line built
    /// from a user's value keeps their pinned-memory options).
    pub fn render(&self) -> String {
        let mut out = render(&self.settings);
        for u in &self.unmodelled {
            if !out.is_empty() {
                out.push(',');
            }
            out.push_str(&u.key);
            out.push(':');
            out.push_str(&u.value);
        }
        out
    }
}

/// What the environment variables do in `version` (which name is read, in
/// which priority, deprecation warnings), for users setting them.
pub fn env_var_notes(version: TorchVersion) -> Vec<String> {
    let mut notes = Vec::new();
    if version < TorchVersion::FIRST_ALLOC_CONF {
        notes.push(format!("PyTorch {version} reads no allocator config variable (PYTORCH_CUDA_ALLOC_CONF appeared in 1.10)."));
        return notes;
    }
    notes.push(
        "PYTORCH_CUDA_ALLOC_CONF is read once, at the first CUDA allocation: set it before the process starts, or in Python before the first CUDA tensor (os.environ[\"PYTORCH_CUDA_ALLOC_CONF\"] = \"...\" before `import torch` is safest).".into(),
    );
    if version == TorchVersion::new(2, 9) {
        notes.push(
            "PyTorch 2.9's generic allocator config reads PYTORCH_ALLOC_CONF and may warn once \"PYTORCH_CUDA_ALLOC_CONF is deprecated, use PYTORCH_ALLOC_CONF instead\", but the 2.9 CUDA allocator parses only PYTORCH_CUDA_ALLOC_CONF: keep using PYTORCH_CUDA_ALLOC_CONF.".into(),
        );
    }
    if version >= TorchVersion::new(2, 10) {
        // Said for the whole range: with no version in the evidence, `version`
        // is only the newest one known, not the user's.
        notes.push(
            "PyTorch 2.10 and later also read PYTORCH_ALLOC_CONF, with the lowest priority: the first set of PYTORCH_CUDA_ALLOC_CONF, PYTORCH_HIP_ALLOC_CONF (ROCm), PYTORCH_ALLOC_CONF is used and the others are ignored, not merged.".into(),
        );
    }
    if version >= TorchVersion::new(1, 13) {
        notes.push("At runtime, torch.cuda.memory._set_allocator_settings(value) re-parses a whole value (max_split_size_mb, roundup_power2_divisions and garbage_collection_threshold reset to defaults); the backend cannot be changed after start-up.".into());
    }
    notes
}

/// The allocator settings in effect. Defaults are PyTorch's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub backend: Backend,
    /// `max_split_size_mb` × 1 MiB; `u64::MAX` when unset (PyTorch: SIZE_MAX).
    pub max_split_size: u64,
    /// `max_non_split_rounding_mb` × 1 MiB (2.6+); the oversize reuse tolerance.
    pub max_non_split_rounding_size: u64,
    /// The 16-bucket `roundup_power2_divisions` table (all 0 = disabled).
    pub roundup_power2_divisions: [u64; 16],
    /// `garbage_collection_threshold`; 0.0 = off. Only active with a memory fraction.
    pub garbage_collection_threshold: f64,
    pub expandable_segments: bool,
    pub release_lock_on_cudamalloc: bool,
    /// `per_process_memory_fraction` (2.10+ key) or `set_per_process_memory_fraction`.
    pub per_process_memory_fraction: Option<f64>,
    /// `large_segment_size_mb` (2.11+); 20 MiB by default.
    pub large_segment_size: u64,
    /// Keys that were accepted but do not affect device memory (pinned_* and similar).
    pub unmodelled_keys: Vec<String>,
    /// Which PyTorch version's behaviour to follow.
    pub version: TorchVersion,
    /// `roundup_bypass_threshold_mb` × 1 MiB (1.13 only): requests above it
    /// skip the power-of-two rounding; `u64::MAX` when unset.
    pub roundup_bypass_threshold: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            backend: Backend::Native,
            max_split_size: u64::MAX,
            max_non_split_rounding_size: 20 * MIB,
            roundup_power2_divisions: [0; 16],
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
            release_lock_on_cudamalloc: false,
            per_process_memory_fraction: None,
            large_segment_size: 20 * MIB,
            unmodelled_keys: Vec::new(),
            version: TorchVersion::DEFAULT,
            roundup_bypass_threshold: u64::MAX,
        }
    }
}
