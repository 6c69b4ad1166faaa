//! Small structured-control-flow helpers over a Cranelift `FunctionBuilder`: counted loops,
//! conditionals, typed element loads and stores, and a vectorized `exp`.

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{types, BlockArg, ConstantData, InstBuilder, MemFlagsData, Type, Value};
use cranelift_frontend::FunctionBuilder;
use foxc_ir::DType;

pub const I64: Type = types::I64;
pub const I32: Type = types::I32;
pub const F32: Type = types::F32;
pub const F64: Type = types::F64;
pub const F32X4: Type = types::F32X4;
pub const I32X4: Type = types::I32X4;

/// The element types the fused CPU kernels read and write as floats (widened to f32 on load,
/// rounded to nearest even on store).
pub fn is_cpu_float(dt: DType) -> bool {
    matches!(dt, DType::F32 | DType::BF16 | DType::F16)
}

/// Memory flags of every access: addresses are computed in bounds, so accesses never trap.
/// Alignment is not claimed (inputs come straight from safetensors bytes).
pub fn mem() -> MemFlagsData {
    MemFlagsData::new().with_notrap()
}

pub struct Fx<'a> {
    pub b: FunctionBuilder<'a>,
    /// Use fused multiply-add (the host has FMA); otherwise `fmul` + `fadd`.
    pub fma: bool,
}

impl<'a> Fx<'a> {
    pub fn ic(&mut self, v: i64) -> Value {
        self.b.ins().iconst(I64, v)
    }

    pub fn f32c(&mut self, v: f32) -> Value {
        self.b.ins().f32const(v)
    }

    pub fn f64c(&mut self, v: f64) -> Value {
        self.b.ins().f64const(v)
    }

    pub fn splat(&mut self, x: Value) -> Value {
        self.b.ins().splat(F32X4, x)
    }

    pub fn splat_c(&mut self, v: f32) -> Value {
        let c = self.f32c(v);
        self.splat(c)
    }

    /// A constant f32x4 with the given lanes.
    pub fn vconst4(&mut self, lanes: [f32; 4]) -> Value {
        let bytes: Vec<u8> = lanes.iter().flat_map(|l| l.to_le_bytes()).collect();
        let h = self.b.func.dfg.constants.insert(ConstantData::from(bytes));
        self.b.ins().vconst(F32X4, h)
    }

    /// `base + idx * scale` (byte address).
    pub fn addr(&mut self, base: Value, idx: Value, scale: i64) -> Value {
        let off = self.b.ins().imul_imm_s(idx, scale);
        self.b.ins().iadd(base, off)
    }

    pub fn load(&mut self, ty: Type, addr: Value, off: i32) -> Value {
        self.b.ins().load(ty, mem(), addr, off)
    }

    pub fn store(&mut self, v: Value, addr: Value, off: i32) {
        self.b.ins().store(mem(), v, addr, off);
    }

    /// Load element `idx` of a buffer of `dt`, widened to f32.
    pub fn load_f32(&mut self, dt: DType, base: Value, idx: Value) -> Value {
        match dt {
            DType::BF16 => {
                let a = self.addr(base, idx, 2);
                let h = self.b.ins().uload16(I32, mem(), a, 0);
                let w = self.b.ins().ishl_imm_s(h, 16);
                self.b.ins().bitcast(F32, MemFlagsData::new(), w)
            }
            DType::F16 => {
                let a = self.addr(base, idx, 2);
                let h = self.b.ins().uload16(I32, mem(), a, 0);
                self.f16_bits_to_f32(h, I32)
            }
            DType::I32 => {
                let a = self.addr(base, idx, 4);
                let x = self.load(I32, a, 0);
                self.b.ins().fcvt_from_sint(F32, x)
            }
            // The planner admits only f32, bf16, f16 and i32 operands.
            _ => {
                let a = self.addr(base, idx, 4);
                self.load(F32, a, 0)
            }
        }
    }

    /// Load 4 consecutive elements starting at `idx` as an f32x4 (f32, bf16 or f16 buffers).
    pub fn load4_f32(&mut self, dt: DType, base: Value, idx: Value) -> Value {
        match dt {
            DType::BF16 => {
                let a = self.addr(base, idx, 2);
                let h = self.b.ins().uload16x4(mem(), a, 0);
                let w = self.b.ins().ishl_imm_s(h, 16);
                self.b.ins().bitcast(F32X4, MemFlagsData::new(), w)
            }
            DType::F16 => {
                let a = self.addr(base, idx, 2);
                let h = self.b.ins().uload16x4(mem(), a, 0);
                self.f16_bits_to_f32(h, I32X4)
            }
            _ => {
                let a = self.addr(base, idx, 4);
                self.load(F32X4, a, 0)
            }
        }
    }

