//! `half-operands` (GPU targets): the attention kernels multiply 16-bit q, k and v on the
//! tensor cores, so an operand of another dtype (an f32 q rotated by RoPE, a q scaled in f32) is
//! cast to the kernels' 16-bit type here, in the IR, where the other passes see it:
//! `fuse-output-cast` then stores the producing statement's value in that type directly and
//! `fuse-loops` computes the cast in the statement's own loop, so no f32 copy is written and no
//! separate cast reads it back. The thresholds that read the operand (its norms) read the cast
//! too: they bound the values the kernel multiplies.
//!
//! The type: f16 when one of q, k, v is f16 and none is bf16, else bf16 (an f32 operand keeps
//! its range in bf16; it goes to f16 only beside f16 operands, an f16 program's normed q and k).

use crate::{PassContext, PassError, PassOptions};
use foxc_ir::{DType, Graph, Op, Value, ValueId};
use std::collections::BTreeMap;

/// The 16-bit type the kernels read the attention operands `qkv` in.
pub fn kernel_half(g: &Graph, qkv: &[ValueId]) -> DType {
    let has = |d: DType| qkv.iter().any(|&v| g.ty(v).dtype == d);
    if has(DType::F16) && !has(DType::BF16) {
        DType::F16
    } else {
        DType::BF16
    }
}

/// The `half-operands` pass.
pub fn run(g: &mut Graph, _opts: &PassOptions, _cx: &mut PassContext) -> Result<(), PassError> {
    // One cast per (value, type), shared by every attention and threshold that reads it.
    let mut casts: BTreeMap<(ValueId, DType), ValueId> = BTreeMap::new();
    // Each attention's q and k as they were, and the type its kernels read them in.
    let mut qk_in: Vec<([ValueId; 2], DType)> = vec![];
    for n in g.find(|op| matches!(op, Op::Attention(_))) {
        let qkv: Vec<ValueId> = g.operands(n).into_iter().take(3).collect();
        let half = kernel_half(g, &qkv);
        qk_in.push(([qkv[0], qkv[1]], half));
        for (pos, &x) in qkv.iter().enumerate() {
            if g.ty(x).dtype == half {
                continue;
            }
            let cast = *casts.entry((x, half)).or_insert_with(|| {
                let mut ty = g.ty(x).clone();
                ty.dtype = half;
                let span = g.node(x).span;
                g.add(Op::Cast, ty, &[x], span)
            });
            g.set_operand(n, pos as u32, Value::of(cast));
        }
    }
    // A threshold's q and k (operands 0 and 1) are its attention's: it reads the same casts.
    for t in g.find(|op| matches!(op, Op::Threshold { .. })) {
        let qk: Vec<ValueId> = g.operands(t).into_iter().take(2).collect();
        let Some(&(_, half)) = qk_in.iter().find(|(a, _)| a[..] == qk[..]) else { continue };
        for (pos, x) in qk.into_iter().enumerate() {
            if let Some(&cast) = casts.get(&(x, half)) {
                g.set_operand(t, pos as u32, Value::of(cast));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fuse_load_map::QMap;
    use crate::Target;

    const ROPE_Q: &str = "attention a(q: bf16[B, H, T, D], k: bf16[B, H, T, D], v: bf16[B, H, T, D], fgate: f32[B, H, T], w: f32[T, D]) -> bf16[B, H, T, D] {
    c[b, h, t]      = cumsum(t, logsigmoid(fgate[b, h, t]))
    qw[b, h, t, d]  = q[b, h, t, d] * w[t, d]
    s[b, h, i, j]   = sum(d, qw[b, h, i, d] * k[b, h, j, d]) / sqrt(D) + c[b, h, i] - c[b, h, j]
    p[b, h, i, j]   = softmax(j, causal(i, j, s[b, h, i, j]))
    out[b, h, i, d] = sum(j, p[b, h, i, j] * v[b, h, j, d])
    return out
}";

    fn optimized(target: Target, q_map: Option<QMap>) -> String {
        let mut g = foxc_ir::frontend::compile("a.attn", ROPE_Q.as_bytes()).unwrap().graph;
        crate::optimize(&mut g, &PassOptions { target, q_map, ..PassOptions::default() }).unwrap();
        foxc_ir::print::print_graph(&g)
    }

    /// On a GPU the f32 q is rounded to bf16 by its own statement (no f32 copy, no cast
    /// launch): the loop stores bf16, and where the kernels compute it as they load q, a bf16
    /// load map (`fuse-load-maps`). The CPU keeps f32 (and its map computes in f32).
    #[test]
    fn an_f32_operand_is_rounded_to_the_kernels_type_on_a_gpu_only() {
        let gpu = optimized(Target::Sm90a, Some(QMap::Kernel));
        let map = gpu.lines().find(|l| l.contains(" = load_map ")).unwrap_or_else(|| panic!("{gpu}"));
        assert!(map.ends_with(": bf16[B, H, T, D]"), "{gpu}");
        assert!(!gpu.contains(": f32[B, H, T, D]") && !gpu.contains("cast"), "no f32 copy of q: {gpu}");
        let gpu = optimized(Target::Sm90a, None);
        let store = gpu.lines().find(|l| l.contains(" = store ")).unwrap_or_else(|| panic!("{gpu}"));
        assert!(store.ends_with(": bf16[B, H, T, D]") && !gpu.contains("load_map"), "{gpu}");
        assert!(!gpu.contains(": f32[B, H, T, D]"), "no f32 copy of q: {gpu}");
        let cpu = optimized(Target::Cpu, None);
        assert!(cpu.contains("= load_map") && cpu.contains(": f32[B, H, T, D]"), "{cpu}");
        assert!(!cpu.contains("cast"), "{cpu}");
    }
}
