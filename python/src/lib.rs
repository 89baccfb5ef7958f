//! `allocdoc._native`: the Python extension. Each function runs one command of
//! the library with `--format json` and hands back the JSON text, the notes
//! meant for standard error and the exit code; `allocdoc/_api.py` turns them
//! into a dict, log records and exceptions. `cli` is the whole `allocdoc`
//! command, compiled from the binary's own source. The GIL is released while
//! the library works.

use allocdoc::app::{self, Buffers, Format, Outcome};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt};
use std::ffi::OsString;

// The binary's source, so the wheel's command is the same code; its `main` is
// the binary's entry and unused here.
#[allow(dead_code)]
#[path = "../../src/main.rs"]
mod cli;

create_exception!(allocdoc, Error, PyException, "An allocdoc error.");
create_exception!(
    allocdoc,
    InputError,
    Error,
    "An unreadable or invalid input (the command's exit code 2)."
);
create_exception!(
    allocdoc,
    UsageError,
    Error,
    "A bad option value (the command's exit code 2)."
);
create_exception!(
    allocdoc,
    NoDeviceError,
    Error,
    "No usable CUDA driver or GPU for --device cuda (the command's exit code 3)."
);

fn py_err(e: allocdoc::Error) -> PyErr {
    match e {
        allocdoc::Error::Input(m) => InputError::new_err(m),
        allocdoc::Error::Usage(m) => UsageError::new_err(keywords(&m)),
        allocdoc::Error::NoDevice(m) => NoDeviceError::new_err(m),
    }
}

/// The command line's flags and the keyword arguments that stand for them here.
const KEYWORDS: [(&str, &str); 10] = [
    ("--torch-version", "torch_version"),
    ("--capacity", "capacity"),
    ("--current", "current"),
    ("--platform", "platform"),
    ("--device", "device"),
    ("--sizes", "sizes"),
    ("--step", "step"),
    ("--knob", "knob"),
    ("--conf", "conf"),
    ("--at", "at"),
];

/// A usage error's message with each flag named as the keyword argument a
/// Python caller passed (`--torch-version two` is `torch_version two`).
fn keywords(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    'scan: while let Some(at) = rest.find("--") {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        for (flag, keyword) in KEYWORDS {
            let whole = tail.strip_prefix(flag).is_some_and(|after| {
                !after.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            });
            if whole {
                out.push_str(keyword);
                rest = &tail[flag.len()..];
                continue 'scan;
            }
        }
        out.push_str("--");
        rest = &tail[2..];
    }
    out.push_str(rest);
    out
}

/// What a command produced: JSON on standard output, notes, exit code.
type Produced = (String, Vec<String>, i32);

/// Runs a command with the GIL released.
fn run(
    py: Python<'_>,
    command: impl FnOnce() -> Result<Outcome, allocdoc::Error> + Send,
) -> PyResult<Produced> {
    py.detach(command)
        .map(|o| (o.stdout, o.stderr, o.exit_code))
        .map_err(py_err)
}

/// One input from Python: its name, and its content when it is not a file.
type Source = (String, Option<Vec<u8>>);

/// The input names, with the in-memory contents under their names.
fn sources(list: Vec<Source>) -> (Vec<String>, Buffers) {
    let mut buffers = Buffers::default();
    let names = list
        .into_iter()
        .map(|(name, data)| {
            if let Some(data) = data {
                buffers.add(name.clone(), data);
            }
            name
        })
        .collect();
    (names, buffers)
}

fn source(one: Source) -> (String, Buffers) {
    let (mut names, buffers) = sources(vec![one]);
    (names.pop().unwrap_or_default(), buffers)
}

/// A device size as Python gives it (bytes as an int, or text as the command
/// takes it), refused as `--capacity` refuses it: 0, over 1 PiB, negative,
/// not a size.
fn size(s: Option<&Bound<'_, PyAny>>) -> PyResult<Option<u64>> {
    let Some(s) = s else { return Ok(None) };
    let text = if let Ok(t) = s.extract::<String>() {
        t
    } else if s.is_instance_of::<PyInt>() && !s.is_instance_of::<PyBool>() {
        s.str()?.to_string()
    } else {
        return Err(UsageError::new_err(format!(
            "capacity: expected bytes as an int or a size as a str (\"24GiB\"), not {}",
            s.get_type().name()?
        )));
    };
    allocdoc::units::parse_device_size(&text)
        .map(Some)
        .map_err(|e| UsageError::new_err(format!("capacity: {e}")))
}

/// A platform as `--platform` takes it (`linux`, `windows`, `rocm`).
fn platform(p: Option<String>) -> PyResult<Option<allocdoc::conf::Platform>> {
    p.map(|p| {
        clap::ValueEnum::from_str(&p, true)
            .map_err(|e| UsageError::new_err(format!("platform {p:?}: {e}")))
    })
    .transpose()
}

