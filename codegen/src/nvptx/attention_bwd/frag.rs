//! Tiles and matrix products of the backward kernels: `[rows, D]` bf16 tiles copied to shared
//! memory with `cp.async` in the forward's swizzled row layout (16-byte chunk `ch` of row `r` at
//! chunk `ch ^ (r & 7)`, `r & 3` when D is not a multiple of 64; on the wgmma path the panel
//! layout of [`super::wg`]), and `mma.sync.m16n8k16` on fragments read with `ldmatrix`:
//!
//! * [`Bwd::a_frags`]: the A operand (16 rows x D) of a warp from a tile;
//! * [`Bwd::mma_abt`]: `C = A B^T` with B the rows of a tile (`S = Q K^T`, `dP = dO V^T`, and
//!   in the transposed world `S^T = K Q^T`, `dP^T = V dO^T`);
//! * [`Bwd::mma_acc`]: `acc += P B` with P in C-fragment order (the A operand packed to bf16)
//!   and B a tile read transposed (`dQ += dS K`, `dV += P^T dO`, `dK += dS^T Q`).
//!
//! Fragments follow the m16n8 C layout: per 8-column n-tile a thread holds 4 values, rows
//! `g = lane >> 2` (elements 0, 1) and `g + 8` (2, 3), columns `2t`, `2t + 1` (`t = lane & 3`).

use super::Bwd;
use inkwell::values::{FloatValue, IntValue, PointerValue};
use inkwell::IntPredicate;

impl<'k, 'a, 'ctx> Bwd<'k, 'a, 'ctx> {
    /// cp.async of `rows` rows of a `[len, D]` 16-bit matrix from row `r0` (rows past len-1
    /// read row len-1: their values are masked or not stored) into the tile at byte offset
    /// `dst`; `len` is the queries' `T` or the keys' `Tk`.
    pub(super) fn load_tile(
        &self,
        src: PointerValue<'ctx>,
        (r0, len): (IntValue<'ctx>, IntValue<'ctx>),
        rows: u32,
        dst: IntValue<'ctx>,
    ) {
        let b = self.b;
        let d = self.cfg.head_dim;
        let cpr = d / 8; // 16-byte chunks per row
        let total = rows * cpr;
        let nth = self.threads;
        let tmax = b.addc(len, -1);
        for it in 0..total.div_ceil(nth) {
            let c = b.addc(self.tid, (it * nth) as i64);
            let emit = |b: &crate::nvptx::builder::KernelBuilder<'a, 'ctx>| {
                let (row, ch) = (b.udivc(c, cpr as i64), b.uremc(c, cpr as i64));
                let grow = b.smin(b.add(r0, row), tmax);
                let eidx = b.add(b.mul(grow, b.i32(d as i64)), b.mulc(ch, 8));
                let gp = b.gep(b.i16t().into(), src, b.sext64(eidx));
                let lo = if self.wg { self.panel_offset(row, ch, rows) } else { self.swz(row, ch) };
                let so = b.add(dst, lo);
                b.cp_async_16(b.smem_at(self.smem, so), gp);
            };
            if (it + 1) * nth <= total {
                emit(b);
            } else {
                b.if_then(b.icmpc(IntPredicate::SLT, c, total as i64), emit);
            }
        }
    }

