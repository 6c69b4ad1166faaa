//! The small NVPTX kernels around attention: the gate cumsum (a scan per (b, h)), RMSNorm over
//! the last axis, the threshold (max-norm reduction and per-tile delta) and casts.
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

use foxc_ir::{DType, GateKind, PruneRule, LOG_F_FLOOR};

pub use super::builder::PTX_KERNEL_CC;
/// Threads per block of the scan (one block per (b, h)).
pub const SCAN_THREADS: u32 = 1024;
/// Threads per block of the elementwise kernels (cast, slope cumsum).
pub const ELEM_THREADS: u32 = 256;
/// Threads per block of the row kernels (RMSNorm, threshold): 4 warps, one row per warp at a time.
pub const ROW_THREADS: u32 = 128;
/// Rows per block of the max-norm reduction (8 per warp).
pub const NORM_ROWS_PER_BLOCK: u32 = 32;

type R<T> = Result<T, String>;
type Kb<'a, 'ctx> = KernelBuilder<'a, 'ctx>;

/// Lane and warp of the thread (`tid & 31`, `tid >> 5`).
fn lane_warp<'ctx>(k: &Kb<'_, 'ctx>, tid: IntValue<'ctx>) -> (IntValue<'ctx>, IntValue<'ctx>) {
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

/// Inclusive scan over the warp with `shfl.up` (lane l gets the sum of lanes 0..=l).
fn warp_scan<'ctx>(k: &Kb<'_, 'ctx>, lane: IntValue<'ctx>, mut x: FloatValue<'ctx>) -> FloatValue<'ctx> {
    for d in [1i64, 2, 4, 8, 16] {
        let y = k.shfl_up(x, d);
        let ok = k.icmpc(IntPredicate::SGE, lane, d);
        let s = k.fadd(x, y);
        x = k.select_f(ok, s, x);
    }
    x
}

/// `gate_cumsum` for `Logits` and `LogGate`: params `(gate: [BH, T], c: f32 [BH, T], T: i32)`.
/// Grid `(BH)` (the (b, h) index is `ctaid.x`), block [`SCAN_THREADS`]. Each thread scans a
/// contiguous chunk; a block-wide scan of the chunk totals (warp shuffles, then one warp over the
/// 32 warp totals) gives each chunk's offset, and a second pass writes the running sums.
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
    let total = k.declare_var(k.f32(0.0).into());
    let run = k.declare_var(k.f32(0.0).into());
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
        let t = k.use_f(total);
        k.def_var(total, k.fadd(t, lf));
    });
    // Inclusive warp scan of the chunk totals.
    let mine = k.use_f(total);
    let x = warp_scan(&k, lane, mine);
    let nwarps = SCAN_THREADS / 32;
    let sh = k.shared_f32(&format!("{name}_warp_totals"), nwarps);
    let is_last = k.icmpc(IntPredicate::EQ, lane, 31);
    k.if_then(is_last, |k| k.store(k.shared_at(sh, warp), x));
    k.barrier();
    let is_w0 = k.icmpc(IntPredicate::EQ, warp, 0);
    k.if_then(is_w0, |k| {
        let p = k.shared_at(sh, lane);
        let y = warp_scan(k, lane, k.load_f32(p));
        k.store(p, y);
    });
    k.barrier();
    // Offset of this chunk: the inclusive total of earlier warps plus the exclusive warp prefix.
    let wprev = k.sub(warp, k.i32(1));
    let wprev_c = k.select_i(k.icmpc(IntPredicate::SGT, warp, 0), wprev, k.i32(0));
    let prev_tot = k.load_f32(k.shared_at(sh, wprev_c));
    let warp_off = k.select_f(k.icmpc(IntPredicate::SGT, warp, 0), prev_tot, k.f32(0.0));
    let excl = k.fsub(x, mine);
    k.def_var(run, k.fadd(warp_off, excl));
    k.for_range(lo64, hi64, k.i64(1), |k, i| {
        let idx = k.add(base, i);
        let xv = k.load_f(in_dt, gate, idx);
        let lf = log_gate(k, kind, xv);
        let r = k.fadd(k.use_f(run), lf);
        k.def_var(run, r);
        k.store_f(DType::F32, out, idx, r);
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
fn load_row<'ctx>(
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

/// Max-norm reduction of the data-dependent threshold bound: params
/// `(q: [BH, T, D], k: [BH, T, D], norms: u32 [BH, 2], T: i32)`. Grid
/// `(ceil(T / NORM_ROWS_PER_BLOCK), BH)`, block [`ROW_THREADS`]. `norms` must be zeroed first: it
/// receives `max_i |q_i|^2` and `max_j |k_j|^2` as f32 bits through `atomicMax` on u32 (non-negative
/// floats order like their bit patterns).
pub fn build_threshold_norms<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    name: &str,
    d: u32,
    kv_group: u32,
    (q_dt, k_dt): (DType, DType),
) -> R<FunctionValue<'ctx>> {
    let params = [("q", ParamTy::Ptr), ("k", ParamTy::Ptr), ("norms", ParamTy::Ptr), ("T", ParamTy::I32)];
    let k = Kb::kernel(ctx, module, name, &params)?;
    let (q, kk, norms, t_len) = (k.param_ptr(0), k.param_ptr(1), k.param_ptr(2), k.param_int(3));
    let qm = k.declare_var(k.f32(0.0).into());
    let km = k.declare_var(k.f32(0.0).into());
    let tid = k.sreg("tid.x");
    let (lane, warp) = lane_warp(&k, tid);
    let bx = k.sreg("ctaid.x");
    let bh = k.sreg("ctaid.y");
    let per_warp = NORM_ROWS_PER_BLOCK / (ROW_THREADS / 32);
    let first = k.add(k.mulc(bx, NORM_ROWS_PER_BLOCK as i64), k.mulc(warp, per_warp as i64));
    let last = k.smin(k.addc(first, per_warp as i64), t_len);
    let bh_base = k.mul(k.sext64(bh), k.sext64(t_len));
    let kbh_base = kv_rows(&k, bh, t_len, kv_group);
    k.for_range(first, last, k.i32(1), |k, i| {
        let base = k.mul(k.add(bh_base, k.sext64(i)), k.i64(d as i64));
        let kbase = k.mul(k.add(kbh_base, k.sext64(i)), k.i64(d as i64));
        let qv = load_row(k, q_dt, q, base, lane, d);
        let kv = load_row(k, k_dt, kk, kbase, lane, d);
        let (mut sq, mut sk) = (k.f32(0.0), k.f32(0.0));
        for (a, b) in qv.iter().zip(&kv) {
            sq = k.fma(*a, *a, sq);
            sk = k.fma(*b, *b, sk);
        }
        let sq = k.warp_sum(sq);
        let sk = k.warp_sum(sk);
        k.def_var(qm, k.fmax(k.use_f(qm), sq));
        k.def_var(km, k.fmax(k.use_f(km), sk));
    });
    let is0 = k.icmpc(IntPredicate::EQ, lane, 0);
    k.if_then(is0, |k| {
        for (slot, var) in [(0i64, qm), (1, km)] {
            let v = k.use_f(var);
            let bits = k.f32_bits(v);
            let idx = k.addc(k.mulc(k.sext64(bh), 2), slot);
            let p = k.gep_dt(DType::I32, norms, idx);
            k.atomic_umax(p, bits);
        }
    });
    k.finish()
}

