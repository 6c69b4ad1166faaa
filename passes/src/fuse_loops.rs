//! `fuse-loops` (every target): an elementwise value that its users can compute in their own
//! loops becomes `inline` (docs/SEMANTICS.md): it gets no buffer and no loop of its own, and
//! a chain such as `store(mul(bind out, sigmoid(bind g)))` (an output gate) or RoPE's
//! `q * cos + rotate_half(q) * sin` is one loop instead of one per node.
//!
//! A value is inline when it is live, elementwise ([`Op::is_elementwise`]), of rank > 0, not an
//! output, and every use reads it by name in a loop ([`Op::reads_by_name`]). A read (`bind`,
//! `gather`, `iota`) is inlined into any number of users: each reads the buffer where it would
//! have read the copy. A computation (`unary`, `binary`, `select`, `cast`) only into one use
//! whose loop runs over exactly its axes, so that nothing is computed twice: `sigmoid(g[b, h,
//! i])` under a sum over `j` keeps its own loop. A product that a `sum {contract}` reads
//! through is left to `contract`.
//!
//! [`mark`] decides for the values a caller reads back (a value read back keeps its buffer);
//! the pipeline decides for the graph's output, and the backends' glue (the driver) decides
//! again for the values it computes, as for `contract`.

use crate::{PassContext, PassError, PassOptions};
use foxc_ir::{Graph, Op, Value, ValueId};
use petgraph::visit::EdgeRef;
use petgraph::Direction;
use std::collections::HashSet;

/// The `fuse-loops` pass.
pub fn run(g: &mut Graph, _opts: &PassOptions, _cx: &mut PassContext) -> Result<(), PassError> {
    mark(g, &[]);
    Ok(())
}

/// Sets `inline` on every node of `g`: true exactly where the values `outputs` (empty: the
/// graph's output) need it and the rules above allow it.
pub fn mark(g: &mut Graph, outputs: &[Value]) {
    let roots = g.roots(outputs);
    let live = g.live_from(&roots);
    let decided: Vec<(ValueId, bool)> =
        g.g.node_indices()
            .map(|n| (n, live.contains(&n) && !roots.contains(&n) && inlinable(g, n)))
            .collect();
    for (n, inline) in decided {
        g.node_mut(n).inline = inline;
    }
}

/// Whether node `n` may be computed in its users' loops (liveness and outputs aside).
fn inlinable(g: &Graph, n: ValueId) -> bool {
    let op = g.op(n);
    if !op.is_elementwise() || g.ty(n).rank() == 0 {
        return false;
    }
    let uses: Vec<(ValueId, usize)> =
        g.g.edges_directed(n, Direction::Outgoing).map(|e| (e.target(), e.weight().pos as usize)).collect();
    if uses.is_empty() || !uses.iter().all(|&(u, pos)| g.op(u).reads_by_name(pos)) {
        return false;
    }
    if uses.iter().any(|&(u, _)| matches!(g.op(u), Op::Reduce { contract: true, .. })) {
        return false;
    }
    match op {
        Op::Bind { .. } | Op::Gather { .. } | Op::Iota { .. } => true,
        _ => match uses[..] {
            [(u, _)] => covers(g, n, u),
            _ => false,
        },
    }
}

/// Whether `n` has every axis of user `u`'s loop: the user's result axes (a store's named
/// ones) and the axis it reduces.
fn covers(g: &Graph, n: ValueId, u: ValueId) -> bool {
    let have: HashSet<&str> = g.ty(n).axes.iter().map(|a| a.name.as_str()).collect();
    let mut loop_axes: Vec<&str> = match g.op(u) {
        Op::Store { axes } => axes.iter().map(String::as_str).collect(),
        _ => g.ty(u).axes.iter().map(|a| a.name.as_str()).collect(),
    };
    if let Op::Reduce { axis, .. } = g.op(u) {
        loop_axes.push(axis);
    }
    loop_axes.iter().all(|a| have.contains(a))
}

#[cfg(test)]
mod tests {
    use super::*;
    use foxc_ir::print::print_graph;

    fn opt_for(src: &str, target: crate::Target) -> Graph {
        let c = foxc_ir::frontend::compile("t.attn", src.as_bytes()).expect("compiles");
        let mut g = c.graph;
        crate::optimize(&mut g, &crate::PassOptions { target, ..crate::PassOptions::default() })
            .expect("optimizes");
        g
    }

    fn opt(src: &str) -> Graph {
        opt_for(src, crate::Target::Cpu)
    }

    /// RoPE's rotation of q on a GPU target (the CPU's kernels compute it where they load q,
    /// `fuse-load-maps`): the reads, the products and the select are computed in the store's
    /// loop; the attention and its operands keep their buffers.
    #[test]
    fn a_rotation_is_one_loop() {
        let g = opt_for(
            "attention rot(q: f32[B, H, T, D], k: f32[B, H, T, D], v: f32[B, H, T, D], cos: f32[T, D], sin: f32[T, D]) -> f32[B, H, T, D] {
    qr[b, h, t, d] = q[b, h, t, d] * cos[t, d] + select(d < D / 2, -q[b, h, t, d + D / 2], q[b, h, t, d - D / 2]) * sin[t, d]
    p[b, h, i, j] = softmax(j, causal(i, j, sum(d, qr[b, h, i, d] * k[b, h, j, d])))
    o[b, h, i, d] = sum(j, p[b, h, i, j] * v[b, h, j, d])
    return o
}",
            crate::Target::Sm90a,
        );
        let text = print_graph(&g);
        for op in ["gather", "mul", "select"] {
            assert!(text.contains(&format!("= inline {op} ")), "{op}:\n{text}");
        }
        assert!(!text.contains("inline attention") && !text.contains("inline store"), "{text}");
        foxc_ir::verify::verify(&g).expect("verifies");
    }

    /// A computation broadcast along its user's loop (a per-row value under a sum over keys)
    /// keeps its own loop; a read broadcast the same way is inlined.
    #[test]
    fn a_broadcast_computation_keeps_its_loop() {
        let g = opt("attention rows(x: f32[T, J], r: f32[T]) -> f32[T] {
    y[t] = sum(j, x[t, j] * exp(r[t]))
    return y
}");
        let text = print_graph(&g);
        assert!(text.contains("= exp ") && !text.contains("inline exp"), "{text}");
        assert!(text.contains("= inline bind "), "{text}");
    }
}
