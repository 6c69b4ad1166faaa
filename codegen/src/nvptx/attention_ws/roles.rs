//! The body of the warp-specialized kernel: barrier setup, the role split, the producer's fill
//! loop and the consumers' compute loop (see the module docs of [`super`] for the protocol).

use super::consumer::Consumer;
use super::sync::{
    fence_async_shared, mbar_arrive, mbar_arrive_on_copies, mbar_init, mbar_wait, named_barrier, set_max_regs,
};
use super::{WsLayout, BLOCK_ROWS, CONSUMER_REGS, PRODUCER_REGS};
use crate::nvptx::attention::score::ScoreMod;
use crate::nvptx::attention::{Attn, AttnKernelConfig, Rows, LOG2E};
use crate::nvptx::builder::KernelBuilder;
use inkwell::values::{IntValue, PointerValue};
use inkwell::IntPredicate;

/// Per-block values every role derives the same way.
pub(super) struct Block<'ctx> {
    pub(super) bh: IntValue<'ctx>,
    /// First row of the block's 128-row tile.
    i0: IntValue<'ctx>,
    tmax: IntValue<'ctx>,
    /// Base pointers of this head's q, k, v, c, out, lse.
    qb: PointerValue<'ctx>,
    kb: PointerValue<'ctx>,
    vb: PointerValue<'ctx>,
    cb: PointerValue<'ctx>,
    ob: PointerValue<'ctx>,
    lb: PointerValue<'ctx>,
}

/// The key-tile walk: from `hi` down to `lo`, and each consumer's own range.
pub(super) struct Walk<'ctx> {
    pub(super) hi: IntValue<'ctx>,
    pub(super) lo: IntValue<'ctx>,
    start: [IntValue<'ctx>; 2],
    end: [IntValue<'ctx>; 2],
}

pub(super) fn emit<'ctx>(
    b: &KernelBuilder<'_, 'ctx>,
    cfg: &AttnKernelConfig,
    view: &AttnKernelConfig,
    lay: &WsLayout,
    score: &dyn ScoreMod,
    name: &str,
) {
    let smem = b.dyn_shared(&format!("{name}_smem"), 1024);
    let tid = b.sreg("tid.x");
    let lane = b.named(b.andc(tid, 31), "lane");
    let wg = b.named(b.lshrc(tid, 7), "wg");
    let wtid = b.named(b.andc(tid, 127), "wtid");
    let t_len = b.param_int(7);
    let blk = block(b, cfg, t_len);

    // Barriers: one thread initializes them, everyone waits for that.
    let s_n = lay.stages as i64;
    let t0 = b.icmpc(IntPredicate::EQ, tid, 0);
    b.if_then_named(t0, ("mbar_init", "roles"), |b| {
        for s in 0..s_n {
            mbar_init(b, bar(b, smem, lay, s, false), 256);
            mbar_init(b, bar(b, smem, lay, s, true), 256);
        }
    });
    b.barrier();

    let a = Attn { b, cfg: view, smem, tid: wtid, lane, t_len, wg: true, score };
    let walk = walk(&a, cfg, &blk);
    let is_producer = b.icmpc(IntPredicate::EQ, wg, 0);
    b.if_else(
        is_producer,
        "role",
        |b| {
            set_max_regs(b, PRODUCER_REGS, false);
            producer(&a, cfg, lay, &blk, &walk);
            vec![]
        },
        |b| {
            set_max_regs(b, CONSUMER_REGS, true);
            let cw = b.addc(wg, -1);
            consumer(&a, cfg, lay, &blk, &walk, cw);
            vec![]
        },
    );
}

