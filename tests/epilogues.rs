//! Fused epilogues and multi-query keys (issue 25, item 6): an output that is a function of attentions (an output
//! gate `attn * sigmoid(g)`, differential attention `attn1 - 0.5 * attn2`) fuses every
//! attention inside it, pruned where the decay is provable; the rest of the expression runs as
//! separate ops on their outputs. Checked against the f64 interpreter (f32 outputs, so that a
//! wrong epilogue shows above the 1e-5 tolerance) and through the gradients.
//!
//! The elementwise function itself is computed where the attention stores its output
//! (`fuse-epilogue`, attribute `epilogue`) on both backends; the gradient program moves it back
//! out and differentiates it as IR ops.
//!
//! Shown failing: with the two attentions of the differential program bound to each other's
//! outputs, `differential_attention_fuses_both` failed its check ("max abs diff 4.200e0 vs the
//! dense reference exceeds the ACP bound + rounding 3.982e-4": the check compares with the
//! source program, not the optimized graph). With the CPU kernel storing `o` instead of `F(o)`,
//! the CPU checks of the epilogue failed (rel L2 9.9e-1 on bench/fox_gate.attn); before
//! `unfuse` dropped the captures only the epilogue read, the gradient program's backward owed
//! the gate a gradient of its own (`attention_backward` with 5 results; the GPU refused it).
//! Without the warp-specialized consumer's prefetch call, the L2 test failed at sm_90a D = 128.

mod common;

use common::{cpu_check, fresh_seed as seed, run_cli as run};

fn write(name: &str, src: &str) -> String {
    common::write_program("epilogue", name, src)
}

const GATE: &str = "attention fox_gate(q: bf16[B, H, T, D], k: bf16[B, H, T, D], v: bf16[B, H, T, D], fgate: f32[B, H, T], g: bf16[B, H, T, D]) -> f32[B, H, T, D] {
    c[b, h, t]      = cumsum(t, logsigmoid(fgate[b, h, t]))
    s[b, h, i, j]   = sum(d, q[b, h, i, d] * k[b, h, j, d]) / sqrt(D) + c[b, h, i] - c[b, h, j]
    p[b, h, i, j]   = softmax(j, causal(i, j, s[b, h, i, j]))
    OUT
    return out
}
";

#[test]
fn an_output_gate_keeps_the_attention_fused_and_pruned() {
    let s = seed();
    for (name, out) in [
        ("gate1.attn", "out[b, h, i, d] = sum(j, p[b, h, i, j] * v[b, h, j, d]) * sigmoid(g[b, h, i, d])"),
        (
            "gate2.attn",
            "o[b, h, i, d]   = sum(j, p[b, h, i, j] * v[b, h, j, d])\n    out[b, h, i, d] = o[b, h, i, d] * sigmoid(g[b, h, i, d])",
        ),
    ] {
        let p = write(name, &GATE.replace("OUT", out));
        let (code, t) = run(&["compile", &p, "--emit", "opt", "--explain"]);
        assert_eq!(code, Some(0), "{t}");
        assert_eq!(t.matches("= attention {").count(), 1, "{name}: {t}");
        assert!(t.contains("fused 1 attention inside the output expression"), "{t}");
        let (code, t) = run(&["run", &p, "--backend", "cpu", "--check", "--shape", "B=1,H=2,T=300,D=16", "--seed", &s]);
        assert_eq!(code, Some(0), "{name}: {t}");
        assert!(t.contains("pruning: paper rule") && t.contains("check: ok"), "{name}: {t}");
        let (code, t) = run(&["grad", &p, "--backend", "cpu", "--check", "--shape", "B=1,H=2,T=200,D=16", "--seed", &s]);
        assert_eq!(code, Some(0), "{name}: {t}");
        assert!(t.contains("check grad_g") && t.contains("check: ok"), "{name}: {t}");
    }
}

