//! `--check` and `foxc verify`: compare an output with the f64 reference interpreter.
//!
//! The criterion (printed as applied, DESIGN.md section 5):
//! - relative L2 error `|out - ref| / |ref| <= tol`, where `ref` is the reference computed on the
//!   kept set the backend used (for a dense run: the dense reference). This tests the arithmetic.
//! - pruned runs also need `max |out - dense| <= 2 eps max|v| + tol max|dense|` (the ACP bound
//!   plus a rounding term proportional to the reference) and a pruned mass below eps in every
//!   checked row, the mass measured on the backend's kept set. This tests pruning's safety.
//!
//! Small problems run the whole graph through the interpreter (the dense reference from the
//! *unoptimized* graph, so the check also covers what the passes did). Large ones take a
//! deterministic sample of rows through the interpreter's row-sampled entry point
//! (`interp::attention::sample_rows`: the same per-row definition as the whole-node path).
//! No attention math lives here.

use crate::acp_stats::attention_node;
use crate::Error;
use foxc_ir::interp::{self, nan_max, Tensor};
use foxc_ir::{Attention, DType, Graph, Op, Prune, ValueId};
use std::collections::BTreeMap;

/// Largest `B*H*T*T` for which the full interpreter runs the unoptimized graph (T x T
/// intermediates through every elementwise op: about a second at this size).
pub const FULL_CHECK_LIMIT: u64 = 1 << 20;

/// Name of the parameter that carries a backend's block starts into the reference graph.
const BACKEND_START: &str = "__backend_start";

#[derive(Clone, Debug)]
pub struct CheckReport {
    /// Relative L2 error against the reference on the backend's kept set, and its tolerance.
    pub rel_l2: f64,
    pub tol: f64,
    /// Largest `|out - dense reference|`, and the bound applied to it on pruned runs:
    /// `acp_bound + rounding`.
    pub max_abs_diff: f64,
    pub acp_bound: f64,
    pub rounding: f64,
    /// Largest dense softmax weight any compared row lost to pruning, and eps.
    pub max_pruned_mass: f64,
    pub eps: f64,
    pub pruned: bool,
    /// "all rows" or "N sampled rows".
    pub coverage: String,
    /// Whose kept set the reference pruned: the backend's own or the interpreter's.
    pub kept_set: &'static str,
    /// Every violated condition, in words (empty when passed).
    pub failures: Vec<String>,
}

impl CheckReport {
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }

    /// The report as `foxc run --check` and `foxc verify` print it.
    pub fn lines(&self) -> Vec<String> {
        let mut v = vec![format!(
            "check vs f64 reference ({}): rel L2 {:.3e} (pass if <= tol {:.1e}; reference on {} kept set)",
            self.coverage, self.rel_l2, self.tol, self.kept_set
        )];
        if self.pruned {
            v.push(format!(
                "  max abs diff vs dense {:.3e} (pass if <= {:.3e} = ACP bound 2 eps max|v| {:.3e} + rounding tol max|ref| + 1 ulp {:.3e}); max pruned mass {:.3e} (pass if < eps {:.3e})",
                self.max_abs_diff,
                self.acp_bound + self.rounding,
                self.acp_bound,
                self.rounding,
                self.max_pruned_mass,
                self.eps
            ));
        } else {
            v.push(format!("  max abs diff {:.3e} (dense run: not bounded separately)", self.max_abs_diff));
        }
        v
    }
}

/// Relative L2 tolerance of each backend (DESIGN.md section 5); bf16, f16 and (for the f64
/// reference) f32 outputs add their rounding.
pub fn tolerance(backend: &str, out_dtype: DType) -> f64 {
    let base = match backend {
        "reference" => 1e-12,
        "cpu" => 1e-5,
        _ => 1e-2,
    };
    match out_dtype {
        DType::BF16 => f64::max(base, 4e-3),
        DType::F16 => f64::max(base, 1e-3),
        // Both sides round their f64 values to the f32 output: two values that straddle a
        // rounding boundary differ by one f32 ulp, at most 2^-23 relative (the reference
        // backend's 1e-12 failed every f32 output).
        DType::F32 => f64::max(base, f32::EPSILON as f64),
        _ => base,
    }
}

