//! The sm_90a (wgmma) matrix products of the backward kernels, used when
//! [`super::BwdConfig::uses_wgmma`]: one warpgroup (4 warps) computes 64 rows of a product,
//! warp `w` of it rows `16 w ..` in the same m16n8 C-fragment order the mma.sync path
//! ([`super::frag`]) produces, so P, dS and the row / column sums are emitted once for both.
//!
//! Tiles are in the forward's wgmma layout (K-major, 128-byte swizzle, 64-column panels of
//! `rows x 128` bytes; [`Bwd::panel_offset`]) and every product maps onto one of the forward's
//! two shapes:
//!
//! * [`Bwd::wg_abt`] `C = A B^T`, both from shared memory, A the 64 rows of a tile from a row,
//!   B all rows of a tile (like `S = Q K^T`): `S = Q K^T`, `dP = dO V^T` (dq kernel),
//!   `S^T = K Q^T`, `dP^T = V dO^T` (dkv kernel, A = the warpgroup's 64 keys);
//! * [`Bwd::wg_acc`] `acc += P B`, P from registers (the A operand, packed to bf16 from the C
//!   fragments), B a `k_rows x D` tile read as the transposed, MN-major operand (like
//!   `O += P V`): `dQ += dS K`, `dV += P^T dO`, `dK += dS^T Q`.
//!
//! Both only issue: a batch opens with [`Bwd::wg_fence`] and ends with [`Bwd::wg_commit_wait`],
//! which waits for everything issued and returns the accumulators (the values only exist
//! after the wait, so nothing reads them early). cp.async writes the tiles through the generic
//! proxy; the kernels put `fence.proxy.async` before the barrier that publishes them.

use super::Bwd;
use crate::nvptx::attention::mma::{gmma_desc, wgmma_rs, wgmma_ss};
use inkwell::values::{FloatValue, IntValue};

/// Rows of one warpgroup's product.
pub(super) const WG_ROWS: u32 = 64;

