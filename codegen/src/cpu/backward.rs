//! The CPU kernel of `attention_backward` (docs/SEMANTICS.md, "attention_backward"; the f64
//! interpreter's `interp/backward.rs` is the reference it is tested against).
//!
//! One task per (batch, kv head), as the interpreter splits the work: the task owns the
//! `kv_group` query heads that read its kv head, so it alone writes their `dq` and `dc` rows
//! and the kv head's `dk`/`dv`, each summed in one fixed order (query heads ascending, rows
//! ascending, keys ascending). Nothing depends on how tasks are spread over threads: the same
//! bits on every run and for any thread count. Capture gradients, which several tasks touch,
//! are summed per task into the launch's shared buffer and added in task order by the
//! finishing function.
//!
//! The kept set is the forward's: the same start operand read the same way as the forward
//! kernel reads it (first kept key tile `min(max(start, 0), last tile of the query tile)`), the
//! same causal / window / expression masks. `P` is recomputed as `exp(s - lse)` from the
//! forward's log-sum-exp.
//!
//! Per query row `i`, keys go four at a time (f32x4 lanes `j0 .. j0 + 4`, as the score region
//! emitter evaluates them): `s = R(x) + c_i - c_j` with `x = scale q_i . k_j`, `p = exp(s -
//! lse_i)`, `ds = p (dout_i . v_j - delta_i)`, `dx = ds R'(x)`, then per lane `dv_j += p dout_i`,
//! `dk_j += dx scale q_i`, `dq_i += dx k_j`; `dc` is row sums minus column sums of `ds`. K, V
//! and the dk/dv accumulators live in per-thread scratch as f32 rows padded with zeros to a
//! multiple of 4 elements (and keys to a multiple of 4 rows), so the inner loops have no tails.

use super::emit::{is_cpu_float, Fx, F32, F32X4, I64};
use super::kernels::{copy_row, zero_fill, AttnKernel, Frame};
use super::region::{self, CaptureCode, Lanes, RegionCode};
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{InstBuilder, Value};
use foxc_ir::index::IndexExpr;
use foxc_ir::DType;

/// One read of a float capture in the score region, and the derivative of the region with
/// respect to that read.
#[derive(Clone, Debug)]
pub struct CapGrad {
    /// The capture's number (operand `captures[k]`).
    pub k: usize,
    pub index: Vec<IndexExpr>,
    pub subs: Vec<region::SubConsts>,
    pub local: RegionCode,
}

/// `attention_backward`, every size a compile-time constant.
#[derive(Clone, Debug)]
pub struct BwdKernel {
    /// The forward's operands, sizes, masks and score region.
    pub fwd: AttnKernel,
    /// dtypes of the operands `out`, `lse`, `dout`.
    pub out: DType,
    pub lse: DType,
    pub dout: DType,
    /// `dR/dx`; `None` when it is the constant 1 (identity score).
    pub dx: Option<RegionCode>,
    pub cap_grads: Vec<CapGrad>,
    /// The captures that get a gradient (the float ones), in result order.
    pub float_caps: Vec<usize>,
}

/// Plan the backward of node `n` from the kernel of its forward (`fwd`, planned from the same
/// operands): check `out`, `lse`, `dout`, compile the score region's derivatives.
pub fn plan(
    g: &foxc_ir::Graph,
    n: foxc_ir::ValueId,
    attn: &foxc_ir::Attention,
    fwd: AttnKernel,
    dim: &dyn Fn(&foxc_ir::Dim) -> Option<u64>,
    invalid: &dyn Fn(String) -> super::CpuError,
) -> Result<BwdKernel, super::CpuError> {
    let vals = g.operand_values(n);
    let [out, lse, dout] = <[foxc_ir::Value; 3]>::try_from(&vals[vals.len().saturating_sub(3)..])
        .map_err(|_| invalid("expects out, lse and dout after the forward's operands".into()))?;
    let shape = |v: foxc_ir::Value| -> Option<Vec<u64>> { g.value_ty(v).dims().map(dim).collect() };
    let (b, h, t, d) = (fwd.bh / fwd.h.max(1), fwd.h, fwd.t, fwd.d);
    for (v, what, want) in
        [(out, "out", vec![b, h, t, d]), (lse, "lse", vec![b, h, t]), (dout, "dout", vec![b, h, t, d])]
    {
        if shape(v).as_ref() != Some(&want) {
            return Err(invalid(format!("{what} has shape {:?}, expected {want:?}", shape(v))));
        }
        if !is_cpu_float(g.value_ty(v).dtype) {
            return Err(invalid(format!("{what} must be f32, bf16 or f16")));
        }
    }
    let grad = attn.score.grad();
    let dx = match grad.dx.nodes.get(grad.dx.root as usize) {
        Some(foxc_ir::attention::RNode::Const(c)) if *c == 1.0 => None,
        _ => Some(RegionCode::new(&grad.dx, dim).map_err(invalid)?),
    };
    let float_caps: Vec<usize> =
        (0..fwd.captures.len()).filter(|&k| is_cpu_float(fwd.captures[k].dtype)).collect();
    let score_code = fwd.score.as_ref();
    let mut cap_grads = vec![];
    for (id, r) in &grad.captures {
        let Some(foxc_ir::attention::RNode::Capture { k, index }) = attn.score.nodes.get(*id as usize) else {
            return Err(invalid("a capture derivative names a node that is not a capture".into()));
        };
        if !float_caps.contains(k) {
            continue;
        }
        let subs = score_code.map(|sc| sc.subs[*id as usize].clone()).unwrap_or_default();
        cap_grads.push(CapGrad {
            k: *k,
            index: index.clone(),
            subs,
            local: RegionCode::new(r, dim).map_err(invalid)?,
        });
    }
    let kernel = BwdKernel {
        fwd,
        out: g.value_ty(out).dtype,
        lse: g.value_ty(lse).dtype,
        dout: g.value_ty(dout).dtype,
        dx,
        cap_grads,
        float_caps,
    };
    if kernel.lse != DType::F32 {
        return Err(invalid("lse must be f32".into()));
    }
    if g.result_count(n) != kernel.result_count() {
        return Err(invalid(format!(
            "{} results, the kernel writes {}",
            g.result_count(n),
            kernel.result_count()
        )));
    }
    Ok(kernel)
}

