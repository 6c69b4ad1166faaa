//! The kept key tiles of a program, for planning work across devices (`foxc.distributed`).
//!
//! Context parallelism decides which key/value blocks a device must receive from the set ACP
//! keeps, so that set must be foxc's own: these functions hand Python the values the compiler's
//! graph computes (the CPU backend's block starts; the interpreter's `gate_cumsum`, `threshold`
//! and `block_boundary`), never a formula re-derived in Python. They read the program's graph
//! after the CPU passes; the GPU targets use the same tiles and the same boundary rule
//! (docs/SEMANTICS.md, `block_boundary`).

use crate::errors::{to_py, value_error};
use crate::program::Program;
use crate::tensors::{f64_bytes, host_inputs, Wire};
use foxc_driver::cpu_backend;
use foxc_driver::Target;
use foxc_ir::interp::{self, Tensor};
use foxc_ir::prune_rule::{self, ThresholdArgs, Whole};
use foxc_ir::{Attention, DType, Graph, Op, Value, ValueId};
use foxc_runtime::HostTensor;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::collections::BTreeMap;

/// `(shape, little-endian bytes)` of an f64 tensor, as the Python side reads it back.
type F64Out<'py> = (Vec<usize>, Bound<'py, PyBytes>);

/// `(shape [B, H, Mt], i32 little-endian bytes, (bm, bn))` of block starts.
type Starts<'py> = (Vec<usize>, Bound<'py, PyBytes>, (usize, usize));

/// The attention node of the CPU graph and its named operands.
fn attention(g: &Graph) -> PyResult<(ValueId, Attention, foxc_ir::AttnOperands)> {
    let n = foxc_driver::acp_stats::attention_node(g)
        .ok_or_else(|| value_error(format!("`{}` has no attention op", g.name)))?;
    let Op::Attention(a) = g.op(n) else { unreachable!("attention_node returns attention ops") };
    let ops = Attention::operands(g, n).map_err(|e| value_error(format!("attention operands: {e}")))?;
    Ok((n, a.clone(), ops))
}

/// `(bm, bn)` of the attention's tiles (set by the tiles pass on every attention).
pub(crate) fn tiles_of(a: &Attention) -> PyResult<(usize, usize)> {
    let t =
        a.tiles.ok_or_else(|| value_error("the attention op has no tiles (the tiles pass did not run)"))?;
    Ok((t.bm as usize, t.bn as usize))
}

/// A program's pruned attention and what its pruning reads: the gate cumsum `c` and the
/// threshold node (its op is `Op::Threshold`).
pub(crate) struct Pruned {
    pub a: Attention,
    pub ops: foxc_ir::AttnOperands,
    pub c: ValueId,
    pub delta: ValueId,
}

/// The pruned attention of `g`; a ValueError ending in `what` (what an unpruned program cannot
/// give) when it is not pruned.
pub(crate) fn pruned(g: &Graph, what: &str) -> PyResult<Pruned> {
    let (_, a, ops) = attention(g)?;
    let (c, delta) =
        boundary_operands(g, &ops).ok_or_else(|| value_error(format!("`{}` is not pruned{what}", g.name)))?;
    if !matches!(g.op(delta), Op::Threshold { .. }) {
        return Err(value_error("the block boundary does not read a threshold node"));
    }
    Ok(Pruned { a, ops, c, delta })
}

/// The operands `(c, delta)` of the program's `block_boundary` node; None when nothing is pruned.
fn boundary_operands(g: &Graph, ops: &foxc_ir::AttnOperands) -> Option<(ValueId, ValueId)> {
    let start = ops.start?;
    let Op::BlockBoundary(_) = g.op(start) else { return None };
    match g.operands(start)[..] {
        [c, delta] => Some((c, delta)),
        _ => None,
    }
}

/// Some of the parameters (those a value needs), rounded to their declared dtypes as the
/// backends see them: the interpreter evaluates only what the targets read.
pub(crate) fn partial_inputs(
    g: &Graph,
    inputs: BTreeMap<String, Wire>,
) -> PyResult<BTreeMap<String, Tensor>> {
    let mut out = BTreeMap::new();
    for (name, (dtype, shape, bytes)) in inputs {
        let p =
            g.param(&name).ok_or_else(|| value_error(format!("`{}` has no parameter `{name}`", g.name)))?;
        let given = match dtype.as_str() {
            "f32" => DType::F32,
            "bf16" => DType::BF16,
            other => {
                return Err(value_error(format!("input `{name}` has dtype {other}: float32 or bfloat16")))
            }
        };
        let numel: usize = shape.iter().product();
        if bytes.len() != numel * given.size_bytes() {
            return Err(value_error(format!("input `{name}`: {} bytes for shape {shape:?}", bytes.len())));
        }
        let t = HostTensor { dtype: given, shape, data: bytes };
        let t = if p.ty.dtype == given {
            t
        } else {
            HostTensor::from_f32_as(p.ty.dtype, &t.shape, &t.to_f32_vec())
        };
        out.insert(name, Tensor { shape: t.shape.clone(), data: t.to_f64_vec() });
    }
    Ok(out)
}

