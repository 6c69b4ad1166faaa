//! `fuse-load-maps`: an attention's q that an elementwise statement computes from
//! tensors read around its own element (RoPE's rotation
//! `q[b, h, t, d] * cos[t, d] + select(d < D / 2, -q[b, h, t, d + D / 2], q[b, h, t, d - D / 2]) * sin[t, d]`)
//! becomes a `load_map` (docs/SEMANTICS.md): the attention kernel computes each element where it
//! loads its query tile, and so does the threshold kernel that reads the same q for its norms,
//! instead of a loop writing the rotated tensor and both kernels reading it back.
//!
//! The statement qualifies when it stores a rank-4 value that only attentions and thresholds
//! read, as their q; its value is a cone of elementwise ops ([`ConeBuilder`]: reads of tensors,
//! indices, dims, constants, unary, binary and `select` nodes) with at most one float `cast` at
//! its top (the map's dtype: f32 for the CPU kernels; for the GPU kernels the 16-bit type of
//! their Q tile, which the `half-operands` pass gave the statement); and it reads some tensor of
//! its own shape at its own subscripts (the map's `x`, the one read every kernel loads as
//! before; on the GPU of the map's own dtype: the kernels load it in 16-byte pieces of the
//! tile's type). Anything else stays a loop, with an explanation.
//!
//! k stays a loop: a kernel loads each key tile once per query tile, so a map there is computed
//! `T / bm` times (on the CPU's standard workload, mapping k too made RoPE 1.35x slower than its
//! loops; q alone is 9% faster: BENCHMARKS.md). [`unfuse`] is the inverse, for the gradient
//! pass.
//!
//! Where the map is computed is a choice ([`QMap`], `--q-map`): the CPU's kernels compute it; on
//! a GPU, q's loop stays the default, measured faster ([`GPU_Q_MAP`]).

use crate::cone::{emit_ops, ConeBuilder};
use crate::{PassContext, PassError, PassOptions};
use foxc_ir::attention::Region;
use foxc_ir::{Axis, DType, Graph, Op, Value, ValueId, ValueType};
use petgraph::visit::EdgeRef;
use std::collections::BTreeSet;

/// Where q's elementwise statement is computed (`--q-map`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QMap {
    /// A loop writes the statement's tensor; the kernels read it.
    Loop,
    /// The kernels that read q compute the statement where they load it (a `load_map`).
    Kernel,
}

/// The GPU's default: the loop. On an H100 (2026-12-08, B = 1, H = 16, T = 8192, D = 128,
/// BENCHMARKS.md, "RoPE's q rotation"), the kernels' map made the pruned forward 6% slower with
/// RoPE and 11% slower with grouped kv heads than the loop, and the dense forward level. The
/// CPU's kernels compute the map (9% faster than the loop there).
pub const GPU_Q_MAP: QMap = QMap::Loop;

/// The `fuse-load-maps` pass.
pub fn run(g: &mut Graph, opts: &PassOptions, cx: &mut PassContext) -> Result<(), PassError> {
    let gpu = opts.target.is_gpu();
    let choice = opts.q_map.unwrap_or(if gpu { GPU_Q_MAP } else { QMap::Kernel });
    let mut seen = BTreeSet::new();
    for n in g.find(|op| matches!(op, Op::Attention(_))) {
        let [q, k] = [0, 1].map(|pos| g.operands(n)[pos]);
        if !seen.insert(q) {
            continue;
        }
        match plan(g, q, 0, gpu) {
            Ok(Some(_)) if choice == QMap::Loop => {
                let why = "on a GPU the loop measured faster (BENCHMARKS.md); `--q-map kernel` computes it where the kernels load q";
                explain(cx, g, q, "q", why.into());
            }
            Ok(Some(p)) => {
                // k's statement may be a map as well, but a kernel loads each key tile once per
                // query tile: it would compute the map that many times.
                let k_too = k != q && matches!(plan(g, k, 1, gpu), Ok(Some(_)));
                apply(g, q, p);
                if k_too {
                    let why = "a kernel loads each key tile once per query tile and would compute its map that many times (the loop computes it once)";
                    explain(cx, g, k, "k", why.into());
                }
            }
            Ok(None) => {}
            Err(why) => explain(cx, g, q, "q", why),
        }
    }
    Ok(())
}

/// Why store `s` stays a loop, at the statement it stores (the store's own span, and a cast's
/// the `half-operands` pass put under it, are where the recognizer made it: the attention's
/// statement).
fn explain(cx: &mut PassContext, g: &Graph, s: ValueId, what: &str, why: String) {
    let mut v = s;
    while matches!(g.op(v), Op::Store { .. } | Op::Cast) && !g.operands(v).is_empty() {
        v = g.operands(v)[0];
    }
    cx.explain(format!("the attention's {what} stays a loop of its own: {why}"), g.node(v).span, None);
}

/// What replacing store `s` makes: the function, its `x` and the tensors it captures.
struct Plan {
    region: Region,
    x: ValueId,
    captures: Vec<ValueId>,
}

