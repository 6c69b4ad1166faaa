//! The f64 reference interpreter: executes any verified graph on host tensors. It is the oracle of
//! every test, so it favours obviously-correct loops over speed, with two exceptions that keep
//! realistic shapes runnable:
//! - the fused attention ops run row by row, heads spread over the cores (the result does not
//!   depend on the split), and never materialize a `T x T` matrix;
//! - a `mul` whose only user is a `sum` is never materialized: the `sum` contracts its two
//!   operands directly (so the unfused `sum(d, q * k)` costs `T*T` values, not `T*T*D`). Every
//!   `sum {contract}` (the `contract` pass's decision for the CPU backend) is such a sum, and this
//!   is its meaning: the sum of the products, each product `x * y` in f64.
//!
//! Numerics (documented contract, tests rely on it):
//! - every value is f64 whatever its declared dtype; only `cast` rounds (bf16/f16 through the
//!   `half` crate, f32 by `as f32`, i32 truncating toward zero and saturating, NaN -> 0 as Rust's
//!   `as` does, bool as `x != 0`). Parameters are used as given (the caller read them in their
//!   dtype already).
//! - comparisons give 1.0 / 0.0 (NaN compares false except `ne`); `select` takes `a` where the
//!   condition is non-zero.
//! - NaN propagates: `min`, `max`, `reduce_max`, the gate floor and the threshold minimum return
//!   NaN when an operand is NaN (unlike `f64::max`). The runtime, not the interpreter, reports it.
//! - `softmax`: entries of `-inf` get weight 0; a row whose entries are all `-inf` (or an empty
//!   row) gives all zeros, not NaN. The fused attention ops do the same for an empty or fully
//!   masked row (output 0).
//! - `reduce_max` over an empty axis gives `-inf`, `sum` gives 0.
//!
//! Any intermediate of more than [`MAX_ELEMENTS`] elements is an error asking for a smaller shape.

pub mod backward;

pub mod acp;
pub mod attention;
mod load_map;
pub mod region;

use crate::graph::{Graph, Value, ValueId};
use crate::ops::{BinaryOp, GateKind, Op, ReduceKind, UnaryOp, LOG_F_FLOOR};
use crate::shapes::{bind_dims, bind_dims_partial, concrete_shape, DimBindings, ShapeError};
use crate::types::DType;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::rc::Rc;

/// Largest intermediate (in elements) the interpreter will allocate: 2^28 f64 = 2 GiB.
pub const MAX_ELEMENTS: u128 = 1 << 28;

/// A dense row-major f64 tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

impl Tensor {
    /// A tensor from its shape and row-major data (panics if they disagree: test helper).
    pub fn new(shape: &[usize], data: Vec<f64>) -> Tensor {
        assert_eq!(shape.iter().product::<usize>(), data.len(), "shape does not match data");
        Tensor { shape: shape.to_vec(), data }
    }

    /// A tensor from its shape and row-major data, or `None` if they disagree.
    pub fn try_new(shape: &[usize], data: Vec<f64>) -> Option<Tensor> {
        let n = shape.iter().try_fold(1usize, |a, &s| a.checked_mul(s))?;
        (n == data.len()).then(|| Tensor { shape: shape.to_vec(), data })
    }

    pub fn from_fn(shape: &[usize], f: impl FnMut(usize) -> f64) -> Tensor {
        let n = shape.iter().product();
        Tensor { shape: shape.to_vec(), data: (0..n).map(f).collect() }
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Element at a multi-index (panics when out of bounds: test helper).
    pub fn at(&self, idx: &[usize]) -> f64 {
        self.data[linear(&self.shape, idx)]
    }
}

fn linear(shape: &[usize], idx: &[usize]) -> usize {
    assert_eq!(shape.len(), idx.len(), "index rank");
    idx.iter().zip(shape).fold(0, |acc, (&i, &n)| {
        assert!(i < n, "index out of bounds");
        acc * n + i
    })
}

/// Statistics of one pruned `attention` node (see docs/SEMANTICS.md).
#[derive(Clone, Debug, PartialEq)]
pub struct PruneStats {
    pub node: ValueId,
    /// Sum over (b, h, m) of `diag(m) - start[m] + 1` (clamped to `[0, diag(m) + 1]`).
    pub kept_tiles: u64,
    /// Sum over (b, h, m) of `diag(m) + 1`: the causal tiles.
    pub total_tiles: u64,
    /// Largest pruned mass of any row: the dense softmax weight of the keys it skipped.
    pub max_pruned_mass: f64,
}

impl PruneStats {
    pub fn kept_fraction(&self) -> f64 {
        if self.total_tiles == 0 {
            1.0
        } else {
            self.kept_tiles as f64 / self.total_tiles as f64
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct RunResult {
    pub output: Tensor,
    /// One entry per pruned `attention` node evaluated, in topological order.
    pub prune: Vec<PruneStats>,
}

#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum InterpError {
    #[error(transparent)]
    Shape(#[from] ShapeError),
    #[error("graph `{0}` has no output")]
    NoOutput(String),
    #[error("input tensor `{0}` is required but was not given")]
    MissingInput(String),
    #[error("input tensor `{tensor}` has shape {shape:?} ({expected} elements) but {got} values")]
    BadInputData { tensor: String, shape: Vec<usize>, expected: usize, got: usize },
    #[error("input tensor `{tensor}` has shape {got:?}, but the graph needs {expected:?}")]
    InputShape { tensor: String, expected: Vec<usize>, got: Vec<usize> },
    #[error(
        "{node} would hold {elements} elements (shape {shape:?}), more than the reference interpreter's limit of 2^28; use a smaller shape (e.g. a smaller T or B)"
    )]
    TooLarge { node: String, elements: u128, shape: Vec<usize> },
    #[error("target node {0} is not in the graph")]
    UnknownTarget(usize),
    /// The program cannot run at these sizes (a user error: per-head thresholds given for
    /// another number of heads).
    #[error("{0}")]
    Refused(String),
    /// The graph is not one the verifier would accept (an internal error, not a user error).
    #[error("malformed graph at {node}: {what}")]
    Malformed { node: String, what: String },
}

/// A value during evaluation: named axes (positional values use "0", "1", ...), sizes, data.
#[derive(Clone, Debug)]
struct Val {
    axes: Vec<String>,
    shape: Vec<usize>,
    data: Rc<Vec<f64>>,
}

impl Val {
    fn strides(&self) -> Vec<usize> {
        row_strides(&self.shape)
    }

