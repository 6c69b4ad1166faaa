//! Decisions the backends used to make by matching IR shapes, made once here as attributes:
//!
//! - `fuse-output-cast`: an attention whose output's only user is a `cast` to another float
//!   dtype writes that dtype itself (`out_dtype`); the cast disappears. A statement's `store`
//!   whose only user is a `cast` (an output gate's result cast to bf16) stores the cast of its
//!   value instead (the same elements: a cast is elementwise), so that `fuse-loops` computes the
//!   cast in the store's loop.
//! - `fuse-boundary` (GPU targets): a pruned attention whose `start` is a `block_boundary` of its
//!   own `c` reads the threshold `delta` instead and finds `start[m]` itself (a binary search
//!   over the monotone `c`, the same value: docs/SEMANTICS.md), saving a launch.
//! - `fuse-threshold` (GPU targets): a threshold whose formula reads tile norms only is one
//!   launch (`plan = one_launch`): the norms, then each head's last block evaluates the formula
//!   (docs/GPU_KERNEL.md).
//! - `fuse-prelude` (GPU targets): such an attention whose `c` is the scan of a gate and whose
//!   `delta` is a one-launch threshold, each read by it alone, gets both from one
//!   launch (`prelude = joint`): the plan becomes a chain of two launches, as the dense
//!   attention's, instead of a fork into two lanes and a join (docs/GPU_KERNEL.md).
//!   When the rows are known to be longer than [`SPLIT_ROWS_ABOVE`] (T bound, or a lower bound
//!   of it in `dims_at_least`), the launch splits them over blocks (`prelude = joint(split
//!   rows)`).

use crate::acp::add_attention;
use crate::{PassContext, PassError, PassOptions};
use foxc_ir::{
    Attention, Dim, GateKind, Graph, NormBound, Op, Prelude, Prune, PruneRule, ScoreBound, ThresholdPlan,
};
use std::collections::BTreeMap;

/// The `fuse-output-cast` pass.
pub fn output_cast(g: &mut Graph, _opts: &PassOptions, _cx: &mut PassContext) -> Result<(), PassError> {
    for n in g.find(|op| matches!(op, Op::Attention(_))) {
        let users = g.users(n);
        let [u] = users[..] else { continue };
        let only_out = g.operand_values(u).iter().all(|v| v.node != n || v.result == 0)
            && g.g.edges_directed(n, petgraph::Direction::Outgoing).count() == 1;
        let to = g.ty(u).dtype;
        if !matches!(g.op(u), Op::Cast) || !only_out || !to.is_float() || g.ty(u).axes != g.ty(n).axes {
            continue;
        }
        let name = g.node(u).name.clone().or_else(|| g.node(n).name.clone());
        let node = g.node_mut(n);
        if let Op::Attention(a) = &mut node.op {
            a.out_dtype = to;
        }
        node.ty.dtype = to;
        node.name = name;
        g.replace_all_uses(u, n);
        g.remove_dead();
    }
    for n in g.find(|op| matches!(op, Op::Store { .. })) {
        let users = g.users(n);
        let [u] = users[..] else { continue };
        let once = g.g.edges_directed(n, petgraph::Direction::Outgoing).count() == 1;
        if !matches!(g.op(u), Op::Cast) || !once || g.ty(u).axes != g.ty(n).axes || Some(n) == g.output {
            continue;
        }
        let Op::Store { axes } = g.op(n).clone() else { continue };
        let x = g.operand_values(n)[0];
        let mut cast_ty = g.value_ty(x).clone();
        cast_ty.dtype = g.ty(u).dtype;
        let span = g.node(u).span;
        let cast = g.add_multi(Op::Cast, vec![cast_ty], &[x], span);
        let store = g.add(Op::Store { axes }, g.ty(u).clone(), &[cast], g.node(n).span);
        g.node_mut(store).name = g.node(u).name.clone().or_else(|| g.node(n).name.clone());
        g.replace_all_uses(u, store);
        g.remove_dead();
    }
    Ok(())
}

/// The `fuse-boundary` pass (GPU targets only).
pub fn boundary(g: &mut Graph, _opts: &PassOptions, _cx: &mut PassContext) -> Result<(), PassError> {
    for n in g.find(|op| matches!(op, Op::Attention(a) if a.prune == Prune::Start)) {
        let Op::Attention(a) = g.op(n).clone() else { continue };
        let ops = Attention::operands(g, n).map_err(PassError::Internal)?;
        let Some(start) = ops.start else { continue };
        let Op::BlockBoundary(t) = g.op(start) else { continue };
        let bops = g.operands(start);
        if Some(*t) != a.tiles || Some(bops[0]) != ops.decay {
            continue;
        }
        let mut fa = a.clone();
        fa.prune = Prune::Boundary;
        let mut fo = ops.clone();
        fo.start = None;
        fo.delta = Some(bops[1]);
        let span = g.node(n).span;
        let f = add_attention(g, fa, &fo.to_vec(), span)?;
        g.node_mut(f).name = g.node(n).name.clone();
        g.replace_all_uses(n, f);
        g.remove_dead();
    }
    Ok(())
}

/// How a threshold of `rule` under `score` and `bound` is launched on a GPU: in one launch
/// where the formula reads the tile norms and nothing of the rows
/// ([`PruneRule::norms_only`]).
pub fn threshold_plan(rule: &PruneRule, score: &ScoreBound, bound: NormBound) -> ThresholdPlan {
    if rule.norms_only(score, bound == NormBound::Data) {
        ThresholdPlan::OneLaunch
    } else {
        ThresholdPlan::NormsThenDelta
    }
}

