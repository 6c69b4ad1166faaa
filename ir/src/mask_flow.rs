//! Does every use of a value pass through a causal mask over `(i, j)` before anything can see
//! the entries `j > i`?
//!
//! The front end accepts a subscript that leaves its axis where `j > i` (`rel[h, i - j]`) only
//! when this holds for the `gather` that reads it: the interpreter reads NaN there, and the mask
//! replaces exactly those entries by `-inf`. The walk follows the value through elementwise ops
//! (the entry `(i, j)` stays the entry `(i, j)`) and through statement boundaries (`store` then
//! `bind` renames the axes), and stops with success at
//! - `causal {i, j}` or `window {i, j, ..}` over the two axes, or
//! - `select(j <= i, value, -inf)` (also spelled `i >= j`, `j < i + 1`, or `select(j > i, -inf,
//!   value)`), or with queries at the end of longer keys `select(j <= i + M - N, value, -inf)`
//!   (the offset is the axes' sizes' difference).
//!
//! It fails when the value reaches the program's result, a reduction, scan, softmax or norm over
//! `i` or `j`, or any other op (conservatively) first.

use crate::graph::{Graph, ValueId};
use crate::index_range::Lin;
use crate::ops::{BinaryOp, Op, UnaryOp};
use crate::types::Dim;
use crate::types::Span;
use std::collections::HashSet;

/// Where and why a value escapes its mask.
#[derive(Clone, Debug, PartialEq)]
pub struct Escape {
    pub reason: String,
    pub span: Span,
}

/// Check that every path from `node` (with axes `i`, `j`) to a result is masked.
pub fn check_masked(g: &Graph, node: ValueId, i: &str, j: &str) -> Result<(), Escape> {
    let mut seen = HashSet::new();
    walk(g, node, i.to_string(), j.to_string(), &mut seen)
}

fn is_neg_inf(g: &Graph, v: ValueId) -> bool {
    match g.op(v) {
        Op::Const(c) => *c == f64::NEG_INFINITY,
        Op::Unary(UnaryOp::Neg) => matches!(g.op(g.operands(v)[0]), Op::Const(c) if *c == f64::INFINITY),
        _ => false,
    }
}

/// Node `v` as `iota(axis) + offset` (the offset a form of dims and integer constants), with the
/// axis' size.
fn iota_plus(g: &Graph, v: ValueId) -> Option<(&str, Dim, Lin)> {
    let o = g.operands(v);
    match g.op(v) {
        Op::Iota { axis } => Some((axis, g.ty(v).axis(axis)?.1.dim.clone(), Lin::konst(0))),
        Op::Binary(BinaryOp::Add) => match (iota_plus(g, o[0]), iota_plus(g, o[1])) {
            (Some((a, d, x)), None) => Some((a, d, x.plus(&dims_of(g, o[1])?))),
            (None, Some((a, d, x))) => Some((a, d, x.plus(&dims_of(g, o[0])?))),
            _ => None,
        },
        Op::Binary(BinaryOp::Sub) => {
            let (a, d, x) = iota_plus(g, o[0])?;
            Some((a, d, x.minus(&dims_of(g, o[1])?)))
        }
        _ => None,
    }
}

/// Node `v` as a form of dims and integer constants (`M - N`).
fn dims_of(g: &Graph, v: ValueId) -> Option<Lin> {
    let o = g.operands(v);
    match g.op(v) {
        Op::DimSize(d) => Some(Lin::dim(d)),
        Op::Const(c) if c.fract() == 0.0 && c.abs() < 9.0e15 => Some(Lin::konst(*c as i64)),
        Op::Binary(BinaryOp::Add) => Some(dims_of(g, o[0])?.plus(&dims_of(g, o[1])?)),
        Op::Binary(BinaryOp::Sub) => Some(dims_of(g, o[0])?.minus(&dims_of(g, o[1])?)),
        Op::Unary(UnaryOp::Neg) => Some(dims_of(g, o[0])?.scaled(-1)),
        _ => None,
    }
}

