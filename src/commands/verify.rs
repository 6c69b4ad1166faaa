//! `foxc verify FILE --inputs in.safetensors --output out.safetensors [--tol X]`: check any
//! implementation's output (foxc's, FlexAttention's, ...) against the f64 reference with the
//! criterion of `--check` (driver/src/check.rs). Exit 1 beyond tolerance.

use crate::cli::VerifyArgs;
use foxc_driver::pipeline::{self, Source};
use foxc_driver::{check, tensors, Error, Target};
use foxc_ir::DType;

/// Default relative L2 tolerance for an output of `dtype` from an unknown implementation: f32
/// outputs as foxc's CPU backend (1e-5), 16-bit ones as its GPU backend (1e-2).
fn default_tol(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-5,
        _ => 1e-2,
    }
}

pub fn verify(a: &VerifyArgs) -> Result<(), Error> {
    let src = Source::read(&a.file)?;
    let c = src.compile()?;
    let inputs = tensors::read(&a.inputs)?;
    tensors::validate(&c.graph, &inputs)?;
    let outputs = tensors::read(&a.output)?;
    let out = outputs.get("out").ok_or_else(|| {
        let names: Vec<&String> = outputs.keys().collect();
        Error::user(format!("error: {} has no tensor named `out` (it has {names:?})", a.output.display()))
    })?;
    if let Some(t) = a.tol {
        if !(t.is_finite() && t > 0.0) {
            return Err(Error::user(format!("error: --tol must be a positive number, got {t}")));
        }
    }
    let tol = a.tol.unwrap_or_else(|| default_tol(out.dtype));
    let opts = pipeline::pass_options(&a.prune.options(), Target::Cpu, false)?;
    let (opt, _) = pipeline::optimize(&c.graph, &opts)?;
    let out64 = foxc_ir::interp::Tensor { shape: out.shape.clone(), data: out.to_f64_vec() };
    println!(
        "foxc verify: `out` {} {:?} of {} against the f64 reference of {} on {}",
        out.dtype,
        out.shape,
        a.output.display(),
        src.name,
        a.inputs.display()
    );
    let r = check::check(&c.graph, &opt, &tensors::to_interp(&inputs), &out64, tol, opts.log_eps, None)?;
    super::run::report_check(&r)
}
