//! The small NVPTX kernels around attention: the gate cumsum (a scan per (b, h)), RMSNorm over
//! the last axis, and casts (the threshold kernels are in [`super::threshold`]).
//!
//! Every kernel here is written for correctness and reasonable memory access, not peak speed:
//! together they move a few bytes per element while attention does O(T) work per element.
//! Parameter lists are documented on each `build_*` function; the launch geometry that goes
//! with each kernel lives in [`super::module`].

use super::builder::{KernelBuilder, ParamTy};
use inkwell::context::Context;
use inkwell::module::Module;
use inkwell::values::{FloatValue, FunctionValue, IntValue, PointerValue};
use inkwell::{FloatPredicate, IntPredicate};

use foxc_ir::{DType, GateKind, LOG_F_FLOOR};

pub use super::builder::PTX_KERNEL_CC;
/// Threads per block of the scan (one block per (b, h)).
pub const SCAN_THREADS: u32 = 1024;
/// Threads per block of the elementwise kernels (cast, slope cumsum).
pub const ELEM_THREADS: u32 = 256;
/// Threads per block of the row kernels (RMSNorm, threshold): 4 warps, one row per warp at a time.
pub const ROW_THREADS: u32 = 128;

type R<T> = Result<T, String>;
type Kb<'a, 'ctx> = KernelBuilder<'a, 'ctx>;

/// Lane and warp of the thread (`tid & 31`, `tid >> 5`).
pub(super) fn lane_warp<'ctx>(k: &Kb<'_, 'ctx>, tid: IntValue<'ctx>) -> (IntValue<'ctx>, IntValue<'ctx>) {
    (k.andc(tid, 31), k.lshrc(tid, 5))
}

/// `log f` of one gate input element, clamped below at `LOG_F_FLOOR` (SEMANTICS.md).
fn log_gate<'ctx>(k: &Kb<'_, 'ctx>, kind: GateKind, x: FloatValue<'ctx>) -> FloatValue<'ctx> {
    let lf = match kind {
        GateKind::LogGate => x,
        GateKind::Logits => {
            // logsigmoid(z) = min(z, 0) - log1p(exp(-|z|)), with log1p(u) computed as
            // u * log(w) / (w - 1), w = 1 + u (exact where w rounds to 1), so a gate logit
            // of +20 still yields its -2e-9 instead of 0.
            let a = k.fabs(x);
            let na = k.fmul(a, k.f32(-std::f64::consts::LOG2_E));
            let u = k.ex2(na);
            let w = k.fadd(u, k.f32(1.0));
            let lw = k.fmul(k.lg2(w), k.f32(std::f64::consts::LN_2));
            let wm1 = k.fsub(w, k.f32(1.0));
            let ratio = k.fdiv(k.fmul(u, lw), wm1);
            let is_one = k.fcmp(FloatPredicate::OEQ, w, k.f32(1.0));
            let l1p = k.select_f(is_one, u, ratio);
            let mz = k.fmin(x, k.f32(0.0));
            k.fsub(mz, l1p)
        }
        GateKind::Slope => {
            k.fail("slope gates are not scanned");
            x
        }
    };
    k.fmax(lf, k.f32(LOG_F_FLOOR))
}

/// A sum carried as an unevaluated f32 pair `h + l` (`|l| <= ulp(h) / 2`): about 48 bits, so a
/// scan of thousands of `log f` stays within rounding of the exact cumsum however large `|c|`
/// grows (a plain f32 scan drifted by ~40 ulp(|c|) at T = 32768 with bursty gates, 0.08 absolute,
/// in an emulation of this kernel; the pair gave round_f32(c) at every position; SEMANTICS.md,
/// gate_cumsum). f32 adds only: LLVM and ptxas keep them as written (no fast-math, no mul to fuse).
type Pair<'ctx> = (FloatValue<'ctx>, FloatValue<'ctx>);

/// `a + b` as `(s, e)` with `s = fl(a + b)` and `e` its exact rounding error (TwoSum).
fn two_sum<'ctx>(k: &Kb<'_, 'ctx>, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> Pair<'ctx> {
    let s = k.fadd(a, b);
    let bb = k.fsub(s, a);
    let e = k.fadd(k.fsub(a, k.fsub(s, bb)), k.fsub(b, bb));
    (s, e)
}

