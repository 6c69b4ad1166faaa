//! The CPU backend's fused kernels (gate cumsum, rmsnorm, threshold, block boundary, attention
//! with score regions, masks and grouped-query heads) on graphs built with the graph API, run by
//! the real executor (`cpu_backend::run_outputs`, every buffer NaN-poisoned before its kernel)
//! against the f64 interpreter (the one reference): dense within rel L2 1e-5; pruned with the
//! interpreter's own block starts, which must equal the kernels' exactly, within 1e-5, and within
//! ACP's eps bound of the dense result; shapes off the tile grid, T = 1, several D, f32 and bf16.

use foxc_driver::cpu_backend;
use foxc_ir::attention::{Attention, Mask, Prune, RNode, Region, Scale};
use foxc_ir::index::IndexExpr;
use foxc_ir::interp;
use foxc_ir::*;
use foxc_runtime::cpu::ExecOptions;
use foxc_runtime::{HostTensor, TensorMap};
use std::collections::BTreeMap;

// ---- inputs -------------------------------------------------------------------------------

/// SplitMix64 with a normal sampler (Box-Muller).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn normal(&mut self) -> f64 {
        let u1 = self.uniform().max(1e-300);
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * self.uniform()).cos()
    }
}

/// Named inputs, held once as exactly representable values and handed to both sides.
#[derive(Default)]
struct Inputs(BTreeMap<String, (DType, Vec<usize>, Vec<f32>)>);

impl Inputs {
    /// `mean + std * N(0, 1)`, rounded to `dtype`.
    fn random(&mut self, rng: &mut Rng, name: &str, dtype: DType, shape: &[usize], mean: f64, std: f64) {
        let n = shape.iter().product();
        let vals = (0..n).map(|_| (mean + std * rng.normal()) as f32).collect();
        self.set(name, dtype, shape, vals);
    }
    fn set(&mut self, name: &str, dtype: DType, shape: &[usize], vals: Vec<f32>) {
        let t = HostTensor::from_f32_as(dtype, shape, &vals);
        self.0.insert(name.into(), (dtype, shape.to_vec(), t.to_f32_vec()));
    }
    fn vals(&self, name: &str) -> &[f32] {
        &self.0[name].2
    }
    fn vals_mut(&mut self, name: &str) -> &mut Vec<f32> {
        &mut self.0.get_mut(name).unwrap().2
    }
    fn host(&self) -> TensorMap {
        self.0.iter().map(|(k, (dt, sh, v))| (k.clone(), HostTensor::from_f32_as(*dt, sh, v))).collect()
    }
    fn interp(&self) -> BTreeMap<String, interp::Tensor> {
        self.0
            .iter()
            .map(|(k, (_, sh, v))| {
                (k.clone(), interp::Tensor::new(sh, v.iter().map(|&x| x as f64).collect()))
            })
            .collect()
    }
}

/// The CPU backend's values `vals` of `g` on `x` (real executor, 2 threads, buffers poisoned).
fn cpu(g: &Graph, vals: &[Value], x: &Inputs) -> Vec<Vec<f64>> {
    let outs: Vec<(String, Value)> = vals.iter().enumerate().map(|(i, v)| (format!("v{i}"), *v)).collect();
    let r = cpu_backend::run_outputs(g, &outs, &x.host(), ExecOptions { threads: 2, poison: true })
        .unwrap_or_else(|e| panic!("cpu run of {}: {e}", g.name));
    outs.iter().map(|(n, _)| r[n].to_f64_vec()).collect()
}

/// The interpreter's values `vals` of `g` on `x`.
fn reference(g: &Graph, vals: &[Value], x: &Inputs) -> Vec<Vec<f64>> {
    let r =
        interp::eval_values(g, &x.interp(), vals).unwrap_or_else(|e| panic!("interpreting {}: {e}", g.name));
    vals.iter().map(|v| r[v].data.clone()).collect()
}