    pub fn load_f64(&mut self, dt: DType, base: Value, idx: Value) -> Value {
        let x = self.load_f32(dt, base, idx);
        self.b.ins().fpromote(F64, x)
    }

    /// Store f32 `v` as element `idx` of a buffer of `dt` (f32, or bf16/f16 rounded to nearest
    /// even).
    pub fn store_f32(&mut self, dt: DType, base: Value, idx: Value, v: Value) {
        match dt {
            DType::BF16 => {
                let h = self.f32_to_bf16_bits(v);
                self.store16(h, base, idx);
            }
            DType::F16 => {
                let h = self.f32_to_f16_bits(v);
                self.store16(h, base, idx);
            }
            _ => {
                let a = self.addr(base, idx, 4);
                self.store(v, a, 0);
            }
        }
    }

    /// The low 16 bits of `h` as element `idx` of a 2-byte buffer.
    fn store16(&mut self, h: Value, base: Value, idx: Value) {
        let a = self.addr(base, idx, 2);
        self.b.ins().istore16(mem(), h, a, 0);
    }

    /// f32 -> bf16 bits (in the low 16 bits of an i32), round to nearest even, NaN stays NaN.
    fn f32_to_bf16_bits(&mut self, v: Value) -> Value {
        let bits = self.b.ins().bitcast(I32, MemFlagsData::new(), v);
        let lsb = self.b.ins().ushr_imm_s(bits, 16);
        let lsb = self.b.ins().band_imm_s(lsb, 1);
        let r = self.b.ins().iadd_imm_s(bits, 0x7fff);
        let r = self.b.ins().iadd(r, lsb);
        let r = self.b.ins().ushr_imm_s(r, 16);
        let q = self.b.ins().ushr_imm_s(bits, 16);
        let qnan = self.b.ins().bor_imm_s(q, 0x40);
        let isnan = self.b.ins().fcmp(FloatCC::Unordered, v, v);
        self.b.ins().select(isnan, qnan, r)
    }

    /// An i32 constant of type `ty` (I32, or I32X4 with every lane `v`).
    fn i32c(&mut self, ty: Type, v: u32) -> Value {
        let c = self.b.ins().iconst(I32, v as i32 as i64);
        if ty == I32 {
            c
        } else {
            self.b.ins().splat(ty, c)
        }
    }

    /// f16 bits (zero-extended into i32 or i32x4 lanes) -> f32, exactly. Exponent and mantissa
    /// shifted into f32 position read as `x * 2^-112` (the biases differ by 127 - 15), so one
    /// multiplication by 2^112 rebiases normals and normalizes subnormals; infinities and NaNs
    /// (f16 exponent 31) get the f32 exponent 255 instead.
    fn f16_bits_to_f32(&mut self, h: Value, ity: Type) -> Value {
        let fty = if ity == I32 { F32 } else { F32X4 };
        let bits = MemFlagsData::new();
        let mag_mask = self.i32c(ity, 0x7fff);
        let mag = self.b.ins().band(h, mag_mask);
        let shifted = self.b.ins().ishl_imm_s(mag, 13);
        let f = self.b.ins().bitcast(fty, bits, shifted);
        let rebias = if ity == I32 { self.f32c(2f32.powi(112)) } else { self.splat_c(2f32.powi(112)) };
        let f = self.b.ins().fmul(f, rebias);
        let finite = self.b.ins().bitcast(ity, bits, f);
        let exp_ones = self.i32c(ity, 0x7c00);
        let inf_nan = self.b.ins().icmp(IntCC::UnsignedGreaterThanOrEqual, mag, exp_ones);
        let f32_exp = self.i32c(ity, 0x7f80_0000);
        let special = self.b.ins().bor(shifted, f32_exp);
        let v = if ity == I32 {
            self.b.ins().select(inf_nan, special, finite)
        } else {
            self.b.ins().bitselect(inf_nan, special, finite)
        };
        let sign_mask = self.i32c(ity, 0x8000);
        let sign = self.b.ins().band(h, sign_mask);
        let sign = self.b.ins().ishl_imm_s(sign, 16);
        let v = self.b.ins().bor(v, sign);
        self.b.ins().bitcast(fty, bits, v)
    }