fn block<'ctx>(b: &KernelBuilder<'_, 'ctx>, cfg: &AttnKernelConfig, t_len: IntValue<'ctx>) -> Block<'ctx> {
    let d = cfg.head_dim as i64;
    let bx = b.sreg("ctaid.x");
    let nbx = b.sreg("nctaid.x");
    let bh = b.sreg("ctaid.y");
    // Longest first: blockIdx.x = 0 takes the last query tile.
    let m = b.sub(b.addc(nbx, -1), bx);
    let i0 = b.named(b.mulc(m, BLOCK_ROWS as i64), "i0");
    let tmax = b.addc(t_len, -1);
    let bh64 = b.sext64(bh);
    let row_base = b.mul(bh64, b.sext64(t_len));
    let mat_base = b.mulc(row_base, d);
    let i16t = b.i16t().into();
    let f32t = b.f32t().into();
    let kv_base = if cfg.kv_group == 1 {
        mat_base
    } else {
        b.mulc(b.mul(b.sext64(b.udivc(bh, cfg.kv_group as i64)), b.sext64(t_len)), d)
    };
    let o_elt = if cfg.out_bf16 { i16t } else { f32t };
    Block {
        bh,
        i0,
        tmax,
        qb: b.gep(i16t, b.param_ptr(0), mat_base),
        kb: b.gep(i16t, b.param_ptr(1), kv_base),
        vb: b.gep(i16t, b.param_ptr(2), kv_base),
        cb: b.gep(f32t, b.param_ptr(3), row_base),
        ob: b.gep(o_elt, b.param_ptr(5), mat_base),
        lb: b.gep(f32t, b.param_ptr(6), row_base),
    }
}

/// `full[s]` (or `empty[s]`) of slot `s`.
fn bar<'ctx>(
    b: &KernelBuilder<'_, 'ctx>,
    smem: PointerValue<'ctx>,
    lay: &WsLayout,
    s: i64,
    empty: bool,
) -> PointerValue<'ctx> {
    let off = lay.bar0 as i64 + 8 * (s + if empty { lay.stages as i64 } else { 0 });
    b.smem_at(smem, b.i32(off))
}

/// [`bar`] at a run-time slot.
pub(super) fn bar_at<'ctx>(
    b: &KernelBuilder<'_, 'ctx>,
    smem: PointerValue<'ctx>,
    lay: &WsLayout,
    s: IntValue<'ctx>,
    empty: bool,
) -> PointerValue<'ctx> {
    let base = lay.bar0 as i64 + if empty { 8 * lay.stages as i64 } else { 0 };
    b.smem_at(smem, b.addc(b.mulc(s, 8), base))
}

/// Row range of consumer `w` (0 or 1): its first row (clamped into the sequence, for the
/// start search of a tail block whose second half is past T) and its diagonal key tile.
fn consumer_rows<'ctx>(
    b: &KernelBuilder<'_, 'ctx>,
    cfg: &AttnKernelConfig,
    blk: &Block<'ctx>,
    w: IntValue<'ctx>,
) -> (IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>) {
    let i0w = b.add(blk.i0, b.mulc(w, 64));
    let i0c = b.smin(i0w, blk.tmax);
    let last = b.smin(b.addc(i0w, 63), blk.tmax);
    let end = b.sdivc(last, cfg.bn as i64);
    (i0w, i0c, end)
}

/// Both consumers' ranges and the walk, computed alike by every warp (the start search is a
/// per-warp ballot; repeating it keeps the roles free of any extra handshake).
fn walk<'ctx>(a: &Attn<'_, '_, 'ctx>, cfg: &AttnKernelConfig, blk: &Block<'ctx>) -> Walk<'ctx> {
    let b = a.b;
    let delta_p = b.param_ptr(4);
    let mut start = [b.i32(0); 2];
    let mut end = [b.i32(0); 2];
    for w in 0..2 {
        let (_, i0c, e) = consumer_rows(b, cfg, blk, b.i32(w as i64));
        start[w] = a.start_tile(blk.cb, delta_p, blk.bh, i0c);
        end[w] = e;
    }
    Walk { hi: b.smax(end[0], end[1]), lo: b.smin(start[0], start[1]), start, end }
}

/// Slot and round parity of fill `k` (the k-th key tile of the walk).
pub(super) fn slot<'ctx>(
    b: &KernelBuilder<'_, 'ctx>,
    lay: &WsLayout,
    k: IntValue<'ctx>,
) -> (IntValue<'ctx>, IntValue<'ctx>) {
    let s_n = lay.stages as i64;
    let s = b.uremc(k, s_n);
    let round = b.udivc(k, s_n);
    (s, b.andc(round, 1))
}

