//! Plain compiled loops for every op that is not a fused kernel: elementwise math, reductions,
//! cumsum, softmax, masks, rmsnorm on any axis, bind/store layout changes and casts.
//!
//! Slow but right: each node becomes one Cranelift function that walks the node's full index
//! space in f64 (results are rounded to their dtype when stored), with the interpreter's
//! semantics (`foxc_ir::interp` is the reference: NaN propagation, `-inf` masking, fully masked
//! softmax rows give zeros, comparisons give 1/0). Transcendental functions and casts call the
//! interpreter's own scalar functions through [`math`], so there is one definition of the math.
//!
//! Layout: the loop nest of `crate::loop_plan` (shared with the GPU loops), an *iteration
//! space* of named axes whose last axis is the *line*, with every size and stride evaluated here
//! from the bound dims and compiled in as a constant. One task is one line.
//!
//! One lowering choice mirrors the interpreter: a `mul` whose only user is a `sum` is not
//! materialized; the sum reads the mul's operands (`sum(d, q * k)` costs `T*T`, not `T*T*D`).

mod emit;
pub mod math;

pub use emit::emit;

use super::CpuError;
use crate::loop_plan::{self, PlanError};
pub use crate::loop_plan::{Body, Expr};
use foxc_ir::{DType, Dim, Graph, Op, Value, ValueId};
use std::collections::{BTreeMap, HashMap};

/// Where one kernel input comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum Src {
    /// A buffer passed in `args[arg]`, read with one element stride per iteration axis.
    Buf { arg: usize, dtype: DType, strides: Vec<i64> },
    /// A scalar folded at compile time (its `args` slot holds 0 and is never read).
    Const(f64),
    /// `gather`: a positional buffer read at computed subscripts, one per buffer axis (`sizes`,
    /// row-major `strides`); a subscript outside `[0, size)` reads NaN.
    Gather { arg: usize, dtype: DType, subs: Vec<Sub>, sizes: Vec<u64>, strides: Vec<i64> },
}

/// One subscript of a gather: `floor((constant + sum coef * index[axis]) / div)`, `axis` an
/// iteration axis, `div` a positive constant when present.
#[derive(Clone, Debug, PartialEq)]
pub struct Sub {
    pub terms: Vec<(usize, i64)>,
    pub constant: i64,
    pub div: Option<i64>,
    /// After the division, in order.
    pub clamps: Vec<(foxc_ir::index::ClampKind, i64)>,
}

/// One generic kernel, every size a compile-time constant.
#[derive(Clone, Debug, PartialEq)]
pub struct Generic {
    /// Sizes of the iteration axes; the last one is the line.
    pub sizes: Vec<u64>,
    pub inputs: Vec<Src>,
    /// `args` slot, dtype and strides of the result (stride 0 along a reduced line).
    pub out_arg: usize,
    pub out_dtype: DType,
    pub out_strides: Vec<i64>,
    pub value: Expr,
    pub body: Body,
    /// The values of the plan's scalars, which [`Expr::Scalar`] reads (an unfolded `dim`).
    pub scalars: Vec<u64>,
}

/// Elements handled per grab of the task counter (a task is one line).
const GRAIN: u64 = 4096;

impl Generic {
    pub fn line(&self) -> u64 {
        *self.sizes.last().unwrap_or(&1)
    }

    /// (task count, tasks per grab, scratch bytes): one task per line, no scratch.
    pub fn tasks(&self) -> (u64, u64, usize) {
        let lines: u64 = self.sizes[..self.sizes.len() - 1].iter().product();
        (lines, (GRAIN / self.line().max(1)).max(1), 0)
    }
}

/// What the planner knows about the graph around one node.
pub struct Ctx<'a> {
    pub g: &'a Graph,
    pub dims: &'a BTreeMap<String, u64>,
    /// Rank-0 values folded to constants.
    pub consts: &'a HashMap<ValueId, f64>,
    /// Topological number of each value (for messages).
    pub num: &'a HashMap<ValueId, usize>,
}

/// A planned kernel and the values whose buffers it reads, in `args` order.
pub struct Planned {
    pub kernel: Generic,
    pub operands: Vec<Value>,
}

