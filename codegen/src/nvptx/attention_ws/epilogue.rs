//! A consumer's 16-bit epilogue through shared memory: the normalized O tile (64 rows) is
//! packed to bf16 (or f16) pairs as the standard epilogue does, written into the consumer's own Q tile (free:
//! every wgmma of this consumer has completed), then copied out with one 16-byte coalesced
//! store per chunk instead of 4-byte stores spread over eight rows per warp instruction.
//!
//! Staging layout: row `r` of the tile is `2 D` bytes at `r * 2 D`; its 16-byte chunk `c`
//! (8 columns) lands at chunk `c ^ (r & 7)`, so the fragment writes (a warp writes one chunk
//! column of eight rows `g`) and the 16-byte reads (eight consecutive chunks of one row per
//! quarter warp) both hit 32 distinct banks.
//!
//! The thread's indices are derived here from a fresh read of `%tid.x` (`sreg_fresh`, not merged
//! with the kernel's first read): keeping them live across the consumer's loop instead made
//! ptxas schedule every wgmma descriptor after the turn barrier (129 instructions before the
//! first HGMMA of a turn instead of 19).

use super::sync::{fence_async_shared, named_barrier};
use super::WsLayout;
use crate::nvptx::attention::score::ScorePos;
use crate::nvptx::attention::Attn;
use inkwell::values::{FloatValue, IntValue, PointerValue};
use inkwell::IntPredicate;

/// Where a consumer's epilogue writes: the block's shared memory and first row, the output
/// and LSE of its head.
pub(super) struct OutAt<'ctx> {
    pub base: PointerValue<'ctx>,
    pub i0: IntValue<'ctx>,
    /// The flat batch-head index (the epilogue's `b`, `h`).
    pub bh: IntValue<'ctx>,
    pub ob: PointerValue<'ctx>,
    pub lb: PointerValue<'ctx>,
}

/// Writes O * inv (in the operands' 16-bit type) for the calling consumer's 64 rows (rows past T skipped) and each
/// row's LSE (lanes `tq = 0`, as the standard epilogue); `o`, `inv`, `lse` are the thread's
/// fragments in the wgmma accumulator order. Uses the consumer's named barrier `cw + 1` (the
/// one of its Q load, 128 threads).
pub(super) fn store_output_half<'ctx>(
    a: &Attn<'_, '_, 'ctx>,
    lay: &WsLayout,
    at: &OutAt<'ctx>,
    o: &[FloatValue<'ctx>],
    inv: [FloatValue<'ctx>; 2],
    lse: [FloatValue<'ctx>; 2],
) {
    let b = a.b;
    let d = a.cfg.head_dim as i64;
    let cpr = d / 8; // 16-byte chunks per row
    let tid = b.sreg_fresh("tid.x");
    let wtid = b.andc(tid, 127);
    let cw = b.addc(b.lshrc(tid, 7), -1);
    let lane = b.andc(tid, 31);
    let tq = b.andc(lane, 3);
    let i0w = b.add(at.i0, b.mulc(cw, 64));
    let tile = b.mulc(cw, lay.q_bytes as i64);
    // This thread's two rows in the tile: 16 per warp, g and g + 8.
    let rl0 = b.add(b.mulc(b.lshrc(wtid, 5), 16), b.lshrc(lane, 2));
    let rl = [rl0, b.addc(rl0, 8)];
    // The wgmmas read Q through the async proxy; order those reads before the generic writes.
    fence_async_shared(b);
    let t4 = b.mulc(tq, 4);
    let t2 = b.mulc(tq, 2);
    for (r, &row) in rl.iter().enumerate() {
        let r7 = b.andc(row, 7);
        let row_off = b.add(b.add(tile, b.mulc(row, 2 * d)), t4);
        for dtile in 0..cpr as usize {
            let at_col = ScorePos { i: b.add(i0w, row), j: b.addc(t2, 8 * dtile as i64), bh: at.bh };
            let (x0, x1) = a.output_pair(o, inv, (dtile, r), at_col);
            let ch = b.xor(b.i32(dtile as i64), r7);
            let off = b.add(row_off, b.mulc(ch, 16));
            // Two adjacent columns -> one b32 (cvt.rn.bf16x2.f32 or .f16x2), as store_output.
            b.store_aligned(b.smem_at(at.base, off), b.pack_half2(a.cfg.dtype_in, x0, x1), 4);
        }
    }
    named_barrier(b, b.addc(cw, 1), 128);
    let v4 = b.i32t().vec_type(4);
    let i16t = b.i16t().into();
    let rows_per_pass = 128 / cpr;
    let ch = b.andc(wtid, cpr - 1);
    let r0 = b.lshrc(wtid, cpr.trailing_zeros() as i64);
    for pass in 0..64 / rows_per_pass {
        let r = b.addc(r0, pass * rows_per_pass);
        let sw = b.xor(ch, b.andc(r, 7));
        let src = b.add(tile, b.add(b.mulc(r, 2 * d), b.mulc(sw, 16)));
        let x = b.load_aligned(v4.into(), b.smem_at(at.base, src), 16);
        let row = b.add(i0w, r);
        let inb = b.icmp(IntPredicate::SLT, row, a.t_len);
        b.if_then_named(inb, ("ostore", "ostore_done"), |b| {
            let idx = b.add(b.mulc(row, d), b.mulc(ch, 8));
            b.store_aligned(b.gep(i16t, at.ob, b.sext64(idx)), x, 16);
        });
    }
    let t0 = b.icmpc(IntPredicate::EQ, tq, 0);
    for r in 0..2 {
        let row = b.add(i0w, rl[r]);
        let inb = b.icmp(IntPredicate::SLT, row, a.t_len);
        b.if_then_named(b.and(inb, t0), ("lse", "lse_done"), |b| {
            let p = b.gep(b.f32t().into(), at.lb, b.sext64(row));
            b.store(p, lse[r]);
        });
    }
}
