//! The pruned FoX forward attention kernel (FlashAttention-2 style), emitted as LLVM IR for NVPTX.
//!
//! One thread block owns one query tile of `bm` rows (`bm / 16` warps, 16 rows per warp) and walks
//! its kept key tiles only, from the diagonal tile down to `start[m]`:
//!
//! * `start[m]` is found inside the kernel (no separate launch): a 32-ary search by each warp over
//!   the key-tile ends (`c` is non-increasing, so "tile kept" is monotone in the tile index); two or
//!   three rounds of one load per lane instead of a chain of dependent loads.
//! * sm_90 with `bm = 64` (the default; one warpgroup per block): `S = Q K^T` with
//!   `wgmma.mma_async m64n{bn}k16` (Q and K from shared-memory descriptors, K-major, 128-byte
//!   swizzle) and `O += P V` with `wgmma m64n{D}k16` (P from registers, V as the transposed,
//!   MN-major B operand). Otherwise (sm_80, or `bm = 128`): `mma.sync.m16n8k16` bf16 for both,
//!   Q fragments kept in registers, K and V read with `ldmatrix` (`.trans` for V).
//! * K and V tiles are staged in shared memory with `cp.async` (double buffered: tile n-1 is in
//!   flight while tile n is computed; `fence.proxy.async` before wgmma reads them). Rows are 16-byte
//!   chunks XOR-swizzled by `row & 7` (the wgmma layout splits rows into 64-column panels of
//!   128 bytes, the hardware's 128B swizzle), so no `ldmatrix` phase has bank conflicts.
//! * Scores `s = scale * q.k + (c_i - c_j)`, online softmax with `ex2.approx` (log2 e folded into
//!   one FMA per element); the causal / tail / window mask runs only on tiles that need it.
//! * Query tiles are scheduled longest first (`blockIdx.x` reversed), so blocks with few kept
//!   tiles fill in behind the long ones.
//!
//! # Kernel parameters, in order
//!
//! 1. `q`: bf16 `[BH, T, D]` (global pointer)
//! 2. `k`: bf16 `[BH, T, D]`
//! 3. `v`: bf16 `[BH, T, D]`
//! 4. `c`: f32 `[BH, T]`, the gate cumsum (read only when `has_decay`; pass any valid pointer otherwise)
//! 5. `delta`: f32 `[BH, Mt]`, `Mt = ceil(T / bm)`, per query tile (read only when `prune`)
//! 6. `out`: `[BH, T, D]`, **f32**, or **bf16** (round to nearest even) when `out_bf16` is set
//!    (the backend sets it when the attention's only user is a cast to bf16, so no cast pass runs)
//! 7. `lse`: f32 `[BH, T]`, natural-log log-sum-exp of the (kept) scores of each row
//! 8. `T`: i32, the sequence length (any T >= 1; tails are masked)
//!
//! Launch with [`launch_geometry`]; the kernel needs `shared_bytes` of dynamic shared memory
//! (above 48 KiB, so the launcher must raise `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`).
//!
//! Supported: `head_dim` 64 or 128 (others are rejected with an error for now), `bm` 64 or 128,
//! `bn` a multiple of 16 up to 128, bf16 inputs, sm_80 (mma.sync) and sm_90 (wgmma when bm = 64;
//! the PTX then needs `sm_90a`). Measured on the H200: docs/GPU_KERNEL.md.

use super::llvm_util::{be, call_declared};
use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::module::{Linkage, Module};
use inkwell::types::{BasicMetadataTypeEnum, BasicType, BasicTypeEnum};
use inkwell::values::BasicValue;
use inkwell::values::{
    BasicMetadataValueEnum, BasicValueEnum, FloatValue, FunctionValue, IntValue, PointerValue,
};
use inkwell::{AddressSpace, FloatPredicate, IntPredicate};

/// Element type of q, k, v.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnDtype {
    Bf16,
}

/// One attention kernel configuration (tile sizes and rule come from the IR attributes).
#[derive(Debug, Clone, PartialEq)]
pub struct AttnKernelConfig {
    pub head_dim: u32,
    pub bm: u32,
    pub bn: u32,
    pub scale: f32,
    pub has_decay: bool,
    pub window: Option<u32>,
    /// Start each query tile at `start[m]` found from `delta` by an in-kernel search.
    pub prune: bool,
    pub dtype_in: AttnDtype,
    /// 80 or 90 (the same code; recorded for the kernel name).
    pub sm: u32,
    /// Write O as bf16 instead of f32 (the output cast fused into the epilogue). The LSE stays f32.
    pub out_bf16: bool,
}

impl AttnKernelConfig {
    /// The standard configuration for a head dimension: bm = 64 (4 warps, two blocks per SM;
    /// measured faster than bm = 128 on the H200, docs/GPU_KERNEL.md), bn = 64.
    pub fn new(head_dim: u32, has_decay: bool, prune: bool) -> Self {
        AttnKernelConfig {
            head_dim,
            bm: 64,
            bn: 64,
            scale: 1.0 / (head_dim as f32).sqrt(),
            has_decay,
            window: None,
            prune,
            dtype_in: AttnDtype::Bf16,
            sm: 90,
            out_bf16: false,
        }
    }

    /// Kernel symbol name; distinct for every configuration so several fit in one module.
    pub fn kernel_name(&self) -> String {
        format!(
            "foxc_attn_fwd_d{}_bm{}_bn{}{}{}{}{}{}_s{:08x}_sm{}",
            self.head_dim,
            self.bm,
            self.bn,
            if self.block_rows() != self.bm { format!("_k{}", self.block_rows()) } else { String::new() },
            if self.has_decay { "_decay" } else { "" },
            if self.prune { "_prune" } else { "" },
            match self.window {
                Some(w) => format!("_w{w}"),
                None => String::new(),
            },
            if self.out_bf16 { "_obf16" } else { "" },
            self.scale.to_bits(),
            self.sm
        )
    }

    /// Query rows per thread block. `bm` is the pruning tile of the IR (delta and start are per
    /// bm rows); on sm_90 the kernel always works in 64-row blocks (one warpgroup, two blocks per
    /// SM) and a 128-row tile is covered by two blocks that share its `start` (the search uses the
    /// tile's first row and its delta, so the kept set is exactly the tile's).
    pub fn block_rows(&self) -> u32 {
        if self.sm == 90 && self.bm.is_multiple_of(64) {
            64
        } else {
            self.bm
        }
    }

    fn threads(&self) -> u32 {
        self.block_rows() / 16 * 32
    }

    /// Dynamic shared memory: Q tile, two buffers each of K and V, two buffers of the per-column
    /// bias `(c_ref - c_j) * log2 e` (decay only).
    fn shared_bytes(&self) -> u32 {
        (self.block_rows() + 4 * self.bn) * self.head_dim * 2
            + if self.has_decay { 2 * self.bn * 4 } else { 0 }
    }

    /// Errors for configurations this kernel does not implement.
    pub fn validate(&self) -> Result<(), String> {
        if self.head_dim != 64 && self.head_dim != 128 {
            return Err(format!("GPU attention supports head_dim 64 and 128 for now, got {}", self.head_dim));
        }
        if self.bm != 64 && self.bm != 128 {
            return Err(format!("GPU attention needs bm = 64 or 128, got {}", self.bm));
        }
        if self.bn == 0 || !self.bn.is_multiple_of(16) || self.bn > 128 {
            return Err(format!("GPU attention needs bn a multiple of 16 up to 128, got {}", self.bn));
        }
        let chunks = self.bn * self.head_dim / 8;
        if !chunks.is_multiple_of(self.threads()) {
            return Err(format!(
                "GPU attention: a {}x{} K tile does not split evenly over {} threads",
                self.bn,
                self.head_dim,
                self.threads()
            ));
        }
        if self.sm != 80 && self.sm != 90 {
            return Err(format!("GPU attention targets sm_80 or sm_90, got sm_{}", self.sm));
        }
        if !self.scale.is_finite() {
            return Err("GPU attention: scale must be finite".into());
        }
        if self.window == Some(0) {
            return Err("GPU attention: window must be at least 1".into());
        }
        Ok(())
    }
}

/// Grid, block and dynamic shared memory of one launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchGeometry {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub shared_bytes: u32,
}

/// Launch geometry for sequence length `t` and `bh` = batch x heads:
/// grid (Mt, BH, 1), one block per query tile.
pub fn launch_geometry(cfg: &AttnKernelConfig, t: u64, bh: u64) -> LaunchGeometry {
    let mt = t.div_ceil(cfg.block_rows().max(1) as u64);
    LaunchGeometry {
        grid: (mt as u32, bh as u32, 1),
        block: (cfg.threads(), 1, 1),
        shared_bytes: cfg.shared_bytes(),
    }
}