fn rel_l2(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let num: f64 = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    (num / den.max(1e-300)).sqrt()
}

fn s(x: &str) -> Dim {
    Dim::sym(x)
}

fn add_attention(g: &mut Graph, a: Attention, ops: &[ValueId]) -> ValueId {
    g.add_attention(a, ops, Span::default()).unwrap()
}

// ---- FoX graphs: gate, norms, pruning, casts -----------------------------------------------

/// A fused FoX-style graph.
#[derive(Clone, Debug)]
struct Cfg {
    dtype: DType,
    gate: Option<GateKind>,
    window: Option<u64>,
    /// `Some` builds threshold + block_boundary + pruned attention.
    prune: Option<(PruneRule, NormBound, Tiles)>,
    log_eps: f64,
    qk_norm: bool,
    out: DType,
}

impl Cfg {
    fn fox(dtype: DType) -> Cfg {
        Cfg {
            dtype,
            gate: Some(GateKind::Logits),
            window: None,
            prune: None,
            log_eps: -10.0,
            qk_norm: false,
            out: DType::F32,
        }
    }
}

struct Built {
    g: Graph,
    start: Option<ValueId>,
    attn: ValueId,
}

fn build(cfg: &Cfg, d: u64) -> Built {
    let mut g = Graph::new("fox");
    let sp = Span::default();
    let bhtd = || [s("B"), s("H"), s("T"), s("D")];
    let bht = || ValueType::tensor(DType::F32, [s("B"), s("H"), s("T")]);
    let mut q = g.add_param("q", ValueType::tensor(cfg.dtype, bhtd()), sp);
    let mut k = g.add_param("k", ValueType::tensor(cfg.dtype, bhtd()), sp);
    let v = g.add_param("v", ValueType::tensor(cfg.dtype, bhtd()), sp);
    let c = cfg.gate.map(|kind| {
        let gt = if kind == GateKind::Slope { ValueType::tensor(DType::F32, [s("H")]) } else { bht() };
        let gp = g.add_param("fgate", gt, sp);
        if kind == GateKind::LogGate {
            // A log gate is at most 0; -inf (a hard reset) is allowed by the declared range.
            g.params.last_mut().unwrap().range = Some((f64::NEG_INFINITY, 0.0));
        }
        g.add(Op::GateCumsum { kind, split_rows: false }, bht(), &[gp], sp)
    });
    if cfg.qk_norm {
        let wt = ValueType::tensor(DType::F32, [s("D")]);
        let wq = g.add_param("wq", wt.clone(), sp);
        let wk = g.add_param("wk", wt, sp);
        let f4 = ValueType::tensor(DType::F32, bhtd());
        q = g.add(Op::RmsNorm { axis: "3".into(), eps: 1e-6 }, f4.clone(), &[q, wq], sp);
        k = g.add(Op::RmsNorm { axis: "3".into(), eps: 1e-6 }, f4, &[k, wk], sp);
    }
    let mut a = Attention::new(
        Scale::constant(1.0 / (d as f64).sqrt()),
        cfg.window.map_or(Mask::Causal, Mask::Window),
        c.is_some(),
    );
    a.tiles = Some(cfg.prune.as_ref().map_or(Tiles { bm: 64, bn: 64 }, |p| p.2));
    let mut ops = vec![q, k, v];
    ops.extend(c);
    let (attn, start) = match cfg.prune.clone() {
        None => (add_attention(&mut g, a, &ops), None),
        Some((rule, bound, tiles)) => {
            let mt = ValueType::tensor(DType::F32, [s("B"), s("H"), Dim::Tiles(Box::new(s("T")), tiles.bm)]);
            let th = Op::Threshold {
                rule,
                log_eps: cfg.log_eps,
                bound,
                score: ScoreBound::IDENTITY,
                scale: a.scale.clone(),
                bm: tiles.bm,
                plan: Default::default(),
            };
            let delta = g.add(th, mt.clone(), &[q, k], sp);
            let st_ty = ValueType { dtype: DType::I32, ..mt };
            let start =
                g.add(Op::BlockBoundary(tiles), st_ty, &[c.expect("pruning needs a decay"), delta], sp);
            ops.push(start);
            a.prune = Prune::Start;
            (add_attention(&mut g, a, &ops), Some(start))
        }
    };
    let out = if cfg.out != DType::F32 {
        g.add(Op::Cast, ValueType::tensor(cfg.out, bhtd()), &[attn], sp)
    } else {
        attn
    };
    g.output = Some(out);
    foxc_ir::verify::verify(&g).unwrap();
    Built { g, start, attn }
}

