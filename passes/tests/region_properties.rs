//! Recognition of attention variants into the generic `attention` op: the region, the mask,
//! the decay operand and the score bound of each variant, and explanations in source names.

use foxc_ir::{Attention, GateKind, Graph, Mask, Op, ScoreBound};
use foxc_passes::recognize::{attention_bound, recognize_attention};

/// A FoX-like program whose scores statement is `scores` (over `s0 = q . k / sqrt(D)`), masked
/// by `mask` (with `{}` for the scores), with extra parameters `params`.
fn program(params: &str, scores: &str, mask: &str) -> String {
    let masked = mask.replace("{}", "e[b, h, i, j]");
    format!(
        "attention variant(q: f32[B, H, T, D], k: f32[B, H, T, D], v: f32[B, H, T, D], fgate: f32[B, H, T]{params}) -> f32[B, H, T, D] {{
            c[b, h, t]      = cumsum(t, logsigmoid(fgate[b, h, t]))
            s0[b, h, i, j]  = sum(d, q[b, h, i, d] * k[b, h, j, d]) / sqrt(D)
            e[b, h, i, j]   = {scores}
            p[b, h, i, j]   = softmax(j, {masked})
            out[b, h, i, d] = sum(j, p[b, h, i, j] * v[b, h, j, d])
            return out
        }}"
    )
}

fn compile(src: &str) -> Graph {
    foxc_ir::frontend::compile("variant.attn", src.as_bytes())
        .unwrap_or_else(|d| panic!("{}", d.render("v", src)))
        .graph
}

/// The recognized attention node of `src` (panics with the explanations if there is none).
fn recognized(src: &str) -> (Graph, foxc_ir::ValueId) {
    let mut g = compile(src);
    let ex = recognize_attention(&mut g).unwrap();
    let n = g.find(|op| matches!(op, Op::Attention(_)));
    assert_eq!(n.len(), 1, "not recognized: {ex:?}\n{src}");
    (g, n[0])
}

/// `score = ...` as the printer shows it, with captures named by their parameters.
fn region_text(g: &Graph, n: foxc_ir::ValueId) -> String {
    let Op::Attention(a) = g.op(n) else { unreachable!() };
    let ops = Attention::operands(g, n).unwrap();
    a.score.display_with(&|k| {
        let c = ops.captures[k];
        g.params
            .iter()
            .find(|p| p.node == c)
            .map(|p| p.name.clone())
            .unwrap_or_else(|| format!("%{}", c.index()))
    })
}

/// The gate kind of the decay operand, if any.
fn gate(g: &Graph, n: foxc_ir::ValueId) -> Option<GateKind> {
    let c = Attention::operands(g, n).unwrap().decay?;
    match g.op(c) {
        Op::GateCumsum { kind, .. } => Some(*kind),
        _ => None,
    }
}

struct Case {
    name: &'static str,
    params: &'static str,
    scores: &'static str,
    mask: &'static str,
    region: &'static str,
    gate: Option<GateKind>,
    mask_is: Mask,
    bound: Result<ScoreBound, &'static str>,
}

const FOX: &str = "s0[b, h, i, j] + c[b, h, i] - c[b, h, j]";

