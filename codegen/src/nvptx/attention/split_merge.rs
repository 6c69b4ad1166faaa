//! The second launch of a split-keys attention ([`super::AttnKernelConfig::split_tiles`]): each
//! row's `Z` partials, each normalized by its own sum with its log-sum-exp `lse_z`, merged into
//! the row's output `sum_z exp(lse_z - lse) o_z` and `lse = ln sum_z exp(lse_z)`. A row whose
//! every partial is empty (`lse_z = -inf`: no key kept, or none visible) gets 0 and `-inf`,
//! as the one-launch kernel gives it.
//!
//! Parameters: `part_o` (f32 `[Z, R, D]`), `part_lse` (f32 `[Z, R]`), `out` (`[R, D]`, f32 or
//! bf16), `lse` (f32 `[R]`), `R` (i32, rows = batch x heads x queries), `Tk` (i32, the keys: `Z`
//! is [`super::split_planes`] of them). Grid `(ceil(R / 4))`, block [`MERGE_THREADS`]: a warp
//! per row, each lane `D / 32` columns.

use super::LOG2E;
use crate::nvptx::builder::{KernelBuilder, ParamTy};
use foxc_ir::DType;
use inkwell::context::Context;
use inkwell::module::Module;
use inkwell::values::{BasicValueEnum, FunctionValue};
use inkwell::{FloatPredicate, IntPredicate};

/// Threads of a merge block (four rows).
pub const MERGE_THREADS: u32 = 128;

/// Adds the merge kernel `name` for head dim `d` (a multiple of 32), `keys` keys to a partial.
pub fn build_split_merge<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    name: &str,
    d: u32,
    keys: u32,
    out: DType,
) -> Result<FunctionValue<'ctx>, String> {
    if d == 0 || !d.is_multiple_of(32) || keys == 0 {
        return Err(format!(
            "split merge: head dim {d} must be a multiple of 32, keys per partial {keys} positive"
        ));
    }
    if let Some(f) = module.get_function(name) {
        return Ok(f);
    }
    let params = [
        ("part_o", ParamTy::Ptr),
        ("part_lse", ParamTy::Ptr),
        ("out", ParamTy::Ptr),
        ("lse", ParamTy::Ptr),
        ("rows", ParamTy::I32),
        ("Tk", ParamTy::I32),
    ];
    let b = KernelBuilder::kernel(ctx, module, name, &params)?;
    let (part_o, part_lse, out_p, lse_p) = (b.param_ptr(0), b.param_ptr(1), b.param_ptr(2), b.param_ptr(3));
    let (rows, tk) = (b.param_int(4), b.param_int(5));
    let planes = b.named(b.sdivc(b.addc(tk, keys as i64 - 1), keys as i64), "planes");
    let tid = b.sreg("tid.x");
    let lane = b.named(b.andc(tid, 31), "lane");
    let row = b.named(b.add(b.mulc(b.sreg("ctaid.x"), (MERGE_THREADS / 32) as i64), b.lshrc(tid, 5)), "row");
    let cols = (d / 32) as usize;
    let inb = b.icmp(IntPredicate::SLT, row, rows);
    b.if_then(inb, |b| {
        let rows64 = b.sext64(rows);
        let lse_at = |z| b.load_f(DType::F32, part_lse, b.add(b.mul(b.sext64(z), rows64), b.sext64(row)));
        // The largest partial LSE (every lane reads the same Z values: one broadcast each).
        let ninf = b.f32(f64::NEG_INFINITY);
        let init: Vec<(&str, BasicValueEnum)> = vec![("z", b.i32(0).into()), ("m", ninf.into())];
        let m = b.while_loop(
            ("max", "max_body", "max_done"),
            &init,
            |b, v| b.icmp(IntPredicate::SLT, v[0].into_int_value(), planes),
            |b, v| {
                let z = v[0].into_int_value();
                vec![b.addc(z, 1).into(), b.fmax(v[1].into_float_value(), lse_at(z)).into()]
            },
        )[1]
        .into_float_value();
        // Empty rows keep m = -inf: weigh against 0 there (every weight is then 0).
        let finite = b.fcmp(FloatPredicate::OGT, m, ninf);
        let m0 = b.select_f(finite, m, b.f32(0.0));
        let zero = b.f32(0.0);
        let mut init: Vec<(&str, BasicValueEnum)> = vec![("z", b.i32(0).into()), ("w", zero.into())];
        init.extend((0..cols).map(|_| ("acc", zero.into())));
        let sums = b.while_loop(
            ("merge", "merge_body", "merge_done"),
            &init,
            |b, v| b.icmp(IntPredicate::SLT, v[0].into_int_value(), planes),
            |b, v| {
                let z = v[0].into_int_value();
                let w = b.ex2(b.fmul(b.fsub(lse_at(z), m0), b.f32(LOG2E)));
                let base = b.mulc(b.add(b.mul(b.sext64(z), rows64), b.sext64(row)), d as i64);
                let mut next: Vec<BasicValueEnum> =
                    vec![b.addc(z, 1).into(), b.fadd(v[1].into_float_value(), w).into()];
                for c in 0..cols {
                    let col = b.sext64(b.addc(lane, 32 * c as i64));
                    let o = b.load_f(DType::F32, part_o, b.add(base, col));
                    next.push(b.fma(w, o, v[2 + c].into_float_value()).into());
                }
                next
            },
        );
        let wsum = sums[1].into_float_value();
        let pos = b.fcmp(FloatPredicate::OGT, wsum, zero);
        let inv = b.select_f(pos, b.fdiv(b.f32(1.0), wsum), zero);
        let out_base = b.mulc(b.sext64(row), d as i64);
        for c in 0..cols {
            let col = b.sext64(b.addc(lane, 32 * c as i64));
            b.store_f(out, out_p, b.add(out_base, col), b.fmul(sums[2 + c].into_float_value(), inv));
        }
        let first = b.icmpc(IntPredicate::EQ, lane, 0);
        b.if_then(first, |b| {
            let lse = b.fadd(m0, b.fdiv(b.lg2(wsum), b.f32(LOG2E)));
            b.store_f(DType::F32, lse_p, b.sext64(row), b.select_f(pos, lse, ninf));
        });
    });
    b.finish()
}
