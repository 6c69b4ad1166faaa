//! The small NVPTX kernels around attention: the gate cumsum (a scan per (b, h)), RMSNorm over
//! the last axis, the threshold (max-norm reduction and per-tile delta) and casts.
//!
//! Every kernel here is written for correctness and reasonable memory access, not peak speed:
//! together they move a few bytes per element while attention does O(T) work per element.
//! Parameter lists are documented on each `build_*` function; the launch geometry that goes
//! with each kernel lives in [`super::module`].

use super::llvm_util::{be, call_declared};
use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::module::{Linkage, Module};
use inkwell::types::{BasicMetadataTypeEnum, BasicTypeEnum, FloatType};
use inkwell::values::{BasicValueEnum, FloatValue, FunctionValue, GlobalValue, IntValue, PointerValue};
use inkwell::{AddressSpace, AtomicOrdering, AtomicRMWBinOp, FloatPredicate, IntPredicate};

use foxc_ir::{DType, GateKind, PruneRule, LOG_F_FLOOR};

/// The `ptx_kernel` calling convention of LLVM's NVPTX backend.
pub const PTX_KERNEL_CC: u32 = 71;
/// Threads per block of the scan (one block per (b, h)).
pub const SCAN_THREADS: u32 = 1024;
/// Threads per block of the elementwise kernels (cast, slope cumsum).
pub const ELEM_THREADS: u32 = 256;
/// Threads per block of the row kernels (RMSNorm, threshold): 4 warps, one row per warp at a time.
pub const ROW_THREADS: u32 = 128;
/// Rows per block of the max-norm reduction (8 per warp).
pub const NORM_ROWS_PER_BLOCK: u32 = 32;

type R<T> = Result<T, String>;

/// A tiny kernel-writing kit over an inkwell builder: thread indices, loops, warp shuffles.
pub(crate) struct Kb<'a, 'ctx> {
    pub ctx: &'ctx Context,
    pub module: &'a Module<'ctx>,
    pub b: Builder<'ctx>,
    pub f: FunctionValue<'ctx>,
}

