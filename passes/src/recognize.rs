//! Recognition of decay-gated softmax attention with egg.
//!
//! 1. The statement that produces the graph output is inlined into one egg term over named
//!    index variables ([`Builder`]): statement results read as `c[b, h, i]` are replaced by their
//!    defining expression with the statement's axes renamed to the use site, and indices bound
//!    inside a statement (`sum(d, ...)`) get names private to that inlining.
//! 2. The e-graph is saturated with the spelling rules of [`crate::lang::rules`].
//! 3. The root class is searched for `sum_j(softmax_j(causal(i, j, S)) * v)` (or `window`) and
//!    `S` for `scale * sum_d(q * k) + (ci - cj)` with `cj` the same function as `ci` with `i`
//!    renamed to `j`. A match adds a `dattn` e-node to the root class.
//! 4. Extraction with [`FusedCost`] (the fused node is the cheapest) picks the `dattn` node; its
//!    operands are emitted back into the IR as positional tensors.

use crate::lang::{pat, rename, Attn, AttnAnalysis, AttnGraph, Num};
use crate::{Explanation, PassError};
use egg::{CostFunction, Extractor, Id, Language, Runner, Searcher, Subst, Symbol};
use foxc_ir::check::infer;
use foxc_ir::{
    AttnAttrs, BinaryOp, DType, Dim, GateKind, Graph, Op, ReduceKind, Span, UnaryOp, ValueId, ValueType,
};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

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
    g: &'a Graph,
    pub eg: AttnGraph,
    memo: HashMap<(ValueId, Ren), Id>,
    scopes: HashMap<(ValueId, Ren), usize>,
    /// Source span of the IR value each class was first built from.
    pub spans: BTreeMap<Id, Span>,
    /// The IR value an `in` leaf reads, by leaf name.
    pub leaves: BTreeMap<Symbol, ValueId>,
    /// The size of every axis name seen.
    pub dims: BTreeMap<Symbol, Dim>,
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
            scopes: HashMap::new(),
            spans: BTreeMap::new(),
            leaves: BTreeMap::new(),
            dims: BTreeMap::new(),
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
    fn leaf(&mut self, n: ValueId, axes: &[String], span: Span) -> Id {
        let name = match self.g.op(n) {
            Op::Param { name, .. } => name.clone(),
            _ => format!("%{}", n.index()),
        };
        let s = Symbol::from(name.as_str());
        self.leaves.insert(s, n);
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
            let key = (n, Ren { map: map.clone(), scope: None });
            let next = self.scopes.len();
            let scope = *self.scopes.entry(key).or_insert(next);
            let ren = Ren { map, scope: Some(scope) };
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

/// Extraction cost: AST size, with the fused node cheapest of all and `logsigmoid` preferred
/// over its longer spellings.
pub(crate) struct FusedCost;

impl CostFunction<Attn> for FusedCost {
    type Cost = f64;
    fn cost<C>(&mut self, enode: &Attn, mut costs: C) -> f64
    where
        C: FnMut(Id) -> f64,
    {
        let own = match enode {
            Attn::DAttn(_) => 0.01,
            Attn::Num(_) | Attn::Symbol(_) => 0.5,
            _ => 1.0,
        };
        enode.fold(own, |acc, id| acc + costs(id))
    }
}

/// One recognized attention, as e-classes.
struct Match {
    i: Symbol,
    j: Symbol,
    d: Symbol,
    window: Option<u64>,
    sc: Id,
    q: Id,
    k: Id,
    v: Id,
    /// `(ci, cj)`, absent without a decay bias.
    c: Option<(Id, Id)>,
    /// The batch axes and the value axis, in the output's order: `[b, h]`, `e`.
    batch: [Symbol; 2],
    e: Symbol,
}

fn var(s: &str) -> egg::Var {
    s.parse().expect("variable literal")
}

fn sym_of(eg: &AttnGraph, s: &Subst, v: &str) -> Option<Symbol> {
    eg[s[var(v)]].data.sym
}

fn matches(eg: &AttnGraph, pattern: &str, class: Id) -> Vec<Subst> {
    pat(pattern).search_eclass(eg, class).map(|m| m.substs).unwrap_or_default()
}

struct Searcher2<'a> {
    eg: &'a AttnGraph,
    out_axes: &'a [String],
}

