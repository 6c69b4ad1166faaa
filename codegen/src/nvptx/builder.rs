//! The one NVPTX kernel builder every foxc GPU kernel is written with, in the style of
//! cranelift-frontend: a thin, infallible layer over an inkwell [`Builder`].
//!
//! * **Infallible.** Methods return values, not `Result`s. LLVM builder errors (an unpositioned
//!   builder, a missing parameter, an unknown dtype) are bugs of the kernel code, not user input,
//!   so the first one is kept, a placeholder value of the right type is returned so emission can
//!   go on, and [`KernelBuilder::finish`] reports it once.
//! * **Structured control flow** ([`control`]): `if_then`, `if_else`, `for_range`, `while_loop`
//!   and `do_while`. Values live across a branch or a loop as *carried values* (one phi per value,
//!   created, fed and named by the construct), or as [`Var`]s (a stack slot that LLVM's `mem2reg`
//!   turns into SSA, like cranelift-frontend's `declare_var / def_var / use_var`).
//! * **Typed helpers** for arithmetic (here), memory and shared memory ([`memory`]), and GPU
//!   intrinsics and inline PTX ([`gpu`]).
//!
//! Values are plain inkwell values (`IntValue`, `FloatValue`, `PointerValue`), so a kernel reads
//! like straight-line code: `let i = b.add(b.mulc(bx, 256), tid);`. Instructions are emitted in
//! Rust evaluation order (arguments before the call), which keeps the IR stable.

pub(crate) mod control;
pub(crate) mod gpu;
pub(crate) mod memory;

use inkwell::attributes::{Attribute, AttributeLoc};
use inkwell::builder::{Builder, BuilderError};
use inkwell::context::Context;
use inkwell::module::{Linkage, Module};
use inkwell::types::{AnyType, BasicMetadataTypeEnum, BasicTypeEnum, FloatType, IntType, PointerType};
use inkwell::values::{
    BasicValue, BasicValueEnum, FloatValue, FunctionValue, InstructionOpcode, IntValue, PointerValue,
};
use inkwell::{AddressSpace, FloatPredicate, IntPredicate};
use std::cell::RefCell;

/// The `ptx_kernel` calling convention of LLVM's NVPTX backend.
pub const PTX_KERNEL_CC: u32 = 71;

/// The type of one kernel parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ParamTy {
    /// A pointer to global memory.
    Ptr,
    I32,
    I64,
    F32,
    /// A 128-byte TMA tensor map passed by value (`.param .align 64 .b8 name[128]`): a `byval`
    /// pointer marked `nvvm.grid_constant`, so the kernel may take its address (the copy
    /// instructions read the map in parameter space) without a local copy.
    TensorMap,
}

/// The 16-bit float type of tensor-core operands (q, k, v and the probabilities fed to the
/// second product): bf16 or IEEE half. Accumulators are f32 either way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Half {
    #[default]
    Bf16,
    F16,
}

impl Half {
    /// The 16-bit float type of a tensor dtype (`None` for any other dtype).
    pub fn of(dt: foxc_ir::DType) -> Option<Half> {
        match dt {
            foxc_ir::DType::BF16 => Some(Half::Bf16),
            foxc_ir::DType::F16 => Some(Half::F16),
            _ => None,
        }
    }

    /// The PTX type name (`bf16`, `f16`), as wgmma's operand types spell it.
    pub fn ptx(self) -> &'static str {
        match self {
            Half::Bf16 => "bf16",
            Half::F16 => "f16",
        }
    }

    /// The IR dtype of a tensor of this type.
    pub fn dtype(self) -> foxc_ir::DType {
        match self {
            Half::Bf16 => foxc_ir::DType::BF16,
            Half::F16 => foxc_ir::DType::F16,
        }
    }

    /// The LLVM float type.
    pub fn float_type<'ctx>(self, ctx: &'ctx Context) -> FloatType<'ctx> {
        match self {
            Half::Bf16 => ctx.bf16_type(),
            Half::F16 => ctx.f16_type(),
        }
    }
}