impl<'a, 'ctx> Kb<'a, 'ctx> {
    /// Declares kernel `name` with `params` (pointers are global-space) and positions at its entry.
    fn kernel(
        ctx: &'ctx Context,
        module: &'a Module<'ctx>,
        name: &str,
        params: &[(&str, BasicTypeEnum<'ctx>)],
    ) -> R<Self> {
        if module.get_function(name).is_some() {
            return Err(format!("kernel {name} is defined twice"));
        }
        let tys: Vec<BasicMetadataTypeEnum> = params.iter().map(|(_, t)| (*t).into()).collect();
        let fty = ctx.void_type().fn_type(&tys, false);
        let f = module.add_function(name, fty, Some(Linkage::External));
        f.set_call_conventions(PTX_KERNEL_CC);
        for (i, (n, _)) in params.iter().enumerate() {
            if let Some(p) = f.get_nth_param(i as u32) {
                p.set_name(n);
            }
        }
        let b = ctx.create_builder();
        let entry = ctx.append_basic_block(f, "entry");
        b.position_at_end(entry);
        Ok(Kb { ctx, module, b, f })
    }

    fn i32t(&self) -> BasicTypeEnum<'ctx> {
        self.ctx.i32_type().into()
    }
    fn f32t(&self) -> FloatType<'ctx> {
        self.ctx.f32_type()
    }
    fn p(&self, i: u32) -> R<BasicValueEnum<'ctx>> {
        self.f.get_nth_param(i).ok_or_else(|| format!("parameter {i} missing"))
    }
    fn pp(&self, i: u32) -> R<PointerValue<'ctx>> {
        Ok(self.p(i)?.into_pointer_value())
    }
    fn pi(&self, i: u32) -> R<IntValue<'ctx>> {
        Ok(self.p(i)?.into_int_value())
    }
    fn pf(&self, i: u32) -> R<FloatValue<'ctx>> {
        Ok(self.p(i)?.into_float_value())
    }
    fn ci(&self, v: i64) -> IntValue<'ctx> {
        self.ctx.i32_type().const_int(v as u64, true)
    }
    fn ci64(&self, v: i64) -> IntValue<'ctx> {
        self.ctx.i64_type().const_int(v as u64, true)
    }
    fn cf(&self, v: f64) -> FloatValue<'ctx> {
        self.f32t().const_float(v)
    }

    /// Declares (once) and calls an intrinsic by name.
    fn call(
        &self,
        name: &str,
        ret: Option<BasicTypeEnum<'ctx>>,
        args: &[BasicValueEnum<'ctx>],
    ) -> R<Option<BasicValueEnum<'ctx>>> {
        call_declared(self.ctx, self.module, &self.b, name, ret, args)
    }
    fn call_f(&self, name: &str, args: &[BasicValueEnum<'ctx>]) -> R<FloatValue<'ctx>> {
        let r = self.call(name, Some(self.f32t().into()), args)?;
        r.map(|v| v.into_float_value()).ok_or_else(|| format!("{name}: no value"))
    }
    fn call_i(&self, name: &str, args: &[BasicValueEnum<'ctx>]) -> R<IntValue<'ctx>> {
        let r = self.call(name, Some(self.i32t()), args)?;
        r.map(|v| v.into_int_value()).ok_or_else(|| format!("{name}: no value"))
    }
    fn sreg(&self, name: &str) -> R<IntValue<'ctx>> {
        self.call_i(&format!("llvm.nvvm.read.ptx.sreg.{name}"), &[])
    }
    fn barrier(&self) -> R<()> {
        // `bar.sync 0` (LLVM 22 no longer knows `llvm.nvvm.barrier0`).
        self.call("llvm.nvvm.barrier.cta.sync.aligned.all", None, &[self.ci(0).into()])?;
        Ok(())
    }

    // ---- integer and float arithmetic ----------------------------------------------------
    fn add(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        self.b.build_int_add(a, b, "").map_err(be)
    }
    fn sub(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        self.b.build_int_sub(a, b, "").map_err(be)
    }
    fn mul(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        self.b.build_int_mul(a, b, "").map_err(be)
    }
    fn icmp(&self, p: IntPredicate, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        self.b.build_int_compare(p, a, b, "").map_err(be)
    }
    fn seli(&self, c: IntValue<'ctx>, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_select(c, a, b, "").map_err(be)?.into_int_value())
    }
    fn self_(&self, c: IntValue<'ctx>, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_select(c, a, b, "").map_err(be)?.into_float_value())
    }
    fn smin(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let c = self.icmp(IntPredicate::SLT, a, b)?;
        self.seli(c, a, b)
    }
    fn sext64(&self, a: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        self.b.build_int_s_extend(a, self.ctx.i64_type(), "").map_err(be)
    }
    fn fadd(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        self.b.build_float_add(a, b, "").map_err(be)
    }
    fn fsub(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        self.b.build_float_sub(a, b, "").map_err(be)
    }
    fn fmul(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        self.b.build_float_mul(a, b, "").map_err(be)
    }
    fn fdiv(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        self.b.build_float_div(a, b, "").map_err(be)
    }
    fn fma(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>, c: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        self.call_f("llvm.fma.f32", &[a.into(), b.into(), c.into()])
    }
    fn fmax(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        self.call_f("llvm.maxnum.f32", &[a.into(), b.into()])
    }
    fn fmin(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        self.call_f("llvm.minnum.f32", &[a.into(), b.into()])
    }
    fn fabs(&self, a: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        self.call_f("llvm.fabs.f32", &[a.into()])
    }
    /// Correctly rounded square root (`sqrt.rn.f32`).
    fn sqrt(&self, a: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        self.call_f("llvm.sqrt.f32", &[a.into()])
    }
    fn ex2(&self, a: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        self.call_f("llvm.nvvm.ex2.approx.ftz.f32", &[a.into()])
    }
    fn lg2(&self, a: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        self.call_f("llvm.nvvm.lg2.approx.f", &[a.into()])
    }
    fn sitofp(&self, a: IntValue<'ctx>) -> R<FloatValue<'ctx>> {
        self.b.build_signed_int_to_float(a, self.f32t(), "").map_err(be)
    }

    /// Butterfly shuffle of a float across the full warp.
    fn shfl_xor(&self, v: FloatValue<'ctx>, m: i64) -> R<FloatValue<'ctx>> {
        self.call_f(
            "llvm.nvvm.shfl.sync.bfly.f32",
            &[self.ci(-1).into(), v.into(), self.ci(m).into(), self.ci(31).into()],
        )
    }
    /// `shfl.sync.up`: lane l receives lane l - d (lanes below d keep their own value).
    fn shfl_up(&self, v: FloatValue<'ctx>, d: i64) -> R<FloatValue<'ctx>> {
        self.call_f(
            "llvm.nvvm.shfl.sync.up.f32",
            &[self.ci(-1).into(), v.into(), self.ci(d).into(), self.ci(0).into()],
        )
    }
    /// Sum over the warp, every lane gets the total.
    fn warp_sum(&self, mut v: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        for m in [16, 8, 4, 2, 1] {
            let o = self.shfl_xor(v, m)?;
            v = self.fadd(v, o)?;
        }
        Ok(v)
    }
    // ---- memory ---------------------------------------------------------------------------
    fn elem_type(&self, dt: DType) -> R<BasicTypeEnum<'ctx>> {
        Ok(match dt {
            DType::F32 => self.ctx.f32_type().into(),
            DType::BF16 => self.ctx.bf16_type().into(),
            DType::F16 => self.ctx.f16_type().into(),
            DType::I32 => self.ctx.i32_type().into(),
            DType::Bool => return Err("bool tensors cannot be kernel operands".into()),
        })
    }
    fn gep(&self, dt: DType, p: PointerValue<'ctx>, idx: IntValue<'ctx>) -> R<PointerValue<'ctx>> {
        let t = self.elem_type(dt)?;
        unsafe { self.b.build_in_bounds_gep(t, p, &[idx], "").map_err(be) }
    }
    /// Loads element `idx` of a float tensor of dtype `dt`, widened to f32.
    fn load_f(&self, dt: DType, p: PointerValue<'ctx>, idx: IntValue<'ctx>) -> R<FloatValue<'ctx>> {
        let a = self.gep(dt, p, idx)?;
        let t = self.elem_type(dt)?;
        let v = self.b.build_load(t, a, "").map_err(be)?;
        match dt {
            DType::F32 => Ok(v.into_float_value()),
            DType::BF16 | DType::F16 => {
                self.b.build_float_ext(v.into_float_value(), self.f32t(), "").map_err(be)
            }
            _ => Err(format!("expected a float tensor, got {dt}")),
        }
    }
    /// Stores an f32 value as element `idx` of a float tensor of dtype `dt` (round to nearest even).
    fn store_f(&self, dt: DType, p: PointerValue<'ctx>, idx: IntValue<'ctx>, v: FloatValue<'ctx>) -> R<()> {
        let a = self.gep(dt, p, idx)?;
        let v = match dt {
            DType::F32 => v,
            DType::BF16 => self.b.build_float_trunc(v, self.ctx.bf16_type(), "").map_err(be)?,
            DType::F16 => self.b.build_float_trunc(v, self.ctx.f16_type(), "").map_err(be)?,
            _ => return Err(format!("expected a float tensor, got {dt}")),
        };
        self.b.build_store(a, v).map_err(be)?;
        Ok(())
    }
    /// A stack variable (promoted to a register by the optimizer).
    fn var(&self, init: FloatValue<'ctx>) -> R<PointerValue<'ctx>> {
        let p = self.b.build_alloca(self.f32t(), "").map_err(be)?;
        self.b.build_store(p, init).map_err(be)?;
        Ok(p)
    }
    fn get(&self, p: PointerValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_load(self.f32t(), p, "").map_err(be)?.into_float_value())
    }
    fn set(&self, p: PointerValue<'ctx>, v: FloatValue<'ctx>) -> R<()> {
        self.b.build_store(p, v).map_err(be)?;
        Ok(())
    }
    /// A kernel-private shared-memory array of `n` f32.
    fn shared_f32(&self, name: &str, n: u32) -> GlobalValue<'ctx> {
        let ty = self.f32t().array_type(n);
        let g = self.module.add_global(ty, Some(AddressSpace::from(3u16)), name);
        g.set_linkage(Linkage::Internal);
        g.set_initializer(&ty.get_undef());
        g.set_alignment(16);
        g
    }
    fn shared_at(&self, g: GlobalValue<'ctx>, n: u32, idx: IntValue<'ctx>) -> R<PointerValue<'ctx>> {
        let ty = self.f32t().array_type(n);
        unsafe { self.b.build_in_bounds_gep(ty, g.as_pointer_value(), &[self.ci(0), idx], "").map_err(be) }
    }

    // ---- control flow ---------------------------------------------------------------------
    /// `if cond { then() }`.
    fn if_then(&self, cond: IntValue<'ctx>, then: impl FnOnce(&Self) -> R<()>) -> R<()> {
        let tb = self.ctx.append_basic_block(self.f, "then");
        let jb = self.ctx.append_basic_block(self.f, "join");
        self.b.build_conditional_branch(cond, tb, jb).map_err(be)?;
        self.b.position_at_end(tb);
        then(self)?;
        self.b.build_unconditional_branch(jb).map_err(be)?;
        self.b.position_at_end(jb);
        Ok(())
    }
    /// `for (i = start; i < end; i += step) body(i)` over i32 or i64 (signed compare).
    fn for_range(
        &self,
        start: IntValue<'ctx>,
        end: IntValue<'ctx>,
        step: IntValue<'ctx>,
        mut body: impl FnMut(&Self, IntValue<'ctx>) -> R<()>,
    ) -> R<()> {
        let pre = self.b.get_insert_block().ok_or("no insert block")?;
        let head = self.ctx.append_basic_block(self.f, "loop");
        let bodyb = self.ctx.append_basic_block(self.f, "body");
        let exit = self.ctx.append_basic_block(self.f, "exit");
        self.b.build_unconditional_branch(head).map_err(be)?;
        self.b.position_at_end(head);
        let phi = self.b.build_phi(start.get_type(), "i").map_err(be)?;
        phi.add_incoming(&[(&start, pre)]);
        let i = phi.as_basic_value().into_int_value();
        let c = self.icmp(IntPredicate::SLT, i, end)?;
        self.b.build_conditional_branch(c, bodyb, exit).map_err(be)?;
        self.b.position_at_end(bodyb);
        body(self, i)?;
        let next = self.add(i, step)?;
        let latch = self.b.get_insert_block().ok_or("no insert block")?;
        self.b.build_unconditional_branch(head).map_err(be)?;
        phi.add_incoming(&[(&next, latch)]);
        self.b.position_at_end(exit);
        Ok(())
    }
    fn ret(&self) -> R<()> {
        self.b.build_return(None).map_err(be)?;
        Ok(())
    }
}

/// `log f` of one gate input element, clamped below at `LOG_F_FLOOR` (SEMANTICS.md).
fn log_gate<'ctx>(k: &Kb<'_, 'ctx>, kind: GateKind, x: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
    let lf = match kind {
        GateKind::LogGate => x,
        GateKind::Logits => {
            // logsigmoid(z) = min(z, 0) - log1p(exp(-|z|)), with log1p(u) computed as
            // u * log(w) / (w - 1), w = 1 + u (exact where w rounds to 1), so a gate logit
            // of +20 still yields its -2e-9 instead of 0.
            let a = k.fabs(x)?;
            let na = k.fmul(a, k.cf(-std::f64::consts::LOG2_E))?;
            let u = k.ex2(na)?;
            let w = k.fadd(u, k.cf(1.0))?;
            let lw = k.fmul(k.lg2(w)?, k.cf(std::f64::consts::LN_2))?;
            let wm1 = k.fsub(w, k.cf(1.0))?;
            let ratio = k.fdiv(k.fmul(u, lw)?, wm1)?;
            let is_one = k.b.build_float_compare(FloatPredicate::OEQ, w, k.cf(1.0), "").map_err(be)?;
            let l1p = k.self_(is_one, u, ratio)?;
            let mz = k.fmin(x, k.cf(0.0))?;
            k.fsub(mz, l1p)?
        }
        GateKind::Slope => return Err("slope gates are not scanned".into()),
    };
    k.fmax(lf, k.cf(LOG_F_FLOOR))
}

