//! The bound `U >= max |R(x, ...)|` of a score region, for ACP's threshold (docs/SEMANTICS.md,
//! `threshold`), from the interval analysis of [`crate::lang`]:
//!
//! - `Static(U)` when the region is bounded whatever `x` is (softcapping `a tanh(x / a)`: `U = a`);
//! - otherwise `Data { gain, extra }` (`U = gain X + extra` with `X = |scale| Qmax Kmax >= |x|`)
//!   when the region is a sum of terms `c x`, `x w` with `w` bounded, and bounded terms
//!   (`x + kb[b, h, j]` with `kb in [-4, 0]`: gain 1, extra 4);
//! - otherwise no bound: the attention stays dense, and the error says which term grows.

use crate::lang::{Attn, AttnAnalysis, AttnGraph, Num};
use egg::{Id, Symbol};
use foxc_ir::attention::{RId, RNode, Region, ScoreBound};
use foxc_ir::{Attention, BinaryOp, Graph, Op, UnaryOp, ValueId};
use std::collections::BTreeMap;

/// Why a region has no bound: the message, and the region node of the term that grows (the
/// explanation points at its source; `None` when the node is not an attention).
#[derive(Clone, Debug, PartialEq)]
pub struct Unbounded {
    pub message: String,
    pub term: Option<RId>,
}

impl std::fmt::Display for Unbounded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// A captured tensor as the bound sees it: its name (for messages) and declared range.
pub struct CaptureInfo {
    pub name: String,
    pub range: Option<(f64, f64)>,
}

/// The e-classes of the region's nodes in a fresh e-graph whose analysis knows the capture
/// ranges (`x` is unconstrained).
fn classes(r: &Region, caps: &[CaptureInfo]) -> (AttnGraph, Vec<Id>) {
    let ranges: BTreeMap<Symbol, (f64, f64)> = caps
        .iter()
        .enumerate()
        .filter_map(|(k, c)| c.range.map(|r| (Symbol::from(format!("$c{k}")), r)))
        .collect();
    let mut eg = AttnGraph::new(AttnAnalysis { ranges });
    let mut ids: Vec<Id> = vec![];
    for n in &r.nodes {
        let at = |k: RId| ids[k as usize];
        let node = match n {
            RNode::Score => {
                let s = eg.add(Attn::Symbol(Symbol::from("$x")));
                Attn::In(vec![s].into_boxed_slice())
            }
            RNode::Capture { k, .. } => {
                let s = eg.add(Attn::Symbol(Symbol::from(format!("$c{k}"))));
                Attn::In(vec![s].into_boxed_slice())
            }
            RNode::Index(v) => Attn::Iota(eg.add(Attn::Symbol(Symbol::from(v.name())))),
            RNode::Dim(d) => Attn::Dim(eg.add(Attn::Symbol(Symbol::from(d.to_string().as_str())))),
            RNode::Const(c) => Attn::Num(Num::new(*c)),
            RNode::Unary(u, a) => Attn::Unary(*u, [at(*a)]),
            RNode::Binary(b, x, y) => {
                let xy = [at(*x), at(*y)];
                match b {
                    BinaryOp::Add => Attn::Add(xy),
                    BinaryOp::Sub => Attn::Sub(xy),
                    BinaryOp::Mul => Attn::Mul(xy),
                    BinaryOp::Div => Attn::Div(xy),
                    BinaryOp::Min => Attn::Min(xy),
                    BinaryOp::Max => Attn::Max(xy),
                    BinaryOp::Lt => Attn::Lt(xy),
                    BinaryOp::Le => Attn::Le(xy),
                    BinaryOp::Gt => Attn::Gt(xy),
                    BinaryOp::Ge => Attn::Ge(xy),
                    BinaryOp::Eq => Attn::Eq(xy),
                    BinaryOp::Ne => Attn::Ne(xy),
                }
            }
            RNode::Select(c, a, b) => Attn::Select([at(*c), at(*a), at(*b)]),
        };
        ids.push(eg.add(node));
    }
    (eg, ids)
}

fn mag(eg: &AttnGraph, id: Id) -> f64 {
    let d = &eg[id].data;
    d.lo.abs().max(d.hi.abs())
}

/// Signed additive terms of node `n` (`+`, `-`, negation, constant factors).
fn terms(r: &Region, n: RId, coef: f64, out: &mut Vec<(f64, RId)>) {
    match &r.nodes[n as usize] {
        RNode::Binary(BinaryOp::Add, a, b) => {
            terms(r, *a, coef, out);
            terms(r, *b, coef, out);
        }
        RNode::Binary(BinaryOp::Sub, a, b) => {
            terms(r, *a, coef, out);
            terms(r, *b, -coef, out);
        }
        RNode::Unary(UnaryOp::Neg, a) => terms(r, *a, -coef, out),
        RNode::Binary(BinaryOp::Mul, a, b) => match (&r.nodes[*a as usize], &r.nodes[*b as usize]) {
            (RNode::Const(c), _) if c.is_finite() => terms(r, *b, coef * c, out),
            (_, RNode::Const(c)) if c.is_finite() => terms(r, *a, coef * c, out),
            _ => out.push((coef, n)),
        },
        RNode::Binary(BinaryOp::Div, a, b) => match &r.nodes[*b as usize] {
            RNode::Const(c) if c.is_finite() && *c != 0.0 => terms(r, *a, coef / c, out),
            _ => out.push((coef, n)),
        },
        _ => out.push((coef, n)),
    }
}

