//! The CPU backend end to end: every example through the passes and the Cranelift kernels,
//! against the f64 reference interpreter; input errors; determinism; unfused graphs.

use foxc_driver::{PruneOptions, Target};
use foxc_ir::PruneRule;

/// The rule of the table named `n`.
fn rule(n: &str) -> PruneRule {
    foxc_passes::rules::by_name(n).unwrap()
}
use foxc_driver::{check, cpu_backend, pipeline, tensors, ErrorKind};
use foxc_ir::interp::{self, Tensor};
use foxc_ir::{DType, Graph, Op};
use foxc_runtime::{HostTensor, TensorMap};
use std::collections::BTreeMap;
use std::path::Path;

const EXAMPLES: &[&str] = &["fox", "fox_loggate", "fox_qknorm", "alibi", "causal", "window"];

fn compile(name: &str) -> Graph {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples").join(format!("{name}.attn"));
    pipeline::Source::read(&path).unwrap().compile().unwrap().graph
}

fn optimize(g: &Graph, prune: bool, rule: PruneRule) -> Graph {
    let args = PruneOptions { no_prune: !prune, prune_rule: rule, ..PruneOptions::default() };
    pipeline::optimize(g, &pipeline::pass_options(&args, Target::Cpu, false).unwrap()).unwrap().0
}

fn shape(s: &str) -> BTreeMap<String, u64> {
    pipeline::parse_shape(s).unwrap()
}

fn attention(g: &Graph) -> foxc_ir::ValueId {
    g.find(|op| matches!(op, Op::Attention(_)))[0]
}

/// The attention writes f32 (the kernel-level comparison; the pass fused the bf16 output cast).
fn f32_out(g: &mut Graph, a: foxc_ir::ValueId) {
    let node = g.node_mut(a);
    if let Op::Attention(at) = &mut node.op {
        at.out_dtype = DType::F32;
        node.ty.dtype = DType::F32;
    }
}

fn rel_l2(a: &[f64], b: &[f64]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    (num / den).sqrt()
}

/// Run the attention node itself (f32 result) on the CPU and compare with the interpreter's
/// f64 evaluation of the same node; then the whole graph (bf16 output) through `--check`.
fn check_example(name: &str, dims: &str, prune: bool, rule: PruneRule, seed: u64) {
    let src = compile(name);
    let what = format!("{name} {dims} prune={prune} {}", rule.name);
    let opt = optimize(&src, prune, rule);
    let inputs = tensors::generate(&src, &shape(dims), seed).unwrap();
    let iin = tensors::to_interp(&inputs);

    let mut att_g = opt.clone();
    let a = attention(&att_g);
    att_g.output = Some(a);
    att_g.remove_dead();
    f32_out(&mut att_g, a);
    let r = cpu_backend::run(&att_g, &inputs).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(r.out.dtype, DType::F32);
    let got: Vec<f64> = r.out.to_f64_vec();
    let want = interp::eval(&att_g, &iin, &[a]).unwrap();
    let e = rel_l2(&got, &want[&a].data);
    assert!(e <= 1e-5, "{what}: attention rel L2 {e:e} vs the interpreter");

    let full = cpu_backend::run(&opt, &inputs).unwrap();
    let out = Tensor { shape: full.out.shape.clone(), data: full.out.to_f64_vec() };
    let starts = cpu_backend::block_starts(&opt, &inputs).unwrap();
    let tol = check::tolerance("cpu", full.out.dtype);
    let rep = check::check(&src, &opt, &iin, &out, tol, -10.0, starts.as_ref()).unwrap();
    assert!(rep.passed(), "{what}: --check failed: {rep:?}");
}

#[test]
fn examples_dense_and_pruned_match_the_interpreter() {
    let mut seed = 1;
    for name in EXAMPLES {
        for dims in ["B=1,H=2,T=17,D=16", "B=2,H=2,T=130,D=32", "B=1,H=1,T=1,D=64"] {
            for (prune, rule) in [(false, rule("paper")), (true, rule("paper")), (true, rule("tight"))] {
                seed += 1;
                check_example(name, dims, prune, rule, seed);
            }
        }
    }
}

#[test]
fn head_dims_and_ragged_lengths() {
    for (i, d) in [16, 32, 64, 96, 128].into_iter().enumerate() {
        check_example(
            "fox",
            &format!("B=1,H=2,T={},D={d}", 67 + 31 * i),
            true,
            rule("paper"),
            100 + i as u64,
        );
    }
}

