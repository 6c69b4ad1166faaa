//! NVPTX backend: module assembly, launch plans, LLVM IR snapshots, and (when ptxas is found)
//! that every kernel's PTX assembles for sm_90a and sm_80.

use foxc_codegen::nvptx::ptxas;
use foxc_codegen::nvptx::{compile, BufferKind, CodegenError, KernelArg, Launch, NvptxSpec, NvptxTarget};
use foxc_ir::{
    Attention, DType, Dim, GateKind, Graph, Mask, NormBound, Op, Prelude, Prune, PruneRule, Scale,
    ScoreBound, Span, Tiles, ValueId, ValueType,
};
use std::collections::BTreeMap;

fn bhtd() -> Vec<Dim> {
    vec![Dim::sym("B"), Dim::sym("H"), Dim::sym("T"), Dim::sym("D")]
}
fn bht() -> Vec<Dim> {
    vec![Dim::sym("B"), Dim::sym("H"), Dim::sym("T")]
}
fn tiles_ty(bm: u32) -> ValueType {
    ValueType::tensor(DType::F32, [Dim::sym("B"), Dim::sym("H"), Dim::Tiles(Box::new(Dim::sym("T")), bm)])
}

/// An attention node with both results typed by the op's rule.
fn attention(g: &mut Graph, a: Attention, ops: &[ValueId]) -> ValueId {
    g.add_attention(a, ops, Span::default()).unwrap()
}

/// The pruned FoX forward as the GPU passes produce it: gate cumsum of logits, a data-bound
/// paper threshold, pruned attention with the boundary fused (delta operand), bf16 output
/// (`out_dtype`); another output dtype stays a cast after an f32 attention.
fn fox_graph(rule: PruneRule, bound: NormBound) -> Graph {
    fox_graph_out(rule, bound, DType::BF16)
}

fn fox_graph_out(rule: PruneRule, bound: NormBound, out_dtype: DType) -> Graph {
    let s = Span::default();
    let mut g = Graph::new("fox");
    g.dims = vec!["B".into(), "H".into(), "T".into(), "D".into()];
    let q = g.add_param("q", ValueType::tensor(DType::BF16, bhtd()), s);
    let k = g.add_param("k", ValueType::tensor(DType::BF16, bhtd()), s);
    let v = g.add_param("v", ValueType::tensor(DType::BF16, bhtd()), s);
    let f = g.add_param("fgate", ValueType::tensor(DType::F32, bht()), s);
    let c = g.add(
        Op::GateCumsum { kind: GateKind::Logits, split_rows: false },
        ValueType::tensor(DType::F32, bht()),
        &[f],
        s,
    );
    let scale = Scale::inv_sqrt(1.0, Dim::sym("D"));
    let plan = foxc_passes::fuse_out::threshold_plan(&rule, &ScoreBound::IDENTITY, bound);
    let th = Op::Threshold {
        rule,
        log_eps: -10.0,
        bound,
        score: ScoreBound::IDENTITY,
        scale: scale.clone(),
        bm: 128,
        plan,
    };
    let delta = g.add(th, tiles_ty(128), &[q, k], s);
    let mut a = Attention::new(scale, Mask::Causal, true);
    a.tiles = Some(Tiles { bm: 128, bn: 64 });
    a.prune = Prune::Boundary;
    if out_dtype == DType::BF16 {
        a.out_dtype = DType::BF16;
    }
    let o = attention(&mut g, a, &[q, k, v, c, delta]);
    g.output = Some(if out_dtype == DType::BF16 {
        o
    } else {
        g.add(Op::Cast, ValueType::tensor(out_dtype, bhtd()), &[o], s)
    });
    g
}

