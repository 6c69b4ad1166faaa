//! CLIF emission of each kernel kind. Every kernel body is a loop over its tasks
//! `task_begin..task_end`; see [`super::abi`] for the argument layout.

use super::emit::{Fx, F32, F32X4, F64, I32, I64};
use super::region::{self, CaptureCode, Lanes, RegionCode};
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{FuncRef, InstBuilder, Value};
use foxc_ir::{BinaryOp, DType, GateKind, NormBound, PruneRule, ScoreBound, LOG_F_FLOOR};

/// A kernel, with every size a compile-time constant.
#[derive(Clone, Debug)]
pub enum Kind {
    /// `x op c` (or `c op x`) elementwise over `n` elements, `c` a folded scalar.
    ScalarOp {
        src: DType,
        dst: DType,
        op: BinaryOp,
        c: f64,
        tensor_first: bool,
        n: u64,
    },
    /// Elementwise conversion of `n` elements.
    Cast {
        src: DType,
        dst: DType,
        n: u64,
    },
    /// `rows` rows of `d` elements; w `[d]`.
    RmsNorm {
        x: DType,
        w: DType,
        out: DType,
        rows: u64,
        d: u64,
        eps: f64,
    },
    GateCumsum {
        kind: GateKind,
        src: DType,
        b: u64,
        h: u64,
        t: u64,
        /// `gate_cumsum_lo`: store the f32 rounding residual of the f64 sum instead of the sum.
        lo: bool,
    },
    Threshold {
        q: DType,
        k: DType,
        bh: u64,
        t: u64,
        d: u64,
        /// Query heads and kv heads (k has `hk` heads; query head h reads kv head h / (h / hk)).
        h: u64,
        hk: u64,
        rule: PruneRule,
        log_eps: f64,
        bound: NormBound,
        score: ScoreBound,
        scale: f64,
        bm: u64,
    },
    BlockBoundary {
        c: DType,
        delta: DType,
        bh: u64,
        t: u64,
        bm: u64,
        bn: u64,
    },
    Attention(AttnKernel),
    AttentionBackward(Box<super::backward::BwdKernel>),
}

#[derive(Clone, Debug)]
pub struct AttnKernel {
    pub q: DType,
    pub k: DType,
    pub v: DType,
    /// dtype of the cumsum operand when there is one.
    pub c: Option<DType>,
    /// `decay(pair)`: operand `c_lo` (f32) follows c; the bias adds `lo_i - lo_j`.
    pub c_lo: bool,
    /// Whether the operand after c holds the first kept key tile per query tile.
    pub pruned: bool,
    pub bh: u64,
    /// Query heads and kv heads (query head h reads kv head h / (h / hk)).
    pub h: u64,
    pub hk: u64,
    pub t: u64,
    pub d: u64,
    pub bm: u64,
    pub bn: u64,
    pub scale: f64,
    /// Causal rows see `j <= i` (and `i - j < window` if set); otherwise every key (before the
    /// expression mask, if any).
    pub causal: bool,
    pub window: Option<u64>,
    /// The score region (`None`: identity) and the expression mask (non-zero keeps).
    pub score: Option<RegionCode>,
    pub mask: Option<RegionCode>,
    /// The captured tensors (operands after start).
    pub captures: Vec<CaptureCode>,
    /// Result 0's dtype (f32 or bf16).
    pub out: DType,
    /// Write result 1, the log-sum-exp of each row (f32 `[B, H, T]`, `-inf` for a row
    /// without kept keys): only when something reads it.
    pub lse: bool,
}

/// Elements of one Cast task.
pub const CAST_GRAIN: u64 = 4096;

fn round_up(x: u64, m: u64) -> u64 {
    x.div_ceil(m) * m
}

/// Byte offsets of the attention kernel's per-thread scratch areas.
pub struct AttnScratch {
    pub bmp: u64,
    pub bnp: u64,
    pub dp: u64,
    pub qs: i64,
    pub kt: i64,
    pub vp: i64,
    pub s: i64,
    pub o: i64,
    pub ci: i64,
    pub cj: i64,
    /// `lo_i`, `lo_j` of a `decay(pair)` (empty areas otherwise).
    pub li: i64,
    pub lj: i64,
    pub mrow: i64,
    pub lrow: i64,
    pub arow: i64,
    pub bytes: usize,
}

impl AttnKernel {
    pub fn mt(&self) -> u64 {
        self.t.div_ceil(self.bm)
    }

    pub fn scratch(&self) -> AttnScratch {
        let bmp = round_up(self.bm, 4);
        let bnp = round_up(self.bn, 8);
        let dp = round_up(self.d, 8);
        let mut off = 0u64;
        let mut take = |floats: u64| {
            let o = off;
            off = round_up(off + floats * 4, 64);
            o as i64
        };
        // Q is stored pre-broadcast (each element splatted to an f32x4): the QK block then
        // loads a ready operand instead of a scalar load and a broadcast per row and column.
        let qs = take(bmp * self.d * 4);
        let kt = take(self.d * bnp);
        let vp = take(bnp * dp);
        let s = take(bmp * bnp);
        let o = take(bmp * dp);
        let ci = take(bmp);
        let cj = take(bnp);
        let pair = self.c_lo as u64;
        let li = take(bmp * pair);
        let lj = take(bnp * pair);
        let mrow = take(bmp);
        let lrow = take(bmp);
        let arow = take(bmp);
        AttnScratch { bmp, bnp, dp, qs, kt, vp, s, o, ci, cj, li, lj, mrow, lrow, arow, bytes: off as usize }
    }
}

