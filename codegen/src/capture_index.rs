//! The numbers of a captured tensor's subscript once the dims are bound: both backends emit
//! `floor((sum c*v + offset) / div)` from these, with `offset` the constant plus the dim terms
//! (`i + M - N`) and `div` the divisor.

use foxc_ir::index::IndexExpr;
use foxc_ir::Dim;

/// One resolved subscript (see the module doc); `div` is `None` when it does not divide.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SubConsts {
    pub offset: i64,
    pub div: Option<i64>,
}

impl SubConsts {
    /// Resolve `e` under `dim` (the size of a dim, `None` when unbound); `Err` says why not.
    pub fn resolve(e: &IndexExpr, dim: &dyn Fn(&Dim) -> Option<u64>) -> Result<SubConsts, String> {
        let offset = e.offset(&|s| dim(&Dim::sym(s))).ok_or_else(|| {
            format!("the subscript `{e}` of a captured tensor has an unbound dim or overflows")
        })?;
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
        Ok(SubConsts { offset, div })
    }
}