/// The bound of region `r` whose captured tensors are `caps`; `Err` says which term is unbounded.
pub fn score_bound(r: &Region, caps: &[CaptureInfo]) -> Result<ScoreBound, Unbounded> {
    let (eg, ids) = classes(r, caps);
    let u = mag(&eg, ids[r.root as usize]);
    if u.is_finite() {
        return Ok(ScoreBound::Static(u));
    }
    let mut ts = vec![];
    terms(r, r.root, 1.0, &mut ts);
    let (mut gain, mut extra) = (0.0, 0.0);
    for (c, n) in ts {
        let m = mag(&eg, ids[n as usize]);
        let bounded_factor = |x: RId, w: RId| {
            matches!(r.nodes[x as usize], RNode::Score) && mag(&eg, ids[w as usize]).is_finite()
        };
        match &r.nodes[n as usize] {
            _ if m.is_finite() => extra += c.abs() * m,
            RNode::Score => gain += c.abs(),
            RNode::Binary(BinaryOp::Mul, a, b) if bounded_factor(*a, *b) => {
                gain += c.abs() * mag(&eg, ids[*b as usize])
            }
            RNode::Binary(BinaryOp::Mul, a, b) if bounded_factor(*b, *a) => {
                gain += c.abs() * mag(&eg, ids[*a as usize])
            }
            _ => {
                let sub = Region { nodes: r.nodes.clone(), root: n };
                let text =
                    sub.display_with(&|k| caps.get(k).map(|c| c.name.clone()).unwrap_or_else(|| "?".into()));
                return Err(Unbounded {
                    message: format!(
                        "the score term `{text}` has no bound (neither a constant nor a multiple of |q| |k| plus a \
                         constant), so no threshold can be derived"
                    ),
                    term: Some(n),
                });
            }
        }
    }
    Ok(ScoreBound::Data { gain, extra })
}

/// The bound of attention node `n` of `g`: captures named as in the source, with their declared
/// ranges (a parameter's `in [lo, hi]`) or the interval the analysis derives for a computed one.
pub fn attention_bound(g: &Graph, n: ValueId) -> Result<ScoreBound, Unbounded> {
    let not_attention = |message: String| Unbounded { message, term: None };
    let Op::Attention(a) = g.op(n) else { return Err(not_attention("not an attention node".into())) };
    let ops = Attention::operands(g, n).map_err(not_attention)?;
    let caps: Vec<CaptureInfo> = ops
        .captures
        .iter()
        .map(|&c| match g.params.iter().find(|p| p.node == c) {
            Some(p) => CaptureInfo { name: p.name.clone(), range: p.range },
            None => CaptureInfo {
                name: g.node(c).name.clone().unwrap_or_else(|| "a computed bias".into()),
                range: crate::monotone::interval(g, c).filter(|(lo, hi)| lo.is_finite() && hi.is_finite()),
            },
        })
        .collect();
    // A tree of selects weighs only its leaves other than `-inf` (an entry of value `-inf` has
    // weight 0), provided every row that keeps a key keeps its diagonal, whose decay is 0: ACP's
    // denominator argument (docs/SEMANTICS.md, `threshold`). Left padding's `select(j >= E, X,
    // -inf)` is one: a row keeping a key `j <= i` has `i >= j >= E`.
    if !matches!(a.score.nodes[a.score.root as usize], RNode::Select(..)) {
        return score_bound(&a.score, &caps);
    }
    let diagonal = crate::key_bound::Diagonal::of(g, ops.q, ops.k);
    if !diagonal.kept_by_rows_with_keys(&a.score) {
        let name = |k: usize| caps.get(k).map(|c| c.name.clone()).unwrap_or_else(|| "?".into());
        let text = a.score.display_with(&name);
        // Right padding's `j < len[b]` empties the rows past the length of all but earlier keys.
        let falling = diagonal.falling_culprit(&a.score).map_or(String::new(), |c| {
            let c = Region { nodes: a.score.nodes.clone(), root: c }.display_with(&name);
            format!(
                "; `{c}` keeps earlier keys of rows whose diagonal it drops: masking those rows too (the \
                 same comparison of the query's position, as in `j < len[b] and i < len[b]`) keeps the pruning"
            )
        });
        return Err(Unbounded {
            message: format!(
                "the score `{text}` may mask a row's diagonal entry (the key at the query's position, \
                 j = i + Tk - Tq) where it keeps an earlier key (each condition must be decided there, \
                 free of j, or j >= E or j < E), and ACP's threshold needs every row that keeps a key to \
                 keep its diagonal, so no threshold can be derived{falling}"
            ),
            term: Some(a.score.root),
        });
    }
    // The node ids stay those of the region, for the explanation's span.
    let mut bounds = vec![];
    for x in weighted_leaves(&a.score) {
        bounds.push(score_bound(&Region { nodes: a.score.nodes.clone(), root: x }, &caps)?);
    }
    Ok(largest(&bounds))
}

