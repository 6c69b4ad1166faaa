//! Plain compiled loops for every op that is not a fused kernel: elementwise math, reductions,
//! cumsum, softmax, masks, rmsnorm on any axis, bind/store layout changes and casts.
//!
//! Slow but right: each node becomes one Cranelift function that walks the node's full index
//! space in f64 (results are rounded to their dtype when stored), with the interpreter's
//! semantics (`foxc_ir::interp` is the reference: NaN propagation, `-inf` masking, fully masked
//! softmax rows give zeros, comparisons give 1/0). Transcendental functions and casts call the
//! interpreter's own scalar functions through [`math`], so there is one definition of the math.
//!
//! Layout: a kernel iterates an *iteration space*, a list of named axes whose last axis is the
//! *line* (the axis of a cumsum/softmax/rmsnorm, the reduced axis of a sum, else the result's
//! last axis). One task is one line. Every buffer (operands and result) has one element stride
//! per iteration axis: axes are matched by NAME, an axis the buffer lacks has stride 0
//! (broadcast), a name repeated in a buffer sums its strides (`bind [i, i]`, a diagonal).
//!
//! One lowering choice mirrors the interpreter: a `mul` whose only user is a `sum` is not
//! materialized; the sum reads the mul's operands (`sum(d, q * k)` costs `T*T`, not `T*T*D`).

mod emit;
pub mod math;

pub use emit::emit;

use super::CpuError;
use foxc_ir::{BinaryOp, DType, Graph, Op, ReduceKind, UnaryOp, Value, ValueId};
use std::collections::{BTreeMap, HashMap, HashSet};

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
}

/// The per-element value of a kernel, in f64.
#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    /// Input `k` of [`Generic::inputs`] at the current element.
    In(usize),
    /// The index along iteration axis `k`, as a number (`iota`).
    Index(usize),
    Const(f64),
    Unary(UnaryOp, Box<Expr>),
    Binary(BinaryOp, Box<Expr>, Box<Expr>),
    Select(Box<Expr>, Box<Expr>, Box<Expr>),
    /// Round to `DType` as `cast` does.
    Cast(DType, Box<Expr>),
    /// `x` where `j <= i` (and `i - j < window`), `-inf` elsewhere; `i`, `j` iteration axes.
    Mask {
        i: usize,
        j: usize,
        window: Option<u64>,
        x: Box<Expr>,
    },
}

/// What a kernel does along its line.
#[derive(Clone, Debug, PartialEq)]
pub enum Body {
    /// Every element of the line gets `value`.
    Map,
    /// The line is reduced into one result element.
    Reduce(ReduceKind),
    /// Inclusive prefix sum along the line.
    Cumsum,
    /// Softmax along the line (`-inf` weighs 0; an all `-inf` line gives zeros).
    Softmax,
    /// `x * rsqrt(mean(x^2) + eps) * w[t]`, `w` the input read along the line only.
    RmsNorm { w: usize, eps: f64 },
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

/// The values the kernels of a graph read: which `mul`s are contracted into their `sum`
/// (never an output in `outputs`).
pub fn absorbed_muls(g: &Graph, live: &HashSet<ValueId>, outputs: &HashSet<ValueId>) -> HashSet<ValueId> {
    let mut out = HashSet::new();
    for &n in live {
        if !matches!(g.op(n), Op::Reduce { kind: ReduceKind::Sum, .. }) {
            continue;
        }
        let Some(&m) = g.operands(n).first() else { continue };
        if matches!(g.op(m), Op::Binary(BinaryOp::Mul))
            && !outputs.contains(&m)
            && g.users(m) == [n]
            && g.ty(m).rank() > 0
        {
            out.insert(m);
        }
    }
    out
}

/// Row-major element strides of `shape`.
fn row_strides(shape: &[u64]) -> Vec<i64> {
    let mut s = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1] as i64;
    }
    s
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

impl Ctx<'_> {
    fn shape(&self, id: ValueId) -> Result<Vec<u64>, CpuError> {
        self.value_shape(Value::of(id))
    }

    fn value_shape(&self, v: Value) -> Result<Vec<u64>, CpuError> {
        let id = v.node;
        self.g
            .value_ty(v)
            .dims()
            .map(|d| {
                d.eval(&|s| self.dims.get(s).copied()).ok_or_else(|| {
                    CpuError::Invalid(format!(
                        "dimension `{d}` of value %{} is not bound to a size",
                        self.num[&id]
                    ))
                })
            })
            .collect()
    }
}

/// Builds the inputs of one kernel: each distinct operand value is one `args` slot.
struct Inputs<'a, 'c> {
    cx: &'c Ctx<'a>,
    node: ValueId,
    /// Iteration axis names and sizes.
    axes: &'c [String],
    sizes: &'c [u64],
    operands: Vec<Value>,
    srcs: Vec<Src>,
}

impl Inputs<'_, '_> {
    fn err(&self, what: String) -> CpuError {
        CpuError::Invalid(format!(
            "value %{} ({}): {what}",
            self.cx.num[&self.node],
            self.cx.g.op(self.node).mnemonic()
        ))
    }

