//! The persistent grid of the warp-specialized kernel (`grid = persistent`, issue 11 item 1):
//! one block per multiprocessor loops over work items, one item being a 128-row query tile of
//! one head, the work the tiles grid gives a block.
//!
//! **Order.** Item `w` is query tile `nt - 1 - w % nt` of flat head `w / nt` (`nt = ceil(T /
//! 128)`): head-major, the longest query tile of a head first, the order in which the tiles
//! grid's blocks start. Heads stay together so the K/V of the one or two heads in flight stay
//! in L2 (spreading the items over all heads measured 26-32% slower at 1x16x32768x128); within
//! a head the long tiles start first and the short ones fill the end.
//!
//! **Hand-out.** Block `x`'s first item is `x`; every next one is `gridDim.x + atom.add(counter,
//! 1)` on an i32 the runtime zeroes before each launch, taken by the producer's thread 0 once the
//! producer has issued the current item's last fill (the consumers still have up to `stages`
//! tiles and the epilogue of that item to go). So a block whose item was short (pruned) takes
//! the next one, and no block holds an item it has not started.
//!
//! **Item ring.** The producer finds both consumers' start tiles (the search of [`super::roles`],
//! while the item's first K/V fill lands) and posts `(w, start_0, start_1)` in entry `k % 2` of a
//! two-entry ring in shared memory: `item_full[e]` (one arrival, the producer's thread 0 after
//! its stores: release) and `item_empty[e]` (128 arrivals per consumer, after reading
//! it). The consumers never search; past the last item the entry holds `w = -1`.
//!
//! **What runs on across items.** The K/V ring's fill count (every role counts the same
//! `hi - lo + 1` fills per item) and the consumers' pingpong turns (both take the same number
//! per item; the first hand-over and the last wait are made once, around the loop). So the
//! producer's first fill of item `k + 1` goes out as soon as a slot is free, while the
//! consumers finish item `k`.
//!
//! **Free-running consumers** (`turns = none`, `cfg.free_running`) take no turns: no first
//! hand-over, no last wait. The protocol does not depend on the turns, so the grid takes them
//! either way: the turns only order the consumers' GEMMs; every hand-over of data goes through
//! mbarriers that count all consumers (the K/V ring's `empty`, the item ring's `item_empty`,
//! 128 arrivals per consumer) and phase parities, so a consumer that runs ahead waits on the
//! next phase of `full` / `item_full`, which the producer cannot complete before every consumer
//! has released the slot or entry (a lead of at most `stages` fills and two items, within the
//! one-bit parity's reach); the Q tile and its barrier are each consumer's own.

use super::consumer::{first_turn, last_turn};
use super::roles::{
    block_at, consumer_item, consumers, load_q, producer_barrier, producer_drain, producer_item, tail_param,
    walk_hi, Block,
};
use super::sync::{mbar_arrive, mbar_init, mbar_wait, named_barrier};
use super::{residency, WsLayout};
use crate::nvptx::attention::params::Tail;
use crate::nvptx::attention::{Attn, AttnKernelConfig};
use crate::nvptx::builder::KernelBuilder;
use inkwell::values::{BasicValueEnum, IntValue, PointerValue};
use inkwell::IntPredicate;

/// Sentinel item: past the last one.
const DONE: i64 = -1;

/// Query rows of an item: the block's ([`residency`]; 128 with two consumers).
fn item_rows(cfg: &AttnKernelConfig) -> i64 {
    residency(cfg.head_dim, cfg.bn).rows() as i64
}

/// Query tiles per head, `ceil(T / rows)`.
fn tiles_per_head<'ctx>(a: &Attn<'_, '_, 'ctx>, cfg: &AttnKernelConfig) -> IntValue<'ctx> {
    let b = a.b;
    b.udivc(b.addc(a.t_len, item_rows(cfg) - 1), item_rows(cfg))
}

/// `(bh, m)` of item `w`: head-major, longest query tile first.
fn decode<'ctx>(
    a: &Attn<'_, '_, 'ctx>,
    cfg: &AttnKernelConfig,
    w: IntValue<'ctx>,
) -> (IntValue<'ctx>, IntValue<'ctx>) {
    let b = a.b;
    let nt = tiles_per_head(a, cfg);
    (b.udiv(w, nt), b.sub(b.addc(nt, -1), b.urem(w, nt)))
}

/// `item_full[e]` (or `item_empty[e]`).
fn item_bar<'ctx>(
    b: &KernelBuilder<'_, 'ctx>,
    smem: PointerValue<'ctx>,
    lay: &WsLayout,
    e: IntValue<'ctx>,
    empty: bool,
) -> PointerValue<'ctx> {
    b.smem_at(smem, b.addc(b.mulc(e, 8), lay.item0 as i64 + if empty { 16 } else { 0 }))
}

