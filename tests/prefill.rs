//! Queries shorter than keys (issue 25, item 3): queries aligned to the end of the keys, as a
//! prefill against a KV cache (`N < M`) or a decode step (`N = 1`), mask `j <= i + M - N`, the
//! decay read at the query's key position `c[b, h, i + M - N]`. Recognized as FoX, fused and
//! pruned on the CPU and the GPU targets, forward and backward, against the f64 reference of
//! the *source* program (small shapes run it whole; the GPU's where a GPU is present: the
//! standard and split-keys forward kernels, the backward's `_fq` kernels).
//!
//! Seen failing: with the CPU forward reading the query's `c` at its row `i` instead of its key
//! position `i + M - N`, the output is unchanged (`c_i` is one number per row, which the softmax
//! cancels) but the log-sum-exp is not: the gradient checks fail ("grad_q rel L2 9.914e-1").

mod common;

use common::{cpu_check, fresh_seed as seed, run_cli as run};

/// The program in a file of its own per test (tests run in parallel in one process).
fn write(name: &str, src: &str) -> String {
    common::write_program("prefill", name, src)
}

const PREFILL: &str = "attention prefill(q: bf16[B, H, N, D], k: bf16[B, H, M, D], v: bf16[B, H, M, D], fgate: f32[B, H, M]) -> bf16[B, H, N, D] {
    c[b, h, t]      = cumsum(t, logsigmoid(fgate[b, h, t]))
    s[b, h, i, j]   = sum(d, q[b, h, i, d] * k[b, h, j, d]) / sqrt(D) + c[b, h, i + M - N] - c[b, h, j]
    p[b, h, i, j]   = softmax(j, select(j <= i + M - N, s[b, h, i, j], -inf))
    out[b, h, i, d] = sum(j, p[b, h, i, j] * v[b, h, j, d])
    return out
}
";

/// The kept fraction `kept X of causal tiles` that `run` prints.
fn kept_tiles(t: &str) -> f64 {
    let at = t.find("kept ").unwrap_or_else(|| panic!("no pruning line: {t}"));
    t[at + 5..].split_whitespace().next().and_then(|x| x.parse().ok()).unwrap_or_else(|| panic!("{t}"))
}

/// The fused op: one attention, causal (its diagonal is the queries' key positions), pruned.
#[test]
fn prefill_is_one_pruned_attention() {
    let p = write("one_attention.attn", PREFILL);
    let (code, t) = run(&["compile", &p, "--emit", "opt"]);
    assert_eq!(code, Some(0), "{t}");
    let attn: Vec<&str> = t.lines().filter(|l| l.contains("= attention {")).collect();
    assert_eq!(attn.len(), 1, "{t}");
    assert!(attn[0].contains("mask = causal") && attn[0].contains("pruned"), "{t}");
    assert!(attn[0].contains("f32[B, H, N]"), "lse per query row: {t}");
    assert!(t.contains("block_boundary {bm = 64, bn = 64}") && t.contains("i32[B, H, N/64]"), "{t}");
    assert!(!t.contains("softmax"), "{t}");
}

/// Forward on the CPU, pruned and dense, against the reference: prefill, decode (one query), a
/// long cache with few queries (pruning really skips tiles), and the square case.
#[test]
fn prefill_and_decode_run_pruned_on_the_cpu() {
    let p = write("cpu_forward.attn", PREFILL);
    let s = seed();
    for shape in ["B=1,H=4,N=40,M=600,D=16", "B=2,H=4,N=1,M=700,D=8", "B=1,H=4,N=130,M=130,D=8"] {
        for prune in [true, false] {
            let t = cpu_check("run", &p, shape, &s, prune);
            assert!(t.contains("all rows"), "{t}");
            if prune {
                assert!(kept_tiles(&t) < 1.0, "{shape}: nothing pruned: {t}");
            }
        }
    }
}

