//! The graph verifier, run after lowering and after every pass.
//!
//! Checks: the output is set and present; parameters and their nodes agree; every edge weight is
//! an operand position and the positions of a node are exactly `0..arity`; the graph is acyclic;
//! every node's type is the one [`crate::check::infer`] derives from its operands (which covers
//! named-axis broadcasting, reductions, `bind`/`store` axis counts, dtypes and the fused ops'
//! shapes of docs/SEMANTICS.md), with the node-typed ops (`param`, `iota`, `cast`) checked here;
//! a `sum {contract}` reads a `mul` that nothing else uses and that is not the output.

use crate::check::infer;
use crate::graph::{Graph, ValueId};
use crate::ops::{BinaryOp, GateKind, Op, ReduceKind};
use crate::print::print_graph;
use crate::types::{DType, ValueType};
use petgraph::visit::EdgeRef;
use petgraph::Direction;
use std::fmt;

/// Why a graph is malformed: the offending node (if any) and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifyError {
    /// The node, as its mnemonic and the DSL name if it has one (`store [b, h, t] (c)`).
    pub node: Option<String>,
    pub message: String,
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.node {
            Some(n) => write!(f, "invalid IR at `{n}`: {}", self.message),
            None => write!(f, "invalid IR: {}", self.message),
        }
    }
}

impl std::error::Error for VerifyError {}

fn describe(g: &Graph, id: ValueId) -> String {
    let n = g.node(id);
    match &n.name {
        Some(name) => format!("{} : {} ({name})", n.op, n.ty),
        None => format!("{} : {}", n.op, n.ty),
    }
}

fn err(g: &Graph, id: ValueId, message: String) -> VerifyError {
    VerifyError { node: Some(describe(g, id)), message }
}