fn round_up(x: u64, m: u64) -> u64 {
    x.div_ceil(m) * m
}

/// Byte offsets of the per-thread scratch areas.
struct Scratch {
    tp: u64,
    dp: u64,
    k: i64,
    v: i64,
    dk: i64,
    dv: i64,
    qs: i64,
    dout: i64,
    dq: i64,
    c: i64,
    /// `lo_j` of a `decay(pair)` (an empty area otherwise).
    lo: i64,
    rows: i64,
    cols: i64,
    bytes: usize,
}

impl BwdKernel {
    fn group(&self) -> u64 {
        self.fwd.h / self.fwd.hk.max(1)
    }

    fn tasks_count(&self) -> u64 {
        (self.fwd.bh / self.fwd.h.max(1)) * self.fwd.hk
    }

    fn scratch(&self) -> Scratch {
        // K, V, their gradients, c and the row / column sums of ds are per key position.
        let tp = round_up(self.fwd.tk, 4);
        let dp = round_up(self.fwd.d, 4);
        let mut off = 0u64;
        let mut take = |floats: u64| {
            let o = off;
            off = round_up(off + floats * 4, 64);
            o as i64
        };
        let k = take(tp * dp);
        let v = take(tp * dp);
        let dk = take(tp * dp);
        let dv = take(tp * dp);
        let qs = take(dp);
        let dout = take(dp);
        let dq = take(dp);
        let c = take(tp);
        let lo = take(tp * self.pair() as u64);
        let rows = take(tp);
        let cols = take(tp);
        Scratch { tp, dp, k, v, dk, dv, qs, dout, dq, c, lo, rows, cols, bytes: off as usize }
    }

    /// Whether the forward's decay is a pair `(c, c_lo)` (operand `c_lo` after c).
    fn pair(&self) -> bool {
        self.fwd.c.is_some() && self.fwd.c_lo
    }

    /// Elements of the float captures, in result order, and their sum.
    fn cap_sizes(&self) -> (Vec<u64>, u64) {
        let sizes: Vec<u64> =
            self.float_caps.iter().map(|&k| self.fwd.captures[k].shape.iter().product()).collect();
        let total = sizes.iter().sum();
        (sizes, total)
    }

    /// (task count, tasks per grab, scratch bytes)
    pub fn tasks(&self) -> (u64, u64, usize) {
        (self.tasks_count(), 1, self.scratch().bytes)
    }

    /// One f32 partial sum per task and float-capture element.
    pub fn temp_bytes(&self) -> usize {
        (self.tasks_count() * self.cap_sizes().1 * 4) as usize
    }

    pub fn has_finish(&self) -> bool {
        !self.float_caps.is_empty()
    }

    /// Results: dq, dk, dv, dc (with a decay), one per float capture.
    pub fn result_count(&self) -> usize {
        3 + self.fwd.c.is_some() as usize + self.float_caps.len()
    }

