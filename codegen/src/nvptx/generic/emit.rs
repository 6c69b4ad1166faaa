//! LLVM IR of one [`Generic`] kernel, written with the NVPTX kernel builder.

use super::{Body, Expr, Generic, Src, LINES_PER_BLOCK, LINE_THREADS, MAP_ELEMS, MAP_THREADS};
use crate::nvptx::attention::region::{binary, unary};
use crate::nvptx::builder::{KernelBuilder, ParamTy};
use crate::nvptx::kernels;
use foxc_ir::{BinaryOp, DType, ReduceKind, UnaryOp};
use inkwell::context::Context;
use inkwell::module::Module;
use inkwell::values::{BasicValueEnum, FloatValue, FunctionValue, IntValue, PointerValue};
use inkwell::{FloatPredicate, IntPredicate};
use std::cell::Cell;

type Kb<'a, 'ctx> = KernelBuilder<'a, 'ctx>;

/// Builds kernel `name` for `k`: parameters as [`Generic`] documents them. Launch: `Map`,
/// [`MAP_ELEMS`] elements per thread, blocks of [`MAP_THREADS`]; line bodies, one warp per line,
/// [`LINES_PER_BLOCK`] lines per block.
pub(crate) fn build<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    name: &str,
    k: &Generic,
) -> Result<FunctionValue<'ctx>, String> {
    let np = k.pointers();
    let mut params: Vec<(String, ParamTy)> = (0..np - 1).map(|i| (format!("in{i}"), ParamTy::Ptr)).collect();
    params.push(("out".into(), ParamTy::Ptr));
    params.extend((0..k.scalars).map(|i| (format!("s{i}"), ParamTy::I64)));
    let named: Vec<(&str, ParamTy)> = params.iter().map(|(n, t)| (n.as_str(), *t)).collect();
    let b = Kb::kernel(ctx, module, name, &named)?;
    let scalars: Vec<IntValue> = (0..k.scalars).map(|i| b.param_int((np + i) as u32)).collect();
    let mut ptrs = (0..np as u32).map(|i| b.param_ptr(i));
    let mut inputs = vec![];
    for s in &k.inputs {
        inputs.push(match s {
            Src::Const(_) => None,
            _ => ptrs.next(),
        });
    }
    let out = ptrs.next().unwrap_or_else(|| b.gptr().const_null());
    let e = Elem { k, scalars, inputs, b: &b, flat: Cell::new(None) };
    match k.body {
        Body::Map => e.map(out),
        Body::Reduce(kind) => e.reduce(out, kind),
        Body::Cumsum { reverse } => e.cumsum(out, reverse),
        Body::Softmax => e.softmax(out),
        Body::RmsNorm { w, eps } => e.rmsnorm(out, w, eps),
    }
    b.finish()
}

/// What the element code of one kernel reads: the kernel, its parameters and the builder.
struct Elem<'k, 'b, 'a, 'ctx> {
    k: &'k Generic,
    scalars: Vec<IntValue<'ctx>>,
    /// The pointer of each input (`None` for constants).
    inputs: Vec<Option<PointerValue<'ctx>>>,
    b: &'b Kb<'a, 'ctx>,
    /// In a `Map` kernel, the element's flat index: the offset of the result and of every input
    /// laid out like it.
    flat: Cell<Option<IntValue<'ctx>>>,
}

