//! Check-time proof that a subscript stays inside its axis for every value of the symbolic dims.
//!
//! Each index variable `v` of size `S_v` ranges over `[0, S_v - 1]`. An affine subscript takes
//! its extremes at the corners of that box, so it is in range iff it is in range at every corner;
//! floor division by a positive divisor is monotone, so the same holds for `(affine) / d`.
//! Corner values are affine forms in the dims (`T - 1`, `2 - T`); a form is proven `>= 0` when all
//! its dim coefficients are `>= 0` and it is `>= 0` with every dim at its least value 1. Distinct
//! dims are treated as independent, which is sound (it may reject, never wrongly accept).
//!
//! Under a causal mask over `(i, j)` (`j <= i`, both of one size S) the pair ranges over the
//! triangle with corners `(0, 0)`, `(S-1, 0)`, `(S-1, S-1)` instead of the square.

use crate::index::{ClampKind, IndexExpr};
use crate::types::Dim;
use std::collections::BTreeMap;
use std::fmt;

/// `sum coef * dim + constant` over symbolic dims (quotients `H / G` are atoms).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Lin {
    pub coef: BTreeMap<Dim, i64>,
    pub c: i64,
}

impl Lin {
    pub fn konst(c: i64) -> Lin {
        Lin { coef: BTreeMap::new(), c }
    }

    /// The form of a dim (a constant folds into `c`).
    pub fn dim(d: &Dim) -> Lin {
        match d {
            Dim::Const(c) => Lin::konst(*c as i64),
            d => Lin { coef: [(d.clone(), 1)].into(), c: 0 },
        }
    }

    fn add_scaled(&mut self, o: &Lin, k: i64) {
        for (d, c) in &o.coef {
            *self.coef.entry(d.clone()).or_insert(0) += c * k;
        }
        self.c += o.c * k;
        self.normalize();
    }

    /// Zero coefficients dropped, and a multiple of an exact quotient by a constant folded into
    /// its dividend: `2 * (D / 2) = D` (the quotient is exact, checked when the dims are bound).
    fn normalize(&mut self) {
        loop {
            let fold = self.coef.iter().find_map(|(d, &k)| match d {
                Dim::Div(a, b) => match **b {
                    Dim::Const(c) if c > 0 && k != 0 && k % c as i64 == 0 => {
                        Some((d.clone(), (**a).clone(), k / c as i64))
                    }
                    _ => None,
                },
                _ => None,
            });
            let Some((q, a, k)) = fold else { break };
            self.coef.remove(&q);
            let a = Lin::dim(&a);
            for (d, c) in &a.coef {
                *self.coef.entry(d.clone()).or_insert(0) += c * k;
            }
            self.c += a.c * k;
        }
        self.coef.retain(|_, c| *c != 0);
    }

    /// A form over the dims: `dim_terms` and `constant` of a subscript (its variables ignored).
    pub fn of_dims(dim_terms: &[(Dim, i64)], constant: i64) -> Lin {
        let mut l = Lin::konst(constant);
        for (d, k) in dim_terms {
            l.add_scaled(&Lin::dim(d), *k);
        }
        l
    }

    pub fn scaled(&self, k: i64) -> Lin {
        let mut r = Lin::default();
        r.add_scaled(self, k);
        r
    }

    pub fn plus(&self, o: &Lin) -> Lin {
        let mut r = self.clone();
        r.add_scaled(o, 1);
        r
    }

    pub fn minus(&self, o: &Lin) -> Lin {
        let mut r = self.clone();
        r.add_scaled(o, -1);
        r
    }

    /// `self >= 0` for every assignment of the dims to positive integers.
    pub fn provably_nonneg(&self) -> bool {
        self.nonneg_from(1)
    }

    /// `self >= 0` for every assignment of the dims to integers `>= least`.
    fn nonneg_from(&self, least: i64) -> bool {
        self.coef.values().all(|&c| c >= 0) && self.coef.values().sum::<i64>() * least + self.c >= 0
    }

    /// `self >= 0` once every dim is large enough: no dim pulls it down, and it is either
    /// constant and `>= 0` or grows with some dim.
    fn eventually_nonneg(&self) -> bool {
        self.coef.values().all(|&c| c >= 0) && (self.c >= 0 || self.coef.values().any(|&c| c > 0))
    }
}