    /// Input for value `v` whose axes are called `names` (its own axis names unless renamed by
    /// `bind`), or `None` names for a 1-D weight read along the line only.
    fn add(&mut self, v: Value, names: Option<&[String]>) -> Result<usize, CpuError> {
        if let Some(&c) = self.cx.consts.get(&v.node).filter(|_| v.result == 0) {
            self.srcs.push(Src::Const(c));
            return Ok(self.srcs.len() - 1);
        }
        let shape = self.cx.value_shape(v)?;
        let own = row_strides(&shape);
        let mut strides = vec![0i64; self.axes.len()];
        match names {
            None => {
                let line = self.axes.len() - 1;
                if shape != [self.sizes[line]] {
                    return Err(
                        self.err(format!("weight has shape {shape:?}, expected [{}]", self.sizes[line]))
                    );
                }
                strides[line] = 1;
            }
            Some(names) => {
                if names.len() != shape.len() {
                    return Err(self.err(format!(
                        "{} axis names for a rank-{} value",
                        names.len(),
                        shape.len()
                    )));
                }
                for (p, name) in names.iter().enumerate() {
                    let a = self.axes.iter().position(|a| a == name).ok_or_else(|| {
                        self.err(format!(
                            "operand axis `{name}` is not an axis of the iteration space {:?}",
                            self.axes
                        ))
                    })?;
                    if self.sizes[a] != shape[p] {
                        return Err(self.err(format!(
                            "operand axis `{name}` has size {}, the iteration space has {}",
                            shape[p], self.sizes[a]
                        )));
                    }
                    strides[a] += own[p];
                }
            }
        }
        let arg = self.operands.len();
        self.operands.push(v);
        self.srcs.push(Src::Buf { arg, dtype: self.cx.g.value_ty(v).dtype, strides });
        Ok(self.srcs.len() - 1)
    }

    /// Input for `gather`'s operand `v` at the subscripts `index` (variables are iteration axes;
    /// one that is not, the interpreter reads as 0, so its term drops).
    fn gather(&mut self, v: Value, index: &[foxc_ir::index::IndexExpr]) -> Result<Expr, CpuError> {
        let sizes = self.cx.value_shape(v)?;
        if index.len() != sizes.len() {
            return Err(self.err(format!("{} subscripts for a rank-{} value", index.len(), sizes.len())));
        }
        let mut subs = vec![];
        for e in index {
            let terms = e
                .terms
                .iter()
                .filter_map(|(name, c)| self.axes.iter().position(|a| a == name).map(|p| (p, *c)))
                .collect();
            let div = match &e.div {
                None => None,
                Some(d) => match d.eval(&|s| self.cx.dims.get(s).copied()) {
                    Some(x) if x > 0 && x <= i64::MAX as u64 => Some(x as i64),
                    _ => {
                        return Err(
                            self.err(format!("the divisor `{d}` of subscript `{e}` is not a positive size"))
                        )
                    }
                },
            };
            subs.push(Sub { terms, constant: e.constant, div });
        }
        let arg = self.operands.len();
        self.operands.push(v);
        let strides = row_strides(&sizes);
        self.srcs.push(Src::Gather { arg, dtype: self.cx.g.value_ty(v).dtype, subs, sizes, strides });
        Ok(Expr::In(self.srcs.len() - 1))
    }

    /// Input for `v` under its own axis names.
    fn named(&mut self, v: Value) -> Result<Expr, CpuError> {
        let names: Vec<String> = self.cx.g.value_ty(v).axes.iter().map(|a| a.name.clone()).collect();
        Ok(Expr::In(self.add(v, Some(&names))?))
    }
}

/// A planned kernel and the values whose buffers it reads, in `args` order.
pub struct Planned {
    pub kernel: Generic,
    pub operands: Vec<Value>,
}