/// Gradients on the CPU against the reference's, pruned and dense, including a decode step.
#[test]
fn prefill_gradients_on_the_cpu() {
    let p = write("cpu_gradients.attn", PREFILL);
    let s = seed();
    for shape in ["B=1,H=2,N=24,M=100,D=16", "B=1,H=2,N=1,M=70,D=8"] {
        for prune in [true, false] {
            let t = cpu_check("grad", &p, shape, &s, prune);
            for g in ["grad_q", "grad_k", "grad_v", "grad_fgate"] {
                assert!(t.contains(&format!("check {g}")), "{g} not checked: {t}");
            }
        }
    }
}

/// Grouped-query decode: G kv heads, query head h reads kv head `h / (H / G)`.
#[test]
fn grouped_query_decode() {
    let p = write(
        "gqa.attn",
        "attention gqa(q: bf16[B, H, N, D], k: bf16[B, G, M, D], v: bf16[B, G, M, D], fgate: f32[B, H, M]) -> bf16[B, H, N, D] {
    c[b, h, t]      = cumsum(t, logsigmoid(fgate[b, h, t]))
    s[b, h, i, j]   = sum(d, q[b, h, i, d] * k[b, h / (H / G), j, d]) / sqrt(D) + c[b, h, i + M - N] - c[b, h, j]
    p[b, h, i, j]   = softmax(j, select(j <= i + M - N, s[b, h, i, j], -inf))
    out[b, h, i, d] = sum(j, p[b, h, i, j] * v[b, h / (H / G), j, d])
    return out
}
",
    );
    let (code, t) = run(&["compile", &p, "--emit", "opt"]);
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("kv_group = H / G") && t.contains("pruned"), "{t}");
    let s = seed();
    for cmd in ["run", "grad"] {
        let (code, t) = run(&[
            cmd,
            &p,
            "--backend",
            "cpu",
            "--check",
            "--shape",
            "B=1,H=4,G=2,N=3,M=300,D=8",
            "--seed",
            &s,
        ]);
        assert_eq!(code, Some(0), "{cmd}: {t}");
        assert!(t.contains("check: ok"), "{t}");
    }
}

/// A decay at the queries' key positions under a mask at their rows (`causal(i, j, ..)` is
/// `j <= i`) is not one attention of aligned queries: it stays unfused, says why, and still runs.
#[test]
fn a_mask_off_the_decay_stays_unfused() {
    let p = write(
        "offdiag.attn",
        &PREFILL.replace("select(j <= i + M - N, s[b, h, i, j], -inf)", "causal(i, j, s[b, h, i, j])"),
    );
    let (code, t) = run(&["compile", &p, "--emit", "opt", "--explain"]);
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("the query row i sits at key position i, not at i + M - N"), "{t}");
    assert!(!t.contains("= attention {"), "{t}");
    let (code, t) = run(&[
        "run",
        &p,
        "--backend",
        "cpu",
        "--check",
        "--shape",
        "B=1,H=2,N=8,M=20,D=8",
        "--seed",
        &seed(),
    ]);
    assert_eq!(code, Some(0), "{t}");
}

