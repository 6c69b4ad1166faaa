//! The ordinary ops of every gradient program run on the GPU's generic loops: for each example
//! the passes fuse, the gradient program with the `attention_backward` results taken as inputs
//! (the backward kernels are `tests/grad_nvptx.rs`'s subject) compiles for sm_90a and sm_80 and
//! its PTX assembles with ptxas (when found). What remains is the reverse cumsum of the gate,
//! rmsnorm and slope gradients, broadcasts and reductions over b, h, t, casts.

use foxc_codegen::nvptx::ptxas;
use foxc_driver::grad::grad_program;
use foxc_driver::{cuda_backend, pipeline};
use foxc_driver::{PruneOptions, Target};
use foxc_ir::{Graph, Op, Span, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Every result of every `attention_backward` of `g` replaced by a new parameter of its type,
/// in the graph and in `outputs` (a gradient output may be a backward result itself); returns
/// how many nodes were cut out.
fn cut_backward(g: &mut Graph, outputs: &mut [(String, Value)]) -> usize {
    let nodes = g.find(|o| matches!(o, Op::AttentionBackward(_)));
    for &n in &nodes {
        let tys: Vec<_> = g.result_types(n).into_iter().cloned().collect();
        for (r, ty) in tys.into_iter().enumerate() {
            let p = g.add_param(&format!("bwd{}_{r}", n.index()), ty, Span::default());
            let result = Value { node: n, result: r as u32 };
            g.replace_value_uses(result, Value::of(p));
            for (_, v) in outputs.iter_mut().filter(|(_, v)| *v == result) {
                *v = Value::of(p);
            }
        }
    }
    nodes.len()
}

#[test]
fn gradient_ops_compile_for_the_gpu() {
    let ptxas = ptxas::find();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&root).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    let mut compiled = vec![];
    for f in files {
        let name = f.file_stem().unwrap().to_string_lossy().into_owned();
        if f.extension().is_none_or(|x| x != "attn") || name.starts_with("refuse_") {
            continue;
        }
        let c = pipeline::Source::read(&f).unwrap().compile().unwrap();
        for (target, arch) in [(Target::Sm90a, "sm_90a"), (Target::Sm80, "sm_80")] {
            let prune = PruneOptions::default();
            let (opt, _) =
                pipeline::optimize(&c.graph, &pipeline::pass_options(&prune, target, false).unwrap())
                    .unwrap();
            let mut p = grad_program(&opt, target).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(cut_backward(&mut p.graph, &mut p.outputs), 1, "{name}: one attention_backward");
            let outs: Vec<Value> = p.outputs.iter().map(|(_, v)| *v).collect();
            let dims = BTreeMap::from([("D".to_string(), 64), ("H".to_string(), 4), ("G".to_string(), 2)]);
            let a = cuda_backend::compile_outputs(&p.graph, &outs, &dims, target)
                .unwrap_or_else(|e| panic!("{name} {arch}: {e}"));
            assert_eq!(a.outputs.len(), p.outputs.len());
            // The gate's gradient is a reverse cumsum (the row scan's launches of a suffix sum),
            // not a total minus a prefix.
            if opt.find(|o| matches!(o, Op::GateCumsum { .. })).len() == 1 {
                let kinds: Vec<&str> = a.kernels.iter().map(|k| p.graph.op(k.node).mnemonic()).collect();
                assert!(kinds.contains(&"cumsum"), "{name}: {kinds:?}");
                let scans = p.graph.find(|o| matches!(o, Op::Cumsum { reverse: true, .. }));
                assert_eq!(scans.len(), 1, "{name}: one reverse cumsum");
            }
            if let Some(ptxas) = &ptxas {
                ptxas::assemble(ptxas, &a.ptx, arch)
                    .unwrap_or_else(|log| panic!("ptxas failed on {name}_{arch}:\n{log}"));
            }
        }
        compiled.push(name);
    }
    assert!(compiled.len() >= 10 && compiled.iter().any(|n| n == "fox_alibi"), "{compiled:?}");
}
