//! The candidate space: the allocator settings that change where memory
//! goes, and their combinations. The config search ([`crate::trial::search`])
//! replays them; the rules' combiner ([`super::combine`]) speaks of the same
//! settings.
//!
//! Today the space depends only on whether a memory fraction is set; the
//! context (PyTorch version, platform, backend) is where a narrower space
//! valid for the user's setup will come from.

use crate::conf::{MIB, Settings};

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

impl Candidate {
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

    /// How many keys this candidate sets (fewer is simpler to explain).
    pub fn keys(&self) -> usize {
        usize::from(self.expandable_segments)
            + usize::from(self.max_split_size_mb.is_some())
            + usize::from(self.roundup_power2_divisions.is_some())
            + usize::from(self.garbage_collection_threshold.is_some())
    }
}

/// The space: expandable_segments × max_split_size_mb × roundup_power2_divisions,
/// × garbage_collection_threshold only when `with_gc` (a memory fraction is set).
/// The all-default candidate comes first.
pub fn space(with_gc: bool) -> Vec<Candidate> {
    let splits = std::iter::once(None).chain(MAX_SPLIT_MB.iter().copied().map(Some));
    let mut out = Vec::new();
    for es in [false, true] {
        for split in splits.clone() {
            for div in std::iter::once(None).chain(ROUNDUP_DIVISIONS.iter().copied().map(Some)) {
                let gcs: Vec<Option<f64>> = if with_gc {
                    std::iter::once(None)
                        .chain(GC_THRESHOLDS.iter().copied().map(Some))
                        .collect()
                } else {
                    vec![None]
                };
                for gc in gcs {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn space_sizes_and_defaults_first() {
        let plain = space(false);
        assert_eq!(plain.len(), 2 * 7 * 5);
        assert_eq!(plain[0].keys(), 0, "the default config leads");
        assert_eq!(space(true).len(), 2 * 7 * 5 * 4);
        let s = plain[0].settings(&Settings::default());
        assert_eq!(s, Settings::default());
    }

    /// Every point of the space is a config PyTorch accepts, and reads back as itself.
    #[test]
    fn every_candidate_renders_and_parses_back() {
        for c in space(true) {
            let s = c.settings(&Settings::default());
            let text = crate::conf::render(&s);
            let back = crate::conf::parse(&text, crate::conf::TorchVersion::DEFAULT)
                .unwrap_or_else(|e| panic!("{text}: {e}"))
                .settings;
            assert_eq!(back, s, "{text}");
        }
    }
}
