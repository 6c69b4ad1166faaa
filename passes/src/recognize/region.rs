//! Extracted score terms ([`super::score::T`]) to the IR's [`Region`], and the scale class to the
//! op's [`Scale`] attribute.
//!
//! A region reads the indices `b, h, i, j`, dims, constants and captured tensors indexed by those
//! indices. A subterm that is none of these (a reduction, a cumsum, a norm) but depends on at
//! most one of `i` and `j` is computed outside the attention and captured (a per-key bias
//! `kb[b, h, j] = sum(e, w[e] * k[b, h, j, e])` becomes a `[B, H, T]` tensor read at `[b, h, j]`).

use super::build::instantiate;
use super::names::shown;
use super::score::T;
use crate::lang::{pat, Attn, AttnGraph};
use egg::{Id, Searcher, Symbol};
use foxc_ir::attention::{IndexVar, RId, RNode, Region, Scale};
use foxc_ir::index::IndexExpr;
use foxc_ir::{BinaryOp, Dim, ValueId};
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

/// A positional tensor of the given index variables (in `b, h, i, j` order) that computes a
/// subterm outside the attention.
pub(crate) type Materialize<'m> = dyn FnMut(&T, &[Symbol]) -> Result<ValueId, String> + 'm;

/// Builds one region and collects its captures.
pub(crate) struct RegionBuilder<'a> {
    /// The DSL names of `b, h, i, j` at this attention.
    pub vars: [(Symbol, IndexVar); 4],
    /// The tensor read by each `in` leaf.
    pub leaves: &'a BTreeMap<Symbol, ValueId>,
    /// Computed subscript templates ([`super::build::Builder::subscripts`]).
    pub subscripts: &'a BTreeMap<Symbol, IndexExpr>,
    pub captures: Vec<ValueId>,
    pub region: Region,
    /// The e-class each region node was extracted from (`None` for nodes the score split
    /// built), for the source spans of explanations.
    classes: Vec<Option<Id>>,
    /// The node built for each shared operand term of this region (a term that uses one
    /// subterm twice gets one node for it: the region stays as small as the term's DAG).
    built: HashMap<*const T, RId>,
}

fn var_index(v: IndexVar) -> IndexExpr {
    IndexExpr {
        terms: vec![(v.name().to_string(), 1)],
        dim_terms: vec![],
        constant: 0,
        div: None,
        clamps: vec![],
    }
}

