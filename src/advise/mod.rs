//! Findings, the cause, and the combined recommendation: settles the
//! user's [`Setup`] and the candidate [`Space`] valid for it, runs the rules
//! over the facts of every OOM incident, picks the headline incident by the
//! rule documented in [`incident`], and turns what fired into one answer.
//!
//! The cause is the `cause` of the highest-priority rule that fired (rules
//! without a cause only add findings and settings); `unknown` when none did.
//! The recommendation is null whenever that cause rules out an allocator
//! setting (request larger than the card, capacity, not the allocator, other
//! processes), whatever else fired, and it is always a candidate of the
//! space: valid for the user's PyTorch and acted on on their platform.
//!
//! A rule that reads a snapshot's recorded trace (`catalog::reads_trace`)
//! and suggests settings is shown only when a caller-supplied [`Checker`]
//! replayed that trace with and without them and the run with them ranked
//! better; otherwise its finding is withheld ([`Withheld`], with the
//! replay's figures). The checker lives in the layer that replays (`trial`).

pub mod claims;
pub mod combine;
pub mod conf_check;
pub mod context;
pub mod facts;
pub mod fills;
pub mod incident;
pub mod setup;
pub mod space;

pub use combine::Recommendation;
pub use context::Context;
pub use setup::{Setup, SetupFlags};
pub use space::Space;

use crate::evidence::{Evidence, Kind, Observation};
use crate::rules::expr::Value;
use crate::rules::{Cause, Facts, Rule, RuleSet, Severity, Verdict};
use crate::workload::RunFigures;
use serde::Serialize;
use std::collections::BTreeMap;

/// One fired rule, as reported.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    pub rule: String,
    pub severity: Severity,
    pub message: String,
    /// The metric values the rule's condition read.
    pub evidence: BTreeMap<String, Value>,
    #[serde(skip)]
    pub title: String,
    #[serde(skip)]
    pub next: Option<String>,
    #[serde(skip)]
    pub reference: String,
    #[serde(skip)]
    pub cause: Option<Cause>,
    #[serde(skip)]
    pub priority: i32,
    /// Where in the program the finding points (`file:line:function`), when
    /// the rule names a site and the evidence recorded it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub site: Option<String>,
    /// The replay that checked the settings this rule suggested.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replay_check: Option<ReplayCheck>,
}

/// A snapshot's trace replayed without and with the settings a trace rule
/// suggested, at one capacity.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplayCheck {
    /// The suggested settings, as `key:value` pairs joined by commas.
    pub settings: String,
    /// The config replayed without them (what the snapshot recorded) and with them.
    pub without: String,
    pub with: String,
    pub capacity_bytes: u64,
    pub without_figures: RunFigures,
    pub with_figures: RunFigures,
    /// The run with the settings ranks better (`RunFigures::rank`: no OOM,
    /// then lower peak reserved, then less driver work).
    pub supported: bool,
    /// What the replay showed, in one sentence.
    pub finding: String,
}

/// Checks the settings a trace rule suggested by replay.
pub type Checker<'c> =
    dyn FnMut(&Facts, &BTreeMap<String, String>) -> Result<ReplayCheck, String> + 'c;

/// A trace rule that fired but whose settings the replay did not support
/// (or could not check): not shown, listed under `-v`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Withheld {
    pub rule: String,
    pub message: String,
    pub settings: BTreeMap<String, String>,
    /// The replay, when it ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replay_check: Option<ReplayCheck>,
    /// Why it could not be checked, when it did not run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unchecked: Option<String>,
}

/// A rule that could not be evaluated, and what it needed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NotEvaluated {
    pub rule: String,
    pub needs: Vec<String>,
}

/// One OOM incident and its own cause (the headline incident first).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IncidentCause {
    /// Index into `evidence.observations` of the report that speaks for it.
    pub observation: usize,
    /// How many reports of it the evidence holds (repeats, cut copies).
    pub reports: usize,
    pub cause: Cause,
    pub verdict: String,
}

/// How many incidents have one cause.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CauseCount {
    pub cause: Cause,
    pub count: usize,
}

/// How many incidents a diagnosis lists with their verdicts; a log of a
/// large job can hold one per rank and step.
pub const MAX_INCIDENTS: usize = 20;

