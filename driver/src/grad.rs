//! Gradients: the gradient program of an optimized graph, its default upstream gradient and
//! the tolerance a backend's gradients are checked with.

use crate::{check, BackendKind, Error};
use foxc_ir::shapes::{bind_dims, concrete_shape};
use foxc_passes::grad::{gradient, GradError, GradProgram, DOUT};
use foxc_runtime::{HostTensor, TensorMap};

/// The gradient program of the optimized `graph` (`foxc grad`, `foxc compile --emit grad`).
pub fn grad_program(opt: &foxc_ir::Graph) -> Result<GradProgram, Error> {
    gradient(opt).map_err(|e| match e {
        GradError::Unsupported(_) => Error::user(format!("error: {e}")),
        GradError::Internal(_) => Error::internal(format!("error: {e}")),
    })
}

/// Relative L2 tolerance of a CPU gradient against the interpreter (see [`tolerance`]).
const CPU_GRAD_TOL: f64 = 1e-4;

/// Relative L2 tolerance of the output `name` of a gradient program on `backend`.
pub fn tolerance(backend: BackendKind, name: &str, dtype: foxc_ir::DType) -> f64 {
    let tol = check::tolerance(backend.name(), dtype);
    // A gradient is a sum over up to T terms per element (and dc a difference of two such
    // sums), accumulated in f32 in another order than the f64 reference: on the CPU 1e-4 rather
    // than the forward's 1e-5.
    if backend == BackendKind::Cpu && name != "out" {
        tol.max(CPU_GRAD_TOL)
    } else {
        tol
    }
}

/// The dtype and concrete shape of the upstream gradient `dout` of `program` (the gradient
/// program of `fwd`) for the shapes of `inputs`.
pub fn dout_type(
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
    let mut rng = crate::workload::Rng::for_param(seed, DOUT);
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|_| rng.normal() as f32).collect();
    Ok(HostTensor::from_f32_as(dtype, &shape, &v))
}
