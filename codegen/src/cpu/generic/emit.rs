//! CLIF of a generic kernel: for each task (one line of the iteration space), the outer indices
//! from the task number, one base offset per buffer, then the body's loops along the line.
//! Arithmetic is f64; loads widen from the buffer's dtype, stores round to the result's dtype.

use super::math::{dtype_code, unary_code, Helper};
use super::{Body, Expr, Generic, Src, Sub};
use crate::cpu::emit::{Fx, F32, F64, I32, I64};
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{types, FuncRef, InstBuilder, MemFlagsData, Value};
use foxc_ir::{BinaryOp, DType, ReduceKind, UnaryOp, LOG_F_FLOOR};

impl Generic {
    /// Which helpers of [`Helper::ALL`] the kernel calls (only those get declared).
    pub fn helpers(&self) -> [bool; 4] {
        let mut h = [false; 4];
        fn walk(e: &Expr, h: &mut [bool; 4]) {
            match e {
                Expr::Unary(u, x) => {
                    if *u != UnaryOp::Neg {
                        h[Helper::Unary.index()] = true;
                    }
                    walk(x, h);
                }
                Expr::Cast(d, x) => {
                    if matches!(d, DType::BF16 | DType::F16) {
                        h[Helper::Cast.index()] = true;
                    }
                    walk(x, h);
                }
                Expr::Binary(_, x, y) => {
                    walk(x, h);
                    walk(y, h);
                }
                Expr::Select(c, x, y) => {
                    walk(c, h);
                    walk(x, h);
                    walk(y, h);
                }
                Expr::Mask { x, .. } => walk(x, h),
                Expr::In(_) | Expr::Index(_) | Expr::Const(_) | Expr::Scalar(_) => {}
            }
        }
        walk(&self.value, &mut h);
        if self.body == Body::Softmax {
            h[Helper::Unary.index()] = true;
        }
        let f16_in = self
            .inputs
            .iter()
            .any(|s| matches!(s, Src::Buf { dtype: DType::F16, .. } | Src::Gather { dtype: DType::F16, .. }));
        h[Helper::F16ToF64.index()] = f16_in;
        h[Helper::F64ToF16.index()] = self.out_dtype == DType::F16;
        h
    }
}

/// The state of one task: pointers, outer indices, base offsets.
struct Line<'k> {
    k: &'k Generic,
    helpers: &'k [Option<FuncRef>; 4],
    ptrs: Vec<Option<Value>>,
    /// Index along each outer iteration axis (the line axis is the loop variable).
    idx: Vec<Value>,
    bases: Vec<Option<Value>>,
    out: Value,
    out_base: Value,
}

fn mem() -> MemFlagsData {
    MemFlagsData::new().with_notrap()
}