impl<'k, 'a, 'ctx> Bwd<'k, 'a, 'ctx> {
    /// Byte offset of 16-byte chunk `ch` of row `row` in a wgmma-layout tile of `rows` rows:
    /// panel `ch / 8` (64 columns) at `panel * rows * 128`, then row `row` at `128 row`, its
    /// chunk at `ch ^ (row & 7)` (the hardware's 128-byte swizzle on a 1024-byte atom).
    pub(super) fn panel_offset(&self, row: IntValue<'ctx>, ch: IntValue<'ctx>, rows: u32) -> IntValue<'ctx> {
        let b = self.b;
        let c = b.xor(b.andc(ch, 7), b.andc(row, 7));
        let at = b.add(b.mulc(b.lshrc(ch, 3), rows as i64 * 128), b.mulc(row, 128));
        b.add(at, b.mulc(c, 16))
    }

    /// Opens a batch of wgmma products (orders this thread's register writes, P packed
    /// included, before the tensor cores read them).
    pub(super) fn wg_fence(&self) {
        self.b.asm_stmt("wgmma.fence.sync.aligned;");
    }

    /// Ends a batch: later work overlaps it until [`Bwd::wg_commit_wait`].
    pub(super) fn wg_commit(&self) {
        self.b.asm_stmt("wgmma.commit_group.sync.aligned;");
    }

    /// Commits the batch and waits for it and every earlier one; `accs` (all accumulators
    /// still in flight) come back usable.
    pub(super) fn wg_commit_wait(&self, accs: &[&[FloatValue<'ctx>]]) -> Vec<Vec<FloatValue<'ctx>>> {
        let b = self.b;
        self.wg_commit();
        let flat: Vec<FloatValue<'ctx>> = accs.iter().flat_map(|a| a.iter().copied()).collect();
        let done = b.asm_pass("wgmma.wait_group.sync.aligned 0;", &flat);
        let mut out = Vec::with_capacity(accs.len());
        let mut at = 0;
        for a in accs {
            out.push(done[at..at + a.len()].to_vec());
            at += a.len();
        }
        out
    }

    /// Issues `C = A B^T` (`b_rows / 2` f32 per thread, from zero): A the 64 rows from `a_off`
    /// of a tile of `a_rows` rows (the panel stride), B the `b_rows` rows of the tile at
    /// `b_off`; 16 columns of D per step, step `s` in panel `s / 4` at byte `32 (s % 4)` of
    /// each 128-byte row.
    pub(super) fn wg_abt(
        &self,
        (a_off, a_rows): (IntValue<'ctx>, u32),
        (b_off, b_rows): (IntValue<'ctx>, u32),
    ) -> Vec<FloatValue<'ctx>> {
        let b = self.b;
        let mut acc = vec![b.f32(0.0); (b_rows / 2) as usize];
        for s in 0..(self.cfg.head_dim / 16) as i64 {
            let (panel, col) = (s / 4, (s % 4) * 32);
            let da = gmma_desc(b, self.smem, b.addc(a_off, panel * a_rows as i64 * 128 + col), 16);
            let db = gmma_desc(b, self.smem, b.addc(b_off, panel * b_rows as i64 * 128 + col), 16);
            acc = wgmma_ss(b, self.cfg.dtype, &acc, da, db);
        }
        acc
    }

    /// Issues `acc += P B` over `k_rows` (a multiple of 16): `p` this warp's 16 rows in
    /// C-fragment order (`k_rows / 8` n-tiles), packed to bf16 A fragments by the caller with
    /// [`Bwd::wg_pack`] before the batch's fence; B the tile at `b_off` (`k_rows` rows x D, D
    /// contiguous: MN-major, 64-column panels `k_rows * 128` bytes apart).
    pub(super) fn wg_acc(
        &self,
        mut acc: Vec<FloatValue<'ctx>>,
        a: &[[IntValue<'ctx>; 4]],
        b_off: IntValue<'ctx>,
        k_rows: u32,
    ) -> Vec<FloatValue<'ctx>> {
        let b = self.b;
        for (kk, af) in a.iter().enumerate() {
            let db = gmma_desc(b, self.smem, b.addc(b_off, kk as i64 * 16 * 128), k_rows as i64 * 128);
            acc = wgmma_rs(b, self.cfg.dtype, &acc, af, db);
        }
        acc
    }

    /// The bf16 A fragments of `p` (16 rows x `8 p.len() / 4` columns in C-fragment order),
    /// one per 16 columns: two n-tiles, each row pair packed.
    pub(super) fn wg_pack(&self, p: &[FloatValue<'ctx>]) -> Vec<[IntValue<'ctx>; 4]> {
        let b = self.b;
        p.chunks(8)
            .map(|t| {
                [
                    b.pack_half2(self.cfg.dtype, t[0], t[1]),
                    b.pack_half2(self.cfg.dtype, t[2], t[3]),
                    b.pack_half2(self.cfg.dtype, t[4], t[5]),
                    b.pack_half2(self.cfg.dtype, t[6], t[7]),
                ]
            })
            .collect()
    }
}

/// `[jt][e]` per 8-column n-tile of a flat accumulator.
pub(super) fn tiles<'ctx>(acc: &[FloatValue<'ctx>]) -> Vec<[FloatValue<'ctx>; 4]> {
    acc.chunks(4).map(|c| [c[0], c[1], c[2], c[3]]).collect()
}

impl<'k, 'a, 'ctx> Bwd<'k, 'a, 'ctx> {
    /// The products `A_x B_x^T` of `prods` ([`Bwd::wg_abt`] operands) in one batch, as n-tiles.
    #[allow(clippy::type_complexity)]
    pub(super) fn wg_abt_batch(
        &self,
        prods: &[((IntValue<'ctx>, u32), (IntValue<'ctx>, u32))],
    ) -> Vec<Vec<[FloatValue<'ctx>; 4]>> {
        self.wg_fence();
        let accs: Vec<_> = prods.iter().map(|&(a, bt)| self.wg_abt(a, bt)).collect();
        let refs: Vec<&[FloatValue<'ctx>]> = accs.iter().map(|a| a.as_slice()).collect();
        self.wg_commit_wait(&refs).iter().map(|a| tiles(a)).collect()
    }

    /// `acc += P B` in a batch of its own (packs, fences, issues, waits).
    pub(super) fn wg_acc_now(
        &self,
        acc: Vec<FloatValue<'ctx>>,
        p: &[FloatValue<'ctx>],
        b_off: IntValue<'ctx>,
        k_rows: u32,
    ) -> Vec<FloatValue<'ctx>> {
        let a = self.wg_pack(p);
        self.wg_fence();
        let acc = self.wg_acc(acc, &a, b_off, k_rows);
        self.wg_commit_wait(&[&acc]).remove(0)
    }
}

impl<'k, 'a, 'ctx> Bwd<'k, 'a, 'ctx> {
    /// On the wgmma path, `fence.proxy.async`: cp.async wrote the tiles through the generic
    /// proxy, wgmma reads them through the async proxy (each thread, before the barrier).
    pub(super) fn fence_proxy(&self) {
        if self.wg {
            self.b.asm_stmt("fence.proxy.async.shared::cta;");
        }
    }
}
