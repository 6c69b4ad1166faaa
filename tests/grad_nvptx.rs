//! The gradient program of every example compiles for the GPU (sm_90a and sm_80, D = 64 and
//! 128) and its PTX assembles with ptxas (when found): the forward, the attention backward
//! kernels and the ordinary ops of the gradient. Examples the GPU backend cannot run yet are
//! named with the reason the compiler gives (no silent skips).

use foxc_codegen::nvptx::{ptxas, BufferKind, GridDim, KernelArg, Launch, NvptxArtifact};
use foxc_driver::grad::grad_program;
use foxc_driver::{cuda_backend, pipeline};
use foxc_driver::{PruneOptions, Target};
use foxc_ir::{Dim, Graph};
use std::collections::BTreeMap;
use std::path::Path;

/// The gradient program of `example` and its GPU artifact for `target` with `D = d`, or the
/// compiler's error.
fn grad_artifact(example: &str, target: Target, d: u64) -> Result<(Graph, NvptxArtifact), String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples").join(format!("{example}.attn"));
    grad_artifact_at(&path, target, d)
}

/// [`grad_artifact`] of the program at `path`.
fn grad_artifact_at(path: &Path, target: Target, d: u64) -> Result<(Graph, NvptxArtifact), String> {
    let example = path.display();
    let src = pipeline::Source::read(path).map_err(|e| e.to_string())?;
    let c = src.compile().map_err(|e| e.to_string())?;
    let prune = PruneOptions::default();
    let (opt, _) = pipeline::optimize(&c.graph, &pipeline::pass_options(&prune, target, false).unwrap())
        .map_err(|e| e.to_string())?;
    let p = grad_program(&opt, target).map_err(|e| e.to_string())?;
    let outs: Vec<_> = p.outputs.iter().map(|(_, v)| *v).collect();
    let dims = BTreeMap::from([("D".to_string(), d), ("H".to_string(), 4), ("G".to_string(), 2)]);
    let a = cuda_backend::compile_outputs(&p.graph, &outs, &dims, target).map_err(|e| e.to_string())?;
    if !a.ptx.contains(".entry foxc_attn_bwd_dq") || !a.ptx.contains(".entry foxc_attn_bwd_dkv") {
        return Err(format!("{example}: the gradient program has no backward kernels"));
    }
    // The graph as the glue compiled it: with `fuse-loops`' decision for these outputs.
    let mut g = p.graph;
    foxc_passes::fuse_loops::mark(&mut g, &outs);
    Ok((g, a))
}

/// The PTX of the gradient program of `example` for `target` with `D = d`, or the compiler's
/// error.
fn grad_ptx(example: &str, target: Target, d: u64) -> Result<String, String> {
    grad_artifact(example, target, d).map(|(_, a)| a.ptx)
}

/// The values the loop of node `n` reads: its operands, and an inline operand's own (it
/// computes those, `fuse-loops`).
fn loop_reads(g: &foxc_ir::Graph, n: foxc_ir::ValueId) -> Vec<foxc_ir::Value> {
    let mut reads = vec![];
    for v in g.operand_values(n) {
        if foxc_codegen::loop_plan::inlined(g, v.node) {
            reads.extend(loop_reads(g, v.node));
        } else {
            reads.push(v);
        }
    }
    reads
}

/// The kernels of the ordinary ops (casts, the gate's reverse cumsum) read the very results
/// their nodes read (through the values they compute inline): a cast of the backward's dk
/// reads dk's buffer, not dq's (the backward's results feed the rest of the program
/// directly, without copies).
#[test]
fn ordinary_kernels_read_the_results_their_nodes_read() {
    for ex in ["fox", "fox_gqa", "fox_alibi"] {
        let (g, a) = grad_artifact(ex, Target::Sm90a, 64).unwrap_or_else(|e| panic!("{ex}: {e}"));
        let mut later = 0;
        for k in &a.kernels {
            if !foxc_codegen::loop_plan::handles(g.op(k.node)) {
                continue;
            }
            let reads = loop_reads(&g, k.node);
            later += reads.iter().filter(|v| v.result != 0).count();
            for arg in &k.args {
                let KernelArg::Buffer(b) = arg else { continue };
                let BufferKind::Value(v) = &a.buffers[*b].kind else { continue };
                assert!(
                    v.node == k.node || reads.contains(v),
                    "{ex}: kernel {} of %{} reads %{}#{}, not one of its operands {reads:?}",
                    k.name,
                    k.node.index(),
                    v.node.index(),
                    v.result
                );
            }
        }
        assert!(later >= 2, "{ex}: no kernel reads a later result of the backward ({later})");
    }
}