/// Word `i` of entry `e` (0: the item, 1 on: the consumers' start tiles).
fn entry<'ctx>(
    b: &KernelBuilder<'_, 'ctx>,
    smem: PointerValue<'ctx>,
    lay: &WsLayout,
    e: IntValue<'ctx>,
    i: i64,
) -> PointerValue<'ctx> {
    b.smem_at(smem, b.addc(b.mulc(e, 16), lay.item0 as i64 + 32 + 4 * i))
}

/// Initializes the item ring's barriers (by the thread that initializes the K/V ring's).
pub(super) fn init_barriers<'ctx>(
    b: &KernelBuilder<'_, 'ctx>,
    smem: PointerValue<'ctx>,
    lay: &WsLayout,
    consumers: u32,
) {
    for e in 0..2 {
        mbar_init(b, item_bar(b, smem, lay, b.i32(e), false), 1);
        mbar_init(b, item_bar(b, smem, lay, b.i32(e), true), 128 * consumers);
    }
}

/// Entry and round parity of item `k` of this block.
fn ring<'ctx>(b: &KernelBuilder<'_, 'ctx>, k: IntValue<'ctx>) -> (IntValue<'ctx>, IntValue<'ctx>) {
    (b.andc(k, 1), b.andc(b.lshrc(k, 1), 1))
}

/// The producer's thread 0 posts item `k` (`w` and the consumers' start tiles) once entry
/// `k % 2` is free.
fn post<'ctx>(
    a: &Attn<'_, '_, 'ctx>,
    lay: &WsLayout,
    k: IntValue<'ctx>,
    w: IntValue<'ctx>,
    st: &[IntValue<'ctx>],
) {
    let b = a.b;
    let t0 = b.icmpc(IntPredicate::EQ, a.tid, 0);
    b.if_then_named(t0, ("post_item", "item_posted"), |b| {
        let (e, par) = ring(b, k);
        mbar_wait(b, item_bar(b, a.smem, lay, e, true), b.xorc(par, 1));
        for (i, v) in std::iter::once(&w).chain(st).enumerate() {
            b.store(entry(b, a.smem, lay, e, i as i64), *v);
        }
        mbar_arrive(b, item_bar(b, a.smem, lay, e, false));
    });
}

/// The producer's thread 0 asks L2 for the item's Q rows (`cp.async.bulk.prefetch.L2`, the
/// item's rows of `2 D` bytes, none past `T`) when it posts the item: the consumers load their
/// Q tiles only after the previous item's epilogue (the Q tile is its staging buffer), and then
/// find the rows in L2 instead of HBM.
fn prefetch_q<'ctx>(a: &Attn<'_, '_, 'ctx>, cfg: &AttnKernelConfig, blk: &Block<'ctx>) {
    let b = a.b;
    let t0 = b.icmpc(IntPredicate::EQ, a.tid, 0);
    b.if_then_named(t0, ("prefetch_q", "q_prefetched"), |b| {
        let d = cfg.head_dim as i64;
        let rows = b.smin(b.sub(a.t_len, blk.i0), b.i32(item_rows(cfg)));
        let src = b.gep(b.i16t().into(), blk.qb, b.sext64(b.mulc(blk.i0, d)));
        let bytes = b.mulc(rows, 2 * d);
        b.call_void(
            "llvm.nvvm.cp.async.bulk.prefetch.L2",
            &[src.into(), bytes.into(), b.i64(0).into(), b.bool(false).into()],
        );
    });
}

/// A consumer thread reads item `k` (`w`, then the consumers' start tiles) and releases its
/// entry.
fn take<'ctx>(
    a: &Attn<'_, '_, 'ctx>,
    cfg: &AttnKernelConfig,
    lay: &WsLayout,
    k: IntValue<'ctx>,
) -> Vec<IntValue<'ctx>> {
    let b = a.b;
    let (e, par) = ring(b, k);
    mbar_wait(b, item_bar(b, a.smem, lay, e, false), par);
    let i32t = b.i32t().into();
    let v =
        (0..=consumers(cfg)).map(|i| b.load(i32t, entry(b, a.smem, lay, e, i)).into_int_value()).collect();
    mbar_arrive(b, item_bar(b, a.smem, lay, e, true));
    v
}

/// The producer's next item after its `k`-th: thread 0 takes it from the counter, the
/// warpgroup reads it after a barrier (two words, alternating, so a thread still reading the
/// previous one is never overwritten: the next write is behind the next barrier).
fn next_item<'ctx>(
    a: &Attn<'_, '_, 'ctx>,
    cfg: &AttnKernelConfig,
    lay: &WsLayout,
    k: IntValue<'ctx>,
) -> IntValue<'ctx> {
    let b = a.b;
    let at = b.smem_at(a.smem, b.addc(b.mulc(b.andc(k, 1), 4), lay.item0 as i64 + 64));
    let t0 = b.icmpc(IntPredicate::EQ, a.tid, 0);
    b.if_then_named(t0, ("fetch_item", "item_fetched"), |b| {
        let counter = b.param_ptr(tail_param(cfg, a.score, Tail::Work));
        let w = b.add(b.sreg("nctaid.x"), b.atomic_add_i32(counter, b.i32(1)));
        b.store(at, w);
    });
    named_barrier(b, b.i32(producer_barrier(consumers(cfg) as u32)), 128);
    b.load(b.i32t().into(), at).into_int_value()
}

