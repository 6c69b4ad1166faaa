//! foxc errors as Python exceptions: a program foxc cannot compile is a `CompileError` (a
//! `ValueError`) carrying the rendered diagnostic; other user errors are `ValueError`; foxc's own
//! failures are `RuntimeError`.

use foxc_driver::{Error, ErrorKind};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::PyErr;

pyo3::create_exception!(
    foxc,
    CompileError,
    PyValueError,
    "A program foxc cannot compile; the message is foxc's diagnostic (file:line:col, a caret, a hint)."
);

/// A front-end failure (parse, type check, lowering).
pub fn compile_error(e: Error) -> PyErr {
    match e.kind {
        ErrorKind::User => CompileError::new_err(e.message),
        ErrorKind::Internal => PyRuntimeError::new_err(e.message),
    }
}

/// Any other facade error.
pub fn to_py(e: Error) -> PyErr {
    match e.kind {
        ErrorKind::User => PyValueError::new_err(strip_prefix(&e.message)),
        ErrorKind::Internal => PyRuntimeError::new_err(e.message),
    }
}

pub fn value_error(msg: impl Into<String>) -> PyErr {
    PyValueError::new_err(msg.into())
}

/// The CLI's messages start with `error: `; a Python exception already says it is one.
fn strip_prefix(m: &str) -> String {
    m.strip_prefix("error: ").unwrap_or(m).to_string()
}
