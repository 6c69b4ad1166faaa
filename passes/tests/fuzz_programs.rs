//! Grammar-aware fuzzing of the DSL front end and the passes.
//!
//! A proptest strategy builds attention programs from the grammar (docs: ir/src/parser.rs) with
//! the shapes real programs have: gates (logits, log-gates, ALiBi slopes), scores with or without
//! scale, softcap, decay bias and extra terms, masks (causal, window, select, none), QK-norm,
//! grouped-query heads, dtypes, plus a random arithmetic term over the names in scope. Each
//! program is also mutated into a near miss (a token deleted, duplicated, swapped or replaced).
//! Every program, well-formed or not:
//! - parses, checks and lowers, or is refused with a diagnostic that is not an internal error;
//!   nothing panics (the whole pipeline runs under `catch_unwind`);
//! - when it compiles, optimizes (pruned and dense) without an internal error, and the dense
//!   optimized graph computes what the unoptimized graph computes on fresh random inputs
//!   (interpreter, relative 1e-9; NaN where the other has NaN);
//! - when it parses, prints back to source (`Program::to_source`) that parses to the same AST,
//!   and `--emit ast` of the reparse is the same text up to byte positions.
//!
//! Bounded for CI: 96 programs per property at T <= 7.

use foxc_ir::interp::{self, Tensor};
use foxc_ir::{frontend, Dim, Graph};
use foxc_passes::{optimize, PassOptions};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;

/// The pieces of a generated program.
#[derive(Clone, Debug)]
struct Spec {
    dt: [&'static str; 4],
    gate: u8,
    gqa: bool,
    qknorm: bool,
    scale: u8,
    softcap: Option<u32>,
    bias: u8,
    mask: u8,
    window: u32,
    extra: Option<String>,
}

/// A random scalar expression over the names a score statement sees (`b, h, i, j` in scope):
/// numbers, dims, accesses with index expressions, calls, unary minus, every binary operator.
fn term() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        (0u32..40).prop_map(|n| format!("{n}")),
        (1u32..9).prop_map(|n| format!("0.{n}5")),
        Just("1e-3".to_string()),
        Just("D".to_string()),
        Just("inf".to_string()),
        Just("c[b, h, i]".to_string()),
        Just("c[b, h, j]".to_string()),
        Just("c[b, h, i - 1]".to_string()),
        Just("q[b, h, i, 0]".to_string()),
        Just("i".to_string()),
        Just("(i - j)".to_string()),
    ];
    leaf.prop_recursive(4, 24, 3, |inner| {
        prop_oneof![
            (
                inner.clone(),
                prop::sample::select(vec!["+", "-", "*", "/", "<", "<=", ">", ">=", "==", "!="]),
                inner.clone()
            )
                // A divisor that cannot be zero: the rewrites are real-number algebra and do not
                // keep the sign of a zero (`-(i - j)` may become `j - i`), so `1 / -(i - j)` at
                // i = j is an infinity of either sign (docs/SEMANTICS.md, "Signed zeros").
                .prop_map(|(a, op, b)| match op {
                    "/" => format!("({a} / (1 + abs({b})))"),
                    _ => format!("({a} {op} {b})"),
                }),
            inner.clone().prop_map(|a| format!("-{a}")),
            (
                prop::sample::select(vec!["exp", "tanh", "logsigmoid", "sqrt", "abs", "log", "softplus"]),
                inner.clone()
            )
                .prop_map(|(f, a)| format!("{f}({a})")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("min({a}, {b})")),
            (inner.clone(), inner.clone(), inner).prop_map(|(a, b, c)| format!("select({a}, {b}, {c})")),
        ]
    })
}

fn spec() -> impl Strategy<Value = Spec> {
    let dt = prop::sample::select(vec!["bf16", "f32", "f16"]);
    (
        [dt.clone(), dt.clone(), dt.clone(), dt],
        0u8..4,
        any::<bool>(),
        any::<bool>(),
        0u8..3,
        prop::option::weighted(0.3, 5u32..40),
        0u8..4,
        0u8..5,
        1u32..6,
        prop::option::weighted(0.3, term()),
    )
        .prop_map(|(dt, gate, gqa, qknorm, scale, softcap, bias, mask, window, extra)| Spec {
            dt,
            gate,
            gqa,
            qknorm,
            scale,
            softcap,
            bias,
            mask,
            window,
            extra,
        })
}