fn eval_one<'py>(
    py: Python<'py>,
    g: &Graph,
    inputs: &BTreeMap<String, Tensor>,
    v: ValueId,
    what: &str,
) -> PyResult<F64Out<'py>> {
    let vals = py
        .detach(|| interp::eval(g, inputs, &[v]))
        .map_err(|e| value_error(format!("computing {what}: {e}")))?;
    let t = &vals[&v];
    Ok((t.shape.clone(), PyBytes::new(py, &f64_bytes(&t.data))))
}

/// The CPU backend's block starts on full inputs: `(shape [B, H, Mt], i32 bytes, (bm, bn))`,
/// or None when the program does not prune (dense attention keeps every causal tile).
#[pyfunction]
fn block_starts<'py>(
    py: Python<'py>,
    program: &Program,
    inputs: BTreeMap<String, Wire>,
) -> PyResult<Option<Starts<'py>>> {
    let g = program.inner.optimized(Target::Cpu)?;
    let (_, a, _) = attention(&g)?;
    let tiles = tiles_of(&a)?;
    let host = host_inputs(&g, inputs)?;
    let Some(s) = py.detach(|| cpu_backend::block_starts(&g, &host)).map_err(to_py)? else { return Ok(None) };
    let bytes: Vec<u8> = s.data.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect();
    Ok(Some((s.shape, PyBytes::new(py, &bytes), tiles)))
}

/// `(bm, bn)` of the program's attention, whether it prunes by block starts, and whether it is
/// plain decay attention (`softmax(q.k / sqrt(D) + c_i - c_j)` under a causal mask of the q, k
/// and v parameters as given, one kv head per head): the form `foxc.distributed`'s partial
/// attention computes.
#[pyfunction]
fn prune_tiles(program: &Program) -> PyResult<((usize, usize), bool, bool)> {
    let g = program.inner.optimized(Target::Cpu)?;
    let (_, a, ops) = attention(&g)?;
    let d = g.ty(ops.q).dims().last().cloned();
    let is_param = |v: ValueId| matches!(g.op(v), Op::Param { .. });
    let plain = a.score.is_identity()
        && is_param(ops.q)
        && is_param(ops.k)
        && is_param(ops.v)
        && a.mask == foxc_ir::Mask::Causal
        && a.decay
        && a.kv_group == foxc_ir::Dim::Const(1)
        && a.scale.factor == 1.0
        && a.scale.inv_sqrt == d;
    Ok((tiles_of(&a)?, boundary_operands(&g, &ops).is_some(), plain))
}

/// The gate cumsum `c [B, H, T]` of the pruned attention (the interpreter's `gate_cumsum`),
/// from only the parameters it reads (e.g. the gate logits).
#[pyfunction]
fn decay_cumsum<'py>(
    py: Python<'py>,
    program: &Program,
    inputs: BTreeMap<String, Wire>,
) -> PyResult<F64Out<'py>> {
    eval_boundary_operand(py, program, inputs, 0, "the gate cumsum")
}

/// The threshold `delta [B, H, Mt]` of the pruned attention (the interpreter's `threshold`
/// of the program's rule), from the parameters it reads (q and k).
#[pyfunction]
fn threshold<'py>(
    py: Python<'py>,
    program: &Program,
    inputs: BTreeMap<String, Wire>,
) -> PyResult<F64Out<'py>> {
    eval_boundary_operand(py, program, inputs, 1, "the threshold")
}

/// Operand `which` of the program's block boundary (0: the gate cumsum, 1: the threshold)
/// through the interpreter, from only the parameters it reads.
fn eval_boundary_operand<'py>(
    py: Python<'py>,
    program: &Program,
    inputs: BTreeMap<String, Wire>,
    which: usize,
    what: &str,
) -> PyResult<F64Out<'py>> {
    let g = program.inner.optimized(Target::Cpu)?;
    let Pruned { c, delta, .. } = pruned(&g, "")?;
    let inputs = partial_inputs(&g, inputs)?;
    eval_one(py, &g, &inputs, [c, delta][which], what)
}

