//! Every program that type-checks runs on the CPU backend: every file in `examples/` and in
//! `tests/spellings/` (picked up from the directories, so a new example is covered without an
//! edit here), as written (no passes: generic loops only) and optimized with and without
//! pruning, on small shapes with fresh random inputs, with every buffer poisoned with NaN before
//! its kernel runs, against the f64 interpreter on the source graph (the program's meaning).
//!
//! Unpruned: the value before the final cast to bf16 matches to f32 accuracy (rel L2 <= 1e-5).
//! Pruned: within 1e-3 (ACP drops at most eps = e^-10 of each row's mass). The bf16 output itself
//! matches to bf16 rounding either way.

use foxc_driver::{cpu_backend, pipeline, tensors};
use foxc_driver::{PruneOptions, Target};
use foxc_ir::interp;
use foxc_ir::{Graph, Op};
use foxc_runtime::cpu::{default_threads, ExecOptions};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn programs() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = vec![];
    for dir in ["examples", "tests/spellings"] {
        for e in std::fs::read_dir(root.join(dir)).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "attn") {
                out.push(p);
            }
        }
    }
    out.sort();
    assert!(out.len() >= 20, "expected the examples and spellings, found {out:?}");
    out
}

/// Small sizes for every dim of the program (H divisible by a kv-head count G).
fn small_dims(g: &Graph, t: u64) -> BTreeMap<String, u64> {
    g.dims
        .iter()
        .map(|d| {
            let v = match d.as_str() {
                "B" => 2,
                "H" => 4,
                "G" => 2,
                "T" => t,
                "D" => 8,
                _ => 3,
            };
            (d.clone(), v)
        })
        .collect()
}

fn rel_l2(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let num: f64 = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    (num / den.max(1e-300)).sqrt()
}

/// `g` with its output moved before a final cast (the f32 value the cast rounds), if any.
fn before_cast(g: &Graph) -> Graph {
    let mut g = g.clone();
    let out = g.output.unwrap();
    if matches!(g.op(out), Op::Cast) {
        g.output = Some(g.operands(out)[0]);
        g.remove_dead();
    }
    g
}

fn fresh_seed() -> u64 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    t.as_nanos() as u64 ^ 0x9e37_79b9_7f4a_7c15
}

fn run_poisoned(g: &Graph, inputs: &foxc_runtime::TensorMap) -> Vec<f64> {
    let opts = ExecOptions { threads: default_threads(), poison: true };
    cpu_backend::run_with(g, inputs, opts).unwrap_or_else(|e| panic!("{}: {e}", g.name)).out.to_f64_vec()
}

/// One program at one shape, as written (`passes = false`: generic loops only) or optimized,
/// unpruned and pruned; before the cast and the whole graph.
fn check_program(path: &Path, t: u64, seed: u64, passes: bool) {
    let src = pipeline::Source::read(path).unwrap().compile().unwrap().graph;
    let dims = small_dims(&src, t);
    let inputs = tensors::generate(&src, &dims, seed).unwrap();
    let iin = tensors::to_interp(&inputs);
    let what = format!("{} {dims:?} seed {seed}", path.display());
    let want_full = interp::run(&src, &iin).unwrap().output;
    let src_f32 = before_cast(&src);
    let want_f32 = interp::run(&src_f32, &iin).unwrap().output;
    if !passes {
        let got = run_poisoned(&src_f32, &inputs);
        assert!(got.iter().all(|x| x.is_finite()), "{what} no passes: non-finite output");
        let e = rel_l2(&got, &want_f32.data);
        assert!(e <= 1e-5, "{what} no passes: rel L2 {e:e} before the cast");
        let full = run_poisoned(&src, &inputs);
        let e = rel_l2(&full, &want_full.data);
        assert!(e <= 1e-2, "{what} no passes: rel L2 {e:e} of the output");
        return;
    }
    for prune in [false, true] {
        let args = PruneOptions { no_prune: !prune, ..PruneOptions::default() };
        let opt =
            pipeline::optimize(&src, &pipeline::pass_options(&args, Target::Cpu, false).unwrap()).unwrap().0;
        let opt_f32 = before_cast(&opt);
        let got = run_poisoned(&opt_f32, &inputs);
        assert!(got.iter().all(|x| x.is_finite()), "{what} prune={prune}: non-finite output");
        let e = rel_l2(&got, &want_f32.data);
        // A pass may fuse the output cast into the attention: then only bf16 accuracy is left.
        let f32_out = opt_f32.ty(opt_f32.output.unwrap()).dtype == foxc_ir::DType::F32;
        let tol = match (f32_out, prune) {
            (false, _) => 1e-2,
            (true, true) => 1e-3,
            (true, false) => 1e-5,
        };
        assert!(e <= tol, "{what} prune={prune}: rel L2 {e:e} before the cast (tol {tol:e})");
        let full = run_poisoned(&opt, &inputs);
        let e = rel_l2(&full, &want_full.data);
        assert!(e <= 1e-2, "{what} prune={prune}: rel L2 {e:e} of the output");
    }
}

/// The programs as written: every op, attention included, on the generic loops.
#[test]
fn every_program_as_written_runs_on_generic_loops() {
    let seed = fresh_seed();
    for (k, p) in programs().iter().enumerate() {
        for t in [1, 19, 70] {
            check_program(p, t, seed.wrapping_add(k as u64 * 7 + t), false);
        }
    }
}

/// The optimized programs: fused attention where the passes fuse it, generic loops elsewhere.
#[test]
fn every_optimized_program_runs_on_the_cpu() {
    let seed = fresh_seed();
    for (k, p) in programs().iter().enumerate() {
        for t in [1, 19, 70] {
            check_program(p, t, seed.wrapping_add(k as u64 * 7 + t), true);
        }
    }
}

/// `--emit clif` of a program the passes refuse to prune shows generic kernels (softmax, sum).
#[test]
fn clif_of_refused_programs_shows_generic_kernels() {
    for p in programs().iter().filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("refuse_")) {
        let src = pipeline::Source::read(p).unwrap().compile().unwrap().graph;
        let clif = cpu_backend::emit_clif(&src, &small_dims(&src, 16)).unwrap();
        assert!(
            clif.contains("_softmax(") && clif.contains("_sum(") && clif.contains("call fn"),
            "{}",
            p.display()
        );
    }
}
