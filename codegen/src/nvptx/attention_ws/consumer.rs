//! A consumer warpgroup, its GEMMs overlapped with its softmax (issue 11, stage b, inside one
//! warpgroup): for key tile n it issues `S_n = Q K_n^T` and then `O += P_{n+1} V_{n+1}` (the
//! previous tile's probabilities, already in registers) as two wgmma groups, waits for the
//! first only, runs tile n's scores and online softmax while the tensor cores do the second,
//! then waits for it, releases tile n+1's slot and rescales O by tile n's factor. The walk and
//! the ring are those of [`super::roles`]; tiles outside this consumer's range are released
//! without compute, before and after its own tiles.
//!
//! The consumers also take turns at the tensor cores, in a ring (named barriers `nc + 1` ..
//! `2 nc` for `nc` consumers, 256 threads each: the waiting consumer and the one handing over):
//! a consumer waits for its turn before issuing a tile's GEMMs and hands the turn to the next
//! one right after issuing them, so one consumer's softmax runs while another's GEMMs do.
//! Every tile of the walk is one turn for every consumer (a skipped tile too), plus one for the
//! last P V: all take the same number of turns. Consumer 0 goes first (the last consumer hands
//! it the first turn) and takes one extra wait at the end for the last consumer's last
//! hand-over, so no barrier is left half-arrived. In the persistent kernel all take the same
//! number of turns per item too, so the turns run on across items: the first hand-over and the
//! last wait are made once, around the item loop ([`first_turn`], [`last_turn`]; per item they
//! would race: the last consumer's last hand-over of one item and its first of the next could
//! complete the barrier without consumer 0).
//!
//! Free-running consumers (`turns = none`, `cfg.free_running`) take no turns: no turn barrier is
//! emitted, and each consumer issues a tile's GEMMs as soon as the slot is full (and its
//! previous softmax done), as independent blocks of the standard kernel do; the warp schedulers
//! interleave the consumers. The turns order the GEMMs only: every slot's hand-over is the
//! ring's `full` / `empty` mbarriers, which count all consumers, so a consumer runs at most
//! `stages` fills ahead of the slowest one.

use super::roles::{bar_at, slot, Block, Walk};
use super::sync::{fence_async_shared, mbar_arrive, mbar_wait, named_arrive, named_barrier};
use super::WsLayout;
use crate::nvptx::attention::{Attn, Rows, LOG2E};
use crate::nvptx::builder::control::{basic, floats};
use crate::nvptx::builder::KernelBuilder;
use inkwell::values::{BasicValueEnum, FloatValue, IntValue, PointerValue};
use inkwell::IntPredicate;

/// One tile's softmax result: `alpha` on the old state, the new max and sum, packed P.
struct Step<'ctx> {
    alpha: [FloatValue<'ctx>; 2],
    m: [FloatValue<'ctx>; 2],
    l: [FloatValue<'ctx>; 2],
    p: Vec<IntValue<'ctx>>,
}

/// What one consumer needs besides its `Attn` view (`a`) and the block's base (`base`).
pub(super) struct Consumer<'k, 'ctx> {
    pub base: PointerValue<'ctx>,
    pub lay: &'k WsLayout,
    pub blk: &'k Block<'ctx>,
    pub walk: &'k Walk<'ctx>,
    /// Fills of the ring before this walk (the persistent kernel's ring runs on across items).
    pub fills: IntValue<'ctx>,
    /// The turns at the tensor cores run on across the persistent kernel's items: the first
    /// hand-over and the last wait are made once, around the item loop ([`first_turn`],
    /// [`last_turn`]), not by [`Consumer::run`].
    pub turns_run_on: bool,
    /// The consumers take turns at the tensor cores (the ring); false: free-running, no turn
    /// barriers at all (`cfg.free_running`).
    pub turns: bool,
    pub rows: &'k Rows<'ctx>,
    /// Offset of this consumer's view from the block's base (its Q tile).
    pub qoff: IntValue<'ctx>,
    pub my_start: IntValue<'ctx>,
    pub my_end: IntValue<'ctx>,
    pub c_ref: Option<FloatValue<'ctx>>,
    /// This consumer (0 to `consumers - 1`).
    pub cw: IntValue<'ctx>,
    /// Consumer warpgroups of the block (2 or 3).
    pub consumers: u32,
}

/// Named barrier of consumer 0's turn with `consumers` consumers (0 is `__syncthreads`, 1 to
/// `nc` the Q loads): 3 with two consumers.
fn turn_barrier0(consumers: u32) -> i64 {
    consumers as i64 + 1
}

/// The last consumer hands consumer 0 its first turn.
pub(super) fn first_turn<'ctx>(b: &KernelBuilder<'_, 'ctx>, cw: IntValue<'ctx>, consumers: u32) {
    let last = b.icmpc(IntPredicate::EQ, cw, consumers as i64 - 1);
    b.if_then_named(last, ("first_turn", "first_turn_done"), |b| {
        named_arrive(b, b.i32(turn_barrier0(consumers)), 256);
    });
}

/// Consumer 0 takes the last consumer's last hand-over, so no barrier is left half-arrived.
pub(super) fn last_turn<'ctx>(b: &KernelBuilder<'_, 'ctx>, cw: IntValue<'ctx>, consumers: u32) {
    let c0 = b.icmpc(IntPredicate::EQ, cw, 0);
    b.if_then_named(c0, ("last_turn", "last_turn_done"), |b| {
        named_barrier(b, b.i32(turn_barrier0(consumers)), 256);
    });
}

