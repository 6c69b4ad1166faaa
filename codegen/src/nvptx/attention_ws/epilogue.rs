//! A consumer's bf16 epilogue through shared memory: the normalized O tile (64 rows) is packed
//! to bf16 pairs as the standard epilogue does, written into the consumer's own Q tile (free:
//! every wgmma of this consumer has completed), then copied out with one 16-byte coalesced
//! store per chunk instead of 4-byte stores spread over eight rows per warp instruction.
//!
//! Staging layout: row `r` of the tile is `2 D` bytes at `r * 2 D`; its 16-byte chunk `c`
//! (8 columns) lands at chunk `c ^ (r & 7)`, so the fragment writes (a warp writes one chunk
//! column of eight rows `g`) and the 16-byte reads (eight consecutive chunks of one row per
//! quarter warp) both hit 32 distinct banks.

use super::sync::{fence_async_shared, named_barrier};
use crate::nvptx::attention::{Attn, Rows};
use inkwell::values::{FloatValue, IntValue, PointerValue};
use inkwell::IntPredicate;

/// Writes O * inv (bf16) for this consumer's 64 rows from `i0w` on (rows past T skipped) and
/// each row's LSE (lanes `tq = 0`, as the standard epilogue). `a` is the consumer's view
/// (shared memory from its Q tile), `cw` the consumer (its named barrier `cw + 1`, the one of
/// its Q load, 128 threads).
#[allow(clippy::too_many_arguments)]
pub(super) fn store_output_bf16<'ctx>(
    a: &Attn<'_, '_, 'ctx>,
    o: &[FloatValue<'ctx>],
    inv: [FloatValue<'ctx>; 2],
    lse: [FloatValue<'ctx>; 2],
    rows: &Rows<'ctx>,
    i0w: IntValue<'ctx>,
    cw: IntValue<'ctx>,
    ob: PointerValue<'ctx>,
    lb: PointerValue<'ctx>,
) {
    let b = a.b;
    let d = a.cfg.head_dim as i64;
    let cpr = d / 8; // 16-byte chunks per row
                     // The wgmmas read Q through the async proxy; order those reads before the generic writes.
    fence_async_shared(b);
    let t4 = b.mulc(rows.tq, 4);
    for r in 0..2 {
        let rl = b.sub(rows.i[r], i0w);
        let r7 = b.andc(rl, 7);
        let row_off = b.add(b.mulc(rl, 2 * d), t4);
        for dtile in 0..cpr as usize {
            let x0 = b.fmul(o[dtile * 4 + 2 * r], inv[r]);
            let x1 = b.fmul(o[dtile * 4 + 2 * r + 1], inv[r]);
            let ch = b.xor(b.i32(dtile as i64), r7);
            let off = b.add(row_off, b.mulc(ch, 16));
            // Two adjacent columns -> one b32 of bf16 (cvt.rn.bf16x2.f32), as store_output.
            b.store_aligned(b.smem_at(a.smem, off), b.pack_bf16(x0, x1), 4);
        }
    }
    named_barrier(b, b.addc(cw, 1), 128);
    let v4 = b.i32t().vec_type(4);
    let i16t = b.i16t().into();
    let threads = 128;
    let rows_per_pass = threads / cpr;
    let ch = b.andc(a.tid, cpr - 1);
    let r0 = b.lshrc(a.tid, cpr.trailing_zeros() as i64);
    for pass in 0..64 / rows_per_pass {
        let rl = b.addc(r0, pass * rows_per_pass);
        let sw = b.xor(ch, b.andc(rl, 7));
        let src = b.add(b.mulc(rl, 2 * d), b.mulc(sw, 16));
        let x = b.load_aligned(v4.into(), b.smem_at(a.smem, src), 16);
        let row = b.add(i0w, rl);
        let inb = b.icmp(IntPredicate::SLT, row, a.t_len);
        b.if_then_named(inb, ("ostore", "ostore_done"), |b| {
            let idx = b.add(b.mulc(row, d), b.mulc(ch, 8));
            b.store_aligned(b.gep(i16t, ob, b.sext64(idx)), x, 16);
        });
    }
    let t0 = b.icmpc(IntPredicate::EQ, rows.tq, 0);
    for r in 0..2 {
        let inb = b.icmp(IntPredicate::SLT, rows.i[r], a.t_len);
        b.if_then_named(b.and(inb, t0), ("lse", "lse_done"), |b| {
            let p = b.gep(b.f32t().into(), lb, b.sext64(rows.i[r]));
            b.store(p, lse[r]);
        });
    }
}
