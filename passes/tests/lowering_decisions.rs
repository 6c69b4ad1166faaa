//! One-line tests of the lowering decisions the passes make per target (`fold-q-scale`,
//! `contract`), in the style of the rule tests: each applies one pass of the pipeline's table
//! (`run_pass`, which honours the table's target column) to a small graph and reads off whether
//! it fired.

use foxc_ir::check::infer;
use foxc_ir::{
    Attention, BinaryOp, DType, Dim, Graph, Mask, Op, ReduceKind, Scale, Span, UnaryOp, ValueId, ValueType,
};
use foxc_passes::{run_pass, PassContext, PassOptions, Target};

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
    run_pass("fold-q-scale", &mut g, &opts(target), &mut PassContext::default()).unwrap();
    foxc_ir::verify::verify(&g).unwrap();
    let Op::Attention(a) = g.op(o) else { unreachable!() };
    (a.scale.to_string(), g.operands(o)[0] == q)
}

/// `sum(d, q[i, d] * k[j, d])` (and, with `shared`, the product also read by a `neg` whose
/// maximum over `d` is added to the sum) after `contract` for `target`: whether the sum contracts.
fn contracts(target: Target, shared: bool) -> bool {
    let src = "attention dot(q: f32[T, D], k: f32[T, D]) -> f32[T, T] {\n    s[i, j] = sum(d, q[i, d] * k[j, d])\n    return s\n}\n";
    let mut g = foxc_ir::frontend::compile("dot.attn", src.as_bytes()).unwrap().graph;
    let sum = g.find(|op| matches!(op, Op::Reduce { kind: ReduceKind::Sum, .. }))[0];
    if shared {
        let m = g.operands(sum)[0];
        let neg = add(&mut g, Op::Unary(UnaryOp::Neg), &[m]);
        let max =
            add(&mut g, Op::Reduce { kind: ReduceKind::Max, axis: "d".into(), contract: false }, &[neg]);
        let both = add(&mut g, Op::Binary(BinaryOp::Add), &[sum, max]);
        let out = add(&mut g, Op::Store { axes: vec!["i".into(), "j".into()] }, &[both]);
        g.output = Some(out);
    }
    run_pass("contract", &mut g, &opts(target), &mut PassContext::default()).unwrap();
    foxc_ir::verify::verify(&g).unwrap();
    matches!(g.op(sum), Op::Reduce { contract: true, .. })
}

/// A node of `op` over `ops`, typed by the IR's own rule.
fn add(g: &mut Graph, op: Op, ops: &[ValueId]) -> ValueId {
    let tys: Vec<&ValueType> = ops.iter().map(|&o| g.ty(o)).collect();
    let ty = infer(&op, &tys).unwrap().unwrap();
    g.add(op, ty, ops, Span::default())
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

#[test]
fn contract_fires_on_a_sum_of_a_product() {
    assert!(contracts(Target::Cpu, false));
}

#[test]
fn contract_not_when_the_product_has_another_user() {
    assert!(!contracts(Target::Cpu, true));
}

#[test]
fn contract_leaves_the_gpu_targets_alone() {
    assert!(!contracts(Target::Sm90a, false));
}
