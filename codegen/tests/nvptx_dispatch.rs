//! NVPTX dispatch of `attention`: what runs on the existing kernel (score regions without
//! captures, grouped-query heads), and the clear "cannot yet run" errors (before any launch)
//! for what does not.

use foxc_codegen::nvptx::ptxas;
use foxc_codegen::nvptx::{compile, CodegenError, NvptxSpec, NvptxTarget};
use foxc_ir::attention::{Attention, Mask, Prune, RNode, Region, Scale, ScoreBound};
use foxc_ir::*;

fn s(x: &str) -> Dim {
    Dim::sym(x)
}

fn spec() -> NvptxSpec {
    NvptxSpec::new(NvptxTarget::Sm90a, std::collections::BTreeMap::from([("D".to_string(), 64)]))
}

/// FoX with a pruned attention (fused boundary) whose threshold has the bound `score` and whose
/// score is `region`.
fn graph(score: ScoreBound, region: Region, group: u64) -> Graph {
    graph_rule(foxc_passes::rules::by_name("paper").unwrap(), score, region, group)
}

/// [`graph`] with the threshold's rule (the tight rule reads k rows in the delta kernel).
fn graph_rule(rule: PruneRule, score: ScoreBound, region: Region, group: u64) -> Graph {
    let sp = Span::default();
    let mut g = Graph::new("g");
    let kv = if group == 1 { "H" } else { "G" };
    let q = g.add_param("q", ValueType::tensor(DType::BF16, [s("B"), s("H"), s("T"), s("D")]), sp);
    let k = g.add_param("k", ValueType::tensor(DType::BF16, [s("B"), s(kv), s("T"), s("D")]), sp);
    let v = g.add_param("v", ValueType::tensor(DType::BF16, [s("B"), s(kv), s("T"), s("D")]), sp);
    let f = g.add_param("fgate", ValueType::tensor(DType::F32, [s("B"), s("H"), s("T")]), sp);
    let bht = ValueType::tensor(DType::F32, [s("B"), s("H"), s("T")]);
    let c = g.add(Op::GateCumsum { kind: GateKind::Logits, split_rows: false }, bht, &[f], sp);
    let scale = Scale::inv_sqrt(1.0, s("D"));
    let plan = foxc_passes::fuse_out::threshold_plan(&rule, &score, NormBound::Data);
    let th = Op::Threshold {
        rule,
        log_eps: -10.0,
        bound: NormBound::Data,
        score,
        scale: scale.clone(),
        bm: 64,
        plan,
    };
    let mt = ValueType::tensor(DType::F32, [s("B"), s("H"), Dim::Tiles(Box::new(s("T")), 64)]);
    let delta = g.add(th, mt, &[q, k], sp);
    let mut a = Attention::new(scale, Mask::Causal, true);
    a.score = region;
    a.kv_group = Dim::Const(group);
    a.tiles = Some(Tiles { bm: 64, bn: 64 });
    a.prune = Prune::Boundary;
    let ops = [q, k, v, c, delta];
    g.output = Some(g.add_attention(a, &ops, sp).unwrap());
    foxc_ir::verify::verify(&g).unwrap();
    g
}

fn softcap() -> Region {
    let mut r = Region::new();
    let x = r.push(RNode::Score);
    let a = r.push(RNode::Const(20.0));
    let d = r.push(RNode::Binary(BinaryOp::Div, x, a));
    let t = r.push(RNode::Unary(UnaryOp::Tanh, d));
    r.push(RNode::Binary(BinaryOp::Mul, a, t));
    r
}

fn spec_with(t: NvptxTarget, dims: &[(&str, u64)]) -> NvptxSpec {
    NvptxSpec::new(t, dims.iter().map(|(k, v)| (k.to_string(), *v)).collect())
}

