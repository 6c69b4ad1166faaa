//! Typing rules of the graph IR's ops: the single source of truth for what type an op produces
//! from its operands. Lowering builds every node through [`infer`], and the verifier
//! ([`crate::verify`]) re-checks every node against it, so the two cannot drift apart.
//!
//! Rules (elementwise ops broadcast by axis *name*):
//! - floating-point ops compute in f32: any float operand (bf16, f16, f32) is widened, results
//!   are f32; `bool` (comparison results) is accepted only as the condition of `select`;
//! - binary ops and `select`: the result's axes are the first operand's axes, then each later
//!   operand's axes that are new, in order; an axis name shared by two operands must have the same
//!   size in both;
//! - `reduce` removes its axis; `cumsum`, `softmax`, `causal`, `window` keep the operand's axes
//!   (the named axes must exist);
//! - `bind` names the axes of a positional operand (dtype kept); `store` makes a named operand
//!   positional in the given axis order (float becomes f32, bool stays bool);
//! - `rmsnorm(x, w)`: w has exactly one axis, named `axis` (or a positional rank-1 weight after
//!   passes), of the same size as x's axis `axis`; result f32 with x's axes;
//! - fused ops: as docs/SEMANTICS.md.

use crate::ops::{GateKind, NormBound, Op, ThresholdPlan};
use crate::types::{Axis, DType, Dim, ValueType};

fn float(t: &ValueType, what: &str) -> Result<(), String> {
    if t.dtype.is_float() {
        Ok(())
    } else {
        Err(format!("{what} must be floating point, found {t}"))
    }
}

fn number(t: &ValueType, what: &str) -> Result<(), String> {
    if t.dtype.is_float() || t.dtype == DType::I32 {
        Ok(())
    } else {
        Err(format!("{what} must be a number, found {t}"))
    }
}

/// Union of the axes of `ts` by name, in order of first appearance.
pub fn broadcast_axes(ts: &[&ValueType]) -> Result<Vec<Axis>, String> {
    let mut axes: Vec<Axis> = Vec::new();
    for t in ts {
        for a in &t.axes {
            match axes.iter().find(|b| b.name == a.name) {
                Some(b) if b.dim != a.dim => {
                    return Err(format!(
                        "axis `{}` has size {} in one operand and {} in another",
                        a.name, b.dim, a.dim
                    ))
                }
                Some(_) => {}
                None => axes.push(a.clone()),
            }
        }
    }
    Ok(axes)
}

fn has_axis(t: &ValueType, axis: &str, what: &str) -> Result<(), String> {
    if t.axis(axis).is_some() {
        Ok(())
    } else {
        let names: Vec<&str> = t.axes.iter().map(|a| a.name.as_str()).collect();
        Err(format!("{what}: operand {t} has no axis `{axis}` (axes: [{}])", names.join(", ")))
    }
}

fn no_duplicates(axes: &[String]) -> Result<(), String> {
    for (n, a) in axes.iter().enumerate() {
        if axes[..n].contains(a) {
            return Err(format!("axis `{a}` appears twice in [{}]", axes.join(", ")));
        }
    }
    Ok(())
}

fn positional_rank(t: &ValueType, rank: usize, what: &str) -> Result<(), String> {
    if !t.is_positional() || t.rank() != rank {
        return Err(format!("{what} must be a positional rank-{rank} tensor, found {t}"));
    }
    Ok(())
}

fn dims(t: &ValueType) -> Vec<Dim> {
    t.dims().cloned().collect()
}

