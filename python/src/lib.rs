//! `allocdoc._native`: the Python extension. Each function runs one command of
//! the library with `--format json` and hands back the JSON text, the notes
//! meant for standard error and the exit code; `allocdoc/_api.py` turns them
//! into a dict, log records and exceptions. The GIL is released while the
//! library works.

use allocdoc::app::{self, Format, Outcome};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(allocdoc, Error, PyException, "An allocdoc error.");
create_exception!(
    allocdoc,
    InputError,
    Error,
    "An unreadable or invalid input (exit code 2)."
);
create_exception!(
    allocdoc,
    UsageError,
    Error,
    "A bad option value (exit code 2)."
);
create_exception!(
    allocdoc,
    NoDeviceError,
    Error,
    "No usable CUDA driver or GPU (exit code 3)."
);

fn py_err(e: allocdoc::Error) -> PyErr {
    match e {
        allocdoc::Error::Input(m) => InputError::new_err(m),
        allocdoc::Error::Usage(m) => UsageError::new_err(m),
        allocdoc::Error::NoDevice(m) => NoDeviceError::new_err(m),
    }
}

/// What a command produced: JSON on standard output, notes, exit code.
type Produced = (String, Vec<String>, i32);

fn produced(r: Result<Outcome, allocdoc::Error>) -> PyResult<Produced> {
    r.map(|o| (o.stdout, o.stderr, o.exit_code)).map_err(py_err)
}

#[pyfunction]
fn parse(py: Python<'_>, inputs: Vec<String>) -> PyResult<Produced> {
    let opts = app::parse::ParseOptions {
        inputs,
        format: Format::Json,
    };
    produced(py.detach(|| app::parse::run(&opts)))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("Error", m.py().get_type::<Error>())?;
    m.add("InputError", m.py().get_type::<InputError>())?;
    m.add("UsageError", m.py().get_type::<UsageError>())?;
    m.add("NoDeviceError", m.py().get_type::<NoDeviceError>())?;
    m.add_function(wrap_pyfunction!(parse, m)?)?;
    Ok(())
}