    /// f32 -> f16 bits (in the low 16 bits of an i32), round to nearest even; overflow is inf, a
    /// NaN a quiet NaN. Three ranges of |v|: at least 2^16 (inf or NaN; 65520 up to 2^16 rounds
    /// to inf in the normal path), below 2^-14 (f16 subnormals: adding 0.5 rounds |v| to a
    /// multiple of 2^-24 in the FPU's round-to-nearest-even, and the low bits are the result),
    /// and normals (rebias, round half to even on the 13 dropped bits).
    fn f32_to_f16_bits(&mut self, v: Value) -> Value {
        let flags = MemFlagsData::new();
        let bits = self.b.ins().bitcast(I32, flags, v);
        let sign = self.b.ins().band_imm_s(bits, 0x8000_0000u32 as i32 as i64);
        let x = self.b.ins().bxor(bits, sign);
        // |v| >= 2^16: inf, or a quiet NaN.
        let is_nan = self.b.ins().icmp_imm_s(IntCC::UnsignedGreaterThan, x, 0x7f80_0000);
        let (qnan, inf) = (self.b.ins().iconst(I32, 0x7e00), self.b.ins().iconst(I32, 0x7c00));
        let big = self.b.ins().select(is_nan, qnan, inf);
        // |v| < 2^-14: subnormal or zero.
        const HALF_BITS: i64 = 0x3f00_0000;
        let xf = self.b.ins().bitcast(F32, flags, x);
        let half = self.f32c(0.5);
        let sum = self.b.ins().fadd(xf, half);
        let sum = self.b.ins().bitcast(I32, flags, sum);
        let small = self.b.ins().iadd_imm_s(sum, -HALF_BITS);
        // Normal: rebias by (15 - 127) << 23 and round to nearest even at bit 13.
        let odd = self.b.ins().ushr_imm_s(x, 13);
        let odd = self.b.ins().band_imm_s(odd, 1);
        let r = self.b.ins().iadd_imm_s(x, -(112 << 23) + 0xfff);
        let r = self.b.ins().iadd(r, odd);
        let normal = self.b.ins().ushr_imm_s(r, 13);
        let is_small = self.b.ins().icmp_imm_s(IntCC::UnsignedLessThan, x, 113 << 23);
        let o = self.b.ins().select(is_small, small, normal);
        let is_big = self.b.ins().icmp_imm_s(IntCC::UnsignedGreaterThanOrEqual, x, 143 << 23);
        let o = self.b.ins().select(is_big, big, o);
        let sign = self.b.ins().ushr_imm_s(sign, 16);
        self.b.ins().bor(o, sign)
    }

    pub fn fmadd(&mut self, a: Value, b: Value, c: Value) -> Value {
        if self.fma {
            self.b.ins().fma(a, b, c)
        } else {
            let p = self.b.ins().fmul(a, b);
            self.b.ins().fadd(p, c)
        }
    }

    /// `for i in (lo..hi).step_by(step)` with signed i64 bounds.
    pub fn for_range(&mut self, lo: Value, hi: Value, step: i64, body: impl FnOnce(&mut Self, Value)) {
        let header = self.b.create_block();
        self.b.append_block_param(header, I64);
        let blk = self.b.create_block();
        let exit = self.b.create_block();
        self.b.ins().jump(header, &[BlockArg::from(lo)]);
        self.b.switch_to_block(header);
        let i = self.b.block_params(header)[0];
        let c = self.b.ins().icmp(IntCC::SignedLessThan, i, hi);
        self.b.ins().brif(c, blk, &[], exit, &[]);
        self.b.switch_to_block(blk);
        body(self, i);
        let n = self.b.ins().iadd_imm_s(i, step);
        self.b.ins().jump(header, &[BlockArg::from(n)]);
        self.b.switch_to_block(exit);
    }

    pub fn for_n(&mut self, lo: i64, hi: i64, step: i64, body: impl FnOnce(&mut Self, Value)) {
        let lo = self.ic(lo);
        let hi = self.ic(hi);
        self.for_range(lo, hi, step, body)
    }

    /// `if cond { body }` (`cond` an integer truth value).
    pub fn if_then(&mut self, cond: Value, body: impl FnOnce(&mut Self)) {
        let then = self.b.create_block();
        let exit = self.b.create_block();
        self.b.ins().brif(cond, then, &[], exit, &[]);
        self.b.switch_to_block(then);
        body(self);
        self.b.ins().jump(exit, &[]);
        self.b.switch_to_block(exit);
    }