/// From this many incidents on, they are judged in parallel.
const PARALLEL_INCIDENTS: usize = 64;

/// What ranks an incident: its report, how many reports it has, the weight
/// and cause of its deciding finding.
struct Judged {
    observation: usize,
    reports: usize,
    weight: incident::Weight,
    cause: Cause,
}

impl Judged {
    fn of(outcome: &Outcome, observation: usize, reports: usize) -> Judged {
        Judged {
            observation,
            reports,
            weight: outcome.weight(),
            cause: outcome
                .deciding()
                .and_then(|f| f.cause)
                .unwrap_or(Cause::Unknown),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Diagnosis {
    pub evidence: Evidence,
    /// Index into `evidence.observations` of the observation diagnosed.
    pub primary: Option<usize>,
    pub cause: Cause,
    /// The one-line answer.
    pub verdict: String,
    pub findings: Vec<Finding>,
    pub recommendation: Option<Recommendation>,
    pub not_evaluated: Vec<NotEvaluated>,
    /// Rules whose expression failed at run time (a rule-file bug), with why.
    pub failed: Vec<(String, String)>,
    /// The current config, when known, and where it came from.
    pub current_conf: Option<(String, &'static str)>,
    pub facts: Facts,
    /// The user's setup every part of the answer holds for.
    pub setup: Setup,
    /// The OOM incidents with their causes, the headline first: the top
    /// [`MAX_INCIDENTS`] by [`incident::headline_key`].
    pub incidents: Vec<IncidentCause>,
    /// How many OOM incidents the evidence holds.
    pub incident_count: usize,
    /// The incidents beyond `incidents`, counted by cause (most first).
    pub other_incidents: Vec<CauseCount>,
    /// Trace rules whose settings the replay did not support.
    pub withheld: Vec<Withheld>,
    /// What fills the card, and for a capacity OOM what must go.
    pub fills: Option<fills::Fills>,
}

impl Diagnosis {
    /// What this diagnosis's claims are held to ([`claims`]).
    pub fn grounds(&self) -> claims::Grounds<'_> {
        claims::Grounds {
            facts: &self.facts,
            cause: self.cause,
            device: self.setup.device,
        }
    }

    /// Why no line is given, in one sentence, when none is: "no allocator
    /// setting will help" only where its claim holds (a setting could place
    /// this request in the cache, but not the allocations after it).
    pub fn no_line(&self) -> Option<String> {
        if self.recommendation.is_some() {
            return None;
        }
        let cause = self.cause.as_str();
        let needs_version = self.not_evaluated.iter().any(|n| {
            n.needs
                .iter()
                .any(|m| m == "torch_version" || m == "expandable_segments_supported")
        });
        Some(if self.cause.rules_out_settings() {
            match claims::Claim::NoSettingHelps.refuted(&self.grounds()) {
                None => format!(
                    "No allocator setting will help here ({cause}); the findings say what will."
                ),
                Some(_) => format!(
                    "No allocator setting is recommended ({cause}): a setting could place this \
                     request in memory the cache holds, but not make room for the allocations after \
                     it; the findings say what will."
                ),
            }
        } else if needs_version {
            "No allocator setting yet: which one applies depends on your PyTorch version; rerun \
             with --torch-version."
                .into()
        } else {
            "No allocator setting to recommend from this evidence.".into()
        })
    }

    /// The incidents whose cause differs from the headline's.
    pub fn differing_incidents(&self) -> impl Iterator<Item = &IncidentCause> {
        self.incidents
            .iter()
            .skip(1)
            .filter(|i| i.cause != self.cause)
    }
}

/// What the rules concluded about one observation.
struct Outcome<'r> {
    facts: Facts,
    findings: Vec<Finding>,
    fired: Vec<(&'r Rule, BTreeMap<String, String>)>,
    not_evaluated: Vec<NotEvaluated>,
    failed: Vec<(String, String)>,
    withheld: Vec<Withheld>,
    /// A rule asked for a replay check and no checker was given.
    wanted_check: bool,
}

impl Outcome<'_> {
    /// The finding that decides the cause (findings are sorted by priority).
    fn deciding(&self) -> Option<&Finding> {
        self.findings.iter().find(|f| f.cause.is_some())
    }

    fn weight(&self) -> incident::Weight {
        self.deciding()
            .map_or_else(incident::Weight::default, |f| incident::Weight {
                severity: match f.severity {
                    Severity::Info => 1,
                    Severity::Warning => 2,
                    Severity::Error => 3,
                },
                priority: f.priority,
            })
    }
}

fn evaluate<'r>(rules: &'r RuleSet, facts: Facts, mut check: Option<&mut Checker>) -> Outcome<'r> {
    let mut out = Outcome {
        facts,
        findings: Vec::new(),
        fired: Vec::new(),
        not_evaluated: Vec::new(),
        failed: Vec::new(),
        withheld: Vec::new(),
        wanted_check: false,
    };
    for rule in &rules.rules {
        match rule.evaluate(&out.facts) {
            Verdict::Fired(f) => {
                let replay_check =
                    match checked(rule, &f.settings, &out.facts, check.as_deref_mut()) {
                        Checked::Shown(c) => c,
                        Checked::Withheld(replay_check, unchecked) => {
                            out.wanted_check |= replay_check.is_none() && check.is_none();
                            out.withheld.push(Withheld {
                                rule: rule.id.clone(),
                                message: f.message,
                                settings: f.settings,
                                replay_check,
                                unchecked,
                            });
                            continue;
                        }
                    };
                out.findings.push(Finding {
                    rule: rule.id.clone(),
                    severity: rule.severity,
                    message: f.message,
                    evidence: f.evidence,
                    title: rule.title.clone(),
                    next: f.next,
                    reference: rule.reference.clone(),
                    cause: rule.cause,
                    priority: rule.priority,
                    site: f.site,
                    replay_check,
                });
                out.fired.push((rule, f.settings));
            }
            Verdict::NotEvaluated(needs) => out.not_evaluated.push(NotEvaluated {
                rule: rule.id.clone(),
                needs,
            }),
            Verdict::Failed(why) => out.failed.push((rule.id.clone(), why)),
            Verdict::Quiet | Verdict::NotApplicable(_) => {}
        }
    }
    // Highest priority first; ties keep rule order (stable sort).
    out.findings
        .sort_by_key(|f| std::cmp::Reverse((f.priority, f.severity)));
    out
}