    /// Operand slots: q, k, v, [c], [c_lo], [start], captures, out, lse, dout; then the results;
    /// then the shared buffer.
    fn slots(&self) -> Slots {
        let mut n = 3;
        let c = self.fwd.c.map(|_| {
            n += 1;
            n - 1
        });
        let c_lo = self.pair().then(|| {
            n += 1;
            n - 1
        });
        let start = self.fwd.pruned.then(|| {
            n += 1;
            n - 1
        });
        let caps = n;
        n += self.fwd.captures.len();
        let out = n;
        let results = n + 3;
        let temp = results + self.result_count();
        Slots { c, c_lo, start, caps, out, results, temp }
    }
}

struct Slots {
    c: Option<usize>,
    c_lo: Option<usize>,
    start: Option<usize>,
    caps: usize,
    /// out, lse, dout follow.
    out: usize,
    results: usize,
    temp: usize,
}

fn arg(fx: &mut Fx, args: Value, k: usize) -> Value {
    fx.load(I64, args, (8 * k) as i32)
}

/// Copy row `row` (`d` elements of `dt`) of buffer `p` into f32 scratch at `dst`, times `mul`,
/// zero-padding to `dp` elements: the forward's row copy ([`copy_row`]), then the padding.
#[allow(clippy::too_many_arguments)]
fn stage_row(fx: &mut Fx, dt: DType, p: Value, row: Value, d: u64, dp: u64, dst: Value, mul: Option<f32>) {
    let base = fx.b.ins().imul_imm_s(row, d as i64);
    let m = mul.map(|m| fx.splat_c(m));
    copy_row(fx, dt, p, base, dst, d, m);
    for e in d..dp {
        let z = fx.f32c(0.0);
        fx.store(z, dst, (e * 4) as i32);
    }
}

/// `a . b` over `dp` f32 (a multiple of 4) at two scratch rows.
/// `a . b_l` for the four rows `b_l = b + l * stride` as the lanes of an f32x4; `a` is loaded
/// once for the four. Each lane sums in `e` order, as a plain dot product would.
fn dot4(fx: &mut Fx, a: Value, b: Value, stride: i64, dp: u64) -> Value {
    let mut acc = [fx.splat_c(0.0); 4];
    for e in (0..dp).step_by(4) {
        let x = fx.load(F32X4, a, (e * 4) as i32);
        for (l, acc) in acc.iter_mut().enumerate() {
            let y = fx.load(F32X4, b, (l as i64 * stride + (e * 4) as i64) as i32);
            *acc = fx.fmadd(x, y, *acc);
        }
    }
    let mut out = fx.splat_c(0.0);
    for (l, acc) in acc.into_iter().enumerate() {
        let s = fx.hsum(acc);
        out = fx.b.ins().insertlane(out, s, l as u8);
    }
    out
}

/// `y_l += c_l x` for the four rows `y_l = y + l * stride` (`c` the lanes of an f32x4); `x` is
/// loaded once for the four.
fn axpy4(fx: &mut Fx, c: Value, x: Value, y: Value, stride: i64, dp: u64) {
    let cs: Vec<Value> = (0..4u8)
        .map(|l| {
            let s = fx.b.ins().extractlane(c, l);
            fx.splat(s)
        })
        .collect();
    for e in (0..dp).step_by(4) {
        let xv = fx.load(F32X4, x, (e * 4) as i32);
        for (l, cv) in cs.iter().enumerate() {
            let off = (l as i64 * stride + (e * 4) as i64) as i32;
            let yv = fx.load(F32X4, y, off);
            let r = fx.fmadd(*cv, xv, yv);
            fx.store(r, y, off);
        }
    }
}

/// `y += sum_l c_l x_l` for the four rows `x_l = x + l * stride`, lanes in order (the same sum as
/// four `y += c_l x_l` in turn); `y` is loaded and stored once.
fn gemv4(fx: &mut Fx, c: Value, x: Value, stride: i64, y: Value, dp: u64) {
    let cs: Vec<Value> = (0..4u8)
        .map(|l| {
            let s = fx.b.ins().extractlane(c, l);
            fx.splat(s)
        })
        .collect();
    for e in (0..dp).step_by(4) {
        let mut acc = fx.load(F32X4, y, (e * 4) as i32);
        for (l, cv) in cs.iter().enumerate() {
            let xv = fx.load(F32X4, x, (l as i64 * stride + (e * 4) as i64) as i32);
            acc = fx.fmadd(*cv, xv, acc);
        }
        fx.store(acc, y, (e * 4) as i32);
    }
}

