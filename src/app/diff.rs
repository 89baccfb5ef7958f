//! The `diff` command: two snapshots' moments (the peak by default) side by
//! side, group by group and category by category, with the memory live
//! before each trace began compared the same way on both sides
//! ([`crate::snapshot::attribute::diff`]). For example a run with and one
//! without activation checkpointing.

use super::Outcome;
use super::top::{attribute_input, parse_at};
use crate::Error;
use crate::snapshot::attribute::{self, Ask, Attribution, Grouping, MomentKind};

#[derive(Debug, Clone)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct DiffOptions {
    /// The snapshot before the change.
    pub before: String,
    /// The snapshot after it.
    pub after: String,
    /// The moment compared on both sides: `peak` (default), `oom` or `end`.
    #[cfg_attr(feature = "cli", arg(long))]
    pub at: Option<String>,
    /// How live memory is grouped.
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value_t))]
    pub by: Grouping,
    /// Groups listed (largest change first) before the rest is summed.
    #[cfg_attr(feature = "cli", arg(short = 'n', long = "top", default_value_t = 20))]
    pub top: usize,
    /// The device on both sides (default: each side's device with a trace, else its first).
    #[cfg_attr(feature = "cli", arg(long))]
    pub device: Option<u32>,
    /// The output format, the inputs' limits, inputs held in memory.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub common: super::Common,
}

impl Default for DiffOptions {
    fn default() -> Self {
        DiffOptions {
            before: String::new(),
            after: String::new(),
            at: None,
            by: Grouping::Site,
            top: 20,
            device: None,
            common: super::Common::default(),
        }
    }
}

pub fn run(opts: &DiffOptions) -> Result<Outcome, Error> {
    let kind = match parse_at(opts.at.as_deref())? {
        (None, None) => MomentKind::Peak,
        (None, Some(k)) => k,
        _ => {
            return Err(Error::Usage(
                "--at: diff compares named moments only: peak, oom or end".to_string(),
            ));
        }
    };
    // Every group on both sides, so that each can be compared.
    let ask = Ask {
        by: opts.by,
        top: usize::MAX,
        at: None,
        timeline_points: 0,
        headline_only: false,
        blocks_without_stacks: true,
    };
    let side = |input: &str| -> Result<Attribution, Error> {
        let devices = attribute_input(
            input,
            (&opts.common.buffers, &opts.common.limits),
            ask,
            opts.device,
        )?;
        let mut traced = devices.iter().filter(|a| a.traced);
        let pick = traced.next().or(devices.first()).cloned();
        pick.ok_or_else(|| Error::Input(format!("{input}: holds no device to attribute")))
    };
    let (before, after) = (side(&opts.before)?, side(&opts.after)?);
    let names = (
        crate::ingest::input_name(&opts.before),
        crate::ingest::input_name(&opts.after),
    );
    let d = attribute::diff((names.0, &before), (names.1, &after), kind, opts.top)
        .ok_or_else(|| Error::Input("nothing to compare: a side has no moment".to_string()))?;
    let mut out = Outcome::ok(
        opts.common
            .format
            .finish(crate::report::top::render_diff(&d, opts.common.format)),
    );
    // A side without the moment asked for is compared at its end: say so.
    for (name, side) in [(names.0, &before), (names.1, &after)] {
        if side.moment(kind).is_none() {
            out.stderr.push(format!(
                "note: {name} has no {} moment (--at {}): its end is compared instead",
                kind.as_str(),
                kind.as_str()
            ));
        }
    }
    Ok(out)
}