/// The one-line answer for an outcome.
fn verdict_of(outcome: &Outcome, evidence: &Evidence) -> (Cause, String) {
    let facts = &outcome.facts;
    let deciding = outcome.deciding();
    let cause = deciding.and_then(|f| f.cause).unwrap_or(Cause::Unknown);
    let verdict = match deciding {
        Some(f) => format!("{}: {}", cause.as_str(), f.message),
        None if evidence.observations.is_empty() => {
            "No OOM message, memory summary, stats dump or snapshot was found in the input.".into()
        }
        None if !facts
            .kinds
            .iter()
            .any(|k| matches!(k, Kind::Oom | Kind::NonAllocatorOom))
            && !facts.values.contains_key("requested") =>
        {
            let counted = match facts.values.get("ooms") {
                Some(crate::rules::Fact::Num(n)) if *n >= 1.0 => Some(*n as u64),
                _ => None,
            };
            let state = match (outcome.findings.first(), counted) {
                (Some(f), _) => format!("the memory state: {}", f.message),
                (None, Some(_)) => dump_state(facts),
                (None, None) => "nothing in the memory state stands out; the OOM message itself \
                                 (or a snapshot) would name the cause."
                    .into(),
            };
            match counted {
                Some(n) => format!(
                    "The allocator counted {n} out-of-memory error{} (\"CUDA OOMs\" / num_ooms), \
                     but the input holds no OOM message; {state}",
                    if n == 1 { "" } else { "s" }
                ),
                None if outcome.findings.is_empty() => {
                    "No out-of-memory error in the evidence, and nothing in the memory state stands out.".into()
                }
                None => format!("No out-of-memory error in the evidence; {state}"),
            }
        }
        None => "Not enough evidence to name a cause.".into(),
    };
    (cause, verdict)
}

