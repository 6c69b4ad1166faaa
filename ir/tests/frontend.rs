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
