//! Property tests against the f64 reference interpreter: fresh random inputs and gates,
//! small shapes (T 5..70, D 4..16) and small tiles so that pruning really happens.
//!
//! - pruned vs dense output within `2 * eps * max|v|`, pruned mass of every row below eps,
//!   for every rule of the table (`foxc_passes::rules::RULES`, iterated: a new rule is tested
//!   without touching this file), on ordinary and adversarial inputs (large norms growing
//!   along the sequence, hard resets, no decay);
//! - the rules documented as never looser than another keep no more tiles than it;
//! - the block boundary equals a brute-force check of every tile (docs/SEMANTICS.md);
//! - the unoptimized graph computes what the optimized dense graph computes (relative 1e-9),
//!   for every example and every spelling.

mod common;

use common::{compile, root};
use foxc_ir::check::infer;
use foxc_ir::interp::{self, RunResult, Tensor};
use foxc_ir::{Dim, Graph, Op, Tiles, ValueId, ValueType};
use foxc_passes::rules::RULES;
use foxc_passes::{optimize, PassOptions};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal};
use std::collections::BTreeMap;

/// The kinds of inputs the safety property runs on.
#[derive(Clone, Copy, Debug)]
enum Inputs {
    /// Gaussian q, k, v with a random amplitude, gates of random strength.
    Ordinary,
    /// q and k norms up to ~40 that grow along the sequence (local statistics differ from
    /// global ones; scores reach hundreds).
    LargeNorms,
    /// A fifth of the gates are hard resets (log f = -inf, clamped to LOG_F_FLOOR).
    HardResets,
    /// Gates of exactly 1 (log f = 0; ALiBi slope 0): c is constant, nothing may be pruned.
    NoDecay,
}

const INPUTS: [Inputs; 4] = [Inputs::Ordinary, Inputs::LargeNorms, Inputs::HardResets, Inputs::NoDecay];

/// Fresh ordinary inputs for every parameter of `g`, by name: gate logits, log-gates <= 0,
/// slopes >= 0, rmsnorm weights, and q, k, v with a random amplitude.
fn inputs(g: &Graph, dims: &BTreeMap<&str, usize>, seed: u64) -> BTreeMap<String, Tensor> {
    inputs_of(g, dims, seed, Inputs::Ordinary)
}

/// As [`inputs`], shaped by `kind`.
fn inputs_of(g: &Graph, dims: &BTreeMap<&str, usize>, seed: u64, kind: Inputs) -> BTreeMap<String, Tensor> {
    let mut rng = StdRng::seed_from_u64(seed);
    let normal = Normal::new(0.0, 1.0).unwrap();
    let amp: f64 = rng.random_range(0.3..2.0);
    let mut out = BTreeMap::new();
    for p in &g.params {
        let shape: Vec<usize> =
            p.ty.dims()
                .map(|d| match d {
                    Dim::Sym(s) => dims[s.as_str()],
                    Dim::Const(c) => *c as usize,
                    Dim::Tiles(..) | Dim::Div(..) => unreachable!("parameters have no tile or quotient dims"),
                })
                .collect();
        // Per-tensor gate strength: some heads forget fast, some slowly.
        let bias: f64 = rng.random_range(-4.0..4.0);
        // Row length of q/k/v ([.., T, D]): the position of a flat index along T.
        let (t_len, d_len) = if shape.len() == 4 { (shape[2], shape[3]) } else { (1, 1) };
        let t = Tensor::from_fn(&shape, |n| {
            let reset = matches!(kind, Inputs::HardResets) && rng.random_range(0..5) == 0;
            let flat = matches!(kind, Inputs::NoDecay);
            match p.name.as_str() {
                "fgate" if reset => f64::NEG_INFINITY,
                "fgate" if flat => f64::INFINITY,
                "fgate" => bias + 2.0 * normal.sample(&mut rng),
                "logf" if reset => f64::NEG_INFINITY,
                "logf" if flat => 0.0,
                "logf" => -rng.random_range(0.0..3.0f64),
                "slope" if reset => 1e3,
                "slope" if flat => 0.0,
                "slope" => rng.random_range(0.0..3.0),
                "wq" | "wk" => normal.sample(&mut rng),
                "q" | "k" if matches!(kind, Inputs::LargeNorms) => {
                    let pos = (n / d_len) % t_len;
                    let grow = 1.0 + 9.0 * pos as f64 / t_len as f64;
                    4.0 * grow * normal.sample(&mut rng)
                }
                _ => amp * normal.sample(&mut rng),
            }
        });
        out.insert(p.name.clone(), t);
    }
    out
}

