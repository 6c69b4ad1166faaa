//! `fold-q-scale` (GPU targets): an `attention` or `threshold` whose q operand is `x * s`,
//! `s * x` or `x / s`, with `s` a compile-time scalar, reads `x` instead, and its `scale`
//! attribute carries the factor (`s`, or `1 / s` for a quotient) as its q factor
//! ([`foxc_ir::Scale::q`], docs/SEMANTICS.md): no kernel writes the scaled queries.
//!
//! Recognition puts every scale it can spell (`c`, `c / sqrt(D)`) into the attribute and
//! multiplies q by any other (`/ D`, `/ sqrt(2 * D)`). The GPU kernels take any f32 scale, so on
//! a GPU target that product needs no launch of its own. The CPU target keeps the product: its
//! kernels round it to f32 before applying their own scale, and folding would move their bits.
//!
//! Which products: `x` has the product's axes, names included (a product that also broadcasts
//! or transposes is not a scaling); `s` is a scalar of constants, dims and elementwise ops; every
//! user of the product reads it as its q (operand 0) and nothing else; it is not the output. A
//! dim that `s` reads must be bound in the options (then it enters the factor as its number) or
//! be the head dim of `x`: the GPU kernels are specialized on that one, so code generation can
//! always evaluate the factor. A factor whose bound value is 0 or not finite stays a product.
//! One sweep in topological order: a product of a product keeps its inner product (it is not
//! read as q). Code generation evaluates the factor with `foxc_ir::fold`'s arithmetic, so the
//! kernels get the number they got when code generation folded the product itself.

use crate::{PassContext, PassError, PassOptions};
use foxc_ir::{BinaryOp, Graph, Op, RId, RNode, Region, ValueId};
use std::collections::{BTreeMap, HashMap};

/// The `fold-q-scale` pass.
pub fn run(g: &mut Graph, opts: &PassOptions, _cx: &mut PassContext) -> Result<(), PassError> {
    let mut folded = false;
    for n in g.topo_order() {
        let Some((x, q)) = foldable(g, n, &opts.dims) else { continue };
        for u in g.users(n) {
            match &mut g.node_mut(u).op {
                Op::Attention(a) => a.scale.q = Some(q.clone()),
                Op::Threshold { scale, .. } => scale.q = Some(q.clone()),
                op => return Err(PassError::Internal(format!("fold-q-scale: a {} reads q", op.mnemonic()))),
            }
        }
        g.replace_all_uses(n, x);
        folded = true;
    }
    if folded {
        g.remove_dead();
    }
    Ok(())
}

/// Product `n` as `(x, factor)` when the pass folds it (see the module doc).
fn foldable(g: &Graph, n: ValueId, dims: &BTreeMap<String, u64>) -> Option<(ValueId, Region)> {
    let (x, s, quotient) = scaling(g, n)?;
    let users = g.users(n);
    let reads_q = |u: &ValueId| {
        matches!(g.op(*u), Op::Attention(_) | Op::Threshold { .. })
            && g.operands(*u).iter().enumerate().all(|(i, &o)| o != n || i == 0)
    };
    if g.output == Some(n) || users.is_empty() || !users.iter().all(reads_q) {
        return None;
    }
    let head: Vec<&str> = g.ty(n).dims().last().map(|d| d.symbols()).unwrap_or_default();
    let mut r = Region::new();
    let root = copy_scalar(g, s, &Bind { dims, head: &head }, &mut r, &mut HashMap::new())?;
    r.root = root;
    if quotient {
        let one = r.push(RNode::Const(1.0));
        r.push(RNode::Binary(BinaryOp::Div, one, root));
    }
    // Every dim bound: the number code generation will use, which must be a usable factor.
    if let Some(v) = r.scalar_value(&|_| None) {
        if !v.is_finite() || v == 0.0 {
            return None;
        }
    }
    r.malformed().is_none().then_some((x, r))
}

/// `n` as a scaling `(x, s, quotient)`: `x * s`, `s * x` or (`quotient`) `x / s`, with `x` of
/// `n`'s axes and `s` of rank 0.
fn scaling(g: &Graph, n: ValueId) -> Option<(ValueId, ValueId, bool)> {
    let ops = g.operand_values(n);
    if ops.len() != 2 || g.ty(n).rank() == 0 || ops.iter().any(|v| v.result != 0) {
        return None;
    }
    let (a, b) = (ops[0].node, ops[1].node);
    let rank0 = |v: ValueId| g.ty(v).rank() == 0;
    let same_axes = |v: ValueId| g.ty(v).axes == g.ty(n).axes;
    match g.op(n) {
        Op::Binary(BinaryOp::Mul) if rank0(b) && same_axes(a) => Some((a, b, false)),
        Op::Binary(BinaryOp::Mul) if rank0(a) && same_axes(b) => Some((b, a, false)),
        Op::Binary(BinaryOp::Div) if rank0(b) && same_axes(a) => Some((a, b, true)),
        _ => None,
    }
}

/// What a factor's dims may be: bound ones (by their number) and the head dim's symbols.
struct Bind<'a> {
    dims: &'a BTreeMap<String, u64>,
    head: &'a [&'a str],
}

/// Appends the scalar subgraph of `v` to `r` (each node once, `memo`); `None` when a node is not
/// a rank-0 constant, dim, unary or non-comparison binary op (the ops `foxc_ir::fold` folds),
/// or reads a dim that is neither bound nor the head dim.
fn copy_scalar(
    g: &Graph,
    v: ValueId,
    bind: &Bind,
    r: &mut Region,
    memo: &mut HashMap<ValueId, RId>,
) -> Option<RId> {
    if let Some(&id) = memo.get(&v) {
        return Some(id);
    }
    if g.ty(v).rank() != 0 || g.operand_values(v).iter().any(|o| o.result != 0) {
        return None;
    }
    let ops = g.operands(v);
    let node = match g.op(v) {
        Op::Const(c) => RNode::Const(*c),
        Op::DimSize(d) => match d.eval(&|s| bind.dims.get(s).copied()) {
            Some(x) => RNode::Const(x as f64),
            None if d.symbols().iter().all(|s| bind.head.contains(s)) => RNode::Dim(d.clone()),
            None => return None,
        },
        Op::Unary(u) => RNode::Unary(*u, copy_scalar(g, ops[0], bind, r, memo)?),
        Op::Binary(b) if !b.is_comparison() => {
            let x = copy_scalar(g, ops[0], bind, r, memo)?;
            let y = copy_scalar(g, ops[1], bind, r, memo)?;
            RNode::Binary(*b, x, y)
        }
        _ => return None,
    };
    let id = r.push(node);
    memo.insert(v, id);
    Some(id)
}
