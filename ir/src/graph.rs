//! The graph IR: a petgraph DAG of typed ops.
//!
//! Nodes are values (an op, its result types, the source span it came from, and an optional
//! name from the DSL). Most ops have one result; a few (attention: `out`, `lse`) have more.
//! Edge `src -> dst` with weight [`Use`] `{ pos: k, result: r }` says that result `r` of `src`
//! is operand `k` of `dst`. A graph has ordered tensor parameters and exactly one output.
//!
//! Single-result code never sees results: a [`ValueId`] names a node and, where a value is
//! meant, its result 0 (`ty`, `add`, `operands`, `users`). Results above 0 go through
//! [`Value`] and the `*_results` / `result_*` functions.

use crate::index::IndexExpr;
use crate::ops::Op;
use crate::types::{DType, Dim, Span, ValueType};
use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use petgraph::visit::{EdgeRef, IntoEdgeReferences};
use petgraph::Direction;

pub use petgraph::stable_graph::NodeIndex as ValueId;

/// One result of a node: `%5` is `Value { node: 5, result: 0 }`, `%5#1` its second result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Value {
    pub node: ValueId,
    pub result: u32,
}

impl Value {
    /// Result 0 of `node`.
    pub fn of(node: ValueId) -> Value {
        Value { node, result: 0 }
    }
}

impl From<ValueId> for Value {
    fn from(node: ValueId) -> Value {
        Value::of(node)
    }
}

/// The weight of an edge: result `result` of the source is operand `pos` of the target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Use {
    pub pos: u32,
    pub result: u32,
}

/// One node of the graph.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub op: Op,
    /// The type of result 0.
    pub ty: ValueType,
    /// The types of results 1, 2, ... (empty for single-result ops).
    pub more: Vec<ValueType>,
    /// Where in the source this value came from (for diagnostics and `--explain`).
    pub span: Span,
    /// The DSL name of a statement result (`c`, `s`, `out`), if it is one.
    pub name: Option<String>,
    /// Computed inside each user's loop, with no buffer and no loop of its own: the
    /// `fuse-loops` pass's decision (docs/SEMANTICS.md, "inline"); printed `inline` before the
    /// op.
    pub inline: bool,
}

/// A tensor parameter of the graph as declared in the DSL.
#[derive(Clone, Debug, PartialEq)]
pub struct Param {
    pub name: String,
    pub ty: ValueType,
    /// `Some(I64)` for an `i64` parameter: callers pass i64, whose values enter the graph as
    /// `ty`'s I32 narrowed the way `interp::cast(I32, x)` narrows (saturating: every comparison
    /// with an index, which is below 2^31, keeps its truth). `None`: stored as typed.
    pub storage: Option<DType>,
    pub node: ValueId,
    /// Declared value range `in [lo, hi]` (the analysis may rely on it; the runtime checks it).
    pub range: Option<(f64, f64)>,
    /// `nonincreasing along DIM`: the axis along which the values never grow (the analysis may
    /// rely on it, a decay cumsum given as a parameter; the driver checks it on host inputs).
    pub nonincreasing: Option<usize>,
}

impl Param {
    /// The dtype callers pass ([`Param::storage`], else the value type's).
    pub fn stored(&self) -> DType {
        self.storage.unwrap_or(self.ty.dtype)
    }
}

/// A subscript that stays in its axis for some sizes of the dims but could not be proven to for
/// all (`c[b, h, i + M - N]` needs `M >= N`; `r[a, 7]` needs `A > 7`): the front end records it
/// and the inputs are checked against it once the dims are bound (`foxc_driver::validate`).
#[derive(Clone, Debug, PartialEq)]
pub struct SubscriptBound {
    /// The tensor read, as the source names it.
    pub tensor: String,
    /// Its axis the subscript indexes, and that axis' size.
    pub axis: usize,
    pub size: Dim,
    pub index: IndexExpr,
    /// The size of each index variable of `index`.
    pub vars: Vec<(String, Dim)>,
    pub span: Span,
}