fn fox_inputs(rng: &mut Rng, cfg: &Cfg, (b, h, t, d): (usize, usize, usize, usize)) -> Inputs {
    let mut x = Inputs::default();
    for n in ["q", "k", "v"] {
        x.random(rng, n, cfg.dtype, &[b, h, t, d], 0.0, 1.0);
    }
    match cfg.gate {
        Some(GateKind::Slope) => {
            x.set("fgate", DType::F32, &[h], (0..h).map(|i| 0.05 + 0.5 * i as f32 / h as f32).collect())
        }
        Some(GateKind::LogGate) => {
            x.random(rng, "fgate", DType::F32, &[b, h, t], 0.0, 1.0);
            x.vals_mut("fgate").iter_mut().for_each(|v| *v = -(v.abs() * 0.5));
        }
        Some(GateKind::Logits) => {
            // Heads alternate between fast forgetting (logits near -1) and slow (near 4).
            x.random(rng, "fgate", DType::F32, &[b, h, t], 0.0, 1.0);
            for (i, v) in x.vals_mut("fgate").iter_mut().enumerate() {
                *v += if ((i / t) % h).is_multiple_of(2) { -1.0 } else { 4.0 };
            }
        }
        None => {}
    }
    if cfg.qk_norm {
        for n in ["wq", "wk"] {
            x.random(rng, n, DType::F32, &[d], 1.0, 0.2);
        }
    }
    x
}

/// Runs `cfg` at `shape` on fresh inputs (see [`run_on`]).
fn run_case(cfg: &Cfg, shape: (usize, usize, usize, usize), seed: u64) -> Vec<f64> {
    let x = fox_inputs(&mut Rng::new(seed), cfg, shape);
    run_on(cfg, shape, &x, &format!("{cfg:?} shape {shape:?}"))
}

/// Runs `cfg` on `x` on the CPU and checks it against the interpreter; returns the CPU's block
/// starts (empty when dense).
fn run_on(cfg: &Cfg, (_, _, t, d): (usize, usize, usize, usize), x: &Inputs, what: &str) -> Vec<f64> {
    let built = build(cfg, d as u64);
    let mut vals = vec![Value::of(built.attn), Value::of(built.g.output.unwrap())];
    vals.extend(built.start.map(Value::of));
    let got = cpu(&built.g, &vals, x);
    let want = reference(&built.g, &vals, x);
    assert!(got[0].iter().all(|v| v.is_finite()), "non-finite output: {what}");
    let e = rel_l2(&got[0], &want[0]);
    assert!(e <= 1e-5, "attention vs the interpreter: rel L2 {e:e}: {what}");
    if let Some((_, _, tiles)) = cfg.prune {
        // The kernels' kept tiles are the interpreter's, exactly.
        assert_eq!(got[2], want[2], "block starts differ from the interpreter's: {what}");
        let mt = t.div_ceil(tiles.bm as usize);
        for (idx, st) in got[2].iter().enumerate() {
            let m = idx % mt;
            assert!(
                *st >= 0.0 && *st as usize <= m * tiles.bm as usize / tiles.bn as usize,
                "start out of range: {what}"
            );
        }
        // And the pruned result is within ACP's bound of the dense one.
        let dense = build(&Cfg { prune: None, ..cfg.clone() }, d as u64);
        let dv = reference(&dense.g, &[Value::of(dense.attn)], x).remove(0);
        let vmax = x.vals("v").iter().fold(0f64, |a, v| a.max(v.abs() as f64));
        let bound = 2.0 * cfg.log_eps.exp() * vmax;
        let maxdiff = got[0].iter().zip(&dv).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        assert!(
            maxdiff <= bound + 1e-5,
            "pruned vs dense: max abs diff {maxdiff:e} > eps bound {bound:e}: {what}"
        );
    }
    if cfg.out == DType::BF16 {
        for (o, a) in got[1].iter().zip(&got[0]) {
            assert_eq!(
                *o as f32,
                half::bf16::from_f32(*a as f32).to_f32(),
                "bf16 cast of {a:e} ({:#x}): {what}",
                (*a as f32).to_bits()
            );
        }
    }
    got.get(2).cloned().unwrap_or_default()
}