/// `gate_cumsum` for `Logits` and `LogGate`: params `(gate: [BH, T], c: f32 [BH, T], T: i32)`.
/// Grid `(BH)` (the (b, h) index is `ctaid.x`), block [`SCAN_THREADS`]. Each thread scans a contiguous chunk; a block-wide scan of
/// the chunk totals (warp shuffles, then one warp over the 32 warp totals) gives each chunk's
/// offset, and a second pass writes the running sums.
pub fn build_gate_scan<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    name: &str,
    kind: GateKind,
    in_dt: DType,
) -> R<FunctionValue<'ctx>> {
    let gp: BasicTypeEnum = ctx.ptr_type(AddressSpace::from(1u16)).into();
    let i32t: BasicTypeEnum = ctx.i32_type().into();
    let k = Kb::kernel(ctx, module, name, &[("gate", gp), ("c", gp), ("T", i32t)])?;
    let gate = k.pp(0)?;
    let out = k.pp(1)?;
    let t_len = k.pi(2)?;
    let total = k.var(k.cf(0.0))?;
    let run = k.var(k.cf(0.0))?;
    let tid = k.sreg("tid.x")?;
    let bh = k.sreg("ctaid.x")?;
    let lane = k.b.build_and(tid, k.ci(31), "").map_err(be)?;
    let warp = k.b.build_right_shift(tid, k.ci(5), false, "").map_err(be)?;
    let nthreads = SCAN_THREADS as i64;
    // chunk = ceil(T / threads)
    let chunk =
        k.b.build_int_signed_div(k.add(t_len, k.ci(nthreads - 1))?, k.ci(nthreads), "").map_err(be)?;
    let lo = k.smin(k.mul(tid, chunk)?, t_len)?;
    let hi = k.smin(k.add(lo, chunk)?, t_len)?;
    let base = k.mul(k.sext64(bh)?, k.sext64(t_len)?)?;
    let lo64 = k.sext64(lo)?;
    let hi64 = k.sext64(hi)?;
    k.for_range(lo64, hi64, k.ci64(1), |k, i| {
        let idx = k.add(base, i)?;
        let x = k.load_f(in_dt, gate, idx)?;
        let lf = log_gate(k, kind, x)?;
        let t = k.get(total)?;
        k.set(total, k.fadd(t, lf)?)
    })?;
    // Inclusive warp scan of the chunk totals.
    let mine = k.get(total)?;
    let mut x = mine;
    for d in [1i64, 2, 4, 8, 16] {
        let y = k.shfl_up(x, d)?;
        let ok = k.icmp(IntPredicate::SGE, lane, k.ci(d))?;
        let s = k.fadd(x, y)?;
        x = k.self_(ok, s, x)?;
    }
    let nwarps = SCAN_THREADS / 32;
    let sh = k.shared_f32(&format!("{name}_warp_totals"), nwarps);
    let is_last = k.icmp(IntPredicate::EQ, lane, k.ci(31))?;
    k.if_then(is_last, |k| {
        let p = k.shared_at(sh, nwarps, warp)?;
        k.b.build_store(p, x).map_err(be)?;
        Ok(())
    })?;
    k.barrier()?;
    let is_w0 = k.icmp(IntPredicate::EQ, warp, k.ci(0))?;
    k.if_then(is_w0, |k| {
        let p = k.shared_at(sh, nwarps, lane)?;
        let mut y = k.get(p)?;
        for d in [1i64, 2, 4, 8, 16] {
            let z = k.shfl_up(y, d)?;
            let ok = k.icmp(IntPredicate::SGE, lane, k.ci(d))?;
            let s = k.fadd(y, z)?;
            y = k.self_(ok, s, y)?;
        }
        k.b.build_store(p, y).map_err(be)?;
        Ok(())
    })?;
    k.barrier()?;
    // Offset of this chunk: the inclusive total of earlier warps plus the exclusive warp prefix.
    let wprev = k.sub(warp, k.ci(1))?;
    let wprev_c = k.seli(k.icmp(IntPredicate::SGT, warp, k.ci(0))?, wprev, k.ci(0))?;
    let prev_tot = k.get(k.shared_at(sh, nwarps, wprev_c)?)?;
    let warp_off = k.self_(k.icmp(IntPredicate::SGT, warp, k.ci(0))?, prev_tot, k.cf(0.0))?;
    let excl = k.fsub(x, mine)?;
    k.set(run, k.fadd(warp_off, excl)?)?;
    k.for_range(lo64, hi64, k.ci64(1), |k, i| {
        let idx = k.add(base, i)?;
        let xv = k.load_f(in_dt, gate, idx)?;
        let lf = log_gate(k, kind, xv)?;
        let r = k.fadd(k.get(run)?, lf)?;
        k.set(run, r)?;
        k.store_f(DType::F32, out, idx, r)
    })?;
    k.ret()?;
    Ok(k.f)
}