#[test]
fn a_static_threshold_bound_and_a_score_region_compile() {
    // The static bound of softcapping maps onto the threshold kernel (identity score here).
    let a = compile(&graph(ScoreBound::Static(20.0), Region::identity(), 1), &spec()).expect("compiles");
    assert!(a.kernels.iter().any(|k| k.name.contains("threshold_delta")));
    assert!(a.kernels.iter().all(|k| !k.name.contains("threshold_norms")), "a static U reads no norms");
    let plain = a.kernels.iter().find(|k| k.name.starts_with("foxc_attn_fwd")).unwrap().name.clone();
    // The region runs in the kernel's score hook: the same kernel, named with the region's tag.
    let a = compile(&graph(ScoreBound::Static(20.0), softcap(), 1), &spec()).expect("compiles");
    let attn = a.kernels.iter().find(|k| k.name.starts_with("foxc_attn_fwd")).unwrap();
    assert!(attn.name.starts_with(&format!("{plain}_r")), "{} vs {plain}", attn.name);
    assert!(a.llvm_ir.contains("tanh.approx.f32"), "tanh is one MUFU instruction");
    // A data bound with an extra term (a ranged key bias: U = x + 4) reads the norms and
    // renders U in the delta kernel (threshold.rs).
    let a = compile(&graph(ScoreBound::Data { gain: 1.0, extra: 4.0 }, Region::identity(), 1), &spec())
        .expect("a data bound with an extra term compiles");
    assert!(a.kernels.iter().any(|k| k.name.contains("threshold_norms")));
}

/// Grouped-query heads: K and V of head `bh / group` in the attention kernel and in both
/// threshold kernels (the norms of k per key/value head); the heads must be static.
#[test]
fn grouped_query_heads_compile_with_static_heads() {
    let g = graph(ScoreBound::IDENTITY, Region::identity(), 3);
    let e = compile(&g, &spec()).unwrap_err();
    assert!(matches!(e, CodegenError::User(_)), "{e}");
    assert!(e.to_string().contains("query heads (H)"), "{e}");
    let a = compile(&g, &spec_with(NvptxTarget::Sm90a, &[("D", 64), ("H", 6), ("G", 2)])).expect("compiles");
    let attn = a.kernels.iter().find(|k| k.name.starts_with("foxc_attn_fwd")).unwrap();
    assert!(attn.name.contains("_g3_"), "{}", attn.name);
    // Both kernels that read k rows (attention, norms; the paper rule's delta reads none)
    // divide the flat head by the group (LLVM may narrow the division).
    let divs = a.llvm_ir.lines().filter(|l| l.contains(" udiv ") && l.ends_with(", 3")).count();
    assert_eq!(divs, 2, "{}", a.llvm_ir);
    // The tight rule's delta kernel reads k rows too.
    let g = graph_rule(
        foxc_passes::rules::by_name("tight").unwrap(),
        ScoreBound::IDENTITY,
        Region::identity(),
        3,
    );
    let a = compile(&g, &spec_with(NvptxTarget::Sm90a, &[("D", 64), ("H", 6), ("G", 2)])).expect("compiles");
    let divs = a.llvm_ir.lines().filter(|l| l.contains(" udiv ") && l.ends_with(", 3")).count();
    assert_eq!(divs, 3, "{}", a.llvm_ir);
    let e = compile(&g, &spec_with(NvptxTarget::Sm90a, &[("D", 64), ("H", 7), ("G", 2)])).unwrap_err();
    assert!(e.to_string().contains("must divide"), "{e}");
}

/// Softcap (region + static bound) and GQA (paper and tight thresholds) assemble with ptxas for sm_90a and sm_80 at D = 64
/// and 128.
#[test]
fn softcap_and_gqa_assemble_with_ptxas() {
    let Some(ptxas) = ptxas::find() else {
        eprintln!("note: ptxas not found (set $PTXAS); skipping the PTX assembly check");
        return;
    };
    let graphs = [
        ("softcap", graph(ScoreBound::Static(20.0), softcap(), 1)),
        ("gqa", graph(ScoreBound::IDENTITY, Region::identity(), 3)),
        ("gqa_softcap", graph(ScoreBound::Static(20.0), softcap(), 3)),
        (
            "gqa_tight",
            graph_rule(
                foxc_passes::rules::by_name("tight").unwrap(),
                ScoreBound::IDENTITY,
                Region::identity(),
                3,
            ),
        ),
    ];
    for (name, g) in &graphs {
        for t in [NvptxTarget::Sm90a, NvptxTarget::Sm80] {
            for d in [64, 128] {
                let a = compile(g, &spec_with(t, &[("D", d), ("H", 6), ("G", 2)])).expect("compiles");
                ptxas::assemble(&ptxas, &a.ptx, t.cpu())
                    .unwrap_or_else(|log| panic!("ptxas failed on {name}_{}_d{d}:\n{log}", t.cpu()));
            }
        }
    }
}
