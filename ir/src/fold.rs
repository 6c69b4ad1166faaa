//! Compile-time values of scalar subgraphs once the symbolic dims are known.
//!
//! The passes keep `1/sqrt(D)` symbolic (`rsqrt(dim D)`), since D is bound only at run time.
//! A backend that specializes a kernel on concrete dims folds such scalars into the kernel here,
//! with one definition of the arithmetic for every backend.

use crate::graph::{Graph, ValueId};
use crate::ops::{BinaryOp, Op, UnaryOp};
use std::collections::BTreeMap;

/// `op(x)` in f64, as the interpreter defines it.
pub fn unary(u: UnaryOp, x: f64) -> f64 {
    match u {
        UnaryOp::Neg => -x,
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Rsqrt => 1.0 / x.sqrt(),
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        UnaryOp::LogSigmoid => x.min(0.0) - (-x.abs()).exp().ln_1p(),
        UnaryOp::Softplus => x.max(0.0) + (-x.abs()).exp().ln_1p(),
        UnaryOp::Relu => x.max(0.0),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Abs => x.abs(),
        UnaryOp::Exp2 => x.exp2(),
        UnaryOp::Log2 => x.log2(),
    }
}

/// `x op y` in f64 for the arithmetic ops (comparisons give `None`: they are not numbers).
pub fn binary(b: BinaryOp, x: f64, y: f64) -> Option<f64> {
    Some(match b {
        BinaryOp::Add => x + y,
        BinaryOp::Sub => x - y,
        BinaryOp::Mul => x * y,
        BinaryOp::Div => x / y,
        BinaryOp::Min => x.min(y),
        BinaryOp::Max => x.max(y),
        _ => return None,
    })
}

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
        Op::Unary(u) => Some(unary(*u, arg(0)?)),
        Op::Binary(b) => binary(*b, arg(0)?, arg(1)?),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
