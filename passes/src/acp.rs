//! ACP insertion: a dense `attention` with a proven decay becomes
//! `threshold -> block_boundary -> attention {pruned}` (docs/SEMANTICS.md).
//!
//! The threshold needs `U >= max |R(x, ...)|` over the attention's score region `R`: the
//! region's interval analysis ([`crate::recognize::bound`]) gives it statically (softcapping:
//! `U = a`) or as `gain * X + extra` with `X = |scale| Qmax Kmax`. The bound on `max|q_i|`,
//! `max|k_j|`: with QK-norm, `|rmsnorm(x, w)_i| <= max|w| sqrt(D)` (each normalized row has mean
//! square 1, before the weight). `max|w|` is data unless the weight parameter declares a range
//! (`w: f32[D] in [lo, hi]` gives `max|w| <= max(|lo|, |hi|)`) and `D` is a constant of the
//! signature; only then is the norm bound `Static`. Otherwise the `threshold` node reduces the
//! data (`Data`), which is always valid and never looser. What has no bound stays dense, with an
//! explanation at the attention's source span.

use crate::monotone::Verdict;
use crate::{PassContext, PassError, PassOptions};
use foxc_ir::check::infer;
use foxc_ir::{Attention, Dim, Graph, NormBound, Op, Prune, ThresholdPlan, ValueId, ValueType};

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

/// The threshold's norm bound: the program's own (QK-norm) and the caller's promise, the
/// tighter of the two per side where both hold; the data's norms unless both sides are bounded.
fn norm_bound(q: Option<f64>, k: Option<f64>, given: Option<(f64, f64)>) -> NormBound {
    let tighter = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    match (tighter(q, given.map(|g| g.0)), tighter(k, given.map(|g| g.1))) {
        (Some(q_max), Some(k_max)) => NormBound::Static { q_max, k_max },
        _ => NormBound::Data,
    }
}

fn add(g: &mut Graph, op: Op, operands: &[ValueId], span: foxc_ir::Span) -> Result<ValueId, PassError> {
    let tys: Vec<ValueType> = operands.iter().map(|o| g.ty(*o).clone()).collect();
    let refs: Vec<&ValueType> = tys.iter().collect();
    let ty = infer(&op, &refs)
        .map_err(|e| PassError::Internal(format!("acp: {e}")))?
        .ok_or_else(|| PassError::Internal(format!("acp: cannot type {}", op.mnemonic())))?;
    Ok(g.add(op, ty, operands, span))
}

/// Add an attention node (both results typed by the op's rule).
pub(crate) fn add_attention(
    g: &mut Graph,
    a: Attention,
    operands: &[ValueId],
    span: foxc_ir::Span,
) -> Result<ValueId, PassError> {
    g.add_attention(a, operands, span).map_err(|e| PassError::Internal(format!("attention: {e}")))
}

/// The most key tiles a row may keep for a GPU to prune it when the threshold reads the norms
/// from the data. That pass reads every key's norm; a window of two tiles leaves pruning less
/// to save than it costs: on an H100 a prefill of N = 1024 against M = 8192 keys in a 256-key
/// window took 0.203 ms pruned and 0.106 ms dense, while a 1024-key window (8 tiles) gained
/// 6% pruned (BENCHMARKS.md, "Padding, windows, sinks, ALiBi and a cache's decay on the GPU").
pub const NARROW_KEY_TILES: u32 = 2;

/// On a GPU whose threshold reads the norms from the data, the most keys a row of `attn` keeps
/// where that is at most [`NARROW_KEY_TILES`] key tiles: its window, or its key bound's
/// distance to the diagonal ([`crate::key_bound::Diagonal::keys_at_most`]; one more key is
/// allowed, as a bound read from `j > E` is `E` itself: `i + M - N - j < 256` keeps 256 keys and
/// bounds 257).
fn narrow_on_a_gpu(
    g: &Graph,
    attn: &Attention,
    ops: &foxc_ir::attention::AttnOperands,
    bound: &NormBound,
    tiles: foxc_ir::Tiles,
    opts: &PassOptions,
) -> Option<f64> {
    if !opts.target.is_gpu() || *bound != NormBound::Data {
        return None;
    }
    let window = match attn.mask {
        foxc_ir::Mask::Window(w) => Some(w as f64),
        _ => None,
    };
    let diagonal = crate::key_bound::Diagonal::of(g, ops.q, ops.k);
    let bounded = attn.keys_from.as_ref().and_then(|e| diagonal.keys_at_most(e));
    let keys = [window, bounded].into_iter().flatten().reduce(f64::min)?;
    (keys <= f64::from(NARROW_KEY_TILES * tiles.bn) + 1.0).then_some(keys)
}

