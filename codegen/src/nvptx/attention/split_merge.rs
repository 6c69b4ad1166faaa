//! The second launch of a split-keys attention ([`super::AttnKernelConfig::split_tiles`]): each
//! row's `Z` partials, each normalized by its own sum with its log-sum-exp `lse_z`, merged into
//! the row's output `sum_z exp(lse_z - lse) o_z` and `lse = ln sum_z exp(lse_z)`. A row whose
//! every partial is empty (`lse_z = -inf`: no key kept, or none visible) gets 0 and `-inf`,
//! as the one-launch kernel gives it.
//!
//! Parameters: `part_o` (f32 `[Z, R, D]`), `part_lse` (f32 `[Z, R]`), `out` (`[R, D]`, f32 or
//! 16-bit), `lse` (f32 `[R]`), `R` (i32, rows = batch x heads x queries), `Tk` (i32, the keys: `Z`
//! is [`super::split_planes`] of them). Grid `(R)`, block [`MERGE_THREADS`]: one row per block, so
//! that a decode step's few rows (16 at one sequence of 16 heads) still spread their partials over
//! many warps. The block's threads read the `Z` partial LSEs together (their maximum, a block
//! reduction); warp `w` then sums planes `w, w + W, ...`, [`MERGE_UNROLL`] planes per step with
//! their loads issued together (a warp walking its planes one dependent load at a time took 21 us
//! for 64 planes, BENCHMARKS.md "Decode"), lane `l` owning columns `l + 32 c`; the warps' sums meet
//! in shared memory and thread `t` writes columns `t, t + 256, ...`.
//!
//! An attention with an epilogue (an output gate, docs/SEMANTICS.md "attention") has it applied
//! here, where the output is final: the partials are of the attention alone. The kernel then
//! takes `T` (i32, queries per head, to split a row into its head and query) after `Tk`, and the
//! epilogue's arguments (its captured tensors and their sizes, [`RegionMod`]) after that.

use super::region::RegionMod;
use super::score::{ScoreMod, ScorePos};
use super::LOG2E;
use crate::nvptx::block_reduce::block_reduce;
use crate::nvptx::builder::{KernelBuilder, ParamTy};
use foxc_ir::DType;
use inkwell::context::Context;
use inkwell::module::Module;
use inkwell::values::{BasicValueEnum, FloatValue, FunctionValue};
use inkwell::{FloatPredicate, IntPredicate};

/// Threads of a merge block (one row).
pub const MERGE_THREADS: u32 = 256;

/// Warps of a merge block.
const MERGE_WARPS: u32 = MERGE_THREADS / 32;

/// Planes a warp loads per step of its walk.
const MERGE_UNROLL: u32 = 4;

/// The merge kernel's own parameters; an epilogue's ([`merge_epilogue_first_param`]) follow.
const OWN_PARAMS: [(&str, ParamTy); 6] = [
    ("part_o", ParamTy::Ptr),
    ("part_lse", ParamTy::Ptr),
    ("out", ParamTy::Ptr),
    ("lse", ParamTy::Ptr),
    ("rows", ParamTy::I32),
    ("Tk", ParamTy::I32),
];

/// The kernel parameter of an epilogue's first argument: after the kernel's own and `T`.
pub(crate) fn merge_epilogue_first_param() -> u32 {
    OWN_PARAMS.len() as u32 + 1
}

