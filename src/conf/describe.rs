//! The effective settings as rows (key, value, default or not), for
//! `conf check` and any report that shows the settings a run used.

use super::keys::{self, Effect};
use super::render::{backend_name, divisions};
use super::{MIB, Settings};
use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};
use serde_json::{Value, json};

/// One modelled setting as `settings.version` knows it.
#[derive(Debug, Clone, PartialEq)]
pub struct SettingRow {
    /// PyTorch's key name.
    pub key: &'static str,
    /// Typed value for JSON: MB counts for `_mb` keys, `null` for "no limit"
    /// or "unset", the 16-bucket table for `roundup_power2_divisions`.
    pub value: Value,
    /// The value in PyTorch's own syntax, or a phrase (`no limit`).
    pub display: String,
    pub default: bool,
}

/// Rows for every modelled key `settings.version` accepts, in render order.
pub fn describe(s: &Settings) -> Vec<SettingRow> {
    let d = Settings {
        version: s.version,
        ..Settings::default()
    };
    let mb = |bytes: u64| bytes / MIB;
    let limit = |bytes: u64| -> (Value, String) {
        if bytes == u64::MAX {
            (Value::Null, "no limit".into())
        } else {
            (json!(mb(bytes)), mb(bytes).to_string())
        }
    };
    let py_bool = |b: bool| (json!(b), if b { "True" } else { "False" }.to_string());
    let mut rows = Vec::new();
    let mut push = |key: &'static str, (value, display): (Value, String), default: bool| {
        if keys::lookup(key, s.version).is_some_and(|k| k.effect == Effect::Modelled) {
            rows.push(SettingRow {
                key,
                value,
                display,
                default,
            });
        }
    };
    let backend = backend_name(s.backend);
    push(
        "backend",
        (json!(backend), backend.to_string()),
        s.backend == d.backend,
    );
    push(
        "large_segment_size_mb",
        (
            json!(mb(s.large_segment_size)),
            mb(s.large_segment_size).to_string(),
        ),
        s.large_segment_size == d.large_segment_size,
    );
    push(
        "max_split_size_mb",
        limit(s.max_split_size),
        s.max_split_size == d.max_split_size,
    );
    push(
        "max_non_split_rounding_mb",
        (
            json!(mb(s.max_non_split_rounding_size)),
            mb(s.max_non_split_rounding_size).to_string(),
        ),
        s.max_non_split_rounding_size == s.large_segment_size,
    );
    let table = s.roundup_power2_divisions;
    let off = table == [0; 16];
    push(
        "roundup_power2_divisions",
        (
            json!(table),
            if off { "off".into() } else { divisions(&table) },
        ),
        off,
    );
    push(
        "roundup_bypass_threshold_mb",
        limit(s.roundup_bypass_threshold),
        s.roundup_bypass_threshold == d.roundup_bypass_threshold,
    );
    let gc = s.garbage_collection_threshold;
    push(
        "garbage_collection_threshold",
        (
            json!(gc),
            if gc == 0.0 {
                "off".into()
            } else {
                gc.to_string()
            },
        ),
        gc == d.garbage_collection_threshold,
    );
    push(
        "expandable_segments",
        py_bool(s.expandable_segments),
        !s.expandable_segments,
    );
    push(
        "release_lock_on_cudamalloc",
        py_bool(s.release_lock_on_cudamalloc),
        !s.release_lock_on_cudamalloc,
    );
    let fraction = match s.per_process_memory_fraction {
        Some(f) => (json!(f), f.to_string()),
        None => (Value::Null, "unset".into()),
    };
    push(
        "per_process_memory_fraction",
        fraction,
        s.per_process_memory_fraction.is_none(),
    );
    rows
}

/// Serializes rows as one JSON object `{key: {"value": …, "default": bool}}`
/// in row order.
pub fn serialize_rows<S: Serializer>(rows: &[SettingRow], ser: S) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    struct Entry<'a> {
        value: &'a Value,
        default: bool,
    }
    let mut map = ser.serialize_map(Some(rows.len()))?;
    for r in rows {
        map.serialize_entry(
            r.key,
            &Entry {
                value: &r.value,
                default: r.default,
            },
        )?;
    }
    map.end()
}
