//! The warp-specialized forward through the NVPTX backend: an attention whose `kernel`
//! attribute says warp-specialized runs the `_ws` kernel at D = 128 (384 threads, one block per
//! 128 query rows, its layout's shared memory) and the standard kernel at D = 64, as the
//! attribute's rule says (`AttnKernel::runs_warp_specialized`).

use foxc_codegen::nvptx::attention::AttnKernelConfig;
use foxc_codegen::nvptx::attention_ws;
use foxc_codegen::nvptx::{compile, Launch, NvptxSpec, NvptxTarget};
use foxc_ir::attention::{Attention, AttnKernel, KvLoads, Mask, Prune, Scale, WsGrid, WsTurns};
use foxc_ir::*;

fn s(x: &str) -> Dim {
    Dim::sym(x)
}

/// Pruned FoX (fused boundary) with the tiles and kernel the tiles pass picks on sm_90a.
fn fox(kernel: AttnKernel) -> Graph {
    let sp = Span::default();
    let mut g = Graph::new("g");
    let bhtd = || ValueType::tensor(DType::BF16, [s("B"), s("H"), s("T"), s("D")]);
    let q = g.add_param("q", bhtd(), sp);
    let k = g.add_param("k", bhtd(), sp);
    let v = g.add_param("v", bhtd(), sp);
    let f = g.add_param("fgate", ValueType::tensor(DType::F32, [s("B"), s("H"), s("T")]), sp);
    let bht = ValueType::tensor(DType::F32, [s("B"), s("H"), s("T")]);
    let c = g.add(Op::GateCumsum { kind: GateKind::Logits, split_rows: false }, bht, &[f], sp);
    let scale = Scale::inv_sqrt(1.0, s("D"));
    let rule = foxc_passes::rules::by_name("paper").unwrap();
    let plan = foxc_passes::fuse_out::threshold_plan(&rule, &ScoreBound::IDENTITY, NormBound::Data);
    let th = Op::Threshold {
        rule,
        log_eps: -10.0,
        bound: NormBound::Data,
        score: ScoreBound::IDENTITY,
        scale: scale.clone(),
        bm: 64,
        plan,
    };
    let mt = ValueType::tensor(DType::F32, [s("B"), s("H"), Dim::Tiles(Box::new(s("T")), 64)]);
    let delta = g.add(th, mt, &[q, k], sp);
    let mut a = Attention::new(scale, Mask::Causal, true);
    a.tiles = Some(foxc_passes::tiles_for(foxc_passes::Target::Sm90a, Some(128), false));
    a.prune = Prune::Boundary;
    a.kernel = kernel;
    let ops = [q, k, v, c, delta];
    g.output = Some(g.add_attention(a, &ops, sp).unwrap());
    foxc_ir::verify::verify(&g).unwrap();
    g
}