/// The load map of store `s`, read as operand `pos` of attentions and thresholds (of the GPU
/// kernels with `gpu`, else of the CPU's): `Ok(None)` where there is nothing to fuse (`s` is not
/// a statement, or one that only renames a tensor), `Err` with the reason where a function was
/// there but cannot be fused.
fn plan(g: &Graph, s: ValueId, pos: u32, gpu: bool) -> Result<Option<Plan>, String> {
    let Op::Store { axes } = g.op(s) else { return Ok(None) };
    if axes.len() != 4 {
        return Ok(None);
    }
    for e in g.g.edges_directed(s, petgraph::Direction::Outgoing) {
        let reader = g.op(e.target());
        if !(e.weight().pos == pos && matches!(reader, Op::Attention(_) | Op::Threshold { .. })) {
            return Err(format!(
                "%{} is also read as operand {} of a `{}`",
                s.index(),
                e.weight().pos,
                reader.mnemonic()
            ));
        }
    }
    let top = g.operands(s)[0];
    let (root, dtype) = match g.op(top) {
        Op::Cast if g.ty(top).dtype.is_float() => (g.operands(top)[0], g.ty(top).dtype),
        _ => (top, g.ty(top).dtype),
    };
    if !dtype.is_float() || g.ty(s).dtype != dtype {
        return Err(format!("the stored value is {}, not a float", g.ty(top).dtype));
    }
    if gpu && !matches!(dtype, DType::BF16 | DType::F16) {
        return Err(format!("it is {dtype}, and the GPU kernels compute a map into their 16-bit Q tile"));
    }
    if !gpu && dtype != DType::F32 {
        return Err(format!("it rounds to {dtype}, and the CPU kernels compute a map in f32"));
    }
    // `x`: the first tensor of the statement's shape that it reads at its own subscripts.
    let plain_read = |v: ValueId| match g.op(v) {
        Op::Bind { axes: read } if read == axes => {
            let t = g.operands(v)[0];
            (g.ty(t).dims().eq(g.ty(s).dims()) && g.operand_values(v)[0].result == 0).then_some(t)
        }
        _ => None,
    };
    let Some(x) = cone_values(g, root).into_iter().find_map(plain_read) else {
        return Err("it reads no tensor of its own shape at its own subscripts".into());
    };
    if plain_read(root) == Some(x) {
        return Ok(None);
    }
    if gpu && g.ty(x).dtype != dtype {
        return Err(format!(
            "it reads its own element from a {} tensor, and the GPU kernels load it as the {dtype} of their Q tile",
            g.ty(x).dtype
        ));
    }
    let is_x = |v: ValueId| plain_read(v) == Some(x);
    let mut b = ConeBuilder::new(g, axes, &is_x);
    let r = b.add(root)?;
    b.region.root = r;
    Ok(Some(Plan { region: b.region, x, captures: b.captures }))
}

/// The values of the cone below `root` (`root` first, then breadth first through the operands
/// of elementwise ops).
fn cone_values(g: &Graph, root: ValueId) -> Vec<ValueId> {
    let (mut order, mut seen) = (vec![root], BTreeSet::from([root]));
    let mut at = 0;
    while let Some(&v) = order.get(at) {
        at += 1;
        if matches!(g.op(v), Op::Unary(_) | Op::Binary(_) | Op::Select) {
            for o in g.operands(v) {
                if seen.insert(o) {
                    order.push(o);
                }
            }
        }
    }
    order
}

/// Replaces store `s` by the load map of `p`.
fn apply(g: &mut Graph, s: ValueId, p: Plan) {
    let operands: Vec<Value> = std::iter::once(p.x).chain(p.captures).map(Value::of).collect();
    let span = g.node(s).span;
    let m = g.add_multi(Op::LoadMap { f: p.region }, vec![g.ty(s).clone()], &operands, span);
    g.node_mut(m).name = g.node(s).name.clone();
    g.replace_all_uses(s, m);
    g.remove_dead();
}

