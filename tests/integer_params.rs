//! Integer parameters (issue 25, item 1): `start: i32[B]` is compared (`j >= start[b]`), never
//! used in float math without `float(...)`; the left-padded FoX with an integer start is still
//! fused and pruned, forward and backward, against the f64 interpreter with fresh inputs.
//! `start: i64[B]` (torch's default integers) is stored as i64 and read as i32, saturating: the
//! same bits as the i32 program, and a start beyond 2^31 masks every key as it should.
//!
//! Shown failing: with the narrowing wrapping (`x as i32`) instead of saturating, the start
//! 2^32 + 3 read as 3 and `an_i64_start_reads_as_its_i32_value` failed on batch 1.

mod common;

use common::{fresh_seed as seed, run_cli as run};
use foxc_driver::{cpu_backend, pipeline, tensors, PruneOptions, Target};
use foxc_ir::interp;
use foxc_ir::{DType, Graph, Op};
use foxc_runtime::HostTensor;
use std::collections::BTreeMap;

fn write(name: &str, src: &str) -> String {
    common::write_program("intparam", name, src)
}

fn example(name: &str) -> String {
    format!("{}/examples/{name}", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn an_integer_start_is_fused_and_pruned() {
    let p = example("fox_leftpad.attn");
    let s = seed();
    // Starts are drawn in [0, 256]: at T = 300 some rows are empty, most are not.
    let (code, t) =
        run(&["run", &p, "--backend", "cpu", "--check", "--shape", "B=3,H=4,T=300,D=16", "--seed", &s]);
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("input  start    i32 [3]") && t.contains("pruning: paper rule"), "{t}");
    assert!(t.contains("check: ok"), "{t}");
    let (code, t) =
        run(&["grad", &p, "--backend", "cpu", "--check", "--shape", "B=2,H=2,T=300,D=16", "--seed", &s]);
    assert_eq!(code, Some(0), "{t}");
    // No gradient for an integer parameter.
    assert!(t.contains("grad_fgate") && !t.contains("grad_start"), "{t}");
    // The same with `start: i64[B]`: its standard inputs are i64, checked against the interpreter.
    let text = std::fs::read_to_string(&p).unwrap().replace("start: i32[B]", "start: i64[B]");
    let p = write("leftpad_i64.attn", &text);
    let (code, t) =
        run(&["run", &p, "--backend", "cpu", "--check", "--shape", "B=3,H=4,T=300,D=16", "--seed", &s]);
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("input  start    i64 [3]") && t.contains("pruning: paper rule"), "{t}");
    assert!(t.contains("check: ok"), "{t}");
}

#[test]
fn float_converts_an_integer_for_arithmetic() {
    let body = |x: &str| {
        format!(
            "attention g(q: f32[A, C], n: i32[A] in [0, 5]) -> f32[A, C] {{\n    y[a, c] = q[a, c] * {x}\n    return y\n}}\n"
        )
    };
    let p = write("mul.attn", &body("n[a]"));
    let (code, t) = run(&["check", &p]);
    assert_eq!(code, Some(1), "{t}");
    assert!(
        t.contains("needs a floating-point number, found an integer (i32)") && t.contains("float(start[b])"),
        "{t}"
    );
    let p = write("float.attn", &body("float(n[a])"));
    let s = seed();
    for backend in ["cpu", "reference"] {
        let (code, t) =
            run(&["run", &p, "--backend", backend, "--check", "--shape", "A=7,C=9", "--seed", &s]);
        assert_eq!(code, Some(0), "{backend}: {t}");
    }
}

/// Inside a comparison an integer adds and subtracts with integers, indices, dims and integer
/// constants (`j < start[b] + 4`: attention sinks counted from a sequence's start, `i - j <
/// len[b] - start[b]`): the sum of their values, so left padding with a window and sinks is one
/// attention, pruned, checked on the CPU against the f64 interpreter. Any other arithmetic with
/// an integer, or with such a sum (`start[b] + 0.5`, `(start[b] + 4) * 2`, a statement
/// `start[b] + 4`), needs `float`. (Shown failing without the sum: "`+` needs a floating-point
/// number".)
#[test]
fn integers_add_and_subtract_inside_a_comparison() {
    let program = |name: &str, sinks: &str| {
        let src = std::fs::read_to_string(example("fox_leftpad.attn")).unwrap().replace(
            "causal(i, j, select(j >= start[b], s[b, h, i, j], -inf))",
            &format!("causal(i, j, select(j >= start[b], select(i - j < 64 or {sinks}, s[b, h, i, j], -inf), -inf))"),
        );
        assert!(src.contains(sinks), "{src}");
        write(name, &src)
    };
    let s = seed();
    for (name, sinks) in [("sum.attn", "j < start[b] + 4"), ("diff.attn", "j - start[b] < 4")] {
        let p = program(name, sinks);
        let (code, t) = run(&["compile", &p, "--emit", "opt", "--explain"]);
        assert_eq!(code, Some(0), "{name}: {t}");
        assert!(t.contains(", pruned") && t.contains("nothing to explain"), "{name}: {t}");
        let (code, t) =
            run(&["run", &p, "--backend", "cpu", "--check", "--shape", "B=3,H=2,T=400,D=16", "--seed", &s]);
        assert_eq!(code, Some(0), "{name}: {t}");
        assert!(t.contains("pruning: paper rule") && t.contains("check: ok"), "{name}: {t}");
    }
    for sinks in ["j < start[b] + 0.5", "j < (start[b] + 4) * 2"] {
        let p = program("bad.attn", sinks);
        let (code, t) = run(&["check", &p]);
        assert_eq!(code, Some(1), "{sinks}: {t}");
        assert!(
            t.contains("needs a floating-point number") && t.contains("`j < start[b] + 4`"),
            "{sinks}: {t}"
        );
    }
    let p = write(
        "stmt_sum.attn",
        "attention g(q: f32[A], n: i32[A]) -> f32[A] {\n    m[a] = n[a] + 4\n    y[a] = q[a] * m[a]\n    return y\n}\n",
    );
    let (code, t) = run(&["check", &p]);
    assert_eq!(code, Some(1), "{t}");
    assert!(t.contains("`+` needs a floating-point number"), "{t}");
}

