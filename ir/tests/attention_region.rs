//! The interpreter's `attention` against the definition (docs/SEMANTICS.md): score regions
//! (softcap, captured bias), grouped-query heads equal to repeated heads, an expression mask
//! equal to the causal one, and the lse result.

use foxc_ir::attention::{Attention, Mask, RNode, Region, Scale};
use foxc_ir::index::IndexExpr;
use foxc_ir::interp::{self, Tensor};
use foxc_ir::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;

const SP: Span = Span { start: 0, end: 0 };

fn s(x: &str) -> Dim {
    Dim::sym(x)
}

fn iv(v: &str) -> IndexExpr {
    IndexExpr { terms: vec![(v.to_string(), 1)], dim_terms: vec![], constant: 0, div: None, clamps: vec![] }
}

fn random(rng: &mut StdRng, shape: &[usize]) -> Tensor {
    Tensor::from_fn(shape, |_| rng.random_range(-1.5..1.5))
}

/// attention(q, k, v, [c], captures) as the only node; `kv` names the k/v head dim.
fn graph(a: Attention, kv: &str, caps: &[(&str, Vec<Dim>)]) -> Graph {
    let mut g = Graph::new("attn");
    let q = g.add_param("q", ValueType::tensor(DType::F32, [s("B"), s("H"), s("T"), s("D")]), SP);
    let k = g.add_param("k", ValueType::tensor(DType::F32, [s("B"), s(kv), s("T"), s("D")]), SP);
    let v = g.add_param("v", ValueType::tensor(DType::F32, [s("B"), s(kv), s("T"), s("D")]), SP);
    let mut ops = vec![q, k, v];
    if a.decay {
        ops.push(g.add_param("c", ValueType::tensor(DType::F32, [s("B"), s("H"), s("T")]), SP));
    }
    for (n, dims) in caps {
        ops.push(g.add_param(n, ValueType::tensor(DType::F32, dims.clone()), SP));
    }
    let o = g.add_attention(a, &ops, SP).unwrap();
    g.output = Some(o);
    verify::verify(&g).unwrap();
    g
}

/// Causal attention straight from the definition with an arbitrary score function.
fn naive(
    ins: &BTreeMap<String, Tensor>,
    group: usize,
    score: impl Fn(f64, [usize; 4]) -> f64,
) -> (Vec<f64>, Vec<f64>) {
    let (q, k, v) = (&ins["q"], &ins["k"], &ins["v"]);
    let (b, h, t, d) = (q.shape[0], q.shape[1], q.shape[2], q.shape[3]);
    let c = ins.get("c");
    let (mut out, mut lse) = (vec![], vec![]);
    for bi in 0..b {
        for hi in 0..h {
            let kh = hi / group;
            for i in 0..t {
                let e: Vec<f64> = (0..=i)
                    .map(|j| {
                        let x: f64 =
                            (0..d).map(|x| q.at(&[bi, hi, i, x]) * k.at(&[bi, kh, j, x])).sum::<f64>()
                                / (d as f64).sqrt();
                        let decay = c.map_or(0.0, |c| c.at(&[bi, hi, i]) - c.at(&[bi, hi, j]));
                        score(x, [bi, hi, i, j]) + decay
                    })
                    .collect();
                let m = e.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = e.iter().map(|x| (x - m).exp()).sum();
                lse.push(m + z.ln());
                for x in 0..d {
                    out.push((0..=i).map(|j| (e[j] - m).exp() * v.at(&[bi, kh, j, x])).sum::<f64>() / z);
                }
            }
        }
    }
    (out, lse)
}

fn max_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).fold(0.0, |m, (x, y)| m.max((x - y).abs()))
}

/// `20 tanh(x / 20) + kb[b, h, j]`.
fn softcap_bias() -> Region {
    let mut r = Region::new();
    let x = r.push(RNode::Score);
    let a = r.push(RNode::Const(20.0));
    let d = r.push(RNode::Binary(BinaryOp::Div, x, a));
    let t = r.push(RNode::Unary(UnaryOp::Tanh, d));
    let m = r.push(RNode::Binary(BinaryOp::Mul, a, t));
    let kb = r.push(RNode::Capture { k: 0, index: vec![iv("b"), iv("h"), iv("j")] });
    r.push(RNode::Binary(BinaryOp::Add, m, kb));
    r
}

fn inputs(
    rng: &mut StdRng,
    (b, h, hk, t, d): (usize, usize, usize, usize, usize),
    c: bool,
) -> BTreeMap<String, Tensor> {
    let mut m = BTreeMap::new();
    m.insert("q".into(), random(rng, &[b, h, t, d]));
    m.insert("k".into(), random(rng, &[b, hk, t, d]));
    m.insert("v".into(), random(rng, &[b, hk, t, d]));
    if c {
        // A non-increasing cumsum of log gates.
        let mut cs = random(rng, &[b, h, t]);
        for bh in 0..b * h {
            let mut acc = 0.0;
            for i in 0..t {
                acc -= cs.data[bh * t + i].abs() * 0.3;
                cs.data[bh * t + i] = acc;
            }
        }
        m.insert("c".into(), cs);
    }
    m
}