    pub fn imin(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().smin(a, b)
    }

    pub fn imax(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().smax(a, b)
    }

    /// Scalar max that ignores NaN semantics subtleties (`a > b ? a : b`).
    pub fn fmax_s(&mut self, a: Value, b: Value) -> Value {
        let c = self.b.ins().fcmp(FloatCC::GreaterThan, a, b);
        self.b.ins().select(c, a, b)
    }

    pub fn fmin_s(&mut self, a: Value, b: Value) -> Value {
        let c = self.b.ins().fcmp(FloatCC::LessThan, a, b);
        self.b.ins().select(c, a, b)
    }

    /// `mask ? x : y` lane-wise, `mask` the result of a vector `fcmp`.
    pub fn vsel(&mut self, mask: Value, x: Value, y: Value) -> Value {
        let m = self.b.ins().bitcast(F32X4, MemFlagsData::new(), mask);
        self.b.ins().bitselect(m, x, y)
    }

    /// Lane-wise `a > b ? a : b` (one compare and a blend, instead of IEEE `fmax`'s NaN dance).
    pub fn vmax(&mut self, a: Value, b: Value) -> Value {
        let c = self.b.ins().fcmp(FloatCC::GreaterThan, a, b);
        self.vsel(c, a, b)
    }

    pub fn hmax(&mut self, v: Value) -> Value {
        let mut m = self.b.ins().extractlane(v, 0);
        for l in 1..4u8 {
            let x = self.b.ins().extractlane(v, l);
            m = self.fmax_s(m, x);
        }
        m
    }

    pub fn hsum(&mut self, v: Value) -> Value {
        let a = self.b.ins().extractlane(v, 0);
        let b = self.b.ins().extractlane(v, 1);
        let c = self.b.ins().extractlane(v, 2);
        let d = self.b.ins().extractlane(v, 3);
        let ab = self.b.ins().fadd(a, b);
        let cd = self.b.ins().fadd(c, d);
        self.b.ins().fadd(ab, cd)
    }

    /// Lane-wise `exp(x)` for `x <= 88` (Cephes `expf`: range reduction by ln 2, degree-6
    /// polynomial, scale by `2^n` through the exponent bits; about 1 ulp). Lanes below -87,
    /// `-inf` included, give exactly 0, so masked scores carry no weight.
    pub fn vexp(&mut self, x: Value) -> Value {
        let lo = self.splat_c(-87.0);
        let under = self.b.ins().fcmp(FloatCC::LessThan, x, lo);
        let x = self.vsel(under, lo, x);
        let log2e = self.splat_c(std::f32::consts::LOG2_E);
        let t = self.b.ins().fmul(x, log2e);
        let fx = self.b.ins().nearest(t);
        let c1 = self.splat_c(-0.693_359_4);
        let c2 = self.splat_c(2.121_944_4e-4);
        let x = self.fmadd(fx, c1, x);
        let x = self.fmadd(fx, c2, x);
        let coeffs = [1.987_569_1e-4f32, 1.398_2e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5];
        let mut y = self.splat_c(coeffs[0]);
        for &c in &coeffs[1..] {
            let cv = self.splat_c(c);
            y = self.fmadd(y, x, cv);
        }
        let xx = self.b.ins().fmul(x, x);
        let one = self.splat_c(1.0);
        let x1 = self.b.ins().fadd(x, one);
        let y = self.fmadd(y, xx, x1);
        let n = self.b.ins().fcvt_to_sint_sat(types::I32X4, fx);
        let bias = self.b.ins().iconst(I32, 127);
        let bias = self.b.ins().splat(types::I32X4, bias);
        let n = self.b.ins().iadd(n, bias);
        let n = self.b.ins().ishl_imm_s(n, 23);
        let pow2n = self.b.ins().bitcast(F32X4, MemFlagsData::new(), n);
        let r = self.b.ins().fmul(y, pow2n);
        let zero = self.splat_c(0.0);
        self.vsel(under, zero, r)
    }

    /// Scalar f32 `exp` through [`Fx::vexp`].
    pub fn exp_s(&mut self, x: Value) -> Value {
        let v = self.splat(x);
        let e = self.vexp(v);
        self.b.ins().extractlane(e, 0)
    }
}