fn cases() -> Vec<Case> {
    use GateKind::*;
    let case = |name, params, scores, mask, region, gate, mask_is, bound| Case {
        name,
        params,
        scores,
        mask,
        region,
        gate,
        mask_is,
        bound,
    };
    vec![
        case("fox", "", FOX, "causal(i, j, {})", "x", Some(Logits), Mask::Causal, Ok(ScoreBound::IDENTITY)),
        case(
            "softcap",
            "",
            "20 * tanh(s0[b, h, i, j] / 20) + c[b, h, i] - c[b, h, j]",
            "causal(i, j, {})",
            "20 * tanh(x / 20)",
            Some(Logits),
            Mask::Causal,
            Ok(ScoreBound::Static(20.0)),
        ),
        case(
            "key bias",
            ", kb: f32[B, H, T] in [-4, 0]",
            "s0[b, h, i, j] + kb[b, h, j] + c[b, h, i] - c[b, h, j]",
            "causal(i, j, {})",
            "x + kb[b, h, j]",
            Some(Logits),
            Mask::Causal,
            Ok(ScoreBound::Data { gain: 1.0, extra: 4.0 }),
        ),
        case(
            "unbounded key bias",
            ", kb: f32[B, H, T]",
            "s0[b, h, i, j] + kb[b, h, j] + c[b, h, i] - c[b, h, j]",
            "causal(i, j, {})",
            "x + kb[b, h, j]",
            Some(Logits),
            Mask::Causal,
            Err("kb[b, h, j]"),
        ),
        case(
            "alibi m (j - i)",
            ", m: f32[H] in [0, inf]",
            "s0[b, h, i, j] + m[h] * (j - i)",
            "causal(i, j, {})",
            "x",
            Some(Slope),
            Mask::Causal,
            Ok(ScoreBound::IDENTITY),
        ),
        case(
            "fox + alibi",
            ", m: f32[H] in [0, inf]",
            "s0[b, h, i, j] + c[b, h, i] - c[b, h, j] - m[h] * (i - j)",
            "causal(i, j, {})",
            "x",
            Some(LogGate),
            Mask::Causal,
            Ok(ScoreBound::IDENTITY),
        ),
        case(
            "softcap + key bias, windowed",
            ", kb: f32[B, H, T] in [-1, 1]",
            "20 * tanh(s0[b, h, i, j] / 20) + kb[b, h, j] + c[b, h, i] - c[b, h, j]",
            "window(i, j, 7, {})",
            "20 * tanh(x / 20) + kb[b, h, j]",
            Some(Logits),
            Mask::Window(7),
            Ok(ScoreBound::Static(21.0)),
        ),
        case(
            "relative bias",
            ", rb: f32[H, T]",
            "s0[b, h, i, j] + rb[h, i] * rb[h, j]",
            "select(j <= i, {}, log(0))",
            "x + rb[h, i] * rb[h, j]",
            None,
            Mask::Causal,
            Err("rb[h, i] * rb[h, j]"),
        ),
        case("no mask", "", FOX, "{}", "x", Some(Logits), Mask::None, Ok(ScoreBound::IDENTITY)),
    ]
}

#[test]
fn variants_become_the_op_with_their_region_decay_and_bound() {
    for c in cases() {
        let src = program(c.params, c.scores, c.mask);
        let (g, n) = recognized(&src);
        let Op::Attention(a) = g.op(n) else { unreachable!() };
        assert_eq!(region_text(&g, n), c.region, "{}", c.name);
        assert_eq!(a.mask, c.mask_is, "{}", c.name);
        assert_eq!(gate(&g, n), c.gate, "{}", c.name);
        assert_eq!(a.decay, c.gate.is_some(), "{}", c.name);
        assert_eq!(a.scale.to_string(), "1/sqrt(D)", "{}", c.name);
        match (attention_bound(&g, n), c.bound) {
            (Ok(b), Ok(want)) => assert_eq!(b, want, "{}", c.name),
            (Err(e), Err(at)) => assert!(e.message.contains(at), "{}: {e}", c.name),
            (got, want) => panic!("{}: bound {got:?}, want {want:?}", c.name),
        }
    }
}

/// The softmax written out: `exp(s - max) / sum(exp(s - max))`, without the max, and with the
/// mask applied before or inside the exponential.
#[test]
fn hand_written_softmax_is_the_op() {
    let pre = "attention hw(q: f32[B, H, T, D], k: f32[B, H, T, D], v: f32[B, H, T, D], fgate: f32[B, H, T]) -> f32[B, H, T, D] {
        c[b, h, t]      = cumsum(t, logsigmoid(fgate[b, h, t]))
        s[b, h, i, j]   = causal(i, j, sum(d, q[b, h, i, d] * k[b, h, j, d]) / sqrt(D) + c[b, h, i] - c[b, h, j])";
    for body in [
        "m[b, h, i] = max(j, s[b, h, i, j])
         e[b, h, i, j] = exp(s[b, h, i, j] - m[b, h, i])
         z[b, h, i] = sum(j, e[b, h, i, j])
         out[b, h, i, d] = sum(j, e[b, h, i, j] / z[b, h, i] * v[b, h, j, d])",
        "e[b, h, i, j] = exp(s[b, h, i, j])
         out[b, h, i, d] = sum(j, e[b, h, i, j] / sum(l, e[b, h, i, l]) * v[b, h, j, d])",
        "p[b, h, i, j] = exp(s[b, h, i, j] - max(l, s[b, h, i, l])) / sum(l, exp(s[b, h, i, l] - max(m, s[b, h, i, m])))
         out[b, h, i, d] = sum(j, p[b, h, i, j] * v[b, h, j, d])",
    ] {
        let src = format!("{pre}\n{body}\nreturn out\n}}");
        let (g, n) = recognized(&src);
        assert_eq!(region_text(&g, n), "x");
        assert_eq!(gate(&g, n), Some(GateKind::Logits));
    }
}

