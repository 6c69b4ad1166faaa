//! The key bound an attention proves: every key `j < E` of row `i` is dropped, for a region
//! `E` of `b, h, i`, dims and captured tensors (never of `j` or the score). Two forms:
//! - an expression mask `j >= E` (also written `E <= j`, `j > E`, `E < j`): masked;
//! - a score region `select(j >= E, X, -inf)` (the same conditions): a `-inf` score, weight 0,
//!   which is what a masked entry contributes (the context-parallel own-chunk partial).
//!
//! A kernel then skips the key tiles that lie below `E` on every row of its query tile
//! (attribute `keys_from`, set by the tiles pass); the value is the same.
//!
//! Why only these forms: the mask keeps an entry where its condition is non-zero, NaN included.
//! A comparison gives exactly 0 or 1 (0 when an operand is NaN), so `j >= E` drops every
//! `j < E`, whatever `E` is. (`and` lowers to nested selects, whose outermost is the form; a
//! product of two conditions would also bound, but a product with a value could be
//! `0 * NaN = NaN`, kept.)
//!
//! [`Diagonal`] says whether a score region keeps each row's diagonal, which ACP's threshold
//! needs; it reads the same conditions (`j >= E` rises along a row's keys).

use foxc_ir::attention::{IndexVar, RId, RNode, Region};
use foxc_ir::{BinaryOp, Dim, Graph, UnaryOp, ValueId};
use std::collections::BTreeMap;

/// The region `E` with every key `j < E` masked, when `mask` is `j >= E` in one of its forms.
pub fn keys_from(mask: &Region) -> Option<Region> {
    lower_bound(mask, mask.root)
}

/// The region `E` with a `-inf` score at every key `j < E`, when the score region is
/// `select(j >= E, X, -inf)` (the condition in one of the mask's forms); in a chain of such
/// selects (a conjunction: `j >= start[b] and i + M - N - j < W`), the largest of their bounds.
pub fn keys_from_score(score: &Region) -> Option<Region> {
    let mut bounds = vec![];
    let mut n = score.root;
    while let Some(&RNode::Select(c, x, e)) = score.nodes.get(n as usize) {
        if !is_neg_inf(score, e) {
            break;
        }
        bounds.extend(lower_bound(score, c));
        n = x;
    }
    let mut bounds = bounds.into_iter();
    let first = bounds.next()?;
    Some(bounds.fold(first, |mut acc, e| {
        let (a, e) = (acc.root, acc.append(&e));
        acc.push(RNode::Binary(BinaryOp::Max, a, e));
        acc
    }))
}

/// A row's diagonal: the key at its position `j = p(i) = i + Tk - Tq` (`i` when square), the
/// entry whose decay is 0 and on which ACP's threshold argument rests.
#[derive(Clone, Debug, PartialEq)]
pub struct Diagonal {
    /// `Tk - Tq`, affine in the dims (`None` where a length is not a plain dim or constant:
    /// then no condition that reads `j` is decided).
    shift: Option<Affine>,
}

impl Diagonal {
    /// The diagonal of an attention whose queries `q` and keys `k` have their positions on
    /// axis 2.
    pub fn of(g: &Graph, q: ValueId, k: ValueId) -> Diagonal {
        let len = |v: ValueId| Affine::of_dim(g.ty(v).dims().nth(2)?);
        Diagonal { shift: len(k).zip(len(q)).map(|(k, q)| k.sub(&q)) }
    }

    /// The most keys a row keeps from its key bound `keys_from` (`E`: every key `j < E`
    /// dropped) to its diagonal `p(i)`, where that is a constant: `p(i) - E(i) + 1` for an `E`
    /// that is `p` less a constant (`i + M - N - 256`, the bound of the window `i + M - N - j <
    /// 256`: 257), the least of those of a `max` of bounds (`max(start[b], i + M - N - 256)`: at
    /// most 257). `None` otherwise.
    pub fn keys_at_most(&self, keys_from: &Region) -> Option<f64> {
        self.keys_below(keys_from, keys_from.root)
    }

    /// [`Diagonal::keys_at_most`] of the bound at node `n`.
    fn keys_below(&self, r: &Region, n: RId) -> Option<f64> {
        if let RNode::Binary(BinaryOp::Max, a, b) = r.nodes[n as usize] {
            return match (self.keys_below(r, a), self.keys_below(r, b)) {
                (Some(x), Some(y)) => Some(x.min(y)),
                (x, y) => x.or(y),
            };
        }
        let p = Affine { i: 1.0, ..Affine::default() }.add(self.shift.as_ref()?);
        Some(p.sub(&self.value(r, n)?).constant()? + 1.0)
    }

    /// Whether region `r` provably is not `-inf` on the diagonal (every row keeps it): no leaf
    /// it can take there is the constant `-inf` (a score leaf is finite where it is bounded).
    pub fn kept(&self, r: &Region) -> bool {
        self.always(r, r.root, &[])
    }

    /// Whether every row that keeps some key `j <= p(i)` keeps its diagonal: what ACP's
    /// threshold needs of a causal or windowed attention (docs/SEMANTICS.md, `threshold`).
    /// [`Diagonal::kept`] suffices; beyond it, a condition that moves with `j` one way decides
    /// as well. `j >= E` (left padding's start) holds at the diagonal of every row where it
    /// holds at a key before it; `j < E` fails at every key before a diagonal where it holds.
    /// So the conditions of a tree of selects may come in any order (`j >= start[b] and
    /// i - j < W`, sinks under padding) as long as each is decided at the diagonal, free of
    /// `j`, or one of these; and a condition a row's path has decided decides its equal at the
    /// diagonal (right padding's `j < len[b] and i < len[b]`: where `j < len[b]` fails at the
    /// diagonal, `i < len[b]` fails at every key).
    pub fn kept_by_rows_with_keys(&self, r: &Region) -> bool {
        self.rows_keep(r, r.root, &[])
    }