/// The leaves of a region's tree of `select`s other than the constant `-inf`.
fn weighted_leaves(r: &Region) -> Vec<RId> {
    let mut out = vec![];
    let mut todo = vec![r.root];
    while let Some(n) = todo.pop() {
        match r.nodes[n as usize] {
            RNode::Select(_, x, y) => todo.extend([y, x]),
            RNode::Const(c) if c == f64::NEG_INFINITY => {}
            _ => out.push(n),
        }
    }
    out
}

/// The largest of several bounds: `Static` when all are, else `gain X + extra` with the largest
/// gain and the largest extra (a `Static(u)` is `0 X + u`).
fn largest(bounds: &[ScoreBound]) -> ScoreBound {
    let parts = |b: &ScoreBound| match *b {
        ScoreBound::Static(u) => (0.0, u),
        ScoreBound::Data { gain, extra } => (gain, extra),
    };
    if bounds.iter().all(|b| matches!(b, ScoreBound::Static(_))) {
        return ScoreBound::Static(bounds.iter().map(|b| parts(b).1).fold(0.0, f64::max));
    }
    let (gain, extra) =
        bounds.iter().map(parts).fold((0.0, 0.0), |(g, e), (g2, e2)| (f64::max(g, g2), f64::max(e, e2)));
    ScoreBound::Data { gain, extra }
}

#[cfg(test)]
mod tests {
    use super::*;
    use foxc_ir::attention::IndexVar;
    use foxc_ir::index::IndexExpr;

    fn kb() -> RNode {
        let v = |n: &str| IndexExpr {
            terms: vec![(n.to_string(), 1)],
            dim_terms: vec![],
            constant: 0,
            div: None,
            clamps: vec![],
        };
        RNode::Capture { k: 0, index: vec![v("b"), v("h"), v("j")] }
    }
    fn cap(range: Option<(f64, f64)>) -> Vec<CaptureInfo> {
        vec![CaptureInfo { name: "kb".into(), range }]
    }

    #[test]
    fn softcap_is_static_and_biases_add_their_range() {
        let mut r = Region::new();
        let x = r.push(RNode::Score);
        let a = r.push(RNode::Const(20.0));
        let d = r.push(RNode::Binary(BinaryOp::Div, x, a));
        let t = r.push(RNode::Unary(UnaryOp::Tanh, d));
        let cap20 = r.push(RNode::Binary(BinaryOp::Mul, a, t));
        assert_eq!(score_bound(&r, &[]), Ok(ScoreBound::Static(20.0)));
        let b = r.push(kb());
        r.push(RNode::Binary(BinaryOp::Add, cap20, b));
        assert_eq!(score_bound(&r, &cap(Some((-4.0, 0.0)))), Ok(ScoreBound::Static(24.0)));
        assert!(score_bound(&r, &cap(None)).is_err());
        assert_eq!(score_bound(&Region::identity(), &[]), Ok(ScoreBound::IDENTITY));
        // x - kb[b, h, j] / 2 with kb in [-4, 0]: U = X + 2.
        let mut r = Region::new();
        let x = r.push(RNode::Score);
        let b = r.push(kb());
        let two = r.push(RNode::Const(2.0));
        let h = r.push(RNode::Binary(BinaryOp::Div, b, two));
        r.push(RNode::Binary(BinaryOp::Sub, x, h));
        assert_eq!(score_bound(&r, &cap(Some((-4.0, 0.0)))), Ok(ScoreBound::Data { gain: 1.0, extra: 2.0 }));
    }

    #[test]
    fn growing_terms_have_no_bound() {
        let mut r = Region::new();
        let x = r.push(RNode::Score);
        let e = r.push(RNode::Unary(UnaryOp::Exp, x));
        r.push(RNode::Binary(BinaryOp::Add, x, e));
        let err = score_bound(&r, &[]).unwrap_err();
        assert!(err.message.contains("`exp(x)`"), "{err}");
        // The term is the node `exp(x)`, not the sum.
        assert_eq!(err.term, Some(e));
        // x + i: the query index grows with T.
        let mut r = Region::new();
        let x = r.push(RNode::Score);
        let i = r.push(RNode::Index(IndexVar::I));
        r.push(RNode::Binary(BinaryOp::Add, x, i));
        let err = score_bound(&r, &[]).unwrap_err();
        assert!(err.message.contains("`i`"), "{err}");
        assert_eq!(err.term, Some(i));
    }
}
