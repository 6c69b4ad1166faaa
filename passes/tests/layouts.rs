//! Sequence-first tensors (`[B, T, H, D]`, the layout of most model code): FoX read in that
//! layout is one pruned attention whatever names its query axis, the causal mask (`causal(i,
//! j, ..)`) or a select of the scores (`j <= i + M - N`, queries at the end of the keys), where
//! the query axis is the output's second; and the fused graph computes what the program as
//! written does (the f64 interpreter on fresh random inputs).

mod common;

use foxc_ir::interp::{self, Tensor};
use foxc_ir::print::print_graph;
use foxc_ir::{Graph, Op, Prune};
use foxc_passes::{optimize, PassOptions};
use std::collections::BTreeMap;

/// FoX over `[B, T, H, D]` tensors: `n` queries at the end of `m` keys (`n` = `m` = `T`: the
/// causal mask; else a select of the scores).
fn program(square: bool) -> String {
    let (n, m, pos, mask) = if square {
        ("T", "T", "i", "causal(i, j, s[b, h, i, j])")
    } else {
        ("N", "M", "i + M - N", "select(j <= i + M - N, s[b, h, i, j], -inf)")
    };
    format!(
        "attention seq_first(q: f32[B, {n}, H, D], k: f32[B, {m}, H, D], v: f32[B, {m}, H, D], fgate: f32[B, {m}, H]) -> f32[B, {n}, H, D] {{
    c[b, h, t]      = cumsum(t, logsigmoid(fgate[b, t, h]))
    s[b, h, i, j]   = sum(d, q[b, i, h, d] * k[b, j, h, d]) / sqrt(D) + c[b, h, {pos}] - c[b, h, j]
    p[b, h, i, j]   = softmax(j, {mask})
    out[b, i, h, d] = sum(j, p[b, h, i, j] * v[b, j, h, d])
    return out
}}
"
    )
}

fn compile(src: &str) -> Graph {
    common::compile_text("seq_first.attn", src)
}

/// Values in [-scale, scale) from a xorshift seeded by `seed`.
fn tensor(seed: &mut u64, shape: &[usize], scale: f64) -> Tensor {
    let n = shape.iter().product();
    let data = (0..n)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            ((*seed >> 11) as f64 / (1u64 << 52) as f64 - 1.0) * scale
        })
        .collect();
    Tensor::new(shape, data)
}

#[test]
fn sequence_first_fox_is_one_pruned_attention() {
    for square in [true, false] {
        let g = compile(&program(square));
        let mut o = g.clone();
        optimize(&mut o, &PassOptions::default()).unwrap_or_else(|e| panic!("{e}"));
        let attn = o.find(|op| matches!(op, Op::Attention(a) if a.prune != Prune::Dense && a.decay));
        assert_eq!(attn.len(), 1, "square = {square}:\n{}", print_graph(&o));
        let (b, h, n, m, d) = (2, 3, if square { 300 } else { 5 }, 300, 8);
        let fresh =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
        let mut seed = fresh | 1;
        let x = BTreeMap::from([
            ("q".to_string(), tensor(&mut seed, &[b, n, h, d], 2.0)),
            ("k".to_string(), tensor(&mut seed, &[b, m, h, d], 2.0)),
            ("v".to_string(), tensor(&mut seed, &[b, m, h, d], 1.0)),
            ("fgate".to_string(), tensor(&mut seed, &[b, m, h], 3.0)),
        ]);
        let written = interp::run(&g, &x).unwrap().output;
        let fused = interp::run(&o, &x).unwrap().output;
        assert_eq!(written.shape, vec![b, n, h, d]);
        // The pruned mass is below eps = e^-10 per row: the outputs move by at most 2 eps max|v|.
        let bound = 2.0 * (-10f64).exp();
        for (p, q) in written.data.iter().zip(&fused.data) {
            assert!((p - q).abs() <= bound, "square = {square}, seed {fresh:#x}: {p} vs {q}");
        }
    }
}