/// `gate_cumsum` for `Slope`: params `(m: [H], c: f32 [BH, T], T: i32, H: i32)`.
/// Grid `(ceil(T / ELEM_THREADS), BH)`: `c[t] = (t + 1) * max(-m[h], LOG_F_FLOOR)`.
pub fn build_gate_slope<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    name: &str,
    in_dt: DType,
) -> R<FunctionValue<'ctx>> {
    let gp: BasicTypeEnum = ctx.ptr_type(AddressSpace::from(1u16)).into();
    let i32t: BasicTypeEnum = ctx.i32_type().into();
    let k = Kb::kernel(ctx, module, name, &[("m", gp), ("c", gp), ("T", i32t), ("H", i32t)])?;
    let (m, out, t_len, h_len) = (k.pp(0)?, k.pp(1)?, k.pi(2)?, k.pi(3)?);
    let bx = k.sreg("ctaid.x")?;
    let tid = k.sreg("tid.x")?;
    let bh = k.sreg("ctaid.y")?;
    let t = k.add(k.mul(bx, k.ci(ELEM_THREADS as i64))?, tid)?;
    let inb = k.icmp(IntPredicate::SLT, t, t_len)?;
    k.if_then(inb, |k| {
        let h = k.b.build_int_signed_rem(bh, h_len, "").map_err(be)?;
        let mv = k.load_f(in_dt, m, k.sext64(h)?)?;
        let lf = k.fmax(k.b.build_float_neg(mv, "").map_err(be)?, k.cf(LOG_F_FLOOR))?;
        let tp1 = k.sitofp(k.add(t, k.ci(1))?)?;
        let idx = k.add(k.mul(k.sext64(bh)?, k.sext64(t_len)?)?, k.sext64(t)?)?;
        k.store_f(DType::F32, out, idx, k.fmul(tp1, lf)?)
    })?;
    k.ret()?;
    Ok(k.f)
}

