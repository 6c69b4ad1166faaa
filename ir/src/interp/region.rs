//! Evaluation of an attention [`Region`] at one score entry, in f64: THE definition of what a
//! region means (backends emit the same node by node; tests compare against this).
//!
//! - `Score` is the scaled product `x` of the entry; `Index` the entry's `b, h, i, j`; `Dim` the
//!   bound size; unary and binary nodes are the interpreter's elementwise ops (comparisons give
//!   1 / 0, `select` takes its second operand where the condition is non-zero, NaN included).
//! - A capture read whose index is outside the tensor gives NaN: the DSL rejects such reads at
//!   check time unless the mask makes them unreachable, and masked entries are never evaluated,
//!   so a NaN here means the program broke that rule (the run's NaN check reports it).

use super::{binary, mul_by_count, unary};
use crate::attention::{IndexVar, RNode, Region};
use crate::index::{Clamp, IndexExpr};
use crate::types::Dim;

/// A captured tensor: its concrete shape and row-major data.
#[derive(Clone, Copy, Debug)]
pub struct Capture<'a> {
    pub shape: &'a [usize],
    pub data: &'a [f64],
}

/// Evaluates one region at many entries (reuses its buffer; dims resolved once).
pub struct RegionEval<'a> {
    region: &'a Region,
    captures: &'a [Capture<'a>],
    /// Value of each `RNode::Dim` (by node position; 0 elsewhere).
    dims: Vec<f64>,
    /// `(x, n)` of each product by a count ([`Region::count_product`]), by node position.
    count_products: Vec<Option<(u32, u32)>>,
    /// Each capture read with its dims bound, by node position (`None` elsewhere).
    reads: Vec<Option<CaptureRead<'a>>>,
    buf: Vec<f64>,
}

/// A read of a captured tensor, `k[index]`, with the subscripts' dims bound once.
#[derive(Clone, Debug)]
pub(super) struct CaptureRead<'a> {
    subs: Vec<Option<BoundSub<'a>>>,
}

impl<'a> CaptureRead<'a> {
    pub(super) fn new(index: &'a [IndexExpr], dim: &dyn Fn(&Dim) -> Option<u64>) -> CaptureRead<'a> {
        let sym = |s: &str| dim(&Dim::sym(s));
        CaptureRead { subs: index.iter().map(|e| BoundSub::new(e, &sym)).collect() }
    }

    /// The flat position of the read in `cap` at entry `at`; `None` outside the tensor.
    pub(super) fn offset(&self, cap: &Capture, at: [usize; 4]) -> Option<usize> {
        let mut off = 0usize;
        for (e, &n) in self.subs.iter().zip(cap.shape) {
            match e.as_ref()?.at(at)? {
                p if p >= 0 && (p as usize) < n => off = off * n + p as usize,
                _ => return None,
            }
        }
        Some(off)
    }
}

/// A capture's subscript with its dims bound once: [`IndexExpr::eval`] (as
/// [`crate::attention::eval_index`] calls it) at every entry, without resolving names and dims
/// again. `None` (in [`RegionEval`]) where the subscript has no value at any entry: an unbound
/// dim, an overflow of its dim terms, a divisor that is not positive, or a variable other than
/// `b, h, i, j` with a non-zero coefficient; the read is then NaN.
#[derive(Clone, Debug)]
struct BoundSub<'a> {
    offset: i64,
    /// `(entry axis, coefficient)` of the terms in order, zero coefficients left out (they add 0).
    terms: Vec<(usize, i64)>,
    div: Option<i64>,
    clamps: Vec<(&'a Clamp, i64)>,
}

impl<'a> BoundSub<'a> {
    fn new(e: &'a IndexExpr, dims: &dyn Fn(&str) -> Option<u64>) -> Option<BoundSub<'a>> {
        let offset = e.offset(dims)?;
        let terms = e
            .terms
            .iter()
            .filter(|(_, c)| *c != 0)
            .map(|(v, c)| IndexVar::from_name(v).map(|v| (v as usize, *c)))
            .collect::<Option<Vec<_>>>()?;
        let div = match &e.div {
            None => None,
            Some(d) => Some(i64::try_from(d.eval(dims)?).ok().filter(|d| *d > 0)?),
        };
        let clamps = e.clamps.iter().map(|c| Some((c, c.bound(dims)?))).collect::<Option<Vec<_>>>()?;
        Some(BoundSub { offset, terms, div, clamps })
    }

    /// The subscript at entry `at` (`None` on overflow).
    fn at(&self, at: [usize; 4]) -> Option<i64> {
        let mut s = self.offset;
        for &(v, c) in &self.terms {
            s = s.checked_add(c.checked_mul(at[v] as i64)?)?;
        }
        let mut x = match self.div {
            None => s,
            Some(d) => s.div_euclid(d),
        };
        for &(c, bound) in &self.clamps {
            x = c.apply(x, bound);
        }
        Some(x)
    }
}

impl<'a> RegionEval<'a> {
    /// Fails when a dim of the region is not bound or a capture is missing.
    pub fn new(
        region: &'a Region,
        captures: &'a [Capture<'a>],
        dim: &'a dyn Fn(&Dim) -> Option<u64>,
    ) -> Result<RegionEval<'a>, String> {
        if let Some(m) = region.malformed() {
            return Err(m);
        }
        let mut dims = vec![0.0; region.nodes.len()];
        for (n, node) in region.nodes.iter().enumerate() {
            match node {
                RNode::Dim(d) => dims[n] = dim(d).ok_or_else(|| format!("dim {d} is not bound"))? as f64,
                RNode::Capture { k, index } => {
                    let c = captures.get(*k).ok_or_else(|| format!("capture {k} is not an operand"))?;
                    if c.shape.len() != index.len() {
                        return Err(format!(
                            "capture {k} has rank {}, read with {} subscripts",
                            c.shape.len(),
                            index.len()
                        ));
                    }
                }
                _ => {}
            }
        }
        let counts = region.counts();
        let count_products = region.nodes.iter().map(|n| region.count_product(n, &counts)).collect();
        let reads = region
            .nodes
            .iter()
            .map(|node| match node {
                RNode::Capture { index, .. } => Some(CaptureRead::new(index, dim)),
                _ => None,
            })
            .collect();
        Ok(RegionEval { region, captures, dims, count_products, reads, buf: vec![0.0; region.nodes.len()] })
    }