/// Adds the kernel for `cfg` to `module` (named [`AttnKernelConfig::kernel_name`]) and returns it.
/// If the module already holds it, returns the existing function.
pub fn build_attention_kernel<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    cfg: &AttnKernelConfig,
) -> Result<FunctionValue<'ctx>, String> {
    cfg.validate()?;
    let name = cfg.kernel_name();
    if let Some(f) = module.get_function(&name) {
        return Ok(f);
    }
    let mut g = Gen::new(ctx, module, cfg);
    g.build(&name)
}

const LOG2E: f64 = std::f64::consts::LOG2_E;
const LN2: f64 = std::f64::consts::LN_2;
/// The kernel calling convention (`ptx_kernel`) of the NVPTX backend.
const PTX_KERNEL_CC: u32 = 71;

struct Gen<'a, 'ctx> {
    ctx: &'ctx Context,
    module: &'a Module<'ctx>,
    b: Builder<'ctx>,
    cfg: AttnKernelConfig,
}

/// Per-thread constant values used everywhere in the body.
struct Env<'ctx> {
    f: FunctionValue<'ctx>,
    smem: PointerValue<'ctx>,
    tid: IntValue<'ctx>,
    lane: IntValue<'ctx>,
    t_len: IntValue<'ctx>,
}

impl<'a, 'ctx> Gen<'a, 'ctx> {
    fn new(ctx: &'ctx Context, module: &'a Module<'ctx>, cfg: &AttnKernelConfig) -> Self {
        Gen { ctx, module, b: ctx.create_builder(), cfg: cfg.clone() }
    }

    // ---- small helpers -------------------------------------------------------------------

