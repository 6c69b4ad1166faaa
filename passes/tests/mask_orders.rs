//! Expression masks in both orders of `select`: `select(c, s, -inf)` keeps where `c` holds,
//! `select(c, -inf, s)` where it does not. Both become the same `attention` node, whose mask
//! region is the keep-condition, and the fused node computes what the program as written does
//! (the f64 interpreter on fresh random inputs, before and after the passes).

mod common;

use foxc_ir::interp::{self, Tensor};
use foxc_ir::print::print_graph;
use foxc_ir::{Attention, Graph, Mask, Op};
use foxc_passes::{optimize, PassOptions};
use std::collections::BTreeMap;

/// FoX with `p = softmax(j, MASK)`, `{}` in `mask` standing for the scores, and a key mask
/// tensor `m: f32[B, H, T]`.
fn program(mask: &str) -> String {
    let masked = mask.replace("{}", "s[b, h, i, j]");
    format!(
        "attention masked(q: f32[B, H, T, D], k: f32[B, H, T, D], v: f32[B, H, T, D], fgate: f32[B, H, T], m: f32[B, H, T]) -> f32[B, H, T, D] {{
    c[b, h, t]      = cumsum(t, logsigmoid(fgate[b, h, t]))
    s[b, h, i, j]   = sum(d, q[b, h, i, d] * k[b, h, j, d]) / sqrt(D) + c[b, h, i] - c[b, h, j]
    p[b, h, i, j]   = softmax(j, {masked})
    out[b, h, i, d] = sum(j, p[b, h, i, j] * v[b, h, j, d])
    return out
}}
"
    )
}

fn compile(src: &str) -> Graph {
    common::compile_text("masked.attn", src)
}

fn optimized(g: &Graph) -> Graph {
    let mut o = g.clone();
    optimize(&mut o, &PassOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    o
}

/// The mask region of the one attention node, captures named by their parameters.
fn mask_text(g: &Graph) -> String {
    let n = g.find(|op| matches!(op, Op::Attention(_)));
    assert_eq!(n.len(), 1, "{}", print_graph(g));
    let Op::Attention(a) = g.op(n[0]) else { unreachable!() };
    let Mask::Expr(r) = &a.mask else { panic!("not an expression mask: {:?}", a.mask) };
    let ops = Attention::operands(g, n[0]).unwrap();
    r.display_with(&|k| {
        g.params.iter().find(|p| p.node == ops.captures[k]).map(|p| p.name.clone()).unwrap_or_default()
    })
}

/// A small deterministic generator (xorshift), values in [-1, 1).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }
}

fn inputs(seed: u64) -> BTreeMap<String, Tensor> {
    let (b, h, t, d) = (1, 2, 9, 4);
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut tensor = |shape: &[usize], scale: f64| {
        let n = shape.iter().product();
        Tensor::new(shape, (0..n).map(|_| rng.next() * scale).collect())
    };
    BTreeMap::from([
        ("q".into(), tensor(&[b, h, t, d], 2.0)),
        ("k".into(), tensor(&[b, h, t, d], 2.0)),
        ("v".into(), tensor(&[b, h, t, d], 1.0)),
        ("fgate".into(), tensor(&[b, h, t], 3.0)),
        ("m".into(), tensor(&[b, h, t], 1.0)),
    ])
}

