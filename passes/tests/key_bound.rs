//! The key bound (`keys_from`) the tiles pass writes under an expression mask is sound: on
//! fresh random captures (NaN among them) and random entries, every key `j < E(b, h, i)` is one
//! the mask drops, as the f64 interpreter evaluates both regions. And it is found for the
//! spellings of a lower bound on `j`, not for masks that bound nothing.

use foxc_ir::attention::Region;
use foxc_ir::interp::region::{Capture, RegionEval};
use foxc_ir::{Attention, Dim, Graph, Mask, Op};
use foxc_passes::{optimize, PassOptions};
use rand::{Rng, SeedableRng};

/// Bidirectional attention whose mask is `MASK` (`{}` standing for the scores), with row
/// vectors `lo`, `hi: f32[B, H, T]` to bound keys by.
fn program(mask: &str) -> String {
    let masked = mask.replace("{}", "s[b, h, i, j]");
    format!(
        "attention bounded(q: f32[B, H, T, D], k: f32[B, H, T, D], v: f32[B, H, T, D], lo: f32[B, H, T], hi: f32[B, H, T]) -> f32[B, H, T, D] {{
    s[b, h, i, j]   = sum(d, q[b, h, i, d] * k[b, h, j, d]) / sqrt(D)
    p[b, h, i, j]   = softmax(j, {masked})
    out[b, h, i, d] = sum(j, p[b, h, i, j] * v[b, h, j, d])
    return out
}}
"
    )
}

