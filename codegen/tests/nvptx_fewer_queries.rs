//! Queries fewer than keys on the GPU forward (`bench/fox_prefill.attn`: N queries at the end of
//! M keys): the attention kernels' `_fq` variants (the warp-specialized one on sm_90a where a
//! square attention would take it, the standard one otherwise), which take the keys' length `Tk`
//! (the queries' `T` stays the fixed one), and the threshold's norms (over the keys'
//! tiles, a last parameter `Tq`) and delta (`T` the queries', `lnT` the keys', a last parameter
//! `Tk`) kernels. Square programs keep their kernels (no `_fq`, no extra parameter). The PTX
//! assembles for sm_90a and sm_80 without spills on sm_90a. The kernels' numbers are checked on
//! the H200 (`foxc run --backend cuda --check`, BENCHMARKS.md).

use foxc_codegen::nvptx::attention::split_merge::MERGE_THREADS;
use foxc_codegen::nvptx::ptxas;
use foxc_codegen::nvptx::{compile, KernelArg, NvptxArtifact, NvptxSpec, NvptxTarget};
use foxc_ir::{Dim, Graph, Op};
use foxc_passes::{optimize, PassOptions, Target};

fn root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn graph(path: &str, target: Target, gradient: bool) -> Graph {
    let src = std::fs::read(root().join(path)).unwrap();
    let mut g = foxc_ir::frontend::compile(path, &src).unwrap_or_else(|e| panic!("{e:?}")).graph;
    optimize(&mut g, &PassOptions { target, gradient, ..PassOptions::default() }).unwrap();
    g
}

fn artifact(g: &Graph, t: NvptxTarget, d: u64) -> NvptxArtifact {
    compile(g, &NvptxSpec::new(t, [("D".to_string(), d)].into_iter().collect())).expect("compiles")
}

fn kernel<'a>(a: &'a NvptxArtifact, prefix: &str) -> &'a foxc_codegen::nvptx::KernelInfo {
    a.kernels.iter().find(|k| k.name.contains(prefix)).unwrap_or_else(|| panic!("a {prefix} kernel"))
}

/// The forward fuses on the GPU targets (pruned, the in-kernel boundary; on sm_90a the
/// warp-specialized kernel at D = 128, as a square attention, and the standard one on sm_80),
/// and so does a gradient program's (its backward has `_fq` kernels).
#[test]
fn prefill_fuses_for_the_gpu_forward_and_backward() {
    for t in [Target::Sm90a, Target::Sm80] {
        let g = graph("bench/fox_prefill.attn", t, false);
        let a: Vec<_> = g.find(|op| matches!(op, Op::Attention(_)));
        assert_eq!(a.len(), 1, "{t:?}");
        let Op::Attention(at) = g.op(a[0]) else { unreachable!() };
        assert_eq!(at.prune, foxc_ir::Prune::Boundary, "{t:?}");
        let ws = at.kernel.runs_warp_specialized(128);
        assert_eq!(ws, t == Target::Sm90a, "{t:?}: {:?}", at.kernel);
        assert!(!at.kernel.runs_warp_specialized(64), "{t:?}: {:?}", at.kernel);
        let g = graph("bench/fox_prefill.attn", t, true);
        assert_eq!(g.find(|op| matches!(op, Op::Attention(_))).len(), 1, "{t:?}: a gradient program");
    }
}

