//! The NVPTX threshold kernels for every rule of the table: each formula compiles under every
//! kind of score bound and norm bound, the per-tile norms kernel is launched exactly when the
//! rendered formula reads a norm statistic from the data (with the deltas in the same kernel
//! when it reads no row statistic), and (when ptxas is found) the PTX assembles for sm_90a and
//! sm_80.

use foxc_codegen::nvptx::ptxas;
use foxc_codegen::nvptx::{compile, NvptxSpec, NvptxTarget};
use foxc_ir::prune_rule::Stat;
use foxc_ir::{DType, Dim, Graph, NormBound, Op, PruneRule, Scale, ScoreBound, Span, ValueType};
use foxc_passes::rules::RULES;
use std::collections::BTreeMap;

/// q, k (bf16 [B, H, T, D]) -> threshold -> the graph's output.
fn threshold_graph(rule: PruneRule, bound: NormBound, score: ScoreBound) -> Graph {
    let s = Span::default();
    let mut g = Graph::new("th");
    let bhtd = vec![Dim::sym("B"), Dim::sym("H"), Dim::sym("T"), Dim::sym("D")];
    let q = g.add_param("q", ValueType::tensor(DType::BF16, bhtd.clone()), s);
    let k = g.add_param("k", ValueType::tensor(DType::BF16, bhtd), s);
    let ty = ValueType::tensor(
        DType::F32,
        [Dim::sym("B"), Dim::sym("H"), Dim::Tiles(Box::new(Dim::sym("T")), 64)],
    );
    let plan = foxc_passes::fuse_out::threshold_plan(&rule, &score, bound);
    let th =
        Op::Threshold { rule, log_eps: -10.0, bound, score, scale: Scale::constant(0.125), bm: 64, plan };
    let delta = g.add(th, ty, &[q, k], s);
    g.output = Some(delta);
    foxc_ir::verify::verify(&g).unwrap();
    g
}

fn cases() -> Vec<(String, Graph, bool)> {
    let mut v = vec![];
    let scores = [ScoreBound::IDENTITY, ScoreBound::Static(20.0), ScoreBound::Data { gain: 1.0, extra: 4.0 }];
    let bounds = [NormBound::Data, NormBound::Static { q_max: 8.0, k_max: 8.0 }];
    for r in RULES {
        for score in scores {
            if !r.rule().fits(&score) {
                continue;
            }
            for bound in bounds {
                let rule = r.rule();
                let reads = rule.formula.stats_under(&score);
                let norms = bound == NormBound::Data
                    && reads
                        .iter()
                        .any(|s| matches!(s, Stat::QMax | Stat::KMax | Stat::QTile | Stat::KCausal));
                v.push((format!("{} {score} {bound:?}", r.name), threshold_graph(rule, bound, score), norms));
            }
        }
    }
    // Per-head thresholds given by the user: no statistic of the data, under every bound.
    for score in scores {
        for bound in bounds {
            let rule = given();
            v.push((format!("{rule} {score} {bound:?}"), threshold_graph(rule, bound, score), false));
        }
    }
    v
}

/// `given[-8, -12.5, -inf]` (`--thresholds -8,-12.5,-inf`).
fn given() -> PruneRule {
    PruneRule::given_thresholds(&[-8.0, -12.5, f64::NEG_INFINITY]).unwrap()
}

/// The given thresholds reach the delta kernel as its f32 constants, selected by the head
/// `bh mod 3` (the table's length: the driver refuses another H before any launch).
#[test]
fn given_thresholds_are_the_delta_kernels_constants() {
    let g = threshold_graph(given(), NormBound::Data, ScoreBound::IDENTITY);
    for t in [NvptxTarget::Sm90a, NvptxTarget::Sm80] {
        let a = compile(&g, &spec(t)).unwrap();
        let names: Vec<&str> = a.kernels.iter().map(|k| k.name.as_str()).collect();
        assert_eq!(names.len(), 1, "{names:?}");
        // -8, -12.5 and -inf as PTX f32 literals, chosen by selects on the head.
        for lit in ["0fC1000000", "0fC1480000", "0fFF800000"] {
            assert!(a.ptx.contains(lit), "{lit} not in the PTX:\n{}", a.ptx);
        }
        assert_eq!(a.ptx.matches("selp.f32").count(), 2, "two selects over three heads:\n{}", a.ptx);
    }
}

fn spec(t: NvptxTarget) -> NvptxSpec {
    NvptxSpec::new(t, BTreeMap::from([("D".to_string(), 64)]))
}

