//! `fuse-epilogue` (every target): an attention whose output only an elementwise function
//! reads before it is stored, `out[b, h, i, d] = F(attn[b, h, i, d], g[b, h, i, d], ...)` (an
//! output gate `o * sigmoid(g)`), computes `F` itself where it stores its output (attribute
//! `epilogue`, docs/SEMANTICS.md "attention"). The output then goes to memory once, in the
//! store's dtype, instead of an f32 write, a read and a write by a loop of its own.
//!
//! The function is the cone of the store's value down to the attention's read: reads of other
//! tensors at subscripts in `b, h, i, d` (captures), indices, dims, constants and unary,
//! binary and `select` nodes, each computed for this store alone, and at most one `cast` to a
//! float dtype at its top (the attention's `out_dtype`). Anything else leaves the loop as it
//! is, with an explanation: a reduction, an interior cast, a value another statement reads.
//!
//! [`unfuse`] is the inverse, for the gradient pass: it differentiates the function as
//! ordinary IR ops.

use crate::cone::{emit_ops, ConeBuilder};
use crate::{PassContext, PassError, PassOptions};
use foxc_ir::attention::{RNode, Region};
use foxc_ir::{Attention, Axis, DType, Graph, Op, Value, ValueId, ValueType};
use petgraph::visit::EdgeRef;
use std::collections::{BTreeMap, BTreeSet};

/// The `fuse-epilogue` pass.
pub fn run(g: &mut Graph, _opts: &PassOptions, cx: &mut PassContext) -> Result<(), PassError> {
    for n in g.find(|op| matches!(op, Op::Attention(_))) {
        match plan(g, n) {
            Ok(Some(p)) => {
                let span = g.node(p.store).span;
                apply(g, n, p)?;
                cx.explain(
                    "the output's elementwise function runs where the attention stores its output (its epilogue), not as a loop of its own".into(),
                    span,
                    None,
                );
            }
            Ok(None) => {}
            Err(why) => cx.explain(
                format!("the output's elementwise function stays a loop of its own: {why}"),
                g.node(n).span,
                None,
            ),
        }
    }
    Ok(())
}

/// What fusing into attention `n` makes: the function, the tensors it reads, the store it
/// replaces and the dtype it stores.
struct Plan {
    region: Region,
    captures: Vec<ValueId>,
    store: ValueId,
    out_dtype: DType,
}

/// The epilogue of attention `n`: `Ok(None)` where there is nothing to fuse (the output is
/// stored as it is, or read by something other than an elementwise chain), `Err` with the
/// reason where a function was there but cannot be fused.
fn plan(g: &Graph, n: ValueId) -> Result<Option<Plan>, String> {
    let Op::Attention(a) = g.op(n) else { return Ok(None) };
    let out_users: Vec<ValueId> =
        g.g.edges_directed(n, petgraph::Direction::Outgoing)
            .filter(|e| e.weight().result == Attention::OUT)
            .map(|e| e.target())
            .collect();
    let [read] = out_users[..] else { return Ok(None) };
    let Op::Bind { axes } = g.op(read) else { return Ok(None) };
    // The elementwise values downstream of the read, and the one store they reach.
    let (mut frontier, mut seen, mut stores) = (vec![read], BTreeSet::new(), BTreeSet::new());
    while let Some(v) = frontier.pop() {
        for u in g.users(v) {
            match g.op(u) {
                Op::Store { axes: st } if st == axes => {
                    stores.insert(u);
                }
                Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast => {
                    if seen.insert(u) {
                        frontier.push(u);
                    }
                }
                _ => return Ok(None),
            }
        }
    }
    let stores: Vec<ValueId> = stores.into_iter().collect();
    let [store] = stores[..] else { return Ok(None) };
    let top = g.operands(store)[0];
    if top == read {
        return Ok(None);
    }
    if a.epilogue.is_some() || a.out_dtype != DType::F32 {
        return Err("the attention already rounds or transforms its output".into());
    }
    let (root, out_dtype) = match g.op(top) {
        Op::Cast if g.ty(top).dtype.is_float() => (g.operands(top)[0], g.ty(top).dtype),
        _ => (top, g.ty(top).dtype),
    };
    if !out_dtype.is_float() || g.ty(store).dtype != out_dtype {
        return Err(format!("the stored value is {}, not a float", g.ty(top).dtype));
    }
    let is_read = |v: ValueId| v == read;
    let mut b = ConeBuilder::new(g, axes, &is_read);
    let r = b.add(root)?;
    b.region.root = r;
    // Every computation of the cone must be this store's alone: fusing it otherwise computes
    // it twice (and its other readers still need its loop).
    let cone: BTreeSet<ValueId> = b.built.keys().copied().chain([top, store]).collect();
    for &v in b.built.keys() {
        let shared_read = matches!(g.op(v), Op::Bind { .. } | Op::Gather { .. } | Op::Iota { .. });
        if (v == read || !shared_read) && g.users(v).iter().any(|u| !cone.contains(u)) {
            return Err(format!("%{} is also read elsewhere", v.index()));
        }
    }
    Ok(Some(Plan { region: b.region, captures: b.captures, store, out_dtype }))
}