/// The kernels and their last arguments: `Tk` = M for the attention (the warp-specialized one at
/// D = 128, after its tensor maps over M key rows; the standard one at D = 64) and the delta,
/// `Tq` = N for the norms (launched over the keys' tiles); the square example has none of them.
#[test]
fn kernels_take_the_other_length_last() {
    let (n, m) = (Dim::sym("N"), Dim::sym("M"));
    let g = graph("bench/fox_prefill.attn", Target::Sm90a, false);
    let std_fwd = artifact(&g, NvptxTarget::Sm90a, 64);
    let fwd = kernel(&std_fwd, "foxc_attn_fwd");
    assert!(fwd.name.contains("_fq_") && !fwd.name.contains("_ws"), "{}", fwd.name);
    assert_eq!(fwd.args.last(), Some(&KernelArg::I32(vec![m.clone()])), "{:?}", fwd.args);
    let a = artifact(&g, NvptxTarget::Sm90a, 128);
    let fwd = kernel(&a, "foxc_attn_fwd");
    assert!(fwd.name.contains("_ws_tma_") && fwd.name.contains("_fq_"), "{}", fwd.name);
    assert_eq!(fwd.args.last(), Some(&KernelArg::I32(vec![m.clone()])), "{:?}", fwd.args);
    for map in &fwd.args[8..10] {
        let KernelArg::TensorMap(map) = map else { panic!("a tensor map: {:?}", fwd.args) };
        assert_eq!(map.dims[1], vec![m.clone()], "{map:?}");
    }
    let norms = kernel(&a, "threshold_norms");
    assert_eq!(norms.args.last(), Some(&KernelArg::I32(vec![n.clone()])), "{:?}", norms.args);
    assert_eq!(norms.args[3], KernelArg::I32(vec![m.clone()]), "{:?}", norms.args);
    let delta = kernel(&a, "threshold_delta");
    assert_eq!(delta.args[4], KernelArg::I32(vec![n]), "{:?}", delta.args);
    assert_eq!(delta.args[5], KernelArg::LnF32(vec![m.clone()]), "{:?}", delta.args);
    assert_eq!(delta.args.last(), Some(&KernelArg::I32(vec![m])), "{:?}", delta.args);
    let sq = artifact(&graph("examples/fox.attn", Target::Sm90a, false), NvptxTarget::Sm90a, 64);
    assert!(sq.kernels.iter().all(|k| !k.name.contains("_fq_")));
    assert_eq!(kernel(&sq, "foxc_attn_fwd").args.len(), 8);
}

#[test]
fn prefill_kernels_assemble_with_ptxas() {
    let Some(ptxas) = ptxas::find() else {
        eprintln!("note: ptxas not found (set $PTXAS); skipping the PTX assembly check");
        return;
    };
    for (t, pt) in [(NvptxTarget::Sm90a, Target::Sm90a), (NvptxTarget::Sm80, Target::Sm80)] {
        let g = graph("bench/fox_prefill.attn", pt, false);
        for d in [32, 64, 128] {
            let a = artifact(&g, t, d);
            let log = ptxas::assemble(&ptxas, &a.ptx, t.cpu())
                .unwrap_or_else(|log| panic!("ptxas failed on {} D={d}:\n{log}", t.cpu()));
            let limit = if t == NvptxTarget::Sm90a { 0 } else { 64 };
            assert!(ptxas::spill_stores(&log) <= limit, "{} D={d} spills:\n{log}", t.cpu());
        }
    }
}