/// The state a dump taken after a counted OOM shows (an OOM counted is
/// something that stands out: `claims::Claim::NothingStandsOut`).
fn dump_state(facts: &Facts) -> String {
    use crate::rules::Fact;
    use crate::units::format_size;
    let num = |n: &str| match facts.values.get(n) {
        Some(Fact::Num(v)) => Some(*v as u64),
        _ => None,
    };
    let cause = "the OOM message itself (or a snapshot) would name its cause.";
    let (Some(reserved), Some(allocated)) = (num("reserved"), num("allocated")) else {
        return format!("this dump does not show the state at the OOM; {cause}");
    };
    let unused = reserved.saturating_sub(allocated);
    let split = num("inactive_split").map_or(String::new(), |s| {
        format!(
            " ({} of it in segments that still hold live tensors, the rest in whole free \
             segments torch.cuda.empty_cache() would return)",
            format_size(s.min(unused))
        )
    });
    format!(
        "at this dump PyTorch reserves {} and live tensors hold {}: {} is cached unused{split}. \
         A dump taken after the OOM shows what was left, not what failed; {cause}",
        format_size(reserved),
        format_size(allocated),
        format_size(unused)
    )
}

/// Runs every rule over `evidence` and combines the result; trace rules'
/// settings are not checked, so those rules are withheld.
pub fn diagnose(evidence: Evidence, ctx: &Context, rules: &RuleSet) -> Diagnosis {
    diagnose_checked(evidence, ctx, rules, None)
}

/// [`diagnose`], with trace rules' settings checked by `check`.
pub fn diagnose_checked<'r>(
    evidence: Evidence,
    ctx: &Context,
    rules: &'r RuleSet,
    mut check: Option<&mut Checker>,
) -> Diagnosis {
    let setup = Setup::resolve(&evidence, ctx);
    let shared = facts::Shared::new(&evidence, ctx, &setup);
    let facts_of = |p: Option<&Observation>| shared.facts(p);
    // Every incident is evaluated, but only the top MAX_INCIDENTS (by
    // incident::headline_key) keep a verdict and only the headline keeps its
    // outcome; the rest are counted by cause, so memory does not grow with them.
    let mut top: Vec<(Judged, Option<Outcome>)> = Vec::new();
    let mut by_cause: Vec<CauseCount> = Vec::new();
    let all = incident::incidents(&evidence);
    let incident_count = all.len();
    let mut offer = |j: Judged, outcome: Option<Outcome<'r>>| {
        match by_cause.iter_mut().find(|c| c.cause == j.cause) {
            Some(c) => c.count += 1,
            None => by_cause.push(CauseCount {
                cause: j.cause,
                count: 1,
            }),
        }
        let key = incident::headline_key(&evidence.observations[j.observation], j.weight);
        let rank = top.partition_point(|(k, _)| {
            incident::headline_key(&evidence.observations[k.observation], k.weight) >= key
        });
        if rank < MAX_INCIDENTS {
            top.insert(rank, (j, outcome));
            top.truncate(MAX_INCIDENTS);
        }
    };
    let report = |inc: &incident::Incident| {
        let i = inc.report();
        Some((i, inc.observations.len(), evidence.observations.get(i)?))
    };
    // Incidents are judged on every core without the replay checker; one
    // whose rules asked for a replay is evaluated again, in order, with it.
    // Only the few that make the top are evaluated again for their verdicts.
    let judge = |(i, n, o)| {
        let outcome = evaluate(rules, facts_of(Some(o)), None);
        (Judged::of(&outcome, i, n), outcome.wanted_check)
    };
    let judged: Vec<(Judged, bool)> = if all.len() < PARALLEL_INCIDENTS {
        all.iter().filter_map(report).map(judge).collect()
    } else {
        use rayon::prelude::*;
        all.par_iter().filter_map(report).map(judge).collect()
    };
    for (j, wanted_check) in judged {
        match check.as_deref_mut() {
            Some(check) if wanted_check => {
                let o = &evidence.observations[j.observation];
                let outcome = evaluate(rules, facts_of(Some(o)), Some(check));
                offer(
                    Judged::of(&outcome, j.observation, j.reports),
                    Some(outcome),
                );
            }
            _ => offer(j, None),
        }
    }
    let top: Vec<(Judged, Outcome)> = top
        .into_iter()
        .map(|(j, o)| {
            let o = o.unwrap_or_else(|| {
                evaluate(
                    rules,
                    facts_of(evidence.observations.get(j.observation)),
                    None,
                )
            });
            (j, o)
        })
        .collect();
    for (j, _) in &top {
        if let Some(c) = by_cause.iter_mut().find(|c| c.cause == j.cause) {
            c.count -= 1;
        }
    }
    by_cause.retain(|c| c.count > 0);
    by_cause.sort_by_key(|c| std::cmp::Reverse(c.count));
    let incident_causes: Vec<IncidentCause> = top
        .iter()
        .map(|(j, o)| IncidentCause {
            observation: j.observation,
            reports: j.reports,
            cause: j.cause,
            verdict: verdict_of(o, &evidence).1,
        })
        .collect();
    let (primary, outcome) = match top.into_iter().next() {
        Some((j, o)) => (Some(j.observation), o),
        None => {
            let p = facts::fallback(&evidence);
            let i = p.and_then(|p| {
                evidence
                    .observations
                    .iter()
                    .position(|o| std::ptr::eq(o, p))
            });
            (i, evaluate(rules, facts_of(p), check))
        }
    };
    let (cause, verdict) = verdict_of(&outcome, &evidence);
    let with_gc = outcome.facts.values.get("fraction_set") == Some(&crate::rules::Fact::Bool(true))
        || ctx
            .current
            .as_ref()
            .is_some_and(|c| c.per_process_memory_fraction.is_some());
    let space = Space::for_setup(&setup, with_gc);
    let recommendation = if cause.rules_out_settings() || no_setting_can_help(&outcome.facts) {
        None
    } else {
        let with: Vec<_> = outcome.fired.iter().map(|(r, s)| (*r, s)).collect();
        combine::combine(&with, ctx.current.as_ref(), &space)
    };
    let fills = fills::fills(
        &evidence,
        primary.and_then(|i| evidence.observations.get(i)),
        &outcome.facts,
        cause == Cause::Capacity,
    );
    Diagnosis {
        fills,
        evidence,
        primary,
        cause,
        verdict,
        findings: outcome.findings,
        recommendation,
        not_evaluated: outcome.not_evaluated,
        failed: outcome.failed,
        current_conf: ctx.current_source.clone(),
        facts: outcome.facts,
        setup,
        incidents: incident_causes,
        incident_count,
        other_incidents: by_cause,
        withheld: outcome.withheld,
    }
}