impl Kind {
    /// (task count, tasks per grab, scratch bytes)
    pub fn tasks(&self) -> (u64, u64, usize) {
        match self {
            Kind::Cast { n, .. } | Kind::ScalarOp { n, .. } => (n.div_ceil(CAST_GRAIN), 1, 0),
            Kind::RmsNorm { rows, .. } => (*rows, 64, 0),
            Kind::GateCumsum { b, h, .. } => (b * h, 1, 0),
            Kind::Threshold { bh, .. } | Kind::BlockBoundary { bh, .. } => (*bh, 1, 0),
            Kind::Attention(a) => (a.bh * a.mt(), 1, a.scratch().bytes),
            Kind::AttentionBackward(a) => a.tasks(),
        }
    }

    /// The results of the node the kernel writes (one buffer each, after the operands).
    pub fn results(&self) -> Vec<u32> {
        match self {
            Kind::Attention(a) if a.lse => vec![0, 1],
            Kind::AttentionBackward(a) => (0..a.result_count() as u32).collect(),
            _ => vec![0],
        }
    }

    /// Bytes of the buffer shared by the kernel's tasks.
    pub fn temp_bytes(&self) -> usize {
        match self {
            Kind::AttentionBackward(a) => a.temp_bytes(),
            _ => 0,
        }
    }

    /// Whether the kernel has a finishing function (run once after its tasks).
    pub fn has_finish(&self) -> bool {
        matches!(self, Kind::AttentionBackward(a) if a.has_finish())
    }
}

/// Helpers a kernel may call.
pub struct Helpers {
    /// `log1p(exp(-|z|))` in f64 (gate logits).
    pub log1p_exp_neg_abs: Option<FuncRef>,
    /// `ln(z)` in f64 (the attention's log-sum-exp).
    pub ln: Option<FuncRef>,
}

pub struct Frame {
    pub args: Value,
    pub begin: Value,
    pub end: Value,
    pub scratch: Value,
}

impl Fx<'_> {
    fn arg(&mut self, args: Value, k: usize) -> Value {
        self.load(I64, args, (8 * k) as i32)
    }
}

pub fn emit(fx: &mut Fx, kind: &Kind, f: &Frame, h: &Helpers) {
    match kind {
        Kind::Cast { src, dst, n } => emit_cast(fx, *src, *dst, *n, f),
        Kind::ScalarOp { src, dst, op, c, tensor_first, n } => {
            emit_scalar_op(fx, *src, *dst, *op, *c, *tensor_first, *n, f)
        }
        Kind::RmsNorm { x, w, out, rows: _, d, eps } => emit_rmsnorm(fx, *x, *w, *out, *d, *eps, f),
        Kind::GateCumsum { kind, src, b: _, h: nh, t, lo } => {
            emit_gate_cumsum(fx, *kind, *src, *nh, *t, *lo, f, h)
        }
        Kind::Threshold { q, k, bh: _, t, d, h, hk, rule, log_eps, bound, score, scale, bm } => {
            let p = super::threshold::Params {
                q: *q,
                k: *k,
                t: *t,
                d: *d,
                h: *h,
                hk: *hk,
                rule,
                log_eps: *log_eps,
                bound: *bound,
                score: *score,
                scale: *scale,
                bm: *bm,
            };
            let bufs = (fx.arg(f.args, 0), fx.arg(f.args, 1), fx.arg(f.args, 2));
            super::threshold::emit(fx, &p, bufs, (f.begin, f.end))
        }
        Kind::BlockBoundary { c, delta, bh: _, t, bm, bn } => {
            emit_block_boundary(fx, *c, *delta, *t, *bm, *bn, f)
        }
        Kind::Attention(a) => emit_attention(fx, a, f, h),
        Kind::AttentionBackward(a) => super::backward::emit(fx, a, f),
    }
}

/// The finishing function of a kernel that has one ([`Kind::has_finish`]).
pub fn emit_finish(fx: &mut Fx, kind: &Kind, f: &Frame) {
    if let Kind::AttentionBackward(a) = kind {
        super::backward::emit_finish(fx, a, f);
    }
}

/// Apply `op` to `(x, c)` or `(c, x)`; scalars or f32x4 alike.
fn apply(fx: &mut Fx, op: BinaryOp, x: Value, c: Value, tensor_first: bool, vector: bool) -> Value {
    let (a, b) = if tensor_first { (x, c) } else { (c, x) };
    match op {
        BinaryOp::Add => fx.b.ins().fadd(a, b),
        BinaryOp::Sub => fx.b.ins().fsub(a, b),
        BinaryOp::Div => fx.b.ins().fdiv(a, b),
        BinaryOp::Min if vector => {
            let m = fx.b.ins().fcmp(FloatCC::LessThan, a, b);
            fx.vsel(m, a, b)
        }
        BinaryOp::Max if vector => fx.vmax(a, b),
        BinaryOp::Min => fx.fmin_s(a, b),
        BinaryOp::Max => fx.fmax_s(a, b),
        // The planner admits only the arithmetic ops above and mul.
        _ => fx.b.ins().fmul(a, b),
    }
}