impl fmt::Display for Lin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = String::new();
        for (d, &c) in &self.coef {
            let name = if matches!(d, Dim::Div(..)) { format!("({d})") } else { d.to_string() };
            let mag = if c.abs() == 1 { name } else { format!("{} * {name}", c.abs()) };
            match (s.is_empty(), c < 0) {
                (true, false) => s.push_str(&mag),
                (true, true) => s.push_str(&format!("-{mag}")),
                (false, neg) => s.push_str(&format!(" {} {mag}", if neg { '-' } else { '+' })),
            }
        }
        if s.is_empty() {
            return write!(f, "{}", self.c);
        }
        if self.c != 0 {
            s.push_str(&format!(" {} {}", if self.c < 0 { '-' } else { '+' }, self.c.abs()));
        }
        f.write_str(&s)
    }
}

/// Why a subscript may leave its axis: the corner where it does and the value there.
#[derive(Clone, Debug, PartialEq)]
pub struct OutOfRange {
    /// `(variable, its value as a form)` at the corner.
    pub at: Vec<(String, Lin)>,
    /// The subscript's numerator there (before any division).
    pub value: Lin,
    /// True when the value is below 0, false when it reaches past the axis.
    pub below: bool,
    /// The divisor times the axis size is not an affine form of the dims (`G * G`): no upper
    /// bound can be proven at all.
    pub unprovable: bool,
    /// Out of range at this corner once the dims are large enough (the subscript is wrong but
    /// for small sizes: `i - j` unmasked, `t + 1`, `1 - i`). When false the subscript is in
    /// range for all large sizes of some dims (`i + M - N` needs `M >= N`, `r[a, 7]` needs
    /// `A > 7`), so it can be checked once the dims are bound.
    pub certain: bool,
}

impl OutOfRange {
    /// `i = 0, j = T - 1`.
    pub fn corner(&self) -> String {
        let parts: Vec<String> = self.at.iter().map(|(v, x)| format!("{v} = {x}")).collect();
        parts.join(", ")
    }
}

/// `d * n` as an affine form when it is one: a constant factor, or `(A / B) * B = A`.
fn product(d: &Dim, n: &Dim) -> Option<Lin> {
    match (d, n) {
        (Dim::Const(c), n) => Some(Lin::dim(n).scaled(*c as i64)),
        (d, Dim::Const(c)) => Some(Lin::dim(d).scaled(*c as i64)),
        (Dim::Div(a, b), n) if **b == *n => Some(Lin::dim(a)),
        _ => None,
    }
}

/// Whether `e` stays in `[0, size)` for every value of its variables (`var_size(v)` is the size
/// of `v`), optionally with `j <= i + size(j) - size(i)` for `mask = Some((i, j))` (`j <= i`
/// when the sizes are equal). `Err` gives a corner where it
/// leaves (or cannot be proven to stay; for an unprovable division the value is the numerator).
pub fn check(
    e: &IndexExpr,
    size: &Dim,
    var_size: &dyn Fn(&str) -> Dim,
    mask: Option<(&str, &str)>,
) -> Result<(), OutOfRange> {
    let top = |v: &str| Lin::dim(&var_size(v)).minus(&Lin::konst(1));
    check_within(e, size, &|v| (Lin::konst(0), top(v)), var_size, mask)
}

/// [`check`] with each variable `v` in `bounds(v) = (lo, hi)` (inclusive, forms of the dims)
/// rather than in `[0, size - 1]`: a read guarded by `select(t >= 1, x[t - 1], 0)` has `t` in
/// `[1, T - 1]` (the caller gives bounds that every admitted value satisfies). A masked pair
/// keeps its triangle of the full sizes.
pub fn check_within(
    e: &IndexExpr,
    size: &Dim,
    bounds: &dyn Fn(&str) -> (Lin, Lin),
    var_size: &dyn Fn(&str) -> Dim,
    mask: Option<(&str, &str)>,
) -> Result<(), OutOfRange> {
    if !e.clamps.is_empty() {
        return check_clamped(e, size, bounds, var_size, mask);
    }
    sides(e, size, bounds, var_size, mask).err.map_or(Ok(()), Err)
}