#[test]
fn differential_attention_fuses_both() {
    let p = write(
        "diff.attn",
        "attention diff(q1: bf16[B, H, T, D], k1: bf16[B, H, T, D], q2: bf16[B, H, T, D], k2: bf16[B, H, T, D], v: bf16[B, H, T, D], fgate: f32[B, H, T]) -> f32[B, H, T, D] {
    c[b, h, t]      = cumsum(t, logsigmoid(fgate[b, h, t]))
    s1[b, h, i, j]  = sum(d, q1[b, h, i, d] * k1[b, h, j, d]) / sqrt(D) + c[b, h, i] - c[b, h, j]
    s2[b, h, i, j]  = sum(d, q2[b, h, i, d] * k2[b, h, j, d]) / sqrt(D) + c[b, h, i] - c[b, h, j]
    p1[b, h, i, j]  = softmax(j, causal(i, j, s1[b, h, i, j]))
    p2[b, h, i, j]  = softmax(j, causal(i, j, s2[b, h, i, j]))
    out[b, h, i, d] = sum(j, p1[b, h, i, j] * v[b, h, j, d]) - 0.5 * sum(j, p2[b, h, i, j] * v[b, h, j, d])
    return out
}
",
    );
    let (code, t) = run(&["compile", &p, "--emit", "opt"]);
    assert_eq!(code, Some(0), "{t}");
    assert_eq!(t.matches("= attention {").count(), 2, "{t}");
    assert_eq!(t.matches(", pruned}").count(), 2, "{t}");
    let s = seed();
    let (code, t) =
        run(&["run", &p, "--backend", "cpu", "--check", "--shape", "B=1,H=2,T=300,D=16", "--seed", &s]);
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("check: ok"), "{t}");
    let (code, t) =
        run(&["grad", &p, "--backend", "cpu", "--check", "--shape", "B=1,H=2,T=150,D=16", "--seed", &s]);
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("check grad_q2") && t.contains("check: ok"), "{t}");
}

/// Multi-query attention: keys and values without a head axis (`k[b, j, d]`) are one kv head
/// shared by every query head (kv_group = H), fused and pruned, forward and backward.
#[test]
fn multi_query_keys_are_one_shared_head() {
    let p = write(
        "mqa.attn",
        "attention fox_mqa(q: bf16[B, H, T, D], k: bf16[B, T, D], v: bf16[B, T, D], fgate: f32[B, H, T]) -> bf16[B, H, T, D] {
    c[b, h, t]      = cumsum(t, logsigmoid(fgate[b, h, t]))
    s[b, h, i, j]   = sum(d, q[b, h, i, d] * k[b, j, d]) / sqrt(D) + c[b, h, i] - c[b, h, j]
    p[b, h, i, j]   = softmax(j, causal(i, j, s[b, h, i, j]))
    out[b, h, i, d] = sum(j, p[b, h, i, j] * v[b, j, d])
    return out
}
",
    );
    let (code, t) = run(&["compile", &p, "--emit", "opt"]);
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("kv_group = H") && t.contains(", pruned}"), "{t}");
    let s = seed();
    let (code, t) =
        run(&["run", &p, "--backend", "cpu", "--check", "--shape", "B=2,H=4,T=300,D=16", "--seed", &s]);
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("pruning: paper rule") && t.contains("check: ok"), "{t}");
    let (code, t) =
        run(&["grad", &p, "--backend", "cpu", "--check", "--shape", "B=2,H=4,T=200,D=16", "--seed", &s]);
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("check grad_k") && t.contains("check: ok"), "{t}");
}

/// A sequence-first layout (`q: [B, T, H, D]`, the layout of most PyTorch models) is recognized:
/// the operands are laid out head-first for the fused attention (a copy each) and the output is
/// stored back in the program's order.
#[test]
fn a_sequence_first_layout_is_fused() {
    let p = write(
        "bthd.attn",
        "attention fox_bthd(q: bf16[B, T, H, D], k: bf16[B, T, H, D], v: bf16[B, T, H, D], fgate: f32[B, T, H]) -> bf16[B, T, H, D] {
    c[b, t, h]      = cumsum(t, logsigmoid(fgate[b, t, h]))
    s[b, h, i, j]   = sum(d, q[b, i, h, d] * k[b, j, h, d]) / sqrt(D) + c[b, i, h] - c[b, j, h]
    p[b, h, i, j]   = softmax(j, causal(i, j, s[b, h, i, j]))
    out[b, i, h, d] = sum(j, p[b, h, i, j] * v[b, j, h, d])
    return out
}
",
    );
    let (code, t) = run(&["compile", &p, "--emit", "opt"]);
    assert_eq!(code, Some(0), "{t}");
    assert!(
        t.contains("= attention {") && t.contains(", pruned}") && t.contains("store [b, i, h, d]"),
        "{t}"
    );
    let s = seed();
    let (code, t) =
        run(&["run", &p, "--backend", "cpu", "--check", "--shape", "B=2,H=3,T=200,D=16", "--seed", &s]);
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("check: ok"), "{t}");
    let (code, t) =
        run(&["grad", &p, "--backend", "cpu", "--check", "--shape", "B=1,H=2,T=150,D=16", "--seed", &s]);
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("check grad_q") && t.contains("check: ok"), "{t}");
}