#[pyfunction]
fn parse(py: Python<'_>, inputs: Vec<Source>) -> PyResult<Produced> {
    let (inputs, buffers) = sources(inputs);
    let opts = app::parse::ParseOptions {
        inputs,
        common: app::Common {
            buffers,
            format: Format::Json,
            ..Default::default()
        },
        ..Default::default()
    };
    run(py, || app::parse::run(&opts))
}

#[pyfunction]
#[pyo3(signature = (inputs, torch_version=None, platform=None, conf=None))]
fn diagnose(
    py: Python<'_>,
    inputs: Vec<Source>,
    torch_version: Option<String>,
    platform: Option<String>,
    conf: Option<String>,
) -> PyResult<Produced> {
    let (inputs, buffers) = sources(inputs);
    let opts = app::diagnose::DiagnoseOptions {
        inputs,
        torch_version,
        platform: self::platform(platform)?,
        conf,
        common: app::Common {
            buffers,
            format: Format::Json,
            ..Default::default()
        },
        ..Default::default()
    };
    run(py, || app::diagnose::run(&opts))
}

#[pyfunction]
#[pyo3(signature = (trace, confs, capacity=None, fidelity=false, torch_version=None))]
fn replay(
    py: Python<'_>,
    trace: Source,
    confs: Vec<String>,
    capacity: Option<Bound<'_, PyAny>>,
    fidelity: bool,
    torch_version: Option<String>,
) -> PyResult<Produced> {
    let (trace, buffers) = source(trace);
    let opts = app::replay::ReplayOptions {
        trace,
        confs,
        capacity: size(capacity.as_ref())?,
        device: "sim".into(),
        fidelity,
        torch_version,
        common: app::Common {
            buffers,
            format: Format::Json,
            ..Default::default()
        },
        ..Default::default()
    };
    run(py, || app::replay::run(&opts))
}

#[pyfunction]
#[pyo3(signature = (input, capacity=None, current=None, torch_version=None, platform=None))]
fn recommend(
    py: Python<'_>,
    input: Source,
    capacity: Option<Bound<'_, PyAny>>,
    current: Option<String>,
    torch_version: Option<String>,
    platform: Option<String>,
) -> PyResult<Produced> {
    let (input, buffers) = source(input);
    let opts = app::recommend::RecommendOptions {
        input,
        capacity: size(capacity.as_ref())?,
        current,
        torch_version,
        platform: self::platform(platform)?,
        common: app::Common {
            buffers,
            format: Format::Json,
            ..Default::default()
        },
        ..Default::default()
    };
    run(py, || app::recommend::run(&opts))
}

#[pyfunction]
#[pyo3(signature = (input, conf, current=None, capacity=None, device="sim".to_owned(), torch_version=None, platform=None))]
#[allow(clippy::too_many_arguments)]
fn validate(
    py: Python<'_>,
    input: Source,
    conf: String,
    current: Option<String>,
    capacity: Option<Bound<'_, PyAny>>,
    device: String,
    torch_version: Option<String>,
    platform: Option<String>,
) -> PyResult<Produced> {
    let (input, buffers) = source(input);
    let opts = app::validate::ValidateOptions {
        input,
        conf,
        current,
        torch_version,
        platform: self::platform(platform)?,
        capacity: size(capacity.as_ref())?,
        device,
        common: app::Common {
            buffers,
            format: Format::Json,
            ..Default::default()
        },
        ..Default::default()
    };
    run(py, || app::validate::run(&opts))
}

/// A grouping as `--by` takes it (`site`, `user`, `stack`, `category`, `size`, `segment`).
fn grouping(by: &str) -> PyResult<allocdoc::evidence::fills::Grouping> {
    clap::ValueEnum::from_str(by, true).map_err(|e| UsageError::new_err(format!("by {by:?}: {e}")))
}

#[pyfunction]
#[pyo3(signature = (inputs, at=None, by="site".to_owned(), n=20, device=None))]
fn top(
    py: Python<'_>,
    inputs: Vec<Source>,
    at: Option<String>,
    by: String,
    n: usize,
    device: Option<u32>,
) -> PyResult<Produced> {
    let (inputs, buffers) = sources(inputs);
    let opts = app::top::TopOptions {
        inputs,
        at,
        by: grouping(&by)?,
        top: n,
        device,
        common: app::Common {
            buffers,
            format: Format::Json,
            ..Default::default()
        },
        ..Default::default()
    };
    run(py, || app::top::run(&opts))
}

#[pyfunction]
#[pyo3(signature = (before, after, at=None, by="site".to_owned(), n=20, device=None))]
fn diff(
    py: Python<'_>,
    before: Source,
    after: Source,
    at: Option<String>,
    by: String,
    n: usize,
    device: Option<u32>,
) -> PyResult<Produced> {
    let (mut names, buffers) = sources(vec![before, after]);
    let after = names.pop().unwrap_or_default();
    let before = names.pop().unwrap_or_default();
    let opts = app::diff::DiffOptions {
        before,
        after,
        at,
        by: grouping(&by)?,
        top: n,
        device,
        common: app::Common {
            buffers,
            format: Format::Json,
            ..Default::default()
        },
    };
    run(py, || app::diff::run(&opts))
}

