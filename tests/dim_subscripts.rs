//! Dims in subscripts (issue 25, item 1): `c[b, h, i + M - N]` (queries aligned to the end of
//! longer keys), `x[t + N]`, `rel[h, T - 1 - i]`, `k[.., d + D / 2]`. Each is checked against the
//! f64 interpreter on the CPU with fresh random inputs; a subscript in range only for some sizes
//! is accepted and checked when the dims are bound, with a message that names the sizes.

mod common;

use common::{fresh_seed as seed, run_cli as run};

fn write(name: &str, src: &str) -> String {
    common::write_program("dimsub", name, src)
}

/// Queries aligned to the end of longer keys, decay gathered at `i + M - N`: runs and matches
/// the reference; with more queries than keys the bind-time check refuses the inputs. (The
/// query's `c` is one number per row, which the softmax cancels: this test checks the mask's
/// offset and the bind-time check; the gathers' dim terms are checked by the next test, seen
/// failing with the CPU's dim terms dropped: rel L2 inf.)
#[test]
fn queries_aligned_to_the_end_of_the_keys() {
    let p = write(
        "prefill.attn",
        "attention prefill(q: bf16[B, H, N, D], k: bf16[B, H, M, D], v: bf16[B, H, M, D], fgate: f32[B, H, M]) -> bf16[B, H, N, D] {
    c[b, h, t]      = cumsum(t, logsigmoid(fgate[b, h, t]))
    s[b, h, i, j]   = sum(d, q[b, h, i, d] * k[b, h, j, d]) / sqrt(D) + c[b, h, i + M - N] - c[b, h, j]
    p[b, h, i, j]   = softmax(j, select(j <= i + M - N, s[b, h, i, j], -inf))
    out[b, h, i, d] = sum(j, p[b, h, i, j] * v[b, h, j, d])
    return out
}
",
    );
    let s = seed();
    for shape in ["B=1,H=2,N=24,M=40,D=16", "B=2,H=1,N=7,M=7,D=8", "B=1,H=1,N=1,M=33,D=8"] {
        for backend in ["cpu", "reference"] {
            let (code, t) =
                run(&["run", &p, "--backend", backend, "--check", "--shape", shape, "--seed", &s]);
            assert_eq!(code, Some(0), "{backend} {shape}: {t}");
            assert!(t.contains("check: ok"), "{t}");
        }
    }
    let (code, t) = run(&["run", &p, "--backend", "cpu", "--shape", "B=1,H=1,N=9,M=8,D=8"]);
    assert_eq!(code, Some(1), "{t}");
    assert!(t.contains("subscript `i + M - N` of `c` takes values -1..=7") && t.contains("N = 9"), "{t}");
}

/// Reversed positions `T - 1 - i`, a half-dim shift `d + D / 2` (the rotate-half of RoPE, on an
/// axis of half the size), and a dim-only subscript: each equals the reference.
#[test]
fn reversed_and_half_dim_subscripts() {
    let p = write(
        "rev.attn",
        "attention rev(x: f32[H, T], u: f32[E], w: f32[E, D]) -> f32[H, T] {
    y[h, t] = x[h, t] * x[h, T - 1 - t] + sum(e, u[e] * w[e, e + D / 2]) + x[h, T - 1]
    return y
}
",
    );
    let s = seed();
    for backend in ["cpu", "reference"] {
        let (code, t) =
            run(&["run", &p, "--backend", backend, "--check", "--shape", "H=3,T=11,E=4,D=8", "--seed", &s]);
        assert_eq!(code, Some(0), "{backend}: {t}");
    }
    // D = 7 does not divide by 2.
    let (code, t) = run(&["run", &p, "--backend", "cpu", "--shape", "H=3,T=11,E=3,D=7"]);
    assert_eq!(code, Some(1), "{t}");
    assert!(t.contains("D = 7 is not divisible by 2"), "{t}");
    // E > D / 2 leaves the axis.
    let (code, t) = run(&["run", &p, "--backend", "cpu", "--shape", "H=3,T=11,E=5,D=8"]);
    assert_eq!(code, Some(1), "{t}");
    assert!(t.contains("subscript `e + D / 2` of `w` takes values 4..=8"), "{t}");
}

