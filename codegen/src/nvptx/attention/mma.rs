//! The MMA steps of the attention kernel: `S = Q K^T` and `O += P V`, with `mma.sync.m16n8k16`
//! (sm_80 and the mma.sync path of sm_90) or `wgmma.mma_async` through inline PTX (sm_90a).
//!
//! Fragments follow the m16n8 C layout: per 8-column n-tile a thread holds 4 values, rows
//! `g = lane >> 2` (elements 0, 1) and `g + 8` (elements 2, 3), columns `2t`, `2t + 1`
//! (`t = lane & 3`). wgmma's m64nN accumulators use the same order per warp and 8 columns.

use super::{Attn, Frags};
use crate::nvptx::builder::{Half, KernelBuilder};
use inkwell::values::{BasicValueEnum, FloatValue, IntValue, PointerValue};

impl<'k, 'a, 'ctx> Attn<'k, 'a, 'ctx> {
    /// `S = Q K^T` for the K tile at byte offset `kcur`: `[jt][e]` per 8-key n-tile.
    pub(crate) fn qk(&self, kcur: IntValue<'ctx>, frag: Option<&Frags<'ctx>>) -> Vec<[FloatValue<'ctx>; 4]> {
        let b = self.b;
        let nt = (self.cfg.bn / 8) as usize;
        let kd = (self.cfg.head_dim / 16) as usize;
        let zero = b.f32(0.0);
        let mut s_acc = vec![[zero; 4]; nt];
        match frag {
            None => {
                // wgmma: Q (64 rows) and K from shared memory, 16 columns of D per step; step s
                // is in panel s / 4 at byte 32 (s % 4) of each 128-byte row.
                let (bm, bn) = (self.cfg.block_rows() as i64, self.cfg.bn as i64);
                let mut acc = vec![zero; nt * 4];
                b.asm_stmt("wgmma.fence.sync.aligned;");
                for s in 0..kd {
                    let step = ((s / 4) as i64, (s % 4) as i64 * 32);
                    let qo = b.i32(step.0 * bm * 128 + step.1);
                    let ko = b.addc(kcur, step.0 * bn * 128 + step.1);
                    let da = self.gmma_desc(qo, 16);
                    let db = self.gmma_desc(ko, 16);
                    acc = self.wgmma(&acc, da, db);
                }
                b.asm_stmt("wgmma.commit_group.sync.aligned;");
                acc = b.asm_pass("wgmma.wait_group.sync.aligned 0;", &acc);
                for (jt, s) in s_acc.iter_mut().enumerate() {
                    s.copy_from_slice(&acc[jt * 4..jt * 4 + 4]);
                }
            }
            Some(f) => {
                for s in 0..kd {
                    for jp in 0..nt / 2 {
                        let off = b.add(kcur, f.k[jp][s]);
                        let m = self.b.ldmatrix_x4(b.smem_at(self.smem, off), false);
                        s_acc[2 * jp] =
                            self.b.mma_m16n8k16(self.cfg.dtype_in, &f.q[s], m[0], m[1], &s_acc[2 * jp]);
                        s_acc[2 * jp + 1] =
                            self.b.mma_m16n8k16(self.cfg.dtype_in, &f.q[s], m[2], m[3], &s_acc[2 * jp + 1]);
                    }
                }
            }
        }
        s_acc
    }

