//! The monotonicity analysis on gate spellings: which log-gates it proves non-positive
//! (so that ACP is inserted) and which it must refuse, with an explanation at the gate.

mod common;

use foxc_ir::{Op, Prune};
use foxc_passes::{optimize, PassOptions};

fn program(gate: &str) -> String {
    format!(
        "attention g(q: bf16[B, H, T, D], k: bf16[B, H, T, D], v: bf16[B, H, T, D], z: f32[B, H, T],
                     f: f32[B, H, T] in [0, 1], lf: f32[B, H, T] in [-5, -0.1], slope: f32[H] in [0.5, 2]) -> bf16[B, H, T, D] {{
            c[b, h, t]      = cumsum(t, {gate})
            s[b, h, i, j]   = sum(d, q[b, h, i, d] * k[b, h, j, d]) / sqrt(D) + c[b, h, i] - c[b, h, j]
            p[b, h, i, j]   = softmax(j, causal(i, j, s[b, h, i, j]))
            out[b, h, i, d] = sum(j, p[b, h, i, j] * v[b, h, j, d])
            return out
        }}"
    )
}

/// (pruned, explanations, source)
fn compile_gate(gate: &str) -> (bool, Vec<foxc_passes::Explanation>, String) {
    let src = program(gate);
    let mut g = foxc_ir::frontend::compile("gate.attn", src.as_bytes())
        .unwrap_or_else(|d| panic!("{}", d.render("gate.attn", &src)))
        .graph;
    let report = optimize(&mut g, &PassOptions::default()).unwrap();
    let pruned = !g.find(|op| matches!(op, Op::Attention(a) if a.prune != Prune::Dense)).is_empty();
    let fused = !g.find(|op| matches!(op, Op::Attention(_))).is_empty();
    assert!(fused, "{gate}: not even recognized: {:?}", report.explanations);
    (pruned, report.explanations, src)
}

#[test]
fn provably_non_positive_gates_are_pruned() {
    for gate in [
        "logsigmoid(z[b, h, t])",
        "-softplus(z[b, h, t])",
        "-softplus(-z[b, h, t])",
        "-relu(z[b, h, t])",
        "-exp(z[b, h, t])",
        "min(z[b, h, t], 0)",
        "min(0, z[b, h, t])",
        "log(f[b, h, t])",
        "log(sigmoid(z[b, h, t]))",
        "lf[b, h, t]",
        "lf[b, h, t] * 2",
        "-slope[h] * sigmoid(z[b, h, t])",
        "logsigmoid(z[b, h, t]) + lf[b, h, t]",
    ] {
        let (pruned, ex, _) = compile_gate(gate);
        assert!(pruned, "{gate}: expected pruning, got {ex:?}");
        assert!(ex.is_empty(), "{gate}: {ex:?}");
    }
}

#[test]
fn gates_that_may_be_positive_are_refused_with_an_explanation() {
    for gate in [
        "z[b, h, t]",
        "softplus(z[b, h, t])",
        "log(z[b, h, t])",
        "relu(z[b, h, t])",
        "-lf[b, h, t]",
        "logsigmoid(z[b, h, t]) - lf[b, h, t]",
        "max(z[b, h, t], 0)",
        "exp(z[b, h, t])",
    ] {
        let (pruned, ex, src) = compile_gate(gate);
        assert!(!pruned, "{gate}: must not be pruned");
        let e = ex
            .iter()
            .find(|e| e.message.contains("cannot prove"))
            .unwrap_or_else(|| panic!("{gate}: {ex:?}"));
        let at = &src[e.span.range()];
        assert!(at.contains(gate) || gate.contains(at), "{gate}: explanation points at `{at}`");
    }
}