/// Write `d` f32 of scratch row `src` (times `mul`) into f32 result row `row` of `p`.
fn write_row(fx: &mut Fx, src: Value, p: Value, row: Value, d: u64, mul: Option<f32>) {
    let base = fx.b.ins().imul_imm_s(row, (d * 4) as i64);
    let dst = fx.b.ins().iadd(p, base);
    if d.is_multiple_of(4) {
        let m = mul.map(|m| fx.splat_c(m));
        for e in (0..d).step_by(4) {
            let x = fx.load(F32X4, src, (e * 4) as i32);
            let x = match m {
                Some(m) => fx.b.ins().fmul(x, m),
                None => x,
            };
            fx.store(x, dst, (e * 4) as i32);
        }
    } else {
        let m = mul.map(|m| fx.f32c(m));
        for e in 0..d {
            let x = fx.load(F32, src, (e * 4) as i32);
            let x = match m {
                Some(m) => fx.b.ins().fmul(x, m),
                None => x,
            };
            fx.store(x, dst, (e * 4) as i32);
        }
    }
}

pub fn emit(fx: &mut Fx, a: &BwdKernel, f: &Frame) {
    let fw = &a.fwd;
    let sc = a.scratch();
    let (tp, dp) = (sc.tp, sc.dp);
    let (tk, d, hk) = (fw.tk, fw.d, fw.hk);
    let g = a.group();
    let sl = a.slots();
    let q = arg(fx, f.args, 0);
    let k = arg(fx, f.args, 1);
    let v = arg(fx, f.args, 2);
    let c = sl.c.map(|s| arg(fx, f.args, s));
    let c_lo = sl.c_lo.map(|s| arg(fx, f.args, s));
    let start = sl.start.map(|s| arg(fx, f.args, s));
    let caps: Vec<(Value, CaptureCode)> =
        fw.captures.iter().enumerate().map(|(i, cc)| (arg(fx, f.args, sl.caps + i), cc.clone())).collect();
    let outp = arg(fx, f.args, sl.out);
    let lsep = arg(fx, f.args, sl.out + 1);
    let doutp = arg(fx, f.args, sl.out + 2);
    let dqp = arg(fx, f.args, sl.results);
    let dkp = arg(fx, f.args, sl.results + 1);
    let dvp = arg(fx, f.args, sl.results + 2);
    let dcp = fw.c.map(|_| arg(fx, f.args, sl.results + 3));
    let temp = (!a.float_caps.is_empty()).then(|| arg(fx, f.args, sl.temp));
    let (cap_sizes, cap_total) = a.cap_sizes();
    // Offset of each capture's partial sums inside a task's slice, by capture number.
    let mut cap_base = vec![None; fw.captures.len()];
    let mut acc = 0u64;
    for (n, &kk) in a.float_caps.iter().enumerate() {
        cap_base[kk] = Some(acc);
        acc += cap_sizes[n];
    }
    let scr = f.scratch;
    let ks = fx.b.ins().iadd_imm_s(scr, sc.k);
    let vs = fx.b.ins().iadd_imm_s(scr, sc.v);
    let dks = fx.b.ins().iadd_imm_s(scr, sc.dk);
    let dvs = fx.b.ins().iadd_imm_s(scr, sc.dv);
    let qss = fx.b.ins().iadd_imm_s(scr, sc.qs);
    let douts = fx.b.ins().iadd_imm_s(scr, sc.dout);
    let dqs = fx.b.ins().iadd_imm_s(scr, sc.dq);
    let cs = fx.b.ins().iadd_imm_s(scr, sc.c);
    let los = c_lo.map(|_| fx.b.ins().iadd_imm_s(scr, sc.lo));
    let rows_s = fx.b.ins().iadd_imm_s(scr, sc.rows);
    let cols_s = fx.b.ins().iadd_imm_s(scr, sc.cols);
    let row_bytes = (dp * 4) as i64;

    fx.for_range(f.begin, f.end, 1, |fx, task| {
        let bi = fx.b.ins().udiv_imm_s(task, hk as i64);
        let kh = fx.b.ins().urem_imm_s(task, hk as i64);
        // Stage K and V of kv head `task` (= b * Hk + kv head) as padded f32; zero dK, dV.
        zero_fill(fx, ks, tp * dp);
        zero_fill(fx, vs, tp * dp);
        zero_fill(fx, dks, tp * dp);
        zero_fill(fx, dvs, tp * dp);
        let kvrow0 = fx.b.ins().imul_imm_s(task, tk as i64);
        let z0 = fx.ic(0);
        let tv = fx.ic(tk as i64);
        fx.for_range(z0, tv, 1, |fx, j| {
            let row = fx.b.ins().iadd(kvrow0, j);
            let kd = fx.addr(ks, j, row_bytes);
            stage_row(fx, fw.k, k, row, d, dp, kd, None);
            let vd = fx.addr(vs, j, row_bytes);
            stage_row(fx, fw.v, v, row, d, dp, vd, None);
        });
        // This task's partial capture gradients start at zero.
        let tslice = temp.map(|tb| {
            let off = fx.b.ins().imul_imm_s(task, (cap_total * 4) as i64);
            let p = fx.b.ins().iadd(tb, off);
            let zf = fx.f32c(0.0);
            let n = fx.ic(cap_total as i64);
            let z0 = fx.ic(0);
            fx.for_range(z0, n, 1, |fx, e| {
                let a = fx.addr(p, e, 4);
                fx.store(zf, a, 0);
            });
            p
        });

        let bf = Bufs {
            q,
            c,
            c_lo,
            lsep,
            dqp,
            dcp,
            outp,
            doutp,
            start,
            caps: &caps,
            tslice,
            cap_base: &cap_base,
            ks,
            vs,
            dks,
            dvs,
            qss,
            douts,
            dqs,
            cs,
            los,
            rows_s,
            cols_s,
        };
        fx.for_n(0, g as i64, 1, |fx, gi| head_rows(fx, a, &sc, &bf, (bi, kh, gi)));
        // dK, dV of the kv head into the results.
        let z0 = fx.ic(0);
        let tv = fx.ic(tk as i64);
        fx.for_range(z0, tv, 1, |fx, j| {
            let row = fx.b.ins().iadd(kvrow0, j);
            let src = fx.addr(dks, j, row_bytes);
            write_row(fx, src, dkp, row, d, None);
            let src = fx.addr(dvs, j, row_bytes);
            write_row(fx, src, dvp, row, d, None);
        });
    });
}