/// The reference backend's tolerance on `optimized`'s attention with these inputs: its base
/// ([`tolerance`]: 1e-12, or the output dtype's rounding), or more where the logits are large. Both sides are f64, but the pipeline computes each logit
/// `x = scale (q . k)` in another order than the program as written (fused and contracted),
/// which moves it by up to `D u |scale| |q| |k|` (`u = 2^-53`); the softmax turns an absolute
/// change of the logits into a relative change of the output of at most twice as much. At
/// q/k norms near 1e3 (T = 512, D = 64) the two sides differ by 1.2e-9.
pub fn reference_tolerance(
    optimized: &Graph,
    inputs: &BTreeMap<String, Tensor>,
    out_dtype: DType,
) -> Result<f64, Error> {
    let base = tolerance("reference", out_dtype);
    let Some((_, a, ops)) = attention(optimized)? else { return Ok(base) };
    let vals = interp::eval(optimized, inputs, &[ops.q, ops.k]).map_err(interp_err)?;
    let max_row_norm = |t: &Tensor| {
        let d = t.shape.last().copied().unwrap_or(1).max(1);
        let m = t.data.chunks(d).map(|r| r.iter().map(|x| x * x).sum::<f64>()).fold(0.0, nan_max);
        (m.sqrt(), d)
    };
    let ((qmax, d), (kmax, _)) = (max_row_norm(&vals[&ops.q]), max_row_norm(&vals[&ops.k]));
    // `|scale| <= |factor| |q factor|`: an inv_sqrt dim is at least 1.
    let x = a.scale.factor.abs() * q_factor(optimized, inputs, &a.scale)?.abs() * qmax * kmax;
    Ok(f64::max(base, 2.0 * d as f64 * f64::EPSILON / 2.0 * x))
}

/// The scale's q factor (`foxc_ir::Scale::q`; 1 without one) at the sizes of `inputs`.
fn q_factor(g: &Graph, inputs: &BTreeMap<String, Tensor>, scale: &foxc_ir::Scale) -> Result<f64, Error> {
    if scale.q.is_none() {
        return Ok(1.0);
    }
    let shapes: Vec<(String, Vec<usize>)> =
        inputs.iter().map(|(k, t)| (k.clone(), t.shape.clone())).collect();
    let dims = foxc_ir::shapes::bind_dims(g, &shapes).map_err(|e| Error::user(format!("error: {e}")))?;
    scale
        .q_value(&|s| dims.get(s))
        .ok_or_else(|| Error::internal("error: the scale's q factor has an unbound dim"))
}

/// `(|out - ref| / |ref|, max |out - ref|)`; NaN anywhere makes both infinite.
pub fn rel_l2(out: &[f64], reference: &[f64]) -> (f64, f64) {
    let (mut num, mut den, mut max_abs) = (0.0f64, 0.0f64, 0.0f64);
    for (&o, &r) in out.iter().zip(reference) {
        let d = o - r;
        num += d * d;
        den += r * r;
        max_abs = max_abs.max(if d.is_nan() { f64::INFINITY } else { d.abs() });
    }
    let rel = if den > 0.0 { (num / den).sqrt() } else { num.sqrt() };
    (if rel.is_nan() { f64::INFINITY } else { rel }, max_abs)
}

fn interp_err(e: impl std::fmt::Display) -> Error {
    Error::user(format!("error: reference interpreter: {e}"))
}

/// The attention node of `g`, its attributes and operands (the one place check reads them).
fn attention(g: &Graph) -> Result<Option<(ValueId, Attention, foxc_ir::AttnOperands)>, Error> {
    let Some(n) = attention_node(g) else { return Ok(None) };
    let Op::Attention(a) = g.op(n) else { return Ok(None) };
    let ops = Attention::operands(g, n).map_err(Error::internal)?;
    Ok(Some((n, a.clone(), ops)))
}