#[allow(clippy::too_many_arguments)]
fn emit_scalar_op(
    fx: &mut Fx,
    src: DType,
    dst: DType,
    op: BinaryOp,
    c: f64,
    tensor_first: bool,
    n: u64,
    f: &Frame,
) {
    let operand = if tensor_first { 0 } else { 1 };
    let x = fx.arg(f.args, operand);
    let y = fx.arg(f.args, 2);
    let vector = dst == DType::F32 && n.is_multiple_of(4);
    fx.for_range(f.begin, f.end, 1, |fx, task| {
        let lo = fx.b.ins().imul_imm_s(task, CAST_GRAIN as i64);
        let hi = fx.b.ins().iadd_imm_s(lo, CAST_GRAIN as i64);
        let nv = fx.ic(n as i64);
        let hi = fx.imin(hi, nv);
        if vector {
            let cv = fx.splat_c(c as f32);
            fx.for_range(lo, hi, 4, |fx, i| {
                let v = fx.load4_f32(src, x, i);
                let r = apply(fx, op, v, cv, tensor_first, true);
                let a = fx.addr(y, i, 4);
                fx.store(r, a, 0);
            });
        } else {
            let cs = fx.f32c(c as f32);
            fx.for_range(lo, hi, 1, |fx, i| {
                let v = fx.load_f32(src, x, i);
                let r = apply(fx, op, v, cs, tensor_first, false);
                fx.store_f32(dst, y, i, r);
            });
        }
    });
}

fn emit_cast(fx: &mut Fx, src: DType, dst: DType, n: u64, f: &Frame) {
    let x = fx.arg(f.args, 0);
    let y = fx.arg(f.args, 1);
    fx.for_range(f.begin, f.end, 1, |fx, task| {
        let lo = fx.b.ins().imul_imm_s(task, CAST_GRAIN as i64);
        let hi = fx.b.ins().iadd_imm_s(lo, CAST_GRAIN as i64);
        let nv = fx.ic(n as i64);
        let hi = fx.imin(hi, nv);
        fx.for_range(lo, hi, 1, |fx, i| {
            let v = fx.load_f32(src, x, i);
            fx.store_f32(dst, y, i, v);
        });
    });
}

#[allow(clippy::too_many_arguments)]
fn emit_rmsnorm(fx: &mut Fx, xt: DType, wt: DType, ot: DType, d: u64, eps: f64, f: &Frame) {
    let x = fx.arg(f.args, 0);
    let w = fx.arg(f.args, 1);
    let y = fx.arg(f.args, 2);
    fx.for_range(f.begin, f.end, 1, |fx, row| {
        let base = fx.b.ins().imul_imm_s(row, d as i64);
        let ss = fx.b.declare_var(F64);
        let z = fx.f64c(0.0);
        fx.b.def_var(ss, z);
        fx.for_n(0, d as i64, 1, |fx, j| {
            let idx = fx.b.ins().iadd(base, j);
            let v = fx.load_f64(xt, x, idx);
            let acc = fx.b.use_var(ss);
            let sq = fx.b.ins().fmul(v, v);
            let acc = fx.b.ins().fadd(acc, sq);
            fx.b.def_var(ss, acc);
        });
        let acc = fx.b.use_var(ss);
        let inv_d = fx.f64c(1.0 / d as f64);
        let mean = fx.b.ins().fmul(acc, inv_d);
        let e = fx.f64c(eps);
        let mean = fx.b.ins().fadd(mean, e);
        let rt = fx.b.ins().sqrt(mean);
        let one = fx.f64c(1.0);
        let r = fx.b.ins().fdiv(one, rt);
        fx.for_n(0, d as i64, 1, |fx, j| {
            let idx = fx.b.ins().iadd(base, j);
            let v = fx.load_f64(xt, x, idx);
            let wv = fx.load_f64(wt, w, j);
            let v = fx.b.ins().fmul(v, r);
            let v = fx.b.ins().fmul(v, wv);
            let v = fx.b.ins().fdemote(F32, v);
            fx.store_f32(ot, y, idx, v);
        });
    });
}

#[allow(clippy::too_many_arguments)]
fn emit_gate_cumsum(
    fx: &mut Fx,
    kind: GateKind,
    src: DType,
    nh: u64,
    t: u64,
    lo: bool,
    f: &Frame,
    h: &Helpers,
) {
    let x = fx.arg(f.args, 0);
    let y = fx.arg(f.args, 1);
    fx.for_range(f.begin, f.end, 1, |fx, bh| {
        let base = fx.b.ins().imul_imm_s(bh, t as i64);
        let acc = fx.b.declare_var(F64);
        let z = fx.f64c(0.0);
        fx.b.def_var(acc, z);
        let floor = fx.f64c(LOG_F_FLOOR);
        // Slope: log f = -m[h] for every t, so c[t] = -m[h] (t + 1) (a product, as the contract says).
        let slope = if kind == GateKind::Slope {
            let hh = fx.b.ins().urem_imm_s(bh, nh as i64);
            let m = fx.load_f64(src, x, hh);
            let lf = fx.b.ins().fneg(m);
            Some(fx.fmax_s(lf, floor))
        } else {
            None
        };
        fx.for_n(0, t as i64, 1, |fx, tt| {
            let idx = fx.b.ins().iadd(base, tt);
            let c = match kind {
                GateKind::Slope => {
                    let n = fx.b.ins().iadd_imm_s(tt, 1);
                    let n = fx.b.ins().fcvt_from_sint(F64, n);
                    fx.b.ins().fmul(slope.expect("set above"), n)
                }
                GateKind::LogGate | GateKind::Logits => {
                    let v = fx.load_f64(src, x, idx);
                    let lf = if kind == GateKind::Logits {
                        // logsigmoid(z) = min(z, 0) - log1p(exp(-|z|))
                        let zero = fx.f64c(0.0);
                        let mn = fx.fmin_s(v, zero);
                        let call =
                            fx.b.ins().call(h.log1p_exp_neg_abs.expect("helper imported for logits"), &[v]);
                        let l = fx.b.inst_results(call)[0];
                        fx.b.ins().fsub(mn, l)
                    } else {
                        v
                    };
                    // Clamp below without hiding NaN (a NaN compares false and stays).
                    let low = fx.b.ins().fcmp(FloatCC::LessThan, lf, floor);
                    let lf = fx.b.ins().select(low, floor, lf);
                    let a = fx.b.use_var(acc);
                    let a = fx.b.ins().fadd(a, lf);
                    fx.b.def_var(acc, a);
                    a
                }
            };
            let mut c32 = fx.b.ins().fdemote(F32, c);
            if lo {
                // gate_cumsum_lo: what the f32 c could not hold, c - round_f32(c), in f32.
                let back = fx.b.ins().fpromote(F64, c32);
                let r = fx.b.ins().fsub(c, back);
                c32 = fx.b.ins().fdemote(F32, r);
            }
            fx.store_f32(DType::F32, y, idx, c32);
        });
    });
}