/// `(s, e)` renormalized (`|s| >= |e|`, FastTwoSum).
fn renorm<'ctx>(k: &Kb<'_, 'ctx>, s: FloatValue<'ctx>, e: FloatValue<'ctx>) -> Pair<'ctx> {
    let h = k.fadd(s, e);
    (h, k.fsub(e, k.fsub(h, s)))
}

/// `a + b` of two pairs.
fn pair_add<'ctx>(k: &Kb<'_, 'ctx>, a: Pair<'ctx>, b: Pair<'ctx>) -> Pair<'ctx> {
    let (s, e) = two_sum(k, a.0, b.0);
    renorm(k, s, k.fadd(e, k.fadd(a.1, b.1)))
}

/// `a + x` of a pair and an f32.
fn pair_add1<'ctx>(k: &Kb<'_, 'ctx>, a: Pair<'ctx>, x: FloatValue<'ctx>) -> Pair<'ctx> {
    let (s, e) = two_sum(k, a.0, x);
    renorm(k, s, k.fadd(e, a.1))
}

/// Inclusive scan of pairs over the warp with `shfl.up` (lane l gets the sum of lanes 0..=l).
fn warp_scan_pair<'ctx>(k: &Kb<'_, 'ctx>, lane: IntValue<'ctx>, mut x: Pair<'ctx>) -> Pair<'ctx> {
    for d in [1i64, 2, 4, 8, 16] {
        let y = (k.shfl_up(x.0, d), k.shfl_up(x.1, d));
        let ok = k.icmpc(IntPredicate::SGE, lane, d);
        let s = pair_add(k, x, y);
        x = (k.select_f(ok, s.0, x.0), k.select_f(ok, s.1, x.1));
    }
    x
}

/// `gate_cumsum` for `Logits` and `LogGate`: params `(gate: [BH, T], c: f32 [BH, T], T: i32)`.
/// Grid `(BH)` (the (b, h) index is `ctaid.x`), block [`SCAN_THREADS`]. Each thread scans a
/// contiguous chunk; a block-wide scan of the chunk totals (warp shuffles, then one warp over the
/// 32 warp totals) gives each chunk's offset, and a second pass writes the running sums. Every
/// sum is a [`Pair`]; `c` is its high part, the exact cumsum rounded to f32.
pub fn build_gate_scan<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    name: &str,
    kind: GateKind,
    in_dt: DType,
) -> R<FunctionValue<'ctx>> {
    let k =
        Kb::kernel(ctx, module, name, &[("gate", ParamTy::Ptr), ("c", ParamTy::Ptr), ("T", ParamTy::I32)])?;
    let gate = k.param_ptr(0);
    let out = k.param_ptr(1);
    let t_len = k.param_int(2);
    let total = [k.declare_var(k.f32(0.0).into()), k.declare_var(k.f32(0.0).into())];
    let run = [k.declare_var(k.f32(0.0).into()), k.declare_var(k.f32(0.0).into())];
    let tid = k.sreg("tid.x");
    let bh = k.sreg("ctaid.x");
    let (lane, warp) = lane_warp(&k, tid);
    let nthreads = SCAN_THREADS as i64;
    // chunk = ceil(T / threads)
    let chunk = k.sdivc(k.addc(t_len, nthreads - 1), nthreads);
    let lo = k.smin(k.mul(tid, chunk), t_len);
    let hi = k.smin(k.add(lo, chunk), t_len);
    let base = k.mul(k.sext64(bh), k.sext64(t_len));
    let lo64 = k.sext64(lo);
    let hi64 = k.sext64(hi);
    k.for_range(lo64, hi64, k.i64(1), |k, i| {
        let idx = k.add(base, i);
        let x = k.load_f(in_dt, gate, idx);
        let lf = log_gate(k, kind, x);
        let t = pair_add1(k, (k.use_f(total[0]), k.use_f(total[1])), lf);
        k.def_var(total[0], t.0);
        k.def_var(total[1], t.1);
    });
    // Inclusive warp scan of the chunk totals.
    let mine = (k.use_f(total[0]), k.use_f(total[1]));
    let x = warp_scan_pair(&k, lane, mine);
    let nwarps = SCAN_THREADS / 32;
    let sh = [
        k.shared_f32(&format!("{name}_warp_totals"), nwarps),
        k.shared_f32(&format!("{name}_warp_totals_lo"), nwarps),
    ];
    let is_last = k.icmpc(IntPredicate::EQ, lane, 31);
    k.if_then(is_last, |k| {
        k.store(k.shared_at(sh[0], warp), x.0);
        k.store(k.shared_at(sh[1], warp), x.1);
    });
    k.barrier();
    let is_w0 = k.icmpc(IntPredicate::EQ, warp, 0);
    k.if_then(is_w0, |k| {
        let p = (k.shared_at(sh[0], lane), k.shared_at(sh[1], lane));
        let y = warp_scan_pair(k, lane, (k.load_f32(p.0), k.load_f32(p.1)));
        k.store(p.0, y.0);
        k.store(p.1, y.1);
    });
    k.barrier();
    // Offset of this chunk: the inclusive total of earlier warps plus the exclusive warp prefix
    // (the previous lane's inclusive sum: no subtraction, which would cancel digits).
    let zero = k.f32(0.0);
    let wprev = k.sub(warp, k.i32(1));
    let has_prev = k.icmpc(IntPredicate::SGT, warp, 0);
    let wprev_c = k.select_i(has_prev, wprev, k.i32(0));
    let prev_tot = (k.load_f32(k.shared_at(sh[0], wprev_c)), k.load_f32(k.shared_at(sh[1], wprev_c)));
    let warp_off = (k.select_f(has_prev, prev_tot.0, zero), k.select_f(has_prev, prev_tot.1, zero));
    let lane_prev = (k.shfl_up(x.0, 1), k.shfl_up(x.1, 1));
    let not_first = k.icmpc(IntPredicate::SGT, lane, 0);
    let excl = (k.select_f(not_first, lane_prev.0, zero), k.select_f(not_first, lane_prev.1, zero));
    let start = pair_add(&k, warp_off, excl);
    k.def_var(run[0], start.0);
    k.def_var(run[1], start.1);
    k.for_range(lo64, hi64, k.i64(1), |k, i| {
        let idx = k.add(base, i);
        let xv = k.load_f(in_dt, gate, idx);
        let lf = log_gate(k, kind, xv);
        let r = pair_add1(k, (k.use_f(run[0]), k.use_f(run[1])), lf);
        k.def_var(run[0], r.0);
        k.def_var(run[1], r.1);
        k.store_f(DType::F32, out, idx, r.0);
    });
    k.finish()
}

