//! Binding symbolic dimensions (`B`, `H`, `T`, `D`, ...) to concrete sizes from the shapes of
//! the tensors a user supplies, and resolving value types to concrete shapes.
//!
//! Binding walks the parameters in declaration order, so the first parameter that mentions a
//! dimension fixes it and every later mismatch names both the offending tensor and the one that
//! fixed the size.

use crate::graph::Graph;
use crate::types::{Dim, ValueType};
use std::collections::BTreeMap;
use std::fmt;

/// Concrete sizes of the symbolic dimensions of a graph.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DimBindings(pub BTreeMap<String, u64>);

impl DimBindings {
    pub fn get(&self, dim: &str) -> Option<u64> {
        self.0.get(dim).copied()
    }

    /// Resolve one dimension.
    pub fn eval(&self, dim: &Dim) -> Option<u64> {
        dim.eval(&|s| self.get(s))
    }
}

impl fmt::Display for DimBindings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(|(k, v)| format!("{k}={v}")).collect();
        f.write_str(&parts.join(","))
    }
}

/// A user-facing shape error; the message names the tensor, the axis and both sizes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    #[error("tensor `{tensor}` has rank {got} (shape {shape:?}), but it is declared with rank {expected} ({declared})")]
    RankMismatch { tensor: String, expected: usize, got: usize, shape: Vec<usize>, declared: String },
    #[error(
        "tensor `{tensor}` axis {axis} ({dim}) has size {got}, but {dim} = {bound} was already fixed by tensor `{bound_by}` axis {bound_axis}"
    )]
    Conflict {
        tensor: String,
        axis: usize,
        dim: String,
        got: u64,
        bound: u64,
        bound_by: String,
        bound_axis: usize,
    },
    #[error("tensor `{tensor}` axis {axis} has size {got}, but it is declared as {dim} = {expected}")]
    FixedMismatch { tensor: String, axis: usize, dim: String, expected: u64, got: u64 },
    #[error("tensor `{tensor}` is missing: graph `{graph}` declares it as {declared}")]
    Missing { tensor: String, graph: String, declared: String },
    #[error(
        "unknown tensor `{tensor}`: graph `{graph}` has no parameter of that name (parameters: {known})"
    )]
    Unknown { tensor: String, graph: String, known: String },
    #[error("tensor `{tensor}` is given twice")]
    Duplicate { tensor: String },
    #[error(
        "dimension {dim} is not bound (no input tensor fixes it); pass it explicitly, e.g. --shape {dim}=64"
    )]
    Unbound { dim: String },
}

/// Bind every symbolic dimension of `g` from the concrete shapes of all its parameters.
///
/// Every parameter must be present exactly once and no other name may appear.
pub fn bind_dims(g: &Graph, shapes: &[(String, Vec<usize>)]) -> Result<DimBindings, ShapeError> {
    bind_dims_with(g, shapes, false)
}

/// As [`bind_dims`], but parameters absent from `shapes` are skipped (the reference interpreter's
/// [`crate::interp::eval`] needs only the parameters its targets depend on).
pub fn bind_dims_partial(g: &Graph, shapes: &[(String, Vec<usize>)]) -> Result<DimBindings, ShapeError> {
    bind_dims_with(g, shapes, true)
}

fn bind_dims_with(
    g: &Graph,
    shapes: &[(String, Vec<usize>)],
    allow_missing: bool,
) -> Result<DimBindings, ShapeError> {
    let mut given: BTreeMap<&str, &[usize]> = BTreeMap::new();
    for (name, shape) in shapes {
        if g.param(name).is_none() {
            let known: Vec<&str> = g.params.iter().map(|p| p.name.as_str()).collect();
            return Err(ShapeError::Unknown {
                tensor: name.clone(),
                graph: g.name.clone(),
                known: known.join(", "),
            });
        }
        if given.insert(name.as_str(), shape.as_slice()).is_some() {
            return Err(ShapeError::Duplicate { tensor: name.clone() });
        }
    }
    // dim name -> (size, tensor, axis) of its first binding
    let mut bound: BTreeMap<String, (u64, String, usize)> = BTreeMap::new();
    let mut present = Vec::new();
    for p in &g.params {
        let Some(shape) = given.get(p.name.as_str()) else {
            if allow_missing {
                continue;
            }
            return Err(ShapeError::Missing {
                tensor: p.name.clone(),
                graph: g.name.clone(),
                declared: p.ty.to_string(),
            });
        };
        if shape.len() != p.ty.rank() {
            return Err(ShapeError::RankMismatch {
                tensor: p.name.clone(),
                expected: p.ty.rank(),
                got: shape.len(),
                shape: shape.to_vec(),
                declared: p.ty.to_string(),
            });
        }
        for (axis, (dim, &size)) in p.ty.dims().zip(shape.iter()).enumerate() {
            if let Dim::Sym(s) = dim {
                let size = size as u64;
                match bound.get(s) {
                    Some((b, by, bax)) if *b != size => {
                        return Err(ShapeError::Conflict {
                            tensor: p.name.clone(),
                            axis,
                            dim: s.clone(),
                            got: size,
                            bound: *b,
                            bound_by: by.clone(),
                            bound_axis: *bax,
                        })
                    }
                    Some(_) => {}
                    None => {
                        bound.insert(s.clone(), (size, p.name.clone(), axis));
                    }
                }
            }
        }
        present.push((p, *shape));
    }
    let b = DimBindings(bound.into_iter().map(|(k, (v, _, _))| (k, v)).collect());
    // Constant and tile-count axes are checked once every symbol is known.
    for (p, shape) in present {
        for (axis, (dim, &size)) in p.ty.dims().zip(shape.iter()).enumerate() {
            if matches!(dim, Dim::Sym(_)) {
                continue;
            }
            let expected = b.eval(dim).ok_or_else(|| ShapeError::Unbound { dim: dim.to_string() })?;
            if expected != size as u64 {
                return Err(ShapeError::FixedMismatch {
                    tensor: p.name.clone(),
                    axis,
                    dim: dim.to_string(),
                    expected,
                    got: size as u64,
                });
            }
        }
    }
    Ok(b)
}

/// The concrete shape of a value of type `ty` (axes in order).
pub fn concrete_shape(ty: &ValueType, b: &DimBindings) -> Result<Vec<usize>, ShapeError> {
    ty.dims()
        .map(|d| {
            b.eval(d).map(|v| v as usize).ok_or_else(|| ShapeError::Unbound { dim: first_unbound(d, b) })
        })
        .collect()
}

fn first_unbound(d: &Dim, b: &DimBindings) -> String {
    match d {
        Dim::Sym(s) => s.clone(),
        Dim::Const(c) => c.to_string(),
        Dim::Tiles(base, _) => {
            if b.eval(base).is_none() {
                first_unbound(base, b)
            } else {
                d.to_string()
            }
        }
        Dim::Div(x, y) => {
            if b.eval(x).is_none() {
                first_unbound(x, b)
            } else if b.eval(y).is_none() {
                first_unbound(y, b)
            } else {
                d.to_string()
            }
        }
    }
}
