//! `fuse-loops` (issue 25, items 6 and 7): the elementwise values around an attention are
//! computed in their users' loops. RoPE on q and k (bench/fox_rope.attn) and an output gate
//! (bench/fox_gate.attn) run on the CPU against the f64 interpreter, forward and gradients, and
//! each chain is one kernel on both backends: a store of the rotated q (or of the gated output)
//! reads the parameters, and no kernel is left for the reads, products, negations or selects
//! it computes.
//!
//! Shown failing: with `Inputs::named` reading an inline value's buffer instead of computing it
//! (the node skipped, as now, but not computed in the user's loop), both tests failed (the GPU:
//! "value %67#0 has no buffer"); with `inline_value`'s select taking its branches the other way
//! round, the RoPE check failed (rel L2 inf: the rotate-half read outside the head dim).

mod common;

use common::{fresh_seed as seed, run_cli as run};

const SHAPE: &str = "B=1,H=2,T=100,D=32";

#[test]
fn rope_and_an_output_gate_match_the_reference_on_the_cpu() {
    let s = seed();
    for f in ["bench/fox_rope.attn", "bench/fox_gate.attn"] {
        for what in ["run", "grad"] {
            let (code, t) = run(&[what, f, "--backend", "cpu", "--check", "--shape", SHAPE, "--seed", &s]);
            assert_eq!(code, Some(0), "{what} {f}: {t}");
            assert!(t.contains("check: ok"), "{what} {f}: {t}");
        }
    }
}

/// The kernels of `f` for `emit` (`ptx` entries or `clif` functions), by name.
fn kernels(f: &str, emit: &str) -> Vec<String> {
    let (code, t) = run(&["compile", f, "--emit", emit, "--shape", SHAPE]);
    assert_eq!(code, Some(0), "{f}: {t}");
    let prefix = if emit == "ptx" { ".visible .entry " } else { "function %" };
    t.lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .map(|l| l.split('(').next().unwrap().to_string())
        .collect()
}

#[test]
fn each_elementwise_chain_is_one_kernel_on_both_backends() {
    for emit in ["ptx", "clif"] {
        // RoPE: k rotated by one store, and so is q on the GPU (the CPU's kernels compute q's
        // rotation where they load it, `fuse-load-maps`, tests/load_maps.rs); only the sign
        // test `d < D / 2` keeps a loop of its own.
        let rope = kernels("bench/fox_rope.attn", emit);
        let named = |op: &str| rope.iter().filter(|k| k.contains(&format!("_{op}"))).count();
        assert_eq!(named("store"), if emit == "ptx" { 2 } else { 1 }, "{emit}: {rope:?}");
        for op in ["bind", "gather", "mul", "add", "neg", "select", "iota"] {
            assert_eq!(named(op), 0, "{emit}: a `{op}` kernel is left: {rope:?}");
        }
        assert_eq!(named("lt"), 1, "{emit}: {rope:?}");
        // The gate: the attention computes `out * sigmoid(g)` where it stores its output
        // (`fuse-epilogue`, tests/epilogue.rs): no loop is left at all.
        let gate = kernels("bench/fox_gate.attn", emit);
        for op in ["bind", "sigmoid", "mul", "cast", "store"] {
            assert!(!gate.iter().any(|k| k.contains(&format!("_{op}"))), "{emit}: {gate:?}");
        }
    }
}

/// The decision is printed: `inline` before the op (RoPE's rotation on a GPU target: its reads
/// and products), and the attention and the stores keep their buffers.
#[test]
fn opt_prints_what_is_inline() {
    let (code, t) = run(&["compile", "bench/fox_rope.attn", "--emit", "opt", "--target", "sm_90a"]);
    assert_eq!(code, Some(0), "{t}");
    for line in ["= inline gather ", "= inline mul ", "= inline select "] {
        assert!(t.contains(line), "{line}: {t}");
    }
    assert!(!t.contains("inline store") && !t.contains("inline attention"), "{t}");
}
