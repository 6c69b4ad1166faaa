//! From one graph node to a [`Generic`] kernel: the iteration space, each operand's strides
//! and the per-element expression, with every size a product of dims (kernel arguments).

use super::{Body, Expr, Generic, Src, Sub};
use crate::nvptx::CodegenError;
use foxc_ir::{Dim, Graph, Op, Value, ValueId};
use std::collections::HashSet;

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

/// The scalar parameters of one kernel: the axis sizes first, then strides, gather sizes and
/// divisors, each distinct product once.
struct Scalars(Vec<Vec<Dim>>);

impl Scalars {
    fn get(&mut self, dims: &[Dim]) -> usize {
        if let Some(p) = self.0.iter().position(|d| d.as_slice() == dims) {
            return p;
        }
        self.0.push(dims.to_vec());
        self.0.len() - 1
    }
}

/// Builds one kernel's inputs.
struct Inputs<'g> {
    g: &'g Graph,
    node: ValueId,
    folded: &'g dyn Fn(Value) -> Option<f64>,
    axes: Vec<String>,
    scalars: Scalars,
    operands: Vec<Value>,
    srcs: Vec<Src>,
}

impl Inputs<'_> {
    fn err(&self, what: String) -> CodegenError {
        CodegenError::Internal(format!(
            "value %{} ({}): {what}",
            self.node.index(),
            self.g.op(self.node).mnemonic()
        ))
    }

    /// Input for value `v` whose axes are called `names` (its own unless renamed by `bind`).
    fn add(&mut self, v: Value, names: &[String]) -> Result<usize, CodegenError> {
        if let Some(c) = (self.folded)(v) {
            self.srcs.push(Src::Const(c));
            return Ok(self.srcs.len() - 1);
        }
        let ty = self.g.value_ty(v);
        let dims: Vec<Dim> = ty.dims().cloned().collect();
        if names.len() != dims.len() {
            return Err(self.err(format!("{} axis names for a rank-{} value", names.len(), dims.len())));
        }
        let mut strides = vec![vec![]; self.axes.len()];
        for (p, name) in names.iter().enumerate() {
            let a = self.axes.iter().position(|x| x == name).ok_or_else(|| {
                self.err(format!(
                    "operand axis `{name}` is not an axis of the iteration space {:?}",
                    self.axes
                ))
            })?;
            let s = self.scalars.get(&dims[p + 1..]);
            strides[a].push(s);
        }
        self.operands.push(v);
        self.srcs.push(Src::Buf { dtype: ty.dtype, strides });
        Ok(self.srcs.len() - 1)
    }

    /// Input for `v` under its own axis names.
    fn named(&mut self, v: Value) -> Result<Expr, CodegenError> {
        let names: Vec<String> = self.g.value_ty(v).axes.iter().map(|a| a.name.clone()).collect();
        Ok(Expr::In(self.add(v, &names)?))
    }

    /// `gather`'s operand `v` read positionally at `index` (a variable that is not an iteration
    /// axis reads as 0, as in the interpreter, so its term drops).
    fn gather(&mut self, v: Value, index: &[foxc_ir::index::IndexExpr]) -> Result<Expr, CodegenError> {
        let ty = self.g.value_ty(v);
        let dims: Vec<Dim> = ty.dims().cloned().collect();
        if index.len() != dims.len() {
            return Err(self.err(format!("{} subscripts for a rank-{} value", index.len(), dims.len())));
        }
        let mut subs = vec![];
        for e in index {
            let terms = e
                .terms
                .iter()
                .filter_map(|(name, c)| self.axes.iter().position(|a| a == name).map(|p| (p, *c)))
                .collect();
            let div = e.div.as_ref().map(|d| self.scalars.get(std::slice::from_ref(d)));
            subs.push(Sub { terms, constant: e.constant, div });
        }
        let sizes = dims.iter().map(|d| self.scalars.get(std::slice::from_ref(d))).collect();
        let strides = (0..dims.len()).map(|p| self.scalars.get(&dims[p + 1..])).collect();
        self.operands.push(v);
        self.srcs.push(Src::Gather { dtype: ty.dtype, subs, sizes, strides });
        Ok(Expr::In(self.srcs.len() - 1))
    }
}

/// Whether `op` is one this module lowers.
pub(crate) fn handles(op: &Op) -> bool {
    matches!(
        op,
        Op::Const(_)
            | Op::DimSize(_)
            | Op::Iota { .. }
            | Op::Bind { .. }
            | Op::Gather { .. }
            | Op::Store { .. }
            | Op::Unary(_)
            | Op::Binary(_)
            | Op::Select
            | Op::Reduce { .. }
            | Op::Cumsum { .. }
            | Op::Softmax { .. }
            | Op::RmsNorm { .. }
            | Op::Causal { .. }
            | Op::Window { .. }
            | Op::Cast
    )
}

