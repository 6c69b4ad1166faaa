//! `foxc check` says at check time which backend cannot run an accepted program (issue 25,
//! item 1): it compiles the GPU forward and backward with the dims unbound and prints a note
//! per refusal, with the reason; a program every backend runs gets no note.

mod common;

use common::{foxc, text, tmp};

fn check(name: &str, src: &str) -> (Option<i32>, String) {
    let p = tmp("checkbk", name);
    std::fs::write(&p, src).unwrap();
    let o = foxc(&["check", p.to_str().unwrap()]);
    (o.status.code(), text(&o))
}

const FOX: &str = "attention fox(q: bf16[B, H, T, D], k: bf16[B, H, T, D], v: bf16[B, H, T, D], fgate: f32[B, H, T]) -> bf16[B, H, T, D] {
    c[b, h, t]      = cumsum(t, logsigmoid(fgate[b, h, t]))
    s[b, h, i, j]   = sum(d, q[b, h, i, d] * k[b, h, j, d]) / sqrt(D) + c[b, h, i] - c[b, h, j]
    p[b, h, i, j]   = softmax(j, causal(i, j, s[b, h, i, j]))
    out[b, h, i, d] = sum(j, p[b, h, i, j] * v[b, h, j, d])
    return out
}
";

#[test]
fn every_backend_runs_fox() {
    let (code, t) = check("fox.attn", FOX);
    assert_eq!(code, Some(0), "{t}");
    assert!(!t.contains("note:"), "{t}");
}

/// f16 attention runs on the GPU too (it was the forward's note before the GPU kernels took
/// f16), and so does an f16 output of bf16 operands (f32 from the kernel, then a cast).
#[test]
fn f16_attentions_run_on_every_backend() {
    let mixed = FOX.replace("-> bf16", "-> f16");
    for (name, src) in [("fox16.attn", FOX.replace("bf16", "f16")), ("mixed.attn", mixed)] {
        let (code, t) = check(name, &src);
        assert_eq!(code, Some(0), "{t}");
        assert!(!t.contains("note:"), "{name}: {t}");
    }
}

#[test]
fn a_gpu_backward_refusal_is_a_note() {
    // A reversed decay read `c[b, h, T - 1 - i]` runs forward on the GPU (the dim term is a
    // kernel argument); its capture gradient is computed on the CPU only.
    let src = FOX.replace("+ c[b, h, i] - c[b, h, j]", "+ c[b, h, T - 1 - i] - c[b, h, j]");
    let (code, t) = check("rev.attn", &src);
    assert_eq!(code, Some(0), "{t}");
    assert!(
        t.contains("note: the CUDA backend (sm_90a) cannot run the backward") && t.contains("-i + T - 1"),
        "{t}"
    );
    assert_eq!(t.matches("note:").count(), 1, "{t}");
    // The GPU's "not yet" names the backend that runs it, once (the note added it again, and
    // the error advised "run the passes first").
    assert!(t.contains("cannot yet run an attention with") && !t.contains("run the passes"), "{t}");
    assert_eq!(t.matches("the CPU backend").count(), 1, "{t}");
}

#[test]
fn a_gradient_no_backend_has_is_said_once() {
    // `rel[a + b]` reads an element many times: its gradient needs a scatter-add, which no
    // backend has.
    let src = "attention r(x: f32[T], rel: f32[U]) -> f32[T] {\n    o[a] = sum(b, x[a] * x[b] * rel[a + b])\n    return o\n}\n";
    let (code, t) = check("rel.attn", src);
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("note: no backend can run the backward") && t.contains("[a + b]"), "{t}");
    assert_eq!(t.matches("note:").count(), 1, "{t}");
    // RoPE's rotate-half has one (each element is read once): no note.
    let src = "attention rope(q: f32[B, H, T, D], sn: f32[T, D]) -> f32[B, H, T, D] {
    r[b, h, t, d] = q[b, h, t, d] + select(d < D / 2, q[b, h, t, d + D / 2], 0) * sn[t, d]
    return r
}
";
    let (code, t) = check("rope.attn", src);
    assert_eq!(code, Some(0), "{t}");
    assert!(!t.contains("note:"), "{t}");
}

#[test]
fn a_large_program_is_not_compiled_at_check_time() {
    // 300 statements: over the node limit, so check answers at once and says what it skipped.
    let mut body = String::from("    x1[t] = q[t] * 0.5\n");
    for k in 2..=300 {
        body.push_str(&format!("    x{k}[t] = x{}[t] * 0.5 + x{}[t] * 0.25\n", k - 1, k - 1));
    }
    let src = format!("attention big(q: f32[T]) -> f32[T] {{\n{body}    return x300\n}}\n");
    let (code, t) = check("big.attn", &src);
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("note: not compiled for the GPU at check time"), "{t}");
}