/// Emit the kernel body (the caller created the entry block and returns after it).
pub fn emit(fx: &mut Fx, k: &Generic, args: Value, begin: Value, end: Value, helpers: &[Option<FuncRef>; 4]) {
    let r = k.sizes.len();
    let line = r - 1;
    let ptrs: Vec<Option<Value>> = k
        .inputs
        .iter()
        .map(|s| match s {
            Src::Buf { arg, .. } | Src::Gather { arg, .. } => Some(fx.load(I64, args, (8 * arg) as i32)),
            Src::Const(_) => None,
        })
        .collect();
    let out = fx.load(I64, args, (8 * k.out_arg) as i32);
    fx.for_range(begin, end, 1, |fx, task| {
        // Outer indices, innermost first; a zero size has no tasks, so never divides.
        let mut idx = vec![task; line];
        let mut rest = task;
        for a in (0..line).rev() {
            let s = k.sizes[a].max(1) as i64;
            idx[a] = fx.b.ins().urem_imm_s(rest, s);
            rest = fx.b.ins().udiv_imm_s(rest, s);
        }
        let base_of = |fx: &mut Fx, strides: &[i64]| {
            let mut b = fx.ic(0);
            for (a, &i) in idx.iter().enumerate() {
                if strides[a] != 0 {
                    let t = fx.b.ins().imul_imm_s(i, strides[a]);
                    b = fx.b.ins().iadd(b, t);
                }
            }
            b
        };
        let bases: Vec<Option<Value>> = k
            .inputs
            .iter()
            .map(|s| match s {
                Src::Buf { strides, .. } => Some(base_of(fx, strides)),
                Src::Const(_) | Src::Gather { .. } => None,
            })
            .collect();
        let out_base = base_of(fx, &k.out_strides);
        let ln = Line { k, helpers, ptrs: ptrs.clone(), idx, bases, out, out_base };
        match &k.body {
            Body::Map => fx.for_n(0, k.line() as i64, 1, |fx, t| {
                let v = ln.eval(fx, &k.value, t);
                ln.store(fx, t, v);
            }),
            Body::Reduce(kind) => {
                let acc = fx.b.declare_var(F64);
                let init = fx.f64c(if *kind == ReduceKind::Sum { 0.0 } else { f64::NEG_INFINITY });
                fx.b.def_var(acc, init);
                fx.for_n(0, k.line() as i64, 1, |fx, t| {
                    let v = ln.eval(fx, &k.value, t);
                    let a = fx.b.use_var(acc);
                    // `fmax` propagates NaN, as the interpreter's reduce_max does.
                    let a =
                        if *kind == ReduceKind::Sum { fx.b.ins().fadd(a, v) } else { fx.b.ins().fmax(a, v) };
                    fx.b.def_var(acc, a);
                });
                let a = fx.b.use_var(acc);
                let zero = fx.ic(0);
                ln.store(fx, zero, a);
            }
            Body::Cumsum { reverse } => {
                let acc = fx.b.declare_var(F64);
                let init = fx.f64c(0.0);
                fx.b.def_var(acc, init);
                let last = k.line() as i64 - 1;
                fx.for_n(0, k.line() as i64, 1, |fx, t| {
                    let t = if *reverse {
                        let end = fx.ic(last);
                        fx.b.ins().isub(end, t)
                    } else {
                        t
                    };
                    let v = ln.eval(fx, &k.value, t);
                    let (ninf, floor) = (fx.f64c(f64::NEG_INFINITY), fx.f64c(LOG_F_FLOOR));
                    let reset = fx.b.ins().fcmp(FloatCC::Equal, v, ninf);
                    let v = fx.b.ins().select(reset, floor, v);
                    let a = fx.b.use_var(acc);
                    let a = fx.b.ins().fadd(a, v);
                    fx.b.def_var(acc, a);
                    ln.store(fx, t, a);
                });
            }
            Body::Softmax => ln.softmax(fx),
            Body::RmsNorm { w, eps } => ln.rmsnorm(fx, *w, *eps),
        }
    });
}

