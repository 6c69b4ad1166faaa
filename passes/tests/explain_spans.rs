//! Explanations point at the source of what they explain: a score term that has no bound (so
//! ACP cannot derive a threshold) is shown at the term itself, not at the statement.

mod common;

use foxc_passes::{optimize, PassOptions};

/// FoX whose scores add `extra` (over `kb: f32[B, H, T]`, declared without a range).
fn program(extra: &str) -> String {
    format!(
        "attention fox_extra(q: bf16[B, H, T, D], k: bf16[B, H, T, D], v: bf16[B, H, T, D], fgate: f32[B, H, T], kb: f32[B, H, T]) -> bf16[B, H, T, D] {{
    c[b, h, t]      = cumsum(t, logsigmoid(fgate[b, h, t]))
    s[b, h, i, j]   = sum(d, q[b, h, i, d] * k[b, h, j, d]) / sqrt(D) + c[b, h, i] - c[b, h, j] + {extra}
    p[b, h, i, j]   = softmax(j, causal(i, j, s[b, h, i, j]))
    out[b, h, i, d] = sum(j, p[b, h, i, j] * v[b, h, j, d])
    return out
}}
"
    )
}

/// The "has no bound" explanation of `extra` and the source text its span covers.
fn unbounded_at(extra: &str) -> (String, String) {
    let src = program(extra);
    let mut g = match foxc_ir::frontend::compile("fox_extra.attn", src.as_bytes()) {
        Ok(c) => c.graph,
        Err(d) => panic!("does not compile:\n{}", d.render("fox_extra.attn", &src)),
    };
    let report = optimize(&mut g, &PassOptions::default()).expect("optimizes");
    let e =
        report.explanations.iter().find(|e| e.message.contains("has no bound")).unwrap_or_else(|| {
            panic!("`{extra}`: no unbounded-term explanation in {:?}", report.explanations)
        });
    (e.message.clone(), src.get(e.span.range()).unwrap_or("<bad span>").to_string())
}

#[test]
fn an_unbounded_term_is_explained_at_the_term() {
    let mut text = String::new();
    for (extra, at) in [
        ("kb[b, h, j]", "kb[b, h, j]"),
        ("abs(kb[b, h, j])", "abs(kb[b, h, j])"),
        ("0.5 * kb[b, h, i] * kb[b, h, j]", "kb[b, h, i] * kb[b, h, j]"),
    ] {
        let (message, shown) = unbounded_at(extra);
        assert_eq!(shown, at, "{message}");
        text.push_str(&format!("+ {extra}\n  note: {message}\n  at `{shown}`\n"));
    }
    insta::assert_snapshot!("unbounded_terms", text);
}
