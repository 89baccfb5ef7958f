//! The candidate space: the allocator settings that change where memory
//! goes, and their combinations, for one [`Setup`]. The config search
//! ([`crate::trial::search`]) replays its candidates, and the rules' combiner
//! ([`super::combine`]) turns what the rules recommend into a [`Candidate`]
//! the same space must admit: one model of a config for every command.
//!
//! A candidate is admitted only when PyTorch accepts its value in every
//! version the setup allows (the parser of `conf check`) and acts on all of
//! it on the setup's platform (`expandable_segments` is ignored on Windows
//! and on ROCm before 2.12), and when `PYTORCH_CUDA_ALLOC_CONF` governs the
//! device and backend at all. So no command can print a line `conf check`
//! would reject or flag as ignored for the user's setup.

use super::setup::Setup;
use crate::conf::{MIB, Settings, TorchVersion};
use crate::evidence::Backend;
use std::collections::BTreeMap;

/// `max_split_size_mb` values tried (PyTorch requires > 20: `kLargeBuffer`/1 MiB).
pub const MAX_SPLIT_MB: [u64; 6] = [32, 64, 128, 256, 512, 1024];
/// `roundup_power2_divisions` values tried (powers of two, as PyTorch requires).
pub const ROUNDUP_DIVISIONS: [u64; 4] = [2, 4, 8, 16];
/// `garbage_collection_threshold` values tried when a memory fraction is set
/// (PyTorch runs the collector only then: `garbage_collect_cached_blocks`).
pub const GC_THRESHOLDS: [f64; 3] = [0.6, 0.8, 0.95];

/// One point of the config space.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub expandable_segments: bool,
    pub max_split_size_mb: Option<u64>,
    pub roundup_power2_divisions: Option<u64>,
    pub garbage_collection_threshold: Option<f64>,
}

/// The keys a [`Candidate`] can set, in the order PyTorch's documentation lists them.
pub const KEYS: [&str; 4] = [
    "expandable_segments",
    "max_split_size_mb",
    "roundup_power2_divisions",
    "garbage_collection_threshold",
];

impl Candidate {
    /// PyTorch's defaults.
    pub const DEFAULTS: Candidate = Candidate {
        expandable_segments: false,
        max_split_size_mb: None,
        roundup_power2_divisions: None,
        garbage_collection_threshold: None,
    };

    /// The settings of this candidate on top of `base` (which keeps the
    /// backend, the version, a memory fraction and the unmodelled keys).
    pub fn settings(&self, base: &Settings) -> Settings {
        let defaults = Settings::default();
        Settings {
            expandable_segments: self.expandable_segments,
            max_split_size: self
                .max_split_size_mb
                .map_or(defaults.max_split_size, |mb| mb * MIB),
            roundup_power2_divisions: self
                .roundup_power2_divisions
                .map_or(defaults.roundup_power2_divisions, |d| [d; 16]),
            garbage_collection_threshold: self
                .garbage_collection_threshold
                .unwrap_or(defaults.garbage_collection_threshold),
            ..base.clone()
        }
    }

    /// This candidate's keys on top of `base`'s (the keys it leaves unset keep `base`'s value).
    pub fn over(&self, base: &Candidate) -> Candidate {
        Candidate {
            expandable_segments: self.expandable_segments || base.expandable_segments,
            max_split_size_mb: self.max_split_size_mb.or(base.max_split_size_mb),
            roundup_power2_divisions: self
                .roundup_power2_divisions
                .or(base.roundup_power2_divisions),
            garbage_collection_threshold: self
                .garbage_collection_threshold
                .or(base.garbage_collection_threshold),
        }
    }

    /// The candidate a config's settings are (what the search would vary).
    pub fn of_settings(s: &Settings) -> Candidate {
        let d = Settings::default();
        Candidate {
            expandable_segments: s.expandable_segments,
            max_split_size_mb: (s.max_split_size != d.max_split_size)
                .then_some(s.max_split_size / MIB),
            roundup_power2_divisions: (s.roundup_power2_divisions != d.roundup_power2_divisions)
                .then(|| s.roundup_power2_divisions[0]),
            garbage_collection_threshold: (s.garbage_collection_threshold
                != d.garbage_collection_threshold)
                .then_some(s.garbage_collection_threshold),
        }
    }

    /// A candidate from `key: value` pairs as rules recommend them; a key
    /// outside the space, or a value that is not one, is the error.
    pub fn from_pairs(pairs: &BTreeMap<String, String>) -> Result<Candidate, String> {
        let mut c = Candidate::DEFAULTS;
        for (k, v) in pairs {
            let bad = || format!("{k}:{v} is not a value the candidate space holds");
            match k.as_str() {
                "expandable_segments" => {
                    c.expandable_segments = match v.as_str() {
                        "True" | "true" => true,
                        "False" | "false" => false,
                        _ => return Err(bad()),
                    }
                }
                "max_split_size_mb" => c.max_split_size_mb = Some(v.parse().map_err(|_| bad())?),
                "roundup_power2_divisions" => {
                    c.roundup_power2_divisions = Some(v.parse().map_err(|_| bad())?)
                }
                "garbage_collection_threshold" => {
                    c.garbage_collection_threshold = Some(v.parse().map_err(|_| bad())?)
                }
                _ => return Err(format!("{k}:{v}: {k} is outside the candidate space")),
            }
        }
        Ok(c)
    }

