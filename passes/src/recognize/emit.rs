//! E-classes back into IR values (named-axis expressions), cheapest spelling first.

use super::build::{instantiate, Builder};
use crate::lang::{Attn, AttnAnalysis};
use egg::{CostFunction, Extractor, Id, Language, Symbol};
use foxc_ir::check::infer;
use foxc_ir::index::IndexExpr;
use foxc_ir::{BinaryOp, DType, Dim, Graph, Op, ReduceKind, Span, ValueId, ValueType};
use std::collections::HashMap;

/// Extraction cost of operands: AST size (`logsigmoid` is preferred over its longer spellings).
pub(crate) struct FusedCost;

impl CostFunction<Attn> for FusedCost {
    type Cost = f64;
    fn cost<C>(&mut self, enode: &Attn, mut costs: C) -> f64
    where
        C: FnMut(Id) -> f64,
    {
        let own = match enode {
            Attn::Num(_) | Attn::Symbol(_) => 0.5,
            _ => 1.0,
        };
        enode.fold(own, |acc, id| acc + costs(id))
    }
}

/// Emits e-classes back into the IR (named-axis values), cheapest spelling first.
pub(crate) struct Emit<'a, 'b> {
    pub g: &'a mut Graph,
    pub b: &'a Builder<'b>,
    pub ex: Extractor<'a, FusedCost, Attn, AttnAnalysis>,
    /// Span of the nodes emitted without a source class of their own.
    pub span: Span,
    pub memo: HashMap<Id, ValueId>,
}

impl Emit<'_, '_> {
    pub fn node(&mut self, op: Op, operands: &[ValueId], span: Span) -> Result<ValueId, String> {
        let tys: Vec<ValueType> = operands.iter().map(|o| self.g.ty(*o).clone()).collect();
        let refs: Vec<&ValueType> = tys.iter().collect();
        let ty = infer(&op, &refs)?.ok_or_else(|| format!("cannot type `{}`", op.mnemonic()))?;
        Ok(self.g.add(op, ty, operands, span))
    }

    pub fn sym(&self, id: Id) -> Result<String, String> {
        self.b.eg[id].data.sym.map(|s| s.to_string()).ok_or_else(|| "expected an index name".to_string())
    }

