//! Packed sequences (issue 25, item 5): several sequences back to back in one row of T tokens,
//! each token's first key given per token (`first[b, t]`, the start of its sequence), spelled
//! as the padding mask of one sequence is: `select(j >= first[b, i], s, -inf)` under the causal
//! mask. The decay needs no reset: `c_i - c_j` within a sequence is the sum of its own log gates.
//! Fused, still pruned (the select that wraps the decay is split), the key tiles below every
//! row's first key skipped (`keys_from`), against the f64 reference of the program as written;
//! the standard inputs draw `first` uniformly, so rows with no key at all (`first > i`) occur
//! and must be 0.

mod common;

use common::{cpu_check, fresh_seed as seed, run_cli as run};

const PACKED: &str = "attention packed(q: bf16[B, H, T, D], k: bf16[B, H, T, D], v: bf16[B, H, T, D], fgate: f32[B, H, T], first: i32[B, T] in [0, 200]) -> bf16[B, H, T, D] {
    c[b, h, t]      = cumsum(t, logsigmoid(fgate[b, h, t]))
    s[b, h, i, j]   = sum(d, q[b, h, i, d] * k[b, h, j, d]) / sqrt(D) + c[b, h, i] - c[b, h, j]
    p[b, h, i, j]   = softmax(j, causal(i, j, select(j >= first[b, i], s[b, h, i, j], -inf)))
    out[b, h, i, d] = sum(j, p[b, h, i, j] * v[b, h, j, d])
    return out
}
";

#[test]
fn packed_sequences_are_one_pruned_attention() {
    let p = common::write_program("packed", "packed.attn", PACKED);
    assert_one_pruned_attention(&p, "cpu");
    check_against_the_reference(&p, &["B=2,H=4,T=300,D=16", "B=1,H=2,T=70,D=8"]);
}

/// `p` optimized for `target` (D = 64) is one causal attention, pruned, whose key bound is each
/// row's first key, the parameter `first` (a trivial bound such as `keys_from = 0` fails).
fn assert_one_pruned_attention(p: &str, target: &str) {
    let (code, t) = run(&["compile", p, "--emit", "opt", "--target", target, "--shape", "D=64"]);
    assert_eq!(code, Some(0), "{t}");
    let first = t.lines().find(|l| l.contains(r#"= param "first""#)).unwrap_or_else(|| panic!("{t}"));
    let first = first.split_whitespace().next().unwrap();
    let attn: Vec<&str> = t.lines().filter(|l| l.contains("= attention {")).collect();
    assert_eq!(attn.len(), 1, "{target}: {t}");
    assert!(
        attn[0].contains("mask = causal")
            && attn[0].contains(&format!("keys_from = {first}[b, i]"))
            && attn[0].contains("pruned"),
        "{target}: {t}"
    );
}

/// Forward (pruned and dense, every row) and gradients of `p` on the CPU against the reference.
fn check_against_the_reference(p: &str, shapes: &[&str]) {
    let s = seed();
    for shape in shapes {
        for prune in [true, false] {
            let t = cpu_check("run", p, shape, &s, prune);
            assert!(t.contains("all rows"), "{t}");
        }
        let t = cpu_check("grad", p, shape, &s, true);
        assert!(t.contains("check grad_fgate"), "{t}");
    }
}

/// Packed sequences prefilled against a cache: `N` new tokens at the end of `M` keys (a chunk
/// of a packed batch whose earlier tokens are cached), each query's first key `first[b, i]` a
/// key position. One fused, pruned attention with the key bound, forward and gradients against
/// the reference, pruned and dense; rows whose sequence starts after their own position have no
/// key and are 0.
#[test]
fn packed_sequences_against_a_cache_are_one_pruned_attention() {
    const PACKED_CACHE: &str = include_str!("../bench/fox_packed_cache.attn");
    let p = common::write_program("packed", "packed_cache.attn", PACKED_CACHE);
    for target in ["cpu", "sm_90a"] {
        assert_one_pruned_attention(&p, target);
    }
    check_against_the_reference(&p, &["B=2,H=2,N=100,M=300,D=16", "B=1,H=2,N=7,M=450,D=8"]);
}