    /// The `PYTORCH_CUDA_ALLOC_CONF` value for `version` ('' for the defaults).
    pub fn value(&self, version: TorchVersion) -> String {
        crate::conf::render(&self.settings(&Settings {
            version,
            ..Settings::default()
        }))
    }

    /// How many keys this candidate sets (fewer is simpler to explain).
    pub fn keys(&self) -> usize {
        usize::from(self.expandable_segments)
            + usize::from(self.max_split_size_mb.is_some())
            + usize::from(self.roundup_power2_divisions.is_some())
            + usize::from(self.garbage_collection_threshold.is_some())
    }
}

/// Every combination: expandable_segments × max_split_size_mb ×
/// roundup_power2_divisions, × garbage_collection_threshold only when
/// `with_gc` (a memory fraction is set). The all-default candidate comes first.
pub fn all(with_gc: bool) -> Vec<Candidate> {
    let splits = std::iter::once(None).chain(MAX_SPLIT_MB.iter().copied().map(Some));
    let gcs: Vec<Option<f64>> = if with_gc {
        std::iter::once(None)
            .chain(GC_THRESHOLDS.iter().copied().map(Some))
            .collect()
    } else {
        vec![None]
    };
    let mut out = Vec::new();
    for es in [false, true] {
        for split in splits.clone() {
            for div in std::iter::once(None).chain(ROUNDUP_DIVISIONS.iter().copied().map(Some)) {
                for &gc in &gcs {
                    out.push(Candidate {
                        expandable_segments: es,
                        max_split_size_mb: split,
                        roundup_power2_divisions: div,
                        garbage_collection_threshold: gc,
                    });
                }
            }
        }
    }
    out
}

/// The candidates valid for one setup.
#[derive(Debug, Clone, PartialEq)]
pub struct Space {
    pub candidates: Vec<Candidate>,
    /// The versions every candidate was checked against.
    pub versions: Vec<TorchVersion>,
    /// Why whole parts of the full space are missing, one sentence each.
    pub excluded: Vec<String>,
    setup: Setup,
}

impl Space {
    /// The space for `setup`; `with_gc` adds collector thresholds (a memory
    /// fraction is set).
    pub fn for_setup(setup: &Setup, with_gc: bool) -> Space {
        let mut space = Space {
            candidates: Vec::new(),
            versions: setup.versions(),
            excluded: Vec::new(),
            setup: setup.clone(),
        };
        let full = all(with_gc);
        // Sentences for each key some candidates lost, from the first loser.
        let mut said: Vec<&str> = Vec::new();
        for c in full {
            match space.admits(&c) {
                Ok(()) => space.candidates.push(c),
                Err(why) => {
                    if let Some(key) = single_key(&c)
                        && !said.contains(&key)
                    {
                        said.push(key);
                        if !space.excluded.contains(&why) {
                            space.excluded.push(why);
                        }
                    }
                }
            }
        }
        if space.candidates.len() == 1
            && space.excluded.is_empty()
            && let Some(why) = space.blanket()
        {
            space.excluded.push(why);
        }
        space
    }

    /// Why nothing but PyTorch's defaults can be recommended, when that holds
    /// for every key (the device or backend is not governed by the variable).
    fn blanket(&self) -> Option<String> {
        blanket(&self.setup)
    }

    /// `Ok` when `c` belongs to this space; otherwise why not, in one sentence.
    pub fn admits(&self, c: &Candidate) -> Result<(), String> {
        admit(&self.setup, &self.versions, c)
    }

    /// The value of `c` as the user should write it (for the replay version).
    pub fn value(&self, c: &Candidate) -> String {
        c.value(self.setup.replay_version())
    }

    /// The setup this space is for.
    pub fn setup(&self) -> &Setup {
        &self.setup
    }
}

/// Why nothing but PyTorch's defaults fits `setup`, when that holds for every key.
fn blanket(setup: &Setup) -> Option<String> {
    if !setup.conf_applies() {
        return Some(format!(
            "PYTORCH_CUDA_ALLOC_CONF governs CUDA and HIP devices only; this OOM is on {}",
            setup.describe()
        ));
    }
    if setup.backend.value == Backend::CudaMallocAsync {
        return Some(
            "the cudaMallocAsync backend ignores max_split_size_mb, roundup_power2_divisions, \
             garbage_collection_threshold and expandable_segments"
                .to_string(),
        );
    }
    None
}