    /// The condition to blame where [`Diagonal::kept_by_rows_with_keys`] fails on a
    /// conjunction (a chain of `select(c, X, -inf)`): one that falls along `j` (right padding's
    /// `j < len[b]`), every other being decided true at the diagonal, free of `j` or rising. Such
    /// a condition keeps earlier keys of rows whose diagonal it drops; `None` otherwise.
    pub fn falling_culprit(&self, r: &Region) -> Option<RId> {
        let (mut n, mut culprit) = (r.root, None);
        loop {
            match r.nodes[n as usize] {
                RNode::Select(c, x, y) if is_neg_inf(r, y) => {
                    match (self.holds(r, c), along_j(r, c)) {
                        (Some(true), _) | (None, Some(Along::Constant | Along::Rising)) => {}
                        (None, Some(Along::Falling)) => {
                            culprit.get_or_insert(c);
                        }
                        _ => return None,
                    }
                    n = x;
                }
                RNode::Select(..) => return None,
                _ => return culprit,
            }
        }
    }

    /// [`Diagonal::kept_by_rows_with_keys`] of the subtree at `n`, for the rows of `facts`.
    fn rows_keep(&self, r: &Region, n: RId, facts: &[Fact]) -> bool {
        let RNode::Select(c, x, y) = r.nodes[n as usize] else { return true };
        if self.always(r, n, facts) || self.never(r, n, facts) {
            return true;
        }
        // A row whose keys reach the other branch than its diagonal needs the diagonal's
        // branch to keep it in such rows.
        let crossing = |diagonal: RId, other: RId, f: &[Fact]| self.crossing(r, diagonal, other, f);
        match self.decide(r, c, facts) {
            Some(true) => crossing(x, y, facts) && self.rows_keep(r, x, facts),
            Some(false) => crossing(y, x, facts) && self.rows_keep(r, y, facts),
            None => {
                // The rows where `c` holds at the diagonal, and those where it does not.
                let (held, failed) = (with(facts, c, true), with(facts, c, false));
                let each = self.rows_keep(r, x, &held) && self.rows_keep(r, y, &failed);
                match along_j(r, c) {
                    // Every key of a row takes its diagonal's branch.
                    Some(Along::Constant) => each,
                    // Where `c` fails at the diagonal it fails at every key; where it holds,
                    // keys in `y` have the diagonal in `x`.
                    Some(Along::Rising) => each && crossing(x, y, &held),
                    // Where `c` holds at the diagonal it holds at every key; where it fails,
                    // keys in `x` have the diagonal in `y`.
                    Some(Along::Falling) => each && crossing(y, x, &failed),
                    None => false,
                }
            }
        }
    }

    /// Whether every row of `facts` that keeps a key `j <= p(i)` in the subtree `other` keeps
    /// its diagonal in the subtree `diagonal`. The conditions on that key's path through `other`
    /// tell of the row's diagonal: one free of `j` is the same there, `j >= E` holding at the
    /// key holds there, `j < E` failing at the key fails there. A path whose conditions the
    /// facts contradict keeps no key of these rows, and a `-inf` leaf none at all. (Sinks beside a
    /// window under left padding, `(j < 4 or i - j < W) and j >= start[b]`: a sink kept has
    /// `j >= start[b]`, so the diagonal has it too.)
    fn crossing(&self, r: &Region, diagonal: RId, other: RId, facts: &[Fact]) -> bool {
        let RNode::Select(c, x, y) = r.nodes[other as usize] else {
            return is_neg_inf(r, other) || self.always(r, diagonal, facts);
        };
        [(true, x), (false, y)].into_iter().all(|(at_key, sub)| {
            let at_diagonal = match along_j(r, c) {
                Some(Along::Constant) => Some(at_key),
                Some(Along::Rising) if at_key => Some(true),
                Some(Along::Falling) if !at_key => Some(false),
                _ => None,
            };
            match at_diagonal {
                Some(v) if self.decide(r, c, facts) == Some(!v) => true,
                Some(v) => self.crossing(r, diagonal, sub, &with(facts, c, v)),
                None => self.crossing(r, diagonal, sub, facts),
            }
        })
    }

    /// Whether the subtree at `n` is not `-inf` on the diagonal of any row of `facts`.
    fn always(&self, r: &Region, n: RId, facts: &[Fact]) -> bool {
        self.leaves(r, n, facts).iter().all(|&l| !is_neg_inf(r, l))
    }

    /// Whether the subtree at `n` is `-inf` at every key of every row of `facts`: a condition
    /// free of `j` takes the same branch at every key as at the diagonal, where the facts may
    /// decide it; any other may take both.
    fn never(&self, r: &Region, n: RId, facts: &[Fact]) -> bool {
        match r.nodes[n as usize] {
            RNode::Select(c, x, y) if free_of_j(r, c) => match self.decide(r, c, facts) {
                Some(true) => self.never(r, x, facts),
                Some(false) => self.never(r, y, facts),
                None => self.never(r, x, &with(facts, c, true)) && self.never(r, y, &with(facts, c, false)),
            },
            RNode::Select(_, x, y) => self.never(r, x, facts) && self.never(r, y, facts),
            _ => is_neg_inf(r, n),
        }
    }

    /// Whether region `r` on the diagonal is the score `x` itself or `-inf`: with
    /// [`Diagonal::kept`], a row's diagonal entry is `x_ii = scale q_i . k_p(i)`, what a rule
    /// reading `s_ii` assumes. (A bound of the identity's size does not say it:
    /// `select(i - j > 0, x, -x)` has `|R| <= |x|` and a diagonal of `-x_ii`.)
    pub fn is_score(&self, r: &Region) -> bool {
        self.leaves(r, r.root, &[]).iter().all(|&n| match r.nodes[n as usize] {
            RNode::Score => true,
            RNode::Const(c) => c == f64::NEG_INFINITY,
            _ => false,
        })
    }