impl Searcher2<'_> {
    fn axes(&self, id: Id) -> &std::collections::BTreeSet<Symbol> {
        &self.eg[id].data.axes
    }

    /// Check a candidate decomposition; Err says which condition failed.
    #[allow(clippy::too_many_arguments)]
    fn check(
        &self,
        i: Symbol,
        j: Symbol,
        window: Option<u64>,
        sc: Id,
        d: Symbol,
        q: Id,
        k: Id,
        v: Id,
        c: Option<(Id, Id)>,
    ) -> Result<Match, String> {
        let eg = self.eg;
        if !self.axes(sc).is_empty() {
            return Err("the score scale depends on an index".into());
        }
        let (qa, ka, va) = (self.axes(q), self.axes(k), self.axes(v));
        if !(qa.contains(&i) && qa.contains(&d) && !qa.contains(&j)) {
            return Err(format!("the query operand must be indexed by `{i}` and `{d}` and not by `{j}`"));
        }
        if !(ka.contains(&j) && ka.contains(&d) && !ka.contains(&i)) {
            return Err(format!("the key operand must be indexed by `{j}` and `{d}` and not by `{i}`"));
        }
        let qb: Vec<Symbol> = qa.iter().filter(|a| **a != i && **a != d).cloned().collect();
        let kb: Vec<Symbol> = ka.iter().filter(|a| **a != j && **a != d).cloned().collect();
        if qb != kb || qb.len() != 2 {
            return Err("q and k must share exactly two batch axes (batch and head)".into());
        }
        if self.out_axes.len() != 4 {
            return Err("the output must have four axes [batch, head, query, feature]".into());
        }
        let o: Vec<Symbol> = self.out_axes.iter().map(|a| Symbol::from(a.as_str())).collect();
        if o[2] != i {
            return Err(format!("the output's third axis must be the query index `{i}`"));
        }
        let batch = [o[0], o[1]];
        if !(qb.contains(&batch[0]) && qb.contains(&batch[1])) {
            return Err("the output's first two axes must be the batch axes of q and k".into());
        }
        let e = o[3];
        let want_v: std::collections::BTreeSet<Symbol> = [batch[0], batch[1], j, e].into_iter().collect();
        if *va != want_v {
            return Err(format!(
                "the value operand must be indexed by exactly the batch axes, `{j}` and `{e}`"
            ));
        }
        if let Some((ci, cj)) = c {
            let (cia, cja) = (self.axes(ci), self.axes(cj));
            let ok_i = cia.iter().all(|a| *a == i || batch.contains(a));
            let ok_j = cja.iter().all(|a| *a == j || batch.contains(a));
            if !ok_i || !ok_j {
                return Err(format!(
                    "the bias is not of the form c[{i}] - c[{j}]: a term depends on both `{i}` and `{j}` or on another index"
                ));
            }
            let ex = Extractor::new(eg, FusedCost);
            let (_, cit) = ex.find_best(ci);
            let same = eg.lookup_expr(&rename(&cit, i, j)).map(|x| eg.find(x)) == Some(eg.find(cj));
            if !same {
                return Err(format!(
                    "the bias terms of `{i}` and `{j}` are not the same function c[{i}] - c[{j}]"
                ));
            }
        }
        Ok(Match { i, j, d, window, sc, q, k, v, c, batch, e })
    }

    /// Try every decomposition of the score class `s`.
    fn scores(&self, i: Symbol, j: Symbol, window: Option<u64>, s: Id, v: Id) -> Result<Match, String> {
        let eg = self.eg;
        let mut last = "the scores are not `scale * sum(d, q * k)` plus a bias `c[i] - c[j]`".to_string();
        let ex = Extractor::new(eg, FusedCost);
        let mut best: Option<(f64, Match)> = None;
        let mut parts: Vec<(Id, Option<Id>)> = vec![(s, None)];
        for m in matches(eg, "(+ ?x ?bias)", s) {
            parts.push((m[var("?x")], Some(m[var("?bias")])));
        }
        for (x, bias) in parts {
            let mut dots: Vec<(Id, Subst)> = vec![];
            for m in matches(eg, "(* ?sc (sum ?d (* ?q ?k)))", x) {
                dots.push((m[var("?sc")], m));
            }
            for m in matches(eg, "(sum ?d (* ?q ?k))", x) {
                if let Some(one) = eg.lookup(Attn::Num(Num::new(1.0))) {
                    dots.push((one, m));
                }
            }
            let biases: Vec<Option<(Id, Id)>> = match bias {
                None => vec![None],
                Some(b) => matches(eg, "(- ?ci ?cj)", b)
                    .into_iter()
                    .map(|m| Some((m[var("?ci")], m[var("?cj")])))
                    .collect(),
            };
            for (sc, m) in &dots {
                let Some(d) = sym_of(eg, m, "?d") else { continue };
                for c in &biases {
                    match self.check(i, j, window, *sc, d, m[var("?q")], m[var("?k")], v, *c) {
                        Ok(found) => {
                            // Among equivalent decompositions, keep the one with the simplest
                            // q and k (a scale split over q and k belongs to the scale).
                            let cost = ex.find_best_cost(found.q) + ex.find_best_cost(found.k);
                            if best.as_ref().is_none_or(|(c0, _)| cost < *c0) {
                                best = Some((cost, found));
                            }
                        }
                        Err(why) => last = why,
                    }
                }
            }
        }
        best.map(|(_, m)| m).ok_or(last)
    }
}

