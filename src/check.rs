//! `--check`: compare a backend's output with the f64 reference interpreter.
//!
//! Small problems run the whole *unoptimized* graph through the interpreter (so the check also
//! covers what the passes did). Large ones evaluate the attention node's operands through the
//! interpreter and recompute a deterministic sample of rows densely in f64.

use crate::acp_stats::attention_node;
use crate::Error;
use foxc_ir::interp::{self, Tensor};
use foxc_ir::{DType, Graph, Op};
use std::collections::BTreeMap;

/// Largest `B*H*T*T` for which the full interpreter runs the unoptimized graph (T x T
/// intermediates through every elementwise op: about a second at this size).
const FULL_CHECK_LIMIT: u64 = 1 << 20;

#[derive(Clone, Debug)]
pub struct CheckReport {
    /// `|out - ref| / |ref|` over the compared elements (ref: dense, f64).
    pub rel_l2: f64,
    pub max_abs_diff: f64,
    /// Largest dense softmax weight any compared row lost to pruning.
    pub max_pruned_mass: f64,
    /// What passes: the backend's tolerance, plus the ACP bound `2 eps max|v|` on max abs diff.
    pub tolerance: f64,
    pub acp_bound: f64,
    /// "all rows" or "N sampled rows".
    pub coverage: String,
    pub passed: bool,
}

/// Relative L2 tolerance of each backend (DESIGN.md section 5); bf16 outputs add their rounding.
pub fn tolerance(backend: &str, out_dtype: DType) -> f64 {
    let base = match backend {
        "reference" => 1e-12,
        "cpu" => 1e-5,
        _ => 1e-2,
    };
    match out_dtype {
        DType::BF16 => f64::max(base, 4e-3),
        DType::F16 => f64::max(base, 1e-3),
        _ => base,
    }
}

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

/// Compare `out` (the backend's output, as f64) with the reference.
pub fn check(
    source_graph: &Graph,
    optimized: &Graph,
    inputs: &BTreeMap<String, Tensor>,
    out: &Tensor,
    backend: &str,
    log_eps: f64,
) -> Result<CheckReport, Error> {
    let out_dtype = optimized.output.map(|o| optimized.ty(o).dtype).unwrap_or(DType::F32);
    let tol = tolerance(backend, out_dtype);
    let attn = attention_node(optimized);
    let shape = &out.shape;
    let work: u64 = if shape.len() == 4 {
        shape[0] as u64 * shape[1] as u64 * shape[2] as u64 * shape[2] as u64
    } else {
        0
    };
    let eps = log_eps.exp();
    let pruned = attn.is_some_and(|a| matches!(optimized.op(a), Op::PrunedDecayAttention { .. }));
    if attn.is_none() || work <= FULL_CHECK_LIMIT {
        let reference = interp::run(source_graph, inputs)
            .map_err(|e| Error::user(format!("error: reference interpreter: {e}")))?;
        let (rel, max_abs) = rel_l2(&out.data, &reference.output.data);
        let (max_mass, max_v) = if pruned {
            let r = interp::run(optimized, inputs)
                .map_err(|e| Error::user(format!("error: reference interpreter: {e}")))?;
            let m = r.prune.iter().map(|p| p.max_pruned_mass).fold(0.0, f64::max);
            (m, max_abs_v(optimized, inputs)?)
        } else {
            (0.0, 0.0)
        };
        let acp_bound = 2.0 * eps * max_v;
        let passed = rel <= tol || (pruned && max_abs <= acp_bound + tol * max_v.max(1.0));
        return Ok(CheckReport {
            rel_l2: rel,
            max_abs_diff: max_abs,
            max_pruned_mass: max_mass,
            tolerance: tol,
            acp_bound,
            coverage: "all rows".into(),
            passed: passed && (!pruned || max_mass < eps),
        });
    }
    sampled_check(optimized, inputs, out, tol, eps)
}

fn max_abs_v(g: &Graph, inputs: &BTreeMap<String, Tensor>) -> Result<f64, Error> {
    let Some(a) = attention_node(g) else { return Ok(0.0) };
    let v = g.operands(a)[2];
    let vals = interp::eval(g, inputs, &[v]).map_err(|e| Error::user(format!("error: {e}")))?;
    Ok(vals[&v].data.iter().fold(0.0f64, |m, x| m.max(x.abs())))
}

fn sampled_check(
    g: &Graph,
    inputs: &BTreeMap<String, Tensor>,
    out: &Tensor,
    tol: f64,
    eps: f64,
) -> Result<CheckReport, Error> {
    let a = attention_node(g).expect("sampled check needs an attention node");
    let ops = g.operands(a);
    let (attrs, tiles) = match g.op(a) {
        Op::PrunedDecayAttention { attn, tiles } => (*attn, Some(*tiles)),
        Op::DecayAttention(attn) => (*attn, None),
        _ => unreachable!(),
    };
    let vals = interp::eval(g, inputs, &ops).map_err(|e| Error::user(format!("error: {e}")))?;
    let (q, k, v) = (&vals[&ops[0]], &vals[&ops[1]], &vals[&ops[2]]);
    let c = attrs.has_decay.then(|| &vals[&ops[3]]);
    let start = tiles.map(|_| &vals[&ops[4]]);
    let [b, h, t, d] = [q.shape[0], q.shape[1], q.shape[2], q.shape[3]];
    let samples = if t > 16384 { 48 } else { 192 };
    let max_v = v.data.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let (mut outs, mut refs, mut max_mass) = (Vec::new(), Vec::new(), 0.0f64);
    for s in 0..samples {
        // A deterministic spread over heads and rows, always including the last row.
        let bh = (s * 7919) % (b * h);
        let i = if s == 0 { t - 1 } else { (s as u64 * 2654435761 % t as u64) as usize };
        let base = bh * t;
        let window_first = attrs.window.map_or(0, |w| (i + 1).saturating_sub(w as usize));
        let kept_first = match (tiles, start) {
            (Some(tl), Some(st)) => {
                let m = i / tl.bm as usize;
                window_first.max(st.data[bh * t.div_ceil(tl.bm as usize) + m] as usize * tl.bn as usize)
            }
            _ => window_first,
        };
        let mut logits = Vec::with_capacity(i + 1 - window_first);
        for j in window_first..=i {
            let dot: f64 = (0..d).map(|x| q.data[(base + i) * d + x] * k.data[(base + j) * d + x]).sum();
            let bias = c.map_or(0.0, |c| c.data[base + i] - c.data[base + j]);
            logits.push(attrs.scale * dot + bias);
        }
        let mx = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = logits.iter().map(|l| (l - mx).exp()).collect();
        let z: f64 = w.iter().sum();
        let mass: f64 = w[..kept_first - window_first].iter().sum::<f64>() / z;
        max_mass = max_mass.max(mass);
        for x in 0..d {
            let o: f64 =
                (window_first..=i).map(|j| w[j - window_first] * v.data[(base + j) * d + x]).sum::<f64>() / z;
            refs.push(o);
            outs.push(out.data[(base + i) * d + x]);
        }
    }
    let _ = h;
    let (rel, max_abs) = rel_l2(&outs, &refs);
    let acp_bound = 2.0 * eps * max_v;
    let pruned = tiles.is_some();
    let passed = (rel <= tol || (pruned && max_abs <= acp_bound + tol * max_v.max(1.0))) && max_mass < eps;
    Ok(CheckReport {
        rel_l2: rel,
        max_abs_diff: max_abs,
        max_pruned_mass: max_mass,
        tolerance: tol,
        acp_bound,
        coverage: format!("{samples} sampled rows"),
        passed,
    })
}
