//! The DSL's attention variants (issue 8): new unary functions, `-inf` literals and index
//! expressions (`gather`), checked on the f64 interpreter with hand-computed values and against
//! equivalent programs, plus the print-parse round trip of the AST form.

use foxc_ir::frontend::{compile, parse};
use foxc_ir::interp::{run, Tensor};
use foxc_ir::{DType, Dim, Graph, Op, Span, ValueType};
use std::collections::BTreeMap;

/// Deterministic, non-trivial inputs (never zeros): a small LCG.
fn rand_tensor(shape: &[usize], seed: u64, lo: f64, hi: f64) -> Tensor {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    Tensor::from_fn(shape, |_| {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let u = ((s >> 11) as f64) / ((1u64 << 53) as f64);
        lo + (hi - lo) * (0.05 + 0.9 * u)
    })
}

fn example(name: &str) -> Graph {
    let path = format!("../examples/{name}");
    let bytes = std::fs::read(&path).unwrap();
    compile(name, &bytes).unwrap_or_else(|d| panic!("{}", d.render_bytes(name, &bytes))).graph
}

fn program(src: &str) -> Graph {
    compile("t.attn", src.as_bytes())
        .unwrap_or_else(|d| panic!("{}", d.render_bytes("t.attn", src.as_bytes())))
        .graph
}

fn run_with(g: &Graph, inputs: &[(&str, Tensor)]) -> Tensor {
    let m: BTreeMap<String, Tensor> = inputs.iter().map(|(k, t)| (k.to_string(), t.clone())).collect();
    run(g, &m).unwrap_or_else(|e| panic!("{}: {e}", g.name)).output
}

fn close(a: &Tensor, b: &Tensor, tol: f64) {
    assert_eq!(a.shape, b.shape);
    for (l, (x, y)) in a.data.iter().zip(&b.data).enumerate() {
        assert!((x - y).abs() <= tol * (1.0 + y.abs()), "element {l}: {x} vs {y}");
    }
}

const B: usize = 1;
const H: usize = 4;
const G: usize = 2;
const T: usize = 6;
const D: usize = 4;

fn qkv(seed: u64, heads: usize) -> (Tensor, Tensor, Tensor) {
    (
        rand_tensor(&[B, H, T, D], seed, -1.0, 1.0),
        rand_tensor(&[B, heads, T, D], seed + 1, -1.0, 1.0),
        rand_tensor(&[B, heads, T, D], seed + 2, -1.0, 1.0),
    )
}

#[test]
fn new_unary_functions_evaluate() {
    let g = program(
        "attention u(x: f32[T]) -> f32[T] {\n o[t] = tanh(x[t]) + abs(x[t]) * 10 + exp2(x[t]) * 100 + log2(abs(x[t])) * 1000\n return o\n}",
    );
    let x = Tensor::new(&[3], vec![-2.0, 0.5, 4.0]);
    let o = run_with(&g, &[("x", x.clone())]);
    let want: Vec<f64> = x
        .data
        .iter()
        .map(|v| v.tanh() + v.abs() * 10.0 + v.exp2() * 100.0 + v.abs().log2() * 1000.0)
        .collect();
    assert_eq!(o.data, want);
}

#[test]
fn floor_division_subscript_by_hand() {
    let g = program("attention h(x: f32[T], y: f32[T]) -> f32[T] {\n o[t] = x[t] + y[t / 2]\n return o\n}");
    let x = Tensor::new(&[5], vec![1.0, 2.0, 3.0, 4.0, 5.0]);
    let y = Tensor::new(&[5], vec![10.0, 20.0, 30.0, 40.0, 50.0]);
    assert_eq!(run_with(&g, &[("x", x), ("y", y)]).data, [11.0, 12.0, 23.0, 24.0, 35.0]);
}

#[test]
fn grouped_heads_by_hand() {
    let g = program(
        "attention h(q: f32[H, T], k: f32[G, T]) -> f32[H, T] {\n o[h, t] = q[h, t] * 0 + k[h / (H / G), t]\n return o\n}",
    );
    let q = rand_tensor(&[4, 2], 1, -1.0, 1.0);
    let k = Tensor::new(&[2, 2], vec![1.0, 2.0, 3.0, 4.0]);
    assert_eq!(run_with(&g, &[("q", q), ("k", k)]).data, [1.0, 2.0, 1.0, 2.0, 3.0, 4.0, 3.0, 4.0]);
    // G must divide H.
    let m: BTreeMap<String, Tensor> = [
        ("q".to_string(), rand_tensor(&[4, 2], 1, -1.0, 1.0)),
        ("k".to_string(), rand_tensor(&[3, 2], 2, -1.0, 1.0)),
    ]
    .into();
    let e = run(&g, &m).unwrap_err().to_string();
    assert!(e.contains("H = 4 is not divisible by G = 3"), "{e}");
}

