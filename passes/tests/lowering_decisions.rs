//! One-line tests of the lowering decisions the passes make per target (`fold-q-scale`), in
//! the style of the rule tests: each applies one pass to a small graph and reads off whether it
//! fired.

use foxc_ir::{Attention, BinaryOp, DType, Dim, Graph, Mask, Op, Scale, Span, ValueType};
use foxc_passes::{fold_scale, PassContext, PassOptions, Target};

fn opts(target: Target) -> PassOptions {
    PassOptions { target, ..PassOptions::default() }
}

/// `attention(q * s, k, v)` with scale `1/sqrt(D)` after `fold-q-scale` for `target`: the
/// attention's printed scale and whether it reads q itself.
fn fold(target: Target, s: f64) -> (String, bool) {
    let sp = Span::default();
    let bhtd = || ["B", "H", "T", "D"].map(Dim::sym);
    let mut g = Graph::new("t");
    let [q, k, v] = ["q", "k", "v"].map(|n| g.add_param(n, ValueType::tensor(DType::BF16, bhtd()), sp));
    let c = g.add(Op::Const(s), ValueType::scalar(DType::F32), &[], sp);
    let qs = g.add(Op::Binary(BinaryOp::Mul), ValueType::tensor(DType::F32, bhtd()), &[q, c], sp);
    let a = Attention::new(Scale::inv_sqrt(1.0, Dim::sym("D")), Mask::Causal, false);
    let o = g.add_attention(a, &[qs, k, v], sp).unwrap();
    g.output = Some(o);
    fold_scale::run(&mut g, &opts(target), &mut PassContext::default()).unwrap();
    foxc_ir::verify::verify(&g).unwrap();
    let Op::Attention(a) = g.op(o) else { unreachable!() };
    (a.scale.to_string(), g.operands(o)[0] == q)
}

#[test]
fn fold_q_scale_fires_for_a_gpu_target() {
    assert_eq!(fold(Target::Sm90a, 0.5), ("1/sqrt(D) * q_factor(0.5)".to_string(), true));
}

#[test]
fn fold_q_scale_leaves_the_cpu_target_alone() {
    assert_eq!(fold(Target::Cpu, 0.5), ("1/sqrt(D)".to_string(), false));
}

#[test]
fn fold_q_scale_keeps_a_zero_factor_a_product() {
    assert_eq!(fold(Target::Sm80, 0.0), ("1/sqrt(D)".to_string(), false));
}