/// Loads one row of `d` elements spread over the warp: lane l holds elements l, l + 32, ...
/// Elements past `d` read as 0 (the index is clamped so no load goes out of bounds).
fn load_row<'ctx>(
    k: &Kb<'_, 'ctx>,
    dt: DType,
    p: PointerValue<'ctx>,
    row_base: IntValue<'ctx>,
    lane: IntValue<'ctx>,
    d: u32,
) -> R<Vec<FloatValue<'ctx>>> {
    let mut out = Vec::new();
    for r in 0..d.div_ceil(32) {
        let e = k.add(lane, k.ci(32 * r as i64))?;
        if (r + 1) * 32 <= d {
            out.push(k.load_f(dt, p, k.add(row_base, k.sext64(e)?)?)?);
        } else {
            let inb = k.icmp(IntPredicate::SLT, e, k.ci(d as i64))?;
            let ec = k.smin(e, k.ci(d as i64 - 1))?;
            let v = k.load_f(dt, p, k.add(row_base, k.sext64(ec)?)?)?;
            out.push(k.self_(inb, v, k.cf(0.0))?);
        }
    }
    Ok(out)
}

/// `rmsnorm` over the last axis: params `(x: [rows, D], w: [D], y: [rows, D], rows: i32)`.
/// Grid `(ceil(rows / 4))`, block [`ROW_THREADS`]: one warp per row.
pub fn build_rmsnorm<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    name: &str,
    d: u32,
    eps: f64,
    (x_dt, w_dt, y_dt): (DType, DType, DType),
) -> R<FunctionValue<'ctx>> {
    let gp: BasicTypeEnum = ctx.ptr_type(AddressSpace::from(1u16)).into();
    let i32t: BasicTypeEnum = ctx.i32_type().into();
    let k = Kb::kernel(ctx, module, name, &[("x", gp), ("w", gp), ("y", gp), ("rows", i32t)])?;
    let (x, w, y, rows) = (k.pp(0)?, k.pp(1)?, k.pp(2)?, k.pi(3)?);
    let tid = k.sreg("tid.x")?;
    let lane = k.b.build_and(tid, k.ci(31), "").map_err(be)?;
    let warp = k.b.build_right_shift(tid, k.ci(5), false, "").map_err(be)?;
    let bx = k.sreg("ctaid.x")?;
    let row = k.add(k.mul(bx, k.ci((ROW_THREADS / 32) as i64))?, warp)?;
    let inb = k.icmp(IntPredicate::SLT, row, rows)?;
    k.if_then(inb, |k| {
        let base = k.mul(k.sext64(row)?, k.ci64(d as i64))?;
        let vals = load_row(k, x_dt, x, base, lane, d)?;
        let mut ss = k.cf(0.0);
        for v in &vals {
            ss = k.fma(*v, *v, ss)?;
        }
        let ss = k.warp_sum(ss)?;
        let mean = k.fdiv(ss, k.cf(d as f64))?;
        let r = k.fdiv(k.cf(1.0), k.sqrt(k.fadd(mean, k.cf(eps))?)?)?;
        for (j, v) in vals.iter().enumerate() {
            let e = k.add(lane, k.ci(32 * j as i64))?;
            let store = |k: &Kb<'_, 'ctx>| -> R<()> {
                let wv = k.load_f(w_dt, w, k.sext64(e)?)?;
                let o = k.fmul(k.fmul(*v, r)?, wv)?;
                k.store_f(y_dt, y, k.add(base, k.sext64(e)?)?, o)
            };
            if (j as u32 + 1) * 32 <= d {
                store(k)?;
            } else {
                let ok = k.icmp(IntPredicate::SLT, e, k.ci(d as i64))?;
                k.if_then(ok, store)?;
            }
        }
        Ok(())
    })?;
    k.ret()?;
    Ok(k.f)
}

