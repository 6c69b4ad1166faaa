//! One snapshot of the rendered diagnostic per bad program in `tests/bad/`.

use foxc_ir::frontend::compile;

#[test]
fn bad_programs() {
    let mut count = 0;
    insta::glob!("bad", "*.attn", |path| {
        let bytes = std::fs::read(path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let diags = match compile(&name, &bytes) {
            Ok(_) => panic!("{name} compiled, but it is a bad program"),
            Err(d) => d,
        };
        assert!(!diags.is_empty(), "{name}: an error without diagnostics");
        let text = diags.render_bytes(&name, &bytes);
        for d in diags.iter() {
            assert!(d.hint.is_some(), "{name}: diagnostic without a hint:\n{text}");
        }
        assert!(text.contains(&format!("--> {name}:")), "{name}: no position:\n{text}");
        assert!(text.contains('^'), "{name}: no caret:\n{text}");
        assert!(!text.contains('\u{1b}'), "{name}: ANSI escape in diagnostics");
        insta::assert_snapshot!(text);
        count += 1;
    });
    assert!(count >= 25, "only {count} bad programs");
}

/// The rendering is deterministic and the same for `compile` and `parse` on syntax errors.
#[test]
fn parse_errors_match_compile_errors() {
    let src = b"attention f(x: f32[T]) -> f32[T] { out[t] = x[t] + }";
    let a = foxc_ir::frontend::parse("f.attn", src).unwrap_err();
    let b = compile("f.attn", src).unwrap_err();
    assert_eq!(a, b);
    assert_eq!(a.render_bytes("f.attn", src), b.render_bytes("f.attn", src));
}

#[test]
fn huge_input_is_a_diagnostic() {
    let mut src = b"attention f(x: f32[T]) -> f32[T] {\n".to_vec();
    src.extend(std::iter::repeat_n(b' ', 4 << 20));
    let d = compile("huge.attn", &src).unwrap_err();
    assert!(d.list[0].message.contains("too large"), "{d}");
}

#[test]
fn deep_nesting_is_a_diagnostic() {
    for open in ["(", "-", "exp(", "sum(i, "] {
        let n = 100_000;
        let mut s = String::from("attention f(x: f32[T]) -> f32[T] {\n out[t] = ");
        s.push_str(&open.repeat(n));
        s.push_str("x[t]");
        s.push_str(&")".repeat(if open == "-" { 0 } else { n }));
        s.push_str("\n return out\n}\n");
        let d = compile("deep.attn", s.as_bytes()).unwrap_err();
        assert!(d.list[0].message.contains("nested too deeply"), "{open}: {d}");
    }
    let mut s = String::from("attention f(x: f32[T]) -> f32[T] {\n out[t] = x[t]");
    s.push_str(&" * x[t]".repeat(100_000));
    s.push_str("\n return out\n}\n");
    let d = compile("long.attn", s.as_bytes()).unwrap_err();
    assert!(d.list[0].message.contains("too large"), "{d}");
}

/// Many failing statements: reporting stops at a cap, and quickly.
#[test]
fn many_errors_are_capped() {
    let mut s = String::from("attention f(x: f32[T]) -> f32[T] {\n");
    for n in 0..20_000 {
        s.push_str(&format!(" a{n}[t] = zz{n}[t]\n"));
    }
    s.push_str(" return a0\n}\n");
    let t = std::time::Instant::now();
    let d = compile("many.attn", s.as_bytes()).unwrap_err();
    assert_eq!(d.len(), foxc_ir::lower::MAX_DIAGNOSTICS);
    assert!(t.elapsed().as_secs() < 10);
}

/// A long valid program compiles (no quadratic blow-up).
#[test]
fn long_valid_program_compiles() {
    let mut s = String::from("attention f(x: f32[T]) -> f32[T] {\n a0[t] = x[t]\n");
    for n in 1..5_000 {
        s.push_str(&format!(" a{n}[t] = a{}[t] * 0.5 + x[t]\n", n - 1));
    }
    s.push_str(" return a4999\n}\n");
    let t = std::time::Instant::now();
    let c = compile("long.attn", s.as_bytes()).unwrap();
    assert_eq!(c.ast.stmts.len(), 5_000);
    assert!(t.elapsed().as_secs() < 20);
}

/// Expressions just inside the limits compile, also on a small (1 MiB) stack.
#[test]
fn nesting_at_the_limit_compiles() {
    let run = || {
        // Each `sigmoid(-(` is three levels of nesting (call, minus, parenthesis).
        let n = 64;
        let mut s = String::from("attention f(x: f32[T]) -> f32[T] {\n out[t] = ");
        s.push_str(&"sigmoid(-(".repeat(n / 2));
        s.push_str("x[t]");
        s.push_str(&"))".repeat(n / 2));
        s.push_str("\n y[t] = x[t]");
        s.push_str(&" + x[t] * 2".repeat(60));
        s.push_str("\n return out\n}\n");
        let c =
            compile("deep.attn", s.as_bytes()).unwrap_or_else(|d| panic!("{}", d.render("deep.attn", &s)));
        let _ = c.ast.to_string();
    };
    std::thread::Builder::new().stack_size(1 << 20).spawn(run).unwrap().join().unwrap();
}
