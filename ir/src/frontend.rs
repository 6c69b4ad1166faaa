//! The front end's entry points: bytes of a `.attn` file to an AST, and to a verified graph.

use crate::ast;
use crate::diag::{Diagnostic, Diagnostics};
use crate::graph::Graph;
use crate::types::Span;

/// Largest accepted source file. Real programs are a few hundred bytes; the cap keeps a huge
/// input from costing time and memory before the first diagnostic.
pub const MAX_SOURCE_BYTES: usize = 1 << 20;

/// A checked program: its AST and its verified graph.
#[derive(Clone, Debug)]
pub struct Compiled {
    pub ast: ast::Program,
    pub graph: Graph,
}

fn source(bytes: &[u8]) -> Result<&str, Diagnostics> {
    if bytes.len() > MAX_SOURCE_BYTES {
        return Err(Diagnostic::new(
            format!("input too large: {} bytes", bytes.len()),
            Span::new(0, 0),
            "this file",
        )
        .with_hint(format!("a program is at most {MAX_SOURCE_BYTES} bytes; is this the right file?"))
        .into());
    }
    match std::str::from_utf8(bytes) {
        Ok(s) => Ok(s),
        Err(e) => {
            let at = e.valid_up_to();
            Err(Diagnostic::new("invalid UTF-8 in the source", Span::new(at, at + 1), "not UTF-8")
                .with_hint(format!("byte {at} starts an invalid UTF-8 sequence; is this a text file?"))
                .into())
        }
    }
}

/// Lex and parse `bytes` (a `.attn` file) into an AST, without type checking.
pub fn parse(file_name: &str, bytes: &[u8]) -> Result<ast::Program, Diagnostics> {
    let _ = file_name;
    let src = source(bytes)?;
    let toks = crate::lexer::lex(src)?;
    Ok(crate::parser::parse_tokens(&toks, src)?)
}

/// Parse, check and lower `bytes` to a verified graph.
pub fn compile(file_name: &str, bytes: &[u8]) -> Result<Compiled, Diagnostics> {
    let ast = parse(file_name, bytes)?;
    let src = source(bytes)?;
    let graph = crate::lower::lower(&ast, src)?;
    if let Err(e) = crate::verify::verify(&graph) {
        return Err(Diagnostic::new(format!("internal error: {e}"), ast.span, "while lowering this program")
            .with_hint("this is a bug in foxc; please report it with this file")
            .into());
    }
    Ok(Compiled { ast, graph })
}
