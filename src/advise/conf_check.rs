//! `conf check`: is a `PYTORCH_CUDA_ALLOC_CONF` value valid for a PyTorch
//! version, what settings it yields, and how requests round under it.

use crate::allocator::sizes::{get_allocation_size, is_small, round_size};
use crate::conf::{
    self, ConfError, ConfWarning, Platform, SettingRow, Settings, TorchVersion, Unmodelled,
    describe, serialize_rows,
};
use crate::evidence::Backend;
use serde::Serialize;

/// Request sizes that show every rounding regime: below 512, the small pool,
/// the 1 MiB boundary, 20 MiB segments, the 10 MiB boundary, big tensors.
pub const REPRESENTATIVE_SIZES: [u64; 12] = [
    1,
    512,
    1200,
    1 << 20,
    (1 << 20) + 1,
    5 << 20,
    (10 << 20) - 1,
    (10 << 20) + 1,
    84 << 20,
    400 << 20,
    (1 << 30) + 1,
    (10 << 30) + 1,
];

/// The warning PyTorch prints where expandable segments are unsupported.
const UNSUPPORTED: &str = "expandable_segments not supported on this platform";

/// One request under the checked settings and under PyTorch's defaults.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RoundingRow {
    pub request_bytes: u64,
    /// `round_size`: the block the request occupies.
    pub rounded_bytes: u64,
    pub pool: &'static str,
    /// `get_allocation_size`: the cudaMalloc'd segment when no cached block fits.
    pub segment_bytes: u64,
    pub default_rounded_bytes: u64,
}

/// Everything `conf check` reports.
#[derive(Debug, Clone, Serialize)]
pub struct ConfCheck {
    pub valid: bool,
    pub torch_version: TorchVersion,
    pub platform: Platform,
    /// Settings PyTorch accepts but ignores on this platform (also among
    /// `warnings`); `settings` shows what takes effect.
    pub ignored: Vec<String>,
    pub value: String,
    pub error: Option<ConfError>,
    pub warnings: Vec<ConfWarning>,
    /// `null` when the value is invalid (PyTorch stops at the first CUDA
    /// allocation; no settings take effect).
    #[serde(serialize_with = "serialize_optional_rows")]
    pub settings: Option<Vec<SettingRow>>,
    /// The accepted value, normalised: modelled keys in a fixed order and
    /// shortest form, then the unmodelled ones as given.
    pub canonical: Option<String>,
    pub unmodelled: Vec<Unmodelled>,
    /// Empty when invalid or under cudaMallocAsync (which does not round so).
    pub rounding: Vec<RoundingRow>,
    pub env_notes: Vec<String>,
}

fn serialize_optional_rows<S: serde::Serializer>(
    rows: &Option<Vec<SettingRow>>,
    ser: S,
) -> Result<S::Ok, S::Error> {
    match rows {
        Some(rows) => serialize_rows(rows, ser),
        None => ser.serialize_none(),
    }
}

/// The rounding table for `settings` over [`REPRESENTATIVE_SIZES`].
pub fn rounding_table(settings: &Settings) -> Vec<RoundingRow> {
    let defaults = Settings {
        version: settings.version,
        ..Settings::default()
    };
    REPRESENTATIVE_SIZES
        .iter()
        .map(|&request| {
            let rounded = round_size(request, settings);
            RoundingRow {
                request_bytes: request,
                rounded_bytes: rounded,
                pool: if is_small(rounded) { "small" } else { "large" },
                segment_bytes: get_allocation_size(rounded, settings),
                default_rounded_bytes: round_size(request, &defaults),
            }
        })
        .collect()
}

/// Checks `value` against `version` on `platform`.
pub fn check(value: &str, version: TorchVersion, platform: Platform) -> ConfCheck {
    let mut warnings = Vec::new();
    if version > TorchVersion::LATEST_KNOWN {
        warnings.push(ConfWarning {
            text: format!(
                "PyTorch {version} is newer than the newest release allocdoc knows ({}); checked with {} rules",
                TorchVersion::LATEST_KNOWN,
                TorchVersion::LATEST_KNOWN
            ),
            from_pytorch: false,
        });
    }
    let env_notes = conf::env_var_notes(version);
    match conf::parse(value, version) {
        Ok(parsed) => {
            let canonical = parsed.render();
            let ignored = platform.ignored(&parsed.settings);
            // The platform's warning restates the parser's note on what builds
            // without the CUDA driver API ignore: say it once there.
            let restated = |w: &ConfWarning| {
                !w.from_pytorch
                    && w.text.contains(UNSUPPORTED)
                    && ignored.iter().any(|i| i.text.contains(UNSUPPORTED))
            };
            warnings.extend(parsed.warnings.into_iter().filter(|w| !restated(w)));
            let ignored_keys = ignored.iter().map(|w| w.text.clone()).collect::<Vec<_>>();
            warnings.extend(ignored);
            let s = platform.effective(&parsed.settings);
            let rounding = if s.backend == Backend::CudaMallocAsync {
                Vec::new()
            } else {
                rounding_notes(&s, &mut warnings);
                rounding_table(&s)
            };
            ConfCheck {
                valid: true,
                torch_version: version,
                platform,
                ignored: ignored_keys,
                value: value.to_string(),
                error: None,
                warnings,
                settings: Some(describe(&s)),
                canonical: Some(canonical),
                unmodelled: parsed.unmodelled,
                rounding,
                env_notes,
            }
        }
        Err(e) => ConfCheck {
            valid: false,
            torch_version: version,
            platform,
            ignored: Vec::new(),
            value: value.to_string(),
            error: Some(e),
            warnings,
            settings: None,
            canonical: None,
            unmodelled: Vec::new(),
            rounding: Vec::new(),
            env_notes,
        },
    }
}

/// What the division table does not do, in the sizes users ask about.
fn rounding_notes(s: &Settings, warnings: &mut Vec<ConfWarning>) {
    // round_size applies the divisions only above 512 × divisions bytes.
    let d = s.roundup_power2_divisions[0];
    if d > 1 && s.version >= TorchVersion::new(2, 0) {
        warnings.push(ConfWarning {
            text: format!(
                "with {d} divisions in the first bucket, requests up to {} bytes keep plain 512-byte rounding (1200 → {}, not the docs' {})",
                512 * d,
                round_size(1200, s),
                crate::allocator::sizes::roundup_power2_next_division(1200, d)
            ),
            from_pytorch: false,
        });
    }
}