/// Plan the generic kernel of node `n` (any op but a parameter or a fused op): the shared loop
/// plan with every size evaluated.
pub fn plan(cx: &Ctx, n: ValueId) -> Result<Planned, CpuError> {
    let g = cx.g;
    let op = g.op(n);
    let bad = |what: String| CpuError::Invalid(format!("value %{} ({}): {what}", cx.num[&n], op.mnemonic()));
    let folded = |v: Value| cx.consts.get(&v.node).copied().filter(|_| v.result == 0);
    let p = loop_plan::plan(g, n, &folded).map_err(|e| match e {
        PlanError::Invalid(what) => bad(what),
        PlanError::Unsupported => match op {
            Op::Param { .. } => bad("parameters have no kernel".into()),
            other => bad(format!("`{}` is a fused op, not a generic one", other.mnemonic())),
        },
    })?;
    let dim = |d: &Dim| {
        d.eval(&|s| cx.dims.get(s).copied())
            .ok_or_else(|| bad(format!("dimension `{d}` is not bound to a size")))
    };
    let scalars = p
        .scalars
        .iter()
        .map(|ds| ds.iter().map(dim).product::<Result<u64, CpuError>>())
        .collect::<Result<Vec<u64>, CpuError>>()?;
    let stride = |list: &[usize]| list.iter().map(|&k| scalars[k] as i64).sum::<i64>();
    let sizes = scalars[..p.sizes.len()].to_vec();
    let mut inputs = Vec::with_capacity(p.inputs.len());
    let mut arg = 0;
    for src in p.inputs {
        inputs.push(match src {
            loop_plan::Src::Const(c) => Src::Const(c),
            loop_plan::Src::Buf { dtype, strides, axes } => {
                for (a, d) in &axes {
                    let have = dim(d)?;
                    if have != sizes[*a] {
                        return Err(bad(format!(
                            "an operand axis of size {have} is read along iteration axis {a} of size {}",
                            sizes[*a]
                        )));
                    }
                }
                arg += 1;
                Src::Buf { arg: arg - 1, dtype, strides: strides.iter().map(|l| stride(l)).collect() }
            }
            loop_plan::Src::Gather { dtype, subs, sizes: gs, strides } => {
                let mut out = Vec::with_capacity(subs.len());
                for s in subs {
                    let div = match s.div.map(|k| scalars[k]) {
                        None => None,
                        Some(x) if x > 0 && x <= i64::MAX as u64 => Some(x as i64),
                        Some(_) => {
                            return Err(bad("a gather subscript's divisor is not a positive size".into()))
                        }
                    };
                    // Every size is a compile-time constant here: `constant + sum k * scalar` folds,
                    // for the offset and for each clamp's bound.
                    let fold = |constant: i64, terms: &[(usize, i64)]| {
                        terms.iter().try_fold(constant, |acc, &(k, c)| {
                            i64::try_from(scalars[k]).ok()?.checked_mul(c)?.checked_add(acc)
                        })
                    };
                    let overflow = || bad("a gather subscript overflows i64".into());
                    let constant = fold(s.constant, &s.dims).ok_or_else(overflow)?;
                    let clamps = s
                        .clamps
                        .iter()
                        .map(|c| fold(c.constant, &c.dims).map(|b| (c.kind, b)).ok_or_else(overflow))
                        .collect::<Result<Vec<_>, _>>()?;
                    out.push(Sub { terms: s.terms, constant, div, clamps });
                }
                arg += 1;
                Src::Gather {
                    arg: arg - 1,
                    dtype,
                    subs: out,
                    sizes: gs.iter().map(|&k| scalars[k]).collect(),
                    strides: strides.iter().map(|&k| scalars[k] as i64).collect(),
                }
            }
        });
    }
    let kernel = Generic {
        sizes,
        inputs,
        out_arg: p.operands.len(),
        out_dtype: g.ty(n).dtype,
        out_strides: p.out_strides.iter().map(|l| stride(l)).collect(),
        value: p.value,
        body: p.body,
        scalars,
    };
    Ok(Planned { kernel, operands: p.operands })
}
