//! `foxc run`: the main job. Compile, get inputs, run on a backend, report, optionally check.

use crate::cli::{BackendArg, RunArgs, TargetArg};
use crate::pipeline::{self, parse_shape, Source, DEFAULT_SHAPE};
use crate::{acp_stats, check, cpu_backend, cuda_backend, tensors, Error};
use foxc_ir::Op;
use foxc_runtime::{HostTensor, TensorMap};
use std::time::Instant;

pub fn run(a: &RunArgs) -> Result<(), Error> {
    let src = match &a.file {
        Some(f) => Source::read(f)?,
        None => Source::embedded_default(),
    };
    let c = src.compile()?;
    let (inputs, origin) = match (&a.inputs, &a.shape) {
        (Some(path), _) => (tensors::read(path)?, format!("from {}", path.display())),
        (None, shape) => {
            let shape = match (shape, &a.file) {
                (Some(s), _) => s.clone(),
                (None, None) => DEFAULT_SHAPE.to_string(),
                (None, Some(_)) => return Err(Error::user(
                    "error: `foxc run FILE` needs --inputs FILE.safetensors or --shape B=..,H=..,T=..,D=..",
                )),
            };
            let dims = parse_shape(&shape)?;
            (
                tensors::generate(&c.graph, &dims, a.seed)?,
                format!("standard workload {shape}, seed {}", a.seed),
            )
        }
    };
    tensors::validate(&c.graph, &inputs)?;
    let backend = match a.backend {
        BackendArg::Reference => "reference",
        BackendArg::Cpu => "cpu",
        BackendArg::Cuda => "cuda",
    };
    let target = if a.backend == BackendArg::Cuda { TargetArg::Sm90a } else { TargetArg::Cpu };
    let mut opts = pipeline::pass_options(&a.prune, target, false)?;
    opts.dims = pipeline::bound_dims(&c.graph, &inputs)?;
    let (opt, _) = pipeline::optimize(&c.graph, &opts)?;
    let interp_inputs = tensors::to_interp(&inputs);

    println!("foxc run: {} on {backend} ({origin})", src.name);
    for (name, t) in &inputs {
        println!("  input  {name:<8} {} {:?}", t.dtype, t.shape);
    }
    // The kept set the backend itself used: the CPU reports its block starts; the GPU kernel
    // reports its in-kernel starts only from a debug build (--check-starts, one more run, checked
    // against the reference's); otherwise the reference's stand in.
    if a.check_starts && a.backend != BackendArg::Cuda {
        return Err(Error::user(
            "error: --check-starts needs --backend cuda (the CPU's starts are always checked by --check)",
        ));
    }
    let backend_starts = match a.backend {
        BackendArg::Cpu => cpu_backend::block_starts(&opt, &inputs)?,
        BackendArg::Cuda if a.check_starts => Some(gpu_starts(&opt, &inputs, &interp_inputs)?),
        _ => None,
    };
    let kept_by = match (a.backend, &backend_starts) {
        (BackendArg::Cpu, Some(_)) => "the CPU kernels' block starts",
        (BackendArg::Cuda, Some(_)) => "the GPU kernel's in-kernel block starts (--check-starts)",
        (BackendArg::Cuda, _) => "the reference's block starts (the GPU kernel does not report its own)",
        _ => "the reference's block starts",
    };
    let stats = acp_stats::measure_with(&opt, &interp_inputs, backend_starts.as_ref())?;
    let attn_op = acp_stats::attention_node(&opt).map(|n| opt.op(n));
    match (&stats, attn_op) {
        (Some(s), Some(Op::Attention(at))) if at.prune != foxc_ir::Prune::Dense => println!(
            "  pruning: {} rule, ln eps = {}, tiles {}x{}: kept {:.3} of causal tiles, {:.3} of causal pairs (from {kept_by})",
            rule_name(&opts), opts.log_eps, s.bm, s.bn, s.kept_tile_fraction, s.kept_pair_fraction
        ),
        (Some(_), _) => println!("  pruning: off (dense attention)"),
        _ => println!("  pruning: no decay attention recognized (see foxc compile --explain)"),
    }

    let t0 = Instant::now();
    let (out, ms, extra) = match a.backend {
        BackendArg::Reference => {
            let r = foxc_ir::interp::run(&opt, &interp_inputs)
                .map_err(|e| Error::user(format!("error: reference interpreter: {e}")))?;
            let dtype = opt.output.map(|o| opt.ty(o).dtype).unwrap_or(foxc_ir::DType::F32);
            (tensors::from_interp(&r.output, dtype), t0.elapsed().as_secs_f64() * 1e3, String::new())
        }
        BackendArg::Cpu => {
            // Under --check every buffer starts as NaN, so an element no kernel writes shows up.
            let exec = foxc_runtime::cpu::ExecOptions {
                threads: foxc_runtime::cpu::default_threads(),
                poison: a.check,
            };
            let r = cpu_backend::run_with(&opt, &inputs, exec)?;
            (r.out, r.run_ms, format!(" (compile {:.1} ms)", r.compile_ms))
        }
        BackendArg::Cuda => {
            let r = cuda_backend::run(&opt, &inputs)?;
            (r.out, r.kernel_ms, " (GPU kernels, events)".to_string())
        }
    };
    let flops = stats.as_ref().map(|s| s.kept_flops).unwrap_or(0.0);
    if flops > 0.0 {
        let gflops = flops / ms / 1e6;
        let rate = if gflops >= 1e3 {
            format!("{:.1} TFLOP/s", gflops / 1e3)
        } else {
            format!("{gflops:.2} GFLOP/s")
        };
        println!("  time: {ms:.3} ms{extra}; kept work {:.3} GFLOP -> {rate}", flops / 1e9);
    } else {
        println!("  time: {ms:.3} ms{extra}");
    }
    let (sum, sum_abs) = tensors::checksum(&out);
    println!("  output out {} {:?}: sum {sum:.6e}, sum|x| {sum_abs:.6e}", out.dtype, out.shape);
    if !a.check {
        // (--check compares with the f64 reference instead, and names the rows that differ.)
        non_finite_from_finite(&inputs, &out)?;
    }
    if let Some(path) = &a.o {
        let mut m = TensorMap::new();
        m.insert("out".to_string(), out.clone());
        tensors::write(path, &m)?;
        println!("  wrote {}", path.display());
    }
    if a.check {
        let out64 = foxc_ir::interp::Tensor { shape: out.shape.clone(), data: out.to_f64_vec() };
        let tol = match backend {
            "reference" => check::reference_tolerance(&opt, &interp_inputs, out.dtype)?,
            _ => check::tolerance(backend, out.dtype),
        };
        let r =
            check::check(&c.graph, &opt, &interp_inputs, &out64, tol, opts.log_eps, backend_starts.as_ref())?;
        report_check(&r)?;
    }
    Ok(())
}