/// Builds one kernel function. See the module documentation.
pub(crate) struct KernelBuilder<'a, 'ctx> {
    pub ctx: &'ctx Context,
    pub module: &'a Module<'ctx>,
    b: Builder<'ctx>,
    f: FunctionValue<'ctx>,
    /// The first error met while building (reported by [`KernelBuilder::finish`]).
    err: RefCell<Option<String>>,
}

impl<'a, 'ctx> KernelBuilder<'a, 'ctx> {
    /// Declares kernel `name` with `params` (named as given) and positions at its `entry` block.
    /// Errors if the module already defines `name`.
    pub fn kernel(
        ctx: &'ctx Context,
        module: &'a Module<'ctx>,
        name: &str,
        params: &[(&str, ParamTy)],
    ) -> Result<Self, String> {
        if module.get_function(name).is_some() {
            return Err(format!("kernel {name} is defined twice"));
        }
        let gp: BasicMetadataTypeEnum = ctx.ptr_type(AddressSpace::from(1u16)).into();
        let tys: Vec<BasicMetadataTypeEnum> = params
            .iter()
            .map(|(_, t)| match t {
                ParamTy::Ptr => gp,
                ParamTy::I32 => ctx.i32_type().into(),
                ParamTy::I64 => ctx.i64_type().into(),
                ParamTy::F32 => ctx.f32_type().into(),
                ParamTy::TensorMap => ctx.ptr_type(AddressSpace::default()).into(),
            })
            .collect();
        let fty = ctx.void_type().fn_type(&tys, false);
        let f = module.add_function(name, fty, Some(Linkage::External));
        f.set_call_conventions(PTX_KERNEL_CC);
        for (i, _) in params.iter().enumerate().filter(|(_, (_, t))| *t == ParamTy::TensorMap) {
            let map = ctx.i8_type().array_type(128).as_any_type_enum();
            let kind = |n: &str| Attribute::get_named_enum_kind_id(n);
            let loc = AttributeLoc::Param(i as u32);
            f.add_attribute(loc, ctx.create_type_attribute(kind("byval"), map));
            f.add_attribute(loc, ctx.create_enum_attribute(kind("align"), 64));
            f.add_attribute(loc, ctx.create_string_attribute("nvvm.grid_constant", ""));
        }
        for (i, (n, _)) in params.iter().enumerate() {
            if let Some(p) = f.get_nth_param(i as u32) {
                p.set_name(n);
            }
        }
        let b = ctx.create_builder();
        let entry = ctx.append_basic_block(f, "entry");
        b.position_at_end(entry);
        Ok(KernelBuilder { ctx, module, b, f, err: RefCell::new(None) })
    }

    /// Ends the kernel (`ret void` at the current position), verifies it and returns it, or the
    /// first error met while building.
    /// Launch bounds (`.maxntid`, `.minnctapersm`): the kernel runs blocks of at most
    /// `max_threads` threads, and ptxas keeps its registers low enough for `min_blocks` of them
    /// per multiprocessor (`65536 / (max_threads * min_blocks)`, rounded down to its granule).
    pub fn launch_bounds(&self, max_threads: u32, min_blocks: u32) {
        for (k, v) in [("nvvm.maxntid", max_threads), ("nvvm.minctasm", min_blocks)] {
            self.f.add_attribute(AttributeLoc::Function, self.ctx.create_string_attribute(k, &v.to_string()));
        }
    }