/// `start [B, H, Mt]` from `c [B, H, T]` and `delta [B, H, Mt]` (f64 bytes) by the interpreter's
/// `block_boundary` rule with the program's tiles: `(shape, i32 bytes)`.
#[pyfunction]
fn boundary<'py>(
    py: Python<'py>,
    program: &Program,
    c: (Vec<usize>, Vec<u8>),
    delta: (Vec<usize>, Vec<u8>),
) -> PyResult<(Vec<usize>, Bound<'py, PyBytes>)> {
    let g = program.inner.optimized(Target::Cpu)?;
    let (_, a, _) = attention(&g)?;
    let (bm, bn) = tiles_of(&a)?;
    let f64s = |b: &[u8]| -> Vec<f64> {
        b.chunks_exact(8).map(|x| f64::from_le_bytes(x.try_into().expect("8 bytes"))).collect()
    };
    let ((cs, cb), (ds, db)) = (c, delta);
    let [b, h, t] = cs[..] else {
        return Err(value_error(format!("c has shape {cs:?}, expected [B, H, T]")));
    };
    let mt = t.div_ceil(bm);
    if ds != [b, h, mt] || cb.len() != b * h * t * 8 || db.len() != b * h * mt * 8 {
        return Err(value_error(format!("delta has shape {ds:?}, expected {:?} (f64 bytes)", [b, h, mt])));
    }
    let (cv, dv) = (f64s(&cb), f64s(&db));
    let s = py.detach(|| interp::acp::boundary(&cv, &dv, b * h, t, bm, bn));
    let bytes: Vec<u8> = s.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect();
    Ok((ds, PyBytes::new(py, &bytes)))
}

/// The reference interpreter's attention results on the graph after the CPU passes:
/// `(out, lse)` as f64, `lse [B, H, T]` the rows' log-sum-exp over the kept keys (-inf for an
/// empty row). Partial results of context parallelism merge through it.
#[pyfunction]
fn reference_with_lse<'py>(
    py: Python<'py>,
    program: &Program,
    inputs: BTreeMap<String, Wire>,
) -> PyResult<(F64Out<'py>, F64Out<'py>)> {
    let g = program.inner.optimized(Target::Cpu)?;
    let (n, _, _) = attention(&g)?;
    if g.output != Some(n) {
        return Err(value_error(format!("`{}`: the output is not the attention's own result", g.name)));
    }
    let host = host_inputs(&g, inputs)?;
    foxc_driver::tensors::validate(&g, &host).map_err(to_py)?;
    let inputs = foxc_driver::tensors::to_interp(&host);
    let (o, l) = (Value { node: n, result: 0 }, Value { node: n, result: 1 });
    let vals = py
        .detach(|| interp::eval_values(&g, &inputs, &[o, l]))
        .map_err(|e| value_error(format!("reference interpreter: {e}")))?;
    let out = |v: &Value| (vals[v].shape.clone(), PyBytes::new(py, &f64_bytes(&vals[v].data)));
    Ok((out(&o), out(&l)))
}

/// Max row norms of local chunks: `(q_max [B, H], k_max [B, Hk])` as f64 bytes, of the rows
/// rounded to their declared dtypes (the statistics a rule's `q_max`, `k_max` reduce).
#[pyfunction]
fn local_norm_stats<'py>(
    py: Python<'py>,
    program: &Program,
    inputs: BTreeMap<String, Wire>,
) -> PyResult<(F64Out<'py>, F64Out<'py>)> {
    let g = program.inner.optimized(Target::Cpu)?;
    let (_, _, ops) = attention(&g)?;
    let (q, k) = (param_name(&g, ops.q)?, param_name(&g, ops.k)?);
    let inputs = partial_inputs(&g, inputs)?;
    let stat = |name: &str| -> PyResult<F64Out<'py>> {
        let t = inputs.get(name).ok_or_else(|| value_error(format!("missing input `{name}`")))?;
        let [b, h, l, d] = t.shape[..] else {
            return Err(value_error(format!("`{name}` is not [B, H, L, D]")));
        };
        let m: Vec<f64> = (0..b * h)
            .map(|bh| {
                (0..l)
                    .map(|i| foxc_ir::prune_rule::row_norm(&t.data[(bh * l + i) * d..(bh * l + i + 1) * d]))
                    .fold(0.0, interp::nan_max)
            })
            .collect();
        Ok((vec![b, h], PyBytes::new(py, &f64_bytes(&m))))
    };
    Ok((stat(&q)?, stat(&k)?))
}

/// The name of the parameter an attention operand reads directly.
fn param_name(g: &Graph, v: ValueId) -> PyResult<String> {
    match g.op(v) {
        Op::Param { .. } => g
            .params
            .iter()
            .find(|p| p.node == v)
            .map(|p| p.name.clone())
            .ok_or_else(|| value_error("parameter node without a parameter")),
        _ => Err(value_error(format!("`{}`: q and k must be parameters to split them over ranks", g.name))),
    }
}

fn f64_arg(name: &str, (shape, bytes): (Vec<usize>, Vec<u8>), want: &[usize]) -> PyResult<Vec<f64>> {
    if shape != want || bytes.len() != want.iter().product::<usize>() * 8 {
        return Err(value_error(format!("`{name}` has shape {shape:?}, expected {want:?} (f64 bytes)")));
    }
    Ok(bytes.chunks_exact(8).map(|x| f64::from_le_bytes(x.try_into().expect("8 bytes"))).collect())
}

