//! `grad`: the vector-Jacobian program of an (optimized) graph (docs/SEMANTICS.md,
//! "attention_backward" and "Gradients of the other ops").
//!
//! The gradient program is the forward graph plus a parameter `dout` (the output's type) and,
//! for every float parameter `p`, a value `grad_<p>` = `dL/dp` with `L = sum(out * dout)`, in
//! `p`'s dtype. Reverse mode over the graph: each value gets one adjoint (contributions are
//! added), fused attention becomes one `attention_backward` node that recomputes `P` from the
//! forward's `lse` (result 1), everything else becomes ordinary IR ops, so every backend runs
//! the gradient program with the kernels it already has plus the backward kernel.
//!
//! The forward's attention is given an f32 output in the gradient program (a narrower
//! `out_dtype` becomes a separate `cast`), so that the backward's `delta_i = dout_i . out_i`
//! reads the unrounded output.

use foxc_ir::check::infer;
use foxc_ir::index::IndexExpr;
use foxc_ir::unary::{Chain, StepBuilder};
use foxc_ir::{
    Attention, Axis, BinaryOp, DType, GateKind, Graph, Op, ReduceKind, Span, UnaryOp, Use, Value, ValueId,
    ValueType, LOG_F_FLOOR,
};
use std::collections::{BTreeMap, BTreeSet};

/// A graph and its named outputs: `out` first, then `grad_<param>` for every float parameter
/// (in parameter order).
#[derive(Clone, Debug)]
pub struct GradProgram {
    pub graph: Graph,
    pub outputs: Vec<(String, Value)>,
}