/// The rows of query head `hq = kh * G + gi` of batch `bi` (the task is kv head `kh`): stage its
/// `c` (and `lo`), then per row its gradient terms (rows without kept keys have none: dq_i = 0),
/// then `dc`.
fn head_rows(fx: &mut Fx, a: &BwdKernel, sc: &Scratch, bf: &Bufs, (bi, kh, gi): (Value, Value, Value)) {
    let fw = &a.fwd;
    let (tp, dp) = (sc.tp, sc.dp);
    let (t, tk, d, h, bm, bn) = (fw.t, fw.tk, fw.d, fw.h, fw.bm, fw.bn);
    let g = a.group();
    let mt = fw.mt();
    // Query head hq = kh * G + gi of batch bi; its rows start at bh * Tq, its c at bh * Tk.
    let hq = fx.b.ins().imul_imm_s(kh, g as i64);
    let hq = fx.b.ins().iadd(hq, gi);
    let bh = fx.b.ins().imul_imm_s(bi, h as i64);
    let bh = fx.b.ins().iadd(bh, hq);
    let row0 = fx.b.ins().imul_imm_s(bh, t as i64);
    let crow0 = if tk == t { row0 } else { fx.b.ins().imul_imm_s(bh, tk as i64) };
    zero_fill(fx, bf.cs, tp);
    if let Some(lb) = bf.los {
        zero_fill(fx, lb, tp);
    }
    zero_fill(fx, bf.rows_s, tp);
    zero_fill(fx, bf.cols_s, tp);
    if let (Some(cp), Some(ct)) = (bf.c, fw.c) {
        let z0 = fx.ic(0);
        let tv = fx.ic(tk as i64);
        fx.for_range(z0, tv, 1, |fx, j| {
            let idx = fx.b.ins().iadd(crow0, j);
            let x = fx.load_f32(ct, cp, idx);
            let a = fx.addr(bf.cs, j, 4);
            fx.store(x, a, 0);
            if let (Some(lp), Some(lb)) = (bf.c_lo, bf.los) {
                let l = fx.load_f32(DType::F32, lp, idx);
                let a = fx.addr(lb, j, 4);
                fx.store(l, a, 0);
            }
        });
    }
    let z0 = fx.ic(0);
    let tv = fx.ic(t as i64);
    fx.for_range(z0, tv, 1, |fx, i| {
        let row = fx.b.ins().iadd(row0, i);
        zero_fill(fx, bf.dqs, dp);
        let lse = fx.load_f32(a.lse, bf.lsep, row);
        let ninf = fx.f32c(f32::NEG_INFINITY);
        let live = fx.b.ins().fcmp(FloatCC::NotEqual, lse, ninf);
        // A row without kept keys (lse = -inf) has P = 0: no gradient, dq_i = 0.
        fx.if_then(live, |fx| {
            let pos = if tk == t { i } else { fx.b.ins().iadd_imm_s(i, fw.offset() as i64) };
            row_body(fx, a, sc, RowCtx { bi, hq, bh, i, pos, row, lse }, bf, (mt, bm, bn));
        });
        write_row(fx, bf.dqs, bf.dqp, row, d, Some(fw.scale as f32));
    });
    // dc_p = (sum_j ds_ij) - (sum_j ds_jp) over this head's rows (row i at key position p) and
    // columns.
    if let Some(dcp) = bf.dcp {
        let z0 = fx.ic(0);
        let tv = fx.ic(tk as i64);
        fx.for_range(z0, tv, 1, |fx, i| {
            let ra = fx.addr(bf.rows_s, i, 4);
            let r = fx.load(F32, ra, 0);
            let ca = fx.addr(bf.cols_s, i, 4);
            let cc = fx.load(F32, ca, 0);
            let x = fx.b.ins().fsub(r, cc);
            let idx = fx.b.ins().iadd(crow0, i);
            fx.store_f32(DType::F32, dcp, idx, x);
        });
    }
}