/// Why the output expression is not attention, pointing at the class to blame.
fn diagnose(eg: &AttnGraph, root: Id) -> (String, Id) {
    if let Some(m) = matches(eg, "(sum ?j (* (softmax ?a ?x) ?v))", root).into_iter().next() {
        let (a, jj) = (eg[m[var("?a")]].data.sym, eg[m[var("?j")]].data.sym);
        // Blame the softmax itself.
        let x = eg.lookup(Attn::Softmax([m[var("?a")], m[var("?x")]])).unwrap_or(m[var("?x")]);
        let sx = m[var("?x")];
        if a != jj {
            let name = |s: Option<Symbol>| s.map(|s| s.to_string()).unwrap_or_default();
            return (
                format!(
                    "softmax is taken over `{}` but the values are summed over `{}`: not attention over keys, \
                     so it is neither fused nor pruned",
                    name(a),
                    name(jj)
                ),
                x,
            );
        }
        let masked = !matches(eg, "(causal ?i ?jm ?s)", sx).is_empty()
            || !matches(eg, "(window ?i ?jm ?w ?s)", sx).is_empty();
        if !masked {
            return (
                format!(
                    "softmax over `{}` is not causally masked: every key is visible, so no key tile can be skipped \
                     (mask it with causal(i, j, s) or window(i, j, W, s))",
                    a.map(|s| s.to_string()).unwrap_or_default()
                ),
                x,
            );
        }
        return ("the mask's key index is not the softmax axis".into(), x);
    }
    ("the output is not `sum(j, softmax(j, mask(scores)) * v)`".into(), root)
}

/// Emits e-classes back into the IR (named-axis values), cheapest spelling first.
struct Emit<'a, 'b> {
    g: &'a mut Graph,
    b: &'a Builder<'b>,
    ex: Extractor<'a, FusedCost, Attn, AttnAnalysis>,
    span: Span,
    memo: HashMap<Id, ValueId>,
}

impl Emit<'_, '_> {
    fn node(&mut self, op: Op, operands: &[ValueId], span: Span) -> Result<ValueId, String> {
        let tys: Vec<ValueType> = operands.iter().map(|o| self.g.ty(*o).clone()).collect();
        let refs: Vec<&ValueType> = tys.iter().collect();
        let ty = infer(&op, &refs)?.ok_or_else(|| format!("cannot type `{}`", op.mnemonic()))?;
        Ok(self.g.add(op, ty, operands, span))
    }