    /// `O += P V` for the V tile at byte offset `vcur`; `p` holds the probabilities in the S
    /// fragment order, `o` the accumulators (`[dtile * 4 + e]`).
    pub(crate) fn pv(
        &self,
        mut o: Vec<FloatValue<'ctx>>,
        p: &[FloatValue<'ctx>],
        vcur: IntValue<'ctx>,
        frag: Option<&Frags<'ctx>>,
    ) -> Vec<FloatValue<'ctx>> {
        let b = self.b;
        let bn = self.cfg.bn as i64;
        let dt = (self.cfg.head_dim / 8) as usize;
        let steps = (bn / 16) as usize;
        for kk in 0..steps {
            // P as the A operand of 16 keys: two n-tiles of S, packed to 16-bit pairs.
            let a = [
                b.pack_half2(self.cfg.dtype_in, p[(2 * kk) * 4], p[(2 * kk) * 4 + 1]),
                b.pack_half2(self.cfg.dtype_in, p[(2 * kk) * 4 + 2], p[(2 * kk) * 4 + 3]),
                b.pack_half2(self.cfg.dtype_in, p[(2 * kk + 1) * 4], p[(2 * kk + 1) * 4 + 1]),
                b.pack_half2(self.cfg.dtype_in, p[(2 * kk + 1) * 4 + 2], p[(2 * kk + 1) * 4 + 3]),
            ];
            match frag {
                None => {
                    // V tile (keys x D, D contiguous) is the MN-major B operand: 8-key groups
                    // 1024 B apart, 64-column panels bn*128 B apart; keys 16kk.. start at row 16kk.
                    if kk == 0 {
                        b.asm_stmt("wgmma.fence.sync.aligned;");
                    }
                    let vo = b.addc(vcur, kk as i64 * 16 * 128);
                    let db = self.gmma_desc(vo, bn * 128);
                    o = self.wgmma_rs(&o, &a, db);
                    if kk + 1 == steps {
                        b.asm_stmt("wgmma.commit_group.sync.aligned;");
                        o = b.asm_pass("wgmma.wait_group.sync.aligned 0;", &o);
                    }
                }
                Some(f) => {
                    for dp in 0..dt / 2 {
                        let off = b.add(vcur, f.v[kk][dp]);
                        let m = self.b.ldmatrix_x4(b.smem_at(self.smem, off), true);
                        let r0 = self.b.mma_m16n8k16(
                            self.cfg.dtype_in,
                            &a,
                            m[0],
                            m[1],
                            &o[(2 * dp) * 4..(2 * dp) * 4 + 4],
                        );
                        o[(2 * dp) * 4..(2 * dp) * 4 + 4].copy_from_slice(&r0);
                        let r1 = self.b.mma_m16n8k16(
                            self.cfg.dtype_in,
                            &a,
                            m[2],
                            m[3],
                            &o[(2 * dp + 1) * 4..(2 * dp + 1) * 4 + 4],
                        );
                        o[(2 * dp + 1) * 4..(2 * dp + 1) * 4 + 4].copy_from_slice(&r1);
                    }
                }
            }
        }
        o
    }

    /// [`wgmma_ss`] on this kernel's builder.
    pub(crate) fn wgmma(
        &self,
        acc: &[FloatValue<'ctx>],
        da: IntValue<'ctx>,
        db: IntValue<'ctx>,
    ) -> Vec<FloatValue<'ctx>> {
        wgmma_ss(self.b, self.cfg.dtype_in, acc, da, db)
    }