#[test]
fn softcap_with_captured_bias_and_lse_match_the_definition() {
    let mut rng = StdRng::seed_from_u64(11);
    let mut a = Attention::new(Scale::inv_sqrt(1.0, s("D")), Mask::Causal, true);
    a.score = softcap_bias();
    let g = graph(a, "H", &[("kb", vec![s("B"), s("H"), s("T")])]);
    let mut ins = inputs(&mut rng, (2, 3, 3, 13, 5), true);
    let kb = random(&mut rng, &[2, 3, 13]);
    ins.insert("kb".into(), kb.clone());
    let o = g.output.unwrap();
    let r = interp::eval_values(&g, &ins, &[Value::of(o), Value { node: o, result: 1 }]).unwrap();
    let (want, want_lse) = naive(&ins, 1, |x, [b, h, _, j]| 20.0 * (x / 20.0).tanh() + kb.at(&[b, h, j]));
    assert!(max_diff(&r[&Value::of(o)].data, &want) < 1e-12);
    assert!(max_diff(&r[&Value { node: o, result: 1 }].data, &want_lse) < 1e-12);
    // The cap matters: the identity score gives another output.
    let (plain, _) = naive(&ins, 1, |x, [b, h, _, j]| x + kb.at(&[b, h, j]));
    assert!(max_diff(&plain, &want) > 1e-6);
}

#[test]
fn grouped_query_heads_equal_repeated_heads() {
    let mut rng = StdRng::seed_from_u64(12);
    let (b, h, hk, t, d) = (2, 6, 2, 9, 4);
    let ins = inputs(&mut rng, (b, h, hk, t, d), true);
    let mut a = Attention::new(Scale::inv_sqrt(1.0, s("D")), Mask::Causal, true);
    a.kv_group = Dim::Const(3);
    let gqa = interp::run(&graph(a, "G", &[]), &ins).unwrap().output;
    // k and v repeated per query head, kv_group 1.
    let rep = |x: &Tensor| {
        Tensor::from_fn(&[b, h, t, d], |l| {
            let (bi, hi, rest) = (l / (h * t * d), (l / (t * d)) % h, l % (t * d));
            x.data[(bi * hk + hi / 3) * t * d + rest]
        })
    };
    let mut ins2 = ins.clone();
    ins2.insert("k".into(), rep(&ins["k"]));
    ins2.insert("v".into(), rep(&ins["v"]));
    let a1 = Attention::new(Scale::inv_sqrt(1.0, s("D")), Mask::Causal, true);
    let full = interp::run(&graph(a1, "H", &[]), &ins2).unwrap().output;
    assert_eq!(gqa.data, full.data);
    let (want, _) = naive(&ins, 3, |x, _| x);
    assert!(max_diff(&gqa.data, &want) < 1e-12);
    // A group that does not divide the heads is an error naming both.
    let mut a = Attention::new(Scale::inv_sqrt(1.0, s("D")), Mask::Causal, true);
    a.kv_group = Dim::Const(4);
    let e = interp::run(&graph(a, "G", &[]), &ins).unwrap_err().to_string();
    assert!(e.contains("6 heads, k 2"), "{e}");
}

#[test]
fn expression_mask_equals_causal_and_none_sees_every_key() {
    let mut rng = StdRng::seed_from_u64(13);
    let ins = inputs(&mut rng, (1, 2, 2, 11, 3), false);
    let mut m = Region::new();
    let i = m.push(RNode::Index(IndexVar::I));
    let j = m.push(RNode::Index(IndexVar::J));
    m.push(RNode::Binary(BinaryOp::Le, j, i));
    let run = |mask: Mask| {
        let a = Attention::new(Scale::constant(0.7), mask, false);
        interp::run(&graph(a, "H", &[]), &ins).unwrap().output.data
    };
    assert_eq!(run(Mask::Expr(m)), run(Mask::Causal));
    // Bidirectional: the last row of causal equals the last row of none; the first differs.
    let (c, n) = (run(Mask::Causal), run(Mask::None));
    let row = |x: &Vec<f64>, i: usize| x[i * 3..(i + 1) * 3].to_vec();
    assert_eq!(row(&c, 10), row(&n, 10));
    assert_ne!(row(&c, 0), row(&n, 0));
}

#[test]
fn out_dtype_rounds_and_an_out_of_range_capture_is_nan() {
    let mut rng = StdRng::seed_from_u64(14);
    let ins = inputs(&mut rng, (1, 1, 1, 6, 2), false);
    let mut a = Attention::new(Scale::constant(1.0), Mask::Causal, false);
    a.out_dtype = DType::BF16;
    let o = interp::run(&graph(a, "H", &[]), &ins).unwrap().output;
    assert!(o.data.iter().all(|&x| half::bf16::from_f64(x).to_f64() == x));
    // rel[i - j + 1] with rel of length 3: out of range for i - j >= 2, so rows i >= 2 are NaN.
    let mut r = Region::new();
    let x = r.push(RNode::Score);
    let e = IndexExpr {
        terms: vec![("i".into(), 1), ("j".into(), -1)],
        dim_terms: vec![],
        constant: 1,
        div: None,
        clamps: vec![],
    };
    let c = r.push(RNode::Capture { k: 0, index: vec![e] });
    r.push(RNode::Binary(BinaryOp::Add, x, c));
    let mut a = Attention::new(Scale::constant(1.0), Mask::Causal, false);
    a.score = r;
    let g = graph(a, "H", &[("rel", vec![Dim::Const(3)])]);
    let mut ins2 = ins.clone();
    ins2.insert("rel".into(), Tensor::new(&[3], vec![0.5, -0.5, 1.0]));
    let o = interp::run(&g, &ins2).unwrap().output;
    assert!(
        o.data[..4].iter().all(|x| x.is_finite()) && o.data[4..].iter().all(|x| x.is_nan()),
        "{:?}",
        o.data
    );
}