/// Where one query row is.
struct RowCtx {
    bi: Value,
    hq: Value,
    bh: Value,
    i: Value,
    /// The row's key position `i + Tk - Tq` (its diagonal and its c).
    pos: Value,
    /// `bh * Tq + i`.
    row: Value,
    lse: Value,
}

/// Buffer and scratch addresses the kernel reads and writes.
#[derive(Clone, Copy)]
struct Bufs<'a> {
    q: Value,
    /// The decay operands, lse and the dq, dc results (read and written per query head).
    c: Option<Value>,
    c_lo: Option<Value>,
    lsep: Value,
    dqp: Value,
    dcp: Option<Value>,
    outp: Value,
    doutp: Value,
    start: Option<Value>,
    caps: &'a [(Value, CaptureCode)],
    tslice: Option<Value>,
    cap_base: &'a [Option<u64>],
    ks: Value,
    vs: Value,
    dks: Value,
    dvs: Value,
    qss: Value,
    douts: Value,
    dqs: Value,
    cs: Value,
    los: Option<Value>,
    rows_s: Value,
    cols_s: Value,
}

fn row_body(fx: &mut Fx, a: &BwdKernel, sc: &Scratch, r: RowCtx, bf: &Bufs, (mt, bm, bn): (u64, u64, u64)) {
    let fw = &a.fwd;
    let (d, dp) = (fw.d, sc.dp);
    let row_bytes = (dp * 4) as i64;
    stage_row(fx, fw.q, bf.q, r.row, d, dp, bf.qss, Some(fw.scale as f32));
    stage_row(fx, a.dout, bf.doutp, r.row, d, dp, bf.douts, None);
    // delta_i = dout_i . out_i
    let base = fx.b.ins().imul_imm_s(r.row, d as i64);
    let mut delta = fx.f32c(0.0);
    for e in 0..d {
        let idx = fx.b.ins().iadd_imm_s(base, e as i64);
        let o = fx.load_f32(a.out, bf.outp, idx);
        let go = fx.load(F32, bf.douts, (e * 4) as i32);
        delta = fx.fmadd(o, go, delta);
    }
    let delta_v = fx.splat(delta);
    let lse_v = fx.splat(r.lse);
    let (jlo, jhi) = key_range(fx, fw, &r, (bf.start, bf.caps), (mt, bm, bn));
    let jlo_v = {
        let x = fx.b.ins().fcvt_from_sint(F32, jlo);
        fx.splat(x)
    };
    let jhi_v = {
        let x = fx.b.ins().fcvt_from_sint(F32, jhi);
        fx.splat(x)
    };
    let ci = if fw.c.is_some() {
        let ca = fx.addr(bf.cs, r.pos, 4);
        let x = fx.load(F32, ca, 0);
        Some(fx.splat(x))
    } else {
        None
    };
    let li = bf.los.map(|lb| {
        let la = fx.addr(lb, r.pos, 4);
        let x = fx.load(F32, la, 0);
        fx.splat(x)
    });
    let rowsum = fx.b.declare_var(F32X4);
    let zv = fx.splat_c(0.0);
    fx.b.def_var(rowsum, zv);
    let j4 = fx.b.ins().band_imm_s(jlo, !3);
    fx.for_range(j4, jhi, 4, |fx, j0| {
        let at = Lanes { b: r.bi, h: r.hq, i: r.i, j0, aligned: true };
        let kr = fx.addr(bf.ks, j0, row_bytes);
        let vr = fx.addr(bf.vs, j0, row_bytes);
        // x = scale q_i . k_j and dp = dout_i . v_j on the four lanes.
        let x = dot4(fx, bf.qss, kr, row_bytes, dp);
        let dpv = dot4(fx, bf.douts, vr, row_bytes, dp);
        let mut s = match &fw.score {
            Some(rc) => region::emit(fx, rc, bf.caps, &at, x),
            None => x,
        };
        if let Some(ci) = ci {
            let cja = fx.addr(bf.cs, j0, 4);
            let cj = fx.load(F32X4, cja, 0);
            let mut bias = fx.b.ins().fsub(ci, cj);
            if let (Some(li), Some(lb)) = (li, bf.los) {
                // decay(pair): (c_i - c_j) + (lo_i - lo_j), as the forward.
                let lja = fx.addr(lb, j0, 4);
                let lj = fx.load(F32X4, lja, 0);
                let dl = fx.b.ins().fsub(li, lj);
                bias = fx.b.ins().fadd(bias, dl);
            }
            s = fx.b.ins().fadd(s, bias);
        }
        // Kept lanes: jlo <= j < jhi, and the expression mask.
        let jf = fx.b.ins().fcvt_from_sint(F32, j0);
        let jf = fx.splat(jf);
        let lanes = fx.vconst4([0.0, 1.0, 2.0, 3.0]);
        let jv = fx.b.ins().fadd(jf, lanes);
        let ge = fx.b.ins().fcmp(FloatCC::GreaterThanOrEqual, jv, jlo_v);
        let lt = fx.b.ins().fcmp(FloatCC::LessThan, jv, jhi_v);
        let mut ok = fx.b.ins().band(ge, lt);
        if let Some(mc) = &fw.mask {
            let x0 = fx.splat_c(0.0);
            let keep = region::emit(fx, mc, bf.caps, &at, x0);
            let ok2 = fx.b.ins().fcmp(FloatCC::NotEqual, keep, x0);
            ok = fx.b.ins().band(ok, ok2);
        }
        let zero = fx.splat_c(0.0);
        let e = fx.b.ins().fsub(s, lse_v);
        let hi = fx.splat_c(88.0);
        let e = fx.b.ins().fmin(e, hi);
        let p = fx.vexp(e);
        let p = fx.vsel(ok, p, zero);
        let dpd = fx.b.ins().fsub(dpv, delta_v);
        let ds = fx.b.ins().fmul(p, dpd);
        let ds = fx.vsel(ok, ds, zero);
        let dx = match &a.dx {
            Some(rc) => {
                let dr = region::emit(fx, rc, bf.caps, &at, x);
                let dx = fx.b.ins().fmul(ds, dr);
                fx.vsel(ok, dx, zero)
            }
            None => ds,
        };
        let rs = fx.b.use_var(rowsum);
        let rs = fx.b.ins().fadd(rs, ds);
        fx.b.def_var(rowsum, rs);
        let cola = fx.addr(bf.cols_s, j0, 4);
        let col = fx.load(F32X4, cola, 0);
        let col = fx.b.ins().fadd(col, ds);
        fx.store(col, cola, 0);
        // dv_j += p dout_i, dk_j += dx (scale q_i), dq_i += dx k_j (keys in order).
        let dvr = fx.addr(bf.dvs, j0, row_bytes);
        axpy4(fx, p, bf.douts, dvr, row_bytes, dp);
        let dkr = fx.addr(bf.dks, j0, row_bytes);
        axpy4(fx, dx, bf.qss, dkr, row_bytes, dp);
        gemv4(fx, dx, kr, row_bytes, bf.dqs, dp);
        if let Some(ts) = bf.tslice {
            capture_grads(fx, a, bf, ts, &at, (x, ds, ok));
        }
    });
    let rs = fx.b.use_var(rowsum);
    let rs = fx.hsum(rs);
    let ra = fx.addr(bf.rows_s, r.pos, 4);
    fx.store(rs, ra, 0);
}