/// `g` with the attention's block starts read from the parameter [`BACKEND_START`] (so the
/// interpreter prunes exactly the tiles the backend skipped), and the inputs with it added.
fn with_backend_starts(
    g: &Graph,
    inputs: &BTreeMap<String, Tensor>,
    start: Option<&Tensor>,
) -> Result<(Graph, BTreeMap<String, Tensor>, &'static str), Error> {
    let (Some(start), Some((_, a, ops))) = (start, attention(g)?) else {
        return Ok((g.clone(), inputs.clone(), "the interpreter's"));
    };
    let Some(node) = ops.start.filter(|_| a.prune == Prune::Start) else {
        return Ok((g.clone(), inputs.clone(), "the interpreter's"));
    };
    let mut g2 = g.clone();
    let ty = g.ty(node).clone();
    let span = g.node(node).span;
    let p = g2.add_param(BACKEND_START, ty, span);
    g2.replace_all_uses(node, p);
    g2.remove_dead();
    let mut ins = inputs.clone();
    ins.insert(BACKEND_START.to_string(), start.clone());
    Ok((g2, ins, "the backend's"))
}

/// One unit in the last place of `x` in `dtype` (0 for 0 and non-finite `x`).
fn ulp(dtype: foxc_ir::DType, x: f64) -> f64 {
    let mantissa = match dtype {
        foxc_ir::DType::BF16 => 7,
        foxc_ir::DType::F16 => 10,
        _ => 23,
    };
    if x > 0.0 && x.is_finite() {
        2f64.powi(x.log2().floor() as i32 - mantissa)
    } else {
        0.0
    }
}

