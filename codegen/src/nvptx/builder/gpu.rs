//! GPU intrinsics and inline PTX: thread indices, barriers, warp shuffles and votes, `cp.async`,
//! atomics, calls of NVVM intrinsics by name, and inline assembly.

use super::{Half, KernelBuilder};
use inkwell::types::{BasicMetadataTypeEnum, BasicType, BasicTypeEnum};
use inkwell::values::{
    BasicMetadataValueEnum, BasicValueEnum, FloatValue, IntValue, PointerValue, ValueKind,
};

impl<'a, 'ctx> KernelBuilder<'a, 'ctx> {
    /// Declares `name` in the module on first use (its type from the arguments and `ret`) and
    /// calls it: how kernels reach NVVM intrinsics. A call of a name LLVM does not know becomes
    /// an undefined external, which `target::finish` rejects.
    pub fn call(
        &self,
        name: &str,
        ret: Option<BasicTypeEnum<'ctx>>,
        args: &[BasicValueEnum<'ctx>],
    ) -> Option<BasicValueEnum<'ctx>> {
        let f = match self.module.get_function(name) {
            Some(f) => f,
            None => {
                let params: Vec<BasicMetadataTypeEnum> = args.iter().map(|a| a.get_type().into()).collect();
                let ty = match ret {
                    Some(r) => r.fn_type(&params, false),
                    None => self.ctx.void_type().fn_type(&params, false),
                };
                self.module.add_function(name, ty, None)
            }
        };
        let margs: Vec<BasicMetadataValueEnum> = args.iter().map(|a| (*a).into()).collect();
        let cs = self.keep(self.b.build_call(f, &margs, "").map(Some), || None)?;
        match (cs.try_as_basic_value(), ret) {
            (ValueKind::Basic(v), Some(_)) => Some(v),
            (_, None) => None,
            (_, Some(t)) => {
                self.fail(format!("{name} returned no value"));
                Some(self.zero_of(t))
            }
        }
    }