impl<'k, 'ctx> Consumer<'k, 'ctx> {
    /// Waits for this consumer's turn at the tensor cores (nothing when free-running).
    fn turn_begin(&self, b: &KernelBuilder<'_, 'ctx>) {
        if !self.turns {
            return;
        }
        named_barrier(b, b.addc(self.cw, self.turn_barrier()), 256);
    }

    /// Named barrier of consumer 0's turn; consumer `w` has the `w`-th after it (0 is
    /// `__syncthreads`, 1 to `nc` the Q loads): 3 with two consumers.
    fn turn_barrier(&self) -> i64 {
        turn_barrier0(self.consumers)
    }

    /// Hands the turn to the next consumer (nothing when free-running).
    fn turn_end(&self, b: &KernelBuilder<'_, 'ctx>) {
        if !self.turns {
            return;
        }
        let next = if self.consumers == 2 {
            b.xorc(self.cw, 1)
        } else {
            let last = b.icmpc(IntPredicate::EQ, self.cw, self.consumers as i64 - 1);
            b.select_i(last, b.i32(0), b.addc(self.cw, 1))
        };
        named_arrive(b, b.addc(next, self.turn_barrier()), 256);
    }

    /// Byte offsets of slot `s`'s K and V tiles, relative to this consumer's view.
    fn kv_off(&self, b: &KernelBuilder<'_, 'ctx>, s: IntValue<'ctx>) -> (IntValue<'ctx>, IntValue<'ctx>) {
        let kv = self.lay.kv_bytes as i64;
        let k = b.sub(b.addc(b.mulc(s, 2 * kv), self.lay.kv0 as i64), self.qoff);
        (k, b.addc(k, kv))
    }