/// The graph without its final cast, so that outputs compare in f64.
fn uncast(g: &Graph) -> Graph {
    let mut g = g.clone();
    let out = g.output.unwrap();
    if matches!(g.op(out), Op::Cast) {
        g.output = Some(g.operands(out)[0]);
        g.remove_dead();
    }
    // A fused output cast: the attention writes f32 again.
    let out = g.output.unwrap();
    let node = g.node_mut(out);
    if let Op::Attention(a) = &mut node.op {
        a.out_dtype = foxc_ir::DType::F32;
        node.ty.dtype = foxc_ir::DType::F32;
    }
    g
}

/// Replace the ACP tiles by `tiles` (small tiles exercise the block rule at small T).
fn retile(g: &mut Graph, tiles: Tiles) {
    for n in g.topo_order() {
        let op = match g.op(n).clone() {
            Op::Threshold { rule, log_eps, bound, score, scale, .. } => {
                Op::Threshold { rule, log_eps, bound, score, scale, bm: tiles.bm, plan: Default::default() }
            }
            Op::BlockBoundary(_) => Op::BlockBoundary(tiles),
            Op::Attention(mut a) => {
                a.tiles = Some(tiles);
                Op::Attention(a)
            }
            _ => continue,
        };
        let tys: Vec<ValueType> = g.operands(n).iter().map(|o| g.ty(*o).clone()).collect();
        let refs: Vec<&ValueType> = tys.iter().collect();
        let ty = infer(&op, &refs).unwrap().unwrap();
        let node = g.node_mut(n);
        node.op = op;
        node.ty = ty;
    }
    foxc_ir::verify::verify(g).unwrap();
}

fn optimized(g: &Graph, opts: &PassOptions) -> Graph {
    let mut o = g.clone();
    optimize(&mut o, opts).unwrap();
    uncast(&o)
}

fn run(g: &Graph, x: &BTreeMap<String, Tensor>) -> RunResult {
    interp::run(g, x).unwrap_or_else(|e| panic!("interpreting {}: {e}", g.name))
}

fn max_abs(t: &[f64]) -> f64 {
    t.iter().fold(0.0, |m, x| m.max(x.abs()))
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.shape, b.shape);
    a.data.iter().zip(&b.data).fold(0.0, |m, (x, y)| m.max((x - y).abs()))
}

const DECAYING: &[&str] = &["fox", "fox_loggate", "fox_qknorm", "alibi", "fox_window"];

/// FoX restricted to a sliding window: pruned, with the window kept as an attribute.
fn fox_window() -> Graph {
    let src = "attention fox_window(q: bf16[B, H, T, D], k: bf16[B, H, T, D], v: bf16[B, H, T, D], fgate: f32[B, H, T]) -> bf16[B, H, T, D] {
        c[b, h, t]      = cumsum(t, logsigmoid(fgate[b, h, t]))
        s[b, h, i, j]   = sum(d, q[b, h, i, d] * k[b, h, j, d]) / sqrt(D) + c[b, h, i] - c[b, h, j]
        p[b, h, i, j]   = softmax(j, window(i, j, 9, s[b, h, i, j]))
        out[b, h, i, d] = sum(j, p[b, h, i, j] * v[b, h, j, d])
        return out
    }";
    let g = foxc_ir::frontend::compile("fox_window.attn", src.as_bytes())
        .map_err(|d| d.render("w", src))
        .unwrap()
        .graph;
    let mut o = g.clone();
    optimize(&mut o, &PassOptions::default()).unwrap();
    let p = o.find(|op| matches!(op, Op::Attention(a) if a.prune != foxc_ir::Prune::Dense));
    assert!(matches!(o.op(p[0]), Op::Attention(a) if a.mask == foxc_ir::Mask::Window(9) && a.decay));
    g
}

