//! `contract` (CPU target): a `sum` whose operand is a `mul` that it alone uses becomes
//! `sum {contract}` (docs/SEMANTICS.md): the CPU's loops read the mul's operands and never
//! write the product, so an unfused `sum(d, q * k)` costs `T*T` values, not `T*T*D`.
//!
//! The GPU targets keep every product a kernel of its own: their generic loops would read a
//! contracting sum through too (the plan is shared, `codegen/src/loop_plan.rs`), but their
//! kernels, and so their results, stay as they are.
//!
//! [`mark`] decides for the values a caller reads back: a product read back is materialized,
//! and a sum that no output needs is left alone. The pipeline decides for the graph's output;
//! the CPU backend's glue (the driver) decides again for the values it computes, since a
//! gradient program is built after the pipeline and its own products have no decision yet.

use crate::{PassContext, PassError, PassOptions};
use foxc_ir::{BinaryOp, Graph, Op, ReduceKind, Value, ValueId};

/// The `contract` pass.
pub fn run(g: &mut Graph, _opts: &PassOptions, _cx: &mut PassContext) -> Result<(), PassError> {
    mark(g, &[]);
    Ok(())
}

/// Sets `contract` on every `sum` of `g`: true exactly where the values `outputs` (empty: the
/// graph's output) need the sum, its operand is a `mul` of rank > 0 that nothing else uses,
/// and that mul is not one of the outputs.
pub fn mark(g: &mut Graph, outputs: &[Value]) {
    let roots = g.roots(outputs);
    let live = g.live_from(&roots);
    let sums = g.find(|op| matches!(op, Op::Reduce { kind: ReduceKind::Sum, .. }));
    let decided: Vec<(ValueId, bool)> = sums
        .into_iter()
        .map(|n| {
            let m = g.operands(n)[0];
            let reads_through = live.contains(&n)
                && matches!(g.op(m), Op::Binary(BinaryOp::Mul))
                && !roots.contains(&m)
                && g.users(m) == [n]
                && g.ty(m).rank() > 0;
            (n, reads_through)
        })
        .collect();
    for (n, c) in decided {
        if let Op::Reduce { contract, .. } = &mut g.node_mut(n).op {
            *contract = c;
        }
    }
}