/// Grouped-query FoX: k and v have G heads, read at head `h / (H / G)`.
const GQA: &str = "attention gqa(q: f32[B, H, T, D], k: f32[B, G, T, D], v: f32[B, G, T, D], fgate: f32[B, H, T]) -> f32[B, H, T, D] {
    c[b, h, t]      = cumsum(t, logsigmoid(fgate[b, h, t]))
    s[b, h, i, j]   = sum(d, q[b, h, i, d] * k[b, h / (H / G), j, d]) / sqrt(D) + c[b, h, i] - c[b, h, j]
    out[b, h, i, d] = sum(j, softmax(j, causal(i, j, s[b, h, i, j])) * v[b, h / (H / G), j, d])
    return out
}";

/// A relative-position bias read at a computed subscript.
const REL: &str = "attention rel(q: f32[B, H, T, D], k: f32[B, H, T, D], v: f32[B, H, T, D], rel: f32[H, T] in [-1, 1]) -> f32[B, H, T, D] {
    s[b, h, i, j]   = sum(d, q[b, h, i, d] * k[b, h, j, d]) / sqrt(D) + rel[h, i - j]
    out[b, h, i, d] = sum(j, softmax(j, causal(i, j, s[b, h, i, j])) * v[b, h, j, d])
    return out
}";

/// A data-dependent key mask that always keeps the diagonal.
const MASK_EXPR: &str = "attention padded(q: f32[B, H, T, D], k: f32[B, H, T, D], v: f32[B, H, T, D], keep: f32[B, T]) -> f32[B, H, T, D] {
    s[b, h, i, j]   = sum(d, q[b, h, i, d] * k[b, h, j, d]) / sqrt(D)
    out[b, h, i, d] = sum(j, softmax(j, select(max(keep[b, j], select(i == j, 1, 0)) > 0, s[b, h, i, j], -inf)) * v[b, h, j, d])
    return out
}";

/// The causal mask with the `-inf` literal.
const SELECT_INF: &str = "attention sel(q: f32[B, H, T, D], k: f32[B, H, T, D], v: f32[B, H, T, D], fgate: f32[B, H, T]) -> f32[B, H, T, D] {
    c[b, h, t]      = cumsum(t, logsigmoid(fgate[b, h, t]))
    s[b, h, i, j]   = sum(d, q[b, h, i, d] * k[b, h, j, d]) / sqrt(D) + c[b, h, i] - c[b, h, j]
    out[b, h, i, d] = sum(j, softmax(j, select(j <= i, s[b, h, i, j], -inf)) * v[b, h, j, d])
    return out
}";

#[test]
fn grouped_query_attention_is_an_attribute() {
    let (g, n) = recognized(GQA);
    let Op::Attention(a) = g.op(n) else { unreachable!() };
    assert_eq!(a.kv_group, Dim::quotient(Dim::sym("H"), Dim::sym("G")));
    let ops = Attention::operands(&g, n).unwrap();
    // k and v are the [B, G, T, D] parameters themselves: no copy per query head.
    assert_eq!(g.op(ops.k), &Op::Param { name: "k".into(), index: 1 });
    assert_eq!(g.op(ops.v), &Op::Param { name: "v".into(), index: 2 });
    assert_eq!((region_text(&g, n), gate(&g, n)), ("x".to_string(), Some(GateKind::Logits)));
}

