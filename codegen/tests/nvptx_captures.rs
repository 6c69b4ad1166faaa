//! Captured tensors in the GPU attention kernel: `examples/fox_keybias.attn` (`kb[b, h, j]` with
//! a declared range, its bound `U = x + 4`) after the passes compiles to one attention kernel
//! whose score hook reads `kb` through its subscripts, with the tensor and its axis sizes (and
//! the head count when it is not static) as kernel arguments after `T`; the PTX assembles.

use foxc_codegen::nvptx::ptxas;
use foxc_codegen::nvptx::{compile, BufferKind, KernelArg, NvptxArtifact, NvptxSpec, NvptxTarget};
use foxc_ir::{Dim, Graph};
use foxc_passes::{optimize, PassOptions, Target};

fn keybias(target: Target) -> Graph {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/fox_keybias.attn");
    let src = std::fs::read(path).unwrap();
    let mut g =
        foxc_ir::frontend::compile("fox_keybias.attn", &src).unwrap_or_else(|e| panic!("{e:?}")).graph;
    optimize(&mut g, &PassOptions { target, ..PassOptions::default() }).unwrap();
    g
}

fn spec(t: NvptxTarget, dims: &[(&str, u64)]) -> NvptxSpec {
    NvptxSpec::new(t, dims.iter().map(|(k, v)| (k.to_string(), *v)).collect())
}

/// The attention kernel's arguments after the eight of its own, and the buffer of `kb`.
fn hook_args(a: &NvptxArtifact) -> (Vec<KernelArg>, usize) {
    let k = a.kernels.iter().find(|k| k.name.starts_with("foxc_attn_fwd")).expect("an attention kernel");
    let kb = a
        .buffers
        .iter()
        .position(|b| matches!(&b.kind, BufferKind::Param { name, .. } if name == "kb"))
        .expect("a buffer for kb");
    (k.args[8..].to_vec(), kb)
}

#[test]
fn a_key_bias_is_read_in_the_score_hook() {
    let g = keybias(Target::Sm90a);
    let sym = |s: &str| vec![Dim::sym(s)];
    // H not static: the kernel splits the flat head with an H argument.
    let a = compile(&g, &spec(NvptxTarget::Sm90a, &[("D", 64)])).expect("compiles");
    let (args, kb) = hook_args(&a);
    assert_eq!(
        args,
        [
            KernelArg::I32(sym("H")),
            KernelArg::Buffer(kb),
            KernelArg::I32(sym("B")),
            KernelArg::I32(sym("H")),
            KernelArg::I32(sym("T"))
        ]
    );
    // The kernel reads kb (a load through the capture pointer survives optimization).
    assert!(a.llvm_ir.contains("%capture0"), "{}", a.llvm_ir);
    // H static: no head argument.
    let a = compile(&g, &spec(NvptxTarget::Sm90a, &[("D", 64), ("H", 4)])).expect("compiles");
    let (args, kb) = hook_args(&a);
    assert_eq!(args[0], KernelArg::Buffer(kb));
    assert_eq!(args.len(), 4);
}

/// The key-bias kernels (and the threshold of `U = x + 4`) assemble for sm_90a and sm_80.
#[test]
fn key_bias_assembles_with_ptxas() {
    let Some(ptxas) = ptxas::find() else {
        eprintln!("note: ptxas not found (set $PTXAS); skipping the PTX assembly check");
        return;
    };
    for (t, pt) in [(NvptxTarget::Sm90a, Target::Sm90a), (NvptxTarget::Sm80, Target::Sm80)] {
        let g = keybias(pt);
        for d in [64, 128] {
            let a = compile(&g, &spec(t, &[("D", d)])).expect("compiles");
            ptxas::assemble(&ptxas, &a.ptx, t.cpu())
                .unwrap_or_else(|log| panic!("ptxas failed on keybias_{}_d{d}:\n{log}", t.cpu()));
        }
    }
}
