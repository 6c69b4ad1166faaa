//! Cranelift code for an attention score region (docs/SEMANTICS.md, "attention"), evaluated on
//! four key columns at once (f32x4 lanes `j0 .. j0 + 4` of one query row `i`). One emitter per
//! `RNode`, translating the node one to one; the f64 interpreter
//! (`foxc_ir::interp::region`) is the reference it is tested against.

use super::emit::{Fx, F32};
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{InstBuilder, Value};
use foxc_ir::attention::{IndexVar, RNode, Region};
use foxc_ir::index::IndexExpr;
use foxc_ir::{BinaryOp, DType, UnaryOp};

use crate::capture_index::contiguous_in_j;
pub use crate::capture_index::SubConsts;

/// A region prepared for one compiled program: dims resolved to numbers.
#[derive(Clone, Debug)]
pub struct RegionCode {
    pub region: Region,
    /// The value of each `RNode::Dim` (by node position), and the dim-dependent parts of each
    /// capture subscript, by node position then axis.
    pub dims: Vec<f32>,
    pub subs: Vec<Vec<SubConsts>>,
}

/// A captured tensor as the kernel reads it.
#[derive(Clone, Debug)]
pub struct CaptureCode {
    pub dtype: DType,
    pub shape: Vec<u64>,
}

impl RegionCode {
    /// Resolve the dims of `r`; `Err` names what the CPU kernel cannot evaluate.
    pub fn new(r: &Region, dim: &dyn Fn(&foxc_ir::Dim) -> Option<u64>) -> Result<RegionCode, String> {
        let mut dims = vec![0.0; r.nodes.len()];
        let mut subs = vec![vec![]; r.nodes.len()];
        for (n, node) in r.nodes.iter().enumerate() {
            match node {
                RNode::Dim(d) => dims[n] = dim(d).ok_or_else(|| format!("dim {d} is not bound"))? as f32,
                RNode::Capture { index, .. } => {
                    for e in index {
                        subs[n].push(SubConsts::resolve(e, dim)?);
                    }
                }
                _ => {}
            }
        }
        Ok(RegionCode { region: r.clone(), dims, subs })
    }
}

/// Where the lanes are: the entry's `b`, `h`, `i` (i64) and the first lane's `j` (i64).
pub struct Lanes {
    pub b: Value,
    pub h: Value,
    pub i: Value,
    pub j0: Value,
    /// `j0` is a multiple of 4 (the caller's promise): a capture read along `j` whose four
    /// elements are all in its axis or all outside it is then one vector load ([`capture`]).
    pub aligned: bool,
}

/// The value (f32) at row `(b, h, i)` of a region that reads neither `j` nor the score, such as
/// an attention's key bound `keys_from`.
pub fn emit_row(
    fx: &mut Fx,
    rc: &RegionCode,
    caps: &[(Value, CaptureCode)],
    (b, h, i): (Value, Value, Value),
) -> Value {
    let j0 = fx.ic(0);
    let x0 = fx.splat_c(0.0);
    let lanes = emit(fx, rc, caps, &Lanes { b, h, i, j0, aligned: true }, x0);
    fx.b.ins().extractlane(lanes, 0)
}

/// The region's value on the four lanes, with `x` (f32x4) the scaled products.
pub fn emit(fx: &mut Fx, rc: &RegionCode, caps: &[(Value, CaptureCode)], at: &Lanes, x: Value) -> Value {
    let mut vals: Vec<Value> = Vec::with_capacity(rc.region.nodes.len());
    let counts = rc.region.counts();
    for (n, node) in rc.region.nodes.iter().enumerate() {
        let v = |k: u32| vals[k as usize];
        let count_product = rc.region.count_product(node, &counts);
        let val = match node {
            RNode::Score => x,
            RNode::Index(IndexVar::J) => {
                let j = fx.b.ins().fcvt_from_sint(F32, at.j0);
                let j = fx.splat(j);
                let lanes = fx.vconst4([0.0, 1.0, 2.0, 3.0]);
                fx.b.ins().fadd(j, lanes)
            }
            RNode::Index(var) => {
                let s = match var {
                    IndexVar::B => at.b,
                    IndexVar::H => at.h,
                    _ => at.i,
                };
                let f = fx.b.ins().fcvt_from_sint(F32, s);
                fx.splat(f)
            }
            RNode::Dim(_) => fx.splat_c(rc.dims[n]),
            RNode::Const(c) => fx.splat_c(*c as f32),
            RNode::Capture { k, index } => capture(fx, &caps[*k], index, &rc.subs[n], at),
            RNode::Unary(u, a) => unary(fx, *u, v(*a)),
            // `x * n` with a count n: 0 where n = 0 even for an infinite x (the interpreter's
            // rule, docs/SEMANTICS.md).
            RNode::Binary(..) if count_product.is_some() => {
                let (xk, nk) = count_product.unwrap_or_default();
                let (xv, nv) = (v(xk), v(nk));
                let p = fx.b.ins().fmul(xv, nv);
                let z = fx.splat_c(0.0);
                let inf = fx.splat_c(f32::INFINITY);
                let ax = fx.b.ins().fabs(xv);
                let is_inf = fx.b.ins().fcmp(FloatCC::Equal, ax, inf);
                let n0 = fx.b.ins().fcmp(FloatCC::Equal, nv, z);
                let m = fx.b.ins().band(is_inf, n0);
                fx.vsel(m, z, p)
            }
            RNode::Binary(op, a, b) => binary(fx, *op, v(*a), v(*b)),
            RNode::Select(c, a, b) => {
                let z = fx.splat_c(0.0);
                let m = fx.b.ins().fcmp(FloatCC::NotEqual, v(*c), z);
                fx.vsel(m, v(*a), v(*b))
            }
        };
        vals.push(val);
    }
    vals[rc.region.root as usize]
}

