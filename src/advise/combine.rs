//! Combining the settings of every fired rule into one environment line.
//!
//! Priority: a key recommended by several rules takes the value of the rule
//! with the highest `priority` (ties: the earlier rule). Then known conflicts
//! are resolved: with `expandable_segments:True` a `max_split_size_mb` is
//! dropped, because expandable blocks are always split and never oversize
//! (`should_split` in CUDACachingAllocator.cpp), so it would only add cost.
//! A setting the current config already has is not repeated.

use crate::conf::{Settings, TorchVersion};
use crate::rules::{Rule, VersionRange};
use serde::Serialize;
use std::collections::BTreeMap;

/// The variable that works in every PyTorch version (1.10 → 2.15); see [`env_note`].
pub const ENV: &str = "PYTORCH_CUDA_ALLOC_CONF";

/// The `recommendation` object of `diagnose --format json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Recommendation {
    pub env: String,
    pub value: String,
    pub settings: BTreeMap<String, String>,
    pub line: String,
    /// Setting it from Python: before the first `import torch` (the config is
    /// read once, at the first CUDA allocation).
    pub python: String,
    /// About the variable's name for the user's version, when it matters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Settings a lower-priority rule wanted but lost, with why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub dropped: Vec<String>,
}

/// Keys in the order PyTorch's documentation lists them; others after, by name.
const KEY_ORDER: [&str; 5] = [
    "backend",
    "expandable_segments",
    "max_split_size_mb",
    "roundup_power2_divisions",
    "garbage_collection_threshold",
];

/// Merges the settings of the fired `rules` (with their rendered settings).
pub fn combine(
    fired: &[(&Rule, &BTreeMap<String, String>)],
    current: Option<&Settings>,
    torch: VersionRange,
) -> Option<Recommendation> {
    let mut order: Vec<_> = fired.iter().enumerate().collect();
    order.sort_by_key(|(i, (r, _))| (std::cmp::Reverse(r.priority), *i));
    let mut settings: BTreeMap<String, String> = BTreeMap::new();
    let mut owner: BTreeMap<String, &str> = BTreeMap::new();
    let mut dropped = Vec::new();
    for (_, (rule, s)) in order {
        for (k, v) in s.iter() {
            match settings.get(k) {
                None => {
                    settings.insert(k.clone(), v.clone());
                    owner.insert(k.clone(), &rule.id);
                }
                Some(have) if have != v => dropped.push(format!(
                    "{k}:{v} (from {}) lost to {k}:{have} (from {}, higher priority)",
                    rule.id,
                    owner.get(k).copied().unwrap_or("?")
                )),
                Some(_) => {}
            }
        }
    }
    if settings.get("expandable_segments").map(String::as_str) == Some("True")
        && let Some(v) = settings.remove("max_split_size_mb")
    {
        dropped.push(format!(
                "max_split_size_mb:{v}: expandable segments are never oversize, so it would only cost speed"
            ));
    }
    if let Some(cur) = current {
        settings.retain(|k, v| !already_set(cur, k, v));
    }
    if settings.is_empty() {
        return None;
    }
    let mut keys: Vec<&String> = settings.keys().collect();
    keys.sort_by_key(|k| {
        (
            KEY_ORDER
                .iter()
                .position(|o| o == k)
                .unwrap_or(KEY_ORDER.len()),
            k.as_str(),
        )
    });
    let value = keys
        .iter()
        .map(|k| format!("{k}:{}", settings.get(*k).map_or("", String::as_str)))
        .collect::<Vec<_>>()
        .join(",");
    Some(Recommendation {
        env: ENV.to_string(),
        line: format!("export {ENV}={value}"),
        python: format!(
            "import os\nos.environ[\"{ENV}\"] = \"{value}\"  # before the first `import torch`\nimport torch"
        ),
        note: env_note(torch),
        value,
        settings,
        dropped,
    })
}

fn already_set(cur: &Settings, key: &str, value: &str) -> bool {
    match key {
        "expandable_segments" => cur.expandable_segments == (value == "True"),
        "max_split_size_mb" => value
            .parse::<u64>()
            .is_ok_and(|mb| cur.max_split_size == mb.saturating_mul(crate::conf::MIB)),
        _ => false,
    }
}

/// What the conf module says about PYTORCH_ALLOC_CONF for the newest version
/// the evidence allows (§6.1: 2.9 warns but reads only PYTORCH_CUDA_ALLOC_CONF;
/// 2.10+ reads PYTORCH_ALLOC_CONF last), so the user does not switch names.
pub fn env_note(torch: VersionRange) -> Option<String> {
    let newest = torch.hi.unwrap_or(TorchVersion::LATEST_KNOWN);
    let notes: Vec<String> = crate::conf::env_var_notes(newest)
        .into_iter()
        .filter(|n| n.contains("PYTORCH_ALLOC_CONF"))
        .collect();
    (!notes.is_empty()).then(|| notes.join(" "))
}