fn attention(mask: &str) -> Attention {
    let src = program(mask);
    let mut g: Graph = foxc_ir::frontend::compile("bounded.attn", src.as_bytes())
        .unwrap_or_else(|d| panic!("{}", d.render("bounded.attn", &src)))
        .graph;
    optimize(&mut g, &PassOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    let n = g.find(|op| matches!(op, Op::Attention(_)));
    let Op::Attention(a) = g.op(n[0]) else { unreachable!() };
    a.clone()
}

/// Masks with a lower bound on `j` (`lo` or `hi` of the row, or `i - 5`) and masks without.
const BOUNDED: &[&str] = &[
    "select(j >= lo[b, h, i], {}, -inf)",
    "select(lo[b, h, i] <= j, {}, -inf)",
    "select(j > lo[b, h, i] + 3, {}, -inf)",
    "select(i - 5 < j, {}, -inf)",
    "select(j >= max(lo[b, h, i], hi[b, h, i]), {}, -inf)",
];
const UNBOUNDED: &[&str] = &[
    "select(j <= hi[b, h, i], {}, -inf)",
    "select(lo[b, h, j] > 0, {}, -inf)",
    "select(j >= lo[b, h, j], {}, -inf)",
    "select(j < lo[b, h, i], -inf, {})",
    "select(lo[b, h, i] == lo[b, h, j], {}, -inf)",
];

#[test]
fn the_bound_is_found_for_lower_bounds_only() {
    for m in BOUNDED {
        let a = attention(m);
        assert!(matches!(a.mask, Mask::Expr(_)), "{m}: {:?}", a.mask);
        assert!(a.keys_from.is_some(), "{m}: no bound in {a}");
    }
    for m in UNBOUNDED {
        let a = attention(m);
        assert!(a.keys_from.is_none(), "{m}: a bound in {a}");
    }
}

/// Every `j < E` is masked, on fresh random captures: values around the key range, some NaN.
#[test]
fn every_key_below_the_bound_is_masked() {
    let seed: u64 = rand::random();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (b, h, t) = (2usize, 3usize, 40usize);
    let shape = [b, h, t];
    let dims = |d: &Dim| {
        d.eval(&|s| {
            [("B", b), ("H", h), ("T", t), ("D", 4)].into_iter().find(|x| x.0 == s).map(|x| x.1 as u64)
        })
    };
    // Every mask the pass gives a bound (a wrong acceptance among the others shows here too).
    for m in BOUNDED.iter().chain(UNBOUNDED) {
        let a = attention(m);
        let (Mask::Expr(mask), Some(e)) = (&a.mask, &a.keys_from) else { continue };
        for _round in 0..20 {
            let draw = |rng: &mut rand::rngs::StdRng| -> Vec<f64> {
                (0..b * h * t)
                    .map(|_| {
                        if rng.random_bool(0.05) {
                            f64::NAN
                        } else {
                            rng.random_range(-10.0..(t as f64 + 10.0))
                        }
                    })
                    .collect()
            };
            let (lo, hi) = (draw(&mut rng), draw(&mut rng));
            let caps = [Capture { shape: &shape, data: &lo }, Capture { shape: &shape, data: &hi }];
            let mut keep = RegionEval::new(mask, &caps, &dims).unwrap();
            let mut bound = RegionEval::new(e, &caps, &dims).unwrap();
            let mut below = 0;
            for bi in 0..b {
                for hi_ in 0..h {
                    for i in 0..t {
                        let ei = bound.eval(0.0, [bi, hi_, i, 0]);
                        for j in 0..t {
                            if (j as f64) < ei {
                                below += 1;
                                let k = keep.eval(0.0, [bi, hi_, i, j]);
                                assert_eq!(
                                    k, 0.0,
                                    "{m} (seed {seed}): j = {j} < E = {ei} at (b {bi}, h {hi_}, i {i}) kept"
                                );
                            }
                        }
                    }
                }
            }
            assert!(below > 0, "{m}: the bound never applied, the test cannot tell");
        }
    }
}

/// A causal program whose score drops keys below `lo` (`select(j >= lo, s, -inf)` inside the
/// causal mask: the context-parallel own-chunk partial) gets the bound from its score region,
/// and it is sound there too: every `j < E` scores `-inf` (fresh random captures and scores,
/// NaN among them). Its GPU kernel is the standard one (the bound is skipped there only).
#[test]
fn a_minus_inf_score_below_the_bound_is_a_bound_too() {
    let a = attention("select(j <= i, select(j >= lo[b, h, i], {}, -inf), -inf)");
    assert_eq!(a.mask, Mask::Causal);
    let e = a.keys_from.as_ref().expect("a bound from the score region");
    assert_eq!(a.kernel, foxc_ir::attention::AttnKernel::Standard);
    let seed: u64 = rand::random();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (b, h, t) = (1usize, 2usize, 50usize);
    let shape = [b, h, t];
    let dims = |d: &Dim| {
        d.eval(&|s| {
            [("B", b), ("H", h), ("T", t), ("D", 4)].into_iter().find(|x| x.0 == s).map(|x| x.1 as u64)
        })
    };
    let lo: Vec<f64> = (0..b * h * t)
        .map(|_| if rng.random_bool(0.05) { f64::NAN } else { rng.random_range(-5.0..55.0) })
        .collect();
    let caps = [Capture { shape: &shape, data: &lo }];
    let mut score = RegionEval::new(&a.score, &caps, &dims).unwrap();
    let mut bound = RegionEval::new(e, &caps, &dims).unwrap();
    let mut below = 0;
    for hi_ in 0..h {
        for i in 0..t {
            let ei = bound.eval(0.0, [0, hi_, i, 0]);
            for j in (0..t).filter(|&j| (j as f64) < ei) {
                below += 1;
                let x = if rng.random_bool(0.1) { f64::NAN } else { rng.random_range(-30.0..30.0) };
                let s = score.eval(x, [0, hi_, i, j]);
                assert_eq!(s, f64::NEG_INFINITY, "seed {seed}: j = {j} < E = {ei} at i {i} scores {s}");
            }
        }
    }
    assert!(below > 0);
}

/// The bound is an attribute of the tiles pass: printed, and unchanged by the value.
#[test]
fn the_bound_is_printed() {
    let a = attention(BOUNDED[0]);
    assert!(a.to_string().contains("keys_from = $0[b, h, i]"), "{a}");
    let _: &Region = a.keys_from.as_ref().unwrap();
}