/// A subscript out of range at every large size stays a positioned error.
#[test]
fn always_out_of_range_is_a_diagnostic() {
    let p = write(
        "past.attn",
        "attention past(x: f32[T]) -> f32[T] {\n    y[t] = x[t] + x[t + T]\n    return y\n}\n",
    );
    let t = common::refused_at_check(&p);
    assert!(t.contains("subscript `t + T` of `x` can be out of range") && t.contains("past.attn:2:"), "{t}");
    let p = write(
        "prod.attn",
        "attention p(x: f32[T]) -> f32[T] {\n    y[t] = x[t] + x[t * T]\n    return y\n}\n",
    );
    let t = common::refused_at_check(&p);
    assert!(t.contains("product of index variables or dims"), "{t}");
}

/// `min` / `max` in subscripts (clipped relative positions, as T5's bias; clamped shifts): the
/// clamp applies last, both sides of the range are proven by the clamps or the subscript, and
/// what only the sizes decide is checked when they are bound.
#[test]
fn clamped_subscripts() {
    let s = seed();
    let rel = write(
        "t5.attn",
        "attention t5(q: bf16[B, H, T, D], k: bf16[B, H, T, D], v: bf16[B, H, T, D], rel: f32[H, 65]) -> bf16[B, H, T, D] {
    s[b, h, i, j]   = sum(d, q[b, h, i, d] * k[b, h, j, d]) / sqrt(D) + rel[h, min(i - j, 64)]
    p[b, h, i, j]   = softmax(j, causal(i, j, s[b, h, i, j]))
    out[b, h, i, d] = sum(j, p[b, h, i, j] * v[b, h, j, d])
    return out
}
",
    );
    for backend in ["cpu", "reference"] {
        let (code, t) = run(&[
            "run",
            &rel,
            "--backend",
            backend,
            "--check",
            "--shape",
            "B=1,H=2,T=150,D=16",
            "--seed",
            &s,
        ]);
        assert_eq!(code, Some(0), "{backend}: {t}");
    }
    let (code, t) =
        run(&["grad", &rel, "--backend", "cpu", "--check", "--shape", "B=1,H=2,T=100,D=16", "--seed", &s]);
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("check grad_rel"), "{t}");
    let p = write(
        "clamp.attn",
        "attention cg(x: f32[T], w: f32[S]) -> f32[T] {\n    y[t] = x[t] * w[min(max(t - 3, 0), S - 1)] + x[max(t - 1, 0)] * w[min(t, 100)]\n    return y\n}\n",
    );
    for backend in ["cpu", "reference"] {
        let (code, t) =
            run(&["run", &p, "--backend", backend, "--check", "--shape", "T=20,S=101", "--seed", &s]);
        assert_eq!(code, Some(0), "{backend}: {t}");
    }
    // `w[min(t, 100)]` needs S > 100 or T <= S: decided by the sizes.
    let (code, t) = run(&["run", &p, "--backend", "cpu", "--shape", "T=60,S=50"]);
    assert_eq!(code, Some(1), "{t}");
    assert!(t.contains("subscript `min(t, 100)` of `w` takes values 0..=59"), "{t}");
    for (bad, says) in
        [("x[min(t, t)]", "of two index expressions"), ("x[min(t, 5) + 1]", "inside a subscript")]
    {
        let p = write(
            "bad.attn",
            &format!("attention b(x: f32[T]) -> f32[T] {{\n    y[t] = x[t] + {bad}\n    return y\n}}\n"),
        );
        let (code, t) = run(&["check", &p]);
        assert_eq!(code, Some(1), "{bad}: {t}");
        assert!(t.contains(says), "{bad}: {t}");
    }
}
