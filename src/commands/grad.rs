//! `foxc grad`: the forward output and the gradient of every float parameter, given the
//! upstream gradient `dout` (from `--dout`, or seeded N(0, 1)), on a backend; `--check`
//! compares every gradient with the f64 interpreter running the same gradient program.

use crate::cli::{BackendArg, GradArgs, TargetArg};
use crate::pipeline::{self, parse_shape, Source};
use crate::{check, cpu_backend, cuda_backend, tensors, Error};
use foxc_ir::interp::{self, Tensor};
use foxc_ir::shapes::{bind_dims, concrete_shape};
use foxc_passes::grad::{gradient, GradError, GradProgram, DOUT};
use foxc_runtime::{HostTensor, TensorMap};
use std::collections::BTreeMap;
use std::time::Instant;

/// The gradient program of the optimized `graph` (also used by `foxc compile --emit grad`).
pub fn grad_program(opt: &foxc_ir::Graph) -> Result<GradProgram, Error> {
    gradient(opt).map_err(|e| match e {
        GradError::Unsupported(_) => Error::user(format!("error: {e}")),
        GradError::Internal(_) => Error::internal(format!("error: {e}")),
    })
}

/// The text of `foxc compile --emit grad`: the gradient program and its outputs.
pub fn emit_text(p: &GradProgram) -> String {
    let mut s = foxc_ir::print::print_graph(&p.graph);
    let order = p.graph.topo_order();
    let num = |n: foxc_ir::ValueId| order.iter().position(|&m| m == n).unwrap_or(usize::MAX);
    for (name, v) in &p.outputs {
        // `%n#r` for a result > 0, as the printer writes operands.
        let r = if v.result > 0 { format!("#{}", v.result) } else { String::new() };
        s.push_str(&format!("// output {name} = %{}{r}\n", num(v.node)));
    }
    s
}

pub fn grad(a: &GradArgs) -> Result<(), Error> {
    let src = Source::read(&a.file)?;
    let c = src.compile()?;
    let inputs = match (&a.inputs, &a.shape) {
        (Some(path), _) => tensors::read(path)?,
        (None, Some(shape)) => tensors::generate(&c.graph, &parse_shape(shape)?, a.seed)?,
        (None, None) => {
            return Err(Error::user(
                "error: `foxc grad FILE` needs --inputs FILE.safetensors or --shape B=..,H=..,T=..,D=..",
            ))
        }
    };
    tensors::validate(&c.graph, &inputs)?;
    let target = if a.backend == BackendArg::Cuda { TargetArg::Sm90a } else { TargetArg::Cpu };
    let mut opts = pipeline::pass_options(&a.prune, target, false)?;
    opts.dims = pipeline::bound_dims(&c.graph, &inputs)?;
    opts.gradient = true;
    let (opt, _) = pipeline::optimize(&c.graph, &opts)?;
    let program = grad_program(&opt)?;
    let g = &program.graph;

    // The upstream gradient: shaped and typed like the output.
    let mut interp_inputs = tensors::to_interp(&inputs);
    let (_, out_shape) = dout_type(&program, &c.graph, &inputs)?;
    let dout = match &a.dout {
        Some(path) => {
            let m = tensors::read(path)?;
            let t = m.get(DOUT).ok_or_else(|| {
                Error::user(format!("error: {} has no tensor named `{DOUT}`", path.display()))
            })?;
            if t.shape != out_shape {
                return Err(Error::user(format!(
                    "error: `{DOUT}` has shape {:?}, the output is {out_shape:?}",
                    t.shape
                )));
            }
            t.clone()
        }
        None => seeded_dout(&program, &c.graph, &inputs, a.seed)?,
    };
    interp_inputs.insert(DOUT.to_string(), Tensor { shape: dout.shape.clone(), data: dout.to_f64_vec() });

    let backend = match a.backend {
        BackendArg::Reference => "reference",
        BackendArg::Cpu => "cpu",
        BackendArg::Cuda => "cuda",
    };
    println!("foxc grad: {} on {backend}", src.name);
    let mut host_inputs = inputs.clone();
    host_inputs.insert(DOUT.to_string(), dout);
    let t0 = Instant::now();
    let results = match a.backend {
        BackendArg::Reference => reference(&program, &interp_inputs)?,
        BackendArg::Cpu => {
            let opts = foxc_runtime::cpu::ExecOptions {
                threads: foxc_runtime::cpu::default_threads(),
                poison: false,
            };
            cpu_backend::run_outputs(g, &program.outputs, &host_inputs, opts)?
        }
        BackendArg::Cuda => {
            cuda_backend::run_outputs(g, &program.outputs, &host_inputs, cuda_backend::RunOptions::default())?
        }
    };
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    println!("  time: {ms:.3} ms (forward + backward)");
    let mut m = TensorMap::new();
    for (name, _) in &program.outputs {
        let t = results
            .get(name)
            .ok_or_else(|| Error::internal(format!("error: output {name} was not computed")))?;
        let (sum, sum_abs) = tensors::checksum(t);
        println!("  {name:<12} {} {:?}: sum {sum:.6e}, sum|x| {sum_abs:.6e}", t.dtype, t.shape);
        m.insert(name.clone(), t.clone());
    }
    if let Some(path) = &a.o {
        tensors::write(path, &m)?;
        println!("  wrote {}", path.display());
    }
    if a.check {
        let reference = reference(&program, &interp_inputs)?;
        let mut failed = vec![];
        for (name, _) in &program.outputs {
            let (t, r) = (&m[name], &reference[name]);
            let (rel, max_abs) = check::rel_l2(&t.to_f64_vec(), &r.to_f64_vec());
            let tol = check::tolerance(backend, t.dtype);
            // A gradient is a sum over up to T terms per element (and dc a difference of two
            // such sums), accumulated in f32 in another order than the f64 reference: on the
            // CPU 1e-4 rather than the forward's 1e-5.
            let tol = if backend == "cpu" && name != "out" { tol.max(CPU_GRAD_TOL) } else { tol };
            let ok = rel <= tol;
            println!(
                "  check {name:<12} rel L2 {rel:.3e} (tol {tol:.1e}), max abs diff {max_abs:.3e}{}",
                if ok { "" } else { "  FAILED" }
            );
            if !ok {
                failed.push(name.clone());
            }
        }
        if !failed.is_empty() {
            return Err(Error::user(format!("error: check failed for {}", failed.join(", "))));
        }
        println!("  check: ok");
    }
    Ok(())
}

