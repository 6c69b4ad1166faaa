//! Subscripts that are index expressions: `i - j`, `t + 1`, `h / (H / G)`.
//!
//! A subscript is an affine form of index variables and dims with integer coefficients and a
//! constant, optionally floor-divided by a positive dim:
//! `floor((sum c*v + sum k*dim + constant) / div)`. Dim terms (`i + M - N`, `d + D / 2`) are
//! numbers once the dims are bound; a dim term may be an exact quotient (`D / 2`). A plain
//! subscript (`i`) is the form `1*i + 0` without a divisor; the front end lowers those to `bind`
//! and every other one to `gather` (ops.rs). The same type describes the subscripts of captured
//! tensors in the fused attention's score region.

use crate::types::Dim;
use std::fmt;

/// One subscript: `sum(coef * var) + constant`, then optionally floor-divided by a positive dim,
/// then clamped (`min` / `max` with bounds of dims and constants), in order.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct IndexExpr {
    pub terms: Vec<(String, i64)>,
    /// `sum k * dim`: terms in the symbolic dims (`+ M - N`), in order of appearance.
    pub dim_terms: Vec<(Dim, i64)>,
    pub constant: i64,
    pub div: Option<Dim>,
    /// `min(x, b)` / `max(x, b)` applied after the division, innermost first
    /// (`rel[h, min(i - j, 128)]`, `x[max(t - 1, 0)]`).
    pub clamps: Vec<Clamp>,
}

/// Whether a clamp caps a subscript from above (`min`) or below (`max`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ClampKind {
    Min,
    Max,
}

/// `min(x, bound)` or `max(x, bound)`, the bound `sum k * dim + constant` (no index variable).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Clamp {
    pub kind: ClampKind,
    pub dim_terms: Vec<(Dim, i64)>,
    pub constant: i64,
}

/// `constant + sum k * dim` under `dims`; `None` on overflow or an unbound dim.
fn dim_sum(constant: i64, terms: &[(Dim, i64)], dims: &dyn Fn(&str) -> Option<u64>) -> Option<i64> {
    terms
        .iter()
        .try_fold(constant, |s, (d, k)| s.checked_add(k.checked_mul(i64::try_from(d.eval(dims)?).ok()?)?))
}

impl Clamp {
    /// The bound under the dim bindings `dims`; `None` on overflow or an unbound dim.
    pub fn bound(&self, dims: &dyn Fn(&str) -> Option<u64>) -> Option<i64> {
        dim_sum(self.constant, &self.dim_terms, dims)
    }

    /// `x` clamped.
    pub fn apply(&self, x: i64, bound: i64) -> i64 {
        match self.kind {
            ClampKind::Min => x.min(bound),
            ClampKind::Max => x.max(bound),
        }
    }
}

impl IndexExpr {
    /// The plain subscript `name`.
    pub fn var(name: &str) -> IndexExpr {
        IndexExpr {
            terms: vec![(name.to_string(), 1)],
            dim_terms: vec![],
            constant: 0,
            div: None,
            clamps: vec![],
        }
    }

    /// The constant subscript `c`.
    pub fn constant(c: i64) -> IndexExpr {
        IndexExpr { terms: vec![], dim_terms: vec![], constant: c, div: None, clamps: vec![] }
    }

    /// The part of the numerator that does not depend on the index variables, `constant + sum
    /// k * dim`, under the dim bindings `dims`; `None` on overflow or an unbound dim.
    pub fn offset(&self, dims: &dyn Fn(&str) -> Option<u64>) -> Option<i64> {
        dim_sum(self.constant, &self.dim_terms, dims)
    }

    /// Whether the subscript mentions no index variable and no dim (a plain number).
    pub fn is_constant(&self) -> bool {
        self.vars().is_empty() && self.dim_terms.iter().all(|(_, k)| *k == 0) && self.clamps.is_empty()
    }

    /// The variable of a plain subscript (`i`, not `i + 0 * j` or `2 * i`).
    pub fn is_plain_var(&self) -> Option<&str> {
        match (
            self.terms.as_slice(),
            self.dim_terms.is_empty() && self.clamps.is_empty(),
            self.constant,
            &self.div,
        ) {
            ([(v, 1)], true, 0, None) => Some(v),
            _ => None,
        }
    }

    /// The same subscript with each variable `v` renamed `f(v)` (the first error stops it).
    pub fn rename_vars<E>(&self, mut f: impl FnMut(&str) -> Result<String, E>) -> Result<IndexExpr, E> {
        let mut e = self.clone();
        for (v, _) in &mut e.terms {
            *v = f(v)?;
        }
        Ok(e)
    }

    /// The variables with a non-zero coefficient, in order of appearance, each once.
    pub fn vars(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for (v, c) in &self.terms {
            if *c != 0 && !out.contains(&v.as_str()) {
                out.push(v);
            }
        }
        out
    }

