//! Expression masks: `select(c, s, -inf)` keeps the entries where `c` holds and
//! `select(c, -inf, s)` those where it does not. A keep-condition that is a comparison linear
//! in the query and key indices and exactly `j <= i` over the integers (`i - j >= 0`,
//! `j < i + 1`, `j - i > 0` with `-inf` first, ...) is the causal mask, which ACP can prune;
//! `j <= i + M - N` (queries aligned to the end of longer keys) is the causal mask shifted by a
//! sum of dims ([`causal_offset`]).

use super::score::T;
use crate::lang::{Attn, Num};
use egg::{Id, Symbol};
use foxc_ir::index::IndexExpr;
use foxc_ir::UnaryOp;
use std::collections::BTreeMap;
use std::rc::Rc;

/// The key under which [`linear`] counts the dim `d` (index names never start with `#`).
fn dim_key(d: Symbol) -> Symbol {
    Symbol::from(format!("#{d}"))
}

/// `sum coef * index + sum coef * dim + constant` of an index expression term (`None` when it is
/// not one: a tensor read, a non-constant product); a dim counts as [`dim_key`].
fn linear(t: &T) -> Option<(BTreeMap<Symbol, f64>, f64)> {
    let kid = |k: usize| linear(t.kids.get(k)?);
    let scaled = |(m, c): (BTreeMap<Symbol, f64>, f64), s: f64| {
        (m.into_iter().map(|(v, a)| (v, a * s)).collect::<BTreeMap<_, _>>(), c * s)
    };
    let sum = |(mut m, c): (BTreeMap<Symbol, f64>, f64), (n, d): (BTreeMap<Symbol, f64>, f64)| {
        for (v, a) in n {
            *m.entry(v).or_insert(0.0) += a;
        }
        (m, c + d)
    };
    match &t.op {
        Attn::Num(n) => Some((BTreeMap::new(), n.get())).filter(|(_, c)| c.is_finite()),
        Attn::Iota(_) => Some((BTreeMap::from([(t.kids.first()?.sym()?, 1.0)]), 0.0)),
        Attn::Dim(_) => Some((BTreeMap::from([(dim_key(t.kids.first()?.sym()?), 1.0)]), 0.0)),
        Attn::Add(_) => Some(sum(kid(0)?, kid(1)?)),
        Attn::Sub(_) => Some(sum(kid(0)?, scaled(kid(1)?, -1.0))),
        Attn::Unary(UnaryOp::Neg, _) => Some(scaled(kid(0)?, -1.0)),
        Attn::Mul(_) => {
            let (a, b) = (kid(0)?, kid(1)?);
            match (a.0.is_empty(), b.0.is_empty()) {
                (true, _) => Some(scaled(b, a.1)),
                (_, true) => Some(scaled(a, b.1)),
                _ => None,
            }
        }
        _ => None,
    }
}

/// Whether keeping the entries where `t` holds (where it does not, if `negated`) is exactly the
/// causal mask `j <= i` for all integer `i`, `j`.
#[cfg(test)]
pub(crate) fn is_causal(t: &T, negated: bool, i: Symbol, j: Symbol) -> bool {
    causal_offset(t, negated, i, j).is_some_and(|o| o == IndexExpr::constant(0))
}

/// `o` when keeping the entries where `t` holds (where it does not, if `negated`) is exactly
/// `j <= i + o` for all integer `i`, `j` and dims, `o` a sum of dims and a constant (the index
/// expression of no variable): 0 for the causal mask, `M - N` for queries at the end of keys.
pub(crate) fn causal_offset(t: &T, negated: bool, i: Symbol, j: Symbol) -> Option<IndexExpr> {
    let (a, b) = (linear(t.kids.first()?)?, linear(t.kids.get(1)?)?);
    // `lhs - rhs` and the comparison, as `g > 0` or `g >= 0`.
    let mut g = a.0;
    for (v, c) in b.0 {
        *g.entry(v).or_insert(0.0) -= c;
    }
    let mut g = (g, a.1 - b.1);
    let flip = |(m, c): (BTreeMap<Symbol, f64>, f64)| (m.into_iter().map(|(v, a)| (v, -a)).collect(), -c);
    let mut strict = match t.op {
        Attn::Gt(_) => true,
        Attn::Ge(_) => false,
        Attn::Lt(_) => {
            g = flip(g);
            true
        }
        Attn::Le(_) => {
            g = flip(g);
            false
        }
        _ => return None,
    };
    if negated {
        // not (g > 0) is -g >= 0; not (g >= 0) is -g > 0 (index values are never NaN).
        g = flip(g);
        strict = !strict;
    }
    let (coef, c) = g;
    let k = coef.get(&i).copied().unwrap_or(0.0);
    let is_dim = |v: &Symbol| v.as_str().starts_with('#');
    if coef.iter().any(|(v, a)| *a != 0.0 && *v != i && *v != j && !is_dim(v))
        || k <= 0.0
        || coef.get(&j) != Some(&-k)
    {
        return None;
    }
    // k (i - j) + sum a_d d + c > 0 (or >= 0) with k > 0: with every a_d / k an integer e_d,
    // i - j + sum e_d d >= lowest over the integers, i.e. j <= i + sum e_d d - lowest.
    let mut dim_terms = vec![];
    for (v, a) in coef.iter().filter(|(v, a)| is_dim(v) && **a != 0.0) {
        let e = a / k;
        if e.fract() != 0.0 || e.abs() > (1u64 << 40) as f64 {
            return None;
        }
        dim_terms.push((foxc_ir::Dim::sym(&v.as_str()[1..]), e as i64));
    }
    let bound = -c / k;
    let lowest = if strict { bound.floor() + 1.0 } else { bound.ceil() };
    if !lowest.is_finite() || lowest.abs() > (1u64 << 40) as f64 {
        return None;
    }
    Some(IndexExpr { terms: vec![], dim_terms, constant: -(lowest as i64), div: None, clamps: vec![] })
}