fn emit_block_boundary(fx: &mut Fx, ct: DType, dt: DType, t: u64, bm: u64, bn: u64, f: &Frame) {
    let c = fx.arg(f.args, 0);
    let delta = fx.arg(f.args, 1);
    let out = fx.arg(f.args, 2);
    let mt = t.div_ceil(bm);
    fx.for_range(f.begin, f.end, 1, |fx, bh| {
        let cbase = fx.b.ins().imul_imm_s(bh, t as i64);
        let obase = fx.b.ins().imul_imm_s(bh, mt as i64);
        fx.for_n(0, mt as i64, 1, |fx, m| {
            let i0 = fx.b.ins().imul_imm_s(m, bm as i64);
            let ci = fx.b.ins().iadd(cbase, i0);
            let ci0 = fx.load_f64(ct, c, ci);
            let didx = fx.b.ins().iadd(obase, m);
            let dl = fx.load_f64(dt, delta, didx);
            // The diagonal tile (holding j = i0) is never skipped.
            let lim = fx.b.ins().udiv_imm_s(i0, bn as i64);
            // start = first n < lim whose tile is kept, else lim. A linear scan from 0 follows
            // the contract even for a cumsum that is not monotone.
            let header = fx.b.create_block();
            fx.b.append_block_param(header, I64);
            let test = fx.b.create_block();
            let next = fx.b.create_block();
            let done = fx.b.create_block();
            fx.b.append_block_param(done, I64);
            let zero = fx.ic(0);
            fx.b.ins().jump(header, &[zero.into()]);
            fx.b.switch_to_block(header);
            let n = fx.b.block_params(header)[0];
            let at_lim = fx.b.ins().icmp(IntCC::SignedGreaterThanOrEqual, n, lim);
            fx.b.ins().brif(at_lim, done, &[n.into()], test, &[]);
            fx.b.switch_to_block(test);
            let jend = fx.b.ins().imul_imm_s(n, bn as i64);
            let jend = fx.b.ins().iadd_imm_s(jend, bn as i64 - 1);
            let tl = fx.ic(t as i64 - 1);
            let jend = fx.imin(jend, tl);
            let cj = fx.b.ins().iadd(cbase, jend);
            let cj = fx.load_f64(ct, c, cj);
            let diff = fx.b.ins().fsub(ci0, cj);
            let skip = fx.b.ins().fcmp(FloatCC::LessThan, diff, dl);
            fx.b.ins().brif(skip, next, &[], done, &[n.into()]);
            fx.b.switch_to_block(next);
            let n1 = fx.b.ins().iadd_imm_s(n, 1);
            fx.b.ins().jump(header, &[n1.into()]);
            fx.b.switch_to_block(done);
            let start = fx.b.block_params(done)[0];
            let s32 = fx.b.ins().ireduce(I32, start);
            let a = fx.addr(out, didx, 4);
            fx.store(s32, a, 0);
        });
    });
}

/// `dst[slot] = src[idx]` as f32: one element of a per-row or per-column f32 buffer (the gate
/// cumsum `c` and its residual `c_lo`) staged next to the tile that reads it.
fn stage_scalar(fx: &mut Fx, dt: DType, src: Value, idx: Value, dst: Value, slot: Value) {
    let x = fx.load_f32(dt, src, idx);
    let at = fx.addr(dst, slot, 4);
    fx.store(x, at, 0);
}

/// Copy `n` elements of `dt` from element `src_idx` of `src` to f32 at byte address `dst`,
/// multiplied by `mul` (an f32x4 splat) when given. Vector path when `n.is_multiple_of(4)`.
pub(super) fn copy_row(
    fx: &mut Fx,
    dt: DType,
    src: Value,
    src_idx: Value,
    dst: Value,
    n: u64,
    mul: Option<Value>,
) {
    if n.is_multiple_of(4) {
        for j in (0..n).step_by(4) {
            let idx = fx.b.ins().iadd_imm_s(src_idx, j as i64);
            let mut v = fx.load4_f32(dt, src, idx);
            if let Some(m) = mul {
                v = fx.b.ins().fmul(v, m);
            }
            fx.store(v, dst, (j * 4) as i32);
        }
    } else {
        let ms = mul.map(|m| fx.b.ins().extractlane(m, 0));
        for j in 0..n {
            let idx = fx.b.ins().iadd_imm_s(src_idx, j as i64);
            let mut v = fx.load_f32(dt, src, idx);
            if let Some(m) = ms {
                v = fx.b.ins().fmul(v, m);
            }
            fx.store(v, dst, (j * 4) as i32);
        }
    }
}

/// Store zeros over `floats` f32 (a multiple of 4) at the 16-byte aligned byte address `dst`.
pub(super) fn zero_fill(fx: &mut Fx, dst: Value, floats: u64) {
    let z = fx.splat_c(0.0);
    let n = (floats / 4) as i64;
    if n <= 16 {
        for j in 0..n {
            fx.store(z, dst, (j * 16) as i32);
        }
    } else {
        fx.for_n(0, n, 1, |fx, j| {
            let a = fx.addr(dst, j, 16);
            fx.store(z, a, 0);
        });
    }
}