/// The threshold of one rank's query tiles: the program's rule formula on the rows of a local
/// chunk (`q`, `k` of `[B, H, L, D]` starting at global row `offset`, a multiple of bm), with
/// the statistics that span the whole sequence of length `t` given: `q_max [B, H]`,
/// `k_max [B, Hk]` and `k_before [B, Hk]` (max |k_j| over the keys before the chunk). Returns
/// `delta [B, H, L / bm]` as f64 bytes: the values the program's `threshold` gives those tiles
/// on the whole sequence (docs/RULES.md).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn threshold_local<'py>(
    py: Python<'py>,
    program: &Program,
    inputs: BTreeMap<String, Wire>,
    t: usize,
    offset: usize,
    q_max: (Vec<usize>, Vec<u8>),
    k_max: (Vec<usize>, Vec<u8>),
    k_before: (Vec<usize>, Vec<u8>),
) -> PyResult<F64Out<'py>> {
    let g = program.inner.optimized(Target::Cpu)?;
    let Pruned { ops, delta, .. } = pruned(&g, "")?;
    let Op::Threshold { rule, log_eps, bound, score, scale, bm, .. } = g.op(delta).clone() else {
        unreachable!("pruned() checks the threshold")
    };
    let (qn, kn) = (param_name(&g, ops.q)?, param_name(&g, ops.k)?);
    let inputs = partial_inputs(&g, inputs)?;
    let (q, k) = match (inputs.get(&qn), inputs.get(&kn)) {
        (Some(q), Some(k)) => (q, k),
        _ => return Err(value_error(format!("threshold_local takes `{qn}` and `{kn}`"))),
    };
    let [b, h, l, d] = q.shape[..] else { return Err(value_error(format!("`{qn}` is not [B, H, L, D]"))) };
    let hk = k.shape.get(1).copied().unwrap_or(0);
    if k.shape.len() != 4 || k.shape[0] != b || k.shape[2..] != [l, d] || hk == 0 || h % hk != 0 {
        return Err(value_error(format!("`{kn}` {:?} does not fit `{qn}` {:?}", k.shape, q.shape)));
    }
    rule.check_heads(h).map_err(value_error)?;
    let bm = bm as usize;
    if bm == 0 || offset % bm != 0 || l % bm != 0 || offset + l > t {
        return Err(value_error(format!(
            "rows {offset}..{} of {t} are not whole {bm}-row tiles",
            offset + l
        )));
    }
    let q_max = f64_arg("q_max", q_max, &[b, h])?;
    let k_max = f64_arg("k_max", k_max, &[b, hk])?;
    let k_before = f64_arg("k_before", k_before, &[b, hk])?;
    // The dims of q's declared type bound to the chunk's sizes, the sequence axis to `t`.
    let dims: BTreeMap<String, u64> = g
        .ty(ops.q)
        .dims()
        .zip([b, h, t, d])
        .filter_map(|(dim, n)| match dim {
            foxc_ir::Dim::Sym(s) => Some((s.clone(), n as u64)),
            _ => None,
        })
        .collect();
    let scale = scale
        .value(&|s| dims.get(s).copied())
        .ok_or_else(|| value_error("the scale reads a dim that q's type does not name"))?;
    // The interpreter's threshold on the chunk, with the whole sequence's statistics.
    let group = h / hk;
    let kv_head = |bh: usize| (bh / h) * hk + (bh % h) / group;
    let stats = |bh: usize| [q_max[bh], k_max[kv_head(bh)], k_before[kv_head(bh)]];
    let args = ThresholdArgs {
        q: &q.data,
        k: &k.data,
        heads: b * h,
        kv_head: &kv_head,
        t: l,
        tk: l,
        d,
        bm,
        log_eps,
        scale,
        bound,
        score,
        whole: Some(Whole { len: t, stats: &stats }),
        given: &rule.given,
    };
    let out = prune_rule::threshold(&rule.formula, &args);
    Ok((vec![b, h, l / bm], PyBytes::new(py, &f64_bytes(&out))))
}

/// Add the functions to the extension module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(block_starts, m)?)?;
    m.add_function(wrap_pyfunction!(prune_tiles, m)?)?;
    m.add_function(wrap_pyfunction!(decay_cumsum, m)?)?;
    m.add_function(wrap_pyfunction!(threshold, m)?)?;
    m.add_function(wrap_pyfunction!(boundary, m)?)?;
    m.add_function(wrap_pyfunction!(reference_with_lse, m)?)?;
    m.add_function(wrap_pyfunction!(local_norm_stats, m)?)?;
    m.add_function(wrap_pyfunction!(threshold_local, m)?)?;
    Ok(())
}
