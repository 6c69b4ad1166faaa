//! A sliding window and attention sinks spelled with `select` around FoX (StreamingLLM's mask,
//! `i - j < W or j < S`): the window alone becomes the `window` mask; with sinks the `or`
//! lowers to nested selects around the decayed score, whose decay the recognizer splits out of
//! both branches, and the attention is pruned because every row provably keeps its diagonal
//! (`i - j < W` holds at `j = i`: ACP's denominator argument). A condition that may drop the
//! diagonal stays dense, and `--explain` says why. Checked on the CPU against the f64
//! interpreter, forward and gradients.
//!
//! Shown failing: with `keeps_diagonal` answering true for every region, the strictly causal
//! program below was pruned and `a_row_that_may_lose_its_diagonal_stays_dense` failed.

mod common;

use common::{fresh_seed as seed, run_cli as run};

const FOX: &str = "attention fox_masked(q: bf16[B, H, T, D], k: bf16[B, H, T, D], v: bf16[B, H, T, D], fgate: f32[B, H, T]) -> f32[B, H, T, D] {
    c[b, h, t]      = cumsum(t, logsigmoid(fgate[b, h, t]))
    s[b, h, i, j]   = sum(d, q[b, h, i, d] * k[b, h, j, d]) / sqrt(D) + c[b, h, i] - c[b, h, j]
    p[b, h, i, j]   = softmax(j, MASK)
    out[b, h, i, d] = sum(j, p[b, h, i, j] * v[b, h, j, d])
    return out
}
";

fn write(name: &str, mask: &str) -> String {
    common::write_program("window_sinks", name, &FOX.replace("MASK", mask))
}

/// `foxc compile --emit opt --explain` of `path`: the text.
fn optimized(path: &str) -> String {
    let (code, t) = run(&["compile", path, "--emit", "opt", "--explain"]);
    assert_eq!(code, Some(0), "{t}");
    t
}

#[test]
fn a_select_window_is_the_window_mask_and_pruned() {
    for (name, mask) in [
        ("win1.attn", "causal(i, j, select(i - j < 96, s[b, h, i, j], -inf))"),
        ("win2.attn", "select(i - j >= 96, -inf, causal(i, j, s[b, h, i, j]))"),
        ("win3.attn", "select(j <= i and i - j < 96, s[b, h, i, j], -inf)"),
    ] {
        let p = write(name, mask);
        let t = optimized(&p);
        assert!(t.contains("mask = window(96)") && t.contains("pruned"), "{name}: {t}");
        let (code, t) = run(&[
            "run",
            &p,
            "--backend",
            "cpu",
            "--check",
            "--shape",
            "B=1,H=4,T=400,D=16",
            "--seed",
            &seed(),
        ]);
        assert_eq!(code, Some(0), "{name}: {t}");
        assert!(t.contains("pruning: paper rule") && t.contains("check: ok"), "{name}: {t}");
    }
}

#[test]
fn sinks_beside_a_window_keep_the_decay_and_are_pruned() {
    for (name, mask) in [
        ("sink1.attn", "causal(i, j, select(i - j < 96 or j < 4, s[b, h, i, j], -inf))"),
        ("sink2.attn", "select(i - j < 96 or j < 4, causal(i, j, s[b, h, i, j]), -inf)"),
        ("sink3.attn", "causal(i, j, select(j < 4 or j > i - 96, s[b, h, i, j], -inf))"),
    ] {
        let p = write(name, mask);
        let t = optimized(&p);
        assert!(t.contains("mask = causal") && t.contains("pruned"), "{name}: {t}");
        assert!(t.contains("nothing to explain"), "{name}: {t}");
        let s = seed();
        let (code, t) =
            run(&["run", &p, "--backend", "cpu", "--check", "--shape", "B=1,H=4,T=400,D=16", "--seed", &s]);
        assert_eq!(code, Some(0), "{name}: {t}");
        assert!(t.contains("pruning: paper rule") && t.contains("check: ok"), "{name}: {t}");
        let (code, t) =
            run(&["grad", &p, "--backend", "cpu", "--check", "--shape", "B=1,H=2,T=200,D=16", "--seed", &s]);
        assert_eq!(code, Some(0), "{name}: {t}");
        assert!(t.contains("check grad_fgate") && t.contains("check: ok"), "{name}: {t}");
    }
}

#[test]
fn a_row_that_may_lose_its_diagonal_stays_dense() {
    // `i - j > 0` fails at j = i, and `j < 4` is unknown there: row 10 keeps keys 0..3 and not
    // its diagonal, so the threshold's premise fails.
    let p = write("strict.attn", "causal(i, j, select(i - j > 0 or j < 4, s[b, h, i, j], -inf))");
    let t = optimized(&p);
    assert!(!t.contains("= threshold") && !t.contains(", pruned"), "{t}");
    assert!(t.contains("may mask a row's diagonal entry"), "{t}");
    let (code, t) =
        run(&["run", &p, "--backend", "cpu", "--check", "--shape", "B=1,H=4,T=300,D=16", "--seed", &seed()]);
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("check: ok"), "{t}");
}