    /// An IR value (named axes) for class `id`.
    pub fn emit(&mut self, id: Id) -> Result<ValueId, String> {
        let id = self.b.eg.find(id);
        if let Some(&v) = self.memo.get(&id) {
            return Ok(v);
        }
        let span = self.b.span_of(id).unwrap_or(self.span);
        if let Some(c) = self.b.eg[id].data.konst {
            if self.b.eg[id].data.axes.is_empty() {
                let v = self.node(Op::Const(c), &[], span)?;
                self.memo.insert(id, v);
                return Ok(v);
            }
        }
        let n = self.ex.find_best_node(id).clone();
        let un = |u| Op::Unary(u);
        let bin = |b| Op::Binary(b);
        let v = match &n {
            Attn::Num(x) => self.node(Op::Const(x.get()), &[], span)?,
            Attn::Dim(s) => {
                let name = self.sym(*s)?;
                self.node(Op::DimSize(Dim::Sym(name)), &[], span)?
            }
            Attn::Iota(a) => {
                let name = self.sym(*a)?;
                let dim =
                    self.b.dims.get(&Symbol::from(name.as_str())).cloned().ok_or("unknown axis size")?;
                let ty = ValueType { dtype: DType::F32, axes: vec![foxc_ir::Axis::new(&name, dim)] };
                self.g.add(Op::Iota { axis: name }, ty, &[], span)
            }
            Attn::In(ch) => {
                let t = self.b.eg[ch[0]].data.sym.ok_or("leaf without a name")?;
                let leaf = *self.b.leaves.get(&t).ok_or("unknown leaf")?;
                if ch[1..].iter().all(|a| self.b.eg[*a].data.sym.is_some()) {
                    let axes = ch[1..].iter().map(|a| self.sym(*a)).collect::<Result<Vec<_>, _>>()?;
                    self.node(Op::Bind { axes }, &[leaf], span)?
                } else {
                    self.gather(leaf, &ch[1..], span)?
                }
            }
            Attn::Recip(x) => {
                let one = self.node(Op::Const(1.0), &[], span)?;
                let x = self.emit(*x)?;
                self.node(bin(BinaryOp::Div), &[one, x], span)?
            }
            Attn::Unary(u, [x]) => {
                let x = self.emit(*x)?;
                self.node(un(*u), &[x], span)?
            }
            Attn::Add(x) | Attn::Sub(x) | Attn::Mul(x) | Attn::Div(x) | Attn::Min(x) | Attn::Max(x) => {
                let b = match &n {
                    Attn::Add(_) => BinaryOp::Add,
                    Attn::Sub(_) => BinaryOp::Sub,
                    Attn::Mul(_) => BinaryOp::Mul,
                    Attn::Div(_) => BinaryOp::Div,
                    Attn::Min(_) => BinaryOp::Min,
                    _ => BinaryOp::Max,
                };
                let (l, r) = (self.emit(x[0])?, self.emit(x[1])?);
                self.node(bin(b), &[l, r], span)?
            }
            Attn::Lt(x) | Attn::Le(x) | Attn::Gt(x) | Attn::Ge(x) | Attn::Eq(x) | Attn::Ne(x) => {
                let b = match &n {
                    Attn::Lt(_) => BinaryOp::Lt,
                    Attn::Le(_) => BinaryOp::Le,
                    Attn::Gt(_) => BinaryOp::Gt,
                    Attn::Ge(_) => BinaryOp::Ge,
                    Attn::Eq(_) => BinaryOp::Eq,
                    _ => BinaryOp::Ne,
                };
                let (l, r) = (self.emit(x[0])?, self.emit(x[1])?);
                self.node(bin(b), &[l, r], span)?
            }
            Attn::Select([c, a, b]) => {
                let ops = [self.emit(*c)?, self.emit(*a)?, self.emit(*b)?];
                self.node(Op::Select, &ops, span)?
            }
            Attn::Sum([a, x]) | Attn::RMax([a, x]) | Attn::Cumsum([a, x]) | Attn::Softmax([a, x]) => {
                let axis = self.sym(*a)?;
                let op = match &n {
                    Attn::Sum(_) => Op::Reduce { kind: ReduceKind::Sum, axis, contract: false },
                    Attn::RMax(_) => Op::Reduce { kind: ReduceKind::Max, axis, contract: false },
                    Attn::Cumsum(_) => Op::Cumsum { axis, reverse: false },
                    _ => Op::Softmax { axis },
                };
                let x = self.emit(*x)?;
                self.node(op, &[x], span)?
            }
            Attn::Causal([i, j, x]) => {
                let (i, j) = (self.sym(*i)?, self.sym(*j)?);
                let x = self.emit(*x)?;
                self.node(Op::Causal { i, j }, &[x], span)?
            }
            Attn::Window([i, j, w, x]) => {
                let (i, j) = (self.sym(*i)?, self.sym(*j)?);
                let size = self.b.eg[*w].data.konst.ok_or("window size is not a constant")? as u64;
                let x = self.emit(*x)?;
                self.node(Op::Window { i, j, size }, &[x], span)?
            }
            Attn::RmsNorm([a, e, x, w]) => {
                let axis = self.sym(*a)?;
                let eps = self.b.eg[*e].data.konst.ok_or("rmsnorm eps is not a constant")?;
                let (x, w) = (self.emit(*x)?, self.emit(*w)?);
                self.node(Op::RmsNorm { axis, eps }, &[x, w], span)?
            }
            Attn::Symbol(_) | Attn::Ix(_) => return Err("unexpected term in an operand".into()),
        };
        self.memo.insert(id, v);
        Ok(v)
    }

