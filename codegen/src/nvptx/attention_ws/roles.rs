//! The body of the warp-specialized kernel: barrier setup, the role split, the producer's fill
//! loop and the consumers' compute loop (see the module docs of [`super`] for the protocol).

use super::consumer::Consumer;
use super::epilogue::{store_output_half, OutAt};
use super::sync::{
    fence_async_shared, mbar_arrive, mbar_arrive_on_copies, mbar_init, mbar_wait, named_barrier, set_max_regs,
};
use super::{persist, tma};
use super::{residency, xch_stride, WsLayout};
use crate::nvptx::attention::params::FWD;
use crate::nvptx::attention::params::{FwdTail, Tail};
use crate::nvptx::attention::score::ScoreMod;
use crate::nvptx::attention::{Attn, AttnKernelConfig, Rows, LOG2E};
use crate::nvptx::builder::KernelBuilder;
use crate::nvptx::heads;
use inkwell::values::{FloatValue, IntValue, PointerValue};
use inkwell::IntPredicate;

/// Named barrier of the producer warpgroup's start exchange (0 is `__syncthreads`, 1 to `nc`
/// the `nc` consumers' Q tiles, `nc + 1` to `2 nc` their turns): 5 with two consumers.
pub(super) fn producer_barrier(consumers: u32) -> i64 {
    2 * consumers as i64 + 1
}

/// Per-block values every role derives the same way.
pub(super) struct Block<'ctx> {
    pub(super) bh: IntValue<'ctx>,
    /// The key/value head it reads (`bh / kv_group`).
    kv_head: IntValue<'ctx>,
    /// First row of the block's 128-row tile.
    pub(super) i0: IntValue<'ctx>,
    /// The last query row `T - 1`, and the last key `Tk - 1` (the same value unless queries are
    /// fewer than keys).
    tmax: IntValue<'ctx>,
    kmax: IntValue<'ctx>,
    /// Base pointers of this head's q, k, v, c, out, lse.
    pub(super) qb: PointerValue<'ctx>,
    kb: PointerValue<'ctx>,
    vb: PointerValue<'ctx>,
    cb: PointerValue<'ctx>,
    ob: PointerValue<'ctx>,
    lb: PointerValue<'ctx>,
}

/// The key-tile walk: from `hi` (the diagonal tile of the block's last row) down to `lo` (the
/// smaller of the two consumers' start tiles).
pub(super) struct Walk<'ctx> {
    pub(super) hi: IntValue<'ctx>,
    pub(super) lo: IntValue<'ctx>,
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
    let t_len = b.param_int(FWD.t);
    // Queries fewer than keys: the keys' own length.
    let (k_len, off) = if cfg.fewer_queries {
        let k_len = b.param_int(tail_param(cfg, score, Tail::Tk));
        (k_len, Some(b.named(b.sub(k_len, t_len), "qoff")))
    } else {
        (t_len, None)
    };
    let a = Attn { b, cfg: view, smem, tid: wtid, lane, t_len, k_len, off, wg: true, score };
    // The tiles grid's block (the persistent kernel derives one per work item instead).
    let blk = (!cfg.persistent).then(|| block(&a, cfg));
    let res = residency(cfg.head_dim, cfg.bn);

    // Barriers: one thread initializes them, everyone waits for that.
    let s_n = lay.stages as i64;
    let t0 = b.icmpc(IntPredicate::EQ, tid, 0);
    b.if_then_named(t0, ("mbar_init", "roles"), |b| {
        for s in 0..s_n {
            mbar_init(b, bar(b, smem, lay, s, false), tma::full_arrivals(cfg));
            mbar_init(b, bar(b, smem, lay, s, true), 128 * res.consumers);
        }
        if cfg.persistent {
            persist::init_barriers(b, smem, lay, res.consumers);
        }
        tma::after_barrier_init(b, cfg);
    });
    b.barrier();

    let is_producer = b.icmpc(IntPredicate::EQ, wg, 0);
    b.if_else(
        is_producer,
        "role",
        |b| {
            set_max_regs(b, residency(cfg.head_dim, cfg.bn).producer_regs, false);
            match &blk {
                Some(blk) => producer(&a, cfg, lay, blk),
                None => persist::producer(&a, cfg, lay),
            }
            vec![]
        },
        |b| {
            set_max_regs(b, residency(cfg.head_dim, cfg.bn).consumer_regs, true);
            let cw = b.addc(wg, -1);
            match &blk {
                Some(blk) => {
                    consumer_item(&a, cfg, lay, blk, cw, b.i32(0), None);
                }
                None => persist::consumer(&a, cfg, lay, cw),
            }
            vec![]
        },
    );
}

