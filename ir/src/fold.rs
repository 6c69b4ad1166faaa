//! Compile-time values of scalar subgraphs once the symbolic dims are known.
//!
//! The passes keep `1/sqrt(D)` symbolic (`rsqrt(dim D)`), since D is bound only at run time.
//! A backend that specializes a kernel on concrete dims folds such scalars into the kernel here,
//! with the interpreter's arithmetic (the one definition of every op).

use crate::graph::{Graph, ValueId};
use crate::interp;
use crate::ops::Op;
use std::collections::BTreeMap;

/// The value of the rank-0 value `v` when it depends only on constants and dims in `dims`.
pub fn scalar_value(g: &Graph, v: ValueId, dims: &BTreeMap<String, u64>) -> Option<f64> {
    let node = g.node(v);
    if node.ty.rank() != 0 {
        return None;
    }
    let ops = g.operands(v);
    let arg = |i: usize| ops.get(i).and_then(|&o| scalar_value(g, o, dims));
    match &node.op {
        Op::Const(c) => Some(*c),
        Op::DimSize(d) => d.eval(&|s| dims.get(s).copied()).map(|x| x as f64),
        Op::Unary(u) => Some(interp::unary(*u, arg(0)?)),
        // A comparison is a bool, not a number to fold into a kernel.
        Op::Binary(b) if !b.is_comparison() => Some(interp::binary(*b, arg(0)?, arg(1)?)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{BinaryOp, UnaryOp};
    use crate::types::{DType, Dim, Span, ValueType};

    #[test]
    fn rsqrt_of_a_bound_dim_folds_and_an_unbound_one_does_not() {
        let mut g = Graph::new("t");
        let d = g.add(Op::DimSize(Dim::sym("D")), ValueType::scalar(DType::F32), &[], Span::default());
        let r = g.add(Op::Unary(UnaryOp::Rsqrt), ValueType::scalar(DType::F32), &[d], Span::default());
        let two = g.add(Op::Const(2.0), ValueType::scalar(DType::F32), &[], Span::default());
        let m = g.add(Op::Binary(BinaryOp::Mul), ValueType::scalar(DType::F32), &[r, two], Span::default());
        let dims: BTreeMap<String, u64> = [("D".to_string(), 64)].into();
        assert_eq!(scalar_value(&g, m, &dims), Some(0.25));
        assert_eq!(scalar_value(&g, m, &BTreeMap::new()), None);
        let lt = g.add(Op::Binary(BinaryOp::Lt), ValueType::scalar(DType::Bool), &[r, two], Span::default());
        assert_eq!(scalar_value(&g, lt, &dims), None);
    }
}