fn unary(fx: &mut Fx, u: UnaryOp, a: Value) -> Value {
    match u {
        UnaryOp::Neg => fx.b.ins().fneg(a),
        UnaryOp::Abs => fx.b.ins().fabs(a),
        UnaryOp::Sqrt => fx.b.ins().sqrt(a),
        UnaryOp::Exp => {
            let hi = fx.splat_c(88.0);
            let a = fx.b.ins().fmin(a, hi);
            fx.vexp(a)
        }
        // tanh(a) = 1 - 2 / (exp(2a) + 1), with 2a clamped where tanh is +-1 in f32 anyway.
        UnaryOp::Tanh => {
            let two = fx.splat_c(2.0);
            let a2 = fx.b.ins().fmul(a, two);
            let hi = fx.splat_c(40.0);
            let lo = fx.splat_c(-40.0);
            let a2 = fx.b.ins().fmin(a2, hi);
            let a2 = fx.b.ins().fmax(a2, lo);
            let e = fx.vexp(a2);
            let one = fx.splat_c(1.0);
            let d = fx.b.ins().fadd(e, one);
            let q = fx.b.ins().fdiv(two, d);
            fx.b.ins().fsub(one, q)
        }
        UnaryOp::Sigmoid => {
            let na = fx.b.ins().fneg(a);
            let hi = fx.splat_c(80.0);
            let na = fx.b.ins().fmin(na, hi);
            let e = fx.vexp(na);
            let one = fx.splat_c(1.0);
            let d = fx.b.ins().fadd(e, one);
            fx.b.ins().fdiv(one, d)
        }
        UnaryOp::Relu => {
            let z = fx.splat_c(0.0);
            fx.b.ins().fmax(a, z)
        }
        // The rest through region_math (matching the interpreter to a few ulps).
        UnaryOp::Log => fx.vlog(a),
        UnaryOp::Log2 => {
            let l = fx.vlog(a);
            let k = fx.splat_c(std::f32::consts::LOG2_E);
            fx.b.ins().fmul(l, k)
        }
        UnaryOp::Exp2 => fx.vexp2(a),
        UnaryOp::Rsqrt => {
            let s = fx.b.ins().sqrt(a);
            let one = fx.splat_c(1.0);
            fx.b.ins().fdiv(one, s)
        }
        // softplus a = max(a, 0) + log(1 + e^-|a|), logsigmoid a = min(a, 0) - log(1 + e^-|a|)
        // (no overflow for large |a|; NaN stays NaN).
        UnaryOp::Softplus => {
            let z = fx.splat_c(0.0);
            let m = fx.b.ins().fmax(a, z);
            let l = fx.vlog1p_exp_neg_abs(a);
            fx.b.ins().fadd(m, l)
        }
        UnaryOp::LogSigmoid => {
            let z = fx.splat_c(0.0);
            let m = fx.b.ins().fmin(a, z);
            let l = fx.vlog1p_exp_neg_abs(a);
            fx.b.ins().fsub(m, l)
        }
        UnaryOp::Silu => {
            let s = unary(fx, UnaryOp::Sigmoid, a);
            fx.b.ins().fmul(a, s)
        }
    }
}

fn binary(fx: &mut Fx, op: BinaryOp, a: Value, b: Value) -> Value {
    let cmp = |cc: FloatCC| Some(cc);
    let cc = match op {
        BinaryOp::Add => return fx.b.ins().fadd(a, b),
        BinaryOp::Sub => return fx.b.ins().fsub(a, b),
        BinaryOp::Mul => return fx.b.ins().fmul(a, b),
        BinaryOp::Div => return fx.b.ins().fdiv(a, b),
        BinaryOp::Min => return fx.b.ins().fmin(a, b),
        BinaryOp::Max => return fx.b.ins().fmax(a, b),
        BinaryOp::Lt => cmp(FloatCC::LessThan),
        BinaryOp::Le => cmp(FloatCC::LessThanOrEqual),
        BinaryOp::Gt => cmp(FloatCC::GreaterThan),
        BinaryOp::Ge => cmp(FloatCC::GreaterThanOrEqual),
        BinaryOp::Eq => cmp(FloatCC::Equal),
        BinaryOp::Ne => cmp(FloatCC::NotEqual),
    };
    let m = fx.b.ins().fcmp(cc.expect("comparison"), a, b);
    let one = fx.splat_c(1.0);
    let zero = fx.splat_c(0.0);
    fx.vsel(m, one, zero)
}

