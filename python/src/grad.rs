//! Gradients on the CPU: the forward with its row log-sum-exp (what torch autograd saves), the
//! saved-forward gradient program (`passes::grad::gradient_from_saved`: the backward of a torch
//! forward) and the recomputing one (`passes::grad::gradient`: NumPy's `attn.grad`), run by the
//! CPU backend or, as the reference, by the f64 interpreter on the same program.

use crate::errors::{to_py, value_error};
use crate::program::{Loaded, Specialization};
use crate::tensors::{host_inputs, Wire};
use foxc_driver::grad::{gradient_program, GradKind};
use foxc_driver::{BackendKind, RunOptions, Target};
use foxc_ir::interp::{self, Tensor};
use foxc_ir::{Attention, Graph, Op, Value};
use foxc_passes::grad::{GradError, GradProgram};
use foxc_runtime::TensorMap;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The gradient program a call runs: the saved-forward one when torch autograd gives the
/// forward's results, else the recomputing one.
pub fn kind_of(saved: bool) -> GradKind {
    if saved {
        GradKind::Saved
    } else {
        GradKind::Recomputed
    }
}

pub fn grad_error(e: GradError) -> PyErr {
    match e {
        GradError::Unsupported(m) => value_error(format!("cannot differentiate this program: {m}")),
        GradError::Internal(m) => {
            PyRuntimeError::new_err(format!("internal error in the gradient pass: {m}"))
        }
    }
}

/// The gradient program of kind `kind` for `target` and `spec` (made once per load).
pub fn program(
    loaded: &Loaded,
    target: Target,
    kind: GradKind,
    spec: &Specialization,
) -> PyResult<Arc<GradProgram>> {
    let mut m = loaded.gradients.lock().unwrap_or_else(|e| e.into_inner());
    let key = (target, kind, spec.clone());
    if let Some(p) = m.get(&key) {
        return Ok(p.clone());
    }
    let g = loaded.optimized_for(target, spec)?;
    let p = Arc::new(gradient_program(&g, target, kind).map_err(grad_error)?);
    m.insert(key, p.clone());
    Ok(p)
}

/// The named `outputs` of `g` on the CPU backend (all cores, buffers not poisoned).
fn run_cpu(
    g: &Graph,
    outputs: &[(String, Value)],
    inputs: &TensorMap,
) -> Result<TensorMap, foxc_driver::Error> {
    let cpu = foxc_driver::backend(BackendKind::Cpu);
    Ok(cpu.run(g, outputs, inputs, RunOptions::default())?.outputs)
}

/// A forward graph and the named values a run computes.
pub type Forward = (Graph, Vec<(String, Value)>);

/// The forward of `target`: `out` and, when the output is a fused attention's, `lse`; with
/// `train`, `passes::grad::forward_for_saved` (adds the attention's unrounded `out_f32`, what
/// the saved-forward gradient program reads). Made once per (target, train, specialization).
pub fn forward(
    loaded: &Loaded,
    target: Target,
    train: bool,
    spec: &Specialization,
) -> PyResult<Arc<Forward>> {
    let mut m = loaded.forwards.lock().unwrap_or_else(|e| e.into_inner());
    let key = (target, train, spec.clone());
    if let Some(f) = m.get(&key) {
        return Ok(f.clone());
    }
    let g = loaded.optimized_for(target, spec)?;
    let f = if train {
        foxc_passes::grad::forward_for_saved(&g).map_err(grad_error)?
    } else {
        let out = g.output.ok_or_else(|| value_error(format!("`{}` has no output", g.name)))?;
        let mut outputs = vec![("out".to_string(), Value::of(out))];
        if matches!(g.op(out), Op::Attention(_)) {
            outputs.push(("lse".to_string(), Value { node: out, result: Attention::LSE }));
        }
        ((*g).clone(), outputs)
    };
    let f = Arc::new(f);
    m.insert(key, f.clone());
    Ok(f)
}

/// The CPU forward (see [`forward`]).
pub fn forward_cpu(
    py: Python<'_>,
    loaded: &Loaded,
    inputs: BTreeMap<String, Wire>,
    train: bool,
) -> PyResult<TensorMap> {
    let f = forward(loaded, Target::Cpu, train, &Specialization::default())?;
    let (g, outputs) = &*f;
    let inputs = host_inputs(g, inputs)?;
    py.detach(|| run_cpu(g, outputs, &inputs)).map_err(to_py)
}

/// Every output of the gradient program of kind `kind` on the CPU backend.
pub fn grad_cpu(
    py: Python<'_>,
    loaded: &Loaded,
    inputs: BTreeMap<String, Wire>,
    kind: GradKind,
) -> PyResult<TensorMap> {
    let p = program(loaded, Target::Cpu, kind, &Specialization::default())?;
    let inputs = host_inputs(&p.graph, inputs)?;
    py.detach(|| run_cpu(&p.graph, &p.outputs, &inputs)).map_err(to_py)
}

/// The same gradient program through the f64 interpreter (THE reference).
pub fn grad_reference(
    py: Python<'_>,
    loaded: &Loaded,
    inputs: BTreeMap<String, Wire>,
    kind: GradKind,
) -> PyResult<BTreeMap<String, Tensor>> {
    let p = program(loaded, Target::Cpu, kind, &Specialization::default())?;
    let inputs = host_inputs(&p.graph, inputs)?;
    foxc_driver::tensors::validate(&p.graph, &inputs).map_err(to_py)?;
    let x = foxc_driver::tensors::to_interp(&inputs);
    let values: Vec<Value> = p.outputs.iter().map(|(_, v)| *v).collect();
    let r = py
        .detach(|| interp::eval_values(&p.graph, &x, &values))
        .map_err(|e| value_error(format!("reference interpreter: {e}")))?;
    Ok(p.outputs.iter().map(|(n, v)| (n.clone(), r[v].clone())).collect())
}
