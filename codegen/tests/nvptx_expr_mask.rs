//! Masks other than causal on the GPU forward. An expression mask (`Mask::Expr`) and no mask
//! (`Mask::None`) compile to the standard attention kernel in its non-causal form (`_bidir`:
//! every key tile up to `T` is visited, none is skipped) with the mask's condition compiled per
//! score element by the score hook, its captured tensors kernel arguments like the score
//! region's. The programs: the context-parallel partial of `python/foxc/distributed.py`
//! (`PARTIAL_SOURCE`: mask `j >= lo[b, h, i]`, the score region selecting `j <= hi[b, h, i]`),
//! `codegen/tests/programs/time_window.attn` (`abs(ts[b, i] - ts[b, j]) <= 0.5`),
//! `examples/local_bidir.attn` (`abs(i - j) < 64`) and `examples/refuse_noncausal.attn`
//! (no mask). The PTX assembles for sm_90a and sm_80.

use foxc_codegen::nvptx::ptxas;
use foxc_codegen::nvptx::{compile, BufferKind, KernelArg, NvptxArtifact, NvptxSpec, NvptxTarget};
use foxc_ir::{Graph, Mask, Op};
use foxc_passes::{optimize, PassOptions, Target};

fn root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Program `NAME = """..."""` of python/foxc/distributed.py (one definition).
fn py_source(name: &str) -> String {
    let py = std::fs::read_to_string(root().join("python/foxc/distributed.py")).unwrap();
    let open = format!("{name} = \"\"\"");
    let start = py.find(&open).unwrap_or_else(|| panic!("{name} in distributed.py")) + open.len();
    let len = py[start..].find("\"\"\"").expect("the end of the source");
    py[start..start + len].to_string()
}

/// The cross-chunk partial of context parallelism.
fn partial_source() -> String {
    py_source("PARTIAL_SOURCE")
}

/// `examples/NAME.attn`, or the test program `codegen/tests/programs/NAME.attn`.
fn example(name: &str) -> String {
    let ex = root().join(format!("examples/{name}.attn"));
    let path = if ex.exists() { ex } else { root().join(format!("codegen/tests/programs/{name}.attn")) };
    std::fs::read_to_string(path).unwrap()
}

/// `src` through the passes for `target` (the partial runs dense, as distributed.py loads it).
fn graph(name: &str, src: &str, target: Target) -> Graph {
    let mut g = foxc_ir::frontend::compile(name, src.as_bytes()).unwrap_or_else(|e| panic!("{e:?}")).graph;
    optimize(&mut g, &PassOptions { target, prune: false, ..PassOptions::default() }).unwrap();
    g
}

fn spec(t: NvptxTarget, d: u64) -> NvptxSpec {
    NvptxSpec::new(t, [("D".to_string(), d)].into_iter().collect())
}

fn attn_kernel(a: &NvptxArtifact) -> &foxc_codegen::nvptx::KernelInfo {
    a.kernels.iter().find(|k| k.name.starts_with("foxc_attn_fwd")).expect("an attention kernel")
}

fn param_buffer(a: &NvptxArtifact, want: &str) -> usize {
    a.buffers
        .iter()
        .position(|b| matches!(&b.kind, BufferKind::Param { name, .. } if name == want))
        .unwrap_or_else(|| panic!("a buffer for {want}"))
}

fn mask_of(g: &Graph) -> Mask {
    let a = g.find(|op| matches!(op, Op::Attention(_)));
    let Op::Attention(a) = g.op(a[0]) else { unreachable!() };
    a.mask.clone()
}

