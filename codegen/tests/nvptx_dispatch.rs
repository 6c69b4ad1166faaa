//! NVPTX dispatch of `attention`: what runs on the existing kernel, and the clear "cannot yet
//! run" errors (before any launch) for what does not.

use foxc_codegen::nvptx::{compile, CodegenError, NvptxSpec, NvptxTarget};
use foxc_ir::attention::{Attention, Mask, Prune, RNode, Region, Scale, ScoreBound};
use foxc_ir::*;

fn s(x: &str) -> Dim {
    Dim::sym(x)
}

fn spec() -> NvptxSpec {
    NvptxSpec { target: NvptxTarget::Sm90a, dims: std::collections::BTreeMap::from([("D".to_string(), 64)]) }
}

/// FoX with a pruned attention (fused boundary) whose threshold has the bound `score` and whose
/// score is `region`.
fn graph(score: ScoreBound, region: Region, group: u64) -> Graph {
    let sp = Span::default();
    let mut g = Graph::new("g");
    let kv = if group == 1 { "H" } else { "G" };
    let q = g.add_param("q", ValueType::tensor(DType::BF16, [s("B"), s("H"), s("T"), s("D")]), sp);
    let k = g.add_param("k", ValueType::tensor(DType::BF16, [s("B"), s(kv), s("T"), s("D")]), sp);
    let v = g.add_param("v", ValueType::tensor(DType::BF16, [s("B"), s(kv), s("T"), s("D")]), sp);
    let f = g.add_param("fgate", ValueType::tensor(DType::F32, [s("B"), s("H"), s("T")]), sp);
    let bht = ValueType::tensor(DType::F32, [s("B"), s("H"), s("T")]);
    let c = g.add(Op::GateCumsum { kind: GateKind::Logits }, bht, &[f], sp);
    let scale = Scale::inv_sqrt(1.0, s("D"));
    let th = Op::Threshold {
        rule: PruneRule::Paper,
        log_eps: -10.0,
        bound: NormBound::Data,
        score,
        scale: scale.clone(),
        bm: 64,
    };
    let mt = ValueType::tensor(DType::F32, [s("B"), s("H"), Dim::Tiles(Box::new(s("T")), 64)]);
    let delta = g.add(th, mt, &[q, k], sp);
    let mut a = Attention::new(scale, Mask::Causal, true);
    a.score = region;
    a.kv_group = Dim::Const(group);
    a.tiles = Some(Tiles { bm: 64, bn: 64 });
    a.prune = Prune::Boundary;
    let ops = [q, k, v, c, delta];
    let tys: Vec<ValueType> = ops.iter().map(|&o| g.ty(o).clone()).collect();
    let refs: Vec<&ValueType> = tys.iter().collect();
    let rt = a.result_types(&refs).unwrap();
    let vals: Vec<Value> = ops.iter().map(|&o| Value::of(o)).collect();
    g.output = Some(g.add_multi(Op::Attention(a), rt, &vals, sp));
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

#[test]
fn a_static_threshold_bound_compiles_and_a_region_is_refused_by_name() {
    // The static bound of softcapping maps onto the threshold kernel (identity score here).
    let a = compile(&graph(ScoreBound::Static(20.0), Region::identity(), 1), &spec()).expect("compiles");
    assert!(a.kernels.iter().any(|k| k.name.contains("threshold_delta")));
    assert!(a.kernels.iter().all(|k| !k.name.contains("threshold_norms")), "a static U reads no norms");
    // The region itself: a clear error before any launch.
    let e = compile(&graph(ScoreBound::Static(20.0), softcap(), 1), &spec()).unwrap_err();
    assert!(matches!(e, CodegenError::Unsupported { .. }), "{e}");
    assert!(e.to_string().contains("a score region (the GPU backend cannot yet run it)"), "{e}");
    // Grouped-query heads, and a data bound with an extra term.
    let e = compile(&graph(ScoreBound::IDENTITY, Region::identity(), 2), &spec()).unwrap_err();
    assert!(e.to_string().contains("grouped-query"), "{e}");
    let e = compile(&graph(ScoreBound::Data { gain: 1.0, extra: 4.0 }, Region::identity(), 1), &spec())
        .unwrap_err();
    assert!(e.to_string().contains("U = x + 4"), "{e}");
}