/// Compare `out` (an output, as f64) with the reference. `start` is the block starts the backend
/// used (`[B, H, Mt]`), when it reports them; otherwise the interpreter's are assumed.
pub fn check(
    source_graph: &Graph,
    optimized: &Graph,
    inputs: &BTreeMap<String, Tensor>,
    out: &Tensor,
    tol: f64,
    log_eps: f64,
    start: Option<&Tensor>,
) -> Result<CheckReport, Error> {
    let attn = attention(optimized)?;
    let pruned = attn.as_ref().is_some_and(|(_, a, _)| a.prune != Prune::Dense);
    let eps = log_eps.exp();
    let shape = &out.shape;
    let work: u64 = if shape.len() == 4 {
        shape[0] as u64 * shape[1] as u64 * shape[2] as u64 * shape[2] as u64
    } else {
        0
    };
    let (g2, ins2, kept_set) = with_backend_starts(optimized, inputs, start)?;
    let mut r = CheckReport {
        rel_l2: 0.0,
        tol,
        max_abs_diff: 0.0,
        acp_bound: 0.0,
        rounding: 0.0,
        max_pruned_mass: 0.0,
        eps,
        pruned,
        coverage: String::new(),
        kept_set: if pruned { kept_set } else { "the dense" },
        failures: vec![],
    };
    let (max_v, max_ref);
    let sampled = attn.as_ref().filter(|_| work > FULL_CHECK_LIMIT);
    if let Some((node, _, ops)) = sampled {
        if !output_is_attention(optimized, *node) {
            return Err(Error::user(
                "error: this output is too large for the full reference and is not the attention's output itself: use a smaller shape to check it",
            ));
        }
        let rows = sample(shape[0] * shape[1], shape[2]);
        let got = interp::attention::sample_rows(&g2, &ins2, *node, &rows).map_err(interp_err)?;
        let dv = shape[3];
        if got.iter().any(|row| row.dense.len() != dv) {
            return Err(Error::user(format!(
                "error: the output has shape {shape:?}, unlike the attention's"
            )));
        }
        let (mut o, mut kept, mut dense) = (vec![], vec![], vec![]);
        for (&(bh, i), row) in rows.iter().zip(&got) {
            o.extend_from_slice(&out.data[(bh * shape[2] + i) * dv..(bh * shape[2] + i + 1) * dv]);
            kept.extend_from_slice(&row.kept);
            dense.extend_from_slice(&row.dense);
            r.max_pruned_mass = nan_max(r.max_pruned_mass, row.pruned_mass);
        }
        r.rel_l2 = rel_l2(&o, &kept).0;
        r.max_abs_diff = rel_l2(&o, &dense).1;
        max_ref = dense.iter().fold(0.0, |m: f64, x| nan_max(m, x.abs()));
        max_v = max_abs_of(optimized, inputs, ops.v)?;
        r.coverage = format!("{} sampled rows", rows.len());
    } else {
        let dense = interp::run(source_graph, inputs).map_err(interp_err)?.output;
        if dense.shape != out.shape {
            return Err(Error::user(format!(
                "error: the output has shape {:?}, the reference {:?}",
                out.shape, dense.shape
            )));
        }
        let kept = if pruned {
            let run = interp::run(&g2, &ins2).map_err(interp_err)?;
            r.max_pruned_mass = run.prune.iter().map(|p| p.max_pruned_mass).fold(0.0, nan_max);
            run.output
        } else {
            dense.clone()
        };
        r.rel_l2 = rel_l2(&out.data, &kept.data).0;
        r.max_abs_diff = rel_l2(&out.data, &dense.data).1;
        max_ref = dense.data.iter().fold(0.0, |m: f64, x| nan_max(m, x.abs()));
        max_v = match &attn {
            Some((_, _, ops)) => max_abs_of(optimized, inputs, ops.v)?,
            None => 0.0,
        };
        r.coverage = "all rows".into();
    }
    r.acp_bound = 2.0 * eps * max_v;
    // Both sides round to the output's dtype: two values that straddle a rounding boundary
    // differ by one ulp, which at the largest magnitude can exceed `tol` relative (a bf16 ulp is
    // 2^-7 relative at the bottom of a binade; tol 4e-3 is 2^-8).
    let out_dtype = optimized.output.map_or(foxc_ir::DType::F32, |o| optimized.ty(o).dtype);
    r.rounding = tol * max_ref + ulp(out_dtype, max_ref);
    if !within(r.rel_l2, tol) {
        r.failures.push(format!("relative L2 error {:.3e} exceeds tol {:.1e}", r.rel_l2, tol));
    }
    if pruned {
        if !within(r.max_abs_diff, r.acp_bound + r.rounding) {
            r.failures.push(format!(
                "max abs diff {:.3e} vs the dense reference exceeds the ACP bound + rounding {:.3e}",
                r.max_abs_diff,
                r.acp_bound + r.rounding
            ));
        }
        if !below(r.max_pruned_mass, eps) {
            r.failures.push(format!("pruned mass {:.3e} is not below eps {:.3e}", r.max_pruned_mass, eps));
        }
    }
    Ok(r)
}

/// `x <= bound`, false for NaN (a NaN error never passes).
fn within(x: f64, bound: f64) -> bool {
    x <= bound
}

/// `x < bound`, false for NaN.
fn below(x: f64, bound: f64) -> bool {
    x < bound
}

/// Whether the graph's output is the attention node's `out` (possibly through casts).
fn output_is_attention(g: &Graph, node: ValueId) -> bool {
    let mut o = g.output;
    while let Some(x) = o {
        if x == node {
            return true;
        }
        o = matches!(g.op(x), Op::Cast).then(|| g.operands(x)[0]);
    }
    false
}

/// `max |x|` of value `v` of `g`.
fn max_abs_of(g: &Graph, inputs: &BTreeMap<String, Tensor>, v: ValueId) -> Result<f64, Error> {
    let vals = interp::eval(g, inputs, &[v]).map_err(interp_err)?;
    Ok(vals[&v].data.iter().fold(0.0f64, |m, x| nan_max(m, x.abs())))
}

/// A deterministic spread of `(b * H + h, i)` rows over heads and positions, always including
/// the last row of the first head (the longest row).
fn sample(heads: usize, t: usize) -> Vec<(usize, usize)> {
    let n = if t > 16384 { 48 } else { 192 };
    (0..n)
        .map(|s| {
            let bh = (s * 7919) % heads.max(1);
            let i = if s == 0 { t - 1 } else { (s as u64 * 2654435761 % t as u64) as usize };
            (bh, i)
        })
        .collect()
}