/// Check that `g` is a well-formed, well-typed graph.
pub fn verify(g: &Graph) -> Result<(), VerifyError> {
    let global = |m: String| VerifyError { node: None, message: m };
    let out = g.output.ok_or_else(|| global("the graph has no output".into()))?;
    if !g.g.contains_node(out) {
        return Err(global("the output is not a node of the graph".into()));
    }
    for (n, p) in g.params.iter().enumerate() {
        if !g.g.contains_node(p.node) {
            return Err(global(format!("parameter `{}` has no node", p.name)));
        }
        match g.op(p.node) {
            Op::Param { name, index } if *name == p.name && *index == n => {}
            _ => return Err(err(g, p.node, format!("is not the node of parameter #{n} `{}`", p.name))),
        }
        if *g.ty(p.node) != p.ty {
            return Err(err(g, p.node, format!("type differs from parameter `{}`: {}", p.name, p.ty)));
        }
        if !p.ty.is_positional() {
            return Err(err(g, p.node, "parameters must have positional axes".into()));
        }
        if p.storage.is_some_and(|s| s != DType::I64 || p.ty.dtype != DType::I32) {
            return Err(err(g, p.node, format!("is stored as {} but typed {}", p.stored(), p.ty)));
        }
        if let Some((lo, hi)) = p.range {
            if lo.is_nan() || hi.is_nan() || lo > hi {
                return Err(err(g, p.node, format!("empty declared range [{lo}, {hi}]")));
            }
        }
        if let Some(axis) = p.nonincreasing {
            if axis >= p.ty.rank() || !p.ty.dtype.is_float() {
                return Err(err(g, p.node, format!("declared nonincreasing along axis {axis} of {}", p.ty)));
            }
        }
    }
    let order = g.topo_order();
    if order.len() != g.g.node_count() {
        return Err(global("the graph has a cycle".into()));
    }
    for &id in &order {
        let node = g.node(id);
        // Operand positions: exactly 0..n, each once.
        let mut ks: Vec<u32> = g.g.edges_directed(id, Direction::Incoming).map(|e| e.weight().pos).collect();
        ks.sort_unstable();
        if ks.iter().enumerate().any(|(i, &k)| k as usize != i) {
            return Err(err(g, id, format!("operand positions {ks:?} are not 0..{}", ks.len())));
        }
        if let Some(n) = node.op.arity() {
            if ks.len() != n {
                return Err(err(
                    g,
                    id,
                    format!("has {} operands, `{}` takes {n}", ks.len(), node.op.mnemonic()),
                ));
            }
        }
        // i64 is a storage dtype of parameters, never a value's.
        if std::iter::once(&node.ty).chain(&node.more).any(|t| t.dtype == DType::I64) {
            return Err(err(g, id, "has an i64 value (i64 is only a parameter's storage)".into()));
        }
        // Every operand names an existing result of its node.
        for o in g.operand_values(id) {
            if o.result as usize >= g.result_count(o.node) {
                return Err(err(
                    g,
                    id,
                    format!("uses result {} of a node with {} result(s)", o.result, g.result_count(o.node)),
                ));
            }
        }
        if node.inline {
            check_inline(g, id, out).map_err(|m| err(g, id, m))?;
        }
        if matches!(node.op, Op::GateCumsum { kind: GateKind::Slope, split_rows: true }) {
            return Err(err(g, id, "a slope's gate_cumsum has no scan to split".into()));
        }
        // Results beyond 0: only attention has them, and they must be its `lse`.
        match &node.op {
            Op::Attention(a) => {
                let tys: Vec<&ValueType> = g.operand_values(id).iter().map(|&v| g.value_ty(v)).collect();
                let want = a.result_types(&tys).map_err(|m| err(g, id, m))?;
                if node.more[..] != want[1..] {
                    let w: Vec<String> = want.iter().map(|t| t.to_string()).collect();
                    return Err(err(g, id, format!("result types should be {}", w.join(", "))));
                }
            }
            Op::AttentionBackward(a) => {
                let tys: Vec<&ValueType> = g.operand_values(id).iter().map(|&v| g.value_ty(v)).collect();
                let want = a.backward_result_types(&tys).map_err(|m| err(g, id, m))?;
                if node.more[..] != want[1..] {
                    let w: Vec<String> = want.iter().map(|t| t.to_string()).collect();
                    return Err(err(g, id, format!("result types should be {}", w.join(", "))));
                }
            }
            _ if !node.more.is_empty() => {
                return Err(err(
                    g,
                    id,
                    format!("`{}` has one result, not {}", node.op.mnemonic(), 1 + node.more.len()),
                ))
            }
            _ => {}
        }
        if let Op::Reduce { kind, contract: true, .. } = &node.op {
            check_contract(g, id, *kind).map_err(|m| err(g, id, m))?;
        }
        let tys: Vec<&ValueType> = g.operand_values(id).iter().map(|&v| g.value_ty(v)).collect();
        let inferred = infer(&node.op, &tys).map_err(|m| err(g, id, m))?;
        match (&node.op, inferred) {
            (_, Some(t)) => {
                if t != node.ty {
                    return Err(err(g, id, format!("type should be {t}")));
                }
            }
            (Op::Param { name, index }, None) => match g.params.get(*index) {
                Some(p) if p.node == id && p.name == *name => {}
                _ => return Err(err(g, id, format!("not registered as parameter #{index}"))),
            },
            (Op::Iota { axis }, None) => {
                let ok = node.ty.dtype == DType::F32 && node.ty.rank() == 1 && node.ty.axes[0].name == *axis;
                if !ok {
                    return Err(err(g, id, format!("iota must be f32 with the single axis `{axis}`")));
                }
            }
            (Op::Gather { index, axes }, None) => {
                if let Err(m) = check_gather(index, axes, tys[0], &node.ty) {
                    return Err(err(g, id, m));
                }
            }
            (Op::Cast, None) => {
                if node.ty.axes != tys[0].axes {
                    return Err(err(g, id, format!("cast changes the axes of {}", tys[0])));
                }
                if node.ty.dtype == DType::Bool || tys[0].dtype == DType::Bool {
                    return Err(err(g, id, "cast from or to bool".into()));
                }
            }
            (
                Op::GateCumsum { kind: GateKind::Slope, .. } | Op::GateCumsumLo { kind: GateKind::Slope },
                None,
            ) => {
                let ok = node.ty.dtype == DType::F32
                    && node.ty.is_positional()
                    && node.ty.rank() == 3
                    && node.ty.axes[1].dim == tys[0].axes[0].dim;
                if !ok {
                    return Err(err(g, id, format!("gate_cumsum of slope {} must be f32 [B, H, T]", tys[0])));
                }
            }
            (Op::LoadMap { f }, None) => check_load_map(g, id, f, &tys).map_err(|m| err(g, id, m))?,
            (op, None) => return Err(err(g, id, format!("no typing rule for `{}`", op.mnemonic()))),
        }
    }
    Ok(())
}

