//! Per-head thresholds given by the user (`--thresholds`, docs/RULES.md "Given thresholds"):
//! `delta[b, h, m] = d_h`. The CPU's deltas are the table's entries head by head, its block
//! starts the interpreter's exactly, its pruned output the interpreter's on the same kept set
//! (every buffer poisoned with NaN first); a tighter threshold keeps fewer tiles, `-inf` keeps
//! every tile; a program of another head count is refused by the CPU backend and the reference.

use foxc_driver::{acp_stats, cpu_backend, pipeline, tensors, ErrorKind, PruneOptions, Target};
use foxc_ir::interp::{self, Tensor};
use foxc_ir::{DType, Graph, Op, PruneRule, Tiles};
use foxc_runtime::cpu::ExecOptions;
use foxc_runtime::TensorMap;
use std::path::Path;

const NEG_INF: f64 = f64::NEG_INFINITY;
const BM: u32 = 32;

fn compile(name: &str) -> Graph {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples").join(format!("{name}.attn"));
    pipeline::Source::read(&path).unwrap().compile().unwrap().graph
}

fn given(d: &[f64]) -> PruneRule {
    foxc_ir::PruneRule::given_thresholds(d).unwrap()
}

fn optimize(src: &Graph, rule: PruneRule) -> Graph {
    let args =
        PruneOptions { prune_rule: rule, tiles: Some(Tiles { bm: BM, bn: BM }), ..PruneOptions::default() };
    pipeline::optimize(src, &pipeline::pass_options(&args, Target::Cpu, false).unwrap()).unwrap().0
}

fn inputs(src: &Graph, dims: &str, seed: u64) -> TensorMap {
    tensors::generate(src, &pipeline::parse_shape(dims).unwrap(), seed).unwrap()
}

fn poisoned() -> ExecOptions {
    ExecOptions { threads: 2, poison: true }
}

/// `g` computing node `n` (its first result) as the output.
fn up_to(g: &Graph, n: foxc_ir::ValueId) -> Graph {
    let mut s = g.clone();
    s.output = Some(n);
    s.remove_dead();
    s
}

fn rel_l2(a: &[f64], b: &[f64]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    (num / den).sqrt()
}

/// Kept key tiles per head from the starts `[B, H, Mt]` (square tiles, queries = keys: query
/// tile m keeps `start..=m`).
fn kept_per_head(start: &Tensor) -> Vec<usize> {
    let (b, h, mt) = (start.shape[0], start.shape[1], start.shape[2]);
    let mut kept = vec![0; h];
    for bi in 0..b {
        for (hi, k) in kept.iter_mut().enumerate() {
            for m in 0..mt {
                let s = start.data[(bi * h + hi) * mt + m];
                assert!(s >= 0.0 && s <= m as f64, "start {s} of tile {m}");
                *k += m + 1 - s as usize;
            }
        }
    }
    kept
}

/// The CPU run of `table` on `x`: its deltas are the table's (head h of every batch, every
/// tile), its starts the interpreter's, its attention output the interpreter's on that kept
/// set. Returns the kept tiles per head.
fn cpu_case(src: &Graph, x: &TensorMap, table: &[f64]) -> Vec<usize> {
    let what = format!("{table:?}");
    let opt = optimize(src, given(table));
    let th = opt.find(|op| matches!(op, Op::Threshold { .. }));
    assert_eq!(th.len(), 1, "{what}");
    let delta = cpu_backend::run_with(&up_to(&opt, th[0]), x, poisoned()).unwrap();
    let (b, h, mt) = (delta.out.shape[0], delta.out.shape[1], delta.out.shape[2]);
    assert_eq!(h, table.len());
    let got = delta.out.to_f64_vec();
    for bi in 0..b {
        for (hi, d) in table.iter().enumerate() {
            for m in 0..mt {
                assert_eq!(got[(bi * h + hi) * mt + m], *d as f32 as f64, "{what}: delta[{bi}, {hi}, {m}]");
            }
        }
    }
    let iin = tensors::to_interp(x);
    let cpu = cpu_backend::block_starts(&opt, x).unwrap().expect("pruned");
    let reference = acp_stats::measure(&opt, &iin).unwrap().unwrap().start;
    assert_eq!(cpu.data, reference.data, "{what}: the CPU kept another set of tiles");

    // The attention node itself in f32, against the interpreter on the same (pruned) graph.
    let a = opt.find(|op| matches!(op, Op::Attention(_)))[0];
    let mut att = up_to(&opt, a);
    if let Op::Attention(at) = &mut att.node_mut(a).op {
        at.out_dtype = DType::F32;
    }
    att.node_mut(a).ty.dtype = DType::F32;
    let r = cpu_backend::run_with(&att, x, poisoned()).unwrap();
    let want = interp::eval(&att, &iin, &[a]).unwrap();
    let e = rel_l2(&r.out.to_f64_vec(), &want[&a].data);
    assert!(e <= 1e-5, "{what}: rel L2 {e:e} against the interpreter");
    kept_per_head(&cpu)
}