/// An epilogue that reads a per-row gate, a per-column vector and the column index, into an
/// f32 output (the unrounded store path), at a head dim that is not a multiple of 4.
const ROWS: &str = "attention gate_rows(q: bf16[B, H, T, D], k: bf16[B, H, T, D], v: bf16[B, H, T, D], fgate: f32[B, H, T], g: f32[B, H, T], w: f32[D]) -> f32[B, H, T, D] {
    c[b, h, t]      = cumsum(t, logsigmoid(fgate[b, h, t]))
    s[b, h, i, j]   = sum(d, q[b, h, i, d] * k[b, h, j, d]) / sqrt(D) + c[b, h, i] - c[b, h, j]
    p[b, h, i, j]   = softmax(j, causal(i, j, s[b, h, i, j]))
    out[b, h, i, d] = sum(j, p[b, h, i, j] * v[b, h, j, d]) * sigmoid(g[b, h, i]) + w[d] * (d + 1) / D
    return out
}
";

fn opt(file: &str, target: &str) -> String {
    let (code, t) = run(&["compile", file, "--emit", "opt", "--target", target]);
    assert_eq!(code, Some(0), "{file} {target}: {t}");
    t
}

#[test]
fn an_output_gate_is_the_attention_s_epilogue_on_every_target() {
    for target in ["cpu", "sm_90a", "sm_80"] {
        let t = opt("bench/fox_gate.attn", target);
        assert!(t.contains("epilogue = o * sigmoid(%4[b, h, i, d])"), "{target}: {t}");
        assert!(t.contains("out = bf16"), "{target}: the cast is the attention's: {t}");
        assert!(!t.contains("= store") && !t.contains("sigmoid %"), "{target}: a loop is left: {t}");
    }
    // `--explain` says where the function went.
    let (code, t) = run(&["compile", "bench/fox_gate.attn", "--emit", "opt", "--explain"]);
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("runs where the attention stores its output (its epilogue)"), "{t}");
    let rows = common::write_program("epilogue", "rows.attn", ROWS);
    let t = opt(&rows, "sm_90a");
    assert!(t.contains("epilogue = o * sigmoid(%4[b, h, i]) + %5[d] * (1 + d) / dim(D)"), "{t}");
}

#[test]
fn fused_epilogues_match_the_reference_on_the_cpu() {
    let s = seed();
    let rows = common::write_program("epilogue", "rows_cpu.attn", ROWS);
    for shape in ["B=1,H=2,T=130,D=6", "B=2,H=3,T=70,D=32"] {
        for prune in [true, false] {
            cpu_check("run", &rows, shape, &s, prune);
            cpu_check("run", "bench/fox_gate.attn", shape, &s, prune);
        }
    }
}

/// A value the epilogue would need that another statement also reads stays a loop of its own,
/// and `--explain` says why.
#[test]
fn a_cone_with_a_reduction_is_explained_not_fused() {
    let src = "attention shared(q: f32[B, H, T, D], k: f32[B, H, T, D], v: f32[B, H, T, D], g: f32[B, H, T, D]) -> f32[B, H, T, D] {
    p[b, h, i, j]   = softmax(j, causal(i, j, sum(d, q[b, h, i, d] * k[b, h, j, d])))
    o[b, h, i, d]   = sum(j, p[b, h, i, j] * v[b, h, j, d])
    sg[b, h, i, d]  = sigmoid(g[b, h, i, d])
    out[b, h, i, d] = o[b, h, i, d] * sg[b, h, i, d] + sg[b, h, i, d] * o[b, h, i, d]
    return out
}
";
    let f = common::write_program("epilogue", "shared.attn", src);
    let t = opt(&f, "cpu");
    assert!(t.contains("epilogue = "), "a cone may share its own values: {t}");
    let src2 = src.replace(
        "out[b, h, i, d] = o[b, h, i, d] * sg[b, h, i, d] + sg[b, h, i, d] * o[b, h, i, d]",
        "out[b, h, i, d] = o[b, h, i, d] * sg[b, h, i, d] + sum(e, g[b, h, i, e]) * o[b, h, i, d]",
    );
    let f2 = common::write_program("epilogue", "reduced.attn", &src2);
    let (code, t) = run(&["compile", &f2, "--emit", "opt", "--explain"]);
    assert_eq!(code, Some(0), "{t}");
    assert!(!t.contains("epilogue = "), "{t}");
    assert!(t.contains("stays a loop of its own: it computes a `sum`"), "{t}");
}

