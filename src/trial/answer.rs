//! One answer: the diagnosis (the rules over the evidence, in the user's
//! setup) and what replays showed, settled into one cause and one line.
//! `diagnose` has no replays; `recommend` adds a search of the setup's
//! candidate space, `validate` one candidate. The cause is always the
//! diagnosis's. The line is the rules' unless the replay evidence is strong
//! enough to overrule them, and then one sentence says which evidence
//! overrides which ("the rules suggest X; replaying your trace shows Y does
//! better").
//!
//! How strong replay evidence is ([`Strength`]) decides what it may overrule:
//!
//! * **proven** (a recorded trace replayed): the best config replaces the
//!   rules' line when the rules' line runs out of memory and it does not, or
//!   it reaches a lower peak reserved; it also gives a line where the rules
//!   gave none, even where the cause rules settings out.
//! * **likely** (text evidence whose probe reproduced the OOM; issue 13's
//!   ensemble makes this a vote over plausible workloads): it replaces the
//!   rules' line only when that line still runs out of memory and another
//!   config does not, and gives a line where the rules gave none only when it
//!   avoids an OOM the current config hits and the cause allows a setting.
//! * **uncertain** (a probe that did not reproduce the OOM): it never changes
//!   the line; a disagreement is reported in one sentence.

use super::run::Run;
use crate::advise::{Diagnosis, Recommendation, Setup};
use crate::rules::Cause;
use serde::Serialize;

/// How strongly replay evidence bears on the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Strength {
    Uncertain,
    Likely,
    Proven,
}

impl Strength {
    /// How the evidence is named in the override sentence.
    fn replaying(self) -> &'static str {
        match self {
            Strength::Proven => "replaying your trace",
            Strength::Likely => "on the synthetic workloads fitted to your figures",
            // A text ensemble, or a trace whose outcome depends on placement.
            Strength::Uncertain => "by replay, on uncertain evidence",
        }
    }

    /// A fitted prediction's strength: likely with no reason to doubt it.
    pub fn of_reasons<T>(reasons: &[T]) -> Strength {
        if reasons.is_empty() {
            Strength::Likely
        } else {
            Strength::Uncertain
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Strength::Proven => "proven",
            Strength::Likely => "likely",
            Strength::Uncertain => "uncertain",
        }
    }
}

/// What replays add to the diagnosis.
#[derive(Debug, Clone, Copy)]
pub struct Replays<'a> {
    pub strength: Strength,
    /// The current config's run.
    pub current: &'a Run,
    /// The configs replayed, best first (the search; or validate's candidate).
    pub ranked: &'a [Run],
    /// The rules' line replayed in full, when it was (a bounded search may
    /// have stopped its run early).
    pub rules: Option<&'a Run>,
}

/// The one answer of a command.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Answer {
    /// The headline cause (the diagnosis's), `None` without text evidence (a trace CSV).
    #[serde(serialize_with = "serialize_cause")]
    pub cause: Option<Cause>,
    /// The diagnosis's one-line verdict.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diagnosis: Option<String>,
    /// The line the rules recommend (`diagnose`'s).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rules_line: Option<String>,
    /// The line to set, after the replays.
    pub recommendation: Option<Recommendation>,
    /// One sentence when the replays overrule the rules, or disagree with them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overrides: Option<String>,
    pub setup: Setup,
}

fn serialize_cause<S: serde::Serializer>(c: &Option<Cause>, s: S) -> Result<S::Ok, S::Error> {
    match c {
        Some(c) => s.serialize_str(c.as_str()),
        None => s.serialize_none(),
    }
}

/// A config's value with its keys in one order, for comparing lines.
pub fn same_config(a: &str, b: &str) -> bool {
    fn key(s: &str) -> Vec<&str> {
        let mut v: Vec<&str> = s.split(',').filter(|x| !x.is_empty()).collect();
        v.sort_unstable();
        v
    }
    key(a) == key(b)
}

fn shown(conf: &str) -> &str {
    if conf.is_empty() {
        "PyTorch's defaults"
    } else {
        conf
    }
}

