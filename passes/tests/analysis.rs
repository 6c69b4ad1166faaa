//! Soundness of the e-graph analysis behind the monotonicity proofs: for random scalar terms
//! over parameters with declared ranges, every value the term takes (at random points of the
//! ranges) lies in the interval the analysis derives after saturation with the rewrite rules.
//! An unsound rule or interval rule would show up as a value outside its class's interval.

use egg::{Id, RecExpr, Symbol};
use foxc_ir::UnaryOp;
use foxc_passes::lang::{rules, runner, Attn, AttnAnalysis, AttnGraph, Num};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;

/// Leaves: name and declared range (None: unconstrained).
const LEAVES: &[(&str, Option<(f64, f64)>)] =
    &[("x", Some((-3.0, 2.0))), ("y", Some((0.0, 1.0))), ("n", Some((-5.0, -0.5))), ("z", None)];

#[derive(Clone, Debug)]
enum T {
    Leaf(usize),
    Num(f64),
    Un(u8, Box<T>),
    Bin(u8, Box<T>, Box<T>),
}

fn term() -> impl Strategy<Value = T> {
    let leaf = prop_oneof![
        (0..LEAVES.len()).prop_map(T::Leaf),
        prop_oneof![Just(0.0), Just(1.0), Just(-1.0), Just(0.5), Just(-2.0)].prop_map(T::Num),
    ];
    leaf.prop_recursive(5, 24, 2, |inner| {
        prop_oneof![
            (0u8..13, inner.clone()).prop_map(|(o, a)| T::Un(o, Box::new(a))),
            (0u8..5, inner.clone(), inner).prop_map(|(o, a, b)| T::Bin(o, Box::new(a), Box::new(b))),
        ]
    })
}

fn build(t: &T, e: &mut RecExpr<Attn>) -> Id {
    match t {
        T::Leaf(i) => {
            let s = e.add(Attn::Symbol(Symbol::from(LEAVES[*i].0)));
            e.add(Attn::In(vec![s].into_boxed_slice()))
        }
        T::Num(x) => e.add(Attn::Num(Num::new(*x))),
        T::Un(o, a) => {
            let a = build(a, e);
            e.add(match o {
                0 => Attn::Unary(UnaryOp::Neg, [a]),
                1 => Attn::Unary(UnaryOp::Exp, [a]),
                2 => Attn::Unary(UnaryOp::Log, [a]),
                3 => Attn::Unary(UnaryOp::Sigmoid, [a]),
                4 => Attn::Unary(UnaryOp::LogSigmoid, [a]),
                5 => Attn::Unary(UnaryOp::Softplus, [a]),
                6 => Attn::Unary(UnaryOp::Relu, [a]),
                7 => Attn::Unary(UnaryOp::Sqrt, [a]),
                8 => Attn::Recip(a),
                9 => Attn::Unary(UnaryOp::Tanh, [a]),
                10 => Attn::Unary(UnaryOp::Abs, [a]),
                11 => Attn::Unary(UnaryOp::Exp2, [a]),
                _ => Attn::Unary(UnaryOp::Log2, [a]),
            })
        }
        T::Bin(o, a, b) => {
            let (a, b) = (build(a, e), build(b, e));
            e.add(match o {
                0 => Attn::Add([a, b]),
                1 => Attn::Sub([a, b]),
                2 => Attn::Mul([a, b]),
                3 => Attn::Min([a, b]),
                _ => Attn::Max([a, b]),
            })
        }
    }
}

