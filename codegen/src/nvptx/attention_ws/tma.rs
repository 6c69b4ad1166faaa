//! K and V through the tensor memory accelerator (`loads = tma`, issue 11 item 1): one producer
//! thread fills a ring slot with `cp.async.bulk.tensor` copies that complete on the slot's
//! `full` mbarrier by bytes (`mbarrier.arrive.expect_tx` arms it), instead of 128 threads
//! issuing 16-byte `cp.async` copies.
//!
//! **Layout.** The consumers' wgmma descriptors read a K (or V) tile as panels of 64 bf16
//! columns, `bn` rows of 128 bytes each, chunk `c` of row `r` at chunk `c ^ (r % 8)` on a
//! 1024-byte aligned panel (`Attn::load_tile`'s `swz_panel`). A TMA box of 64 columns x `bn`
//! rows with the 128-byte swizzle writes exactly that, so a tile is `D / 64` copies, panel `p`
//! at `p * bn * 128` bytes into the tile.
//!
//! **Tails.** The maps are 3-D, `(D, Tk, B H_kv)` (`Tk` the keys, `T` unless queries are fewer)
//! with a `(64, bn, 1)` box, so rows of a box past `Tk` arrive as zeros (a 2-D map over the
//! flattened rows would bring the next head's rows). `cp.async` clamped them to row `Tk - 1`
//! instead; both are keys past every query row, masked before the softmax (probability exactly
//! 0), so the output is the same.
//!
//! **Parameters.** The kernel takes the maps of K and V right after the score hook's.

use super::WsLayout;
use crate::nvptx::attention::params::{FwdTail, Tail};
use crate::nvptx::attention::{Attn, AttnKernelConfig};
use crate::nvptx::builder::KernelBuilder;
use crate::nvptx::{KernelArg, TmaMap};
use foxc_ir::Dim;
use inkwell::values::{IntValue, PointerValue};
use inkwell::IntPredicate;

/// Columns of one copy: one 128-byte swizzle row of bf16.
const PANEL: u32 = 64;

/// Arrivals that complete a slot's `full` barrier: with TMA, the armed arrival of the thread
/// that issues the copies (the bytes complete it) and the 128 producer threads' arrivals
/// after their `c_j` stores; with `cp.async`, 128 copy arrivals and those 128.
pub(super) fn full_arrivals(cfg: &AttnKernelConfig) -> u32 {
    if cfg.tma {
        129
    } else {
        256
    }
}

/// After the barriers' `mbarrier.init` (by the initializing thread, before the block-wide
/// barrier): makes the initialized barriers visible to the copy engine's `complete_tx`
/// (`fence.mbarrier_init.release.cluster`), as the TMA pipelines of CUTLASS do.
pub(super) fn after_barrier_init(b: &KernelBuilder<'_, '_>, cfg: &AttnKernelConfig) {
    if cfg.tma {
        b.call_void("llvm.nvvm.fence.mbarrier_init.release.cluster", &[]);
    }
}

/// The launch arguments: maps of the K and V buffers, `[B, H_kv, Tk, D]` contiguous 16-bit
/// elements (bf16 or f16: the maps say bf16, and the copies move bits, zeros out of bounds) with
/// `B H_kv` the product of `kv_heads`, each as `(D, Tk, B H_kv)` with a `(64, bn, 1)` box.
pub(crate) fn args(cfg: &AttnKernelConfig, k: usize, v: usize, t: &Dim, kv_heads: &[Dim]) -> [KernelArg; 2] {
    let map = |buffer| {
        KernelArg::TensorMap(TmaMap {
            buffer,
            dims: vec![vec![Dim::Const(cfg.head_dim as u64)], vec![t.clone()], kv_heads.to_vec()],
            box_dims: vec![PANEL, cfg.bn, 1],
            swizzle_bytes: 128,
        })
    };
    [map(k), map(v)]
}

/// Bytes the copies of one fill bring: the K and the V tile.
fn fill_bytes(lay: &WsLayout) -> i64 {
    2 * lay.kv_bytes as i64
}

