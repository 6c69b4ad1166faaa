//! Shared helpers of the pass tests.
#![allow(dead_code)]

use foxc_ir::Graph;
use foxc_passes::{optimize, PassOptions, PassReport};
use std::path::PathBuf;

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Compile a DSL file of the repository (path relative to the repository root).
pub fn compile(rel: &str) -> Graph {
    let path = root().join(rel);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    match foxc_ir::frontend::compile(rel, &bytes) {
        Ok(c) => c.graph,
        Err(d) => panic!("{rel} does not compile:\n{}", d.render(rel, &String::from_utf8_lossy(&bytes))),
    }
}

/// Compile DSL text (`name`: what diagnostics call it); panics with the rendered diagnostic.
pub fn compile_text(name: &str, src: &str) -> Graph {
    foxc_ir::frontend::compile(name, src.as_bytes())
        .unwrap_or_else(|d| panic!("{}", d.render(name, src)))
        .graph
}

pub fn run(g: &Graph, opts: &PassOptions) -> (Graph, PassReport) {
    let mut o = g.clone();
    let report = optimize(&mut o, opts).unwrap_or_else(|e| panic!("optimize {}: {e}", g.name));
    (o, report)
}

pub fn all_passes() -> PassOptions {
    PassOptions { print_after_all: true, ..PassOptions::default() }
}