/// GPU targets fuse the forward, pruned (the in-kernel boundary; the kernel a square attention
/// would take: warp-specialized on sm_90a for D = 128, standard on sm_80), and the gradient
/// program: one attention and one attention_backward.
#[test]
fn gpu_targets_fuse_forward_and_backward() {
    let p = write("gpu_forward.attn", PREFILL);
    for target in ["sm_90a", "sm_80"] {
        let (code, t) = run(&["compile", &p, "--emit", "opt", "--target", target, "--explain"]);
        assert_eq!(code, Some(0), "{t}");
        let attn: Vec<&str> = t.lines().filter(|l| l.contains("= attention {")).collect();
        assert_eq!(attn.len(), 1, "{target}: {t}");
        assert!(attn[0].contains("pruned(fused boundary)"), "{t}");
        let ws = attn[0].contains("kernel = warp_specialized(D = 128");
        assert_eq!(ws, target == "sm_90a", "{target}: {t}");
        // Its threshold has no k_causal: a rule that reads it falls back to the paper's, saying so.
        let (code, t) =
            run(&["compile", &p, "--emit", "opt", "--target", target, "--explain", "--prune-rule", "local"]);
        assert_eq!(code, Some(0), "{t}");
        assert!(t.contains("the rule `local` reads k_causal") && t.contains("rule = paper"), "{target}: {t}");
        let (code, t) = run(&["compile", &p, "--emit", "grad", "--target", target, "--explain"]);
        assert_eq!(code, Some(0), "{t}");
        let fused = |op: &str| t.lines().filter(|l| l.contains(&format!("= {op} {{"))).count();
        assert_eq!((fused("attention"), fused("attention_backward")), (1, 1), "{target}: {t}");
        assert!(t.contains("f32[B, H, M]") && t.contains("pruned(fused boundary)"), "dc per key: {t}");
    }
}

/// The GPU gradient program compiles: the forward (split keys at one query row, the standard
/// kernel otherwise) and the `_fq` backward kernels, which assemble (where ptxas is found).
#[test]
fn gpu_gradient_programs_compile_and_assemble() {
    use foxc_codegen::nvptx::ptxas;
    use foxc_driver::{cuda_backend, grad::grad_program, pipeline, PruneOptions, Target};
    let src = pipeline::Source { name: "prefill.attn".into(), bytes: PREFILL.as_bytes().to_vec() };
    let g = src.compile().unwrap().graph;
    for (target, arch) in [(Target::Sm90a, "sm_90a"), (Target::Sm80, "sm_80")] {
        for (d, n) in [(64, None), (128, Some(1))] {
            let mut dims = std::collections::BTreeMap::from([("D".to_string(), d)]);
            let mut opts = pipeline::pass_options(&PruneOptions::default(), target, false).unwrap();
            opts.gradient = true;
            if let Some(n) = n {
                dims.insert("N".into(), n);
                opts.dims = dims.clone();
            }
            let p = grad_program(&pipeline::optimize(&g, &opts).unwrap().0, target).unwrap();
            let outs: Vec<_> = p.outputs.iter().map(|(_, v)| *v).collect();
            let a = cuda_backend::compile_outputs(&p.graph, &outs, &dims, target).unwrap();
            let at = format!("{arch} D={d} N={n:?}");
            // The backward's own kernels are the `_fq` ones (the forward's name has `_fq` too).
            for k in ["dq", "dkv"] {
                let entry = a.ptx.lines().find(|l| l.contains(&format!(".entry foxc_attn_bwd_{k}_")));
                assert!(entry.is_some_and(|l| l.contains("_fq_")), "{at}: {k}: {entry:?}");
            }
            assert_eq!(a.ptx.contains("split_merge"), n.is_some(), "{at}");
            if let Some(x) = ptxas::find() {
                ptxas::assemble(&x, &a.ptx, arch).unwrap_or_else(|log| panic!("{at}: {log}"));
            }
        }
    }
}

/// On a GPU: forward and gradients against the reference, pruned and dense: a prefill of a
/// ragged tile count against a longer cache, a decode step (one query: split keys forward), 64
/// queries (one block), and the square case; D = 64 and 128.
#[test]
fn prefill_and_decode_forward_and_backward_on_the_gpu() {
    if !common::gpu_or_skip("prefill::prefill_and_decode_forward_and_backward_on_the_gpu") {
        return;
    }
    let p = write("gpu_run.attn", PREFILL);
    let s = seed();
    for shape in [
        "B=1,H=4,N=300,M=1000,D=64",
        "B=2,H=2,N=1,M=777,D=128",
        "B=1,H=2,N=64,M=2049,D=64",
        "B=1,H=2,N=200,M=200,D=128",
    ] {
        for prune in [&[][..], &["--no-prune"][..]] {
            for what in ["run", "grad"] {
                let mut args = vec![what, &p, "--backend", "cuda", "--check", "--shape", shape, "--seed", &s];
                args.extend_from_slice(prune);
                let (code, t) = run(&args);
                assert_eq!(code, Some(0), "{what} {shape} {prune:?}: {t}");
            }
        }
    }
}

