//! `and` / `or` in the condition of a `select` (issue 25, item 1): they lower to nested selects
//! of one comparison each, so the masks recognition knows stay visible. A padding start joined
//! to the causal mask with `and`, in either order, fuses and is pruned on the CPU, against the
//! f64 interpreter (`--check`); so does `or` of the negated masks with `-inf` first; `and`
//! outside a select is a positioned diagnostic (exit 1). Fresh inputs each run (seed printed).
//!
//! Shown failing: without the `mask-into-causal` rewrite, `j >= start[b] and j <= i` ran unfused
//! and dense ("pruning: off"), 30x slower.

mod common;

use common::{foxc, text, tmp};

const PADDED: &str = "attention fox_and(q: bf16[B, H, T, D], k: bf16[B, H, T, D], v: bf16[B, H, T, D], fgate: f32[B, H, T], start: f32[B]) -> bf16[B, H, T, D] {
    c[b, h, t]      = cumsum(t, logsigmoid(fgate[b, h, t]))
    s[b, h, i, j]   = sum(d, q[b, h, i, d] * k[b, h, j, d]) / sqrt(D) + c[b, h, i] - c[b, h, j]
    p[b, h, i, j]   = softmax(j, select(COND, s[b, h, i, j], -inf))
    out[b, h, i, d] = sum(j, p[b, h, i, j] * v[b, h, j, d])
    return out
}
";

fn seed() -> String {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let seed = (t.as_nanos() as u64 ^ 0x2f1e_05c3_9b7a_d441) % 1_000_000_007;
    eprintln!("conditions: seed {seed}");
    seed.to_string()
}

fn run_check(name: &str, src: &str) -> String {
    let p = tmp("cond", name);
    std::fs::write(&p, src).unwrap();
    let seed = seed();
    let o = foxc(&[
        "run",
        p.to_str().unwrap(),
        "--backend",
        "cpu",
        "--check",
        "--shape",
        "B=2,H=2,T=200,D=16",
        "--seed",
        &seed,
    ]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{name}: {t}");
    t
}

#[test]
fn a_start_and_the_causal_mask_fuse_and_prune_in_either_order() {
    for cond in ["j >= start[b] and j <= i", "j <= i and j >= start[b]"] {
        let t = run_check("and.attn", &PADDED.replace("COND", cond));
        assert!(t.contains("pruning: paper rule"), "{cond}: not pruned:\n{t}");
        assert!(t.contains("check: ok"), "{t}");
    }
}

/// `or` of the dropped entries, `-inf` first, in either order: the causal mask comes out of the
/// conjunction of the two drops (shown failing before: with the start first, "no decay attention
/// recognized", unfused and dense).
#[test]
fn or_of_negated_masks_fuses_and_prunes_in_either_order() {
    for cond in ["j > i or j < start[b]", "j < start[b] or j > i"] {
        let src = PADDED
            .replace("select(COND, s[b, h, i, j], -inf)", &format!("select({cond}, -inf, s[b, h, i, j])"));
        let t = run_check("or.attn", &src);
        assert!(t.contains("pruning: paper rule"), "{cond}: not pruned:\n{t}");
        assert!(t.contains("check: ok"), "{t}");
    }
}

#[test]
fn and_outside_a_select_is_a_diagnostic() {
    let p = tmp("cond", "bare.attn");
    std::fs::write(
        &p,
        "attention g(q: f32[A, C]) -> f32[A, C] {\n    y[a, c] = select(q[a, c] > 0, 1, 0) * (q[a, c] > 0 and q[a, c] < 1)\n    return y\n}\n",
    )
    .unwrap();
    let o = foxc(&["check", p.to_str().unwrap()]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(t.contains("`and` outside the condition of a `select`") && t.contains("bare.attn:2:"), "{t}");
}