impl<'ctx> Elem<'_, '_, '_, 'ctx> {
    fn size(&self, a: usize) -> IntValue<'ctx> {
        self.scalars[a]
    }

    /// The sum of the scalar parameters `terms` (0 for none).
    fn stride(&self, terms: &[usize]) -> IntValue<'ctx> {
        let b = self.b;
        terms.iter().fold(b.i64(0), |acc, &t| b.add(acc, self.scalars[t]))
    }

    /// `sum coord[a] * stride[a]`.
    fn offset(&self, strides: &[Vec<usize>], coord: &[IntValue<'ctx>]) -> IntValue<'ctx> {
        let b = self.b;
        let mut off = b.i64(0);
        for (a, terms) in strides.iter().enumerate() {
            if !terms.is_empty() {
                off = b.add(off, b.mul(coord[a], self.stride(terms)));
            }
        }
        off
    }

    /// The coordinates of flat index `flat` over axes `0..n` (row-major). Where the index and
    /// every size fit in 31 bits (any tensor below 2^31 elements) the divisions are 32-bit,
    /// several times cheaper than the 64-bit ones the general case needs.
    fn split(&self, flat: IntValue<'ctx>, n: usize) -> Vec<IntValue<'ctx>> {
        let b = self.b;
        if n == 0 {
            return vec![];
        }
        let max = i32::MAX as i64;
        let mut small = b.icmpc(IntPredicate::SLE, flat, max);
        for a in 0..n {
            small = b.and(small, b.icmpc(IntPredicate::SLE, self.size(a), max));
        }
        let narrow = |b: &Kb<'_, 'ctx>| -> Vec<BasicValueEnum<'ctx>> {
            let trunc = |x: IntValue<'ctx>| b.trunc32(x);
            let mut f = trunc(flat);
            let mut c = vec![b.i64(0).into(); n];
            for a in (0..n).rev() {
                let s = trunc(self.size(a));
                c[a] = b.zext64(b.urem(f, s)).into();
                f = b.udiv(f, s);
            }
            c
        };
        let wide = |b: &Kb<'_, 'ctx>| -> Vec<BasicValueEnum<'ctx>> {
            let mut f = flat;
            let mut c = vec![b.i64(0).into(); n];
            for a in (0..n).rev() {
                let s = self.size(a);
                c[a] = b.srem(f, s).into();
                f = b.sdiv(f, s);
            }
            c
        };
        b.if_else(small, "coord", narrow, wide).into_iter().map(|v| v.into_int_value()).collect()
    }

    /// The product of the sizes of axes `0..n`.
    fn count(&self, n: usize) -> IntValue<'ctx> {
        let b = self.b;
        (0..n).fold(b.i64(1), |acc, a| b.mul(acc, self.size(a)))
    }

    /// [`MAP_ELEMS`] consecutive elements per thread. Where the group is whole and the
    /// innermost axis a multiple of [`MAP_ELEMS`] (so the group lies in one line), its elements
    /// share one coordinate split, the divisions that made RoPE's rotation loops compute-bound;
    /// the thread computes every value before it stores any, so a store that may alias an input
    /// does not hold up the next element's loads. Elsewhere (the tail, odd innermost sizes) each
    /// element splits its own coordinates.
    fn map(&self, out: PointerValue<'ctx>) {
        let b = self.b;
        let rank = self.k.rank;
        let elems = MAP_ELEMS as i64;
        let thread =
            b.add(b.mul(b.zext64(b.sreg("ctaid.x")), b.i64(MAP_THREADS as i64)), b.zext64(b.sreg("tid.x")));
        let first = b.mulc(thread, elems);
        let n = self.count(rank);
        let needs = self.k.needs_coords();
        let mut grouped = b.icmp(IntPredicate::SLE, b.addc(first, elems), n);
        if needs {
            let inner_fits = b.icmpc(IntPredicate::EQ, b.srem(self.size(rank - 1), b.i64(elems)), 0);
            grouped = b.and(grouped, inner_fits);
        }
        b.if_else(
            grouped,
            "map",
            |_| {
                let base = if needs { self.split(first, rank) } else { vec![] };
                let values: Vec<FloatValue<'ctx>> = (0..elems)
                    .map(|e| {
                        let mut coord = base.clone();
                        if let Some(last) = coord.last_mut() {
                            *last = b.addc(*last, e);
                        }
                        self.flat_value(b.addc(first, e), &coord)
                    })
                    .collect();
                for (e, v) in values.into_iter().enumerate() {
                    self.store(out, b.addc(first, e as i64), v);
                }
                vec![]
            },
            |_| {
                for e in 0..elems {
                    let idx = b.addc(first, e);
                    b.if_then(b.icmp(IntPredicate::SLT, idx, n), |_| {
                        let coord = if needs { self.split(idx, rank) } else { vec![] };
                        let v = self.flat_value(idx, &coord);
                        self.store(out, idx, v);
                    });
                }
                vec![]
            },
        );
    }

    /// The kernel's value at flat index `flat` (the result's own order, so also the offset of
    /// every input laid out like it) and coordinates `coord`.
    fn flat_value(&self, flat: IntValue<'ctx>, coord: &[IntValue<'ctx>]) -> FloatValue<'ctx> {
        self.flat.set(Some(flat));
        let v = self.eval(&self.k.value, coord);
        self.flat.set(None);
        v
    }

    /// This thread's line: one warp per line (lanes strided by 32), or one thread per line in a
    /// serial kernel; and whether the line exists (the same for a whole warp in warp mode).
    fn line(&self) -> (IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>) {
        let b = self.b;
        let tid = b.zext64(b.sreg("tid.x"));
        let block = b.zext64(b.sreg("ctaid.x"));
        let (line, lane) = if self.k.serial {
            (b.add(b.mul(block, b.i64(LINE_THREADS as i64)), tid), b.i64(0))
        } else {
            (b.add(b.mul(block, b.i64(LINES_PER_BLOCK as i64)), b.lshrc(tid, 5)), b.andc(tid, 31))
        };
        let inside = b.icmp(IntPredicate::SLT, line, self.count(self.k.rank - 1));
        (line, lane, inside)
    }

    /// Positions of the line this thread visits: `lane, lane + step, ...`.
    fn step(&self) -> IntValue<'ctx> {
        self.b.i64(if self.k.serial { 1 } else { 32 })
    }

    /// Coordinates of element `pos` of the line whose other coordinates are `line`.
    fn at(&self, line: &[IntValue<'ctx>], pos: IntValue<'ctx>) -> Vec<IntValue<'ctx>> {
        let mut c = line.to_vec();
        c.push(pos);
        c
    }

    /// Folds `elem(coordinates)` over the line from `init` with `combine`: this thread takes
    /// positions `lane, lane + step, ...`; in warp mode a butterfly over the warp follows (a
    /// fixed order: the same bits on every run) and every lane gets the result.
    fn fold(
        &self,
        line: &[IntValue<'ctx>],
        lane: IntValue<'ctx>,
        init: f64,
        elem: &dyn Fn(&[IntValue<'ctx>]) -> FloatValue<'ctx>,
        combine: &dyn Fn(FloatValue<'ctx>, FloatValue<'ctx>) -> FloatValue<'ctx>,
    ) -> FloatValue<'ctx> {
        let b = self.b;
        let len = self.size(self.k.rank - 1);
        let acc = b.declare_var(b.f32(init).into());
        b.for_range(lane, len, self.step(), |_, pos| {
            let x = elem(&self.at(line, pos));
            b.def_var(acc, combine(b.use_f(acc), x));
        });
        let mut v = b.use_f(acc);
        if !self.k.serial {
            for m in [16, 8, 4, 2, 1] {
                v = combine(v, b.shfl_xor(v, m));
            }
        }
        v
    }

    /// Writes `value(coordinates)` at every position of the line this thread visits.
    fn write_line(
        &self,
        out: PointerValue<'ctx>,
        line: &[IntValue<'ctx>],
        lane: IntValue<'ctx>,
        value: &dyn Fn(&[IntValue<'ctx>]) -> FloatValue<'ctx>,
    ) {
        let b = self.b;
        let len = self.size(self.k.rank - 1);
        b.for_range(lane, len, self.step(), |_, pos| {
            let c = self.at(line, pos);
            self.store(out, self.offset(&self.k.out_strides, &c), value(&c));
        });
    }

    /// The line's value at `c`.
    fn value_at(&self, c: &[IntValue<'ctx>]) -> FloatValue<'ctx> {
        self.eval(&self.k.value, c)
    }

    /// Runs `body(line coordinates, lane)` for this thread's line, if it exists.
    fn for_line(&self, body: impl FnOnce(&[IntValue<'ctx>], IntValue<'ctx>)) {
        let (line, lane, inside) = self.line();
        self.b.if_then(inside, |_| {
            let coord = self.split(line, self.k.rank - 1);
            body(&coord, lane);
        });
    }

    /// Sum or NaN-keeping max of the line; lane 0 writes.
    fn reduce(&self, out: PointerValue<'ctx>, kind: ReduceKind) {
        let b = self.b;
        self.for_line(|line, lane| {
            let v = match kind {
                ReduceKind::Sum => self.fold(line, lane, 0.0, &|c| self.value_at(c), &|x, y| b.fadd(x, y)),
                ReduceKind::Max => {
                    self.fold(line, lane, f64::NEG_INFINITY, &|c| self.value_at(c), &|x, y| {
                        binary(b, BinaryOp::Max, x, y)
                    })
                }
            };
            let first = b.icmpc(IntPredicate::EQ, lane, 0);
            b.if_then(first, |_| {
                let off = self.offset(&self.k.out_strides, &self.at(line, b.i64(0)));
                self.store(out, off, v);
            });
        });
    }

    /// Softmax as the interpreter defines it: the max ignoring NaN, `exp(x - max) / sum`; a line
    /// of only `-inf` (and no NaN) is all zeros. Three passes over the line.
    fn softmax(&self, out: PointerValue<'ctx>) {
        let b = self.b;
        self.for_line(|line, lane| {
            let m = self.fold(line, lane, f64::NEG_INFINITY, &|c| self.value_at(c), &|x, y| b.fmax(x, y));
            let nan = self.fold(
                line,
                lane,
                0.0,
                &|c| {
                    let x = self.value_at(c);
                    b.select_f(b.fcmp(FloatPredicate::UNO, x, x), b.f32(1.0), b.f32(0.0))
                },
                &|x, y| b.fmax(x, y),
            );
            let e = |c: &[IntValue<'ctx>]| unary(b, UnaryOp::Exp, b.fsub(self.value_at(c), m));
            let z = self.fold(line, lane, 0.0, &e, &|x, y| b.fadd(x, y));
            let masked = b.and(
                b.fcmp(FloatPredicate::OEQ, m, b.f32(f64::NEG_INFINITY)),
                b.fcmp(FloatPredicate::OEQ, nan, b.f32(0.0)),
            );
            self.write_line(out, line, lane, &|c| b.select_f(masked, b.f32(0.0), b.fdiv(e(c), z)));
        });
    }

    /// `x * rsqrt(mean(x^2) + eps) * w[position]`.
    fn rmsnorm(&self, out: PointerValue<'ctx>, w: usize, eps: f64) {
        let b = self.b;
        self.for_line(|line, lane| {
            let sq = |c: &[IntValue<'ctx>]| {
                let x = self.value_at(c);
                b.fmul(x, x)
            };
            let ss = self.fold(line, lane, 0.0, &sq, &|x, y| b.fadd(x, y));
            let len = b.sitofp(self.size(self.k.rank - 1));
            let r = b.fdiv(b.f32(1.0), b.sqrt(b.fadd(b.fdiv(ss, len), b.f32(eps))));
            self.write_line(out, line, lane, &|c| b.fmul(b.fmul(self.value_at(c), r), self.input(w, c)));
        });
    }

    /// Inclusive prefix sum of each line (`reverse`: its suffix sum, the line walked from its
    /// end: position `p` of the walk is element `len - 1 - p`), each term a
    /// [`kernels::cumsum_term`]. Serial: a running sum. Warp mode: 32 elements at a time, an
    /// inclusive warp scan plus the total of the chunks before (lane 31's sum, broadcast).
    fn cumsum(&self, out: PointerValue<'ctx>, reverse: bool) {
        let b = self.b;
        let len = self.size(self.k.rank - 1);
        let elem = |pos: IntValue<'ctx>| if reverse { b.sub(b.addc(len, -1), pos) } else { pos };
        let term = |x: FloatValue<'ctx>| kernels::cumsum_term(b, x);
        self.for_line(|line, lane| {
            let carry = b.declare_var(b.f32(0.0).into());
            if self.k.serial {
                b.for_range(b.i64(0), len, b.i64(1), |_, pos| {
                    let c = self.at(line, elem(pos));
                    let s = b.fadd(b.use_f(carry), term(self.value_at(&c)));
                    self.store(out, self.offset(&self.k.out_strides, &c), s);
                    b.def_var(carry, s);
                });
                return;
            }
            let lane32 = b.trunc32(lane);
            b.for_range(b.i64(0), len, b.i64(32), |_, start| {
                let pos = b.add(start, lane);
                let here = b.icmp(IntPredicate::SLT, pos, len);
                let x = b.if_then_carry(here, ("load", "loaded"), &[("x", b.f32(0.0).into())], |_| {
                    vec![term(self.value_at(&self.at(line, elem(pos)))).into()]
                });
                let mut s = x[0].into_float_value();
                for d in [1i64, 2, 4, 8, 16] {
                    let y = b.shfl_up(s, d);
                    let ok = b.icmpc(IntPredicate::SGE, lane32, d);
                    s = b.select_f(ok, b.fadd(s, y), s);
                }
                let before = b.use_f(carry);
                let total = b.call_f(
                    "llvm.nvvm.shfl.sync.idx.f32",
                    &[b.i32(-1).into(), s.into(), b.i32(31).into(), b.i32(31).into()],
                );
                b.if_then(here, |_| {
                    let off = self.offset(&self.k.out_strides, &self.at(line, elem(pos)));
                    self.store(out, off, b.fadd(before, s));
                });
                b.def_var(carry, b.fadd(before, total));
            });
        });
    }

    /// Element `off` of a buffer of dtype `dt`, as f32 (bool: 1 or 0).
    fn load(&self, dt: DType, p: PointerValue<'ctx>, off: IntValue<'ctx>) -> FloatValue<'ctx> {
        let b = self.b;
        match dt {
            DType::F32 | DType::BF16 | DType::F16 => b.load_f(dt, p, off),
            DType::I32 => {
                let v = b.load(b.i32t().into(), b.gep(b.i32t().into(), p, off));
                b.sitofp(v.into_int_value())
            }
            DType::I64 => {
                unreachable!("i64 is only a parameter's storage: the verifier keeps it out of graphs")
            }
            DType::Bool => {
                let i8t = b.ctx.i8_type();
                let v = b.load(i8t.into(), b.gep(i8t.into(), p, off)).into_int_value();
                let t = b.icmp(IntPredicate::NE, v, i8t.const_zero());
                b.select_f(t, b.f32(1.0), b.f32(0.0))
            }
        }
    }

    /// Stores `v` as element `off` of the result, converted as `cast` converts.
    fn store(&self, p: PointerValue<'ctx>, off: IntValue<'ctx>, v: FloatValue<'ctx>) {
        let b = self.b;
        match self.k.out_dtype {
            dt @ (DType::F32 | DType::BF16 | DType::F16) => b.store_f(dt, p, off, v),
            DType::I32 => b.store(b.gep(b.i32t().into(), p, off), to_i32(b, v)),
            DType::I64 => {
                unreachable!("i64 is only a parameter's storage: the verifier keeps it out of graphs")
            }
            DType::Bool => {
                let i8t = b.ctx.i8_type();
                let t = b.fcmp(FloatPredicate::UNE, v, b.f32(0.0));
                let byte = b.select_i(t, i8t.const_int(1, false), i8t.const_zero());
                b.store(b.gep(i8t.into(), p, off), byte);
            }
        }
    }

    /// The value of `e` at iteration coordinates `coord`.
    fn eval(&self, e: &Expr, coord: &[IntValue<'ctx>]) -> FloatValue<'ctx> {
        let b = self.b;
        match e {
            Expr::In(i) => self.input(*i, coord),
            Expr::Index(a) => b.sitofp(coord[*a]),
            Expr::Const(c) => b.f32(*c),
            Expr::Scalar(s) => b.sitofp(self.scalars[*s]),
            Expr::Unary(u, x) => unary(b, *u, self.eval(x, coord)),
            Expr::Binary(op, x, y) => {
                let (x, y) = (self.eval(x, coord), self.eval(y, coord));
                binary(b, *op, x, y)
            }
            Expr::Select(c, x, y) => {
                let c = self.eval(c, coord);
                let (x, y) = (self.eval(x, coord), self.eval(y, coord));
                b.select_f(b.fcmp(FloatPredicate::UNE, c, b.f32(0.0)), x, y)
            }
            Expr::Cast(dt, x) => round_to(b, *dt, self.eval(x, coord)),
            Expr::Mask { i, j, window, x } => {
                let v = self.eval(x, coord);
                let (ci, cj) = (coord[*i], coord[*j]);
                let mut keep = b.icmp(IntPredicate::SLE, cj, ci);
                if let Some(w) = window {
                    let near = b.icmp(IntPredicate::SLT, b.sub(ci, cj), b.i64(*w as i64));
                    keep = b.and(keep, near);
                }
                b.select_f(keep, v, b.f32(f64::NEG_INFINITY))
            }
        }
    }

    /// Input `i` at `coord`.
    fn input(&self, i: usize, coord: &[IntValue<'ctx>]) -> FloatValue<'ctx> {
        let b = self.b;
        let p = self.inputs[i];
        match (&self.k.inputs[i], p) {
            (Src::Const(c), _) => b.f32(*c),
            (Src::Buf { dtype, strides, .. }, Some(p)) => {
                let off = match self.flat.get() {
                    Some(f) if self.k.flat_input(i) => f,
                    _ => self.offset(strides, coord),
                };
                self.load(*dtype, p, off)
            }
            (Src::Gather { dtype, subs, sizes, strides }, Some(p)) => {
                let mut ok = b.bool(true);
                let mut off = b.i64(0);
                for (k, sub) in subs.iter().enumerate() {
                    let mut s = b.i64(sub.constant);
                    for &(a, c) in &sub.terms {
                        s = b.add(s, b.mul(coord[a], b.i64(c)));
                    }
                    for &(d, c) in &sub.dims {
                        s = b.add(s, b.mul(self.scalars[d], b.i64(c)));
                    }
                    if let Some(d) = sub.div {
                        let d = self.scalars[d];
                        // floor(s / d) for d > 0 (a non-positive divisor reads NaN).
                        let pos = b.icmpc(IntPredicate::SGT, d, 0);
                        ok = b.and(ok, pos);
                        let safe = b.select_i(pos, d, b.i64(1));
                        let q = b.sdiv(s, safe);
                        let r = b.srem(s, safe);
                        let down = b.and(b.icmpc(IntPredicate::NE, r, 0), b.icmpc(IntPredicate::SLT, s, 0));
                        s = b.select_i(down, b.addc(q, -1), q);
                    }
                    for c in &sub.clamps {
                        let mut bound = b.i64(c.constant);
                        for &(d, k) in &c.dims {
                            bound = b.add(bound, b.mul(self.scalars[d], b.i64(k)));
                        }
                        s = match c.kind {
                            foxc_ir::index::ClampKind::Min => b.smin(s, bound),
                            foxc_ir::index::ClampKind::Max => b.smax(s, bound),
                        };
                    }
                    let inside = b.and(
                        b.icmpc(IntPredicate::SGE, s, 0),
                        b.icmp(IntPredicate::SLT, s, self.scalars[sizes[k]]),
                    );
                    ok = b.and(ok, inside);
                    off = b.add(off, b.mul(s, self.scalars[strides[k]]));
                }
                let v = b.if_then_carry(ok, ("gather", "gathered"), &[("g", b.f32(f64::NAN).into())], |_| {
                    vec![BasicValueEnum::from(self.load(*dtype, p, off))]
                });
                v[0].into_float_value()
            }
            _ => {
                b.fail(format!("input {i} has no pointer"));
                b.f32(0.0)
            }
        }
    }
}

/// `x` as i32 the way `cast` converts (`as i32`: toward zero, saturating, NaN to 0).
fn to_i32<'ctx>(b: &Kb<'_, 'ctx>, x: FloatValue<'ctx>) -> IntValue<'ctx> {
    b.call_int("llvm.fptosi.sat.i32.f32", b.i32t(), &[x.into()])
}

/// `x` rounded to `dt` and back to f32, as `cast` defines it.
fn round_to<'ctx>(b: &Kb<'_, 'ctx>, dt: DType, x: FloatValue<'ctx>) -> FloatValue<'ctx> {
    match dt {
        DType::F32 => x,
        DType::BF16 => b.fpext(b.fptrunc(x, b.ctx.bf16_type())),
        DType::F16 => b.fpext(b.fptrunc(x, b.ctx.f16_type())),
        DType::I32 => b.sitofp(to_i32(b, x)),
        DType::I64 => unreachable!("i64 is only a parameter's storage: the verifier keeps it out of graphs"),
        DType::Bool => b.select_f(b.fcmp(FloatPredicate::UNE, x, b.f32(0.0)), b.f32(1.0), b.f32(0.0)),
    }
}
