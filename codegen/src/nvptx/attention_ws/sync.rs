//! The synchronization pieces of the warp-specialized kernel: shared-memory mbarriers (init,
//! arrive, the parity wait loop, the arrive that fires when a thread's `cp.async` copies land),
//! named barriers for one warpgroup, and register reallocation (`setmaxnreg`). All through
//! LLVM 22's NVVM intrinsics; only the async-proxy fence is inline PTX (LLVM has no intrinsic
//! for the CTA-scoped `fence.proxy.async.shared::cta`).

use crate::nvptx::builder::KernelBuilder;
use inkwell::values::{IntValue, PointerValue};

/// `mbarrier.init.shared.b64 [bar], count`.
pub(super) fn mbar_init<'ctx>(b: &KernelBuilder<'_, 'ctx>, bar: PointerValue<'ctx>, count: u32) {
    b.call_void("llvm.nvvm.mbarrier.init.shared", &[bar.into(), b.i32(count as i64).into()]);
}

/// `mbarrier.arrive.shared.b64` (release at CTA scope: this thread's earlier shared-memory
/// stores are visible to whoever waits for the phase to complete).
pub(super) fn mbar_arrive<'ctx>(b: &KernelBuilder<'_, 'ctx>, bar: PointerValue<'ctx>) {
    b.call("llvm.nvvm.mbarrier.arrive.shared", Some(b.i64t().into()), &[bar.into()]);
}

/// `cp.async.mbarrier.arrive.noinc.shared.b64`: one arrival on `bar`, made when every
/// `cp.async` this thread issued before it has landed (the barrier's count includes it).
pub(super) fn mbar_arrive_on_copies<'ctx>(b: &KernelBuilder<'_, 'ctx>, bar: PointerValue<'ctx>) {
    b.call_void("llvm.nvvm.cp.async.mbarrier.arrive.noinc.shared", &[bar.into()]);
}

/// Spins until the phase of `bar` with parity `parity` (0 or 1) has completed
/// (`mbarrier.try_wait.parity`, acquire at CTA scope). A fresh barrier counts its phase
/// "before 0" (parity 1) as completed, which is how a producer's first wait on an empty slot
/// passes at once.
pub(super) fn mbar_wait<'ctx>(b: &KernelBuilder<'_, 'ctx>, bar: PointerValue<'ctx>, parity: IntValue<'ctx>) {
    b.do_while(("mbar_wait", "mbar_done"), &[], |b, _| {
        let ok = b.call_int(
            "llvm.nvvm.mbarrier.try.wait.parity.scope.cta.space.cta",
            b.i1t(),
            &[bar.into(), parity.into()],
        );
        (b.not(ok), vec![])
    });
}

/// `bar.sync id, threads` for the warps of one warpgroup (ids from 1: 0 is `__syncthreads`).
pub(super) fn named_barrier<'ctx>(b: &KernelBuilder<'_, 'ctx>, id: IntValue<'ctx>, threads: u32) {
    b.call_void("llvm.nvvm.barrier.cta.sync.aligned.count", &[id.into(), b.i32(threads as i64).into()]);
}

/// `bar.arrive id, threads`: counts this warp's arrival without waiting (the pingpong turn
/// handed to the other consumer warpgroup).
pub(super) fn named_arrive<'ctx>(b: &KernelBuilder<'_, 'ctx>, id: IntValue<'ctx>, threads: u32) {
    b.call_void("llvm.nvvm.barrier.cta.arrive.aligned.count", &[id.into(), b.i32(threads as i64).into()]);
}

/// `setmaxnreg.{inc,dec}.sync.aligned.u32 regs`: every warp of the warpgroup runs it together;
/// it takes effect because the kernel declares `.maxntid` and `.minnctapersm` (a register cap at entry).
pub(super) fn set_max_regs(b: &KernelBuilder<'_, '_>, regs: u32, grow: bool) {
    let name = if grow {
        "llvm.nvvm.setmaxnreg.inc.sync.aligned.u32"
    } else {
        "llvm.nvvm.setmaxnreg.dec.sync.aligned.u32"
    };
    b.call_void(name, &[b.i32(regs as i64).into()]);
}

/// Orders this thread's view of generic-proxy shared-memory writes (`cp.async`, plain stores)
/// before its next async-proxy reads (`wgmma` operands).
pub(super) fn fence_async_shared(b: &KernelBuilder<'_, '_>) {
    b.asm_stmt("fence.proxy.async.shared::cta;");
}