/// The program's source text.
fn render(s: &Spec) -> String {
    let kv = if s.gqa { "G" } else { "H" };
    let mut params = vec![
        format!("q: {}[B, H, T, D]", s.dt[0]),
        format!("k: {}[B, {kv}, T, D]", s.dt[1]),
        format!("v: {}[B, {kv}, T, D]", s.dt[2]),
    ];
    let gate = match s.gate {
        0 => {
            params.push("fgate: f32[B, H, T]".into());
            "c[b, h, t] = cumsum(t, logsigmoid(fgate[b, h, t]))"
        }
        1 => {
            params.push("logf: f32[B, H, T] in [-inf, 0]".into());
            "c[b, h, t] = cumsum(t, logf[b, h, t])"
        }
        2 => {
            params.push("slope: f32[H] in [0, inf]".into());
            "c[b, h, t] = -(slope[h] * t)"
        }
        _ => {
            params.push("fgate: f32[B, H, T]".into());
            "c[b, h, t] = cumsum(t, -softplus(-fgate[b, h, t]))"
        }
    };
    let mut stmts = vec![gate.to_string()];
    let (qn, kn) = if s.qknorm {
        params.push("wq: f32[D]".into());
        params.push("wk: f32[D]".into());
        stmts.push("qn[b, h, t, d] = rmsnorm(q[b, h, t, d], wq[d])".into());
        stmts.push(format!("kn[b, {}, t, d] = rmsnorm(k[b, {}, t, d], wk[d])", "g", "g"));
        ("qn", "kn")
    } else {
        ("q", "k")
    };
    let kvi = if s.gqa { "h / (H / G)" } else { "h" };
    let mut x = format!("sum(d, {qn}[b, h, i, d] * {kn}[b, {kvi}, j, d])");
    x = match s.scale {
        0 => format!("{x} / sqrt(D)"),
        1 => format!("{x} * 0.125"),
        _ => x,
    };
    if let Some(a) = s.softcap {
        x = format!("{a} * tanh({x} / {a})");
    }
    x = match s.bias {
        0 => format!("{x} + c[b, h, i] - c[b, h, j]"),
        1 => format!("{x} - (c[b, h, j] - c[b, h, i])"),
        2 => format!("c[b, h, i] + {x} - c[b, h, j]"),
        _ => x,
    };
    if let Some(e) = &s.extra {
        x = format!("{x} + 0.01 * {e}");
    }
    stmts.push(format!("s[b, h, i, j] = {x}"));
    let m = match s.mask {
        0 => "causal(i, j, s[b, h, i, j])".to_string(),
        1 => format!("window(i, j, {}, s[b, h, i, j])", s.window),
        2 => "select(j <= i, s[b, h, i, j], -inf)".to_string(),
        3 => "select(j > i, -inf, s[b, h, i, j])".to_string(),
        _ => "s[b, h, i, j]".to_string(),
    };
    stmts.push(format!("p[b, h, i, j] = softmax(j, {m})"));
    stmts.push(format!("out[b, h, i, d] = sum(j, p[b, h, i, j] * v[b, {kvi}, j, d])"));
    format!(
        "attention fuzz({}) -> {}[B, H, T, D] {{\n    {}\n    return out\n}}\n",
        params.join(", "),
        s.dt[3],
        stmts.join("\n    ")
    )
}

/// A near miss: one token of `src` deleted, duplicated, swapped with the next or replaced.
fn mutate(src: &str, kind: u8, at: usize, with: &str) -> String {
    let Ok(toks) = foxc_ir::lexer::lex(src) else { return src.to_string() };
    let texts: Vec<&str> = toks
        .iter()
        .map(|t| &src[t.span.start as usize..t.span.end as usize])
        .filter(|t| !t.is_empty())
        .collect();
    if texts.is_empty() {
        return src.to_string();
    }
    let k = at % texts.len();
    let mut out: Vec<&str> = texts.clone();
    match kind {
        0 => {
            out.remove(k);
        }
        1 => out.insert(k, texts[k]),
        2 if k + 1 < out.len() => out.swap(k, k + 1),
        _ => out[k] = with,
    }
    out.join(" ")
}