    /// A call with no result.
    pub fn call_void(&self, name: &str, args: &[BasicValueEnum<'ctx>]) {
        self.call(name, None, args);
    }

    /// A call returning f32.
    pub fn call_f(&self, name: &str, args: &[BasicValueEnum<'ctx>]) -> FloatValue<'ctx> {
        match self.call(name, Some(self.f32t().into()), args) {
            Some(BasicValueEnum::FloatValue(v)) => v,
            _ => self.f32(0.0),
        }
    }

    /// A call returning an integer of type `ret`.
    pub fn call_int(
        &self,
        name: &str,
        ret: inkwell::types::IntType<'ctx>,
        args: &[BasicValueEnum<'ctx>],
    ) -> IntValue<'ctx> {
        match self.call(name, Some(ret.into()), args) {
            Some(BasicValueEnum::IntValue(v)) => v,
            _ => ret.const_zero(),
        }
    }

    /// A call returning i32.
    pub fn call_i(&self, name: &str, args: &[BasicValueEnum<'ctx>]) -> IntValue<'ctx> {
        self.call_int(name, self.i32t(), args)
    }

    /// A call returning a struct of `n` values of type `t` (ldmatrix, mma), as its fields.
    pub fn call_n(
        &self,
        name: &str,
        t: BasicTypeEnum<'ctx>,
        n: usize,
        args: &[BasicValueEnum<'ctx>],
    ) -> Vec<BasicValueEnum<'ctx>> {
        let st = self.ctx.struct_type(&vec![t; n], false);
        match self.call(name, Some(st.into()), args) {
            Some(BasicValueEnum::StructValue(s)) => (0..n as u32).map(|i| self.field(s, i)).collect(),
            _ => vec![self.zero_of(t); n],
        }
    }

    /// A PTX special register, `llvm.nvvm.read.ptx.sreg.<name>` (`tid.x`, `ctaid.y`, ...).
    pub fn sreg(&self, name: &str) -> IntValue<'ctx> {
        self.call_i(&format!("llvm.nvvm.read.ptx.sreg.{name}"), &[])
    }

    /// A fresh read of a 32-bit special register (inline `mov.u32`): unlike [`Self::sreg`],
    /// which LLVM merges with the kernel's first read, it keeps derived indices from living
    /// across long loops (attention_ws's epilogue: live indices changed ptxas's wgmma schedule).
    pub fn sreg_fresh(&self, name: &str) -> IntValue<'ctx> {
        let v = self.asm(&format!("mov.u32 $0, %{name};"), "=r", Some(self.i32t().into()), &[]);
        // None only after a builder error, which `finish` reports.
        v.map(|v| v.into_int_value()).unwrap_or_else(|| self.i32(0))
    }

    /// `bar.sync 0` (the name LLVM 22 knows; `barrier0` is only auto-upgraded from text IR).
    pub fn barrier(&self) {
        self.call_void("llvm.nvvm.barrier.cta.sync.aligned.all", &[self.i32(0).into()]);
    }

    /// Butterfly shuffle of a float across the full warp (`shfl.sync.bfly`).
    pub fn shfl_xor(&self, v: FloatValue<'ctx>, m: i64) -> FloatValue<'ctx> {
        self.call_f(
            "llvm.nvvm.shfl.sync.bfly.f32",
            &[self.i32(-1).into(), v.into(), self.i32(m).into(), self.i32(31).into()],
        )
    }

    /// `shfl.sync.up`: lane l receives lane l - d (lanes below d keep their own value).
    pub fn shfl_up(&self, v: FloatValue<'ctx>, d: i64) -> FloatValue<'ctx> {
        self.call_f(
            "llvm.nvvm.shfl.sync.up.f32",
            &[self.i32(-1).into(), v.into(), self.i32(d).into(), self.i32(0).into()],
        )
    }

    /// Sum over the warp; every lane gets the total.
    pub fn warp_sum(&self, mut v: FloatValue<'ctx>) -> FloatValue<'ctx> {
        for m in [16, 8, 4, 2, 1] {
            let o = self.shfl_xor(v, m);
            v = self.fadd(v, o);
        }
        v
    }

    /// `vote.sync.ballot` over the full warp: bit l is lane l's `pred`.
    pub fn vote_ballot(&self, pred: IntValue<'ctx>) -> IntValue<'ctx> {
        self.call_i("llvm.nvvm.vote.ballot.sync", &[self.i32(-1).into(), pred.into()])
    }

    /// `vote.sync.any` over the full warp.
    pub fn vote_any(&self, pred: IntValue<'ctx>) -> IntValue<'ctx> {
        self.call_int("llvm.nvvm.vote.any.sync", self.i1t(), &[self.i32(-1).into(), pred.into()])
    }

    /// Count of trailing zeros of an i32 (32 for 0 is undefined: `is_zero_poison`).
    pub fn cttz(&self, x: IntValue<'ctx>) -> IntValue<'ctx> {
        self.call_i("llvm.cttz.i32", &[x.into(), self.bool(true).into()])
    }

    /// `atom.add.u32` on the i32 at `p` (relaxed, device scope): returns the value before the
    /// add (the persistent attention's work counter).
    pub fn atomic_add_i32(&self, p: PointerValue<'ctx>, v: IntValue<'ctx>) -> IntValue<'ctx> {
        let r =
            self.b.build_atomicrmw(inkwell::AtomicRMWBinOp::Add, p, v, inkwell::AtomicOrdering::Monotonic);
        self.keep(r, || self.i32(0))
    }

    /// `fence.acq_rel.gpu`: with a relaxed atomic between two of them, the stores before the
    /// writer's fence are visible to the loads after the reader's (the threshold's per-head
    /// arrival counter).
    pub fn fence_acq_rel_gpu(&self) {
        self.asm_stmt("fence.acq_rel.gpu;");
    }

    /// `bar.red.or.pred` on barrier 0: waits for the whole block, as [`Self::barrier`], and
    /// returns (i1, to every thread) whether `pred` (i1) was true in any thread.
    pub fn barrier_any(&self, pred: IntValue<'ctx>) -> IntValue<'ctx> {
        self.call_int(
            "llvm.nvvm.barrier.cta.red.or.aligned.all",
            self.i1t(),
            &[self.i32(0).into(), pred.into()],
        )
    }

    // ---- asynchronous copies -------------------------------------------------------------

    /// `cp.async.cg.shared.global` of 16 bytes.
    pub fn cp_async_16(&self, dst_shared: PointerValue<'ctx>, src_global: PointerValue<'ctx>) {
        self.call_void("llvm.nvvm.cp.async.cg.shared.global.16", &[dst_shared.into(), src_global.into()]);
    }
    /// `cp.async.commit_group`.
    pub fn cp_async_commit(&self) {
        self.call_void("llvm.nvvm.cp.async.commit.group", &[]);
    }
    /// `cp.async.wait_group n`: at most `n` groups still in flight.
    pub fn cp_async_wait(&self, n: i64) {
        self.call_void("llvm.nvvm.cp.async.wait.group", &[self.i32(n).into()]);
    }

    // ---- warp-level matrix fragments (sm_80 and later) ------------------------------------

    /// `ldmatrix .x4` (optionally `.trans`) of four 8x8 b16 matrices from a shared address: the
    /// four b32 registers of this lane's fragment.
    pub fn ldmatrix_x4(&self, p: PointerValue<'ctx>, trans: bool) -> [IntValue<'ctx>; 4] {
        let name = if trans {
            "llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4.trans.b16.p3"
        } else {
            "llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4.b16.p3"
        };
        let r = self.call_n(name, self.i32t().into(), 4, &[p.into()]);
        [0, 1, 2, 3].map(|i| r[i].into_int_value())
    }

    /// `mma.sync m16n8k16` with f32 accumulators, operands of type `half`: d = a (16x16) *
    /// b (16x8) + c, in the fragment layout (a: four b32, b: two b32 of packed pairs, c and d:
    /// four f32 per lane).
    pub fn mma_m16n8k16(
        &self,
        half: Half,
        a: &[IntValue<'ctx>; 4],
        b0: IntValue<'ctx>,
        b1: IntValue<'ctx>,
        c: &[FloatValue<'ctx>],
    ) -> [FloatValue<'ctx>; 4] {
        // The bf16 intrinsic takes the packed pairs as i32, the f16 one as <2 x half>.
        let pair = |v: IntValue<'ctx>| -> BasicValueEnum<'ctx> {
            match half {
                Half::Bf16 => v.into(),
                Half::F16 => {
                    let h2 = self.ctx.f16_type().vec_type(2);
                    self.keep(self.b.build_bit_cast(v, h2, ""), || h2.const_zero().into())
                }
            }
        };
        let mut args: Vec<BasicValueEnum> = a.iter().map(|v| pair(*v)).collect();
        args.extend([pair(b0), pair(b1)]);
        args.extend(c.iter().map(|v| BasicValueEnum::from(*v)));
        let name = match half {
            Half::Bf16 => "llvm.nvvm.mma.m16n8k16.row.col.bf16",
            Half::F16 => "llvm.nvvm.mma.m16n8k16.row.col.f32.f32",
        };
        let r = self.call_n(name, self.f32t().into(), 4, &args);
        [0, 1, 2, 3].map(|i| r[i].into_float_value())
    }

    // ---- inline PTX ----------------------------------------------------------------------

    /// Inline PTX with side effects (kept in order with the other side-effecting asm);
    /// `constraints` in LLVM's syntax. Returns the asm's result, if `ret` is given.
    pub fn asm(
        &self,
        text: &str,
        constraints: &str,
        ret: Option<BasicTypeEnum<'ctx>>,
        args: &[BasicValueEnum<'ctx>],
    ) -> Option<BasicValueEnum<'ctx>> {
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
        let cs = self.keep(self.b.build_indirect_call(fty, asm, &margs, "").map(Some), || None)?;
        match (cs.try_as_basic_value(), ret) {
            (ValueKind::Basic(v), Some(_)) => Some(v),
            (_, None) => None,
            (_, Some(t)) => Some(self.zero_of(t)),
        }
    }

    /// An instruction with no operands and no results, e.g. `wgmma.fence.sync.aligned;`
    /// (a memory clobber keeps memory accesses on their side of it).
    pub fn asm_stmt(&self, text: &str) {
        self.asm(text, "~{memory}", None, &[]);
    }

    /// Inline asm returning `n` f32 (`=f` outputs, in a struct) from `args`: the results.
    pub fn asm_f32s(
        &self,
        text: &str,
        constraints: &str,
        n: usize,
        args: &[BasicValueEnum<'ctx>],
    ) -> Vec<FloatValue<'ctx>> {
        let f = self.f32t();
        let st = self.ctx.struct_type(&vec![f.into(); n], false);
        match self.asm(text, constraints, Some(st.into()), args) {
            Some(BasicValueEnum::StructValue(s)) => {
                (0..n as u32).map(|i| self.field(s, i).into_float_value()).collect()
            }
            _ => {
                self.fail("inline asm returned no struct");
                vec![self.f32(0.0); n]
            }
        }
    }

    /// An asm that returns `vals` unchanged but after `text` (tied operands), so no use of them
    /// moves above it (`wgmma.wait_group`).
    pub fn asm_pass(&self, text: &str, vals: &[FloatValue<'ctx>]) -> Vec<FloatValue<'ctx>> {
        let n = vals.len();
        let mut cons: Vec<String> = (0..n).map(|_| "=f".to_string()).collect();
        cons.extend((0..n).map(|i| i.to_string()));
        let args: Vec<BasicValueEnum> = vals.iter().map(|v| (*v).into()).collect();
        self.asm_f32s(text, &cons.join(","), n, &args)
    }
}