impl GradProgram {
    /// The value of output `name`.
    pub fn output(&self, name: &str) -> Option<Value> {
        self.outputs.iter().find(|(n, _)| n == name).map(|(_, v)| *v)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GradError {
    /// The program uses something the gradient pass cannot differentiate (a user error).
    #[error("cannot differentiate this program: {0}")]
    Unsupported(String),
    #[error("internal error in the gradient pass: {0}")]
    Internal(String),
}

/// The name of the upstream gradient parameter.
pub const DOUT: &str = "dout";

/// The names of the saved forward results in [`gradient_from_saved`]'s program.
pub const SAVED_OUT: &str = "out";
pub const SAVED_LSE: &str = "lse";
/// [`forward_for_saved`]'s name of the attention's unrounded output.
pub const SAVED_OUT_F32: &str = "out_f32";

/// Build the gradient program of `fwd`.
pub fn gradient(fwd: &Graph) -> Result<GradProgram, GradError> {
    let mut g = unfused(fwd)?;
    let out = g.output.ok_or_else(|| GradError::Internal("the graph has no output".into()))?;
    reserve_names(&g, &[DOUT])?;
    widen_attention_outputs(&mut g);
    let out = g.output.unwrap_or(out);
    let out_ty = g.ty(out).clone();
    let dout = g.add_param(DOUT, out_ty, Span::default());
    let mut b = Builder { g, adj: BTreeMap::new(), saved: None };
    b.adj.insert(Value::of(out), Value::of(dout));
    b.reverse(&[dout])?;
    let mut outputs = vec![("out".to_string(), Value::of(out))];
    outputs.extend(b.param_grads(fwd)?);
    foxc_ir::verify::verify(&b.g)
        .map_err(|e| GradError::Internal(format!("the gradient program does not verify: {e}")))?;
    Ok(GradProgram { graph: b.g, outputs })
}

/// The gradient program of `fwd` for a caller that kept the forward's results (torch
/// autograd): the attention is not recomputed. Its results are parameters instead: `out`
/// (f32, the output's shape: the backward reads an f32 `out` as in [`gradient`], so the
/// backends see one operand type) and `lse` (f32 `[B, H, T]`), beside the forward's
/// parameters and `dout` (the output's type). The cheap forward values the backward needs
/// (gate cumsum, threshold, block starts) are recomputed from the parameters, so the kept set
/// is the forward's. Outputs: `grad_<param>` for every float parameter of `fwd` (no `out`).
///
/// `fwd` must be an optimized graph whose output is its one attention's `out`.
pub fn gradient_from_saved(fwd: &Graph) -> Result<GradProgram, GradError> {
    let mut g = unfused(fwd)?;
    let n = saved_attention(&g)?;
    reserve_names(&g, &[DOUT, SAVED_OUT, SAVED_LSE])?;
    let out_ty = g.ty(n).clone();
    let lse_ty = g
        .result_ty(n, Attention::LSE)
        .cloned()
        .ok_or_else(|| GradError::Internal("the attention has no log-sum-exp result".into()))?;
    let dout = g.add_param(DOUT, out_ty.clone(), Span::default());
    let saved_ty = ValueType { dtype: DType::F32, axes: out_ty.axes.clone() };
    let saved_out = g.add_param(SAVED_OUT, saved_ty, Span::default());
    let saved_lse = g.add_param(SAVED_LSE, lse_ty, Span::default());
    let saved = Saved { attention: n, out: Value::of(saved_out), lse: Value::of(saved_lse) };
    let mut b = Builder { g, adj: BTreeMap::new(), saved: Some(saved) };
    b.adj.insert(Value::of(n), Value::of(dout));
    b.reverse(&[dout, saved_out, saved_lse])?;
    let outputs = b.param_grads(fwd)?;
    let Some((_, first)) = outputs.first() else {
        return Err(GradError::Unsupported(format!("`{}` has no float parameter", b.g.name)));
    };
    // The forward attention has no user left: the backward reads the saved results.
    b.g.output = Some(first.node);
    if !b.g.users(n).is_empty() {
        return Err(GradError::Internal("the forward attention is still read".into()));
    }
    b.g.g.remove_node(n);
    foxc_ir::verify::verify(&b.g)
        .map_err(|e| GradError::Internal(format!("the gradient program does not verify: {e}")))?;
    Ok(GradProgram { graph: b.g, outputs })
}

/// The one fused attention of `g`, which must give the output (what [`gradient_from_saved`]
/// and [`forward_for_saved`] take).
fn saved_attention(g: &Graph) -> Result<ValueId, GradError> {
    let out = g.output.ok_or_else(|| GradError::Internal("the graph has no output".into()))?;
    let attns = g.find(|op| matches!(op, Op::Attention(_)));
    let &[n] = attns.as_slice() else {
        let why = if attns.is_empty() {
            " (`foxc compile FILE --emit grad --target TARGET --explain` says why none is fused in a \
             gradient program for that target)"
        } else {
            ""
        };
        return Err(GradError::Unsupported(format!(
            "the saved-forward gradient needs exactly one fused attention, `{}` has {}{why}",
            g.name,
            attns.len()
        )));
    };
    if out != n {
        return Err(GradError::Unsupported(format!(
            "the saved-forward gradient needs the output of `{}` to be its attention's output, found `{}` after it",
            g.name,
            g.op(out).mnemonic()
        )));
    }
    Ok(n)
}

/// The forward whose results feed [`gradient_from_saved`] exactly: `fwd` with its attention's
/// output widened to f32 (a narrower output dtype becomes a `cast` after it), and the values to
/// compute: `out` (the program's output), `lse` and, when the output is narrower than f32,
/// `out_f32` (the attention's unrounded output). The backward's `delta_i = dout_i . out_i` then
/// reads the unrounded output, as [`gradient`]'s does: a rounded `out` puts its rounding into
/// `delta`, which the decay gradients (sums of `dS` that cancel) amplify.
pub fn forward_for_saved(fwd: &Graph) -> Result<(Graph, Vec<(String, Value)>), GradError> {
    let mut g = unfused(fwd)?;
    let n = saved_attention(&g)?;
    widen_attention_outputs(&mut g);
    let out = g.output.ok_or_else(|| GradError::Internal("the graph has no output".into()))?;
    let mut outputs = vec![
        ("out".to_string(), Value::of(out)),
        (SAVED_LSE.to_string(), Value { node: n, result: Attention::LSE }),
    ];
    if out != n {
        outputs.push((SAVED_OUT_F32.to_string(), Value::of(n)));
    }
    foxc_ir::verify::verify(&g)
        .map_err(|e| GradError::Internal(format!("the widened forward does not verify: {e}")))?;
    Ok((g, outputs))
}

/// Parameters the gradient program adds must not clash with the program's own.
fn reserve_names(g: &Graph, names: &[&str]) -> Result<(), GradError> {
    match names.iter().find(|n| g.param(n).is_some()) {
        Some(n) => Err(GradError::Unsupported(format!("a parameter is already named `{n}`"))),
        None => Ok(()),
    }
}

/// `fwd` unfused: every attention's epilogue moved back into IR ops after it
/// ([`crate::fuse_epilogue::unfuse`]) and every load map back into the statement it was
/// ([`crate::fuse_load_map::unfuse`]): the gradient pass differentiates those.
fn unfused(fwd: &Graph) -> Result<Graph, GradError> {
    let mut g = fwd.clone();
    for n in g.find(|op| matches!(op, Op::Attention(a) if a.epilogue.is_some())) {
        crate::fuse_epilogue::unfuse(&mut g, n)
            .map_err(|e| GradError::Internal(format!("moving the epilogue out of %{}: {e}", n.index())))?;
    }
    for m in g.find(|op| matches!(op, Op::LoadMap { .. })) {
        crate::fuse_load_map::unfuse(&mut g, m)
            .map_err(|e| GradError::Internal(format!("storing the load map %{}: {e}", m.index())))?;
    }
    Ok(g)
}

/// Give every attention an f32 `out` and move a narrower `out_dtype` into a following `cast`.
fn widen_attention_outputs(g: &mut Graph) {
    for n in g.find(|op| matches!(op, Op::Attention(a) if a.out_dtype != DType::F32)) {
        let Op::Attention(a) = g.op(n).clone() else { continue };
        let narrow = g.ty(n).clone();
        let mut wide = a.clone();
        wide.out_dtype = DType::F32;
        let node = g.node_mut(n);
        node.op = Op::Attention(wide);
        node.ty.dtype = DType::F32;
        let span = node.span;
        let name = node.name.take();
        let cast = g.add(Op::Cast, narrow, &[], span);
        g.replace_value_uses(Value::of(n), Value::of(cast));
        g.g.add_edge(n, cast, Use { pos: 0, result: 0 });
        g.node_mut(cast).name = name;
    }
}

/// The attention whose results the caller saved, and the parameters holding them.
struct Saved {
    attention: ValueId,
    out: Value,
    lse: Value,
}

struct Builder {
    g: Graph,
    /// The adjoint of every value that has one so far (f32, the value's axes).
    adj: BTreeMap<Value, Value>,
    /// Set by [`gradient_from_saved`]: the backward of this attention reads these.
    saved: Option<Saved>,
}

impl Builder {
    /// Reverse mode over every node that depends on a float parameter other than `inputs`
    /// (the parameters the gradient program added), from the last to the first.
    fn reverse(&mut self, inputs: &[ValueId]) -> Result<(), GradError> {
        let live = self.depends_on_float_params(inputs);
        let order: Vec<ValueId> = self.g.topo_order();
        for &n in order.iter().rev() {
            if inputs.contains(&n) || !live.contains(&n) {
                continue;
            }
            self.node_grad(n, &live)?;
        }
        Ok(())
    }

    /// `grad_<p>` for every float parameter `p` of `fwd`, each in `p`'s dtype (zeros where `p`
    /// does not reach the output).
    fn param_grads(&mut self, fwd: &Graph) -> Result<Vec<(String, Value)>, GradError> {
        let mut outputs = vec![];
        for p in &fwd.params {
            if !p.ty.dtype.is_float() {
                continue;
            }
            let ty = self.g.ty(p.node).clone();
            let grad = match self.adj.get(&Value::of(p.node)).copied() {
                Some(v) => self.conform(v, &ty)?,
                None => self.zeros_like(&ty)?,
            };
            // Every output in the parameter's dtype.
            let grad = if ty.dtype != DType::F32 {
                Value::of(self.g.add_multi(Op::Cast, vec![ty.clone()], &[grad], Span::default()))
            } else {
                grad
            };
            outputs.push((format!("grad_{}", p.name), grad));
        }
        Ok(outputs)
    }

    /// Nodes that depend on some float parameter other than `inputs` (only they get adjoints).
    fn depends_on_float_params(&self, inputs: &[ValueId]) -> BTreeSet<ValueId> {
        let mut live = BTreeSet::new();
        for n in self.g.topo_order() {
            let from_param = match self.g.op(n) {
                Op::Param { .. } => !inputs.contains(&n) && self.g.ty(n).dtype.is_float(),
                _ => false,
            };
            if from_param || self.g.operands(n).iter().any(|o| live.contains(o)) {
                live.insert(n);
            }
        }
        live
    }

    fn internal(e: String) -> GradError {
        GradError::Internal(e)
    }

    /// Add a node whose type `infer` derives.
    fn op(&mut self, op: Op, operands: &[Value]) -> Result<Value, GradError> {
        let tys: Vec<&ValueType> = operands.iter().map(|&v| self.g.value_ty(v)).collect();
        let ty = infer(&op, &tys)
            .map_err(|e| Self::internal(format!("{}: {e}", op.mnemonic())))?
            .ok_or_else(|| Self::internal(format!("{} needs an explicit type", op.mnemonic())))?;
        Ok(Value::of(self.g.add_multi(op, vec![ty], operands, Span::default())))
    }

    fn cnst(&mut self, c: f64) -> Value {
        Value::of(self.g.add(Op::Const(c), ValueType::scalar(DType::F32), &[], Span::default()))
    }

    fn un(&mut self, u: UnaryOp, a: Value) -> Result<Value, GradError> {
        self.op(Op::Unary(u), &[a])
    }

    fn bin(&mut self, o: BinaryOp, a: Value, b: Value) -> Result<Value, GradError> {
        self.op(Op::Binary(o), &[a, b])
    }

    fn select(&mut self, c: Value, a: Value, b: Value) -> Result<Value, GradError> {
        self.op(Op::Select, &[c, a, b])
    }

    fn reduce_sum(&mut self, v: Value, axis: &str) -> Result<Value, GradError> {
        self.op(Op::Reduce { kind: ReduceKind::Sum, axis: axis.to_string(), contract: false }, &[v])
    }

    /// Zeros with the single axis `axis` (an iota times 0: finite, so never NaN).
    fn zeros_axis(&mut self, axis: &Axis) -> Result<Value, GradError> {
        let ty = ValueType { dtype: DType::F32, axes: vec![axis.clone()] };
        let iota = Value::of(self.g.add(Op::Iota { axis: axis.name.clone() }, ty, &[], Span::default()));
        let z = self.cnst(0.0);
        self.bin(BinaryOp::Mul, iota, z)
    }

    fn zeros_like(&mut self, ty: &ValueType) -> Result<Value, GradError> {
        let z = self.cnst(0.0);
        self.broadcast_to(z, ty)
    }

    /// `v` broadcast to every axis of `ty` (adding zeros), in `ty`'s order.
    fn broadcast_to(&mut self, v: Value, ty: &ValueType) -> Result<Value, GradError> {
        let mut v = v;
        for a in &ty.axes {
            if self.g.value_ty(v).axis(&a.name).is_none() {
                let z = self.zeros_axis(a)?;
                v = self.bin(BinaryOp::Add, v, z)?;
            }
        }
        self.conform(v, ty)
    }

    /// `v` (whose axes are `ty`'s, by name, in any order) with `ty`'s axis order.
    fn conform(&mut self, v: Value, ty: &ValueType) -> Result<Value, GradError> {
        let vt = self.g.value_ty(v).clone();
        let names = |t: &ValueType| t.axes.iter().map(|a| a.name.clone()).collect::<Vec<_>>();
        let (have, want) = (names(&vt), names(ty));
        if have == want {
            return Ok(v);
        }
        let mut hs = have.clone();
        let mut ws = want.clone();
        hs.sort();
        ws.sort();
        if hs != ws {
            return Err(Self::internal(format!("cannot lay out {vt} as {ty}")));
        }
        let p = self.op(Op::Store { axes: want.clone() }, &[v])?;
        if ty.is_positional() {
            Ok(p)
        } else {
            self.op(Op::Bind { axes: want }, &[p])
        }
    }

    /// `v` summed over the axes `ty` lacks, laid out as `ty`.
    fn sum_to(&mut self, v: Value, ty: &ValueType) -> Result<Value, GradError> {
        let mut v = v;
        let extra: Vec<String> = self
            .g
            .value_ty(v)
            .axes
            .iter()
            .filter(|a| ty.axis(&a.name).is_none())
            .map(|a| a.name.clone())
            .collect();
        for a in extra {
            v = self.reduce_sum(v, &a)?;
        }
        self.broadcast_to(v, ty)
    }

    /// The adjoint of `x` from a gather `y = x[e_0(v), ..]` whose subscripts read every element
    /// at most once: each subscript is `+-v + offset` in its own variable `v` (`t - 1`,
    /// `d + D / 2`, `T - 1 - i`) or a number (`slope[h, 0]`). Then `dx[p] = dy[v(p)]` where
    /// `v(p) = +-(p - offset)` lies in `v`'s axis (and `p = offset` on a number's axis), 0
    /// elsewhere: a gather of `dy` under explicit range conditions (not the gather's NaN, which
    /// would hide a NaN gradient). Subscripts that read an element many times (`i - j`,
    /// `h / (H / G)`, a variable in two subscripts) need a scatter-add and are refused.
    fn gather_grad(
        &mut self,
        x: Value,
        index: &[IndexExpr],
        y: Value,
        dy: Value,
    ) -> Result<Value, GradError> {
        let refuse = |why: &str| {
            Err(GradError::Unsupported(format!(
                "no gradient rule for `gather` with subscripts [{}]: {why}",
                index.iter().map(|e| e.to_string()).collect::<Vec<_>>().join(", ")
            )))
        };
        let xt = self.g.value_ty(x).clone();
        let yt = self.g.value_ty(y).clone();
        // Per axis of x: `Some((v, c))` for `c * v + offset`, `None` for a number.
        let mut inverse: Vec<Option<(String, i64)>> = vec![];
        for e in index {
            if e.div.is_some() {
                return refuse("a divided subscript reads an element many times");
            }
            if !e.clamps.is_empty() {
                return refuse("a clamped subscript (`min` / `max`) reads its bound element many times");
            }
            match (e.vars().as_slice(), e.terms.iter().map(|(_, c)| *c).sum::<i64>()) {
                ([], _) => inverse.push(None),
                ([v], c @ (1 | -1)) => {
                    if inverse.iter().flatten().any(|(w, _)| w == v) {
                        return refuse("a variable in two subscripts");
                    }
                    inverse.push(Some((v.to_string(), c)));
                }
                _ => return refuse("a subscript of several variables (or a coefficient other than 1 or -1) reads an element many times"),
            }
        }
        let p = |k: usize| format!("__grad_p{k}");
        // dy positional, read back at v(p).
        let order: Vec<String> = yt.axes.iter().map(|a| a.name.clone()).collect();
        let dyp = self.op(Op::Store { axes: order.clone() }, &[dy])?;
        let mut back = vec![];
        for name in &order {
            let (k, (e, (_, c))) = index
                .iter()
                .zip(&inverse)
                .enumerate()
                .find_map(|(k, (e, inv))| inv.as_ref().filter(|(v, _)| v == name).map(|i| (k, (e, i))))
                .ok_or_else(|| Self::internal(format!("gather result axis `{name}` is in no subscript")))?;
            // v = c * (p - offset) = c * p - c * offset.
            back.push(IndexExpr {
                terms: vec![(p(k), *c)],
                dim_terms: e.dim_terms.iter().map(|(d, x)| (d.clone(), -c * x)).collect(),
                constant: -c * e.constant,
                div: None,
                clamps: vec![],
            });
        }
        let mut axes: Vec<Axis> = vec![];
        for (k, inv) in inverse.iter().enumerate() {
            if inv.is_some() {
                axes.push(Axis::new(&p(k), xt.axes[k].dim.clone()));
            }
        }
        let names: Vec<String> = axes.iter().map(|a| a.name.clone()).collect();
        let gty = ValueType { dtype: DType::F32, axes };
        let mut d = Value::of(self.g.add_multi(
            Op::Gather { index: back, axes: names },
            vec![gty],
            &[dyp],
            Span::default(),
        ));
        let zero = self.cnst(0.0);
        for (k, (e, inv)) in index.iter().zip(&inverse).enumerate() {
            let axis = Axis::new(&p(k), xt.axes[k].dim.clone());
            let ity = ValueType { dtype: DType::F32, axes: vec![axis] };
            let at = Value::of(self.g.add(Op::Iota { axis: p(k) }, ity, &[], Span::default()));
            let offset = self.dim_form(e)?;
            let conds = match inv {
                None => vec![self.bin(BinaryOp::Eq, at, offset)?],
                Some((v, c)) => {
                    // v(p) in [0, size(v)).
                    let rel = self.bin(BinaryOp::Sub, at, offset)?;
                    let cv = self.cnst(*c as f64);
                    let vp = self.bin(BinaryOp::Mul, cv, rel)?;
                    let size = yt
                        .axis(v)
                        .map(|(_, a)| a.dim.clone())
                        .ok_or_else(|| Self::internal(format!("no axis `{v}`")))?;
                    let n = self.op(Op::DimSize(size), &[])?;
                    vec![self.bin(BinaryOp::Ge, vp, zero)?, self.bin(BinaryOp::Lt, vp, n)?]
                }
            };
            for cond in conds {
                d = self.select(cond, d, zero)?;
            }
        }
        let out: Vec<String> = (0..index.len()).map(p).collect();
        self.op(Op::Store { axes: out }, &[d])
    }

    /// `constant + sum k * dim` of a subscript, as an f32 scalar value.
    fn dim_form(&mut self, e: &IndexExpr) -> Result<Value, GradError> {
        let mut acc = self.cnst(e.constant as f64);
        for (d, k) in &e.dim_terms {
            let dv = self.op(Op::DimSize(d.clone()), &[])?;
            let kv = self.cnst(*k as f64);
            let t = self.bin(BinaryOp::Mul, kv, dv)?;
            acc = self.bin(BinaryOp::Add, acc, t)?;
        }
        Ok(acc)
    }

    /// Add `contribution` (laid out as `target`'s type after `sum_to`) to `target`'s adjoint.
    fn accumulate(&mut self, target: Value, contribution: Value) -> Result<(), GradError> {
        let ty = self.g.value_ty(target).clone();
        let c = self.sum_to(contribution, &ty)?;
        let sum = match self.adj.get(&target).copied() {
            None => c,
            Some(prev) => self.bin(BinaryOp::Add, prev, c)?,
        };
        self.adj.insert(target, sum);
        Ok(())
    }

    /// The contributions of node `n` to its operands' adjoints.
    fn node_grad(&mut self, n: ValueId, live: &BTreeSet<ValueId>) -> Result<(), GradError> {
        let ops = self.g.operand_values(n);
        let wants = |k: usize| ops.get(k).is_some_and(|o| live.contains(&o.node));
        let op = self.g.op(n).clone();
        if let Op::Attention(a) = &op {
            return self.attention_grad(n, a, &ops, live);
        }
        let Some(dy) = self.adj.get(&Value::of(n)).copied() else { return Ok(()) };
        let y = Value::of(n);
        match op {
            Op::Param { .. } | Op::Const(_) | Op::DimSize(_) | Op::Iota { .. } => {}
            // Step functions: zero derivative almost everywhere.
            Op::Threshold { .. } | Op::BlockBoundary(_) => {}
            Op::Cast => {
                if wants(0) {
                    self.accumulate(ops[0], dy)?;
                }
            }
            Op::Unary(u) => {
                if wants(0) {
                    let d = self.unary_grad(u, ops[0], y, dy)?;
                    self.accumulate(ops[0], d)?;
                }
            }
            Op::Binary(bo) if bo.is_comparison() => {}
            Op::Binary(bo) => {
                let (x, z) = (ops[0], ops[1]);
                let (dx, dz) = self.binary_grad(bo, x, z, y, dy, wants(0), wants(1))?;
                if let Some(d) = dx {
                    self.accumulate(x, d)?;
                }
                if let Some(d) = dz {
                    self.accumulate(z, d)?;
                }
            }
            Op::Select => {
                let zero = self.cnst(0.0);
                if wants(1) {
                    let d = self.select(ops[0], dy, zero)?;
                    self.accumulate(ops[1], d)?;
                }
                if wants(2) {
                    let d = self.select(ops[0], zero, dy)?;
                    self.accumulate(ops[2], d)?;
                }
            }
            Op::Reduce { kind, axis, .. } => {
                if wants(0) {
                    let xt = self.g.value_ty(ops[0]).clone();
                    let db = self.broadcast_to(dy, &xt)?;
                    let d = match kind {
                        ReduceKind::Sum => db,
                        ReduceKind::Max => {
                            // To every entry equal to the maximum.
                            let yb = self.broadcast_to(y, &xt)?;
                            let at = self.bin(BinaryOp::Eq, ops[0], yb)?;
                            let zero = self.cnst(0.0);
                            self.select(at, db, zero)?
                        }
                    };
                    let _ = axis;
                    self.accumulate(ops[0], d)?;
                }
            }
            Op::Cumsum { axis, reverse } => {
                if wants(0) {
                    // The adjoint of a prefix sum is the suffix sum, and the other way round.
                    let d = self.op(Op::Cumsum { axis, reverse: !reverse }, &[dy])?;
                    self.accumulate(ops[0], d)?;
                }
            }
            Op::Softmax { axis } => {
                if wants(0) {
                    // dx = y (dy - sum_axis(dy y)).
                    let dyy = self.bin(BinaryOp::Mul, dy, y)?;
                    let s = self.reduce_sum(dyy, &axis)?;
                    let yt = self.g.value_ty(y).clone();
                    let s = self.broadcast_to(s, &yt)?;
                    let diff = self.bin(BinaryOp::Sub, dy, s)?;
                    let d = self.bin(BinaryOp::Mul, y, diff)?;
                    self.accumulate(ops[0], d)?;
                }
            }
            Op::Causal { .. } | Op::Window { .. } => {
                if wants(0) {
                    // Pass dy where the mask keeps the entry: the same mask applied to zeros.
                    let xt = self.g.value_ty(ops[0]).clone();
                    let z = self.zeros_like(&xt)?;
                    let m = self.op(op.clone(), &[z])?;
                    let zero = self.cnst(0.0);
                    let keep = self.bin(BinaryOp::Eq, m, zero)?;
                    let d = self.select(keep, dy, zero)?;
                    self.accumulate(ops[0], d)?;
                }
            }
            Op::Bind { axes } => {
                if wants(0) {
                    let d = self.op(Op::Store { axes }, &[dy])?;
                    self.accumulate(ops[0], d)?;
                }
            }
            Op::Store { axes } => {
                if wants(0) {
                    let d = self.op(Op::Bind { axes }, &[dy])?;
                    self.accumulate(ops[0], d)?;
                }
            }
            Op::Gather { index, .. } => {
                if wants(0) {
                    let d = self.gather_grad(ops[0], &index, y, dy)?;
                    self.accumulate(ops[0], d)?;
                }
            }
            Op::RmsNorm { axis, eps } => self.rmsnorm_grad(&ops, &axis, eps, dy, wants(0), wants(1))?,
            Op::GateCumsum { kind, .. } => {
                if wants(0) {
                    self.gate_cumsum_grad(kind, ops[0], dy)?;
                }
            }
            other => {
                return Err(GradError::Unsupported(format!("no gradient rule for `{}`", other.mnemonic())));
            }
        }
        Ok(())
    }

    /// `dx` of `y = u(x)` from `dy`: the op's derivative (`foxc_ir::unary`) built as graph nodes.
    fn unary_grad(&mut self, u: UnaryOp, x: Value, y: Value, dy: Value) -> Result<Value, GradError> {
        let d = &u.def().derivative;
        let s = d.build(self, x, y)?;
        Ok(match d.chain {
            Chain::Scale(a) => self.bin(BinaryOp::Mul, dy, s.arg(a))?,
            Chain::Divide(a) => self.bin(BinaryOp::Div, dy, s.arg(a))?,
            Chain::Negate => self.un(UnaryOp::Neg, dy)?,
            Chain::Where { cond, zero } => self.select(s.arg(cond), dy, s.arg(zero))?,
            Chain::Sign { pos, neg, zero } => {
                let ndy = self.un(UnaryOp::Neg, dy)?;
                let inner = self.select(s.arg(neg), ndy, s.arg(zero))?;
                self.select(s.arg(pos), dy, inner)?
            }
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn binary_grad(
        &mut self,
        bo: BinaryOp,
        x: Value,
        z: Value,
        y: Value,
        dy: Value,
        want_x: bool,
        want_z: bool,
    ) -> Result<(Option<Value>, Option<Value>), GradError> {
        use BinaryOp::*;
        let mut dx = None;
        let mut dz = None;
        match bo {
            Add => {
                dx = want_x.then_some(dy);
                dz = want_z.then_some(dy);
            }
            Sub => {
                dx = want_x.then_some(dy);
                if want_z {
                    dz = Some(self.un(UnaryOp::Neg, dy)?);
                }
            }
            Mul => {
                if want_x {
                    dx = Some(self.bin(Mul, dy, z)?);
                }
                if want_z {
                    dz = Some(self.bin(Mul, dy, x)?);
                }
            }
            Div => {
                if want_x {
                    dx = Some(self.bin(Div, dy, z)?);
                }
                if want_z {
                    // d(x/z)/dz = -(x/z)/z.
                    let t = self.bin(Mul, dy, y)?;
                    let t = self.bin(Div, t, z)?;
                    dz = Some(self.un(UnaryOp::Neg, t)?);
                }
            }
            Min | Max => {
                // The operand picked gets dy; the first one on ties.
                let first = self.bin(if bo == Min { Le } else { Ge }, x, z)?;
                let zero = self.cnst(0.0);
                if want_x {
                    dx = Some(self.select(first, dy, zero)?);
                }
                if want_z {
                    dz = Some(self.select(first, zero, dy)?);
                }
            }
            Lt | Le | Gt | Ge | Eq | Ne => {}
        }
        Ok((dx, dz))
    }

    /// `y = x r w`, `r = rsqrt(mean_axis(x^2) + eps)`:
    /// `dx = r w dy - x r^3 / n sum_axis(x w dy)`, `dw = sum_{other axes}(dy x r)`.
    fn rmsnorm_grad(
        &mut self,
        ops: &[Value],
        axis: &str,
        eps: f64,
        dy: Value,
        want_x: bool,
        want_w: bool,
    ) -> Result<(), GradError> {
        use BinaryOp::*;
        let (x, w) = (ops[0], ops[1]);
        let xt = self.g.value_ty(x).clone();
        let wt = self.g.value_ty(w).clone();
        let (_, ax) =
            xt.axis(axis).ok_or_else(|| Self::internal(format!("rmsnorm axis `{axis}` not in {xt}")))?;
        let dim = ax.dim.clone();
        // The weight under the normalized axis's name (after passes it is positional `[D]`).
        let wn = if wt.axis(axis).is_some() {
            w
        } else {
            self.op(Op::Bind { axes: vec![axis.to_string()] }, &[w])?
        };
        let n = Value::of(self.g.add(Op::DimSize(dim), ValueType::scalar(DType::F32), &[], Span::default()));
        let xx = self.bin(Mul, x, x)?;
        let ss = self.reduce_sum(xx, axis)?;
        let ms = self.bin(Div, ss, n)?;
        let e = self.cnst(eps);
        let ms = self.bin(Add, ms, e)?;
        let r = self.un(UnaryOp::Rsqrt, ms)?;
        if want_x {
            let wdy = self.bin(Mul, wn, dy)?;
            let t1 = self.bin(Mul, r, wdy)?;
            let xw = self.bin(Mul, x, wdy)?;
            let s = self.reduce_sum(xw, axis)?;
            let r2 = self.bin(Mul, r, r)?;
            let r3 = self.bin(Mul, r2, r)?;
            let k = self.bin(Div, r3, n)?;
            let ks = self.bin(Mul, k, s)?;
            let t2 = self.bin(Mul, x, ks)?;
            let d = self.bin(Sub, t1, t2)?;
            let d = self.conform(d, &xt)?;
            self.accumulate(x, d)?;
        }
        if want_w {
            let xr = self.bin(Mul, x, r)?;
            let t = self.bin(Mul, dy, xr)?;
            let mut v = t;
            let others: Vec<String> =
                self.g.value_ty(v).axes.iter().filter(|a| a.name != axis).map(|a| a.name.clone()).collect();
            for a in others {
                v = self.reduce_sum(v, &a)?;
            }
            let v = if wt.axis(axis).is_some() {
                v
            } else {
                self.op(Op::Store { axes: vec![axis.to_string()] }, &[v])?
            };
            self.accumulate(w, v)?;
        }
        Ok(())
    }

    /// `c_t = sum_{l <= t} max(log f_l, LOG_F_FLOOR)` on `[B, H, T]`: `g = reverse cumsum of dc`,
    /// then through the gate (zero where the floor is active).
    fn gate_cumsum_grad(&mut self, kind: GateKind, x: Value, dc: Value) -> Result<(), GradError> {
        use BinaryOp::*;
        let g = self.op(Op::Cumsum { axis: "2".into(), reverse: true }, &[dc])?;
        let floor = self.cnst(LOG_F_FLOOR);
        let zero = self.cnst(0.0);
        let d = match kind {
            GateKind::Logits => {
                let lf = self.un(UnaryOp::LogSigmoid, x)?;
                let keep = self.bin(Ge, lf, floor)?;
                let nx = self.un(UnaryOp::Neg, x)?;
                let s = self.un(UnaryOp::Sigmoid, nx)?;
                let gs = self.bin(Mul, g, s)?;
                self.select(keep, gs, zero)?
            }
            GateKind::LogGate => {
                let keep = self.bin(Ge, x, floor)?;
                self.select(keep, g, zero)?
            }
            GateKind::Slope => {
                // log f = -m[h] for every (b, t): dm[h] = -sum_{b, t} g.
                let s = self.reduce_sum(g, "2")?;
                let s = self.reduce_sum(s, "0")?;
                let s = self.op(Op::Store { axes: vec!["1".into()] }, &[s])?;
                let lf = self.un(UnaryOp::Neg, x)?;
                let keep = self.bin(Ge, lf, floor)?;
                let ns = self.un(UnaryOp::Neg, s)?;
                self.select(keep, ns, zero)?
            }
        };
        self.accumulate(x, d)
    }

    /// One `attention_backward` node; its results feed q, k, v, c and the float captures.
    fn attention_grad(
        &mut self,
        n: ValueId,
        a: &Attention,
        ops: &[Value],
        live: &BTreeSet<ValueId>,
    ) -> Result<(), GradError> {
        if self.adj.contains_key(&Value { node: n, result: Attention::LSE }) {
            return Err(GradError::Unsupported("the gradient through an attention's log-sum-exp".into()));
        }
        let Some(dy) = self.adj.get(&Value::of(n)).copied() else { return Ok(()) };
        let out_ty = self.g.ty(n).clone();
        let dy = self.conform(dy, &out_ty)?;
        let (out, lse) = match &self.saved {
            Some(s) if s.attention == n => (s.out, s.lse),
            _ => (Value::of(n), Value { node: n, result: Attention::LSE }),
        };
        let mut operands = ops.to_vec();
        operands.extend([out, lse, dy]);
        let tys: Vec<&ValueType> = operands.iter().map(|&v| self.g.value_ty(v)).collect();
        let rtys =
            a.backward_result_types(&tys).map_err(|e| Self::internal(format!("attention_backward: {e}")))?;
        let bw = self.g.add_multi(Op::AttentionBackward(a.clone()), rtys, &operands, Span::default());
        // Result r of the backward goes to operand `targets[r]`.
        let fixed = a.fixed_operands();
        let mut targets = vec![ops[0], ops[1], ops[2]];
        if a.decay {
            targets.push(ops[3]);
        }
        for &c in &ops[fixed..] {
            if self.g.value_ty(c).dtype.is_float() {
                targets.push(c);
            }
        }
        for (r, t) in targets.into_iter().enumerate() {
            if live.contains(&t.node) {
                self.accumulate(t, Value { node: bw, result: r as u32 })?;
            }
        }
        Ok(())
    }
}

/// Gradient programs build derivative steps as graph nodes.
impl StepBuilder for Builder {
    type Value = Value;
    type Error = GradError;
    fn step_const(&mut self, c: f64) -> Result<Value, GradError> {
        Ok(self.cnst(c))
    }
    fn step_unary(&mut self, op: UnaryOp, x: Value) -> Result<Value, GradError> {
        self.un(op, x)
    }
    fn step_binary(&mut self, op: BinaryOp, x: Value, y: Value) -> Result<Value, GradError> {
        self.bin(op, x, y)
    }
}