/// The number of the kernel's parameter `p` after the score hook's.
pub(super) fn tail_param(cfg: &AttnKernelConfig, score: &dyn ScoreMod, p: Tail) -> u32 {
    FwdTail::of(cfg, score.params().len()).at(p)
}

/// The tiles grid's block: query tile and head from the block index.
fn block<'ctx>(a: &Attn<'_, '_, 'ctx>, cfg: &AttnKernelConfig) -> Block<'ctx> {
    let b = a.b;
    let bx = b.sreg("ctaid.x");
    let nbx = b.sreg("nctaid.x");
    let bh = b.sreg("ctaid.y");
    // Longest first: blockIdx.x = 0 takes the last query tile.
    let m = b.sub(b.addc(nbx, -1), bx);
    block_at(a, cfg, bh, m)
}

/// The block of query tile `m` (of the residency's rows) of flat head `bh`.
pub(super) fn block_at<'ctx>(
    a: &Attn<'_, '_, 'ctx>,
    cfg: &AttnKernelConfig,
    bh: IntValue<'ctx>,
    m: IntValue<'ctx>,
) -> Block<'ctx> {
    let (b, t_len, k_len) = (a.b, a.t_len, a.k_len);
    let d = cfg.head_dim as i64;
    let i0 = b.named(b.mulc(m, residency(cfg.head_dim, cfg.bn).rows() as i64), "i0");
    let tmax = b.addc(t_len, -1);
    let kmax = if a.off.is_some() { b.addc(k_len, -1) } else { tmax };
    let bh64 = b.sext64(bh);
    let row_base = b.mul(bh64, b.sext64(t_len));
    // c is per key position: [B, H, Tk].
    let c_base = if a.off.is_some() { b.mul(bh64, b.sext64(k_len)) } else { row_base };
    let mat_base = b.mulc(row_base, d);
    let i16t = b.i16t().into();
    let f32t = b.f32t().into();
    // Key/value head of query head `bh` (GQA: `kv_group` query heads share one).
    let kv_head = heads::kv_head(b, bh, cfg.kv_group);
    let kv_base = b.mulc(heads::kv_rows(b, bh, k_len, cfg.kv_group), d);
    let o_elt = if cfg.out_half { i16t } else { f32t };
    Block {
        bh,
        kv_head,
        i0,
        tmax,
        kmax,
        qb: b.gep(i16t, b.param_ptr(FWD.q), mat_base),
        kb: b.gep(i16t, b.param_ptr(FWD.k), kv_base),
        vb: b.gep(i16t, b.param_ptr(FWD.v), kv_base),
        cb: b.gep(f32t, b.param_ptr(FWD.c), c_base),
        ob: b.gep(o_elt, b.param_ptr(FWD.out), mat_base),
        lb: b.gep(f32t, b.param_ptr(FWD.lse), row_base),
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

/// Row range of consumer `w` (0 to `consumers - 1`): its first row (clamped into the sequence,
/// for the start search of a tail block whose last rows are past T) and its diagonal key tile.
fn consumer_rows<'ctx>(
    a: &Attn<'_, '_, 'ctx>,
    cfg: &AttnKernelConfig,
    blk: &Block<'ctx>,
    w: IntValue<'ctx>,
) -> (IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>) {
    let b = a.b;
    let i0w = b.add(blk.i0, b.mulc(w, 64));
    let i0c = b.smin(i0w, blk.tmax);
    let last = b.smin(b.addc(i0w, 63), blk.tmax);
    let end = b.sdivc(a.pos(last), cfg.bn as i64);
    (i0w, i0c, end)
}

