//! `fuse-gradient-casts` (`passes::fuse_grad`) on the gradient program of every example for a
//! GPU target: where it applies, the backward writes its dq, dk, dv in the casts' dtype
//! (`grads = bf16`), the casts are gone, the outputs name the backward's results, and the f64
//! interpreter gives the same bits as the program before the step (the backward rounds its
//! results as the casts did). Where a gradient has another use (QK-norm: dq flows on into the
//! norm's backward) and on the CPU target nothing changes.
//!
//! Shown failing: with the interpreter's rounding of a narrower backward result removed,
//! `fused_casts_give_the_same_bits` failed (alibi's grad_k, the first example it fused).

mod grad_common;

use foxc_ir::{DType, Op, Tiles};
use foxc_passes::fuse_grad::{gradient_casts, optimize_gradient};
use foxc_passes::grad::gradient;
use foxc_passes::{optimize, PassOptions, Target};
use grad_common::{examples, grads, inputs};
use std::collections::BTreeMap;

fn options(target: Target) -> PassOptions {
    PassOptions { target, tiles: Some(Tiles { bm: 8, bn: 8 }), log_eps: -2.0, ..PassOptions::default() }
}

/// The grads dtype of the program's backward, if it has one.
fn grads_dtype(g: &foxc_ir::Graph) -> Option<DType> {
    g.find(|op| matches!(op, Op::AttentionBackward(_))).first().map(|&n| match g.op(n) {
        Op::AttentionBackward(a) => a.grad_dtype,
        _ => unreachable!(),
    })
}

#[test]
fn fused_casts_give_the_same_bits() {
    let dims = BTreeMap::from([("B", 2), ("H", 2), ("G", 1), ("T", 40), ("D", 8), ("N", 13), ("M", 40)]);
    let (mut fused, mut kept) = (vec![], vec![]);
    for (name, src) in examples() {
        let mut opt = src.clone();
        optimize(&mut opt, &options(Target::Sm90a)).unwrap();
        let Ok(before) = gradient(&opt) else { continue };
        if grads_dtype(&before.graph).is_none() {
            continue;
        }
        let mut after = before.clone();
        gradient_casts(&mut after);
        foxc_ir::verify::verify(&after.graph).unwrap_or_else(|e| panic!("{name}: {e}"));
        match grads_dtype(&after.graph) {
            Some(DType::F32) => {
                kept.push(name.clone());
                continue;
            }
            Some(dt) => assert_eq!(dt, DType::BF16, "{name}"),
            None => panic!("{name}: the backward is gone"),
        }
        let casts = |p: &foxc_passes::grad::GradProgram| p.graph.find(|op| matches!(op, Op::Cast)).len();
        assert_eq!(casts(&after) + 3, casts(&before), "{name}: three casts fewer");
        for (out, v) in &after.outputs {
            if ["grad_q", "grad_k", "grad_v"].contains(&out.as_str()) {
                assert!(matches!(after.graph.op(v.node), Op::AttentionBackward(_)), "{name}: {out}");
            }
        }
        let ins = inputs(&opt, &dims, 11, 0.5);
        let (want, got) = (grads(&before, &ins), grads(&after, &ins));
        assert_eq!(want.keys().collect::<Vec<_>>(), got.keys().collect::<Vec<_>>(), "{name}");
        for (k, w) in &want {
            let bits = |t: &foxc_ir::interp::Tensor| t.data.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert!(bits(w) == bits(&got[k]), "{name}: {k} differs");
        }
        fused.push(name);
    }
    assert!(fused.len() >= 10, "fused: {fused:?}");
    assert!(kept.contains(&"fox_qknorm".to_string()), "kept f32: {kept:?}");
}

#[test]
fn the_cpu_target_keeps_f32_gradients() {
    let (_, src) = examples().into_iter().find(|(n, _)| n == "fox").unwrap();
    let mut opt = src.clone();
    optimize(&mut opt, &options(Target::Cpu)).unwrap();
    let mut p = gradient(&opt).unwrap();
    optimize_gradient(&mut p, Target::Cpu);
    assert_eq!(grads_dtype(&p.graph), Some(DType::F32));
    let mut opt = src.clone();
    optimize(&mut opt, &options(Target::Sm90a)).unwrap();
    let mut p = gradient(&opt).unwrap();
    optimize_gradient(&mut p, Target::Sm90a);
    assert_eq!(grads_dtype(&p.graph), Some(DType::BF16));
}