#[test]
fn relative_position_under_causal_mask_by_hand() {
    let g = program(
        "attention r(x: f32[T], rel: f32[T]) -> f32[T, T] {\n m[i, j] = causal(i, j, x[i] * 0 + x[j] * 0 + rel[i - j])\n return m\n}",
    );
    let x = Tensor::new(&[3], vec![1.0, 2.0, 3.0]);
    let rel = Tensor::new(&[3], vec![10.0, 20.0, 30.0]);
    let n = f64::NEG_INFINITY;
    assert_eq!(run_with(&g, &[("x", x), ("rel", rel)]).data, [10.0, n, n, 20.0, 10.0, n, 30.0, 20.0, 10.0]);
}

#[test]
fn select_mask_with_negative_infinity_literal() {
    let g = program(
        "attention r(x: f32[T], rel: f32[T]) -> f32[T, T] {\n s[i, j] = x[i] + x[j] + rel[i - j]\n m[a, b] = select(b <= a, s[a, b], -inf)\n return m\n}",
    );
    let x = Tensor::new(&[2], vec![1.0, 2.0]);
    let rel = Tensor::new(&[2], vec![10.0, 20.0]);
    assert_eq!(run_with(&g, &[("x", x), ("rel", rel)]).data, [12.0, f64::NEG_INFINITY, 23.0, 14.0]);
}

/// An out-of-range read is NaN, never a wrong number: a gather built by hand past the end.
#[test]
fn out_of_range_reads_are_nan() {
    let sp = Span::default();
    let mut g = Graph::new("shift");
    let x = g.add_param("x", ValueType::tensor(DType::F32, [Dim::sym("T")]), sp);
    let ix = foxc_ir::index::IndexExpr {
        terms: vec![("t".into(), 1)],
        dim_terms: vec![],
        constant: 1,
        div: None,
        clamps: vec![],
    };
    let ty = ValueType { dtype: DType::F32, axes: vec![foxc_ir::Axis::new("t", Dim::sym("T"))] };
    let gth = g.add(Op::Gather { index: vec![ix], axes: vec!["t".into()] }, ty, &[x], sp);
    g.output = Some(g.add(
        Op::Store { axes: vec!["t".into()] },
        ValueType::tensor(DType::F32, [Dim::sym("T")]),
        &[gth],
        sp,
    ));
    foxc_ir::verify::verify(&g).unwrap();
    let o = run_with(&g, &[("x", Tensor::new(&[3], vec![1.0, 2.0, 3.0]))]);
    assert_eq!(&o.data[..2], [2.0, 3.0]);
    assert!(o.data[2].is_nan());
}

fn fox_inputs(seed: u64, heads: usize) -> Vec<(&'static str, Tensor)> {
    let (q, k, v) = qkv(seed, heads);
    vec![("q", q), ("k", k), ("v", v), ("fgate", rand_tensor(&[B, H, T], seed + 3, -1.0, 3.0))]
}

#[test]
fn grouped_query_fox_equals_fox_with_repeated_heads() {
    let inputs = fox_inputs(10, G);
    let gqa = run_with(&example("fox_gqa.attn"), &inputs);
    let repeat = |t: &Tensor| {
        Tensor::from_fn(&[B, H, T, D], |l| {
            let (h, rest) = ((l / (T * D)) % H, l % (T * D));
            t.data[(h / (H / G)) * T * D + rest]
        })
    };
    let full: Vec<(&str, Tensor)> = inputs
        .iter()
        .map(|(n, t)| (*n, if *n == "k" || *n == "v" { repeat(t) } else { t.clone() }))
        .collect();
    let fox = run_with(&example("fox.attn"), &full);
    close(&gqa, &fox, 1e-12);
}

#[test]
fn handwritten_softmax_equals_fox() {
    let inputs = fox_inputs(20, H);
    close(
        &run_with(&example("fox_handwritten.attn"), &inputs),
        &run_with(&example("fox.attn"), &inputs),
        1e-9,
    );
}

#[test]
fn alibi_spelled_with_m_equals_alibi() {
    let (q, k, v) = qkv(30, H);
    let m = rand_tensor(&[H], 33, 0.0, 1.0);
    let a = run_with(
        &example("alibi_m.attn"),
        &[("q", q.clone()), ("k", k.clone()), ("v", v.clone()), ("m", m.clone())],
    );
    let b = run_with(&example("alibi.attn"), &[("q", q), ("k", k), ("v", v), ("slope", m)]);
    close(&a, &b, 1e-12);
}