/// QK-norm, ALiBi slopes, dense attention over f32 q/k (cast to bf16 inside the plan).
fn qknorm_alibi_graph() -> Graph {
    let s = Span::default();
    let mut g = Graph::new("alibi qk");
    let q = g.add_param("q", ValueType::tensor(DType::BF16, bhtd()), s);
    let k = g.add_param("k", ValueType::tensor(DType::BF16, bhtd()), s);
    let v = g.add_param("v", ValueType::tensor(DType::BF16, bhtd()), s);
    let wq = g.add_param("wq", ValueType::tensor(DType::F32, [Dim::sym("D")]), s);
    let m = g.add_param("m", ValueType::tensor(DType::F32, [Dim::sym("H")]), s);
    let rms = |g: &mut Graph, x, w| {
        g.add(Op::RmsNorm { axis: "3".into(), eps: 1e-6 }, ValueType::tensor(DType::F32, bhtd()), &[x, w], s)
    };
    let qn = rms(&mut g, q, wq);
    let kn = rms(&mut g, k, wq);
    let c = g.add(
        Op::GateCumsum { kind: GateKind::Slope, split_rows: false },
        ValueType::tensor(DType::F32, bht()),
        &[m],
        s,
    );
    let mut a = Attention::new(Scale::constant(0.125), Mask::Window(256), true);
    a.tiles = Some(Tiles { bm: 64, bn: 64 });
    let o = attention(&mut g, a, &[qn, kn, v, c]);
    g.output = Some(o);
    with_half_operands(g)
}

/// `g` as the GPU pipeline hands it to code generation: the `half-operands` pass has cast every
/// attention operand that is not 16-bit (here the f32 normed q and k) to the kernels' type.
fn with_half_operands(mut g: Graph) -> Graph {
    let opts = foxc_passes::PassOptions { target: foxc_passes::Target::Sm90a, ..Default::default() };
    foxc_passes::half_operands::run(&mut g, &opts, &mut Default::default()).unwrap();
    g
}

fn spec(t: NvptxTarget, d: u64) -> NvptxSpec {
    NvptxSpec::new(t, BTreeMap::from([("D".to_string(), d)]))
}

#[test]
fn fox_plan_has_one_kernel_per_node_and_no_boundary_launch() {
    let g = fox_graph(foxc_passes::rules::by_name("paper").unwrap(), NormBound::Data);
    let a = compile(&g, &spec(NvptxTarget::Sm90a, 64)).expect("compiles");
    let names: Vec<&str> = a.kernels.iter().map(|k| k.name.as_str()).collect();
    // The output cast to bf16 is fused into the attention epilogue: no cast launch. The paper
    // rule reads only norm statistics: the threshold is one kernel (norms, then each head's
    // last block evaluates its deltas).
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(names[0].contains("gate_cumsum"), "{names:?}");
    assert!(names[1].contains("threshold_norms_delta"), "{names:?}");
    assert!(names[2].starts_with("foxc_attn_fwd_d64_bm128_bn64") && names[2].contains("_prune"), "{names:?}");
    assert!(names[2].contains("_obf16_"), "{names:?}");
    for k in &a.kernels {
        assert!(a.ptx.contains(&format!(".entry {}", k.name)), "PTX lacks {}", k.name);
    }
    assert!(a.ptx.contains(".target sm_90a"));
    let buffer = |k: usize, arg: usize| match &a.kernels[k].args[arg] {
        KernelArg::Buffer(b) => *b,
        other => panic!("{other:?}"),
    };
    // Its arguments: the per-tile norms (scratch), delta (the threshold's value, which the
    // attention reads as its argument 5) and the per-head arrival counters (zero at the first
    // launch, left zero: counters, not scratch).
    assert!(matches!(a.buffers[buffer(1, 2)].kind, BufferKind::Scratch(_)));
    let threshold = g.find(|o| matches!(o, Op::Threshold { .. }))[0];
    assert_eq!(a.buffers[buffer(1, 3)].kind, BufferKind::Value(threshold.into()));
    assert!(matches!(a.buffers[buffer(1, 4)].kind, BufferKind::Counters(_)));
    assert_eq!(a.buffers[buffer(1, 4)].dtype, DType::I32);
    assert_eq!(buffer(2, 4), buffer(1, 3));
    let bind = |s: &str| match s {
        "B" => Some(2),
        "H" => Some(3),
        "T" => Some(1000),
        "D" => Some(64),
        _ => None,
    };
    let geo = a.kernels[2].geometry(&bind).unwrap();
    // The attention kernel's own geometry (a block may own part of a bm tile).
    let Launch::Attention { cfg, .. } = &a.kernels[2].launch else { panic!("not attention") };
    assert_eq!(geo, foxc_codegen::nvptx::attention::launch_geometry(cfg, 1000, 1000, 6, None));
    assert_eq!(geo.grid.1, 6);
    assert_eq!(a.kernels[0].geometry(&bind).unwrap().grid, (6, 1, 1));
    assert_eq!(a.buffers[a.outputs[0]].dtype, DType::BF16);
    // The attention writes the graph output directly (out_dtype bf16).
    assert!(matches!(&a.kernels[2].args[5], KernelArg::Buffer(b) if *b == a.outputs[0]));
    assert_eq!(a.buffers[a.outputs[0]].kind, BufferKind::Value(g.output.unwrap().into()));
    assert!(cfg.out_half);
}