impl SubscriptBound {
    /// `Ok` when the subscript stays in `[0, size)` for every value of its variables under the
    /// bindings `dims`; else the range it takes and the axis size (`None` when some dim is
    /// unbound or the arithmetic overflows: the caller reports it as out of range).
    pub fn holds(&self, dims: &dyn Fn(&str) -> Option<u64>) -> Result<(), Option<(i64, i64, u64)>> {
        let mut ranges = Vec::with_capacity(self.vars.len());
        for (v, d) in &self.vars {
            match d.eval(dims) {
                Some(0) => return Ok(()), // no entry reads it
                Some(n) => ranges.push((v.as_str(), (0, i64::try_from(n - 1).map_err(|_| None)?))),
                None => return Err(None),
            }
        }
        let range = |v: &str| ranges.iter().find(|(w, _)| *w == v).map_or((0, 0), |(_, r)| *r);
        let size = self.size.eval(dims).ok_or(None)?;
        let (lo, hi) = self.index.range(&range, dims).ok_or(None)?;
        if lo >= 0 && u64::try_from(hi).is_ok_and(|h| h < size) {
            Ok(())
        } else {
            Err(Some((lo, hi, size)))
        }
    }
}

#[derive(Clone, Debug)]
pub struct Graph {
    pub name: String,
    pub g: StableDiGraph<Node, Use>,
    pub params: Vec<Param>,
    pub output: Option<ValueId>,
    /// Symbolic dimension names in order of first appearance in the signature.
    pub dims: Vec<String>,
    /// Subscripts to check when the dims are bound ([`SubscriptBound`]).
    pub bind_checks: Vec<SubscriptBound>,
}

impl Graph {
    pub fn new(name: &str) -> Graph {
        Graph {
            name: name.to_string(),
            g: StableDiGraph::new(),
            params: vec![],
            output: None,
            dims: vec![],
            bind_checks: vec![],
        }
    }

    /// Add a value computed by `op` from `operands` (result 0 of each).
    pub fn add(&mut self, op: Op, ty: ValueType, operands: &[ValueId], span: Span) -> ValueId {
        let ops: Vec<Value> = operands.iter().map(|&o| Value::of(o)).collect();
        self.add_multi(op, vec![ty], &ops, span)
    }

    /// Add a node with the result types `tys` (at least one) computed from `operands`.
    pub fn add_multi(&mut self, op: Op, tys: Vec<ValueType>, operands: &[Value], span: Span) -> ValueId {
        let mut tys = tys.into_iter();
        let ty = tys.next().expect("a node has at least one result");
        let id = self.g.add_node(Node { op, ty, more: tys.collect(), span, name: None, inline: false });
        for (k, o) in operands.iter().enumerate() {
            self.g.add_edge(o.node, id, Use { pos: k as u32, result: o.result });
        }
        id
    }

