//! Lane-wise f32x4 functions of score regions that Cranelift has no instruction for: `log`,
//! `exp2` and `log(1 + e)` (from which `log2`, `softplus` and `logsigmoid` follow; `exp` is
//! [`Fx::vexp`]). Each follows the interpreter's f64 function (`foxc_ir::interp::unary`, the
//! definition) to a few f32 ulps, special values included: `log(0) = -inf`, `log` of a negative
//! number or NaN is NaN, `log(inf) = inf`, subnormal inputs are exact, `exp2` overflows to `inf`
//! and underflows to 0.

use super::emit::{Fx, F32X4, I32};
use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::{types, InstBuilder, MemFlagsData, Value};

const I32X4: cranelift_codegen::ir::Type = types::I32X4;

impl Fx<'_> {
    fn splat_i(&mut self, v: i64) -> Value {
        let c = self.b.ins().iconst(I32, v);
        self.b.ins().splat(I32X4, c)
    }

    fn as_ints(&mut self, x: Value) -> Value {
        self.b.ins().bitcast(I32X4, MemFlagsData::new(), x)
    }

    fn as_floats(&mut self, x: Value) -> Value {
        self.b.ins().bitcast(F32X4, MemFlagsData::new(), x)
    }

    /// `2^k` for integer lanes `k` in `[-126, 127]` (the exponent field alone).
    fn pow2i(&mut self, k: Value) -> Value {
        let bias = self.splat_i(127);
        let e = self.b.ins().iadd(k, bias);
        let bits = self.b.ins().ishl_imm_s(e, 23);
        self.as_floats(bits)
    }

    /// Lane-wise natural log. The argument is split as `x = 2^e m` with `m` in
    /// `[sqrt(1/2), sqrt(2))`; `log(m)` is Cephes' degree-9 polynomial in `m - 1` (about 1 ulp),
    /// and `e ln 2` is added in two parts so that it stays exact.
    pub fn vlog(&mut self, x: Value) -> Value {
        // Subnormals: scale into the normal range first (2^23), remember the 23.
        let min_normal = self.splat_c(f32::MIN_POSITIVE);
        let tiny = self.b.ins().fcmp(FloatCC::LessThan, x, min_normal);
        let up = self.splat_c(8_388_608.0);
        let xu = self.b.ins().fmul(x, up);
        let xs = self.vsel(tiny, xu, x);
        let bits = self.as_ints(xs);
        // m in [0.5, 1): the mantissa with the exponent of 0.5; e the unbiased exponent + 1.
        let exp = self.b.ins().ushr_imm_s(bits, 23);
        let ff = self.splat_i(0xff);
        let exp = self.b.ins().band(exp, ff);
        let bias = self.splat_i(126);
        let e = self.b.ins().isub(exp, bias);
        let mask = self.splat_i(0x007f_ffff);
        let mant = self.b.ins().band(bits, mask);
        let half = self.splat_i(0x3f00_0000);
        let mbits = self.b.ins().bor(mant, half);
        let m = self.as_floats(mbits);
        let mut ef = self.b.ins().fcvt_from_sint(F32X4, e);
        let shift = self.splat_c(23.0);
        let zero = self.splat_c(0.0);
        let sub = self.vsel(tiny, shift, zero);
        ef = self.b.ins().fsub(ef, sub);
        // m < sqrt(1/2): use 2m (in [sqrt(1/2), 1)) and e - 1.
        let sqrth = self.splat_c(std::f32::consts::FRAC_1_SQRT_2);
        let small = self.b.ins().fcmp(FloatCC::LessThan, m, sqrth);
        let m2 = self.b.ins().fadd(m, m);
        let m = self.vsel(small, m2, m);
        let one = self.splat_c(1.0);
        let m = self.b.ins().fsub(m, one);
        let dec = self.vsel(small, one, zero);
        let ef = self.b.ins().fsub(ef, dec);
        let z = self.b.ins().fmul(m, m);
        let coeffs = [
            7.037_683_6e-2f32,
            -1.151_461e-1,
            1.167_699_9e-1,
            -1.242_014_1e-1,
            1.424_932_3e-1,
            -1.666_805_8e-1,
            2.000_071_5e-1,
            -2.499_999_4e-1,
            3.333_333e-1,
        ];
        let mut y = self.splat_c(coeffs[0]);
        for &c in &coeffs[1..] {
            let cv = self.splat_c(c);
            y = self.fmadd(y, m, cv);
        }
        let y = self.b.ins().fmul(y, m);
        let y = self.b.ins().fmul(y, z);
        let lo = self.splat_c(-2.121_944_4e-4);
        let y = self.fmadd(ef, lo, y);
        let mhalf = self.splat_c(-0.5);
        let y = self.fmadd(z, mhalf, y);
        let r = self.b.ins().fadd(m, y);
        let hi = self.splat_c(0.693_359_4);
        let r = self.fmadd(ef, hi, r);
        // Special values.
        let is_zero = self.b.ins().fcmp(FloatCC::Equal, x, zero);
        let ninf = self.splat_c(f32::NEG_INFINITY);
        let r = self.vsel(is_zero, ninf, r);
        let inf = self.splat_c(f32::INFINITY);
        let is_inf = self.b.ins().fcmp(FloatCC::Equal, x, inf);
        let r = self.vsel(is_inf, inf, r);
        let neg = self.b.ins().fcmp(FloatCC::LessThan, x, zero);
        let nan = self.b.ins().fcmp(FloatCC::Unordered, x, x);
        let bad = self.b.ins().bor(neg, nan);
        let qnan = self.splat_c(f32::NAN);
        self.vsel(bad, qnan, r)
    }

    /// Lane-wise `2^x`: `2^n 2^f` with `n` the nearest integer and `|f| <= 1/2` (`2^f` by
    /// [`Fx::vexp`]); `2^n` as two exponent-field factors so that overflow gives `inf` and
    /// underflow 0 (through subnormals), as IEEE multiplication rounds them.
    pub fn vexp2(&mut self, x: Value) -> Value {
        let hi = self.splat_c(254.0);
        let lo = self.splat_c(-252.0);
        let x = self.b.ins().fmin(x, hi);
        let x = self.b.ins().fmax(x, lo);
        let n = self.b.ins().nearest(x);
        let f = self.b.ins().fsub(x, n);
        let ln2 = self.splat_c(std::f32::consts::LN_2);
        let fl = self.b.ins().fmul(f, ln2);
        let y = self.vexp(fl);
        let ni = self.b.ins().fcvt_to_sint_sat(I32X4, n);
        let n1 = self.b.ins().sshr_imm_s(ni, 1);
        let n2 = self.b.ins().isub(ni, n1);
        let p1 = self.pow2i(n1);
        let p2 = self.pow2i(n2);
        let y = self.b.ins().fmul(y, p1);
        self.b.ins().fmul(y, p2)
    }

    /// Lane-wise `log(1 + e)` for `e >= 0` without losing a small `e` to the rounding of
    /// `1 + e`: `log(u) e / (u - 1)` with `u = 1 + e` (exactly `e` when `u` rounds to 1).
    pub fn vlog1p(&mut self, e: Value) -> Value {
        let one = self.splat_c(1.0);
        let u = self.b.ins().fadd(one, e);
        let d = self.b.ins().fsub(u, one);
        let l = self.vlog(u);
        // e / d is 1 up to rounding for large e (and inf / inf at e = inf).
        let q = self.b.ins().fdiv(e, d);
        let inf = self.splat_c(f32::INFINITY);
        let big = self.b.ins().fcmp(FloatCC::Equal, e, inf);
        let q = self.vsel(big, one, q);
        let r = self.b.ins().fmul(l, q);
        let zero = self.splat_c(0.0);
        let exact = self.b.ins().fcmp(FloatCC::Equal, d, zero);
        self.vsel(exact, e, r)
    }

    /// `log(1 + e^-|a|)`, the shared part of softplus and logsigmoid (NaN stays NaN). For
    /// `|a| > 87` it is 0 ([`Fx::vexp`] flushes there; the true value is below 2^-125).
    pub fn vlog1p_exp_neg_abs(&mut self, a: Value) -> Value {
        let m = self.b.ins().fabs(a);
        let m = self.b.ins().fneg(m);
        let e = self.vexp(m);
        self.vlog1p(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cranelift_codegen::ir::{AbiParam, UserFuncName};
    use cranelift_codegen::settings::{self, Configurable};
    use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
    use cranelift_jit::{JITBuilder, JITModule};
    use cranelift_module::{default_libcall_names, Linkage, Module};

    /// `f` compiled as `fn(x: *const f32x4, y: *mut f32x4)` and applied to `xs`, four at a time.
    fn apply(f: fn(&mut Fx, Value) -> Value, xs: &[f32]) -> Vec<f32> {
        let mut flags = settings::builder();
        flags.set("opt_level", "none").unwrap();
        let isa = cranelift_native::builder().unwrap().finish(settings::Flags::new(flags)).unwrap();
        let mut module = JITModule::new(JITBuilder::with_isa(isa, default_libcall_names()));
        let mut sig = module.make_signature();
        sig.params.push(AbiParam::new(types::I64));
        sig.params.push(AbiParam::new(types::I64));
        let id = module.declare_function("lanes", Linkage::Local, &sig).unwrap();
        let mut ctx = module.make_context();
        ctx.func.signature = sig;
        ctx.func.name = UserFuncName::testcase("lanes");
        let mut fbc = FunctionBuilderContext::new();
        let tcfg = module.target_config();
        {
            let b = FunctionBuilder::new(&mut ctx.func, &mut fbc);
            let mut fx = Fx { b, fma: false };
            let entry = fx.b.create_block();
            fx.b.append_block_params_for_function_params(entry);
            fx.b.switch_to_block(entry);
            let p = fx.b.block_params(entry).to_vec();
            let x = fx.load(F32X4, p[0], 0);
            let y = f(&mut fx, x);
            fx.store(y, p[1], 0);
            fx.b.ins().return_(&[]);
            fx.b.seal_all_blocks();
            fx.b.finalize(tcfg);
        }
        module.define_function(id, &mut ctx).unwrap();
        module.finalize_definitions().unwrap();
        let code = module.get_finalized_function(id);
        // SAFETY: the function just compiled has this signature and reads/writes 16 bytes.
        let run: extern "C" fn(*const f32, *mut f32) = unsafe { std::mem::transmute(code) };
        let mut out = vec![0.0f32; xs.len().div_ceil(4) * 4];
        let mut inp = xs.to_vec();
        inp.resize(out.len(), 1.0);
        for (a, b) in inp.chunks(4).zip(out.chunks_mut(4)) {
            run(a.as_ptr(), b.as_mut_ptr());
        }
        out.truncate(xs.len());
        out
    }

    /// Inputs: special values, subnormals, around 1 and the f32 range, and a fresh random sweep
    /// from `seed`.
    fn inputs(seed: u64) -> Vec<f32> {
        let mut v = vec![
            0.0,
            -0.0,
            -1.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            1.0,
            1.0 + f32::EPSILON,
            1.0 - f32::EPSILON / 2.0,
            f32::MIN_POSITIVE,
            f32::MIN_POSITIVE / 3.0,
            1e-45,
            f32::MAX,
            // Both sides of the mantissa split at sqrt(1/2), and sqrt(2).
            f32::from_bits(std::f32::consts::FRAC_1_SQRT_2.to_bits() - 1),
            std::f32::consts::FRAC_1_SQRT_2,
            std::f32::consts::SQRT_2,
            2.0,
            1e-30,
            1e30,
        ];
        let mut s: u64 = seed | 1;
        for k in 0..4000 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 40) as f32 / (1u64 << 24) as f32;
            // Magnitudes from 2^-60 to 2^60, both signs, and a dense band around [-40, 40].
            let x = if k % 2 == 0 { (2.0f32).powf(120.0 * u - 60.0) } else { 80.0 * u - 40.0 };
            v.push(if k % 3 == 0 { -x } else { x });
        }
        v
    }

    /// `got` within `ulps` f32 ulps of the f64 `want` (relative), or `abs` absolutely; NaN
    /// exactly where `want` is NaN, infinities equal.
    fn check(name: &str, xs: &[f32], got: &[f32], want: impl Fn(f64) -> f64, ulps: f64, abs: f64, seed: u64) {
        for (&x, &g) in xs.iter().zip(got) {
            let w = want(x as f64);
            let wf = w as f32;
            let ok = if w.is_nan() {
                g.is_nan()
            } else if wf.is_infinite() || g.is_infinite() {
                g == wf
            } else {
                let err = (g as f64 - w).abs();
                err <= ulps * f64::from(f32::EPSILON) * w.abs() || err <= abs
            };
            assert!(ok, "{name}({x:e}) = {g:e}, want {w:e} (seed {seed:#x})");
        }
    }

    #[test]
    fn lanes_match_the_interpreter() {
        use foxc_ir::interp::unary;
        use foxc_ir::UnaryOp as U;
        let seed =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
        let xs = inputs(seed);
        check("log", &xs, &apply(|fx, x| fx.vlog(x), &xs), |x| unary(U::Log, x), 2.0, 0.0, seed);
        check("exp2", &xs, &apply(|fx, x| fx.vexp2(x), &xs), |x| unary(U::Exp2, x), 3.0, 1e-44, seed);
        let pos: Vec<f32> = xs.iter().map(|x| x.abs()).collect();
        check("log1p", &pos, &apply(|fx, x| fx.vlog1p(x), &pos), f64::ln_1p, 3.0, 0.0, seed);
        check(
            "log1p_exp_neg_abs",
            &xs,
            &apply(|fx, x| fx.vlog1p_exp_neg_abs(x), &xs),
            |x| (-x.abs()).exp().ln_1p(),
            4.0,
            // Flushed to 0 beyond |a| = 87 (documented on the function).
            2f64.powi(-125),
            seed,
        );
    }
}
