//! The score `E` of a recognized attention, split into the region `R` (an expression of the
//! scaled product `x`) and the decay terms `c_i - c_j` (contract: docs/SEMANTICS.md).
//!
//! 1. [`extract`] reads one term out of the saturated score class with the class of
//!    `scale * q . k` replaced by the leaf `x` (cheapest spelling, dims costed high so that a
//!    `1/sqrt(D)` stays in the scale rather than the region).
//! 2. [`split`] expands the term into a signed sum (distributing factors free of `x` over sums:
//!    `m[h] (j - i)` is `m[h] j - m[h] i`) and pairs every term `t(i)` that depends on the query
//!    index (and batch/head) only with a term `-t(j)`: those pairs are the decay `c_i - c_j`.
//!    Everything else (terms with `x`, unpaired key or query biases, terms of both `i` and `j`)
//!    is the region.

use super::build::Shifted;
use super::mask::same_offset;
use crate::lang::{rename, Attn, AttnGraph, Num};
use egg::{Id, Language, RecExpr, Symbol};
use foxc_ir::index::IndexExpr;
use foxc_ir::{Dim, UnaryOp};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::rc::Rc;

/// The name of the leaf that stands for `x = scale * q . k` in an extracted term.
pub(crate) const X: &str = "$x";

/// An extracted term: an e-graph node with its children, and the class it came from (`None` for
/// nodes built by [`split`]).
///
/// Children are shared: [`extract`] builds one node per e-class, so a term that uses a class
/// twice (`a2 = a1 + a1`) holds it once, and a chain of such statements stays as small as the
/// program. Walks over terms ([`T::uses_x`], [`T::to_expr`], the region builder) visit each
/// shared node once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct T {
    /// The node; its child ids are meaningless (the children are `kids`).
    pub op: Attn,
    pub kids: Vec<Rc<T>>,
    pub class: Option<Id>,
}

impl T {
    pub fn x(class: Id) -> T {
        T { op: Attn::Symbol(Symbol::from(X)), kids: vec![], class: Some(class) }
    }
    pub fn num(c: f64) -> T {
        T { op: Attn::Num(Num::new(c)), kids: vec![], class: None }
    }
    fn node(op: Attn, kids: Vec<T>) -> T {
        T { op, kids: kids.into_iter().map(Rc::new).collect(), class: None }
    }
    pub fn is_x(&self) -> bool {
        matches!(&self.op, Attn::Symbol(s) if s.as_str() == X)
    }
    pub fn uses_x(&self) -> bool {
        // Each shared node once: a node seen before did not use `x` (else the walk had stopped).
        fn go(t: &T, seen: &mut HashSet<*const T>) -> bool {
            t.is_x() || t.kids.iter().any(|k| seen.insert(Rc::as_ptr(k)) && go(k, seen))
        }
        go(self, &mut HashSet::new())
    }
    pub fn konst(&self) -> Option<f64> {
        match &self.op {
            Attn::Num(n) => Some(n.get()),
            _ => None,
        }
    }

    /// Free index variables (those of the classes; a built node has the union of its children's).
    pub fn axes(&self, eg: &AttnGraph) -> BTreeSet<Symbol> {
        match self.class {
            Some(c) if !self.is_x() => eg[c].data.axes.clone(),
            _ => self.kids.iter().flat_map(|k| k.axes(eg)).collect(),
        }
    }

    /// The term as a `RecExpr` (for adding it to the e-graph).
    pub fn to_expr(&self) -> RecExpr<Attn> {
        // A shared node is added once (the expression is as large as the term's DAG).
        fn go(t: &T, e: &mut RecExpr<Attn>, memo: &mut HashMap<*const T, Id>) -> Id {
            let mut ids = Vec::with_capacity(t.kids.len());
            for k in &t.kids {
                let id = match memo.get(&Rc::as_ptr(k)) {
                    Some(&id) => id,
                    None => {
                        let id = go(k, e, memo);
                        memo.insert(Rc::as_ptr(k), id);
                        id
                    }
                };
                ids.push(id);
            }
            let mut op = t.op.clone();
            for (slot, id) in op.children_mut().iter_mut().zip(ids) {
                *slot = id;
            }
            e.add(op)
        }
        let mut e = RecExpr::default();
        go(self, &mut e, &mut HashMap::new());
        e
    }