    /// `leaf[subscripts]` with computed subscripts (`ix` classes) as a `gather` node.
    fn gather(&mut self, leaf: ValueId, subs: &[Id], span: Span) -> Result<ValueId, String> {
        let mut index = vec![];
        let mut axes: Vec<String> = vec![];
        for s in subs {
            let e = match self.b.eg[*s].data.sym {
                Some(v) => IndexExpr::var(v.as_str()),
                None => {
                    let n = self.b.eg[*s]
                        .nodes
                        .iter()
                        .find(|n| matches!(n, Attn::Ix(_)))
                        .ok_or("a subscript is not an index")?;
                    let ch = n.children().to_vec();
                    let text = self.b.eg[ch[0]].data.sym.ok_or("a subscript without a template")?;
                    let template = self.b.subscripts.get(&text).ok_or("unknown subscript template")?;
                    let vars = ch[1..].iter().map(|v| self.sym(*v)).collect::<Result<Vec<_>, _>>()?;
                    instantiate(template, &vars).ok_or("bad subscript template")?
                }
            };
            for v in e.vars() {
                if !axes.iter().any(|a| a == v) {
                    axes.push(v.to_string());
                }
            }
            index.push(e);
        }
        let dims = axes
            .iter()
            .map(|a| self.b.dims.get(&Symbol::from(a.as_str())).cloned().map(|d| foxc_ir::Axis::new(a, d)))
            .collect::<Option<Vec<_>>>()
            .ok_or("unknown size of a gathered index")?;
        let ty = ValueType { dtype: self.g.ty(leaf).dtype, axes: dims };
        Ok(self.g.add(Op::Gather { index, axes }, ty, &[leaf], span))
    }

    /// Broadcast a named value to the given axes (adding `0 * iota(a)` for a missing axis `a`)
    /// and store it positionally in that order.
    pub fn positional(&mut self, id: Id, order: &[Symbol], span: Span) -> Result<ValueId, String> {
        let order_s: Vec<String> = order.iter().map(|s| s.to_string()).collect();
        let best = self.ex.find_best_node(self.b.eg.find(id)).clone();
        // A parameter read in exactly this order is the parameter itself.
        if let Attn::In(ch) = &best {
            let axes: Vec<Option<Symbol>> = ch[1..].iter().map(|a| self.b.eg[*a].data.sym).collect();
            if axes.iter().map(|a| a.map(|s| s.to_string())).collect::<Vec<_>>()
                == order_s.iter().map(|s| Some(s.clone())).collect::<Vec<_>>()
            {
                if let Some(t) = self.b.eg[ch[0]].data.sym {
                    if let Some(&leaf) = self.b.leaves.get(&t) {
                        return Ok(leaf);
                    }
                }
            }
        }
        // rmsnorm over the last axis of a parameter read in order: the positional rmsnorm.
        if let Attn::RmsNorm([a, e, x, w]) = &best {
            let last = order.last().copied();
            if self.b.eg[*a].data.sym == last {
                let xp = self.positional(*x, order, span)?;
                let wp = self.positional(*w, &order[order.len() - 1..], span)?;
                if self.g.ty(xp).is_positional() && self.g.ty(wp).is_positional() {
                    let eps = self.b.eg[*e].data.konst.ok_or("rmsnorm eps is not a constant")?;
                    let axis = (order.len() - 1).to_string();
                    return self.node(Op::RmsNorm { axis, eps }, &[xp, wp], span);
                }
            }
        }
        let mut v = self.emit(id)?;
        for a in order {
            if self.g.ty(v).axis(a.as_str()).is_none() {
                let dim = self.b.dims.get(a).cloned().ok_or_else(|| format!("unknown size of axis `{a}`"))?;
                let ty = ValueType { dtype: DType::F32, axes: vec![foxc_ir::Axis::new(a.as_str(), dim)] };
                let io = self.g.add(Op::Iota { axis: a.to_string() }, ty, &[], span);
                let zero = self.node(Op::Const(0.0), &[], span)?;
                let z = self.node(Op::Binary(BinaryOp::Mul), &[zero, io], span)?;
                v = self.node(Op::Binary(BinaryOp::Add), &[v, z], span)?;
            }
        }
        self.node(Op::Store { axes: order_s }, &[v], span)
    }
}