    /// The value of the subscript: `var` gives the index variables, `dims` the symbolic dims.
    /// `None` on overflow, an unbound dim, or a divisor that is not a positive exact quotient.
    pub fn eval(&self, var: &dyn Fn(&str) -> i64, dims: &dyn Fn(&str) -> Option<u64>) -> Option<i64> {
        let mut s = self.offset(dims)?;
        for (v, c) in &self.terms {
            s = s.checked_add(c.checked_mul(var(v))?)?;
        }
        let mut x = match &self.div {
            None => s,
            Some(d) => {
                let d = i64::try_from(d.eval(dims)?).ok()?;
                if d <= 0 {
                    return None;
                }
                s.div_euclid(d)
            }
        };
        for c in &self.clamps {
            x = c.apply(x, c.bound(dims)?);
        }
        Some(x)
    }

    /// The smallest and largest value of the subscript when each variable `v` ranges over
    /// `range(v) = (lo, hi)` (inclusive) and dims are bound by `dims`; `None` as for [`Self::eval`].
    /// Exact: an affine form takes its extremes at the corners, and floor division by a positive
    /// number is monotone.
    pub fn range(
        &self,
        range: &dyn Fn(&str) -> (i64, i64),
        dims: &dyn Fn(&str) -> Option<u64>,
    ) -> Option<(i64, i64)> {
        let c = self.offset(dims)?;
        let (mut lo, mut hi) = (c, c);
        for (v, c) in &self.terms {
            let (a, b) = range(v);
            let (x, y) = (c.checked_mul(a)?, c.checked_mul(b)?);
            lo = lo.checked_add(x.min(y))?;
            hi = hi.checked_add(x.max(y))?;
        }
        let (mut lo, mut hi) = match &self.div {
            None => (lo, hi),
            Some(d) => {
                let d = i64::try_from(d.eval(dims)?).ok()?;
                if d <= 0 {
                    return None;
                }
                (lo.div_euclid(d), hi.div_euclid(d))
            }
        };
        // Clamps are monotone: the extremes clamp to the extremes.
        for c in &self.clamps {
            let b = c.bound(dims)?;
            (lo, hi) = (c.apply(lo, b), c.apply(hi, b));
        }
        Some((lo, hi))
    }
}

