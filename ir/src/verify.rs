//! The graph verifier, run after lowering and after every pass.
//!
//! Checks: the output is set and present; parameters and their nodes agree; every edge weight is
//! an operand position and the positions of a node are exactly `0..arity`; the graph is acyclic;
//! every node's type is the one [`crate::check::infer`] derives from its operands (which covers
//! named-axis broadcasting, reductions, `bind`/`store` axis counts, dtypes and the fused ops'
//! shapes of docs/SEMANTICS.md), with the node-typed ops (`param`, `iota`, `cast`) checked here.

use crate::check::infer;
use crate::graph::{Graph, ValueId};
use crate::ops::{GateKind, Op};
use crate::print::print_graph;
use crate::types::{DType, ValueType};
use petgraph::Direction;
use std::fmt;

/// Why a graph is malformed: the offending node (if any) and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifyError {
    /// The node, as its mnemonic and the DSL name if it has one (`store [b, h, t] (c)`).
    pub node: Option<String>,
    pub message: String,
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.node {
            Some(n) => write!(f, "invalid IR at `{n}`: {}", self.message),
            None => write!(f, "invalid IR: {}", self.message),
        }
    }
}

impl std::error::Error for VerifyError {}

fn describe(g: &Graph, id: ValueId) -> String {
    let n = g.node(id);
    match &n.name {
        Some(name) => format!("{} : {} ({name})", n.op, n.ty),
        None => format!("{} : {}", n.op, n.ty),
    }
}

fn err(g: &Graph, id: ValueId, message: String) -> VerifyError {
    VerifyError { node: Some(describe(g, id)), message }
}

/// Check that `g` is a well-formed, well-typed graph.
pub fn verify(g: &Graph) -> Result<(), VerifyError> {
    let global = |m: String| VerifyError { node: None, message: m };
    let out = g.output.ok_or_else(|| global("the graph has no output".into()))?;
    if !g.g.contains_node(out) {
        return Err(global("the output is not a node of the graph".into()));
    }
    for (n, p) in g.params.iter().enumerate() {
        if !g.g.contains_node(p.node) {
            return Err(global(format!("parameter `{}` has no node", p.name)));
        }
        match g.op(p.node) {
            Op::Param { name, index } if *name == p.name && *index == n => {}
            _ => return Err(err(g, p.node, format!("is not the node of parameter #{n} `{}`", p.name))),
        }
        if *g.ty(p.node) != p.ty {
            return Err(err(g, p.node, format!("type differs from parameter `{}`: {}", p.name, p.ty)));
        }
        if !p.ty.is_positional() {
            return Err(err(g, p.node, "parameters must have positional axes".into()));
        }
        if let Some((lo, hi)) = p.range {
            if lo.is_nan() || hi.is_nan() || lo > hi {
                return Err(err(g, p.node, format!("empty declared range [{lo}, {hi}]")));
            }
        }
    }
    let order = g.topo_order();
    if order.len() != g.g.node_count() {
        return Err(global("the graph has a cycle".into()));
    }
    for &id in &order {
        let node = g.node(id);
        // Operand positions: exactly 0..n, each once.
        let mut ks: Vec<u32> = g.g.edges_directed(id, Direction::Incoming).map(|e| *e.weight()).collect();
        ks.sort_unstable();
        if ks.iter().enumerate().any(|(i, &k)| k as usize != i) {
            return Err(err(g, id, format!("operand positions {ks:?} are not 0..{}", ks.len())));
        }
        if let Some(n) = node.op.arity() {
            if ks.len() != n {
                return Err(err(
                    g,
                    id,
                    format!("has {} operands, `{}` takes {n}", ks.len(), node.op.mnemonic()),
                ));
            }
        }
        let operands = g.operands(id);
        let tys: Vec<&ValueType> = operands.iter().map(|&o| g.ty(o)).collect();
        let inferred = infer(&node.op, &tys).map_err(|m| err(g, id, m))?;
        match (&node.op, inferred) {
            (_, Some(t)) => {
                if t != node.ty {
                    return Err(err(g, id, format!("type should be {t}")));
                }
            }
            (Op::Param { name, index }, None) => match g.params.get(*index) {
                Some(p) if p.node == id && p.name == *name => {}
                _ => return Err(err(g, id, format!("not registered as parameter #{index}"))),
            },
            (Op::Iota { axis }, None) => {
                let ok = node.ty.dtype == DType::F32 && node.ty.rank() == 1 && node.ty.axes[0].name == *axis;
                if !ok {
                    return Err(err(g, id, format!("iota must be f32 with the single axis `{axis}`")));
                }
            }
            (Op::Cast, None) => {
                if node.ty.axes != tys[0].axes {
                    return Err(err(g, id, format!("cast changes the axes of {}", tys[0])));
                }
                if node.ty.dtype == DType::Bool || tys[0].dtype == DType::Bool {
                    return Err(err(g, id, "cast from or to bool".into()));
                }
            }
            (Op::GateCumsum { kind: GateKind::Slope }, None) => {
                let ok = node.ty.dtype == DType::F32
                    && node.ty.is_positional()
                    && node.ty.rank() == 3
                    && node.ty.axes[1].dim == tys[0].axes[0].dim;
                if !ok {
                    return Err(err(g, id, format!("gate_cumsum of slope {} must be f32 [B, H, T]", tys[0])));
                }
            }
            (op, None) => return Err(err(g, id, format!("no typing rule for `{}`", op.mnemonic()))),
        }
    }
    Ok(())
}

/// Verify, and on failure append the printed graph (for pass debugging and internal errors).
pub fn verify_verbose(g: &Graph) -> Result<(), String> {
    verify(g).map_err(|e| format!("{e}\n{}", print_graph(g)))
}
