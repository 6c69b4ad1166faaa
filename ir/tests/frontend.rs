//! Snapshots of the AST (`--emit ast` form) and the lowered IR of every example program.

use foxc_ir::frontend::{compile, parse};
use foxc_ir::print::print_graph;

#[test]
fn examples_ast_and_ir() {
    insta::glob!("../../examples", "*.attn", |path| {
        let bytes = std::fs::read(path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let ast = parse(&name, &bytes).unwrap_or_else(|d| panic!("{}", d.render_bytes(&name, &bytes)));
        insta::assert_snapshot!("ast", ast.to_string());
        let c = compile(&name, &bytes).unwrap_or_else(|d| panic!("{}", d.render_bytes(&name, &bytes)));
        assert_eq!(c.ast, ast);
        foxc_ir::verify::verify(&c.graph).unwrap();
        insta::assert_snapshot!("ir", print_graph(&c.graph));
    });
}

#[test]
fn fox_graph_shape() {
    let src = std::fs::read("../examples/fox.attn").unwrap();
    let c = compile("fox.attn", &src).unwrap();
    let g = &c.graph;
    assert_eq!(g.name, "fox");
    let names: Vec<&str> = g.params.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["q", "k", "v", "fgate"]);
    assert_eq!(g.dims, ["B", "H", "T", "D"]);
    let out = g.output.unwrap();
    assert_eq!(g.ty(out).to_string(), "bf16[B, H, T, D]");
    assert!(matches!(g.op(out), foxc_ir::Op::Cast));
}

#[test]
fn loggate_range_is_recorded() {
    let src = std::fs::read("../examples/fox_loggate.attn").unwrap();
    let c = compile("fox_loggate.attn", &src).unwrap();
    assert_eq!(c.graph.param("logf").unwrap().range, Some((f64::NEG_INFINITY, 0.0)));
    let src = std::fs::read("../examples/alibi.attn").unwrap();
    let c = compile("alibi.attn", &src).unwrap();
    assert_eq!(c.graph.param("slope").unwrap().range, Some((0.0, f64::INFINITY)));
}

#[test]
fn nonincreasing_axis_is_recorded() {
    let src = std::fs::read("../examples/fox_cache.attn").unwrap();
    let c = compile("fox_cache.attn", &src).unwrap();
    assert_eq!(c.graph.param("c").unwrap().nonincreasing, Some(2));
    assert_eq!(c.graph.param("k").unwrap().nonincreasing, None);
    assert!(print_graph(&c.graph).contains("%c: f32[B, H, M] (nonincreasing along M)"));
    // The declaration survives printing the AST back to source.
    let again = compile("again.attn", c.ast.to_source().as_bytes()).unwrap();
    assert_eq!(again.graph.param("c").unwrap().nonincreasing, Some(2));
}

/// Every construct of the DSL in one program.
const FEATURES: &str = "# every construct of the DSL
attention features(x: f16[B, T, 64], w: f32[64], temp: f32 in [0, inf], bias: f32[T],) -> f32[B, T] {
    scale = 1 / sqrt(64) * temp;   # a scalar statement
    n[b, t, e] = rmsnorm(x[b, t, e], w[e])
    m[b, t] = max(e, n[b, t, e])   # a reduction: `e` is not declared and not on the left
    y[b, t] = max(m[b, t], 0) + min(m[b, t], 1.5e0) - relu(-m[b, t])
    z[b, t] = select(y[b, t] >= 0, exp(y[b, t]), log(sigmoid(y[b, t]))) * scale
    u[b, t] = softplus(z[b, t]) + rsqrt(1 + z[b, t] * z[b, t]) + logsigmoid(bias[t]) * t / T
    s[b, i, j] = window(i, j, 4, u[b, i] - u[b, j] + (i - j))
    r[b, i] = sum(j, softmax(j, s[b, i, j]) * u[b, j])
    out[b, t] = cumsum(t, r[b, t]) + select(r[b, t] != 0, 1, 0) * select(r[b, t] < 1, 0.5, .25)
    return out
}
";

#[test]
fn features_program() {
    let c = compile("features.attn", FEATURES.as_bytes())
        .unwrap_or_else(|d| panic!("{}", d.render("features.attn", FEATURES)));
    insta::assert_snapshot!("features_ast", c.ast.to_string());
    insta::assert_snapshot!("features_ir", print_graph(&c.graph));
    let g = &c.graph;
    assert_eq!(g.params.len(), 4);
    assert_eq!(g.param("temp").unwrap().ty.rank(), 0);
    assert_eq!(g.param("temp").unwrap().range, Some((0.0, f64::INFINITY)));
    assert_eq!(g.dims, ["B", "T"]);
    // No cast: the result is already f32.
    assert!(matches!(g.op(g.output.unwrap()), foxc_ir::Op::Store { .. }));
}

#[test]
fn max_is_elementwise_over_a_left_hand_index() {
    let src = "attention m(x: f32[T, T]) -> f32[T, T] { y[i, j] = max(i, x[i, j]) return y }";
    let c = compile("m.attn", src.as_bytes()).unwrap();
    let ir = print_graph(&c.graph);
    assert!(ir.contains(" = max %"), "{ir}");
    assert!(ir.contains("iota {axis = i}"), "{ir}");
    let src = "attention m(x: f32[T, T]) -> f32[T] { y[i] = max(j, x[i, j]) return y }";
    let ir = print_graph(&compile("m.attn", src.as_bytes()).unwrap().graph);
    assert!(ir.contains("reduce_max {axis = j}"), "{ir}");
}

#[test]
fn return_of_a_parameter_casts() {
    let src = "attention id(x: bf16[N]) -> f32[N] { return x }";
    let c = compile("id.attn", src.as_bytes()).unwrap();
    let ir = print_graph(&c.graph);
    assert_eq!(
        ir,
        "graph @id(%x: bf16[N]) -> f32[N] {\n  %0 = param \"x\" #0 : bf16[N]\n  %1 = cast %0 : f32[N]\n  return %1\n}\n"
    );
}

#[test]
fn index_variables_are_local_to_a_statement() {
    // `d` has size D in the first statement and T in the second.
    let src = "attention l(x: f32[T, D]) -> f32[T] {
        a[t] = sum(d, x[t, d])
        b[d] = a[d]
        return b
    }";
    compile("l.attn", src.as_bytes()).unwrap();
}

#[test]
fn parse_only_does_not_check() {
    let src = b"attention p(x: f32[T]) -> f32[T] { y[t] = nope[t, t, t] return zz }";
    assert!(parse("p.attn", src).is_ok());
    assert!(compile("p.attn", src).is_err());
}

#[test]
fn diagnostics_render_positions() {
    let src = "attention f(x: f32[T]) -> f32[T] {\n    y[t] = exp(x[t], x[t])\n    return y\n}\n";
    let d = compile("f.attn", src.as_bytes()).unwrap_err();
    let r = d.render("f.attn", src);
    assert_eq!(
        r,
        "error: `exp` takes 1 argument, found 2\n --> f.attn:2:12\n  |\n2 |     y[t] = exp(x[t], x[t])\n  |            ^^^^^^^^^^^^^^^ wrong number of arguments\n  |\n  = hint: for example `exp(x[i])`\n"
    );
}
