//! Programs off the beaten path: the passes must neither panic nor produce invalid IR
//! (the pass manager verifies after every pass), and must stay meaning-preserving.

use foxc_ir::interp::{self, Tensor};
use foxc_ir::{Dim, Graph, Op, Prune};
use foxc_passes::{optimize, PassOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;

/// Output (before the final cast, if any) of `g` on fresh inputs of small size.
fn output(g: &Graph, seed: u64) -> Tensor {
    let mut g = g.clone();
    let out = g.output.unwrap();
    if matches!(g.op(out), Op::Cast) {
        g.output = Some(g.operands(out)[0]);
        g.remove_dead();
    }
    let mut rng = StdRng::seed_from_u64(seed);
    let size = |d: &Dim| match d {
        Dim::Sym(s) if s == "T" => 11,
        Dim::Sym(_) => 3,
        Dim::Const(c) => *c as usize,
        other => panic!("parameter dim {other}"),
    };
    let inputs: BTreeMap<String, Tensor> = g
        .params
        .iter()
        .map(|p| {
            let shape: Vec<usize> = p.ty.dims().map(size).collect();
            (p.name.clone(), Tensor::from_fn(&shape, |_| rng.random_range(-2.0..2.0)))
        })
        .collect();
    interp::run(&g, &inputs).unwrap().output
}

fn check(src: &str) -> (bool, Vec<String>) {
    let mut g = foxc_ir::frontend::compile("odd.attn", src.as_bytes())
        .unwrap_or_else(|d| panic!("{}", d.render("odd.attn", src)))
        .graph;
    let original = g.clone();
    let report = optimize(&mut g, &PassOptions::default()).unwrap_or_else(|e| panic!("{e}\n{src}"));
    let mut dense = original.clone();
    optimize(&mut dense, &PassOptions { prune: false, ..PassOptions::default() }).unwrap();
    for seed in 0..3 {
        let (want, got) = (output(&original, seed), output(&dense, seed));
        let scale = want.data.iter().fold(1e-300f64, |m, x| m.max(x.abs()));
        let err = want.data.iter().zip(&got.data).fold(0.0f64, |m, (a, b)| m.max((a - b).abs())) / scale;
        assert!(err < 1e-9, "relative error {err}\n{src}");
    }
    let pruned = !g.find(|op| matches!(op, Op::Attention(a) if a.prune != Prune::Dense)).is_empty();
    (pruned, report.explanations.into_iter().map(|e| e.message).collect())
}

#[test]
fn odd_but_valid_programs() {
    // Not attention at all.
    let (p, ex) = check(
        "attention a(g: f32[B, H, T]) -> f32[B, H, T] {
            c[b, h, t] = cumsum(t, logsigmoid(g[b, h, t]))
            return c
        }",
    );
    assert!(!p && !ex.is_empty());
    // Sequence-first layout [B, T, H, D]: fused through stores that reorder, still pruned.
    let (p, ex) = check(
        "attention a(q: f32[B, T, H, D], k: f32[B, T, H, D], v: f32[B, T, H, E], z: f32[B, H, T]) -> f32[B, H, T, E] {
            c[b, h, t] = cumsum(t, logsigmoid(z[b, h, t]))
            s[b, h, i, j] = sum(d, q[b, i, h, d] * k[b, j, h, d]) * 0.125 + c[b, h, i] - c[b, h, j]
            out[b, h, i, e] = sum(j, softmax(j, causal(i, j, s[b, h, i, j])) * v[b, j, h, e])
            return out
        }",
    );
    assert!(p, "{ex:?}");
    // A constant scale, a bias with a coefficient: 2 * (c[i] - c[j]) is 2c[i] - 2c[j].
    let (p, ex) = check(
        "attention a(q: f32[B, H, T, D], k: f32[B, H, T, D], v: f32[B, H, T, D], z: f32[B, H, T]) -> f32[B, H, T, D] {
            c[b, h, t] = cumsum(t, logsigmoid(z[b, h, t]))
            out[b, h, i, e] = sum(j, softmax(j, causal(i, j, sum(d, q[b, h, i, d] * k[b, h, j, d]) + 2 * (c[b, h, i] - c[b, h, j]))) * v[b, h, j, e])
            return out
        }",
    );
    assert!(p, "{ex:?}");
    // A bias that couples i and j: recognized as not of the form c[i] - c[j].
    let (p, ex) = check(
        "attention a(q: f32[B, H, T, D], k: f32[B, H, T, D], v: f32[B, H, T, D]) -> f32[B, H, T, D] {
            out[b, h, i, e] = sum(j, softmax(j, causal(i, j, sum(d, q[b, h, i, d] * k[b, h, j, d]) - (i - j) * (i - j))) * v[b, h, j, e])
            return out
        }",
    );
    assert!(!p && !ex.is_empty(), "{ex:?}");
}