/// The walk's first tile: the diagonal tile of the block's last row (no search needed).
pub(super) fn walk_hi<'ctx>(
    a: &Attn<'_, '_, 'ctx>,
    cfg: &AttnKernelConfig,
    blk: &Block<'ctx>,
) -> IntValue<'ctx> {
    let b = a.b;
    let ends: Vec<IntValue> = (0..consumers(cfg)).map(|w| consumer_rows(a, cfg, blk, b.i32(w)).2).collect();
    ends[1..].iter().fold(ends[0], |hi, &e| b.smax(hi, e))
}

/// Consumer warpgroups of the block ([`residency`]).
pub(super) fn consumers(cfg: &AttnKernelConfig) -> i64 {
    residency(cfg.head_dim, cfg.bn).consumers as i64
}

/// The smallest of the consumers' start tiles: the walk's last tile.
fn walk_lo<'ctx>(b: &KernelBuilder<'_, 'ctx>, st: &[IntValue<'ctx>]) -> IntValue<'ctx> {
    st[1..].iter().fold(st[0], |lo, &s| b.smin(lo, s))
}

/// Every consumer's start tile (each one's IR query tile's `start`: window bound and the
/// in-kernel pruning search). Without pruning they are arithmetic. With pruning the four warps
/// of warpgroup `wg` split the searches: [`post_start`] now (each role calls it once its
/// first loads are issued, so they land during the search), then `sync` (a barrier of the
/// warpgroup's 128 threads), then the results read back from the warpgroup's exchange.
fn starts<'ctx>(
    a: &Attn<'_, '_, 'ctx>,
    cfg: &AttnKernelConfig,
    lay: &WsLayout,
    blk: &Block<'ctx>,
    wg: IntValue<'ctx>,
    sync: impl FnOnce(&KernelBuilder<'_, 'ctx>),
) -> Vec<IntValue<'ctx>> {
    let b = a.b;
    if !cfg.prune {
        sync(b);
        return (0..consumers(cfg))
            .map(|w| {
                let (_, i0c, end) = consumer_rows(a, cfg, blk, b.i32(w));
                let st = a.start_tile(blk.cb, b.param_ptr(FWD.delta), blk.bh, i0c, None);
                a.key_bound_start((st, end), (blk.bh, i0c, 64))
            })
            .collect();
    }
    let stride = xch_stride(consumers(cfg) as u32) as i64;
    let xch = b.addc(b.mulc(wg, stride), lay.xch0 as i64);
    post_start(a, cfg, blk, xch);
    sync(b);
    let i32t = b.i32t().into();
    (0..consumers(cfg))
        .map(|h| b.load(i32t, b.smem_at(a.smem, b.addc(xch, 4 * h))).into_int_value())
        .collect()
}

/// This warp's half of the start search: warps 0 and 1 of the warpgroup (`a.tid` is the
/// thread's index in it) search consumer 0's start, warps 2 and 3 consumer 1's, so a
/// warpgroup has both in the time of one search (a 32-ary search per warp, a chain of
/// dependent loads); the first thread of each half stores its result at `xch + 4 half`. With a
/// third consumer, warps 0 and 1 then search its start too (stored at `xch + 8`).
fn post_start<'ctx>(a: &Attn<'_, '_, 'ctx>, cfg: &AttnKernelConfig, blk: &Block<'ctx>, xch: IntValue<'ctx>) {
    let b = a.b;
    let half = b.lshrc(a.tid, 6);
    // Thread 0 of each half is the search's thread 0 (it also writes the debug starts).
    let ah = Attn { tid: b.andc(a.tid, 63), ..*a };
    let search = |w: IntValue<'ctx>| {
        let (_, i0c, end) = consumer_rows(a, cfg, blk, w);
        let st = ah.start_tile(blk.cb, b.param_ptr(FWD.delta), blk.bh, i0c, None);
        // Raised to the consumer's 64 rows' key bound (warp-uniform: every role that computes
        // a start gets the same one).
        let st = a.key_bound_start((st, end), (blk.bh, i0c, 64));
        let first = b.icmpc(IntPredicate::EQ, ah.tid, 0);
        b.if_then_named(first, ("post_start", "post_start_done"), |b| {
            b.store(b.smem_at(a.smem, b.add(xch, b.mulc(w, 4))), st);
        });
    };
    search(half);
    if consumers(cfg) == 3 {
        let lower = b.icmpc(IntPredicate::EQ, half, 0);
        b.if_then_named(lower, ("third_start", "third_start_done"), |b| search(b.i32(2)));
    }
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
/// (cp.async, arrival when landed) and store the tile's `c_j` (plain arrival, release). The
/// first fill (tile `hi`, slot 0, round 0: its `empty` barrier is fresh and would pass at once)
/// needs no search and goes out first; the start search that bounds the rest runs while it
/// lands, and so does its `c_j` load (stored and arrived on after the search).
fn producer<'ctx>(a: &Attn<'_, '_, 'ctx>, cfg: &AttnKernelConfig, lay: &WsLayout, blk: &Block<'ctx>) {
    let b = a.b;
    producer_item(a, cfg, lay, blk, b.i32(0), false, |_| {});
    producer_drain(b, cfg);
}