#[test]
fn cpu_matches_the_interpreter_and_tighter_thresholds_keep_fewer_tiles() {
    let src = compile("fox");
    let x = inputs(&src, "B=2,H=4,T=640,D=16", 7);
    let mt = 640 / BM as usize;
    let all = 2 * mt * (mt + 1) / 2;
    let none = cpu_case(&src, &x, &[NEG_INF; 4]);
    assert_eq!(none, vec![all; 4], "-inf keeps every tile");
    let loose = cpu_case(&src, &x, &[-30.0, -30.0, -30.0, -30.0]);
    let tight = cpu_case(&src, &x, &[-3.0, -3.0, -3.0, -3.0]);
    let tightest = cpu_case(&src, &x, &[-0.5, -0.5, -0.5, -0.5]);
    for h in 0..4 {
        assert!(tightest[h] <= tight[h] && tight[h] <= loose[h] && loose[h] <= all, "head {h}");
    }
    let sum = |v: &[usize]| v.iter().sum::<usize>();
    assert!(sum(&tight) < sum(&loose), "{tight:?} vs {loose:?}");
    assert!(sum(&tightest) < sum(&tight), "{tightest:?} vs {tight:?}");
    // Per head: each head keeps what its own threshold alone keeps; -inf spares its head.
    let mixed = cpu_case(&src, &x, &[-0.5, NEG_INF, -30.0, -3.0]);
    assert_eq!(mixed, vec![tightest[0], all, loose[2], tight[3]]);
}

#[test]
fn another_head_count_is_refused_by_the_cpu_and_the_reference() {
    let src = compile("fox");
    let opt = optimize(&src, given(&[-4.0, -8.0]));
    let x = inputs(&src, "B=1,H=3,T=64,D=16", 3);
    // The driver's input validation, before any backend (the CUDA backend's only check: its
    // kernel takes the table's length as H).
    let e = foxc_driver::validate::check_inputs(&opt, &x).expect_err("H = 3 with 2 thresholds");
    assert!(e.to_string().contains("2 per-head thresholds") && e.to_string().contains("H = 3"), "{e}");
    let e = cpu_backend::run(&opt, &x).expect_err("H = 3 with 2 thresholds");
    assert_eq!(e.kind, ErrorKind::User, "{e}");
    assert!(e.message.contains("2 per-head thresholds") && e.message.contains("H = 3"), "{e}");
    let e = cpu_backend::block_starts(&opt, &x).expect_err("H = 3 with 2 thresholds");
    assert!(e.message.contains("H = 3"), "{e}");
    let e = interp::run(&opt, &tensors::to_interp(&x)).expect_err("the interpreter refuses too");
    assert!(matches!(e, interp::InterpError::Refused(_)), "{e}");
    assert!(e.to_string().contains("2 per-head thresholds"), "{e}");
    // The reference backend as `foxc run --backend reference` calls it.
    let be = foxc_driver::backend(foxc_driver::BackendKind::Reference);
    let Err(e) = be.run(&opt, &[], &x, Default::default()) else { panic!("the reference backend ran") };
    assert_eq!(e.kind, ErrorKind::User, "{e}");
    assert!(e.message.contains("H = 3"), "{e}");
    // The table of the right length runs.
    assert!(cpu_backend::run(&opt, &inputs(&src, "B=1,H=2,T=64,D=16", 3)).is_ok());
}

/// The gradient program keeps the rule: its threshold is the forward's, and it runs on the CPU
/// against the interpreter.
#[test]
fn the_gradient_program_runs_with_given_thresholds() {
    let src = compile("fox");
    let opt = optimize(&src, given(&[-0.3, NEG_INF]));
    let gp = foxc_driver::grad::grad_program(&opt, Target::Cpu).unwrap();
    let th = gp.graph.find(|op| matches!(op, Op::Threshold { .. }));
    assert!(!th.is_empty(), "no threshold in the gradient program");
    for n in th {
        let Op::Threshold { rule, .. } = gp.graph.op(n) else { unreachable!() };
        assert_eq!(rule.to_string(), "given[-0.3, -inf]");
    }
    let x = inputs(&src, "B=1,H=2,T=320,D=16", 5);
    let mut with_dout = x.clone();
    let dout = foxc_driver::grad::seeded_dout(&gp, &opt, &x, 11).unwrap();
    with_dout.insert("dout".into(), dout);
    let outs: Vec<(String, foxc_ir::Value)> = gp.outputs.clone();
    let cpu = cpu_backend::run_outputs(&gp.graph, &outs, &with_dout, poisoned()).unwrap();
    assert!(outs.len() >= 4, "{outs:?}");
    let iin = tensors::to_interp(&with_dout);
    let vals: Vec<foxc_ir::Value> = outs.iter().map(|(_, v)| *v).collect();
    let want = interp::eval_values(&gp.graph, &iin, &vals).unwrap();
    for (name, v) in &outs {
        let got = cpu[name].to_f64_vec();
        let e = rel_l2(&got, &want[v].data);
        assert!(e <= 5e-3, "{name}: rel L2 {e:e}");
    }
}