#[test]
fn every_rule_compiles_with_a_norms_kernel_exactly_when_it_reads_data_norms() {
    let cases = cases();
    assert!(cases.len() >= RULES.len() * 2, "{} cases", cases.len());
    for (what, g, norms) in &cases {
        let a = compile(g, &spec(NvptxTarget::Sm90a)).unwrap_or_else(|e| panic!("{what}: {e}"));
        let names: Vec<&str> = a.kernels.iter().map(|k| k.name.as_str()).collect();
        // Norm statistics without row statistics: one kernel (norms, then each head's deltas).
        let fused = *norms
            && !g.find(|o| matches!(o, Op::Threshold { .. })).iter().any(|&n| {
                let Op::Threshold { rule, score, .. } = g.op(n) else { return false };
                rule.formula.stats_under(score).iter().any(|s| s.per_row())
            });
        let last = if fused { "threshold_norms_delta" } else { "threshold_delta" };
        assert!(names.last().is_some_and(|n| n.contains(last)), "{what}: {names:?}");
        assert_eq!(names.iter().any(|n| n.contains("threshold_norms")), *norms, "{what}: {names:?}");
        assert_eq!(names.len(), if *norms && !fused { 2 } else { 1 }, "{what}: {names:?}");
    }
}

#[test]
fn every_rule_assembles_with_ptxas() {
    let Some(ptxas) = ptxas::find() else {
        eprintln!("note: ptxas not found (set $PTXAS); skipping the PTX assembly check");
        return;
    };
    for (n, (what, g, _)) in cases().iter().enumerate() {
        for t in [NvptxTarget::Sm90a, NvptxTarget::Sm80] {
            let a = compile(g, &spec(t)).unwrap_or_else(|e| panic!("{what}: {e}"));
            ptxas::assemble(&ptxas, &a.ptx, t.cpu())
                .unwrap_or_else(|log| panic!("ptxas failed on c{n}_{}:\n{log}", t.cpu()));
        }
    }
}

/// The pruned FoX forward as the GPU passes leave it (examples/fox.attn, boundary fused).
fn pruned_fox() -> Graph {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/fox.attn");
    let src = std::fs::read(path).unwrap();
    let mut g = foxc_ir::frontend::compile("fox.attn", &src).unwrap().graph;
    let opts = foxc_passes::PassOptions { target: foxc_passes::Target::Sm90a, ..Default::default() };
    foxc_passes::optimize(&mut g, &opts).unwrap();
    g
}

/// `NvptxSpec::debug_starts`: the attention kernel gets one more pointer parameter, the i32
/// `[B, H, Mt]` buffer the artifact names, and a kernel of its own name; off, nothing changes.
#[test]
fn debug_starts_add_a_buffer_and_a_parameter_only_when_asked() {
    let g = pruned_fox();
    for t in [NvptxTarget::Sm90a, NvptxTarget::Sm80] {
        let plain = compile(&g, &spec(t)).unwrap();
        assert_eq!(plain.debug_starts, None);
        assert!(!plain.ptx.contains("_dbgstart"));
        let mut s = spec(t);
        s.debug_starts = true;
        let a = compile(&g, &s).unwrap();
        let buf = a.debug_starts.expect("a debug buffer");
        assert_eq!(a.buffers[buf].dtype, DType::I32);
        assert_eq!(a.buffers[buf].shape.len(), 3, "{:?}", a.buffers[buf].shape);
        let attn = a.kernels.iter().find(|k| k.name.starts_with("foxc_attn_fwd")).unwrap();
        assert!(attn.name.contains("_dbgstart"), "{}", attn.name);
        let plain_attn = plain.kernels.iter().find(|k| k.name.starts_with("foxc_attn_fwd")).unwrap();
        assert_eq!(attn.args.len(), plain_attn.args.len() + 1);
        assert_eq!(attn.args.last(), Some(&foxc_codegen::nvptx::KernelArg::Buffer(buf)));
        // The kernel reads the parameter (to store the starts): its PTX loads it.
        assert!(
            a.ptx.contains(&format!("[{}_param_{}]", attn.name, attn.args.len() - 1)),
            "no use of the param"
        );
        if let Some(ptxas) = ptxas::find() {
            ptxas::assemble(&ptxas, &a.ptx, t.cpu())
                .unwrap_or_else(|log| panic!("ptxas failed on dbg:\n{log}"));
        }
    }
}

/// The one-kernel threshold counts each head's blocks in with a relaxed atomic between two
/// `fence.acq_rel.gpu` (the writer's release, the last block's acquire), tells the whole block
/// whether it was last through `bar.red.or`, and scans the tiles' key norms (`shfl.sync.up`)
/// only for a formula that reads k_causal.
#[test]
fn the_one_kernel_threshold_counts_blocks_in_and_scans_only_for_k_causal() {
    for (name, scans) in [("paper", false), ("local", true)] {
        let rule = foxc_passes::rules::by_name(name).unwrap();
        let g = threshold_graph(rule, NormBound::Data, ScoreBound::IDENTITY);
        let a = compile(&g, &spec(NvptxTarget::Sm90a)).unwrap();
        assert_eq!(a.kernels.len(), 1, "{name}");
        assert!(a.kernels[0].name.contains("threshold_norms_delta"), "{name}");
        assert_eq!(a.ptx.matches("fence.acq_rel.gpu;").count(), 2, "{name}");
        assert_eq!(a.ptx.matches("atom.global.add.u32").count(), 1, "{name}");
        assert!(a.ptx.contains("bar.red.or.pred"), "{name}");
        assert_eq!(a.ptx.contains("shfl.sync.up"), scans, "{name}");
    }
}
