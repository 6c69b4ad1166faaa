//! The graph IR: a petgraph DAG of typed ops.
//!
//! Nodes are values (an op, its result type, the source span it came from, and an optional
//! name from the DSL). Edge `src -> dst` with weight `k` says that `src` is operand `k` of
//! `dst`. A graph has ordered tensor parameters and exactly one output.

use crate::ops::Op;
use crate::types::{Span, ValueType};
use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use petgraph::visit::{EdgeRef, IntoEdgeReferences};
use petgraph::Direction;

pub use petgraph::stable_graph::NodeIndex as ValueId;

/// One value of the graph.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub op: Op,
    pub ty: ValueType,
    /// Where in the source this value came from (for diagnostics and `--explain`).
    pub span: Span,
    /// The DSL name of a statement result (`c`, `s`, `out`), if it is one.
    pub name: Option<String>,
}

/// A tensor parameter of the graph as declared in the DSL.
#[derive(Clone, Debug, PartialEq)]
pub struct Param {
    pub name: String,
    pub ty: ValueType,
    pub node: ValueId,
    /// Declared value range `in [lo, hi]` (the analysis may rely on it; the runtime checks it).
    pub range: Option<(f64, f64)>,
}

#[derive(Clone, Debug)]
pub struct Graph {
    pub name: String,
    pub g: StableDiGraph<Node, u32>,
    pub params: Vec<Param>,
    pub output: Option<ValueId>,
    /// Symbolic dimension names in order of first appearance in the signature.
    pub dims: Vec<String>,
}

impl Graph {
    pub fn new(name: &str) -> Graph {
        Graph { name: name.to_string(), g: StableDiGraph::new(), params: vec![], output: None, dims: vec![] }
    }

    /// Add a value computed by `op` from `operands`.
    pub fn add(&mut self, op: Op, ty: ValueType, operands: &[ValueId], span: Span) -> ValueId {
        let id = self.g.add_node(Node { op, ty, span, name: None });
        for (k, &o) in operands.iter().enumerate() {
            self.g.add_edge(o, id, k as u32);
        }
        id
    }

    /// Add a tensor parameter (positional axes).
    pub fn add_param(&mut self, name: &str, ty: ValueType, span: Span) -> ValueId {
        let index = self.params.len();
        let id = self.add(Op::Param { name: name.to_string(), index }, ty.clone(), &[], span);
        self.params.push(Param { name: name.to_string(), ty, node: id, range: None });
        id
    }

    /// Add a tensor parameter whose values are declared to lie in `[lo, hi]`.
    pub fn add_param_in(&mut self, name: &str, ty: ValueType, range: (f64, f64), span: Span) -> ValueId {
        let id = self.add_param(name, ty, span);
        self.params.last_mut().expect("just pushed").range = Some(range);
        id
    }

    pub fn node(&self, id: ValueId) -> &Node {
        &self.g[id]
    }

    pub fn node_mut(&mut self, id: ValueId) -> &mut Node {
        &mut self.g[id]
    }

    pub fn op(&self, id: ValueId) -> &Op {
        &self.g[id].op
    }

    pub fn ty(&self, id: ValueId) -> &ValueType {
        &self.g[id].ty
    }

    /// Operands of `id` in order.
    pub fn operands(&self, id: ValueId) -> Vec<ValueId> {
        let mut es: Vec<(u32, ValueId)> =
            self.g.edges_directed(id, Direction::Incoming).map(|e| (*e.weight(), e.source())).collect();
        es.sort_by_key(|(k, _)| *k);
        es.into_iter().map(|(_, s)| s).collect()
    }

    /// Values that use `id` as an operand.
    pub fn users(&self, id: ValueId) -> Vec<ValueId> {
        let mut u: Vec<ValueId> = self.g.neighbors_directed(id, Direction::Outgoing).collect();
        u.sort();
        u.dedup();
        u
    }

    /// Replace every use of `old` by `new` (the output too).
    pub fn replace_all_uses(&mut self, old: ValueId, new: ValueId) {
        let uses: Vec<(petgraph::stable_graph::EdgeIndex, ValueId, u32)> = self
            .g
            .edges_directed(old, Direction::Outgoing)
            .map(|e| (e.id(), e.target(), *e.weight()))
            .collect();
        for (e, dst, k) in uses {
            self.g.remove_edge(e);
            self.g.add_edge(new, dst, k);
        }
        if self.output == Some(old) {
            self.output = Some(new);
        }
    }

    /// Nodes in a deterministic topological order (ties broken by node index).
    pub fn topo_order(&self) -> Vec<ValueId> {
        let mut indeg: std::collections::BTreeMap<ValueId, usize> =
            self.g.node_indices().map(|n| (n, 0)).collect();
        for e in self.g.edge_references() {
            *indeg.get_mut(&e.target()).unwrap() += 1;
        }
        let mut ready: std::collections::BTreeSet<ValueId> =
            indeg.iter().filter(|(_, &d)| d == 0).map(|(&n, _)| n).collect();
        let mut order = Vec::with_capacity(indeg.len());
        while let Some(n) = ready.pop_first() {
            order.push(n);
            for m in self.g.neighbors_directed(n, Direction::Outgoing) {
                let d = indeg.get_mut(&m).unwrap();
                *d -= 1;
                if *d == 0 {
                    ready.insert(m);
                }
            }
        }
        order
    }

    /// Remove every node the output does not depend on (parameters always stay).
    pub fn remove_dead(&mut self) {
        let mut live = std::collections::HashSet::new();
        let mut stack: Vec<ValueId> = self.output.into_iter().collect();
        stack.extend(self.params.iter().map(|p| p.node));
        while let Some(n) = stack.pop() {
            if live.insert(n) {
                stack.extend(self.g.neighbors_directed(n, Direction::Incoming));
            }
        }
        let dead: Vec<ValueId> = self.g.node_indices().filter(|n| !live.contains(n)).collect();
        for n in dead {
            self.g.remove_node(n);
        }
    }

    /// Nodes whose op satisfies `pred`, in topological order.
    pub fn find(&self, pred: impl Fn(&Op) -> bool) -> Vec<ValueId> {
        self.topo_order().into_iter().filter(|&n| pred(&self.g[n].op)).collect()
    }

    pub fn param(&self, name: &str) -> Option<&Param> {
        self.params.iter().find(|p| p.name == name)
    }
}

pub type NodeIdx = NodeIndex;
