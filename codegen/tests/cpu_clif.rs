//! Snapshots of the Cranelift IR that `foxc compile --emit clif` prints, on a small tile
//! configuration (bm = 4, bn = 8, D = 8) so that the unrolled register blocks stay readable.

mod cpu_common;

use cpu_common::*;
use foxc_codegen::cpu::{self, CpuOptions};
use foxc_ir::*;

fn clif(cfg: &Cfg) -> String {
    let g = build(cfg, 8).g;
    cpu::clif_text(&g, &dims(1, 2, 16, 8), CpuOptions { fma: true }).unwrap()
}

#[test]
fn clif_pruned_fox_bf16() {
    let mut c = Cfg::fox(DType::BF16);
    c.prune = Some((foxc_passes::rules::by_name("tight").unwrap(), NormBound::Data, Tiles { bm: 4, bn: 8 }));
    c.out = DType::BF16;
    insta::assert_snapshot!("pruned_fox_bf16", clif(&c));
}

#[test]
fn clif_dense_sliding_window_f32() {
    let mut c = Cfg::fox(DType::F32);
    c.gate = None;
    c.window = Some(5);
    insta::assert_snapshot!("dense_window_f32", clif(&c));
}

#[test]
fn clif_is_deterministic_and_names_kernels() {
    let mut c = Cfg::fox(DType::BF16);
    c.qk_norm = true;
    c.prune = Some((
        foxc_passes::rules::by_name("paper").unwrap(),
        NormBound::Static { q_max: 8.0, k_max: 8.0 },
        Tiles { bm: 4, bn: 8 },
    ));
    let a = clif(&c);
    assert_eq!(a, clif(&c));
    for k in ["gate_cumsum", "rmsnorm", "threshold", "block_boundary", "_attention"] {
        assert!(a.contains(k), "no {k} kernel in\n{a}");
    }
    assert!(a.contains("fma.f32x4") || a.contains(" fma "), "no f32x4 fma");
}