    /// The e-class of the term, adding it to the e-graph if needed (hash-consing makes equal
    /// spellings one class).
    pub fn class_in(&self, eg: &mut AttnGraph) -> Id {
        match self.class {
            Some(c) => eg.find(c),
            None => {
                let id = eg.add_expr(&self.to_expr());
                eg.find(id)
            }
        }
    }
}

/// Own cost of a node (AST size; `dim` costs `dim_cost`).
fn own_cost(n: &Attn, dim_cost: f64) -> Option<f64> {
    Some(match n {
        Attn::Dim(_) => dim_cost,
        Attn::Num(_) | Attn::Symbol(_) => 0.5,
        // Division by a constant reads as written (`x / 20`, not `x * 0.05`).
        Attn::Div(_) => 0.9,
        _ => 1.0,
    })
}

/// The cheapest term of class `root`, with class `x` (if any) read as the leaf [`X`] and a dim
/// costing `dim_cost` (high in regions: a `1/sqrt(D)` belongs in the scale).
/// Returns the term and its cost; `None` if the class has no finite term.
pub(crate) fn extract(eg: &AttnGraph, root: Id, x: Option<Id>, dim_cost: f64) -> Option<(T, f64)> {
    let x = x.map(|x| eg.find(x));
    let best = cheapest_nodes(eg, root, x, dim_cost);
    // One node per class (memo: the node and its height), so that a class used twice is one
    // shared child; a term taller than MAX_TERM_HEIGHT is none (as a walk that gave up deeper
    // than that on any path).
    type Built = HashMap<Id, Option<(Rc<T>, usize)>>;
    fn build(
        eg: &AttnGraph,
        best: &HashMap<Id, (f64, Attn)>,
        x: Option<Id>,
        c: Id,
        memo: &mut Built,
    ) -> Option<(Rc<T>, usize)> {
        let c = eg.find(c);
        if Some(c) == x {
            return Some((Rc::new(T::x(c)), 0));
        }
        if let Some(b) = memo.get(&c) {
            return b.clone();
        }
        // Cycles cannot occur (costs grow along the best nodes), but a class under construction
        // reads as none rather than recursing forever.
        memo.insert(c, None);
        let n = &best.get(&c)?.1;
        let mut kids = Vec::with_capacity(n.len());
        let mut height = 0;
        for k in n.children() {
            let (t, h) = build(eg, best, x, *k, memo)?;
            height = height.max(h + 1);
            kids.push(t);
        }
        let b =
            (height <= MAX_TERM_HEIGHT).then(|| (Rc::new(T { op: n.clone(), kids, class: Some(c) }), height));
        memo.insert(c, b.clone());
        b
    }
    let root = eg.find(root);
    let cost = if Some(root) == x { X_COST } else { best.get(&root)?.0 };
    let (t, _) = build(eg, &best, x, root, &mut HashMap::new())?;
    Some((Rc::unwrap_or_clone(t), cost))
}

/// The cost of the leaf [`X`].
const X_COST: f64 = 0.5;

/// A node's cost in the queue of [`cheapest_nodes`]: cheapest first, then the class's and the
/// node's position in the e-graph (a deterministic choice among equal costs).
#[derive(PartialEq)]
struct Queued(f64, usize, usize);

impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Queued {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        // Reversed: `BinaryHeap` pops the largest.
        o.0.total_cmp(&self.0).then(o.1.cmp(&self.1)).then(o.2.cmp(&self.2))
    }
}

