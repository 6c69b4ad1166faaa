//! `foxc grad`: the forward output and the gradient of every float parameter, given the
//! upstream gradient `dout` (from `--dout`, or seeded N(0, 1)), on a backend; `--check`
//! compares every gradient with the f64 interpreter running the same gradient program.

use super::Given;
use crate::cli::GradArgs;
use foxc_driver::grad::{dout_type, grad_program, seeded_dout};
use foxc_driver::pipeline::{self, Source};
use foxc_driver::{check, tensors, BackendKind, Error, RunOptions};
use foxc_passes::grad::{GradProgram, DOUT};
use foxc_runtime::{HostTensor, TensorMap};
use std::time::Instant;

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

/// The upstream gradient of `--dout`, shaped like the output, or seeded N(0, 1).
fn upstream(
    a: &GradArgs,
    program: &GradProgram,
    fwd: &foxc_ir::Graph,
    inputs: &TensorMap,
) -> Result<HostTensor, Error> {
    let Some(path) = &a.dout else { return seeded_dout(program, fwd, inputs, a.seed) };
    let (_, out_shape) = dout_type(program, fwd, inputs)?;
    let m = tensors::read(path)?;
    let t = m
        .get(DOUT)
        .ok_or_else(|| Error::user(format!("error: {} has no tensor named `{DOUT}`", path.display())))?;
    if t.shape != out_shape {
        return Err(Error::user(format!(
            "error: `{DOUT}` has shape {:?}, the output is {out_shape:?}",
            t.shape
        )));
    }
    Ok(t.clone())
}

pub fn grad(a: &GradArgs) -> Result<(), Error> {
    let src = Source::read(&a.file)?;
    let c = src.compile()?;
    let given = Given::of(a.inputs.as_deref(), a.shape.as_deref()).ok_or_else(|| {
        Error::user("error: `foxc grad FILE` needs --inputs FILE.safetensors or --shape B=..,H=..,T=..,D=..")
    })?;
    let inputs = given.tensors(&c.graph, a.seed)?;
    tensors::validate(&c.graph, &inputs)?;
    let kind = a.backend;
    let backend = foxc_driver::backend(kind);
    let mut opts = pipeline::pass_options(&a.prune.options(), backend.target(), false)?;
    opts.dims = pipeline::bound_dims(&c.graph, &inputs)?;
    opts.gradient = true;
    let (opt, _) = pipeline::optimize(&c.graph, &opts)?;
    let program = grad_program(&opt, backend.target())?;
    let g = &program.graph;
    // The upstream gradient: shaped and typed like the output.
    let dout = upstream(a, &program, &c.graph, &inputs)?;

    println!("foxc grad: {} on {}", src.name, kind.name());
    let mut host_inputs = inputs.clone();
    host_inputs.insert(DOUT.to_string(), dout);
    let t0 = Instant::now();
    let results = backend.run(g, &program.outputs, &host_inputs, RunOptions::default())?.outputs;
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
        check_grads(kind, &program, &host_inputs, &m)?;
    }
    Ok(())
}

/// `--check`: every output against the same gradient program through the f64 interpreter.
fn check_grads(
    kind: BackendKind,
    program: &GradProgram,
    inputs: &TensorMap,
    m: &TensorMap,
) -> Result<(), Error> {
    let reference = foxc_driver::backend(BackendKind::Reference);
    let run = |x: &TensorMap| reference.run(&program.graph, &program.outputs, x, RunOptions::default());
    let want = run(inputs)?.outputs;
    // On the GPU (bf16 operands) also the reference at inputs one ulp apart: how well each
    // gradient is conditioned (foxc_driver::grad::conditioned_tolerance).
    let apart = match kind {
        BackendKind::Cuda => Some(run(&foxc_driver::grad::one_ulp_apart(inputs, 1))?.outputs),
        _ => None,
    };
    let moved =
        |name: &str| apart.as_ref().map(|a| check::rel_l2(&a[name].to_f64_vec(), &want[name].to_f64_vec()).0);
    let moved_out = moved("out");
    let mut failed = vec![];
    for (name, _) in &program.outputs {
        let (t, r) = (&m[name], &want[name]);
        let (rel, max_abs) = check::rel_l2(&t.to_f64_vec(), &r.to_f64_vec());
        let mut tol = foxc_driver::grad::tolerance(kind, name, t.dtype);
        let mut why = String::new();
        if let (Some(mv), Some(mo)) = (moved(name), moved_out) {
            let cond = foxc_driver::grad::conditioned_tolerance(tol, mv, mo);
            if cond > tol {
                why = format!(
                    ": its reference moves {:.1}x as far as the output's at inputs one ulp apart",
                    mv / mo
                );
                tol = cond;
            }
        }
        let ok = rel <= tol;
        println!(
            "  check {name:<12} rel L2 {rel:.3e} (tol {tol:.1e}{why}), max abs diff {max_abs:.3e}{}",
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
    Ok(())
}
