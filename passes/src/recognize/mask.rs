//! Expression masks: `select(c, s, -inf)` keeps the entries where `c` holds and
//! `select(c, -inf, s)` those where it does not. A keep-condition that is a comparison linear
//! in the query and key indices and exactly `j <= i` over the integers (`i - j >= 0`,
//! `j < i + 1`, `j - i > 0` with `-inf` first, ...) is the causal mask, which ACP can prune.

use super::score::T;
use crate::lang::{Attn, Num};
use egg::{Id, Symbol};
use std::collections::BTreeMap;
use std::rc::Rc;

/// `sum coef * index + constant` of an index expression term (`None` when it is not one:
/// a tensor read, a non-constant product, a dim).
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
        Attn::Add(_) => Some(sum(kid(0)?, kid(1)?)),
        Attn::Sub(_) => Some(sum(kid(0)?, scaled(kid(1)?, -1.0))),
        Attn::Neg(_) => Some(scaled(kid(0)?, -1.0)),
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
pub(crate) fn is_causal(t: &T, negated: bool, i: Symbol, j: Symbol) -> bool {
    let (a, b) = match (t.kids.first().and_then(|k| linear(k)), t.kids.get(1).and_then(|k| linear(k))) {
        (Some(a), Some(b)) => (a, b),
        _ => return false,
    };
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
        _ => return false,
    };
    if negated {
        // not (g > 0) is -g >= 0; not (g >= 0) is -g > 0 (index values are never NaN).
        g = flip(g);
        strict = !strict;
    }
    let (coef, c) = g;
    let k = coef.get(&i).copied().unwrap_or(0.0);
    if coef.iter().any(|(v, a)| *a != 0.0 && *v != i && *v != j) || k <= 0.0 || coef.get(&j) != Some(&-k) {
        return false;
    }
    // k (i - j) + c > 0 (or >= 0) with k > 0: i - j >= lowest, over the integers.
    let bound = -c / k;
    let lowest = if strict { bound.floor() + 1.0 } else { bound.ceil() };
    lowest == 0.0
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