impl fmt::Display for IndexExpr {
    /// DSL syntax that parses back to the same subscript: `i - j`, `t + 1`, `2 * i`,
    /// `h / (H / G)`, `(i + j) / 2`, `min(i - j, 128)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some((last, inner)) = self.clamps.split_last() {
            let inner = IndexExpr { clamps: inner.to_vec(), ..self.clone() };
            let bound = IndexExpr { dim_terms: last.dim_terms.clone(), ..IndexExpr::constant(last.constant) };
            let name = if last.kind == ClampKind::Min { "min" } else { "max" };
            return write!(f, "{name}({inner}, {bound})");
        }
        // `c * name` after what is written so far: ` + 2 * t`, ` - M`, `-i` first.
        let push = |s: &mut String, c: i64, name: &str| {
            if s.is_empty() {
                if c < 0 {
                    s.push('-');
                }
            } else {
                s.push_str(if c < 0 { " - " } else { " + " });
            }
            if c.unsigned_abs() != 1 {
                s.push_str(&format!("{} * ", c.unsigned_abs()));
            }
            s.push_str(name);
        };
        let mut s = String::new();
        for (v, c) in self.terms.iter().filter(|(_, c)| *c != 0) {
            push(&mut s, *c, v);
        }
        for (d, c) in self.dim_terms.iter().filter(|(_, c)| *c != 0) {
            let name = match d {
                Dim::Sym(_) | Dim::Const(_) => d.to_string(),
                // `D / 2` binds tighter than `+`, but not after `2 *`.
                _ if c.unsigned_abs() == 1 => d.to_string(),
                _ => format!("({d})"),
            };
            push(&mut s, *c, &name);
        }
        let n_terms = self.terms.iter().filter(|(_, c)| *c != 0).count()
            + self.dim_terms.iter().filter(|(_, c)| *c != 0).count();
        if s.is_empty() {
            s = self.constant.to_string();
        } else if self.constant != 0 {
            let sign = if self.constant < 0 { '-' } else { '+' };
            s.push_str(&format!(" {sign} {}", self.constant.unsigned_abs()));
        }
        match &self.div {
            None => f.write_str(&s),
            Some(d) => {
                let simple_num = n_terms + (self.constant != 0) as usize <= 1
                    && !s.starts_with('-')
                    && !s.contains(" * ")
                    && !s.contains(" / ");
                let num = if simple_num { s } else { format!("({s})") };
                match d {
                    Dim::Sym(_) | Dim::Const(_) => write!(f, "{num} / {d}"),
                    _ => write!(f, "{num} / ({d})"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(terms: &[(&str, i64)], constant: i64, div: Option<Dim>) -> IndexExpr {
        IndexExpr {
            terms: terms.iter().map(|(v, c)| (v.to_string(), *c)).collect(),
            dim_terms: vec![],
            constant,
            div,
            clamps: vec![],
        }
    }

    #[test]
    fn displays_dsl_syntax() {
        assert_eq!(e(&[("i", 1), ("j", -1)], 0, None).to_string(), "i - j");
        assert_eq!(e(&[("t", 1)], 1, None).to_string(), "t + 1");
        assert_eq!(e(&[("t", -2)], -3, None).to_string(), "-2 * t - 3");
        assert_eq!(e(&[], 4, None).to_string(), "4");
        let gqa = e(&[("h", 1)], 0, Some(Dim::quotient(Dim::sym("H"), Dim::sym("G"))));
        assert_eq!(gqa.to_string(), "h / (H / G)");
        assert_eq!(e(&[("i", 1), ("j", 1)], 0, Some(Dim::Const(2))).to_string(), "(i + j) / 2");
        assert_eq!(IndexExpr::var("b").to_string(), "b");
        let mut aligned = e(&[("i", 1)], 0, None);
        aligned.dim_terms = vec![(Dim::sym("M"), 1), (Dim::sym("N"), -1)];
        assert_eq!(aligned.to_string(), "i + M - N");
        let mut half = e(&[("d", 1)], 0, None);
        half.dim_terms = vec![(Dim::quotient(Dim::sym("D"), Dim::Const(2)), -1)];
        assert_eq!(half.to_string(), "d - D / 2");
        half.dim_terms[0].1 = 2;
        assert_eq!(half.to_string(), "d + 2 * (D / 2)");
        let mut alone = IndexExpr::constant(0);
        alone.dim_terms = vec![(Dim::quotient(Dim::sym("D"), Dim::Const(2)), 1)];
        alone.div = Some(Dim::Const(2));
        assert_eq!(alone.to_string(), "(D / 2) / 2");
    }

    #[test]
    fn clamps_apply_after_the_division_in_order() {
        let mut rel = e(&[("i", 1), ("j", -1)], 0, Some(Dim::Const(2)));
        rel.clamps = vec![
            Clamp { kind: ClampKind::Max, dim_terms: vec![], constant: 0 },
            Clamp { kind: ClampKind::Min, dim_terms: vec![(Dim::sym("S"), 1)], constant: -1 },
        ];
        assert_eq!(rel.to_string(), "min(max((i - j) / 2, 0), S - 1)");
        let dims = |s: &str| (s == "S").then_some(5);
        let at = |i: i64, j: i64| rel.eval(&|v| if v == "i" { i } else { j }, &dims);
        assert_eq!((at(20, 0), at(3, 0), at(0, 7)), (Some(4), Some(1), Some(0)));
        assert_eq!(rel.range(&|_| (0, 20), &dims), Some((0, 4)));
        assert!(rel.is_plain_var().is_none() && !rel.is_constant());
    }

    #[test]
    fn dim_terms_are_numbers_once_bound() {
        let mut aligned = e(&[("i", 1)], 0, None);
        aligned.dim_terms = vec![(Dim::sym("M"), 1), (Dim::sym("N"), -1)];
        let dims = |s: &str| match s {
            "M" => Some(10),
            "N" => Some(3),
            _ => None,
        };
        assert_eq!(aligned.offset(&dims), Some(7));
        assert_eq!(aligned.eval(&|_| 2, &dims), Some(9));
        assert_eq!(aligned.range(&|_| (0, 2), &dims), Some((7, 9)));
        assert_eq!(aligned.eval(&|_| 2, &|_| None), None);
        assert!(!aligned.is_constant());
        assert!(IndexExpr::constant(3).is_constant());
    }

    #[test]
    fn evaluates_with_floor_division() {
        let dims = |s: &str| match s {
            "H" => Some(16),
            "G" => Some(4),
            "K" => Some(3),
            _ => None,
        };
        let gqa = e(&[("h", 1)], 0, Some(Dim::quotient(Dim::sym("H"), Dim::sym("G"))));
        let heads: Vec<i64> = (0..16).map(|h| gqa.eval(&|_| h, &dims).unwrap()).collect();
        assert_eq!(heads, [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3]);
        // Floor, not truncation, for negative numerators.
        assert_eq!(e(&[("i", -1)], 0, Some(Dim::Const(2))).eval(&|_| 3, &dims), Some(-2));
        // 16 / 3 is not exact: no value.
        let bad = e(&[("h", 1)], 0, Some(Dim::quotient(Dim::sym("H"), Dim::sym("K"))));
        assert_eq!(bad.eval(&|_| 1, &dims), None);
        assert_eq!(
            e(&[("i", 1), ("j", -1)], 5, None).eval(&|v| if v == "i" { 2 } else { 7 }, &dims),
            Some(0)
        );
    }

    #[test]
    fn plain_and_range() {
        assert_eq!(IndexExpr::var("i").is_plain_var(), Some("i"));
        assert_eq!(e(&[("i", 1)], 1, None).is_plain_var(), None);
        assert_eq!(e(&[("i", 2)], 0, None).is_plain_var(), None);
        let r = |v: &str| if v == "i" { (0, 9) } else { (0, 4) };
        assert_eq!(e(&[("i", 1), ("j", -1)], 0, None).range(&r, &|_| None), Some((-4, 9)));
        assert_eq!(e(&[("i", 1)], 0, Some(Dim::Const(4))).range(&r, &|_| None), Some((0, 2)));
    }
}
