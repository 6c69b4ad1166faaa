//! What `foxc check` says beyond the diagnostics: whether the GPU backend can compile the
//! program (forward, and the backward that training runs) with its dims unbound, the same way
//! `run --backend cuda` and `grad --backend cuda` would. The CPU backend and the reference run
//! every program the front end accepts; the GPU refuses some (an f16 output of bf16 operands, gradients of
//! captured tensors of other shapes than `[B, H, T]`), and the user should learn that at check
//! time, not at the first GPU run.

use crate::grad::grad_program;
use crate::{cuda_backend, pipeline, Error, PruneOptions, Target};
use foxc_ir::Graph;

/// One path that cannot run the program, and why (the error that path gives).
#[derive(Clone, Debug, PartialEq)]
pub struct Unsupported {
    /// `"forward"` or `"backward"`.
    pub path: &'static str,
    /// Only the GPU backend refuses (else: no backend can, e.g. a gradient with no rule).
    pub gpu_only: bool,
    pub reason: String,
}

/// The largest program (IR nodes) that `foxc check` compiles for the GPU: code generation is
/// linear in the program but not free (a 200-statement DAG takes seconds in a debug build, a
/// 7000-statement chain a minute), and a check should answer at once.
pub const GPU_CHECK_MAX_NODES: usize = 400;

/// What [`gpu_unsupported`] found.
#[derive(Clone, Debug, PartialEq)]
pub enum GpuSupport {
    /// The refusals, empty when both paths compile.
    Checked(Vec<Unsupported>),
    /// Not compiled: the program has this many IR nodes (over [`GPU_CHECK_MAX_NODES`]).
    TooLarge(usize),
}

/// The paths (forward, backward) that cannot compile `g` for the GPU `target`; empty when
/// both can. Sizes stay symbolic except the head dim, which the GPU kernels specialize on
/// ([`pipeline::DEFAULT_CODEGEN_D`] unless the program fixes it): a path refused only at
/// some sizes (a head dim the kernels do not take) is refused when it runs, with that said.
pub fn gpu_support(g: &Graph, target: Target) -> GpuSupport {
    let nodes = g.g.node_count();
    if nodes > GPU_CHECK_MAX_NODES {
        return GpuSupport::TooLarge(nodes);
    }
    GpuSupport::Checked(gpu_unsupported(g, target))
}

/// The refusals of [`gpu_support`], whatever the program's size.
pub fn gpu_unsupported(g: &Graph, target: Target) -> Vec<Unsupported> {
    let reason = |e: Error| e.to_string().trim_start_matches("error: ").to_string();
    let dims = pipeline::codegen_dims(None);
    let optimized = |gradient: bool| -> Result<Graph, Error> {
        let mut opts = pipeline::pass_options(&PruneOptions::default(), target, false)?;
        opts.gradient = gradient;
        Ok(pipeline::optimize(g, &opts)?.0)
    };
    let mut out = vec![];
    if let Err(e) = optimized(false).and_then(|opt| cuda_backend::compile(&opt, &dims, target)) {
        out.push(Unsupported { path: "forward", gpu_only: true, reason: reason(e) });
        return out;
    }
    let program = match optimized(true).and_then(|opt| grad_program(&opt, target)) {
        Ok(p) => p,
        Err(e) => {
            out.push(Unsupported { path: "backward", gpu_only: false, reason: reason(e) });
            return out;
        }
    };
    let outputs: Vec<_> = program.outputs.iter().map(|(_, v)| *v).collect();
    if let Err(e) = cuda_backend::compile_outputs(&program.graph, &outputs, &dims, target) {
        out.push(Unsupported { path: "backward", gpu_only: true, reason: reason(e) });
    }
    out
}