/// `gate_cumsum` for `Slope`: params `(m: [H], c: f32 [BH, T], T: i32, H: i32)`.
/// Grid `(ceil(T / ELEM_THREADS), BH)`: `c[t] = (t + 1) * max(-m[h], LOG_F_FLOOR)`.
pub fn build_gate_slope<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    name: &str,
    in_dt: DType,
) -> R<FunctionValue<'ctx>> {
    let params = [("m", ParamTy::Ptr), ("c", ParamTy::Ptr), ("T", ParamTy::I32), ("H", ParamTy::I32)];
    let k = Kb::kernel(ctx, module, name, &params)?;
    let (m, out, t_len, h_len) = (k.param_ptr(0), k.param_ptr(1), k.param_int(2), k.param_int(3));
    let bx = k.sreg("ctaid.x");
    let tid = k.sreg("tid.x");
    let bh = k.sreg("ctaid.y");
    let t = k.add(k.mulc(bx, ELEM_THREADS as i64), tid);
    let inb = k.icmp(IntPredicate::SLT, t, t_len);
    k.if_then(inb, |k| {
        let h = k.srem(bh, h_len);
        let mv = k.load_f(in_dt, m, k.sext64(h));
        let lf = k.fmax(k.fneg(mv), k.f32(LOG_F_FLOOR));
        let tp1 = k.sitofp(k.addc(t, 1));
        let idx = k.add(k.mul(k.sext64(bh), k.sext64(t_len)), k.sext64(t));
        k.store_f(DType::F32, out, idx, k.fmul(tp1, lf));
    });
    k.finish()
}

