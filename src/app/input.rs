//! What `recommend` and `validate` share before they replay: the input read
//! once, its diagnosis (the same `diagnose::diagnose` that `diagnose` runs, so
//! the three commands start from one cause and one setup), the config in use
//! at the setup's PyTorch version, and the workload to replay.

use super::diagnose::{context, diagnose, read_one};
use crate::Error;
use crate::advise::{Diagnosis, Setup};
use crate::conf::{Platform, Settings};
use crate::ingest::InputKind;
use crate::trial::workload::{Loaded, Workload};

/// An input ready for the replays.
pub struct Prepared {
    /// The diagnosis of the evidence; `None` for a trace CSV or an RMM log,
    /// which hold none.
    pub diagnosis: Option<Diagnosis>,
    pub setup: Setup,
    /// The workload, or why there is nothing to replay.
    pub loaded: Loaded,
    /// The config in use (as given, '' = PyTorch's defaults) and its settings
    /// at the setup's version, as they take effect on its platform.
    pub current_conf: String,
    pub current: Settings,
    /// Notes for standard error (the current config a snapshot recorded, …).
    pub notes: Vec<String>,
}

/// Reads `input`, diagnoses it and loads its workload.
pub fn prepare(
    input: &str,
    (torch_version, platform): (Option<&str>, Option<Platform>),
    current: Option<&str>,
    (capacity, limits): (Option<u64>, &crate::limits::Limits),
    buffers: &super::Buffers,
) -> Result<Prepared, Error> {
    let name = if input.is_empty() { "-" } else { input };
    let mut ctx = context(torch_version, platform)?;
    if let Some(c) = current {
        ctx.set_current(c, "--current")
            .map_err(|why| Error::Usage(format!("--current {c:?}: {why}")))?;
    }
    let (data, evidence) = read_one(name, buffers, limits, &mut ctx)?;
    let diagnosis = match crate::ingest::detect(&data) {
        InputKind::TraceCsv | InputKind::RmmLog => None,
        InputKind::Pickle | InputKind::Text => {
            let rules = crate::rules::RuleSet::with_dir(None)?;
            Some(diagnose(evidence, &ctx, &rules, (buffers, limits)))
        }
    };
    let setup = match &diagnosis {
        Some(d) => d.setup.clone(),
        None => Setup::resolve(&crate::evidence::Evidence::default(), &ctx),
    };
    let version = setup.replay_version();
    let current_conf = current.unwrap_or_default().to_string();
    let settings = conf_at("--current", &current_conf, &setup)?;
    let loaded = Workload::from_bytes(
        crate::ingest::input_name(name),
        data,
        capacity,
        &settings,
        (diagnosis.as_ref(), limits),
    )?;
    let mut notes = Vec::new();
    let (current_conf, mut current) = match &loaded {
        Loaded::Ready(w) => {
            let (conf, s, note) = w.current(current, settings);
            notes.extend(note.map(|n| format!("note: {n}")));
            (conf, s)
        }
        Loaded::Nothing(_) => (current_conf, settings),
    };
    current.version = version;
    Ok(Prepared {
        diagnosis,
        setup,
        loaded,
        current_conf,
        current,
        notes,
    })
}

/// A config the user gave (`flag`), parsed for the setup's version, as it
/// takes effect on the setup's platform (a value PyTorch rejects there is a
/// usage error naming PyTorch's own message).
pub fn conf_at(flag: &str, value: &str, setup: &Setup) -> Result<Settings, Error> {
    let version = setup.replay_version();
    let parsed = crate::conf::parse(value, version).map_err(|e| {
        Error::Usage(format!(
            "{flag} {value:?}: PyTorch {version} rejects it: {e} (`allocdoc conf check` explains)"
        ))
    })?;
    Ok(setup.platform.value.effective(&parsed.settings))
}

/// What PyTorch ignores of `value` on the setup's platform, as notes.
pub fn ignored_notes(flag: &str, value: &str, setup: &Setup) -> Vec<String> {
    crate::conf::parse(value, setup.replay_version())
        .map(|p| {
            setup
                .platform
                .value
                .ignored(&p.settings)
                .into_iter()
                .map(|w| format!("note: {flag} {value:?}: {}", w.text))
                .collect()
        })
        .unwrap_or_default()
}