/// A contracting reduction `id`: a sum whose operand is a `mul` it alone uses (a backend reads
/// the mul's operands and never writes the product, so nothing else may read it).
fn check_contract(g: &Graph, id: ValueId, kind: ReduceKind) -> Result<(), String> {
    if kind != ReduceKind::Sum {
        return Err("only a sum contracts its operand".into());
    }
    let m = g.operand_values(id)[0];
    if !matches!(g.op(m.node), Op::Binary(BinaryOp::Mul)) {
        return Err(format!("contracts `{}`, not a mul", g.op(m.node).mnemonic()));
    }
    let uses = g.g.edges_directed(m.node, Direction::Outgoing).count();
    if uses != 1 || g.output == Some(m.node) {
        return Err("contracts a mul that is also used elsewhere (or is the output)".into());
    }
    Ok(())
}

/// Verify, and on failure append the printed graph (for pass debugging and internal errors).
pub fn verify_verbose(g: &Graph) -> Result<(), String> {
    verify(g).map_err(|e| format!("{e}\n{}", print_graph(g)))
}

/// An `inline` node: elementwise, not the output, not a scalar, and every use a read by name
/// in a loop (so that each user can compute it in place of a buffer it no longer has).
fn check_inline(g: &Graph, id: ValueId, out: ValueId) -> Result<(), String> {
    let node = g.node(id);
    if !node.op.is_elementwise() {
        return Err(format!(
            "inline `{}`: only elementwise ops are computed in their users' loops",
            node.op.mnemonic()
        ));
    }
    if id == out || node.ty.rank() == 0 {
        return Err("inline: the output and scalars keep a buffer".into());
    }
    for e in g.g.edges_directed(id, Direction::Outgoing) {
        let user = g.op(e.target());
        if !user.reads_by_name(e.weight().pos as usize) {
            return Err(format!(
                "inline: used as operand {} of `{}`, which reads a buffer",
                e.weight().pos,
                user.mnemonic()
            ));
        }
    }
    Ok(())
}

/// `gather`: a positional operand of rank `index.len()`; the result has exactly the named axes
/// `axes`, each the variable of some subscript and every subscript's variables among them; a
/// plain subscript `v` at position p gives `v` the operand's size at p; dtype kept.
fn check_gather(
    index: &[crate::index::IndexExpr],
    axes: &[String],
    x: &ValueType,
    ty: &ValueType,
) -> Result<(), String> {
    if !x.is_positional() || x.rank() != index.len() {
        return Err(format!("gather: {} subscripts for operand {x}", index.len()));
    }
    let names: Vec<&str> = ty.axes.iter().map(|a| a.name.as_str()).collect();
    if names != axes.iter().map(|a| a.as_str()).collect::<Vec<_>>() {
        return Err(format!("gather: result axes [{}] are not [{}]", names.join(", "), axes.join(", ")));
    }
    if ty.dtype != x.dtype {
        return Err(format!("gather: dtype {} differs from the operand's {}", ty.dtype, x.dtype));
    }
    for (n, a) in axes.iter().enumerate() {
        if axes[..n].contains(a) || a.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("gather: axis `{a}` repeated or positional"));
        }
        if !index.iter().any(|e| e.vars().contains(&a.as_str())) {
            return Err(format!("gather: axis `{a}` is used by no subscript"));
        }
    }
    for (p, e) in index.iter().enumerate() {
        for v in e.vars() {
            if !axes.iter().any(|a| a == v) {
                return Err(format!("gather: variable `{v}` of subscript `{e}` is not a result axis"));
            }
        }
        if let Some(v) = e.is_plain_var() {
            let d = ty.axis(v).map(|(_, a)| &a.dim);
            if d != Some(&x.axes[p].dim) {
                return Err(format!(
                    "gather: `{v}` indexes axis {p} of size {} with another size",
                    x.axes[p].dim
                ));
            }
        }
    }
    Ok(())
}

