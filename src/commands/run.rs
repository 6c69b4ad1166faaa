//! `foxc run`: the main job. Compile, get inputs, run on a backend, report, optionally check.

use super::Given;
use crate::cli::RunArgs;
use foxc_driver::pipeline::{self, Source, DEFAULT_SHAPE};
use foxc_driver::{acp_stats, check, starts_check, tensors, BackendKind, Error, RunOptions, Timing};
use foxc_ir::Op;
use foxc_runtime::{HostTensor, TensorMap};

/// The run's source and inputs, and where the inputs came from (for the header line).
fn source_and_inputs(a: &RunArgs) -> Result<(Source, foxc_ir::frontend::Compiled, TensorMap, String), Error> {
    let src = match &a.file {
        Some(f) => Source::read(f)?,
        None => Source::embedded_default(),
    };
    let c = src.compile()?;
    // Without a file the embedded example runs at the default shape.
    let shape = a.shape.as_deref().or(a.file.is_none().then_some(DEFAULT_SHAPE));
    let given = Given::of(a.inputs.as_deref(), shape).ok_or_else(|| {
        Error::user("error: `foxc run FILE` needs --inputs FILE.safetensors or --shape B=..,H=..,T=..,D=..")
    })?;
    let inputs = given.tensors(&c.graph, a.seed)?;
    let origin = match given {
        Given::File(path) => format!("from {}", path.display()),
        Given::Standard(shape) => format!("standard workload {shape}, seed {}", a.seed),
    };
    Ok((src, c, inputs, origin))
}