impl<'a> RegionBuilder<'a> {
    pub fn new(
        vars: [Symbol; 4],
        leaves: &'a BTreeMap<Symbol, ValueId>,
        subscripts: &'a BTreeMap<Symbol, IndexExpr>,
    ) -> RegionBuilder<'a> {
        let iv = IndexVar::ALL;
        RegionBuilder {
            vars: [(vars[0], iv[0]), (vars[1], iv[1]), (vars[2], iv[2]), (vars[3], iv[3])],
            leaves,
            subscripts,
            captures: vec![],
            region: Region::new(),
            classes: vec![],
            built: HashMap::new(),
        }
    }

    fn var(&self, s: Symbol) -> Option<IndexVar> {
        self.vars.iter().find(|(n, _)| *n == s).map(|(_, v)| *v)
    }

    /// One subscript of a leaf in the variables `b, h, i, j` (`None` if it uses another index).
    fn subscript(&self, a: &T) -> Option<IndexExpr> {
        if let Some(s) = a.sym() {
            return self.var(s).map(var_index);
        }
        if !matches!(a.op, Attn::Ix(_)) {
            return None;
        }
        let template = self.subscripts.get(&a.kids[0].sym()?)?;
        let vars = a.kids[1..]
            .iter()
            .map(|v| v.sym().and_then(|s| self.var(s)).map(|v| v.name().to_string()))
            .collect::<Option<Vec<_>>>()?;
        instantiate(template, &vars)
    }

    /// Append `n`, extracted from `class`.
    fn push(&mut self, n: RNode, class: Option<Id>) -> RId {
        self.classes.push(class);
        self.region.push(n)
    }

    fn capture(&mut self, v: ValueId, index: Vec<IndexExpr>, class: Option<Id>) -> RId {
        let k = match self.captures.iter().position(|c| *c == v) {
            Some(k) => k,
            None => {
                self.captures.push(v);
                self.captures.len() - 1
            }
        };
        self.push(RNode::Capture { k, index }, class)
    }

    /// Add `t` to the region; returns its node.
    pub fn add(&mut self, eg: &AttnGraph, t: &T, mat: &mut Materialize) -> Result<RId, String> {
        let kid = |me: &mut Self, mat: &mut Materialize, k: usize| me.add_shared(eg, &t.kids[k], mat);
        let node = match &t.op {
            _ if t.is_x() => RNode::Score,
            Attn::Num(n) => RNode::Const(n.get()),
            Attn::Iota(_) => {
                let s = t.kids[0].sym().ok_or("an index without a name")?;
                RNode::Index(self.var(s).ok_or_else(|| {
                    format!(
                        "the scores use the index `{}`, which is none of batch, head, query or key",
                        shown(s)
                    )
                })?)
            }
            Attn::Dim(_) => {
                let s = t.kids[0].sym().ok_or("a dim without a name")?;
                RNode::Dim(Dim::sym(s.as_str()))
            }
            Attn::In(_) => {
                let name = t.kids[0].sym().ok_or("a tensor without a name")?;
                let index: Option<Vec<IndexExpr>> = t.kids[1..].iter().map(|a| self.subscript(a)).collect();
                match (index, self.leaves.get(&name)) {
                    (Some(index), Some(&v)) => return Ok(self.capture(v, index, t.class)),
                    _ => return self.materialize(eg, t, mat),
                }
            }
            Attn::Unary(u, _) => {
                let a = kid(self, mat, 0)?;
                RNode::Unary(*u, a)
            }
            Attn::Recip(_) => {
                let one = self.push(RNode::Const(1.0), None);
                let a = kid(self, mat, 0)?;
                RNode::Binary(BinaryOp::Div, one, a)
            }
            Attn::Add(_)
            | Attn::Sub(_)
            | Attn::Mul(_)
            | Attn::Div(_)
            | Attn::Min(_)
            | Attn::Max(_)
            | Attn::Lt(_)
            | Attn::Le(_)
            | Attn::Gt(_)
            | Attn::Ge(_)
            | Attn::Eq(_)
            | Attn::Ne(_) => {
                let b = match &t.op {
                    Attn::Add(_) => BinaryOp::Add,
                    Attn::Sub(_) => BinaryOp::Sub,
                    Attn::Mul(_) => BinaryOp::Mul,
                    Attn::Div(_) => BinaryOp::Div,
                    Attn::Min(_) => BinaryOp::Min,
                    Attn::Max(_) => BinaryOp::Max,
                    Attn::Lt(_) => BinaryOp::Lt,
                    Attn::Le(_) => BinaryOp::Le,
                    Attn::Gt(_) => BinaryOp::Gt,
                    Attn::Ge(_) => BinaryOp::Ge,
                    Attn::Eq(_) => BinaryOp::Eq,
                    _ => BinaryOp::Ne,
                };
                let (x, y) = (kid(self, mat, 0)?, kid(self, mat, 1)?);
                RNode::Binary(b, x, y)
            }
            Attn::Select(_) => {
                let (c, a, b) = (kid(self, mat, 0)?, kid(self, mat, 1)?, kid(self, mat, 2)?);
                RNode::Select(c, a, b)
            }
            _ => return self.materialize(eg, t, mat),
        };
        Ok(self.push(node, t.class))
    }

    /// [`RegionBuilder::add`] of an operand term, once per shared term. A leaf (a constant, an
    /// index, a read) is built at every use, as the tree walk did.
    fn add_shared(&mut self, eg: &AttnGraph, t: &Rc<T>, mat: &mut Materialize) -> Result<RId, String> {
        if t.kids.is_empty() || matches!(t.op, Attn::In(_)) {
            return self.add(eg, t, mat);
        }
        if let Some(&n) = self.built.get(&Rc::as_ptr(t)) {
            return Ok(n);
        }
        let n = self.add(eg, t, mat)?;
        self.built.insert(Rc::as_ptr(t), n);
        Ok(n)
    }

    /// A subterm computed outside the attention and captured.
    fn materialize(&mut self, eg: &AttnGraph, t: &T, mat: &mut Materialize) -> Result<RId, String> {
        if t.uses_x() && matches!(t.op, Attn::Causal(_) | Attn::Window(_)) {
            return Err("a `causal` or `window` mask is applied inside the scores, not around them (write \
                        softmax(j, window(i, j, W, E)), or select(c, window(i, j, W, E), -inf))"
                .into());
        }
        if t.uses_x() {
            return Err("the scores use `q . k` inside a reduction or a cumsum".into());
        }
        let ax = t.axes(eg);
        if let Some(s) = ax.iter().find(|s| self.var(**s).is_none()) {
            return Err(format!(
                "the scores use the index `{}`, which is none of batch, head, query or key",
                shown(*s)
            ));
        }
        let (i, j) = (self.vars[2].0, self.vars[3].0);
        if ax.contains(&i) && ax.contains(&j) {
            return Err(
                "a term of the scores that depends on both the query and the key index is a reduction or \
                        a cumsum, which cannot be computed per score entry"
                    .into(),
            );
        }
        let order: Vec<(Symbol, IndexVar)> =
            self.vars.iter().filter(|(s, _)| ax.contains(s)).cloned().collect();
        let syms: Vec<Symbol> = order.iter().map(|(s, _)| *s).collect();
        let v = mat(t, &syms)?;
        Ok(self.capture(v, order.into_iter().map(|(_, v)| var_index(v)).collect(), t.class))
    }

    /// The region built so far, with root `root`, and the e-class of each of its nodes; the
    /// builder starts a new one that shares the captures (the score region and the mask region
    /// of one op).
    pub fn take(&mut self, root: RId) -> (Region, Vec<Option<Id>>) {
        let mut r = std::mem::replace(&mut self.region, Region::new());
        r.root = root;
        self.built.clear();
        (r, std::mem::take(&mut self.classes))
    }
}