/// Each pair of spellings (`c` kept, and `-inf` where the opposite holds) optimizes to one
/// graph with the mask region `want`, and every spelling's fused graph computes what the
/// program as written computes.
#[test]
fn both_select_orders_are_one_expression_mask() {
    let pairs = [
        // Strictly causal (the diagonal masked): a comparison of indices flips exactly.
        ("select(j < i, {}, -inf)", "select(j >= i, -inf, {})", "j < i"),
        ("select(i - j > 0, {}, -inf)", "select(i - j <= 0, -inf, {})", "i - j > 0"),
        // A tensor read may be NaN: the opposite of `c` is `c == 0` (NaN masks in both).
        ("select(m[b, h, j] <= 0, {}, -inf)", "select(m[b, h, j] > 0, -inf, {})", ""),
    ];
    for (keep, drop, want) in pairs {
        let (gk, gd) = (compile(&program(keep)), compile(&program(drop)));
        let (ok, od) = (optimized(&gk), optimized(&gd));
        if want.is_empty() {
            assert_eq!(mask_text(&ok), "m[b, h, j] <= 0");
            assert_eq!(mask_text(&od), "m[b, h, j] > 0 == 0");
        } else {
            assert_eq!(mask_text(&ok), want, "{keep}");
            assert_eq!(print_graph(&ok), print_graph(&od), "{keep} vs {drop}");
        }
        for (written, fused) in [(&gk, &ok), (&gd, &od)] {
            let fresh =
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
            for seed in fresh..fresh + 3 {
                let x = inputs(seed);
                let a = interp::run(written, &x).unwrap().output;
                let b = interp::run(fused, &x).unwrap().output;
                for (p, q) in a.data.iter().zip(&b.data) {
                    // Rows with every key masked are NaN as written (0/0) and 0 fused: both are
                    // the documented empty-row convention of their op.
                    assert!(
                        (p - q).abs() <= 1e-12 || (p.is_nan() && *q == 0.0),
                        "{keep} / {drop} seed {seed:#x}: {p} vs {q}"
                    );
                }
            }
        }
    }
}

/// The mask of the one attention node: `causal`, `window(W)` or `expr`.
fn mask_kind(g: &Graph) -> String {
    let n = g.find(|op| matches!(op, Op::Attention(_)));
    assert_eq!(n.len(), 1, "{}", print_graph(g));
    let Op::Attention(a) = g.op(n[0]) else { unreachable!() };
    match &a.mask {
        Mask::Causal => "causal".into(),
        Mask::Window(w) => format!("window({w})"),
        Mask::None => "none".into(),
        Mask::Expr(_) => "expr".into(),
    }
}

/// A sliding window spelled as a select inside or around `causal`, in each order of the select,
/// is the `window` mask; a window of no whole size, or on the other side of the key, stays a
/// select of the score under the causal mask. All are pruned. Each fused graph computes what the program as written computes.
#[test]
fn a_select_window_around_causal_is_the_window_mask() {
    let cases = [
        ("causal(i, j, select(i - j < 3, {}, -inf))", "window(3)"),
        ("select(i - j < 3, causal(i, j, {}), -inf)", "window(3)"),
        ("causal(i, j, select(j > i - 3, {}, -inf))", "window(3)"),
        ("causal(i, j, select(i - j >= 3, -inf, {}))", "window(3)"),
        ("select(i - j >= 3, -inf, causal(i, j, {}))", "window(3)"),
        // Not windows of the causal mask's kind: a fractional size, the other side of the key.
        ("causal(i, j, select(i - j < 2.5, {}, -inf))", "causal"),
        ("causal(i, j, select(j - i < 3, {}, -inf))", "causal"),
    ];
    for (mask, want) in cases {
        let g = compile(&program(mask));
        let o = optimized(&g);
        assert_eq!(mask_kind(&o), want, "{mask}");
        // Pruned either way: the window mask is prunable, and a select that keeps the diagonal
        // (`i - j < 2.5` at j = i is 0 < 2.5) has the bound of the score it keeps.
        assert!(!o.find(|op| matches!(op, Op::Threshold { .. })).is_empty(), "{mask}: not pruned");
        let fresh =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
        for seed in fresh..fresh + 3 {
            let x = inputs(seed);
            let a = interp::run(&g, &x).unwrap().output;
            let b = interp::run(&o, &x).unwrap().output;
            for (p, q) in a.data.iter().zip(&b.data) {
                assert!((p - q).abs() <= 1e-12, "{mask} seed {seed:#x}: {p} vs {q}");
            }
        }
    }
}