    /// [`wgmma_rs`] on this kernel's builder.
    pub(crate) fn wgmma_rs(
        &self,
        acc: &[FloatValue<'ctx>],
        a: &[IntValue<'ctx>; 4],
        db: IntValue<'ctx>,
    ) -> Vec<FloatValue<'ctx>> {
        wgmma_rs(self.b, self.cfg.dtype_in, acc, a, db)
    }

    /// [`gmma_desc`] of byte offset `off` in this kernel's shared memory.
    pub(crate) fn gmma_desc(&self, off: IntValue<'ctx>, lbo: i64) -> IntValue<'ctx> {
        gmma_desc(self.b, self.smem, off, lbo)
    }
}

// The wgmma instructions as free functions of the builder: the forward ([`Attn`]) and the
// backward kernels (`attention_bwd::wg`) emit the same text.

/// wgmma m64nNk16 `half` -> f32, A and B from shared memory descriptors, accumulating into
/// `acc` (N/2 values per thread, in the mma.m16n8 C-fragment order per 8 columns).
pub(crate) fn wgmma_ss<'ctx>(
    b: &KernelBuilder<'_, 'ctx>,
    half: Half,
    acc: &[FloatValue<'ctx>],
    da: IntValue<'ctx>,
    db: IntValue<'ctx>,
) -> Vec<FloatValue<'ctx>> {
    let n = acc.len();
    let regs: Vec<String> = (0..n).map(|i| format!("${i}")).collect();
    let text = format!(
        "{{\n.reg .pred p;\nsetp.ne.b32 p, ${}, 0;\nwgmma.mma_async.sync.aligned.m64n{}k16.f32.{h}.{h} {{{}}}, ${}, ${}, p, 1, 1, 0, 0;\n}}",
        2 * n + 2,
        2 * n,
        regs.join(", "),
        2 * n,
        2 * n + 1,
        h = half.ptx()
    );
    let mut cons: Vec<String> = (0..n).map(|_| "=f".to_string()).collect();
    cons.extend((0..n).map(|i| i.to_string()));
    cons.extend(["l", "l", "r"].map(String::from));
    let mut args: Vec<BasicValueEnum> = acc.iter().map(|v| (*v).into()).collect();
    args.extend::<[BasicValueEnum; 3]>([da.into(), db.into(), b.i32(1).into()]);
    b.asm_f32s(&text, &cons.join(","), n, &args)
}

/// wgmma m64nNk16 with A (`half`, the warp's 16 rows in mma.m16n8k16 A-fragment order) from
/// registers and B from a transposed (MN-major) shared-memory descriptor.
pub(crate) fn wgmma_rs<'ctx>(
    b: &KernelBuilder<'_, 'ctx>,
    half: Half,
    acc: &[FloatValue<'ctx>],
    a: &[IntValue<'ctx>; 4],
    db: IntValue<'ctx>,
) -> Vec<FloatValue<'ctx>> {
    let n = acc.len();
    let regs: Vec<String> = (0..n).map(|i| format!("${i}")).collect();
    let text = format!(
        "{{\n.reg .pred p;\nsetp.ne.b32 p, ${}, 0;\nwgmma.mma_async.sync.aligned.m64n{}k16.f32.{h}.{h} {{{}}}, {{${}, ${}, ${}, ${}}}, ${}, p, 1, 1, 1;\n}}",
        2 * n + 5,
        2 * n,
        regs.join(", "),
        2 * n,
        2 * n + 1,
        2 * n + 2,
        2 * n + 3,
        2 * n + 4,
        h = half.ptx()
    );
    let mut cons: Vec<String> = (0..n).map(|_| "=f".to_string()).collect();
    cons.extend((0..n).map(|i| i.to_string()));
    cons.extend(["r", "r", "r", "r", "l", "r"].map(String::from));
    let mut args: Vec<BasicValueEnum> = acc.iter().map(|v| (*v).into()).collect();
    args.extend(a.iter().map(|v| BasicValueEnum::from(*v)));
    args.extend::<[BasicValueEnum; 2]>([db.into(), b.i32(1).into()]);
    b.asm_f32s(&text, &cons.join(","), n, &args)
}

/// Shared-memory matrix descriptor (sm_90) of byte offset `off` in `smem`: 128B swizzle, stride
/// 1024 B between 8-row groups. `lbo`: for K-major operands unused (16); for MN-major ones (V,
/// transposed) the byte stride between 64-element panels along N.
pub(crate) fn gmma_desc<'ctx>(
    b: &KernelBuilder<'_, 'ctx>,
    smem: PointerValue<'ctx>,
    off: IntValue<'ctx>,
    lbo: i64,
) -> IntValue<'ctx> {
    let base = b.ptr_to_i64(smem);
    let addr = b.add(base, b.zext64(off));
    let a = b.lshrc(addr, 4);
    let a = b.andc(a, 0x3FFF);
    let hi = ((lbo >> 4) << 16) | (64i64 << 32) | (1i64 << 62);
    b.orc(a, hi)
}