/// A NaN or infinity in the output when every input is finite means the arithmetic overflowed
/// (f32 holds magnitudes up to 3.4e38: q and k near 1e19 overflow their dot product) or a NaN
/// arose inside; the output is not a result, so the run fails rather than writing it.
fn non_finite_from_finite(inputs: &TensorMap, out: &HostTensor) -> Result<(), Error> {
    let bad = out.to_f32_vec().iter().filter(|x| !x.is_finite()).count();
    if bad == 0 {
        return Ok(());
    }
    let mut largest = 0.0f32;
    for t in inputs.values() {
        for x in t.to_f32_vec() {
            if !x.is_finite() {
                return Ok(()); // infinities in, infinities out: the reference decides (--check)
            }
            largest = largest.max(x.abs());
        }
    }
    Err(Error::user(format!(
        "error: the output holds {bad} NaN or infinite values of {} although every input is finite (largest |x| = {largest:.3e}): the f32 arithmetic overflowed or a NaN arose inside; scale the inputs down",
        out.numel()
    )))
}

/// Print a check report; a failed check is a user-visible error (exit 1) naming what failed.
pub(crate) fn report_check(r: &check::CheckReport) -> Result<(), Error> {
    for l in r.lines() {
        println!("  {l}");
    }
    if r.passed() {
        println!("  check: ok");
        Ok(())
    } else {
        Err(Error::user(format!("error: check failed: {}", r.failures.join("; "))))
    }
}

/// The block starts the GPU attention kernel found in-kernel (a debug run), checked against the
/// reference's ([`crate::starts_check`]): equal, or a near tie of the f32 threshold.
fn gpu_starts(
    opt: &foxc_ir::Graph,
    inputs: &foxc_runtime::TensorMap,
    interp_inputs: &std::collections::BTreeMap<String, foxc_ir::interp::Tensor>,
) -> Result<foxc_ir::interp::Tensor, Error> {
    let out = opt.output.ok_or_else(|| Error::user("error: the program has no output"))?;
    let outs = [("out".to_string(), foxc_ir::Value::of(out))];
    let mut m = crate::cuda_backend::run_debug_starts(opt, &outs, inputs, Default::default())?;
    let t = m.remove("debug_starts").ok_or_else(|| Error::internal("internal error: no debug starts"))?;
    let got = foxc_ir::interp::Tensor { shape: t.shape.clone(), data: t.to_f64_vec() };
    let r = crate::starts_check::compare(opt, interp_inputs, &got)?;
    println!(
        "  starts: {} of {} query tiles equal to the reference's, {} near ties of the f32 threshold, {} wrong",
        r.equal, r.tiles, r.near_ties, r.bad_count
    );
    if r.bad_count > 0 {
        return Err(Error::user(format!("error: the GPU kernel kept other tiles: {}", r.bad.join("; "))));
    }
    Ok(got)
}

/// The pruning rule's name as the user gave it.
fn rule_name(opts: &foxc_passes::PassOptions) -> String {
    opts.rule.name.clone()
}