#[test]
fn fox_alibi_and_keybias_reduce_to_fox() {
    let inputs = fox_inputs(40, H);
    let fox = run_with(&example("fox.attn"), &inputs);
    let mut with_m = inputs.clone();
    with_m.push(("m", Tensor::new(&[H], vec![0.0; H])));
    close(&run_with(&example("fox_alibi.attn"), &with_m), &fox, 1e-12);
    // A constant key bias cancels in the softmax.
    let mut with_kb = inputs.clone();
    with_kb.push(("kb", Tensor::new(&[B, H, T], vec![-2.5; B * H * T])));
    close(&run_with(&example("fox_keybias.attn"), &with_kb), &fox, 1e-9);
    // A non-constant one changes the result.
    with_kb.pop();
    with_kb.push(("kb", rand_tensor(&[B, H, T], 41, -4.0, 0.0)));
    let kb = run_with(&example("fox_keybias.attn"), &with_kb);
    assert!(kb.data.iter().zip(&fox.data).any(|(a, b)| (a - b).abs() > 1e-3));
}

#[test]
fn softcap_bounds_the_score() {
    // With a cap far above the scores, softcapped FoX is FoX; with cap 20 it differs once the
    // scores are large (q, k scaled up).
    let src = std::fs::read_to_string("../examples/fox_softcap.attn").unwrap();
    let wide = program(&src.replace("20", "1e6"));
    let inputs = fox_inputs(50, H);
    close(&run_with(&wide, &inputs), &run_with(&example("fox.attn"), &inputs), 1e-6);
    let big: Vec<(&str, Tensor)> = inputs
        .iter()
        .map(|(n, t)| {
            (
                *n,
                if *n == "q" || *n == "k" {
                    Tensor::new(&t.shape, t.data.iter().map(|x| x * 12.0).collect())
                } else {
                    t.clone()
                },
            )
        })
        .collect();
    let capped = run_with(&example("fox_softcap.attn"), &big);
    let plain = run_with(&example("fox.attn"), &big);
    assert!(capped.data.iter().all(|x| x.is_finite()));
    assert!(capped.data.iter().zip(&plain.data).any(|(a, b)| (a - b).abs() > 1e-3));
}

/// `--emit ast` prints every expression fully parenthesized in DSL syntax: rebuilding the
/// program from it parses back to the same printed form.
#[test]
fn ast_print_parse_round_trip() {
    for name in [
        "fox_softcap.attn",
        "fox_gqa.attn",
        "fox_alibi.attn",
        "fox_keybias.attn",
        "fox_handwritten.attn",
        "alibi_m.attn",
        "fox.attn",
    ] {
        let bytes = std::fs::read(format!("../examples/{name}")).unwrap();
        let a = parse(name, &bytes).unwrap();
        let src = to_source(&a);
        let b = parse(name, src.as_bytes())
            .unwrap_or_else(|d| panic!("{}\n{src}", d.render_bytes(name, src.as_bytes())));
        assert_eq!(to_source(&b), src, "{name}");
        let stmts =
            |p: &foxc_ir::ast::Program| p.stmts.iter().map(|s| s.value.to_string()).collect::<Vec<_>>();
        assert_eq!(stmts(&a), stmts(&b));
        compile(name, src.as_bytes()).unwrap();
    }
}

fn to_source(p: &foxc_ir::ast::Program) -> String {
    let bound = |x: f64| {
        if x.is_infinite() {
            if x > 0.0 {
                "inf".into()
            } else {
                "-inf".into()
            }
        } else {
            format!("{x}")
        }
    };
    let params: Vec<String> = p
        .params
        .iter()
        .map(|d| match d.range {
            Some((lo, hi)) => format!("{}: {} in [{}, {}]", d.name.name, d.ty, bound(lo), bound(hi)),
            None => format!("{}: {}", d.name.name, d.ty),
        })
        .collect();
    let mut s = format!("attention {}({}) -> {} {{\n", p.name.name, params.join(", "), p.ret);
    for st in &p.stmts {
        let ix: Vec<&str> = st.indices.iter().map(|i| i.name.as_str()).collect();
        let lhs =
            if ix.is_empty() { st.name.name.clone() } else { format!("{}[{}]", st.name.name, ix.join(", ")) };
        s.push_str(&format!("  {lhs} = {}\n", st.value));
    }
    s.push_str(&format!("  return {}\n}}\n", p.result.name));
    s
}

