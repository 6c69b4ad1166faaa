//! foxc-ir: the DSL front end, the graph IR and the f64 reference interpreter.
//!
//! Pipeline owned here: source text --[`lexer`]--> tokens --[`parser`]--> [`ast`] --[`check`]-->
//! typed AST --[`lower`]--> [`graph::Graph`] --[`verify`]. The [`interp`] module executes any
//! verified graph in f64 and is the oracle of every test.

pub mod graph;
pub mod ops;
pub mod print;
pub mod types;

pub use graph::{Graph, Node, Param, ValueId};
pub use ops::*;
pub use types::*;
