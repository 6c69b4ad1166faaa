//! One graph node as a loop nest, the plan both backends' generic loops are built from
//! (`cpu/generic`: sizes bound at compile time; `nvptx/generic`: sizes passed at run time).
//!
//! A node iterates an *iteration space*: named axes whose last one is the *line* (the axis of a
//! cumsum, softmax or rmsnorm, the reduced axis of a sum, else the result's last axis). Each
//! operand is read with one element stride per iteration axis, matched by axis NAME: an axis the
//! operand lacks has stride 0 (broadcast), a name repeated by a `bind` sums its strides (a
//! diagonal). The value of one element is an [`Expr`] over the inputs; the [`Body`] says what
//! happens along the line.
//!
//! Every size and stride here is symbolic: a product of dims, listed once in
//! [`LoopPlan::scalars`] and referred to by index. The GPU passes them as kernel arguments; the
//! CPU evaluates them with the bound dims and compiles them in as constants.

use foxc_ir::index::IndexExpr;
use foxc_ir::{BinaryOp, DType, Dim, Graph, Op, ReduceKind, UnaryOp, Value, ValueId, ValueType};
use std::collections::HashSet;

/// The per-element value of a loop.
#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    /// Input `k` of [`LoopPlan::inputs`] at the current element.
    In(usize),
    /// The index along iteration axis `k`, as a number (`iota`).
    Index(usize),
    Const(f64),
    /// Scalar `k` of [`LoopPlan::scalars`] (a dim that was not folded), as a number.
    Scalar(usize),
    Unary(UnaryOp, Box<Expr>),
    Binary(BinaryOp, Box<Expr>, Box<Expr>),
    Select(Box<Expr>, Box<Expr>, Box<Expr>),
    /// Rounded to `DType` as `cast` does.
    Cast(DType, Box<Expr>),
    /// `x` where `j <= i` (and `i - j < window`), `-inf` elsewhere; `i`, `j` iteration axes.
    Mask {
        i: usize,
        j: usize,
        window: Option<u64>,
        x: Box<Expr>,
    },
}

/// What a loop does along its line.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Body {
    /// Every element of the line gets the value.
    Map,
    /// The line is reduced into one result element (sum: 0 for an empty line; max: -inf).
    Reduce(ReduceKind),
    /// Inclusive prefix sum along the line (`reverse`: suffix sum, the line walked from its
    /// end); a `-inf` term counts as `LOG_F_FLOOR`, as in the interpreter.
    Cumsum { reverse: bool },
    /// Softmax along the line (`-inf` weighs 0; a line of only `-inf` gives zeros; a NaN makes
    /// the line NaN).
    Softmax,
    /// `x * rsqrt(mean(x^2) + eps) * w[t]`, `w` the input read along the line only.
    RmsNorm { w: usize, eps: f64 },
}

/// Where one input comes from. Scalars are indices into [`LoopPlan::scalars`].
#[derive(Clone, Debug, PartialEq)]
pub enum Src {
    /// A buffer (the next of [`LoopPlan::operands`]). `strides[a]` lists the scalars whose sum
    /// is its element stride along iteration axis `a` (empty: 0, broadcast); `axes` pairs each
    /// of its own axes, in order, with the iteration axis it is read along and its size (the
    /// CPU checks the sizes agree).
    Buf { dtype: DType, strides: Vec<Vec<usize>>, axes: Vec<(usize, Dim)> },
    /// A compile-time scalar (no buffer).
    Const(f64),
    /// A buffer read at computed subscripts (`gather`): one [`Sub`] per buffer axis, with the
    /// axis' size and row-major stride as scalars; a subscript outside `[0, size)` reads NaN.
    Gather { dtype: DType, subs: Vec<Sub>, sizes: Vec<usize>, strides: Vec<usize> },
}

/// One gather subscript: `floor((constant + sum coef * index[axis]) / div)`, `axis` an
/// iteration axis, `div` a scalar when present.
#[derive(Clone, Debug, PartialEq)]
pub struct Sub {
    pub terms: Vec<(usize, i64)>,
    /// `(scalar, k)`: `k` times a dim (`i + M - N`), added to the constant.
    pub dims: Vec<(usize, i64)>,
    pub constant: i64,
    pub div: Option<usize>,
    /// After the division, in order.
    pub clamps: Vec<SubClamp>,
}

/// `min` / `max` of a subscript with `constant + sum k * scalar`.
#[derive(Clone, Debug, PartialEq)]
pub struct SubClamp {
    pub kind: foxc_ir::index::ClampKind,
    pub dims: Vec<(usize, i64)>,
    pub constant: i64,
}