#[test]
fn masked_subscripts_must_stay_masked() {
    let bad = |src: &str, want: &str| {
        let d = compile("t.attn", src.as_bytes()).unwrap_err();
        let text = d.render_bytes("t.attn", src.as_bytes());
        assert!(text.contains(want), "{text}");
    };
    // Summed over j before any mask.
    bad(
        "attention r(x: f32[T], rel: f32[T]) -> f32[T] {\n s[i] = sum(j, x[i] * x[j] + rel[i - j])\n return s\n}",
        "`sum` over `j` combines its entries first",
    );
    // Returned unmasked.
    bad(
        "attention r(x: f32[T], rel: f32[T]) -> f32[T, T] {\n s[i, j] = x[i] * x[j] + rel[i - j]\n return s\n}",
        "it reaches the program's result",
    );
    // Masked the wrong way round: j >= i keeps exactly the entries that are out of range.
    bad(
        "attention r(x: f32[T], rel: f32[T]) -> f32[T, T] {\n s[i, j] = causal(j, i, x[i] * x[j] + rel[i - j])\n return s\n}",
        "can be out of range",
    );
    // Masked in a later statement, through renamed axes: accepted.
    program(
        "attention r(x: f32[T], rel: f32[T]) -> f32[T] {\n s[i, j] = x[i] * x[j] + rel[i - j]\n p[a, b] = softmax(b, causal(a, b, s[a, b]))\n o[a] = sum(b, p[a, b] * x[b])\n return o\n}",
    );
}

/// Soundness of the range rule, exhaustively over small subscripts `(a*i + b*j + c) [/ 2]` and
/// every mask spelling: whatever the front end accepts never reads outside `rel` (which would be
/// NaN in the output) at any size that its bind-time checks admit. Also not vacuous: the masked relative position is accepted.
#[test]
fn accepted_subscripts_never_read_out_of_range() {
    let wraps = [
        "s[i, j]",
        "causal(i, j, s[i, j])",
        "causal(j, i, s[i, j])",
        "window(i, j, 2, s[i, j])",
        "select(j <= i, s[i, j], -inf)",
        "select(i >= j, s[i, j], -inf)",
        "select(j > i, -inf, s[i, j])",
        "select(i <= j, s[i, j], -inf)",
        "exp(s[i, j])",
    ];
    let (mut accepted, mut total, mut refused_at_bind) = (0, 0, 0);
    for a in -2i64..=2 {
        for b in -2i64..=2 {
            for c in -2i64..=2 {
                for div in [false, true] {
                    let affine = format!("{a} * i + {b} * j + {c}").replace("+ -", "- ");
                    let sub = if div { format!("({affine}) / 2") } else { affine };
                    for w in wraps {
                        total += 1;
                        let src = format!(
                            "attention r(x: f32[T], rel: f32[T]) -> f32[T, T] {{\n s[i, j] = x[i] * 0 + x[j] * 0 + rel[{sub}]\n m[i, j] = {w}\n return m\n}}"
                        );
                        let Ok(c) = compile("t.attn", src.as_bytes()) else { continue };
                        accepted += 1;
                        // The gather's subscript prints as DSL that lowers to the same subscript.
                        let gather = |g: &Graph| {
                            let n = g.find(|op| matches!(op, Op::Gather { .. }))[0];
                            let Op::Gather { index, .. } = g.op(n) else { unreachable!() };
                            index[0].clone()
                        };
                        let ix = gather(&c.graph);
                        let again = program(&src.replace(&format!("rel[{sub}]"), &format!("rel[{ix}]")));
                        if ix.is_plain_var().is_none() {
                            assert_eq!(gather(&again), ix, "{sub} printed as {ix}");
                        }
                        for t in [1usize, 2, 5] {
                            // A subscript in range only at some sizes is checked when T is
                            // bound; at the sizes it refuses there is nothing to run.
                            let bound = |s: &str| (s == "T").then_some(t as u64);
                            if c.graph.bind_checks.iter().any(|b| b.holds(&bound).is_err()) {
                                refused_at_bind += 1;
                                continue;
                            }
                            let x = rand_tensor(&[t], 7, -1.0, 1.0);
                            let rel = rand_tensor(&[t], 8, -1.0, 1.0);
                            let o = run_with(&c.graph, &[("x", x), ("rel", rel)]);
                            assert!(o.data.iter().all(|v| !v.is_nan()), "NaN at T = {t}:\n{src}");
                        }
                    }
                }
            }
        }
    }
    assert!(accepted > 100 && accepted < total, "accepted {accepted} of {total}");
    // Constant subscripts (`rel[2]`) fit long enough axes only: refused at T = 1 and 2.
    assert!(refused_at_bind > 0, "no subscript was left to the bind-time check");
    for ok in ["i - j", "(i - j) / 2", "i + -1 * j"] {
        let src = format!(
            "attention r(x: f32[T], rel: f32[T]) -> f32[T, T] {{\n s[i, j] = x[i] * 0 + x[j] * 0 + rel[{ok}]\n m[i, j] = causal(i, j, s[i, j])\n return m\n}}"
        );
        compile("t.attn", src.as_bytes())
            .unwrap_or_else(|d| panic!("{ok}: {}", d.render_bytes("t.attn", src.as_bytes())));
    }
}