fn dims(b: usize, h: usize, t: usize, d: usize) -> BTreeMap<&'static str, usize> {
    [("B", b), ("H", h), ("T", t), ("D", d)].into_iter().collect()
}

/// Check the block boundary of `g` against every tile, by the definition in SEMANTICS.md.
fn check_boundary_brute_force(g: &Graph, x: &BTreeMap<String, Tensor>) {
    let bb = g.find(|op| matches!(op, Op::BlockBoundary(_)))[0];
    let Op::BlockBoundary(tiles) = *g.op(bb) else { unreachable!() };
    let ops = g.operands(bb);
    let vals = interp::eval(g, x, &[ops[0], ops[1], bb]).unwrap();
    let (c, delta, start) = (&vals[&ops[0]], &vals[&ops[1]], &vals[&bb]);
    let (b, h, t) = (c.shape[0], c.shape[1], c.shape[2]);
    let (bm, bn) = (tiles.bm as usize, tiles.bn as usize);
    let mt = t.div_ceil(bm);
    for bi in 0..b {
        for hi in 0..h {
            for m in 0..mt {
                let i0 = m * bm;
                let dl = delta.at(&[bi, hi, m]);
                let diag = i0 / bn;
                let mut want = diag;
                for n in 0..=diag {
                    let jend = (n * bn + bn - 1).min(t - 1);
                    let skip = c.at(&[bi, hi, i0]) - c.at(&[bi, hi, jend]) < dl;
                    if !skip {
                        want = n;
                        break;
                    }
                }
                assert_eq!(start.at(&[bi, hi, m]) as usize, want, "start of tile {m} (b {bi}, h {hi})");
            }
        }
    }
}

/// Rules documented (docs/RULES.md) as never looser than another: (rule, than).
const NEVER_LOOSER: &[(&str, &str)] = &[("tight", "paper"), ("local", "paper"), ("tight-causal", "tight")];

/// One pruning case over every rule of the table; returns (kept, total) tiles per rule, in the
/// table's order.
fn pruning_case(
    ex: &str,
    shape: (usize, usize, usize, usize),
    tiles: Tiles,
    log_eps: f64,
    seed: u64,
    kind: Inputs,
) -> Vec<(u64, u64)> {
    let g = if ex == "fox_window" { fox_window() } else { compile(&format!("examples/{ex}.attn")) };
    let (b, h, t, d) = shape;
    let x = inputs_of(&g, &dims(b, h, t, d), seed, kind);
    let dense = optimized(&g, &PassOptions { prune: false, log_eps, ..PassOptions::default() });
    let reference = run(&dense, &x).output;
    let eps = log_eps.exp();
    let bound = 2.0 * eps * max_abs(&x["v"].data) + 1e-12;
    let mut kept = vec![];
    for def in RULES {
        let rule = def.rule();
        let name = def.name;
        let mut p = optimized(&g, &PassOptions { rule, log_eps, ..PassOptions::default() });
        retile(&mut p, tiles);
        let res = run(&p, &x);
        let diff = max_diff(&res.output, &reference);
        assert!(diff <= bound, "{ex} {name} {kind:?}: |pruned - dense| = {diff} > {bound}");
        assert_eq!(res.prune.len(), 1);
        let st = &res.prune[0];
        assert!(
            st.max_pruned_mass < eps,
            "{ex} {name} {kind:?}: pruned mass {} >= eps {eps}",
            st.max_pruned_mass
        );
        if matches!(kind, Inputs::NoDecay) {
            assert_eq!(st.kept_tiles, st.total_tiles, "{ex} {name}: pruned without decay");
        }
        kept.push((st.kept_tiles, st.total_tiles));
        check_boundary_brute_force(&p, &x);
    }
    let at = |n: &str| kept[RULES.iter().position(|r| r.name == n).expect("rule in the table")].0;
    for (a, b) in NEVER_LOOSER {
        assert!(at(a) <= at(b), "{ex} {kind:?}: {a} keeps {} tiles, {b} {}", at(a), at(b));
    }
    kept
}