    /// Waits for fill `k`'s slot to be full; returns (slot, parity).
    fn wait_full(&self, b: &KernelBuilder<'_, 'ctx>, n: IntValue<'ctx>) -> IntValue<'ctx> {
        let k = b.add(self.fills, b.sub(self.walk.hi, n));
        let (s, par) = slot(b, self.lay, k);
        mbar_wait(b, bar_at(b, self.base, self.lay, s, false), par);
        s
    }

    fn release(&self, b: &KernelBuilder<'_, 'ctx>, s: IntValue<'ctx>) {
        mbar_arrive(b, bar_at(b, self.base, self.lay, s, true));
    }

    /// Waits for and releases every tile in `[to, from]` (walking down), computing nothing.
    fn skip(&self, b: &KernelBuilder<'_, 'ctx>, from: IntValue<'ctx>, to: IntValue<'ctx>) {
        b.while_loop(
            ("skip", "skip_tile", "skip_done"),
            &[("n", from.into())],
            |b, v| b.icmp(IntPredicate::SGE, v[0].into_int_value(), to),
            |b, v| {
                let n = v[0].into_int_value();
                let s = self.wait_full(b, n);
                self.turn_begin(b);
                self.release(b, s);
                self.turn_end(b);
                vec![b.addc(n, -1).into()]
            },
        );
    }

    /// Scores and online softmax of key tile `n` from its raw `S` accumulators (slot `s` holds
    /// the tile's `c_j`): the factor on the old state, the new max and sum, and P packed as
    /// bf16 pairs in the wgmma A order.
    fn softmax(
        &self,
        a: &Attn<'_, '_, 'ctx>,
        acc: &[FloatValue<'ctx>],
        n: IntValue<'ctx>,
        s: IntValue<'ctx>,
        m_old: [FloatValue<'ctx>; 2],
        l_old: [FloatValue<'ctx>; 2],
    ) -> Step<'ctx> {
        let b = a.b;
        let bn = a.cfg.bn as i64;
        let s_acc: Vec<[FloatValue; 4]> = acc.chunks(4).map(|c| [c[0], c[1], c[2], c[3]]).collect();
        let j0 = b.mulc(n, bn);
        let col0 = b.add(j0, b.mulc(self.rows.tq, 2));
        let c_col: Vec<FloatValue> = match self.c_ref {
            Some(cr) => {
                let cbuf = b.sub(b.addc(b.mulc(s, 4 * bn), self.lay.c0 as i64), self.qoff);
                let l2e = b.f32(LOG2E);
                a.load_colb(cbuf, self.rows.tq).into_iter().map(|cj| b.fmul(b.fsub(cr, cj), l2e)).collect()
            }
            None => vec![],
        };
        let s2 = a.scores(&s_acc, &c_col, self.rows, j0, col0, self.blk.bh);
        let st = a.online_softmax(&s2, m_old, l_old);
        let p = st.p.chunks(2).map(|p| b.pack_half2(a.cfg.dtype_in, p[0], p[1])).collect();
        Step { alpha: st.alpha, m: st.m_new, l: st.l_new, p }
    }

    /// Issues `S = Q K^T` for the K tile at `koff` (one wgmma group); returns the accumulators
    /// (valid only after the matching `wgmma.wait_group`).
    fn issue_qk(&self, a: &Attn<'_, '_, 'ctx>, koff: IntValue<'ctx>) -> Vec<FloatValue<'ctx>> {
        let b = a.b;
        let (bm, bn) = (a.cfg.block_rows() as i64, a.cfg.bn as i64);
        let mut acc = vec![b.f32(0.0); (bn / 2) as usize];
        for s in 0..(a.cfg.head_dim / 16) as i64 {
            let step = (s / 4, (s % 4) * 32);
            let da = a.gmma_desc(b.i32(step.0 * bm * 128 + step.1), 16);
            let db = a.gmma_desc(b.addc(koff, step.0 * bn * 128 + step.1), 16);
            acc = a.wgmma(&acc, da, db);
        }
        b.asm_stmt("wgmma.commit_group.sync.aligned;");
        acc
    }

    /// Issues `O += P V` for the V tile at `voff` (one wgmma group); `p` packed bf16 pairs in
    /// the order [`Self::softmax`] returns (4 per 16 keys).
    fn issue_pv(
        &self,
        a: &Attn<'_, '_, 'ctx>,
        mut o: Vec<FloatValue<'ctx>>,
        p: &[IntValue<'ctx>],
        voff: IntValue<'ctx>,
    ) -> Vec<FloatValue<'ctx>> {
        let b = a.b;
        let bn = a.cfg.bn as i64;
        for kk in 0..(bn / 16) as usize {
            // The A fragment of keys 16kk..: n-tiles 2kk (rows g, g+8) and 2kk+1.
            let frag = [p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3]];
            let db = a.gmma_desc(b.addc(voff, kk as i64 * 16 * 128), bn * 128);
            o = a.wgmma_rs(&o, &frag, db);
        }
        b.asm_stmt("wgmma.commit_group.sync.aligned;");
        o
    }

    /// The whole walk of this consumer; returns O and the final max and sum.
    pub(super) fn run(
        &self,
        a: &Attn<'_, '_, 'ctx>,
    ) -> (Vec<FloatValue<'ctx>>, [FloatValue<'ctx>; 2], [FloatValue<'ctx>; 2]) {
        let b = a.b;
        let dt = (a.cfg.head_dim / 8) as usize;
        let pn = (a.cfg.bn / 4) as usize; // packed P values per thread
        let zero = b.f32(0.0);
        let ninf = b.f32(f64::NEG_INFINITY);
        if self.turns && !self.turns_run_on {
            first_turn(b, self.cw, self.consumers);
        }
        self.skip(b, self.walk.hi, b.addc(self.my_end, 1));

        // First own tile: S alone, then its softmax (O is still zero: nothing to rescale).
        let n0 = self.my_end;
        let s0 = self.wait_full(b, n0);
        fence_async_shared(b);
        let (k0, _) = self.kv_off(b, s0);
        self.turn_begin(b);
        b.asm_stmt("wgmma.fence.sync.aligned;");
        let acc = self.issue_qk(a, k0);
        self.turn_end(b);
        let acc = b.asm_pass("wgmma.wait_group.sync.aligned 0;", &acc);
        let st = self.softmax(a, &acc, n0, s0, [ninf; 2], [zero; 2]);

        // Own tiles n0 - 1 down to my_start: S_n and P_{n+1} V_{n+1} in flight together.
        let mut carried: Vec<(&str, BasicValueEnum)> =
            vec![("n", b.addc(n0, -1).into()), ("sprev", s0.into())];
        carried.extend((0..dt * 4).map(|_| ("o", zero.into())));
        carried.extend([("m", st.m[0].into()), ("m", st.m[1].into())]);
        carried.extend([("l", st.l[0].into()), ("l", st.l[1].into())]);
        carried.extend(st.p.iter().map(|v| ("p", (*v).into())));
        let fin = b.while_loop(
            ("own", "own_tile", "own_done"),
            &carried,
            |b, v| b.icmp(IntPredicate::SGE, v[0].into_int_value(), self.my_start),
            |b, v| {
                let n = v[0].into_int_value();
                let sprev = v[1].into_int_value();
                let o = floats(&v[2..2 + dt * 4]);
                let m_old = [v[2 + dt * 4].into_float_value(), v[3 + dt * 4].into_float_value()];
                let l_old = [v[4 + dt * 4].into_float_value(), v[5 + dt * 4].into_float_value()];
                let p: Vec<IntValue> = v[6 + dt * 4..].iter().map(|x| x.into_int_value()).collect();
                let s = self.wait_full(b, n);
                fence_async_shared(b);
                let (k, _) = self.kv_off(b, s);
                let (_, vprev) = self.kv_off(b, sprev);
                self.turn_begin(b);
                b.asm_stmt("wgmma.fence.sync.aligned;");
                let acc = self.issue_qk(a, k);
                let o = self.issue_pv(a, o, &p, vprev);
                self.turn_end(b);
                let acc = b.asm_pass("wgmma.wait_group.sync.aligned 1;", &acc);
                let st = self.softmax(a, &acc, n, s, m_old, l_old);
                let o = b.asm_pass("wgmma.wait_group.sync.aligned 0;", &o);
                self.release(b, sprev);
                let o = a.rescale(&o, st.alpha);
                let mut next = vec![b.addc(n, -1).into(), s.into()];
                next.extend(basic(&o));
                next.extend(basic(&st.m));
                next.extend(basic(&st.l));
                next.extend(basic(&st.p));
                next
            },
        );
        // The last own tile's P V, then its slot.
        let sprev = fin[1].into_int_value();
        let o = floats(&fin[2..2 + dt * 4]);
        let m = [fin[2 + dt * 4].into_float_value(), fin[3 + dt * 4].into_float_value()];
        let l = [fin[4 + dt * 4].into_float_value(), fin[5 + dt * 4].into_float_value()];
        let p: Vec<IntValue> = fin[6 + dt * 4..6 + dt * 4 + pn].iter().map(|x| x.into_int_value()).collect();
        let (_, vprev) = self.kv_off(b, sprev);
        self.turn_begin(b);
        b.asm_stmt("wgmma.fence.sync.aligned;");
        let o = self.issue_pv(a, o, &p, vprev);
        self.turn_end(b);
        let o = b.asm_pass("wgmma.wait_group.sync.aligned 0;", &o);
        self.release(b, sprev);
        self.skip(b, b.addc(self.my_start, -1), self.walk.lo);
        if self.turns && !self.turns_run_on {
            last_turn(b, self.cw, self.consumers);
        }
        (o, m, l)
    }
}
