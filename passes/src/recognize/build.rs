//! IR values (named-axis expressions) to e-graph terms, statements inlined.

use crate::lang::{Attn, AttnAnalysis, AttnGraph, Num};
use egg::{Id, Symbol};
use foxc_ir::index::IndexExpr;
use foxc_ir::{BinaryOp, Dim, Graph, Op, ReduceKind, Span, UnaryOp, ValueId};
use std::collections::{BTreeMap, HashMap};

/// Renaming of axis names while inlining a statement.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct Ren {
    map: Vec<(String, String)>,
    /// Suffix for names the statement binds itself (None at the top level).
    scope: Option<usize>,
}

impl Ren {
    pub(crate) fn top() -> Ren {
        Ren { map: vec![], scope: None }
    }
    fn name(&self, a: &str) -> String {
        if let Some((_, to)) = self.map.iter().find(|(from, _)| from == a) {
            return to.clone();
        }
        match self.scope {
            Some(s) => format!("{a}'{s}"),
            None => a.to_string(),
        }
    }
}

/// Translates IR values (named-axis expressions) into e-graph terms.
pub(crate) struct Builder<'a> {
    pub g: &'a Graph,
    pub eg: AttnGraph,
    memo: HashMap<(ValueId, Ren), Id>,
    /// Source span of the IR value each class was first built from.
    pub spans: BTreeMap<Id, Span>,
    /// The IR value an `in` leaf reads, by leaf name.
    pub leaves: BTreeMap<Symbol, ValueId>,
    /// The size of every axis name seen.
    pub dims: BTreeMap<Symbol, Dim>,
    /// The computed subscripts by template text (the `ix` nodes' first child).
    pub subscripts: BTreeMap<Symbol, IndexExpr>,
}

