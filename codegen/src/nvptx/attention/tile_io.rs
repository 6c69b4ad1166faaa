//! Tile I/O of the attention kernel: global -> shared copies with `cp.async` (swizzled layouts
//! for `ldmatrix` and for wgmma), the per-column decay bias in shared memory, the `ldmatrix`
//! addressing of the mma.sync path, and the output epilogue (O / l as f32 or bf16, and the LSE).

use super::score::ScorePos;
use super::{Attn, Rows, LOG2E};
use crate::nvptx::builder::KernelBuilder;
use inkwell::types::BasicTypeEnum;
use inkwell::values::{FloatValue, IntValue, PointerValue};
use inkwell::IntPredicate;

/// Lane-derived indices of the `ldmatrix` addressing: `lane & 7`, `(lane >> 3) & 1`, `lane >> 4`.
pub(super) struct LaneParts<'ctx> {
    l7: IntValue<'ctx>,
    l8: IntValue<'ctx>,
    l16: IntValue<'ctx>,
}

/// One 16-byte chunk of a tile ([`Attn::tile_chunks`]): its global row, its chunk in the row
/// (elements `8 ch ..`), where it is read and its byte offset in shared memory.
struct TileChunk<'ctx> {
    row: IntValue<'ctx>,
    ch: IntValue<'ctx>,
    src: PointerValue<'ctx>,
    smem: IntValue<'ctx>,
}

impl<'k, 'a, 'ctx> Attn<'k, 'a, 'ctx> {
    /// Issues cp.async of `rows` rows of a [T, D] bf16 matrix starting at row `r0` (rows past
    /// T-1 are clamped to T-1: their values are masked or discarded) into the tile at `dst_off`,
    /// in the wgmma panel layout on the wgmma path, else in the ldmatrix layout.
    pub(crate) fn load_tile(
        &self,
        src: PointerValue<'ctx>,
        r0: IntValue<'ctx>,
        rows: u32,
        dst_off: IntValue<'ctx>,
        len: IntValue<'ctx>,
    ) {
        let b = self.b;
        self.tile_chunks(src, (r0, rows), dst_off, len, |c| {
            b.cp_async_16(b.smem_at(self.smem, c.smem), c.src)
        });
    }