    /// Add a tensor parameter (positional axes).
    pub fn add_param(&mut self, name: &str, ty: ValueType, span: Span) -> ValueId {
        let index = self.params.len();
        let id = self.add(Op::Param { name: name.to_string(), index }, ty.clone(), &[], span);
        self.params.push(Param {
            name: name.to_string(),
            ty,
            storage: None,
            node: id,
            range: None,
            nonincreasing: None,
        });
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

    /// The number of results of node `id`.
    pub fn result_count(&self, id: ValueId) -> usize {
        1 + self.g[id].more.len()
    }

    /// The type of result `r` of node `id` (`None` if it has no such result).
    pub fn result_ty(&self, id: ValueId, r: u32) -> Option<&ValueType> {
        let n = &self.g[id];
        match r {
            0 => Some(&n.ty),
            r => n.more.get(r as usize - 1),
        }
    }

    /// The type of value `v`. Panics if the result does not exist (the verifier rules it out).
    pub fn value_ty(&self, v: Value) -> &ValueType {
        self.result_ty(v.node, v.result).expect("result index in range")
    }

    /// The types of all results of `id`, in order.
    pub fn result_types(&self, id: ValueId) -> Vec<&ValueType> {
        let n = &self.g[id];
        std::iter::once(&n.ty).chain(n.more.iter()).collect()
    }

    /// Operands of `id` in order, as the nodes that produce them (see [`Graph::operand_values`]
    /// for which result).
    pub fn operands(&self, id: ValueId) -> Vec<ValueId> {
        self.operand_values(id).into_iter().map(|v| v.node).collect()
    }

    /// Operands of `id` in order, with the result of each.
    pub fn operand_values(&self, id: ValueId) -> Vec<Value> {
        let mut es: Vec<(u32, Value)> = self
            .g
            .edges_directed(id, Direction::Incoming)
            .map(|e| (e.weight().pos, Value { node: e.source(), result: e.weight().result }))
            .collect();
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

    /// Replace every use of every result of `old` by the same result of `new` (the output
    /// too). `new` must have at least the results of `old` that are used.
    pub fn replace_all_uses(&mut self, old: ValueId, new: ValueId) {
        let uses: Vec<(petgraph::stable_graph::EdgeIndex, ValueId, Use)> = self
            .g
            .edges_directed(old, Direction::Outgoing)
            .map(|e| (e.id(), e.target(), *e.weight()))
            .collect();
        for (e, dst, w) in uses {
            self.g.remove_edge(e);
            self.g.add_edge(new, dst, w);
        }
        if self.output == Some(old) {
            self.output = Some(new);
        }
    }

    /// Replace every use of value `old` by value `new` (the output only if both are result 0).
    pub fn replace_value_uses(&mut self, old: Value, new: Value) {
        let uses: Vec<(petgraph::stable_graph::EdgeIndex, ValueId, Use)> = self
            .g
            .edges_directed(old.node, Direction::Outgoing)
            .filter(|e| e.weight().result == old.result)
            .map(|e| (e.id(), e.target(), *e.weight()))
            .collect();
        for (e, dst, w) in uses {
            self.g.remove_edge(e);
            self.g.add_edge(new.node, dst, Use { pos: w.pos, result: new.result });
        }
        if old.result == 0 && new.result == 0 && self.output == Some(old.node) {
            self.output = Some(new.node);
        }
    }

    /// Make operand `pos` of `id` read `new` instead (its other operands and every other use
    /// of the old value stay). False when `id` has no operand at `pos`.
    pub fn set_operand(&mut self, id: ValueId, pos: u32, new: Value) -> bool {
        let Some(e) =
            self.g.edges_directed(id, Direction::Incoming).find(|e| e.weight().pos == pos).map(|e| e.id())
        else {
            return false;
        };
        self.g.remove_edge(e);
        self.g.add_edge(new.node, id, Use { pos, result: new.result });
        true
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

    /// The nodes `roots` depend on, themselves included.
    pub fn live_from(&self, roots: &[ValueId]) -> std::collections::HashSet<ValueId> {
        let mut live = std::collections::HashSet::new();
        let mut stack = roots.to_vec();
        while let Some(n) = stack.pop() {
            if live.insert(n) {
                stack.extend(self.g.neighbors_directed(n, Direction::Incoming));
            }
        }
        live
    }

    /// The nodes of `outputs`, or the output's when it is empty: what a caller reads back.
    pub fn roots(&self, outputs: &[Value]) -> Vec<ValueId> {
        if outputs.is_empty() {
            self.output.into_iter().collect()
        } else {
            outputs.iter().map(|o| o.node).collect()
        }
    }

    /// Remove every node the output does not depend on (parameters always stay).
    pub fn remove_dead(&mut self) {
        let mut roots: Vec<ValueId> = self.output.into_iter().collect();
        roots.extend(self.params.iter().map(|p| p.node));
        let live = self.live_from(&roots);
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