/// What the replay check decided for a fired rule.
enum Checked {
    /// Shown: it needs no check (it reads no trace, or suggests nothing), or
    /// the replay supports its settings.
    Shown(Option<ReplayCheck>),
    /// Not shown: the replay that did not support them, or why none ran.
    Withheld(Option<ReplayCheck>, Option<String>),
}

fn checked(
    rule: &Rule,
    settings: &BTreeMap<String, String>,
    facts: &Facts,
    check: Option<&mut Checker>,
) -> Checked {
    if settings.is_empty() || !crate::rules::catalog::reads_trace(&rule.when) {
        return Checked::Shown(None);
    }
    let Some(check) = check else {
        return Checked::Withheld(None, Some("no replay was run".into()));
    };
    match check(facts, settings) {
        Ok(c) if c.supported => Checked::Shown(Some(c)),
        Ok(c) => Checked::Withheld(Some(c), None),
        Err(why) => Checked::Withheld(None, Some(why)),
    }
}

/// Holds whatever rules a `--rules` directory adds: no allocator setting is
/// ever recommended for a failure outside the allocator or for a request
/// larger than the whole card.
fn no_setting_can_help(facts: &Facts) -> bool {
    use crate::rules::Fact;
    let num = |n: &str| match facts.values.get(n) {
        Some(Fact::Num(v)) => Some(*v),
        _ => None,
    };
    let outside = facts.values.get("non_allocator_oom") == Some(&Fact::Bool(true));
    let too_large = matches!((num("requested"), num("capacity")), (Some(r), Some(c)) if r > c);
    outside || too_large
}