/// The producer's K and V copies of one fill: key rows from `j0` of key/value head `kv_head`
/// into the slot whose K tile starts at byte `koff` of shared memory (V right after it), landing
/// on `full`. Thread 0 of the producer warpgroup arms `full` with the bytes and issues
/// `2 D / 64` copies; the others go on to the `c_j` stores.
pub(super) fn fill_kv<'ctx>(
    a: &Attn<'_, '_, 'ctx>,
    cfg: &AttnKernelConfig,
    lay: &WsLayout,
    kv_head: IntValue<'ctx>,
    j0: IntValue<'ctx>,
    koff: IntValue<'ctx>,
    full: PointerValue<'ctx>,
) {
    let b = a.b;
    let first = b.icmpc(IntPredicate::EQ, a.tid, 0);
    let tail = FwdTail::of(cfg, a.score.params().len());
    b.if_then_named(first, ("tma_fill", "tma_filled"), |b| {
        arrive_expect_tx(b, full, fill_bytes(lay));
        for (m, base) in [(0u32, 0i64), (1, lay.kv_bytes as i64)] {
            let map = b.param_ptr(tail.at([Tail::KMap, Tail::VMap][m as usize]));
            for p in 0..(cfg.head_dim / PANEL) as i64 {
                let off = b.addc(koff, base + p * cfg.bn as i64 * 128);
                copy_box(b, b.smem_at(a.smem, off), full, map, [b.i32(p * PANEL as i64), j0, kv_head]);
            }
        }
    });
}

/// `mbarrier.arrive.expect_tx.shared::cta.b64 _, [bar], bytes`: one arrival that also makes
/// the phase wait for `bytes` more of completed copies.
fn arrive_expect_tx<'ctx>(b: &KernelBuilder<'_, 'ctx>, bar: PointerValue<'ctx>, bytes: i64) {
    b.call(
        "llvm.nvvm.mbarrier.arrive.expect.tx.scope.cta.space.cta",
        Some(b.i64t().into()),
        &[bar.into(), b.i32(bytes).into()],
    );
}

/// `cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes`: the box
/// at `coords` (innermost first) of the map at `map` into `dst`, completing on `bar`. No
/// multicast, no cache hint, no CTA group.
fn copy_box<'ctx>(
    b: &KernelBuilder<'_, 'ctx>,
    dst: PointerValue<'ctx>,
    bar: PointerValue<'ctx>,
    map: PointerValue<'ctx>,
    coords: [IntValue<'ctx>; 3],
) {
    let off = b.bool(false);
    b.call_void(
        "llvm.nvvm.cp.async.bulk.tensor.g2s.tile.3d",
        &[
            b.shared_cluster(dst).into(),
            bar.into(),
            map.into(),
            coords[0].into(),
            coords[1].into(),
            coords[2].into(),
            b.ctx.i16_type().const_zero().into(),
            b.i64(0).into(),
            off.into(),
            off.into(),
            b.i32(0).into(),
        ],
    );
}

#[cfg(test)]
mod tests {
    use super::super::{build, HEAD_DIMS};
    use super::*;
    use crate::nvptx::attention::score::Identity;
    use crate::nvptx::target::{finish, prepare_module, target_machine, NvptxTarget};
    use inkwell::context::Context;

    fn cfg(d: u32, tma: bool) -> AttnKernelConfig {
        let mut c = AttnKernelConfig::new(d, true, true);
        (c.ws, c.tma, c.bn, c.out_half) = (true, tma, 128, true);
        c
    }

    fn ptx_for(c: &AttnKernelConfig) -> String {
        let ctx = Context::create();
        let m = ctx.create_module("tma");
        let tm = target_machine(NvptxTarget::Sm90a).unwrap();
        prepare_module(&m, &tm);
        build(&ctx, &m, c, &Identity, &c.kernel_name()).unwrap();
        finish(&m, &tm).unwrap().1
    }

