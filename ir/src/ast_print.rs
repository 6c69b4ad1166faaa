//! The AST printed back as DSL source, and the AST with its source positions erased: together
//! they state the print-parse round trip (`parse(p.to_source())` is `p` up to positions), which
//! the program fuzzer (`passes/tests/fuzz_programs.rs`) checks on generated programs.
//!
//! Every sub-expression is printed fully parenthesized (the `--emit ast` form of expressions), so
//! the reparse does not depend on precedence. Parentheses count toward the parser's nesting
//! limit: a program whose expressions nest close to `parser::MAX_NESTING` may print to a source
//! that the parser refuses.

use crate::ast::*;
use crate::types::Span;
use std::fmt::Write;

fn bound(x: f64) -> String {
    if x == f64::INFINITY {
        "inf".into()
    } else if x == f64::NEG_INFINITY {
        "-inf".into()
    } else {
        format!("{x}")
    }
}

impl Program {
    /// DSL source that parses back to this program (up to spans).
    pub fn to_source(&self) -> String {
        let mut s = String::new();
        let params: Vec<String> = self
            .params
            .iter()
            .map(|p| {
                let range =
                    p.range.map_or(String::new(), |(lo, hi)| format!(" in [{}, {}]", bound(lo), bound(hi)));
                let along = p
                    .nonincreasing
                    .as_ref()
                    .map_or(String::new(), |d| format!(" nonincreasing along {}", d.name));
                format!("{}: {}{range}{along}", p.name.name, p.ty)
            })
            .collect();
        let _ = writeln!(s, "attention {}({}) -> {} {{", self.name.name, params.join(", "), self.ret);
        for st in &self.stmts {
            let _ = write!(s, "    {}", st.name.name);
            if !st.indices.is_empty() {
                let ix: Vec<&str> = st.indices.iter().map(|i| i.name.as_str()).collect();
                let _ = write!(s, "[{}]", ix.join(", "));
            }
            let _ = writeln!(s, " = {}", st.value);
        }
        let _ = writeln!(s, "    return {}\n}}", self.result.name);
        s
    }

    /// The program with every span set to the default: two parses of equivalent sources compare
    /// equal with `==`.
    pub fn without_spans(&self) -> Program {
        let z = Span::default();
        let id = |i: &Ident| Ident { name: i.name.clone(), span: z };
        let ty = |t: &TypeExpr| TypeExpr {
            dtype: t.dtype,
            dims: t
                .dims
                .iter()
                .map(|d| match d {
                    DimExpr::Sym(i) => DimExpr::Sym(id(i)),
                    DimExpr::Const(c, _) => DimExpr::Const(*c, z),
                })
                .collect(),
            span: z,
        };
        Program {
            name: id(&self.name),
            params: self
                .params
                .iter()
                .map(|p| ParamDecl {
                    name: id(&p.name),
                    ty: ty(&p.ty),
                    range: p.range,
                    nonincreasing: p.nonincreasing.as_ref().map(id),
                    span: z,
                })
                .collect(),
            ret: ty(&self.ret),
            stmts: self
                .stmts
                .iter()
                .map(|s| Stmt {
                    name: id(&s.name),
                    indices: s.indices.iter().map(id).collect(),
                    value: s.value.without_spans(),
                    span: z,
                })
                .collect(),
            result: id(&self.result),
            span: z,
        }
    }
}

impl Expr {
    /// The expression with every span set to the default.
    pub fn without_spans(&self) -> Expr {
        let z = Span::default();
        let id = |i: &Ident| Ident { name: i.name.clone(), span: z };
        let kind = match &self.kind {
            ExprKind::Num { value, int, text } => {
                ExprKind::Num { value: *value, int: *int, text: text.clone() }
            }
            ExprKind::Name(i) => ExprKind::Name(id(i)),
            ExprKind::Access { name, indices } => ExprKind::Access {
                name: id(name),
                indices: indices.iter().map(Expr::without_spans).collect(),
            },
            ExprKind::Unary(op, e) => ExprKind::Unary(*op, Box::new(e.without_spans())),
            ExprKind::Binary(op, a, b) => {
                ExprKind::Binary(*op, Box::new(a.without_spans()), Box::new(b.without_spans()))
            }
            ExprKind::Call { func, args } => {
                ExprKind::Call { func: id(func), args: args.iter().map(Expr::without_spans).collect() }
            }
        };
        Expr { kind, span: z, depth: self.depth }
    }
}

#[cfg(test)]
mod tests {
    use crate::frontend::parse;

    #[test]
    fn every_example_prints_and_reparses_to_itself() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
        let mut n = 0;
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_none_or(|x| x != "attn") {
                continue;
            }
            let src = std::fs::read(&p).unwrap();
            let Ok(a) = parse("x", &src) else { continue };
            let printed = a.to_source();
            let b = parse("y", printed.as_bytes())
                .unwrap_or_else(|d| panic!("{}: {}", p.display(), d.render("y", &printed)));
            assert_eq!(b.without_spans(), a.without_spans(), "{}:\n{printed}", p.display());
            n += 1;
        }
        assert!(n >= 10, "{n} examples");
    }
}