/// Which sides of `[0, size)` an (unclamped) subscript provably keeps, and where it leaves.
struct Sides {
    /// `>= 0` at every corner.
    lower: bool,
    /// `< size` at every corner.
    upper: bool,
    /// A corner where it leaves: one out of range for every value of the dims when there is
    /// one, else one out of range once the dims are large, else the first.
    err: Option<OutOfRange>,
}

fn sides(
    e: &IndexExpr,
    size: &Dim,
    bounds: &dyn Fn(&str) -> (Lin, Lin),
    var_size: &dyn Fn(&str) -> Dim,
    mask: Option<(&str, &str)>,
) -> Sides {
    let vars = e.vars();
    let coef = |v: &str| e.terms.iter().filter(|(n, _)| n == v).map(|(_, c)| c).sum::<i64>();
    // Where some variable has no value (`hi < lo`: `t >= 1` at T = 1) nothing is read, so a
    // form may be proven `>= 0` under `hi - lo >= 0` of any one variable: x >= 0 when
    // x - (hi - lo) is.
    let widths: Vec<Lin> = vars.iter().map(|v| bounds(v)).map(|(lo, hi)| hi.minus(&lo)).collect();
    let nonneg = |x: &Lin| x.provably_nonneg() || widths.iter().any(|w| x.minus(w).provably_nonneg());
    // Corners: each variable at its least or greatest value; a masked pair at the triangle's
    // corners.
    let top = |v: &str| Lin::dim(&var_size(v)).minus(&Lin::konst(1));
    let mut corners: Vec<Vec<(String, Lin)>> = vec![vec![]];
    let paired =
        |v: &str| mask.is_some_and(|(i, j)| (v == i || v == j) && vars.contains(&i) && vars.contains(&j));
    for v in vars.iter().filter(|v| !paired(v)) {
        let (lo, hi) = bounds(v);
        corners = corners
            .into_iter()
            .flat_map(|c| {
                [lo.clone(), hi.clone()].into_iter().map(move |x| {
                    let mut c = c.clone();
                    c.push((v.to_string(), x));
                    c
                })
            })
            .collect();
    }
    if let Some((i, j)) = mask.filter(|(i, j)| vars.contains(i) && vars.contains(j)) {
        // `j <= i + s` with `s = size(j) - size(i)`: the queries at the end of the keys. The kept
        // set lies in the hull of (-s, 0), (top i, 0), (top i, top j) and (0, s), whatever the
        // sign of `s` (its first and last corner are on the line j = i + s, one of them outside
        // the axes); with equal sizes that is the causal triangle, its first corner twice.
        let shift = Lin::dim(&var_size(j)).minus(&Lin::dim(&var_size(i)));
        let (ti, tj) = (top(i), top(j));
        let tri = [
            (shift.scaled(-1), Lin::konst(0)),
            (ti.clone(), Lin::konst(0)),
            (ti, tj),
            (Lin::konst(0), shift),
        ];
        corners = corners
            .into_iter()
            .flat_map(|c| {
                tri.clone().into_iter().map(move |(xi, xj)| {
                    let mut c = c.clone();
                    c.push((i.to_string(), xi));
                    c.push((j.to_string(), xj));
                    c
                })
            })
            .collect();
    }
    // The numerator must stay <= limit: size - 1, or d * size - 1 under a division by d.
    let limit = match &e.div {
        None => Some(Lin::dim(size).minus(&Lin::konst(1))),
        Some(d) => product(d, size).map(|p| p.minus(&Lin::konst(1))),
    };
    let (mut lower, mut upper) = (true, true);
    let (mut definite_err, mut first): (Option<OutOfRange>, Option<OutOfRange>) = (None, None);
    for at in corners {
        let mut value = Lin::of_dims(&e.dim_terms, e.constant);
        for (v, x) in &at {
            value.add_scaled(x, coef(v));
        }
        let low_ok = nonneg(&value);
        let high_ok = limit.as_ref().is_some_and(|l| nonneg(&l.minus(&value)));
        lower &= low_ok;
        upper &= high_ok;
        if low_ok && high_ok {
            continue;
        }
        // `escape` is how far past the bound the value goes (>= 0 when it leaves).
        let escape = if !low_ok {
            Some(value.scaled(-1).minus(&Lin::konst(1)))
        } else {
            limit.as_ref().map(|l| value.minus(l).minus(&Lin::konst(1)))
        };
        let definite = escape.as_ref().is_some_and(|x| x.provably_nonneg());
        let certain = escape.as_ref().is_some_and(|x| x.eventually_nonneg());
        let out = OutOfRange { at, value, below: !low_ok, unprovable: low_ok && limit.is_none(), certain };
        if definite {
            definite_err.get_or_insert(out);
        } else if first.as_ref().is_none_or(|f| certain && !f.certain) {
            // A corner wrong once the dims are large outranks one wrong only at some sizes.
            first = Some(out);
        }
    }
    Sides { lower, upper, err: definite_err.or(first) }
}