/// First row of the keys that query head `bh` reads, `(bh / kv_group) T` (64-bit): key/value
/// head `h / kv_group` of batch `b` is flat head `(b H + h) / kv_group` since `kv_group`
/// divides `H`.
fn kv_rows<'ctx>(
    k: &Kb<'_, 'ctx>,
    bh: IntValue<'ctx>,
    t_len: IntValue<'ctx>,
    kv_group: u32,
) -> IntValue<'ctx> {
    let kvh = if kv_group == 1 { bh } else { k.udivc(bh, kv_group as i64) };
    k.mul(k.sext64(kvh), k.sext64(t_len))
}

/// How the threshold kernel gets `Qmax` and `Kmax`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BoundSrc {
    Static {
        q_max: f64,
        k_max: f64,
    },
    /// From the `norms` buffer written by [`build_threshold_norms`] (squared norms as f32 bits).
    Norms,
}

/// Per-query-tile delta: params `(q, k, norms: u32 [BH, 2], delta: f32 [BH, Mt], T: i32, lnT: f32)`.
/// Grid `(Mt, BH)`, block [`ROW_THREADS`]. `norms` is read only for [`BoundSrc::Norms`] (pass any
/// valid pointer otherwise).
#[allow(clippy::too_many_arguments)]
pub fn build_threshold_delta<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    name: &str,
    d: u32,
    kv_group: u32,
    (q_dt, k_dt): (DType, DType),
    rule: PruneRule,
    log_eps: f64,
    scale: f64,
    bm: u32,
    bound: BoundSrc,
) -> R<FunctionValue<'ctx>> {
    let params = [
        ("q", ParamTy::Ptr),
        ("k", ParamTy::Ptr),
        ("norms", ParamTy::Ptr),
        ("delta", ParamTy::Ptr),
        ("T", ParamTy::I32),
        ("lnT", ParamTy::F32),
    ];
    let k = Kb::kernel(ctx, module, name, &params)?;
    let (q, kk, norms, delta) = (k.param_ptr(0), k.param_ptr(1), k.param_ptr(2), k.param_ptr(3));
    let (t_len, ln_t) = (k.param_int(4), k.param_f32(5));
    let wmin = k.declare_var(k.f32(f64::INFINITY).into());
    let tid = k.sreg("tid.x");
    let (lane, warp) = lane_warp(&k, tid);
    let m = k.sreg("ctaid.x");
    let bh = k.sreg("ctaid.y");
    let mt = k.sreg("nctaid.x");
    let norm = |k: &Kb<'_, 'ctx>, slot: i64| -> FloatValue<'ctx> {
        let idx = k.addc(k.mulc(k.sext64(bh), 2), slot);
        let sq = k.load_f(DType::F32, norms, idx);
        k.sqrt(sq)
    };
    let (qmax, kmax) = match bound {
        BoundSrc::Static { q_max, k_max } => (k.f32(q_max), k.f32(k_max)),
        BoundSrc::Norms => (norm(&k, 0), norm(&k, 1)),
    };
    let ascale = scale.abs();
    let out_idx = k.add(k.mul(k.sext64(bh), k.sext64(mt)), k.sext64(m));
    match rule {
        PruneRule::Paper => {
            let is0 = k.icmpc(IntPredicate::EQ, tid, 0);
            k.if_then(is0, |k| {
                let u = k.fmul(k.fmul(k.f32(ascale), qmax), kmax);
                let v = k.fsub(k.fsub(k.f32(log_eps), k.fmul(k.f32(2.0), u)), ln_t);
                k.store_f(DType::F32, delta, out_idx, v);
            });
        }
        PruneRule::Tight => {
            let nw = (ROW_THREADS / 32) as i64;
            let i0 = k.mulc(m, bm as i64);
            let first = k.add(i0, warp);
            let last = k.smin(k.addc(i0, bm as i64), t_len);
            let bh_base = k.mul(k.sext64(bh), k.sext64(t_len));
            let kbh_base = kv_rows(&k, bh, t_len, kv_group);
            let c0 = k.fsub(k.f32(log_eps), ln_t);
            k.for_range(first, last, k.i32(nw), |k, i| {
                let base = k.mul(k.add(bh_base, k.sext64(i)), k.i64(d as i64));
                let kbase = k.mul(k.add(kbh_base, k.sext64(i)), k.i64(d as i64));
                let qv = load_row(k, q_dt, q, base, lane, d);
                let kv = load_row(k, k_dt, kk, kbase, lane, d);
                let (mut qq, mut qk) = (k.f32(0.0), k.f32(0.0));
                for (a, b) in qv.iter().zip(&kv) {
                    qq = k.fma(*a, *a, qq);
                    qk = k.fma(*a, *b, qk);
                }
                let qq = k.warp_sum(qq);
                let qk = k.warp_sum(qk);
                let pen = k.fmul(k.fmul(k.f32(ascale), k.sqrt(qq)), kmax);
                let v = k.fadd(k.fsub(c0, pen), k.fmul(k.f32(scale), qk));
                k.def_var(wmin, k.fmin(k.use_f(wmin), v));
            });
            let sh = k.shared_f32(&format!("{name}_warp_min"), nw as u32);
            let is0 = k.icmpc(IntPredicate::EQ, lane, 0);
            k.if_then(is0, |k| k.store(k.shared_at(sh, warp), k.use_f(wmin)));
            k.barrier();
            let t0 = k.icmpc(IntPredicate::EQ, tid, 0);
            k.if_then(t0, |k| {
                let mut v = k.f32(f64::INFINITY);
                for w in 0..nw {
                    v = k.fmin(v, k.load_f32(k.shared_at(sh, k.i32(w))));
                }
                k.store_f(DType::F32, delta, out_idx, v);
            });
        }
    }
    k.finish()
}
