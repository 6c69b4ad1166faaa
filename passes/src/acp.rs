//! ACP insertion: `decay_attention` with a proven decay becomes
//! `threshold -> block_boundary -> pruned_decay_attention` (docs/SEMANTICS.md).
//!
//! The bound on `max|q_i|`, `max|k_j|`: with QK-norm, `|rmsnorm(x, w)_i| <= max|w| sqrt(D)`
//! (each normalized row has mean square 1, before the weight). `max|w|` is data unless the weight
//! parameter declares a range (`w: f32[D] in [lo, hi]` gives `max|w| <= max(|lo|, |hi|)`) and
//! `D` is a constant of the signature; only then is the bound `Static`. Otherwise the
//! `threshold` node reduces the data (`Data`), which is always valid and never looser.

use crate::monotone::Verdict;
use crate::tiles::tiles_for;
use crate::{Explanation, PassContext, PassError, PassOptions};
use foxc_ir::check::infer;
use foxc_ir::{Dim, Graph, NormBound, Op, ValueId, ValueType};

/// `max|x_i|` without reading data, when `x` is a positional rmsnorm of a weight with a
/// declared range and a constant feature size.
fn static_norm(g: &Graph, x: ValueId) -> Option<f64> {
    if !matches!(g.op(x), Op::RmsNorm { .. }) {
        return None;
    }
    let w = g.operands(x)[1];
    let p = g.params.iter().find(|p| p.node == w)?;
    let (lo, hi) = p.range?;
    let d = match g.ty(x).axes.last()?.dim {
        Dim::Const(d) => d as f64,
        _ => return None,
    };
    let m = lo.abs().max(hi.abs());
    m.is_finite().then_some(m * d.sqrt())
}

fn add(g: &mut Graph, op: Op, operands: &[ValueId], span: foxc_ir::Span) -> Result<ValueId, PassError> {
    let tys: Vec<ValueType> = operands.iter().map(|o| g.ty(*o).clone()).collect();
    let refs: Vec<&ValueType> = tys.iter().collect();
    let ty = infer(&op, &refs)
        .map_err(|e| PassError::Internal(format!("acp: {e}")))?
        .ok_or_else(|| PassError::Internal(format!("acp: cannot type {}", op.mnemonic())))?;
    Ok(g.add(op, ty, operands, span))
}

/// The ACP pass.
pub fn run(g: &mut Graph, opts: &PassOptions, cx: &mut PassContext) -> Result<(), PassError> {
    for n in g.find(|op| matches!(op, Op::DecayAttention(_))) {
        let Op::DecayAttention(attn) = *g.op(n) else { continue };
        let span = g.node(n).span;
        let verdict = cx.verdicts.get(&n).cloned().unwrap_or_else(|| crate::monotone::verdict(g, n));
        match verdict {
            Verdict::Decay(_) => {}
            Verdict::NoDecay => {
                cx.explanations.push(Explanation {
                    message: "not pruned: the attention has no decay bias, so no key tile falls below the threshold"
                        .into(),
                    span,
                    hint: attn
                        .window
                        .map(|_| "tiles entirely outside the window are skipped exactly by the kernel".to_string()),
                });
                continue;
            }
            // The monotonicity pass already explained it.
            Verdict::Unproven(..) => continue,
        }
        if !opts.prune {
            cx.explanations.push(Explanation {
                message: "not pruned: pruning is disabled (--no-prune)".into(),
                span,
                hint: None,
            });
            continue;
        }
        let ops = g.operands(n);
        let (q, k, v, c) = (ops[0], ops[1], ops[2], ops[3]);
        let head_dim = match g.ty(q).axes.get(3).map(|a| &a.dim) {
            Some(Dim::Const(d)) => Some(*d),
            _ => None,
        };
        let tiles = opts.tiles.unwrap_or_else(|| tiles_for(opts.target, head_dim));
        let bound = match (static_norm(g, q), static_norm(g, k)) {
            (Some(q_max), Some(k_max)) => NormBound::Static { q_max, k_max },
            _ => NormBound::Data,
        };
        let th =
            Op::Threshold { rule: opts.rule, log_eps: opts.log_eps, bound, scale: attn.scale, bm: tiles.bm };
        let delta = add(g, th, &[q, k], span)?;
        let start = add(g, Op::BlockBoundary(tiles), &[c, delta], span)?;
        let pruned = add(g, Op::PrunedDecayAttention { attn, tiles }, &[q, k, v, c, start], span)?;
        g.node_mut(pruned).name = g.node(n).name.clone();
        g.replace_all_uses(n, pruned);
        g.remove_dead();
    }
    Ok(())
}
