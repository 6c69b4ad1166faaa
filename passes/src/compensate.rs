//! `compensate-decay` (CPU target): every attention whose decay `c` is a `gate_cumsum` also
//! reads `c_lo`, a `gate_cumsum_lo` of the same gate, and adds `lo_i - lo_j` to the bias
//! (`decay(pair)`, docs/SEMANTICS.md "gate_cumsum_lo").
//!
//! Why: `c` is stored in f32 and grows without bound along the sequence (about -1600 at
//! T = 4096 with bursty gates, -7700 for a fast-forgetting head), so `c_i - c_j` inherits an
//! absolute rounding error of `ulp(|c|)` although the bias itself is small where the softmax
//! weight is. Measured on the 4-head T = 4096 bursty case (f32 FoX, `--no-prune`): the f64
//! reference fed `round_f32(c)` is 2.32e-5 (relative L2) from the exact one, the CPU kernel's
//! output 2.32e-5 too: the kernel's own arithmetic adds nothing visible, the rounding of `c` is
//! all of the 1e-5 contract's miss. The pair `(c, lo)` keeps the f64 cumsum; the bias
//! `(c_i - c_j) + (lo_i - lo_j)` then errs by `ulp(|c_i - c_j|)`, the rounding any f32 score has.
//!
//! Only where scores are computed in f32 from f32 operands (the CPU, contract 1e-5): the GPU
//! kernels take bf16 q and k (contract 1e-2), whose rounding dominates `ulp(|c|)` until |c|
//! reaches ~1e5, and keep the single `c` (this pass is the decision; backends obey it).

use crate::acp::add_attention;
use crate::{PassContext, PassError, PassOptions};
use foxc_ir::{Attention, Graph, Op, ValueId};
use std::collections::BTreeMap;

/// The `compensate-decay` pass.
pub fn run(g: &mut Graph, _opts: &PassOptions, _cx: &mut PassContext) -> Result<(), PassError> {
    // One residual per cumsum, however many attentions read it.
    let mut residual: BTreeMap<ValueId, ValueId> = BTreeMap::new();
    for n in g.find(|op| matches!(op, Op::Attention(a) if a.decay && !a.decay_lo)) {
        let Op::Attention(a) = g.op(n).clone() else { continue };
        let mut ops = Attention::operands(g, n).map_err(PassError::Internal)?;
        let Some(c) = ops.decay else { continue };
        let Op::GateCumsum { kind, .. } = *g.op(c) else { continue };
        let lo = match residual.get(&c) {
            Some(&lo) => lo,
            None => {
                let gate = g.operands(c);
                let lo = g.add(Op::GateCumsumLo { kind }, g.ty(c).clone(), &gate, g.node(c).span);
                residual.insert(c, lo);
                lo
            }
        };
        let mut pa = a.clone();
        pa.decay_lo = true;
        ops.decay_lo = Some(lo);
        let span = g.node(n).span;
        let p = add_attention(g, pa, &ops.to_vec(), span)?;
        g.node_mut(p).name = g.node(n).name.clone();
        g.replace_all_uses(n, p);
        g.remove_dead();
    }
    Ok(())
}