/// [`check_within`] of a clamped subscript. Each side of `[0, size)` is proven by the
/// unclamped subscript or by the clamps: going through them in order, `max(x, b)` makes the
/// value `>= 0` when `b >= 0` and keeps it below the axis only when `b` is below it too;
/// `min(x, b)` the other way round. What cannot be proven is never certain (the bind-time
/// check decides it exactly).
fn check_clamped(
    e: &IndexExpr,
    size: &Dim,
    bounds: &dyn Fn(&str) -> (Lin, Lin),
    var_size: &dyn Fn(&str) -> Dim,
    mask: Option<(&str, &str)>,
) -> Result<(), OutOfRange> {
    let base = IndexExpr { clamps: vec![], ..e.clone() };
    let s = sides(&base, size, bounds, var_size, mask);
    let limit = Lin::dim(size).minus(&Lin::konst(1));
    let (mut lower, mut upper) = (s.lower, s.upper);
    for c in &e.clamps {
        let b = Lin::of_dims(&c.dim_terms, c.constant);
        let (b_low, b_high) = (b.provably_nonneg(), limit.minus(&b).provably_nonneg());
        match c.kind {
            ClampKind::Max => (lower, upper) = (lower || b_low, upper && b_high),
            ClampKind::Min => (lower, upper) = (lower && b_low, upper || b_high),
        }
    }
    if lower && upper {
        return Ok(());
    }
    let mut out = s.err.unwrap_or(OutOfRange {
        at: vec![],
        value: Lin::konst(0),
        below: !lower,
        unprovable: false,
        certain: false,
    });
    out.below = !lower;
    out.certain = false;
    Err(out)
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
    fn t(_: &str) -> Dim {
        Dim::sym("T")
    }

    #[test]
    fn relative_position_needs_the_mask() {
        let rel = e(&[("i", 1), ("j", -1)], 0, None);
        let err = check(&rel, &Dim::sym("T"), &t, None).unwrap_err();
        assert!(err.below);
        assert_eq!(err.corner(), "i = 0, j = T - 1");
        assert_eq!(err.value.to_string(), "-T + 1");
        assert!(err.certain, "wrong whenever T >= 2");
        // `1 - i` fits only T <= 2: wrong, not a size to check at bind time.
        let err = check(&e(&[("i", -1)], 1, None), &Dim::sym("T"), &t, None).unwrap_err();
        assert!(err.certain);
        assert_eq!(check(&rel, &Dim::sym("T"), &t, Some(("i", "j"))), Ok(()));
        // The mask the other way round does not help.
        assert!(check(&rel, &Dim::sym("T"), &t, Some(("j", "i"))).is_err());
    }

    #[test]
    fn shift_leaves_the_axis() {
        let err = check(&e(&[("t", 1)], 1, None), &Dim::sym("T"), &t, None).unwrap_err();
        assert!(!err.below);
        assert_eq!(err.value.to_string(), "T");
        assert_eq!(check(&e(&[("t", 1)], 0, None), &Dim::sym("T"), &t, None), Ok(()));
    }

    #[test]
    fn queries_aligned_to_the_end_of_longer_keys() {
        // `c[i + M - N]`, i over N, into an axis of size M: in range exactly when M >= N.
        let mut aligned = e(&[("i", 1)], 0, None);
        aligned.dim_terms = vec![(Dim::sym("M"), 1), (Dim::sym("N"), -1)];
        let n = |_: &str| Dim::sym("N");
        let err = check(&aligned, &Dim::sym("M"), &n, None).unwrap_err();
        assert!(err.below && !err.certain);
        assert_eq!(err.value.to_string(), "M - N");
        // A constant into a symbolic axis is in range for long enough axes.
        let err = check(&e(&[], 7, None), &Dim::sym("A"), &n, None).unwrap_err();
        assert!(!err.below && !err.certain);
        // `t + N` into an axis of size N never fits.
        let mut past = e(&[("t", 1)], 0, None);
        past.dim_terms = vec![(Dim::sym("N"), 1)];
        assert!(check(&past, &Dim::sym("N"), &n, None).unwrap_err().certain);
    }

    /// A relative position read by queries at the end of longer keys, `rel[i + M - N - j]` into
    /// an axis of size M (i over N, j over M): in range where `j <= i + M - N`, whatever the sign
    /// of `M - N`; `rel[i - j]` is not (it is `N - M` short). Clamped, `min(i + M - N - j, 128)`
    /// into 129 entries is in range there too. (Shown failing with the causal triangle's corners
    /// of the square case.)
    #[test]
    fn a_relative_position_of_a_prefill_needs_the_shifted_mask() {
        let size = |v: &str| Dim::sym(if v == "i" { "N" } else { "M" });
        let mut rel = e(&[("i", 1), ("j", -1)], 0, None);
        rel.dim_terms = vec![(Dim::sym("M"), 1), (Dim::sym("N"), -1)];
        assert_eq!(check(&rel, &Dim::sym("M"), &size, Some(("i", "j"))), Ok(()));
        assert!(check(&rel, &Dim::sym("M"), &size, None).unwrap_err().certain);
        let unshifted = e(&[("i", 1), ("j", -1)], 0, None);
        assert!(check(&unshifted, &Dim::sym("M"), &size, Some(("i", "j"))).is_err());
        let mut clamped = rel.clone();
        clamped.clamps = vec![crate::index::Clamp { kind: ClampKind::Min, dim_terms: vec![], constant: 128 }];
        assert_eq!(check(&clamped, &Dim::Const(129), &size, Some(("i", "j"))), Ok(()));
    }

    #[test]
    fn guarded_bounds_and_half_dims() {
        let d = |_: &str| Dim::sym("D");
        let half = Dim::quotient(Dim::sym("D"), Dim::Const(2));
        // `x[d + D / 2]` with d < D / 2 (a rotate-half read): in range, by 2 * (D / 2) = D.
        let mut up = e(&[("d", 1)], 0, None);
        up.dim_terms = vec![(half.clone(), 1)];
        let below_half = |_: &str| (Lin::konst(0), Lin::dim(&half).minus(&Lin::konst(1)));
        assert_eq!(check_within(&up, &Dim::sym("D"), &below_half, &d, None), Ok(()));
        assert!(check(&up, &Dim::sym("D"), &d, None).is_err(), "unguarded it leaves the axis");
        // `x[t - 1]` with t >= 1 (a token shift).
        let t = |_: &str| Dim::sym("T");
        let shifted = e(&[("t", 1)], -1, None);
        let from_one = |_: &str| (Lin::konst(1), Lin::dim(&Dim::sym("T")).minus(&Lin::konst(1)));
        assert_eq!(check_within(&shifted, &Dim::sym("T"), &from_one, &t, None), Ok(()));
        assert!(check(&shifted, &Dim::sym("T"), &t, None).unwrap_err().certain);
    }

    #[test]
    fn grouped_heads() {
        let h = |_: &str| Dim::sym("H");
        let gqa = e(&[("h", 1)], 0, Some(Dim::quotient(Dim::sym("H"), Dim::sym("G"))));
        assert_eq!(check(&gqa, &Dim::sym("G"), &h, None), Ok(()));
        // Into an axis of another size: not provable.
        assert!(check(&gqa, &Dim::sym("K"), &h, None).is_err());
        // Constant divisors: h / 2 into an axis of size H is fine; 2 * h is not.
        assert_eq!(check(&e(&[("h", 1)], 0, Some(Dim::Const(2))), &Dim::sym("H"), &h, None), Ok(()));
        assert!(check(&e(&[("h", 2)], 0, None), &Dim::sym("H"), &h, None).is_err());
    }
}