/// The partial's mask reads `lo`, its score region `hi`, `cq` and `ck`: all four are kernel
/// arguments after the kernel's own eight (with the head count, H not being static), the
/// kernel is the non-causal standard one (not warp-specialized, even at D = 128 on sm_90a)
/// and it reads `lo` (the load through its capture pointer survives optimization).
#[test]
fn the_cp_partial_reads_its_mask_capture_in_the_kernel() {
    let g = graph("partial.attn", &partial_source(), Target::Sm90a);
    assert!(matches!(mask_of(&g), Mask::Expr(_)), "{:?}", mask_of(&g));
    for d in [64, 128] {
        let a = compile(&g, &spec(NvptxTarget::Sm90a, d)).expect("compiles");
        let k = attn_kernel(&a);
        assert!(k.name.contains("_bidir") && !k.name.contains("_ws"), "{}", k.name);
        let bufs: Vec<usize> = k.args[8..]
            .iter()
            .filter_map(|x| if let KernelArg::Buffer(b) = x { Some(*b) } else { None })
            .collect();
        for p in ["lo", "hi", "cq", "ck"] {
            assert!(bufs.contains(&param_buffer(&a, p)), "{p} is not a kernel argument: {:?}", k.args);
        }
        // Capture 3 is `lo` (operands in the order of first use: hi, cq, ck, lo).
        assert_eq!(k.args[8 + 1 + 3 * 4], KernelArg::Buffer(param_buffer(&a, "lo")));
        assert!(
            a.llvm_ir.contains("getelementptr float, ptr addrspace(1) %capture3"),
            "the mask's capture is not read"
        );
    }
}

/// `g` (its attention bounded by the tiles pass) compiled for sm_90a at D = 128, and the same
/// graph with the attention's `keys_from` taken away.
fn with_and_without_key_bound(g: &Graph) -> (NvptxArtifact, NvptxArtifact) {
    let mut unbounded = g.clone();
    let n = unbounded.find(|op| matches!(op, Op::Attention(_)))[0];
    let Op::Attention(a) = &mut unbounded.node_mut(n).op else { unreachable!() };
    assert!(a.keys_from.take().is_some(), "the tiles pass set no keys_from");
    let with = compile(g, &spec(NvptxTarget::Sm90a, 128)).expect("compiles");
    let without = compile(&unbounded, &spec(NvptxTarget::Sm90a, 128)).expect("compiles");
    (with, without)
}

/// The partial's mask `j >= lo[b, h, i]` carries the key bound `keys_from = lo[b, h, i]` (the
/// tiles pass): its kernel computes the block's first key tile from `min lo` over the rows
/// (one `fptosi` of the minimum after a warp butterfly), a kernel of its own; without the
/// attribute the same program computes no start (every tile visited).
#[test]
fn the_partial_skips_tiles_below_its_key_bound() {
    let g = graph("partial.attn", &partial_source(), Target::Sm90a);
    let (with, without) = with_and_without_key_bound(&g);
    assert_ne!(attn_kernel(&with).name, attn_kernel(&without).name);
    assert_eq!(with.llvm_ir.matches("fptosi float").count(), 1, "{}", with.llvm_ir);
    assert_eq!(without.llvm_ir.matches("fptosi float").count(), 0);
}

/// The own-chunk partial (`DIAG_SOURCE`: causal, `select(j >= lo, s, -inf)` in the score)
/// carries the bound from its score region: at D = 128 on sm_90a it takes the warp-specialized
/// causal kernel, whose producer and consumers raise each consumer's start to the bound (each
/// role converts its rows' minimum: more `fptosi` than the same kernel without the attribute).
#[test]
fn the_own_chunk_partial_skips_below_its_score_bound() {
    let g = graph("diag.attn", &py_source("DIAG_SOURCE"), Target::Sm90a);
    assert_eq!(mask_of(&g), Mask::Causal);
    let (with, without) = with_and_without_key_bound(&g);
    let k = attn_kernel(&with);
    assert!(k.name.contains("_ws") && !k.name.contains("_bidir"), "{}", k.name);
    let count = |c: &NvptxArtifact| c.llvm_ir.matches("fptosi float").count();
    assert!(count(&with) > count(&without), "{} vs {}", count(&with), count(&without));
}