#[test]
fn computed_subscripts_and_expression_masks() {
    let (g, n) = recognized(REL);
    assert_eq!(region_text(&g, n), "x + rel[h, i - j]");
    assert_eq!(attention_bound(&g, n), Ok(ScoreBound::Data { gain: 1.0, extra: 1.0 }));
    let (g, n) = recognized(MASK_EXPR);
    let Op::Attention(a) = g.op(n) else { unreachable!() };
    let Mask::Expr(m) = &a.mask else { panic!("mask {:?}", a.mask) };
    assert_eq!(m.display_with(&|_| "keep".into()), "max(keep[b, j], select(i == j, 1, 0)) > 0");
    let (g, n) = recognized(SELECT_INF);
    let Op::Attention(a) = g.op(n) else { unreachable!() };
    assert_eq!((&a.mask, gate(&g, n)), (&Mask::Causal, Some(GateKind::Logits)));
}

/// A key bias computed from the keys themselves (a reduction over the feature axis).
const COMPUTED_BIAS: &str = "attention kbias(q: f32[B, H, T, D], k: f32[B, H, T, D], v: f32[B, H, T, D], w: f32[D]) -> f32[B, H, T, D] {
    s[b, h, i, j]   = sum(d, q[b, h, i, d] * k[b, h, j, d]) / sqrt(D) + tanh(sum(e, w[e] * k[b, h, j, e]))
    out[b, h, i, d] = sum(j, softmax(j, causal(i, j, s[b, h, i, j])) * v[b, h, j, d])
    return out
}";

/// A subterm the region cannot compute per entry but that depends on one of `i`, `j` only is
/// computed outside the attention and captured.
#[test]
fn computed_biases_are_captured() {
    let (g, n) = recognized(COMPUTED_BIAS);
    let text = region_text(&g, n);
    assert!(text.starts_with("x + tanh(%") && text.ends_with("[b, h, j])"), "{text}");
    let ops = Attention::operands(&g, n).unwrap();
    assert_eq!(ops.captures.len(), 1);
    assert_eq!(g.ty(ops.captures[0]).rank(), 3);
    assert_eq!(attention_bound(&g, n), Ok(ScoreBound::Data { gain: 1.0, extra: 1.0 }));
}

/// Explanations name indices as written, never the private names of inlined statements.
#[test]
fn explanations_use_source_names() {
    // k read at the query index: not attention; the message names `d`, not `d'N`.
    let src = program("", "sum(d, q[b, h, i, d] * k[b, h, i, d]) / sqrt(D) + c[b, h, j]", "causal(i, j, {})");
    let mut g = compile(&src);
    let ex = recognize_attention(&mut g).unwrap();
    assert!(g.find(|op| matches!(op, Op::Attention(_))).is_empty());
    assert!(!ex.is_empty());
    for e in &ex {
        assert!(!e.message.contains('\''), "internal name in {:?}", e.message);
    }
}

/// A mask applied inside an expression of the scores (`causal(i, j, s) - 1`) is not fused, and
/// the explanation says where the mask is, not that `q . k` sits in a reduction. (Shown failing
/// before the message: "inside a reduction or a cumsum".)
#[test]
fn a_mask_inside_the_scores_is_explained_as_one() {
    for mask in ["causal(i, j, {}) - 1", "select(j <= i, 0.5 * window(i, j, 8, {}), -inf)"] {
        let src = program("", FOX, mask);
        let mut g = compile(&src);
        let ex = recognize_attention(&mut g).unwrap();
        assert!(g.find(|op| matches!(op, Op::Attention(_))).is_empty(), "{mask}");
        assert!(
            ex.iter().any(|e| e.message.contains("mask is applied inside the scores, not around them")),
            "{mask}: {ex:?}"
        );
    }
}

// ---- Meaning preservation: the recognized op computes what the program says. ----

use foxc_ir::interp::{self, Tensor};
use foxc_ir::Dim;
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;