#[test]
fn gradient_programs_assemble_for_the_gpu() {
    let ptxas = ptxas::find();
    if ptxas.is_none() {
        eprintln!("note: ptxas not found (set $PTXAS); compiling only");
    }
    let runs = [
        "fox",
        "fox_softcap",
        "fox_gqa",
        "window",
        "causal",
        "fox_loggate",
        "fox_handwritten",
        "fox_qknorm",
        "local_bidir",
        "refuse_noncausal",
        "fox_keybias",
    ];
    for ex in runs {
        for target in [Target::Sm90a, Target::Sm80] {
            for d in [64, 128] {
                let ptx = grad_ptx(ex, target, d).unwrap_or_else(|e| panic!("{ex} D={d}: {e}"));
                let Some(ptxas) = &ptxas else { continue };
                let arch = if target == Target::Sm80 { "sm_80" } else { "sm_90a" };
                ptxas::assemble(ptxas, &ptx, arch)
                    .unwrap_or_else(|log| panic!("ptxas failed on {ex}_{arch}_d{d}:\n{log}"));
            }
        }
    }
}

/// D = 256: the gradient programs compile and assemble on both targets, and the dq and dkv
/// kernels launch two blocks per (tile, head), one per 128-column half of the head dim (grid y
/// = heads x 2; D = 128 launches one).
#[test]
fn head_dim_256_backward_launches_a_block_per_half() {
    let ptxas = ptxas::find();
    for ex in ["fox", "fox_gqa", "window", "causal"] {
        for target in [Target::Sm90a, Target::Sm80] {
            for d in [128, 256] {
                let (_, a) = grad_artifact(ex, target, d).unwrap_or_else(|e| panic!("{ex} D={d}: {e}"));
                let bwd: Vec<_> = a
                    .kernels
                    .iter()
                    .filter(|k| {
                        k.name.starts_with("foxc_attn_bwd_dq") || k.name.starts_with("foxc_attn_bwd_dkv")
                    })
                    .collect();
                assert_eq!(bwd.len(), 2, "{ex} D={d}");
                for k in bwd {
                    let Launch::GridShared { y: GridDim::Ceil(dims, 1), .. } = &k.launch else {
                        panic!("{ex} D={d}: {} launch {:?}", k.name, k.launch)
                    };
                    let halves = dims.last() == Some(&Dim::Const(2));
                    assert_eq!(halves, d == 256, "{ex} D={d}: {} grid y {dims:?}", k.name);
                }
                let Some(ptxas) = &ptxas else { continue };
                let arch = if target == Target::Sm80 { "sm_80" } else { "sm_90a" };
                ptxas::assemble(ptxas, &a.ptx, arch)
                    .unwrap_or_else(|log| panic!("ptxas failed on {ex}_{arch}_d{d}:\n{log}"));
            }
        }
    }
}

/// What the GPU backward does not run yet says so (a user-facing refusal, not a crash): the
/// gradient of a captured tensor not shaped `[B, H, T]` (time_window's `ts: f32[B, T]`, read
/// by its mask).
#[test]
fn other_captured_tensor_gradients_are_refused_in_the_backward() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("codegen/tests/programs/time_window.attn");
    let e = grad_artifact_at(&path, Target::Sm90a, 64).map(|_| ()).unwrap_err();
    assert!(e.contains("captured tensor") && e.contains("[B, H, T]"), "{e}");
}

/// A key-indexed capture (`kb[b, h, j]` of fox_keybias) and a query-indexed one (`qt[b, h, i]`
/// of codegen/tests/programs/query_temp.attn): the gradient (a result of the backward) is
/// written by the dq kernel (the row sums; 0 without a query read) and then accumulated by the
/// dkv kernel (the column sums); both kernels take it as their last argument; on both targets
/// and paths; the PTX assembles.
#[test]
fn key_capture_gradient_is_written_by_dq_and_summed_by_dkv() {
    let ptxas = ptxas::find();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let programs =
        [root.join("examples/fox_keybias.attn"), root.join("codegen/tests/programs/query_temp.attn")];
    for (path, target, d) in programs.iter().flat_map(|p| {
        [Target::Sm90a, Target::Sm80].into_iter().flat_map(move |t| [64, 128, 256].map(|d| (p, t, d)))
    }) {
        {
            let (g, a) = grad_artifact_at(path, target, d).unwrap_or_else(|e| panic!("D={d}: {e}"));
            if let Some(ptxas) = &ptxas {
                let arch = if target == Target::Sm80 { "sm_80" } else { "sm_90a" };
                ptxas::assemble(ptxas, &a.ptx, arch)
                    .unwrap_or_else(|log| panic!("ptxas failed on {}_{arch}_d{d}:\n{log}", path.display()));
            }
            let bwd = g.find(|op| matches!(op, foxc_ir::Op::AttentionBackward(_)));
            assert_eq!(bwd.len(), 1);
            let kb_grad = a
                .buffers
                .iter()
                .position(|b| matches!(&b.kind, BufferKind::Value(v) if v.node == bwd[0] && v.result == 4))
                .expect(
                    "the backward's result 4 (the capture's gradient: after dq, dk, dv, dc) has a buffer",
                );
            for kind in ["foxc_attn_bwd_dq", "foxc_attn_bwd_dkv"] {
                let k = a.kernels.iter().find(|k| k.name.starts_with(kind)).expect(kind);
                assert_eq!(k.args.last(), Some(&KernelArg::Buffer(kb_grad)), "{kind} D={d}: {:?}", k.args);
            }
        }
    }
}
