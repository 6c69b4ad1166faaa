//! The CPU attention kernel with score regions, masks and grouped-query heads against the f64
//! interpreter (the one reference), on fresh random inputs with NaN-poisoned outputs.

mod cpu_common;

use cpu_common::{dims, execute, Rng, Tensor};
use foxc_codegen::cpu;
use foxc_ir::attention::{Attention, Mask, RNode, Region, Scale};
use foxc_ir::index::IndexExpr;
use foxc_ir::interp;
use foxc_ir::*;
use std::collections::{BTreeMap, HashMap};

fn iv(v: &str) -> IndexExpr {
    IndexExpr { terms: vec![(v.to_string(), 1)], constant: 0, div: None }
}

/// The score regions under test, by name.
fn region(name: &str) -> Region {
    let mut r = Region::new();
    let x = r.push(RNode::Score);
    match name {
        "identity" => {}
        // 20 tanh(x / 20) + kb[b, h, j]
        "softcap_bias" => {
            let a = r.push(RNode::Const(20.0));
            let d = r.push(RNode::Binary(BinaryOp::Div, x, a));
            let t = r.push(RNode::Unary(UnaryOp::Tanh, d));
            let m = r.push(RNode::Binary(BinaryOp::Mul, a, t));
            let kb = r.push(RNode::Capture { k: 0, index: vec![iv("b"), iv("h"), iv("j")] });
            r.push(RNode::Binary(BinaryOp::Add, m, kb));
        }
        // select(abs(x) < 1, x, sigmoid(x)) - 0.1 * (i - j) / dim(T)
        "select_index" => {
            let ax = r.push(RNode::Unary(UnaryOp::Abs, x));
            let one = r.push(RNode::Const(1.0));
            let lt = r.push(RNode::Binary(BinaryOp::Lt, ax, one));
            let sg = r.push(RNode::Unary(UnaryOp::Sigmoid, x));
            let sel = r.push(RNode::Select(lt, x, sg));
            let i = r.push(RNode::Index(IndexVar::I));
            let j = r.push(RNode::Index(IndexVar::J));
            let ij = r.push(RNode::Binary(BinaryOp::Sub, i, j));
            let c = r.push(RNode::Const(0.1));
            let t = r.push(RNode::Dim(Dim::sym("T")));
            let m = r.push(RNode::Binary(BinaryOp::Mul, c, ij));
            let q = r.push(RNode::Binary(BinaryOp::Div, m, t));
            r.push(RNode::Binary(BinaryOp::Sub, sel, q));
        }
        // x + 0.3 log(1 + x^2) - 0.2 log2(2 + x) ... every function the CPU region evaluates
        // through region_math, on arguments that stay finite: log, log2 of positive values,
        // exp2, rsqrt, softplus and logsigmoid of the raw score.
        "transcendental" => {
            let sq = r.push(RNode::Binary(BinaryOp::Mul, x, x));
            let one = r.push(RNode::Const(1.0));
            let p1 = r.push(RNode::Binary(BinaryOp::Add, one, sq));
            let mut acc = x;
            for (u, arg, c) in [
                (UnaryOp::Log, p1, 0.3),
                (UnaryOp::Log2, p1, -0.2),
                (UnaryOp::Rsqrt, p1, 0.5),
                (UnaryOp::Exp2, x, 0.1),
                (UnaryOp::Softplus, x, -0.4),
                (UnaryOp::LogSigmoid, x, 0.25),
            ] {
                let f = r.push(RNode::Unary(u, arg));
                let k = r.push(RNode::Const(c));
                let t = r.push(RNode::Binary(BinaryOp::Mul, k, f));
                acc = r.push(RNode::Binary(BinaryOp::Add, acc, t));
            }
        }
        other => panic!("no region {other}"),
    }
    r
}

/// `j <= i` as an expression mask.
fn causal_expr() -> Region {
    let mut r = Region::new();
    let i = r.push(RNode::Index(IndexVar::I));
    let j = r.push(RNode::Index(IndexVar::J));
    r.push(RNode::Binary(BinaryOp::Le, j, i));
    r
}

struct Case {
    score: &'static str,
    mask: Mask,
    group: u64,
    decay: bool,
    out: DType,
    dtype: DType,
}

/// The graph: q [B, H, T, D], k and v [B, G, T, D] with G = H / group, optional gate logits and
/// a captured key bias kb [B, H, T] when the region reads it.
fn graph(c: &Case) -> Graph {
    let sp = Span::default();
    let mut g = Graph::new("region");
    let s = |x: &str| Dim::sym(x);
    let q = g.add_param("q", ValueType::tensor(c.dtype, [s("B"), s("H"), s("T"), s("D")]), sp);
    let kv = if c.group == 1 { "H" } else { "G" };
    let k = g.add_param("k", ValueType::tensor(c.dtype, [s("B"), s(kv), s("T"), s("D")]), sp);
    let v = g.add_param("v", ValueType::tensor(c.dtype, [s("B"), s(kv), s("T"), s("D")]), sp);
    let mut ops = vec![q, k, v];
    if c.decay {
        let f = g.add_param("fgate", ValueType::tensor(DType::F32, [s("B"), s("H"), s("T")]), sp);
        let bht = ValueType::tensor(DType::F32, [s("B"), s("H"), s("T")]);
        ops.push(g.add(Op::GateCumsum { kind: GateKind::Logits }, bht, &[f], sp));
    }
    let score = region(c.score);
    if !score.captures().is_empty() {
        ops.push(g.add_param("kb", ValueType::tensor(DType::F32, [s("B"), s("H"), s("T")]), sp));
    }
    let mut a = Attention::new(Scale::inv_sqrt(1.0, s("D")), c.mask.clone(), c.decay);
    a.score = score;
    a.kv_group = Dim::Const(c.group);
    a.out_dtype = c.out;
    a.tiles = Some(Tiles { bm: 16, bn: 8 });
    let tys: Vec<ValueType> = ops.iter().map(|&o| g.ty(o).clone()).collect();
    let refs: Vec<&ValueType> = tys.iter().collect();
    let rt = a.result_types(&refs).unwrap();
    let vals: Vec<Value> = ops.iter().map(|&o| Value::of(o)).collect();
    let o = g.add_multi(Op::Attention(a), rt, &vals, sp);
    g.output = Some(o);
    foxc_ir::verify::verify(&g).unwrap();
    g
}