impl T {
    /// The symbol of a symbol leaf.
    pub fn sym(&self) -> Option<Symbol> {
        match &self.op {
            Attn::Symbol(s) => Some(*s),
            _ => None,
        }
    }
}

/// The [`Scale`] of the class `sc`: a constant, or `c / sqrt(D)` with a symbolic dim `D`.
pub(crate) fn scale_of(eg: &AttnGraph, sc: Id) -> Option<Scale> {
    let data = &eg[sc].data;
    if !data.axes.is_empty() {
        return None;
    }
    if let Some(k) = data.konst {
        return k.is_finite().then(|| Scale::constant(k));
    }
    let dim_of = |m: &egg::Subst| eg[m["?d".parse().unwrap()]].data.sym.map(|s| Dim::sym(s.as_str()));
    if let Some(m) = pat("(rsqrt (dim ?d))").search_eclass(eg, sc) {
        if let Some(d) = m.substs.iter().find_map(dim_of) {
            return Some(Scale::inv_sqrt(1.0, d));
        }
    }
    if let Some(m) = pat("(* ?c (rsqrt (dim ?d)))").search_eclass(eg, sc) {
        for s in &m.substs {
            let c = eg[s["?c".parse().unwrap()]].data.konst;
            if let (Some(c), Some(d)) = (c.filter(|c| c.is_finite()), dim_of(s)) {
                return Some(Scale::inv_sqrt(c, d));
            }
        }
    }
    None
}