#[pyfunction]
#[pyo3(signature = (inputs, sizes, at=Vec::new(), confs=Vec::new(), capacity=None, step=1, knob="size".to_owned(), points=None, knobs=None, at_points=None, along=None))]
#[allow(clippy::too_many_arguments)]
fn fit(
    py: Python<'_>,
    inputs: Vec<Source>,
    sizes: Vec<i64>,
    at: Vec<i64>,
    confs: Vec<String>,
    capacity: Option<Bound<'_, PyAny>>,
    step: u64,
    knob: String,
    points: Option<String>,
    knobs: Option<String>,
    at_points: Option<String>,
    along: Option<String>,
) -> PyResult<Produced> {
    let (inputs, buffers) = sources(inputs);
    // As text, so that 0 and negative sizes get the command's own refusal.
    let text = |v: Vec<i64>| v.iter().map(i64::to_string).collect();
    let opts = app::fit::FitOptions {
        recordings: app::fit::Recordings {
            inputs,
            sizes: text(sizes),
            points,
            knobs,
        },
        at: text(at),
        confs,
        capacity: size(capacity.as_ref())?,
        step,
        knob,
        at_points,
        along,
        common: app::Common {
            buffers,
            format: Format::Json,
            ..Default::default()
        },
        ..Default::default()
    };
    run(py, || app::fit::run(&opts))
}

#[pyfunction]
#[pyo3(signature = (inputs, sizes, run=None, lengths=None, batch=None, steps=None, seed=0, pad_to=1, confs=Vec::new(), capacity=None, cap_step=None, knob="size".to_owned(), points=None, knobs=None))]
#[allow(clippy::too_many_arguments)]
fn forecast(
    py: Python<'_>,
    inputs: Vec<Source>,
    sizes: Vec<i64>,
    run: Option<Source>,
    lengths: Option<Source>,
    batch: Option<String>,
    steps: Option<u64>,
    seed: u64,
    pad_to: u64,
    confs: Vec<String>,
    capacity: Option<Bound<'_, PyAny>>,
    cap_step: Option<u64>,
    knob: String,
    points: Option<String>,
    knobs: Option<String>,
) -> PyResult<Produced> {
    let (inputs, mut buffers) = sources(inputs);
    // The run and the lengths: files, or contents held here by name.
    let mut held = |s: Option<Source>| {
        s.map(|(name, data)| {
            if let Some(data) = data {
                buffers.add(name.clone(), data);
            }
            name
        })
    };
    // `run` names the run here; the helper that runs a command is `crate::run`.
    let (steps_file, lengths_file) = (held(run), held(lengths));
    let opts = app::forecast::ForecastOptions {
        recordings: app::fit::Recordings {
            inputs,
            sizes: sizes.iter().map(i64::to_string).collect(),
            points,
            knobs,
        },
        run: steps_file,
        lengths: lengths_file,
        batch,
        steps,
        seed,
        pad_to,
        confs,
        capacity: size(capacity.as_ref())?,
        cap_step,
        knob,
        common: app::Common {
            buffers,
            format: Format::Json,
            ..Default::default()
        },
        ..Default::default()
    };
    crate::run(py, || app::forecast::run(&opts))
}

/// The `allocdoc` command: `argv` as `sys.argv` (the program first); prints
/// as the binary does and returns the exit code.
#[pyfunction]
fn command(py: Python<'_>, argv: Vec<OsString>) -> u8 {
    py.detach(|| cli::cli(argv))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    for (name, kind, ty) in [
        ("InputError", "input", py.get_type::<InputError>()),
        ("UsageError", "usage", py.get_type::<UsageError>()),
        ("NoDeviceError", "no_device", py.get_type::<NoDeviceError>()),
    ] {
        // `kind` is what `--each` writes in its error documents.
        ty.setattr("kind", kind)?;
        m.add(name, ty)?;
    }
    m.add("Error", py.get_type::<Error>())?;
    m.add("SCHEMA_VERSION", allocdoc::report::common::SCHEMA_VERSION)?;
    m.add_function(wrap_pyfunction!(parse, m)?)?;
    m.add_function(wrap_pyfunction!(diagnose, m)?)?;
    m.add_function(wrap_pyfunction!(replay, m)?)?;
    m.add_function(wrap_pyfunction!(recommend, m)?)?;
    m.add_function(wrap_pyfunction!(validate, m)?)?;
    m.add_function(wrap_pyfunction!(top, m)?)?;
    m.add_function(wrap_pyfunction!(diff, m)?)?;
    m.add_function(wrap_pyfunction!(fit, m)?)?;
    m.add_function(wrap_pyfunction!(forecast, m)?)?;
    m.add_function(wrap_pyfunction!(command, m)?)?;
    Ok(())
}