    /// The leaves of the tree of selects at `n` that its value on the diagonal can be in the
    /// rows of `facts`: a select whose condition is decided there leads to one branch, an
    /// undecided one to both (each with what it says of the row).
    fn leaves(&self, r: &Region, n: RId, facts: &[Fact]) -> Vec<RId> {
        let mut out = vec![];
        let mut todo = vec![(n, facts.to_vec())];
        while let Some((n, facts)) = todo.pop() {
            match r.nodes[n as usize] {
                RNode::Select(c, x, y) => match self.decide(r, c, &facts) {
                    Some(true) => todo.push((x, facts)),
                    Some(false) => todo.push((y, facts)),
                    None => todo.extend([(x, with(&facts, c, true)), (y, with(&facts, c, false))]),
                },
                _ => out.push(n),
            }
        }
        out
    }

    /// The value of condition `c` at the diagonal of the rows of `facts`: decided by its
    /// sides ([`Diagonal::holds`]) or by a fact about a condition that is the same there.
    fn decide(&self, r: &Region, c: RId, facts: &[Fact]) -> Option<bool> {
        self.holds(r, c).or_else(|| facts.iter().find(|f| self.same_at_diagonal(r, f.0, c)).map(|f| f.1))
    }

    /// Whether comparisons `a` and `b` are the same at the diagonal: the same operator, and
    /// sides that are the same affine form there or the same expression free of `j`
    /// (`j < len[b]` at `j = i` is `i < len[b]`).
    fn same_at_diagonal(&self, r: &Region, a: RId, b: RId) -> bool {
        let (RNode::Binary(op, a0, a1), RNode::Binary(op2, b0, b1)) =
            (&r.nodes[a as usize], &r.nodes[b as usize])
        else {
            return false;
        };
        let side = |x: RId, y: RId| match (self.value(r, x), self.value(r, y)) {
            (Some(u), Some(v)) => u.sub(&v).constant() == Some(0.0),
            _ => free_of_j(r, x) && same_tree(r, x, y),
        };
        op.is_comparison() && op == op2 && side(*a0, *b0) && side(*a1, *b1)
    }

    /// The value of comparison `n` on the diagonal, when its two sides there differ by a
    /// constant (`i - j < 64` is `0 < 64`; `i + M - N - j < 64` with `p = i + M - N` too).
    fn holds(&self, r: &Region, n: RId) -> Option<bool> {
        let RNode::Binary(op, a, b) = r.nodes[n as usize] else { return None };
        let d = self.value(r, a)?.sub(&self.value(r, b)?).constant()?;
        Some(match op {
            BinaryOp::Lt => d < 0.0,
            BinaryOp::Le => d <= 0.0,
            BinaryOp::Gt => d > 0.0,
            BinaryOp::Ge => d >= 0.0,
            BinaryOp::Eq => d == 0.0,
            BinaryOp::Ne => d != 0.0,
            _ => return None,
        })
    }

    /// Node `n` on the diagonal as an affine form of `i` and the dims, when it is one.
    fn value(&self, r: &Region, n: RId) -> Option<Affine> {
        let f = |x: RId| self.value(r, x);
        let v = match &r.nodes[n as usize] {
            RNode::Index(IndexVar::I) => Affine { i: 1.0, ..Affine::default() },
            RNode::Index(IndexVar::J) => Affine { i: 1.0, ..Affine::default() }.add(self.shift.as_ref()?),
            RNode::Dim(d) => Affine::of_dim(d)?,
            RNode::Const(c) if c.is_finite() => Affine { k: *c, ..Affine::default() },
            RNode::Unary(UnaryOp::Neg, x) => f(*x)?.scale(-1.0),
            RNode::Binary(BinaryOp::Add, x, y) => f(*x)?.add(&f(*y)?),
            RNode::Binary(BinaryOp::Sub, x, y) => f(*x)?.sub(&f(*y)?),
            RNode::Binary(BinaryOp::Mul, x, y) => {
                let (x, y) = (f(*x)?, f(*y)?);
                match (x.constant(), y.constant()) {
                    (Some(c), _) => y.scale(c),
                    (_, Some(c)) => x.scale(c),
                    _ => return None,
                }
            }
            _ => return None,
        };
        v.finite().then_some(v)
    }
}

/// `i * i_coef + sum dims[name] * name + k`.
#[derive(Clone, Debug, Default, PartialEq)]
struct Affine {
    i: f64,
    dims: BTreeMap<String, f64>,
    k: f64,
}

impl Affine {
    fn of_dim(d: &Dim) -> Option<Affine> {
        match d {
            Dim::Sym(s) => Some(Affine { dims: BTreeMap::from([(s.clone(), 1.0)]), ..Affine::default() }),
            Dim::Const(c) => Some(Affine { k: *c as f64, ..Affine::default() }),
            _ => None,
        }
    }
    fn scale(mut self, c: f64) -> Affine {
        self.i *= c;
        self.k *= c;
        self.dims.values_mut().for_each(|v| *v *= c);
        self
    }
    fn add(mut self, o: &Affine) -> Affine {
        self.i += o.i;
        self.k += o.k;
        for (d, v) in &o.dims {
            *self.dims.entry(d.clone()).or_default() += v;
        }
        self
    }
    fn sub(self, o: &Affine) -> Affine {
        self.add(&o.clone().scale(-1.0))
    }
    /// The constant, when no `i` or dim remains.
    fn constant(&self) -> Option<f64> {
        (self.i == 0.0 && self.dims.values().all(|v| *v == 0.0)).then_some(self.k)
    }
    fn finite(&self) -> bool {
        self.i.is_finite() && self.k.is_finite() && self.dims.values().all(|v| v.is_finite())
    }
}

/// A condition of a region with its truth at the diagonal of the rows considered (at every key,
/// for a condition free of `j`).
type Fact = (RId, bool);

/// `facts` and `(c, holds)`.
fn with(facts: &[Fact], c: RId, holds: bool) -> Vec<Fact> {
    let mut f = facts.to_vec();
    f.push((c, holds));
    f
}