/// `Ok` when `setup` admits `c`: PyTorch accepts its value in every one of
/// `versions` and acts on all of it on the setup's platform.
fn admit(setup: &Setup, versions: &[TorchVersion], c: &Candidate) -> Result<(), String> {
    if c.keys() == 0 {
        return Ok(());
    }
    if let Some(why) = blanket(setup) {
        return Err(why);
    }
    let platform = setup.platform.value;
    for &v in versions {
        // Before FIRST_ALLOC_CONF the value is valid text that PyTorch never reads.
        if v < TorchVersion::FIRST_ALLOC_CONF {
            return Err(format!(
                "PyTorch {v} does not read PYTORCH_CUDA_ALLOC_CONF (it appeared in 1.10): \
                 pass --torch-version when yours is 1.10 or later"
            ));
        }
        let value = c.value(v);
        let parsed = crate::conf::parse(&value, v)
            .map_err(|e| format!("PyTorch {v} rejects {value}: {e}"))?;
        if let Some(w) = platform.ignored(&parsed.settings).into_iter().next() {
            return Err(w.text);
        }
    }
    Ok(())
}

/// `Ok` when `setup` admits the config `value` (as written for its replay
/// version): what a command may print as the line to set.
pub fn admits_value(setup: &Setup, value: &str) -> Result<(), String> {
    let version = setup.replay_version();
    let parsed = crate::conf::parse(value, version)
        .map_err(|e| format!("PyTorch {version} rejects {value}: {e}"))?;
    // Keys outside the space (a fraction, pinned-memory options) are the
    // user's own; the space's keys are judged.
    admit(
        setup,
        &setup.versions(),
        &Candidate::of_settings(&parsed.settings),
    )
}

/// The key a one-key candidate sets.
fn single_key(c: &Candidate) -> Option<&'static str> {
    if c.keys() != 1 {
        return None;
    }
    Some(if c.expandable_segments {
        KEYS[0]
    } else if c.max_split_size_mb.is_some() {
        KEYS[1]
    } else if c.roundup_power2_divisions.is_some() {
        KEYS[2]
    } else {
        KEYS[3]
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::advise::setup::SetupFlags;
    use crate::conf::Platform;

    fn setup(major: u16, minor: u16, platform: Platform) -> Setup {
        Setup::of_flags(&SetupFlags {
            torch: Some(TorchVersion::new(major, minor)),
            platform: Some(platform),
        })
    }

    #[test]
    fn space_sizes_and_defaults_first() {
        let plain = all(false);
        assert_eq!(plain.len(), 2 * 7 * 5);
        assert_eq!(plain[0].keys(), 0, "the default config leads");
        assert_eq!(all(true).len(), 2 * 7 * 5 * 4);
        let s = plain[0].settings(&Settings::default());
        assert_eq!(s, Settings::default());
        let linux = Space::for_setup(&setup(2, 6, Platform::Linux), false);
        assert_eq!(linux.candidates, plain, "everything is valid on 2.6 Linux");
        assert!(linux.excluded.is_empty());
    }

    /// Every point of the space is a config PyTorch accepts, and reads back as itself.
    #[test]
    fn every_candidate_renders_and_parses_back() {
        for c in all(true) {
            let s = c.settings(&Settings::default());
            let text = crate::conf::render(&s);
            let back = crate::conf::parse(&text, crate::conf::TorchVersion::DEFAULT)
                .unwrap_or_else(|e| panic!("{text}: {e}"))
                .settings;
            assert_eq!(back, s, "{text}");
            assert_eq!(Candidate::of_settings(&s), c, "{text}");
        }
    }

    #[test]
    fn the_space_follows_version_and_platform() {
        // 2.0: no expandable segments (PyTorch rejects the key before 2.1).
        let old = Space::for_setup(&setup(2, 0, Platform::Linux), false);
        assert!(old.candidates.iter().all(|c| !c.expandable_segments));
        assert_eq!(old.candidates.len(), 7 * 5);
        assert!(
            old.excluded[0].contains("Unrecognized CachingAllocator option"),
            "{:?}",
            old.excluded
        );
        // 1.10: only max_split_size_mb exists.
        let v110 = Space::for_setup(&setup(1, 10, Platform::Linux), true);
        assert_eq!(v110.candidates.len(), 7);
        // Windows 2.6: accepted but ignored, so left out.
        let win = Space::for_setup(&setup(2, 6, Platform::Windows), false);
        assert!(win.candidates.iter().all(|c| !c.expandable_segments));
        assert!(win.excluded[0].contains("not supported on this platform"));
        // ROCm before 2.12 ignores them too; 2.12 does not.
        let rocm = Space::for_setup(&setup(2, 4, Platform::Rocm), false);
        assert!(rocm.candidates.iter().all(|c| !c.expandable_segments));
        let rocm12 = Space::for_setup(&setup(2, 12, Platform::Rocm), false);
        assert!(rocm12.candidates.iter().any(|c| c.expandable_segments));
    }

    #[test]
    fn rule_pairs_become_candidates() {
        let mut pairs = BTreeMap::new();
        pairs.insert("max_split_size_mb".to_string(), "64".to_string());
        pairs.insert("expandable_segments".to_string(), "True".to_string());
        let c = Candidate::from_pairs(&pairs).unwrap();
        assert_eq!(
            c.value(TorchVersion::DEFAULT),
            "max_split_size_mb:64,expandable_segments:True"
        );
        pairs.insert("backend".to_string(), "cudaMallocAsync".to_string());
        assert!(
            Candidate::from_pairs(&pairs)
                .unwrap_err()
                .contains("outside")
        );
    }
}
