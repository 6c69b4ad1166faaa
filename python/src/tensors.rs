//! Host tensors from Python: `{name: (dtype, shape, bytes)}`, converted to the dtype each
//! parameter declares (float32, bfloat16 or float16 arrays are accepted for any float parameter, int32
//! for an i32 one, int64 for an i64 one).

use crate::errors::value_error;
use foxc_ir::{DType, Graph};
use foxc_runtime::{HostTensor, TensorMap};
use pyo3::prelude::*;
use std::collections::BTreeMap;

/// One tensor as the Python side sends it.
pub type Wire = (String, Vec<usize>, Vec<u8>);

fn dtype_of(name: &str, tensor: &str) -> PyResult<DType> {
    match name {
        "f32" => Ok(DType::F32),
        "bf16" => Ok(DType::BF16),
        "f16" => Ok(DType::F16),
        "i32" => Ok(DType::I32),
        "i64" => Ok(DType::I64),
        other => Err(value_error(format!(
            "input `{tensor}` has dtype {other}: foxc takes float32, bfloat16 or float16 arrays (int32 or int64 for i32 or i64 parameters)"
        ))),
    }
}

/// Names first (missing and unexpected tensors), then each tensor's byte count, then the
/// conversion to the declared dtype. Shapes and values are checked by the runtime's validation.
pub fn host_inputs(g: &Graph, inputs: BTreeMap<String, Wire>) -> PyResult<TensorMap> {
    let expected: Vec<&str> = g.params.iter().map(|p| p.name.as_str()).collect();
    let missing: Vec<&str> = expected.iter().copied().filter(|n| !inputs.contains_key(*n)).collect();
    if !missing.is_empty() {
        return Err(value_error(format!(
            "missing input tensor(s) {}: `{}` takes {}",
            missing.join(", "),
            g.name,
            expected.join(", ")
        )));
    }
    if let Some(extra) = inputs.keys().find(|k| g.param(k).is_none()) {
        return Err(value_error(format!(
            "unexpected input tensor `{extra}`: `{}` takes {}",
            g.name,
            expected.join(", ")
        )));
    }
    let mut out = TensorMap::new();
    for (name, (dtype, shape, bytes)) in inputs {
        let given = dtype_of(&dtype, &name)?;
        let numel: usize = shape.iter().product();
        if bytes.len() != numel * given.size_bytes() {
            return Err(value_error(format!(
                "input `{name}`: {} bytes for shape {shape:?} of {dtype}",
                bytes.len()
            )));
        }
        let declared = g.param(&name).map(|p| p.stored()).unwrap_or(given);
        let t = HostTensor { dtype: given, shape, data: bytes };
        // Floats convert between float dtypes; integers are never converted to or from floats.
        let t = if declared == given {
            t
        } else if declared.is_float() && given.is_float() {
            HostTensor::from_f32_as(declared, &t.shape, &t.to_f32_vec())
        } else {
            return Err(value_error(format!(
                "input `{name}` is declared {} but foxc got a {} array (int32 for i32 parameters, int64 for i64 ones, float32, bfloat16 or float16 for float ones)",
                declared.name(),
                given.name()
            )));
        };
        out.insert(name, t);
    }
    Ok(out)
}

/// Little-endian bytes of f32 values.
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn f64_bytes(v: &[f64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