    /// The Q tile of head `bh` ([`Attn::load_tile`]'s rows of q's tensor at `src`): copied by
    /// cp.async, or where q has a load map, loaded 16 bytes (8 columns) at a time, mapped
    /// ([`ScoreMod::q_map`] on the 8 columns), rounded to the tile's 16-bit type and stored to
    /// the tile by this thread (the caller's wait and barrier publish both alike; on the wgmma
    /// path its `fence.proxy.async` covers the stores).
    pub(crate) fn load_q_tile(
        &self,
        src: PointerValue<'ctx>,
        (r0, rows): (IntValue<'ctx>, u32),
        dst_off: IntValue<'ctx>,
        len: IntValue<'ctx>,
        bh: IntValue<'ctx>,
    ) {
        if !self.score.has_q_map() {
            return self.load_tile(src, r0, rows, dst_off, len);
        }
        let b = self.b;
        let half = self.cfg.dtype_in;
        let v8 = b.elem_type(half.dtype()).into_float_type().vec_type(8);
        // Every chunk's load first, then the maps: the loads are in flight together.
        let mut chunks = vec![];
        self.tile_chunks(src, (r0, rows), dst_off, len, |c| {
            chunks.push((b.load_aligned(v8.into(), c.src, 16).into_vector_value(), c))
        });
        for (x, c) in chunks {
            let xs: Vec<_> = (0..8).map(|e| b.fpext(b.extract_f(x, e))).collect();
            let mapped = self.score.q_map(b, &xs, ScorePos { i: c.row, j: b.mulc(c.ch, 8), bh });
            let words: Vec<_> = mapped.chunks(2).map(|p| b.pack_half2(half, p[0], p[1])).collect();
            b.store_aligned(b.smem_at(self.smem, c.smem), b.vec_i32(&words), 16);
        }
    }

    /// Calls `each` on the 16-byte chunks of a `rows x D` tile of 16-bit elements (a matrix
    /// at `src`) that this thread moves, in order: chunk `tid + it * threads` for each `it`, of
    /// tile row `row` (global row `r0 + row`, clamped to `len - 1`), in the tile's layout
    /// (wgmma panels or the ldmatrix swizzle) at `dst_off`.
    fn tile_chunks(
        &self,
        src: PointerValue<'ctx>,
        (r0, rows): (IntValue<'ctx>, u32),
        dst_off: IntValue<'ctx>,
        len: IntValue<'ctx>,
        mut each: impl FnMut(TileChunk<'ctx>),
    ) {
        let b = self.b;
        let d = self.cfg.head_dim;
        let cpr = d / 8; // 16-byte chunks per row
        let total = rows * cpr;
        let nth = self.cfg.threads();
        let tmax = b.addc(len, -1);
        // Chunk `tid + it * nth` is chunk `ch` of row `row`. With a power-of-two row (every
        // tuned D) the chunk column is the same in every iteration.
        let pow2 = cpr.is_power_of_two() && nth.is_multiple_of(cpr);
        let (ch0, row_base) = if pow2 {
            (b.andc(self.tid, cpr as i64 - 1), b.lshrc(self.tid, cpr.trailing_zeros() as i64))
        } else {
            (self.tid, self.tid)
        };
        for it in 0..total / nth {
            let (row, ch) = if pow2 {
                (b.addc(row_base, (it * nth / cpr) as i64), ch0)
            } else {
                let c = b.addc(self.tid, (it * nth) as i64);
                (b.udivc(c, cpr as i64), b.uremc(c, cpr as i64))
            };
            let grow = b.smin(b.add(r0, row), tmax);
            let elem = b.add(b.mulc(grow, d as i64), b.mulc(ch, 8));
            let src = b.gep(b.i16t().into(), src, b.sext64(elem));
            let lo = if self.wg { self.swz_panel(row, ch, rows) } else { self.swz(row, ch) };
            each(TileChunk { row: grow, ch, src, smem: b.add(dst_off, lo) });
        }
    }

    /// Byte offset in a swizzled tile of `D` bf16 per row: chunk `ch` (16 bytes) of row `row`
    /// lands at chunk `ch ^ (row & 7)` (`row & 3` when D is not a multiple of 64, so the chunk
    /// stays in its row), so the 8 rows of an `ldmatrix` phase hit distinct bank groups.
    fn swz(&self, row: IntValue<'ctx>, ch: IntValue<'ctx>) -> IntValue<'ctx> {
        let b = self.b;
        let d = self.cfg.head_dim as i64;
        let mask = if d % 64 == 0 { 7 } else { 3 };
        let r7 = b.andc(row, mask);
        let c = b.xor(ch, r7);
        let a = b.mulc(row, d * 2);
        let c16 = b.mulc(c, 16);
        b.add(a, c16)
    }

    /// Byte offset in the wgmma layout (K-major, 128-byte swizzle): the tile is split into panels
    /// of 64 bf16 columns; in a panel each row is 128 bytes and chunk `c` of row `r` lands at
    /// chunk `c ^ (r & 7)` (the hardware's 128B swizzle on a 1024-byte aligned atom).
    fn swz_panel(&self, row: IntValue<'ctx>, ch: IntValue<'ctx>, rows: u32) -> IntValue<'ctx> {
        let b = self.b;
        let r7 = b.andc(row, 7);
        let c8 = b.andc(ch, 7);
        let panel = b.lshrc(ch, 3);
        let c = b.xor(c8, r7);
        let a = b.add(b.mulc(panel, rows as i64 * 128), b.mulc(row, 128));
        b.add(a, b.mulc(c, 16))
    }

    pub(super) fn lane_parts(&self) -> LaneParts<'ctx> {
        let b = self.b;
        let l7 = b.andc(self.lane, 7);
        let l8 = b.andc(b.lshrc(self.lane, 3), 1);
        let l16 = b.lshrc(self.lane, 4);
        LaneParts { l7, l8, l16 }
    }

    /// The warp's Q A-fragments (mma.sync path), one per k-step of 16 over D: matrices
    /// (rows 0-7, k lo), (rows 8-15, k lo), (rows 0-7, k hi), (rows 8-15, k hi).
    pub(super) fn q_fragments(&self, l: &LaneParts<'ctx>, wrow0: IntValue<'ctx>) -> Vec<[IntValue<'ctx>; 4]> {
        let b = self.b;
        let row = b.add(b.add(wrow0, l.l7), b.mulc(l.l8, 8));
        (0..(self.cfg.head_dim / 16) as i64)
            .map(|s| {
                let ch = b.addc(l.l16, 2 * s);
                let off = self.swz(row, ch);
                self.b.ldmatrix_x4(b.smem_at(self.smem, off), false)
            })
            .collect()
    }