fn dims_of(g: &Graph, t: usize) -> BTreeMap<String, usize> {
    let mut d = BTreeMap::new();
    for s in &g.dims {
        let v = match s.as_str() {
            "B" => 1,
            "H" => 2,
            "G" => 1,
            "T" => t,
            "D" => 4,
            _ => 3,
        };
        d.insert(s.clone(), v);
    }
    d
}

/// Fresh inputs by parameter name (gates, log-gates <= 0, slopes >= 0, anything else normal).
fn inputs(g: &Graph, dims: &BTreeMap<String, usize>, seed: u64) -> Option<BTreeMap<String, Tensor>> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = BTreeMap::new();
    for p in &g.params {
        let mut shape = vec![];
        for d in p.ty.dims() {
            shape.push(match d {
                Dim::Sym(s) => *dims.get(s.as_str())?,
                Dim::Const(c) => *c as usize,
                _ => return None,
            });
        }
        let t = Tensor::from_fn(&shape, |_| match p.name.as_str() {
            "logf" => -rng.random_range(0.0..2.0f64),
            "slope" => rng.random_range(0.0..1.0),
            _ => rng.random_range(-1.5..1.5),
        });
        out.insert(p.name.clone(), t);
    }
    Some(out)
}

/// The largest finite magnitude of the program's compile-time scalars (constants and their
/// folds such as `exp(37)`), 0 without any.
fn largest_scalar(g: &Graph, dims: &BTreeMap<String, usize>) -> f64 {
    let dims: BTreeMap<String, u64> = dims.iter().map(|(k, v)| (k.clone(), *v as u64)).collect();
    g.topo_order()
        .into_iter()
        .filter_map(|n| foxc_ir::fold::scalar_value(g, n, &dims))
        .filter(|v| v.is_finite())
        .fold(0.0, |m, v| m.max(v.abs()))
}

/// One unit in the last place of `x` in `dtype` (0 for f64 and non-float dtypes).
fn ulp(dtype: foxc_ir::DType, x: f64) -> f64 {
    let bits = match dtype {
        foxc_ir::DType::BF16 => 8,
        foxc_ir::DType::F16 => 11,
        foxc_ir::DType::F32 => 24,
        _ => return 0.0,
    };
    if x == 0.0 || !x.is_finite() {
        return 0.0;
    }
    2f64.powi(x.abs().log2().floor() as i32 + 1 - bits)
}

/// The whole pipeline on one source; `Err` describes a property violation (not a refusal).
fn pipeline(src: &str, seed: u64) -> Result<(), String> {
    let compiled = match frontend::compile("fuzz.attn", src.as_bytes()) {
        Ok(c) => c,
        Err(d) => {
            let text = d.render("fuzz.attn", src);
            return if d.is_internal() {
                Err(format!("internal error from the front end:\n{text}"))
            } else {
                Ok(())
            };
        }
    };
    let g = compiled.graph;
    for prune in [true, false] {
        let mut o = g.clone();
        match optimize(&mut o, &PassOptions { prune, ..PassOptions::default() }) {
            Ok(_) => {}
            Err(foxc_passes::PassError::InvalidOption(_)) => {}
            Err(e) => return Err(format!("optimize (prune {prune}): {e}")),
        }
        if prune {
            continue;
        }
        let dims = dims_of(&g, 1 + (seed % 7) as usize);
        let Some(x) = inputs(&g, &dims, seed) else { continue };
        let (a, b) = (interp::run(&g, &x), interp::run(&o, &x));
        match (a, b) {
            (Ok(a), Ok(b)) => {
                let scale =
                    a.output
                        .data
                        .iter()
                        .fold(1e-300f64, |m, v| if v.is_finite() { m.max(v.abs()) } else { m });
                // Both are rounded to the output dtype last: f64 values a reassociation apart
                // may round to neighbours (a program adding 1e12 to every score moves them by
                // ~1e-4), so one ulp of the output dtype is the same result.
                let out_dtype = g.output.map_or(foxc_ir::DType::F32, |o| g.ty(o).dtype);
                // A score term of magnitude K (`0.01 * exp(37)` = 1.2e14) leaves the scores known
                // to K * 2^-52 absolute in f64, whatever the order of the sums; softmax weights
                // then move by up to that factor: the two graphs agree within ~4 K 2^-52.
                let k = largest_scalar(&g, &dims);
                let conditioning = 4.0 * k * f64::EPSILON * scale;
                for (u, w) in a.output.data.iter().zip(&b.output.data) {
                    let near = 1e-9 * scale + conditioning + ulp(out_dtype, u.abs().max(w.abs()));
                    let same = (u.is_nan() && w.is_nan()) || u == w || (u - w).abs() <= near;
                    if !same {
                        return Err(format!("optimized dense graph differs: {u} vs {w} (dims {dims:?})"));
                    }
                }
            }
            (Err(_), Err(_)) => {}
            (a, b) => return Err(format!("one graph runs, the other not: {:?} / {:?}", a.err(), b.err())),
        }
    }
    Ok(())
}