/// `prelude = joint`: the gate scan is one more block per head of the one-kernel threshold, and
/// the plan is that launch, then the attention (no fork into two lanes).
#[test]
fn joint_prelude_is_one_launch_before_the_attention() {
    let mut g = fox_graph(foxc_passes::rules::by_name("paper").unwrap(), NormBound::Data);
    let attn = g.find(|o| matches!(o, Op::Attention(_)))[0];
    let Op::Attention(a) = &mut g.node_mut(attn).op else { unreachable!() };
    a.prelude = Prelude::Joint;
    let a = compile(&g, &spec(NvptxTarget::Sm90a, 128)).expect("compiles");
    let names: Vec<&str> = a.kernels.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(names[0].contains("threshold_with_scan"), "{names:?}");
    let c = g.find(|o| matches!(o, Op::GateCumsum { .. }))[0];
    let threshold = g.find(|o| matches!(o, Op::Threshold { .. }))[0];
    assert_eq!((a.kernels[0].node, &a.kernels[0].also[..]), (threshold, &[c][..]));
    assert_eq!((&a.kernels[0].deps[..], &a.kernels[1].deps[..]), (&[][..], &[0][..]));
    let buffer = |k: usize, arg: usize| match &a.kernels[k].args[arg] {
        KernelArg::Buffer(b) => *b,
        other => panic!("{other:?}"),
    };
    // Arguments 7 and 8: the gate and c, which the attention reads as its argument 3.
    assert!(matches!(a.buffers[buffer(0, 7)].kind, BufferKind::Param { ref name, .. } if name == "fgate"));
    assert_eq!(a.buffers[buffer(0, 8)].kind, BufferKind::Value(c.into()));
    assert_eq!(buffer(1, 3), buffer(0, 8));
    assert_eq!(buffer(1, 4), buffer(0, 3));
    // One scan block ahead of the ceil(1000 / 128) = 8 tiles of each of the 6 heads.
    let bind =
        |s: &str| [("B", 2), ("H", 3), ("T", 1000), ("D", 128)].into_iter().find(|p| p.0 == s).map(|p| p.1);
    let geo = a.kernels[0].geometry(&bind).unwrap();
    assert_eq!((geo.grid, geo.block.0), ((9, 6, 1), foxc_codegen::nvptx::threshold::NORM_THREADS));
    // Both bodies are in the kernel: the scan's stage and the threshold's arrival.
    let body = a.ptx.split(&format!(".entry {}", names[0])).nth(1).unwrap().split(".entry").next().unwrap();
    for want in ["_stage", "atom.global.add", "fence.acq_rel.gpu", "bar.red.or"] {
        assert!(body.contains(want), "the joint kernel lacks {want}");
    }
    // Its log gates divide without the correctly rounded division, whose slow-path branch per
    // gate kept ptxas from interleaving a thread's gates.
    assert!(body.contains("div.full.f32"), "the joint kernel's log gates lack div.full");
    assert!(!body.contains("div.rn.f32"), "the joint kernel divides with div.rn");
    // Its two scan shapes (short and long rows) share one stage, the long one's (8192 + 256
    // words): two would overrun the 48 KB of static shared memory beside the threshold's.
    let stages: Vec<&str> =
        a.ptx.lines().filter(|l| l.contains(".shared") && l.contains("_stage[")).collect();
    assert_eq!(stages.len(), 1, "{stages:?}");
    assert!(stages[0].contains(&format!("{}_stage[33792]", names[0])), "{stages:?}");
    // Rows split over blocks (`prelude = joint(split rows)`): a block per 8192-element
    // segment, 3 at T = 20000, ahead of the ceil(20000 / 128) = 157 tiles; whole rows, one.
    let at_20000 =
        |s: &str| [("B", 2), ("H", 3), ("T", 20000), ("D", 128)].into_iter().find(|p| p.0 == s).map(|p| p.1);
    assert_eq!(a.kernels[0].geometry(&at_20000).unwrap().grid, (158, 6, 1));
    let mut split = g.clone();
    let Op::Attention(sa) = &mut split.node_mut(attn).op else { unreachable!() };
    sa.prelude = Prelude::JointSplitRows;
    let s = compile(&split, &spec(NvptxTarget::Sm90a, 128)).expect("compiles");
    assert!(s.kernels[0].name.contains("threshold_with_split_scan"), "{}", s.kernels[0].name);
    assert_eq!(s.kernels[0].geometry(&at_20000).unwrap().grid, (160, 6, 1));
    assert_eq!(s.kernels[0].geometry(&bind).unwrap().grid, (9, 6, 1), "one segment at T = 1000");
    // Both joint kernels assemble on both targets (sm_80: 48 KB of static shared memory).
    if let Some(ptxas) = ptxas::find() {
        for (g, what) in [(&g, "whole rows"), (&split, "split rows")] {
            for t in [NvptxTarget::Sm90a, NvptxTarget::Sm80] {
                let m = compile(g, &spec(t, 128)).expect("compiles");
                ptxas::assemble(&ptxas, &m.ptx, t.cpu()).unwrap_or_else(|log| {
                    panic!("ptxas failed on the joint prelude ({what}, {}):\n{log}", t.cpu())
                });
            }
        }
    }
    // A threshold with row statistics is two kernels: it cannot take the scan.
    let mut g = fox_graph(foxc_passes::rules::by_name("tight").unwrap(), NormBound::Data);
    let Op::Attention(a) = &mut g.node_mut(attn).op else { unreachable!() };
    a.prelude = Prelude::Joint;
    let err = compile(&g, &spec(NvptxTarget::Sm90a, 128)).unwrap_err();
    assert!(matches!(&err, CodegenError::Internal(m) if m.contains("prelude = joint")), "{err}");
}