/// More queries than keys: the fused op has no key position for the first rows, so the sizes are
/// refused when bound, naming the dims (here without a decay, whose gather would refuse them
/// too), on the CPU and the reference alike.
#[test]
fn more_queries_than_keys_are_named_at_bind_time() {
    let p = write(
        "nodecay.attn",
        "attention nd(q: bf16[B, H, N, D], k: bf16[B, H, M, D], v: bf16[B, H, M, D]) -> bf16[B, H, N, D] {
    s[b, h, i, j]   = sum(d, q[b, h, i, d] * k[b, h, j, d]) / sqrt(D)
    p[b, h, i, j]   = softmax(j, select(j <= i + M - N, s[b, h, i, j], -inf))
    out[b, h, i, d] = sum(j, p[b, h, i, j] * v[b, h, j, d])
    return out
}
",
    );
    for backend in ["cpu", "reference"] {
        let (code, t) = run(&["run", &p, "--backend", backend, "--shape", "B=1,H=1,N=9,M=4,D=8"]);
        assert_eq!(code, Some(1), "{backend}: {t}");
        assert!(t.contains("its N = 9 queries at the end of its M = 4 keys"), "{backend}: {t}");
        let (code, t) = run(&[
            "run",
            &p,
            "--backend",
            backend,
            "--check",
            "--shape",
            "B=1,H=2,N=4,M=9,D=8",
            "--seed",
            &seed(),
        ]);
        assert_eq!(code, Some(0), "{backend}: {t}");
    }
}

/// A relative-position bias read by queries at the end of the keys, `rel[h, min(i + M - N - j,
/// 128)]`: out of range only above the shifted diagonal, which the mask `j <= i + M - N` drops,
/// so it compiles for every `N <= M` (before, it was checked at the bound sizes and refused at a
/// prefill: "takes values -49..=128 at these sizes"); a table as long as the keys read without
/// a clamp too. Fused, pruned, checked on the CPU against the f64 interpreter (prefill, decode,
/// N = M) forward and backward. Without the mask it is refused at compile time, the hint naming
/// the shifted mask. (Shown failing with the square case's triangle in the range check.)
#[test]
fn a_relative_bias_of_a_prefill_is_in_range_under_its_mask() {
    let src = |read: &str, table: &str, mask: &str| {
        PREFILL
            .replace("fgate: f32[B, H, M])", &format!("fgate: f32[B, H, M], rel: f32[{table}] in [-2, 2])"))
            .replace("/ sqrt(D) +", &format!("/ sqrt(D) + {read} +"))
            .replace("select(j <= i + M - N, s[b, h, i, j], -inf)", mask)
    };
    let masked = "select(j <= i + M - N, s[b, h, i, j], -inf)";
    let s = seed();
    for (name, read, table) in [
        ("rel_clamped.attn", "rel[h, min(i + M - N - j, 128)]", "H, 129"),
        ("rel_long.attn", "rel[h, i + M - N - j]", "H, M"),
    ] {
        let p = write(name, &src(read, table, masked));
        let (code, t) = run(&["compile", &p, "--emit", "opt", "--explain"]);
        assert_eq!(code, Some(0), "{name}: {t}");
        assert!(t.contains(", pruned") && t.contains("nothing to explain"), "{name}: {t}");
        for shape in ["B=1,H=2,N=50,M=400,D=16", "B=2,H=2,N=1,M=300,D=16", "B=1,H=2,N=200,M=200,D=16"] {
            let t = cpu_check("run", &p, shape, &s, true);
            assert!(t.contains("pruning: paper rule"), "{name} {shape}: {t}");
        }
        cpu_check("grad", &p, "B=1,H=2,N=40,M=200,D=16", &s, true);
        common::pruned_ptx_assembles(&p);
    }
    let p = write("rel_unmasked.attn", &src("rel[h, i + M - N - j]", "H, M", "s[b, h, i, j]"));
    let (code, t) = run(&["check", &p]);
    assert_eq!(code, Some(1), "{t}");
    assert!(
        t.contains("in range only where j <= i + M - N") && t.contains("`select(j <= i + M - N, ..., -inf)`"),
        "{t}"
    );
}