/// Plan the generic kernel of node `n` (any op but a parameter or a fused op).
pub fn plan(cx: &Ctx, n: ValueId, absorbed: &HashSet<ValueId>) -> Result<Planned, CpuError> {
    let g = cx.g;
    let op = g.op(n);
    let ops = g.operand_values(n);
    let bad = |what: String| CpuError::Invalid(format!("value %{} ({}): {what}", cx.num[&n], op.mnemonic()));
    if let Some(a) = op.arity() {
        if ops.len() != a {
            return Err(bad(format!("expects {a} operands, has {}", ops.len())));
        }
    }
    let ty = g.ty(n);
    let shape = cx.shape(n)?;
    // The result's axis names: a store names its positional result by the statement's indices.
    let rnames: Vec<String> = match op {
        Op::Store { axes } => {
            if axes.len() != shape.len() {
                return Err(bad("store axes do not match the result rank".into()));
            }
            axes.clone()
        }
        _ => ty.axes.iter().map(|a| a.name.clone()).collect(),
    };
    let mut seen = HashSet::new();
    if !rnames.iter().all(|a| seen.insert(a)) {
        return Err(bad(format!("repeated result axis in {rnames:?}")));
    }
    let rstrides = row_strides(&shape);
    // Iteration order: result axes, with the op's axis moved last (or appended when reduced).
    let mut order: Vec<usize> = (0..shape.len()).collect();
    let mut extra: Option<(String, u64)> = None;
    let pos = |axis: &str| rnames.iter().position(|a| a == axis);
    match op {
        Op::Cumsum { axis } | Op::Softmax { axis } | Op::RmsNorm { axis, .. } => {
            let p = pos(axis).ok_or_else(|| bad(format!("axis `{axis}` is not an axis of the value")))?;
            order.retain(|&a| a != p);
            order.push(p);
        }
        Op::Reduce { axis, .. } => {
            if pos(axis).is_some() {
                return Err(bad(format!("reduced axis `{axis}` is still an axis of the result")));
            }
            // A contracted mul keeps its own type: the axis is found there too.
            let src = ops[0];
            let p = g
                .value_ty(src)
                .axis(axis)
                .map(|(p, _)| p)
                .ok_or_else(|| bad(format!("reduced axis `{axis}` is not an axis of the operand")))?;
            extra = Some((axis.clone(), cx.value_shape(src)?[p]));
        }
        _ => {}
    }
    let mut axes: Vec<String> = order.iter().map(|&p| rnames[p].clone()).collect();
    let mut sizes: Vec<u64> = order.iter().map(|&p| shape[p]).collect();
    let mut out_strides: Vec<i64> = order.iter().map(|&p| rstrides[p]).collect();
    if let Some((a, s)) = extra {
        axes.push(a);
        sizes.push(s);
        out_strides.push(0);
    }
    if axes.is_empty() {
        // A scalar result: one line of one element. The empty name matches no operand axis.
        axes.push(String::new());
        sizes.push(1);
        out_strides.push(0);
    }
    let ipos = |axis: &str| axes.iter().position(|a| a == axis);
    let mut inp = Inputs { cx, node: n, axes: &axes, sizes: &sizes, operands: vec![], srcs: vec![] };
    let mut body = Body::Map;
    let value = match op {
        Op::Const(c) => Expr::Const(*c),
        Op::DimSize(d) => {
            let v = d
                .eval(&|s| cx.dims.get(s).copied())
                .ok_or_else(|| bad(format!("dimension `{d}` is not bound to a size")))?;
            Expr::Const(v as f64)
        }
        Op::Iota { axis } => {
            Expr::Index(ipos(axis).ok_or_else(|| bad(format!("iota axis `{axis}` not in its type")))?)
        }
        Op::Bind { axes: names } => Expr::In(inp.add(ops[0], Some(names))?),
        Op::Gather { index, .. } => inp.gather(ops[0], index)?,
        Op::Store { .. } => inp.named(ops[0])?,
        Op::Cast => Expr::Cast(ty.dtype, Box::new(inp.named(ops[0])?)),
        Op::Unary(u) => Expr::Unary(*u, Box::new(inp.named(ops[0])?)),
        Op::Binary(b) => {
            let x = inp.named(ops[0])?;
            let y = inp.named(ops[1])?;
            Expr::Binary(*b, Box::new(x), Box::new(y))
        }
        Op::Select => {
            let c = inp.named(ops[0])?;
            let x = inp.named(ops[1])?;
            let y = inp.named(ops[2])?;
            Expr::Select(Box::new(c), Box::new(x), Box::new(y))
        }
        Op::Reduce { kind, .. } => {
            body = Body::Reduce(*kind);
            if ops[0].result == 0 && absorbed.contains(&ops[0].node) {
                let mo = g.operand_values(ops[0].node);
                if mo.len() != 2 {
                    return Err(bad("contracted mul must have two operands".into()));
                }
                let x = inp.named(mo[0])?;
                let y = inp.named(mo[1])?;
                Expr::Binary(BinaryOp::Mul, Box::new(x), Box::new(y))
            } else {
                inp.named(ops[0])?
            }
        }
        Op::Cumsum { .. } => {
            body = Body::Cumsum;
            inp.named(ops[0])?
        }
        Op::Softmax { .. } => {
            body = Body::Softmax;
            inp.named(ops[0])?
        }
        Op::RmsNorm { eps, .. } => {
            let x = inp.named(ops[0])?;
            body = Body::RmsNorm { w: inp.add(ops[1], None)?, eps: *eps };
            x
        }
        Op::Causal { i, j } | Op::Window { i, j, .. } => {
            let window = if let Op::Window { size, .. } = op { Some(*size) } else { None };
            let pi = ipos(i).ok_or_else(|| bad(format!("mask axis `{i}` not in the value")))?;
            let pj = ipos(j).ok_or_else(|| bad(format!("mask axis `{j}` not in the value")))?;
            Expr::Mask { i: pi, j: pj, window, x: Box::new(inp.named(ops[0])?) }
        }
        Op::Param { .. } => return Err(bad("parameters have no kernel".into())),
        other => return Err(bad(format!("`{}` is a fused op, not a generic one", other.mnemonic()))),
    };
    let (operands, inputs) = (inp.operands, inp.srcs);
    let kernel =
        Generic { sizes, inputs, out_arg: operands.len(), out_dtype: ty.dtype, out_strides, value, body };
    Ok(Planned { kernel, operands })
}