/// Print-parse round trip of a source that parses.
fn round_trip(src: &str) -> Result<(), String> {
    let Ok(a) = frontend::parse("a.attn", src.as_bytes()) else { return Ok(()) };
    let printed = a.to_source();
    let b = frontend::parse("b.attn", printed.as_bytes()).map_err(|d| {
        format!("the printed program does not parse:\n{printed}\n{}", d.render("b.attn", &printed))
    })?;
    if b.without_spans() != a.without_spans() {
        return Err(format!("reparse differs:\n{src}\n--- printed ---\n{printed}"));
    }
    let strip = |s: String| -> String {
        s.split_whitespace().filter(|w| !w.starts_with('@')).collect::<Vec<_>>().join(" ")
    };
    if strip(a.to_string()) != strip(b.to_string()) {
        return Err(format!("--emit ast differs:\n{a}\n{b}"));
    }
    Ok(())
}

fn guarded(src: &str, f: impl FnOnce() -> Result<(), String> + std::panic::UnwindSafe) -> Result<(), String> {
    std::panic::catch_unwind(f).unwrap_or_else(|_| Err(format!("panicked on:\n{src}")))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn well_formed_programs_go_through_the_pipeline(s in spec(), seed in any::<u64>()) {
        let src = render(&s);
        let r = guarded(&src, || pipeline(&src, seed));
        prop_assert!(r.is_ok(), "{}\n{}", r.unwrap_err(), src);
        prop_assert!(round_trip(&src).is_ok(), "{:?}", round_trip(&src));
    }

    #[test]
    fn near_misses_are_refused_or_compiled_never_a_panic(
        s in spec(),
        kind in 0u8..4,
        at in any::<usize>(),
        with in prop::sample::select(vec!["zz", "1e999", "-", "(", "]", ",", "sum", "T", "inf", "==", "attention", "0x", "\u{e9}"]),
        seed in any::<u64>(),
    ) {
        let src = mutate(&render(&s), kind, at, with);
        let r = guarded(&src, || pipeline(&src, seed));
        prop_assert!(r.is_ok(), "{}\n{}", r.unwrap_err(), src);
        let rt = guarded(&src, || round_trip(&src));
        prop_assert!(rt.is_ok(), "{}", rt.unwrap_err());
    }
}

/// The generator reaches deep: a good share of its programs compile, and some are pruned.
#[test]
fn the_generator_reaches_the_passes() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let (mut compiled, mut pruned) = (0, 0);
    for _ in 0..64 {
        let s = spec().new_tree(&mut runner).unwrap().current();
        let Ok(c) = frontend::compile("g.attn", render(&s).as_bytes()) else { continue };
        compiled += 1;
        let mut o = c.graph.clone();
        optimize(&mut o, &PassOptions::default()).unwrap();
        pruned += usize::from(!o.find(|op| matches!(op, foxc_ir::Op::Threshold { .. })).is_empty());
    }
    eprintln!("compiled {compiled} / 64, pruned {pruned}");
    assert!(compiled >= 32 && pruned >= 8, "compiled {compiled} / 64, pruned {pruned}");
}