/// Relative L2 tolerance of a CPU gradient against the interpreter (see the check).
const CPU_GRAD_TOL: f64 = 1e-4;

/// The dtype and concrete shape of the upstream gradient `dout` of `program` (the gradient
/// program of `fwd`) for the shapes of `inputs`.
fn dout_type(
    program: &GradProgram,
    fwd: &foxc_ir::Graph,
    inputs: &TensorMap,
) -> Result<(foxc_ir::DType, Vec<usize>), Error> {
    let shapes: Vec<(String, Vec<usize>)> =
        inputs.iter().map(|(k, t)| (k.clone(), t.shape.clone())).collect();
    let dims = bind_dims(fwd, &shapes).map_err(|e| Error::user(format!("error: {e}")))?;
    let dout_param = program
        .graph
        .param(DOUT)
        .ok_or_else(|| Error::internal("error: the gradient program has no dout"))?;
    let shape = concrete_shape(&dout_param.ty, &dims).map_err(|e| Error::user(format!("error: {e}")))?;
    Ok((dout_param.ty.dtype, shape))
}

/// The default upstream gradient: N(0, 1) from `seed`, shaped and typed like the output.
pub fn seeded_dout(
    program: &GradProgram,
    fwd: &foxc_ir::Graph,
    inputs: &TensorMap,
    seed: u64,
) -> Result<HostTensor, Error> {
    let (dtype, shape) = dout_type(program, fwd, inputs)?;
    let mut rng = foxc_runtime::workload::Rng::for_param(seed, DOUT);
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|_| rng.normal() as f32).collect();
    Ok(HostTensor::from_f32_as(dtype, &shape, &v))
}

/// Every output of the gradient program through the f64 interpreter, in its node's dtype.
fn reference(
    p: &GradProgram,
    inputs: &BTreeMap<String, Tensor>,
) -> Result<BTreeMap<String, HostTensor>, Error> {
    // By value: an output may be a result > 0 of its node (a capture's gradient is one).
    let targets: Vec<foxc_ir::Value> = p.outputs.iter().map(|(_, v)| *v).collect();
    let vals = interp::eval_values(&p.graph, inputs, &targets)
        .map_err(|e| Error::user(format!("error: reference interpreter: {e}")))?;
    let mut out = BTreeMap::new();
    for (name, v) in &p.outputs {
        let t =
            vals.get(v).ok_or_else(|| Error::internal(format!("error: output {name} was not computed")))?;
        out.insert(name.clone(), tensors::from_interp(t, p.graph.value_ty(*v).dtype));
    }
    Ok(out)
}
