//! Safe KV eviction for `foxc.KVCache`: the program's own pruning rule under a horizon of
//! later queries (`foxc_ir::evict`, docs/RULES.md "Eviction"), on the program's own decay
//! cumsum (the interpreter's), never a formula re-derived in Python.

use crate::errors::value_error;
use crate::program::Program;
use crate::starts::{partial_inputs, pruned, tiles_of, Pruned};
use crate::tensors::Wire;
use foxc_driver::Target;
use foxc_ir::evict::{first_kept_block, threshold, Horizon};
use foxc_ir::{interp, Dim, Graph, NormBound, Op, ValueId};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::collections::BTreeMap;

/// Why an unpruned program has no eviction (the tail of the error).
const NOTHING_TO_EVICT: &str = ": nothing can be evicted";

/// What a cache needs to know of a program, as a dict: `bn` (the key block), `key_dim` and
/// `query_dim` (the symbolic dims of the key and query axes), `decay_params` (the parameters
/// the decay cumsum reads), `q` and `k` (the parameters the
/// score reads as its q and k, or None where it transforms them first) and `static_norms`
/// (`(q_max, k_max)` when the program bounds the norms itself, QK-norm; else None).
#[pyfunction]
fn eviction_info(py: Python<'_>, program: &Program) -> PyResult<Py<pyo3::types::PyDict>> {
    let g = program.inner.optimized(Target::Cpu)?;
    let Pruned { a, ops, c, delta } = pruned(&g, NOTHING_TO_EVICT)?;
    let Op::Threshold { bound, rule, .. } = g.op(delta) else {
        unreachable!("pruned() checks the threshold")
    };
    // Refused when the cache is made, not at its first eviction.
    foxc_ir::evict::refuses_given(&rule.formula).map_err(value_error)?;
    let (_, bn) = tiles_of(&a)?;
    let seq_dim = |v: ValueId| -> Option<String> {
        let dims: Vec<&Dim> = g.ty(v).dims().collect();
        match dims.len().checked_sub(2).map(|i| dims[i]) {
            Some(Dim::Sym(s)) => Some(s.clone()),
            _ => None,
        }
    };
    let param = |v: ValueId| match g.op(v) {
        Op::Param { .. } => g.params.iter().find(|p| p.node == v).map(|p| p.name.clone()),
        _ => None,
    };
    let d = pyo3::types::PyDict::new(py);
    d.set_item("bn", bn)?;
    d.set_item("key_dim", seq_dim(ops.k))?;
    d.set_item("query_dim", seq_dim(ops.q))?;
    d.set_item("decay_params", reads(&g, c))?;
    d.set_item("q", param(ops.q))?;
    d.set_item("k", param(ops.k))?;
    d.set_item(
        "static_norms",
        match *bound {
            NormBound::Static { q_max, k_max } => Some((q_max, k_max)),
            NormBound::Data => None,
        },
    )?;
    Ok(d.unbind())
}

/// The parameters value `v` reads, in declaration order (the cached gates the decay cumsum of
/// the kept window is computed from).
fn reads(g: &Graph, v: ValueId) -> Vec<String> {
    let mut seen = vec![v];
    let mut todo = vec![v];
    while let Some(n) = todo.pop() {
        for o in g.operands(n) {
            if !seen.contains(&o) {
                seen.push(o);
                todo.push(o);
            }
        }
    }
    g.params.iter().filter(|p| seen.contains(&p.node)).map(|p| p.name.clone()).collect()
}

/// The first key block each head must keep, `(shape [..c's leading dims], i32 bytes, delta)`:
/// the blocks before it are below the pruning threshold for every later query within the
/// horizon (`max_keys` keys per row, `|q| <= q_norm`, `|k| <= k_norm`). `inputs` are the
/// parameters the decay cumsum reads (the cached gates), `dims` the sizes of the symbolic dims
/// (the scale may read the head dim).
#[pyfunction]
fn first_kept_blocks<'py>(
    py: Python<'py>,
    program: &Program,
    inputs: BTreeMap<String, Wire>,
    dims: BTreeMap<String, u64>,
    max_keys: usize,
    q_norm: f64,
    k_norm: f64,
) -> PyResult<(Vec<usize>, Bound<'py, PyBytes>, f64)> {
    let g = program.inner.optimized(Target::Cpu)?;
    let Pruned { a, c, delta, .. } = pruned(&g, NOTHING_TO_EVICT)?;
    let Op::Threshold { rule, log_eps, score, scale, .. } = g.op(delta).clone() else {
        unreachable!("pruned() checks the threshold")
    };
    let (_, bn) = tiles_of(&a)?;
    let scale = scale.value(&|s| dims.get(s).copied()).ok_or_else(|| {
        value_error(format!("the scale reads a dim that `dims` does not bind (given {:?})", dims.keys()))
    })?;
    let horizon = Horizon { max_keys, q_norm, k_norm };
    let delta = threshold(&rule.formula, &score, log_eps, scale, &horizon).map_err(value_error)?;
    let inputs = partial_inputs(&g, inputs)?;
    let vals = py
        .detach(|| interp::eval(&g, &inputs, &[c]))
        .map_err(|e| value_error(format!("computing the gate cumsum: {e}")))?;
    let c = &vals[&c];
    let (lead, l) = match c.shape.split_last() {
        Some((&l, lead)) if l > 0 => (lead.to_vec(), l),
        _ => return Err(value_error(format!("the gate cumsum has shape {:?}: no cached key", c.shape))),
    };
    let kept: Vec<u8> = c
        .data
        .chunks_exact(l)
        .flat_map(|row| (first_kept_block(row, delta, bn) as i32).to_le_bytes())
        .collect();
    Ok((lead, PyBytes::new(py, &kept), delta))
}

/// Add the functions to the extension module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(eviction_info, m)?)?;
    m.add_function(wrap_pyfunction!(first_kept_blocks, m)?)?;
    Ok(())
}