    pub fn finish(self) -> Result<FunctionValue<'ctx>, String> {
        let r = self.b.build_return(None);
        self.keep(r.map(|_| ()), || ());
        if let Some(e) = self.err.borrow_mut().take() {
            return Err(format!("building kernel {}: {e}", self.f.get_name().to_string_lossy()));
        }
        if !self.f.verify(true) {
            return Err(format!("LLVM verifier rejected {}", self.f.get_name().to_string_lossy()));
        }
        Ok(self.f)
    }

    // ---- error keeping -------------------------------------------------------------------

    /// Records `msg` unless an earlier error is already kept.
    pub fn fail(&self, msg: impl Into<String>) {
        let mut e = self.err.borrow_mut();
        if e.is_none() {
            *e = Some(msg.into());
        }
    }

    /// The value of `r`, or (after recording the error) `fallback()`.
    pub(crate) fn keep<T>(&self, r: Result<T, BuilderError>, fallback: impl FnOnce() -> T) -> T {
        match r {
            Ok(v) => v,
            Err(e) => {
                self.fail(format!("LLVM builder: {e}"));
                fallback()
            }
        }
    }

    // ---- parameters, types, constants ----------------------------------------------------

    fn param(&self, i: u32) -> Option<BasicValueEnum<'ctx>> {
        let p = self.f.get_nth_param(i);
        if p.is_none() {
            self.fail(format!("parameter {i} missing"));
        }
        p
    }
    pub fn param_ptr(&self, i: u32) -> PointerValue<'ctx> {
        match self.param(i) {
            Some(BasicValueEnum::PointerValue(p)) => p,
            _ => {
                self.fail(format!("parameter {i} is not a pointer"));
                self.gptr().const_null()
            }
        }
    }
    pub fn param_int(&self, i: u32) -> IntValue<'ctx> {
        match self.param(i) {
            Some(BasicValueEnum::IntValue(v)) => v,
            _ => {
                self.fail(format!("parameter {i} is not an integer"));
                self.i32(0)
            }
        }
    }
    pub fn param_f32(&self, i: u32) -> FloatValue<'ctx> {
        match self.param(i) {
            Some(BasicValueEnum::FloatValue(v)) => v,
            _ => {
                self.fail(format!("parameter {i} is not a float"));
                self.f32(0.0)
            }
        }
    }

    pub fn i1t(&self) -> IntType<'ctx> {
        self.ctx.bool_type()
    }
    pub fn i16t(&self) -> IntType<'ctx> {
        self.ctx.i16_type()
    }
    pub fn i32t(&self) -> IntType<'ctx> {
        self.ctx.i32_type()
    }
    pub fn i64t(&self) -> IntType<'ctx> {
        self.ctx.i64_type()
    }
    pub fn f32t(&self) -> FloatType<'ctx> {
        self.ctx.f32_type()
    }
    /// A pointer to global memory (address space 1).
    pub fn gptr(&self) -> PointerType<'ctx> {
        self.ctx.ptr_type(AddressSpace::from(1u16))
    }
    pub fn i32(&self, v: i64) -> IntValue<'ctx> {
        self.i32t().const_int(v as u64, true)
    }
    pub fn i64(&self, v: i64) -> IntValue<'ctx> {
        self.i64t().const_int(v as u64, true)
    }
    pub fn bool(&self, v: bool) -> IntValue<'ctx> {
        self.i1t().const_int(v as u64, false)
    }
    pub fn f32(&self, v: f64) -> FloatValue<'ctx> {
        self.f32t().const_float(v)
    }
    /// The constant `c` of `a`'s integer type.
    pub fn like(&self, a: IntValue<'ctx>, c: i64) -> IntValue<'ctx> {
        a.get_type().const_int(c as u64, true)
    }
    /// Names `v` in the IR (readability of `--emit llvm`; no effect on the code).
    pub fn named<V: BasicValue<'ctx>>(&self, v: V, name: &str) -> V {
        v.as_basic_value_enum().set_name(name);
        v
    }
    /// A zero of type `t` (the placeholder after an error).
    pub(crate) fn zero_of(&self, t: BasicTypeEnum<'ctx>) -> BasicValueEnum<'ctx> {
        t.const_zero()
    }

    // ---- integers ------------------------------------------------------------------------

    pub fn add(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> IntValue<'ctx> {
        self.keep(self.b.build_int_add(a, b, ""), || a)
    }
    pub fn sub(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> IntValue<'ctx> {
        self.keep(self.b.build_int_sub(a, b, ""), || a)
    }
    pub fn mul(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> IntValue<'ctx> {
        self.keep(self.b.build_int_mul(a, b, ""), || a)
    }
    /// `a + c` (no instruction for `c = 0`).
    pub fn addc(&self, a: IntValue<'ctx>, c: i64) -> IntValue<'ctx> {
        if c == 0 {
            return a;
        }
        self.add(a, self.like(a, c))
    }
    pub fn mulc(&self, a: IntValue<'ctx>, c: i64) -> IntValue<'ctx> {
        self.mul(a, self.like(a, c))
    }
    pub fn and(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> IntValue<'ctx> {
        self.keep(self.b.build_and(a, b, ""), || a)
    }
    pub fn andc(&self, a: IntValue<'ctx>, c: i64) -> IntValue<'ctx> {
        self.and(a, self.like(a, c))
    }
    pub fn or(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> IntValue<'ctx> {
        self.keep(self.b.build_or(a, b, ""), || a)
    }
    pub fn orc(&self, a: IntValue<'ctx>, c: i64) -> IntValue<'ctx> {
        self.or(a, self.like(a, c))
    }
    pub fn xor(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> IntValue<'ctx> {
        self.keep(self.b.build_xor(a, b, ""), || a)
    }
    pub fn xorc(&self, a: IntValue<'ctx>, c: i64) -> IntValue<'ctx> {
        self.xor(a, self.like(a, c))
    }
    pub fn not(&self, a: IntValue<'ctx>) -> IntValue<'ctx> {
        self.keep(self.b.build_not(a, ""), || a)
    }
    /// Logical shift right by a constant.
    pub fn lshrc(&self, a: IntValue<'ctx>, c: i64) -> IntValue<'ctx> {
        self.keep(self.b.build_right_shift(a, self.like(a, c), false, ""), || a)
    }
    pub fn sdiv(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> IntValue<'ctx> {
        self.keep(self.b.build_int_signed_div(a, b, ""), || a)
    }
    pub fn sdivc(&self, a: IntValue<'ctx>, c: i64) -> IntValue<'ctx> {
        self.sdiv(a, self.like(a, c))
    }
    pub fn udiv(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> IntValue<'ctx> {
        self.keep(self.b.build_int_unsigned_div(a, b, ""), || a)
    }
    pub fn urem(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> IntValue<'ctx> {
        self.keep(self.b.build_int_unsigned_rem(a, b, ""), || a)
    }
    pub fn udivc(&self, a: IntValue<'ctx>, c: i64) -> IntValue<'ctx> {
        self.keep(self.b.build_int_unsigned_div(a, self.like(a, c), ""), || a)
    }
    pub fn srem(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> IntValue<'ctx> {
        self.keep(self.b.build_int_signed_rem(a, b, ""), || a)
    }
    pub fn uremc(&self, a: IntValue<'ctx>, c: i64) -> IntValue<'ctx> {
        self.keep(self.b.build_int_unsigned_rem(a, self.like(a, c), ""), || a)
    }
    pub fn icmp(&self, p: IntPredicate, a: IntValue<'ctx>, b: IntValue<'ctx>) -> IntValue<'ctx> {
        self.keep(self.b.build_int_compare(p, a, b, ""), || self.bool(false))
    }
    pub fn icmpc(&self, p: IntPredicate, a: IntValue<'ctx>, c: i64) -> IntValue<'ctx> {
        self.icmp(p, a, self.like(a, c))
    }
    /// `c ? a : b` for integers.
    pub fn select_i(&self, c: IntValue<'ctx>, a: IntValue<'ctx>, b: IntValue<'ctx>) -> IntValue<'ctx> {
        self.keep(self.b.build_select(c, a, b, "").map(|v| v.into_int_value()), || a)
    }
    /// Signed minimum (compare and select; LLVM turns it into `llvm.smin`).
    pub fn smin(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> IntValue<'ctx> {
        let c = self.icmp(IntPredicate::SLT, a, b);
        self.select_i(c, a, b)
    }
    pub fn smax(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> IntValue<'ctx> {
        let c = self.icmp(IntPredicate::SGT, a, b);
        self.select_i(c, a, b)
    }
    pub fn sext64(&self, a: IntValue<'ctx>) -> IntValue<'ctx> {
        self.keep(self.b.build_int_s_extend(a, self.i64t(), ""), || self.i64(0))
    }
    /// The low 32 bits of an integer.
    pub fn trunc32(&self, a: IntValue<'ctx>) -> IntValue<'ctx> {
        self.keep(self.b.build_int_truncate(a, self.i32t(), ""), || self.i32(0))
    }
    pub fn zext64(&self, a: IntValue<'ctx>) -> IntValue<'ctx> {
        self.keep(self.b.build_int_z_extend(a, self.i64t(), ""), || self.i64(0))
    }

    // ---- floats --------------------------------------------------------------------------

    pub fn fadd(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> FloatValue<'ctx> {
        self.keep(self.b.build_float_add(a, b, ""), || a)
    }
    pub fn fsub(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> FloatValue<'ctx> {
        self.keep(self.b.build_float_sub(a, b, ""), || a)
    }
    pub fn fmul(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> FloatValue<'ctx> {
        self.keep(self.b.build_float_mul(a, b, ""), || a)
    }
    pub fn fdiv(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> FloatValue<'ctx> {
        self.keep(self.b.build_float_div(a, b, ""), || a)
    }
    /// `a / b` to within 2 ulp over the full range, without the correctly rounded division's
    /// slow path (`div.full.f32`): no branch, so ptxas can interleave independent divisions.
    pub fn fdiv_full(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> FloatValue<'ctx> {
        self.call_f("llvm.nvvm.div.full", &[a.into(), b.into()])
    }
    pub fn fneg(&self, a: FloatValue<'ctx>) -> FloatValue<'ctx> {
        self.keep(self.b.build_float_neg(a, ""), || a)
    }
    pub fn fcmp(&self, p: FloatPredicate, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> IntValue<'ctx> {
        self.keep(self.b.build_float_compare(p, a, b, ""), || self.bool(false))
    }
    /// `c ? a : b` for floats.
    pub fn select_f(&self, c: IntValue<'ctx>, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> FloatValue<'ctx> {
        self.keep(self.b.build_select(c, a, b, "").map(|v| v.into_float_value()), || a)
    }
    /// Fused multiply-add `a * b + c` (`fma.rn.f32`).
    pub fn fma(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>, c: FloatValue<'ctx>) -> FloatValue<'ctx> {
        self.call_f("llvm.fma.f32", &[a.into(), b.into(), c.into()])
    }
    pub fn fmax(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> FloatValue<'ctx> {
        self.call_f("llvm.maxnum.f32", &[a.into(), b.into()])
    }
    pub fn fmin(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> FloatValue<'ctx> {
        self.call_f("llvm.minnum.f32", &[a.into(), b.into()])
    }
    pub fn fabs(&self, a: FloatValue<'ctx>) -> FloatValue<'ctx> {
        self.call_f("llvm.fabs.f32", &[a.into()])
    }
    /// Correctly rounded square root (`sqrt.rn.f32`).
    pub fn sqrt(&self, a: FloatValue<'ctx>) -> FloatValue<'ctx> {
        self.call_f("llvm.sqrt.f32", &[a.into()])
    }
    /// `2^a`, approximate, subnormals flushed (`ex2.approx.ftz.f32`).
    pub fn ex2(&self, a: FloatValue<'ctx>) -> FloatValue<'ctx> {
        self.call_f("llvm.nvvm.ex2.approx.ftz.f32", &[a.into()])
    }
    /// `log2(a)`, approximate (`lg2.approx.f32`).
    pub fn lg2(&self, a: FloatValue<'ctx>) -> FloatValue<'ctx> {
        self.call_f("llvm.nvvm.lg2.approx.f", &[a.into()])
    }
    pub fn sitofp(&self, a: IntValue<'ctx>) -> FloatValue<'ctx> {
        self.keep(self.b.build_signed_int_to_float(a, self.f32t(), ""), || self.f32(0.0))
    }
    /// An index (a row, a key column, below 2^24) as f32. An index built as `x + C` with a
    /// constant `C` (the columns of a score fragment: its first column plus 0, 1, 8, 9, ...)
    /// converts as `f32(x) + C`, so a fragment's elements share one conversion of `x` and a
    /// float add each: the same value (every integer below 2^24 is exact in f32), and one live
    /// base instead of one conversion per column (the warp-specialized consumer spilled 80
    /// bytes with `select(j >= first[b, i], x, -inf)` converting each column).
    pub fn index_f32(&self, ix: IntValue<'ctx>) -> FloatValue<'ctx> {
        let plus_constant =
            ix.as_instruction().filter(|i| i.get_opcode() == InstructionOpcode::Add).and_then(|add| {
                let x = add.get_operand(0)?.value()?.into_int_value();
                let c = add.get_operand(1)?.value()?.into_int_value().get_sign_extended_constant()?;
                Some((x, c))
            });
        match plus_constant {
            Some((x, c)) => self.fadd(self.sitofp(x), self.f32(c as f64)),
            None => self.sitofp(ix),
        }
    }
    /// Converts an f32 to i32, rounding toward zero (poison outside the i32 range: callers clamp).
    pub fn fptosi(&self, a: FloatValue<'ctx>) -> IntValue<'ctx> {
        self.keep(self.b.build_float_to_signed_int(a, self.i32t(), ""), || self.i32(0))
    }
    /// Widens a half-precision float to f32.
    pub fn fpext(&self, a: FloatValue<'ctx>) -> FloatValue<'ctx> {
        self.keep(self.b.build_float_ext(a, self.f32t(), ""), || self.f32(0.0))
    }
    /// Narrows an f32 to `t` (round to nearest even).
    pub fn fptrunc(&self, a: FloatValue<'ctx>, t: FloatType<'ctx>) -> FloatValue<'ctx> {
        self.keep(self.b.build_float_trunc(a, t, ""), || t.const_zero())
    }
    /// Packs two f32 into one b32 of `half` (lo = first), round to nearest even
    /// (`cvt.rn.bf16x2.f32`, `cvt.rn.f16x2.f32`).
    pub fn pack_half2(&self, half: Half, lo: FloatValue<'ctx>, hi: FloatValue<'ctx>) -> IntValue<'ctx> {
        let v = self.vec2_f32(lo, hi);
        let h2 = half.float_type(self.ctx).vec_type(2);
        let t = self.keep(self.b.build_float_trunc(v, h2, ""), || h2.const_zero());
        self.keep(self.b.build_bit_cast(t, self.i32t(), "").map(|v| v.into_int_value()), || self.i32(0))
    }
    /// `<2 x float> (a, b)`.
    pub fn vec2_f32(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> inkwell::values::VectorValue<'ctx> {
        let v2 = self.f32t().vec_type(2);
        let mut v = v2.get_undef();
        for (i, x) in [a, b].into_iter().enumerate() {
            v = self.keep(self.b.build_insert_element(v, x, self.i32(i as i64), ""), || v);
        }
        v
    }
    /// `<n x i32> (xs...)`.
    pub fn vec_i32(&self, xs: &[IntValue<'ctx>]) -> inkwell::values::VectorValue<'ctx> {
        let vt = self.i32t().vec_type(xs.len() as u32);
        let mut v = vt.get_undef();
        for (i, x) in xs.iter().enumerate() {
            v = self.keep(self.b.build_insert_element(v, *x, self.i32(i as i64), ""), || v);
        }
        v
    }
    /// Element `i` of a float vector.
    pub fn extract_f(&self, v: inkwell::values::VectorValue<'ctx>, i: i64) -> FloatValue<'ctx> {
        self.keep(self.b.build_extract_element(v, self.i32(i), "").map(|x| x.into_float_value()), || {
            self.f32(0.0)
        })
    }
    /// Field `i` of a struct value (the results of an intrinsic or inline asm).
    pub fn field(&self, s: inkwell::values::StructValue<'ctx>, i: u32) -> BasicValueEnum<'ctx> {
        let t = s.get_type().get_field_type_at_index(i);
        self.keep(self.b.build_extract_value(s, i, ""), || match t {
            Some(t) => self.zero_of(t),
            None => self.i32(0).into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::control::{basic, floats};
    use super::*;

    fn kernel<'a, 'ctx>(ctx: &'ctx Context, m: &'a Module<'ctx>) -> KernelBuilder<'a, 'ctx> {
        KernelBuilder::kernel(ctx, m, "k", &[("p", ParamTy::Ptr), ("n", ParamTy::I32)]).unwrap()
    }

    /// Every structured construct in one kernel: the function verifies, the carried values get
    /// their phis (named), and the variable disappears under mem2reg.
    #[test]
    fn structured_control_flow_verifies() {
        let ctx = Context::create();
        let m = ctx.create_module("t");
        let b = kernel(&ctx, &m);
        let (p, n) = (b.param_ptr(0), b.param_int(1));
        let acc = b.declare_var(b.f32(0.0).into());
        b.for_range(b.i32(0), n, b.i32(1), |b, i| {
            let x = b.load_f32(b.gep(b.f32t().into(), p, b.sext64(i)));
            b.def_var(acc, b.fadd(b.use_f(acc), x));
        });
        let halves = b.while_loop(
            ("w", "w_body", "w_done"),
            &[("h", n.into())],
            |b, v| b.icmpc(IntPredicate::SGT, v[0].into_int_value(), 1),
            |b, v| vec![b.lshrc(v[0].into_int_value(), 1).into()],
        );
        let last = b.do_while(("d", "d_done"), &[("x", b.f32(1.0).into()), ("k", halves[0])], |b, v| {
            let x = b.fmul(v[0].into_float_value(), b.f32(2.0));
            let k = b.addc(v[1].into_int_value(), -1);
            (b.icmpc(IntPredicate::SGT, k, 0), vec![x.into(), k.into()])
        });
        let pos = b.fcmp(FloatPredicate::OGT, b.use_f(acc), b.f32(0.0));
        let sel = b.if_else(pos, "sel", |b| basic(&[b.use_f(acc)]), |b| basic(&[b.fneg(b.use_f(acc))]));
        let big = b.fcmp(FloatPredicate::OGT, floats(&sel)[0], b.f32(100.0));
        let capped = b.if_then_carry(big, ("cap", "capped"), &[("c", sel[0])], |b| basic(&[b.f32(100.0)]));
        let out = b.fadd(floats(&capped)[0], last[0].into_float_value());
        b.if_then(b.icmpc(IntPredicate::EQ, n, 0), |b| b.store(p, out));
        let f = b.finish().expect("builds");
        let ir = inkwell::values::AnyValue::print_to_string(&f).to_string();
        for name in ["%i = phi i32", "%h = phi i32", "%x = phi float", "%sel = phi float", "%c = phi float"] {
            assert!(ir.contains(name), "{name} missing:\n{ir}");
        }
        assert!(m.verify().is_ok());
    }

    /// A builder error does not stop emission; the first one is what `finish` reports.
    #[test]
    fn first_error_is_kept_and_reported_at_finish() {
        let ctx = Context::create();
        let m = ctx.create_module("t");
        let b = kernel(&ctx, &m);
        let missing = b.param_ptr(7);
        b.store(missing, b.f32(1.0));
        b.fail("a later error");
        let e = b.finish().unwrap_err();
        assert!(e.contains("parameter 7 missing") && !e.contains("later"), "{e}");
    }

    #[test]
    fn a_kernel_is_defined_once() {
        let ctx = Context::create();
        let m = ctx.create_module("t");
        kernel(&ctx, &m).finish().unwrap();
        let e = KernelBuilder::kernel(&ctx, &m, "k", &[]).err().unwrap();
        assert!(e.contains("defined twice"), "{e}");
    }
}
