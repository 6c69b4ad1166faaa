//! Snapshots of the Cranelift IR that `foxc compile --emit clif` prints for examples after the
//! passes (the pipeline's real output), on small tiles (bm = 4, bn = 8) and D = 8 so that the
//! unrolled register blocks stay readable.

use foxc_codegen::cpu::{self, CpuOptions};
use foxc_ir::{Graph, Tiles};
use foxc_passes::{optimize, rules, PassOptions};

/// `examples/NAME.attn` through the passes for the CPU with threshold rule `rule`.
fn optimized(name: &str, rule: &str) -> Graph {
    let path = format!("{}/../examples/{name}.attn", env!("CARGO_MANIFEST_DIR"));
    let src = std::fs::read(&path).unwrap();
    let mut g = foxc_ir::frontend::compile(&path, &src).unwrap_or_else(|e| panic!("{e:?}")).graph;
    let opts = PassOptions {
        rule: rules::by_name(rule).unwrap(),
        tiles: Some(Tiles { bm: 4, bn: 8 }),
        ..PassOptions::default()
    };
    optimize(&mut g, &opts).unwrap();
    g
}

fn clif(g: &Graph) -> String {
    let dims = [("B", 1), ("H", 2), ("T", 16), ("D", 8)].iter().map(|(k, v)| (k.to_string(), *v)).collect();
    cpu::clif_text(g, &dims, CpuOptions { fma: true }).unwrap()
}

#[test]
fn clif_pruned_fox_bf16() {
    insta::assert_snapshot!("pruned_fox_bf16", clif(&optimized("fox", "tight")));
}

#[test]
fn clif_dense_sliding_window_bf16() {
    insta::assert_snapshot!("dense_window_bf16", clif(&optimized("window", "paper")));
}

#[test]
fn clif_is_deterministic_and_names_kernels() {
    let g = optimized("fox_qknorm", "paper");
    let a = clif(&g);
    assert_eq!(a, clif(&g));
    for k in ["gate_cumsum", "rmsnorm", "threshold", "block_boundary", "_attention"] {
        assert!(a.contains(k), "no {k} kernel in\n{a}");
    }
    assert!(a.contains("fma.f32x4") || a.contains(" fma "), "no f32x4 fma");
}
