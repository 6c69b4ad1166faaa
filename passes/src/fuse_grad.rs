//! `fuse-gradient-casts` (GPU targets), on a gradient program ([`crate::grad`]): an
//! `attention_backward` whose `dq`, `dk` and `dv` each have one use, a `cast` to the same
//! 16-bit float dtype (the gradients of bf16 or f16 parameters), writes that dtype itself
//! (`grads = DTYPE`, [`foxc_ir::Attention::grad_dtype`]); the casts disappear and the program's
//! outputs name the backward's results. The backward kernels round their f32 accumulators as
//! the cast did (to nearest even), so the values are the same bits; what goes is a pass over
//! memory per gradient: the f32 written, read back and rounded (at 16 heads of 16384 keys and
//! D = 128, 134 MB of f32 each way for each of dk and dv).
//!
//! It runs on the gradient program rather than in the forward's pipeline because the casts are
//! made there: the gradient of a bf16 parameter is its f32 adjoint cast to bf16.

use crate::grad::GradProgram;
use crate::Target;
use foxc_ir::{DType, Graph, Op, Value, ValueId, ValueType};

/// Runs the gradient program's passes for `target` (today the one above, on GPU targets).
pub fn optimize_gradient(p: &mut GradProgram, target: Target) {
    if target.is_gpu() {
        gradient_casts(p);
    }
}

/// The `fuse-gradient-casts` step on every `attention_backward` of `p` it applies to.
pub fn gradient_casts(p: &mut GradProgram) {
    for n in p.graph.find(|op| matches!(op, Op::AttentionBackward(a) if a.grad_dtype == DType::F32)) {
        let Some((casts, to)) = fusable_casts(p, n) else { continue };
        let Op::AttentionBackward(mut a) = p.graph.op(n).clone() else { continue };
        a.grad_dtype = to;
        // The results' types are the op's rule's for the new attribute.
        let tys: Vec<ValueType> =
            p.graph.operand_values(n).iter().map(|&v| p.graph.value_ty(v).clone()).collect();
        let Ok(mut rt) = a.backward_result_types(&tys.iter().collect::<Vec<_>>()) else { continue };
        let node = p.graph.node_mut(n);
        node.op = Op::AttentionBackward(a);
        node.ty = rt.remove(0);
        node.more = rt;
        for (r, &cast) in casts.iter().enumerate() {
            let result = Value { node: n, result: r as u32 };
            p.graph.replace_value_uses(Value::of(cast), result);
            for (_, v) in p.outputs.iter_mut().filter(|(_, v)| *v == Value::of(cast)) {
                *v = result;
            }
            p.graph.g.remove_node(cast);
        }
    }
}

/// The casts of results 0, 1, 2 of backward `n` and their common dtype, where each result's
/// one use is a cast to one 16-bit float dtype and the cast keeps the result's axes.
fn fusable_casts(p: &GradProgram, n: ValueId) -> Option<([ValueId; 3], DType)> {
    let g = &p.graph;
    let mut casts = [n; 3];
    let mut dtype = None;
    for (r, cast) in casts.iter_mut().enumerate() {
        let v = Value { node: n, result: r as u32 };
        let u = only_use(g, v)?;
        let is_output = p.outputs.iter().any(|(_, o)| *o == v) || (r == 0 && g.output == Some(n));
        let to = g.ty(u).dtype;
        let fits = matches!(g.op(u), Op::Cast)
            && matches!(to, DType::BF16 | DType::F16)
            && g.ty(u).axes == g.value_ty(v).axes
            && dtype.is_none_or(|d| d == to);
        if is_output || !fits {
            return None;
        }
        dtype = Some(to);
        *cast = u;
    }
    Some((casts, dtype?))
}

/// The node that reads `v`, where exactly one operand of one node does.
fn only_use(g: &Graph, v: Value) -> Option<ValueId> {
    let mut reads = g
        .users(v.node)
        .into_iter()
        .flat_map(|u| g.operand_values(u).into_iter().filter(move |&o| o == v).map(move |_| u));
    let u = reads.next()?;
    reads.next().is_none().then_some(u)
}
