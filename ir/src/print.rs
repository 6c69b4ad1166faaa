//! The textual form of the graph IR (stable: snapshot tests depend on it) and DOT export.
//!
//! ```text
//! graph @fox(%q: bf16[B, H, T, D], ...) -> bf16[B, H, T, D] {
//!   %4 = bind [b, h, t] %3 : f32[b:B, h:H, t:T]        // c
//!   ...
//!   %12:2 = attention {scale = 1/sqrt(D), score = 20 * tanh(x / 20), mask = causal, decay} %3, %5, %7, %11 : f32[B, H, T, D], f32[B, H, T]
//!   %13 = cast %12 : bf16[B, H, T, D]
//!   return %17
//! }
//! ```
//! A node with several results prints as `%N:count`, its results beyond the first as `%N#r`.
//! The captured tensors of an attention region print as the values they are (`%7[b, h, j]`).
//! Values are renumbered densely in topological order, so printing does not depend on the
//! node indices a pass happened to leave behind.

use crate::attention::Attention;
use crate::graph::{Graph, Value, ValueId};
use crate::ops::Op;
use std::collections::HashMap;
use std::fmt::Write;

fn numbering(g: &Graph) -> (Vec<ValueId>, HashMap<ValueId, usize>) {
    let order = g.topo_order();
    let num = order.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    (order, num)
}

/// `%N` for result 0, `%N#r` for result r.
fn value_name(num: &HashMap<ValueId, usize>, v: Value) -> String {
    if v.result == 0 {
        format!("%{}", num[&v.node])
    } else {
        format!("%{}#{}", num[&v.node], v.result)
    }
}

/// Print the graph in the foxc IR text format.
pub fn print_graph(g: &Graph) -> String {
    let (order, num) = numbering(g);
    let mut s = String::new();
    let params: Vec<String> = g
        .params
        .iter()
        .map(|p| {
            let mut d = format!("%{}: {}", p.name, p.ty);
            if let Some(s) = p.storage {
                d.push_str(&format!(" (stored {s})"));
            }
            if let Some(ax) = p.nonincreasing.and_then(|k| p.ty.axes.get(k)) {
                d.push_str(&format!(" (nonincreasing along {})", ax.dim));
            }
            d
        })
        .collect();
    let ret = g.output.map(|o| g.ty(o).to_string()).unwrap_or_else(|| "()".into());
    let _ = writeln!(s, "graph @{}({}) -> {} {{", g.name, params.join(", "), ret);
    for n in order {
        let node = g.node(n);
        let vals = g.operand_values(n);
        let ops: Vec<String> = vals.iter().map(|o| value_name(&num, *o)).collect();
        let count = g.result_count(n);
        let lhs = if count > 1 { format!("%{}:{count}", num[&n]) } else { format!("%{}", num[&n]) };
        let op = match &node.op {
            Op::Attention(a) => match Attention::operands(g, n) {
                Ok(o) => {
                    let cap =
                        |k: usize| o.captures.get(k).map_or(format!("${k}"), |c| format!("%{}", num[c]));
                    format!("attention {{{}}}", a.attrs_with(&cap))
                }
                Err(_) => node.op.to_string(),
            },
            Op::LoadMap { f } => {
                let cap = |k: usize| vals.get(k + 1).map_or(format!("${k}"), |v| value_name(&num, *v));
                format!("load_map {{f = {}}}", f.display_load_map(&cap))
            }
            op => op.to_string(),
        };
        let inline = if node.inline { "inline " } else { "" };
        let mut line = format!("  {lhs} = {inline}{op}");
        if !ops.is_empty() {
            line.push(' ');
            line.push_str(&ops.join(", "));
        }
        let tys: Vec<String> = g.result_types(n).iter().map(|t| t.to_string()).collect();
        let _ = write!(line, " : {}", tys.join(", "));
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
        for (k, o) in g.operand_values(*n).iter().enumerate() {
            let label = if o.result == 0 { k.to_string() } else { format!("{k} (#{})", o.result) };
            let _ = writeln!(s, "  n{} -> n{} [label=\"{}\"];", num[&o.node], num[n], label);
        }
    }
    if let Some(o) = g.output {
        let _ = writeln!(s, "  out [shape=oval];\n  n{} -> out;", num[&o]);
    }
    s.push_str("}\n");
    s
}
