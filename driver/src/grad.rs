//! Gradients: the gradient program of an optimized graph, its default upstream gradient and
//! the tolerance a backend's gradients are checked with.

use crate::{check, BackendKind, Error};
use foxc_ir::shapes::{bind_dims, concrete_shape};
use foxc_passes::grad::{gradient, gradient_from_saved, GradError, GradProgram, DOUT};
use foxc_runtime::{HostTensor, TensorMap};

/// Which gradient program of a forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GradKind {
    /// The forward recomputed inside it (`foxc grad`, the Python `attn.grad`).
    Recomputed,
    /// The forward's results given (torch autograd's backward of a saved forward:
    /// `passes::grad::gradient_from_saved`).
    Saved,
}

/// The gradient program of kind `kind` of `opt` (a graph optimized for `target`) for `target`,
/// what every caller runs (the CLI, the Python extension): the gradient pass, the gradient
/// program's own passes for the target ([`foxc_passes::fuse_grad::optimize_gradient`]), then
/// its elementwise values carry `fuse-loops`' decision for its outputs (the backends' glue
/// makes the same one again for the values a run computes).
pub fn gradient_program(
    opt: &foxc_ir::Graph,
    target: crate::Target,
    kind: GradKind,
) -> Result<GradProgram, GradError> {
    let mut p = match kind {
        GradKind::Recomputed => gradient(opt)?,
        GradKind::Saved => gradient_from_saved(opt)?,
    };
    foxc_passes::fuse_grad::optimize_gradient(&mut p, target);
    let outputs: Vec<foxc_ir::Value> = p.outputs.iter().map(|(_, v)| *v).collect();
    foxc_passes::fuse_loops::mark(&mut p.graph, &outputs);
    Ok(p)
}

/// The recomputing gradient program of `opt` for `target` ([`gradient_program`]; `foxc grad`,
/// `foxc compile --emit grad`), its errors the CLI's.
pub fn grad_program(opt: &foxc_ir::Graph, target: crate::Target) -> Result<GradProgram, Error> {
    gradient_program(opt, target, GradKind::Recomputed).map_err(|e| match e {
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

/// `inputs` with every bf16 and f16 tensor moved by up to one unit in the last place of its
/// dtype (`x (1 +- 2^-p)` rounded, `p` its mantissa bits: the upper half of each binade moves to
/// a neighbour, the lower half may round back), up or down by a coin from `seed` per element
/// (f32 and integer tensors as they are): the
/// precision at which a GPU kernel holds its operands (q, k, v, and the probabilities and
/// score gradients it forms from them, in bf16).
pub fn one_ulp_apart(inputs: &TensorMap, seed: u64) -> TensorMap {
    let mut out = TensorMap::new();
    for (name, t) in inputs {
        let ulp = match t.dtype {
            foxc_ir::DType::BF16 => 2f32.powi(-8),
            foxc_ir::DType::F16 => 2f32.powi(-11),
            _ => {
                out.insert(name.clone(), t.clone());
                continue;
            }
        };
        let mut rng = crate::workload::Rng::for_param(seed, name);
        let v: Vec<f32> = t
            .to_f32_vec()
            .into_iter()
            .map(|x| {
                // x (1 +- 2^-p) is within one ulp of x: it rounds to x or a neighbour.
                let s = if rng.next_u64() & 1 == 0 { 1.0 } else { -1.0 };
                x * (1.0 + s * ulp)
            })
            .collect();
        out.insert(name.clone(), HostTensor::from_f32_as(t.dtype, &t.shape, &v));
    }
    out
}

/// The tolerance of a GPU gradient conditioned worse than the forward output: `tol` (the
/// output's, [`tolerance`]) scaled by how much more the gradient's reference moves than the
/// output's (`moved`, `moved_out`: relative L2 between the references at the inputs and at inputs
/// one ulp apart, [`one_ulp_apart`]), beyond a factor 2. A sum of many terms that cancel (ALiBi's
/// slope gradient, `(t + 1) dc_t` over every position) carries the kernels' bf16 rounding of P
/// and dS amplified by its condition, which the output's tolerance does not allow for; the other
/// gradients move within 2x of the output and keep `tol`.
pub fn conditioned_tolerance(tol: f64, moved: f64, moved_out: f64) -> f64 {
    let ratio = moved / (2.0 * moved_out);
    if ratio.is_finite() && ratio > 1.0 {
        tol * ratio
    } else {
        tol
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// bf16 tensors move by at most one ulp per element (many by one), f32 ones not at all; the
    /// tolerance widens only for a gradient that moves more than twice as much as the output.
    #[test]
    fn one_ulp_apart_and_the_conditioned_tolerance() {
        let vals: Vec<f32> = (0..200).map(|i| (i as f32 - 100.0) * 0.37 + 0.01).collect();
        let mut m = TensorMap::new();
        m.insert("q".into(), HostTensor::from_f32_as(foxc_ir::DType::BF16, &[200], &vals));
        m.insert("g".into(), HostTensor::from_f32(&[200], &vals));
        let a = one_ulp_apart(&m, 3);
        assert_eq!(a["g"], m["g"]);
        let (x, y) = (m["q"].to_f32_vec(), a["q"].to_f32_vec());
        let moved = x.iter().zip(&y).filter(|(p, q)| p != q).count();
        assert!(moved > 50, "{moved} of 200 moved");
        for (p, q) in x.iter().zip(&y) {
            // One bf16 ulp of p: 2^(exponent - 7).
            let ulp = 2f32.powi(p.abs().log2().floor() as i32 - 7);
            assert!((p - q).abs() <= ulp, "{p} -> {q}");
        }
        // Within 2x of the output's movement: the plain tolerance; 4x: twice it.
        assert_eq!(conditioned_tolerance(1e-2, 1.5e-2, 1e-2), 1e-2);
        assert_eq!(conditioned_tolerance(1e-2, 4e-2, 1e-2), 2e-2);
        assert_eq!(conditioned_tolerance(1e-2, 4e-2, 0.0), 1e-2);
        assert_eq!(conditioned_tolerance(1e-2, f64::NAN, 1e-2), 1e-2);
    }
}