    /// The count the first `full` barrier is initialized with (ptxas form: `mov.b32 %rN, C;`
    /// right before the first `mbarrier.init`).
    fn full_init(ptx: &str) -> String {
        let lines: Vec<&str> = ptx.lines().collect();
        let i = lines.iter().position(|l| l.contains("mbarrier.init")).expect("an mbarrier.init");
        lines[i - 1].trim_end_matches(';').rsplit(", ").next().unwrap_or_default().to_string()
    }

    const COPY: &str = "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes";

    /// The maps arrive by value in parameter space (the copies read them there, no local copy),
    /// one thread arms `full` with the tile bytes and copies `D / 64` panels of K and of V; the
    /// 128 `cp.async` arrivals are gone, so `full` waits for 129 arrivals; cp.async kernels keep
    /// their 256.
    #[test]
    fn ptx_passes_the_maps_by_value_and_copies_panels() {
        for d in HEAD_DIMS {
            let c = cfg(d, true);
            let name = c.kernel_name();
            assert!(name.starts_with("foxc_attn_fwd_ws_tma_"), "{name}");
            let ptx = ptx_for(&c);
            for p in [8, 9] {
                let decl = format!(".param .align 64 .b8 {name}_param_{p}[128]");
                assert!(ptx.contains(&decl), "D={d}: no `{decl}`");
            }
            assert!(ptx.contains("cvta.param.u64"), "D={d}: the map's address is not taken in param space");
            assert!(!ptx.contains(".local"), "D={d}: a map was copied to local memory");
            // Each fill the producer emits (its first one is emitted ahead of its loop).
            let copies = ptx.matches(COPY).count() as u32;
            assert!(copies > 0 && copies.is_multiple_of(2 * d / PANEL), "D={d}: {copies} copies");
            assert!(ptx.contains("mbarrier.arrive.expect_tx.shared.b64"), "D={d}");
            assert!(ptx.contains("fence.mbarrier_init.release.cluster"), "D={d}");
            assert_eq!(full_init(&ptx), "129", "D={d}");
            assert!(!ptx.contains("cp.async.mbarrier.arrive.noinc"), "D={d}");
            let plain = ptx_for(&cfg(d, false));
            assert!(
                !plain.contains("cp.async.bulk.tensor") && !plain.contains("fence.mbarrier_init"),
                "D={d}"
            );
            assert_eq!(full_init(&plain), "256", "D={d}");
        }
    }

    /// ptxas assembles the TMA kernel with `setmaxnreg` honoured and spills bounded as for the
    /// cp.async kernel (assembles_with_ptxas_and_bounded_spills).
    #[test]
    fn assembles_with_ptxas() {
        use crate::nvptx::ptxas;
        let Some(ptxas) = ptxas::find() else {
            eprintln!("note: ptxas not found (set $PTXAS); skipping the PTX assembly check");
            return;
        };
        for d in HEAD_DIMS {
            for decay in [true, false] {
                let mut c = cfg(d, true);
                c.has_decay = decay;
                c.prune = decay;
                let log = ptxas::assemble(&ptxas, &ptx_for(&c), "sm_90a")
                    .unwrap_or_else(|log| panic!("ptxas failed on {}:\n{log}", c.kernel_name()));
                assert!(!log.contains("C7508") && !log.contains("warning"), "D={d}: {log}");
                assert!(ptxas::spill_stores(&log) <= 64, "D={d}: {log}");
            }
        }
    }

    /// K and V as `(D, T, B H_kv)` maps with a `(64, bn, 1)` box and the 128-byte swizzle.
    #[test]
    fn args_map_kv_as_three_dimensional_boxes() {
        let c = cfg(128, true);
        let heads = [Dim::sym("B"), Dim::sym("Hkv")];
        let [k, v] = args(&c, 1, 2, &Dim::sym("T"), &heads);
        let want = |buffer| {
            KernelArg::TensorMap(TmaMap {
                buffer,
                dims: vec![vec![Dim::Const(128)], vec![Dim::sym("T")], heads.to_vec()],
                box_dims: vec![64, 128, 1],
                swizzle_bytes: 128,
            })
        };
        assert_eq!((k, v), (want(1), want(2)));
    }
}