/// The loop nest of one node.
#[derive(Clone, Debug, PartialEq)]
pub struct LoopPlan {
    /// The iteration axes' sizes (the last is the line); scalars `0..sizes.len()` are these.
    pub sizes: Vec<Dim>,
    /// Every distinct product of dims the loop needs, the axis sizes first.
    pub scalars: Vec<Vec<Dim>>,
    pub inputs: Vec<Src>,
    /// The values read from memory, in the order of the `Buf` and `Gather` inputs.
    pub operands: Vec<Value>,
    /// The scalars summing to the result's stride along each iteration axis (empty along a
    /// reduced line).
    pub out_strides: Vec<Vec<usize>>,
    pub value: Expr,
    pub body: Body,
}

/// Why a node has no loop plan.
#[derive(Clone, Debug, PartialEq)]
pub enum PlanError {
    /// Not an op of this module (a parameter or a fused op).
    Unsupported,
    /// The node is malformed for its op (the verifier should have refused it).
    Invalid(String),
}

/// Whether `op` is one [`plan`] lowers: a scalar, an elementwise op, or an op that reads its
/// operand by name in a loop (the IR's two classes, [`Op::is_elementwise`] and
/// [`Op::reads_by_name`], which `fuse-loops` decides by).
pub fn handles(op: &Op) -> bool {
    matches!(op, Op::Const(_) | Op::DimSize(_)) || op.is_elementwise() || op.reads_by_name(0)
}

/// Whether `n` is a `mul` that a `sum {contract}` reads through (the `contract` pass's
/// decision, docs/SEMANTICS.md): it needs no loop of its own unless the caller reads it back
/// (the verifier lets nothing else use it).
pub fn read_through(g: &Graph, n: ValueId) -> bool {
    matches!(g.op(n), Op::Binary(BinaryOp::Mul))
        && g.users(n).iter().any(|&u| matches!(g.op(u), Op::Reduce { contract: true, .. }))
}

/// Whether node `n` is computed inside its users' loops (the `fuse-loops` pass's decision):
/// it needs no loop of its own unless the caller reads it back.
pub fn inlined(g: &Graph, n: ValueId) -> bool {
    g.node(n).inline
}

/// Whether `n` has no buffer of its own: a product a `sum {contract}` reads through, or an
/// inline value, unless the caller reads it back (`is_output`). Such a value exists only inside
/// the loops of its users.
pub fn unbuffered(g: &Graph, n: ValueId, is_output: &dyn Fn(ValueId) -> bool) -> bool {
    ((read_through(g, n) || inlined(g, n)) && !is_output(n)) || loaded_through(g, n)
}

/// Whether `n` is a `load_map`: its readers (attention and threshold kernels) compute it where
/// they load it (the `fuse-load-maps` pass's decision); it has no buffer, not even as an output.
pub fn loaded_through(g: &Graph, n: ValueId) -> bool {
    matches!(g.op(n), Op::LoadMap { .. })
}

/// Whether node `n` reads an [`unbuffered`] value, so that only the generic loop, which computes
/// it in place, can compute `n` (the backends' fast kernels read buffers; a load map is read by
/// the fused kernels that compute it, never by a loop). Both backends ask this one question.
pub fn reads_unbuffered(g: &Graph, n: ValueId, is_output: &dyn Fn(ValueId) -> bool) -> bool {
    g.operands(n).into_iter().any(|x| unbuffered(g, x, is_output) && !loaded_through(g, x))
}

/// Each distinct product of dims once.
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

/// Builds one loop's inputs.
struct Inputs<'g> {
    g: &'g Graph,
    folded: &'g dyn Fn(Value) -> Option<f64>,
    axes: Vec<String>,
    scalars: Scalars,
    operands: Vec<Value>,
    srcs: Vec<Src>,
}

