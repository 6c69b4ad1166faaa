//! The dq kernel: one block of [`DQ_ROWS`] query rows walks the forward's kept key tiles
//! (diagonal first, down to `start[m]`), accumulating `dQ = scale sum_j dx_ij k_j` and the row
//! sums of dS in registers; writes dq, dc (the row sums, decay only) and, for the dkv kernel,
//! `start[m]` of its IR tile (pruned only). See the module documentation for the parameters.

use super::probs::{ElemFn, PosFn};
use super::{Bwd, BwdConfig, Regions, DQ_ROWS, LOG2E};
use crate::nvptx::attention::key_bound::{first_key_tile, BoundRows};
use crate::nvptx::attention::params::{BwdTailParam, DqParams, DQ};
use crate::nvptx::attention::prune::{search_start, SearchAt};
use crate::nvptx::attention::score::ScoreMod;
use crate::nvptx::builder::control::{basic, floats};
use crate::nvptx::builder::ParamTy;
use crate::nvptx::heads;
use inkwell::context::Context;
use inkwell::module::Module;
use inkwell::values::{BasicValueEnum, FloatValue, FunctionValue, IntValue, PointerValue};
use inkwell::{FloatPredicate, IntPredicate};

pub(super) fn build<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    name: &str,
    cfg: &BwdConfig,
    regions: &Regions,
) -> Result<FunctionValue<'ctx>, String> {
    let p = ParamTy::Ptr;
    let params = DqParams {
        q: ("q", p),
        k: ("k", p),
        v: ("v", p),
        c: ("c", p),
        delta: ("delta", p),
        dout: ("dout", p),
        lse: ("lse", p),
        dd: ("dd", p),
        dq: ("dq", p),
        dc: ("dc", p),
        start: ("start", p),
        t: ("T", ParamTy::I32),
    }
    .into_vec();
    Bwd::build(ctx, module, (name, &params), (cfg, regions), cfg.dq_threads(), |k| k.emit_dq())
}