/// The producer warpgroup: every item of this block in turn ([`producer_item`]), posting each
/// with its start tiles (and asking L2 for its Q rows), then the end sentinel.
pub(super) fn producer<'ctx>(a: &Attn<'_, '_, 'ctx>, cfg: &AttnKernelConfig, lay: &WsLayout) {
    let b = a.b;
    let total = b.mul(tiles_per_head(a, cfg), b.param_int(tail_param(cfg, a.score, Tail::Heads)));
    let zero = b.i32(0);
    let carried = [("w", b.sreg("ctaid.x").into()), ("k", zero.into()), ("fills", zero.into())];
    let fin = b.while_loop(
        ("items", "item", "items_done"),
        &carried,
        |b, v| b.icmp(IntPredicate::SLT, v[0].into_int_value(), total),
        |b, v| {
            let [w, k, fills] = [0, 1, 2].map(|i| v[i].into_int_value());
            let (bh, m) = decode(a, cfg, w);
            let blk = block_at(a, cfg, bh, m);
            let lo = producer_item(a, cfg, lay, &blk, fills, true, |st| {
                post(a, lay, k, w, st);
                prefetch_q(a, cfg, &blk);
            });
            let fills = b.add(fills, b.addc(b.sub(walk_hi(a, cfg, &blk), lo), 1));
            let w = next_item(a, cfg, lay, k);
            vec![w.into(), b.addc(k, 1).into(), fills.into()]
        },
    );
    let none = vec![zero; consumers(cfg) as usize];
    post(a, lay, fin[1].into_int_value(), b.i32(DONE), &none);
    producer_drain(b, cfg);
}

/// Consumer warpgroup `cw`: the items the producer posts, in order ([`consumer_item`] with the
/// posted start tiles), until the sentinel. Each item's Q copy goes out as soon as the item is
/// known: the first one (`blockIdx.x`, which the grid never makes past the last item) before
/// the producer has posted it (its start search runs meanwhile), the next ones right after
/// the previous item's epilogue has read its staged output back from the Q tile.
pub(super) fn consumer<'ctx>(
    a: &Attn<'_, '_, 'ctx>,
    cfg: &AttnKernelConfig,
    lay: &WsLayout,
    cw: IntValue<'ctx>,
) {
    let b = a.b;
    let nc = consumers(cfg) as u32;
    if !cfg.free_running {
        first_turn(b, cw, nc);
    }
    let zero = b.i32(0);
    let (bh, m) = decode(a, cfg, b.sreg("ctaid.x"));
    load_q(a, cfg, lay, &block_at(a, cfg, bh, m), cw);
    let it = take(a, cfg, lay, zero);
    // Carried: the item, its start tiles, k, fills.
    let mut carried: Vec<(&str, BasicValueEnum)> = vec![("w", it[0].into())];
    carried.extend(it[1..].iter().map(|s| ("start", (*s).into())));
    carried.extend([("k", zero.into()), ("fills", zero.into())]);
    let n = nc as usize;
    b.while_loop(
        ("items", "item", "items_done"),
        &carried,
        |b, v| b.icmpc(IntPredicate::SGE, v[0].into_int_value(), 0),
        |b, v| {
            let iv: Vec<IntValue> = v.iter().map(|x| x.into_int_value()).collect();
            let (w, st, k, fills) = (iv[0], &iv[1..=n], iv[n + 1], iv[n + 2]);
            let (bh, m) = decode(a, cfg, w);
            let blk = block_at(a, cfg, bh, m);
            let len = consumer_item(a, cfg, lay, &blk, cw, fills, Some(st));
            let k = b.addc(k, 1);
            let it = take(a, cfg, lay, k);
            let more = b.icmpc(IntPredicate::SGE, it[0], 0);
            b.if_then_named(more, ("next_q", "next_q_done"), |b| {
                // This item's epilogue staged its output in the Q tile: every warp of the
                // warpgroup has read it back before the next Q lands there.
                named_barrier(b, b.addc(cw, 1), 128);
                let (bh, m) = decode(a, cfg, it[0]);
                load_q(a, cfg, lay, &block_at(a, cfg, bh, m), cw);
            });
            let mut next: Vec<BasicValueEnum> = it.iter().map(|x| (*x).into()).collect();
            next.extend::<[BasicValueEnum; 2]>([k.into(), b.add(fills, len).into()]);
            next
        },
    );
    if !cfg.free_running {
        last_turn(b, cw, nc);
    }
}