impl Inputs<'_> {
    /// Input for value `v` whose axes are called `names` (its own unless renamed by `bind`).
    fn add(&mut self, v: Value, names: &[String]) -> Result<usize, PlanError> {
        if let Some(c) = (self.folded)(v) {
            self.srcs.push(Src::Const(c));
            return Ok(self.srcs.len() - 1);
        }
        let ty = self.g.value_ty(v);
        let dims: Vec<Dim> = ty.dims().cloned().collect();
        if names.len() != dims.len() {
            return Err(invalid(format!("{} axis names for a rank-{} value", names.len(), dims.len())));
        }
        let mut strides = vec![vec![]; self.axes.len()];
        let mut axes = Vec::with_capacity(dims.len());
        for (p, name) in names.iter().enumerate() {
            let a = self.axes.iter().position(|x| x == name).ok_or_else(|| {
                invalid(format!(
                    "operand axis `{name}` is not an axis of the iteration space {:?}",
                    self.axes
                ))
            })?;
            strides[a].push(self.scalars.get(&dims[p + 1..]));
            axes.push((a, dims[p].clone()));
        }
        self.operands.push(v);
        self.srcs.push(Src::Buf { dtype: ty.dtype, strides, axes });
        Ok(self.srcs.len() - 1)
    }

    /// Input for `v` under its own axis names; an `inline` value is computed here instead
    /// ([`inline_value`]).
    fn named(&mut self, v: Value) -> Result<Expr, PlanError> {
        if inlined(self.g, v.node) {
            return self.inline_value(v.node);
        }
        let names: Vec<String> = self.g.value_ty(v).axes.iter().map(|a| a.name.clone()).collect();
        Ok(Expr::In(self.add(v, &names)?))
    }

    /// The value of the `inline` node `n` in this loop, from its operands (the `fuse-loops`
    /// pass checked that its axes are this loop's). A computed value is rounded to its dtype,
    /// as its buffer would have held it: the loop's result is the one unfused loops give.
    fn inline_value(&mut self, n: ValueId) -> Result<Expr, PlanError> {
        let ops = self.g.operand_values(n);
        let dtype = self.g.ty(n).dtype;
        let rounded = |e: Expr| Expr::Cast(dtype, Box::new(e));
        Ok(match self.g.op(n) {
            Op::Bind { axes } => Expr::In(self.add(ops[0], axes)?),
            Op::Gather { index, .. } => self.gather(ops[0], index)?,
            Op::Iota { axis } => {
                Expr::Index(self.axes.iter().position(|a| a == axis).ok_or_else(|| {
                    invalid(format!("inline iota axis `{axis}` is not an axis of the loop"))
                })?)
            }
            Op::Cast => rounded(self.named(ops[0])?),
            Op::Unary(u) => rounded(Expr::Unary(*u, Box::new(self.named(ops[0])?))),
            Op::Binary(b) => {
                let x = self.named(ops[0])?;
                let y = self.named(ops[1])?;
                rounded(Expr::Binary(*b, Box::new(x), Box::new(y)))
            }
            Op::Select => {
                let c = self.named(ops[0])?;
                let x = self.named(ops[1])?;
                let y = self.named(ops[2])?;
                rounded(Expr::Select(Box::new(c), Box::new(x), Box::new(y)))
            }
            op => return Err(invalid(format!("`{}` cannot be inline", op.mnemonic()))),
        })
    }

    /// `gather`'s operand `v` read positionally at `index` (a variable that is not an iteration
    /// axis reads as 0, as in the interpreter, so its term drops).
    fn gather(&mut self, v: Value, index: &[IndexExpr]) -> Result<Expr, PlanError> {
        let ty = self.g.value_ty(v);
        let dims: Vec<Dim> = ty.dims().cloned().collect();
        if index.len() != dims.len() {
            return Err(invalid(format!("{} subscripts for a rank-{} value", index.len(), dims.len())));
        }
        let mut subs = vec![];
        for e in index {
            let terms = e
                .terms
                .iter()
                .filter_map(|(name, c)| self.axes.iter().position(|a| a == name).map(|p| (p, *c)))
                .collect();
            let div = e.div.as_ref().map(|d| self.scalars.get(std::slice::from_ref(d)));
            let dims =
                e.dim_terms.iter().map(|(d, k)| (self.scalars.get(std::slice::from_ref(d)), *k)).collect();
            let clamps = e
                .clamps
                .iter()
                .map(|c| {
                    let ds = c.dim_terms.iter().map(|(d, k)| (self.scalars.get(std::slice::from_ref(d)), *k));
                    SubClamp { kind: c.kind, dims: ds.collect(), constant: c.constant }
                })
                .collect();
            subs.push(Sub { terms, dims, constant: e.constant, div, clamps });
        }
        let sizes = dims.iter().map(|d| self.scalars.get(std::slice::from_ref(d))).collect();
        let strides = (0..dims.len()).map(|p| self.scalars.get(&dims[p + 1..])).collect();
        self.operands.push(v);
        self.srcs.push(Src::Gather { dtype: ty.dtype, subs, sizes, strides });
        Ok(Expr::In(self.srcs.len() - 1))
    }
}

fn invalid(what: String) -> PlanError {
    PlanError::Invalid(what)
}

