//! Block-wide reductions (the threshold kernels, the split merge): a maximum or minimum every thread receives,
//! and a running maximum in thread order.

use super::builder::KernelBuilder as Kb;
use inkwell::values::{FloatValue, IntValue};
use inkwell::IntPredicate;

/// Combine per-thread values `vals` over a block of `warps` warps with `op` (max or min): warp
/// reduction, then every thread reads the warps' results from shared memory (so all threads
/// hold them).
pub(crate) fn block_reduce<'ctx>(
    k: &Kb<'_, 'ctx>,
    name: &str,
    vals: &[FloatValue<'ctx>],
    (lane, warp): (IntValue<'ctx>, IntValue<'ctx>),
    warps: u32,
    min: bool,
) -> Vec<FloatValue<'ctx>> {
    let op = |a, b| if min { k.fmin(a, b) } else { k.fmax(a, b) };
    let sh = k.shared_f32(name, warps * vals.len() as u32);
    let wr: Vec<FloatValue<'ctx>> = vals
        .iter()
        .map(|&v| {
            let mut v = v;
            for m in [16, 8, 4, 2, 1] {
                v = op(v, k.shfl_xor(v, m));
            }
            v
        })
        .collect();
    let is0 = k.icmpc(IntPredicate::EQ, lane, 0);
    k.if_then(is0, |k| {
        for (s, v) in wr.iter().enumerate() {
            let at = k.addc(warp, (s as u32 * warps) as i64);
            k.store(k.shared_at(sh, at), *v);
        }
    });
    k.barrier();
    (0..vals.len())
        .map(|s| {
            let mut v = k.load_f32(k.shared_at(sh, k.i32((s as u32 * warps) as i64)));
            for w in 1..warps {
                v = op(v, k.load_f32(k.shared_at(sh, k.i32((s as u32 * warps + w) as i64))));
            }
            v
        })
        .collect()
}

/// Inclusive running maximum of `v` over the threads of a block of `warps` warps, in thread
/// order, and the block's maximum: a warp scan (`shfl.up`; a lane below the distance keeps its
/// own value, which max leaves unchanged), then the maxima of the warps before this one from
/// shared memory. Ends with a barrier, so the caller may call it again in a loop.
pub(crate) fn block_scan_max<'ctx>(
    k: &Kb<'_, 'ctx>,
    name: &str,
    v: FloatValue<'ctx>,
    (lane, warp): (IntValue<'ctx>, IntValue<'ctx>),
    warps: u32,
) -> (FloatValue<'ctx>, FloatValue<'ctx>) {
    let mut x = v;
    for dist in [1, 2, 4, 8, 16] {
        x = k.fmax(x, k.shfl_up(x, dist));
    }
    let sh = k.shared_f32(name, warps);
    k.if_then(k.icmpc(IntPredicate::EQ, lane, 31), |k| k.store(k.shared_at(sh, warp), x));
    k.barrier();
    let (mut before, mut total) = (x, x);
    for w in 0..warps {
        let m = k.load_f32(k.shared_at(sh, k.i32(w as i64)));
        let earlier = k.icmpc(IntPredicate::UGT, warp, w as i64);
        before = k.select_f(earlier, k.fmax(before, m), before);
        total = k.fmax(total, m);
    }
    k.barrier();
    (before, total)
}
