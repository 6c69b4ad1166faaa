//! Compile-time values of scalar subgraphs once the symbolic dims are known.
//!
//! The passes keep `1/sqrt(D)` symbolic (`rsqrt(dim D)`), since D is bound only at run time.
//! A backend that specializes a kernel on concrete dims folds such scalars into the kernel here,
//! with the interpreter's arithmetic (the one definition of every op).

use crate::graph::{Graph, ValueId};
use crate::interp;
use crate::ops::Op;
use std::collections::{BTreeMap, HashMap};

/// The value of the rank-0 value `v` when it depends only on constants and dims in `dims`.
///
/// Each node is folded once (a scalar used twice, `a2 = a1 + a1`, is not folded twice: a chain
/// of such statements would otherwise take time exponential in its length).
pub fn scalar_value(g: &Graph, v: ValueId, dims: &BTreeMap<String, u64>) -> Option<f64> {
    fold(g, v, dims, &mut HashMap::new())
}

fn fold(
    g: &Graph,
    v: ValueId,
    dims: &BTreeMap<String, u64>,
    memo: &mut HashMap<ValueId, Option<f64>>,
) -> Option<f64> {
    if let Some(&x) = memo.get(&v) {
        return x;
    }
    let node = g.node(v);
    let x = if node.ty.rank() != 0 {
        None
    } else {
        let ops = g.operands(v);
        let mut arg = |i: usize| ops.get(i).and_then(|&o| fold(g, o, dims, memo));
        match &node.op {
            Op::Const(c) => Some(*c),
            Op::DimSize(d) => d.eval(&|s| dims.get(s).copied()).map(|x| x as f64),
            Op::Unary(u) => arg(0).map(|a| interp::unary(*u, a)),
            // A comparison is a bool, not a number to fold into a kernel.
            Op::Binary(b) if !b.is_comparison() => match (arg(0), arg(1)) {
                (Some(a), Some(c)) => Some(interp::binary(*b, a, c)),
                _ => None,
            },
            _ => None,
        }
    };
    memo.insert(v, x);
    x
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{BinaryOp, UnaryOp};
    use crate::types::{DType, Dim, Span, ValueType};

    /// `a_{k+1} = a_k + a_k`, 64 deep: 2^64 visits without the memo (the fuzzer's hang).
    #[test]
    fn a_shared_chain_folds_in_linear_time() {
        let mut g = Graph::new("t");
        let s = ValueType::scalar(DType::F32);
        let mut a = g.add(Op::Const(1.0), s.clone(), &[], Span::default());
        for _ in 0..64 {
            a = g.add(Op::Binary(BinaryOp::Add), s.clone(), &[a, a], Span::default());
        }
        assert_eq!(scalar_value(&g, a, &BTreeMap::new()), Some(2f64.powi(64)));
    }

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
