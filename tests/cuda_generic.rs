//! The generic NVPTX loops on a GPU against the f64 interpreter: every program of
//! `tests/generic/` (one per corner: reductions, cumsum, broadcast select, iota and dims, the
//! transcendentals, masks, gathers at index expressions, the FoX + ALiBi gate) at its `# shape:`
//! with fresh random inputs, every buffer poisoned with NaN first (`cuda_backend::run`
//! rejects a NaN left in the output); then several outputs of one program through
//! `run_outputs`. Without a CUDA driver (this machine, CI without a GPU) it says so and passes.

mod common;

use foxc_driver::{cuda_backend, pipeline, tensors};
use foxc_ir::interp;
use foxc_ir::{Op, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn gpu() -> bool {
    common::gpu_or_skip("cuda_generic (the generic loops on the GPU)")
}

fn programs() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/generic");
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "attn"))
        .collect();
    out.sort();
    out
}

/// The dims of the program's `# shape: A=1,B=2` line.
fn shape(src: &str) -> BTreeMap<String, u64> {
    let line = src.lines().find_map(|l| l.strip_prefix("# shape: ")).expect("a `# shape:` line");
    pipeline::parse_shape(line.trim()).unwrap()
}

fn fresh_seed() -> u64 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    t.as_nanos() as u64
}

/// Relative L2 distance, infinities compared exactly (both the same infinity, or a failure).
fn rel_l2(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let (mut num, mut den) = (0.0, 0.0);
    for (&x, &y) in got.iter().zip(want) {
        if y.is_infinite() {
            if x != y {
                return f64::INFINITY;
            }
            continue;
        }
        num += (x - y) * (x - y);
        den += y * y;
    }
    (num / den.max(1e-300)).sqrt()
}

#[test]
fn generic_programs_match_the_interpreter_on_the_gpu() {
    if !gpu() {
        return;
    }
    let seed = fresh_seed();
    for p in programs() {
        let src = pipeline::Source::read(&p).unwrap();
        let text = String::from_utf8(src.bytes.clone()).unwrap();
        let g = src.compile().unwrap().graph;
        let inputs = tensors::generate(&g, &shape(&text), seed).unwrap();
        let want = interp::run(&g, &tensors::to_interp(&inputs)).unwrap().output;
        let got = cuda_backend::run(&g, &inputs).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        let e = rel_l2(&got.out.to_f64_vec(), &want.data);
        // f32 math with the PTX approximations (ex2, lg2: about 2^-22), bf16 storage where
        // the program says so.
        let tol = if got.out.dtype == foxc_ir::DType::BF16 { 1e-2 } else { 1e-5 };
        assert!(e <= tol, "{} seed {seed}: rel L2 {e:e} (tol {tol:e})", p.display());
    }
}

/// One program, two outputs: the buffer of an intermediate value and of the result, each as
/// the interpreter computes it.
#[test]
fn several_outputs_come_back_by_name() {
    if !gpu() {
        return;
    }
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/generic/fox_alibi_gate.attn");
    let src = pipeline::Source::read(&p).unwrap();
    let text = String::from_utf8(src.bytes.clone()).unwrap();
    let g = src.compile().unwrap().graph;
    let scan = g.find(|o| matches!(o, Op::Cumsum { .. }))[0];
    let gate = g.operands(scan)[0];
    let outputs =
        vec![("gate".to_string(), Value::of(gate)), ("c".to_string(), Value::of(g.output.unwrap()))];
    let inputs = tensors::generate(&g, &shape(&text), fresh_seed()).unwrap();
    let got = cuda_backend::run_outputs(&g, &outputs, &inputs, cuda_backend::RunOptions::default()).unwrap();
    let want = interp::eval_values(
        &g,
        &tensors::to_interp(&inputs),
        &[Value::of(gate), Value::of(g.output.unwrap())],
    )
    .unwrap();
    for (name, v) in &outputs {
        let e = rel_l2(&got[name].to_f64_vec(), &want[v].data);
        assert!(e <= 1e-5, "{name}: rel L2 {e:e}");
    }
}