/// `fuse-prelude` splits the rows longer than one segment of the joint kernel's scan: the pass
/// cannot see the backend's segment, so its own constant must stay equal to it (a row of one
/// segment has nothing to split and runs ~1 us slower split).
#[test]
fn the_pass_splits_rows_of_more_than_one_scan_segment() {
    let segment = foxc_codegen::nvptx::threshold::SPLIT_SEGMENT;
    assert_eq!(foxc_passes::fuse_out::SPLIT_ROWS_ABOVE, segment as u64);
}

/// A gate scan with `split_rows` (a decode step's, outside any joint prelude) is two launches
/// of a block per 8192-element segment: the segments' sums into a `[B, H, S, 2]` scratch, then
/// the scans from them; both assemble without spills. The pass's constant is this segment.
#[test]
fn a_split_gate_scan_is_two_launches_of_a_block_per_segment() {
    assert_eq!(foxc_codegen::nvptx::kernels::SCAN_SEGMENT as u64, foxc_passes::fuse_out::SPLIT_ROWS_ABOVE);
    let mut g = fox_graph(foxc_passes::rules::by_name("paper").unwrap(), NormBound::Data);
    let scan = g.find(|op| matches!(op, Op::GateCumsum { .. }))[0];
    let Op::GateCumsum { split_rows, .. } = &mut g.node_mut(scan).op else { unreachable!() };
    *split_rows = true;
    let a = compile(&g, &spec(NvptxTarget::Sm90a, 128)).expect("compiles");
    let names: Vec<&str> = a.kernels.iter().map(|k| k.name.as_str()).collect();
    let at = |w: &str| names.iter().position(|n| n.contains(w)).unwrap_or_else(|| panic!("{w}: {names:?}"));
    let (sums, scans) = (at("gate_segment_sums"), at("gate_scan_segments"));
    assert_eq!(scans, sums + 1, "{names:?}");
    assert!(at("attn_fwd") > scans, "{names:?}");
    // 3 segments at T = 20000 for each of the 6 heads, in both launches.
    let bind =
        |s: &str| [("B", 2), ("H", 3), ("T", 20000), ("D", 128)].into_iter().find(|p| p.0 == s).map(|p| p.1);
    for k in [sums, scans] {
        let geo = a.kernels[k].geometry(&bind).unwrap();
        assert_eq!((geo.grid, geo.block.0), ((3, 6, 1), foxc_codegen::nvptx::kernels::SPLIT_SCAN_THREADS));
    }
    // The sums' scratch is read by the scans: the same buffer, [B, H, S, 2] f32.
    let buffer_arg = |k: usize, i: usize| match a.kernels[k].args[i] {
        KernelArg::Buffer(b) => b,
        ref x => panic!("argument {i} of kernel {k} is {x:?}"),
    };
    assert_eq!(buffer_arg(sums, 1), buffer_arg(scans, 1));
    assert_eq!(a.buffers[buffer_arg(sums, 1)].bytes(&bind).unwrap(), 2 * 3 * 3 * 2 * 4);
    if let Some(ptxas) = ptxas::find() {
        for t in [NvptxTarget::Sm90a, NvptxTarget::Sm80] {
            let m = compile(&g, &spec(t, 128)).expect("compiles");
            let log = ptxas::assemble(&ptxas, &m.ptx, t.cpu()).unwrap_or_else(|l| panic!("{}: {l}", t.cpu()));
            for l in log.lines().filter(|l| l.contains("spill stores")) {
                assert!(l.contains(" 0 bytes spill stores"), "{}: {l}", t.cpu());
            }
            // A block's threads share 65536 registers (`ptxas::registers`).
            let threads = foxc_codegen::nvptx::kernels::SPLIT_SCAN_THREADS;
            let scans: Vec<_> =
                ptxas::registers(&log).into_iter().filter(|(k, _)| k.contains("gate_s")).collect();
            assert_eq!(scans.len(), 2, "{}: {log}", t.cpu());
            for (kernel, regs) in scans {
                assert!(
                    regs * threads <= 65536,
                    "{}: {kernel} {regs} registers x {threads} threads",
                    t.cpu()
                );
            }
        }
    }
}