/// `cast` (and `x * s` for a compile-time scalar `s`): params `(x, y, n: i64)`;
/// grid `(ceil(n / ELEM_THREADS))`.
pub fn build_cast<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    name: &str,
    from: DType,
    to: DType,
    mul: Option<f64>,
) -> R<FunctionValue<'ctx>> {
    for dt in [from, to] {
        if !dt.is_float() {
            return Err(format!("GPU cast supports float dtypes only, got {dt}"));
        }
    }
    let gp: BasicTypeEnum = ctx.ptr_type(AddressSpace::from(1u16)).into();
    let i64t: BasicTypeEnum = ctx.i64_type().into();
    let k = Kb::kernel(ctx, module, name, &[("x", gp), ("y", gp), ("n", i64t)])?;
    let (x, y, n) = (k.pp(0)?, k.pp(1)?, k.pi(2)?);
    let bx = k.sext64(k.sreg("ctaid.x")?)?;
    let tid = k.sext64(k.sreg("tid.x")?)?;
    let i = k.add(k.mul(bx, k.ci64(ELEM_THREADS as i64))?, tid)?;
    let inb = k.icmp(IntPredicate::SLT, i, n)?;
    k.if_then(inb, |k| {
        let mut v = k.load_f(from, x, i)?;
        if let Some(m) = mul {
            v = k.fmul(v, k.cf(m))?;
        }
        k.store_f(to, y, i, v)
    })?;
    k.ret()?;
    Ok(k.f)
}