/// The cheapest node of every class below `root` that has a finite term (`x`, when given, is
/// the leaf [`X`] of cost [`X_COST`]), with its cost: the cost of a term is the sum of its
/// nodes' own costs.
///
/// Knuth's generalization of Dijkstra's algorithm: every own cost is positive, so the cheapest
/// node whose children all have their final cost is final for its class. Each node is looked at
/// once per child and once when its children are done: time O(nodes log nodes), however the
/// e-graph's classes are ordered (a fixpoint over the classes in e-graph order re-evaluated a
/// long chain once per improvement, quadratically).
fn cheapest_nodes(eg: &AttnGraph, root: Id, x: Option<Id>, dim_cost: f64) -> HashMap<Id, (f64, Attn)> {
    let below = reachable(eg, root, x);
    let order: Vec<Id> = eg.classes().map(|c| c.id).filter(|c| below.contains(c) && Some(*c) != x).collect();
    let pos: HashMap<Id, usize> = order.iter().enumerate().map(|(p, id)| (*id, p)).collect();
    // Per class and node: how many children are not final yet; per class: the nodes reading it
    // (once per occurrence).
    let mut waiting: Vec<Vec<usize>> = Vec::with_capacity(order.len());
    let mut readers: Vec<Vec<(usize, usize)>> = vec![vec![]; order.len()];
    let mut queue = std::collections::BinaryHeap::new();
    let mut best: HashMap<Id, (f64, Attn)> = HashMap::new();
    let cost_of = |best: &HashMap<Id, (f64, Attn)>, c: Id| -> Option<f64> {
        let c = eg.find(c);
        if Some(c) == x {
            return Some(X_COST);
        }
        best.get(&c).map(|b| b.0)
    };
    let node_cost = |best: &HashMap<Id, (f64, Attn)>, n: &Attn| -> Option<f64> {
        let own = own_cost(n, dim_cost)?;
        let kids: Option<f64> = n.children().iter().map(|c| cost_of(best, *c)).sum();
        Some(own + kids?)
    };
    for (p, id) in order.iter().enumerate() {
        let mut w = Vec::with_capacity(eg[*id].nodes.len());
        for (k, n) in eg[*id].nodes.iter().enumerate() {
            let mut pending = 0;
            for c in n.children() {
                if let Some(&q) = pos.get(&eg.find(*c)) {
                    readers[q].push((p, k));
                    pending += 1;
                }
            }
            if pending == 0 {
                if let Some(c) = node_cost(&best, n) {
                    queue.push(Queued(c, p, k));
                }
            }
            w.push(pending);
        }
        waiting.push(w);
    }
    while let Some(Queued(c, p, k)) = queue.pop() {
        let id = order[p];
        if best.contains_key(&id) {
            continue;
        }
        best.insert(id, (c, eg[id].nodes[k].clone()));
        for &(r, rk) in &readers[p] {
            waiting[r][rk] -= 1;
            if waiting[r][rk] == 0 && !best.contains_key(&order[r]) {
                if let Some(c) = node_cost(&best, &eg[order[r]].nodes[rk]) {
                    queue.push(Queued(c, r, rk));
                }
            }
        }
    }
    best
}

/// The classes reachable from `root` through the nodes' children, `stop` (when given) included
/// but not descended into.
pub(crate) fn reachable(eg: &AttnGraph, root: Id, stop: Option<Id>) -> BTreeSet<Id> {
    let mut seen = BTreeSet::new();
    let mut stack = vec![eg.find(root)];
    while let Some(c) = stack.pop() {
        if !seen.insert(c) || Some(c) == stop {
            continue;
        }
        for n in &eg[c].nodes {
            stack.extend(n.children().iter().map(|k| eg.find(*k)));
        }
    }
    seen
}

/// The tallest term [`extract`] returns (deeper ones are none: the walks over terms recurse).
const MAX_TERM_HEIGHT: usize = 201;

/// The most terms [`expand`] makes of one term: past it the term stays whole (a doubling
/// chain `a2 = a1 + a1, a3 = a2 + a2, ...` would expand into exponentially many).
pub(crate) const MAX_TERMS: usize = 256;

/// `coef * t` terms of a sum.
pub(crate) type Terms = Vec<(f64, T)>;

/// Expand `t` into a signed sum of terms (`+`, `-`, negation, constant factors, and products of
/// `x`-free sums are distributed); a term that would expand into more than [`MAX_TERMS`] terms
/// stays whole.
pub(crate) fn expand(t: &T, coef: f64, out: &mut Terms) {
    let start = out.len();
    if !expand_within(t, coef, out, start + MAX_TERMS) {
        out.truncate(start);
        out.push((coef, t.clone()));
    }
}