fn tiles(bm: u32, bn: u32) -> Tiles {
    Tiles { bm, bn }
}

fn rule(name: &str) -> PruneRule {
    foxc_passes::rules::by_name(name).unwrap()
}

#[test]
fn dense_fox_f32_and_bf16() {
    for (i, dt) in [DType::F32, DType::BF16].into_iter().enumerate() {
        run_case(&Cfg::fox(dt), (1, 2, 70, 64), 1 + i as u64);
    }
}

#[test]
fn dense_edge_shapes() {
    for (n, &(t, d)) in [(1, 16), (17, 32), (17, 96), (65, 128), (3, 20), (129, 64)].iter().enumerate() {
        run_case(&Cfg::fox(DType::BF16), (2, 1, t, d), 11 + n as u64);
    }
}

#[test]
fn dense_variants() {
    let mut c = Cfg::fox(DType::F32);
    c.gate = None;
    run_case(&c, (1, 2, 50, 32), 21);
    c.window = Some(7);
    run_case(&c, (1, 2, 150, 32), 22);
    let mut c = Cfg::fox(DType::F32);
    c.gate = Some(GateKind::Slope);
    run_case(&c, (1, 3, 90, 16), 23);
    c.gate = Some(GateKind::LogGate);
    c.window = Some(70);
    run_case(&c, (2, 1, 200, 16), 24);
}

#[test]
fn pruned_rules_and_tiles() {
    let mut seed = 30;
    // Every rule of the table (a new rule is compiled and compared without touching this test).
    for r in foxc_passes::rules::RULES.iter().map(|r| r.rule()) {
        for tl in [tiles(16, 16), tiles(32, 16), tiles(16, 32), tiles(64, 64), tiles(12, 20)] {
            for &(t, d) in &[(1usize, 16usize), (17, 32), (300, 64)] {
                seed += 1;
                let mut c = Cfg::fox(DType::BF16);
                c.prune = Some((r.clone(), NormBound::Data, tl));
                run_case(&c, (1, 2, t, d), seed);
            }
        }
    }
}

#[test]
fn pruned_qk_norm_static_bound_window_bf16_out() {
    let d = 64usize;
    let mut c = Cfg::fox(DType::BF16);
    c.qk_norm = true;
    // QK-norm bound: max|w| * sqrt(D); weights are ~N(1, 0.2), below 2.5 with overwhelming odds.
    let bnd = 2.5 * (d as f64).sqrt();
    c.prune = Some((rule("paper"), NormBound::Static { q_max: bnd, k_max: bnd }, tiles(32, 32)));
    c.out = DType::BF16;
    run_case(&c, (1, 2, 200, d), 41);
    c.prune = Some((rule("tight"), NormBound::Static { q_max: bnd, k_max: bnd }, tiles(32, 32)));
    c.window = Some(100);
    c.gate = Some(GateKind::LogGate);
    run_case(&c, (2, 2, 130, d), 42);
}

