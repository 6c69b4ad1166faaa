//! An elementwise statement as an attention region and back: the `fuse-epilogue` and
//! `fuse-load-maps` passes turn the cone of ops below a store into a [`Region`] over the
//! store's axes (`b, h, i, j`), read by a kernel where it loads or stores a tensor; their
//! inverses (for the gradient pass) emit the region as IR ops again.

use foxc_ir::attention::{IndexVar, RId, RNode, Region};
use foxc_ir::check::infer;
use foxc_ir::index::IndexExpr;
use foxc_ir::{Axis, DType, Graph, Op, Span, Value, ValueId, ValueType};
use std::collections::{BTreeMap, BTreeSet};

/// Builds the region of a cone: the values `is_x` picks are `x`, the store's axes `b, h, i, j`,
/// every other tensor read a capture (numbered in order of first read).
pub(crate) struct ConeBuilder<'g> {
    g: &'g Graph,
    is_x: &'g dyn Fn(ValueId) -> bool,
    axes: &'g [String],
    pub region: Region,
    /// The captured tensors, by capture number.
    pub captures: Vec<ValueId>,
    /// The cone's values and their region nodes.
    pub built: BTreeMap<ValueId, RId>,
}

impl<'g> ConeBuilder<'g> {
    pub fn new(g: &'g Graph, axes: &'g [String], is_x: &'g dyn Fn(ValueId) -> bool) -> ConeBuilder<'g> {
        ConeBuilder { g, is_x, axes, region: Region::new(), captures: vec![], built: BTreeMap::new() }
    }

    fn var(&self, axis: &str) -> Result<IndexVar, String> {
        let p = self
            .axes
            .iter()
            .position(|a| a == axis)
            .ok_or_else(|| format!("it reads the index `{axis}`, which is not one of the statement's"))?;
        Ok(IndexVar::ALL[p])
    }

    /// `e` with the store's axis names replaced by `b, h, i, j`.
    fn rename(&self, e: &IndexExpr) -> Result<IndexExpr, String> {
        e.rename_vars(|v| Ok(self.var(v)?.name().to_string()))
    }

    fn capture(&mut self, v: Value, index: Vec<IndexExpr>) -> Result<RNode, String> {
        if v.result != 0 {
            return Err("it reads a second result of an op".into());
        }
        let k = match self.captures.iter().position(|c| *c == v.node) {
            Some(k) => k,
            None => {
                self.captures.push(v.node);
                self.captures.len() - 1
            }
        };
        Ok(RNode::Capture { k, index })
    }

    /// The region node of value `v` of the cone (built once), `Err` saying why the cone is not
    /// a region: a reduction, a cast inside, an axis the store does not have.
    pub fn add(&mut self, v: ValueId) -> Result<RId, String> {
        if let Some(&r) = self.built.get(&v) {
            return Ok(r);
        }
        let g = self.g;
        let ops = g.operand_values(v);
        let node = if (self.is_x)(v) {
            RNode::Score
        } else {
            match g.op(v) {
                Op::Const(c) => RNode::Const(*c),
                Op::DimSize(d) => RNode::Dim(d.clone()),
                Op::Iota { axis } => RNode::Index(self.var(axis)?),
                Op::Bind { axes } => {
                    let index = axes
                        .iter()
                        .map(|a| Ok(IndexExpr::var(self.var(a)?.name())))
                        .collect::<Result<_, String>>()?;
                    self.capture(ops[0], index)?
                }
                Op::Gather { index, .. } => {
                    let index = index.iter().map(|e| self.rename(e)).collect::<Result<_, _>>()?;
                    self.capture(ops[0], index)?
                }
                Op::Unary(u) => RNode::Unary(*u, self.add(ops[0].node)?),
                Op::Binary(b) => {
                    let (x, y) = (self.add(ops[0].node)?, self.add(ops[1].node)?);
                    RNode::Binary(*b, x, y)
                }
                Op::Select => {
                    let (c, x, y) = (self.add(ops[0].node)?, self.add(ops[1].node)?, self.add(ops[2].node)?);
                    RNode::Select(c, x, y)
                }
                Op::Cast => return Err("it rounds inside (a cast before its last op)".into()),
                op => return Err(format!("it computes a `{}`", op.mnemonic())),
            }
        };
        if !matches!(node, RNode::Score) && g.ty(v).axes.iter().any(|a| !self.axes.contains(&a.name)) {
            return Err(format!("%{} has an axis the statement does not", v.index()));
        }
        let r = self.region.push(node);
        self.built.insert(v, r);
        Ok(r)
    }
}

/// Emits `region` as IR ops over the named `axes` (`b, h, i, j` in order), its `x` the value
/// `x` (read through a `bind` to the axes) and capture `k` the tensor `captures[k]`: the value
/// of its root, f32 (`Err` where a capture is missing or an op does not type).
pub(crate) fn emit_ops(
    g: &mut Graph,
    region: &Region,
    captures: &[ValueId],
    axes: &[Axis],
    x: Value,
    span: Span,
) -> Result<Value, String> {
    let names: Vec<String> = axes.iter().map(|a| a.name.clone()).collect();
    let named = |dtype: DType| ValueType { dtype, axes: axes.to_vec() };
    let mut vals: Vec<Value> = Vec::with_capacity(region.nodes.len());
    for rn in &region.nodes {
        let add =
            |g: &mut Graph, op: Op, ty: Option<ValueType>, operands: &[Value]| -> Result<Value, String> {
                let ty = match ty {
                    Some(t) => t,
                    None => {
                        let tys: Vec<&ValueType> = operands.iter().map(|&v| g.value_ty(v)).collect();
                        infer(&op, &tys)?.ok_or("an op without a derived type")?
                    }
                };
                Ok(Value::of(g.add_multi(op, vec![ty], operands, span)))
            };
        let var_axis = |v: &str| -> Result<&Axis, String> {
            let at = IndexVar::from_name(v).ok_or(format!("index `{v}`"))? as usize;
            axes.get(at).ok_or(format!("the statement has no axis {at}"))
        };
        let v = match rn {
            RNode::Score => {
                let xt = g.value_ty(x).dtype;
                add(g, Op::Bind { axes: names.clone() }, Some(named(xt)), &[x])?
            }
            RNode::Index(var) => {
                let ax = var_axis(var.name())?.clone();
                add(
                    g,
                    Op::Iota { axis: ax.name.clone() },
                    Some(ValueType { dtype: DType::F32, axes: vec![ax] }),
                    &[],
                )?
            }
            RNode::Dim(d) => add(g, Op::DimSize(d.clone()), None, &[])?,
            RNode::Const(c) => add(g, Op::Const(*c), None, &[])?,
            RNode::Capture { k, index } => {
                let cap = *captures.get(*k).ok_or(format!("capture {k}"))?;
                let index: Vec<IndexExpr> = index
                    .iter()
                    .map(|e| e.rename_vars(|v| Ok(var_axis(v)?.name.clone())))
                    .collect::<Result<_, String>>()?;
                let plain: Option<Vec<String>> =
                    index.iter().map(|e| e.is_plain_var().map(str::to_string)).collect();
                let distinct =
                    plain.as_ref().is_some_and(|p| p.iter().collect::<BTreeSet<_>>().len() == p.len());
                match plain.filter(|_| distinct) {
                    // Each subscript a variable of its own: the tensor's axes renamed.
                    Some(names) => {
                        let dims: Vec<Axis> =
                            g.ty(cap).dims().zip(&names).map(|(d, nm)| Axis::new(nm, d.clone())).collect();
                        let ty = ValueType { dtype: g.ty(cap).dtype, axes: dims };
                        add(g, Op::Bind { axes: names }, Some(ty), &[Value::of(cap)])?
                    }
                    None => {
                        let mut used: Vec<Axis> = vec![];
                        for e in &index {
                            for v in e.vars() {
                                if !used.iter().any(|a| a.name == v) {
                                    used.push(
                                        axes.iter().find(|a| a.name == v).ok_or(format!("axis {v}"))?.clone(),
                                    );
                                }
                            }
                        }
                        let ty = ValueType { dtype: g.ty(cap).dtype, axes: used.clone() };
                        let axes_named: Vec<String> = used.iter().map(|a| a.name.clone()).collect();
                        add(g, Op::Gather { index, axes: axes_named }, Some(ty), &[Value::of(cap)])?
                    }
                }
            }
            RNode::Unary(u, x) => add(g, Op::Unary(*u), None, &[vals[*x as usize]])?,
            RNode::Binary(b, x, y) => add(g, Op::Binary(*b), None, &[vals[*x as usize], vals[*y as usize]])?,
            RNode::Select(c, x, y) => {
                add(g, Op::Select, None, &[vals[*c as usize], vals[*x as usize], vals[*y as usize]])?
            }
        };
        vals.push(v);
    }
    vals.get(region.root as usize).copied().ok_or_else(|| "the region's root".into())
}