/// [`expand`] into `out` while it holds at most `limit` terms; false when it would exceed it.
fn expand_within(t: &T, coef: f64, out: &mut Terms, limit: usize) -> bool {
    let expand = |t: &T, coef: f64, out: &mut Terms| expand_within(t, coef, out, limit);
    let push = |out: &mut Terms, term: (f64, T)| {
        out.push(term);
        out.len() <= limit
    };
    match &t.op {
        Attn::Add(_) => expand(&t.kids[0], coef, out) && expand(&t.kids[1], coef, out),
        Attn::Sub(_) => expand(&t.kids[0], coef, out) && expand(&t.kids[1], -coef, out),
        Attn::Unary(UnaryOp::Neg, _) => expand(&t.kids[0], -coef, out),
        Attn::Mul(_) => {
            let (a, b) = (&t.kids[0], &t.kids[1]);
            if let Some(c) = a.konst().filter(|c| c.is_finite()) {
                return expand(b, coef * c, out);
            }
            if let Some(c) = b.konst().filter(|c| c.is_finite()) {
                return expand(a, coef * c, out);
            }
            // Distributing an infinite factor over a sum is wrong where the sum is 0 (`inf * (i -
            // j)` is 0 on the diagonal by the count rule, `inf * i - inf * j` is NaN there).
            let infinite = |f: &T| f.konst().is_some_and(|c| !c.is_finite());
            if t.uses_x() || infinite(a) || infinite(b) {
                return push(out, (coef, t.clone()));
            }
            // Each factor on its own (within its own limit), then their product within ours.
            let (mut ta, mut tb) = (vec![], vec![]);
            self::expand(a, 1.0, &mut ta);
            self::expand(b, 1.0, &mut tb);
            if ta.len() == 1 && tb.len() == 1 && ta[0].1 == **a && tb[0].1 == **b {
                return push(out, (coef * ta[0].0 * tb[0].0, t.clone()));
            }
            for (ca, xa) in &ta {
                for (cb, xb) in &tb {
                    let term =
                        (coef * ca * cb, T::node(Attn::Mul([Id::from(0); 2]), vec![xa.clone(), xb.clone()]));
                    if !push(out, term) {
                        return false;
                    }
                }
            }
            true
        }
        _ => push(out, (coef, t.clone())),
    }
}

/// Rebuild `sum coef * t` as one term (`None` for an empty sum).
pub(crate) fn sum_of(terms: &[(f64, T)]) -> Option<T> {
    let z = Id::from(0);
    let mut acc: Option<T> = None;
    for (c, t) in terms {
        let (neg, mag) = (*c < 0.0, c.abs());
        let scaled =
            if mag == 1.0 { t.clone() } else { T::node(Attn::Mul([z; 2]), vec![T::num(mag), t.clone()]) };
        acc = Some(match acc {
            None if neg => T::node(Attn::Unary(UnaryOp::Neg, [z]), vec![scaled]),
            None => scaled,
            Some(a) if neg => T::node(Attn::Sub([z; 2]), vec![a, scaled]),
            Some(a) => T::node(Attn::Add([z; 2]), vec![a, scaled]),
        });
    }
    acc
}

/// The score split into region terms and decay terms `c(i)` (each paired with a `-c(j)`).
#[derive(Clone, Debug)]
pub(crate) struct Split {
    pub region: Terms,
    pub decay: Terms,
    /// The decay's query offset `o` (a sum of dims): the pairs are `c(i + o) - c(j)`, the terms
    /// in `decay` the unshifted `c(i)`. `None`: no shift. Under a causal mask, the first pair's
    /// (the pairs may differ; the fused op reads them all at the diagonal).
    pub offset: Option<IndexExpr>,
}

/// The unshifted class and shift of term `t` when it reads a tensor at `i` plus dims
/// ([`Shifted`]).
fn shifted_read<'s>(
    eg: &AttnGraph,
    t: &T,
    i: Symbol,
    shifted: &'s BTreeMap<Id, Shifted>,
) -> Option<&'s Shifted> {
    let c = eg.find(t.class?);
    shifted.iter().find(|(k, s)| eg.find(**k) == c && s.var == i).map(|(_, s)| s)
}