#[test]
fn pruning_skips_tiles_on_fast_heads() {
    let (h, t) = (2usize, 512usize);
    let mut c = Cfg::fox(DType::F32);
    c.prune = Some((rule("tight"), NormBound::Data, tiles(32, 32)));
    let st = run_case(&c, (1, h, t, 32), 5);
    let mt = t / 32;
    // Head 0 forgets fast: its late query tiles start far from 0. Head 1 forgets slowly.
    assert!(st[mt - 1] >= 5.0, "fast head not pruned: {:?}", &st[..mt]);
    assert!(st[2 * mt - 1] <= 1.0, "slow head pruned too much: {:?}", &st[mt..]);
}

/// Hard resets (`log f = -inf`) stay finite through the floor; gates of exactly 1 prune nothing.
#[test]
fn hard_reset_and_no_decay_gates() {
    let shape = (1usize, 2usize, 150usize, 32usize);
    let t = shape.2;
    let mut c = Cfg::fox(DType::F32);
    c.gate = Some(GateKind::LogGate);
    c.prune = Some((rule("tight"), NormBound::Data, tiles(16, 16)));
    let mut x = fox_inputs(&mut Rng::new(77), &c, shape);
    for (i, v) in x.vals_mut("fgate").iter_mut().enumerate() {
        // head 0: a hard reset every 40 tokens; head 1: no decay at all.
        *v = if i < t {
            if i % 40 == 39 {
                f32::NEG_INFINITY
            } else {
                -0.01
            }
        } else {
            0.0
        };
    }
    let st = run_on(&c, shape, &x, "hard resets");
    let mt = t.div_ceil(16);
    assert!(st[mt..].iter().all(|&s| s == 0.0), "a head without decay was pruned: {:?}", &st[mt..]);
    assert!(st[mt - 1] > 0.0, "a hard reset did not prune: {:?}", &st[..mt]);
}

/// An op without a fused kernel compiles to a generic loop kernel named after it; unbound dims
/// are still an error.
#[test]
fn unfused_ops_get_generic_kernels() {
    let mut g = Graph::new("bad");
    let sp = Span::default();
    let t = ValueType::tensor(DType::F32, [s("T")]);
    let x = g.add_param("x", t.clone(), sp);
    let y = g.add(Op::Unary(UnaryOp::Exp), t, &[x], sp);
    g.output = Some(y);
    let dims = [("T".to_string(), 4u64)].into_iter().collect();
    let p = foxc_codegen::cpu::compile(&g, &dims).unwrap();
    assert_eq!(p.kernels.len(), 1);
    assert_eq!(p.kernels[0].name, "k1_exp");
    let e = foxc_codegen::cpu::compile(&build(&Cfg::fox(DType::F32), 8).g, &dims).unwrap_err();
    assert!(e.to_string().contains("not bound"), "{e}");
}

// ---- score regions, masks, grouped-query heads ----------------------------------------------

fn iv(v: &str) -> IndexExpr {
    IndexExpr::var(v)
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
            let t = r.push(RNode::Dim(s("T")));
            let m = r.push(RNode::Binary(BinaryOp::Mul, c, ij));
            let q = r.push(RNode::Binary(BinaryOp::Div, m, t));
            r.push(RNode::Binary(BinaryOp::Sub, sel, q));
        }
        // x + 0.3 log(1 + x^2) - 0.2 log2(1 + x^2) + ...: every function the CPU region
        // evaluates through region_math, on arguments that stay finite.
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
                (UnaryOp::Silu, x, 0.15),
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