#[test]
fn the_gradient_program_moves_the_epilogue_out() {
    for target in ["cpu", "sm_90a"] {
        let (code, t) = run(&["compile", "bench/fox_gate.attn", "--emit", "grad", "--target", target]);
        assert_eq!(code, Some(0), "{t}");
        assert!(!t.contains("epilogue"), "{target}: {t}");
        let bwd = t.lines().find(|l| l.contains("attention_backward")).expect("a backward");
        assert!(bwd.contains(":4 = attention_backward"), "{target}: a capture gradient is left: {bwd}");
    }
    let s = seed();
    cpu_check("grad", "bench/fox_gate.attn", "B=1,H=2,T=90,D=16", &s, true);
    let rows = common::write_program("epilogue", "rows_grad.attn", ROWS);
    cpu_check("grad", &rows, "B=1,H=2,T=90,D=16", &s, true);
}

/// The epilogue's reads are asked of L2 when a block starts (one `prefetch.global.L2` per line
/// the thread's share covers), in the warp-specialized and the standard kernels; a kernel
/// without an epilogue asks for nothing.
#[test]
fn the_epilogue_s_lines_are_asked_of_l2_when_a_block_starts() {
    for (target, shape) in [("sm_90a", "D=128"), ("sm_90a", "D=64"), ("sm_80", "D=64")] {
        let ptx = |f: &str| {
            let (code, t) = run(&["compile", f, "--emit", "ptx", "--target", target, "--shape", shape]);
            assert_eq!(code, Some(0), "{f} {target} {shape}: {t}");
            t.matches("prefetch.global.L2").count()
        };
        assert!(ptx("bench/fox_gate.attn") >= 1, "{target} {shape}");
        assert_eq!(ptx("examples/fox.attn"), 0, "{target} {shape}");
    }
}

/// A decode step's few queries split their keys on the GPU, and the launch that merges the key
/// slices applies the gate (the partials are of the attention alone): no loop is left, the
/// merge reads `g` and `T`, the split kernel reads neither, and both assemble. On the CPU the
/// same program matches the reference.
#[test]
fn a_decode_step_s_gate_is_applied_by_the_split_keys_merge() {
    let f = "bench/fox_gate_cache.attn";
    for (target, shape) in [("sm_90a", "D=128,N=1"), ("sm_90a", "D=64,N=16"), ("sm_80", "D=64,N=4")] {
        let at = format!("{target} {shape}");
        let (code, t) = run(&["compile", f, "--emit", "opt", "--target", target, "--shape", shape]);
        assert_eq!(code, Some(0), "{at}: {t}");
        assert!(t.contains("kernel = split_keys"), "{at}: {t}");
        assert!(t.contains("epilogue = o * sigmoid(%4[b, h, i, d])"), "{at}: {t}");
        assert!(!t.contains("= store") && !t.contains("sigmoid %"), "{at}: a loop is left: {t}");
        let (code, ptx) = run(&["compile", f, "--emit", "ptx", "--target", target, "--shape", shape]);
        assert_eq!(code, Some(0), "{at}: {ptx}");
        let entry = |name: &str| {
            let from = ptx.find(&format!(".entry {name}")).unwrap_or_else(|| panic!("{at}: no {name}"));
            let body = &ptx[from..];
            let end = body[1..].find(".entry").map_or(body.len(), |e| e + 1);
            &body[..end]
        };
        // The merge loads five pointers (its four and the gate's) and reads the bf16 gate.
        let merge = entry("foxc_fox_gate_cache_split_merge");
        assert_eq!(merge.matches("ld.param.b64").count(), 5, "{at}: the merge reads no gate: {merge}");
        assert!(merge.contains("ld.global.b16") || merge.contains("ld.global.nc.b16"), "{at}: {merge}");
        let fwd = entry("foxc_attn_fwd");
        assert!(!fwd.contains("prefetch.global.L2"), "{at}: the split kernel reads no gate");
        if let Some(p) = foxc_codegen::nvptx::ptxas::find() {
            foxc_codegen::nvptx::ptxas::assemble(&p, &ptx, target)
                .unwrap_or_else(|log| panic!("{at}: ptxas: {log}"));
        }
    }
    let s = seed();
    for shape in ["B=1,H=2,N=1,M=300,D=16", "B=2,H=3,N=5,M=200,D=32"] {
        cpu_check("run", f, shape, &s, true);
    }
}
