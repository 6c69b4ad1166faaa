//! Getting the input tensors of a run (from a file or the standard workload generator) and
//! moving tensors between the runtime's host form and the interpreter's f64 form.

use crate::Error;
use foxc_ir::interp::Tensor;
use foxc_ir::shapes::DimBindings;
use foxc_ir::Graph;
use foxc_runtime::{HostTensor, TensorMap};
use std::collections::BTreeMap;
use std::path::Path;

/// Generate the standard workload for `g` at the given dims.
pub fn generate(g: &Graph, dims: &BTreeMap<String, u64>, seed: u64) -> Result<TensorMap, Error> {
    let missing: Vec<&str> = g.dims.iter().filter(|d| !dims.contains_key(*d)).map(String::as_str).collect();
    if !missing.is_empty() {
        return Err(Error::user(format!(
            "error: --shape does not give {} (the program's dims are {})",
            missing.join(", "),
            g.dims.join(", ")
        )));
    }
    let unknown: Vec<&str> = dims.keys().filter(|d| !g.dims.contains(d)).map(String::as_str).collect();
    if !unknown.is_empty() {
        return Err(Error::user(format!(
            "error: --shape names {} which the program does not use (its dims are {})",
            unknown.join(", "),
            g.dims.join(", ")
        )));
    }
    crate::workload::standard_inputs(g, &DimBindings(dims.clone()), seed)
        .map_err(|e| Error::user(format!("error: {e}")))
}

pub fn read(path: &Path) -> Result<TensorMap, Error> {
    foxc_runtime::io::read_safetensors(path).map_err(|e| Error::user(format!("error: {e}")))
}

pub fn write(path: &Path, tensors: &TensorMap) -> Result<(), Error> {
    foxc_runtime::io::write_safetensors(path, tensors).map_err(|e| Error::user(format!("error: {e}")))
}

/// Check the inputs against the program's parameters before any work.
pub fn validate(g: &Graph, inputs: &TensorMap) -> Result<DimBindings, Error> {
    crate::validate::check_inputs(g, inputs).map_err(|e| Error::user(format!("error: {e}")))
}

pub fn to_interp(inputs: &TensorMap) -> BTreeMap<String, Tensor> {
    inputs.iter().map(|(k, t)| (k.clone(), Tensor { shape: t.shape.clone(), data: t.to_f64_vec() })).collect()
}

/// An interpreter result as a host tensor of `dtype`.
pub fn from_interp(t: &Tensor, dtype: foxc_ir::DType) -> HostTensor {
    let v: Vec<f32> = t.data.iter().map(|&x| x as f32).collect();
    HostTensor::from_f32_as(dtype, &t.shape, &v)
}

/// Sum and sum of absolute values: a short fingerprint of an output.
pub fn checksum(t: &HostTensor) -> (f64, f64) {
    t.to_f32_vec().iter().fold((0.0, 0.0), |(s, a), &x| (s + x as f64, a + (x as f64).abs()))
}