/// A ramp's shift to the diagonal: where `c_i t` is a ramp `a * i` (ALiBi's `m[h] * i`, `a`
/// free of `i`) and the region holds terms `c_i a o` for the mask's offset `o = M - N + k`
/// (`m[h] * (j - i - M + N)` expands into them), the pair is `c(i + o) - c(j)` with `c(t) = a
/// t`: those terms' indices in `region`. `None` for another term, a zero offset, or terms that
/// do not add up to exactly `o`.
fn ramp_shift(
    eg: &mut AttnGraph,
    ci: f64,
    t: &T,
    i: Symbol,
    region: &Terms,
    diagonal: Option<&IndexExpr>,
) -> Option<(IndexExpr, Vec<usize>)> {
    let diagonal = diagonal.filter(|o| !same_offset(o, &IndexExpr::constant(0)))?;
    let is_i = |k: &T| matches!(k.op, Attn::Iota(_)) && k.kids.first().and_then(|s| s.sym()) == Some(i);
    let a = match t.kids.as_slice() {
        [x, y] if matches!(t.op, Attn::Mul(_)) && is_i(y) => x.clone(),
        [x, y] if matches!(t.op, Attn::Mul(_)) && is_i(x) => y.clone(),
        _ => return None,
    };
    if a.axes(eg).contains(&i) {
        return None;
    }
    let a = a.class_in(eg);
    let mut by = IndexExpr::constant(0);
    let mut used = vec![];
    for (n, (cr, r)) in region.iter().enumerate() {
        let Some((k, dim)) = ramp_part(eg, r, a) else { continue };
        let e = cr * k / ci;
        if e.fract() != 0.0 || e.abs() > (1u64 << 40) as f64 {
            continue;
        }
        match dim {
            Some(d) => by.dim_terms.push((Dim::sym(d.as_str()), e as i64)),
            None => by.constant += e as i64,
        }
        used.push(n);
    }
    eg.rebuild();
    same_offset(&by, diagonal).then_some((by, used))
}

/// `k a X` (a dim `X`) or `k a` as `(k, X)`: a term of a ramp's offset, `a` the ramp's class.
fn ramp_part(eg: &mut AttnGraph, t: &T, a: Id) -> Option<(f64, Option<Symbol>)> {
    if t.class_in(eg) == a {
        return Some((1.0, None));
    }
    let [x, y] = t.kids.as_slice() else { return None };
    if !matches!(t.op, Attn::Mul(_)) {
        return None;
    }
    let dim = |k: &T| match k.op {
        Attn::Dim(_) => k.kids.first().and_then(|s| s.sym()),
        _ => None,
    };
    match (x.konst(), y.konst(), dim(x), dim(y)) {
        (Some(k), ..) if k.is_finite() => ramp_part(eg, y, a).map(|(c, d)| (c * k, d)),
        (_, Some(k), ..) if k.is_finite() => ramp_part(eg, x, a).map(|(c, d)| (c * k, d)),
        (_, _, Some(d), None) if y.class_in(eg) == a => Some((1.0, Some(d))),
        (_, _, None, Some(d)) if x.class_in(eg) == a => Some((1.0, Some(d))),
        _ => None,
    }
}

/// `select(cond, A + decay, B + decay)` is `select(cond, A, B) + decay`, and `-inf` as a branch
/// takes any decay (`-inf + decay` is `-inf`): equal wherever the decay is finite or `-inf`
/// (only a NaN decay, from a NaN gate, now reaches the row, where it belongs). So a padding or
/// packing mask spelled around the whole score keeps its decay provable, and so does an `or`
/// of conditions (nested selects, `select(c1, s, select(c2, s, -inf))`: a sliding window with
/// attention sinks).
fn split_select(
    eg: &mut AttnGraph,
    e: &T,
    ij: (Symbol, Symbol),
    batch: [Symbol; 2],
    shifted: &BTreeMap<Id, Shifted>,
    diagonal: Option<&IndexExpr>,
) -> Option<Split> {
    let Attn::Select(_) = &e.op else { return None };
    let ninf = |t: &T| t.konst() == Some(f64::NEG_INFINITY);
    // Each branch split, or `None` for a `-inf` branch.
    let mut branch = |t: &T| -> Option<Option<Split>> {
        if ninf(t) {
            return Some(None);
        }
        let s = split(eg, t, ij, batch, shifted, diagonal);
        (!s.decay.is_empty()).then_some(Some(s))
    };
    let (a, b) = (branch(&e.kids[1])?, branch(&e.kids[2])?);
    let same = |eg: &mut AttnGraph, x: &Split, y: &Split| {
        (diagonal.is_some() || x.offset == y.offset)
            && x.decay.len() == y.decay.len()
            && x.decay
                .iter()
                .zip(&y.decay)
                .all(|((c1, t1), (c2, t2))| c1 == c2 && t1.class_in(eg) == t2.class_in(eg))
    };
    let (decay, offset) = match (&a, &b) {
        (Some(x), Some(y)) if !same(eg, x, y) => return None,
        (Some(x), _) | (None, Some(x)) => (x.decay.clone(), x.offset.clone()),
        (None, None) => return None,
    };
    let kept = |s: Option<Split>| match s {
        Some(s) => sum_of(&s.region),
        None => Some(T::num(f64::NEG_INFINITY)),
    };
    let (ka, kb) = (kept(a)?, kept(b)?);
    let region = T::node(Attn::Select([Id::from(0); 3]), vec![(*e.kids[0]).clone(), ka, kb]);
    Some(Split { region: vec![(1.0, region)], decay, offset })
}

