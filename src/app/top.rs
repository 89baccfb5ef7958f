//! The `top` command: what fills the card. The live allocations of a
//! snapshot at its peak, at its OOM and at its end (or at a moment asked
//! for), grouped by the code that made them, with their categories, the
//! memory live before the trace began and the reserved memory no tensor
//! holds ([`crate::snapshot::attribute`]).

use super::Outcome;
use crate::Error;
use crate::ingest::InputKind;
use crate::snapshot::attribute::{self, Ask, At, Attribution, Grouping, MomentKind};
use std::path::PathBuf;

#[derive(Debug, Clone)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct TopOptions {
    /// Torch memory snapshot pickles (`torch.cuda.memory._dump_snapshot()`); `-` reads
    /// standard input. Two or more (one per rank) give the per-rank table.
    #[cfg_attr(feature = "cli", arg(required = true))]
    pub inputs: Vec<String>,
    /// Walk directories and wildcard patterns for the snapshots (one per rank).
    #[cfg_attr(feature = "cli", arg(long))]
    pub each: bool,
    /// The moment: `peak` (most memory allocated), `oom` (the trace's OOM), `end`,
    /// an event index (`1402`), or a time since the trace's first entry (`2.5s`, `300ms`).
    /// Default: the peak, the OOM when there is one, and the end.
    #[cfg_attr(feature = "cli", arg(long))]
    pub at: Option<String>,
    /// How live memory is grouped.
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value_t))]
    pub by: Grouping,
    /// Rows listed before the rest is summed.
    #[cfg_attr(feature = "cli", arg(short = 'n', long = "top", default_value_t = 20))]
    pub top: usize,
    /// Only this device (its index, as in `cuda:1`).
    #[cfg_attr(feature = "cli", arg(long))]
    pub device: Option<u32>,
    /// Also write a self-contained HTML report (a timeline stacked by category beside the table).
    #[cfg_attr(feature = "cli", arg(long))]
    pub report: Option<PathBuf>,
    /// The output format, the inputs' limits, inputs held in memory.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub common: super::Common,
}

impl Default for TopOptions {
    fn default() -> Self {
        TopOptions {
            inputs: Vec::new(),
            each: false,
            at: None,
            by: Grouping::Site,
            top: 20,
            device: None,
            report: None,
            common: super::Common::default(),
        }
    }
}

/// Which moments `--at` asks for: `None` shows the default ones.
pub fn parse_at(at: Option<&str>) -> Result<(Option<At>, Option<MomentKind>), Error> {
    let Some(at) = at.map(str::trim) else {
        return Ok((None, None));
    };
    let usage = || {
        Error::Usage(format!(
            "--at {at:?}: expected peak, oom, end, an event index (1402) or a time since the trace's first entry (2.5s, 300ms, 120us)"
        ))
    };
    Ok(match at {
        "peak" => (None, Some(MomentKind::Peak)),
        "oom" => (None, Some(MomentKind::Oom)),
        "end" => (None, Some(MomentKind::End)),
        _ if at.bytes().all(|b| b.is_ascii_digit()) => {
            let n = at.parse().map_err(|_| usage())?;
            (Some(At::Event(n)), Some(MomentKind::Event))
        }
        _ => {
            let (number, scale) = [("us", 1.0), ("ms", 1e3), ("s", 1e6)]
                .iter()
                .find_map(|(unit, scale)| Some((at.strip_suffix(unit)?, *scale)))
                .ok_or_else(usage)?;
            let v: f64 = number.trim().parse().map_err(|_| usage())?;
            if !v.is_finite() || v < 0.0 || v * scale > i64::MAX as f64 {
                return Err(usage());
            }
            (Some(At::Time((v * scale) as i64)), Some(MomentKind::Time))
        }
    })
}

/// The attribution of a snapshot's devices as `top` computes it: `device`
/// picks one; snapshots without stacks are grouped by block size and by
/// segment instead, when `ask` says so.
pub fn attribute_input(
    input: &str,
    (buffers, limits): (&super::Buffers, &crate::limits::Limits),
    ask: Ask,
    device: Option<u32>,
) -> Result<Vec<Attribution>, Error> {
    let name = crate::ingest::input_name(input);
    let data = buffers.read(input, limits)?;
    if crate::ingest::detect(&data) != InputKind::Pickle {
        return Err(Error::Input(format!(
            "{name}: not a snapshot pickle: `top` and `diff` read a torch memory snapshot ({}); for a log or pasted text, `allocdoc diagnose` says what must go",
            attribute::RECORD_STACKS
        )));
    }
    let mut release = data.releaser();
    let release = release.as_mut().map(|r| r as &mut dyn FnMut(usize));
    let devices = device.map(|d| vec![d]);
    let (snap, out) =
        attribute::tapped::attribute_input(name, &data, limits, release, devices.as_deref(), ask)?;
    if let Some(d) = device
        && out.is_empty()
    {
        let have: Vec<String> = snap.devices().iter().map(|d| format!("cuda:{d}")).collect();
        return Err(Error::Usage(format!(
            "--device {d}: {name} holds no segments or trace entries of cuda:{d} (it has {})",
            if have.is_empty() {
                "none".to_string()
            } else {
                have.join(", ")
            }
        )));
    }
    Ok(out)
}