/// Max relative L2 error of the CPU kernel against the interpreter for case `c`.
fn error(c: &Case, seed: u64, (b, h, t, d): (usize, usize, usize, usize)) -> f64 {
    let g = graph(c);
    let hk = h / c.group as usize;
    let mut rng = Rng::new(seed);
    let mut inputs: HashMap<String, Tensor> = HashMap::new();
    inputs.insert("q".into(), Tensor::random(&mut rng, c.dtype, &[b, h, t, d], 0.0, 1.5));
    inputs.insert("k".into(), Tensor::random(&mut rng, c.dtype, &[b, hk, t, d], 0.0, 1.5));
    inputs.insert("v".into(), Tensor::random(&mut rng, c.dtype, &[b, hk, t, d], 0.0, 1.0));
    if g.param("fgate").is_some() {
        inputs.insert("fgate".into(), Tensor::random(&mut rng, DType::F32, &[b, h, t], 1.0, 2.0));
    }
    if g.param("kb").is_some() {
        inputs.insert("kb".into(), Tensor::random(&mut rng, DType::F32, &[b, h, t], -1.0, 1.0));
    }
    let mut dm = dims(b as u64, h as u64, t as u64, d as u64);
    dm.insert("G".into(), hk as u64);
    let p = cpu::compile(&g, &dm).unwrap();
    let got = &execute(&g, &p, &inputs)[&g.output.unwrap()];
    let ins: BTreeMap<String, interp::Tensor> = inputs
        .iter()
        .map(|(k, t)| (k.clone(), interp::Tensor::new(&t.shape, t.vals.iter().map(|&x| x as f64).collect())))
        .collect();
    let want = interp::run(&g, &ins).unwrap().output;
    assert!(got.vals.iter().all(|x| x.is_finite()), "non-finite output (poison left?)");
    cpu_common::rel_l2(&got.vals, &want.data)
}

fn cases() -> Vec<Case> {
    let mut v = vec![];
    for score in ["identity", "softcap_bias", "select_index", "transcendental"] {
        for mask in [Mask::Causal, Mask::Window(7), Mask::None, Mask::Expr(causal_expr())] {
            for group in [1, 2] {
                v.push(Case {
                    score,
                    mask: mask.clone(),
                    group,
                    decay: score != "select_index",
                    out: DType::F32,
                    dtype: DType::F32,
                });
            }
        }
    }
    v.push(Case {
        score: "softcap_bias",
        mask: Mask::Causal,
        group: 2,
        decay: true,
        out: DType::BF16,
        dtype: DType::BF16,
    });
    v
}

#[test]
fn regions_masks_and_gqa_match_the_interpreter() {
    let mut rng = Rng::new(7);
    for (n, c) in cases().iter().enumerate() {
        // Fresh shapes: T off the tile grid, D not always a multiple of 4.
        let t = 5 + (rng.next_u64() % 60) as usize;
        let d = [4, 8, 6][n % 3];
        let e = error(c, 1000 + n as u64, (2, 4, t, d));
        let tol = if c.out == DType::BF16 { 1e-2 } else { 2e-5 };
        assert!(
            e < tol,
            "case {n} ({}, {:?}, group {}, T = {t}, D = {d}): rel L2 {e}",
            c.score,
            c.mask,
            c.group
        );
    }
}

/// The expression mask `j <= i` is the causal mask, on the CPU kernel too.
#[test]
fn expression_mask_equals_causal() {
    let base = |mask| Case {
        score: "softcap_bias",
        mask,
        group: 1,
        decay: true,
        out: DType::F32,
        dtype: DType::F32,
    };
    let run = |mask: Mask| {
        let g = graph(&base(mask));
        let mut rng = Rng::new(3);
        let mut inputs: HashMap<String, Tensor> = HashMap::new();
        for (nm, sh) in [("q", vec![1, 2, 33, 8]), ("k", vec![1, 2, 33, 8]), ("v", vec![1, 2, 33, 8])] {
            inputs.insert(nm.into(), Tensor::random(&mut rng, DType::F32, &sh, 0.0, 1.0));
        }
        inputs.insert("fgate".into(), Tensor::random(&mut rng, DType::F32, &[1, 2, 33], 1.0, 1.0));
        inputs.insert("kb".into(), Tensor::random(&mut rng, DType::F32, &[1, 2, 33], 0.0, 1.0));
        let mut dm = dims(1, 2, 33, 8);
        dm.insert("G".into(), 2);
        let p = cpu::compile(&g, &dm).unwrap();
        execute(&g, &p, &inputs)[&g.output.unwrap()].vals.clone()
    };
    let (a, b) = (run(Mask::Causal), run(Mask::Expr(causal_expr())));
    let diff = a.iter().zip(&b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    assert!(diff < 1e-6, "max difference {diff}");
}
