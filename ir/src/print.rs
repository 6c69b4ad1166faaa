//! The textual form of the graph IR (stable: snapshot tests depend on it) and DOT export.
//!
//! ```text
//! graph @fox(%q: bf16[B, H, T, D], ...) -> bf16[B, H, T, D] {
//!   %4 = bind [b, h, t] %3 : f32[b:B, h:H, t:T]        // c
//!   ...
//!   return %17
//! }
//! ```
//! Values are renumbered densely in topological order, so printing does not depend on the
//! node indices a pass happened to leave behind.

use crate::graph::{Graph, ValueId};
use std::collections::HashMap;
use std::fmt::Write;

fn numbering(g: &Graph) -> (Vec<ValueId>, HashMap<ValueId, usize>) {
    let order = g.topo_order();
    let num = order.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    (order, num)
}

/// Print the graph in the foxc IR text format.
pub fn print_graph(g: &Graph) -> String {
    let (order, num) = numbering(g);
    let mut s = String::new();
    let params: Vec<String> = g.params.iter().map(|p| format!("%{}: {}", p.name, p.ty)).collect();
    let ret = g.output.map(|o| g.ty(o).to_string()).unwrap_or_else(|| "()".into());
    let _ = writeln!(s, "graph @{}({}) -> {} {{", g.name, params.join(", "), ret);
    for n in order {
        let node = g.node(n);
        let ops: Vec<String> = g.operands(n).iter().map(|o| format!("%{}", num[o])).collect();
        let mut line = format!("  %{} = {}", num[&n], node.op);
        if !ops.is_empty() {
            line.push(' ');
            line.push_str(&ops.join(", "));
        }
        let _ = write!(line, " : {}", node.ty);
        if let Some(name) = &node.name {
            let _ = write!(line, "  // {name}");
        }
        s.push_str(&line);
        s.push('\n');
    }
    if let Some(o) = g.output {
        let _ = writeln!(s, "  return %{}", num[&o]);
    }
    s.push_str("}\n");
    s
}

/// Graphviz DOT export (`foxc compile --dot`).
pub fn to_dot(g: &Graph) -> String {
    let (order, num) = numbering(g);
    let mut s = format!("digraph \"{}\" {{\n  node [shape=box, fontname=monospace];\n", g.name);
    for n in &order {
        let node = g.node(*n);
        let label = format!("%{} = {}\\n{}", num[n], node.op, node.ty).replace('"', "\\\"");
        let style = if node.op.is_fused() { ", style=filled, fillcolor=lightblue" } else { "" };
        let _ = writeln!(s, "  n{} [label=\"{}\"{}];", num[n], label, style);
    }
    for n in &order {
        for (k, o) in g.operands(*n).iter().enumerate() {
            let _ = writeln!(s, "  n{} -> n{} [label=\"{}\"];", num[o], num[n], k);
        }
    }
    if let Some(o) = g.output {
        let _ = writeln!(s, "  out [shape=oval];\n  n{} -> out;", num[&o]);
    }
    s.push_str("}\n");
    s
}