/// `foxc compile FILE --emit opt`: the one fused attention's line, which must be causal and
/// pruned.
fn one_pruned_causal(path: &str) -> String {
    let (code, t) = run(&["compile", path, "--emit", "opt", "--explain"]);
    assert_eq!(code, Some(0), "{t}");
    let attn: Vec<&str> = t.lines().filter(|l| l.contains("= attention {")).collect();
    assert_eq!(attn.len(), 1, "{path}: {t}");
    assert!(attn[0].contains("mask = causal") && attn[0].contains("pruned"), "{path}: {t}");
    t
}

/// The left-padded prefills: the prefill's causal mask in each place of a conjunction.
fn padded_prefills() -> Vec<(&'static str, String)> {
    let padded = PREFILL.replace("fgate: f32[B, H, M])", "fgate: f32[B, H, M], start: i32[B] in [0, 90])");
    // The causal mask after the start and six `or`s of kept entries, each one link of the
    // conjunction (seventh and eighth, a select of both branches not counting).
    let ors: Vec<String> =
        (1..=6).map(|k| format!("(j < start[b] + {k} or i + M - N - j < {})", 50 * k)).collect();
    let seven_ors =
        format!("select(j >= start[b] and {} and j <= i + M - N, s[b, h, i, j], -inf)", ors.join(" and "));
    [
        ("pad_first.attn", "select(j >= start[b] and j <= i + M - N, s[b, h, i, j], -inf)"),
        ("pad_nested.attn", "select(j >= start[b], select(j <= i + M - N, s[b, h, i, j], -inf), -inf)"),
        ("pad_dropped.attn", "select(j < start[b] or j > i + M - N, -inf, s[b, h, i, j])"),
        (
            "pad_window.attn",
            "select(j >= start[b] and i + M - N - j < 300 and j <= i + M - N, s[b, h, i, j], -inf)",
        ),
        // Attention sinks beside a window, an `or` before the causal mask; then the start last.
        (
            "pad_sinks_window.attn",
            "select(j >= start[b] and (j < start[b] + 4 or i + M - N - j < 64) and j <= i + M - N, s[b, h, i, j], -inf)",
        ),
        (
            "sinks_window_pad.attn",
            "select((j < start[b] + 4 or i + M - N - j < 64) and j <= i + M - N and j >= start[b], s[b, h, i, j], -inf)",
        ),
    ]
    .into_iter()
    .chain([("ors_then_causal.attn", seven_ors.as_str())])
    .map(|(name, mask)| (name, padded.replace("select(j <= i + M - N, s[b, h, i, j], -inf)", mask)))
    .collect()
}

/// Left padding in a prefill or a decode step, the prefill's causal mask anywhere in the
/// conjunction (after the start, nested inside it, third after a window, after an `or` of sinks
/// and a window, or both dropped with `-inf` first): the causal mask comes out, one pruned
/// attention, forward and gradients on the CPU against the reference, rows before a sequence's
/// start included (they are 0).
///
/// Shown failing before the recognizer looked inside the conjunction: every spelling but the
/// causal mask first was "not causally masked" and dense. The sinks' `or` before the causal
/// mask, before the recognizer looked into both branches of an `or`: dense; with the start
/// after it, before the diagonal rule read a kept sink's `j >= start[b]` as holding at the
/// diagonal: "may mask a row's diagonal entry", dense. The causal mask after six `or`s, while
/// an `or` counted as two links: not found ("not causally masked"), dense.
#[test]
fn left_padding_beside_the_prefill_mask_is_pruned() {
    let pruned = ["B=2,H=2,N=40,M=600,D=16", "B=3,H=2,N=1,M=500,D=8"];
    pruned_on_the_cpu(padded_prefills(), &pruned, &["B=2,H=2,N=60,M=60,D=8"], "B=2,H=2,N=12,M=100,D=8");
}