#[test]
fn integers_do_not_hide_in_statements_or_results() {
    let p = write(
        "stmt.attn",
        "attention g(q: f32[A], n: i32[A]) -> f32[A] {\n    m[a] = n[a]\n    y[a] = q[a]\n    return y\n}\n",
    );
    let (code, t) = run(&["check", &p]);
    assert_eq!(code, Some(1), "{t}");
    assert!(t.contains("statement `m` holds integers"), "{t}");
    let p =
        write("ret.attn", "attention g(n: i32[A]) -> i32[A] {\n    y[a] = float(n[a])\n    return y\n}\n");
    let (code, t) = run(&["check", &p]);
    assert_eq!(code, Some(1), "{t}");
    assert!(t.contains("the result cannot be i32"), "{t}");
    let p =
        write("i64ret.attn", "attention g(n: i64[A]) -> i64[A] {\n    y[a] = float(n[a])\n    return y\n}\n");
    let (code, t) = run(&["check", &p]);
    assert_eq!(code, Some(1), "{t}");
    assert!(t.contains("the result cannot be i64"), "{t}");
    let p =
        write("long.attn", "attention g(n: int64[A]) -> f32[A] {\n    y[a] = float(n[a])\n    return y\n}\n");
    let (code, t) = run(&["check", &p]);
    assert_eq!(code, Some(1), "{t}");
    assert!(t.contains("unknown dtype `int64`") && t.contains("write `i64`"), "{t}");
}

fn compiled(src: &str) -> Graph {
    pipeline::Source { name: "leftpad.attn".into(), bytes: src.as_bytes().to_vec() }.compile().unwrap().graph
}

fn cpu_pruned(src: &Graph) -> Graph {
    let args = PruneOptions { tiles: Some(foxc_ir::Tiles { bm: 8, bn: 16 }), ..PruneOptions::default() };
    let g = pipeline::optimize(src, &pipeline::pass_options(&args, Target::Cpu, false).unwrap()).unwrap().0;
    assert!(!g.find(|op| matches!(op, Op::BlockBoundary(_))).is_empty(), "pruned");
    g
}

fn i64_tensor(values: &[i64]) -> HostTensor {
    HostTensor {
        dtype: DType::I64,
        shape: vec![values.len()],
        data: values.iter().flat_map(|x| x.to_le_bytes()).collect(),
    }
}

#[test]
fn an_i64_start_reads_as_its_i32_value() {
    let text = std::fs::read_to_string(example("fox_leftpad.attn")).unwrap();
    let wide = text.replace("start: i32[B] in [0, 256]", "start: i64[B]");
    assert_ne!(wide, text);
    let (narrow, wide) = (compiled(&text.replace(" in [0, 256]", "")), compiled(&wide));
    assert!(foxc_ir::print::print_graph(&wide).contains("%start: i32[B] (stored i64)"));
    let dims: BTreeMap<String, u64> =
        [("B", 3), ("H", 2), ("T", 70), ("D", 16)].iter().map(|(k, v)| (k.to_string(), *v)).collect();
    let s: u64 = seed().parse().unwrap();
    let mut x = tensors::generate(&narrow, &dims, s).unwrap();
    // Off the tile grid; beyond i32 (every key masked: the row is 0, as at i32::MAX); below it
    // (every key visible, as at i32::MIN).
    let starts = [3i64, (1 << 32) + 3, -(1 << 40)];
    x.insert(
        "start".into(),
        HostTensor::from_f32_as(DType::I32, &[3], &[3.0, i32::MAX as f32, i32::MIN as f32]),
    );
    let mut x64 = x.clone();
    x64.insert("start".into(), i64_tensor(&starts));
    let (a, b) = (cpu_pruned(&narrow), cpu_pruned(&wide));
    let (ra, rb) = (cpu_backend::run(&a, &x).unwrap().out, cpu_backend::run(&b, &x64).unwrap().out);
    assert!(ra == rb, "the i64 program gives other bits than the i32 one");
    // The interpreter narrows the same way (its run of the source is the reference).
    let want = interp::run(&wide, &tensors::to_interp(&x64)).unwrap().output;
    let got = rb.to_f64_vec();
    let row = 2 * 70 * 16;
    assert!(got[row..2 * row].iter().all(|&v| v == 0.0), "batch 1 (start 2^32 + 3) has a key");
    assert!(want.data[row..2 * row].iter().all(|&v| v == 0.0), "interpreter: batch 1 has a key");
    let err = got.iter().zip(&want.data).map(|(g, w)| (g - w).abs()).fold(0.0, f64::max);
    assert!(err < 2e-2, "CPU vs interpreter: max error {err}");
    // An i64 parameter takes i64 tensors (no silent widening or narrowing of integers).
    let e = cpu_backend::run(&b, &x).unwrap_err().to_string();
    assert!(e.contains("`start` has dtype i32, but the graph declares i64[B]"), "{e}");
}