/// Row `r`'s key range `[jlo, jhi)`: the mask's, raised to pruning's first kept tile, exactly
/// as the forward kernel keeps tiles, then to the row's key bound (`keys_from`).
fn key_range(
    fx: &mut Fx,
    fw: &AttnKernel,
    r: &RowCtx,
    (start, caps): (Option<Value>, &[(Value, CaptureCode)]),
    (mt, bm, bn): (u64, u64, u64),
) -> (Value, Value) {
    let (t, tk) = (fw.t, fw.tk);
    let i1 = fx.b.ins().iadd_imm_s(r.pos, 1);
    let jhi = if fw.causal { i1 } else { fx.ic(tk as i64) };
    let mut jlo = fx.ic(0);
    if let Some(w) = fw.window {
        let w = w.min(i64::MAX as u64 / 4) as i64;
        let lo = fx.b.ins().iadd_imm_s(i1, -w);
        let zero = fx.ic(0);
        jlo = fx.imax(lo, zero);
    }
    if let Some(sp) = start {
        let m = fx.b.ins().udiv_imm_s(r.i, bm as i64);
        let idx = fx.b.ins().imul_imm_s(r.bh, mt as i64);
        let idx = fx.b.ins().iadd(idx, m);
        let sa = fx.addr(sp, idx, 4);
        let s32 = fx.load(cranelift_codegen::ir::types::I32, sa, 0);
        let s = fx.b.ins().sextend(I64, s32);
        let zero = fx.ic(0);
        let s = fx.imax(s, zero);
        // The forward's last key tile of this query tile.
        let diag = if fw.causal {
            let i0 = fx.b.ins().imul_imm_s(m, bm as i64);
            let last = fx.b.ins().iadd_imm_s(i0, bm as i64 - 1);
            let tl = fx.ic(t as i64 - 1);
            let last = fx.imin(last, tl);
            let last = if tk == t { last } else { fx.b.ins().iadd_imm_s(last, fw.offset() as i64) };
            fx.b.ins().udiv_imm_s(last, bn as i64)
        } else {
            fx.ic(((tk - 1) / bn) as i64)
        };
        let s = fx.imin(s, diag);
        let s = fx.b.ins().imul_imm_s(s, bn as i64);
        jlo = fx.imax(jlo, s);
    }
    if let Some(e) = &fw.keys_from {
        // Every key j < E_i of this row is masked (P = 0, no gradient), so its walk starts at
        // floor(E_i), clamped to [0, jhi]; the forward started at the tile of its query tile's
        // smallest E, at or below it. A NaN E_i masks the whole row: its lse is -inf and it
        // does not get here (a NaN compares false: the clamp gives 0, the walk stays whole).
        let ei = region::emit_row(fx, e, caps, (r.bi, r.hq, r.i));
        let zf = fx.f32c(0.0);
        let ei = fx.fmax_s(ei, zf);
        let hi = fx.b.ins().fcvt_from_sint(F32, jhi);
        let ei = fx.fmin_s(ei, hi);
        let ej = fx.b.ins().fcvt_to_sint_sat(I64, ei);
        jlo = fx.imax(jlo, ej);
    }
    (jlo, jhi)
}