/// Fresh inputs: parameters with a declared range are drawn inside it (an infinite end is
/// replaced by a finite one 3 away), the others from a normal-ish spread of random amplitude.
fn inputs(g: &Graph, t: usize, d: usize, h: usize, seed: u64) -> BTreeMap<String, Tensor> {
    let mut rng = StdRng::seed_from_u64(seed);
    let amp: f64 = rng.random_range(0.3..2.5);
    g.params
        .iter()
        .map(|p| {
            let shape: Vec<usize> =
                p.ty.dims()
                    .map(|dim| match dim {
                        Dim::Sym(s) if s == "T" => t,
                        Dim::Sym(s) if s == "D" => d,
                        // G divides H (grouped-query attention).
                        Dim::Sym(s) if s == "H" => 2 * h,
                        Dim::Sym(s) if s == "G" => h,
                        Dim::Sym(_) => 2,
                        Dim::Const(c) => *c as usize,
                        other => panic!("parameter dim {other}"),
                    })
                    .collect();
            let (lo, hi) = match p.range {
                Some((lo, hi)) => {
                    let lo = if lo.is_finite() { lo } else { hi.min(0.0) - 3.0 };
                    let hi = if hi.is_finite() { hi } else { lo + 3.0 };
                    (lo, hi)
                }
                None => (-amp * 2.0, amp * 2.0),
            };
            let bias: f64 = if p.name == "fgate" { rng.random_range(-3.0..4.0) } else { 0.0 };
            (p.name.clone(), Tensor::from_fn(&shape, |_| bias + rng.random_range(lo..=hi)))
        })
        .collect()
}

/// `g` without its final cast.
fn uncast(g: &Graph) -> Graph {
    let mut g = g.clone();
    let out = g.output.unwrap();
    if matches!(g.op(out), Op::Cast) {
        g.output = Some(g.operands(out)[0]);
        g.remove_dead();
    }
    g
}

/// Every program recognition must preserve: the cases above, the other variants, the examples
/// and the spellings.
fn programs() -> Vec<String> {
    let mut v: Vec<String> = cases().iter().map(|c| program(c.params, c.scores, c.mask)).collect();
    v.extend([GQA, REL, MASK_EXPR, SELECT_INF, COMPUTED_BIAS].map(String::from));
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for dir in ["examples", "tests/spellings"] {
        let mut files: Vec<_> = std::fs::read_dir(root.join(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "attn"))
            .collect();
        files.sort();
        v.extend(files.iter().map(|f| std::fs::read_to_string(f).unwrap()));
    }
    v
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, failure_persistence: None, ..ProptestConfig::default() })]

    /// The interpreter on the program as written and on the recognized graph agree (relative
    /// 1e-9) on fresh random inputs, for every program recognition fuses.
    #[test]
    fn recognition_preserves_meaning(t in 1usize..24, d in 2usize..9, h in 1usize..4, seed in any::<u64>()) {
        for src in programs() {
            let g = compile(&src);
            let mut o = g.clone();
            recognize_attention(&mut o).unwrap();
            if o.find(|op| matches!(op, Op::Attention(_))).is_empty() {
                continue;
            }
            let x = inputs(&g, t, d, h, seed);
            let want = interp::run(&uncast(&g), &x).unwrap().output;
            let got = interp::run(&uncast(&o), &x).unwrap().output;
            let scale = want.data.iter().fold(1e-300f64, |m, v| m.max(v.abs()));
            let err = want.data.iter().zip(&got.data).fold(0.0f64, |m, (a, b)| m.max((a - b).abs())) / scale;
            prop_assert!(err < 1e-9, "relative error {} (T = {}, D = {}, H = {})\n{}", err, t, d, h, src);
        }
    }
}

/// The property above is not vacuous: it covers at least every case, the examples and the
/// spellings that fuse.
#[test]
fn meaning_check_covers_the_variants() {
    let fused = programs()
        .iter()
        .filter(|src| {
            let mut g = compile(src);
            recognize_attention(&mut g).unwrap();
            !g.find(|op| matches!(op, Op::Attention(_))).is_empty()
        })
        .count();
    assert!(fused >= cases().len() + 5 + 20, "only {fused} programs fuse");
}

// ---- Pruning safety with regions: what ACP skips weighs less than eps. ----