impl<'a> Builder<'a> {
    pub fn new(g: &'a Graph) -> Builder<'a> {
        let mut ranges = BTreeMap::new();
        for p in &g.params {
            if let Some(r) = p.range {
                ranges.insert(Symbol::from(p.name.as_str()), r);
            }
        }
        Builder {
            g,
            eg: AttnGraph::new(AttnAnalysis { ranges }),
            memo: HashMap::new(),
            spans: BTreeMap::new(),
            leaves: BTreeMap::new(),
            dims: BTreeMap::new(),
            subscripts: BTreeMap::new(),
        }
    }

    fn add(&mut self, node: Attn, span: Span) -> Id {
        let id = self.eg.add(node);
        self.spans.entry(id).or_insert(span);
        id
    }

    fn sym(&mut self, s: &str, span: Span) -> Id {
        self.add(Attn::Symbol(Symbol::from(s)), span)
    }

    /// The term of a positional value read with the given (already renamed) axis names.
    /// The leaf name of positional value `n` (its parameter name, else `%N`), registered.
    fn leaf_name(&mut self, n: ValueId) -> String {
        let name = match self.g.op(n) {
            Op::Param { name, .. } => name.clone(),
            _ => format!("%{}", n.index()),
        };
        self.leaves.insert(Symbol::from(name.as_str()), n);
        name
    }

    /// `x[e1, .., er]` with computed subscripts: an `in` leaf whose computed subscripts are `ix`
    /// nodes (templates over `$0, $1, ...` plus the renamed variables).
    fn gather(&mut self, n: ValueId, x: ValueId, index: &[IndexExpr], ren: &Ren, span: Span) -> Id {
        let name = self.leaf_name(x);
        for a in &self.g.ty(n).axes {
            self.dims.entry(Symbol::from(ren.name(&a.name).as_str())).or_insert_with(|| a.dim.clone());
        }
        let mut ch = vec![self.sym(&name, span)];
        for e in index {
            if let Some(v) = e.is_plain_var() {
                let v = ren.name(v);
                ch.push(self.sym(&v, span));
                continue;
            }
            let vars: Vec<String> = e.vars().into_iter().map(|v| v.to_string()).collect();
            let pos = |v: &str| vars.iter().position(|w| w == v).unwrap_or(0);
            let template = IndexExpr {
                terms: e
                    .terms
                    .iter()
                    .filter(|(_, c)| *c != 0)
                    .map(|(v, c)| (format!("${}", pos(v)), *c))
                    .collect(),
                constant: e.constant,
                div: e.div.clone(),
            };
            let text = template.to_string();
            self.subscripts.insert(Symbol::from(text.as_str()), template);
            let mut ix = vec![self.sym(&text, span)];
            for v in &vars {
                let v = ren.name(v);
                ix.push(self.sym(&v, span));
            }
            ch.push(self.add(Attn::Ix(ix.into_boxed_slice()), span));
        }
        self.add(Attn::In(ch.into_boxed_slice()), span)
    }

    fn leaf(&mut self, n: ValueId, axes: &[String], span: Span) -> Id {
        let name = self.leaf_name(n);
        for (a, d) in axes.iter().zip(self.g.ty(n).dims()) {
            self.dims.entry(Symbol::from(a.as_str())).or_insert_with(|| d.clone());
        }
        let mut ch = vec![self.sym(&name, span)];
        for a in axes {
            ch.push(self.sym(a, span));
        }
        self.add(Attn::In(ch.into_boxed_slice()), span)
    }

    /// Translate a positional value `n` whose axes are read as `axes` (a leaf or an inlined
    /// statement).
    pub fn positional(&mut self, n: ValueId, axes: &[String], span: Span) -> Result<Id, (String, Span)> {
        if let Op::Store { axes: saxes } = self.g.op(n) {
            let saxes = saxes.clone();
            let map: Vec<(String, String)> = saxes.iter().cloned().zip(axes.iter().cloned()).collect();
            // The indices a statement binds are named after the statement alone, not after the
            // use site: two inlinings of one statement are then equal terms up to their free
            // indices (a hand-written softmax's numerator and denominator). No clash is possible:
            // a statement's private names occur only inside its own inlinings, which never nest.
            let ren = Ren { map, scope: Some(n.index()) };
            let inner = self.g.operands(n)[0];
            return self.term(inner, &ren);
        }
        Ok(self.leaf(n, axes, span))
    }

    /// Translate the named-axis value `n` under renaming `ren`.
    pub fn term(&mut self, n: ValueId, ren: &Ren) -> Result<Id, (String, Span)> {
        if let Some(&id) = self.memo.get(&(n, ren.clone())) {
            return Ok(id);
        }
        let node = self.g.node(n);
        let span = node.span;
        let ops = self.g.operands(n);
        let sub = |me: &mut Self, k: usize| me.term(ops[k], ren);
        let id = match &node.op {
            Op::Const(c) => self.add(Attn::Num(Num::new(*c)), span),
            Op::DimSize(Dim::Const(c)) => self.add(Attn::Num(Num::new(*c as f64)), span),
            Op::DimSize(d) => {
                let s = self.sym(&d.to_string(), span);
                self.add(Attn::Dim(s), span)
            }
            Op::Iota { axis } => {
                let a = ren.name(axis);
                if let Some((_, ax)) = node.ty.axis(axis) {
                    self.dims.entry(Symbol::from(a.as_str())).or_insert_with(|| ax.dim.clone());
                }
                let s = self.sym(&a, span);
                self.add(Attn::Iota(s), span)
            }
            Op::Gather { index, .. } => self.gather(n, ops[0], index, ren, span),
            Op::Bind { axes } => {
                let axes: Vec<String> = axes.iter().map(|a| ren.name(a)).collect();
                self.positional(ops[0], &axes, span)?
            }
            Op::Unary(u) => {
                let x = sub(self, 0)?;
                let e = match u {
                    UnaryOp::Neg => Attn::Neg(x),
                    UnaryOp::Exp => Attn::Exp(x),
                    UnaryOp::Log => Attn::Log(x),
                    UnaryOp::Sqrt => Attn::Sqrt(x),
                    UnaryOp::Rsqrt => Attn::Rsqrt(x),
                    UnaryOp::Sigmoid => Attn::Sigmoid(x),
                    UnaryOp::LogSigmoid => Attn::LogSigmoid(x),
                    UnaryOp::Softplus => Attn::Softplus(x),
                    UnaryOp::Relu => Attn::Relu(x),
                    UnaryOp::Tanh => Attn::Tanh(x),
                    UnaryOp::Abs => Attn::Abs(x),
                    UnaryOp::Exp2 => Attn::Exp2(x),
                    UnaryOp::Log2 => Attn::Log2(x),
                };
                self.add(e, span)
            }
            Op::Binary(b) => {
                let x = [sub(self, 0)?, sub(self, 1)?];
                let e = match b {
                    BinaryOp::Add => Attn::Add(x),
                    BinaryOp::Sub => Attn::Sub(x),
                    BinaryOp::Mul => Attn::Mul(x),
                    BinaryOp::Div => Attn::Div(x),
                    BinaryOp::Min => Attn::Min(x),
                    BinaryOp::Max => Attn::Max(x),
                    BinaryOp::Lt => Attn::Lt(x),
                    BinaryOp::Le => Attn::Le(x),
                    BinaryOp::Gt => Attn::Gt(x),
                    BinaryOp::Ge => Attn::Ge(x),
                    BinaryOp::Eq => Attn::Eq(x),
                    BinaryOp::Ne => Attn::Ne(x),
                };
                self.add(e, span)
            }
            Op::Select => {
                let x = [sub(self, 0)?, sub(self, 1)?, sub(self, 2)?];
                self.add(Attn::Select(x), span)
            }
            Op::Reduce { kind, axis } => {
                let a = self.sym(&ren.name(axis), span);
                let x = sub(self, 0)?;
                match kind {
                    ReduceKind::Sum => self.add(Attn::Sum([a, x]), span),
                    ReduceKind::Max => self.add(Attn::RMax([a, x]), span),
                }
            }
            Op::Cumsum { axis } | Op::Softmax { axis } => {
                let a = self.sym(&ren.name(axis), span);
                let x = sub(self, 0)?;
                if matches!(node.op, Op::Cumsum { .. }) {
                    self.add(Attn::Cumsum([a, x]), span)
                } else {
                    self.add(Attn::Softmax([a, x]), span)
                }
            }
            Op::Causal { i, j } => {
                let (i, j) = (self.sym(&ren.name(i), span), self.sym(&ren.name(j), span));
                let x = sub(self, 0)?;
                self.add(Attn::Causal([i, j, x]), span)
            }
            Op::Window { i, j, size } => {
                let (i, j) = (self.sym(&ren.name(i), span), self.sym(&ren.name(j), span));
                let w = self.add(Attn::Num(Num::new(*size as f64)), span);
                let x = sub(self, 0)?;
                self.add(Attn::Window([i, j, w, x]), span)
            }
            Op::RmsNorm { axis, eps } => {
                let a = self.sym(&ren.name(axis), span);
                let e = self.add(Attn::Num(Num::new(*eps)), span);
                let x = sub(self, 0)?;
                let w = sub(self, 1)?;
                self.add(Attn::RmsNorm([a, e, x, w]), span)
            }
            other => {
                return Err((
                    format!("`{}` is not supported inside an attention expression", other.mnemonic()),
                    span,
                ))
            }
        };
        self.memo.insert((n, ren.clone()), id);
        Ok(id)
    }

    pub fn span_of(&self, id: Id) -> Option<Span> {
        let root = self.eg.find(id);
        self.spans.iter().find(|(k, _)| self.eg.find(**k) == root).map(|(_, s)| *s)
    }
}

/// A subscript template (over `$0, $1, ...`) with `$k` replaced by `vars[k]`.
pub(crate) fn instantiate(template: &IndexExpr, vars: &[String]) -> Option<IndexExpr> {
    let terms = template
        .terms
        .iter()
        .map(|(v, c)| {
            v.strip_prefix('$')
                .and_then(|k| k.parse::<usize>().ok())
                .and_then(|k| vars.get(k))
                .map(|n| (n.clone(), *c))
        })
        .collect::<Option<Vec<_>>>()?;
    Some(IndexExpr { terms, constant: template.constant, div: template.div.clone() })
}
