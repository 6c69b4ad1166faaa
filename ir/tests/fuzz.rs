//! Property tests: no input makes the front end panic. Random bytes, random token soup from the
//! DSL's vocabulary, and mutations of the example programs all end in `Ok` or in diagnostics that
//! render.

use foxc_ir::frontend::{compile, parse};
use foxc_ir::lower::FUNCTIONS;
use proptest::prelude::*;

/// The DSL's syntax and sample names; the function names come from the front end's own list
/// ([`FUNCTIONS`]), so a new function is fuzzed without an edit here.
const SYNTAX: &[&str] = &[
    "attention",
    "fox",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    ",",
    ":",
    ";",
    "->",
    "=",
    "+",
    "-",
    "*",
    "/",
    "<",
    "<=",
    ">",
    ">=",
    "==",
    "!=",
    "return",
    "in",
    "inf",
    "bf16",
    "f16",
    "f32",
    "bool",
    "i32",
    "B",
    "H",
    "T",
    "D",
    "b",
    "h",
    "i",
    "j",
    "t",
    "d",
    "q",
    "k",
    "v",
    "c",
    "s",
    "p",
    "out",
    "fgate",
    "0",
    "1",
    "2.5",
    "256",
    "1e-6",
    "#",
    "\n",
    " ",
    "\t",
    "q[b, h, i, d]",
    "x",
    "G",
    "-inf",
    "k[b, h / (H / G), j, d]",
    "rel[h, i - j]",
];

/// Every token the soups draw from: the syntax and every function name.
fn vocab() -> Vec<&'static str> {
    SYNTAX.iter().chain(FUNCTIONS.iter()).copied().collect()
}

fn check(bytes: &[u8]) {
    match compile("fuzz.attn", bytes) {
        Ok(c) => {
            foxc_ir::verify::verify(&c.graph).expect("compile returned an unverified graph");
            let _ = c.ast.to_string();
            let _ = foxc_ir::print::print_graph(&c.graph);
        }
        Err(d) => {
            assert!(!d.is_empty());
            let text = d.render_bytes("fuzz.attn", bytes);
            assert!(text.starts_with("error: "), "{text}");
        }
    }
    if let Ok(p) = parse("fuzz.attn", bytes) {
        let _ = p.to_string();
    }
}

fn examples() -> Vec<Vec<u8>> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir("../examples")
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "attn"))
        .map(|p| (p.to_string_lossy().to_string(), std::fs::read(&p).unwrap()))
        .collect();
    v.sort();
    v.into_iter().map(|(_, b)| b).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        check(&bytes);
    }

    #[test]
    fn token_soup_never_panics(toks in proptest::collection::vec(proptest::sample::select(vocab()), 0..200)) {
        let src = toks.join(" ");
        check(src.as_bytes());
    }

    /// A valid prefix followed by soup reaches the checker and lowering, not just the parser.
    #[test]
    fn statement_soup_never_panics(toks in proptest::collection::vec(proptest::sample::select(vocab()), 0..60)) {
        let src = format!(
            "attention f(q: bf16[B, H, T, D], k: bf16[B, H, T, D], s: f32, g: f32[B, H, T] in [-inf, 0]) -> f32[B, H, T, D] {{\n x[b, h, i, d] = {}\n return x\n}}",
            toks.join(" ")
        );
        check(src.as_bytes());
    }

    /// Examples with one byte range deleted or replaced.
    #[test]
    fn mutated_examples_never_panic(which in 0usize..64, at in any::<prop::sample::Index>(), len in 0usize..16,
                                    ins in proptest::collection::vec(proptest::sample::select(vocab()), 0..3)) {
        let ex = examples();
        let mut src = ex[which % ex.len()].clone();
        let start = at.index(src.len() + 1);
        let end = (start + len).min(src.len());
        src.splice(start..end, ins.join(" ").into_bytes());
        check(&src);
    }
}