/// The producer: for each key tile of the walk, wait for its slot to be free, copy K and V
/// (cp.async, arrival when landed) and store the tile's `c_j` (plain arrival, release).
fn producer<'ctx>(
    a: &Attn<'_, '_, 'ctx>,
    cfg: &AttnKernelConfig,
    lay: &WsLayout,
    blk: &Block<'ctx>,
    walk: &Walk<'ctx>,
) {
    let b = a.b;
    let bn = cfg.bn as i64;
    let kv = lay.kv_bytes as i64;
    b.do_while(("fill", "fill_done"), &[("n", walk.hi.into())], |b, v| {
        let n = v[0].into_int_value();
        let k = b.sub(walk.hi, n);
        let (s, par) = slot(b, lay, k);
        mbar_wait(b, bar_at(b, a.smem, lay, s, true), b.xorc(par, 1));
        let j0 = b.mulc(n, bn);
        let koff = b.addc(b.mulc(s, 2 * kv), lay.kv0 as i64);
        a.load_tile(blk.kb, j0, cfg.bn, koff);
        a.load_tile(blk.vb, j0, cfg.bn, b.addc(koff, kv));
        let full = bar_at(b, a.smem, lay, s, false);
        mbar_arrive_on_copies(b, full);
        if cfg.has_decay {
            let inb = b.icmpc(IntPredicate::SLT, a.tid, bn);
            b.if_then_named(inb, ("c_col", "c_col_done"), |b| {
                let j = b.smin(b.add(j0, a.tid), blk.tmax);
                let cj = b.load_f32(b.gep(b.f32t().into(), blk.cb, b.sext64(j)));
                let off = b.add(b.addc(b.mulc(s, 4 * bn), lay.c0 as i64), b.mulc(a.tid, 4));
                b.store(b.smem_at(a.smem, off), cj);
            });
        }
        mbar_arrive(b, full);
        let nn = b.addc(n, -1);
        (b.icmp(IntPredicate::SGE, nn, walk.lo), vec![nn.into()])
    });
    // Leave only once the copies have landed (the consumers still read the slots).
    b.call_void("llvm.nvvm.cp.async.wait.all", &[]);
}

/// Consumer `cw` (0 or 1): its 64 rows as one block of the old kernel, reading K/V from the
/// ring, computing only the key tiles in its own range and releasing every slot it is given.
fn consumer<'ctx>(
    a0: &Attn<'_, '_, 'ctx>,
    cfg: &AttnKernelConfig,
    lay: &WsLayout,
    blk: &Block<'ctx>,
    walk: &Walk<'ctx>,
    cw: IntValue<'ctx>,
) {
    let b = a0.b;
    // This consumer's view of shared memory starts at its Q tile, so the old kernel's wgmma
    // steps find Q at offset 0; the ring's offsets are taken relative to it.
    let qoff = b.mulc(cw, lay.q_bytes as i64);
    let smem_c = b.smem_at(a0.smem, qoff);
    let a = Attn { smem: smem_c, ..*a0 };
    let (i0w, i0c, _) = consumer_rows(b, cfg, blk, cw);
    let is1 = b.icmpc(IntPredicate::EQ, cw, 1);
    let my_start = b.select_i(is1, walk.start[1], walk.start[0]);
    let my_end = b.select_i(is1, walk.end[1], walk.end[0]);

    a.load_tile(blk.qb, i0w, 64, b.i32(0));
    b.cp_async_commit();
    let f32t = b.f32t().into();
    let l2e = b.f32(LOG2E);
    let c_ref = cfg.has_decay.then(|| b.load_f32(b.gep(f32t, blk.cb, b.sext64(i0c))));
    let warp = b.lshrc(a.tid, 5);
    let g = b.lshrc(a.lane, 2);
    let tq = b.andc(a.lane, 3);
    let iw0 = b.add(i0w, b.mulc(warp, 16));
    let rows = Rows { iw0, i: [b.add(iw0, g), b.addc(b.add(iw0, g), 8)], tq };
    let cir = match c_ref {
        Some(cr) => rows.i.map(|i| {
            let ci = b.load_f32(b.gep(f32t, blk.cb, b.sext64(b.smin(i, blk.tmax))));
            b.fmul(b.fsub(ci, cr), l2e)
        }),
        None => [b.f32(0.0); 2],
    };
    b.cp_async_wait(0);
    fence_async_shared(b);
    named_barrier(b, b.addc(cw, 1), 128);

    let c = Consumer { base: a0.smem, lay, blk, walk, rows: &rows, qoff, my_start, my_end, c_ref, cw };
    let (o, m, l) = c.run(&a);
    let (inv, lse) = a.finalize(m, l, cir);
    let o_elt = if cfg.out_bf16 { b.i16t().into() } else { f32t };
    a.store_output(&o, inv, lse, &rows, blk.ob, o_elt, blk.lb);
}
