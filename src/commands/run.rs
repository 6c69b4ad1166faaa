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
    let opts = pipeline::pass_options(&a.prune, target, false);
    let (opt, _) = pipeline::optimize(&c.graph, &opts)?;
    let interp_inputs = tensors::to_interp(&inputs);

    println!("foxc run: {} on {backend} ({origin})", src.name);
    for (name, t) in &inputs {
        println!("  input  {name:<8} {} {:?}", t.dtype, t.shape);
    }
    let stats = acp_stats::measure(&opt, &interp_inputs)?;
    let attn_op = acp_stats::attention_node(&opt).map(|n| opt.op(n));
    match (&stats, attn_op) {
        (Some(s), Some(Op::PrunedDecayAttention { .. })) => println!(
            "  pruning: {:?} rule, ln eps = {}, tiles {}x{}: kept {:.3} of causal tiles, {:.3} of causal pairs",
            opts.rule, opts.log_eps, s.bm, s.bn, s.kept_tile_fraction, s.kept_pair_fraction
        ),
        (Some(_), _) => println!("  pruning: off (dense decay attention)"),
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
            let r = cpu_backend::run(&opt, &inputs)?;
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
    if let Some(path) = &a.o {
        let mut m = TensorMap::new();
        m.insert("out".to_string(), out.clone());
        tensors::write(path, &m)?;
        println!("  wrote {}", path.display());
    }
    if a.check {
        report_check(&c.graph, &opt, &interp_inputs, &out, backend, opts.log_eps)?;
    }
    Ok(())
}

fn report_check(
    source: &foxc_ir::Graph,
    opt: &foxc_ir::Graph,
    inputs: &std::collections::BTreeMap<String, foxc_ir::interp::Tensor>,
    out: &HostTensor,
    backend: &str,
    log_eps: f64,
) -> Result<(), Error> {
    let out64 = foxc_ir::interp::Tensor { shape: out.shape.clone(), data: out.to_f64_vec() };
    let r = check::check(source, opt, inputs, &out64, backend, log_eps)?;
    let line = format!(
        "  check vs f64 reference ({}): rel L2 {:.3e} (tol {:.1e}), max abs diff {:.3e} (ACP bound {:.3e}), max pruned mass {:.3e} (eps {:.3e})",
        r.coverage,
        r.rel_l2,
        r.tolerance,
        r.max_abs_diff,
        r.acp_bound,
        r.max_pruned_mass,
        log_eps.exp()
    );
    println!("{line}");
    if r.passed {
        println!("  check: ok");
        Ok(())
    } else {
        Err(Error::user("error: check failed: the output is outside the tolerance of the reference"))
    }
}