/// The producer leaves only once its copies have landed (the consumers still read the slots);
/// bulk (TMA) copies complete on the barriers the consumers wait for, `cp.async` ones need a wait.
pub(super) fn producer_drain(b: &KernelBuilder<'_, '_>, cfg: &AttnKernelConfig) {
    if !cfg.tma {
        b.call_void("llvm.nvvm.cp.async.wait.all", &[]);
    }
}

/// The producer's fills of one block (or work item): `fills` of the ring came before it
/// (the persistent kernel's ring runs on across items), its first fill waits for its slot
/// when `first_waits` (a fresh ring's first slot is free), and `post` gets the consumers'
/// start tiles as soon as the search has them. Returns the walk's last tile `lo`.
pub(super) fn producer_item<'ctx>(
    a: &Attn<'_, '_, 'ctx>,
    cfg: &AttnKernelConfig,
    lay: &WsLayout,
    blk: &Block<'ctx>,
    fills: IntValue<'ctx>,
    first_waits: bool,
    post: impl FnOnce(&[IntValue<'ctx>]),
) -> IntValue<'ctx> {
    let b = a.b;
    let hi = walk_hi(a, cfg, blk);
    let first = fill(a, cfg, lay, blk, fills, hi, hi, first_waits);
    let st = starts(a, cfg, lay, blk, b.i32(0), |b| {
        if cfg.prune {
            named_barrier(b, b.i32(producer_barrier(consumers(cfg) as u32)), 128);
        }
    });
    post(&st);
    publish(a, cfg, lay, first);
    let lo = walk_lo(b, &st);
    b.while_loop(
        ("fill", "fill_tile", "fill_done"),
        &[("n", b.addc(hi, -1).into())],
        |b, v| b.icmp(IntPredicate::SGE, v[0].into_int_value(), lo),
        |b, v| {
            let n = v[0].into_int_value();
            let f = fill(a, cfg, lay, blk, fills, hi, n, true);
            publish(a, cfg, lay, f);
            vec![b.addc(n, -1).into()]
        },
    );
    lo
}

/// A fill whose copies are out: its slot and its `c_j` as loaded (decay only), for [`publish`].
struct Fill<'ctx> {
    slot: IntValue<'ctx>,
    cj: Option<FloatValue<'ctx>>,
}

/// Fill `fills + hi - n` of the ring: key tile `n` into its slot (after waiting for the slot to
/// be empty when `wait_empty`): K and V copies with their arrival on `full`, and the load of
/// the tile's `c_j` (column `j0 + tid`, clamped to T - 1).
#[allow(clippy::too_many_arguments)]
fn fill<'ctx>(
    a: &Attn<'_, '_, 'ctx>,
    cfg: &AttnKernelConfig,
    lay: &WsLayout,
    blk: &Block<'ctx>,
    fills: IntValue<'ctx>,
    hi: IntValue<'ctx>,
    n: IntValue<'ctx>,
    wait_empty: bool,
) -> Fill<'ctx> {
    let b = a.b;
    let bn = cfg.bn as i64;
    let kv = lay.kv_bytes as i64;
    let (s, par) = slot(b, lay, b.add(fills, b.sub(hi, n)));
    if wait_empty {
        mbar_wait(b, bar_at(b, a.smem, lay, s, true), b.xorc(par, 1));
    }
    let j0 = b.mulc(n, bn);
    let koff = b.addc(b.mulc(s, 2 * kv), lay.kv0 as i64);
    let full = bar_at(b, a.smem, lay, s, false);
    if cfg.tma {
        tma::fill_kv(a, cfg, lay, blk.kv_head, j0, koff, full);
    } else {
        a.load_tile(blk.kb, j0, cfg.bn, koff, a.k_len);
        a.load_tile(blk.vb, j0, cfg.bn, b.addc(koff, kv), a.k_len);
        mbar_arrive_on_copies(b, full);
    }
    let cj = cfg.has_decay.then(|| {
        let j = b.smin(b.add(j0, a.tid), blk.kmax);
        b.load_f32(b.gep(b.f32t().into(), blk.cb, b.sext64(j)))
    });
    Fill { slot: s, cj }
}