/// The result's axis names, each once: a store names its positional result by the statement's
/// indices.
fn result_names(op: &Op, ty: &ValueType, rank: usize) -> Result<Vec<String>, PlanError> {
    let rnames: Vec<String> = match op {
        Op::Store { axes } => {
            if axes.len() != rank {
                return Err(invalid("store axes do not match the result rank".into()));
            }
            axes.clone()
        }
        _ => ty.axes.iter().map(|a| a.name.clone()).collect(),
    };
    let mut seen = HashSet::new();
    if !rnames.iter().all(|a| seen.insert(a)) {
        return Err(invalid(format!("repeated result axis in {rnames:?}")));
    }
    Ok(rnames)
}

/// The loop nest of node `n` (an op [`handles`] accepts). `folded(v)` is the compile-time value
/// of an operand without a buffer (a folded scalar); a `sum {contract}` reads its mul's operands
/// (see [`read_through`]).
pub fn plan(g: &Graph, n: ValueId, folded: &dyn Fn(Value) -> Option<f64>) -> Result<LoopPlan, PlanError> {
    let op = g.op(n);
    let ops = g.operand_values(n);
    if !handles(op) {
        return Err(PlanError::Unsupported);
    }
    if let Some(a) = op.arity() {
        if ops.len() != a {
            return Err(invalid(format!("expects {a} operands, has {}", ops.len())));
        }
    }
    let ty = g.ty(n);
    let rdims: Vec<Dim> = ty.dims().cloned().collect();
    let rnames = result_names(op, ty, rdims.len())?;
    // Iteration order: result axes, the op's axis moved last (or appended when reduced).
    let mut order: Vec<usize> = (0..rdims.len()).collect();
    let mut extra: Option<(String, Dim)> = None;
    match op {
        Op::Cumsum { axis, .. } | Op::Softmax { axis } | Op::RmsNorm { axis, .. } => {
            let p = rnames
                .iter()
                .position(|a| a == axis)
                .ok_or_else(|| invalid(format!("axis `{axis}` is not an axis of the value")))?;
            order.retain(|&a| a != p);
            order.push(p);
        }
        Op::Reduce { axis, .. } => {
            if rnames.contains(axis) {
                return Err(invalid(format!("reduced axis `{axis}` is still an axis of the result")));
            }
            // A contracted mul keeps its own type: the axis is found there too.
            let (_, ax) = g
                .value_ty(ops[0])
                .axis(axis)
                .ok_or_else(|| invalid(format!("reduced axis `{axis}` is not an axis of the operand")))?;
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
    // The axis sizes are scalars 0..rank (the GPU kernels read them there).
    let mut scalars = Scalars(sizes.iter().map(|d| vec![d.clone()]).collect());
    let out_strides: Vec<Vec<usize>> =
        out_dims.iter().map(|d| d.map(|d| vec![scalars.get(d)]).unwrap_or_default()).collect();
    let ipos = |axis: &str| axes.iter().position(|a| a == axis);
    let mut body = Body::Map;
    let mut inp = Inputs { g, folded, axes: axes.clone(), scalars, operands: vec![], srcs: vec![] };
    let value = match op {
        Op::Const(c) => Expr::Const(*c),
        Op::DimSize(d) => match folded(Value::of(n)) {
            Some(c) => Expr::Const(c),
            None => Expr::Scalar(inp.scalars.get(std::slice::from_ref(d))),
        },
        Op::Iota { axis } => {
            Expr::Index(ipos(axis).ok_or_else(|| invalid(format!("iota axis `{axis}` not in its type")))?)
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
        Op::Reduce { kind, contract, .. } => {
            body = Body::Reduce(*kind);
            if *contract {
                let mo = g.operand_values(ops[0].node);
                if !matches!(g.op(ops[0].node), Op::Binary(BinaryOp::Mul)) || mo.len() != 2 {
                    return Err(invalid("a contracting sum must read a mul of two operands".into()));
                }
                let x = inp.named(mo[0])?;
                let y = inp.named(mo[1])?;
                Expr::Binary(BinaryOp::Mul, Box::new(x), Box::new(y))
            } else {
                inp.named(ops[0])?
            }
        }
        Op::Cumsum { reverse, .. } => {
            body = Body::Cumsum { reverse: *reverse };
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
            let pi = ipos(i).ok_or_else(|| invalid(format!("mask axis `{i}` not in the value")))?;
            let pj = ipos(j).ok_or_else(|| invalid(format!("mask axis `{j}` not in the value")))?;
            Expr::Mask { i: pi, j: pj, window, x: Box::new(inp.named(ops[0])?) }
        }
        _ => return Err(PlanError::Unsupported),
    };
    Ok(LoopPlan {
        sizes,
        scalars: inp.scalars.0,
        inputs: inp.srcs,
        operands: inp.operands,
        out_strides,
        value,
        body,
    })
}