fn emit_attention(fx: &mut Fx, a: &AttnKernel, f: &Frame, h: &Helpers) {
    let sc = a.scratch();
    let (bmp, bnp, dp) = (sc.bmp, sc.bnp, sc.dp);
    let (t, d, bm, bn) = (a.t, a.d, a.bm, a.bn);
    let mt = a.mt();
    let q = fx.arg(f.args, 0);
    let k = fx.arg(f.args, 1);
    let v = fx.arg(f.args, 2);
    let mut next = 3;
    let c = a.c.map(|_| {
        next += 1;
        fx.arg(f.args, next - 1)
    });
    let c_lo = (a.c.is_some() && a.c_lo).then(|| {
        next += 1;
        fx.arg(f.args, next - 1)
    });
    let start = if a.pruned {
        next += 1;
        Some(fx.arg(f.args, next - 1))
    } else {
        None
    };
    let caps: Vec<(Value, CaptureCode)> =
        a.captures.iter().enumerate().map(|(k, cc)| (fx.arg(f.args, next + k), cc.clone())).collect();
    let out = fx.arg(f.args, next + a.captures.len());
    let lse_out = a.lse.then(|| fx.arg(f.args, next + a.captures.len() + 1));
    let scr = f.scratch;
    let qs = fx.b.ins().iadd_imm_s(scr, sc.qs);
    let kt = fx.b.ins().iadd_imm_s(scr, sc.kt);
    let vp = fx.b.ins().iadd_imm_s(scr, sc.vp);
    let sb = fx.b.ins().iadd_imm_s(scr, sc.s);
    let ob = fx.b.ins().iadd_imm_s(scr, sc.o);
    let cib = fx.b.ins().iadd_imm_s(scr, sc.ci);
    let cjb = fx.b.ins().iadd_imm_s(scr, sc.cj);
    // decay(pair): lo_i of the tile's rows and lo_j of its columns.
    let lo_bufs = c_lo.map(|_| (fx.b.ins().iadd_imm_s(scr, sc.li), fx.b.ins().iadd_imm_s(scr, sc.lj)));
    let mrow = fx.b.ins().iadd_imm_s(scr, sc.mrow);
    let lrow = fx.b.ins().iadd_imm_s(scr, sc.lrow);
    let arow = fx.b.ins().iadd_imm_s(scr, sc.arow);
    let bhn = a.bh;

    fx.for_range(f.begin, f.end, 1, |fx, task| {
        // Longest query tiles first: task -> (m = Mt-1 - task / BH, bh = task % BH).
        let mq = fx.b.ins().udiv_imm_s(task, bhn as i64);
        let mlast = fx.ic(mt as i64 - 1);
        let m = fx.b.ins().isub(mlast, mq);
        let bh = fx.b.ins().urem_imm_s(task, bhn as i64);
        let i0 = fx.b.ins().imul_imm_s(m, bm as i64);
        let tv = fx.ic(t as i64);
        let rem = fx.b.ins().isub(tv, i0);
        let bmv = fx.ic(bm as i64);
        let rows = fx.imin(bmv, rem);
        let row_base = fx.b.ins().imul_imm_s(bh, t as i64); // row index of (bh, 0)
                                                            // k and v rows of the kv head b * hk + h / (H / hk).
        let bi = fx.b.ins().udiv_imm_s(bh, a.h as i64);
        let hi = fx.b.ins().urem_imm_s(bh, a.h as i64);
        let kv_base = if a.hk == a.h {
            row_base
        } else {
            let kvh = fx.b.ins().udiv_imm_s(hi, (a.h / a.hk.max(1)).max(1) as i64);
            let kvb = fx.b.ins().imul_imm_s(bi, a.hk as i64);
            let kvh = fx.b.ins().iadd(kvb, kvh);
            fx.b.ins().imul_imm_s(kvh, t as i64)
        };
        let ilast = fx.b.ins().iadd(i0, rows);
        let ilast = fx.b.ins().iadd_imm_s(ilast, -1);
        // The last key tile: the diagonal one for causal rows, else the last of the sequence.
        let diag =
            if a.causal { fx.b.ins().udiv_imm_s(ilast, bn as i64) } else { fx.ic(((t - 1) / bn) as i64) };
        let mut n_lo = fx.ic(0);
        if let Some(sp) = start {
            let idx = fx.b.ins().imul_imm_s(bh, mt as i64);
            let idx = fx.b.ins().iadd(idx, m);
            let sa = fx.addr(sp, idx, 4);
            let s32 = fx.load(I32, sa, 0);
            let s = fx.b.ins().sextend(I64, s32);
            let zero = fx.ic(0);
            let s = fx.imax(s, zero);
            n_lo = fx.imin(s, diag);
        }
        if let Some(w) = a.window {
            // Tiles whose last column jend satisfies i0 - jend >= window hold no visible key
            // for any row of the tile: first kept n = ceil((i0 + 2 - window - bn) / bn), >= 0.
            let w = w.min(i64::MAX as u64 / 4) as i64;
            let x = fx.b.ins().iadd_imm_s(i0, 2 - w - bn as i64 + (bn as i64 - 1));
            let zero = fx.ic(0);
            let x = fx.imax(x, zero);
            let nw = fx.b.ins().sdiv_imm_s(x, bn as i64);
            let nw = fx.imin(nw, diag);
            n_lo = fx.imax(n_lo, nw);
        }

        // Per-task init.
        zero_fill(fx, qs, bmp * d * 4);
        zero_fill(fx, ob, bmp * dp);
        zero_fill(fx, vp, bnp * dp);
        zero_fill(fx, cib, bmp);
        if let Some((lib, _)) = lo_bufs {
            zero_fill(fx, lib, bmp);
        }
        let ninf = fx.splat_c(f32::NEG_INFINITY);
        let zv = fx.splat_c(0.0);
        for r in (0..bmp).step_by(4) {
            fx.store(ninf, mrow, (r * 4) as i32);
            fx.store(zv, lrow, (r * 4) as i32);
        }
        let scale_v = fx.splat_c(a.scale as f32);
        let z0 = fx_zero(fx);
        fx.for_range(z0, rows, 1, |fx, r| {
            let row = fx.b.ins().iadd(row_base, i0);
            let row = fx.b.ins().iadd(row, r);
            let src = fx.b.ins().imul_imm_s(row, d as i64);
            let dst = fx.addr(qs, r, (d * 16) as i64);
            if d.is_multiple_of(4) {
                for j in (0..d).step_by(4) {
                    let idx = fx.b.ins().iadd_imm_s(src, j as i64);
                    let x = fx.load4_f32(a.q, q, idx);
                    let x = fx.b.ins().fmul(x, scale_v);
                    for l in 0..4u8 {
                        let e = fx.b.ins().extractlane(x, l);
                        let sv = fx.splat(e);
                        fx.store(sv, dst, ((j + l as u64) * 16) as i32);
                    }
                }
            } else {
                let sc = fx.f32c(a.scale as f32);
                for j in 0..d {
                    let idx = fx.b.ins().iadd_imm_s(src, j as i64);
                    let x = fx.load_f32(a.q, q, idx);
                    let x = fx.b.ins().fmul(x, sc);
                    let sv = fx.splat(x);
                    fx.store(sv, dst, (j * 16) as i32);
                }
            }
            if let (Some(cp), Some(ct)) = (c, a.c) {
                stage_scalar(fx, ct, cp, row, cib, r);
            }
            if let (Some(lp), Some((lib, _))) = (c_lo, lo_bufs) {
                stage_scalar(fx, DType::F32, lp, row, lib, r);
            }
        });

        let diag1 = fx.b.ins().iadd_imm_s(diag, 1);
        fx.for_range(n_lo, diag1, 1, |fx, n| {
            let j0 = fx.b.ins().imul_imm_s(n, bn as i64);
            let tv = fx.ic(t as i64);
            let remj = fx.b.ins().isub(tv, j0);
            let bnv = fx.ic(bn as i64);
            let cols = fx.imin(bnv, remj);
            // Pack K transposed ([d][bnp]) and V ([bnp][dp]) as f32, and c_j.
            let z0 = fx_zero(fx);
            fx.for_range(z0, cols, 1, |fx, cc| {
                let row = fx.b.ins().iadd(row_base, j0);
                let row = fx.b.ins().iadd(row, cc);
                let kvrow = fx.b.ins().iadd(kv_base, j0);
                let kvrow = fx.b.ins().iadd(kvrow, cc);
                let src = fx.b.ins().imul_imm_s(kvrow, d as i64);
                let ktc = fx.addr(kt, cc, 4);
                if d.is_multiple_of(4) {
                    for j in (0..d).step_by(4) {
                        let idx = fx.b.ins().iadd_imm_s(src, j as i64);
                        let x = fx.load4_f32(a.k, k, idx);
                        for l in 0..4u8 {
                            let e = fx.b.ins().extractlane(x, l);
                            fx.store(e, ktc, ((j + l as u64) * bnp * 4) as i32);
                        }
                    }
                } else {
                    for j in 0..d {
                        let idx = fx.b.ins().iadd_imm_s(src, j as i64);
                        let e = fx.load_f32(a.k, k, idx);
                        fx.store(e, ktc, (j * bnp * 4) as i32);
                    }
                }
                let vdst = fx.addr(vp, cc, (dp * 4) as i64);
                copy_row(fx, a.v, v, src, vdst, d, None);
                if let (Some(cp), Some(ct)) = (c, a.c) {
                    stage_scalar(fx, ct, cp, row, cjb, cc);
                }
                if let (Some(lp), Some((_, ljb))) = (c_lo, lo_bufs) {
                    stage_scalar(fx, DType::F32, lp, row, ljb, cc);
                }
            });
            // The last key tile may be short: zero the padding columns so that they stay finite.
            let short = fx.b.ins().icmp_imm_s(IntCC::SignedLessThan, cols, bnp as i64);
            fx.if_then(short, |fx| {
                let hi = fx.ic(bnp as i64);
                fx.for_range(cols, hi, 1, |fx, cc| {
                    let ktc = fx.addr(kt, cc, 4);
                    let z = fx.f32c(0.0);
                    for j in 0..d {
                        fx.store(z, ktc, (j * bnp * 4) as i32);
                    }
                    let vdst = fx.addr(vp, cc, (dp * 4) as i64);
                    zero_fill(fx, vdst, dp);
                    let ca = fx.addr(cjb, cc, 4);
                    fx.store(z, ca, 0);
                    if let Some((_, ljb)) = lo_bufs {
                        let la = fx.addr(ljb, cc, 4);
                        fx.store(z, la, 0);
                    }
                });
            });

            // S = (scale Q) K^T, register blocks of 4 rows x 8 columns.
            fx.for_n(0, bmp as i64, 4, |fx, rb| {
                let qrow = fx.addr(qs, rb, (d * 16) as i64);
                let srow = fx.addr(sb, rb, (bnp * 4) as i64);
                fx.for_n(0, bnp as i64, 8, |fx, cb| {
                    let ktc = fx.addr(kt, cb, 4);
                    let mut acc = [fx.splat_c(0.0); 8];
                    for j in 0..d {
                        let k0 = fx.load(F32X4, ktc, (j * bnp * 4) as i32);
                        let k1 = fx.load(F32X4, ktc, (j * bnp * 4 + 16) as i32);
                        for r in 0..4 {
                            let qv = fx.load(F32X4, qrow, ((r * d + j) * 16) as i32);
                            acc[2 * r as usize] = fx.fmadd(qv, k0, acc[2 * r as usize]);
                            acc[2 * r as usize + 1] = fx.fmadd(qv, k1, acc[2 * r as usize + 1]);
                        }
                    }
                    let sdst = fx.addr(srow, cb, 4);
                    for r in 0..4u64 {
                        fx.store(acc[2 * r as usize], sdst, (r * bnp * 4) as i32);
                        fx.store(acc[2 * r as usize + 1], sdst, (r * bnp * 4 + 16) as i32);
                    }
                });
            });

            // Bias, mask, online softmax per row.
            fx.for_n(0, bmp as i64, 1, |fx, r| {
                let i = fx.b.ins().iadd(i0, r);
                // Visible columns of row i in this tile: [c_lo, c_hi).
                let rel = fx.b.ins().isub(i, j0);
                let rel1 = fx.b.ins().iadd_imm_s(rel, 1);
                let chi = if a.causal { fx.imin(cols, rel1) } else { cols };
                let in_rows = fx.b.ins().icmp(IntCC::SignedLessThan, r, rows);
                let zero = fx.ic(0);
                let chi = fx.b.ins().select(in_rows, chi, zero);
                let chi_f = fx.b.ins().fcvt_from_sint(F32, chi);
                let chi_v = fx.splat(chi_f);
                let clo_v = a.window.map(|w| {
                    let w = w.min(i64::MAX as u64 / 4) as i64;
                    let lo = fx.b.ins().iadd_imm_s(rel, 1 - w);
                    let zero = fx.ic(0);
                    let lo = fx.imax(lo, zero);
                    let lo = fx.b.ins().fcvt_from_sint(F32, lo);
                    fx.splat(lo)
                });
                let srow = fx.addr(sb, r, (bnp * 4) as i64);
                let civ = if a.c.is_some() {
                    let ca = fx.addr(cib, r, 4);
                    let ci = fx.load(F32, ca, 0);
                    Some(fx.splat(ci))
                } else {
                    None
                };
                let liv = lo_bufs.map(|(lib, _)| {
                    let la = fx.addr(lib, r, 4);
                    let li = fx.load(F32, la, 0);
                    fx.splat(li)
                });
                let mut vmx = fx.splat_c(f32::NEG_INFINITY);
                let ninf = vmx;
                for cc in (0..bnp).step_by(4) {
                    let mut s = fx.load(F32X4, srow, (cc * 4) as i32);
                    let jc = fx.b.ins().iadd_imm_s(j0, cc as i64);
                    let at = Lanes { b: bi, h: hi, i, j0: jc };
                    if let Some(rc) = &a.score {
                        s = region::emit(fx, rc, &caps, &at, s);
                    }
                    if let Some(civ) = civ {
                        let cj = fx.load(F32X4, cjb, (cc * 4) as i32);
                        let mut bias = fx.b.ins().fsub(civ, cj);
                        if let (Some(liv), Some((_, ljb))) = (liv, lo_bufs) {
                            // decay(pair): (c_i - c_j) + (lo_i - lo_j), the f64 cumsum's difference.
                            let lj = fx.load(F32X4, ljb, (cc * 4) as i32);
                            let dl = fx.b.ins().fsub(liv, lj);
                            bias = fx.b.ins().fadd(bias, dl);
                        }
                        s = fx.b.ins().fadd(s, bias);
                    }
                    let cf = cc as f32;
                    let idx = fx.vconst4([cf, cf + 1.0, cf + 2.0, cf + 3.0]);
                    let mut ok = fx.b.ins().fcmp(FloatCC::LessThan, idx, chi_v);
                    if let Some(clo_v) = clo_v {
                        let ok2 = fx.b.ins().fcmp(FloatCC::GreaterThanOrEqual, idx, clo_v);
                        ok = fx.b.ins().band(ok, ok2);
                    }
                    if let Some(mc) = &a.mask {
                        let x0 = fx.splat_c(0.0);
                        let keep = region::emit(fx, mc, &caps, &at, x0);
                        let ok2 = fx.b.ins().fcmp(FloatCC::NotEqual, keep, x0);
                        ok = fx.b.ins().band(ok, ok2);
                    }
                    s = fx.vsel(ok, s, ninf);
                    fx.store(s, srow, (cc * 4) as i32);
                    vmx = fx.vmax(vmx, s);
                }
                let tmax = fx.hmax(vmx);
                let ma = fx.addr(mrow, r, 4);
                let m_old = fx.load(F32, ma, 0);
                let m_new = fx.fmax_s(m_old, tmax);
                let ninf_s = fx.f32c(f32::NEG_INFINITY);
                let none = fx.b.ins().fcmp(FloatCC::Equal, m_new, ninf_s);
                let zf = fx.f32c(0.0);
                let m_use = fx.b.ins().select(none, zf, m_new);
                let dm = fx.b.ins().fsub(m_old, m_use);
                let alpha = fx.exp_s(dm);
                let mu = fx.splat(m_use);
                let mut vs = fx.splat_c(0.0);
                for cc in (0..bnp).step_by(4) {
                    let s = fx.load(F32X4, srow, (cc * 4) as i32);
                    let x = fx.b.ins().fsub(s, mu);
                    let p = fx.vexp(x);
                    fx.store(p, srow, (cc * 4) as i32);
                    vs = fx.b.ins().fadd(vs, p);
                }
                let la = fx.addr(lrow, r, 4);
                let l_old = fx.load(F32, la, 0);
                let psum = fx.hsum(vs);
                let l_new = fx.fmadd(l_old, alpha, psum);
                fx.store(l_new, la, 0);
                fx.store(m_new, ma, 0);
                let aa = fx.addr(arow, r, 4);
                fx.store(alpha, aa, 0);
            });

            // O = alpha O + P V, register blocks of 4 rows x 8 head dims.
            fx.for_n(0, bmp as i64, 4, |fx, rb| {
                let prow = fx.addr(sb, rb, (bnp * 4) as i64);
                let orow = fx.addr(ob, rb, (dp * 4) as i64);
                let arb = fx.addr(arow, rb, 4);
                let mut al = [fx.splat_c(0.0); 4];
                for (r, x) in al.iter_mut().enumerate() {
                    let s = fx.load(F32, arb, (r * 4) as i32);
                    *x = fx.splat(s);
                }
                fx.for_n(0, dp as i64, 8, |fx, db| {
                    let oc = fx.addr(orow, db, 4);
                    let vc = fx.addr(vp, db, 4);
                    let mut acc = [al[0]; 8];
                    for r in 0..4u64 {
                        for hh in 0..2u64 {
                            let o = fx.load(F32X4, oc, (r * dp * 4 + hh * 16) as i32);
                            acc[(2 * r + hh) as usize] = fx.b.ins().fmul(o, al[r as usize]);
                        }
                    }
                    for cc in 0..bnp {
                        let v0 = fx.load(F32X4, vc, (cc * dp * 4) as i32);
                        let v1 = fx.load(F32X4, vc, (cc * dp * 4 + 16) as i32);
                        for r in 0..4u64 {
                            let p = fx.load(F32, prow, ((r * bnp + cc) * 4) as i32);
                            let p = fx.splat(p);
                            acc[2 * r as usize] = fx.fmadd(p, v0, acc[2 * r as usize]);
                            acc[2 * r as usize + 1] = fx.fmadd(p, v1, acc[2 * r as usize + 1]);
                        }
                    }
                    for r in 0..4u64 {
                        for hh in 0..2u64 {
                            fx.store(acc[(2 * r + hh) as usize], oc, (r * dp * 4 + hh * 16) as i32);
                        }
                    }
                });
            });
        });

        // out_i = O_i / l_i; lse_i = m_i + ln l_i (m_i as the exponents used it: 0 for a row
        // without kept keys, whose l_i = 0 gives -inf).
        let z0 = fx_zero(fx);
        fx.for_range(z0, rows, 1, |fx, r| {
            let la = fx.addr(lrow, r, 4);
            let l = fx.load(F32, la, 0);
            if let Some(lp) = lse_out {
                let ma = fx.addr(mrow, r, 4);
                let m = fx.load(F32, ma, 0);
                let ninf = fx.f32c(f32::NEG_INFINITY);
                let none = fx.b.ins().fcmp(FloatCC::Equal, m, ninf);
                let zf = fx.f32c(0.0);
                let m = fx.b.ins().select(none, zf, m);
                let m = fx.b.ins().fpromote(F64, m);
                let l64 = fx.b.ins().fpromote(F64, l);
                let call = fx.b.ins().call(h.ln.expect("ln imported when lse is written"), &[l64]);
                let lnl = fx.b.inst_results(call)[0];
                let x = fx.b.ins().fadd(m, lnl);
                let x = fx.b.ins().fdemote(F32, x);
                let row = fx.b.ins().iadd(row_base, i0);
                let row = fx.b.ins().iadd(row, r);
                fx.store_f32(DType::F32, lp, row, x);
            }
            // A row without kept keys has l = 0 and O = 0: its output is 0 (docs/SEMANTICS.md,
            // empty rows), not 0 * (1 / 0) = NaN.
            let one = fx.f32c(1.0);
            let zf = fx.f32c(0.0);
            let inv = fx.b.ins().fdiv(one, l);
            // (l = 0 exactly: a NaN l keeps its NaN, as the contract wants.)
            let empty = fx.b.ins().fcmp(FloatCC::Equal, l, zf);
            let inv = fx.b.ins().select(empty, zf, inv);
            let invv = fx.splat(inv);
            let row = fx.b.ins().iadd(row_base, i0);
            let row = fx.b.ins().iadd(row, r);
            let dst = fx.b.ins().imul_imm_s(row, (d * 4) as i64);
            let dst = fx.b.ins().iadd(out, dst);
            let src = fx.addr(ob, r, (dp * 4) as i64);
            if a.out != DType::F32 {
                let base = fx.b.ins().imul_imm_s(row, d as i64);
                for j in 0..d {
                    let x = fx.load(F32, src, (j * 4) as i32);
                    let y = fx.b.ins().fmul(x, inv);
                    let idx = fx.b.ins().iadd_imm_s(base, j as i64);
                    fx.store_f32(a.out, out, idx, y);
                }
            } else if d.is_multiple_of(4) {
                for j in (0..d).step_by(4) {
                    let x = fx.load(F32X4, src, (j * 4) as i32);
                    let y = fx.b.ins().fmul(x, invv);
                    fx.store(y, dst, (j * 4) as i32);
                }
            } else {
                for j in 0..d {
                    let x = fx.load(F32, src, (j * 4) as i32);
                    let y = fx.b.ins().fmul(x, inv);
                    fx.store(y, dst, (j * 4) as i32);
                }
            }
        });
    });
}

fn fx_zero(fx: &mut Fx) -> Value {
    fx.ic(0)
}