    /// Byte offset of chunk `ch` of row `row` in a swizzled tile.
    fn swz(&self, row: IntValue<'ctx>, ch: IntValue<'ctx>) -> IntValue<'ctx> {
        let b = self.b;
        let d = self.cfg.head_dim as i64;
        let mask = if d % 64 == 0 { 7 } else { 3 };
        let c = b.xor(ch, b.andc(row, mask));
        b.add(b.mulc(row, d * 2), b.mulc(c, 16))
    }

    /// `lane & 7`, `(lane >> 3) & 1`, `lane >> 4`: the ldmatrix addressing of a lane.
    fn lane_parts(&self) -> (IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>) {
        let b = self.b;
        (b.andc(self.lane, 7), b.andc(b.lshrc(self.lane, 3), 1), b.lshrc(self.lane, 4))
    }

    /// The A fragments of the 16 rows from `row0` of the tile at `off`, one per k-step of 16
    /// over D: matrices (rows 0-7, k lo), (rows 8-15, k lo), (rows 0-7, k hi), (rows 8-15, k hi).
    pub(super) fn a_frags(&self, off: IntValue<'ctx>, row0: IntValue<'ctx>) -> Vec<[IntValue<'ctx>; 4]> {
        let b = self.b;
        let (l7, l8, l16) = self.lane_parts();
        let row = b.add(b.add(row0, l7), b.mulc(l8, 8));
        (0..(self.cfg.head_dim / 16) as i64)
            .map(|s| {
                let o = b.add(off, self.swz(row, b.addc(l16, 2 * s)));
                self.b.ldmatrix_x4(b.smem_at(self.smem, o), false)
            })
            .collect()
    }

    /// `C = A B^T` (`[nt][e]` per 8-column n-tile) with A the fragments `a` (16 x D) and B the
    /// `n_rows` rows of the tile at `off` (n rows x D): ldmatrix matrices (rows 0-7, k lo),
    /// (rows 0-7, k hi), (rows 8-15, k lo), (rows 8-15, k hi) of each 16-row pair.
    pub(super) fn mma_abt(
        &self,
        a: &[[IntValue<'ctx>; 4]],
        off: IntValue<'ctx>,
        n_rows: u32,
    ) -> Vec<[FloatValue<'ctx>; 4]> {
        self.mma_abt_with(&|s| a[s], a.len(), off, n_rows)
    }

    /// [`Bwd::mma_abt`] with the A fragments read from the tile at `a_off` (rows from
    /// `a_row0`) one k-step at a time, for a head dim whose fragments would not stay in
    /// registers next to the accumulators (D = 256: 64 registers per 16 x D operand).
    pub(super) fn mma_abt_smem(
        &self,
        (a_off, a_row0): (IntValue<'ctx>, IntValue<'ctx>),
        off: IntValue<'ctx>,
        n_rows: u32,
    ) -> Vec<[FloatValue<'ctx>; 4]> {
        let b = self.b;
        let (l7, l8, l16) = self.lane_parts();
        let row = b.add(b.add(a_row0, l7), b.mulc(l8, 8));
        let frag = |s: usize| {
            let o = b.add(a_off, self.swz(row, b.addc(l16, 2 * s as i64)));
            b.ldmatrix_x4(b.smem_at(self.smem, o), false)
        };
        self.mma_abt_with(&frag, (self.cfg.head_dim / 16) as usize, off, n_rows)
    }

    /// `C = A B^T` with the A fragment of k-step `s` from `a(s)` (called once per k-step).
    fn mma_abt_with(
        &self,
        a: &dyn Fn(usize) -> [IntValue<'ctx>; 4],
        ksteps: usize,
        off: IntValue<'ctx>,
        n_rows: u32,
    ) -> Vec<[FloatValue<'ctx>; 4]> {
        let b = self.b;
        let (l7, l8, l16) = self.lane_parts();
        let nt = (n_rows / 8) as usize;
        let zero = b.f32(0.0);
        let mut c = vec![[zero; 4]; nt];
        let row_l = b.add(l7, b.mulc(l16, 8));
        for s in 0..ksteps {
            let af = &a(s);
            for jp in 0..nt / 2 {
                let row = b.addc(row_l, 16 * jp as i64);
                let o = b.add(off, self.swz(row, b.addc(l8, 2 * s as i64)));
                let m = self.b.ldmatrix_x4(b.smem_at(self.smem, o), false);
                c[2 * jp] = self.b.mma_m16n8k16(self.cfg.dtype, af, m[0], m[1], &c[2 * jp]);
                c[2 * jp + 1] = self.b.mma_m16n8k16(self.cfg.dtype, af, m[2], m[3], &c[2 * jp + 1]);
            }
        }
        c
    }

    /// `acc += P B`: `p` in C-fragment order over `k_rows / 8` n-tiles (16 rows x k_rows),
    /// B the tile at `off` (k_rows x D) read transposed; `acc[dtile * 4 + e]` over
    /// `acc.len() / 4` 8-column tiles of B, from 16-byte chunk `ch0` of its rows (the block's
    /// head-dim part, [`super::BwdConfig::d_parts`]; `None`: from column 0).
    pub(super) fn mma_acc(
        &self,
        mut acc: Vec<FloatValue<'ctx>>,
        p: &[FloatValue<'ctx>],
        (off, ch0): (IntValue<'ctx>, Option<IntValue<'ctx>>),
        k_rows: u32,
    ) -> Vec<FloatValue<'ctx>> {
        let b = self.b;
        let (l7, l8, mut l16) = self.lane_parts();
        if let Some(c) = ch0 {
            l16 = b.add(l16, c);
        }
        let dt = acc.len() / 4;
        let row_l = b.add(l7, b.mulc(l8, 8));
        for kk in 0..(k_rows / 16) as usize {
            let a = [
                b.pack_half2(self.cfg.dtype, p[(2 * kk) * 4], p[(2 * kk) * 4 + 1]),
                b.pack_half2(self.cfg.dtype, p[(2 * kk) * 4 + 2], p[(2 * kk) * 4 + 3]),
                b.pack_half2(self.cfg.dtype, p[(2 * kk + 1) * 4], p[(2 * kk + 1) * 4 + 1]),
                b.pack_half2(self.cfg.dtype, p[(2 * kk + 1) * 4 + 2], p[(2 * kk + 1) * 4 + 3]),
            ];
            let row = b.addc(row_l, 16 * kk as i64);
            for dp in 0..dt / 2 {
                let o = b.add(off, self.swz(row, b.addc(l16, 2 * dp as i64)));
                let m = self.b.ldmatrix_x4(b.smem_at(self.smem, o), true);
                for (h, (b0, b1)) in [(m[0], m[1]), (m[2], m[3])].into_iter().enumerate() {
                    let at = (2 * dp + h) * 4;
                    let r = self.b.mma_m16n8k16(self.cfg.dtype, &a, b0, b1, &acc[at..at + 4]);
                    acc[at..at + 4].copy_from_slice(&r);
                }
            }
        }
        acc
    }
}