impl Line<'_> {
    fn call(&self, fx: &mut Fx, h: Helper, args: &[Value]) -> Value {
        let f = self.helpers[h.index()].expect("helper declared for this kernel");
        let c = fx.b.ins().call(f, args);
        fx.b.inst_results(c)[0]
    }

    /// Element offset of input or output buffer with `base` and line stride `s` at line index `t`.
    fn offset(fx: &mut Fx, base: Value, s: i64, t: Value) -> Value {
        if s == 0 {
            return base;
        }
        let o = fx.b.ins().imul_imm_s(t, s);
        fx.b.ins().iadd(base, o)
    }

    /// Load element `off` of a `dt` buffer, widened to f64.
    fn load(&self, fx: &mut Fx, dt: DType, p: Value, off: Value) -> Value {
        match dt {
            DType::F32 | DType::BF16 => fx.load_f64(dt, p, off),
            DType::I32 => {
                let a = fx.addr(p, off, 4);
                let x = fx.load(I32, a, 0);
                fx.b.ins().fcvt_from_sint(F64, x)
            }
            DType::I64 => {
                unreachable!("i64 is only a parameter's storage: the verifier keeps it out of graphs")
            }
            DType::Bool => {
                let a = fx.b.ins().iadd(p, off);
                let x = fx.b.ins().uload8(I32, mem(), a, 0);
                fx.b.ins().fcvt_from_uint(F64, x)
            }
            DType::F16 => {
                let a = fx.addr(p, off, 2);
                let x = fx.b.ins().uload16(I32, mem(), a, 0);
                self.call(fx, Helper::F16ToF64, &[x])
            }
        }
    }

    /// Store f64 `v` as result element at line index `t`, rounded to the result dtype.
    fn store(&self, fx: &mut Fx, t: Value, v: Value) {
        let k = self.k;
        let off = Self::offset(fx, self.out_base, k.out_strides[k.sizes.len() - 1], t);
        let p = self.out;
        match k.out_dtype {
            DType::F32 | DType::BF16 => {
                let x = fx.b.ins().fdemote(F32, v);
                fx.store_f32(k.out_dtype, p, off, x);
            }
            DType::I32 => {
                let x = fx.b.ins().fcvt_to_sint_sat(I32, v);
                let a = fx.addr(p, off, 4);
                fx.store(x, a, 0);
            }
            DType::I64 => {
                unreachable!("i64 is only a parameter's storage: the verifier keeps it out of graphs")
            }
            DType::Bool => {
                let zero = fx.f64c(0.0);
                let c = fx.b.ins().fcmp(FloatCC::NotEqual, v, zero);
                let a = fx.b.ins().iadd(p, off);
                fx.b.ins().store(mem(), c, a, 0);
            }
            DType::F16 => {
                let x = self.call(fx, Helper::F64ToF16, &[v]);
                let a = fx.addr(p, off, 2);
                fx.b.ins().istore16(mem(), x, a, 0);
            }
        }
    }

    /// The index along iteration axis `a` (the line's loop variable `t` for the last axis).
    fn index(&self, a: usize, t: Value) -> Value {
        if a + 1 == self.k.sizes.len() {
            t
        } else {
            self.idx[a]
        }
    }

    fn eval(&self, fx: &mut Fx, e: &Expr, t: Value) -> Value {
        match e {
            Expr::In(i) => match &self.k.inputs[*i] {
                Src::Const(c) => fx.f64c(*c),
                Src::Buf { dtype, strides, .. } => {
                    let base = self.bases[*i].expect("buffer input has a base");
                    let off = Self::offset(fx, base, strides[strides.len() - 1], t);
                    let p = self.ptrs[*i].expect("buffer input has a pointer");
                    self.load(fx, *dtype, p, off)
                }
                Src::Gather { dtype, subs, sizes, strides, .. } => {
                    let p = self.ptrs[*i].expect("gather input has a pointer");
                    self.gather(fx, *dtype, p, subs, sizes, strides, t)
                }
            },
            Expr::Index(a) => {
                let i = self.index(*a, t);
                fx.b.ins().fcvt_from_sint(F64, i)
            }
            Expr::Const(c) => fx.f64c(*c),
            Expr::Scalar(k) => fx.f64c(self.k.scalars[*k] as f64),
            Expr::Unary(UnaryOp::Neg, x) => {
                let x = self.eval(fx, x, t);
                fx.b.ins().fneg(x)
            }
            Expr::Unary(u, x) => {
                let x = self.eval(fx, x, t);
                let code = fx.ic(unary_code(*u));
                self.call(fx, Helper::Unary, &[code, x])
            }
            Expr::Binary(b, x, y) => {
                let x = self.eval(fx, x, t);
                let y = self.eval(fx, y, t);
                binary(fx, *b, x, y)
            }
            Expr::Select(c, x, y) => {
                let c = self.eval(fx, c, t);
                let x = self.eval(fx, x, t);
                let y = self.eval(fx, y, t);
                let zero = fx.f64c(0.0);
                // Non-zero (NaN included) takes `x`, as the interpreter's `!= 0.0`.
                let nz = fx.b.ins().fcmp(FloatCC::NotEqual, c, zero);
                fx.b.ins().select(nz, x, y)
            }
            Expr::Cast(d, x) => {
                let x = self.eval(fx, x, t);
                match d {
                    DType::F32 => {
                        let r = fx.b.ins().fdemote(F32, x);
                        fx.b.ins().fpromote(F64, r)
                    }
                    DType::I32 => {
                        let r = fx.b.ins().fcvt_to_sint_sat(I32, x);
                        fx.b.ins().fcvt_from_sint(F64, r)
                    }
                    DType::I64 => {
                        unreachable!("i64 is only a parameter's storage: the verifier keeps it out of graphs")
                    }
                    DType::Bool => {
                        let zero = fx.f64c(0.0);
                        let c = fx.b.ins().fcmp(FloatCC::NotEqual, x, zero);
                        truth(fx, c)
                    }
                    DType::BF16 | DType::F16 => {
                        let code = fx.ic(dtype_code(*d));
                        self.call(fx, Helper::Cast, &[code, x])
                    }
                }
            }
            Expr::Mask { i, j, window, x } => {
                let x = self.eval(fx, x, t);
                let (ci, cj) = (self.index(*i, t), self.index(*j, t));
                let mut vis = fx.b.ins().icmp(IntCC::SignedLessThanOrEqual, cj, ci);
                if let Some(w) = window {
                    let d = fx.b.ins().isub(ci, cj);
                    let wv = fx.ic(*w as i64);
                    let inside = fx.b.ins().icmp(IntCC::SignedLessThan, d, wv);
                    vis = fx.b.ins().band(vis, inside);
                }
                let ninf = fx.f64c(f64::NEG_INFINITY);
                fx.b.ins().select(vis, x, ninf)
            }
        }
    }

    /// Element of a gathered buffer at the subscripts `subs`, NaN when one is out of range (the
    /// address is then clamped to element 0, so nothing outside the buffer is read).
    #[allow(clippy::too_many_arguments)]
    fn gather(
        &self,
        fx: &mut Fx,
        dt: DType,
        p: Value,
        subs: &[Sub],
        sizes: &[u64],
        strides: &[i64],
        t: Value,
    ) -> Value {
        let mut off = fx.ic(0);
        let mut valid = fx.b.ins().iconst(types::I8, 1);
        for ((sub, &size), &stride) in subs.iter().zip(sizes).zip(strides) {
            let mut x = fx.ic(sub.constant);
            for &(a, c) in &sub.terms {
                let i = self.index(a, t);
                let ci = fx.b.ins().imul_imm_s(i, c);
                x = fx.b.ins().iadd(x, ci);
            }
            if let Some(d) = sub.div {
                // Floor division by d > 0: truncate, then step down when the remainder is negative.
                let q = fx.b.ins().sdiv_imm_s(x, d);
                let r = fx.b.ins().srem_imm_s(x, d);
                let neg = fx.b.ins().icmp_imm_s(IntCC::SignedLessThan, r, 0);
                let one = fx.b.ins().uextend(I64, neg);
                x = fx.b.ins().isub(q, one);
            }
            for &(kind, b) in &sub.clamps {
                let b = fx.ic(b);
                x = match kind {
                    foxc_ir::index::ClampKind::Min => fx.imin(x, b),
                    foxc_ir::index::ClampKind::Max => fx.imax(x, b),
                };
            }
            // Unsigned `x < size` also rejects negative subscripts.
            let inside = fx.b.ins().icmp_imm_u(IntCC::UnsignedLessThan, x, size as i64);
            valid = fx.b.ins().band(valid, inside);
            let xs = fx.b.ins().imul_imm_s(x, stride);
            off = fx.b.ins().iadd(off, xs);
        }
        let zero = fx.ic(0);
        let off = fx.b.ins().select(valid, off, zero);
        let v = self.load(fx, dt, p, off);
        let nan = fx.f64c(f64::NAN);
        fx.b.ins().select(valid, v, nan)
    }

    /// Softmax along the line: the max ignores NaN but a NaN anywhere poisons the line (as in the
    /// interpreter); an all `-inf` line gives zeros; otherwise `exp(x - max) / sum`.
    fn softmax(&self, fx: &mut Fx) {
        let k = self.k;
        let n = k.line() as i64;
        let mx = fx.b.declare_var(F64);
        let nan = fx.b.declare_var(types::I8);
        let ninf = fx.f64c(f64::NEG_INFINITY);
        fx.b.def_var(mx, ninf);
        let no = fx.b.ins().iconst(types::I8, 0);
        fx.b.def_var(nan, no);
        fx.for_n(0, n, 1, |fx, t| {
            let v = self.eval(fx, &k.value, t);
            let m = fx.b.use_var(mx);
            let gt = fx.b.ins().fcmp(FloatCC::GreaterThan, v, m);
            let m = fx.b.ins().select(gt, v, m);
            fx.b.def_var(mx, m);
            let isnan = fx.b.ins().fcmp(FloatCC::Unordered, v, v);
            let a = fx.b.use_var(nan);
            let a = fx.b.ins().bor(a, isnan);
            fx.b.def_var(nan, a);
        });
        let m = fx.b.use_var(mx);
        let any_nan = fx.b.use_var(nan);
        let ninf = fx.f64c(f64::NEG_INFINITY);
        let all_masked = fx.b.ins().fcmp(FloatCC::Equal, m, ninf);
        let no_nan = fx.b.ins().icmp_imm_s(IntCC::Equal, any_nan, 0);
        let zero_line = fx.b.ins().band(all_masked, no_nan);
        fx.if_then(zero_line, |fx| {
            fx.for_n(0, n, 1, |fx, t| {
                let z = fx.f64c(0.0);
                self.store(fx, t, z);
            });
        });
        let normal = fx.b.ins().icmp_imm_s(IntCC::Equal, zero_line, 0);
        fx.if_then(normal, |fx| {
            let z = fx.b.declare_var(F64);
            let zero = fx.f64c(0.0);
            fx.b.def_var(z, zero);
            fx.for_n(0, n, 1, |fx, t| {
                let v = self.eval(fx, &k.value, t);
                let d = fx.b.ins().fsub(v, m);
                let code = fx.ic(unary_code(UnaryOp::Exp));
                let e = self.call(fx, Helper::Unary, &[code, d]);
                let a = fx.b.use_var(z);
                let a = fx.b.ins().fadd(a, e);
                fx.b.def_var(z, a);
            });
            let zs = fx.b.use_var(z);
            fx.for_n(0, n, 1, |fx, t| {
                let v = self.eval(fx, &k.value, t);
                let d = fx.b.ins().fsub(v, m);
                let code = fx.ic(unary_code(UnaryOp::Exp));
                let e = self.call(fx, Helper::Unary, &[code, d]);
                let p = fx.b.ins().fdiv(e, zs);
                self.store(fx, t, p);
            });
        });
    }

    /// `x * (1 / sqrt(mean(x^2) + eps)) * w[t]` along the line.
    fn rmsnorm(&self, fx: &mut Fx, w: usize, eps: f64) {
        let k = self.k;
        let n = k.line() as i64;
        let ss = fx.b.declare_var(F64);
        let zero = fx.f64c(0.0);
        fx.b.def_var(ss, zero);
        fx.for_n(0, n, 1, |fx, t| {
            let v = self.eval(fx, &k.value, t);
            let a = fx.b.use_var(ss);
            let sq = fx.b.ins().fmul(v, v);
            let a = fx.b.ins().fadd(a, sq);
            fx.b.def_var(ss, a);
        });
        let a = fx.b.use_var(ss);
        let nf = fx.f64c(n as f64);
        let ms = fx.b.ins().fdiv(a, nf);
        let e = fx.f64c(eps);
        let ms = fx.b.ins().fadd(ms, e);
        let rt = fx.b.ins().sqrt(ms);
        let one = fx.f64c(1.0);
        let r = fx.b.ins().fdiv(one, rt);
        fx.for_n(0, n, 1, |fx, t| {
            let v = self.eval(fx, &k.value, t);
            let wv = self.eval(fx, &Expr::In(w), t);
            let v = fx.b.ins().fmul(v, r);
            let v = fx.b.ins().fmul(v, wv);
            self.store(fx, t, v);
        });
    }
}