fn tile_size() -> impl Strategy<Value = u32> {
    prop_oneof![Just(1u32), Just(4), Just(8), Just(16), Just(64)]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn pruning_is_safe(ex in 0..DECAYING.len(), b in 1usize..3, h in 1usize..4, t in 5usize..70, d in 4usize..17,
                       bm in tile_size(), bn in tile_size(), log_eps in -12.0f64..-2.0, seed in any::<u64>(),
                       kind in 0..INPUTS.len()) {
        pruning_case(DECAYING[ex], (b, h, t, d), Tiles { bm, bn }, log_eps, seed, INPUTS[kind]);
    }
}

fn all_programs() -> Vec<String> {
    let mut v: Vec<String> = ["fox", "fox_loggate", "fox_qknorm", "alibi", "causal", "window"]
        .iter()
        .map(|e| format!("examples/{e}.attn"))
        .collect();
    let mut s: Vec<String> = std::fs::read_dir(root().join("tests/spellings"))
        .unwrap()
        .map(|e| format!("tests/spellings/{}", e.unwrap().file_name().into_string().unwrap()))
        .filter(|n| n.ends_with(".attn"))
        .collect();
    s.sort();
    v.extend(s);
    v
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    /// The unoptimized graph (the DSL's meaning) and the optimized dense graph agree.
    #[test]
    fn optimization_preserves_meaning(t in 1usize..40, d in 4usize..17, h in 1usize..3, seed in any::<u64>()) {
        for f in all_programs() {
            let g = compile(&f);
            let x = inputs(&g, &dims(1, h, t, d), seed);
            let want = run(&uncast(&g), &x).output;
            let got = run(&optimized(&g, &PassOptions { prune: false, ..PassOptions::default() }), &x).output;
            let rel = max_diff(&got, &want) / max_abs(&want.data).max(1e-300);
            prop_assert!(rel < 1e-9, "{}: relative error {} (T = {}, D = {})", f, rel, t, d);
        }
    }
}

/// The property tests above are not vacuous: on a forgetful workload pruning skips tiles.
#[test]
fn pruning_skips_tiles_on_a_forgetful_workload() {
    // Skipped tiles per rule (the table's order), on ordinary and on growing-norm inputs.
    let mut skipped = [vec![0u64; RULES.len()], vec![0u64; RULES.len()]];
    for seed in 0..8 {
        for ex in DECAYING {
            for (s, kind) in skipped.iter_mut().zip([Inputs::Ordinary, Inputs::LargeNorms]) {
                let k = pruning_case(ex, (1, 2, 64, 8), Tiles { bm: 8, bn: 8 }, -10.0, seed, kind);
                for (s, (kept, total)) in s.iter_mut().zip(k) {
                    *s += total - kept;
                }
            }
        }
    }
    let names: Vec<&str> = RULES.iter().map(|r| r.name).collect();
    eprintln!("skipped tiles {names:?}: ordinary {:?}, growing norms {:?}", skipped[0], skipped[1]);
    let at = |s: &[u64], n: &str| s[names.iter().position(|r| *r == n).unwrap()];
    assert!(skipped[0].iter().all(|&s| s > 0), "a rule skips nothing: {:?}", skipped[0]);
    assert!(at(&skipped[0], "tight") > at(&skipped[0], "paper"), "{:?}", skipped[0]);
    // Tile-local norms pay off where norms grow along the sequence.
    assert!(at(&skipped[1], "local") > at(&skipped[1], "paper"), "{:?}", skipped[1]);
}

/// Hard resets (log f = -inf) and gates of exactly 1 stay finite and exact.
#[test]
fn extreme_gates() {
    let g = compile("examples/fox_loggate.attn");
    let mut x = inputs(&g, &dims(1, 1, 33, 8), 7);
    for (n, v) in x.get_mut("logf").unwrap().data.iter_mut().enumerate() {
        *v = match n % 3 {
            0 => f64::NEG_INFINITY,
            1 => 0.0,
            _ => -0.5,
        };
    }
    let dense = run(&optimized(&g, &PassOptions { prune: false, ..PassOptions::default() }), &x).output;
    let mut p = optimized(&g, &PassOptions::default());
    retile(&mut p, Tiles { bm: 4, bn: 4 });
    let res = run(&p, &x);
    assert!(res.output.data.iter().all(|v| v.is_finite()));
    assert!(max_diff(&res.output, &dense) <= 2.0 * (-10.0f64).exp() * max_abs(&x["v"].data) + 1e-12);
    let _: Option<ValueId> = None;
}