/// `keep` is true when the condition holds exactly where `j <= i + size(j) - size(i)` (the
/// causal mask, with queries at the end of longer keys: `j <= i + M - N`), false where it
/// fails.
fn causal_condition(g: &Graph, cond: ValueId, i: &str, j: &str) -> Option<bool> {
    let Op::Binary(b) = g.op(cond) else { return None };
    let o = g.operands(cond);
    let ((x, dx, ox), (y, dy, oy)) = (iota_plus(g, o[0])?, iota_plus(g, o[1])?);
    // As `j - i OP k`, over the integers.
    let (op, k, (di, dj)) = if x == j && y == i {
        (*b, oy.minus(&ox), (dy, dx))
    } else if x == i && y == j {
        (b.swapped()?, ox.minus(&oy), (dx, dy))
    } else {
        return None;
    };
    let shift = Lin::dim(&dj).minus(&Lin::dim(&di));
    let one = Lin::konst(1);
    match op {
        // `j <= i + k`, `j < i + k` (= `j <= i + k - 1`): kept below the diagonal.
        BinaryOp::Le if k == shift => Some(true),
        BinaryOp::Lt if k.minus(&one) == shift => Some(true),
        // `j > i + k`, `j >= i + k` (= `j > i + k - 1`): the entries above it.
        BinaryOp::Gt if k == shift => Some(false),
        BinaryOp::Ge if k.minus(&one) == shift => Some(false),
        _ => None,
    }
}

fn walk(
    g: &Graph,
    v: ValueId,
    i: String,
    j: String,
    seen: &mut HashSet<(ValueId, String, String)>,
) -> Result<(), Escape> {
    if !seen.insert((v, i.clone(), j.clone())) {
        return Ok(());
    }
    let escape = |reason: String, at: ValueId| Err(Escape { reason, span: g.node(at).span });
    if g.output == Some(v) {
        return escape("it reaches the program's result".into(), v);
    }
    for u in g.users(v) {
        let ops = g.operands(u);
        match g.op(u) {
            Op::Causal { i: ci, j: cj } | Op::Window { i: ci, j: cj, .. } if *ci == i && *cj == j => continue,
            Op::Select => {
                let keep = causal_condition(g, ops[0], &i, &j);
                let masked = match keep {
                    Some(true) => ops[1] == v && ops[0] != v && ops[2] != v && is_neg_inf(g, ops[2]),
                    Some(false) => ops[2] == v && ops[0] != v && ops[1] != v && is_neg_inf(g, ops[1]),
                    None => false,
                };
                if masked {
                    continue;
                }
                if ops[0] == v {
                    return escape("it is used as a condition".into(), u);
                }
                walk(g, u, i.clone(), j.clone(), seen)?;
            }
            Op::Unary(_) | Op::Binary(_) | Op::Cast | Op::Causal { .. } | Op::Window { .. } => {
                walk(g, u, i.clone(), j.clone(), seen)?
            }
            Op::Reduce { axis, .. }
            | Op::Cumsum { axis, .. }
            | Op::Softmax { axis }
            | Op::RmsNorm { axis, .. } => {
                if *axis == i || *axis == j {
                    return escape(
                        format!("`{}` over `{axis}` combines its entries first", g.op(u).mnemonic()),
                        u,
                    );
                }
                walk(g, u, i.clone(), j.clone(), seen)?;
            }
            Op::Store { axes } => {
                let (pi, pj) = match (axes.iter().position(|a| *a == i), axes.iter().position(|a| *a == j)) {
                    (Some(a), Some(b)) => (a, b),
                    _ => return escape("it is stored without its axes".into(), u),
                };
                if g.output == Some(u) {
                    return escape("it reaches the program's result".into(), u);
                }
                for w in g.users(u) {
                    match g.op(w) {
                        Op::Bind { axes } => walk(g, w, axes[pi].clone(), axes[pj].clone(), seen)?,
                        _ if g.output == Some(w) => {
                            return escape("it reaches the program's result".into(), w)
                        }
                        op => return escape(format!("`{}` reads it before a mask", op.mnemonic()), w),
                    }
                }
            }
            op => return escape(format!("`{}` reads it before a mask", op.mnemonic()), u),
        }
    }
    Ok(())
}