/// The non-causal kernels differ from the causal ones only where they must: a causal program
/// keeps the causal kernel; expression masks and no mask get the non-causal one.
#[test]
fn only_non_causal_masks_get_the_non_causal_kernel() {
    let cases = [
        ("fox", false),
        ("causal", false),
        ("window", false),
        ("local_bidir", true),
        ("time_window", true),
        ("refuse_noncausal", true),
    ];
    for (name, bidir) in cases {
        let g = graph(name, &example(name), Target::Sm90a);
        let a = compile(&g, &spec(NvptxTarget::Sm90a, 64)).expect("compiles");
        assert_eq!(attn_kernel(&a).name.contains("_bidir"), bidir, "{name}: {}", attn_kernel(&a).name);
    }
    let g = graph("time_window", &example("time_window"), Target::Sm90a);
    assert!(matches!(mask_of(&g), Mask::Expr(_)));
    let a = compile(&g, &spec(NvptxTarget::Sm90a, 64)).expect("compiles");
    // ts's buffer and its two axis sizes follow the head count.
    let k = attn_kernel(&a);
    assert_eq!(k.args[9], KernelArg::Buffer(param_buffer(&a, "ts")), "{:?}", k.args);
}

/// Every program above assembles for both targets at D = 64 and 128, without spills on sm_90a.
#[test]
fn expression_masks_assemble_with_ptxas() {
    let Some(ptxas) = ptxas::find() else {
        eprintln!("note: ptxas not found (set $PTXAS); skipping the PTX assembly check");
        return;
    };
    let programs = [
        ("partial", partial_source()),
        ("diag", py_source("DIAG_SOURCE")),
        ("local_bidir", example("local_bidir")),
        ("time_window", example("time_window")),
        ("refuse_noncausal", example("refuse_noncausal")),
    ];
    for (t, pt) in [(NvptxTarget::Sm90a, Target::Sm90a), (NvptxTarget::Sm80, Target::Sm80)] {
        for (name, src) in &programs {
            let g = graph(name, src, pt);
            for d in [64, 128] {
                let a = compile(&g, &spec(t, d)).expect("compiles");
                let log = ptxas::assemble(&ptxas, &a.ptx, t.cpu())
                    .unwrap_or_else(|log| panic!("ptxas failed on {name} {} D={d}:\n{log}", t.cpu()));
                // No spills on the sm_90a (wgmma) path; mma.sync at D = 128 holds O in
                // registers and spills a few bytes (4 measured for the partial).
                let limit = if t == NvptxTarget::Sm90a { 0 } else { 64 };
                assert!(ptxas::spill_stores(&log) <= limit, "{name} {} D={d} spills:\n{log}", t.cpu());
            }
        }
    }
}

/// A score region that reads the key index (left padding's `select(j >= start[b], x, -inf)`,
/// pruned) on sm_90a's warp-specialized kernel at D = 128 assembles without spills: a
/// fragment's columns share one f32 conversion (shown failing when each column was converted
/// on its own: 68 bytes of spill stores).
#[test]
fn a_key_index_region_does_not_spill_the_warp_specialized_kernel() {
    let Some(ptxas) = ptxas::find() else {
        eprintln!("note: ptxas not found (set $PTXAS); skipping the PTX assembly check");
        return;
    };
    let mut g = foxc_ir::frontend::compile("fox_leftpad", example("fox_leftpad").as_bytes())
        .unwrap_or_else(|e| panic!("{e:?}"))
        .graph;
    // D bound in the passes too: 64 x 128 tiles, as `foxc run` picks at D = 128.
    let dims = [("D".to_string(), 128)].into_iter().collect();
    optimize(&mut g, &PassOptions { target: Target::Sm90a, dims, ..PassOptions::default() }).unwrap();
    let a = compile(&g, &spec(NvptxTarget::Sm90a, 128)).expect("compiles");
    let k = attn_kernel(&a);
    assert!(k.name.contains("_ws") && k.name.contains("_prune") && k.name.contains("_bn128"), "{}", k.name);
    let log = ptxas::assemble(&ptxas, &a.ptx, "sm_90a").unwrap_or_else(|log| panic!("ptxas failed:\n{log}"));
    assert_eq!(ptxas::spill_stores(&log), 0, "{log}");
}