/// Each program: one pruned causal attention whose GPU kernels assemble; on the CPU against the
/// reference, forward at `pruned` shapes (where tiles must be skipped) and `other` shapes, and
/// gradients at `grad`, pruned and dense.
fn pruned_on_the_cpu(programs: Vec<(&str, String)>, pruned: &[&str], other: &[&str], grad: &str) {
    let s = seed();
    for (name, src) in programs {
        let p = write(name, &src);
        one_pruned_causal(&p);
        common::pruned_ptx_assembles(&p);
        for shape in pruned {
            let t = cpu_check("run", &p, shape, &s, true);
            assert!(kept_tiles(&t) < 1.0, "{name} {shape}: nothing pruned: {t}");
        }
        for shape in other {
            cpu_check("run", &p, shape, &s, true);
        }
        for prune in [true, false] {
            cpu_check("grad", &p, grad, &s, prune);
        }
    }
}

/// ALiBi against a KV cache: `m[h] * (j - i - M + N)` is the ramp `m[h] t` read at the query's
/// key position (its `m[h] (N - M)` terms put the query there), alone and beside FoX's decay; one
/// pruned attention, forward and gradients on the CPU. So is the ramp written at the query's
/// row, `m[h] * (j - i)`: it differs from the one at its key position by `m[h] (M - N)`, the same
/// for every key of a row, which the softmax and its gradients do not see.
///
/// Beside FoX's decay at the query's key position, the ramp at the row is a second pair at
/// another query position: under the causal mask both are read at the diagonal.
///
/// Shown failing before the ramp's shift: "the causal mask's diagonal is j <= i + M - N but the
/// decay reads the query row at i", unfused (and, for the row's spelling, before a decay at
/// another query position than the mask's was taken as the mask's; FoX beside the row's ramp
/// and the ramp plus 5, before pairs at different positions were taken: dense, "the score term
/// `m[h] * i` has no bound").
#[test]
fn alibi_against_a_cache_is_pruned() {
    let pruned = ["B=2,H=3,N=30,M=500,D=16", "B=1,H=3,N=1,M=400,D=8"];
    pruned_on_the_cpu(alibi_prefills(), &pruned, &[], "B=1,H=3,N=10,M=90,D=8");
}

const ALIBI: &str = "attention alibi_cache(q: bf16[B, H, N, D], k: bf16[B, H, M, D], v: bf16[B, H, M, D], m: f32[H] in [0.01, 1]) -> bf16[B, H, N, D] {
    s[b, h, i, j]   = sum(d, q[b, h, i, d] * k[b, h, j, d]) / sqrt(D) + RAMP
    p[b, h, i, j]   = softmax(j, select(j <= i + M - N, s[b, h, i, j], -inf))
    out[b, h, i, d] = sum(j, p[b, h, i, j] * v[b, h, j, d])
    return out
}
";