/// q [B, H, T, D], k and v [B, G, T, D] with G = H / group, optional gate logits and a captured
/// key bias kb [B, H, T] when the region reads it.
fn region_graph(c: &Case) -> Graph {
    let sp = Span::default();
    let mut g = Graph::new("region");
    let q = g.add_param("q", ValueType::tensor(c.dtype, [s("B"), s("H"), s("T"), s("D")]), sp);
    let kv = if c.group == 1 { "H" } else { "G" };
    let k = g.add_param("k", ValueType::tensor(c.dtype, [s("B"), s(kv), s("T"), s("D")]), sp);
    let v = g.add_param("v", ValueType::tensor(c.dtype, [s("B"), s(kv), s("T"), s("D")]), sp);
    let mut ops = vec![q, k, v];
    if c.decay {
        let f = g.add_param("fgate", ValueType::tensor(DType::F32, [s("B"), s("H"), s("T")]), sp);
        let bht = ValueType::tensor(DType::F32, [s("B"), s("H"), s("T")]);
        ops.push(g.add(Op::GateCumsum { kind: GateKind::Logits, split_rows: false }, bht, &[f], sp));
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
    let o = add_attention(&mut g, a, &ops);
    g.output = Some(o);
    foxc_ir::verify::verify(&g).unwrap();
    g
}

fn region_inputs(g: &Graph, c: &Case, seed: u64, (b, h, t, d): (usize, usize, usize, usize)) -> Inputs {
    let hk = h / c.group as usize;
    let mut rng = Rng::new(seed);
    let mut x = Inputs::default();
    x.random(&mut rng, "q", c.dtype, &[b, h, t, d], 0.0, 1.5);
    x.random(&mut rng, "k", c.dtype, &[b, hk, t, d], 0.0, 1.5);
    x.random(&mut rng, "v", c.dtype, &[b, hk, t, d], 0.0, 1.0);
    if g.param("fgate").is_some() {
        x.random(&mut rng, "fgate", DType::F32, &[b, h, t], 1.0, 2.0);
    }
    if g.param("kb").is_some() {
        x.random(&mut rng, "kb", DType::F32, &[b, h, t], -1.0, 1.0);
    }
    x
}

/// Relative L2 error of the CPU kernel against the interpreter for case `c`.
fn region_error(c: &Case, seed: u64, shape: (usize, usize, usize, usize)) -> f64 {
    let g = region_graph(c);
    let x = region_inputs(&g, c, seed, shape);
    let out = Value::of(g.output.unwrap());
    let got = cpu(&g, &[out], &x).remove(0);
    let want = reference(&g, &[out], &x).remove(0);
    assert!(got.iter().all(|v| v.is_finite()), "non-finite output (poison left?)");
    rel_l2(&got, &want)
}

fn region_cases() -> Vec<Case> {
    let mut v = vec![];
    for score in ["identity", "softcap_bias", "select_index", "transcendental"] {
        for mask in [Mask::Causal, Mask::Window(7), Mask::None, Mask::Expr(causal_expr())] {
            for group in [1, 2] {
                let decay = score != "select_index";
                v.push(Case { score, mask: mask.clone(), group, decay, out: DType::F32, dtype: DType::F32 });
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
    for (n, c) in region_cases().iter().enumerate() {
        // Fresh shapes: T off the tile grid, D not always a multiple of 4.
        let t = 5 + (rng.next_u64() % 60) as usize;
        let d = [4, 8, 6][n % 3];
        let e = region_error(c, 1000 + n as u64, (2, 4, t, d));
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
    let case = |mask| Case {
        score: "softcap_bias",
        mask,
        group: 1,
        decay: true,
        out: DType::F32,
        dtype: DType::F32,
    };
    let run = |c: &Case| {
        let g = region_graph(c);
        let x = region_inputs(&g, c, 3, (1, 2, 33, 8));
        cpu(&g, &[Value::of(g.output.unwrap())], &x).remove(0)
    };
    let (a, b) = (run(&case(Mask::Causal)), run(&case(Mask::Expr(causal_expr()))));
    let diff = a.iter().zip(&b).fold(0f64, |m, (x, y)| m.max((x - y).abs()));
    assert!(diff < 1e-6, "max difference {diff}");
}