pub fn run(a: &RunArgs) -> Result<(), Error> {
    let (src, c, inputs, origin) = source_and_inputs(a)?;
    tensors::validate(&c.graph, &inputs)?;
    let kind = a.backend;
    let backend = foxc_driver::backend(kind);
    let mut opts = pipeline::pass_options(&a.prune.options(), backend.target(), false)?;
    opts.dims = pipeline::bound_dims(&c.graph, &inputs)?;
    let (opt, _) = pipeline::optimize(&c.graph, &opts)?;
    // The statistics (and --check) come from the reference interpreter, which stops at 2^28
    // elements a tensor: beyond it the run reports no statistics (and the inputs are not copied
    // to f64 unless --check or --check-starts asks for the reference, which then says what is too
    // large).
    let beyond = acp_stats::beyond_reference(&inputs);
    let interp_inputs = if beyond.is_none() || a.check || a.check_starts {
        tensors::to_interp(&inputs)
    } else {
        Default::default()
    };

    println!("foxc run: {} on {} ({origin})", src.name, kind.name());
    for (name, t) in &inputs {
        println!("  input  {name:<8} {} {:?}", t.dtype, t.shape);
    }
    // The kept set the backend itself used: the CPU reports its block starts; the GPU kernel
    // reports its in-kernel starts only from a debug build (--check-starts, one more run, checked
    // against the reference's); otherwise the reference's stand in.
    if a.check_starts && a.backend != BackendKind::Cuda {
        return Err(Error::user(
            "error: --check-starts needs --backend cuda (the CPU's starts are always checked by --check)",
        ));
    }
    let backend_starts = if a.check_starts {
        Some(gpu_starts(&opt, &inputs, &interp_inputs)?)
    } else {
        backend.block_starts(&opt, &inputs)?
    };
    let kept_by = match (a.backend, &backend_starts) {
        (BackendKind::Cpu, Some(_)) => "the CPU kernels' block starts",
        (BackendKind::Cuda, Some(_)) => "the GPU kernel's in-kernel block starts (--check-starts)",
        (BackendKind::Cuda, _) => "the reference's block starts (the GPU kernel does not report its own)",
        _ => "the reference's block starts",
    };
    let stats = match &beyond {
        None => acp_stats::measure_with(&opt, &interp_inputs, backend_starts.as_ref())?,
        Some(_) => None,
    };
    let attn_op = acp_stats::attention_node(&opt).map(|n| opt.op(n));
    // The rule the graph's threshold uses: the one asked for, or the default where it does not
    // fit the score region (`--explain` says so).
    let rule = opt
        .find(|op| matches!(op, Op::Threshold { .. }))
        .first()
        .and_then(|&n| match opt.op(n) {
            Op::Threshold { rule, .. } => Some(rule.name.clone()),
            _ => None,
        })
        .unwrap_or_else(|| opts.rule.name.clone());
    match (&stats, attn_op) {
        (_, Some(_)) if beyond.is_some() => {
            println!("  pruning: not measured ({})", beyond.as_deref().unwrap_or_default())
        }
        (Some(s), Some(Op::Attention(at))) if at.prune != foxc_ir::Prune::Dense => println!(
            "  pruning: {rule} rule, ln eps = {}, tiles {}x{}: kept {:.3} of causal tiles, {:.3} of causal pairs (from {kept_by})",
            opts.log_eps, s.bm, s.bn, s.kept_tile_fraction, s.kept_pair_fraction
        ),
        (Some(_), _) => println!("  pruning: off (dense attention)"),
        _ => println!("  pruning: no decay attention recognized (see foxc compile --explain)"),
    }

    // Under --check every CPU buffer starts as NaN, so an element no kernel writes shows up.
    let r = backend.run(&opt, &[], &inputs, RunOptions { poison: a.check, allow_nan: false })?;
    let out =
        r.outputs.get("out").ok_or_else(|| Error::internal("internal error: the run lost its output"))?;
    print_time(r.ms, r.timing, stats.as_ref().map(|s| s.kept_flops).unwrap_or(0.0));
    let (sum, sum_abs) = tensors::checksum(out);
    println!("  output out {} {:?}: sum {sum:.6e}, sum|x| {sum_abs:.6e}", out.dtype, out.shape);
    if !a.check {
        // (--check compares with the f64 reference instead, and names the rows that differ.)
        non_finite_from_finite(&inputs, out)?;
    }
    if let Some(path) = &a.o {
        let mut m = TensorMap::new();
        m.insert("out".to_string(), out.clone());
        tensors::write(path, &m)?;
        println!("  wrote {}", path.display());
    }
    if a.check {
        let out64 = foxc_ir::interp::Tensor { shape: out.shape.clone(), data: out.to_f64_vec() };
        let tol = backend.check_tolerance(&opt, &interp_inputs, out.dtype)?;
        let r =
            check::check(&c.graph, &opt, &interp_inputs, &out64, tol, opts.log_eps, backend_starts.as_ref())?;
        report_check(&r)?;
    }
    Ok(())
}

/// The time line: how it was measured, and the rate on the kept work when there is any.
fn print_time(ms: f64, timing: Timing, flops: f64) {
    let extra = match timing {
        Timing::Wall => String::new(),
        Timing::Kernels { compile_ms } => format!(" (compile {compile_ms:.1} ms)"),
        Timing::GpuEvents => " (GPU kernels, events)".to_string(),
    };
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
/// reference's ([`starts_check`]): equal, or a near tie of the f32 threshold.
fn gpu_starts(
    opt: &foxc_ir::Graph,
    inputs: &TensorMap,
    interp_inputs: &std::collections::BTreeMap<String, foxc_ir::interp::Tensor>,
) -> Result<foxc_ir::interp::Tensor, Error> {
    let (got, r) = starts_check::gpu_starts(opt, inputs, interp_inputs)?;
    println!(
        "  starts: {} of {} query tiles equal to the reference's, {} near ties of the f32 threshold, {} wrong",
        r.equal, r.tiles, r.near_ties, r.bad_count
    );
    if r.bad_count > 0 {
        return Err(Error::user(format!("error: the GPU kernel kept other tiles: {}", r.bad.join("; "))));
    }
    Ok(got)
}