/// A cast to anything but bf16 is not fused: the attention writes f32 and the cast kernel runs.
#[test]
fn cast_to_f16_is_not_fused() {
    let g = fox_graph_out(foxc_passes::rules::by_name("paper").unwrap(), NormBound::Data, DType::F16);
    let a = compile(&g, &spec(NvptxTarget::Sm90a, 64)).expect("compiles");
    let names: Vec<&str> = a.kernels.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(names.len(), 4, "{names:?}");
    assert!(!names[2].contains("_obf16"), "{names:?}");
    assert!(names[3].contains("cast"), "{names:?}");
    let Launch::Attention { cfg, .. } = &a.kernels[2].launch else { panic!("not attention") };
    assert!(!cfg.out_half);
}

#[test]
fn static_tight_and_sm80() {
    let g = fox_graph(
        foxc_passes::rules::by_name("tight").unwrap(),
        NormBound::Static { q_max: 8.0, k_max: 8.0 },
    );
    let a = compile(&g, &spec(NvptxTarget::Sm80, 128)).expect("compiles");
    assert_eq!(a.kernels.len(), 3);
    assert!(a.ptx.contains(".target sm_80"));
}

#[test]
fn qknorm_alibi_casts_attention_inputs() {
    let a = compile(&qknorm_alibi_graph(), &spec(NvptxTarget::Sm90a, 128)).expect("compiles");
    let names: Vec<&str> = a.kernels.iter().map(|k| k.name.as_str()).collect();
    assert!(names.iter().filter(|n| n.contains("rmsnorm")).count() == 2, "{names:?}");
    // The half-operands pass's casts of the f32 normed q and k.
    assert!(names.iter().filter(|n| n.contains("_cast_")).count() == 2, "{names:?}");
    assert!(names.iter().any(|n| n.contains("_w256_")), "{names:?}");
}

#[test]
fn unsupported_op_is_named() {
    let s = Span::default();
    let mut g = Graph::new("bad");
    // Every elementwise, reduction and scan op has a generic kernel; a block boundary outside
    // the attention kernel (the fuse-boundary pass did not apply) has none.
    let c = g.add_param("c", ValueType::tensor(DType::F32, bht()), s);
    let delta = g.add_param("delta", tiles_ty(64), s);
    let starts = ValueType { dtype: DType::I32, ..tiles_ty(64) };
    let y = g.add(Op::BlockBoundary(Tiles { bm: 64, bn: 64 }), starts, &[c, delta], s);
    g.output = Some(y);
    let e = compile(&g, &spec(NvptxTarget::Sm90a, 64)).unwrap_err();
    assert!(matches!(&e, CodegenError::Unsupported { op, .. } if op.starts_with("block_boundary")), "{e}");
    assert!(e.to_string().contains("block_boundary"));
}