    /// The region's value at entry `[b, h, i, j]` with score `x`.
    pub fn eval(&mut self, x: f64, at: [usize; 4]) -> f64 {
        for n in 0..self.region.nodes.len() {
            let b = &self.buf;
            let val = match &self.region.nodes[n] {
                RNode::Score => x,
                RNode::Index(v) => at[*v as usize] as f64,
                RNode::Dim(_) => self.dims[n],
                RNode::Const(c) => *c,
                RNode::Capture { k, .. } => {
                    let c = &self.captures[*k];
                    self.reads[n].as_ref().and_then(|r| r.offset(c, at)).map_or(f64::NAN, |o| c.data[o])
                }
                RNode::Unary(u, a) => unary(*u, b[*a as usize]),
                RNode::Binary(op, a, c) => match self.count_products[n] {
                    Some((x, k)) => mul_by_count(b[x as usize], b[k as usize]),
                    None => binary(*op, b[*a as usize], b[*c as usize]),
                },
                RNode::Select(c, a, e) => {
                    if b[*c as usize] != 0.0 {
                        b[*a as usize]
                    } else {
                        b[*e as usize]
                    }
                }
            };
            self.buf[n] = val;
        }
        self.buf[self.region.root as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::{Capture, CaptureRead};
    use crate::attention::{eval_index, IndexVar};
    use crate::index::{Clamp, ClampKind, IndexExpr};
    use crate::types::Dim;
    use proptest::prelude::*;

    /// A subscript of the index variables (and one unknown name), dims `N` (bound) and `U`
    /// (unbound), a divisor and clamps: every part [`IndexExpr::eval`] reads.
    fn subscript() -> impl Strategy<Value = IndexExpr> {
        let var = prop::sample::select(vec!["b", "h", "i", "j", "z"]);
        let dim = prop::sample::select(vec![Dim::sym("N"), Dim::sym("U"), Dim::Const(3)]);
        let clamp = (any::<bool>(), prop::collection::vec((dim.clone(), -2i64..3), 0..2), -20i64..20)
            .prop_map(|(min, dim_terms, constant)| Clamp {
                kind: if min { ClampKind::Min } else { ClampKind::Max },
                dim_terms,
                constant,
            });
        (
            prop::collection::vec((var.prop_map(String::from), -3i64..4), 0..4),
            prop::collection::vec((dim.clone(), -2i64..3), 0..2),
            -40i64..40,
            prop::option::of(prop::sample::select(vec![
                Dim::sym("N"),
                Dim::sym("U"),
                Dim::Const(2),
                Dim::Const(0),
            ])),
            prop::collection::vec(clamp, 0..2),
        )
            .prop_map(|(terms, dim_terms, constant, div, clamps)| IndexExpr {
                terms,
                dim_terms,
                constant,
                div,
                clamps,
            })
    }

    proptest! {
        /// A read with its dims bound once is at the offset `eval_index` gives, NaN (`None`)
        /// where it does: the interpreter's capture reads keep their definition.
        #[test]
        fn a_bound_read_is_where_eval_index_puts_it(
            index in prop::collection::vec(subscript(), 1..3),
            at in prop::array::uniform4(0usize..12),
            sizes in prop::collection::vec(1usize..30, 2),
        ) {
            let dim = |d: &Dim| d.eval(&|s| (s == "N").then_some(5));
            let shape = &sizes[..index.len()];
            let data = vec![0.0; shape.iter().product()];
            let cap = Capture { shape, data: &data };
            let var = |v: &str| IndexVar::from_name(v).map(|v| at[v as usize] as i64);
            let mut want = Some(0usize);
            for (e, &n) in index.iter().zip(shape) {
                want = match (want, eval_index(e, &var, &dim)) {
                    (Some(off), Some(p)) if p >= 0 && (p as usize) < n => Some(off * n + p as usize),
                    _ => None,
                };
            }
            prop_assert_eq!(CaptureRead::new(&index, &dim).offset(&cap, at), want);
        }
    }
}