fn eval(t: &T, env: &[f64]) -> f64 {
    match t {
        T::Leaf(i) => env[*i],
        T::Num(x) => *x,
        T::Un(o, a) => {
            let a = eval(a, env);
            match o {
                0 => -a,
                1 => a.exp(),
                2 => a.ln(),
                3 => 1.0 / (1.0 + (-a).exp()),
                4 | 5 if a.is_nan() => a,
                4 => a.min(0.0) - (-a.abs()).exp().ln_1p(),
                5 => a.max(0.0) + (-a.abs()).exp().ln_1p(),
                6 if a.is_nan() => a,
                6 => a.max(0.0),
                7 => a.sqrt(),
                8 => 1.0 / a,
                9 => a.tanh(),
                10 => a.abs(),
                11 => a.exp2(),
                _ => a.log2(),
            }
        }
        T::Bin(o, a, b) => {
            let (a, b) = (eval(a, env), eval(b, env));
            match o {
                0 => a + b,
                1 => a - b,
                2 => a * b,
                // NaN propagates through min and max, as in the interpreter.
                _ if a.is_nan() || b.is_nan() => f64::NAN,
                3 => a.min(b),
                _ => a.max(b),
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn intervals_contain_every_value(t in term(), seed in any::<u64>()) {
        let mut e = RecExpr::default();
        build(&t, &mut e);
        let ranges: BTreeMap<Symbol, (f64, f64)> =
            LEAVES.iter().filter_map(|(n, r)| r.map(|r| (Symbol::from(*n), r))).collect();
        let mut eg = AttnGraph::new(AttnAnalysis { ranges });
        let root = eg.add_expr(&e);
        let runner = runner(6, 5_000).with_egraph(eg).run(&rules());
        let d = &runner.egraph[runner.egraph.find(root)].data;
        let mut rng = StdRng::seed_from_u64(seed);
        for _ in 0..64 {
            let env: Vec<f64> = LEAVES
                .iter()
                .map(|(_, r)| match r {
                    Some((lo, hi)) => rng.random_range(*lo..=*hi),
                    None => rng.random_range(-30.0..30.0),
                })
                .collect();
            let v = eval(&t, &env);
            if v.is_nan() {
                continue;
            }
            let tol = if v.is_finite() { 1e-9 * (1.0 + v.abs()) } else { 0.0 };
            prop_assert!(d.lo - tol <= v && v <= d.hi + tol, "{} = {} outside [{}, {}] at {:?}", e, v, d.lo, d.hi, env);
        }
    }
}

/// Found by `intervals_contain_every_value`: `logsigmoid(x * (x * 0))` is derived along several
/// paths whose point intervals differ in the last bit; the merge intersected them to the empty
/// interval `[inf, -inf]`, which then spread to the root (shown failing before the fix).
#[test]
fn rounding_apart_derivations_do_not_empty_an_interval() {
    let e: RecExpr<Attn> = "(* (logsigmoid (* (in x) (* (in x) 0))) (- (+ 1 0) 1))".parse().unwrap();
    let ranges: BTreeMap<Symbol, (f64, f64)> =
        LEAVES.iter().filter_map(|(n, r)| r.map(|r| (Symbol::from(*n), r))).collect();
    let mut eg = AttnGraph::new(AttnAnalysis { ranges });
    let root = eg.add_expr(&e);
    let runner = runner(6, 5_000).with_egraph(eg).run(&rules());
    for c in runner.egraph.classes() {
        assert!(c.data.lo <= c.data.hi, "class {}: empty interval [{}, {}]", c.id, c.data.lo, c.data.hi);
    }
    let d = &runner.egraph[runner.egraph.find(root)].data;
    assert!(d.lo <= 0.0 && 0.0 <= d.hi, "root [{}, {}]", d.lo, d.hi);
}

/// A NaN literal (what constant folding leaves of `inf - inf`) in a class that becomes its own
/// descendant through unions (`x = -(-x)`: a cycle, as the rewrite rules make them):
/// rebuilding terminates. The literal's interval was `[NaN, NaN]`, and the analysis compared
/// its data with `!=`, to which NaN is never equal to itself, so every merge reported a change
/// and the rebuild re-queued the cycle forever (a random near-miss program of `fuzz_programs`
/// hung the recognizer for over 20 minutes).
#[test]
fn a_nan_literal_on_a_cycle_rebuilds() {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut eg = AttnGraph::default();
        let nan = eg.add(Attn::Num(Num::new(f64::NAN)));
        let neg = eg.add(Attn::Unary(UnaryOp::Neg, [nan]));
        let negneg = eg.add(Attn::Unary(UnaryOp::Neg, [neg]));
        eg.union(nan, negneg);
        eg.rebuild();
        let d = eg[eg.find(nan)].data.clone();
        tx.send(d).unwrap();
    });
    let d = rx.recv_timeout(std::time::Duration::from_secs(20)).expect("the rebuild ends within 20 s");
    assert!(!d.lo.is_nan() && !d.hi.is_nan(), "{d:?}");
}