pub fn run(opts: &TopOptions) -> Result<Outcome, Error> {
    let (at, only) = parse_at(opts.at.as_deref())?;
    let ask = Ask {
        by: opts.by,
        top: opts.top.max(1),
        at,
        timeline_points: if opts.report.is_some() { 1200 } else { 0 },
        headline_only: false,
        blocks_without_stacks: true,
    };
    let inputs = if opts.each {
        super::each::expand(&opts.inputs)
    } else {
        opts.inputs.clone()
    };
    if inputs.len() >= 2 {
        return ranks(opts, &inputs, ask);
    }
    let input = inputs.first().map_or("-", String::as_str);
    let mut devices = attribute_input(
        input,
        (&opts.common.buffers, &opts.common.limits),
        ask,
        opts.device,
    )?;
    let must_go = must_go(input, opts, &devices)?;
    if let Some(kind) = only {
        keep_moment(&mut devices, kind);
    }
    let name = crate::ingest::input_name(input);
    let mut notes = Vec::new();
    if let Some(path) = &opts.report {
        let html = crate::report::top::html(name, &devices, must_go.as_ref());
        notes.push(super::write_report(path, &html)?);
    }
    let mut out = Outcome::ok(opts.common.format.finish(crate::report::top::render(
        name,
        &devices,
        must_go.as_ref(),
        opts.common.format,
    )));
    out.stderr = notes;
    Ok(out)
}

/// Keeps only the moment `--at` names.
fn keep_moment(devices: &mut [Attribution], kind: MomentKind) {
    for a in devices {
        if kind == MomentKind::Oom && a.moment(MomentKind::Oom).is_none() {
            a.notes
                .push("the trace records no OOM: --at oom shows nothing".to_string());
        }
        a.moments.retain(|m| m.moment == kind);
    }
}

/// Several snapshots, one per rank: the per-rank table, then the outlier's table.
fn ranks(opts: &TopOptions, inputs: &[String], ask: Ask) -> Result<Outcome, Error> {
    use rayon::prelude::*;
    let one = |input: &String| -> Result<(String, Attribution), Error> {
        let devices = attribute_input(
            input,
            (&opts.common.buffers, &opts.common.limits),
            ask,
            opts.device,
        )?;
        // A rank's snapshot holds its own device; of several, the fullest.
        let a = devices
            .into_iter()
            .max_by_key(|a| a.headline().map_or(0, |m| m.allocated_bytes))
            .ok_or_else(|| Error::Input(format!("{input}: holds no device to attribute")))?;
        Ok((crate::ingest::input_name(input).to_string(), a))
    };
    let attributed: Vec<(String, Attribution)> =
        inputs.par_iter().map(one).collect::<Result<_, _>>()?;
    let ranks = attribute::ranks(&attributed);
    Ok(Outcome::ok(opts.common.format.finish(
        crate::report::top::render_ranks(&ranks, &attributed, opts.common.format),
    )))
}

/// What must go when a device's trace records an OOM: the shortfall, the
/// levers of its largest category, and the smallest card under the recorded
/// config and under the one `diagnose` recommends (bisected by replay).
fn must_go(
    input: &str,
    opts: &TopOptions,
    devices: &[Attribution],
) -> Result<Option<(u32, crate::advise::fills::MustGo)>, Error> {
    let Some((device, oom)) = devices
        .iter()
        .find_map(|a| Some((a.device_index, a.moment(MomentKind::Oom)?)))
    else {
        return Ok(None);
    };
    let Some(mut g) = crate::advise::fills::from_moment(oom) else {
        return Ok(None);
    };
    g.levers = crate::advise::fills::levers(oom);
    let prepared = super::input::prepare(
        input,
        (None, None),
        None,
        (None, &opts.common.limits),
        &opts.common.buffers,
    )?;
    // Only a full card calls for memory to go: not when `diagnose` names
    // another cause, nor, when it names none, unless the figures fall short.
    use crate::rules::Cause;
    match prepared.diagnosis.as_ref().map(|d| d.cause) {
        Some(Cause::Capacity | Cause::RequestExceedsCapacity) => {}
        None | Some(Cause::Unknown) if g.shortfall_bytes > 0 => {}
        _ => return Ok(None),
    }
    if let crate::trial::workload::Loaded::Ready(w) = &prepared.loaded {
        let mut configs = vec![(
            "current",
            prepared.current_conf.clone(),
            prepared.current.clone(),
        )];
        if let Some(r) = prepared
            .diagnosis
            .as_ref()
            .and_then(|d| d.recommendation.as_ref())
            && let Ok(p) = crate::conf::parse(&r.value, prepared.current.version)
        {
            configs.push(("recommended", r.value.clone(), p.settings));
        }
        let card = oom
            .reserved_bytes
            .saturating_add(oom.device_free_bytes.unwrap_or(0));
        let ceiling = crate::trial::workload::DEFAULT_CAPACITY.max(card.saturating_mul(4));
        g.smallest_card = crate::trial::fills::smallest_cards(w, &configs, ceiling)?;
    }
    Ok(Some((device, g)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moments_are_named_or_numbered() {
        assert_eq!(parse_at(None).unwrap(), (None, None));
        assert_eq!(
            parse_at(Some("oom")).unwrap(),
            (None, Some(MomentKind::Oom))
        );
        assert_eq!(
            parse_at(Some("1402")).unwrap(),
            (Some(At::Event(1402)), Some(MomentKind::Event))
        );
        assert_eq!(
            parse_at(Some("2.5s")).unwrap(),
            (Some(At::Time(2_500_000)), Some(MomentKind::Time))
        );
        assert_eq!(parse_at(Some("300ms")).unwrap().0, Some(At::Time(300_000)));
        for bad in ["", "-1s", "soon", "1e400s", "99999999999999999999"] {
            assert!(matches!(parse_at(Some(bad)), Err(Error::Usage(_))), "{bad}");
        }
    }
}