/// The dq kernel's loop invariants: the block's rows and head, its buffers (pointers at the
/// head's row 0) and shared-memory offsets, the first and last key tiles, and the thread's rows
/// with their terms.
struct DqBlock<'ctx> {
    bh: IntValue<'ctx>,
    /// The head-dim part of a split block, and whether it is part 0.
    part: Option<IntValue<'ctx>>,
    first_part: Option<IntValue<'ctx>>,
    n_end: IntValue<'ctx>,
    n_start: IntValue<'ctx>,
    /// Row index of the head's row 0 (i64).
    row_base: IntValue<'ctx>,
    kb: PointerValue<'ctx>,
    vb: PointerValue<'ctx>,
    cb: PointerValue<'ctx>,
    dqb: PointerValue<'ctx>,
    dcb: PointerValue<'ctx>,
    q_off: IntValue<'ctx>,
    do_off: IntValue<'ctx>,
    k_off: [IntValue<'ctx>; 2],
    v_off: [IntValue<'ctx>; 2],
    colb: [IntValue<'ctx>; 2],
    c_ref: Option<FloatValue<'ctx>>,
    /// Lane within its row's quad, the warp's first row (in the block), and absolute.
    tq: IntValue<'ctx>,
    wrow0: IntValue<'ctx>,
    iw0: IntValue<'ctx>,
    ri: [IntValue<'ctx>; 2],
    rt: [FloatValue<'ctx>; 2],
    ddr: [FloatValue<'ctx>; 2],
    #[allow(clippy::type_complexity)]
    qdo: Option<(Vec<[IntValue<'ctx>; 4]>, Vec<[IntValue<'ctx>; 4]>)>,
    /// 8-column tiles of the dQ this block accumulates (its head-dim part).
    dq_tiles: usize,
}

impl<'k, 'a, 'ctx> Bwd<'k, 'a, 'ctx> {
    fn emit_dq(&self) {
        let b = self.b;
        let blk = self.dq_block();
        let dt = blk.dq_tiles;
        let zero = b.f32(0.0);
        let mut carried: Vec<(&str, BasicValueEnum)> =
            vec![("n", blk.n_end.into()), ("parity", b.i32(0).into())];
        carried.extend((0..dt * 4).map(|_| ("dq", zero.into())));
        carried.extend([("rowsum", zero.into()), ("rowsum", zero.into())]);
        // Row sums of the captured tensors' terms, two per query-read gradient slot.
        carried.extend((0..2 * self.regions.slots(false).len()).map(|_| ("caprow", zero.into())));
        let last = b.do_while(("tile", "epilogue"), &carried, |_, vals| self.dq_tile(&blk, vals));
        self.dq_epilogue(&blk, &last);
    }

    /// The block's rows, buffers and shared-memory layout; the first loads issued (Q and dO,
    /// then the diagonal's K and V), the first key tile found (window, pruning search), and
    /// once Q and dO have landed, the thread's fragments and per-row terms.
    fn dq_block(&self) -> DqBlock<'ctx> {
        let (b, cfg) = (self.b, self.cfg);
        let d = cfg.head_dim as i64;
        let rows = DQ_ROWS as i64;
        let bn = cfg.bn as i64;
        let t_len = self.t_len;
        let pp = |i| b.param_ptr(i);
        let (q_p, k_p, v_p, c_p, delta_p, do_p) =
            (pp(DQ.q), pp(DQ.k), pp(DQ.v), pp(DQ.c), pp(DQ.delta), pp(DQ.dout));
        let (lse_p, dd_p, dq_p, dc_p, st_p) = (pp(DQ.lse), pp(DQ.dd), pp(DQ.dq), pp(DQ.dc), pp(DQ.start));
        let i16t = b.i16t().into();
        let f32t = b.f32t().into();

        let warp = b.lshrc(self.tid, 5);
        let bx = b.sreg("ctaid.x");
        let (bh, part) = self.head_and_part();
        let first_part = self.first_part(part);
        // Longest first: blockIdx.x = 0 takes the last query tile (as the forward).
        let m = b.sub(b.addc(b.sreg("nctaid.x"), -1), bx);
        let i0 = b.mulc(m, rows);
        let tmax = b.addc(t_len, -1);
        let i_last = b.smin(b.addc(i0, rows - 1), tmax);
        // The last key tile: the diagonal's under a causal mask, else the sequence's.
        let kmax = if self.off.is_some() { b.addc(self.k_len, -1) } else { tmax };
        let j_last = if cfg.causal { self.pos(i_last) } else { kmax };
        let n_end = b.named(b.sdivc(j_last, bn), "n_end");

        let t64 = b.sext64(t_len);
        let row_base = b.mul(b.sext64(bh), t64);
        // c and dc are per key position: [B, H, Tk].
        let c_base = self.key_base(bh, row_base);
        let mat_base = b.mulc(row_base, d);
        let kv_base = b.mulc(heads::kv_rows(b, bh, self.k_len, cfg.kv_group), d);
        let (qb, dob) = (b.gep(i16t, q_p, mat_base), b.gep(i16t, do_p, mat_base));
        let (kb, vb) = (b.gep(i16t, k_p, kv_base), b.gep(i16t, v_p, kv_base));
        let dqb = b.gep(self.grad_elem(), dq_p, mat_base);
        let (cb, lb) = (b.gep(f32t, c_p, c_base), b.gep(f32t, lse_p, row_base));
        let (ddb, dcb) = (b.gep(f32t, dd_p, row_base), b.gep(f32t, dc_p, c_base));

        // Shared memory: Q, dO, K[bufs], V[bufs], column bias[2]. One buffer: K[1] = K[0].
        let tile = rows * d * 2;
        let kv = bn * d * 2;
        let bufs = cfg.dq_kv_buffers() as i64;
        let q_off = b.i32(0);
        let do_off = b.i32(tile);
        let (k_off, v_off) = if bufs == 2 {
            ([b.i32(2 * tile), b.i32(2 * tile + 2 * kv)], [b.i32(2 * tile + kv), b.i32(2 * tile + 3 * kv)])
        } else {
            ([b.i32(2 * tile); 2], [b.i32(2 * tile + kv); 2])
        };
        let colb = [b.i32(2 * tile + 2 * bufs * kv), b.i32(2 * tile + 2 * bufs * kv + bn * 4)];

        self.load_tile(qb, (i0, t_len), DQ_ROWS, q_off);
        self.load_tile(dob, (i0, t_len), DQ_ROWS, do_off);
        b.cp_async_commit();
        let j_end0 = b.mulc(n_end, bn);
        self.load_tile(kb, (j_end0, self.k_len), cfg.bn, k_off[0]);
        self.load_tile(vb, (j_end0, self.k_len), cfg.bn, v_off[0]);
        b.cp_async_commit();

        let c_ref = cfg.has_decay.then(|| {
            let cr = b.load_f32(b.gep(f32t, cb, b.sext64(self.pos(i0))));
            self.store_colb(cr, self.col_c(cb, n_end), colb[0]);
            cr
        });
        let n_start = self.dq_first_tile(cb, (delta_p, st_p), (bh, i0, n_end), first_part);

        // Q and dO landed (the diagonal's K and V may still be in flight).
        b.cp_async_wait(1);
        self.fence_proxy();
        b.barrier();
        let g = b.lshrc(self.lane, 2);
        let tq = b.andc(self.lane, 3);
        let wrow0 = b.mulc(warp, 16);
        // mma.sync: the Q and dO fragments stay in registers (wgmma reads the tiles; a split
        // head dim reads them per k-step, see `mma_abt_smem`).
        let qdo =
            (!self.wg && part.is_none()).then(|| (self.a_frags(q_off, wrow0), self.a_frags(do_off, wrow0)));
        let iw0 = b.add(i0, wrow0);
        let ri = [b.add(iw0, g), b.addc(b.add(iw0, g), 8)];
        let (rt, ddr) = self.dq_row_terms(ri, (cb, lb, ddb), c_ref);
        DqBlock {
            bh,
            part,
            first_part,
            n_end,
            n_start,
            row_base,
            kb,
            vb,
            cb,
            dqb,
            dcb,
            q_off,
            do_off,
            k_off,
            v_off,
            colb,
            c_ref,
            tq,
            wrow0,
            iw0,
            ri,
            rt,
            ddr,
            qdo,
            dq_tiles: (cfg.part_dim() / 8) as usize,
        }
    }

    /// The first key tile of the block: the window's, raised by the forward's pruning search
    /// and by the key bound of the block's rows. The IR tile's own first tile (the search's,
    /// raised to the key bound of all its rows) is written for the dkv kernel by the block
    /// holding the IR tile's first row. Never past the diagonal's `n_end`: the walk visits it.
    fn dq_first_tile(
        &self,
        cb: PointerValue<'ctx>,
        (delta_p, st_p): (PointerValue<'ctx>, PointerValue<'ctx>),
        (bh, i0, n_end): (IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>),
        first_part: Option<IntValue<'ctx>>,
    ) -> IntValue<'ctx> {
        let (b, cfg) = (self.b, self.cfg);
        let (bn, t_len) = (cfg.bn as i64, self.t_len);
        let mut n_start = b.i32(0);
        if let Some(w) = cfg.window {
            n_start = b.sdivc(b.smax(b.addc(self.pos(i0), 1 - w as i64), b.i32(0)), bn);
        }
        if !cfg.uses_start() {
            return n_start;
        }
        let bm = cfg.bm as i64;
        let m_ir = b.udivc(i0, bm);
        let i0_ir = b.mulc(m_ir, bm);
        let search = cfg.prune.then(|| {
            let (p0, k_len) = (self.pos(i0_ir), self.k_len);
            let at = SearchAt { cb, delta_p, bh, m: m_ir, p0, t_len, k_len, lane: self.lane, slice: None };
            search_start(b, cfg.bm, cfg.bn, &at)
        });
        let bound = |i0, rows| {
            let at = BoundRows { bh, i0, rows, lane: self.lane, k_len: self.k_len, bn: cfg.bn };
            cfg.key_bound.then(|| first_key_tile(b, self.regions.score, &at)).flatten()
        };
        let tile_start = [search, bound(i0_ir, cfg.bm)].into_iter().flatten().reduce(|x, y| b.smax(x, y));
        let tile_start = tile_start.expect("uses_start: a search or a key bound");
        let mut first = b.and(b.icmp(IntPredicate::EQ, i0, i0_ir), b.icmpc(IntPredicate::EQ, self.tid, 0));
        if let Some(f) = first_part {
            first = b.and(first, f);
        }
        b.if_then(first, |b| {
            let mt = b.sdivc(b.addc(t_len, bm - 1), bm);
            let idx = b.add(b.mul(bh, mt), m_ir);
            b.store(b.gep(b.i32t().into(), st_p, b.sext64(idx)), tile_start);
        });
        for s in [search, bound(i0, DQ_ROWS)].into_iter().flatten() {
            n_start = b.smax(n_start, s);
        }
        if cfg.key_bound {
            n_start = b.smin(n_start, n_end);
        }
        n_start
    }

    /// Per row `ri[r]` of the thread: `(c_i - c_ref - lse_i) log2 e` (`-inf` for an empty row)
    /// and `D_i`.
    fn dq_row_terms(
        &self,
        ri: [IntValue<'ctx>; 2],
        (cb, lb, ddb): (PointerValue<'ctx>, PointerValue<'ctx>, PointerValue<'ctx>),
        c_ref: Option<FloatValue<'ctx>>,
    ) -> ([FloatValue<'ctx>; 2], [FloatValue<'ctx>; 2]) {
        let b = self.b;
        let f32t = b.f32t().into();
        let tmax = b.addc(self.t_len, -1);
        let l2e = b.f32(LOG2E);
        let ninf = b.f32(f64::NEG_INFINITY);
        let mut rt = [ninf; 2];
        let mut ddr = [ninf; 2];
        for r in 0..2 {
            let i = b.smin(ri[r], tmax);
            let ic = b.sext64(i);
            // c at the row's key position.
            let pc = self.pos_index(i, ic);
            let li = b.load_f32(b.gep(f32t, lb, ic));
            let cterm = match c_ref {
                Some(cr) => b.fsub(b.load_f32(b.gep(f32t, cb, pc)), cr),
                None => b.f32(0.0),
            };
            let empty = b.fcmp(FloatPredicate::OEQ, li, ninf);
            rt[r] = b.select_f(empty, ninf, b.fmul(b.fsub(cterm, li), l2e));
            ddr[r] = b.load_f32(b.gep(f32t, ddb, ic));
        }
        (rt, ddr)
    }

    /// One key tile `n` (carried: `n, parity, dq..., rowsum x2, caprow...`): prefetch the next
    /// tile, S and dP, probabilities and dS, the row sums, dQ += dS K; the carried values of
    /// the next iteration, and whether there is one.
    fn dq_tile(
        &self,
        blk: &DqBlock<'ctx>,
        vals: &[BasicValueEnum<'ctx>],
    ) -> (IntValue<'ctx>, Vec<BasicValueEnum<'ctx>>) {
        let (b, cfg) = (self.b, self.cfg);
        let bn = cfg.bn as i64;
        let dt = blk.dq_tiles;
        let cap_slots = self.regions.slots(false);
        let c0 = 4 + dt * 4;
        let (k_off, v_off) = (blk.k_off, blk.v_off);
        let n = vals[0].into_int_value();
        let par = vals[1].into_int_value();
        let dq_in = floats(&vals[2..2 + dt * 4]);
        let rs_in = [vals[2 + dt * 4].into_float_value(), vals[3 + dt * 4].into_float_value()];
        b.cp_async_wait(0);
        self.fence_proxy();
        b.barrier();
        let is0 = b.icmpc(IntPredicate::EQ, par, 0);
        let more = b.icmp(IntPredicate::SGT, n, blk.n_start);
        // The next key tile into the other buffer (with one buffer: after the products).
        let prefetch = |b: &crate::nvptx::builder::KernelBuilder<'a, 'ctx>| {
            b.if_then(more, |b| {
                let jn = (b.mulc(b.addc(n, -1), bn), self.k_len);
                self.load_tile(blk.kb, jn, cfg.bn, b.select_i(is0, k_off[1], k_off[0]));
                self.load_tile(blk.vb, jn, cfg.bn, b.select_i(is0, v_off[1], v_off[0]));
            });
            b.cp_async_commit();
        };
        let bufs = cfg.dq_kv_buffers();
        if bufs == 2 {
            prefetch(b);
        }
        let kcur = b.select_i(is0, k_off[0], k_off[1]);
        let vcur = b.select_i(is0, v_off[0], v_off[1]);
        let j0 = b.mulc(n, bn);
        let col0 = b.add(j0, b.mulc(blk.tq, 2));
        let (c_col, c_next) = if cfg.has_decay {
            let c_col = self.load_colb(b.select_i(is0, blk.colb[0], blk.colb[1]), blk.tq);
            (c_col, Some(self.col_c(blk.cb, b.smax(b.addc(n, -1), b.i32(0)))))
        } else {
            (vec![], None)
        };
        let (q_off, do_off) = (blk.q_off, blk.do_off);
        let (s, dp) = match &blk.qdo {
            Some((qf, dof)) => (self.mma_abt(qf, kcur, cfg.bn), self.mma_abt(dof, vcur, cfg.bn)),
            None if !self.wg => (
                self.mma_abt_smem((q_off, blk.wrow0), kcur, cfg.bn),
                self.mma_abt_smem((do_off, blk.wrow0), vcur, cfg.bn),
            ),
            None => {
                let mut r = self
                    .wg_abt_batch(&[((q_off, DQ_ROWS), (kcur, cfg.bn)), ((do_off, DQ_ROWS), (vcur, cfg.bn))]);
                let dp = r.pop().unwrap_or_default();
                (r.pop().unwrap_or_default(), dp)
            }
        };
        let (ri, rt, ddr) = (blk.ri, blk.rt, blk.ddr);
        // Element e of n-tile jt: row ri[e / 2], key col0 + 8 jt + (e & 1).
        let pos: PosFn = &|jt, e| (ri[e / 2], b.addc(col0, (8 * jt + (e & 1)) as i64));
        let term: ElemFn = &|jt, e| match c_col.get(jt * 2 + (e & 1)) {
            Some(&cc) => b.fadd(cc, rt[e / 2]),
            None => rt[e / 2],
        };
        let need = self.dq_needs_mask(j0, blk.iw0);
        let (p, xs) = self.probs(&s, term, pos, need, blk.bh);
        let ddf: ElemFn = &|_, e| ddr[e / 2];
        let (ds, dx) = self.dscores(&p, &dp, ddf, &xs, pos, blk.bh);
        let mut rs = rs_in;
        for (k, v) in ds.iter().enumerate() {
            let r = (k % 4) / 2;
            rs[r] = b.fadd(rs[r], *v);
        }
        let mut caprs = floats(&vals[c0..c0 + 2 * cap_slots.len()]);
        for (s, terms) in self.capture_terms(&p, &ds, &xs, pos, blk.bh, false).iter().enumerate() {
            for (k, v) in terms.iter().enumerate() {
                let r = 2 * s + (k % 4) / 2;
                caprs[r] = b.fadd(caprs[r], *v);
            }
        }
        let dq = if self.wg {
            self.wg_acc_now(dq_in, &dx, kcur, cfg.bn)
        } else {
            // The block's part: 16-byte chunks from part * part_dim / 8.
            let ch0 = blk.part.map(|p| b.mulc(p, (cfg.part_dim() / 8) as i64));
            self.mma_acc(dq_in, &dx, (kcur, ch0), cfg.bn)
        };
        if let (Some(cr), Some(cn)) = (blk.c_ref, c_next) {
            // The other bias buffer was last read before this iteration's barrier.
            self.store_colb(cr, cn, b.select_i(is0, blk.colb[1], blk.colb[0]));
        }
        if bufs == 1 {
            // Every warp is done reading K and V before the next tile overwrites them.
            b.barrier();
            prefetch(b);
        }
        let n_next = b.addc(n, -1);
        let again = b.icmp(IntPredicate::SGE, n_next, blk.n_start);
        let mut next = vec![n_next.into(), b.xorc(par, 1).into()];
        next.extend(basic(&dq));
        next.extend(basic(&rs));
        next.extend(basic(&caprs));
        (again, next)
    }

    /// Whether the tile at key `j0` needs the element mask for the warp's rows from `iw0`: it
    /// crosses the diagonal (causal), the score region has a mask (every element, as the
    /// forward's softmax), it runs past the keys, or part of it lies outside the window.
    fn dq_needs_mask(&self, j0: IntValue<'ctx>, iw0: IntValue<'ctx>) -> IntValue<'ctx> {
        let (b, cfg) = (self.b, self.cfg);
        let bn = cfg.bn as i64;
        let pw0 = self.pos(iw0);
        let mut need = if cfg.causal {
            b.icmp(IntPredicate::SGT, b.addc(j0, bn - 1), pw0)
        } else if self.regions.score.has_mask() {
            b.bool(true)
        } else {
            b.icmp(IntPredicate::SGE, b.addc(j0, bn - 1), self.k_len)
        };
        if let Some(w) = cfg.window {
            let wl = b.sub(b.addc(pw0, 15), j0);
            need = b.or(need, b.icmpc(IntPredicate::SGE, wl, w as i64));
        }
        need
    }

    /// Epilogue: dq = scale * acc (f32 pairs), the row sums of dS into dc, the captured
    /// tensors' row sums into their gradients.
    fn dq_epilogue(&self, blk: &DqBlock<'ctx>, last: &[BasicValueEnum<'ctx>]) {
        let (b, cfg) = (self.b, self.cfg);
        let d = cfg.head_dim as i64;
        let f32t = b.f32t().into();
        let dt = blk.dq_tiles;
        let cap_slots = self.regions.slots(false);
        let c0 = 4 + dt * 4;
        let (tq, ri, t_len) = (blk.tq, blk.ri, self.t_len);
        let dq = floats(&last[2..2 + dt * 4]);
        let rs = [last[2 + dt * 4].into_float_value(), last[3 + dt * 4].into_float_value()];
        // The captured tensors' row sums over the row's 4 lanes (every lane shuffles: outside
        // the row guard below), 0 for a gradient without a query read; [slot][row].
        let caprs = floats(&last[c0..c0 + 2 * cap_slots.len()]);
        let capsum: Vec<[FloatValue<'ctx>; 2]> = (0..self.regions.grads)
            .map(|slot| match cap_slots.iter().position(|&c| c == slot) {
                Some(s) => [0, 1].map(|r| {
                    let v = caprs[2 * s + r];
                    let v = b.fadd(v, b.shfl_xor(v, 1));
                    b.fadd(v, b.shfl_xor(v, 2))
                }),
                None => [b.f32(0.0); 2],
            })
            .collect();
        let sc = b.f32(cfg.scale as f64);
        let mut t2 = b.mulc(tq, 2);
        if let Some(p) = blk.part {
            t2 = b.add(t2, b.mulc(p, cfg.part_dim() as i64));
        }
        for r in 0..2 {
            let mut sum = rs[r];
            sum = b.fadd(sum, b.shfl_xor(sum, 1));
            sum = b.fadd(sum, b.shfl_xor(sum, 2));
            let inb = b.icmp(IntPredicate::SLT, ri[r], t_len);
            b.if_then(inb, |b| {
                let rowoff = b.mulc(ri[r], d);
                for dtile in 0..dt {
                    let x0 = b.fmul(dq[dtile * 4 + 2 * r], sc);
                    let x1 = b.fmul(dq[dtile * 4 + 2 * r + 1], sc);
                    let idx = b.add(rowoff, b.addc(t2, 8 * dtile as i64));
                    self.store_grad_pair(blk.dqb, b.sext64(idx), x0, x1);
                }
                // Every gradient of a captured tensor: its row sums (0 without a query read);
                // the dkv kernel adds the column sums.
                for (slot, sums) in capsum.iter().enumerate() {
                    let v = sums[r];
                    let mut w = b.icmpc(IntPredicate::EQ, tq, 0);
                    if let Some(f) = blk.first_part {
                        w = b.and(w, f);
                    }
                    let gp = b.gep(f32t, b.param_ptr(self.tail.at(BwdTailParam::Grad(slot))), blk.row_base);
                    b.if_then(w, |b| b.store(b.gep(f32t, gp, b.sext64(ri[r])), v));
                }
                if cfg.has_decay {
                    let mut w = b.icmpc(IntPredicate::EQ, tq, 0);
                    if let Some(f) = blk.first_part {
                        w = b.and(w, f);
                    }
                    // At the row's key position (dc is [B, H, Tk]).
                    b.if_then(w, |b| {
                        b.store(b.gep(f32t, blk.dcb, b.sext64(self.pos(ri[r]))), sum);
                    });
                }
            });
        }
    }

    /// c at key `n * bn + (tid mod bn)` (clamped to Tk-1).
    pub(super) fn col_c(
        &self,
        cb: inkwell::values::PointerValue<'ctx>,
        n: IntValue<'ctx>,
    ) -> FloatValue<'ctx> {
        let b = self.b;
        let bn = self.cfg.bn as i64;
        let j = b.smin(b.add(b.mulc(n, bn), b.uremc(self.tid, bn)), b.addc(self.k_len, -1));
        b.load_f32(b.gep(b.f32t().into(), cb, b.sext64(j)))
    }

    /// Threads `tid < bn` write the column bias `(c_ref - c_j) log2 e` to the buffer at `off`.
    fn store_colb(&self, c_ref: FloatValue<'ctx>, cj: FloatValue<'ctx>, off: IntValue<'ctx>) {
        let b = self.b;
        let v = b.fmul(b.fsub(c_ref, cj), b.f32(LOG2E));
        b.if_then(b.icmpc(IntPredicate::SLT, self.tid, self.cfg.bn as i64), |b| {
            b.store(b.smem_at(self.smem, b.add(off, b.mulc(self.tid, 4))), v);
        });
    }

    /// This thread's column biases (columns `8 jt + 2t`, `+ 1` of each n-tile) from `buf`.
    fn load_colb(&self, buf: IntValue<'ctx>, tq: IntValue<'ctx>) -> Vec<FloatValue<'ctx>> {
        self.load_pairs(buf, tq, self.cfg.bn)
    }

    /// The f32 pairs at columns `8 jt + 2t`, `+ 1` (jt < n / 8) of the f32 row at `buf`.
    pub(super) fn load_pairs(
        &self,
        buf: IntValue<'ctx>,
        tq: IntValue<'ctx>,
        n: u32,
    ) -> Vec<FloatValue<'ctx>> {
        let b = self.b;
        let v2t = b.f32t().vec_type(2);
        let t8 = b.mulc(tq, 8);
        let mut out = Vec::new();
        for jt in 0..(n / 8) as i64 {
            let off = b.add(buf, b.addc(t8, 32 * jt));
            let ld = b.load_aligned(v2t.into(), b.smem_at(self.smem, off), 8).into_vector_value();
            out.push(b.extract_f(ld, 0));
            out.push(b.extract_f(ld, 1));
        }
        out
    }
}