/// The `fuse-threshold` pass (GPU targets only): [`threshold_plan`] on every threshold.
pub fn threshold(g: &mut Graph, _opts: &PassOptions, _cx: &mut PassContext) -> Result<(), PassError> {
    for n in g.find(|op| matches!(op, Op::Threshold { .. })) {
        // The one-launch threshold takes q and k tiles of one length (and so the joint prelude).
        let ops = g.operands(n);
        if foxc_ir::attention::fewer_queries(g, ops[0], ops[1]) {
            continue;
        }
        if let Op::Threshold { rule, score, bound, plan, .. } = &mut g.node_mut(n).op {
            *plan = threshold_plan(rule, score, *bound);
        }
    }
    Ok(())
}

/// Rows (T) above this length get `prelude = joint(split rows)` when T is bound at compile time,
/// and a gate scan outside a joint prelude `split rows` (two launches, a block per segment).
/// The joint launch's block walks a row's 8192-element segments one after another; split, each
/// segment has its own block. Measured faster on the H200 above 8192 and slower at T <= 8192,
/// where a row is one segment and there is nothing to split. With T unknown the rows stay whole,
/// unless the caller guarantees more (`dims_at_least`: the Python op, see [`split_rows_bounds`]).
pub const SPLIT_ROWS_ABOVE: u64 = 8192;

/// The rows' length where the caller bound it, else the lower bound it guarantees where the
/// rows are one plain dim (a quotient's bound says nothing of the quotient).
fn rows_at_least(rows: &Dim, opts: &PassOptions) -> Option<u64> {
    rows.eval(&|s| opts.dims.get(s).copied()).or_else(|| match rows {
        Dim::Sym(t) => opts.dims_at_least.get(t).copied(),
        _ => None,
    })
}

/// The lower bounds under which `fuse-prelude` splits the rows of `g` (a graph optimized
/// without them) at the lengths `len` gives: `T > SPLIT_ROWS_ABOVE` for each joint prelude or
/// gate scan whose rows are a plain dim `T` that `len` puts above it; empty where none is. A caller that
/// compiles once per class of shapes (the Python op: T unbound) keys its plans on it and passes
/// it as [`PassOptions::dims_at_least`], so long rows get the split kernel and short ones the
/// whole-row kernel, each where it was measured faster.
pub fn split_rows_bounds(g: &Graph, len: &dyn Fn(&str) -> Option<u64>) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let mut rows: Vec<Option<&Dim>> = vec![];
    for n in g.find(|op| matches!(op, Op::Attention(a) if a.prelude.is_joint())) {
        let Ok(ops) = Attention::operands(g, n) else { continue };
        rows.push(g.ty(ops.q).axes.get(2).map(|ax| &ax.dim));
    }
    rows.extend(g.find(splittable_scan).into_iter().map(|n| g.ty(n).axes.get(2).map(|ax| &ax.dim)));
    for t in rows.into_iter().flatten() {
        if let Dim::Sym(t) = t {
            if len(t).is_some_and(|v| v > SPLIT_ROWS_ABOVE) {
                out.insert(t.clone(), SPLIT_ROWS_ABOVE + 1);
            }
        }
    }
    out
}

/// A gate scan (logits or log gates: a slope's cumsum has no scan).
fn splittable_scan(op: &Op) -> bool {
    matches!(op, Op::GateCumsum { kind, .. } if *kind != GateKind::Slope)
}

/// The `fuse-prelude` pass (GPU targets only).
pub fn prelude(g: &mut Graph, opts: &PassOptions, _cx: &mut PassContext) -> Result<(), PassError> {
    for n in g.find(|op| matches!(op, Op::Attention(a) if a.prune == Prune::Boundary)) {
        let ops = Attention::operands(g, n).map_err(PassError::Internal)?;
        let (Some(c), Some(delta)) = (ops.decay, ops.delta) else { continue };
        let scan = matches!(g.op(c), Op::GateCumsum { kind, .. } if *kind != GateKind::Slope);
        let one_launch = matches!(g.op(delta), Op::Threshold { plan: ThresholdPlan::OneLaunch, .. });
        let only_here = |v| g.users(v) == [n];
        if scan && one_launch && only_here(c) && only_here(delta) {
            let rows = g.ty(ops.q).axes.get(2).and_then(|ax| rows_at_least(&ax.dim, opts));
            let long = rows.is_some_and(|t| t > SPLIT_ROWS_ABOVE);
            if let Op::Attention(a) = &mut g.node_mut(n).op {
                a.prelude = if long { Prelude::JointSplitRows } else { Prelude::Joint };
            }
        }
    }
    // A gate scan of long rows that no joint prelude runs: a block per segment (a decode step
    // scans B H rows of its whole cache, fewer rows than the chip has multiprocessors).
    for n in g.find(splittable_scan) {
        let joint = g.users(n).iter().any(|&u| matches!(g.op(u), Op::Attention(a) if a.prelude.is_joint()));
        let rows = g.ty(n).axes.get(2).and_then(|ax| rows_at_least(&ax.dim, opts));
        if !joint && rows.is_some_and(|t| t > SPLIT_ROWS_ABOVE) {
            if let Op::GateCumsum { split_rows, .. } = &mut g.node_mut(n).op {
                *split_rows = true;
            }
        }
    }
    Ok(())
}