    fn pos(&self, axis: &str) -> Option<usize> {
        self.axes.iter().position(|a| a == axis)
    }
}

fn row_strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Iterate the row-major index space of `shape`, tracking one offset per operand (`strides[k]`
/// gives operand k's stride for each output axis; 0 broadcasts), and collect `f(offsets)`.
fn gather<const N: usize>(
    shape: &[usize],
    strides: [&[usize]; N],
    mut f: impl FnMut([usize; N]) -> f64,
) -> Vec<f64> {
    let n: usize = shape.iter().product();
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return out;
    }
    let r = shape.len();
    let mut idx = vec![0usize; r];
    let mut offs = [0usize; N];
    loop {
        out.push(f(offs));
        // odometer increment
        let mut ax = r;
        loop {
            if ax == 0 {
                return out;
            }
            ax -= 1;
            idx[ax] += 1;
            for k in 0..N {
                offs[k] += strides[k][ax];
            }
            if idx[ax] < shape[ax] {
                break;
            }
            for k in 0..N {
                offs[k] -= strides[k][ax] * shape[ax];
            }
            idx[ax] = 0;
        }
    }
}

/// `max` that keeps a NaN (f64::max drops it): the one definition every consumer uses.
pub fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

/// `min` that keeps a NaN (f64::min drops it).
pub fn nan_min(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.min(b)
    }
}

pub use crate::unary::logsigmoid;

/// `op(x)`: the definition every backend calls for elementwise math (the op's row, `crate::unary`).
pub fn unary(u: UnaryOp, x: f64) -> f64 {
    u.eval(x)
}

/// `x op y`: the definition every backend calls (comparisons give 1 or 0).
pub fn binary(b: BinaryOp, x: f64, y: f64) -> f64 {
    let t = |c: bool| if c { 1.0 } else { 0.0 };
    match b {
        BinaryOp::Add => x + y,
        BinaryOp::Sub => x - y,
        BinaryOp::Mul => x * y,
        BinaryOp::Div => x / y,
        BinaryOp::Min => nan_min(x, y),
        BinaryOp::Max => nan_max(x, y),
        BinaryOp::Lt => t(x < y),
        BinaryOp::Le => t(x <= y),
        BinaryOp::Gt => t(x > y),
        BinaryOp::Ge => t(x >= y),
        BinaryOp::Eq => t(x == y),
        BinaryOp::Ne => t(x != y),
    }
}

/// `x * n` where `n` is a count (an exact integer computed from indices, dims and integer
/// constants, such as the distance `i - j`): `n` copies of `x` added, so a zero count gives 0
/// even for an infinite `x` (ALiBi's `slope * (i - j)` at distance 0 with a slope of `inf`,
/// declared legal by `in [0, inf]`; the fused kernels, which see it as a gate of `-inf`, agree).
/// NaN still propagates.
pub fn mul_by_count(x: f64, n: f64) -> f64 {
    if n == 0.0 && x.is_infinite() {
        0.0
    } else {
        x * n
    }
}

/// A cumsum term of `-inf` (a hard reset: `log f = -inf`) is taken as [`LOG_F_FLOOR`], as
/// `gate_cumsum` does, so that differences of the sum stay finite: two positions after the same
/// reset have a finite decay between them, which `-inf - -inf` would turn into NaN.
fn cumsum_term(x: f64) -> f64 {
    if x == f64::NEG_INFINITY {
        LOG_F_FLOOR
    } else {
        x
    }
}

/// `x` rounded to nearest, ties to even, to a binary float of `mantissa` stored bits whose normal
/// exponents run `min_exp..=max_exp` (subnormals below, infinity above); infinities, NaN and the
/// sign of zero kept. Not `half`'s `from_f64`: it looks at the f64's upper 32 bits only, so a
/// value just above a tie whose extra bits sit in the lower word rounds down (1 + 2^-8 + 2^-23
/// to bf16 gave 1, not 1 + 2^-7: about 1 value in 10^4 of random f32 ones).
pub fn round_to_float(x: f64, mantissa: i32, min_exp: i32, max_exp: i32) -> f64 {
    if !x.is_finite() || x == 0.0 {
        return x;
    }
    // The exponent of x (f64 subnormals are far below every target's range: they round to 0).
    let e = ((x.to_bits() >> 52) & 0x7ff) as i32 - 1023;
    let q = (e.max(min_exp) - mantissa).clamp(-1022, 1023);
    let r = (x * 2f64.powi(-q)).round_ties_even() * 2f64.powi(q);
    if r.abs() >= 2f64.powi(max_exp + 1) {
        return f64::INFINITY.copysign(x);
    }
    r
}

/// `x` rounded to `dt` as `cast` defines it.
pub fn cast(dt: DType, x: f64) -> f64 {
    match dt {
        DType::BF16 => round_to_float(x, 7, -126, 127),
        DType::F16 => round_to_float(x, 10, -14, 15),
        DType::F32 => x as f32 as f64,
        DType::I32 => (x as i32) as f64,
        DType::I64 => (x as i64) as f64,
        DType::Bool => {
            if x != 0.0 {
                1.0
            } else {
                0.0
            }
        }
    }
}

/// Run the whole graph: every parameter must be given; returns the output and pruning stats.
pub fn run(g: &Graph, inputs: &BTreeMap<String, Tensor>) -> Result<RunResult, InterpError> {
    let out = g.output.ok_or_else(|| InterpError::NoOutput(g.name.clone()))?;
    let shapes: Vec<(String, Vec<usize>)> =
        inputs.iter().map(|(k, t)| (k.clone(), t.shape.clone())).collect();
    let dims = bind_dims(g, &shapes)?;
    let mut ev = Evaluator::new(g, inputs, dims, &[out])?;
    let mut vals = ev.eval_all()?;
    let v = vals.remove(&out).ok_or_else(|| malformed(g, out, "output was not computed"))?;
    Ok(RunResult { output: v, prune: ev.prune })
}

/// Evaluate only what `targets` need and return every result of each target (`lse` of an
/// attention is `Value { node, result: 1 }`).
pub fn eval_values(
    g: &Graph,
    inputs: &BTreeMap<String, Tensor>,
    targets: &[Value],
) -> Result<BTreeMap<Value, Tensor>, InterpError> {
    let nodes: Vec<ValueId> = targets.iter().map(|v| v.node).collect();
    let shapes: Vec<(String, Vec<usize>)> =
        inputs.iter().map(|(k, t)| (k.clone(), t.shape.clone())).collect();
    let dims = bind_dims_partial(g, &shapes)?;
    let mut ev = Evaluator::new(g, inputs, dims, &nodes)?;
    let firsts = ev.eval_all()?;
    let mut out = BTreeMap::new();
    for v in targets {
        let t = if v.result == 0 {
            firsts.get(&v.node).cloned()
        } else {
            ev.target_more.get(&(v.node, v.result)).cloned()
        };
        out.insert(*v, t.ok_or_else(|| malformed(g, v.node, format!("has no result {}", v.result)))?);
    }
    Ok(out)
}

/// Evaluate only what `targets` need (parameters not needed may be absent from `inputs`).
/// Used to compute thresholds and block boundaries at long T without running attention.
pub fn eval(
    g: &Graph,
    inputs: &BTreeMap<String, Tensor>,
    targets: &[ValueId],
) -> Result<BTreeMap<ValueId, Tensor>, InterpError> {
    let shapes: Vec<(String, Vec<usize>)> =
        inputs.iter().map(|(k, t)| (k.clone(), t.shape.clone())).collect();
    let dims = bind_dims_partial(g, &shapes)?;
    let mut ev = Evaluator::new(g, inputs, dims, targets)?;
    ev.eval_all()
}

/// The nodes of `order` (operands first) whose values are exact integers made from indices,
/// dims and integer constants by `+`, `-`, `*`, `min`, `max` and negation.
/// Whether constant `c` is a count (an exact integer well inside f64's integers).
pub(crate) fn is_count_const(c: f64) -> bool {
    c.fract() == 0.0 && c.abs() < 9.0e15
}

/// Whether `b` of two counts is a count.
pub(crate) fn keeps_counts(b: BinaryOp) -> bool {
    matches!(b, BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Min | BinaryOp::Max)
}

fn count_nodes(g: &Graph, order: &[ValueId]) -> HashSet<ValueId> {
    let mut counts = HashSet::new();
    for &n in order {
        let all = |c: &HashSet<ValueId>| g.operands(n).iter().all(|o| c.contains(o));
        let is_count = match g.op(n) {
            Op::Iota { .. } | Op::DimSize(_) => true,
            Op::Const(c) => is_count_const(*c),
            Op::Unary(UnaryOp::Neg) => all(&counts),
            Op::Binary(b) if keeps_counts(*b) => all(&counts),
            _ => false,
        };
        if is_count {
            counts.insert(n);
        }
    }
    counts
}

fn describe(g: &Graph, id: ValueId) -> String {
    let n = g.node(id);
    match &n.name {
        Some(name) => format!("node %{} `{}` ({})", id.index(), name, n.op.mnemonic()),
        None => format!("node %{} ({})", id.index(), n.op.mnemonic()),
    }
}

fn malformed(g: &Graph, id: ValueId, what: impl Into<String>) -> InterpError {
    InterpError::Malformed { node: describe(g, id), what: what.into() }
}

struct Evaluator<'a> {
    g: &'a Graph,
    inputs: &'a BTreeMap<String, Tensor>,
    dims: DimBindings,
    order: Vec<ValueId>,
    targets: BTreeSet<ValueId>,
    /// Remaining uses of each needed value (freed at zero unless a target).
    uses: HashMap<ValueId, usize>,
    /// `mul` nodes contracted directly by their single `sum` user.
    deferred: BTreeSet<ValueId>,
    /// Nodes whose values are counts (see [`mul_by_count`]).
    counts: HashSet<ValueId>,
    vals: HashMap<ValueId, Val>,
    prune: Vec<PruneStats>,
    /// Results beyond the first of the node being evaluated (set by `eval_node`).
    pending_more: Vec<Val>,
    /// Results beyond the first of live multi-result nodes.
    more: HashMap<ValueId, Vec<Val>>,
    /// Results beyond the first of the targets, `(node, result)`.
    target_more: BTreeMap<(ValueId, u32), Tensor>,
}

