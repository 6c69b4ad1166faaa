//! IR values (named-axis expressions) to e-graph terms, statements inlined.

use crate::lang::{Attn, AttnAnalysis, AttnGraph, Num};
use egg::{Id, Symbol};
use foxc_ir::index::IndexExpr;
use foxc_ir::{BinaryOp, DType, Dim, Graph, Op, ReduceKind, Span, ValueId};
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
    /// Reads shifted by dims along one index (`c[b, h, i + M - N]`, queries at the end of
    /// longer keys), by the class of the read: the class of the same tensor read unshifted
    /// (`c[b, h, i]`), the index and the shift (dims and a constant). The score split pairs
    /// `c[i + M - N]` with `-c[j]` through it.
    pub shifted: BTreeMap<Id, Shifted>,
}

/// A read of a tensor at one index plus a sum of dims ([`Builder::shifted`]).
#[derive(Clone, Debug)]
pub(crate) struct Shifted {
    pub unshifted: Id,
    pub var: Symbol,
    pub by: IndexExpr,
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
            shifted: BTreeMap::new(),
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
                dim_terms: e.dim_terms.clone(),
                constant: e.constant,
                div: e.div.clone(),
                clamps: e.clamps.clone(),
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
        let read = self.add(Attn::In(ch.into_boxed_slice()), span);
        self.note_shift(read, x, index, ren, span);
        read
    }

    /// Records `read` in [`Builder::shifted`] when exactly one subscript is an index plus dims
    /// (and a constant) and every other is a plain index; the unshifted read is built too.
    fn note_shift(&mut self, read: Id, x: ValueId, index: &[IndexExpr], ren: &Ren, span: Span) {
        let shift = |e: &IndexExpr| match e.terms.as_slice() {
            [(v, 1)] if !e.dim_terms.is_empty() && e.div.is_none() && e.clamps.is_empty() => Some(v.clone()),
            _ => None,
        };
        let shifted: Vec<usize> = (0..index.len()).filter(|&k| index[k].is_plain_var().is_none()).collect();
        let [k] = shifted[..] else { return };
        let Some(v) = shift(&index[k]) else { return };
        let axes: Vec<String> =
            index.iter().map(|e| ren.name(e.is_plain_var().map_or(v.as_str(), |p| p))).collect();
        let by = IndexExpr { terms: vec![], ..index[k].clone() };
        if let Ok(unshifted) = self.positional(x, &axes, span) {
            let var = Symbol::from(ren.name(&v).as_str());
            self.shifted.insert(read, Shifted { unshifted, var, by });
        }
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
        match self.inline(n, axes) {
            Some((inner, ren)) => self.term(inner, &ren),
            None => Ok(self.leaf(n, axes, span)),
        }
    }

    /// A statement `n` read as `axes` inlines as its expression under this renaming; `None` for
    /// a leaf.
    fn inline(&self, n: ValueId, axes: &[String]) -> Option<(ValueId, Ren)> {
        let Op::Store { axes: saxes } = self.g.op(n) else { return None };
        let map: Vec<(String, String)> = saxes.iter().cloned().zip(axes.iter().cloned()).collect();
        // The indices a statement binds are named after the statement alone, not after the
        // use site: two inlinings of one statement are then equal terms up to their free
        // indices (a hand-written softmax's numerator and denominator). No clash is possible:
        // a statement's private names occur only inside its own inlinings, which never nest.
        Some((self.g.operands(n)[0], Ren { map, scope: Some(n.index()) }))
    }

    /// Translate the named-axis value `n` under renaming `ren`.
    ///
    /// Iterative (an explicit stack, not recursion): a chain of thousands of statements inlines
    /// into a term that deep. The e-graph sees the nodes in the order a recursive walk would add
    /// them (a node's symbols, then its operands left to right, then the node), so class ids,
    /// spans and hence extraction are those of the recursive walk.
    pub fn term(&mut self, n: ValueId, ren: &Ren) -> Result<Id, (String, Span)> {
        enum Step {
            /// Visit: memo hit, or the node's own symbols, then its operands, then `Finish`.
            Visit(ValueId, Ren),
            /// Operands done: add the node (its pre-added symbol ids in `pre`).
            Finish(ValueId, Ren, Vec<Id>),
        }
        let key = (n, ren.clone());
        let mut stack = vec![Step::Visit(n, ren.clone())];
        while let Some(step) = stack.pop() {
            match step {
                Step::Visit(n, ren) => {
                    if self.memo.contains_key(&(n, ren.clone())) {
                        continue;
                    }
                    let (pre, kids) = self.visit(n, &ren)?;
                    stack.push(Step::Finish(n, ren.clone(), pre));
                    for k in kids.into_iter().rev() {
                        stack.push(Step::Visit(k.0, k.1));
                    }
                }
                Step::Finish(n, ren, pre) => {
                    let id = self.finish(n, &ren, &pre)?;
                    self.memo.insert((n, ren), id);
                }
            }
        }
        Ok(self.memo[&key])
    }

    /// The first half of translating `n`: the symbols added before its operands, and the
    /// operands to translate (value and renaming), in order.
    #[allow(clippy::type_complexity)]
    fn visit(&mut self, n: ValueId, ren: &Ren) -> Result<(Vec<Id>, Vec<(ValueId, Ren)>), (String, Span)> {
        let node = self.g.node(n);
        let span = node.span;
        let ops = self.g.operands(n);
        let same = |ks: &[usize]| ks.iter().map(|&k| (ops[k], ren.clone())).collect::<Vec<_>>();
        Ok(match &node.op {
            Op::Const(_) | Op::DimSize(_) | Op::Iota { .. } | Op::Gather { .. } => (vec![], vec![]),
            Op::Bind { axes } => {
                let axes: Vec<String> = axes.iter().map(|a| ren.name(a)).collect();
                match self.inline(ops[0], &axes) {
                    Some(k) => (vec![], vec![k]),
                    None => (vec![], vec![]),
                }
            }
            Op::Unary(_) => (vec![], same(&[0])),
            // `float(start[b])`: an integer's value, as the region reads every captured tensor
            // (exact below 2^24 in the kernels' f32, as comparing the integer is).
            Op::Cast if self.g.ty(ops[0]).dtype == DType::I32 => (vec![], same(&[0])),
            Op::Binary(_) => (vec![], same(&[0, 1])),
            Op::Select => (vec![], same(&[0, 1, 2])),
            // A reverse cumsum (made by the gradient pass, never by the DSL) is not a term of the
            // e-graph's language: it stays outside, as an unsupported op.
            Op::Reduce { axis, .. } | Op::Cumsum { axis, reverse: false } | Op::Softmax { axis } => {
                (vec![self.sym(&ren.name(axis), span)], same(&[0]))
            }
            Op::Causal { i, j } => {
                let pre = vec![self.sym(&ren.name(i), span), self.sym(&ren.name(j), span)];
                (pre, same(&[0]))
            }
            Op::Window { i, j, size } => {
                let pre = vec![
                    self.sym(&ren.name(i), span),
                    self.sym(&ren.name(j), span),
                    self.add(Attn::Num(Num::new(*size as f64)), span),
                ];
                (pre, same(&[0]))
            }
            Op::RmsNorm { axis, eps } => {
                let pre = vec![self.sym(&ren.name(axis), span), self.add(Attn::Num(Num::new(*eps)), span)];
                (pre, same(&[0, 1]))
            }
            other => {
                return Err((
                    format!("`{}` is not supported inside an attention expression", other.mnemonic()),
                    span,
                ))
            }
        })
    }

    /// The second half of translating `n`: its class, from its operands' (all translated).
    fn finish(&mut self, n: ValueId, ren: &Ren, pre: &[Id]) -> Result<Id, (String, Span)> {
        let node = self.g.node(n);
        let span = node.span;
        let ops = self.g.operands(n);
        let memo = &self.memo;
        let sub = |k: usize| memo[&(ops[k], ren.clone())];
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
                match self.inline(ops[0], &axes) {
                    Some(k) => self.memo[&k],
                    None => self.leaf(ops[0], &axes, span),
                }
            }
            Op::Unary(u) => {
                let x = sub(0);
                self.add(Attn::Unary(*u, [x]), span)
            }
            Op::Cast => sub(0),
            Op::Binary(b) => {
                let x = [sub(0), sub(1)];
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
                let x = [sub(0), sub(1), sub(2)];
                self.add(Attn::Select(x), span)
            }
            Op::Reduce { kind, .. } => {
                let x = sub(0);
                match kind {
                    ReduceKind::Sum => self.add(Attn::Sum([pre[0], x]), span),
                    ReduceKind::Max => self.add(Attn::RMax([pre[0], x]), span),
                }
            }
            Op::Cumsum { reverse: false, .. } => {
                let x = sub(0);
                self.add(Attn::Cumsum([pre[0], x]), span)
            }
            Op::Softmax { .. } => {
                let x = sub(0);
                self.add(Attn::Softmax([pre[0], x]), span)
            }
            Op::Causal { .. } => {
                let x = sub(0);
                self.add(Attn::Causal([pre[0], pre[1], x]), span)
            }
            Op::Window { .. } => {
                let x = sub(0);
                self.add(Attn::Window([pre[0], pre[1], pre[2], x]), span)
            }
            Op::RmsNorm { .. } => {
                let (x, w) = (sub(0), sub(1));
                self.add(Attn::RmsNorm([pre[0], pre[1], x, w]), span)
            }
            other => {
                return Err((
                    format!("`{}` is not supported inside an attention expression", other.mnemonic()),
                    span,
                ))
            }
        };
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
    Some(IndexExpr { terms, ..template.clone() })
}