/// A compare result (i8 0/1) as f64 1.0 / 0.0.
fn truth(fx: &mut Fx, c: Value) -> Value {
    let w = fx.b.ins().uextend(I32, c);
    fx.b.ins().fcvt_from_uint(F64, w)
}

/// `x op y` in f64 with the interpreter's semantics (comparisons give 1/0, NaN compares false
/// except `ne`; `min`/`max` propagate NaN).
fn binary(fx: &mut Fx, b: BinaryOp, x: Value, y: Value) -> Value {
    let cmp = |fx: &mut Fx, cc: FloatCC| {
        let c = fx.b.ins().fcmp(cc, x, y);
        truth(fx, c)
    };
    match b {
        BinaryOp::Add => fx.b.ins().fadd(x, y),
        BinaryOp::Sub => fx.b.ins().fsub(x, y),
        BinaryOp::Mul => fx.b.ins().fmul(x, y),
        BinaryOp::Div => fx.b.ins().fdiv(x, y),
        BinaryOp::Min => fx.b.ins().fmin(x, y),
        BinaryOp::Max => fx.b.ins().fmax(x, y),
        BinaryOp::Lt => cmp(fx, FloatCC::LessThan),
        BinaryOp::Le => cmp(fx, FloatCC::LessThanOrEqual),
        BinaryOp::Gt => cmp(fx, FloatCC::GreaterThan),
        BinaryOp::Ge => cmp(fx, FloatCC::GreaterThanOrEqual),
        BinaryOp::Eq => cmp(fx, FloatCC::Equal),
        BinaryOp::Ne => cmp(fx, FloatCC::NotEqual),
    }
}