/// Replaces load map `m` by the statement it came from: its function as IR ops (f32), rounded
/// to its dtype, stored (the gradient pass differentiates those).
pub fn unfuse(g: &mut Graph, m: ValueId) -> Result<(), String> {
    let Op::LoadMap { f } = g.op(m).clone() else { return Ok(()) };
    let ops = g.operands(m);
    let (&x, captures) = ops.split_first().ok_or("a load_map without operands")?;
    let ty = g.ty(m).clone();
    let names = ["b", "h", "i", "d"];
    let axes: Vec<Axis> = ty.dims().zip(names).map(|(d, name)| Axis::new(name, d.clone())).collect();
    let span = g.node(m).span;
    let mut top = emit_ops(g, &f, captures, &axes, Value::of(x), span)?;
    if ty.dtype != DType::F32 {
        top = Value::of(g.add_multi(
            Op::Cast,
            vec![ValueType { dtype: ty.dtype, axes: axes.clone() }],
            &[top],
            span,
        ));
    }
    let store = g.add_multi(Op::Store { axes: names.map(String::from).to_vec() }, vec![ty], &[top], span);
    g.node_mut(store).name = g.node_mut(m).name.take();
    g.replace_all_uses(m, store);
    g.g.remove_node(m);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Target;

    const ROPE: &str = "attention a(q: bf16[B, H, T, D], k: bf16[B, H, T, D], v: bf16[B, H, T, D], fgate: f32[B, H, T], cos: f32[T, D], sin: f32[T, D]) -> f32[B, H, T, D] {
    c[b, h, t]      = cumsum(t, logsigmoid(fgate[b, h, t]))
    qr[b, h, t, d]  = q[b, h, t, d] * cos[t, d] + select(d < D / 2, -q[b, h, t, d + D / 2], q[b, h, t, d - D / 2]) * sin[t, d]
    s[b, h, i, j]   = sum(d, qr[b, h, i, d] * k[b, h, j, d]) / sqrt(D) + c[b, h, i] - c[b, h, j]
    p[b, h, i, j]   = softmax(j, causal(i, j, s[b, h, i, j]))
    out[b, h, i, d] = sum(j, p[b, h, i, j] * v[b, h, j, d])
    return out
}";

    /// The optimized program and the explanations; on a GPU target with the kernels computing
    /// the map (`--q-map kernel`; the loop is the default there).
    fn optimized(src: &str, target: Target) -> (String, Vec<String>) {
        let mut g = foxc_ir::frontend::compile("a.attn", src.as_bytes()).unwrap().graph;
        let q_map = target.is_gpu().then_some(QMap::Kernel);
        let rep = crate::optimize(&mut g, &PassOptions { target, q_map, ..PassOptions::default() }).unwrap();
        (foxc_ir::print::print_graph(&g), rep.explanations.into_iter().map(|e| e.message).collect())
    }

    #[test]
    fn a_rotated_q_is_loaded_through_its_map_on_the_cpu() {
        let (ir, _) = optimized(ROPE, Target::Cpu);
        assert_eq!(ir.matches("= load_map {f = x * %").count(), 1, "{ir}");
        assert!(
            ir.contains("select(d < dim(D) * 0.5, -%0[b, h, i, d + D / 2], %0[b, h, i, d - D / 2])"),
            "{ir}"
        );
        // The threshold and the attention read the map; no loop stores the rotated q.
        assert!(!ir.contains("store"), "{ir}");
    }

    /// The verifier admits a load map as q only: read as k, no kernel would compute it.
    #[test]
    fn a_load_map_read_as_k_does_not_verify() {
        let mut g = foxc_ir::frontend::compile("a.attn", ROPE.as_bytes()).unwrap().graph;
        crate::optimize(&mut g, &PassOptions::default()).unwrap();
        let m = g.find(|op| matches!(op, Op::LoadMap { .. }))[0];
        let a = g.find(|op| matches!(op, Op::Attention(_)))[0];
        g.set_operand(a, 1, Value::of(m));
        let e = foxc_ir::verify::verify(&g).unwrap_err().to_string();
        assert!(e.contains("only an attention's or a threshold's q loads through one"), "{e}");
    }

    /// On a GPU the map is the statement's 16-bit value (the `half-operands` cast at its top)
    /// of an `x` in that type, which the kernels load into their Q tile; an f32 `x` stays a
    /// loop, and `--explain` says why.
    #[test]
    fn a_gpu_target_maps_q_into_its_16_bit_tile() {
        for target in [Target::Sm90a, Target::Sm80] {
            let (ir, _) = optimized(ROPE, target);
            let maps: Vec<_> = ir.lines().filter(|l| l.contains("= load_map {")).collect();
            assert!(maps.len() == 1 && maps[0].ends_with(": bf16[B, H, T, D]"), "{ir}");
        }
        let src = ROPE.replace("q: bf16[B, H, T, D]", "q: f32[B, H, T, D]");
        let (ir, why) = optimized(&src, Target::Sm90a);
        assert!(!ir.contains("load_map"), "{ir}");
        let said = "the attention's q stays a loop of its own: it reads its own element from a f32 tensor, and the GPU kernels load it as the bf16 of their Q tile";
        assert!(why.iter().any(|m| m == said), "{why:?}");
    }

    #[test]
    fn a_map_without_its_own_element_is_explained() {
        let src = ROPE.replace(
            "q[b, h, t, d] * cos[t, d] + select(d < D / 2, -q[b, h, t, d + D / 2], q[b, h, t, d - D / 2]) * sin[t, d]",
            "q[b, h, t, D - 1 - d] * cos[t, d]",
        );
        let (ir, why) = optimized(&src, Target::Cpu);
        assert!(!ir.contains("load_map"), "{ir}");
        let said = "the attention's q stays a loop of its own: it reads no tensor of its own shape at its own subscripts";
        assert!(why.iter().any(|m| m == said), "{why:?}");
    }
}
