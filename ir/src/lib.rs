//! foxc-ir: the DSL front end, the graph IR and the f64 reference interpreter.
//!
//! Pipeline owned here: source text --[`lexer`]--> tokens --[`parser`]--> [`ast`] --[`check`]-->
//! typed AST --[`lower`]--> [`graph::Graph`] --[`verify`]. The [`interp`] module executes any
//! verified graph in f64 and is the oracle of every test.
//!
//! Diagnostics are rendered by [`diag`], not ariadne: ariadne's layout (`Error:`, `╭─[file:line:col]`)
//! differs from the `error:` / `--> file:line:col` text that tests, the CLI and Python's
//! `CompileError` rely on.

pub mod ast;
pub mod ast_print;
pub mod attention;
mod attention_check;
pub mod attention_grad;
pub mod check;
pub mod diag;
pub mod evict;
pub mod fold;
pub mod frontend;
pub mod graph;
pub mod index;
pub mod index_range;
pub mod interp;
pub mod lexer;
pub mod lower;
pub mod mask_flow;
pub mod ops;
pub mod parser;
pub mod print;
pub mod prune_rule;
pub mod shapes;
pub mod types;
pub mod unary;
pub mod verify;

pub use graph::{Graph, Node, Param, Use, Value, ValueId};
pub use ops::*;
pub use types::*;
