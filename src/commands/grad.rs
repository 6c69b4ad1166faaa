//! `foxc grad`: the forward output and the gradient of every float parameter, given the
//! upstream gradient `dout` (from `--dout`, or seeded N(0, 1)), on a backend; `--check`
//! compares every gradient with the f64 interpreter running the same gradient program.

use crate::cli::{BackendArg, GradArgs, TargetArg};
use crate::pipeline::{self, parse_shape, Source};
use crate::{check, tensors, Error};
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
        s.push_str(&format!("// output {name} = %{}\n", num(v.node)));
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
    let opts = pipeline::pass_options(&a.prune, target, false);
    let (opt, _) = pipeline::optimize(&c.graph, &opts)?;
    let program = grad_program(&opt)?;
    let g = &program.graph;

    // The upstream gradient: shaped and typed like the output.
    let mut interp_inputs = tensors::to_interp(&inputs);
    let shapes: Vec<(String, Vec<usize>)> =
        interp_inputs.iter().map(|(k, t)| (k.clone(), t.shape.clone())).collect();
    let dims = bind_dims(&c.graph, &shapes).map_err(|e| Error::user(format!("error: {e}")))?;
    let dout_param =
        g.param(DOUT).ok_or_else(|| Error::internal("error: the gradient program has no dout"))?;
    let out_shape = concrete_shape(&dout_param.ty, &dims).map_err(|e| Error::user(format!("error: {e}")))?;
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
        None => {
            let mut rng = foxc_runtime::workload::Rng::for_param(a.seed, DOUT);
            let n: usize = out_shape.iter().product();
            let v: Vec<f32> = (0..n).map(|_| rng.normal() as f32).collect();
            HostTensor::from_f32_as(dout_param.ty.dtype, &out_shape, &v)
        }
    };
    interp_inputs.insert(DOUT.to_string(), Tensor { shape: dout.shape.clone(), data: dout.to_f64_vec() });

    let backend = match a.backend {
        BackendArg::Reference => "reference",
        BackendArg::Cpu => "cpu",
        BackendArg::Cuda => "cuda",
    };
    if a.backend != BackendArg::Reference {
        return Err(Error::user(format!(
            "error: foxc grad --backend {backend}: the {backend} backward kernels are not built yet; use --backend reference"
        )));
    }
    println!("foxc grad: {} on {backend}", src.name);
    let t0 = Instant::now();
    let results = reference(&program, &interp_inputs)?;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    println!("  time: {ms:.3} ms (forward + backward)");
    let mut m = TensorMap::new();
    for (name, t) in &results {
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
        for (name, t) in &results {
            let r = &reference[name];
            let (rel, max_abs) = check::rel_l2(&t.to_f64_vec(), &r.to_f64_vec());
            let tol = check::tolerance(backend, t.dtype);
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

/// Every output of the gradient program through the f64 interpreter, in its node's dtype.
fn reference(
    p: &GradProgram,
    inputs: &BTreeMap<String, Tensor>,
) -> Result<BTreeMap<String, HostTensor>, Error> {
    let targets: Vec<foxc_ir::ValueId> = p.outputs.iter().map(|(_, v)| v.node).collect();
    let vals = interp::eval(&p.graph, inputs, &targets)
        .map_err(|e| Error::user(format!("error: reference interpreter: {e}")))?;
    let mut out = BTreeMap::new();
    for (name, v) in &p.outputs {
        let t = vals
            .get(&v.node)
            .ok_or_else(|| Error::internal(format!("error: output {name} was not computed")))?;
        out.insert(name.clone(), tensors::from_interp(t, p.graph.ty(v.node).dtype));
    }
    Ok(out)
}
