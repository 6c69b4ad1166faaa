//! `gradient_from_saved` (the attention's `out` and `lse` are inputs, as torch autograd keeps
//! them) against `gradient` (the forward recomputed inside), both run by the f64 interpreter:
//! the same gradients for every example, dense and pruned.

mod grad_common;

use foxc_ir::interp::{self, Tensor};
use foxc_ir::{Attention, Op, Tiles, Value};
use foxc_passes::grad::{
    forward_for_saved, gradient, gradient_from_saved, DOUT, SAVED_LSE, SAVED_OUT, SAVED_OUT_F32,
};
use foxc_passes::{optimize, PassOptions};
use grad_common::{examples, grads, inputs, smooth};
use std::collections::BTreeMap;

/// The forward's attention results (`out`, `lse`) on the inputs (without `dout`).
fn saved(fwd: &foxc_ir::Graph, ins: &BTreeMap<String, Tensor>) -> (Tensor, Tensor) {
    let att = fwd.find(|op| matches!(op, Op::Attention(_)))[0];
    let mut x = ins.clone();
    x.remove(DOUT);
    let out = Value::of(att);
    let lse = Value { node: att, result: Attention::LSE };
    let mut r = interp::eval_values(fwd, &x, &[out, lse]).unwrap();
    (r.remove(&out).unwrap(), r.remove(&lse).unwrap())
}

/// `gradient_from_saved`'s gradients on `ins` plus the saved results, with `lse` moved by
/// `lse_shift` (0 in the real checks).
fn saved_grads(
    fwd: &foxc_ir::Graph,
    ins: &BTreeMap<String, Tensor>,
    lse_shift: f64,
) -> BTreeMap<String, Tensor> {
    let prog = gradient_from_saved(fwd).unwrap_or_else(|e| panic!("{}: {e}", fwd.name));
    // The forward attention is gone: only the backward remains.
    assert!(
        prog.graph.find(|op| matches!(op, Op::Attention(_))).is_empty(),
        "{}: attention recomputed",
        fwd.name
    );
    assert_eq!(prog.graph.find(|op| matches!(op, Op::AttentionBackward(_))).len(), 1);
    assert!(prog.output("out").is_none());
    let (out, mut lse) = saved(fwd, ins);
    lse.data.iter_mut().for_each(|x| *x += lse_shift);
    let mut x = ins.clone();
    x.insert(SAVED_OUT.to_string(), out);
    x.insert(SAVED_LSE.to_string(), lse);
    grads(&prog, &x)
}

/// The largest |a - b| over every gradient, relative to the largest |b| of that gradient.
fn worst_difference(name: &str, got: &BTreeMap<String, Tensor>, want: &BTreeMap<String, Tensor>) -> f64 {
    let mut worst = 0.0f64;
    let names: Vec<&String> = want.keys().filter(|k| k.starts_with("grad_")).collect();
    assert!(!names.is_empty(), "{name}: no gradients");
    assert_eq!(got.keys().collect::<Vec<_>>(), names, "{name}: the same gradients");
    for n in names {
        let (a, b) = (&got[n], &want[n]);
        assert_eq!(a.shape, b.shape, "{name}: {n} shape");
        assert!(a.data.iter().all(|x| x.is_finite()), "{name}: {n} not finite");
        let scale = b.data.iter().fold(1e-30f64, |m, x| m.max(x.abs()));
        let d = a.data.iter().zip(&b.data).fold(0.0f64, |m, (x, y)| m.max((x - y).abs()));
        worst = worst.max(d / scale);
    }
    worst
}

/// Every example, dense and pruned (tiles small enough that pruning skips tiles), in f64
/// without rounding: the two programs compute the same gradients up to f64 rounding.
#[test]
fn saved_forward_gradients_equal_the_recomputed_ones() {
    let dims = BTreeMap::from([("B", 2), ("H", 2), ("G", 1), ("T", 40), ("D", 4), ("N", 13), ("M", 40)]);
    let mut tested = vec![];
    for (name, src) in examples() {
        for prune in [false, true] {
            let opts = PassOptions {
                prune,
                tiles: Some(Tiles { bm: 8, bn: 8 }),
                log_eps: -2.0,
                ..PassOptions::default()
            };
            let mut opt = src.clone();
            optimize(&mut opt, &opts).unwrap();
            let fwd = smooth(&opt);
            if fwd.find(|op| matches!(op, Op::Attention(_))).is_empty() {
                // The refuse_* examples stay unfused: refused with a reason, not miscomputed.
                let e = gradient_from_saved(&fwd).unwrap_err().to_string();
                assert!(e.contains("exactly one fused attention"), "{name}: {e}");
                continue;
            }
            for seed in [3, 4] {
                let ins = inputs(&fwd, &dims, seed, 1.0);
                let want = grads(&gradient(&fwd).unwrap(), &ins);
                let got = saved_grads(&fwd, &ins, 0.0);
                let worst = worst_difference(&name, &got, &want);
                assert!(worst <= 1e-12, "{name} prune={prune} seed {seed}: gradients differ by {worst:e}");
            }
            tested.push(format!("{name}{}", if prune { "+acp" } else { "" }));
        }
    }
    assert!(tested.len() >= 20, "tested: {tested:?}");
}