/// A `load_map`: a float `[B, H, T, D]` with operand 0 (its `x`) of that shape, its function
/// reading captures that exist, and read only as an attention's or a threshold's q (its readers
/// compute it as they load it: nothing else could read it).
fn check_load_map(
    g: &Graph,
    id: ValueId,
    f: &crate::attention::Region,
    tys: &[&ValueType],
) -> Result<(), String> {
    let ty = g.ty(id);
    let Some((x, caps)) = tys.split_first() else {
        return Err("a load_map reads at least its x".into());
    };
    if !ty.dtype.is_float() || !ty.is_positional() || ty.rank() != 4 {
        return Err(format!("a load_map is a float [B, H, T, D], not {ty}"));
    }
    if !x.dtype.is_float() || !x.is_positional() || x.dims().ne(ty.dims()) {
        return Err(format!("a load_map's x {x} does not have its shape {ty}"));
    }
    crate::attention_check::check_region_of("load_map", f, caps, "f")?;
    for e in g.g.edges_directed(id, Direction::Outgoing) {
        let reader = g.op(e.target());
        let q = e.weight().pos == 0;
        if !(q && matches!(reader, Op::Attention(_) | Op::Threshold { .. })) {
            return Err(format!(
                "a load_map is read as operand {} of a `{}`: only an attention's or a threshold's q loads through one",
                e.weight().pos,
                reader.mnemonic()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::{Attention, Mask, Prune, RNode, Region, Scale, ScoreBound};
    use crate::graph::Value;
    use crate::ops::{NormBound, PruneRule, ReduceKind, Tiles};
    use crate::types::{Axis, Dim, Span};
    use petgraph::visit::EdgeRef;

    fn bhtd() -> Vec<Dim> {
        ["B", "H", "T", "D"].iter().map(|s| Dim::sym(s)).collect()
    }

    fn t(dtype: DType, dims: Vec<Dim>) -> ValueType {
        ValueType::tensor(dtype, dims)
    }

    /// q, k, v, fgate parameters.
    fn params(g: &mut Graph) -> [ValueId; 4] {
        let sp = Span::default();
        let q = g.add_param("q", t(DType::BF16, bhtd()), sp);
        let k = g.add_param("k", t(DType::BF16, bhtd()), sp);
        let v = g.add_param("v", t(DType::BF16, bhtd()), sp);
        let f = g.add_param("fgate", t(DType::F32, bhtd()[..3].to_vec()), sp);
        [q, k, v, f]
    }

    /// The graph a pruning pass produces for FoX.
    fn pruned_fox() -> Graph {
        let sp = Span::default();
        let mut g = Graph::new("fox");
        let [q, k, v, f] = params(&mut g);
        let bht = bhtd()[..3].to_vec();
        let c = g.add(
            Op::GateCumsum { kind: crate::ops::GateKind::Logits, split_rows: false },
            t(DType::F32, bht.clone()),
            &[f],
            sp,
        );
        let tiles = ValueType::tensor(
            DType::F32,
            [Dim::sym("B"), Dim::sym("H"), Dim::Tiles(Box::new(Dim::sym("T")), 64)],
        );
        let delta = g.add(
            Op::Threshold {
                // A rule reading the diagonal logit (the verifier lets it through: identity score).
                rule: PruneRule {
                    name: "tight".into(),
                    formula: crate::prune_rule::build::s(crate::prune_rule::Stat::Sii),
                    given: vec![],
                },
                log_eps: -10.0,
                bound: NormBound::Data,
                score: ScoreBound::IDENTITY,
                scale: Scale::constant(0.125),
                bm: 64,
                plan: crate::ops::ThresholdPlan::NormsThenDelta,
            },
            tiles.clone(),
            &[q, k],
            sp,
        );
        let start = ValueType { dtype: DType::I32, axes: tiles.axes.clone() };
        let st = g.add(Op::BlockBoundary(Tiles { bm: 64, bn: 32 }), start, &[c, delta], sp);
        let mut a = Attention::new(Scale::constant(0.125), Mask::Causal, true);
        a.tiles = Some(Tiles { bm: 64, bn: 32 });
        a.prune = Prune::Start;
        let o = attention(&mut g, a, &[q, k, v, c, st]);
        let out = g.add(Op::Cast, t(DType::BF16, bhtd()), &[o], sp);
        g.output = Some(out);
        g
    }

    /// An attention node with its two results typed by the op's rule.
    fn attention(g: &mut Graph, a: Attention, ops: &[ValueId]) -> ValueId {
        g.add_attention(a, ops, Span::default()).unwrap()
    }

    #[test]
    fn accepts_fused_ops() {
        verify(&pruned_fox()).unwrap();
        // Dense decay attention without c, and a slope cumsum.
        let sp = Span::default();
        let mut g = Graph::new("causal");
        let [q, k, v, _] = params(&mut g);
        let o = attention(
            &mut g,
            Attention::new(Scale::inv_sqrt(1.0, Dim::sym("D")), Mask::Window(256), false),
            &[q, k, v],
        );
        g.output = Some(o);
        verify(&g).unwrap();
        let m = g.add_param("slope", t(DType::F32, vec![Dim::sym("H")]), sp);
        let c = g.add(
            Op::GateCumsum { kind: crate::ops::GateKind::Slope, split_rows: false },
            t(DType::F32, bhtd()[..3].to_vec()),
            &[m],
            sp,
        );
        let o = attention(&mut g, Attention::new(Scale::constant(0.125), Mask::Causal, true), &[q, k, v, c]);
        g.output = Some(o);
        verify(&g).unwrap();
        // A softcapped score with a captured per-key bias, grouped-query heads, bf16 output.
        let kb = g.add_param("kb", t(DType::F32, bhtd()[..3].to_vec()), sp);
        let mut r = Region::new();
        let x = r.push(RNode::Score);
        let th = r.push(RNode::Unary(crate::ops::UnaryOp::Tanh, x));
        let iv = |v: &str| crate::index::IndexExpr {
            terms: vec![(v.to_string(), 1)],
            dim_terms: vec![],
            constant: 0,
            div: None,
            clamps: vec![],
        };
        let cap = r.push(RNode::Capture { k: 0, index: vec![iv("b"), iv("h"), iv("j")] });
        r.push(RNode::Binary(crate::ops::BinaryOp::Add, th, cap));
        let mut a = Attention::new(Scale::constant(0.125), Mask::None, true);
        a.score = r;
        a.out_dtype = DType::BF16;
        let o = attention(&mut g, a.clone(), &[q, k, v, c, kb]);
        g.output = Some(o);
        verify(&g).unwrap();
        let text = print_graph(&g);
        assert!(text.contains(":2 = attention {scale = 0.125, score = tanh(x) + %"), "{text}");
        assert!(text.contains("bf16[B, H, T, D], f32[B, H, T]"), "{text}");
        // Capture index out of range, a wrong subscript count, a missing lse, a bad result index.
        let mut bad = a.clone();
        bad.score.nodes[2] = RNode::Capture { k: 1, index: vec![iv("b"), iv("h"), iv("j")] };
        g.node_mut(o).op = Op::Attention(bad);
        fails(&g, "reads capture 1, but the node has 1 captures");
        let mut bad = a.clone();
        bad.score.nodes[2] = RNode::Capture { k: 0, index: vec![iv("b"), iv("j")] };
        g.node_mut(o).op = Op::Attention(bad);
        fails(&g, "with 2 subscripts");
        g.node_mut(o).op = Op::Attention(a);
        let lse = g.node(o).more.clone();
        g.node_mut(o).more.clear();
        fails(&g, "result types should be");
        g.node_mut(o).more = lse;
        let user = g.add_multi(
            Op::Unary(crate::ops::UnaryOp::Exp),
            vec![t(DType::F32, bhtd()[..3].to_vec())],
            &[Value { node: o, result: 2 }],
            sp,
        );
        g.output = Some(user);
        fails(&g, "uses result 2 of a node with 2 result(s)");
    }

    #[test]
    fn accepts_positional_rmsnorm() {
        let sp = Span::default();
        let mut g = Graph::new("n");
        let [q, ..] = params(&mut g);
        let w = g.add_param("w", t(DType::F32, vec![Dim::sym("D")]), sp);
        let o = g.add(Op::RmsNorm { axis: "3".into(), eps: 1e-6 }, t(DType::F32, bhtd()), &[q, w], sp);
        g.output = Some(o);
        verify(&g).unwrap();
    }

    fn fails(g: &Graph, needle: &str) {
        let e = verify(g).unwrap_err().to_string();
        assert!(e.contains(needle), "expected `{needle}` in: {e}");
    }

    #[test]
    fn rejects_malformed_graphs() {
        let sp = Span::default();
        // No output.
        let mut g = pruned_fox();
        g.output = None;
        fails(&g, "no output");
        // A one-launch threshold whose formula reads the rows (tight: s_ii).
        let mut g = pruned_fox();
        let th = g.find(|o| matches!(o, Op::Threshold { .. }))[0];
        if let Op::Threshold { plan, .. } = &mut g.node_mut(th).op {
            *plan = crate::ops::ThresholdPlan::OneLaunch;
        }
        fails(&g, "plan = one_launch needs a formula of tile norms only");
        // Wrong result type of a fused op.
        let mut g = pruned_fox();
        let att = g.find(|o| matches!(o, Op::Attention(_)))[0];
        g.node_mut(att).ty = t(DType::F32, bhtd()[..3].to_vec());
        fails(&g, "type should be f32[B, H, T, D]");
        // Operand of the wrong shape: c swapped for delta.
        let mut g = pruned_fox();
        let bb = g.find(|o| matches!(o, Op::BlockBoundary(_)))[0];
        let ops = g.operands(bb);
        let e: Vec<_> = g.g.edges_directed(bb, Direction::Incoming).map(|e| e.id()).collect();
        for e in e {
            g.g.remove_edge(e);
        }
        g.g.add_edge(ops[1], bb, crate::graph::Use { pos: 0, result: 0 });
        g.g.add_edge(ops[0], bb, crate::graph::Use { pos: 1, result: 0 });
        fails(&g, "block_boundary");
        // Missing operand.
        let mut g = pruned_fox();
        let cast = g.output.unwrap();
        let e: Vec<_> = g.g.edges_directed(cast, Direction::Incoming).map(|e| e.id()).collect();
        g.g.remove_edge(e[0]);
        fails(&g, "has 0 operands, `cast` takes 1");
        // A cycle.
        let mut g = Graph::new("cyc");
        let [q, ..] = params(&mut g);
        let a = g.add(Op::Unary(crate::ops::UnaryOp::Exp), t(DType::F32, bhtd()), &[q], sp);
        let b = g.add(Op::Unary(crate::ops::UnaryOp::Exp), t(DType::F32, bhtd()), &[a], sp);
        g.g.add_edge(b, a, crate::graph::Use { pos: 1, result: 0 });
        g.output = Some(b);
        fails(&g, "cycle");
        // Broadcast of one axis name with two sizes; reduce over a missing axis; bool arithmetic.
        let mut g = Graph::new("b");
        let [q, _, _, f] = params(&mut g);
        let x = g.add(
            Op::Bind { axes: vec!["b".into(), "h".into(), "i".into(), "d".into()] },
            t(DType::BF16, bhtd()),
            &[q],
            sp,
        );
        g.node_mut(x).ty.axes =
            ["b", "h", "i", "d"].iter().zip(bhtd()).map(|(n, d)| Axis::new(n, d)).collect();
        let y = g.add(
            Op::Bind { axes: vec!["b".into(), "h".into(), "d".into()] },
            t(DType::F32, bhtd()[..3].to_vec()),
            &[f],
            sp,
        );
        g.node_mut(y).ty.axes = ["b", "h", "d"].iter().zip(bhtd()).map(|(n, d)| Axis::new(n, d)).collect();
        let s = g.add(Op::Binary(crate::ops::BinaryOp::Add), ValueType::scalar(DType::F32), &[x, y], sp);
        g.output = Some(s);
        fails(&g, "axis `d` has size");
        g.g.remove_node(s);
        let mut g2 = g.clone();
        let r = g2.add(
            Op::Reduce { kind: ReduceKind::Sum, axis: "z".into(), contract: false },
            ValueType::scalar(DType::F32),
            &[x],
            sp,
        );
        g2.output = Some(r);
        fails(&g2, "no axis `z`");
        let xt = g.ty(x).clone();
        let bt = ValueType { dtype: DType::Bool, axes: xt.axes.clone() };
        let c = g.add(Op::Binary(crate::ops::BinaryOp::Lt), bt, &[x, x], sp);
        let n = g.add(Op::Unary(crate::ops::UnaryOp::Neg), ValueType { dtype: DType::F32, ..xt }, &[c], sp);
        g.output = Some(n);
        fails(&g, "must be floating point");
        // Store with the wrong axis count.
        let mut g = Graph::new("s");
        let [q, ..] = params(&mut g);
        let x = g.add(
            Op::Bind { axes: vec!["b".into(), "h".into(), "i".into(), "d".into()] },
            t(DType::BF16, bhtd()),
            &[q],
            sp,
        );
        g.node_mut(x).ty.axes =
            ["b", "h", "i", "d"].iter().zip(bhtd()).map(|(n, d)| Axis::new(n, d)).collect();
        let s = g.add(
            Op::Store { axes: vec!["b".into(), "h".into(), "i".into()] },
            t(DType::F32, bhtd()[..3].to_vec()),
            &[x],
            sp,
        );
        g.output = Some(s);
        fails(&g, "does not have exactly these axes");
    }

    #[test]
    fn compiled_examples_verify() {
        let src = include_str!("../../examples/fox.attn");
        let c = crate::frontend::compile("fox.attn", src.as_bytes()).unwrap();
        verify(&c.graph).unwrap();
        assert!(verify_verbose(&c.graph).is_ok());
    }
}