/// Gives attention `n` the epilogue of `p` and makes it the store's value.
fn apply(g: &mut Graph, n: ValueId, p: Plan) -> Result<(), PassError> {
    let Op::Attention(a) = g.op(n).clone() else { return Ok(()) };
    let mut operands = g.operands(n);
    let mut region = p.region;
    // The epilogue's captures join the op's (one operand per tensor).
    for node in &mut region.nodes {
        if let RNode::Capture { k, .. } = node {
            let v = p.captures[*k];
            *k = match operands[a.fixed_operands()..].iter().position(|c| *c == v) {
                Some(at) => at,
                None => {
                    operands.push(v);
                    operands.len() - 1 - a.fixed_operands()
                }
            };
        }
    }
    let mut fused = a;
    fused.epilogue = Some(region);
    fused.out_dtype = p.out_dtype;
    let span = g.node(n).span;
    let new = g.add_attention(fused, &operands, span).map_err(PassError::Internal)?;
    g.replace_all_uses(n, new);
    g.node_mut(new).name = g.node(p.store).name.clone();
    g.replace_all_uses(p.store, new);
    g.remove_dead();
    Ok(())
}

/// The regions of `a` other than the epilogue: the score, an expression mask, the key bound.
fn attention_regions(a: &Attention) -> impl Iterator<Item = &Region> {
    let mask = match &a.mask {
        foxc_ir::Mask::Expr(r) => Some(r),
        _ => None,
    };
    std::iter::once(&a.score).chain(mask).chain(a.keys_from.as_ref())
}

/// [`attention_regions`], to change.
fn attention_regions_mut(a: &mut Attention) -> impl Iterator<Item = &mut Region> {
    let mask = match &mut a.mask {
        foxc_ir::Mask::Expr(r) => Some(r),
        _ => None,
    };
    std::iter::once(&mut a.score).chain(mask).chain(a.keys_from.as_mut())
}

/// Moves the epilogue of attention `n` (if any) back into IR ops after it: the attention gets
/// an f32 output and its users read `store(cast(F(attn)))` instead (the gradient pass
/// differentiates those).
pub fn unfuse(g: &mut Graph, n: ValueId) -> Result<(), String> {
    let Op::Attention(a) = g.op(n).clone() else { return Ok(()) };
    let Some(region) = a.epilogue.clone() else { return Ok(()) };
    let ops = Attention::operands(g, n)?;
    let out_ty = g.ty(n).clone();
    let names = ["b", "h", "i", "d"];
    let axes: Vec<Axis> = out_ty.dims().zip(names).map(|(d, name)| Axis::new(name, d.clone())).collect();
    // The attention without the epilogue, and without the captures only the epilogue read (a
    // backward would otherwise owe them a gradient of their own).
    let mut plain = a.clone();
    plain.epilogue = None;
    plain.out_dtype = DType::F32;
    let still_read: BTreeSet<usize> = attention_regions(&plain).flat_map(Region::captures).collect();
    let mut keep: Vec<ValueId> = g.operands(n)[..a.fixed_operands()].to_vec();
    let mut renumber = BTreeMap::new();
    for (k, &c) in ops.captures.iter().enumerate() {
        if still_read.contains(&k) {
            renumber.insert(k, renumber.len());
            keep.push(c);
        }
    }
    for r in attention_regions_mut(&mut plain) {
        for node in &mut r.nodes {
            if let RNode::Capture { k, .. } = node {
                *k = renumber[k];
            }
        }
    }
    let span = g.node(n).span;
    let name = g.node_mut(n).name.take();
    let was_output = g.output == Some(n);
    let n = {
        let plain_node = g.add_attention(plain, &keep, span)?;
        g.replace_all_uses(n, plain_node);
        g.g.remove_node(n);
        plain_node
    };
    let old_users: Vec<(ValueId, u32)> =
        g.g.edges_directed(n, petgraph::Direction::Outgoing)
            .filter(|e| e.weight().result == Attention::OUT)
            .map(|e| (e.target(), e.weight().pos))
            .collect();
    let named = |dtype: DType| ValueType { dtype, axes: axes.clone() };
    let mut top = emit_ops(g, &region, &ops.captures, &axes, Value::of(n), span)?;
    if a.out_dtype != DType::F32 {
        top = Value::of(g.add_multi(Op::Cast, vec![named(a.out_dtype)], &[top], span));
    }
    let stored = ValueType { dtype: a.out_dtype, axes: out_ty.axes.clone() };
    let store = g.add_multi(
        Op::Store { axes: names.iter().map(|s| s.to_string()).collect() },
        vec![stored],
        &[top],
        span,
    );
    g.node_mut(store).name = name;
    for (u, pos) in old_users {
        g.set_operand(u, pos, Value::of(store));
    }
    if was_output {
        g.output = Some(store);
    }
    Ok(())
}