/// The ALiBi prefills: the ramp at the query's key position, alone and beside FoX's decay.
fn alibi_prefills() -> Vec<(&'static str, String)> {
    let fox_alibi = PREFILL
        .replace("fgate: f32[B, H, M])", "fgate: f32[B, H, M], m: f32[H] in [0.01, 1])")
        .replace("- c[b, h, j]\n", "- c[b, h, j] + RAMP\n");
    [
        ("alibi1.attn", ALIBI, "m[h] * (j - i - M + N)"),
        ("alibi2.attn", ALIBI, "-m[h] * (i + M - N - j)"),
        ("alibi3.attn", ALIBI, "m[h] * (j - (i + M - 1)) + m[h] * (N - 1)"),
        // At the query's row: the ramp at its key position plus `m[h] (M - N)`, the same for
        // every key of the row.
        ("alibi_row.attn", ALIBI, "m[h] * (j - i)"),
        ("fox_alibi.attn", fox_alibi.as_str(), "m[h] * (j - i - M + N)"),
        // FoX's pair at the query's key position, the ramp's at its row: both are read at the
        // diagonal. And a ramp offset by a constant: the constant stays in the score, bounded.
        ("fox_alibi_row.attn", fox_alibi.as_str(), "m[h] * (j - i)"),
        ("fox_alibi_plus5.attn", fox_alibi.as_str(), "m[h] * (j - i + 5)"),
    ]
    .into_iter()
    .map(|(name, src, ramp)| (name, src.replace("RAMP", ramp)))
    .collect()
}

/// On a GPU: the left-padded and ALiBi prefills, forward and gradients against the reference,
/// pruned and dense: a prefill and a decode step (split keys), D = 64 and 128.
#[test]
fn padded_and_alibi_prefills_on_the_gpu() {
    if !common::gpu_or_skip("prefill::padded_and_alibi_prefills_on_the_gpu") {
        return;
    }
    let s = seed();
    for (name, src) in padded_prefills().into_iter().chain(alibi_prefills()) {
        let p = write(&format!("gpu_{name}"), &src);
        for shape in ["B=2,H=3,N=200,M=900,D=64", "B=3,H=3,N=1,M=700,D=128"] {
            for prune in [&[][..], &["--no-prune"][..]] {
                for what in ["run", "grad"] {
                    let mut args =
                        vec![what, &p, "--backend", "cuda", "--check", "--shape", shape, "--seed", &s];
                    args.extend_from_slice(prune);
                    let (code, t) = run(&args);
                    assert_eq!(code, Some(0), "{name} {what} {shape} {prune:?}: {t}");
                }
            }
        }
    }
}

/// A prefill's window spelled as a distance, `i + M - N - j < W`, alone or in a conjunction with
/// a start: its key bound is found (`keys_from`, the largest of the conjunction's bounds), so the
/// key tiles before the window are not visited, pruned or dense; checked on the CPU against the
/// reference with a long cache.
///
/// Shown failing before the bound read sums: no `keys_from`, every key tile from the start
/// visited (kept tiles 0.52 pruned, 1.0 dense, at N = 64, M = 2048).
#[test]
fn a_prefill_window_skips_the_keys_before_it() {
    let s = seed();
    for (name, mask, bound) in [
        (
            "win_dist.attn",
            "select(i + M - N - j < 100 and j <= i + M - N, s[b, h, i, j], -inf)",
            "keys_from = i + (dim(M) - dim(N)) - 100",
        ),
        (
            "win_start.attn",
            "select(j >= start[b] and i + M - N - j < 100 and j <= i + M - N, s[b, h, i, j], -inf)",
            "keys_from = max(%",
        ),
    ] {
        let src = PREFILL
            .replace("fgate: f32[B, H, M])", "fgate: f32[B, H, M], start: i32[B] in [0, 90])")
            .replace("select(j <= i + M - N, s[b, h, i, j], -inf)", mask);
        let p = write(name, &src);
        let t = one_pruned_causal(&p);
        assert!(t.contains(bound), "{name}: {t}");
        for shape in ["B=2,H=2,N=40,M=600,D=16", "B=2,H=2,N=1,M=500,D=8"] {
            cpu_check("run", &p, shape, &s, true);
        }
        cpu_check("grad", &p, "B=1,H=2,N=12,M=300,D=8", &s, true);
        let (code, t) = run(&[
            "bench",
            &p,
            "--backend",
            "cpu",
            "--shape",
            "B=1,H=2,N=64,M=2048,D=16",
            "--iters",
            "1",
            "--format",
            "csv",
        ]);
        assert_eq!(code, Some(0), "{t}");
        for line in t.lines().filter(|l| l.contains(",forward,")) {
            let kept: f64 = line.split(',').nth_back(1).and_then(|x| x.parse().ok()).unwrap_or(1.0);
            assert!(kept < 0.2, "{name}: the window's key bound skipped nothing: {line}");
        }
    }
}