/// Keys of another length than the queries (`k: [B, H, S, D]`, here more queries than keys):
/// without a decay or a causal mask the queries' key positions play no part, so it is fused as
/// dense cross-attention and means the same (`check` compares it with the program as written);
/// it was once an internal error (found by the context-parallel work, which wrote such a program).
#[test]
fn keys_of_another_length_fuse_as_cross_attention() {
    let (pruned, ex) = check(
        "attention a(q: f32[B, H, T, D], k: f32[B, H, S, D], v: f32[B, H, S, D]) -> f32[B, H, T, D] {
            s[b, h, i, j] = sum(d, q[b, h, i, d] * k[b, h, j, d])
            p[b, h, i, j] = softmax(j, s[b, h, i, j])
            out[b, h, i, d] = sum(j, p[b, h, i, j] * v[b, h, j, d])
            return out
        }",
    );
    assert!(!pruned);
    assert!(!ex.iter().any(|m| m.starts_with("not fused:")), "{ex:?}");
    assert!(ex.iter().any(|m| m.starts_with("not pruned:") && m.contains("not causally masked")), "{ex:?}");
}

/// An infinite scale of `q . k` stays unfused: recognition moves a scale it cannot spell onto
/// q, and `inf (q . k) = (inf q) . k` is false (an infinity of the dot's sign against a sum of
/// infinities of both signs, NaN). The optimized program gives the source's values, NaN where
/// the source has NaN and nowhere else. Found by `fuzz_programs` ("optimized dense graph
/// differs: 0 vs NaN", a random near-miss spelling with `* inf`); shown failing: without the
/// refusal the program fused.
#[test]
fn an_infinite_scale_stays_unfused() {
    let src = "attention a(q: f32[B, H, T, D], k: f32[B, H, T, D], v: f32[B, H, T, D]) -> f32[B, H, T, D] {
        s[b, h, i, j] = sum(d, q[b, h, i, d] * k[b, h, j, d]) * inf
        out[b, h, i, e] = sum(j, softmax(j, causal(i, j, s[b, h, i, j])) * v[b, h, j, e])
        return out
    }";
    let g = foxc_ir::frontend::compile("odd.attn", src.as_bytes()).unwrap().graph;
    let mut o = g.clone();
    let report = optimize(&mut o, &PassOptions::default()).unwrap();
    assert!(o.find(|op| matches!(op, Op::Attention(_))).is_empty());
    assert!(
        report.explanations.iter().any(|e| e.message.contains("scale of `q . k` is infinite")),
        "{:?}",
        report.explanations
    );
    for seed in 0..3 {
        let (want, got) = (output(&g, seed), output(&o, seed));
        assert!(want.data.iter().any(|x| x.is_nan()) && want.data.iter().any(|x| !x.is_nan()));
        for (a, b) in want.data.iter().zip(&got.data) {
            assert!(
                a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()) || (a - b).abs() < 1e-9,
                "{a} vs {b}"
            );
        }
    }
}

/// A scale and its inverse around `q . k` (`21 * (x / 21)`): recognition ends, fuses and
/// prunes. Its e-graph holds the cycle `x = 21 * (x / 21)`, on which each visit's rounding
/// shaved an ulp off the interval analysis's bounds and counted as a change: the rebuild went
/// round it without end (`fuzz_programs` hung on this spelling; shown failing: the test
/// timed out before the merge ignored moves within rounding).
#[test]
fn a_scale_and_its_inverse_recognize_in_bounded_time() {
    let src = "attention a(q: f32[B, H, T, D], k: f32[B, H, T, D], v: f32[B, H, T, D], fgate: f32[B, H, T]) -> f32[B, H, T, D] {
        c[b, h, t] = cumsum(t, logsigmoid(fgate[b, h, t]))
        s[b, h, i, j] = 21 * (sum(d, q[b, h, i, d] * k[b, h, j, d]) / sqrt(D) / 21) - (c[b, h, j] - c[b, h, i])
        out[b, h, i, e] = sum(j, softmax(j, window(i, j, 5, s[b, h, i, j])) * v[b, h, j, e])
        return out
    }";
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(check(src)).unwrap());
    let (pruned, ex) = rx.recv_timeout(std::time::Duration::from_secs(60)).expect("optimized within 60 s");
    assert!(pruned, "{ex:?}");
}