use foxc_ir::{Prune, Tiles, ValueType};
use foxc_passes::{optimize, PassOptions};

/// Small tiles on every ACP node (the pass picks 64 x 64; small T needs small tiles to prune).
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
        let node = g.node_mut(n);
        match &op {
            Op::Attention(a) => {
                let mut rt = a.result_types(&refs).unwrap();
                node.ty = rt.remove(0);
                node.more = rt;
            }
            _ => node.ty = foxc_ir::check::infer(&op, &refs).unwrap().unwrap(),
        }
        node.op = op;
    }
    foxc_ir::verify::verify(g).unwrap();
}

/// The decaying variants: each must be pruned by the pipeline.
fn decaying() -> Vec<String> {
    let mut v: Vec<String> = cases()
        .iter()
        .filter(|c| c.gate.is_some() && c.bound.is_ok() && c.mask_is != Mask::None)
        .map(|c| program(c.params, c.scores, c.mask))
        .collect();
    v.push(GQA.to_string());
    v
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, failure_persistence: None, ..ProptestConfig::default() })]

    /// Pruned output within `2 eps max|v|` of the program's meaning, and the pruned mass of every
    /// row below eps, for every decaying variant (static and data bounds).
    #[test]
    fn pruning_with_regions_is_safe(t in 4usize..48, d in 2usize..9, h in 1usize..3, seed in any::<u64>(),
                                    bm in prop_oneof![Just(1u32), Just(4), Just(8)],
                                    bn in prop_oneof![Just(1u32), Just(4), Just(8)],
                                    log_eps in -12.0f64..-3.0) {
        for src in decaying() {
            let g = compile(&src);
            let mut o = g.clone();
            optimize(&mut o, &PassOptions { log_eps, ..PassOptions::default() }).unwrap();
            let pruned = o.find(|op| matches!(op, Op::Attention(a) if a.prune != Prune::Dense));
            prop_assert_eq!(pruned.len(), 1, "not pruned:\n{}", src);
            retile(&mut o, Tiles { bm, bn });
            let x = inputs(&g, t, d, h, seed);
            let want = interp::run(&uncast(&g), &x).unwrap().output;
            let res = interp::run(&uncast(&o), &x).unwrap();
            let eps = log_eps.exp();
            let vmax = x["v"].data.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            let diff = want.data.iter().zip(&res.output.data).fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
            prop_assert!(diff <= 2.0 * eps * vmax + 1e-9, "|pruned - program| = {} > {}\n{}", diff, 2.0 * eps * vmax, src);
            prop_assert_eq!(res.prune.len(), 1);
            prop_assert!(res.prune[0].max_pruned_mass < eps, "pruned mass {} >= {}\n{}", res.prune[0].max_pruned_mass, eps, src);
        }
    }
}

/// The property above is not vacuous: with forgetful gates, tiles are skipped for every variant.
#[test]
fn regions_still_prune_tiles() {
    for src in decaying() {
        let g = compile(&src);
        let mut o = g.clone();
        optimize(&mut o, &PassOptions::default()).unwrap();
        retile(&mut o, Tiles { bm: 4, bn: 4 });
        let mut x = inputs(&g, 64, 4, 1, 3);
        // Strongly forgetful gates and slopes.
        if let Some(f) = x.get_mut("fgate") {
            f.data.iter_mut().for_each(|v| *v = -3.0);
        }
        if let Some(m) = x.get_mut("m") {
            m.data.iter_mut().for_each(|v| *v = 2.0);
        }
        let res = interp::run(&uncast(&o), &x).unwrap();
        let st = &res.prune[0];
        assert!(
            st.kept_tiles < st.total_tiles,
            "nothing skipped ({} of {})\n{src}",
            st.kept_tiles,
            st.total_tiles
        );
    }
}

/// Recognition's result depends on its node and iteration limits only, and every program
/// saturates well within them (so the limits do not decide anything either).
#[test]
fn every_program_saturates_within_the_limits() {
    for src in programs() {
        let g = compile(&src);
        let (saturated, nodes) = foxc_passes::recognize::saturates(&g).unwrap();
        assert!(saturated, "{nodes} e-nodes, not saturated:\n{src}");
    }
}