/// The ACP pass.
pub fn run(g: &mut Graph, opts: &PassOptions, cx: &mut PassContext) -> Result<(), PassError> {
    for n in g.find(|op| matches!(op, Op::Attention(a) if a.prune == Prune::Dense)) {
        let Op::Attention(attn) = g.op(n).clone() else { continue };
        let span = g.node(n).span;
        let verdict = cx.verdicts.get(&n).cloned().unwrap_or_else(|| crate::monotone::verdict(g, n));
        let explain =
            |cx: &mut PassContext, message: String, hint: Option<String>| cx.explain(message, span, hint);
        match verdict {
            Verdict::Decay(_) => {}
            Verdict::NoDecay => {
                let hint = matches!(attn.mask, foxc_ir::Mask::Window(_)).then(|| {
                    "tiles entirely outside the window are skipped exactly by the kernel".to_string()
                });
                explain(
                    cx,
                    "not pruned: the attention has no decay bias, so no key tile falls below the threshold"
                        .into(),
                    hint,
                );
                continue;
            }
            // The monotonicity pass already explained it.
            Verdict::Unproven(..) => continue,
        }
        if !opts.prune {
            explain(cx, "not pruned: pruning is disabled (--no-prune)".into(), None);
            continue;
        }
        if !attn.mask.is_causal() {
            // Recognition already explained a missing mask at the softmax.
            if matches!(attn.mask, foxc_ir::Mask::None) {
                continue;
            }
            explain(
                cx,
                "not pruned: ACP's tile rule needs a causal (or sliding-window) mask, so that the diagonal bounds each row"
                    .into(),
                None,
            );
            continue;
        }
        let score = match crate::recognize::bound::attention_bound(g, n) {
            Ok(b) => b,
            Err(why) => {
                // At the term that grows, where recognition recorded its source.
                let at = why.term.and_then(|t| cx.region_spans.get(&n)?.get(t as usize).copied());
                let message = format!("not pruned: {why}");
                cx.explain(message, at.unwrap_or(span), None);
                continue;
            }
        };
        let Some(tiles) = attn.tiles else {
            return Err(PassError::Internal("acp: the tiles pass did not set the attention's tiles".into()));
        };
        let ops = Attention::operands(g, n).map_err(PassError::Internal)?;
        let c = ops.decay.ok_or_else(|| PassError::Internal("acp: decay verdict without c".into()))?;
        let bound = norm_bound(static_norm(g, ops.q), static_norm(g, ops.k), opts.norm_bounds);
        if let Some(keys) = narrow_on_a_gpu(g, &attn, &ops, &bound, tiles, opts) {
            explain(
                cx,
                format!(
                    "not pruned: each row's keys lie among the {keys} up to its diagonal (a window of {NARROW_KEY_TILES} key \
                     tiles of {}), and on a GPU the threshold's pass over every key's norm costs more than pruning them \
                     can save",
                    tiles.bn
                ),
                Some("bounds on q's and k's norms (QK-norm, or a KV cache's checked bounds) take that pass away".into()),
            );
            continue;
        }
        // A rule reading the diagonal logit s_ii = scale q_i . k_i fits the identity score only
        // (a bound of its size, and a region whose diagonal entry is x itself); other regions
        // fall back to the default rule (which reads no row statistic).
        // A GPU's threshold of queries fewer than keys folds whole key tiles: it has no k_causal
        // (the keys up to each tile's last query position).
        let gpu_fewer = opts.target.is_gpu() && ops.fewer_queries(g);
        let no_k_causal =
            gpu_fewer && opts.rule.formula.stats_under(&score).contains(&foxc_ir::prune_rule::Stat::KCausal);
        let reads_sii = opts.rule.formula.uses(foxc_ir::prune_rule::Stat::Sii);
        let sii_is_diagonal =
            !reads_sii || crate::key_bound::Diagonal::of(g, ops.q, ops.k).is_score(&attn.score);
        let fits = opts.rule.fits(&score) && sii_is_diagonal && !no_k_causal;
        if no_k_causal {
            explain(
                cx,
                format!(
                    "the rule `{}` reads k_causal, which the GPU's threshold of fewer queries than keys does not compute; `{}` used",
                    opts.rule.name,
                    crate::rules::RULES[0].name
                ),
                None,
            );
        } else if !fits {
            explain(
                cx,
                format!(
                    "the rule `{}` needs the identity score; `{}` used",
                    opts.rule.name,
                    crate::rules::RULES[0].name
                ),
                None,
            );
        }
        let rule = if fits { opts.rule.clone() } else { crate::rules::default_rule() };
        if rule.reads_given() {
            explain(
                cx,
                format!(
                    "pruned with thresholds given per head by the user: rule = {rule} (the user's choice, not a safety proof: the pruned mass per row is not bounded by eps)"
                ),
                None,
            );
        }
        let th = Op::Threshold {
            rule,
            log_eps: opts.log_eps,
            bound,
            score,
            scale: attn.scale.clone(),
            bm: tiles.bm,
            // `fuse-threshold` decides (GPU targets).
            plan: ThresholdPlan::NormsThenDelta,
        };
        let delta = add(g, th, &[ops.q, ops.k], span)?;
        let start = add(g, Op::BlockBoundary(tiles), &[c, delta], span)?;
        let mut pa = attn.clone();
        pa.prune = Prune::Start;
        let mut po = ops.clone();
        po.start = Some(start);
        let pruned = add_attention(g, pa, &po.to_vec(), span)?;
        g.node_mut(pruned).name = g.node(n).name.clone();
        g.replace_all_uses(n, pruned);
        g.remove_dead();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn norm_bound_takes_the_tighter_side_and_needs_both() {
        let s = |q_max, k_max| NormBound::Static { q_max, k_max };
        assert_eq!(norm_bound(None, None, None), NormBound::Data);
        assert_eq!(norm_bound(Some(8.0), None, None), NormBound::Data);
        assert_eq!(norm_bound(None, None, Some((3.0, 4.0))), s(3.0, 4.0));
        assert_eq!(norm_bound(Some(8.0), Some(2.0), Some((3.0, 4.0))), s(3.0, 2.0));
        assert_eq!(norm_bound(Some(8.0), None, Some((9.0, 4.0))), s(8.0, 4.0));
    }
}