#[test]
fn pruning_skips_work_and_same_bits_every_run() {
    let src = compile("fox");
    let opt = optimize(&src, true, rule("paper"));
    let inputs = tensors::generate(&src, &shape("B=1,H=8,T=1024,D=64"), 3).unwrap();
    let a = cpu_backend::run(&opt, &inputs).unwrap();
    let b = cpu_backend::run(&opt, &inputs).unwrap();
    assert_eq!(a.out, b.out, "CPU runs differ");
    let stats = foxc_driver::acp_stats::measure(&opt, &tensors::to_interp(&inputs)).unwrap();
    if let Some(s) = stats {
        assert!(s.kept_tile_fraction < 0.9, "standard workload barely pruned: {}", s.kept_tile_fraction);
    }
}

fn err(g: &Graph, inputs: &TensorMap) -> foxc_driver::Error {
    cpu_backend::run(g, inputs).expect_err("expected an error")
}

#[test]
fn bad_inputs_are_user_errors_naming_the_tensor() {
    let src = compile("fox");
    let opt = optimize(&src, true, rule("paper"));
    let good = tensors::generate(&src, &shape("B=1,H=2,T=32,D=16"), 9).unwrap();

    let mut m = good.clone();
    m.remove("v");
    let e = err(&opt, &m);
    assert!(e.kind == ErrorKind::User && e.message.contains("`v`"), "{e}");

    let mut m = good.clone();
    m.insert("extra".into(), HostTensor::from_f32(&[1], &[1.0]));
    let e = err(&opt, &m);
    assert!(e.kind == ErrorKind::User && e.message.contains("extra"), "{e}");

    let mut m = good.clone();
    m.insert("k".into(), HostTensor::from_f32_as_bf16(&[1, 2, 31, 16], &vec![0.5; 2 * 31 * 16]));
    let e = err(&opt, &m);
    assert!(e.kind == ErrorKind::User && e.message.contains('k'), "{e}");

    let mut m = good.clone();
    m.insert("q".into(), HostTensor::from_f32(&[1, 2, 32, 16], &vec![0.5; 2 * 32 * 16]));
    let e = err(&opt, &m);
    assert!(e.kind == ErrorKind::User && e.message.contains("`q`"), "{e}");

    let mut m = good.clone();
    let mut g = m["fgate"].to_f32_vec();
    g[5] = f32::NAN;
    m.insert("fgate".into(), HostTensor::from_f32(&[1, 2, 32], &g));
    let e = err(&opt, &m);
    assert!(e.kind == ErrorKind::User && e.message.contains("fgate"), "{e}");
}

/// The source graph, without the passes, runs on the generic loops (issue 8: every program that
/// type-checks runs on the CPU) and agrees with the fused kernels to bf16 rounding.
#[test]
fn unfused_graphs_run_on_generic_loops() {
    let src = compile("fox");
    let inputs = tensors::generate(&src, &shape("B=1,H=1,T=8,D=16"), 1).unwrap();
    let plain = cpu_backend::run(&src, &inputs).unwrap().out.to_f64_vec();
    let fused = cpu_backend::run(&optimize(&src, false, rule("paper")), &inputs).unwrap().out.to_f64_vec();
    assert!(rel_l2(&plain, &fused) <= 1e-2, "{}", rel_l2(&plain, &fused));
    let clif = cpu_backend::emit_clif(&optimize(&src, true, rule("paper")), &shape("D=16")).unwrap();
    assert!(clif.contains("function %k") && clif.contains("_attention"), "{clif}");
}

/// `--tiles` reaches the CPU kernels: other tile shapes stay exact against the interpreter.
#[test]
fn other_tile_shapes() {
    let src = compile("fox");
    for (bm, bn) in [(32, 16), (16, 64), (48, 32)] {
        let args = PruneOptions {
            prune_rule: rule("tight"),
            tiles: Some(foxc_ir::Tiles { bm, bn }),
            ..PruneOptions::default()
        };
        let opt =
            pipeline::optimize(&src, &pipeline::pass_options(&args, Target::Cpu, false).unwrap()).unwrap().0;
        let inputs = tensors::generate(&src, &shape("B=1,H=4,T=200,D=32"), bm as u64).unwrap();
        let mut att_g = opt.clone();
        let a = attention(&att_g);
        att_g.output = Some(a);
        att_g.remove_dead();
        f32_out(&mut att_g, a);
        let got = cpu_backend::run(&att_g, &inputs).unwrap().out.to_f64_vec();
        let want = interp::eval(&att_g, &tensors::to_interp(&inputs), &[a]).unwrap();
        let e = rel_l2(&got, &want[&a].data);
        assert!(e <= 1e-5, "tiles {bm}x{bn}: rel L2 {e:e}");
    }
}