/// Whether the subtrees at `a` and `b` are the same expression, node for node.
fn same_tree(r: &Region, a: RId, b: RId) -> bool {
    let same = |x: &RId, y: &RId| same_tree(r, *x, *y);
    a == b
        || match (&r.nodes[a as usize], &r.nodes[b as usize]) {
            (RNode::Unary(u, x), RNode::Unary(v, y)) => u == v && same(x, y),
            (RNode::Binary(o, x0, x1), RNode::Binary(p, y0, y1)) => o == p && same(x0, y0) && same(x1, y1),
            (RNode::Select(c, x0, x1), RNode::Select(d, y0, y1)) => {
                same(c, d) && same(x0, y0) && same(x1, y1)
            }
            (RNode::Unary(..) | RNode::Binary(..) | RNode::Select(..), _) => false,
            (x, y) => x == y,
        }
}

fn is_neg_inf(r: &Region, n: RId) -> bool {
    matches!(r.nodes[n as usize], RNode::Const(c) if c == f64::NEG_INFINITY)
}

/// How a condition's truth moves along a row's keys.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Along {
    /// The same at every key (it reads neither `j` nor the score).
    Constant,
    /// `j >= E`, `j > E` (either side) with `E` free of `j`: false, then true from some key on.
    Rising,
    /// `j <= E`, `j < E` (either side): true up to some key, then false.
    Falling,
}

/// How condition `n` moves along a row's keys, where it is one of the forms of [`Along`]. A
/// comparison with a NaN side is false at every key, which each form allows.
fn along_j(r: &Region, n: RId) -> Option<Along> {
    if free_of_j(r, n) {
        return Some(Along::Constant);
    }
    match j_against(r, n)?.0 {
        BinaryOp::Ge | BinaryOp::Gt => Some(Along::Rising),
        BinaryOp::Le | BinaryOp::Lt => Some(Along::Falling),
        _ => None,
    }
}

/// Node `n` of `r` as `j OP E` with `E` free of `j`: `(OP, E)`, `E` as a sum of the region's
/// `j`-free nodes (`sum coef * node`). The sides may be sums in which `j` has the coefficient +1
/// or -1: `j >= E` is `E` itself, `E < j` is `j > E` turned around, `i + M - N - j < W` is `j >
/// i + M - N - W`.
fn j_against(r: &Region, n: RId) -> Option<(BinaryOp, Vec<(f64, RId)>)> {
    let RNode::Binary(op, a, b) = *r.nodes.get(n as usize)? else { return None };
    if !op.is_comparison() {
        return None;
    }
    // `a - b = jc j + rest`: with jc = 1, `j OP -rest`; with jc = -1, `rest OP j`.
    let (mut jc, mut rest) = (0.0, vec![]);
    if !j_terms(r, a, 1.0, &mut jc, &mut rest) || !j_terms(r, b, -1.0, &mut jc, &mut rest) {
        return None;
    }
    if jc == 1.0 {
        rest.iter_mut().for_each(|(c, _)| *c = -*c);
        Some((op, rest))
    } else if jc == -1.0 {
        Some((op.swapped()?, rest))
    } else {
        None
    }
}

/// Node `n` times `coef` as `jc j + sum out`, its terms free of `j` (sums, differences,
/// negations and constant factors are opened); false where `j` sits elsewhere.
fn j_terms(r: &Region, n: RId, coef: f64, jc: &mut f64, out: &mut Vec<(f64, RId)>) -> bool {
    if free_of_j(r, n) {
        out.push((coef, n));
        return true;
    }
    let konst = |x: RId| match r.nodes[x as usize] {
        RNode::Const(c) if c.is_finite() => Some(c),
        _ => None,
    };
    match r.nodes[n as usize] {
        RNode::Index(IndexVar::J) => {
            *jc += coef;
            true
        }
        RNode::Unary(UnaryOp::Neg, x) => j_terms(r, x, -coef, jc, out),
        RNode::Binary(BinaryOp::Add, x, y) => j_terms(r, x, coef, jc, out) && j_terms(r, y, coef, jc, out),
        RNode::Binary(BinaryOp::Sub, x, y) => j_terms(r, x, coef, jc, out) && j_terms(r, y, -coef, jc, out),
        RNode::Binary(BinaryOp::Mul, x, y) => match (konst(x), konst(y)) {
            (Some(c), _) => j_terms(r, y, coef * c, jc, out),
            (_, Some(c)) => j_terms(r, x, coef * c, jc, out),
            _ => false,
        },
        _ => false,
    }
}

/// `E` when node `n` of `r` is the comparison `j >= E` (`E <= j`, `j > E`, `E < j`, or sums
/// that are one of these: [`j_against`]).
fn lower_bound(r: &Region, n: RId) -> Option<Region> {
    match j_against(r, n)? {
        (BinaryOp::Ge | BinaryOp::Gt, e) => Some(sum_region(r, &e)),
        _ => None,
    }
}

/// `sum coef * node` as a region of its own (`0` for no term).
fn sum_region(r: &Region, terms: &[(f64, RId)]) -> Region {
    let mut out = Region::new();
    let mut acc: Option<RId> = None;
    // Positive terms first: `lo - 5` rather than `-5 + lo`.
    let (plus, minus): (Vec<_>, Vec<_>) = terms.iter().partition(|(c, _)| *c > 0.0);
    for &(c, n) in plus.iter().chain(&minus) {
        let x = out.append(&subtree(r, n));
        let (x, minus) = match c {
            1.0 => (x, false),
            -1.0 => (x, true),
            c => {
                let k = out.push(RNode::Const(c));
                (out.push(RNode::Binary(BinaryOp::Mul, k, x)), false)
            }
        };
        acc = Some(match (acc, minus) {
            (None, false) => x,
            (None, true) => out.push(RNode::Unary(UnaryOp::Neg, x)),
            (Some(a), false) => out.push(RNode::Binary(BinaryOp::Add, a, x)),
            (Some(a), true) => out.push(RNode::Binary(BinaryOp::Sub, a, x)),
        });
    }
    out.root = acc.unwrap_or_else(|| out.push(RNode::Const(0.0)));
    out
}

