//! Whether a verdict holds wherever the driver puts segments. The simulated
//! card places them first-fit by default, but the real driver's placement is
//! unverified (`bench/gpu/placement.py` records it on a GPU), and the
//! allocator breaks ties between equal-sized free blocks by address. So a
//! verdict from a replay is checked under every [`Placement`] policy of the
//! card, and one whose OOM outcome changes with the policy is flagged as
//! placement-dependent.

use super::run::Replayer;
use crate::conf::Settings;
use crate::device::sim::Placement;
use serde::Serialize;

/// What a config does on one workload across the placement policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fate {
    /// No OOM under any policy.
    Avoids,
    /// No OOM under any policy, but with less than
    /// [`NARROW_MARGIN`](super::ensemble::NARROW_MARGIN) of the room to spare
    /// (set by the ensemble's judgement, never by [`Ooms::fate`]).
    AvoidsNarrowly,
    /// An OOM under every policy.
    Fails,
    /// An OOM under some policies only.
    DependsOnPlacement,
}

/// Whether a run ran out of memory under each policy of [`Placement::ALL`],
/// in that order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ooms(pub [bool; 3]);

impl Ooms {
    pub fn fate(&self) -> Fate {
        match self.0 {
            [false, false, false] => Fate::Avoids,
            [true, true, true] => Fate::Fails,
            _ => Fate::DependsOnPlacement,
        }
    }

    /// The policies under which the outcome differs from first-fit's.
    pub fn differing(&self) -> Vec<&'static str> {
        Placement::ALL
            .iter()
            .zip(self.0)
            .skip(1)
            .filter(|&(_, oom)| oom != self.0[0])
            .map(|(p, _)| p.name())
            .collect()
    }

    /// Per policy, for JSON: `{"first-fit": false, …}`.
    pub fn by_policy(&self) -> Vec<PolicyOutcome> {
        Placement::ALL
            .iter()
            .zip(self.0)
            .map(|(p, oom)| PolicyOutcome {
                policy: p.name(),
                oom,
            })
            .collect()
    }
}

/// One policy's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PolicyOutcome {
    pub policy: &'static str,
    pub oom: bool,
}

/// Replays under the policies other than first-fit, whose outcome
/// (`first_fit_oom`) is already known, side by side.
pub fn ooms(replay: &Replayer, settings: &Settings, capacity: u64, first_fit_oom: bool) -> Ooms {
    let [_, rising, random] = Placement::ALL;
    let oom = |placement| {
        replay(settings, "", capacity, None, placement)
            .figures
            .oom
            .is_some()
    };
    let (rising, random) = rayon::join(|| oom(rising), || oom(random));
    Ooms([first_fit_oom, rising, random])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fates_and_differing_policies() {
        assert_eq!(Ooms([false; 3]).fate(), Fate::Avoids);
        assert_eq!(Ooms([true; 3]).fate(), Fate::Fails);
        let mixed = Ooms([false, true, false]);
        assert_eq!(mixed.fate(), Fate::DependsOnPlacement);
        assert_eq!(mixed.differing(), vec!["rising addresses"]);
        assert!(Ooms([true; 3]).differing().is_empty());
    }
}