/// The rest of a fill: threads `tid < bn` store the `c_j` into the slot, then every producer
/// thread arrives on `full` (release: the stores are visible to the consumers' acquire wait).
fn publish<'ctx>(a: &Attn<'_, '_, 'ctx>, cfg: &AttnKernelConfig, lay: &WsLayout, f: Fill<'ctx>) {
    let b = a.b;
    let bn = cfg.bn as i64;
    if let Some(cj) = f.cj {
        let inb = b.icmpc(IntPredicate::SLT, a.tid, bn);
        b.if_then_named(inb, ("c_col", "c_col_done"), |b| {
            let off = b.add(b.addc(b.mulc(f.slot, 4 * bn), lay.c0 as i64), b.mulc(a.tid, 4));
            b.store(b.smem_at(a.smem, off), cj);
        });
    }
    mbar_arrive(b, bar_at(b, a.smem, lay, f.slot, false));
}

/// Consumer `cw`'s view of shared memory (its offset and the `Attn` that starts at its Q
/// tile, so the old kernel's wgmma steps find Q at offset 0; the ring's offsets are taken
/// relative to it).
fn consumer_view_of<'a, 'b, 'ctx>(
    a0: &Attn<'a, 'b, 'ctx>,
    lay: &WsLayout,
    cw: IntValue<'ctx>,
) -> (IntValue<'ctx>, Attn<'a, 'b, 'ctx>) {
    let b = a0.b;
    let qoff = b.mulc(cw, lay.q_bytes as i64);
    (qoff, Attn { smem: b.smem_at(a0.smem, qoff), ..*a0 })
}

/// Consumer `cw` issues the copy of its 64 Q rows of `blk` into its Q tile (one cp.async
/// group; [`consumer_item`] waits for it), or with q's load map computes them there.
pub(super) fn load_q<'ctx>(
    a0: &Attn<'_, '_, 'ctx>,
    cfg: &AttnKernelConfig,
    lay: &WsLayout,
    blk: &Block<'ctx>,
    cw: IntValue<'ctx>,
) {
    let b = a0.b;
    let (_, a) = consumer_view_of(a0, lay, cw);
    let (i0w, _, _) = consumer_rows(a0, cfg, blk, cw);
    a.load_q_tile(blk.qb, (i0w, 64), b.i32(0), a.t_len, blk.bh);
    b.cp_async_commit();
}

/// The head's `out` and `lse` for the epilogue: the block's, or for a persistent item made
/// afresh after the walk (a zero-extended head index, so LLVM does not reuse the item's earlier
/// products and keep the two 64-bit pointers live through the walk: live values there moved
/// ptxas's wgmma descriptor schedule).
fn out_ptrs<'ctx>(
    b: &KernelBuilder<'_, 'ctx>,
    cfg: &AttnKernelConfig,
    blk: &Block<'ctx>,
    afresh: bool,
) -> (PointerValue<'ctx>, PointerValue<'ctx>) {
    if !afresh {
        return (blk.ob, blk.lb);
    }
    let row_base = b.mul(b.zext64(blk.bh), b.zext64(b.param_int(FWD.t)));
    let o_elt = if cfg.out_half { b.i16t().into() } else { b.f32t().into() };
    let ob = b.gep(o_elt, b.param_ptr(FWD.out), b.mulc(row_base, cfg.head_dim as i64));
    (ob, b.gep(b.f32t().into(), b.param_ptr(FWD.lse), row_base))
}

