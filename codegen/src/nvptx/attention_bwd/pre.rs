//! The backward's first launch: `D_i = sum_d dout_id out_id` per row (f32), one warp per row,
//! [`super::PRE_ROWS`] rows per block; the lanes stride over D and the warp sums in a fixed
//! shuffle order (deterministic).

use super::PRE_ROWS;
use crate::nvptx::builder::{Half, KernelBuilder, ParamTy};
use foxc_ir::DType;
use inkwell::context::Context;
use inkwell::module::Module;
use inkwell::values::FunctionValue;
use inkwell::IntPredicate;

/// Builds kernel `name`: parameters `out` (f32), `dout` (`half`: the copy the mma kernels
/// read; the module casts other dtypes first), `dd` (f32), `rows` (i32, the rows of all heads).
pub(super) fn build<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    name: &str,
    head_dim: u32,
    half: Half,
) -> Result<FunctionValue<'ctx>, String> {
    let params =
        [("out", ParamTy::Ptr), ("dout", ParamTy::Ptr), ("dd", ParamTy::Ptr), ("rows", ParamTy::I32)];
    let b = KernelBuilder::kernel(ctx, module, name, &params)?;
    let (out_p, dout_p, dd_p, rows) = (b.param_ptr(0), b.param_ptr(1), b.param_ptr(2), b.param_int(3));
    let tid = b.sreg("tid.x");
    let lane = b.andc(tid, 31);
    let row = b.add(b.mulc(b.sreg("ctaid.x"), PRE_ROWS as i64), b.lshrc(tid, 5));
    let inb = b.icmp(IntPredicate::SLT, row, rows);
    b.if_then(inb, |b| {
        let d = head_dim as i64;
        let base = b.mulc(b.sext64(row), d);
        let mut acc = b.f32(0.0);
        for k in 0..(d as u32).div_ceil(32) as i64 {
            let col = b.addc(lane, 32 * k);
            let x = if (k + 1) * 32 <= d {
                let idx = b.add(base, b.sext64(col));
                b.fmul(b.load_f(DType::F32, out_p, idx), b.load_f(half.dtype(), dout_p, idx))
            } else {
                let ok = b.icmpc(IntPredicate::SLT, col, d);
                let idx = b.add(base, b.sext64(b.select_i(ok, col, b.i32(0))));
                let v = b.fmul(b.load_f(DType::F32, out_p, idx), b.load_f(half.dtype(), dout_p, idx));
                b.select_f(ok, v, b.f32(0.0))
            };
            acc = b.fadd(acc, x);
        }
        let s = b.warp_sum(acc);
        b.if_then(b.icmpc(IntPredicate::EQ, lane, 0), |b| {
            b.store_f(DType::F32, dd_p, b.sext64(row), s);
        });
    });
    b.finish()
}
