//! The saved-forward gradient program (`passes::grad::gradient_from_saved`, what the torch op's
//! backward runs) of the examples the Python package trains with compiles for the GPU (sm_90a
//! and sm_80, D = 64 and 128): the backward kernels are there, the forward attention kernel is
//! not (its results are inputs), and the PTX assembles with ptxas (when found). So does the
//! training forward (`forward_for_saved`: out, lse and the unrounded out_f32).

use foxc_codegen::nvptx::ptxas;
use foxc_driver::{cuda_backend, pipeline};
use foxc_passes::grad::{forward_for_saved, gradient_from_saved};
use foxc_passes::{PassOptions, Target};
use std::collections::BTreeMap;
use std::path::Path;

fn optimized(example: &str, target: Target) -> foxc_ir::Graph {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples").join(format!("{example}.attn"));
    let c = pipeline::Source::read(&path).unwrap().compile().unwrap();
    let opts = PassOptions { target, ..PassOptions::default() };
    pipeline::optimize(&c.graph, &opts).unwrap().0
}

/// The training forward: three outputs, each its own buffer, the forward attention kernel.
fn train_forward_ptx(example: &str, target: Target, d: u64) -> String {
    let (g, outputs) = forward_for_saved(&optimized(example, target)).unwrap();
    let outs: Vec<_> = outputs.iter().map(|(_, v)| *v).collect();
    assert_eq!(outs.len(), 3, "{example}: out, lse, out_f32");
    let dims = BTreeMap::from([("D".to_string(), d)]);
    let name = foxc_driver::target::name(target);
    let a = cuda_backend::compile_outputs(&g, &outs, &dims, target)
        .unwrap_or_else(|e| panic!("{example} {name} D={d}: {}", e.message));
    let mut bufs = a.outputs.clone();
    bufs.sort();
    bufs.dedup();
    assert_eq!(bufs.len(), 3, "{example}: one buffer per output");
    assert!(a.ptx.contains(".entry foxc_attn_fwd"), "{example}: no forward attention kernel");
    a.ptx
}

fn saved_grad_ptx(example: &str, target: Target, d: u64) -> String {
    let opt = optimized(example, target);
    let p = gradient_from_saved(&opt).unwrap_or_else(|e| panic!("{example}: {e}"));
    let outs: Vec<_> = p.outputs.iter().map(|(_, v)| *v).collect();
    let dims = BTreeMap::from([("D".to_string(), d)]);
    let name = foxc_driver::target::name(target);
    let a = cuda_backend::compile_outputs(&p.graph, &outs, &dims, target)
        .unwrap_or_else(|e| panic!("{example} {name} D={d}: {}", e.message));
    assert_eq!(a.outputs.len(), outs.len(), "{example}: one buffer per gradient");
    assert!(a.ptx.contains(".entry foxc_attn_bwd_dq"), "{example}: no dq kernel");
    assert!(a.ptx.contains(".entry foxc_attn_bwd_dkv"), "{example}: no dk/dv kernel");
    assert!(!a.ptx.contains(".entry foxc_attn_fwd"), "{example}: the forward attention is recomputed");
    a.ptx
}

#[test]
fn saved_forward_gradient_programs_assemble_for_the_gpu() {
    let ptxas = ptxas::find();
    if ptxas.is_none() {
        eprintln!("note: ptxas not found (set $PTXAS); compiling only");
    }
    for ex in ["fox", "fox_qknorm", "alibi", "causal", "window"] {
        for (target, arch) in [(Target::Sm90a, "sm_90a"), (Target::Sm80, "sm_80")] {
            for d in [64, 128] {
                for (what, ptx) in
                    [("bwd", saved_grad_ptx(ex, target, d)), ("fwd", train_forward_ptx(ex, target, d))]
                {
                    let Some(ptxas) = &ptxas else { continue };
                    ptxas::assemble(ptxas, &ptx, arch)
                        .unwrap_or_else(|log| panic!("ptxas failed on {ex}_{what}_{arch}_{d}:\n{log}"));
                }
            }
        }
    }
}
