//! Integer parameters (issue 25, item 1): `start: i32[B]` is compared (`j >= start[b]`), never
//! used in float math without `float(...)`; the left-padded FoX with an integer start is still
//! fused and pruned, forward and backward, against the f64 interpreter with fresh inputs.

mod common;

use common::{fresh_seed as seed, run_cli as run};

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
        write("i64.attn", "attention g(n: i64[A]) -> f32[A] {\n    y[a] = float(n[a])\n    return y\n}\n");
    let (code, t) = run(&["check", &p]);
    assert_eq!(code, Some(1), "{t}");
    assert!(t.contains("unknown dtype `i64`") && t.contains("use `i32`"), "{t}");
}