impl<'a> Evaluator<'a> {
    fn new(
        g: &'a Graph,
        inputs: &'a BTreeMap<String, Tensor>,
        dims: DimBindings,
        targets: &[ValueId],
    ) -> Result<Evaluator<'a>, InterpError> {
        let mut needed = BTreeSet::new();
        let mut stack = Vec::new();
        for &t in targets {
            if !g.g.contains_node(t) {
                return Err(InterpError::UnknownTarget(t.index()));
            }
            stack.push(t);
        }
        while let Some(n) = stack.pop() {
            if needed.insert(n) {
                stack.extend(g.operands(n));
            }
        }
        let targets: BTreeSet<ValueId> = targets.iter().copied().collect();
        let order: Vec<ValueId> = g.topo_order().into_iter().filter(|n| needed.contains(n)).collect();
        let mut uses: HashMap<ValueId, usize> = HashMap::new();
        for &n in &order {
            for o in g.operands(n) {
                *uses.entry(o).or_default() += 1;
            }
        }
        let mut deferred = BTreeSet::new();
        for &n in &order {
            if matches!(g.op(n), Op::Binary(BinaryOp::Mul)) && !targets.contains(&n) {
                let users: Vec<ValueId> = g.users(n).into_iter().filter(|u| needed.contains(u)).collect();
                if users.len() == 1
                    && uses.get(&n) == Some(&1)
                    && matches!(g.op(users[0]), Op::Reduce { kind: ReduceKind::Sum, .. })
                {
                    deferred.insert(n);
                }
            }
        }
        let counts = count_nodes(g, &order);
        Ok(Evaluator {
            g,
            inputs,
            counts,
            dims,
            order,
            targets,
            uses,
            deferred,
            vals: HashMap::new(),
            prune: vec![],
            pending_more: vec![],
            more: HashMap::new(),
            target_more: BTreeMap::new(),
        })
    }

    fn eval_all(&mut self) -> Result<BTreeMap<ValueId, Tensor>, InterpError> {
        let order = std::mem::take(&mut self.order);
        let mut out = BTreeMap::new();
        for n in order {
            if self.deferred.contains(&n) {
                continue;
            }
            let v = self.eval_node(n)?;
            if self.targets.contains(&n) {
                out.insert(n, Tensor { shape: v.shape.clone(), data: v.data.as_ref().clone() });
            }
            self.vals.insert(n, v);
            let more = std::mem::take(&mut self.pending_more);
            if !more.is_empty() {
                if self.targets.contains(&n) {
                    for (r, m) in more.iter().enumerate() {
                        let t = Tensor { shape: m.shape.clone(), data: m.data.as_ref().clone() };
                        self.target_more.insert((n, r as u32 + 1), t);
                    }
                }
                self.more.insert(n, more);
            }
            // Free operands that nobody needs any more (deferred muls' operands included).
            let mut ops = self.g.operands(n);
            let mut i = 0;
            while i < ops.len() {
                let o = ops[i];
                if self.deferred.contains(&o) {
                    ops.extend(self.g.operands(o));
                }
                if let Some(c) = self.uses.get_mut(&o) {
                    *c = c.saturating_sub(1);
                    if *c == 0 && !self.targets.contains(&o) {
                        self.vals.remove(&o);
                        self.more.remove(&o);
                    }
                }
                i += 1;
            }
        }
        Ok(out)
    }

    fn err(&self, id: ValueId, what: impl Into<String>) -> InterpError {
        malformed(self.g, id, what)
    }

    /// Operand `v` (any result of a computed node) of node `of`.
    fn val(&self, v: impl Into<Value>, of: ValueId) -> Result<&Val, InterpError> {
        self.value(v.into(), of)
    }

    /// Any result of a computed node.
    fn value(&self, v: Value, of: ValueId) -> Result<&Val, InterpError> {
        match v.result {
            0 => self.vals.get(&v.node).ok_or_else(|| self.err(of, "operand not computed")),
            r => self
                .more
                .get(&v.node)
                .and_then(|m| m.get(r as usize - 1))
                .ok_or_else(|| self.err(of, "operand result not computed")),
        }
    }

    fn operands(&self, id: ValueId) -> Result<Vec<Value>, InterpError> {
        let ops = self.g.operand_values(id);
        if let Some(a) = self.g.op(id).arity() {
            if ops.len() != a {
                return Err(self.err(id, format!("expects {a} operands, has {}", ops.len())));
            }
        }
        Ok(ops)
    }

    /// Concrete shape and axis names of node `id`'s declared type, with the size guard.
    fn node_layout(&self, id: ValueId) -> Result<(Vec<String>, Vec<usize>), InterpError> {
        let ty = self.g.ty(id);
        let shape = concrete_shape(ty, &self.dims)?;
        let elements: u128 = shape.iter().map(|&s| s as u128).product();
        if elements > MAX_ELEMENTS {
            return Err(InterpError::TooLarge { node: describe(self.g, id), elements, shape });
        }
        Ok((ty.axes.iter().map(|a| a.name.clone()).collect(), shape))
    }

    /// Strides of `v` for an output of axes `axes`/`shape` (0 where `v` lacks the axis).
    fn bstrides(
        &self,
        id: ValueId,
        v: &Val,
        axes: &[String],
        shape: &[usize],
    ) -> Result<Vec<usize>, InterpError> {
        let vs = v.strides();
        for a in &v.axes {
            if !axes.contains(a) {
                return Err(self.err(id, format!("operand axis `{a}` is not an axis of the result {axes:?}")));
            }
        }
        let mut st = Vec::with_capacity(axes.len());
        for (a, &n) in axes.iter().zip(shape) {
            // Summing the strides of repeated axes takes a diagonal (`bind [i, i]`).
            let mut s = 0;
            for (p, name) in v.axes.iter().enumerate() {
                if name == a {
                    if v.shape[p] != n {
                        return Err(self.err(
                            id,
                            format!("operand axis `{a}` has size {}, the result has {n}", v.shape[p]),
                        ));
                    }
                    s += vs[p];
                }
            }
            st.push(s);
        }
        Ok(st)
    }

    /// `gather`: every result element reads `a` at its computed subscripts, NaN outside `a`.
    fn gather_op(
        &self,
        id: ValueId,
        a: &Val,
        index: &[crate::index::IndexExpr],
        axes: &[String],
        shape: &[usize],
    ) -> Result<Vec<f64>, InterpError> {
        let dims = |s: &str| self.dims.get(s);
        for e in index {
            if let Some(d) = &e.div {
                if let Some((x, xv, y, yv)) = d.failed_division(&dims) {
                    return Err(
                        self.err(id, format!("{x} = {xv} is not divisible by {y} = {yv} (needed by `{e}`)"))
                    );
                }
                if d.eval(&dims).is_none() {
                    return Err(ShapeError::Unbound { dim: d.to_string() }.into());
                }
            }
        }
        let ast = a.strides();
        let n: usize = shape.iter().product();
        let st = row_strides(shape);
        let mut out = Vec::with_capacity(n);
        for l in 0..n {
            let coord =
                |v: &str| axes.iter().position(|x| x == v).map_or(0, |p| ((l / st[p]) % shape[p]) as i64);
            let mut off = Some(0usize);
            for (p, e) in index.iter().enumerate() {
                off = match (off, e.eval(&coord, &dims)) {
                    (Some(o), Some(x)) if x >= 0 && (x as usize) < a.shape[p] => {
                        Some(o + x as usize * ast[p])
                    }
                    _ => None,
                };
            }
            out.push(off.map_or(f64::NAN, |o| a.data[o]));
        }
        Ok(out)
    }

    /// `v` laid out (broadcast, transposed) as `axes`/`shape`.
    fn conform(&self, id: ValueId, v: &Val, axes: &[String], shape: &[usize]) -> Result<Val, InterpError> {
        if v.axes == axes && v.shape == shape {
            return Ok(v.clone());
        }
        let st = self.bstrides(id, v, axes, shape)?;
        let d = &v.data;
        let data = gather(shape, [&st], |[o]| d[o]);
        Ok(Val { axes: axes.to_vec(), shape: shape.to_vec(), data: Rc::new(data) })
    }

    fn eval_node(&mut self, id: ValueId) -> Result<Val, InterpError> {
        let g = self.g;
        let op = g.op(id);
        let ops = self.operands(id)?;
        let (axes, shape) = self.node_layout(id)?;
        let mk = |data: Vec<f64>| Val { axes: axes.clone(), shape: shape.clone(), data: Rc::new(data) };
        let n: usize = shape.iter().product();
        let v = match op {
            Op::Param { name, index } => {
                let t = self.inputs.get(name).ok_or_else(|| InterpError::MissingInput(name.clone()))?;
                if t.data.len() != t.numel() {
                    return Err(InterpError::BadInputData {
                        tensor: name.clone(),
                        shape: t.shape.clone(),
                        expected: t.numel(),
                        got: t.data.len(),
                    });
                }
                if t.shape != shape {
                    return Err(InterpError::InputShape {
                        tensor: name.clone(),
                        expected: shape,
                        got: t.shape.clone(),
                    });
                }
                // An i64 parameter enters the graph narrowed to its i32 value type.
                let p = &g.params[*index];
                if p.storage.is_some() {
                    mk(t.data.iter().map(|&x| cast(p.ty.dtype, x)).collect())
                } else {
                    mk(t.data.clone())
                }
            }
            Op::Const(c) => mk(vec![*c; n]),
            Op::DimSize(d) => {
                let s = self.dims.eval(d).ok_or_else(|| ShapeError::Unbound { dim: d.to_string() })?;
                mk(vec![s as f64; n])
            }
            Op::Iota { axis } => {
                let p = axes
                    .iter()
                    .position(|a| a == axis)
                    .ok_or_else(|| self.err(id, "iota axis not in its type"))?;
                let st = row_strides(&shape);
                mk((0..n).map(|l| ((l / st[p]) % shape[p]) as f64).collect())
            }
            Op::Bind { axes: names } => {
                let a = self.val(ops[0], id)?;
                if names.len() != a.axes.len() {
                    return Err(
                        self.err(id, format!("binds {} names to a rank-{} value", names.len(), a.axes.len()))
                    );
                }
                let renamed = Val { axes: names.clone(), shape: a.shape.clone(), data: a.data.clone() };
                self.conform(id, &renamed, &axes, &shape)?
            }
            Op::Gather { index, axes: _ } => {
                let a = self.val(ops[0], id)?;
                mk(self.gather_op(id, a, index, &axes, &shape)?)
            }
            Op::Store { axes: names } => {
                let a = self.val(ops[0], id)?;
                if names.len() != shape.len() {
                    return Err(self.err(id, "store axes do not match the result rank"));
                }
                let st = self.bstrides(id, a, names, &shape)?;
                let d = &a.data;
                mk(gather(&shape, [&st], |[o]| d[o]))
            }
            Op::Unary(u) => {
                let a = self.conform(id, self.val(ops[0], id)?, &axes, &shape)?;
                mk(a.data.iter().map(|&x| unary(*u, x)).collect())
            }
            Op::Binary(b) => {
                let (x, y) = (self.val(ops[0], id)?, self.val(ops[1], id)?);
                let sx = self.bstrides(id, x, &axes, &shape)?;
                let sy = self.bstrides(id, y, &axes, &shape)?;
                let (dx, dy) = (&x.data, &y.data);
                let (cx, cy) = (self.counts.contains(&ops[0].node), self.counts.contains(&ops[1].node));
                if *b == BinaryOp::Mul && (cx || cy) {
                    let f = |x: f64, y: f64| if cy { mul_by_count(x, y) } else { mul_by_count(y, x) };
                    mk(gather(&shape, [&sx, &sy], |[i, j]| f(dx[i], dy[j])))
                } else {
                    mk(gather(&shape, [&sx, &sy], |[i, j]| binary(*b, dx[i], dy[j])))
                }
            }
            Op::Select => {
                let (c, x, y) = (self.val(ops[0], id)?, self.val(ops[1], id)?, self.val(ops[2], id)?);
                let sc = self.bstrides(id, c, &axes, &shape)?;
                let sx = self.bstrides(id, x, &axes, &shape)?;
                let sy = self.bstrides(id, y, &axes, &shape)?;
                let (dc, dx, dy) = (&c.data, &x.data, &y.data);
                mk(gather(&shape, [&sc, &sx, &sy], |[k, i, j]| if dc[k] != 0.0 { dx[i] } else { dy[j] }))
            }
            Op::Reduce { kind, axis, .. } => {
                if self.deferred.contains(&ops[0].node) {
                    return self.contract(id, ops[0].node, axis, axes, shape);
                }
                let a = self.val(ops[0], id)?;
                let p = a
                    .pos(axis)
                    .ok_or_else(|| self.err(id, format!("reduced axis `{axis}` not in the operand")))?;
                let (len, stride) = (a.shape[p], a.strides()[p]);
                let mut raxes = a.axes.clone();
                raxes.remove(p);
                let mut rshape = a.shape.clone();
                rshape.remove(p);
                let mut ost = a.strides();
                ost.remove(p);
                let d = &a.data;
                let data = gather(&rshape, [&ost], |[o]| {
                    let it = (0..len).map(|k| d[o + k * stride]);
                    match kind {
                        ReduceKind::Sum => it.sum(),
                        ReduceKind::Max => it.fold(f64::NEG_INFINITY, nan_max),
                    }
                });
                let r = Val { axes: raxes, shape: rshape, data: Rc::new(data) };
                self.conform(id, &r, &axes, &shape)?
            }
            Op::Cumsum { axis, reverse } => {
                let a = self.conform(id, self.val(ops[0], id)?, &axes, &shape)?;
                let p = a
                    .pos(axis)
                    .ok_or_else(|| self.err(id, format!("cumsum axis `{axis}` not in the value")))?;
                let stride = a.strides()[p];
                let mut d: Vec<f64> = a.data.iter().map(|&x| cumsum_term(x)).collect();
                // Row-major order visits `l - stride` before `l`, so one pass is a prefix sum;
                // the reverse order visits `l + stride` first, so one pass is a suffix sum.
                let n = shape[p];
                if *reverse {
                    for l in (0..d.len()).rev() {
                        if (l / stride) % n + 1 < n {
                            d[l] += d[l + stride];
                        }
                    }
                } else {
                    for l in 0..d.len() {
                        if (l / stride) % n > 0 {
                            d[l] += d[l - stride];
                        }
                    }
                }
                mk(d)
            }
            Op::Softmax { axis } => {
                let a = self.conform(id, self.val(ops[0], id)?, &axes, &shape)?;
                let p = a
                    .pos(axis)
                    .ok_or_else(|| self.err(id, format!("softmax axis `{axis}` not in the value")))?;
                let mut d = a.data.as_ref().clone();
                for_each_line(&shape, p, |idx| softmax_line(&mut d, idx));
                mk(d)
            }
            Op::Causal { i, j } | Op::Window { i, j, .. } => {
                let window = if let Op::Window { size, .. } = op { Some(*size) } else { None };
                let a = self.conform(id, self.val(ops[0], id)?, &axes, &shape)?;
                let pi = a.pos(i).ok_or_else(|| self.err(id, format!("mask axis `{i}` not in the value")))?;
                let pj = a.pos(j).ok_or_else(|| self.err(id, format!("mask axis `{j}` not in the value")))?;
                let st = row_strides(&shape);
                let d = a.data.iter().enumerate().map(|(l, &x)| {
                    let (ci, cj) = ((l / st[pi]) % shape[pi], (l / st[pj]) % shape[pj]);
                    let visible = cj <= ci && window.is_none_or(|w| ((ci - cj) as u64) < w);
                    if visible {
                        x
                    } else {
                        f64::NEG_INFINITY
                    }
                });
                mk(d.collect())
            }
            Op::RmsNorm { axis, eps } => {
                let a = self.conform(id, self.val(ops[0], id)?, &axes, &shape)?;
                let w = self.val(ops[1], id)?;
                let p = a
                    .pos(axis)
                    .ok_or_else(|| self.err(id, format!("rmsnorm axis `{axis}` not in the value")))?;
                if w.shape.len() != 1 || w.shape[0] != shape[p] {
                    return Err(self.err(
                        id,
                        format!("rmsnorm weight has shape {:?}, expected [{}]", w.shape, shape[p]),
                    ));
                }
                let mut d = a.data.as_ref().clone();
                let wd = &w.data;
                for_each_line(&shape, p, |idx| {
                    let ms = idx.clone().map(|l| d[l] * d[l]).sum::<f64>() / idx.len() as f64;
                    let r = 1.0 / (ms + eps).sqrt();
                    for (k, l) in idx.enumerate() {
                        d[l] = d[l] * r * wd[k];
                    }
                });
                mk(d)
            }
            Op::Cast => {
                let a = self.conform(id, self.val(ops[0], id)?, &axes, &shape)?;
                let dt = g.ty(id).dtype;
                mk(a.data.iter().map(|&x| cast(dt, x)).collect())
            }
            Op::GateCumsum { kind, .. } => mk(self.gate_cumsum(id, *kind, ops[0], &shape)?),
            Op::GateCumsumLo { kind } => {
                // The f32 rounding residual of the same f64 cumsum (docs/SEMANTICS.md).
                let c = self.gate_cumsum(id, *kind, ops[0], &shape)?;
                mk(c.iter().map(|&c| (c - c as f32 as f64) as f32 as f64).collect())
            }
            Op::Threshold { .. } => mk(self.threshold(id, &ops, &shape)?),
            Op::BlockBoundary(_) => mk(self.block_boundary(id, &ops, &shape)?),
            Op::Attention(_) => {
                let (out, lse) = self.attention_node(id)?;
                self.pending_more = vec![lse];
                out
            }
            Op::LoadMap { .. } => mk(self.load_map(id, &ops, &shape)?),
            Op::AttentionBackward(_) => {
                let mut rs = self.attention_backward_node(id)?;
                self.pending_more = rs.split_off(1);
                rs.remove(0)
            }
        };
        if v.shape != shape {
            return Err(self.err(id, format!("computed shape {:?}, declared {:?}", v.shape, shape)));
        }
        Ok(v)
    }

    /// `sum(axis, x * y)` without materializing `x * y`.
    fn contract(
        &self,
        id: ValueId,
        mul: ValueId,
        axis: &str,
        axes: Vec<String>,
        shape: Vec<usize>,
    ) -> Result<Val, InterpError> {
        let mo = self.operands(mul)?;
        let (x, y) = (self.val(mo[0], mul)?, self.val(mo[1], mul)?);
        let (maxes, mshape) = self.node_layout_unguarded(mul)?;
        let p = maxes
            .iter()
            .position(|a| a == axis)
            .ok_or_else(|| self.err(id, "reduced axis not in operand"))?;
        let len = mshape[p];
        let sx = self.bstrides(mul, x, &maxes, &mshape)?;
        let sy = self.bstrides(mul, y, &maxes, &mshape)?;
        // Output strides of x and y: drop the reduced axis, then follow the sum's own layout.
        let mut oaxes = maxes.clone();
        oaxes.remove(p);
        let pick = |s: &[usize]| -> Result<Vec<usize>, InterpError> {
            axes.iter()
                .map(|a| {
                    let q = oaxes
                        .iter()
                        .position(|b| b == a)
                        .ok_or_else(|| self.err(id, "result axis not in operand"))?;
                    let q = if q >= p { q + 1 } else { q };
                    Ok(s[q])
                })
                .collect()
        };
        let (ox, oy) = (pick(&sx)?, pick(&sy)?);
        let (kx, ky) = (sx[p], sy[p]);
        let (dx, dy) = (&x.data, &y.data);
        let data =
            gather(&shape, [&ox, &oy], |[i, j]| (0..len).map(|k| dx[i + k * kx] * dy[j + k * ky]).sum());
        Ok(Val { axes, shape, data: Rc::new(data) })
    }

    fn node_layout_unguarded(&self, id: ValueId) -> Result<(Vec<String>, Vec<usize>), InterpError> {
        let ty = self.g.ty(id);
        Ok((ty.axes.iter().map(|a| a.name.clone()).collect(), concrete_shape(ty, &self.dims)?))
    }

    fn positional(
        &self,
        id: ValueId,
        operand: impl Into<Value>,
        rank: usize,
        what: &str,
    ) -> Result<&Val, InterpError> {
        let v = self.val(operand, id)?;
        if v.shape.len() != rank {
            return Err(self.err(id, format!("operand {what} has shape {:?}, expected rank {rank}", v.shape)));
        }
        Ok(v)
    }

    fn gate_cumsum(
        &self,
        id: ValueId,
        kind: GateKind,
        x: Value,
        shape: &[usize],
    ) -> Result<Vec<f64>, InterpError> {
        if shape.len() != 3 {
            return Err(self.err(id, "gate_cumsum result must be [B, H, T]"));
        }
        let (b, h, t) = (shape[0], shape[1], shape[2]);
        let v = match kind {
            GateKind::Slope => self.positional(id, x, 1, "m")?,
            _ => self.positional(id, x, 3, "gate")?,
        };
        let expect: Vec<usize> = if kind == GateKind::Slope { vec![h] } else { shape.to_vec() };
        if v.shape != expect {
            return Err(self.err(id, format!("gate operand has shape {:?}, expected {expect:?}", v.shape)));
        }
        let mut out = vec![0.0; b * h * t];
        for bi in 0..b {
            for hi in 0..h {
                let base = (bi * h + hi) * t;
                let mut acc = 0.0;
                for ti in 0..t {
                    let lf = match kind {
                        GateKind::Logits => logsigmoid(v.data[base + ti]),
                        GateKind::LogGate => v.data[base + ti],
                        GateKind::Slope => -v.data[hi],
                    };
                    acc += nan_max(lf, LOG_F_FLOOR);
                    out[base + ti] = acc;
                }
            }
        }
        Ok(out)
    }
}

/// Call `f` with the linear indices of every line of `shape` along axis `p`.
fn for_each_line(shape: &[usize], p: usize, mut f: impl FnMut(std::iter::StepBy<std::ops::Range<usize>>)) {
    let st = row_strides(shape);
    let (len, stride) = (shape[p], st[p]);
    let outer: usize = shape[..p].iter().product();
    for o in 0..outer {
        for inner in 0..stride {
            let base = o * len * stride + inner;
            f((base..base + len * stride).step_by(stride.max(1)));
        }
    }
}

fn softmax_line(d: &mut [f64], idx: std::iter::StepBy<std::ops::Range<usize>>) {
    let mx = idx.clone().fold(f64::NEG_INFINITY, |a, l| a.max(d[l]));
    let has_nan = idx.clone().any(|l| d[l].is_nan());
    if mx == f64::NEG_INFINITY && !has_nan {
        // All entries masked: weight 0 everywhere rather than 0/0.
        for l in idx {
            d[l] = 0.0;
        }
        return;
    }
    let mut z = 0.0;
    for l in idx.clone() {
        d[l] = (d[l] - mx).exp();
        z += d[l];
    }
    for l in idx {
        d[l] /= z;
    }
}
