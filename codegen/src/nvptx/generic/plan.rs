//! From one graph node to a [`Generic`] kernel: the shared loop plan (`crate::loop_plan`, sizes
//! and strides as run-time scalar parameters) and the GPU's choice of threads per line.

use super::Generic;
use crate::loop_plan::{self, PlanError};
use crate::nvptx::CodegenError;
use foxc_ir::{Dim, Graph, Op, Value, ValueId};

/// A planned kernel and what its launch passes.
#[derive(Clone, Debug)]
pub(crate) struct Planned {
    pub kernel: Generic,
    /// The values read from memory, in pointer-parameter order (the result pointer follows).
    pub operands: Vec<Value>,
    /// The i64 scalar parameters, each the product of its dims.
    pub scalars: Vec<Vec<Dim>>,
    /// The iteration axes' sizes (the last is the line).
    pub sizes: Vec<Dim>,
}

/// Plans the kernel of node `n` (an op [`loop_plan::handles`] accepts). `folded(v)` is the
/// compile-time value of an operand that has no buffer (a folded scalar).
pub(crate) fn plan(
    g: &Graph,
    n: ValueId,
    folded: &dyn Fn(Value) -> Option<f64>,
) -> Result<Planned, CodegenError> {
    let op = g.op(n);
    // A `sum {contract}` reads its mul's operands, as on the CPU (the `contract` pass marks
    // sums for the CPU target only: on a GPU target every mul is its own kernel).
    let p = loop_plan::plan(g, n, folded).map_err(|e| match e {
        PlanError::Unsupported => {
            CodegenError::Unsupported { op: op.mnemonic().to_string(), node: n.index() }
        }
        PlanError::Invalid(what) => {
            CodegenError::Internal(format!("value %{} ({}): {what}", n.index(), op.mnemonic()))
        }
    })?;
    // A sum or cumsum along an axis that is not the operand's innermost: one thread per line.
    let serial = match op {
        Op::Reduce { axis, .. } | Op::Cumsum { axis, .. } => {
            let operand = g.operand_values(n)[0];
            g.value_ty(operand).axes.last().is_some_and(|last| last.name != *axis)
        }
        _ => false,
    };
    let kernel = Generic {
        serial,
        rank: p.sizes.len(),
        scalars: p.scalars.len(),
        inputs: p.inputs,
        out_dtype: g.ty(n).dtype,
        out_strides: p.out_strides,
        value: p.value,
        body: p.body,
    };
    Ok(Planned { kernel, operands: p.operands, scalars: p.scalars, sizes: p.sizes })
}