/// Loads one row of `d` elements spread over the warp: lane l holds elements l, l + 32, ...
/// Elements past `d` read as 0 (the index is clamped so no load goes out of bounds).
pub(super) fn load_row<'ctx>(
    k: &Kb<'_, 'ctx>,
    dt: DType,
    p: PointerValue<'ctx>,
    row_base: IntValue<'ctx>,
    lane: IntValue<'ctx>,
    d: u32,
) -> Vec<FloatValue<'ctx>> {
    let mut out = Vec::new();
    for r in 0..d.div_ceil(32) {
        let e = k.addc(lane, 32 * r as i64);
        if (r + 1) * 32 <= d {
            out.push(k.load_f(dt, p, k.add(row_base, k.sext64(e))));
        } else {
            let inb = k.icmpc(IntPredicate::SLT, e, d as i64);
            let ec = k.smin(e, k.i32(d as i64 - 1));
            let v = k.load_f(dt, p, k.add(row_base, k.sext64(ec)));
            out.push(k.select_f(inb, v, k.f32(0.0)));
        }
    }
    out
}

/// `rmsnorm` over the last axis: params `(x: [rows, D], w: [D], y: [rows, D], rows: i32)`.
/// Grid `(ceil(rows / 4))`, block [`ROW_THREADS`]: one warp per row.
pub fn build_rmsnorm<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    name: &str,
    d: u32,
    eps: f64,
    (x_dt, w_dt, y_dt): (DType, DType, DType),
) -> R<FunctionValue<'ctx>> {
    let params = [("x", ParamTy::Ptr), ("w", ParamTy::Ptr), ("y", ParamTy::Ptr), ("rows", ParamTy::I32)];
    let k = Kb::kernel(ctx, module, name, &params)?;
    let (x, w, y, rows) = (k.param_ptr(0), k.param_ptr(1), k.param_ptr(2), k.param_int(3));
    let tid = k.sreg("tid.x");
    let (lane, warp) = lane_warp(&k, tid);
    let bx = k.sreg("ctaid.x");
    let row = k.add(k.mulc(bx, (ROW_THREADS / 32) as i64), warp);
    let inb = k.icmp(IntPredicate::SLT, row, rows);
    k.if_then(inb, |k| {
        let base = k.mul(k.sext64(row), k.i64(d as i64));
        let vals = load_row(k, x_dt, x, base, lane, d);
        let mut ss = k.f32(0.0);
        for v in &vals {
            ss = k.fma(*v, *v, ss);
        }
        let ss = k.warp_sum(ss);
        let mean = k.fdiv(ss, k.f32(d as f64));
        let r = k.fdiv(k.f32(1.0), k.sqrt(k.fadd(mean, k.f32(eps))));
        for (j, v) in vals.iter().enumerate() {
            let e = k.addc(lane, 32 * j as i64);
            let store = |k: &Kb<'_, 'ctx>| {
                let wv = k.load_f(w_dt, w, k.sext64(e));
                let o = k.fmul(k.fmul(*v, r), wv);
                k.store_f(y_dt, y, k.add(base, k.sext64(e)), o);
            };
            if (j as u32 + 1) * 32 <= d {
                store(k);
            } else {
                let ok = k.icmpc(IntPredicate::SLT, e, d as i64);
                k.if_then(ok, store);
            }
        }
    });
    k.finish()
}

/// `cast` (and `x * s` for a compile-time scalar `s`): params `(x, y, n: i64)`;
/// grid `(ceil(n / ELEM_THREADS))`.
pub fn build_cast<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    name: &str,
    from: DType,
    to: DType,
    mul: Option<f64>,
) -> R<FunctionValue<'ctx>> {
    for dt in [from, to] {
        if !dt.is_float() {
            return Err(format!("GPU cast supports float dtypes only, got {dt}"));
        }
    }
    let k = Kb::kernel(ctx, module, name, &[("x", ParamTy::Ptr), ("y", ParamTy::Ptr), ("n", ParamTy::I64)])?;
    let (x, y, n) = (k.param_ptr(0), k.param_ptr(1), k.param_int(2));
    let bx = k.sext64(k.sreg("ctaid.x"));
    let tid = k.sext64(k.sreg("tid.x"));
    let i = k.add(k.mulc(bx, ELEM_THREADS as i64), tid);
    let inb = k.icmp(IntPredicate::SLT, i, n);
    k.if_then(inb, |k| {
        let mut v = k.load_f(from, x, i);
        if let Some(m) = mul {
            v = k.fmul(v, k.f32(m));
        }
        k.store_f(to, y, i, v);
    });
    k.finish()
}