/// The node ids `n` depends on (itself included), in increasing order.
fn reachable(r: &Region, n: RId) -> Vec<RId> {
    let mut seen = vec![false; r.nodes.len()];
    let mut stack = vec![n];
    while let Some(x) = stack.pop() {
        if std::mem::replace(&mut seen[x as usize], true) {
            continue;
        }
        match &r.nodes[x as usize] {
            RNode::Unary(_, a) => stack.push(*a),
            RNode::Binary(_, a, b) => stack.extend([*a, *b]),
            RNode::Select(c, a, b) => stack.extend([*c, *a, *b]),
            _ => {}
        }
    }
    (0..r.nodes.len() as RId).filter(|x| seen[*x as usize]).collect()
}

/// Whether the value of node `n` depends neither on `j` nor on the score.
fn free_of_j(r: &Region, n: RId) -> bool {
    reachable(r, n).iter().all(|&x| match &r.nodes[x as usize] {
        RNode::Score | RNode::Index(IndexVar::J) => false,
        RNode::Capture { index, .. } => index.iter().all(|e| !e.vars().contains(&"j")),
        _ => true,
    })
}

/// Node `n` and what it depends on, as a region of its own (ids renumbered, order kept).
fn subtree(r: &Region, n: RId) -> Region {
    let keep = reachable(r, n);
    let mut new_id = vec![0 as RId; r.nodes.len()];
    let mut out = Region::new();
    for &x in &keep {
        let m = |a: &RId| new_id[*a as usize];
        let node = match &r.nodes[x as usize] {
            RNode::Unary(u, a) => RNode::Unary(*u, m(a)),
            RNode::Binary(op, a, b) => RNode::Binary(*op, m(a), m(b)),
            RNode::Select(c, a, b) => RNode::Select(m(c), m(a), m(b)),
            other => other.clone(),
        };
        new_id[x as usize] = out.push(node);
    }
    out.root = new_id[n as usize];
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use foxc_ir::index::IndexExpr;
    use foxc_ir::interp::region::{Capture, RegionEval};
    use proptest::prelude::*;

    fn lo_capture(r: &mut Region, var: &str) -> RId {
        r.push(RNode::Capture {
            k: 0,
            index: vec![IndexExpr::var("b"), IndexExpr::var("h"), IndexExpr::var(var)],
        })
    }

    /// `select(c, x, y)` pushed onto `r`.
    fn select(r: &mut Region, c: RId, x: RId, y: RId) -> RId {
        r.push(RNode::Select(c, x, y))
    }

    /// The diagonal of a square attention (`p(i) = i`).
    fn square() -> Diagonal {
        Diagonal { shift: Some(Affine::default()) }
    }

    /// The keys a row keeps at most from its key bound: `i - 99` (a window of 100 as a
    /// distance) gives 100, a `max` with a start the window's, a `max` of two windows the
    /// narrower's, `lo` alone nothing, and a bound of another slope in `i` nothing. Shown
    /// failing with a `max`'s two counts taken by their larger.
    #[test]
    fn keys_at_most_reads_a_window_s_bound() {
        let d = square();
        let mut r = Region::new();
        let i = r.push(RNode::Index(IndexVar::I));
        let c = r.push(RNode::Const(99.0));
        let win = r.push(RNode::Binary(BinaryOp::Sub, i, c));
        let lo = lo_capture(&mut r, "i");
        let both = r.push(RNode::Binary(BinaryOp::Max, lo, win));
        let two = r.push(RNode::Const(2.0));
        let half = r.push(RNode::Binary(BinaryOp::Mul, i, two));
        let c2 = r.push(RNode::Const(49.0));
        let narrow = r.push(RNode::Binary(BinaryOp::Sub, i, c2));
        let two_windows = r.push(RNode::Binary(BinaryOp::Max, win, narrow));
        let at = |root: RId| d.keys_at_most(&Region { nodes: r.nodes.clone(), root });
        assert_eq!(at(win), Some(100.0));
        assert_eq!(at(both), Some(100.0));
        assert_eq!(at(two_windows), Some(50.0), "the larger bound, the fewer keys");
        assert_eq!(at(lo), None);
        assert_eq!(at(half), None);
    }

    /// Left padding's `j >= lo[b]` around a window, in either order, and sinks inside it keep
    /// the diagonal of every row that keeps a key; a condition that falls along `j` (right
    /// padding's `j < hi[b]`, keys before the start) or an equality with `j` does not.
    #[test]
    fn rows_with_keys_keep_their_diagonal_through_conditions_that_move_one_way() {
        let mut r = Region::new();
        let x = r.push(RNode::Score);
        let ninf = r.push(RNode::Const(f64::NEG_INFINITY));
        let (j, i) = (r.push(RNode::Index(IndexVar::J)), r.push(RNode::Index(IndexVar::I)));
        let lo = r.push(RNode::Capture { k: 0, index: vec![IndexExpr::var("b")] });
        let (w, three) = (r.push(RNode::Const(8.0)), r.push(RNode::Const(3.0)));
        let from_lo = r.push(RNode::Binary(BinaryOp::Ge, j, lo));
        let before_lo = r.push(RNode::Binary(BinaryOp::Lt, j, lo));
        let dist = r.push(RNode::Binary(BinaryOp::Sub, i, j));
        let in_window = r.push(RNode::Binary(BinaryOp::Lt, dist, w));
        let sink = r.push(RNode::Binary(BinaryOp::Lt, j, three));
        let at_i = r.push(RNode::Binary(BinaryOp::Eq, j, i));
        let d = square();
        let with_root = |r: &Region, root: RId| Region { nodes: r.nodes.clone(), root };
        let yes = |r: &mut Region, root: RId| d.kept_by_rows_with_keys(&with_root(r, root));
        let window = select(&mut r, in_window, x, ninf);
        let padded_window = select(&mut r, from_lo, window, ninf);
        assert!(yes(&mut r, padded_window));
        assert!(!d.kept(&with_root(&r, padded_window)), "kept alone cannot say it");
        let padded = select(&mut r, from_lo, x, ninf);
        let window_of_padded = select(&mut r, in_window, padded, ninf);
        assert!(yes(&mut r, window_of_padded));
        let sinks = select(&mut r, sink, x, ninf);
        let window_or_sinks = select(&mut r, in_window, x, sinks);
        let padded_sinks = select(&mut r, from_lo, window_or_sinks, ninf);
        assert!(yes(&mut r, padded_sinks));
        // The padding inside both branches of the sinks' `or` (`(j < 3 or i - j < 8) and j >=
        // lo[b]`): a sink kept has j >= lo[b], so its row's diagonal has it too.
        let sinks_padded = select(&mut r, sink, padded, ninf);
        let window_padded = select(&mut r, in_window, padded, ninf);
        let sinks_or_window_padded = select(&mut r, sink, padded, window_padded);
        assert!(yes(&mut r, sinks_or_window_padded));
        assert!(!yes(&mut r, sinks_padded), "a sink kept, the diagonal past the sinks");
        // Right padding: row 9 with hi = 5 keeps keys 0..4, not its diagonal; with the rows
        // past the length masked too (`i < hi`), in either order, no row does.
        let right = select(&mut r, before_lo, x, ninf);
        assert!(!yes(&mut r, right));
        let query_in = r.push(RNode::Binary(BinaryOp::Lt, i, lo));
        let rows_in = select(&mut r, query_in, x, ninf);
        let right_rows = select(&mut r, before_lo, rows_in, ninf);
        assert!(yes(&mut r, right_rows));
        let rows_right = select(&mut r, query_in, right, ninf);
        assert!(yes(&mut r, rows_right));
        let rows_out = select(&mut r, query_in, ninf, x);
        let right_rows_out = select(&mut r, before_lo, rows_out, ninf);
        assert!(!yes(&mut r, right_rows_out), "keys of the rows past the length");
        // Sinks alone: row 10 keeps keys 0..2, not its diagonal.
        assert!(!yes(&mut r, sinks));
        // Keys from lo, else the sinks: a row before lo keeps keys 0..2 and not its diagonal.
        let from_lo_else_sinks = select(&mut r, from_lo, x, sinks);
        assert!(!yes(&mut r, from_lo_else_sinks));
        let only_diagonal = select(&mut r, at_i, x, ninf);
        assert!(yes(&mut r, only_diagonal), "j == i holds at the diagonal");
        let not_diagonal = select(&mut r, at_i, ninf, x);
        assert!(!yes(&mut r, not_diagonal));
        // The explanation's culprit: the falling condition of a conjunction, none elsewhere.
        let culprit = |r: &Region, root: RId| d.falling_culprit(&with_root(r, root));
        assert_eq!(culprit(&r, right), Some(before_lo));
        assert_eq!(culprit(&r, sinks), Some(sink));
        assert_eq!(culprit(&r, not_diagonal), None);
        // `i - j > 0 and j < 3`: the strict mask drops every diagonal, whatever the sinks do.
        let zero = r.push(RNode::Const(0.0));
        let before_diagonal = r.push(RNode::Binary(BinaryOp::Gt, dist, zero));
        let strict_sinks = select(&mut r, before_diagonal, sinks, ninf);
        assert!(!yes(&mut r, strict_sinks));
        assert_eq!(culprit(&r, strict_sinks), None);
    }

    /// A tree of selects over padding, window, sink and query conditions (leaves the score or
    /// `-inf`), as the strategy below draws it.
    #[derive(Clone, Debug)]
    enum Tree {
        Score,
        NegInf,
        Select(u8, Box<Tree>, Box<Tree>),
    }

    const CONDITIONS: u8 = 9;

    /// Condition `c` of the pool, on `r`: `j >= lo[b]`, `j < lo[b]`, `i - j < 3`, `j < 2`,
    /// `i < lo[b]`, `lo[b] > j`, `j == i - 2`, `i + j > lo[b]`, `i - 2 < lo[b]`.
    fn condition(r: &mut Region, c: u8) -> RId {
        let (j, i) = (r.push(RNode::Index(IndexVar::J)), r.push(RNode::Index(IndexVar::I)));
        let lo = r.push(RNode::Capture { k: 0, index: vec![IndexExpr::var("b")] });
        let k = |r: &mut Region, c: f64| r.push(RNode::Const(c));
        let (op, a, b) = match c {
            0 => (BinaryOp::Ge, j, lo),
            1 => (BinaryOp::Lt, j, lo),
            2 => (BinaryOp::Lt, r.push(RNode::Binary(BinaryOp::Sub, i, j)), k(r, 3.0)),
            3 => (BinaryOp::Lt, j, k(r, 2.0)),
            4 => (BinaryOp::Lt, i, lo),
            5 => (BinaryOp::Gt, lo, j),
            6 => {
                let two = k(r, 2.0);
                (BinaryOp::Eq, j, r.push(RNode::Binary(BinaryOp::Sub, i, two)))
            }
            7 => (BinaryOp::Gt, r.push(RNode::Binary(BinaryOp::Add, i, j)), lo),
            _ => {
                let two = k(r, 2.0);
                (BinaryOp::Lt, r.push(RNode::Binary(BinaryOp::Sub, i, two)), lo)
            }
        };
        r.push(RNode::Binary(op, a, b))
    }

    fn build(r: &mut Region, t: &Tree) -> RId {
        match t {
            Tree::Score => r.push(RNode::Score),
            Tree::NegInf => r.push(RNode::Const(f64::NEG_INFINITY)),
            Tree::Select(c, x, y) => {
                let c = condition(r, *c);
                let (x, y) = (build(r, x), build(r, y));
                select(r, c, x, y)
            }
        }
    }

    fn tree() -> impl Strategy<Value = Tree> {
        prop_oneof![Just(Tree::Score), Just(Tree::NegInf)].prop_recursive(4, 16, 2, |inner| {
            (0..CONDITIONS, inner.clone(), inner)
                .prop_map(|(c, x, y)| Tree::Select(c, Box::new(x), Box::new(y)))
        })
    }

    proptest! {
        // Cheap cases (a tree of at most 16 nodes on 20 rows), and the unsound variants of the
        // rule's crossing facts surface only in a few thousand.
        #![proptest_config(ProptestConfig::with_cases(8192))]

        /// Where `kept_by_rows_with_keys` (or `kept`) says yes, every row of the interpreter's
        /// causal region that keeps a key keeps its diagonal, for starts anywhere in and past
        /// the row.
        #[test]
        fn a_row_said_to_keep_its_diagonal_does(t in tree(), lo in prop::collection::vec(0u32..12, 2)) {
            let mut r = Region::new();
            r.root = build(&mut r, &t);
            let d = square();
            let (kept, with_keys) = (d.kept(&r), d.kept_by_rows_with_keys(&r));
            prop_assert!(!kept || with_keys, "kept implies kept_by_rows_with_keys");
            let data: Vec<f64> = lo.iter().map(|&x| x as f64).collect();
            let caps = [Capture { shape: &[2], data: &data }];
            let dim = |_: &Dim| None;
            let mut ev = RegionEval::new(&r, &caps, &dim).unwrap();
            for b in 0..2 {
                for i in 0..10 {
                    let mut keeps = |j: usize| ev.eval(0.0, [b, 0, i, j]) != f64::NEG_INFINITY;
                    let diagonal = keeps(i);
                    let any = (0..=i).any(&mut keeps);
                    prop_assert!(!with_keys || !any || diagonal, "row {} of batch {}: {:?}", i, b, t);
                    prop_assert!(!kept || diagonal, "row {} of batch {}: {:?}", i, b, t);
                }
            }
        }
    }

    /// `j >= lo[b, h, i]` (the context-parallel partial's mask) gives `lo[b, h, i]`, in either
    /// spelling.
    #[test]
    fn lower_bounds_are_found() {
        let mut r = Region::new();
        let j = r.push(RNode::Index(IndexVar::J));
        let lo = lo_capture(&mut r, "i");
        r.push(RNode::Binary(BinaryOp::Ge, j, lo));
        let e = keys_from(&r).expect("a bound");
        assert_eq!(e.display_with(&|k| format!("${k}")), "$0[b, h, i]");
        let mut r2 = r.clone();
        r2.nodes[2] = RNode::Binary(BinaryOp::Lt, lo, j);
        assert_eq!(keys_from(&r2).expect("a bound").display_with(&|k| format!("${k}")), "$0[b, h, i]");
    }

    /// `select(j >= lo[b, h, i], x, -inf)` as a score region gives `lo[b, h, i]`; with the
    /// `-inf` in the other arm (kept below lo) or a finite fallback, nothing.
    #[test]
    fn score_regions_bound_through_a_minus_inf_select() {
        let mut r = Region::new();
        let x = r.push(RNode::Score);
        let j = r.push(RNode::Index(IndexVar::J));
        let lo = lo_capture(&mut r, "i");
        let ge = r.push(RNode::Binary(BinaryOp::Ge, j, lo));
        let ninf = r.push(RNode::Const(f64::NEG_INFINITY));
        r.push(RNode::Select(ge, x, ninf));
        let e = keys_from_score(&r).expect("a bound");
        assert_eq!(e.display_with(&|k| format!("${k}")), "$0[b, h, i]");
        let mut swapped = r.clone();
        swapped.nodes[5] = RNode::Select(ge, ninf, x);
        assert!(keys_from_score(&swapped).is_none());
        let mut finite = r.clone();
        finite.nodes[4] = RNode::Const(-1e30);
        assert!(keys_from_score(&finite).is_none());
        assert!(keys_from(&r).is_none(), "a score region is not a mask");
    }

    /// A comparison of sums in which `j` has the coefficient -1 or +1 bounds as `j OP E`: a
    /// prefill's window `i + M - N - j < 64` gives `i + M - N - 64`; `j + 5 > lo` gives
    /// `lo - 5`. `-j + lo >= 3` is an upper bound, and `2 j >= lo` or `j - j >= lo` no bound.
    #[test]
    fn lower_bounds_of_sums_in_j() {
        let show = |r: &Region| keys_from(r).map(|e| e.display_with(&|k| format!("${k}")));
        let mut r = Region::new();
        let (i, j) = (r.push(RNode::Index(IndexVar::I)), r.push(RNode::Index(IndexVar::J)));
        let (m, n) = (r.push(RNode::Dim(Dim::sym("M"))), r.push(RNode::Dim(Dim::sym("N"))));
        let shift = r.push(RNode::Binary(BinaryOp::Sub, m, n));
        let p = r.push(RNode::Binary(BinaryOp::Add, i, shift));
        let dist = r.push(RNode::Binary(BinaryOp::Sub, p, j));
        let w = r.push(RNode::Const(64.0));
        r.push(RNode::Binary(BinaryOp::Lt, dist, w));
        assert_eq!(show(&r).as_deref(), Some("i + (dim(M) - dim(N)) - 64"));
        let mut r = Region::new();
        let j = r.push(RNode::Index(IndexVar::J));
        let lo = lo_capture(&mut r, "i");
        let five = r.push(RNode::Const(5.0));
        let j5 = r.push(RNode::Binary(BinaryOp::Add, j, five));
        let top = r.push(RNode::Binary(BinaryOp::Gt, j5, lo));
        assert_eq!(show(&r).as_deref(), Some("$0[b, h, i] - 5"));
        let neg = r.push(RNode::Unary(UnaryOp::Neg, j));
        let three = r.push(RNode::Const(3.0));
        let upper = r.push(RNode::Binary(BinaryOp::Add, neg, lo));
        r.push(RNode::Binary(BinaryOp::Ge, upper, three));
        assert_eq!(show(&r), None, "an upper bound");
        let two = r.push(RNode::Const(2.0));
        let j2 = r.push(RNode::Binary(BinaryOp::Mul, two, j));
        r.push(RNode::Binary(BinaryOp::Ge, j2, lo));
        assert_eq!(show(&r), None, "2 j");
        let jj = r.push(RNode::Binary(BinaryOp::Sub, j, j));
        r.push(RNode::Binary(BinaryOp::Ge, jj, lo));
        assert_eq!(show(&r), None, "j - j");
        let _ = top;
    }

    /// Side `coef_j j + coef_i i + coef_lo lo[b] + k` of a comparison, pushed onto `r`.
    fn side(r: &mut Region, (cj, ci, cl, k): (i8, i8, i8, i8)) -> RId {
        let mut acc = r.push(RNode::Const(k as f64));
        for (c, leaf) in [(cj, RNode::Index(IndexVar::J)), (ci, RNode::Index(IndexVar::I))]
            .into_iter()
            .chain([(cl, RNode::Capture { k: 0, index: vec![IndexExpr::var("b")] })])
        {
            let x = r.push(leaf);
            let c = r.push(RNode::Const(c as f64));
            let term = r.push(RNode::Binary(BinaryOp::Mul, c, x));
            acc = r.push(RNode::Binary(BinaryOp::Add, acc, term));
        }
        acc
    }

    proptest! {
        /// Where a comparison of two affine sides gives a bound `E`, every key `j < E` of every
        /// row fails it (and so is masked), for starts anywhere.
        #[test]
        fn a_key_below_a_found_bound_is_masked(
            a in (-2i8..=2, -2i8..=2, -2i8..=2, -9i8..=9),
            b in (-2i8..=2, -2i8..=2, -2i8..=2, -9i8..=9),
            op in prop::sample::select(vec![BinaryOp::Lt, BinaryOp::Le, BinaryOp::Gt, BinaryOp::Ge]),
            lo in prop::collection::vec(0u32..12, 2),
        ) {
            let mut r = Region::new();
            let (x, y) = (side(&mut r, a), side(&mut r, b));
            let cond = r.push(RNode::Binary(op, x, y));
            let Some(e) = keys_from(&r) else { return Ok(()) };
            prop_assert_eq!(a.0 - b.0, if matches!(op, BinaryOp::Gt | BinaryOp::Ge) { 1 } else { -1 }, "{:?}", e);
            let data: Vec<f64> = lo.iter().map(|&x| x as f64).collect();
            let caps = [Capture { shape: &[2], data: &data }];
            let dim = |_: &Dim| None;
            let mut keeps = RegionEval::new(&r, &caps, &dim).unwrap();
            let mut bound = RegionEval::new(&e, &caps, &dim).unwrap();
            for bb in 0..2 {
                for i in 0..10 {
                    let at = bound.eval(0.0, [bb, 0, i, 0]);
                    for j in 0..20usize {
                        if (j as f64) < at {
                            prop_assert_eq!(keeps.eval(0.0, [bb, 0, i, j]), 0.0, "j {} < E {} at i {}", j, at, i);
                        }
                    }
                }
            }
            let _ = cond;
        }
    }

    /// A chain of `-inf` selects (a conjunction) bounds by the largest of its conditions'
    /// bounds; a link that bounds nothing (`j < hi`) is passed over.
    #[test]
    fn a_conjunction_bounds_by_its_largest_bound() {
        let mut r = Region::new();
        let x = r.push(RNode::Score);
        let j = r.push(RNode::Index(IndexVar::J));
        let lo = lo_capture(&mut r, "i");
        let hi = r.push(RNode::Capture { k: 1, index: vec![IndexExpr::var("b")] });
        let ninf = r.push(RNode::Const(f64::NEG_INFINITY));
        let (ge, lt) =
            (r.push(RNode::Binary(BinaryOp::Ge, j, lo)), r.push(RNode::Binary(BinaryOp::Lt, j, hi)));
        let i = r.push(RNode::Index(IndexVar::I));
        let w = r.push(RNode::Binary(BinaryOp::Sub, i, j));
        let c64 = r.push(RNode::Const(64.0));
        let win = r.push(RNode::Binary(BinaryOp::Lt, w, c64));
        let inner = select(&mut r, win, x, ninf);
        let mid = select(&mut r, lt, inner, ninf);
        select(&mut r, ge, mid, ninf);
        let e = keys_from_score(&r).expect("a bound");
        assert_eq!(e.display_with(&|k| format!("${k}")), "max($0[b, h, i], i - 64)");
        assert!(e.malformed().is_none(), "{e:?}");
    }

    /// No bound where the form does not prove one: `j <= E` (an upper bound), `E` reading `j`,
    /// a product (`(j >= E) * E` is NaN, kept, where `E` is), `doc[i] == doc[j]`.
    #[test]
    fn no_bound_otherwise() {
        let mut r = Region::new();
        let j = r.push(RNode::Index(IndexVar::J));
        let lo = lo_capture(&mut r, "i");
        r.push(RNode::Binary(BinaryOp::Le, j, lo));
        assert!(keys_from(&r).is_none());
        let mut r = Region::new();
        let j = r.push(RNode::Index(IndexVar::J));
        let lo = lo_capture(&mut r, "j");
        r.push(RNode::Binary(BinaryOp::Ge, j, lo));
        assert!(keys_from(&r).is_none(), "E reads j");
        let mut r = Region::new();
        let j = r.push(RNode::Index(IndexVar::J));
        let lo = lo_capture(&mut r, "i");
        let ge = r.push(RNode::Binary(BinaryOp::Ge, j, lo));
        r.push(RNode::Binary(BinaryOp::Mul, ge, lo));
        assert!(keys_from(&r).is_none(), "a product with a value");
        let mut r = Region::new();
        let a = lo_capture(&mut r, "i");
        let b = lo_capture(&mut r, "j");
        r.push(RNode::Binary(BinaryOp::Eq, a, b));
        assert!(keys_from(&r).is_none());
    }
}
