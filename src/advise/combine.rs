//! The one recommendation type ([`Recommendation`]: what every command
//! prints as the line to set), and the combination of every fired rule's
//! settings into one candidate of the setup's space.
//!
//! Priority: a key recommended by several rules takes the value of the rule
//! with the highest `priority` (ties: the earlier rule). The merged settings
//! are one [`Candidate`] of the [`Space`] the search replays: a key outside
//! it, or one the space does not admit for the user's version and platform,
//! is dropped with the reason. No setting is dropped for "only costing
//! speed": replays find `max_split_size_mb` with expandable segments the only
//! configs that avoid some OOMs. A setting the current config already has is
//! not repeated.

use super::space::{Candidate, KEYS, Space};
use crate::conf::{Platform, Settings, Shell, TorchVersion};
use crate::rules::{Rule, VersionRange};
use serde::Serialize;
use std::collections::BTreeMap;

/// The variable that works in every PyTorch version (1.10 → 2.15); see [`env_note`].
pub const ENV: &str = "PYTORCH_CUDA_ALLOC_CONF";

/// One way to set the variable, for one shell.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ShellLine {
    pub shell: Shell,
    pub line: String,
}

/// The `recommendation` object of `diagnose`, `recommend` (and the line
/// `validate` proves): the contract's `env`, `value`, `settings`, `line`,
/// then the line for every shell of the platform and the Python snippet.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Recommendation {
    pub env: String,
    pub value: String,
    pub settings: BTreeMap<String, String>,
    /// The line for the platform's usual shell (`export` on Linux, `set` for
    /// cmd.exe on Windows); PyTorch's defaults are asked for by clearing it.
    pub line: String,
    /// The line for every shell of the platform, the usual one first.
    pub lines: Vec<ShellLine>,
    /// Setting it from Python: before the first `import torch` (the config is
    /// read once, at the first CUDA allocation). Works on every platform.
    pub python: String,
    /// About the variable's name for the user's version, when it matters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Settings a rule wanted but the answer left out, with why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub dropped: Vec<String>,
}

impl Recommendation {
    /// The recommendation of `value` ('' = PyTorch's defaults) for a user on
    /// `platform` with a PyTorch in `torch`.
    pub fn new(value: String, platform: Platform, torch: VersionRange) -> Self {
        let settings = value
            .split(',')
            .filter_map(|kv| kv.split_once(':'))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let lines: Vec<ShellLine> = Shell::of(platform)
            .iter()
            .map(|&shell| ShellLine {
                shell,
                line: shell.line(ENV, &value),
            })
            .collect();
        let python = if value.is_empty() {
            format!(
                "import os\nos.environ.pop(\"{ENV}\", None)  # before the first `import torch`\nimport torch"
            )
        } else {
            format!(
                "import os\nos.environ[\"{ENV}\"] = \"{value}\"  # before the first `import torch`\nimport torch"
            )
        };
        Recommendation {
            env: ENV.to_string(),
            line: lines.first().map(|l| l.line.clone()).unwrap_or_default(),
            lines,
            python,
            note: env_note(torch),
            value,
            settings,
            dropped: Vec::new(),
        }
    }
}

/// Merges the settings of the fired `rules` (with their rendered settings)
/// into one candidate of `space`, on top of the `current` config.
pub fn combine(
    fired: &[(&Rule, &BTreeMap<String, String>)],
    current: Option<&Settings>,
    space: &Space,
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
    // One key at a time, so that one inadmissible key does not sink the others.
    let mut pairs = BTreeMap::new();
    for (k, v) in settings {
        let one = BTreeMap::from([(k.clone(), v.clone())]);
        match Candidate::from_pairs(&one).and_then(|c| space.admits(&c)) {
            Ok(()) => {
                pairs.insert(k, v);
            }
            Err(why) => dropped.push(format!(
                "{k}:{v} (from {}): {why}",
                owner.get(&k).copied().unwrap_or("?")
            )),
        }
    }
    if let Some(cur) = current {
        pairs.retain(|k, v| !already_set(cur, k, v));
    }
    let new = Candidate::from_pairs(&pairs).ok()?;
    if new.keys() == 0 {
        return None;
    }
    // The line is the whole config to set: the settings in use stay in it
    // (pasting a line without them would silently drop them).
    let candidate = match current {
        Some(cur) => new.over(&Candidate::of_settings(cur)),
        None => new,
    };
    if let Err(why) = space.admits(&candidate) {
        // Each key is admitted but not their combination (never seen; kept honest).
        dropped.push(format!("{}: {why}", space.value(&candidate)));
        return None;
    }
    let setup = space.setup();
    let value = match current {
        Some(cur) => crate::conf::render(&candidate.settings(cur)),
        None => space.value(&candidate),
    };
    let mut r = Recommendation::new(value, setup.platform.value, setup.torch.value);
    r.dropped = dropped;
    Some(r)
}

fn already_set(cur: &Settings, key: &str, value: &str) -> bool {
    let Ok(c) = Candidate::from_pairs(&BTreeMap::from([(key.to_string(), value.to_string())]))
    else {
        return false;
    };
    let have = Candidate::of_settings(cur);
    match key {
        k if k == KEYS[0] => have.expandable_segments == c.expandable_segments,
        k if k == KEYS[1] => have.max_split_size_mb == c.max_split_size_mb,
        k if k == KEYS[2] => have.roundup_power2_divisions == c.roundup_power2_divisions,
        k if k == KEYS[3] => have.garbage_collection_threshold == c.garbage_collection_threshold,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_follow_the_platform() {
        let any = VersionRange::default();
        let r = Recommendation::new("expandable_segments:True".into(), Platform::Linux, any);
        assert_eq!(
            r.line,
            "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
        );
        assert_eq!(
            r.settings.get("expandable_segments").map(String::as_str),
            Some("True")
        );
        let w = Recommendation::new("max_split_size_mb:512".into(), Platform::Windows, any);
        assert_eq!(w.line, "set PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:512");
        assert_eq!(
            w.lines[1].line,
            "$env:PYTORCH_CUDA_ALLOC_CONF = \"max_split_size_mb:512\""
        );
        assert!(
            w.python
                .contains("os.environ[\"PYTORCH_CUDA_ALLOC_CONF\"] = \"max_split_size_mb:512\"")
        );
        let d = Recommendation::new(String::new(), Platform::Linux, any);
        assert_eq!(d.line, "unset PYTORCH_CUDA_ALLOC_CONF");
        assert!(d.settings.is_empty());
    }
}
