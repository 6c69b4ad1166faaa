//! The gradient program, run by the f64 interpreter, against central finite differences of the
//! forward: every example (dense), and the pruned examples with the kept set held fixed.

mod grad_common;

use foxc_ir::interp;
use foxc_ir::{Op, Tiles};
use foxc_passes::grad::gradient;
use foxc_passes::{optimize, PassOptions};
use grad_common::{examples, grads, inputs, loss, smooth};
use std::collections::BTreeMap;

const H: f64 = 1e-5;

/// Compare every gradient coordinate with `(L(x + h) - L(x - h)) / 2h`. With `frozen`, a
/// coordinate whose perturbation changes that node's value (the block boundary) is skipped;
/// returns (checked, skipped).
fn check_fd(
    name: &str,
    fwd: &foxc_ir::Graph,
    dims: &BTreeMap<&str, usize>,
    seed: u64,
    decay: f64,
    frozen: Option<foxc_ir::ValueId>,
) -> (usize, usize) {
    let prog = gradient(fwd).unwrap_or_else(|e| panic!("{name}: {e}"));
    let ins = inputs(fwd, dims, seed, decay);
    let got = grads(&prog, &ins);
    // The forward's inputs (without dout) of a perturbed input set.
    let fwd_only = |x: &BTreeMap<String, interp::Tensor>| {
        let mut x = x.clone();
        x.remove(foxc_passes::grad::DOUT);
        x
    };
    let base_start = frozen.map(|n| interp::eval(fwd, &fwd_only(&ins), &[n]).unwrap()[&n].clone());
    let (mut checked, mut skipped) = (0, 0);
    for p in &fwd.params {
        if !p.ty.dtype.is_float() {
            continue;
        }
        let g = &got[&format!("grad_{}", p.name)];
        assert_eq!(g.shape, ins[&p.name].shape, "{name}: grad_{} shape", p.name);
        let scale = g.data.iter().fold(1.0f64, |m, x| m.max(x.abs()));
        for idx in 0..g.data.len() {
            let mut plus = ins.clone();
            plus.get_mut(&p.name).unwrap().data[idx] += H;
            let mut minus = ins.clone();
            minus.get_mut(&p.name).unwrap().data[idx] -= H;
            if let (Some(n), Some(base)) = (frozen, &base_start) {
                let moved = |x: &BTreeMap<String, interp::Tensor>| {
                    &interp::eval(fwd, &fwd_only(x), &[n]).unwrap()[&n] != base
                };
                if moved(&plus) || moved(&minus) {
                    skipped += 1;
                    continue;
                }
            }
            let fd = (loss(fwd, &plus) - loss(fwd, &minus)) / (2.0 * H);
            let an = g.data[idx];
            assert!(
                (fd - an).abs() <= 2e-6 * scale,
                "{name}: grad_{}[{idx}] = {an}, finite differences give {fd} (seed {seed})",
                p.name
            );
            checked += 1;
        }
    }
    (checked, skipped)
}

#[test]
fn every_example_matches_finite_differences_dense() {
    let dims = BTreeMap::from([("B", 1), ("H", 4), ("G", 2), ("T", 7), ("D", 3)]);
    let opts = PassOptions { prune: false, ..PassOptions::default() };
    let mut tested = vec![];
    for (name, src) in examples() {
        let mut opt = src.clone();
        optimize(&mut opt, &opts).unwrap();
        let fwd = smooth(&opt);
        for seed in 0..2 {
            let (checked, _) = check_fd(&name, &fwd, &dims, seed, 0.0, None);
            assert!(checked > 0, "{name}: nothing checked");
        }
        tested.push(name);
    }
    assert!(tested.len() >= 10, "examples tested: {tested:?}");
}

#[test]
fn pruned_examples_match_finite_differences_with_the_kept_set_fixed() {
    let dims = BTreeMap::from([("B", 1), ("H", 2), ("G", 1), ("T", 40), ("D", 3)]);
    let opts = PassOptions { tiles: Some(Tiles { bm: 8, bn: 8 }), log_eps: -2.0, ..PassOptions::default() };
    let mut pruned = 0;
    for (name, src) in examples() {
        let mut opt = src.clone();
        optimize(&mut opt, &opts).unwrap();
        let fwd = smooth(&opt);
        let Some(&bb) = fwd.find(|op| matches!(op, Op::BlockBoundary(_))).first() else { continue };
        // Pruning really skips tiles at this setting.
        let mut ins = inputs(&fwd, &dims, 7, 1.0);
        ins.remove(foxc_passes::grad::DOUT);
        let stats = interp::run(&fwd, &ins).unwrap().prune;
        assert!(stats.iter().any(|s| s.kept_fraction() < 1.0), "{name}: nothing pruned ({stats:?})");
        let (checked, skipped) = check_fd(&name, &fwd, &dims, 7, 1.0, Some(bb));
        assert!(checked > 4 * skipped, "{name}: {skipped} coordinates moved the boundary, {checked} checked");
        pruned += 1;
    }
    assert!(pruned >= 4, "pruned examples: {pruned}");
}