/// The type of the value `op` computes from operands of types `ops`, for every op whose result
/// type is determined by its operands and attributes. `Param`, `Iota` and `Cast` carry their
/// type on the node (so does `Gather`, whose axis sizes are those of its index variables):
/// for those this returns `None` and the caller checks them itself.
pub fn infer(op: &Op, ops: &[&ValueType]) -> Result<Option<ValueType>, String> {
    if let Some(n) = op.arity() {
        if ops.len() != n {
            return Err(format!("`{}` takes {n} operands, found {}", op.mnemonic(), ops.len()));
        }
    }
    let f32_with = |axes: Vec<Axis>| Some(ValueType { dtype: DType::F32, axes });
    Ok(match op {
        // The sizes of a gather's axes are the index variables' sizes, carried on the node.
        // A load map's type is the statement's it replaced (the verifier checks its shape).
        Op::Param { .. } | Op::Iota { .. } | Op::Cast | Op::Gather { .. } | Op::LoadMap { .. } => None,
        Op::Const(_) | Op::DimSize(_) => Some(ValueType::scalar(DType::F32)),
        Op::Bind { axes } => {
            let t = ops[0];
            if !t.is_positional() {
                return Err(format!("bind: operand must be positional, found {t}"));
            }
            if t.rank() != axes.len() {
                return Err(format!("bind: {} names for an operand of rank {} ({t})", axes.len(), t.rank()));
            }
            no_duplicates(axes)?;
            Some(ValueType {
                dtype: t.dtype,
                axes: axes.iter().zip(t.dims()).map(|(n, d)| Axis::new(n, d.clone())).collect(),
            })
        }
        Op::Store { axes } => {
            let t = ops[0];
            no_duplicates(axes)?;
            if t.rank() != axes.len() || axes.iter().any(|a| t.axis(a).is_none()) {
                return Err(format!(
                    "store [{}]: operand {t} does not have exactly these axes",
                    axes.join(", ")
                ));
            }
            // A statement's value is f32 (bool for a condition); a 16-bit float stays one (the
            // output's cast stored directly, `fuse-output-cast`; a copy of a 16-bit parameter
            // holds the same values).
            let dtype = match t.dtype {
                DType::Bool | DType::BF16 | DType::F16 => t.dtype,
                _ => DType::F32,
            };
            let d = axes.iter().map(|a| t.axis(a).map(|(_, x)| x.dim.clone()).unwrap_or(Dim::Const(0)));
            Some(ValueType::tensor(dtype, d))
        }
        Op::Unary(_) => {
            float(ops[0], "operand")?;
            f32_with(ops[0].axes.clone())
        }
        Op::Binary(b) => {
            // Comparisons take integers too (by value); arithmetic is floating point only.
            let operand = if b.is_comparison() { number } else { float };
            operand(ops[0], "left operand")?;
            operand(ops[1], "right operand")?;
            let axes = broadcast_axes(ops)?;
            let dtype = if b.is_comparison() { DType::Bool } else { DType::F32 };
            Some(ValueType { dtype, axes })
        }
        Op::Select => {
            if ops[0].dtype != DType::Bool {
                return Err(format!("select: condition must be bool, found {}", ops[0]));
            }
            float(ops[1], "select's second operand")?;
            float(ops[2], "select's third operand")?;
            f32_with(broadcast_axes(ops)?)
        }
        Op::Reduce { axis, .. } => {
            float(ops[0], "operand")?;
            has_axis(ops[0], axis, op.mnemonic())?;
            f32_with(ops[0].axes.iter().filter(|a| a.name != *axis).cloned().collect())
        }
        Op::Cumsum { axis, .. } | Op::Softmax { axis } => {
            float(ops[0], "operand")?;
            has_axis(ops[0], axis, op.mnemonic())?;
            f32_with(ops[0].axes.clone())
        }
        Op::Causal { i, j } | Op::Window { i, j, .. } => {
            float(ops[0], "operand")?;
            has_axis(ops[0], i, op.mnemonic())?;
            has_axis(ops[0], j, op.mnemonic())?;
            if i == j {
                return Err(format!("{}: i and j are the same axis `{i}`", op.mnemonic()));
            }
            if let Op::Window { size: 0, .. } = op {
                return Err("window: size must be at least 1".into());
            }
            f32_with(ops[0].axes.clone())
        }
        Op::RmsNorm { axis, eps } => {
            let (x, w) = (ops[0], ops[1]);
            float(x, "rmsnorm input")?;
            float(w, "rmsnorm weight")?;
            has_axis(x, axis, "rmsnorm")?;
            if w.rank() != 1 || !(w.axes[0].name == *axis || w.is_positional()) {
                return Err(format!("rmsnorm: weight must have the single axis `{axis}`, found {w}"));
            }
            let xd = &x.axis(axis).map(|(_, a)| a.dim.clone());
            if xd.as_ref() != Some(&w.axes[0].dim) {
                return Err(format!("rmsnorm: weight {w} does not match the size of axis `{axis}` of {x}"));
            }
            if !(eps.is_finite() && *eps >= 0.0) {
                return Err(format!("rmsnorm: eps must be finite and >= 0, found {eps}"));
            }
            f32_with(x.axes.clone())
        }
        Op::GateCumsum { kind, .. } | Op::GateCumsumLo { kind } => {
            let g = ops[0];
            float(g, "gate_cumsum operand")?;
            match kind {
                GateKind::Slope => {
                    positional_rank(g, 1, "gate_cumsum {gate = Slope} operand")?;
                    // [B, H, T] with H from the slope; B and T are not determined by the operand.
                    None
                }
                GateKind::Logits | GateKind::LogGate => {
                    positional_rank(g, 3, "gate_cumsum operand")?;
                    Some(ValueType::tensor(DType::F32, dims(g)))
                }
            }
        }
        // Result 0; [`crate::attention::Attention::result_types`] gives both.
        Op::Attention(a) => Some(a.result_types(ops)?.remove(0)),
        // dq; [`crate::attention::Attention::backward_result_types`] gives them all.
        Op::AttentionBackward(a) => Some(a.backward_result_types(ops)?.remove(0)),
        Op::Threshold { rule, bm, log_eps, score, scale, bound, plan } => {
            let (q, k) = (ops[0], ops[1]);
            positional_rank(q, 4, "threshold's q")?;
            positional_rank(k, 4, "threshold's k")?;
            float(q, "threshold's q")?;
            float(k, "threshold's k")?;
            let (dq, dk) = (dims(q), dims(k));
            // Queries may be fewer than keys (aligned to the end of them, as the attention's).
            if dq[0] != dk[0] || dq[3] != dk[3] {
                return Err(format!("threshold: k {k} does not match q {q} in B and D"));
            }
            if *bm == 0 {
                return Err("threshold: bm must be at least 1".into());
            }
            if log_eps.is_nan() || scale.factor.is_nan() {
                return Err("threshold: log_eps and scale must not be NaN".into());
            }
            if let Some(e) = scale.malformed() {
                return Err(format!("threshold: {e}"));
            }
            if !rule.fits(score) {
                return Err(format!(
                    "threshold: the rule `{}` reads s_ii and needs the identity score (its diagonal \
                     logit is q.k)",
                    rule.name
                ));
            }
            if *plan == ThresholdPlan::OneLaunch && !rule.norms_only(score, *bound == NormBound::Data) {
                return Err(format!(
                    "threshold: plan = one_launch needs a formula of tile norms only under a data \
                     bound; the rule `{}` reads the rows or a static bound",
                    rule.name
                ));
            }
            let d = dims(q);
            if rule.reads_given() {
                crate::prune_rule::check_given(&rule.given).map_err(|e| format!("threshold: {e}"))?;
                if let Dim::Const(h) = d[1] {
                    rule.check_heads(h as usize).map_err(|e| format!("threshold: {e}"))?;
                }
            }
            Some(ValueType::tensor(
                DType::F32,
                [d[0].clone(), d[1].clone(), Dim::Tiles(Box::new(d[2].clone()), *bm)],
            ))
        }
        Op::BlockBoundary(t) => {
            let (c, delta) = (ops[0], ops[1]);
            positional_rank(c, 3, "block_boundary's c")?;
            float(c, "block_boundary's c")?;
            tiles_ok(t.bm, t.bn)?;
            // delta's tiles are the queries' (`ceil(Tq / bm)`): fewer queries than keys sit at
            // the end of them ([`query_rows`]).
            let d = dims(c);
            let rows = query_rows(delta, t.bm).unwrap_or_else(|| d[2].clone());
            let want =
                ValueType::tensor(DType::F32, [d[0].clone(), d[1].clone(), Dim::Tiles(Box::new(rows), t.bm)]);
            if *delta != want {
                return Err(format!("block_boundary: delta must be {want}, found {delta}"));
            }
            Some(ValueType { dtype: DType::I32, axes: want.axes })
        }
    })
}

/// The query count `Tq` of a per-query-tile tensor `[B, H, ceil(Tq / bm)]` (a `threshold` result,
/// a `block_boundary` operand): `block_boundary` reads its queries' length from delta's type.
pub fn query_rows(per_tile: &ValueType, bm: u32) -> Option<Dim> {
    match per_tile.dims().nth(2) {
        Some(Dim::Tiles(rows, b)) if *b == bm && per_tile.rank() == 3 => Some((**rows).clone()),
        _ => None,
    }
}

fn tiles_ok(bm: u32, bn: u32) -> Result<(), String> {
    if bm == 0 || bn == 0 {
        return Err(format!("tiles must be non-empty, found bm = {bm}, bn = {bn}"));
    }
    Ok(())
}
