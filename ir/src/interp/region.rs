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
use crate::attention::{eval_index, IndexVar, RNode, Region};
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
    /// The dims an index expression divides by, resolved (`None`: unbound).
    dim: &'a dyn Fn(&Dim) -> Option<u64>,
    /// `(x, n)` of each product by a count ([`Region::count_product`]), by node position.
    count_products: Vec<Option<(u32, u32)>>,
    buf: Vec<f64>,
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
        Ok(RegionEval { region, captures, dims, dim, count_products, buf: vec![0.0; region.nodes.len()] })
    }

    /// The region's value at entry `[b, h, i, j]` with score `x`.
    pub fn eval(&mut self, x: f64, at: [usize; 4]) -> f64 {
        let var = |v: &str| IndexVar::from_name(v).map(|v| at[v as usize] as i64);
        for n in 0..self.region.nodes.len() {
            let b = &self.buf;
            let val = match &self.region.nodes[n] {
                RNode::Score => x,
                RNode::Index(v) => at[*v as usize] as f64,
                RNode::Dim(_) => self.dims[n],
                RNode::Const(c) => *c,
                RNode::Capture { k, index } => self.read(*k, index, &var),
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

    fn read(&self, k: usize, index: &[crate::index::IndexExpr], var: &dyn Fn(&str) -> Option<i64>) -> f64 {
        let c = &self.captures[k];
        let mut off = 0usize;
        for (e, &n) in index.iter().zip(c.shape) {
            match eval_index(e, var, self.dim) {
                Some(p) if p >= 0 && (p as usize) < n => off = off * n + p as usize,
                _ => return f64::NAN,
            }
        }
        c.data[off]
    }
}