    /// Byte offsets (relative to the tile) of the `ldmatrix` loads of the mma.sync path:
    /// K `[jp][s]` for n-tile pair jp and k-step s, matrices (keys 0-7, k lo), (keys 0-7, k hi),
    /// (keys 8-15, k lo), (keys 8-15, k hi); V `[kk][dp]` (trans) for key step kk and d pair dp,
    /// matrices (keys 0-7, d lo), (keys 8-15, d lo), (keys 0-7, d hi), (keys 8-15, d hi).
    #[allow(clippy::type_complexity)]
    pub(super) fn kv_offsets(
        &self,
        l: &LaneParts<'ctx>,
    ) -> (Vec<Vec<IntValue<'ctx>>>, Vec<Vec<IntValue<'ctx>>>) {
        let b = self.b;
        let (nt, kd, dt) = (self.cfg.bn / 8, self.cfg.head_dim / 16, self.cfg.head_dim / 8);
        let k_row_l = b.add(l.l7, b.mulc(l.l16, 8));
        let v_row_l = b.add(l.l7, b.mulc(l.l8, 8));
        let mut k_offs = Vec::new();
        for jp in 0..nt / 2 {
            let row = b.addc(k_row_l, 16 * jp as i64);
            k_offs.push((0..kd).map(|s| self.swz(row, b.addc(l.l8, 2 * s as i64))).collect());
        }
        let mut v_offs = Vec::new();
        for kk in 0..self.cfg.bn / 16 {
            let row = b.addc(v_row_l, 16 * kk as i64);
            v_offs.push((0..dt / 2).map(|dp| self.swz(row, b.addc(l.l16, 2 * dp as i64))).collect());
        }
        (k_offs, v_offs)
    }