fn dims(d: u64) -> std::collections::BTreeMap<String, u64> {
    [("B", 2), ("H", 3), ("T", 1000), ("D", d)].iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

/// The attention launch of the compiled program: its kernel name and configuration.
fn attention_launch(
    g: &Graph,
    d: u64,
) -> (String, AttnKernelConfig, foxc_codegen::nvptx::attention::LaunchGeometry) {
    let bind = dims(d);
    let a = compile(g, &NvptxSpec::new(NvptxTarget::Sm90a, bind.clone())).expect("compiles");
    let k = a.kernels.iter().find(|k| k.name.starts_with("foxc_attn_fwd")).expect("an attention kernel");
    let Launch::Attention { cfg, .. } = &k.launch else { panic!("not an attention launch") };
    let geo = k.geometry(&|s| bind.get(s).copied()).unwrap();
    (k.name.clone(), cfg.clone(), geo)
}

#[test]
fn warp_specialized_at_d128_standard_at_d64() {
    let g = fox(AttnKernel::WarpSpecialized {
        head_dims: vec![128],
        loads: KvLoads::CpAsync,
        grid: WsGrid::Tiles,
        turns: WsTurns::Ring,
    });
    let (name, cfg, geo) = attention_launch(&g, 128);
    assert!(name.starts_with("foxc_attn_fwd_ws_d128_bm64_bn128_"), "{name}");
    assert!(cfg.ws);
    // ceil(1000 / 128) query tiles per head, B H = 6 heads, 3 warpgroups.
    assert_eq!(geo.grid, (8, 6, 1));
    assert_eq!(geo.block, (attention_ws::THREADS, 1, 1));
    assert_eq!(geo.shared_bytes, attention_ws::layout(&cfg).unwrap().total);
    // D = 64: the rule keeps the standard kernel (measured faster there).
    let (name, cfg, geo) = attention_launch(&g, 64);
    assert!(name.starts_with("foxc_attn_fwd_d64_"), "{name}");
    assert!(!cfg.ws);
    assert_eq!(geo.block, (128, 1, 1));
}

#[test]
fn the_standard_attribute_keeps_the_standard_kernel() {
    let (name, cfg, _) = attention_launch(&fox(AttnKernel::Standard), 128);
    assert!(name.starts_with("foxc_attn_fwd_d128_"), "{name}");
    assert!(!cfg.ws);
}

/// `grid = persistent`: the `_persist` kernel, launched one block per SM of the spec's device
/// (never more than the work items; one per item without a device count), with the head count
/// and a work counter the runtime zeroes before the launch as its last two arguments.
#[test]
fn persistent_grid_takes_bh_and_a_zeroed_counter() {
    use foxc_codegen::nvptx::KernelArg;
    let g = fox(AttnKernel::WarpSpecialized {
        head_dims: vec![128],
        loads: KvLoads::Tma,
        grid: WsGrid::Persistent,
        turns: WsTurns::Ring,
    });
    let bind = dims(128);
    for (sms, blocks) in [(Some(132), 48), (Some(20), 20), (None, 48)] {
        let spec = NvptxSpec { sms, ..NvptxSpec::new(NvptxTarget::Sm90a, bind.clone()) };
        let a = compile(&g, &spec).expect("compiles");
        let k = a.kernels.iter().find(|k| k.name.starts_with("foxc_attn_fwd")).unwrap();
        assert!(k.name.starts_with("foxc_attn_fwd_ws_tma_persist_d128_"), "{}", k.name);
        let Launch::Attention { cfg, .. } = &k.launch else { panic!("not an attention launch") };
        assert!(cfg.persistent);
        // 8 query tiles x 6 heads = 48 items.
        let geo = k.geometry(&|s| bind.get(s).copied()).unwrap();
        assert_eq!(geo.grid, (blocks, 1, 1), "sms {sms:?}");
        assert_eq!(geo.block, (attention_ws::THREADS, 1, 1));
        let n = k.args.len();
        assert_eq!(k.args[n - 2], KernelArg::I32(vec![Dim::sym("B"), Dim::sym("H")]));
        let KernelArg::Buffer(counter) = k.args[n - 1] else { panic!("no counter: {:?}", k.args[n - 1]) };
        assert_eq!(k.zero_first, vec![counter]);
        assert_eq!(a.buffers[counter].dtype, DType::I32);
    }
    // The tiles grid has neither.
    let g = fox(AttnKernel::WarpSpecialized {
        head_dims: vec![128],
        loads: KvLoads::Tma,
        grid: WsGrid::Tiles,
        turns: WsTurns::Ring,
    });
    let a = compile(&g, &NvptxSpec::new(NvptxTarget::Sm90a, bind)).unwrap();
    let k = a.kernels.iter().find(|k| k.name.starts_with("foxc_attn_fwd")).unwrap();
    assert!(k.zero_first.is_empty() && !k.name.contains("persist"), "{}", k.name);
}

/// `turns = none`: the free-running kernel (`_free_`, `cfg.free_running`), at D = 64 (three
/// consumers) and 128, with the launch geometry of the ring's kernel; `ring` has neither.
#[test]
fn turns_none_reaches_the_kernel_config() {
    for d in [64, 128] {
        let attr = |turns| AttnKernel::WarpSpecialized {
            head_dims: vec![64, 128],
            loads: KvLoads::Tma,
            grid: WsGrid::Tiles,
            turns,
        };
        let (name, cfg, geo) = attention_launch(&fox(attr(WsTurns::None)), d);
        assert!(name.starts_with(&format!("foxc_attn_fwd_ws_tma_free_d{d}_")), "{name}");
        assert!(cfg.ws && cfg.free_running);
        let (ring_name, ring_cfg, ring_geo) = attention_launch(&fox(attr(WsTurns::Ring)), d);
        assert!(!ring_name.contains("_free") && !ring_cfg.free_running, "{ring_name}");
        assert_eq!(geo, ring_geo);
    }
}