/// Max-norm reduction of the data-dependent threshold bound: params
/// `(q: [BH, T, D], k: [BH, T, D], norms: u32 [BH, 2], T: i32)`. Grid
/// `(ceil(T / NORM_ROWS_PER_BLOCK), BH)`, block [`ROW_THREADS`]. `norms` must be zeroed first: it
/// receives `max_i |q_i|^2` and `max_j |k_j|^2` as f32 bits through `atomicMax` on u32 (non-negative
/// floats order like their bit patterns).
pub fn build_threshold_norms<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    name: &str,
    d: u32,
    (q_dt, k_dt): (DType, DType),
) -> R<FunctionValue<'ctx>> {
    let gp: BasicTypeEnum = ctx.ptr_type(AddressSpace::from(1u16)).into();
    let i32t: BasicTypeEnum = ctx.i32_type().into();
    let k = Kb::kernel(ctx, module, name, &[("q", gp), ("k", gp), ("norms", gp), ("T", i32t)])?;
    let (q, kk, norms, t_len) = (k.pp(0)?, k.pp(1)?, k.pp(2)?, k.pi(3)?);
    let qm = k.var(k.cf(0.0))?;
    let km = k.var(k.cf(0.0))?;
    let tid = k.sreg("tid.x")?;
    let lane = k.b.build_and(tid, k.ci(31), "").map_err(be)?;
    let warp = k.b.build_right_shift(tid, k.ci(5), false, "").map_err(be)?;
    let bx = k.sreg("ctaid.x")?;
    let bh = k.sreg("ctaid.y")?;
    let per_warp = NORM_ROWS_PER_BLOCK / (ROW_THREADS / 32);
    let first = k.add(k.mul(bx, k.ci(NORM_ROWS_PER_BLOCK as i64))?, k.mul(warp, k.ci(per_warp as i64))?)?;
    let last = k.smin(k.add(first, k.ci(per_warp as i64))?, t_len)?;
    let bh_base = k.mul(k.sext64(bh)?, k.sext64(t_len)?)?;
    k.for_range(first, last, k.ci(1), |k, i| {
        let base = k.mul(k.add(bh_base, k.sext64(i)?)?, k.ci64(d as i64))?;
        let qv = load_row(k, q_dt, q, base, lane, d)?;
        let kv = load_row(k, k_dt, kk, base, lane, d)?;
        let (mut sq, mut sk) = (k.cf(0.0), k.cf(0.0));
        for (a, b) in qv.iter().zip(&kv) {
            sq = k.fma(*a, *a, sq)?;
            sk = k.fma(*b, *b, sk)?;
        }
        let sq = k.warp_sum(sq)?;
        let sk = k.warp_sum(sk)?;
        k.set(qm, k.fmax(k.get(qm)?, sq)?)?;
        k.set(km, k.fmax(k.get(km)?, sk)?)
    })?;
    let is0 = k.icmp(IntPredicate::EQ, lane, k.ci(0))?;
    k.if_then(is0, |k| {
        for (slot, var) in [(0i64, qm), (1, km)] {
            let v = k.get(var)?;
            let bits = k.b.build_bit_cast(v, k.ctx.i32_type(), "").map_err(be)?.into_int_value();
            let idx = k.add(k.mul(k.sext64(bh)?, k.ci64(2))?, k.ci64(slot))?;
            let p = k.gep(DType::I32, norms, idx)?;
            k.b.build_atomicrmw(AtomicRMWBinOp::UMax, p, bits, AtomicOrdering::Monotonic).map_err(be)?;
        }
        Ok(())
    })?;
    k.ret()?;
    Ok(k.f)
}

/// How the threshold kernel gets `Qmax` and `Kmax`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BoundSrc {
    Static {
        q_max: f64,
        k_max: f64,
    },
    /// From the `norms` buffer written by [`build_threshold_norms`] (squared norms as f32 bits).
    Norms,
}