    fn sym(&self, id: Id) -> Result<String, String> {
        self.b.eg[id].data.sym.map(|s| s.to_string()).ok_or_else(|| "expected an index name".to_string())
    }

    /// An IR value (named axes) for class `id`.
    fn emit(&mut self, id: Id) -> Result<ValueId, String> {
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
                let axes = ch[1..].iter().map(|a| self.sym(*a)).collect::<Result<Vec<_>, _>>()?;
                self.node(Op::Bind { axes }, &[leaf], span)?
            }
            Attn::Recip(x) => {
                let one = self.node(Op::Const(1.0), &[], span)?;
                let x = self.emit(*x)?;
                self.node(bin(BinaryOp::Div), &[one, x], span)?
            }
            Attn::Neg(x)
            | Attn::Exp(x)
            | Attn::Log(x)
            | Attn::Sqrt(x)
            | Attn::Rsqrt(x)
            | Attn::Sigmoid(x) => {
                let u = match &n {
                    Attn::Neg(_) => UnaryOp::Neg,
                    Attn::Exp(_) => UnaryOp::Exp,
                    Attn::Log(_) => UnaryOp::Log,
                    Attn::Sqrt(_) => UnaryOp::Sqrt,
                    Attn::Rsqrt(_) => UnaryOp::Rsqrt,
                    _ => UnaryOp::Sigmoid,
                };
                let x = self.emit(*x)?;
                self.node(un(u), &[x], span)?
            }
            Attn::LogSigmoid(x)
            | Attn::Softplus(x)
            | Attn::Relu(x)
            | Attn::Tanh(x)
            | Attn::Abs(x)
            | Attn::Exp2(x)
            | Attn::Log2(x) => {
                let u = match &n {
                    Attn::LogSigmoid(_) => UnaryOp::LogSigmoid,
                    Attn::Softplus(_) => UnaryOp::Softplus,
                    Attn::Tanh(_) => UnaryOp::Tanh,
                    Attn::Abs(_) => UnaryOp::Abs,
                    Attn::Exp2(_) => UnaryOp::Exp2,
                    Attn::Log2(_) => UnaryOp::Log2,
                    _ => UnaryOp::Relu,
                };
                let x = self.emit(*x)?;
                self.node(un(u), &[x], span)?
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
                    Attn::Sum(_) => Op::Reduce { kind: ReduceKind::Sum, axis },
                    Attn::RMax(_) => Op::Reduce { kind: ReduceKind::Max, axis },
                    Attn::Cumsum(_) => Op::Cumsum { axis },
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
            Attn::DAttn(_) | Attn::Symbol(_) => return Err("unexpected term in an operand".into()),
        };
        self.memo.insert(id, v);
        Ok(v)
    }

    /// Broadcast a named value to the given axes (adding `0 * iota(a)` for a missing axis `a`)
    /// and store it positionally in that order.
    fn positional(&mut self, id: Id, order: &[Symbol], span: Span) -> Result<ValueId, String> {
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

/// The recognition pass: replace the output statement by one `decay_attention` node.
pub(crate) fn recognize(g: &mut Graph, ex: &mut Vec<Explanation>) -> Result<Option<ValueId>, PassError> {
    let Some(out) = g.output else { return Ok(None) };
    if g.find(|op| matches!(op, Op::DecayAttention(_) | Op::PrunedDecayAttention { .. }))
        .into_iter()
        .next()
        .is_some()
    {
        return Ok(None);
    }
    let store = if matches!(g.op(out), Op::Cast) { g.operands(out)[0] } else { out };
    let Op::Store { axes: out_axes } = g.op(store).clone() else {
        ex.push(Explanation {
            message: "not recognized as attention: the output is not an index-notation statement".into(),
            span: g.node(out).span,
            hint: None,
        });
        return Ok(None);
    };
    // The builder reads a snapshot (same node ids) while the graph is rewritten.
    let snapshot = g.clone();
    let g_ro: &Graph = &snapshot;
    let mut b = Builder::new(g_ro);
    let root = match b.term(g_ro.operands(store)[0], &Ren::top()) {
        Ok(r) => r,
        Err((msg, span)) => {
            ex.push(Explanation { message: format!("not recognized as attention: {msg}"), span, hint: None });
            return Ok(None);
        }
    };
    let eg = std::mem::take(&mut b.eg);
    let runner = Runner::default()
        .with_egraph(eg)
        .with_iter_limit(12)
        .with_node_limit(40_000)
        .with_time_limit(Duration::from_secs(5))
        .run(&crate::lang::rules());
    b.eg = runner.egraph;
    // The scale of an unscaled dot product is the literal 1.
    b.eg.add(Attn::Num(Num::new(1.0)));
    b.eg.rebuild();
    let root = b.eg.find(root);

    // Search the saturated root class for the attention shape.
    let mut found: Result<Match, (String, Id)> = Err(diagnose(&b.eg, root));
    {
        let s2 = Searcher2 { eg: &b.eg, out_axes: &out_axes };
        let mut cands: Vec<(Symbol, Symbol, Option<u64>, Id, Id)> = vec![];
        for m in matches(&b.eg, "(sum ?j (* (softmax ?j (causal ?i ?j ?s)) ?v))", root) {
            if let (Some(i), Some(j)) = (sym_of(&b.eg, &m, "?i"), sym_of(&b.eg, &m, "?j")) {
                cands.push((i, j, None, m[var("?s")], m[var("?v")]));
            }
        }
        for m in matches(&b.eg, "(sum ?j (* (softmax ?j (window ?i ?j ?w ?s)) ?v))", root) {
            let w = b.eg[m[var("?w")]].data.konst.map(|w| w as u64);
            if let (Some(i), Some(j), Some(w)) = (sym_of(&b.eg, &m, "?i"), sym_of(&b.eg, &m, "?j"), w) {
                cands.push((i, j, Some(w), m[var("?s")], m[var("?v")]));
            }
        }
        for (i, j, w, s, v) in cands {
            match s2.scores(i, j, w, s, v) {
                Ok(m) => {
                    found = Ok(m);
                    break;
                }
                Err(why) => found = Err((why, s)),
            }
        }
    }
    let m = match found {
        Ok(m) => m,
        Err((why, at)) => {
            let span = b.span_of(at).unwrap_or(g_ro.node(store).span);
            ex.push(Explanation {
                message: format!("not recognized as decay-gated attention: {why}"),
                span,
                hint: Some(
                    "foxc fuses `sum(j, softmax(j, causal(i, j, scale * sum(d, q * k) + c[i] - c[j])) * v)`"
                        .into(),
                ),
            });
            return Ok(None);
        }
    };

    // Add the fused node to the root class and extract.
    let zero = b.eg.add(Attn::Num(Num::new(0.0)));
    let w = b.eg.add(Attn::Num(Num::new(m.window.unwrap_or(0) as f64)));
    let (si, sj, sd) =
        (b.eg.add(Attn::Symbol(m.i)), b.eg.add(Attn::Symbol(m.j)), b.eg.add(Attn::Symbol(m.d)));
    let (ci, cj) = m.c.unwrap_or((zero, zero));
    let fused = b.eg.add(Attn::DAttn([si, sj, sd, w, m.sc, m.q, m.k, m.v, ci, cj]));
    b.eg.union(root, fused);
    b.eg.rebuild();
    let root = b.eg.find(root);
    let store_span = g_ro.node(store).span;
    let store_name = g_ro.node(store).name.clone();

    let extractor = Extractor::new(&b.eg, FusedCost);
    if !matches!(extractor.find_best_node(root), Attn::DAttn(_)) {
        return Err(PassError::Internal("extraction did not choose the fused attention node".into()));
    }
    let mut em = Emit { g, b: &b, ex: extractor, span: store_span, memo: HashMap::new() };
    let fail = |e: String| PassError::Internal(format!("emitting the fused attention: {e}"));
    let [bb, hh] = m.batch;
    let qo = [bb, hh, m.i, m.d];
    let ko = [bb, hh, m.j, m.d];
    let vo = [bb, hh, m.j, m.e];
    let mut q = em.positional(m.q, &qo, store_span).map_err(fail)?;
    let k = em.positional(m.k, &ko, store_span).map_err(fail)?;
    let v = em.positional(m.v, &vo, store_span).map_err(fail)?;
    // A constant scale is an attribute; a symbolic one (`1/sqrt(D)` with D symbolic) is applied
    // to q, because the attribute is a number.
    let scale = match em.b.eg[m.sc].data.konst {
        Some(s) => s,
        None => {
            let s = em.emit(m.sc).map_err(fail)?;
            q = em.node(Op::Binary(BinaryOp::Mul), &[q, s], store_span).map_err(fail)?;
            1.0
        }
    };
    let mut operands = vec![q, k, v];
    if let Some((ci, _)) = m.c {
        let c = emit_c(&mut em, ci, &[bb, hh, m.i]).map_err(fail)?;
        operands.push(c);
    }
    let attrs = AttnAttrs { scale, has_decay: m.c.is_some(), window: m.window };
    let node = em.node(Op::DecayAttention(attrs), &operands, store_span).map_err(fail)?;
    g.node_mut(node).name = store_name;
    g.replace_all_uses(store, node);
    g.remove_dead();
    Ok(Some(node))
}

/// The positional `[B, H, T]` log-decay cumsum `c` for the class of `c[i]`: a `gate_cumsum` when
/// `c` is a cumsum of a gate (logits or log-gates) or a linear ALiBi ramp, else the stored value.
fn emit_c(em: &mut Emit, ci: Id, order: &[Symbol; 3]) -> Result<ValueId, String> {
    let eg = &em.b.eg;
    let [bb, hh, i] = *order;
    let span = em.b.span_of(ci).unwrap_or(em.span);
    // c[i] = cumsum(i, G[b, h, i]).
    for m in matches(eg, "(cumsum ?t ?g)", ci) {
        if eg[m[var("?t")]].data.sym != Some(i) {
            continue;
        }
        let gid = m[var("?g")];
        for lm in matches(eg, "(logsigmoid ?z)", gid) {
            let z = lm[var("?z")];
            if eg[z].data.axes.iter().all(|a| order.contains(a)) {
                let zp = em.positional(z, order, span)?;
                return em.node(Op::GateCumsum { kind: GateKind::Logits }, &[zp], span);
            }
        }
        let gp = em.positional(gid, order, span)?;
        return em.node(Op::GateCumsum { kind: GateKind::LogGate }, &[gp], span);
    }
    // c[i] = a[h] * i (ALiBi: slope -a).
    for m in matches(eg, "(* ?a (iota ?t))", ci) {
        let a = m[var("?a")];
        if eg[m[var("?t")]].data.sym == Some(i) && eg[a].data.axes.iter().all(|x| *x == hh) {
            // New nodes of the slope point at the slope's source (for `--explain`).
            let span = em.b.span_of(a).unwrap_or(span);
            em.span = span;
            let neg = em.b.eg.lookup(Attn::Neg(a));
            let slope = match neg {
                Some(n) => em.positional(n, &[hh], span)?,
                None => {
                    let av = em.positional(a, &[hh], span)?;
                    em.node(Op::Unary(UnaryOp::Neg), &[av], span)?
                }
            };
            let dim =
                |s: &Symbol| em.b.dims.get(s).cloned().ok_or_else(|| format!("unknown size of axis `{s}`"));
            let ty = ValueType::tensor(DType::F32, [dim(&bb)?, dim(&hh)?, dim(&i)?]);
            return Ok(em.g.add(Op::GateCumsum { kind: GateKind::Slope }, ty, &[slope], span));
        }
    }
    em.positional(ci, order, span)
}