/// Split the extracted score `e` (see the module doc). `batch` are the batch and head indices;
/// `shifted` the builder's shifted reads; `diagonal` the causal mask's offset `o` (`j <= i + o`),
/// `None` without one. Under a causal mask the fused op reads every pair at the diagonal, so
/// pairs written at different query positions are all taken (FoX's `c(i + M - N) - c(j)` beside
/// ALiBi's `m[h] (j - i)`): each moves by a row constant. A ramp's pair may be put there by the
/// terms of its offset ([`ramp_shift`]).
pub(crate) fn split(
    eg: &mut AttnGraph,
    e: &T,
    (i, j): (Symbol, Symbol),
    batch: [Symbol; 2],
    shifted: &BTreeMap<Id, Shifted>,
    diagonal: Option<&IndexExpr>,
) -> Split {
    if let Some(s) = split_select(eg, e, (i, j), batch, shifted, diagonal) {
        return s;
    }
    let mut terms = vec![];
    expand(e, 1.0, &mut terms);
    let side =
        |ax: &BTreeSet<Symbol>, k: Symbol| ax.contains(&k) && ax.iter().all(|a| *a == k || batch.contains(a));
    let mut region = vec![];
    let mut is = vec![];
    let mut js = vec![];
    for (c, t) in terms {
        let ax = t.axes(eg);
        if t.uses_x() {
            region.push((c, t));
        } else if side(&ax, i) {
            is.push((c, t));
        } else if side(&ax, j) {
            js.push((c, t));
        } else {
            region.push((c, t));
        }
    }
    let mut used = vec![false; js.len()];
    let mut decay = vec![];
    // The shift of the pairs so far. Without a causal mask every pair of one attention has the
    // same (the first pair's; a pair of another shift stays in the region, both halves).
    let mut offset: Option<Option<IndexExpr>> = None;
    for (ci, ti) in is {
        // `c(i + o)` pairs with `-c(j)` through its unshifted read `c(i)`, and a ramp `a i`
        // with the terms `a o` that put it at the diagonal.
        let ramp = ramp_shift(eg, ci, &ti, i, &region, diagonal);
        let shift = match &ramp {
            Some((by, _)) => Some(Shifted { unshifted: ti.class_in(eg), var: i, by: by.clone() }),
            None => shifted_read(eg, &ti, i, shifted).cloned(),
        };
        let base = match &shift {
            Some(s) => extract(eg, s.unshifted, None, 1.0).map(|(t, _)| t),
            None => Some(ti.clone()),
        };
        let Some(base) = base.filter(|_| {
            let zero = IndexExpr::constant(0);
            let by = |o: Option<&IndexExpr>| o.cloned().unwrap_or_else(|| zero.clone());
            diagonal.is_some()
                || offset
                    .as_ref()
                    .is_none_or(|o| same_offset(&by(o.as_ref()), &by(shift.as_ref().map(|s| &s.by))))
        }) else {
            region.push((ci, ti));
            continue;
        };
        let renamed = eg.add_expr(&rename(&base.to_expr(), i, j));
        let cands: Vec<Id> = js.iter().map(|(_, t)| t.class_in(eg)).collect();
        eg.rebuild();
        let want = eg.find(renamed);
        let hit = (0..js.len()).find(|&n| !used[n] && js[n].0 == -ci && eg.find(cands[n]) == want);
        match hit {
            Some(n) => {
                used[n] = true;
                offset = Some(shift.map(|s| s.by));
                decay.push((ci, base));
                if let Some((_, terms)) = ramp {
                    region = region
                        .into_iter()
                        .enumerate()
                        .filter(|(n, _)| !terms.contains(n))
                        .map(|(_, t)| t)
                        .collect();
                }
            }
            None => region.push((ci, ti)),
        }
    }
    for (n, t) in js.into_iter().enumerate() {
        if !used[n] {
            region.push(t);
        }
    }
    // `x` first: `x + kb[b, h, j]` reads as the user wrote it.
    region.sort_by_key(|(_, t)| !t.uses_x());
    Split { region, decay, offset: offset.flatten() }
}