/// The captured tensors' gradients of the four lanes at `at`: `ds * dR/d(read)` added to this
/// task's partial sums `ts` where the read is in range and the lane kept (`ok`).
fn capture_grads(
    fx: &mut Fx,
    a: &BwdKernel,
    bf: &Bufs,
    ts: Value,
    at: &Lanes,
    (x, ds, ok): (Value, Value, Value),
) {
    let fw = &a.fwd;
    for cg in &a.cap_grads {
        let Some(base) = bf.cap_base[cg.k] else { continue };
        let local = region::emit(fx, &cg.local, bf.caps, at, x);
        let contrib = fx.b.ins().fmul(ds, local);
        let shape = fw.captures[cg.k].shape.clone();
        for l in 0..4u8 {
            let (inr, off) = region::capture_offset(fx, &shape, &cg.index, &cg.subs, at, l);
            let okl = fx.b.ins().extractlane(ok, l);
            let okl = fx.b.ins().icmp_imm_s(IntCC::NotEqual, okl, 0);
            let both = fx.b.ins().band(inr, okl);
            fx.if_then(both, |fx| {
                let cl = fx.b.ins().extractlane(contrib, l);
                let off = fx.b.ins().iadd_imm_s(off, base as i64);
                let pa = fx.addr(ts, off, 4);
                let old = fx.load(F32, pa, 0);
                let new = fx.b.ins().fadd(old, cl);
                fx.store(new, pa, 0);
            });
        }
    }
}

/// Add the tasks' partial capture gradients in task order into the capture results.
pub fn emit_finish(fx: &mut Fx, a: &BwdKernel, f: &Frame) {
    let sl = a.slots();
    let (sizes, total) = a.cap_sizes();
    let tasks = a.tasks_count();
    let temp = arg(fx, f.args, sl.temp);
    let first = sl.results + 3 + a.fwd.c.is_some() as usize;
    let mut base = 0u64;
    for (n, &size) in sizes.iter().enumerate() {
        let dst = arg(fx, f.args, first + n);
        let z0 = fx.ic(0);
        let nv = fx.ic(size as i64);
        fx.for_range(z0, nv, 1, |fx, e| {
            let sum = fx.b.declare_var(F32);
            let zf = fx.f32c(0.0);
            fx.b.def_var(sum, zf);
            fx.for_n(0, tasks as i64, 1, |fx, tk| {
                let off = fx.b.ins().imul_imm_s(tk, total as i64);
                let off = fx.b.ins().iadd(off, e);
                let off = fx.b.ins().iadd_imm_s(off, base as i64);
                let pa = fx.addr(temp, off, 4);
                let x = fx.load(F32, pa, 0);
                let s = fx.b.use_var(sum);
                let s = fx.b.ins().fadd(s, x);
                fx.b.def_var(sum, s);
            });
            let s = fx.b.use_var(sum);
            fx.store_f32(DType::F32, dst, e, s);
        });
        base += size;
    }
}