/// A GPU graph with the query count bound at most one block (a decode step) splits its keys:
/// the attention kernel's `_sk32` variant (32 key tiles of 64), launched over `(1, BH, ceil(M / 2048))`, writes f32
/// partials that a merge launch (over the rows, `Tk` last) combines into the bf16 output. More
/// queries (the kernel a square attention would take), or the CPU, keep one launch. The PTX
/// assembles without spills on sm_90a.
#[test]
fn a_decode_step_splits_its_keys() {
    let bound = |n: u64, t: Target| {
        let src = std::fs::read(root().join("bench/fox_prefill.attn")).unwrap();
        let mut g = foxc_ir::frontend::compile("p", &src).unwrap().graph;
        let dims = [("N".to_string(), n)].into_iter().collect();
        optimize(&mut g, &PassOptions { target: t, dims, ..PassOptions::default() }).unwrap();
        g
    };
    let kernel_of = |g: &Graph| {
        let a = g.find(|op| matches!(op, Op::Attention(_)));
        let Op::Attention(at) = g.op(a[0]) else { unreachable!() };
        at.kernel.clone()
    };
    use foxc_ir::attention::AttnKernel;
    // A decode step's tiles, 64x64: 2048 keys a block are 32 key tiles.
    assert_eq!(kernel_of(&bound(1, Target::Sm90a)), AttnKernel::SplitKeys { tiles: 32 });
    assert_eq!(kernel_of(&bound(64, Target::Sm80)), AttnKernel::SplitKeys { tiles: 32 });
    assert!(kernel_of(&bound(65, Target::Sm90a)).runs_warp_specialized(128));
    assert_eq!(kernel_of(&bound(65, Target::Sm80)), AttnKernel::Standard);
    assert_eq!(kernel_of(&bound(1, Target::Cpu)), AttnKernel::Standard);
    let g = bound(1, Target::Sm90a);
    assert!(foxc_ir::print::print_graph(&g).contains("kernel = split_keys(tiles = 32)"));
    let a = artifact(&g, NvptxTarget::Sm90a, 128);
    let fwd = kernel(&a, "foxc_attn_fwd");
    assert!(fwd.name.contains("_sk32_") && !fwd.name.contains("_obf16"), "{}", fwd.name);
    let bind = |s: &str| {
        [("B", 2), ("H", 16), ("N", 1), ("M", 131072 + 5), ("D", 128)].iter().find(|p| p.0 == s).map(|p| p.1)
    };
    let foxc_codegen::nvptx::Launch::Attention { cfg, .. } = &fwd.launch else { panic!("not attention") };
    let bn = cfg.bn as usize;
    assert_eq!(fwd.geometry(&bind).unwrap().grid, (1, 32, (131072 / (32 * bn) + 1) as u32), "bn = {bn}");
    let merge = kernel(&a, "split_merge");
    assert_eq!(merge.args.last(), Some(&KernelArg::I32(vec![Dim::sym("M")])), "{:?}", merge.args);
    let merge_geo = merge.geometry(&bind).unwrap();
    assert_eq!((merge_geo.grid, merge_geo.block.0), ((32, 1, 1), MERGE_THREADS), "32 rows, one a block");
    let names: Vec<&str> = a.kernels.iter().map(|k| k.name.as_str()).collect();
    let at = |p: &str| names.iter().position(|n| n.contains(p)).unwrap();
    assert!(at("foxc_attn_fwd") < at("split_merge"), "{names:?}");
    let Some(ptxas) = ptxas::find() else {
        eprintln!("note: ptxas not found (set $PTXAS); skipping the PTX assembly check");
        return;
    };
    for d in [64, 128, 256] {
        let a = artifact(&g, NvptxTarget::Sm90a, d);
        let log = ptxas::assemble(&ptxas, &a.ptx, "sm_90a")
            .unwrap_or_else(|log| panic!("ptxas failed D={d}:\n{log}"));
        assert_eq!(ptxas::spill_stores(&log), 0, "D={d} spills:\n{log}");
        let (_, regs) = ptxas::registers(&log).into_iter().find(|(k, _)| k.contains("split_merge")).unwrap();
        assert!(
            regs * MERGE_THREADS <= 65536,
            "D={d}: the merge's {regs} registers x {MERGE_THREADS} threads"
        );
    }
}

/// `--split-key-tiles` (`PassOptions::split_key_tiles`) sets the key tiles a split-keys block
/// walks: the kernel's name, its grid's slices and the merge's keys a partial follow it.
#[test]
fn split_key_tiles_option_sets_the_slices() {
    let src = std::fs::read(root().join("bench/fox_prefill.attn")).unwrap();
    let mut g = foxc_ir::frontend::compile("p", &src).unwrap().graph;
    let dims = [("N".to_string(), 1)].into_iter().collect();
    optimize(
        &mut g,
        &PassOptions { target: Target::Sm90a, dims, split_key_tiles: Some(4), ..PassOptions::default() },
    )
    .unwrap();
    assert!(foxc_ir::print::print_graph(&g).contains("kernel = split_keys(tiles = 4)"));
    let a = artifact(&g, NvptxTarget::Sm90a, 128);
    let fwd = kernel(&a, "foxc_attn_fwd");
    assert!(fwd.name.contains("_sk4_"), "{}", fwd.name);
    let foxc_codegen::nvptx::Launch::Attention { cfg, .. } = &fwd.launch else { panic!("not attention") };
    let keys = 4 * cfg.bn as u64;
    let m = 20000;
    let bind =
        |s: &str| [("B", 1), ("H", 2), ("N", 1), ("M", m), ("D", 128)].iter().find(|p| p.0 == s).map(|p| p.1);
    assert_eq!(fwd.geometry(&bind).unwrap().grid.2 as u64, m.div_ceil(keys));
    assert!(kernel(&a, "split_merge").name.contains(&format!("split_merge_k{keys}")));
}