/// Lane-wise read of a captured tensor at `index`; NaN where the index is out of range (as the
/// interpreter defines it). A subscript without `j` reads one element for all four lanes; a
/// float tensor read along its last axis at `j + c` (`j` nowhere else, no division or clamp)
/// whose groups of four cannot straddle that axis' ends (`c` and the axis' size multiples of 4,
/// `j0` aligned) is one vector load, NaN when the group is outside.
fn capture(
    fx: &mut Fx,
    cap: &(Value, CaptureCode),
    index: &[IndexExpr],
    subs: &[SubConsts],
    at: &Lanes,
) -> Value {
    let (ptr, cc) = cap;
    // The same element on every lane (a per-head slope, a per-row bias), or four consecutive
    // ones: lane 0's subscript decides for all four.
    let uniform = !index.iter().any(|e| e.terms.iter().any(|(v, _)| v == IndexVar::J.name()));
    let along_j = cc.shape.last().is_some_and(|&n| contiguous_in_j(index, subs, n, 4));
    if uniform || (at.aligned && cc.dtype.is_float() && along_j) {
        let (ok, off) = capture_offset(fx, &cc.shape, index, subs, at, 0);
        let zero = fx.ic(0);
        let safe = fx.b.ins().select(ok, off, zero);
        if uniform {
            let x = fx.load_f32(cc.dtype, *ptr, safe);
            let nan = fx.f32c(f32::NAN);
            let x = fx.b.ins().select(ok, x, nan);
            return fx.splat(x);
        }
        let x = fx.load4_f32(cc.dtype, *ptr, safe);
        let nan = fx.splat_c(f32::NAN);
        return fx.b.ins().select(ok, x, nan);
    }
    let mut out = fx.splat_c(f32::NAN);
    for lane in 0..4u8 {
        let (ok, off) = capture_offset(fx, &cc.shape, index, subs, at, lane);
        let zero = fx.ic(0);
        let safe = fx.b.ins().select(ok, off, zero);
        let x = fx.load_f32(cc.dtype, *ptr, safe);
        let nan = fx.f32c(f32::NAN);
        let x = fx.b.ins().select(ok, x, nan);
        out = fx.b.ins().insertlane(out, x, lane);
    }
    out
}

/// Where lane `lane` reads a captured tensor of `shape` at `index`: (in range (i8 truth),
/// row-major element offset). The one definition of a capture subscript, shared by the
/// forward's reads and the backward's capture gradients.
pub fn capture_offset(
    fx: &mut Fx,
    shape: &[u64],
    index: &[IndexExpr],
    subs: &[SubConsts],
    at: &Lanes,
    lane: u8,
) -> (Value, Value) {
    let j = fx.b.ins().iadd_imm_s(at.j0, lane as i64);
    let mut off = fx.ic(0);
    let mut ok = fx.b.ins().iconst(cranelift_codegen::ir::types::I8, 1);
    for ((e, &n), sc) in index.iter().zip(shape).zip(subs) {
        let mut p = fx.ic(sc.offset);
        for (var, coef) in &e.terms {
            let x = match IndexVar::from_name(var) {
                Some(IndexVar::B) => at.b,
                Some(IndexVar::H) => at.h,
                Some(IndexVar::I) => at.i,
                _ => j,
            };
            let t = fx.b.ins().imul_imm_s(x, *coef);
            p = fx.b.ins().iadd(p, t);
        }
        if let Some(d) = sc.div {
            // Floor division: shift negative numerators down by d - 1 first.
            let neg = fx.b.ins().icmp_imm_s(IntCC::SignedLessThan, p, 0);
            let adj = fx.b.ins().iadd_imm_s(p, -(d - 1));
            let p2 = fx.b.ins().select(neg, adj, p);
            p = fx.b.ins().sdiv_imm_s(p2, d);
        }
        for &(kind, b) in &sc.clamps {
            let b = fx.ic(b);
            p = match kind {
                foxc_ir::index::ClampKind::Min => fx.imin(p, b),
                foxc_ir::index::ClampKind::Max => fx.imax(p, b),
            };
        }
        let ge0 = fx.b.ins().icmp_imm_s(IntCC::SignedGreaterThanOrEqual, p, 0);
        let lt = fx.b.ins().icmp_imm_s(IntCC::SignedLessThan, p, n as i64);
        let in_range = fx.b.ins().band(ge0, lt);
        ok = fx.b.ins().band(ok, in_range);
        let scaled = fx.b.ins().imul_imm_s(off, n as i64);
        off = fx.b.ins().iadd(scaled, p);
    }
    (ok, off)
}