#[test]
fn missing_head_dim_and_bad_head_dim_are_user_errors() {
    let g = fox_graph(foxc_passes::rules::by_name("paper").unwrap(), NormBound::Data);
    let no_d = NvptxSpec::new(NvptxTarget::Sm90a, BTreeMap::new());
    let e = compile(&g, &no_d).unwrap_err();
    assert!(matches!(e, CodegenError::User(_)), "{e}");
    assert!(e.to_string().contains("D"), "{e}");
    let e = compile(&g, &spec(NvptxTarget::Sm90a, 48)).unwrap_err();
    assert!(matches!(e, CodegenError::User(_)), "{e}");
    assert!(e.to_string().contains("32, 64, 96, 128 and 256"), "{e}");
}

/// Every head dimension of the GPU kernel compiles on both targets (D = 32 was refused before);
/// D = 32 and 96 take the mma.sync path on sm_90a, the others wgmma.
#[test]
fn every_head_dim_compiles_on_both_targets() {
    let g = fox_graph(foxc_passes::rules::by_name("paper").unwrap(), NormBound::Data);
    for d in foxc_codegen::nvptx::attention::HEAD_DIMS {
        for t in [NvptxTarget::Sm90a, NvptxTarget::Sm80] {
            let a = compile(&g, &spec(t, d as u64)).unwrap_or_else(|e| panic!("D={d} {t:?}: {e}"));
            let wgmma = a.ptx.contains("wgmma.mma_async");
            assert_eq!(wgmma, t == NvptxTarget::Sm90a && d % 64 == 0, "D={d} {t:?}");
        }
    }
}

/// The attention kernel's optimized LLVM IR (D = 64, both targets): any change to the kernel
/// shows here.
#[test]
fn attention_llvm_ir_snapshot() {
    for (t, name) in
        [(NvptxTarget::Sm90a, "nvptx_attention_sm90a_d64"), (NvptxTarget::Sm80, "nvptx_attention_sm80_d64")]
    {
        let a =
            compile(&fox_graph(foxc_passes::rules::by_name("paper").unwrap(), NormBound::Data), &spec(t, 64))
                .expect("compiles");
        insta::assert_snapshot!(name, attention_ir(&a.llvm_ir));
    }
}

/// The IR of the attention kernel alone, attribute-group numbers dropped.
fn attention_ir(ir: &str) -> String {
    let mut out = String::new();
    let mut keep = false;
    for line in ir.lines() {
        if line.starts_with("define ") {
            keep = line.contains("foxc_attn_fwd");
        }
        if keep {
            let line = match (line.starts_with("define "), line.rfind(" #")) {
                (true, Some(p)) => format!("{} {{", &line[..p]),
                _ => line.to_string(),
            };
            out.push_str(&line);
            out.push('\n');
        }
        if line == "}" {
            keep = false;
        }
    }
    out
}

/// Snapshot of the LLVM IR of the small kernels (attention excluded: its IR belongs to the
/// attention kernel's own tests and is large).
#[test]
fn small_kernels_llvm_ir_snapshot() {
    let a = compile(&qknorm_alibi_graph(), &spec(NvptxTarget::Sm90a, 64)).expect("compiles");
    let small = small_kernels_ir(&a.llvm_ir);
    insta::assert_snapshot!("nvptx_small_kernels_sm90a_d64", small);
}

#[test]
fn fox_gate_and_threshold_llvm_ir_snapshot() {
    let a = compile(
        &fox_graph(foxc_passes::rules::by_name("tight").unwrap(), NormBound::Data),
        &spec(NvptxTarget::Sm90a, 64),
    )
    .expect("compiles");
    let small = small_kernels_ir(&a.llvm_ir);
    insta::assert_snapshot!("nvptx_fox_gate_threshold_sm90a_d64", small);
}

/// The paper rule's threshold: one kernel (norms, then each head's last block evaluates the
/// deltas of all its tiles).
#[test]
fn fox_gate_and_one_kernel_threshold_llvm_ir_snapshot() {
    let a = compile(
        &fox_graph(foxc_passes::rules::by_name("paper").unwrap(), NormBound::Data),
        &spec(NvptxTarget::Sm90a, 64),
    )
    .expect("compiles");
    let small = small_kernels_ir(&a.llvm_ir);
    insta::assert_snapshot!("nvptx_fox_gate_threshold_paper_sm90a_d64", small);
}

