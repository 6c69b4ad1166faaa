//! CLIF emission of each kernel kind. Every kernel body is a loop over its tasks
//! `task_begin..task_end`; see [`super::abi`] for the argument layout.

use super::emit::{Fx, F32, F64, I32, I64};
use super::load_map::Operand;
use super::region::{CaptureCode, RegionCode};
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
        /// A q read through its load map (its captures in `captures`; boxed: the other kinds
        /// are small).
        q_map: Option<Box<RegionCode>>,
        /// The map's captured tensors (operands after q and k).
        captures: Vec<CaptureCode>,
        bh: u64,
        /// Query rows and key rows.
        t: u64,
        tk: u64,
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
        /// Query rows and key rows (c's length).
        t: u64,
        tk: u64,
        bm: u64,
        bn: u64,
    },
    Attention(Box<AttnKernel>),
    AttentionBackward(Box<super::backward::BwdKernel>),
}

#[derive(Clone, Debug)]
pub struct AttnKernel {
    /// The dtypes of the q and k buffers, q read through its load map when it has one
    /// (docs/SEMANTICS.md, "load_map"; the map's captures are in `captures`).
    pub q: DType,
    pub k: DType,
    pub q_map: Option<RegionCode>,
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
    /// Query rows; key rows `tk >= t` under a causal mask or a decay (query row `i` sits at key
    /// position `i + tk - t`, [`AttnKernel::offset`]).
    pub t: u64,
    pub tk: u64,
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
    /// The key bound `keys_from` (`E(b, h, i)`: every key `j < E` of row `i` is masked, set by
    /// the tiles pass): the forward walks each query tile's keys from the first tile that
    /// reaches the smallest `E` of its rows.
    pub keys_from: Option<RegionCode>,
    /// The epilogue `F(o, b, h, i, d)` applied to each output element before it is stored (its
    /// `x` is the output, its `j` the column).
    pub epilogue: Option<RegionCode>,
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
    /// Query rows of one register block of the score and `P V` products: 4, or the tile's rows
    /// when fewer (a decode step's tile of 1 row computes 1 row, not 4).
    pub rb: u64,
    /// The tile's rows rounded up to whole register blocks.
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

    /// The key position of query row 0 (queries aligned to the end of the keys): `Tk - Tq`.
    pub fn offset(&self) -> u64 {
        self.tk.saturating_sub(self.t)
    }

    pub fn scratch(&self) -> AttnScratch {
        let rb = self.bm.clamp(1, 4);
        let bmp = round_up(self.bm, rb);
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
        // Whole f32x4 vectors: the running max and sum are initialized four rows at a time.
        let rows4 = round_up(bmp, 4);
        let mrow = take(rows4);
        let lrow = take(rows4);
        let arow = take(rows4);
        AttnScratch {
            rb,
            bmp,
            bnp,
            dp,
            qs,
            kt,
            vp,
            s,
            o,
            ci,
            cj,
            li,
            lj,
            mrow,
            lrow,
            arow,
            bytes: off as usize,
        }
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
    pub(super) fn arg(&mut self, args: Value, k: usize) -> Value {
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
        Kind::Threshold {
            q,
            k,
            q_map,
            captures,
            bh: _,
            t,
            tk,
            d,
            h,
            hk,
            rule,
            log_eps,
            bound,
            score,
            scale,
            bm,
        } => {
            let p = super::threshold::Params {
                q: Operand { dtype: *q, map: q_map.as_deref().cloned() },
                k: Operand { dtype: *k, map: None },
                t: *t,
                tk: *tk,
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
            let caps: Vec<(Value, CaptureCode)> =
                captures.iter().enumerate().map(|(n, c)| (fx.arg(f.args, 2 + n), c.clone())).collect();
            let bufs = (fx.arg(f.args, 0), fx.arg(f.args, 1), fx.arg(f.args, 2 + captures.len()));
            super::threshold::emit(fx, &p, bufs, &caps, (f.begin, f.end))
        }
        Kind::BlockBoundary { c, delta, bh: _, t, tk, bm, bn } => {
            emit_block_boundary(fx, (*c, *delta), (*t, *tk), (*bm, *bn), f)
        }
        Kind::Attention(a) => super::attention::emit(fx, a, f, h),
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

/// `start` of every query tile of tasks `f.begin..f.end` (heads): `t` queries at the end of
/// `tk` keys (docs/SEMANTICS.md, block_boundary).
fn emit_block_boundary(
    fx: &mut Fx,
    (ct, dt): (DType, DType),
    (t, tk): (u64, u64),
    (bm, bn): (u64, u64),
    f: &Frame,
) {
    let c = fx.arg(f.args, 0);
    let delta = fx.arg(f.args, 1);
    let out = fx.arg(f.args, 2);
    let mt = t.div_ceil(bm);
    fx.for_range(f.begin, f.end, 1, |fx, bh| {
        let cbase = fx.b.ins().imul_imm_s(bh, tk as i64);
        let obase = fx.b.ins().imul_imm_s(bh, mt as i64);
        fx.for_n(0, mt as i64, 1, |fx, m| {
            // The tile's first row, as a key position.
            let i0 = fx.b.ins().imul_imm_s(m, bm as i64);
            let i0 = if tk == t { i0 } else { fx.b.ins().iadd_imm_s(i0, (tk - t) as i64) };
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
            let tl = fx.ic(tk as i64 - 1);
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
pub(super) fn stage_scalar(fx: &mut Fx, dt: DType, src: Value, idx: Value, dst: Value, slot: Value) {
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