/// A wrong saved `lse` must show: the check above can fail.
#[test]
fn a_wrong_saved_lse_changes_the_gradients() {
    let dims = BTreeMap::from([("B", 1), ("H", 2), ("G", 1), ("T", 24), ("D", 4)]);
    let (_, src) = examples().into_iter().find(|(n, _)| n == "fox").unwrap();
    let mut opt = src.clone();
    optimize(&mut opt, &PassOptions::default()).unwrap();
    let fwd = smooth(&opt);
    let ins = inputs(&fwd, &dims, 5, 0.0);
    let want = grads(&gradient(&fwd).unwrap(), &ins);
    let got = saved_grads(&fwd, &ins, 1e-3);
    assert!(worst_difference("fox", &got, &want) > 1e-6);
}

/// As written (bf16 inputs and output): `forward_for_saved` computes the program's output, the
/// attention's unrounded f32 output and lse; fed to the saved-forward program they give
/// `gradient`'s gradients exactly. The bf16-rounded output instead moves the decay gradients
/// (delta_i = dout_i . out_i carries the rounding; the sums of dS that cancel amplify it).
#[test]
fn the_widened_forward_feeds_the_saved_program_exactly() {
    let dims = BTreeMap::from([("B", 1), ("H", 2), ("G", 1), ("T", 32), ("D", 8)]);
    for name in ["fox", "fox_qknorm", "alibi"] {
        let (_, src) = examples().into_iter().find(|(n, _)| n == name).unwrap();
        let mut fwd = src.clone();
        optimize(&mut fwd, &PassOptions::default()).unwrap();
        let ins = inputs(&fwd, &dims, 9, 0.0);
        let want = grads(&gradient(&fwd).unwrap(), &ins);
        let (wide, outs) = forward_for_saved(&fwd).unwrap();
        let names: Vec<&str> = outs.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["out", SAVED_LSE, SAVED_OUT_F32], "{name}");
        let mut x = ins.clone();
        x.remove(DOUT);
        let values: Vec<Value> = outs.iter().map(|(_, v)| *v).collect();
        let r = interp::eval_values(&wide, &x, &values).unwrap();
        // The program's output is the forward's (bf16), unchanged by the widening.
        let plain = interp::run(&fwd, &x).unwrap().output;
        assert_eq!(r[&values[0]].data, plain.data, "{name}: output");
        let prog = gradient_from_saved(&fwd).unwrap();
        let mut s = ins.clone();
        s.insert(SAVED_LSE.to_string(), r[&values[1]].clone());
        s.insert(SAVED_OUT.to_string(), r[&values[2]].clone());
        let worst = worst_difference(name, &grads(&prog, &s), &want);
        assert!(worst <= 1e-12, "{name}: {worst:e}");
        // The rounded output: close, not equal.
        s.insert(SAVED_OUT.to_string(), r[&values[0]].clone());
        let worst = worst_difference(name, &grads(&prog, &s), &want);
        assert!(worst > 1e-9 && worst <= 5e-2, "{name}: {worst:e}");
    }
}

#[test]
fn programs_it_cannot_take_are_refused_with_a_reason() {
    let (_, src) = examples().into_iter().find(|(n, _)| n == "fox").unwrap();
    // Before the passes there is no fused attention.
    let e = gradient_from_saved(&src).unwrap_err().to_string();
    assert!(e.contains("exactly one fused attention"), "{e}");
    // An output computed after the attention.
    let mut opt = src.clone();
    optimize(&mut opt, &PassOptions::default()).unwrap();
    let att = opt.output.unwrap();
    let ty = opt.ty(att).clone();
    let neg = opt.add(Op::Unary(foxc_ir::UnaryOp::Neg), ty, &[att], foxc_ir::Span::default());
    opt.output = Some(neg);
    let e = gradient_from_saved(&opt).unwrap_err().to_string();
    assert!(e.contains("after it"), "{e}");
}
