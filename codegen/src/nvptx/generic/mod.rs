//! Plain GPU loops for every op that is not a fused kernel: elementwise math with broadcasting
//! by axis name, select, comparisons, iota, constants and dims, masks, bind/store layout
//! changes, casts, gathers at index expressions, reductions (sum, max), cumsum, softmax and
//! rmsnorm along an axis.
//!
//! The GPU counterpart of `cpu/generic` (the same iteration-space model), slow but right: one
//! kernel per node, math in f32 (the attention region's own f32 functions, `attention/region.rs`),
//! storage in f32, bf16, f16, i32 or bool (one byte, 0 or 1). Semantics are the interpreter's
//! (`foxc_ir::interp`): NaN propagates through min/max, comparisons give 1/0, `select` takes its
//! first branch where the condition is non-zero, a gather outside its operand reads NaN.
//!
//! Unlike the CPU loops, sizes stay runtime values (the Python path compiles once per head
//! dimension, not per shape): every axis size and stride is a product of dims, passed as an i64
//! kernel argument ([`Planned::scalars`]).
//!
//! Layout: a kernel iterates an *iteration space*, named axes whose last one is the *line* (the
//! axis of a cumsum, softmax or rmsnorm, the reduced axis of a sum, else the result's last axis).
//! `Map` kernels give each thread 4 consecutive elements (reading the result's layout at the
//! flat index);
//! line kernels one warp per line, parallel enough for `[B, H]` lines of length `T`, or one
//! thread per line when the line runs across the operand's innermost axis (coalesced, and fine
//! for short lines such as a sum over `B`). Either way the order of a reduction is fixed: the
//! same bits on every run.
//! Every buffer has one stride per iteration axis (0 where it lacks the axis: broadcast); a name
//! repeated in a `bind` sums its strides (a diagonal).

mod emit;
mod plan;

pub(crate) use crate::loop_plan::handles;
pub(crate) use crate::loop_plan::{Body, Expr, Src};
pub(crate) use emit::build;
pub(crate) use plan::plan;

use foxc_ir::DType;

/// Threads per block of the elementwise (`Map`) kernels.
pub(crate) const MAP_THREADS: u32 = 256;
/// Consecutive elements per thread of a `Map` kernel (blocks cover `MAP_THREADS * MAP_ELEMS`).
pub(crate) const MAP_ELEMS: u32 = 4;
/// Threads per block of the line kernels: one warp per line.
pub(crate) const LINE_THREADS: u32 = 128;
/// Lines per block of the line kernels in warp mode.
pub(crate) const LINES_PER_BLOCK: u32 = LINE_THREADS / 32;

/// One generic kernel. Parameters: a pointer per `Buf`/`Gather` input (in input order), the
/// result pointer, then the i64 scalars: the `rank` axis sizes first, then the rest.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Generic {
    /// Number of iteration axes (at least 1); the last is the line.
    pub rank: usize,
    pub inputs: Vec<Src>,
    pub out_dtype: DType,
    /// Scalar parameters summing to the result's stride along each iteration axis (empty along
    /// a reduced line).
    pub out_strides: Vec<Vec<usize>>,
    pub value: Expr,
    pub body: Body,
    /// Number of i64 scalar parameters.
    pub scalars: usize,
    /// A line kernel with one thread per line (serial along it) instead of one warp: for a
    /// sum or cumsum along an axis that is not the operand's innermost, where neighbouring
    /// lines are neighbours in memory (coalesced) and lines may be short (a sum over `B`).
    pub serial: bool,
}

impl Generic {
    /// Lines per block of a line kernel (blocks of [`LINE_THREADS`]).
    pub(crate) fn lines_per_block(&self) -> u32 {
        if self.serial {
            LINE_THREADS
        } else {
            LINES_PER_BLOCK
        }
    }

    /// Pointer parameters (inputs read from memory, then the result).
    pub(crate) fn pointers(&self) -> usize {
        self.inputs.iter().filter(|s| !matches!(s, Src::Const(_))).count() + 1
    }

    /// Whether input `i` is laid out like the result (the same strides along every axis): a
    /// `Map` kernel reads it at the flat element index, no coordinates needed.
    pub(crate) fn flat_input(&self, i: usize) -> bool {
        matches!(&self.inputs[i], Src::Buf { strides, .. } if *strides == self.out_strides)
    }

    /// Whether a `Map` kernel needs the element's coordinates: an index, a mask, a gather, or an
    /// input laid out otherwise than the result (broadcast, transposed). Without them the
    /// kernel skips the per-axis 64-bit divisions.
    pub(crate) fn needs_coords(&self) -> bool {
        fn uses_index(e: &Expr) -> bool {
            match e {
                Expr::Index(_) | Expr::Mask { .. } => true,
                Expr::In(_) | Expr::Const(_) | Expr::Scalar(_) => false,
                Expr::Unary(_, x) | Expr::Cast(_, x) => uses_index(x),
                Expr::Binary(_, x, y) => uses_index(x) || uses_index(y),
                Expr::Select(c, x, y) => uses_index(c) || uses_index(x) || uses_index(y),
            }
        }
        uses_index(&self.value)
            || (0..self.inputs.len()).any(|i| !matches!(self.inputs[i], Src::Const(_)) && !self.flat_input(i))
    }
}