/// Settles one answer from a diagnosis (none for a trace CSV) and the replays (none for `diagnose`).
pub fn decide(d: Option<&Diagnosis>, setup: &Setup, replays: Option<Replays>) -> Answer {
    let cause = d.map(|d| d.cause);
    let rules = d.and_then(|d| d.recommendation.clone());
    let mut answer = Answer {
        cause,
        diagnosis: d.map(|d| d.verdict.clone()),
        rules_line: rules.as_ref().map(|r| r.value.clone()),
        recommendation: rules.clone(),
        overrides: None,
        setup: setup.clone(),
    };
    let Some(r) = replays else {
        return answer;
    };
    // Only what the setup admits can become the line (a candidate `validate`
    // was given may be one PyTorch ignores on the user's platform).
    let ranked: Vec<&Run> = r
        .ranked
        .iter()
        .filter(|run| crate::advise::space::admits_value(setup, &run.conf).is_ok())
        .collect();
    let best = ranked.first().copied().filter(|b| b.figures.oom.is_none());
    let rules_run = rules.as_ref().and_then(|x| {
        ranked
            .iter()
            .copied()
            .find(|run| same_config(&run.conf, &x.value))
    });
    let line =
        |conf: &str| Recommendation::new(conf.to_string(), setup.platform.value, setup.torch.value);
    let how = r.strength.replaying();
    let ruled_out = cause.is_some_and(Cause::rules_out_settings);
    match (&rules, rules_run, best) {
        // The rules' line was replayed and runs out of memory.
        (Some(x), Some(xr), b) if xr.figures.oom.is_some() => match b {
            Some(b) if r.strength >= Strength::Likely => {
                answer.recommendation = Some(line(&b.conf));
                answer.overrides = Some(format!(
                    "the rules suggest {}; {how}, it still runs out of memory and {} avoids the OOM",
                    x.value,
                    shown(&b.conf)
                ));
            }
            Some(b) => {
                answer.overrides = Some(format!(
                    "the rules suggest {}; {how}, it still runs out of memory and {} avoids the OOM, \
                     but that evidence is not strong enough to change the rules' line",
                    x.value,
                    shown(&b.conf)
                ));
            }
            // Every config fails: only a replayed trace drops the rules' line
            // (synthetic workloads may fail where the user's run would not).
            None => {
                let every = if ranked.len() > 1 {
                    ", like every other config tried"
                } else {
                    ""
                };
                answer.overrides = Some(if r.strength == Strength::Proven {
                    answer.recommendation = None;
                    format!(
                        "the rules suggest {}; {how}, it still runs out of memory{every}",
                        x.value
                    )
                } else {
                    format!(
                        "the rules suggest {}; {how}, it still runs out of memory{every}, but \
                         that evidence is not strong enough to drop the rules' line",
                        x.value
                    )
                });
            }
        },
        // The rules' line runs; a trace may still show a better one.
        (Some(x), Some(xr), Some(b)) if !same_config(&b.conf, &x.value) => {
            if r.strength == Strength::Proven
                && b.figures.peak_reserved_bytes < xr.figures.peak_reserved_bytes
            {
                answer.recommendation = Some(line(&b.conf));
                answer.overrides = Some(format!(
                    "the rules suggest {}; {how} shows {} does better (peak reserved {} instead of {})",
                    x.value,
                    shown(&b.conf),
                    crate::units::human(b.figures.peak_reserved_bytes),
                    crate::units::human(xr.figures.peak_reserved_bytes)
                ));
            } else if b.figures.peak_reserved_bytes < xr.figures.peak_reserved_bytes {
                answer.overrides = Some(format!(
                    "{} ranks first {how}, but the rules' {} also runs there, and a synthetic \
                     probe is not enough to change the line",
                    shown(&b.conf),
                    x.value
                ));
            }
        }
        (Some(_), _, _) => {}
        // No line from the rules.
        (None, _, Some(b)) => {
            let current_oom = r.current.figures.oom.is_some();
            let gives = match r.strength {
                // The contract: a replayed trace's best config that runs.
                Strength::Proven => true,
                Strength::Likely => current_oom && !ruled_out,
                Strength::Uncertain => false,
            };
            let kept = !current_oom && same_config(&b.conf, &r.current.conf);
            let what = if current_oom {
                format!("{} avoids the OOM the current config hits", shown(&b.conf))
            } else if kept {
                format!("{}, the config in use, does best", shown(&b.conf))
            } else {
                let (new, old) = (
                    b.figures.peak_reserved_bytes,
                    r.current.figures.peak_reserved_bytes,
                );
                let how_much = format!(
                    "peak reserved {} against {}",
                    crate::units::human(new),
                    crate::units::human(old)
                );
                match new.cmp(&old) {
                    std::cmp::Ordering::Less => format!(
                        "{} does better than the current config ({how_much})",
                        shown(&b.conf)
                    ),
                    std::cmp::Ordering::Equal => format!(
                        "{} runs as well as the current config ({how_much})",
                        shown(&b.conf)
                    ),
                    std::cmp::Ordering::Greater => format!(
                        "{} ranks first, above the current config ({how_much})",
                        shown(&b.conf)
                    ),
                }
            };
            let rules_said = match cause {
                // "No setting can help" only where its claim holds: where
                // one could place this request in the cache, the rules rule
                // settings out for the allocations after it.
                Some(c) if ruled_out => {
                    let room = d.is_some_and(|d| {
                        crate::advise::claims::Claim::NoSettingHelps
                            .refuted(&d.grounds())
                            .is_some()
                    });
                    format!(
                        "the rules find {}: no allocator setting {}",
                        c.as_str(),
                        if room {
                            "makes room for the allocations after this one"
                        } else {
                            "can help"
                        }
                    )
                }
                Some(_) => "the rules suggest no setting".to_string(),
                None => String::new(),
            };
            if gives {
                answer.recommendation = Some(line(&b.conf));
                if !rules_said.is_empty() {
                    answer.overrides = Some(format!("{rules_said}; {how}, {what}"));
                }
            } else if r.strength == Strength::Likely && !current_oom {
                // No OOM to avoid, on synthetic evidence: the line keeps the
                // config in use (a probe is not enough to change it).
                answer.recommendation = Some(line(&r.current.conf));
                if !rules_said.is_empty() {
                    answer.overrides = Some(if kept {
                        format!("{rules_said}; {how}, {what}")
                    } else {
                        format!(
                            "{rules_said}; {how}, {what}, but a synthetic probe is not enough \
                             to change {}, the config in use",
                            shown(&r.current.conf)
                        )
                    });
                }
            } else if !rules_said.is_empty() && !kept {
                let why = if ruled_out {
                    "that gets past this one allocation, not the next ones"
                } else {
                    "that evidence is not strong enough to show that a setting helps"
                };
                answer.overrides = Some(format!("{rules_said}; {how}, {what}, but {why}"));
            }
        }
        (None, _, None) => {}
    }
    answer
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::advise::SetupFlags;
    use crate::workload::{OomEvent, RunFigures};

    /// A fragmentation diagnosis whose rules recommend expandable segments, in the default setup.
    fn fragmentation_with_the_rules_line() -> (Setup, Diagnosis) {
        let setup = Setup::of_flags(&SetupFlags::default());
        let d = diagnosis(
            Cause::Fragmentation,
            Some("expandable_segments:True"),
            &setup,
        );
        (setup, d)
    }

    /// The answer of `d` with `ranked` replays of `strength` beside the `current` run.
    fn replayed(
        d: &Diagnosis,
        setup: &Setup,
        strength: Strength,
        (current, ranked): (&Run, &[Run]),
    ) -> Answer {
        decide(
            Some(d),
            setup,
            Some(Replays {
                strength,
                current,
                ranked,
                rules: None,
            }),
        )
    }

    fn run(conf: &str, oom: bool, peak: u64) -> Run {
        Run {
            conf: conf.into(),
            figures: RunFigures {
                oom: oom.then(|| OomEvent {
                    event_index: 9,
                    requested_bytes: 1 << 30,
                    message: String::new(),
                    before_trace: None,
                }),
                peak_reserved_bytes: peak,
                ..RunFigures::default()
            },
        }
    }

    fn diagnosis(cause: Cause, line: Option<&str>, setup: &Setup) -> Diagnosis {
        let mut d = crate::advise::diagnose(
            crate::evidence::Evidence::default(),
            &crate::advise::Context::default(),
            &crate::rules::RuleSet::default(),
        );
        d.cause = cause;
        d.recommendation =
            line.map(|l| Recommendation::new(l.into(), setup.platform.value, setup.torch.value));
        d
    }

    #[test]
    fn a_trace_overrules_the_rules_a_probe_does_not() {
        let (setup, d) = fragmentation_with_the_rules_line();
        let current = run("", true, 10);
        let ranked = [
            run("max_split_size_mb:64,expandable_segments:True", false, 8),
            run("expandable_segments:True", false, 9),
        ];
        let proven = replayed(&d, &setup, Strength::Proven, (&current, &ranked));
        assert_eq!(
            proven.recommendation.map(|r| r.value).as_deref(),
            Some("max_split_size_mb:64,expandable_segments:True")
        );
        let sentence = proven.overrides.unwrap();
        assert!(
            sentence.starts_with(
                "the rules suggest expandable_segments:True; replaying your trace shows"
            ),
            "{sentence}"
        );
        let likely = replayed(&d, &setup, Strength::Likely, (&current, &ranked));
        assert_eq!(
            likely.recommendation.map(|r| r.value).as_deref(),
            Some("expandable_segments:True"),
            "a probe does not overrule a line that also runs"
        );
        assert!(likely.overrides.is_some_and(|s| s.contains("not enough")));
    }

    #[test]
    fn a_ruled_out_cause_keeps_no_line_unless_a_trace_proves_one() {
        let setup = Setup::of_flags(&SetupFlags::default());
        let d = diagnosis(Cause::Capacity, None, &setup);
        let current = run("", true, 10);
        let ranked = [run("expandable_segments:True", false, 9)];
        let probe = replayed(&d, &setup, Strength::Likely, (&current, &ranked));
        assert_eq!(probe.recommendation, None);
        let s = probe.overrides.unwrap();
        assert!(
            s.starts_with(
                "the rules find capacity: no allocator setting can help; on the synthetic workloads"
            ),
            "{s}"
        );
        assert!(s.ends_with("not the next ones"), "{s}");
        let trace = replayed(&d, &setup, Strength::Proven, (&current, &ranked));
        assert_eq!(
            trace.recommendation.map(|r| r.value).as_deref(),
            Some("expandable_segments:True")
        );
        assert!(
            trace
                .overrides
                .unwrap()
                .contains("replaying your trace, expandable_segments:True avoids the OOM")
        );
    }

    #[test]
    fn a_probe_failing_everywhere_keeps_the_rules_line() {
        let (setup, d) = fragmentation_with_the_rules_line();
        let current = run("", true, 10);
        let ranked = [
            run("expandable_segments:True", true, 9),
            run("max_split_size_mb:64", true, 9),
        ];
        let a = replayed(&d, &setup, Strength::Likely, (&current, &ranked));
        assert_eq!(
            a.recommendation.map(|r| r.value).as_deref(),
            Some("expandable_segments:True")
        );
        assert!(
            a.overrides
                .as_deref()
                .is_some_and(|s| s.ends_with("like every other config tried, but that evidence is not strong enough to drop the rules' line")),
            "{:?}",
            a.overrides
        );
    }

    #[test]
    fn the_rules_line_failing_everywhere_leaves_no_line() {
        let (setup, d) = fragmentation_with_the_rules_line();
        let current = run("", true, 10);
        let ranked = [run("expandable_segments:True", true, 9)];
        let a = replayed(&d, &setup, Strength::Proven, (&current, &ranked));
        assert_eq!(a.recommendation, None);
        assert_eq!(
            a.overrides.as_deref(),
            Some(
                "the rules suggest expandable_segments:True; replaying your trace, it still runs out of memory"
            )
        );
    }
}
