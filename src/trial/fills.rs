//! The smallest card a snapshot's trace runs on, under the config it was
//! recorded with and under the recommended one: the bisection `recommend`
//! uses ([`super::search::min_capacity`]), for `top`'s "What must go".

use super::workload::Workload;
use crate::advise::fills::SmallestCard;
use crate::conf::Settings;
use crate::device::sim::Placement;

/// Bisects, for each config (`current` or `recommended`, its text and its
/// settings), the smallest card in `(0, ceiling]` on which `workload` runs.
pub fn smallest_cards(
    workload: &Workload,
    configs: &[(&'static str, String, Settings)],
    ceiling: u64,
) -> Result<Vec<SmallestCard>, crate::Error> {
    workload.with_replayer(|replay| {
        configs
            .iter()
            .map(|(config, conf, settings)| {
                let run = |cap: u64| replay(settings, conf, cap, None, Placement::FirstFit).figures;
                let at_ceiling = run(ceiling);
                let capacity = at_ceiling.oom.is_none().then(|| {
                    super::search::min_capacity(
                        &at_ceiling,
                        ceiling,
                        settings.per_process_memory_fraction.is_none(),
                        run,
                        &|_| {},
                    )
                });
                SmallestCard {
                    config,
                    conf: conf.clone(),
                    capacity_bytes: capacity,
                }
            })
            .collect()
    })
}