/// Plans the kernel of node `n` (an op [`handles`] accepts). `folded(v)` is the compile-time
/// value of an operand that has no buffer (a folded scalar).
pub(crate) fn plan(
    g: &Graph,
    n: ValueId,
    folded: &dyn Fn(Value) -> Option<f64>,
) -> Result<Planned, CodegenError> {
    let op = g.op(n);
    let ops = g.operand_values(n);
    let bad =
        |what: String| CodegenError::Internal(format!("value %{} ({}): {what}", n.index(), op.mnemonic()));
    if !handles(op) {
        return Err(CodegenError::Unsupported { op: op.mnemonic().to_string(), node: n.index() });
    }
    if let Some(a) = op.arity() {
        if ops.len() != a {
            return Err(bad(format!("expects {a} operands, has {}", ops.len())));
        }
    }
    let ty = g.ty(n);
    let rdims: Vec<Dim> = ty.dims().cloned().collect();
    // The result's axis names: a store names its positional result by the statement's indices.
    let rnames: Vec<String> = match op {
        Op::Store { axes } => {
            if axes.len() != rdims.len() {
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
    // Iteration order: result axes, the op's axis moved last (or appended when reduced).
    let mut order: Vec<usize> = (0..rdims.len()).collect();
    let mut extra: Option<(String, Dim)> = None;
    match op {
        Op::Cumsum { axis } | Op::Softmax { axis } | Op::RmsNorm { axis, .. } => {
            let p = rnames
                .iter()
                .position(|a| a == axis)
                .ok_or_else(|| bad(format!("axis `{axis}` is not an axis of the value")))?;
            order.retain(|&a| a != p);
            order.push(p);
        }
        Op::Reduce { axis, .. } => {
            if rnames.contains(axis) {
                return Err(bad(format!("reduced axis `{axis}` is still an axis of the result")));
            }
            let src = g.value_ty(ops[0]);
            let (_, ax) = src
                .axis(axis)
                .ok_or_else(|| bad(format!("reduced axis `{axis}` is not an axis of the operand")))?;
            extra = Some((axis.clone(), ax.dim.clone()));
        }
        _ => {}
    }
    let mut axes: Vec<String> = order.iter().map(|&p| rnames[p].clone()).collect();
    let mut sizes: Vec<Dim> = order.iter().map(|&p| rdims[p].clone()).collect();
    // The result's row-major stride along each iteration axis (none along a reduced line).
    let mut out_dims: Vec<Option<&[Dim]>> = order.iter().map(|&p| Some(&rdims[p + 1..])).collect();
    if let Some((a, d)) = extra {
        axes.push(a);
        sizes.push(d);
        out_dims.push(None);
    }
    if axes.is_empty() {
        // A scalar result: one line of one element; the empty name matches no operand axis.
        axes.push(String::new());
        sizes.push(Dim::Const(1));
        out_dims.push(None);
    }
    // The axis sizes are parameters 0..rank (the emitter reads them there).
    let mut scalars = Scalars(sizes.iter().map(|d| vec![d.clone()]).collect());
    let out_strides: Vec<Vec<usize>> =
        out_dims.iter().map(|d| d.map(|d| vec![scalars.get(d)]).unwrap_or_default()).collect();
    let ipos = |axis: &str| axes.iter().position(|a| a == axis);
    let mut body = Body::Map;
    let mut inp = Inputs { g, node: n, folded, axes: axes.clone(), scalars, operands: vec![], srcs: vec![] };
    let value = match op {
        Op::Const(c) => Expr::Const(*c),
        Op::DimSize(d) => match folded(Value::of(n)) {
            Some(c) => Expr::Const(c),
            None => Expr::Scalar(inp.scalars.get(std::slice::from_ref(d))),
        },
        Op::Iota { axis } => {
            Expr::Index(ipos(axis).ok_or_else(|| bad(format!("iota axis `{axis}` not in its type")))?)
        }
        Op::Bind { axes: names } => Expr::In(inp.add(ops[0], names)?),
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
            inp.named(ops[0])?
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
            // The weight's one axis is the line.
            let line = [axes[axes.len() - 1].clone()];
            body = Body::RmsNorm { w: inp.add(ops[1], &line)?, eps: *eps };
            x
        }
        Op::Causal { i, j } | Op::Window { i, j, .. } => {
            let window = if let Op::Window { size, .. } = op { Some(*size) } else { None };
            let pi = ipos(i).ok_or_else(|| bad(format!("mask axis `{i}` not in the value")))?;
            let pj = ipos(j).ok_or_else(|| bad(format!("mask axis `{j}` not in the value")))?;
            Expr::Mask { i: pi, j: pj, window, x: Box::new(inp.named(ops[0])?) }
        }
        _ => return Err(CodegenError::Unsupported { op: op.mnemonic().to_string(), node: n.index() }),
    };
    // A sum or cumsum along an axis that is not the operand's innermost: one thread per line.
    let serial = match op {
        Op::Reduce { axis, .. } | Op::Cumsum { axis } => {
            let names: Vec<&str> = g.value_ty(ops[0]).axes.iter().map(|a| a.name.as_str()).collect();
            names.last().is_some_and(|last| last != axis)
        }
        _ => false,
    };
    let kernel = Generic {
        serial,
        rank: axes.len(),
        scalars: inp.scalars.0.len(),
        inputs: inp.srcs,
        out_dtype: ty.dtype,
        out_strides,
        value,
        body,
    };
    Ok(Planned { kernel, operands: inp.operands, scalars: inp.scalars.0, sizes })
}