/// `e` as the sum `(dim name -> coefficient, constant)` (dims other than symbols by their text).
pub(crate) fn dim_sum(e: &IndexExpr) -> (BTreeMap<String, i64>, i64) {
    let mut m = BTreeMap::new();
    let mut c = e.constant;
    for (d, k) in &e.dim_terms {
        match d {
            foxc_ir::Dim::Const(n) => c += *n as i64 * k,
            d => *m.entry(d.to_string()).or_insert(0) += k,
        }
    }
    m.retain(|_, k| *k != 0);
    (m, c)
}

/// Whether two offsets (sums of dims) are equal for every size of the dims.
pub(crate) fn same_offset(a: &IndexExpr, b: &IndexExpr) -> bool {
    dim_sum(a) == dim_sum(b)
}

/// The keep-condition term of a mask: `c`, or for `select(c, -inf, s)` the opposite comparison
/// when `c` compares index expressions (never NaN), else `c == 0` (a NaN condition masks in
/// both spellings, as the interpreter reads `select`).
pub(crate) fn keep_term(c: T, negated: bool) -> T {
    if !negated {
        return c;
    }
    let index_only = c.kids.iter().all(|k| linear(k).is_some());
    let opposite = match c.op {
        Attn::Lt(x) => Some(Attn::Ge(x)),
        Attn::Le(x) => Some(Attn::Gt(x)),
        Attn::Gt(x) => Some(Attn::Le(x)),
        Attn::Ge(x) => Some(Attn::Lt(x)),
        Attn::Eq(x) => Some(Attn::Ne(x)),
        Attn::Ne(x) => Some(Attn::Eq(x)),
        _ => None,
    };
    match opposite {
        Some(op) if index_only => T { op, kids: c.kids, class: None },
        _ => {
            let zero = Id::from(0usize);
            T {
                op: Attn::Eq([zero, zero]),
                kids: vec![
                    Rc::new(c),
                    Rc::new(T { op: Attn::Num(Num::new(0.0)), kids: vec![], class: None }),
                ],
                class: None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(op: Attn) -> T {
        T { op, kids: vec![], class: None }
    }
    fn ix(s: &str) -> T {
        T {
            op: Attn::Iota(Id::from(0usize)),
            kids: vec![Rc::new(leaf(Attn::Symbol(Symbol::from(s))))],
            class: None,
        }
    }
    fn num(c: f64) -> T {
        leaf(Attn::Num(Num::new(c)))
    }
    fn bin(op: fn([Id; 2]) -> Attn, a: T, b: T) -> T {
        let z = Id::from(0usize);
        T { op: op([z, z]), kids: vec![Rc::new(a), Rc::new(b)], class: None }
    }

    /// Every spelling of `j <= i` (and of its opposite with `-inf` first) is causal; shifted,
    /// scaled-the-wrong-way or other-index conditions are not.
    #[test]
    fn causal_conditions_over_the_integers() {
        let (i, j) = (Symbol::from("i"), Symbol::from("j"));
        let causal = |t: &T, neg: bool| is_causal(t, neg, i, j);
        assert!(causal(&bin(Attn::Le, ix("j"), ix("i")), false));
        assert!(causal(&bin(Attn::Ge, bin(Attn::Sub, ix("i"), ix("j")), num(0.0)), false));
        assert!(causal(&bin(Attn::Lt, ix("j"), bin(Attn::Add, ix("i"), num(1.0))), false));
        assert!(causal(&bin(Attn::Gt, bin(Attn::Add, ix("i"), num(0.5)), ix("j")), false));
        assert!(causal(
            &bin(Attn::Ge, bin(Attn::Mul, num(2.0), ix("i")), bin(Attn::Mul, ix("j"), num(2.0))),
            false
        ));
        // Negated: keep where j > i does not hold.
        assert!(causal(&bin(Attn::Gt, ix("j"), ix("i")), true));
        assert!(causal(&bin(Attn::Gt, bin(Attn::Sub, ix("j"), ix("i")), num(0.0)), true));
        assert!(causal(&bin(Attn::Lt, ix("i"), ix("j")), true));
        assert!(causal(&bin(Attn::Ge, ix("j"), bin(Attn::Add, ix("i"), num(1.0))), true));
        // Not causal: strictly below the diagonal, the wrong direction, another index, a read.
        assert!(!causal(&bin(Attn::Lt, ix("j"), ix("i")), false));
        assert!(!causal(&bin(Attn::Le, ix("j"), ix("i")), true));
        assert!(!causal(&bin(Attn::Ge, ix("j"), ix("i")), false));
        assert!(!causal(&bin(Attn::Le, ix("j"), ix("h")), false));
        assert!(!causal(&bin(Attn::Le, ix("j"), bin(Attn::Add, ix("i"), ix("h"))), false));
        assert!(!causal(&bin(Attn::Ne, ix("j"), ix("i")), false));
        let read = T { op: Attn::Recip(Id::from(0usize)), kids: vec![Rc::new(ix("i"))], class: None };
        assert!(!causal(&bin(Attn::Le, ix("j"), read), false));
    }

    fn dim(s: &str) -> T {
        T {
            op: Attn::Dim(Id::from(0usize)),
            kids: vec![Rc::new(leaf(Attn::Symbol(Symbol::from(s))))],
            class: None,
        }
    }

    /// `j <= i + M - N` (and its spellings) is the causal mask shifted by `M - N`; a shift by a
    /// fraction of a dim or a product is none.
    #[test]
    fn causal_offsets_of_sums_of_dims() {
        let (i, j) = (Symbol::from("i"), Symbol::from("j"));
        let off = |t: &T, neg: bool| causal_offset(t, neg, i, j).map(|o| o.to_string());
        let shifted = bin(Attn::Sub, bin(Attn::Add, ix("i"), dim("M")), dim("N"));
        assert_eq!(off(&bin(Attn::Le, ix("j"), shifted.clone()), false).as_deref(), Some("M - N"));
        // j < i + M - N + 1, and keep where j > i + M - N fails.
        let plus1 = bin(Attn::Add, shifted.clone(), num(1.0));
        assert_eq!(off(&bin(Attn::Lt, ix("j"), plus1), false).as_deref(), Some("M - N"));
        assert_eq!(off(&bin(Attn::Gt, ix("j"), shifted.clone()), true).as_deref(), Some("M - N"));
        // j <= i + M - 1 (a decode step against M keys).
        let last = bin(Attn::Add, ix("i"), bin(Attn::Sub, dim("M"), num(1.0)));
        assert_eq!(off(&bin(Attn::Le, ix("j"), last), false).as_deref(), Some("M - 1"));
        // 2 j <= 2 i + M: half a dim is no integer shift; j <= i * M is not linear.
        let half = bin(Attn::Add, bin(Attn::Mul, num(2.0), ix("i")), dim("M"));
        assert_eq!(off(&bin(Attn::Le, bin(Attn::Mul, num(2.0), ix("j")), half), false), None);
        assert_eq!(off(&bin(Attn::Le, ix("j"), bin(Attn::Mul, ix("i"), dim("M"))), false), None);
        assert!(is_causal(&bin(Attn::Le, ix("j"), ix("i")), false, i, j));
        assert!(!is_causal(&bin(Attn::Le, ix("j"), shifted), false, i, j));
    }

    #[test]
    fn negated_keep_conditions() {
        let t = keep_term(bin(Attn::Gt, ix("j"), ix("i")), true);
        assert!(matches!(t.op, Attn::Le(_)));
        assert!(matches!(keep_term(bin(Attn::Gt, ix("j"), ix("i")), false).op, Attn::Gt(_)));
        // A condition that may be NaN (a tensor read) is compared with 0 instead.
        let read = T { op: Attn::Recip(Id::from(0usize)), kids: vec![Rc::new(ix("i"))], class: None };
        let t = keep_term(bin(Attn::Gt, read, num(0.0)), true);
        assert!(matches!(t.op, Attn::Eq(_)) && matches!(t.kids[0].op, Attn::Gt(_)));
    }
}