    /// c at column `n * bn + (tid mod bn)` (clamped to T-1), loaded by every thread.
    pub(super) fn load_col_c(&self, cb: PointerValue<'ctx>, n: IntValue<'ctx>) -> FloatValue<'ctx> {
        let b = self.b;
        let bn = self.cfg.bn as i64;
        let tmax = b.addc(self.k_len, -1);
        let col = if bn.count_ones() == 1 { b.andc(self.tid, bn - 1) } else { b.uremc(self.tid, bn) };
        let j = b.smin(b.add(b.mulc(n, bn), col), tmax);
        b.load_f32(b.gep(b.f32t().into(), cb, b.sext64(j)))
    }

    /// Threads `tid < bn` write `(c_ref - c_j) * log2 e` to the bias buffer at `off`.
    pub(super) fn store_colb(&self, c_ref: FloatValue<'ctx>, cj: FloatValue<'ctx>, off: IntValue<'ctx>) {
        let b = self.b;
        let c = b.icmpc(IntPredicate::SLT, self.tid, self.cfg.bn as i64);
        let v = b.fmul(b.fsub(c_ref, cj), b.f32(LOG2E));
        b.if_then_named(c, ("colb", "colb_done"), |b| {
            let p = b.smem_at(self.smem, b.add(off, b.mulc(self.tid, 4)));
            b.store(p, v);
        });
    }

    /// This thread's column biases from the buffer at `cbuf`: for each n-tile jt, the columns
    /// `8 jt + 2t` and `+ 1` (one 8-byte load each).
    pub(crate) fn load_colb(&self, cbuf: IntValue<'ctx>, tq: IntValue<'ctx>) -> Vec<FloatValue<'ctx>> {
        let b = self.b;
        let t8 = b.mulc(tq, 8);
        let v2t = b.f32t().vec_type(2);
        let mut c_col = Vec::new();
        for jt in 0..(self.cfg.bn / 8) as i64 {
            let off = b.add(cbuf, b.addc(t8, 32 * jt));
            let ld = b.load_aligned(v2t.into(), b.smem_at(self.smem, off), 8).into_vector_value();
            for e in 0..2 {
                c_col.push(b.extract_f(ld, e));
            }
        }
        c_col
    }

    /// The epilogue: this thread's two rows of `O * inv` (columns `8 dtile + 2t`, `+ 1`) as an
    /// f32 pair or a packed bf16 pair, and (lane t = 0) each row's LSE. Rows past T are skipped.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn store_output(
        &self,
        o: &[FloatValue<'ctx>],
        inv: [FloatValue<'ctx>; 2],
        lse: [FloatValue<'ctx>; 2],
        rows: &Rows<'ctx>,
        (ob, o_elt, lb): (PointerValue<'ctx>, BasicTypeEnum<'ctx>, PointerValue<'ctx>),
        bh: IntValue<'ctx>,
    ) {
        let b = self.b;
        let d = self.cfg.head_dim as i64;
        let t2 = b.mulc(rows.tq, 2);
        for (r, &row) in rows.i.iter().enumerate() {
            let inb = b.icmp(IntPredicate::SLT, row, self.t_len);
            b.if_then_named(inb, ("store", "store_done"), |b| {
                let rowoff = b.mulc(row, d);
                for dtile in 0..(d / 8) as usize {
                    let col = b.addc(t2, 8 * dtile as i64);
                    let (x0, x1) = self.output_pair(o, inv, (dtile, r), ScorePos { i: row, j: col, bh });
                    let idx = b.add(rowoff, col);
                    let p = b.gep(o_elt, ob, b.sext64(idx));
                    if self.cfg.out_half {
                        // Two adjacent columns -> one b32 (cvt.rn.bf16x2.f32, or .f16x2).
                        b.store_aligned(p, b.pack_half2(self.cfg.dtype_in, x0, x1), 4);
                    } else {
                        b.store_aligned(p, b.vec2_f32(x0, x1), 8);
                    }
                }
                let t0 = b.icmpc(IntPredicate::EQ, rows.tq, 0);
                b.if_then_named(t0, ("lse", "lse_done"), |b| {
                    let p = b.gep(b.f32t().into(), lb, b.sext64(row));
                    b.store(p, lse[r]);
                });
            });
        }
    }

    /// What every epilogue writes: the thread's two adjacent output columns of D tile `dtile`
    /// in its row `r` (0 or 1), `O * inv` ([`normalized_pair`]) through the attention's
    /// epilogue, for the columns `at.j` and `at.j + 1` of row `at.i` of head `at.bh`.
    pub(crate) fn output_pair(
        &self,
        o: &[FloatValue<'ctx>],
        inv: [FloatValue<'ctx>; 2],
        (dtile, r): (usize, usize),
        at: ScorePos<'ctx>,
    ) -> (FloatValue<'ctx>, FloatValue<'ctx>) {
        let b = self.b;
        let (x0, x1) = normalized_pair(b, o, inv, dtile, r);
        if !self.score.has_epilogue() {
            return (x0, x1);
        }
        let next = ScorePos { j: b.addc(at.j, 1), ..at };
        (self.score.epilogue(b, x0, at), self.score.epilogue(b, x1, next))
    }

    /// Asks L2 for the lines the epilogue reads in rows `i0 .. i0 + rows` of head `bh` (nothing
    /// without an epilogue): the calling group's thread `tid` of `threads` takes row
    /// `i0 + tid / (threads / rows)` and every 32nd column of its share, one request per
    /// 128-byte line of an f32 row (two of a 16-bit one). Issued when the block starts, the
    /// epilogue's reads in the block's tail find their lines in L2 instead of HBM.
    pub(crate) fn prefetch_epilogue_rows(
        &self,
        (i0, rows): (IntValue<'ctx>, u32),
        (tid, threads): (IntValue<'ctx>, u32),
        bh: IntValue<'ctx>,
    ) {
        if !self.score.has_epilogue() {
            return;
        }
        let b = self.b;
        let per_row = (threads / rows).max(1);
        let i = b.add(i0, b.udivc(tid, per_row as i64));
        let share = b.mulc(b.uremc(tid, per_row as i64), 32);
        let lines = self.cfg.head_dim.div_ceil(32);
        for l in 0..lines.div_ceil(per_row) {
            let j = b.addc(share, (l * per_row * 32) as i64);
            self.score.prefetch_epilogue(b, ScorePos { i, j, bh });
        }
    }
}

/// The thread's two adjacent O columns of D tile `dtile` in its row `r` (0 or 1) of the
/// accumulator fragments `o`, divided by the row's sum (`inv[r] = 1 / l`).
fn normalized_pair<'ctx>(
    b: &KernelBuilder<'_, 'ctx>,
    o: &[FloatValue<'ctx>],
    inv: [FloatValue<'ctx>; 2],
    dtile: usize,
    r: usize,
) -> (FloatValue<'ctx>, FloatValue<'ctx>) {
    (b.fmul(o[dtile * 4 + 2 * r], inv[r]), b.fmul(o[dtile * 4 + 2 * r + 1], inv[r]))
}