/// Consumer `cw` (0 to `consumers - 1`): its 64 rows as one block of the old kernel, reading
/// K/V from the ring, computing only the key tiles in its own range and releasing every slot
/// it is given. Its Q copy and its row loads of `c` go out before the start search, which runs
/// while they land. `fills`: fills of the ring before this block (or work item). `given`: the
/// consumers' start tiles, when the producer found them (the persistent kernel, which has also
/// issued the Q copy already, [`load_q`]; the consumer then searches nothing and its turns at
/// the tensor cores run on across items). Returns the walk's length (the fills it took).
pub(super) fn consumer_item<'ctx>(
    a0: &Attn<'_, '_, 'ctx>,
    cfg: &AttnKernelConfig,
    lay: &WsLayout,
    blk: &Block<'ctx>,
    cw: IntValue<'ctx>,
    fills: IntValue<'ctx>,
    given: Option<&[IntValue<'ctx>]>,
) -> IntValue<'ctx> {
    let b = a0.b;
    let (qoff, a) = consumer_view_of(a0, lay, cw);
    let (i0w, i0c, my_end) = consumer_rows(a0, cfg, blk, cw);

    if given.is_none() {
        load_q(a0, cfg, lay, blk, cw);
    }
    a.prefetch_epilogue_rows((i0w, 64), (a.tid, 128), blk.bh);
    let f32t = b.f32t().into();
    let l2e = b.f32(LOG2E);
    let c_ref = cfg.has_decay.then(|| b.load_f32(b.gep(f32t, blk.cb, b.sext64(a.pos(i0c)))));
    let warp = b.lshrc(a.tid, 5);
    let g = b.lshrc(a.lane, 2);
    let tq = b.andc(a.lane, 3);
    let iw0 = b.add(i0w, b.mulc(warp, 16));
    let i = [b.add(iw0, g), b.addc(b.add(iw0, g), 8)];
    let rows = Rows { iw0, i, pw0: a.pos(iw0), p: i.map(|i| a.pos(i)), tq };
    let cir = match c_ref {
        Some(cr) => rows.i.map(|i| {
            let ci = b.load_f32(b.gep(f32t, blk.cb, b.sext64(a.pos(b.smin(i, blk.tmax)))));
            b.fmul(b.fsub(ci, cr), l2e)
        }),
        None => [b.f32(0.0); 2],
    };
    // The Q tile's barrier also publishes the start search's halves.
    let q_landed = |b: &KernelBuilder<'_, 'ctx>| {
        b.cp_async_wait(0);
        fence_async_shared(b);
        named_barrier(b, b.addc(cw, 1), 128);
    };
    let st = match given {
        Some(st) => {
            q_landed(b);
            st.to_vec()
        }
        None => starts(a0, cfg, lay, blk, b.addc(cw, 1), q_landed),
    };
    let walk = Walk { hi: walk_hi(a0, cfg, blk), lo: walk_lo(b, &st) };
    let my_start =
        (1..st.len()).fold(st[0], |my, w| b.select_i(b.icmpc(IntPredicate::EQ, cw, w as i64), st[w], my));

    let c = Consumer {
        base: a0.smem,
        lay,
        blk,
        walk: &walk,
        fills,
        turns_run_on: given.is_some(),
        turns: !cfg.free_running,
        rows: &rows,
        qoff,
        my_start,
        my_end,
        c_ref,
        cw,
        consumers: consumers(cfg) as u32,
    };
    let (o, m, l) = c.run(&a);
    let (inv, lse) = a.finalize(m, l, cir);
    if cfg.out_half {
        let (ob, lb) = out_ptrs(b, cfg, blk, given.is_some());
        let at = OutAt { base: a0.smem, i0: blk.i0, bh: blk.bh, ob, lb };
        store_output_half(&a, lay, &at, &o, inv, lse);
    } else {
        let (ob, lb) = out_ptrs(b, cfg, blk, given.is_some());
        a.store_output(&o, inv, lse, &rows, (ob, f32t, lb), blk.bh);
    }
    b.addc(b.sub(walk.hi, walk.lo), 1)
}