/// Adds the merge kernel `name` for head dim `d` (a multiple of 32), `keys` keys to a partial,
/// writing `epilogue(o)` where the attention has one (its arguments from
/// [`merge_epilogue_first_param`] on).
pub(crate) fn build_split_merge<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    name: &str,
    (d, keys): (u32, u32),
    out: DType,
    epilogue: Option<&RegionMod>,
) -> Result<FunctionValue<'ctx>, String> {
    if d == 0 || !d.is_multiple_of(32) || keys == 0 {
        return Err(format!(
            "split merge: head dim {d} must be a multiple of 32, keys per partial {keys} positive"
        ));
    }
    if let Some(f) = module.get_function(name) {
        return Ok(f);
    }
    let mut params: Vec<(String, ParamTy)> = OWN_PARAMS.iter().map(|(n, t)| (n.to_string(), *t)).collect();
    if let Some(e) = epilogue {
        params.push(("T".into(), ParamTy::I32));
        params.extend(e.params());
    }
    let params: Vec<(&str, ParamTy)> = params.iter().map(|(n, t)| (n.as_str(), *t)).collect();
    let b = KernelBuilder::kernel(ctx, module, name, &params)?;
    b.launch_bounds(MERGE_THREADS, 1);
    let (part_o, part_lse, out_p, lse_p) = (b.param_ptr(0), b.param_ptr(1), b.param_ptr(2), b.param_ptr(3));
    let (rows, tk) = (b.param_int(4), b.param_int(5));
    let planes = b.named(b.sdivc(b.addc(tk, keys as i64 - 1), keys as i64), "planes");
    let tid = b.sreg("tid.x");
    let lane = b.named(b.andc(tid, 31), "lane");
    let warp = b.named(b.lshrc(tid, 5), "warp");
    let row = b.named(b.sreg("ctaid.x"), "row");
    let rows64 = b.sext64(rows);
    let plane_row = |z| b.add(b.mul(b.sext64(z), rows64), b.sext64(row));
    let lse_at = |z| b.load_f(DType::F32, part_lse, plane_row(z));
    let ninf = b.f32(f64::NEG_INFINITY);
    let zero = b.f32(0.0);

    // The largest partial LSE: thread t reads planes t, t + MERGE_THREADS, ...
    let init: Vec<(&str, BasicValueEnum)> = vec![("z", tid.into()), ("m", ninf.into())];
    let mine = b.while_loop(
        ("max", "max_body", "max_done"),
        &init,
        |b, v| b.icmp(IntPredicate::SLT, v[0].into_int_value(), planes),
        |b, v| {
            let z = v[0].into_int_value();
            vec![b.addc(z, MERGE_THREADS as i64).into(), b.fmax(v[1].into_float_value(), lse_at(z)).into()]
        },
    )[1]
    .into_float_value();
    let m = block_reduce(&b, &format!("{name}_max"), &[mine], (lane, warp), MERGE_WARPS, false)[0];
    // Empty rows keep m = -inf: weigh against 0 there (every weight is then 0).
    let m0 = b.select_f(b.fcmp(FloatPredicate::OGT, m, ninf), m, zero);

    // Warp w's planes, MERGE_UNROLL per step; a plane past the last reads the step's first
    // (always in range) with weight 0.
    let cols = (d / 32) as usize;
    let stride = (MERGE_WARPS * MERGE_UNROLL) as i64;
    let mut init: Vec<(&str, BasicValueEnum)> = vec![("z", warp.into()), ("w", zero.into())];
    init.extend((0..cols).map(|_| ("acc", zero.into())));
    let sums = b.while_loop(
        ("merge", "merge_body", "merge_done"),
        &init,
        |b, v| b.icmp(IntPredicate::SLT, v[0].into_int_value(), planes),
        |b, v| {
            let z0 = v[0].into_int_value();
            let steps: Vec<(FloatValue, Vec<FloatValue>)> = (0..MERGE_UNROLL)
                .map(|u| {
                    let z = b.addc(z0, (u * MERGE_WARPS) as i64);
                    let live = b.icmp(IntPredicate::SLT, z, planes);
                    let z = b.select_i(live, z, z0);
                    let w = b.ex2(b.fmul(b.fsub(lse_at(z), m0), b.f32(LOG2E)));
                    let w = b.select_f(live, w, zero);
                    let base = b.mulc(plane_row(z), d as i64);
                    let o = (0..cols)
                        .map(|c| {
                            b.load_f(DType::F32, part_o, b.add(base, b.sext64(b.addc(lane, 32 * c as i64))))
                        })
                        .collect();
                    (w, o)
                })
                .collect();
            let mut wsum = v[1].into_float_value();
            let mut acc: Vec<FloatValue> = (0..cols).map(|c| v[2 + c].into_float_value()).collect();
            for (w, o) in steps {
                wsum = b.fadd(wsum, w);
                for c in 0..cols {
                    acc[c] = b.fma(w, o[c], acc[c]);
                }
            }
            let mut next: Vec<BasicValueEnum> = vec![b.addc(z0, stride).into(), wsum.into()];
            next.extend(acc.into_iter().map(BasicValueEnum::from));
            next
        },
    );

    // The warps' sums meet in shared memory: `[warp][d]` column sums, then `[warp]` weights.
    let sh = b.shared_f32(&format!("{name}_sums"), MERGE_WARPS * (d + 1));
    let wd = b.mulc(warp, d as i64);
    for c in 0..cols {
        let at = b.add(wd, b.addc(lane, 32 * c as i64));
        b.store(b.shared_at(sh, at), sums[2 + c].into_float_value());
    }
    b.if_then(b.icmpc(IntPredicate::EQ, lane, 0), |b| {
        b.store(b.shared_at(sh, b.addc(warp, (MERGE_WARPS * d) as i64)), sums[1].into_float_value());
    });
    b.barrier();
    let from = |at: u32| b.load_f32(b.shared_at(sh, b.i32(at as i64)));
    let wsum = (1..MERGE_WARPS).fold(from(MERGE_WARPS * d), |s, w| b.fadd(s, from(MERGE_WARPS * d + w)));
    let pos = b.fcmp(FloatPredicate::OGT, wsum, zero);
    let inv = b.select_f(pos, b.fdiv(b.f32(1.0), wsum), zero);
    let out_base = b.mulc(b.sext64(row), d as i64);
    // The epilogue with the row's head and query: row = bh T + i.
    let epilogue = epilogue.map(|e| {
        let t = b.param_int(OWN_PARAMS.len() as u32);
        (e, b.named(b.udiv(row, t), "bh"), b.named(b.urem(row, t), "i"))
    });
    b.for_range(tid, b.i32(d as i64), b.i32(MERGE_THREADS as i64), |b, col| {
        let at = |w: u32| b.load_f32(b.shared_at(sh, b.addc(col, (w * d) as i64)));
        let total = (1..MERGE_WARPS).fold(at(0), |s, w| b.fadd(s, at(w)));
        let o = b.fmul(total, inv);
        let o = match epilogue {
            Some((e, bh, i)) => e.emit(b, o, ScorePos { i, j: col, bh }),
            None => o,
        };
        b.store_f(out, out_p, b.add(out_base, b.sext64(col)), o);
    });
    b.if_then(b.icmpc(IntPredicate::EQ, tid, 0), |b| {
        let lse = b.fadd(m0, b.fdiv(b.lg2(wsum), b.f32(LOG2E)));
        b.store_f(DType::F32, lse_p, b.sext64(row), b.select_f(pos, lse, ninf));
    });
    b.finish()
}