/// Per-query-tile delta: params `(q, k, norms: u32 [BH, 2], delta: f32 [BH, Mt], T: i32, lnT: f32)`.
/// Grid `(Mt, BH)`, block [`ROW_THREADS`]. `norms` is read only for [`BoundSrc::Norms`] (pass any
/// valid pointer otherwise).
#[allow(clippy::too_many_arguments)]
pub fn build_threshold_delta<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    name: &str,
    d: u32,
    (q_dt, k_dt): (DType, DType),
    rule: PruneRule,
    log_eps: f64,
    scale: f64,
    bm: u32,
    bound: BoundSrc,
) -> R<FunctionValue<'ctx>> {
    let gp: BasicTypeEnum = ctx.ptr_type(AddressSpace::from(1u16)).into();
    let i32t: BasicTypeEnum = ctx.i32_type().into();
    let f32t: BasicTypeEnum = ctx.f32_type().into();
    let k = Kb::kernel(
        ctx,
        module,
        name,
        &[("q", gp), ("k", gp), ("norms", gp), ("delta", gp), ("T", i32t), ("lnT", f32t)],
    )?;
    let (q, kk, norms, delta, t_len, ln_t) = (k.pp(0)?, k.pp(1)?, k.pp(2)?, k.pp(3)?, k.pi(4)?, k.pf(5)?);
    let wmin = k.var(k.cf(f64::INFINITY))?;
    let tid = k.sreg("tid.x")?;
    let lane = k.b.build_and(tid, k.ci(31), "").map_err(be)?;
    let warp = k.b.build_right_shift(tid, k.ci(5), false, "").map_err(be)?;
    let m = k.sreg("ctaid.x")?;
    let bh = k.sreg("ctaid.y")?;
    let mt = k.sreg("nctaid.x")?;
    let norm = |k: &Kb<'_, 'ctx>, slot: i64| -> R<FloatValue<'ctx>> {
        let idx = k.add(k.mul(k.sext64(bh)?, k.ci64(2))?, k.ci64(slot))?;
        let sq = k.load_f(DType::F32, norms, idx)?;
        k.sqrt(sq)
    };
    let (qmax, kmax) = match bound {
        BoundSrc::Static { q_max, k_max } => (k.cf(q_max), k.cf(k_max)),
        BoundSrc::Norms => (norm(&k, 0)?, norm(&k, 1)?),
    };
    let ascale = scale.abs();
    let out_idx = k.add(k.mul(k.sext64(bh)?, k.sext64(mt)?)?, k.sext64(m)?)?;
    match rule {
        PruneRule::Paper => {
            let is0 = k.icmp(IntPredicate::EQ, tid, k.ci(0))?;
            k.if_then(is0, |k| {
                let u = k.fmul(k.fmul(k.cf(ascale), qmax)?, kmax)?;
                let v = k.fsub(k.fsub(k.cf(log_eps), k.fmul(k.cf(2.0), u)?)?, ln_t)?;
                k.store_f(DType::F32, delta, out_idx, v)
            })?;
        }
        PruneRule::Tight => {
            let nw = (ROW_THREADS / 32) as i64;
            let i0 = k.mul(m, k.ci(bm as i64))?;
            let first = k.add(i0, warp)?;
            let last = k.smin(k.add(i0, k.ci(bm as i64))?, t_len)?;
            let bh_base = k.mul(k.sext64(bh)?, k.sext64(t_len)?)?;
            let c0 = k.fsub(k.cf(log_eps), ln_t)?;
            k.for_range(first, last, k.ci(nw), |k, i| {
                let base = k.mul(k.add(bh_base, k.sext64(i)?)?, k.ci64(d as i64))?;
                let qv = load_row(k, q_dt, q, base, lane, d)?;
                let kv = load_row(k, k_dt, kk, base, lane, d)?;
                let (mut qq, mut qk) = (k.cf(0.0), k.cf(0.0));
                for (a, b) in qv.iter().zip(&kv) {
                    qq = k.fma(*a, *a, qq)?;
                    qk = k.fma(*a, *b, qk)?;
                }
                let qq = k.warp_sum(qq)?;
                let qk = k.warp_sum(qk)?;
                let pen = k.fmul(k.fmul(k.cf(ascale), k.sqrt(qq)?)?, kmax)?;
                let v = k.fadd(k.fsub(c0, pen)?, k.fmul(k.cf(scale), qk)?)?;
                k.set(wmin, k.fmin(k.get(wmin)?, v)?)
            })?;
            let sh = k.shared_f32(&format!("{name}_warp_min"), nw as u32);
            let is0 = k.icmp(IntPredicate::EQ, lane, k.ci(0))?;
            k.if_then(is0, |k| {
                let p = k.shared_at(sh, nw as u32, warp)?;
                k.b.build_store(p, k.get(wmin)?).map_err(be)?;
                Ok(())
            })?;
            k.barrier()?;
            let t0 = k.icmp(IntPredicate::EQ, tid, k.ci(0))?;
            k.if_then(t0, |k| {
                let mut v = k.cf(f64::INFINITY);
                for w in 0..nw {
                    v = k.fmin(v, k.get(k.shared_at(sh, nw as u32, k.ci(w))?)?)?;
                }
                k.store_f(DType::F32, delta, out_idx, v)
            })?;
        }
    }
    k.ret()?;
    Ok(k.f)
}