    fn i32t(&self) -> inkwell::types::IntType<'ctx> {
        self.ctx.i32_type()
    }
    fn f32t(&self) -> inkwell::types::FloatType<'ctx> {
        self.ctx.f32_type()
    }
    fn ci(&self, v: i64) -> IntValue<'ctx> {
        self.i32t().const_int(v as u64, true)
    }
    fn ci64(&self, v: i64) -> IntValue<'ctx> {
        self.ctx.i64_type().const_int(v as u64, true)
    }
    fn cf(&self, v: f64) -> FloatValue<'ctx> {
        self.f32t().const_float(v)
    }
    fn gptr(&self) -> inkwell::types::PointerType<'ctx> {
        self.ctx.ptr_type(AddressSpace::from(1u16))
    }

    /// Declares (once) and calls an intrinsic or other external function by name.
    fn call(
        &self,
        name: &str,
        ret: Option<BasicTypeEnum<'ctx>>,
        args: &[BasicValueEnum<'ctx>],
    ) -> Result<Option<BasicValueEnum<'ctx>>, String> {
        call_declared(self.ctx, self.module, &self.b, name, ret, args)
    }
    fn call_i(&self, name: &str, args: &[BasicValueEnum<'ctx>]) -> Result<IntValue<'ctx>, String> {
        let r = self.call(name, Some(self.i32t().into()), args)?;
        r.map(|v| v.into_int_value()).ok_or_else(|| format!("{name}: no value"))
    }
    fn call_f(&self, name: &str, args: &[BasicValueEnum<'ctx>]) -> Result<FloatValue<'ctx>, String> {
        let r = self.call(name, Some(self.f32t().into()), args)?;
        r.map(|v| v.into_float_value()).ok_or_else(|| format!("{name}: no value"))
    }
    fn sreg(&self, name: &str) -> Result<IntValue<'ctx>, String> {
        self.call_i(&format!("llvm.nvvm.read.ptx.sreg.{name}"), &[])
    }

    fn add(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> Result<IntValue<'ctx>, String> {
        self.b.build_int_add(a, b, "").map_err(be)
    }
    fn sub(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> Result<IntValue<'ctx>, String> {
        self.b.build_int_sub(a, b, "").map_err(be)
    }
    fn mul(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> Result<IntValue<'ctx>, String> {
        self.b.build_int_mul(a, b, "").map_err(be)
    }
    fn addc(&self, a: IntValue<'ctx>, c: i64) -> Result<IntValue<'ctx>, String> {
        if c == 0 {
            return Ok(a);
        }
        let k = if a.get_type().get_bit_width() == 64 { self.ci64(c) } else { self.ci(c) };
        self.add(a, k)
    }
    fn mulc(&self, a: IntValue<'ctx>, c: i64) -> Result<IntValue<'ctx>, String> {
        let k = if a.get_type().get_bit_width() == 64 { self.ci64(c) } else { self.ci(c) };
        self.mul(a, k)
    }
    fn icmp(&self, p: IntPredicate, a: IntValue<'ctx>, b: IntValue<'ctx>) -> Result<IntValue<'ctx>, String> {
        self.b.build_int_compare(p, a, b, "").map_err(be)
    }
    fn seli(
        &self,
        c: IntValue<'ctx>,
        a: IntValue<'ctx>,
        b: IntValue<'ctx>,
    ) -> Result<IntValue<'ctx>, String> {
        Ok(self.b.build_select(c, a, b, "").map_err(be)?.into_int_value())
    }
    fn self_(
        &self,
        c: IntValue<'ctx>,
        a: FloatValue<'ctx>,
        b: FloatValue<'ctx>,
    ) -> Result<FloatValue<'ctx>, String> {
        Ok(self.b.build_select(c, a, b, "").map_err(be)?.into_float_value())
    }
    fn smin(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> Result<IntValue<'ctx>, String> {
        let c = self.icmp(IntPredicate::SLT, a, b)?;
        self.seli(c, a, b)
    }
    fn smax(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> Result<IntValue<'ctx>, String> {
        let c = self.icmp(IntPredicate::SGT, a, b)?;
        self.seli(c, a, b)
    }
    fn sext64(&self, a: IntValue<'ctx>) -> Result<IntValue<'ctx>, String> {
        self.b.build_int_s_extend(a, self.ctx.i64_type(), "").map_err(be)
    }
    fn fmul(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> Result<FloatValue<'ctx>, String> {
        self.b.build_float_mul(a, b, "").map_err(be)
    }
    fn fsub(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> Result<FloatValue<'ctx>, String> {
        self.b.build_float_sub(a, b, "").map_err(be)
    }
    fn fadd(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> Result<FloatValue<'ctx>, String> {
        self.b.build_float_add(a, b, "").map_err(be)
    }
    fn fma(
        &self,
        a: FloatValue<'ctx>,
        b: FloatValue<'ctx>,
        c: FloatValue<'ctx>,
    ) -> Result<FloatValue<'ctx>, String> {
        self.call_f("llvm.fma.f32", &[a.into(), b.into(), c.into()])
    }
    fn fmax(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> Result<FloatValue<'ctx>, String> {
        self.call_f("llvm.maxnum.f32", &[a.into(), b.into()])
    }
    fn ex2(&self, a: FloatValue<'ctx>) -> Result<FloatValue<'ctx>, String> {
        self.call_f("llvm.nvvm.ex2.approx.ftz.f32", &[a.into()])
    }
    fn shfl_xor(&self, v: FloatValue<'ctx>, m: i64) -> Result<FloatValue<'ctx>, String> {
        self.call_f(
            "llvm.nvvm.shfl.sync.bfly.f32",
            &[self.ci(-1).into(), v.into(), self.ci(m).into(), self.ci(31).into()],
        )
    }
    fn gep_g(
        &self,
        elem: BasicTypeEnum<'ctx>,
        p: PointerValue<'ctx>,
        idx: IntValue<'ctx>,
    ) -> Result<PointerValue<'ctx>, String> {
        unsafe { self.b.build_in_bounds_gep(elem, p, &[idx], "").map_err(be) }
    }
    fn smem_at(&self, env: &Env<'ctx>, off: IntValue<'ctx>) -> Result<PointerValue<'ctx>, String> {
        self.gep_g(self.ctx.i8_type().into(), env.smem, off)
    }
    fn load_f32(&self, p: PointerValue<'ctx>) -> Result<FloatValue<'ctx>, String> {
        Ok(self.b.build_load(self.f32t(), p, "").map_err(be)?.into_float_value())
    }
    fn barrier(&self) -> Result<(), String> {
        // bar.sync 0 (the name LLVM 22 knows; `barrier0` is only auto-upgraded from text IR).
        self.call("llvm.nvvm.barrier.cta.sync.aligned.all", None, &[self.ci(0).into()])?;
        Ok(())
    }

    /// ldmatrix .x4 (optionally .trans) from a shared address; returns four b32 registers.
    fn ldmatrix(&self, p: PointerValue<'ctx>, trans: bool) -> Result<[IntValue<'ctx>; 4], String> {
        let i32t = self.i32t();
        let st = self.ctx.struct_type(&[i32t.into(), i32t.into(), i32t.into(), i32t.into()], false);
        let name = if trans {
            "llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4.trans.b16.p3"
        } else {
            "llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4.b16.p3"
        };
        let r =
            self.call(name, Some(st.into()), &[p.into()])?.ok_or("ldmatrix: no value")?.into_struct_value();
        let mut out = [self.ci(0); 4];
        for (i, o) in out.iter_mut().enumerate() {
            *o = self.b.build_extract_value(r, i as u32, "").map_err(be)?.into_int_value();
        }
        Ok(out)
    }

    /// d = a(16x16 bf16) * b(16x8 bf16) + c (f32), the m16n8k16 fragment layout.
    fn mma(
        &self,
        a: &[IntValue<'ctx>; 4],
        b0: IntValue<'ctx>,
        b1: IntValue<'ctx>,
        c: &[FloatValue<'ctx>],
    ) -> Result<[FloatValue<'ctx>; 4], String> {
        let f = self.f32t();
        let st = self.ctx.struct_type(&[f.into(), f.into(), f.into(), f.into()], false);
        let args: Vec<BasicValueEnum> = vec![
            a[0].into(),
            a[1].into(),
            a[2].into(),
            a[3].into(),
            b0.into(),
            b1.into(),
            c[0].into(),
            c[1].into(),
            c[2].into(),
            c[3].into(),
        ];
        let r = self
            .call("llvm.nvvm.mma.m16n8k16.row.col.bf16", Some(st.into()), &args)?
            .ok_or("mma: no value")?
            .into_struct_value();
        let mut out = [self.cf(0.0); 4];
        for (i, o) in out.iter_mut().enumerate() {
            *o = self.b.build_extract_value(r, i as u32, "").map_err(be)?.into_float_value();
        }
        Ok(out)
    }

    /// Packs two f32 into one b32 of bf16 (lo = first column), round to nearest even.
    fn pack_bf16(&self, lo: FloatValue<'ctx>, hi: FloatValue<'ctx>) -> Result<IntValue<'ctx>, String> {
        let v2 = self.f32t().vec_type(2);
        let mut v = v2.get_undef();
        v = self.b.build_insert_element(v, lo, self.ci(0), "").map_err(be)?;
        v = self.b.build_insert_element(v, hi, self.ci(1), "").map_err(be)?;
        let bf2 = self.ctx.bf16_type().vec_type(2);
        let t = self.b.build_float_trunc(v, bf2, "").map_err(be)?;
        Ok(self.b.build_bit_cast(t, self.i32t(), "").map_err(be)?.into_int_value())
    }

    /// Byte offset in a swizzled tile of `D` bf16 per row: chunk `ch` (16 bytes) of row `row`.
    fn swz(&self, row: IntValue<'ctx>, ch: IntValue<'ctx>) -> Result<IntValue<'ctx>, String> {
        let d = self.cfg.head_dim as i64;
        let r7 = self.b.build_and(row, self.ci(7), "").map_err(be)?;
        let c = self.b.build_xor(ch, r7, "").map_err(be)?;
        let a = self.mulc(row, d * 2)?;
        let b = self.mulc(c, 16)?;
        self.add(a, b)
    }

    /// Byte offset in the wgmma layout (K-major, 128-byte swizzle): the tile is split into panels
    /// of 64 bf16 columns; in a panel each row is 128 bytes and chunk `c` of row `r` lands at
    /// chunk `c ^ (r & 7)` (the hardware's 128B swizzle on a 1024-byte aligned atom).
    fn swz_panel(
        &self,
        row: IntValue<'ctx>,
        ch: IntValue<'ctx>,
        rows: u32,
    ) -> Result<IntValue<'ctx>, String> {
        let r7 = self.b.build_and(row, self.ci(7), "").map_err(be)?;
        let c8 = self.b.build_and(ch, self.ci(7), "").map_err(be)?;
        let panel = self.b.build_right_shift(ch, self.ci(3), false, "").map_err(be)?;
        let c = self.b.build_xor(c8, r7, "").map_err(be)?;
        let a = self.add(self.mulc(panel, rows as i64 * 128)?, self.mulc(row, 128)?)?;
        self.add(a, self.mulc(c, 16)?)
    }

    /// Inline PTX with side effects (kept in order with the other side-effecting asm).
    fn asm(
        &self,
        text: &str,
        constraints: &str,
        ret: Option<BasicTypeEnum<'ctx>>,
        args: &[BasicValueEnum<'ctx>],
    ) -> Result<Option<BasicValueEnum<'ctx>>, String> {
        let params: Vec<BasicMetadataTypeEnum> = args.iter().map(|a| a.get_type().into()).collect();
        let fty = match ret {
            Some(r) => r.fn_type(&params, false),
            None => self.ctx.void_type().fn_type(&params, false),
        };
        let asm = self.ctx.create_inline_asm(
            fty,
            text.to_string(),
            constraints.to_string(),
            true,
            false,
            None,
            false,
        );
        let margs: Vec<BasicMetadataValueEnum> = args.iter().map(|a| (*a).into()).collect();
        let cs = self.b.build_indirect_call(fty, asm, &margs, "").map_err(be)?;
        Ok(match cs.try_as_basic_value() {
            inkwell::values::ValueKind::Basic(v) => Some(v),
            _ => None,
        })
    }

    /// An asm that returns `vals` unchanged but after `text` (so no use moves above it).
    fn asm_pass(&self, text: &str, vals: &[FloatValue<'ctx>]) -> Result<Vec<FloatValue<'ctx>>, String> {
        let n = vals.len();
        let f = self.f32t();
        let st = self.ctx.struct_type(&vec![f.into(); n], false);
        let mut cons: Vec<String> = (0..n).map(|_| "=f".to_string()).collect();
        cons.extend((0..n).map(|i| i.to_string()));
        let args: Vec<BasicValueEnum> = vals.iter().map(|v| (*v).into()).collect();
        let r = self
            .asm(text, &cons.join(","), Some(st.into()), &args)?
            .ok_or("asm: no value")?
            .into_struct_value();
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            out.push(self.b.build_extract_value(r, i as u32, "").map_err(be)?.into_float_value());
        }
        Ok(out)
    }

    /// wgmma m64nNk16 bf16 -> f32, A and B from shared memory descriptors, accumulating into `acc`
    /// (N/2 values per thread, in the mma.m16n8 C-fragment order per 8 columns).
    fn wgmma(
        &self,
        acc: &[FloatValue<'ctx>],
        da: IntValue<'ctx>,
        db: IntValue<'ctx>,
    ) -> Result<Vec<FloatValue<'ctx>>, String> {
        let n = acc.len();
        let regs: Vec<String> = (0..n).map(|i| format!("${i}")).collect();
        let text = format!(
            "{{\n.reg .pred p;\nsetp.ne.b32 p, ${}, 0;\nwgmma.mma_async.sync.aligned.m64n{}k16.f32.bf16.bf16 {{{}}}, ${}, ${}, p, 1, 1, 0, 0;\n}}",
            2 * n + 2,
            2 * n,
            regs.join(", "),
            2 * n,
            2 * n + 1
        );
        let mut cons: Vec<String> = (0..n).map(|_| "=f".to_string()).collect();
        cons.extend((0..n).map(|i| i.to_string()));
        cons.push("l".into());
        cons.push("l".into());
        cons.push("r".into());
        let f = self.f32t();
        let st = self.ctx.struct_type(&vec![f.into(); n], false);
        let mut args: Vec<BasicValueEnum> = acc.iter().map(|v| (*v).into()).collect();
        args.push(da.into());
        args.push(db.into());
        args.push(self.ci(1).into());
        let r = self
            .asm(&text, &cons.join(","), Some(st.into()), &args)?
            .ok_or("wgmma: no value")?
            .into_struct_value();
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            out.push(self.b.build_extract_value(r, i as u32, "").map_err(be)?.into_float_value());
        }
        Ok(out)
    }

    /// wgmma m64nNk16 with A (bf16, the warp's 16 rows in mma.m16n8k16 A-fragment order) from
    /// registers and B from a transposed (MN-major) shared-memory descriptor.
    fn wgmma_rs(
        &self,
        acc: &[FloatValue<'ctx>],
        a: &[IntValue<'ctx>; 4],
        db: IntValue<'ctx>,
    ) -> Result<Vec<FloatValue<'ctx>>, String> {
        let n = acc.len();
        let regs: Vec<String> = (0..n).map(|i| format!("${i}")).collect();
        let text = format!(
            "{{\n.reg .pred p;\nsetp.ne.b32 p, ${}, 0;\nwgmma.mma_async.sync.aligned.m64n{}k16.f32.bf16.bf16 {{{}}}, {{${}, ${}, ${}, ${}}}, ${}, p, 1, 1, 1;\n}}",
            2 * n + 5,
            2 * n,
            regs.join(", "),
            2 * n,
            2 * n + 1,
            2 * n + 2,
            2 * n + 3,
            2 * n + 4
        );
        let mut cons: Vec<String> = (0..n).map(|_| "=f".to_string()).collect();
        cons.extend((0..n).map(|i| i.to_string()));
        cons.extend(["r", "r", "r", "r", "l", "r"].iter().map(|c| c.to_string()));
        let f = self.f32t();
        let st = self.ctx.struct_type(&vec![f.into(); n], false);
        let mut args: Vec<BasicValueEnum> = acc.iter().map(|v| (*v).into()).collect();
        args.extend(a.iter().map(|v| BasicValueEnum::from(*v)));
        args.push(db.into());
        args.push(self.ci(1).into());
        let r = self
            .asm(&text, &cons.join(","), Some(st.into()), &args)?
            .ok_or("wgmma: no value")?
            .into_struct_value();
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            out.push(self.b.build_extract_value(r, i as u32, "").map_err(be)?.into_float_value());
        }
        Ok(out)
    }

    /// Shared-memory matrix descriptor (sm_90): 128B swizzle, stride 1024 B between 8-row groups.
    /// `lbo`: for K-major operands unused (16); for MN-major ones (V, transposed) the byte stride
    /// between 64-element panels along N.
    fn gmma_desc(&self, env: &Env<'ctx>, off: IntValue<'ctx>, lbo: i64) -> Result<IntValue<'ctx>, String> {
        let i64t = self.ctx.i64_type();
        let base = self.b.build_ptr_to_int(env.smem, i64t, "").map_err(be)?;
        let addr = self.add(base, self.b.build_int_z_extend(off, i64t, "").map_err(be)?)?;
        let a = self.b.build_right_shift(addr, self.ci64(4), false, "").map_err(be)?;
        let a = self.b.build_and(a, self.ci64(0x3FFF), "").map_err(be)?;
        let hi = ((lbo >> 4) << 16) | (64i64 << 32) | (1i64 << 62);
        self.b.build_or(a, self.ci64(hi), "").map_err(be)
    }

    /// Issues cp.async of `rows` rows of a [T, D] bf16 matrix starting at row `r0` (rows past
    /// T-1 are clamped to T-1: their values are masked or discarded) into the tile at `dst_off`.
    fn load_tile(
        &self,
        env: &Env<'ctx>,
        src: PointerValue<'ctx>,
        r0: IntValue<'ctx>,
        rows: u32,
        dst_off: IntValue<'ctx>,
        panels: bool,
    ) -> Result<(), String> {
        let d = self.cfg.head_dim;
        let cpr = d / 8; // 16-byte chunks per row
        let total = rows * cpr;
        let nth = self.cfg.threads();
        let tmax = self.addc(env.t_len, -1)?;
        let ch = self.b.build_and(env.tid, self.ci(cpr as i64 - 1), "").map_err(be)?;
        let row_base =
            self.b.build_right_shift(env.tid, self.ci(cpr.trailing_zeros() as i64), false, "").map_err(be)?;
        for it in 0..total / nth {
            let row = self.addc(row_base, (it * nth / cpr) as i64)?;
            let grow = self.smin(self.add(r0, row)?, tmax)?;
            let eidx = self.add(self.mulc(grow, d as i64)?, self.mulc(ch, 8)?)?;
            let gp = self.gep_g(self.ctx.i16_type().into(), src, self.sext64(eidx)?)?;
            let lo = if panels { self.swz_panel(row, ch, rows)? } else { self.swz(row, ch)? };
            let so = self.add(dst_off, lo)?;
            let sp = self.smem_at(env, so)?;
            self.call("llvm.nvvm.cp.async.cg.shared.global.16", None, &[sp.into(), gp.into()])?;
        }
        Ok(())
    }

    // ---- the kernel ----------------------------------------------------------------------

    fn build(&mut self, name: &str) -> Result<FunctionValue<'ctx>, String> {
        let cfg = self.cfg.clone();
        let d = cfg.head_dim as i64;
        let bm = cfg.block_rows() as i64; // rows of this block (the IR tile is cfg.bm)
        let bn = cfg.bn as i64;
        let nt = (cfg.bn / 8) as usize; // n-tiles of 8 keys in S
        let kd = (cfg.head_dim / 16) as usize; // k-steps over D
        let dt = (cfg.head_dim / 8) as usize; // n-tiles of 8 dims in O
        let f32t = self.f32t();
        let i32t = self.i32t();
        let gp = self.gptr();
        // S = Q K^T on the Hopper tensor-core path (one warpgroup per 64 query rows).
        let wg = cfg.sm == 90 && bm == 64;

        let fty = self.ctx.void_type().fn_type(
            &[gp.into(), gp.into(), gp.into(), gp.into(), gp.into(), gp.into(), gp.into(), i32t.into()],
            false,
        );
        let f = self.module.add_function(name, fty, Some(Linkage::External));
        f.set_call_conventions(PTX_KERNEL_CC);
        let pnames = ["q", "k", "v", "c", "delta", "out", "lse", "T"];
        for (i, n) in pnames.iter().enumerate() {
            if let Some(p) = f.get_nth_param(i as u32) {
                p.set_name(n);
            }
        }
        let param = |i: u32| f.get_nth_param(i).ok_or_else(|| format!("param {i} missing"));
        let q_p = param(0)?.into_pointer_value();
        let k_p = param(1)?.into_pointer_value();
        let v_p = param(2)?.into_pointer_value();
        let c_p = param(3)?.into_pointer_value();
        let delta_p = param(4)?.into_pointer_value();
        let out_p = param(5)?.into_pointer_value();
        let lse_p = param(6)?.into_pointer_value();
        let t_len = param(7)?.into_int_value();

        // Dynamic shared memory: one extern array per kernel name (PTX aliases them anyway).
        let smem_name = format!("{name}_smem");
        let smem_g = match self.module.get_global(&smem_name) {
            Some(g) => g,
            None => {
                let g = self.module.add_global(
                    self.ctx.i8_type().array_type(0),
                    Some(AddressSpace::from(3u16)),
                    &smem_name,
                );
                g.set_linkage(Linkage::External);
                // 1024: the wgmma 128-byte swizzle atom is 8 rows x 128 B.
                g.set_alignment(1024);
                g
            }
        };

        let entry = self.ctx.append_basic_block(f, "entry");
        self.b.position_at_end(entry);

        let tid = self.sreg("tid.x")?;
        let lane = self.b.build_and(tid, self.ci(31), "lane").map_err(be)?;
        let warp = self.b.build_right_shift(tid, self.ci(5), false, "warp").map_err(be)?;
        let env = Env { f, smem: smem_g.as_pointer_value(), tid, lane, t_len };
        let bx = self.sreg("ctaid.x")?;
        let nbx = self.sreg("nctaid.x")?;
        let bh = self.sreg("ctaid.y")?;
        // Longest first: blockIdx.x = 0 takes the last query tile.
        let m = self.sub(self.addc(nbx, -1)?, bx)?;
        let i0 = self.mulc(m, bm)?;
        let tmax = self.addc(t_len, -1)?;
        let i_last = self.smin(self.addc(i0, bm - 1)?, tmax)?;
        let n_end = self.b.build_int_signed_div(i_last, self.ci(bn), "n_end").map_err(be)?;

        // Per-(b,h) base pointers (64-bit offsets).
        let bh64 = self.sext64(bh)?;
        let t64 = self.sext64(t_len)?;
        let row_base = self.b.build_int_mul(bh64, t64, "").map_err(be)?; // bh*T
        let mat_base = self.mulc(row_base, d)?; // bh*T*D
        let i16t: BasicTypeEnum = self.ctx.i16_type().into();
        let qb = self.gep_g(i16t, q_p, mat_base)?;
        let kb = self.gep_g(i16t, k_p, mat_base)?;
        let vb = self.gep_g(i16t, v_p, mat_base)?;
        // O element type: f32, or bf16 (stored as i16 bit patterns) with the cast fused.
        let o_elt: BasicTypeEnum = if cfg.out_bf16 { i16t } else { f32t.into() };
        let ob = self.gep_g(o_elt, out_p, mat_base)?;
        let cb = self.gep_g(f32t.into(), c_p, row_base)?;
        let lb = self.gep_g(f32t.into(), lse_p, row_base)?;

        // ---- Q load (its own cp.async group) and first K/V tile ----
        let q_off = self.ci(0);
        let kv_bytes = bn * d * 2;
        let k_off = [self.ci(bm * d * 2), self.ci(bm * d * 2 + 2 * kv_bytes)];
        let v_off = [self.ci(bm * d * 2 + kv_bytes), self.ci(bm * d * 2 + 3 * kv_bytes)];
        self.load_tile(&env, qb, i0, bm as u32, q_off, wg)?;
        self.call("llvm.nvvm.cp.async.commit.group", None, &[])?;
        let j_end0 = self.mulc(n_end, bn)?;
        self.load_tile(&env, kb, j_end0, cfg.bn, k_off[0], wg)?;
        self.load_tile(&env, vb, j_end0, cfg.bn, v_off[0], wg)?;
        self.call("llvm.nvvm.cp.async.commit.group", None, &[])?;

        // Per-column bias in log2 units relative to c_ref = c[i0]: b_j = (c_ref - c_j) * log2 e.
        // Kept keys have |c_ref - c_j| bounded by |delta| + the tile span, so the relative value
        // keeps its precision, and the row term (c_i - c_ref) cancels in the softmax (it returns
        // only in the LSE). One thread per column writes it to shared memory once per tile.
        let l2e = self.cf(LOG2E);
        let colb_base = bm * d * 2 + 4 * kv_bytes;
        let colb_off = [self.ci(colb_base), self.ci(colb_base + bn * 4)];
        let c_ref = if cfg.has_decay {
            let cr = self.load_f32(self.gep_g(f32t.into(), cb, self.sext64(i0)?)?)?;
            let cj = self.load_col_c(&env, cb, n_end)?;
            self.store_colb(&env, cr, cj, colb_off[0])?;
            Some(cr)
        } else {
            None
        };

        // ---- start tile: window bound and the in-kernel pruning search ----
        let mut n_start = self.ci(0);
        if let Some(w) = cfg.window {
            // A tile is outside every row's window iff i0 - jend(n) >= w: keep the first tile whose
            // end reaches the first row's window start.
            let x = self.addc(i0, 1 - w as i64)?;
            let x = self.smax(x, self.ci(0))?;
            n_start = self.b.build_int_signed_div(x, self.ci(bn), "").map_err(be)?;
        }
        if cfg.prune {
            // The IR tile holding this block (the same block when block_rows == bm).
            let m_ir = self.b.build_int_unsigned_div(i0, self.ci(cfg.bm as i64), "m_ir").map_err(be)?;
            let i0_ir = self.mulc(m_ir, cfg.bm as i64)?;
            let ps = self.prune_search(&env, cb, delta_p, bh, m_ir, i0_ir)?;
            n_start = self.smax(n_start, ps)?;
        }

        // Q fragments: wait for the Q group only (K/V of the first tile may still fly).
        self.call("llvm.nvvm.cp.async.wait.group", None, &[self.ci(1).into()])?;
        if wg {
            self.asm("fence.proxy.async.shared::cta;", "~{memory}", None, &[])?;
        }
        self.barrier()?;
        let g = self.b.build_right_shift(lane, self.ci(2), false, "g").map_err(be)?;
        let tq = self.b.build_and(lane, self.ci(3), "t").map_err(be)?;
        let l7 = self.b.build_and(lane, self.ci(7), "").map_err(be)?;
        let l8 = self
            .b
            .build_and(self.b.build_right_shift(lane, self.ci(3), false, "").map_err(be)?, self.ci(1), "")
            .map_err(be)?;
        let l16 = self.b.build_right_shift(lane, self.ci(4), false, "").map_err(be)?;
        let wrow0 = self.mulc(warp, 16)?; // first row of this warp in the tile
        let mut qf: Vec<[IntValue<'ctx>; 4]> = Vec::with_capacity(kd);
        if !wg {
            // A fragment: matrices (rows 0-7, k lo), (rows 8-15, k lo), (rows 0-7, k hi), (rows 8-15, k hi).
            let row = self.add(self.add(wrow0, l7)?, self.mulc(l8, 8)?)?;
            for s in 0..kd {
                let ch = self.addc(l16, 2 * s as i64)?;
                let off = self.swz(row, ch)?;
                qf.push(self.ldmatrix(self.smem_at(&env, off)?, false)?);
            }
        }
        // Rows of this thread: i0 + warp*16 + g and + 8.
        let iw0 = self.add(i0, wrow0)?;
        let row_i = [self.add(iw0, g)?, self.addc(self.add(iw0, g)?, 8)?];
        // Row term (c_i - c_ref) * log2 e, needed only for the LSE.
        let mut cir = [self.cf(0.0); 2];
        if let Some(cr) = c_ref {
            for r in 0..2 {
                let ii = self.smin(row_i[r], tmax)?;
                let ci = self.load_f32(self.gep_g(f32t.into(), cb, self.sext64(ii)?)?)?;
                cir[r] = self.fmul(self.fsub(ci, cr)?, l2e)?;
            }
        }
        // Offsets inside a K tile for the ldmatrix of n-tile pair jp, k-step s:
        // matrices (keys 0-7, k lo), (keys 0-7, k hi), (keys 8-15, k lo), (keys 8-15, k hi).
        let k_row_l = self.add(l7, self.mulc(l16, 8)?)?;
        // V (trans): matrices (keys 0-7, d lo), (keys 8-15, d lo), (keys 0-7, d hi), (keys 8-15, d hi).
        let v_row_l = self.add(l7, self.mulc(l8, 8)?)?;
        let mut k_offs = Vec::new(); // [jp][s] relative byte offsets
        for jp in 0..nt / 2 {
            let row = self.addc(k_row_l, 16 * jp as i64)?;
            let mut v = Vec::new();
            for s in 0..kd {
                let ch = self.addc(l8, 2 * s as i64)?;
                v.push(self.swz(row, ch)?);
            }
            k_offs.push(v);
        }
        let mut v_offs = Vec::new(); // [kk][dp]
        for kk in 0..(bn / 16) as usize {
            let row = self.addc(v_row_l, 16 * kk as i64)?;
            let mut v = Vec::new();
            for dp in 0..dt / 2 {
                let ch = self.addc(l16, 2 * dp as i64)?;
                v.push(self.swz(row, ch)?);
            }
            v_offs.push(v);
        }

        // ---- main loop over kept key tiles, diagonal first ----
        let pre = self.b.get_insert_block().ok_or("no block")?;
        let body = self.ctx.append_basic_block(f, "tile");
        let pf = self.ctx.append_basic_block(f, "prefetch");
        let comp = self.ctx.append_basic_block(f, "compute");
        let maskb = self.ctx.append_basic_block(f, "mask");
        let soft = self.ctx.append_basic_block(f, "softmax");
        let exit = self.ctx.append_basic_block(f, "epilogue");
        self.b.build_unconditional_branch(body).map_err(be)?;

        self.b.position_at_end(body);
        let n_phi = self.b.build_phi(i32t, "n").map_err(be)?;
        let par_phi = self.b.build_phi(i32t, "parity").map_err(be)?;
        let mut acc_phi = Vec::new();
        for _ in 0..dt * 4 {
            acc_phi.push(self.b.build_phi(f32t, "o").map_err(be)?);
        }
        let m_phi = [self.b.build_phi(f32t, "m").map_err(be)?, self.b.build_phi(f32t, "m").map_err(be)?];
        let l_phi = [self.b.build_phi(f32t, "l").map_err(be)?, self.b.build_phi(f32t, "l").map_err(be)?];
        n_phi.add_incoming(&[(&n_end, pre)]);
        par_phi.add_incoming(&[(&self.ci(0), pre)]);
        let zero = self.cf(0.0);
        let ninf = self.cf(f64::NEG_INFINITY);
        for p in &acc_phi {
            p.add_incoming(&[(&zero, pre)]);
        }
        for r in 0..2 {
            m_phi[r].add_incoming(&[(&ninf, pre)]);
            l_phi[r].add_incoming(&[(&zero, pre)]);
        }
        let n = n_phi.as_basic_value().into_int_value();
        let par = par_phi.as_basic_value().into_int_value();
        self.call("llvm.nvvm.cp.async.wait.group", None, &[self.ci(0).into()])?;
        if wg {
            // cp.async wrote K through the generic proxy; wgmma reads it through the async proxy.
            self.asm("fence.proxy.async.shared::cta;", "~{memory}", None, &[])?;
        }
        self.barrier()?;
        let more = self.icmp(IntPredicate::SGT, n, n_start)?;
        self.b.build_conditional_branch(more, pf, comp).map_err(be)?;

        // Prefetch tile n-1 into the other buffer (read last in the previous iteration, which
        // every thread has finished: the barrier above).
        self.b.position_at_end(pf);
        {
            let is0 = self.icmp(IntPredicate::EQ, par, self.ci(0))?;
            let ko = self.seli(is0, k_off[1], k_off[0])?;
            let vo = self.seli(is0, v_off[1], v_off[0])?;
            let jn = self.mulc(self.addc(n, -1)?, bn)?;
            self.load_tile(&env, kb, jn, cfg.bn, ko, wg)?;
            self.load_tile(&env, vb, jn, cfg.bn, vo, wg)?;
            self.b.build_unconditional_branch(comp).map_err(be)?;
        }

        self.b.position_at_end(comp);
        self.call("llvm.nvvm.cp.async.commit.group", None, &[])?;
        let is0 = self.icmp(IntPredicate::EQ, par, self.ci(0))?;
        let kcur = self.seli(is0, k_off[0], k_off[1])?;
        let vcur = self.seli(is0, v_off[0], v_off[1])?;
        let j0 = self.mulc(n, bn)?;
        // Column c values of this thread: keys j0 + 8*jt + 2t + {0,1}.
        let col0 = self.add(j0, self.mulc(tq, 2)?)?;
        let mut c_col = Vec::new();
        let mut c_next = None;
        if cfg.has_decay {
            let cbuf = self.seli(is0, colb_off[0], colb_off[1])?;
            let t8 = self.mulc(tq, 8)?;
            let v2t = f32t.vec_type(2);
            for jt in 0..nt {
                let off = self.add(cbuf, self.addc(t8, 32 * jt as i64)?)?;
                let ld = self.b.build_load(v2t, self.smem_at(&env, off)?, "").map_err(be)?;
                ld.as_instruction_value().ok_or("load")?.set_alignment(8).map_err(|e| e.to_string())?;
                let ld = ld.into_vector_value();
                for e in 0..2 {
                    let x = self.b.build_extract_element(ld, self.ci(e), "").map_err(be)?;
                    c_col.push(x.into_float_value());
                }
            }
            // c of tile n-1 (written to the other bias buffer at the end of this iteration).
            let nprev = self.smax(self.addc(n, -1)?, self.ci(0))?;
            c_next = Some(self.load_col_c(&env, cb, nprev)?);
        }
        // S = Q K^T
        let mut s_acc: Vec<[FloatValue<'ctx>; 4]> = vec![[zero; 4]; nt];
        if wg {
            let mut acc: Vec<FloatValue<'ctx>> = vec![zero; nt * 4];
            self.asm("wgmma.fence.sync.aligned;", "~{memory}", None, &[])?;
            for s in 0..kd {
                let step = ((s / 4) as i64, (s % 4) as i64 * 32);
                let qo = self.ci(step.0 * bm * 128 + step.1);
                let ko = self.addc(kcur, step.0 * bn * 128 + step.1)?;
                let da = self.gmma_desc(&env, qo, 16)?;
                let db = self.gmma_desc(&env, ko, 16)?;
                acc = self.wgmma(&acc, da, db)?;
            }
            self.asm("wgmma.commit_group.sync.aligned;", "~{memory}", None, &[])?;
            acc = self.asm_pass("wgmma.wait_group.sync.aligned 0;", &acc)?;
            for jt in 0..nt {
                for e in 0..4 {
                    s_acc[jt][e] = acc[jt * 4 + e];
                }
            }
        }
        for s in 0..(if wg { 0 } else { kd }) {
            for jp in 0..nt / 2 {
                let off = self.add(kcur, k_offs[jp][s])?;
                let b = self.ldmatrix(self.smem_at(&env, off)?, false)?;
                s_acc[2 * jp] = self.mma(&qf[s], b[0], b[1], &s_acc[2 * jp])?;
                s_acc[2 * jp + 1] = self.mma(&qf[s], b[2], b[3], &s_acc[2 * jp + 1])?;
            }
        }
        // Scores in log2 units, less the row term: s2 = scale log2e q.k + b_j.
        let sl2 = self.cf(cfg.scale as f64 * LOG2E);
        let mut sv: Vec<FloatValue<'ctx>> = Vec::with_capacity(nt * 4);
        for jt in 0..nt {
            for e in 0..4 {
                let x = s_acc[jt][e];
                let v = if cfg.has_decay {
                    self.fma(x, sl2, c_col[jt * 2 + (e & 1)])?
                } else {
                    self.fmul(x, sl2)?
                };
                sv.push(v);
            }
        }
        // Does this warp's 16 x bn block need masking? (diagonal, tail, or window edge)
        let jlast = self.addc(j0, bn - 1)?;
        let mut need = self.icmp(IntPredicate::SGT, jlast, iw0)?;
        let tail = self.icmp(IntPredicate::SGE, jlast, t_len)?;
        need = self.b.build_or(need, tail, "").map_err(be)?;
        if let Some(w) = cfg.window {
            let wl = self.sub(self.addc(iw0, 15)?, j0)?;
            let wc = self.icmp(IntPredicate::SGE, wl, self.ci(w as i64))?;
            need = self.b.build_or(need, wc, "").map_err(be)?;
        }
        let comp_end = self.b.get_insert_block().ok_or("no block")?;
        self.b.build_conditional_branch(need, maskb, soft).map_err(be)?;

        self.b.position_at_end(maskb);
        let mut sm = Vec::with_capacity(sv.len());
        for jt in 0..nt {
            for e in 0..4 {
                let r = e / 2;
                let j = self.addc(col0, (8 * jt + (e & 1)) as i64)?;
                let mut ok = self.icmp(IntPredicate::SLE, j, row_i[r])?;
                let int = self.icmp(IntPredicate::SLT, j, t_len)?;
                ok = self.b.build_and(ok, int, "").map_err(be)?;
                if let Some(w) = cfg.window {
                    let dist = self.sub(row_i[r], j)?;
                    let inw = self.icmp(IntPredicate::SLT, dist, self.ci(w as i64))?;
                    ok = self.b.build_and(ok, inw, "").map_err(be)?;
                }
                sm.push(self.self_(ok, sv[jt * 4 + e], ninf)?);
            }
        }
        self.b.build_unconditional_branch(soft).map_err(be)?;

        self.b.position_at_end(soft);
        let mut s2 = Vec::with_capacity(sv.len());
        for i in 0..sv.len() {
            let p = self.b.build_phi(f32t, "s").map_err(be)?;
            p.add_incoming(&[(&sv[i], comp_end), (&sm[i], maskb)]);
            s2.push(p.as_basic_value().into_float_value());
        }
        // Online softmax, two rows per thread (row g: elements 0,1; row g+8: elements 2,3).
        let mut alpha = [zero; 2];
        let mut m_new = [zero; 2];
        let mut m_neg = [zero; 2];
        for r in 0..2 {
            let mut mx = ninf;
            for jt in 0..nt {
                for e in 0..2 {
                    mx = self.fmax(mx, s2[jt * 4 + 2 * r + e])?;
                }
            }
            mx = self.fmax(mx, self.shfl_xor(mx, 1)?)?;
            mx = self.fmax(mx, self.shfl_xor(mx, 2)?)?;
            let m_old = m_phi[r].as_basic_value().into_float_value();
            let mn = self.fmax(m_old, mx)?;
            // A row with nothing kept so far keeps max -inf; subtract 0 then (no inf - inf).
            let isinf = self.b.build_float_compare(FloatPredicate::OEQ, mn, ninf, "").map_err(be)?;
            let mu = self.self_(isinf, zero, mn)?;
            let mneg = self.b.build_float_neg(mu, "").map_err(be)?;
            alpha[r] = self.ex2(self.fadd(m_old, mneg)?)?;
            m_new[r] = mn;
            m_neg[r] = mneg;
        }
        let mut pv = vec![zero; sv.len()];
        let mut lsum = [zero; 2];
        for r in 0..2 {
            let mut acc = self.fmul(l_phi[r].as_basic_value().into_float_value(), alpha[r])?;
            for jt in 0..nt {
                for e in 0..2 {
                    let i = jt * 4 + 2 * r + e;
                    let p = self.ex2(self.fadd(s2[i], m_neg[r])?)?;
                    pv[i] = p;
                    acc = self.fadd(acc, p)?;
                }
            }
            lsum[r] = acc;
        }
        // Rescale O only when some row of the warp raised its max (rare after the first tiles:
        // the diagonal tile, taken first, usually holds the row maximum).
        let one = self.cf(1.0);
        let a0 = self.b.build_float_compare(FloatPredicate::UNE, alpha[0], one, "").map_err(be)?;
        let a1 = self.b.build_float_compare(FloatPredicate::UNE, alpha[1], one, "").map_err(be)?;
        let anyr = self.b.build_or(a0, a1, "").map_err(be)?;
        let anyw = self
            .call(
                "llvm.nvvm.vote.any.sync",
                Some(self.ctx.bool_type().into()),
                &[self.ci(-1).into(), anyr.into()],
            )?
            .ok_or("vote.any")?
            .into_int_value();
        let resc = self.ctx.append_basic_block(f, "rescale");
        let pvb = self.ctx.append_basic_block(f, "pv");
        let soft_end = self.b.get_insert_block().ok_or("no block")?;
        self.b.build_conditional_branch(anyw, resc, pvb).map_err(be)?;
        self.b.position_at_end(resc);
        let mut scaled = Vec::with_capacity(dt * 4);
        for (i, p) in acc_phi.iter().enumerate() {
            let r = (i % 4) / 2;
            scaled.push(self.fmul(p.as_basic_value().into_float_value(), alpha[r])?);
        }
        self.b.build_unconditional_branch(pvb).map_err(be)?;
        self.b.position_at_end(pvb);
        let mut o: Vec<FloatValue<'ctx>> = Vec::with_capacity(dt * 4);
        for (i, p) in acc_phi.iter().enumerate() {
            let ph = self.b.build_phi(f32t, "o_s").map_err(be)?;
            ph.add_incoming(&[(&p.as_basic_value(), soft_end), (&scaled[i], resc)]);
            o.push(ph.as_basic_value().into_float_value());
        }
        for kk in 0..(bn / 16) as usize {
            let a = [
                self.pack_bf16(pv[(2 * kk) * 4], pv[(2 * kk) * 4 + 1])?,
                self.pack_bf16(pv[(2 * kk) * 4 + 2], pv[(2 * kk) * 4 + 3])?,
                self.pack_bf16(pv[(2 * kk + 1) * 4], pv[(2 * kk + 1) * 4 + 1])?,
                self.pack_bf16(pv[(2 * kk + 1) * 4 + 2], pv[(2 * kk + 1) * 4 + 3])?,
            ];
            if wg {
                // V tile (keys x D, D contiguous) is the MN-major B operand: 8-key groups 1024 B
                // apart, 64-column panels bn*128 B apart; keys 16kk.. start at row 16kk.
                if kk == 0 {
                    self.asm("wgmma.fence.sync.aligned;", "~{memory}", None, &[])?;
                }
                let vo = self.addc(vcur, kk as i64 * 16 * 128)?;
                let db = self.gmma_desc(&env, vo, bn * 128)?;
                o = self.wgmma_rs(&o, &a, db)?;
                if kk + 1 == (bn / 16) as usize {
                    self.asm("wgmma.commit_group.sync.aligned;", "~{memory}", None, &[])?;
                    o = self.asm_pass("wgmma.wait_group.sync.aligned 0;", &o)?;
                }
                continue;
            }
            for dp in 0..dt / 2 {
                let off = self.add(vcur, v_offs[kk][dp])?;
                let b = self.ldmatrix(self.smem_at(&env, off)?, true)?;
                let c0: Vec<FloatValue> = o[(2 * dp) * 4..(2 * dp) * 4 + 4].to_vec();
                let r0 = self.mma(&a, b[0], b[1], &c0)?;
                o[(2 * dp) * 4..(2 * dp) * 4 + 4].copy_from_slice(&r0);
                let c1: Vec<FloatValue> = o[(2 * dp + 1) * 4..(2 * dp + 1) * 4 + 4].to_vec();
                let r1 = self.mma(&a, b[2], b[3], &c1)?;
                o[(2 * dp + 1) * 4..(2 * dp + 1) * 4 + 4].copy_from_slice(&r1);
            }
        }
        if let (Some(cr), Some(cn)) = (c_ref, c_next) {
            // The other bias buffer was last read in the previous iteration (before this
            // iteration's barrier); the next iteration reads it after its own barrier.
            let other = self.seli(is0, colb_off[1], colb_off[0])?;
            self.store_colb(&env, cr, cn, other)?;
        }
        let n_next = self.addc(n, -1)?;
        let par_next = self.b.build_xor(par, self.ci(1), "").map_err(be)?;
        let again = self.icmp(IntPredicate::SGE, n_next, n_start)?;
        let latch = self.b.get_insert_block().ok_or("no block")?;
        n_phi.add_incoming(&[(&n_next, latch)]);
        par_phi.add_incoming(&[(&par_next, latch)]);
        for (p, v) in acc_phi.iter().zip(o.iter()) {
            p.add_incoming(&[(v, latch)]);
        }
        for r in 0..2 {
            m_phi[r].add_incoming(&[(&m_new[r], latch)]);
            l_phi[r].add_incoming(&[(&lsum[r], latch)]);
        }
        self.b.build_conditional_branch(again, body, exit).map_err(be)?;

        // ---- epilogue: O / l and LSE ----
        self.b.position_at_end(exit);
        let mut inv = [zero; 2];
        let mut lse_v = [zero; 2];
        for r in 0..2 {
            let mut l = lsum[r];
            l = self.fadd(l, self.shfl_xor(l, 1)?)?;
            l = self.fadd(l, self.shfl_xor(l, 2)?)?;
            let pos = self.b.build_float_compare(FloatPredicate::OGT, l, zero, "").map_err(be)?;
            let rl = self.b.build_float_div(self.cf(1.0), l, "").map_err(be)?;
            inv[r] = self.self_(pos, rl, zero)?;
            let lg = self.call_f("llvm.nvvm.lg2.approx.f", &[l.into()])?;
            let m2 = self.fadd(m_new[r], cir[r])?;
            let mut lse = self.fmul(self.fadd(lg, m2)?, self.cf(LN2))?;
            lse = self.self_(pos, lse, ninf)?;
            lse_v[r] = lse;
        }
        let v2 = f32t.vec_type(2);
        let t2 = self.mulc(tq, 2)?;
        for r in 0..2 {
            let st_bb = self.ctx.append_basic_block(f, "store");
            let next_bb = self.ctx.append_basic_block(f, "store_done");
            let inb = self.icmp(IntPredicate::SLT, row_i[r], t_len)?;
            self.b.build_conditional_branch(inb, st_bb, next_bb).map_err(be)?;
            self.b.position_at_end(st_bb);
            let rowoff = self.mulc(row_i[r], d)?;
            for dtile in 0..dt {
                let x0 = self.fmul(o[dtile * 4 + 2 * r], inv[r])?;
                let x1 = self.fmul(o[dtile * 4 + 2 * r + 1], inv[r])?;
                let idx = self.add(rowoff, self.addc(t2, 8 * dtile as i64)?)?;
                let p = self.gep_g(o_elt, ob, self.sext64(idx)?)?;
                if cfg.out_bf16 {
                    // Two adjacent columns -> one b32 of bf16 (cvt.rn.bf16x2.f32), same addressing.
                    let st = self.b.build_store(p, self.pack_bf16(x0, x1)?).map_err(be)?;
                    st.set_alignment(4).map_err(|e| e.to_string())?;
                } else {
                    let mut vv = v2.get_undef();
                    vv = self.b.build_insert_element(vv, x0, self.ci(0), "").map_err(be)?;
                    vv = self.b.build_insert_element(vv, x1, self.ci(1), "").map_err(be)?;
                    let st = self.b.build_store(p, vv).map_err(be)?;
                    st.set_alignment(8).map_err(|e| e.to_string())?;
                }
            }
            let t0 = self.icmp(IntPredicate::EQ, tq, self.ci(0))?;
            let lse_bb = self.ctx.append_basic_block(f, "lse");
            self.b.build_conditional_branch(t0, lse_bb, next_bb).map_err(be)?;
            self.b.position_at_end(lse_bb);
            let p = self.gep_g(f32t.into(), lb, self.sext64(row_i[r])?)?;
            self.b.build_store(p, lse_v[r]).map_err(be)?;
            self.b.build_unconditional_branch(next_bb).map_err(be)?;
            self.b.position_at_end(next_bb);
        }
        self.b.build_return(None).map_err(be)?;
        let _ = env.f;
        if !f.verify(true) {
            return Err(format!("LLVM verifier rejected {name}"));
        }
        Ok(f)
    }

    /// c at column `n * bn + (tid mod bn)` (clamped to T-1), loaded by every thread.
    fn load_col_c(
        &self,
        env: &Env<'ctx>,
        cb: PointerValue<'ctx>,
        n: IntValue<'ctx>,
    ) -> Result<FloatValue<'ctx>, String> {
        let bn = self.cfg.bn as i64;
        let tmax = self.addc(env.t_len, -1)?;
        let col = self.b.build_and(env.tid, self.ci(bn - 1), "").map_err(be)?;
        let col = if bn.count_ones() == 1 {
            col
        } else {
            self.b.build_int_unsigned_rem(env.tid, self.ci(bn), "").map_err(be)?
        };
        let j = self.smin(self.add(self.mulc(n, bn)?, col)?, tmax)?;
        self.load_f32(self.gep_g(self.f32t().into(), cb, self.sext64(j)?)?)
    }

    /// Threads `tid < bn` write `(c_ref - c_j) * log2 e` to the bias buffer at `off`.
    fn store_colb(
        &self,
        env: &Env<'ctx>,
        c_ref: FloatValue<'ctx>,
        cj: FloatValue<'ctx>,
        off: IntValue<'ctx>,
    ) -> Result<(), String> {
        let bn = self.cfg.bn as i64;
        let st = self.ctx.append_basic_block(env.f, "colb");
        let done = self.ctx.append_basic_block(env.f, "colb_done");
        let c = self.icmp(IntPredicate::SLT, env.tid, self.ci(bn))?;
        let v = self.fmul(self.fsub(c_ref, cj)?, self.cf(LOG2E))?;
        self.b.build_conditional_branch(c, st, done).map_err(be)?;
        self.b.position_at_end(st);
        let p = self.smem_at(env, self.add(off, self.mulc(env.tid, 4)?)?)?;
        self.b.build_store(p, v).map_err(be)?;
        self.b.build_unconditional_branch(done).map_err(be)?;
        self.b.position_at_end(done);
        Ok(())
    }

    /// start[m] by a 32-ary search per warp: the first key tile n in [0, floor(i0/bn)] with
    /// `c[i0] - c[jend(n)] >= delta[m]` (unordered counts as kept), capped at floor(i0/bn).
    /// `m` and `i0` are the IR tile's index and first row (tiles of `cfg.bm` rows).
    fn prune_search(
        &self,
        env: &Env<'ctx>,
        cb: PointerValue<'ctx>,
        delta_p: PointerValue<'ctx>,
        bh: IntValue<'ctx>,
        m: IntValue<'ctx>,
        i0: IntValue<'ctx>,
    ) -> Result<IntValue<'ctx>, String> {
        let bn = self.cfg.bn as i64;
        let bm = self.cfg.bm as i64;
        let f32t = self.f32t();
        let i32t = self.i32t();
        let tmax = self.addc(env.t_len, -1)?;
        let mt = self.b.build_int_signed_div(self.addc(env.t_len, bm - 1)?, self.ci(bm), "mt").map_err(be)?;
        let didx = self.add(self.mul(bh, mt)?, m)?;
        let dl = self.load_f32(self.gep_g(f32t.into(), delta_p, self.sext64(didx)?)?)?;
        let ci0 = self.load_f32(self.gep_g(f32t.into(), cb, self.sext64(i0)?)?)?;
        let cap = self.b.build_int_signed_div(i0, self.ci(bn), "cap").map_err(be)?;

        let pre = self.b.get_insert_block().ok_or("no block")?;
        let head = self.ctx.append_basic_block(env.f, "search");
        let body = self.ctx.append_basic_block(env.f, "search_step");
        let done = self.ctx.append_basic_block(env.f, "search_done");
        self.b.build_unconditional_branch(head).map_err(be)?;
        self.b.position_at_end(head);
        let lo_phi = self.b.build_phi(i32t, "lo").map_err(be)?;
        let hi_phi = self.b.build_phi(i32t, "hi").map_err(be)?;
        lo_phi.add_incoming(&[(&self.ci(0), pre)]);
        hi_phi.add_incoming(&[(&cap, pre)]);
        let lo = lo_phi.as_basic_value().into_int_value();
        let hi = hi_phi.as_basic_value().into_int_value();
        let go = self.icmp(IntPredicate::SLT, lo, hi)?;
        self.b.build_conditional_branch(go, body, done).map_err(be)?;

        self.b.position_at_end(body);
        let len = self.sub(hi, lo)?;
        let stride = self.b.build_right_shift(self.addc(len, 31)?, self.ci(5), false, "").map_err(be)?;
        let nl = self.add(lo, self.mul(env.lane, stride)?)?;
        let inr = self.icmp(IntPredicate::SLT, nl, hi)?;
        let nn = self.smin(nl, self.addc(hi, -1)?)?;
        let jend = self.smin(self.addc(self.mulc(nn, bn)?, bn - 1)?, tmax)?;
        let cj = self.load_f32(self.gep_g(f32t.into(), cb, self.sext64(jend)?)?)?;
        let diff = self.fsub(ci0, cj)?;
        let keep = self.b.build_float_compare(FloatPredicate::UGE, diff, dl, "").map_err(be)?;
        let not_in = self.b.build_not(inr, "").map_err(be)?;
        let pred = self.b.build_or(keep, not_in, "").map_err(be)?;
        let mask = self.call_i("llvm.nvvm.vote.ballot.sync", &[self.ci(-1).into(), pred.into()])?;
        let fz =
            self.call_i("llvm.cttz.i32", &[mask.into(), self.ctx.bool_type().const_int(1, false).into()])?;
        let none = self.icmp(IntPredicate::EQ, mask, self.ci(0))?;
        // mask == 0: all 32 probes dropped; the answer lies past the last probe.
        let lo_none = self.addc(self.add(lo, self.mulc(stride, 31)?)?, 1)?;
        let nf = self.add(lo, self.mul(fz, stride)?)?;
        let hi_some = self.smin(nf, hi)?;
        let f0 = self.icmp(IntPredicate::EQ, fz, self.ci(0))?;
        let prev = self.addc(self.add(lo, self.mul(self.addc(fz, -1)?, stride)?)?, 1)?;
        let lo_some = self.seli(f0, lo, prev)?;
        let lo2 = self.seli(none, lo_none, lo_some)?;
        let hi2 = self.seli(none, hi, hi_some)?;
        let bend = self.b.get_insert_block().ok_or("no block")?;
        lo_phi.add_incoming(&[(&lo2, bend)]);
        hi_phi.add_incoming(&[(&hi2, bend)]);
        self.b.build_unconditional_branch(head).map_err(be)?;

        self.b.position_at_end(done);
        Ok(lo)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_unsupported_head_dim() {
        let cfg = AttnKernelConfig::new(96, true, true);
        let ctx = Context::create();
        let m = ctx.create_module("t");
        let e = build_attention_kernel(&ctx, &m, &cfg).unwrap_err();
        assert!(e.contains("head_dim"), "{e}");
    }

    #[test]
    fn builds_and_verifies_all_variants() {
        let ctx = Context::create();
        let m = ctx.create_module("t");
        for d in [64, 128] {
            for (decay, prune, window) in [(true, true, None), (true, false, None), (false, false, Some(256))]
            {
                let mut cfg = AttnKernelConfig::new(d, decay, prune);
                cfg.window = window;
                let f = build_attention_kernel(&ctx, &m, &cfg).unwrap();
                assert_eq!(f.count_params(), 8);
            }
        }
        assert!(m.verify().is_ok());
    }

    #[test]
    fn hopper_path_uses_wgmma_and_ampere_path_mma_sync() {
        let ctx = Context::create();
        let m = ctx.create_module("t");
        let mut cfg = AttnKernelConfig::new(128, true, true);
        build_attention_kernel(&ctx, &m, &cfg).unwrap();
        cfg.sm = 80;
        build_attention_kernel(&ctx, &m, &cfg).unwrap();
        let ir = m.print_to_string().to_string();
        assert!(ir.contains("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16"));
        assert!(ir.contains("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16"));
        assert!(ir.contains("llvm.nvvm.mma.m16n8k16.row.col.bf16"));
        assert!(ir.contains("llvm.nvvm.cp.async.cg.shared.global.16"));
    }

    #[test]
    fn bf16_output_variant_coexists_and_packs_on_both_paths() {
        let ctx = Context::create();
        let m = ctx.create_module("t");
        for sm in [90, 80] {
            let mut cfg = AttnKernelConfig::new(64, true, true);
            cfg.sm = sm;
            let f32_name = build_attention_kernel(&ctx, &m, &cfg).unwrap().get_name().to_owned();
            cfg.out_bf16 = true;
            let f = build_attention_kernel(&ctx, &m, &cfg).unwrap();
            assert_ne!(f.get_name(), f32_name.as_c_str());
            assert!(cfg.kernel_name().contains("_obf16_"));
            let ir = inkwell::values::AnyValue::print_to_string(&f).to_string();
            // The epilogue stores packed bf16 pairs, no f32 pairs.
            assert!(ir.contains("store i32"), "{sm}");
            assert!(!ir.contains("store <2 x float>"), "{sm}");
        }
        assert!(m.verify().is_ok());
    }

    #[test]
    fn geometry() {
        let mut cfg = AttnKernelConfig::new(128, true, true);
        cfg.bm = 128;
        // sm_90 covers a 128-row pruning tile with two 64-row blocks.
        let g = launch_geometry(&cfg, 1000, 6);
        assert_eq!(g.grid, (16, 6, 1));
        assert_eq!(g.block, (128, 1, 1));
        assert!(cfg.kernel_name().contains("_bm128_bn64_k64_"));
        cfg.sm = 80;
        let g = launch_geometry(&cfg, 1000, 6);
        assert_eq!(g.grid, (8, 6, 1));
        assert_eq!(g.block, (256, 1, 1));
        assert_eq!(g.shared_bytes, (128 + 4 * 64) * 128 * 2 + 2 * 64 * 4);
    }
}
