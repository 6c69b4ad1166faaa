//! Guarded reads (issue 25, items 1 and 6): a read under a select branch need be in range only
//! where the branch is taken. The rule (ir/src/lower.rs, `Guard`): comparisons of an index
//! variable with dims and constants (`t >= 1`, `d < D / 2`), joined by `and` where the
//! condition holds or by `or` where it fails, bound the variable inside that branch; the read's
//! subscript must stay in range for every value within those bounds. Token shift on k (FoX
//! "Pro") is then fused and pruned, and RoPE's rotate-half is spelled without a D x D matrix.
//! Each is checked against the f64 interpreter on fresh inputs.

mod common;

use common::{fresh_seed as seed, run_cli as run};

fn write(name: &str, src: &str) -> String {
    common::write_program("guarded", name, src)
}

const SHIFT: &str = "attention fox_shift(q: bf16[B, H, T, D], k: bf16[B, H, T, D], v: bf16[B, H, T, D], fgate: f32[B, H, T]) -> bf16[B, H, T, D] {
    c[b, h, t]      = cumsum(t, logsigmoid(fgate[b, h, t]))
    ks[b, h, t, d]  = 0.5 * k[b, h, t, d] + 0.5 * GUARDED
    s[b, h, i, j]   = sum(d, q[b, h, i, d] * ks[b, h, j, d]) / sqrt(D) + c[b, h, i] - c[b, h, j]
    p[b, h, i, j]   = softmax(j, causal(i, j, s[b, h, i, j]))
    out[b, h, i, d] = sum(j, p[b, h, i, j] * v[b, h, j, d])
    return out
}
";

#[test]
fn token_shift_is_fused_and_pruned() {
    let s = seed();
    for (name, guarded) in [
        ("then.attn", "select(t >= 1, k[b, h, t - 1, d], 0)"),
        ("else.attn", "select(t < 1, 0, k[b, h, t - 1, d])"),
        ("and.attn", "select(t > 0 and t <= T - 1, k[b, h, t - 1, d], 0)"),
    ] {
        let p = write(name, &SHIFT.replace("GUARDED", guarded));
        let (code, t) =
            run(&["run", &p, "--backend", "cpu", "--check", "--shape", "B=1,H=2,T=150,D=16", "--seed", &s]);
        assert_eq!(code, Some(0), "{guarded}: {t}");
        assert!(t.contains("pruning: paper rule") && t.contains("check: ok"), "{guarded}: {t}");
    }
}

#[test]
fn a_guard_that_does_not_cover_the_read_is_an_error() {
    for (name, guarded) in [
        ("ge0.attn", "select(t >= 0, k[b, h, t - 1, d], 0)"),
        ("other.attn", "select(t >= 1, 0, k[b, h, t - 1, d])"),
        ("or.attn", "select(t >= 1 or t >= 2, k[b, h, t - 2, d], 0)"),
    ] {
        let p = write(name, &SHIFT.replace("GUARDED", guarded));
        let (code, t) = run(&["check", &p]);
        assert_eq!(code, Some(1), "{guarded}: {t}");
        assert!(t.contains("can be out of range"), "{guarded}: {t}");
    }
}

#[test]
fn rope_rotate_half_reads_the_other_half() {
    let p = write(
        "rope.attn",
        "attention rope(q: f32[B, H, T, D], cs: f32[T, D], sn: f32[T, D]) -> f32[B, H, T, D] {
    r[b, h, t, d] = q[b, h, t, d] * cs[t, d] + select(d < D / 2, -q[b, h, t, d + D / 2], q[b, h, t, d - D / 2]) * sn[t, d]
    return r
}
",
    );
    let s = seed();
    for backend in ["cpu", "reference"] {
        let (code, t) =
            run(&["run", &p, "--backend", backend, "--check", "--shape", "B=2,H=2,T=9,D=16", "--seed", &s]);
        assert_eq!(code, Some(0), "{backend}: {t}");
    }
    // Unguarded, the upper read leaves the axis.
    let p = write(
        "rope_bad.attn",
        "attention rope(q: f32[B, H, T, D], sn: f32[T, D]) -> f32[B, H, T, D] {\n    r[b, h, t, d] = q[b, h, t, d] + q[b, h, t, d + D / 2] * sn[t, d]\n    return r\n}\n",
    );
    let (code, t) = run(&["check", &p]);
    assert_eq!(code, Some(1), "{t}");
    assert!(t.contains("subscript `d + D / 2` of `q` can be out of range"), "{t}");
}

/// Token shift and RoPE train: their gathers have a gradient (each element read once; the rule
/// is checked against finite differences in passes/tests/grad_fd.rs), and the CPU backend's
/// gradients equal the interpreter's.
#[test]
fn token_shift_and_rope_have_gradients() {
    let s = seed();
    let shift = write("shift_grad.attn", &SHIFT.replace("GUARDED", "select(t >= 1, k[b, h, t - 1, d], 0)"));
    let (code, t) =
        run(&["grad", &shift, "--backend", "cpu", "--check", "--shape", "B=1,H=2,T=150,D=16", "--seed", &s]);
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("check grad_k") && t.contains("check: ok"), "{t}");
    let rope = write(
        "rope_grad.attn",
        "attention rope(q: f32[B, H, T, D], cs: f32[T, D], sn: f32[T, D]) -> f32[B, H, T, D] {
    r[b, h, t, d] = q[b, h, t, d] * cs[t, d] + select(d < D / 2, -q[b, h, t, d + D / 2], q[b, h, t, d - D / 2]) * sn[t, d]
    return r
}
",
    );
    let (code, t) =
        run(&["grad", &rope, "--backend", "cpu", "--check", "--shape", "B=2,H=2,T=9,D=16", "--seed", &s]);
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("check grad_q") && t.contains("check: ok"), "{t}");
}