/// The IR of every kernel but attention, with attribute-group numbers dropped (they shift when
/// the attention kernel changes).
fn small_kernels_ir(ir: &str) -> String {
    let mut small = String::new();
    let mut keep = false;
    for line in ir.lines() {
        if line.starts_with("define ") {
            keep = !line.contains("foxc_attn_fwd");
        }
        if keep {
            let line = match (line.starts_with("define "), line.rfind(" #")) {
                (true, Some(p)) => format!("{} {{", &line[..p]),
                _ => line.to_string(),
            };
            small.push_str(&line);
            small.push('\n');
        }
        if line == "}" {
            keep = false;
        }
    }
    small
}

#[test]
fn every_kernel_assembles_with_ptxas() {
    let Some(ptxas) = ptxas::find() else {
        eprintln!("note: ptxas not found (set $PTXAS); skipping the PTX assembly check");
        return;
    };
    let graphs = [
        fox_graph(foxc_passes::rules::by_name("paper").unwrap(), NormBound::Data),
        fox_graph(
            foxc_passes::rules::by_name("tight").unwrap(),
            NormBound::Static { q_max: 8.0, k_max: 8.0 },
        ),
        qknorm_alibi_graph(),
    ];
    for (gi, g) in graphs.iter().enumerate() {
        for t in [NvptxTarget::Sm90a, NvptxTarget::Sm80] {
            for d in foxc_codegen::nvptx::attention::HEAD_DIMS {
                let a = compile(g, &spec(t, d as u64)).expect("compiles");
                ptxas::assemble(&ptxas, &a.ptx, t.cpu())
                    .unwrap_or_else(|log| panic!("ptxas failed on g{gi}_{}_d{d}:\n{log}", t.cpu()));
            }
        }
    }
}

/// An attention of q scaled by `rsqrt(D)` (a scale recognition cannot spell multiplies q):
/// the `fold-q-scale` pass puts the factor into the scale attribute, and the backend reads it
/// there: no kernel and no buffer for the product. Without the pass the product is the flat
/// "scale" kernel, and the attention's scale is the attribute's own.
#[test]
fn scalar_scale_of_q_is_folded() {
    let s = Span::default();
    let mut g = Graph::new("causal");
    let q = g.add_param("q", ValueType::tensor(DType::BF16, bhtd()), s);
    let k = g.add_param("k", ValueType::tensor(DType::BF16, bhtd()), s);
    let v = g.add_param("v", ValueType::tensor(DType::BF16, bhtd()), s);
    let d = g.add(Op::DimSize(Dim::sym("D")), ValueType::scalar(DType::F32), &[], s);
    let r = g.add(Op::Unary(foxc_ir::UnaryOp::Rsqrt), ValueType::scalar(DType::F32), &[d], s);
    let qs = g.add(Op::Binary(foxc_ir::BinaryOp::Mul), ValueType::tensor(DType::F32, bhtd()), &[q, r], s);
    let mut a = Attention::new(Scale::constant(1.0), Mask::Causal, false);
    a.tiles = Some(Tiles { bm: 64, bn: 64 });
    let o = attention(&mut g, a, &[qs, k, v]);
    g.output = Some(o);
    // Unfolded, the f32 product is cast to bf16 for the kernel (the half-operands pass).
    let product = compile(&with_half_operands(g.clone()), &spec(NvptxTarget::Sm90a, 64)).expect("compiles");
    let names: Vec<&str> = product.kernels.iter().map(|k| k.name.as_str()).collect();
    assert!(names.len() == 3 && names[0].contains("_scale_") && names[1].contains("_cast_"), "{names:?}");
    let Launch::Attention { cfg, .. } = &product.kernels[2].launch else { panic!("not attention") };
    assert_eq!(cfg.scale, 1.0);
    let opts = foxc_passes::PassOptions { target: foxc_passes::Target::Sm90a, ..Default::default() };
    assert!(foxc_passes::run_pass("fold-q-scale", &mut g, &opts, &mut Default::default()).unwrap());
    let a = compile(&g, &spec(NvptxTarget::Sm90a, 64)).expect("compiles");
    assert_eq!(a.kernels.len(), 1, "{:?}", a.kernels.iter().map(|k| &k.name).collect::<Vec<_>>());
    let Launch::Attention { cfg, .. } = &a.kernels[0].launch else { panic!("not attention") };
    assert_eq!(cfg.scale, 0.125);
    assert_eq!(a.kernels[0].args[0], KernelArg::Buffer(0), "attention reads q itself");
}
