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
//! `j < E`, whatever `E` is. (The DSL has no `and` of conditions: a product of two would
//! also bound, but a product with a value could be `0 * NaN = NaN`, kept.)

use foxc_ir::attention::{IndexVar, RId, RNode, Region};
use foxc_ir::{BinaryOp, UnaryOp};

/// The region `E` with every key `j < E` masked, when `mask` is `j >= E` in one of its forms.
pub fn keys_from(mask: &Region) -> Option<Region> {
    lower_bound(mask, mask.root)
}

/// The region `E` with a `-inf` score at every key `j < E`, when the score region is
/// `select(j >= E, X, -inf)` (the condition in one of the mask's forms).
pub fn keys_from_score(score: &Region) -> Option<Region> {
    match *score.nodes.get(score.root as usize)? {
        RNode::Select(c, _, e) if matches!(score.nodes.get(e as usize), Some(RNode::Const(x)) if *x == f64::NEG_INFINITY) => {
            lower_bound(score, c)
        }
        _ => None,
    }
}

/// The node of the kept score `X` when the score region is `select(j >= E, X, -inf)` (the form
/// of [`keys_from_score`]). ACP may bound `|X|` instead of the region: an entry whose condition
/// fails has weight 0 whatever `X` is, and the threshold's denominator argument still holds,
/// because a causal (or window) row that keeps any key `j <= i` has `i >= j >= E`, so it keeps
/// its diagonal, whose decay is 0 (docs/RULES.md); a row with no kept key is 0 and prunes nothing.
pub fn kept_score(score: &Region) -> Option<RId> {
    keys_from_score(score)?;
    match *score.nodes.get(score.root as usize)? {
        RNode::Select(_, x, _) => Some(x),
        _ => None,
    }
}

/// Whether node `n` of region `r` provably is not `-inf` at `j = i` (every row keeps its
/// diagonal): a select whose condition holds there (or fails there) by the affine values of
/// its two sides, or whose branches both keep it; a leaf other than the constant `-inf` (a
/// score, finite where it is bounded).
pub fn keeps_diagonal(r: &Region, n: RId) -> bool {
    match r.nodes[n as usize] {
        RNode::Select(c, x, y) => match holds_on_diagonal(r, c) {
            Some(true) => keeps_diagonal(r, x),
            Some(false) => keeps_diagonal(r, y),
            None => keeps_diagonal(r, x) && keeps_diagonal(r, y),
        },
        RNode::Const(c) => c != f64::NEG_INFINITY,
        _ => true,
    }
}

/// Whether region `r` at `j = i` is the score `x` itself or `-inf` (following the selects whose
/// condition is decided there, both branches of the others): with [`keeps_diagonal`], a row's
/// diagonal entry is `x_ii = scale q_i . k_i`, what a rule reading `s_ii` assumes. (A bound of
/// the identity's size does not say it: `select(i - j > 0, x, -x)` has `|R| <= |x|` and a
/// diagonal of `-x_ii`.)
pub fn diagonal_is_score(r: &Region) -> bool {
    fn at(r: &Region, n: RId) -> bool {
        match r.nodes[n as usize] {
            RNode::Score => true,
            RNode::Const(c) => c == f64::NEG_INFINITY,
            RNode::Select(c, x, y) => match holds_on_diagonal(r, c) {
                Some(true) => at(r, x),
                Some(false) => at(r, y),
                None => at(r, x) && at(r, y),
            },
            _ => false,
        }
    }
    at(r, r.root)
}

/// The value of comparison `n` at `j = i` when both sides are affine in `i` and `j` with the
/// same coefficient of `i` there (`i - j < 64`: `0 < 64`); `None` otherwise.
fn holds_on_diagonal(r: &Region, n: RId) -> Option<bool> {
    let RNode::Binary(op, a, b) = r.nodes[n as usize] else { return None };
    let (ca, ka) = diagonal_affine(r, a)?;
    let (cb, kb) = diagonal_affine(r, b)?;
    if ca != cb {
        return None;
    }
    Some(match op {
        BinaryOp::Lt => ka < kb,
        BinaryOp::Le => ka <= kb,
        BinaryOp::Gt => ka > kb,
        BinaryOp::Ge => ka >= kb,
        BinaryOp::Eq => ka == kb,
        BinaryOp::Ne => ka != kb,
        _ => return None,
    })
}

/// Node `n` at `j = i` as `a i + k` (integers and finite constants), when it is one.
fn diagonal_affine(r: &Region, n: RId) -> Option<(f64, f64)> {
    let f = |x: RId| diagonal_affine(r, x);
    let v = match r.nodes[n as usize] {
        RNode::Index(IndexVar::I | IndexVar::J) => (1.0, 0.0),
        RNode::Const(c) if c.is_finite() => (0.0, c),
        RNode::Unary(UnaryOp::Neg, x) => {
            let (a, k) = f(x)?;
            (-a, -k)
        }
        RNode::Binary(BinaryOp::Add, x, y) => {
            let ((a, k), (b, l)) = (f(x)?, f(y)?);
            (a + b, k + l)
        }
        RNode::Binary(BinaryOp::Sub, x, y) => {
            let ((a, k), (b, l)) = (f(x)?, f(y)?);
            (a - b, k - l)
        }
        RNode::Binary(BinaryOp::Mul, x, y) => match (f(x)?, f(y)?) {
            ((0.0, c), (a, k)) | ((a, k), (0.0, c)) => (a * c, k * c),
            _ => return None,
        },
        _ => return None,
    };
    (v.0.is_finite() && v.1.is_finite()).then_some(v)
}

/// `E` when node `n` of `r` is the comparison `j >= E` (`E <= j`, `j > E`, `E < j`).
fn lower_bound(r: &Region, n: RId) -> Option<Region> {
    let is_j = |x: RId| matches!(r.nodes.get(x as usize), Some(RNode::Index(IndexVar::J)));
    match *r.nodes.get(n as usize)? {
        RNode::Binary(BinaryOp::Ge | BinaryOp::Gt, a, e) if is_j(a) && free_of_j(r, e) => Some(subtree(r, e)),
        RNode::Binary(BinaryOp::Le | BinaryOp::Lt, e, a) if is_j(a) && free_of_j(r, e) => Some(subtree(r, e)),
        _ => None,
    }
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

    fn lo_capture(r: &mut Region, var: &str) -> RId {
        r.push(RNode::Capture {
            k: 0,
            index: vec![IndexExpr::var("b"), IndexExpr::var("h"), IndexExpr::var(var)],
        })
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
