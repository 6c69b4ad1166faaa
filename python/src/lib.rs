//! `foxc._foxc`: the compiler and the runtime of foxc inside a Python process.
//!
//! This layer is thin on purpose: it turns Python values into the driver's types and back
//! (tensors travel as `(dtype, shape, bytes)` triples for the CPU and as raw device pointers for
//! the GPU) and maps errors to Python exceptions. The Python package (`python/foxc/`) validates
//! framework tensors and owns the user-facing API.

mod errors;
mod evict;
mod gpu;
mod grad;
mod program;
mod registry;
mod starts;
mod tensors;

use pyo3::prelude::*;

#[pymodule]
fn _foxc(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("CompileError", m.py().get_type::<errors::CompileError>())?;
    m.add_class::<program::Program>()?;
    m.add_class::<gpu::GpuPlan>()?;
    m.add_function(wrap_pyfunction!(program::load, m)?)?;
    m.add_function(wrap_pyfunction!(registry::cache_info, m)?)?;
    m.add_function(wrap_pyfunction!(registry::by_id, m)?)?;
    starts::register(m)?;
    evict::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // The defaults of `foxc.load`, defined once in the driver.
    m.add("DEFAULT_PRUNE_RULE", foxc_driver::DEFAULT_PRUNE_RULE)?;
    m.add("DEFAULT_LOG_EPS", foxc_driver::DEFAULT_LOG_EPS)?;
    Ok(())
}
