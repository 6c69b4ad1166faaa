//! The numbers of a captured tensor's subscript once the dims are bound: both backends emit
//! `floor((sum c*v + offset) / div)` from these, with `offset` the constant plus the dim terms
//! (`i + M - N`) and `div` the divisor.

use foxc_ir::attention::IndexVar;
use foxc_ir::index::{ClampKind, IndexExpr};
use foxc_ir::Dim;

/// One resolved subscript (see the module doc); `div` is `None` when it does not divide;
/// `clamps` follow the division, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SubConsts {
    pub offset: i64,
    pub div: Option<i64>,
    pub clamps: Vec<(ClampKind, i64)>,
}

impl SubConsts {
    /// Resolve `e` under `dim` (the size of a dim, `None` when unbound); `Err` says why not.
    pub fn resolve(e: &IndexExpr, dim: &dyn Fn(&Dim) -> Option<u64>) -> Result<SubConsts, String> {
        match SubConsts::resolve_partly(e, dim)? {
            (sc, rest) if rest.is_empty() => Ok(sc),
            (_, rest) => Err(format!(
                "the subscript `{e}` of a captured tensor needs the dim {} bound at compile time",
                rest[0].0
            )),
        }
    }

    /// [`SubConsts::resolve`] leaving the dim terms whose dim is unbound, `(dim, coefficient)`,
    /// to be added at run time (the GPU passes them as kernel arguments); the divisor must be
    /// bound.
    pub fn resolve_partly(
        e: &IndexExpr,
        dim: &dyn Fn(&Dim) -> Option<u64>,
    ) -> Result<(SubConsts, Vec<(Dim, i64)>), String> {
        let overflow = || format!("the subscript `{e}` of a captured tensor overflows");
        let mut offset = e.constant;
        let mut rest = vec![];
        for (d, k) in &e.dim_terms {
            match dim(d) {
                Some(v) => {
                    let v = i64::try_from(v).map_err(|_| overflow())?;
                    offset = v.checked_mul(*k).and_then(|x| x.checked_add(offset)).ok_or_else(overflow)?;
                }
                None => rest.push((d.clone(), *k)),
            }
        }
        let div = match &e.div {
            None => None,
            Some(d) => {
                let v = dim(d).ok_or_else(|| {
                    format!("the divisor {d} of a captured tensor's subscript is not bound")
                })?;
                Some(
                    i64::try_from(v)
                        .ok()
                        .filter(|v| *v > 0)
                        .ok_or_else(|| format!("a captured tensor's subscript divides by {d} = {v}"))?,
                )
            }
        };
        let mut clamps = vec![];
        for c in &e.clamps {
            let b = c.bound(&|s| dim(&Dim::sym(s))).ok_or_else(|| {
                format!("the clamp of the subscript `{e}` of a captured tensor needs its dims bound at compile time")
            })?;
            clamps.push((c.kind, b));
        }
        Ok((SubConsts { offset, div, clamps }, rest))
    }
}

/// Whether a read at `index` (its subscripts resolved to `subs`, the last axis `last` long)
/// takes `lanes` consecutive elements of the last axis for `lanes` columns `j0 + e` with `j0` a
/// multiple of `lanes`, all inside the axis or all outside it: `j` only in the last subscript, as
/// `j + c` with no division or clamp, `c` and `last` multiples of `lanes`. Both backends then read
/// the group with one vector load.
pub fn contiguous_in_j(index: &[IndexExpr], subs: &[SubConsts], last: u64, lanes: u64) -> bool {
    let j = IndexVar::J.name();
    let (Some((e, rest)), Some(sub)) = (index.split_last(), subs.last()) else {
        return false;
    };
    let reads_j = |e: &IndexExpr| e.terms.iter().any(|(v, _)| v == j);
    matches!(e.terms.as_slice(), [(v, 1)] if v == j)
        && !rest.iter().any(reads_j)
        && sub.div.is_none()
        && sub.clamps.is_empty()
        && sub.offset % lanes as i64 == 0
        && last.is_multiple_of(lanes)
}