/// On a GPU whose threshold reads the norms from the data, a row that keeps at most two key
/// tiles (a narrow window) is not pruned: that pass reads every key's norm, which costs more
/// than pruning saves there (BENCHMARKS.md: 0.203 ms pruned, 0.106 dense). `--explain` says so.
/// The CPU prunes it, and so does a GPU with narrower tiles or a wider window. Shown failing
/// with the rule taking no window (`NARROW_KEY_TILES` 0): pruned.
#[test]
fn a_narrow_window_is_not_pruned_on_a_gpu() {
    let attention = |file: &str, extra: &[&str]| {
        let mut args = vec!["compile", file, "--emit", "opt", "--explain"];
        args.extend_from_slice(extra);
        let (code, t) = run(&args);
        assert_eq!(code, Some(0), "{file} {extra:?}: {t}");
        let line =
            t.lines().find(|l| l.contains("= attention {")).unwrap_or_else(|| panic!("{t}")).to_string();
        (line, t)
    };
    let f = "bench/fox_pad_window_prefill.attn";
    let gpu = ["--target", "sm_90a", "--shape", "D=128"];
    let (line, t) = attention(f, &gpu);
    assert!(line.contains("bn = 128") && !line.contains("pruned"), "{t}");
    assert!(t.contains("not pruned: each row's keys lie among the 257 up to its diagonal (a window of 2 key tiles of 128)"), "{t}");
    let (line, t) = attention(f, &[&gpu[..], &["--tiles", "64x64"]].concat());
    assert!(line.contains("pruned"), "4 tiles of 64: {t}");
    let (line, t) = attention(f, &[]);
    assert!(line.contains("pruned"), "the CPU: {t}");
    let wide = write("pad_window_1024.attn", &std::fs::read_to_string(f).unwrap().replace("< 256", "< 1024"));
    let (line, t) = attention(&wide, &gpu);
    assert!(line.contains("pruned"), "1024 keys: {t}");
}

/// A decode step's cache keeps FoX's `c` (declared nonincreasing) and the score adds ALiBi's
/// ramp at the query's key position: the recognizer stores the two as one sum, `c[b, h, t] -
/// m[h] t`, which the monotonicity pass proves never grows along the keys (each term does not,
/// `m >= 0` by its declared range), so the attention is pruned; forward and gradients on the
/// CPU against the reference. With `m` of either sign it is not proven, and stays dense.
///
/// Shown failing before the sum's proof: "the decay bias c[i] - c[j] is not a cumsum of log
/// forget gates nor an ALiBi ramp", dense.
#[test]
fn a_caches_decay_beside_alibi_is_pruned() {
    let src = std::fs::read_to_string("bench/fox_cache_alibi.attn").unwrap();
    pruned_on_the_cpu(
        vec![("cache_alibi.attn", src.clone())],
        &["B=2,H=3,N=30,M=500,D=16", "B=1,H=3,N=1,M=400,D=8"],
        &[],
        "B=1,H=3,N=10,M=90,D=8",
    );
    let p = write("cache_alibi_signed.attn", &src.replace("in [0, 1]", "in [-1, 1]"));
    let (code, t) = run(&["compile", &p, "--emit", "opt", "--explain"]);
    assert_eq!(code, Some(0), "{t}");
    let attn: Vec<&str> = t.lines().filter(|l| l.contains("= attention {")).collect();
    assert!(t.contains("cannot be proven to fall with distance"), "{t}");
    assert!(attn.len() == 1 && !attn[0].contains("pruned"), "{t}");
}
