//! The dkv kernel: one block per key tile `n` (`bn` keys, 16 per warp) and kv head. For each
//! query head of the GQA group (ascending) it walks the query chunks of `bq` rows that keep
//! tile `n`, from the chunk holding the tile's first key up (a chunk is kept when its IR tile
//! has `start <= n`: the start scratch written by the dq kernel; the window bounds the walk),
//! double-buffering the Q and dO chunks, and accumulates in registers
//! `dV = sum P^T dO` and `dK = scale sum dx^T Q` over the whole group (heads ascending, rows
//! ascending: a fixed order). After each query head it subtracts the column sums of dS from
//! that head's dc (which the dq kernel filled with the row sums): dc = rowsum - colsum.

use super::probs::{ElemFn, PosFn};
use super::wg::WG_ROWS;
use super::{Bwd, BwdConfig, Regions, LOG2E};
use crate::nvptx::attention::params::{BwdTailParam, DkvParams, DKV};
use crate::nvptx::attention::score::ScoreMod;
use crate::nvptx::builder::control::{basic, floats};
use crate::nvptx::builder::{KernelBuilder, ParamTy};
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
    let params = DkvParams {
        q: ("q", p),
        k: ("k", p),
        v: ("v", p),
        c: ("c", p),
        dout: ("dout", p),
        lse: ("lse", p),
        dd: ("dd", p),
        start: ("start", p),
        dk: ("dk", p),
        dv: ("dv", p),
        dc: ("dc", p),
        t: ("T", ParamTy::I32),
    }
    .into_vec();
    Bwd::build(ctx, module, (name, &params), (cfg, regions), cfg.dkv_threads(), |k| k.emit_dkv())
}

/// Per-head pointers of the dkv walk (query head `bh`).
struct Head<'ctx> {
    bh: IntValue<'ctx>,
    qb: PointerValue<'ctx>,
    dob: PointerValue<'ctx>,
    cb: PointerValue<'ctx>,
    lb: PointerValue<'ctx>,
    ddb: PointerValue<'ctx>,
    /// `start` of this head's IR tiles.
    stb: PointerValue<'ctx>,
    c_ref: Option<FloatValue<'ctx>>,
}

/// Byte offsets of the dkv kernel's shared memory.
struct Smem<'ctx> {
    k: IntValue<'ctx>,
    v: IntValue<'ctx>,
    q: [IntValue<'ctx>; 2],
    dout: [IntValue<'ctx>; 2],
    /// Per query row of the chunk: `(c_i - c_ref - lse_i) log2 e` (or -inf), then `D_i`.
    rows: [IntValue<'ctx>; 2],
}

/// The block's key tile `n` and head-dim part, this thread's two keys and its lane in the quad.
#[derive(Clone, Copy)]
struct KeyTile<'ctx> {
    n: IntValue<'ctx>,
    part: Option<IntValue<'ctx>>,
    rj: [IntValue<'ctx>; 2],
    tq: IntValue<'ctx>,
}

/// What one query head's walk sums for this thread: dK and dV (onto what the earlier heads
/// left), the column sums of dS for its two keys and those of the captured tensors' terms (two
/// per key-read gradient slot, [`super::Regions::slots`]).
struct HeadSums<'ctx> {
    dk: Vec<FloatValue<'ctx>>,
    dv: Vec<FloatValue<'ctx>>,
    colsum: [FloatValue<'ctx>; 2],
    capcol: Vec<FloatValue<'ctx>>,
}

impl<'ctx> HeadSums<'ctx> {
    fn flat(&self) -> Vec<BasicValueEnum<'ctx>> {
        let mut v = basic(&self.dk);
        v.extend(basic(&self.dv));
        v.extend(basic(&self.colsum));
        v.extend(basic(&self.capcol));
        v
    }

    /// [`Self::flat`]'s inverse, `dt` 8-column tiles each of dK and dV.
    fn unflat(v: &[BasicValueEnum<'ctx>], dt: usize) -> Self {
        let f = floats(v);
        let (acc, rest) = f.split_at(2 * dt * 4);
        HeadSums {
            dk: acc[..dt * 4].to_vec(),
            dv: acc[dt * 4..].to_vec(),
            colsum: [rest[0], rest[1]],
            capcol: rest[2..].to_vec(),
        }
    }
}

impl<'k, 'a, 'ctx> Bwd<'k, 'a, 'ctx> {
    fn emit_dkv(&self) {
        let (b, cfg) = (self.b, self.cfg);
        let d = cfg.head_dim as i64;
        let bn = cfg.bn as i64;
        let bq = cfg.bq() as i64;
        // 8-column tiles of the dK and dV this block accumulates (its head-dim part).
        let dt = (cfg.part_dim() / 8) as usize;
        let grp = cfg.kv_group as i64;
        let t_len = self.t_len;
        let pp = |i| b.param_ptr(i);
        let (q_p, k_p, v_p, c_p, do_p, lse_p) =
            (pp(DKV.q), pp(DKV.k), pp(DKV.v), pp(DKV.c), pp(DKV.dout), pp(DKV.lse));
        let (dd_p, st_p, dk_p, dv_p) = (pp(DKV.dd), pp(DKV.start), pp(DKV.dk), pp(DKV.dv));
        let i16t = b.i16t().into();
        let f32t = b.f32t().into();
        let warp = b.lshrc(self.tid, 5);
        let n = b.named(b.sreg("ctaid.x"), "n");
        let (bhk, part) = self.head_and_part();
        let first_part = self.first_part(part);
        let j0 = b.mulc(n, bn);
        let jw0 = b.add(j0, b.mulc(warp, 16));
        let g = b.lshrc(self.lane, 2);
        let tq = b.andc(self.lane, 3);
        let rj = [b.add(jw0, g), b.addc(b.add(jw0, g), 8)];
        // Keys run to Tk (c and dc too), queries to T.
        let kmax = b.addc(self.k_len, -1);
        let t64 = b.sext64(t_len);
        let k64 = if self.off.is_some() { b.sext64(self.k_len) } else { t64 };
        let kv_base = b.mulc(b.mul(b.sext64(bhk), k64), d);
        let (kb, vb) = (b.gep(i16t, k_p, kv_base), b.gep(i16t, v_p, kv_base));
        let (dkb, dvb) = (b.gep(self.grad_elem(), dk_p, kv_base), b.gep(self.grad_elem(), dv_p, kv_base));

        let kvt = bn * d * 2;
        let qt = bq * d * 2;
        let sm = Smem {
            k: b.i32(0),
            v: b.i32(kvt),
            q: [b.i32(2 * kvt), b.i32(2 * kvt + qt)],
            dout: [b.i32(2 * kvt + 2 * qt), b.i32(2 * kvt + 3 * qt)],
            rows: [b.i32(2 * kvt + 4 * qt), b.i32(2 * kvt + 4 * qt + 2 * bq * 4)],
        };
        self.load_tile(kb, (j0, self.k_len), cfg.bn, sm.k);
        self.load_tile(vb, (j0, self.k_len), cfg.bn, sm.v);
        b.cp_async_commit();

        // The query chunks that can keep this tile: from the chunk of the first query whose key
        // position reaches its first key to the end, or to the last row within the window of
        // its last key (query row = key position - off).
        let mq = b.sdivc(b.addc(t_len, bq - 1), bq);
        let row_of = |p: IntValue<'ctx>| match self.off {
            Some(off) => b.smax(b.sub(p, off), b.i32(0)),
            None => p,
        };
        // Without a causal mask every chunk may keep the tile: from the first.
        let q_lo = b.named(if cfg.causal { b.sdivc(row_of(j0), bq) } else { b.i32(0) }, "q_lo");
        let q_hi = match cfg.window {
            Some(w) => {
                let jl = b.smin(b.addc(j0, bn - 1), kmax);
                b.smin(mq, b.addc(b.sdivc(row_of(b.addc(jl, w as i64 - 1)), bq), 1))
            }
            None => mq,
        };
        let mt_ir = b.sdivc(b.addc(t_len, cfg.bm as i64 - 1), cfg.bm as i64);

        let zero = b.f32(0.0);
        let mut carried: Vec<(&str, BasicValueEnum)> = vec![("gi", b.i32(0).into())];
        carried.extend((0..dt * 4).map(|_| ("dk", zero.into())));
        carried.extend((0..dt * 4).map(|_| ("dv", zero.into())));
        let last = b.do_while(("head", "kv_epilogue"), &carried, |b, vals| {
            let gi = vals[0].into_int_value();
            let acc_in = floats(&vals[1..]);
            let bh = b.add(b.mulc(bhk, grp), gi);
            let row_base = b.mul(b.sext64(bh), t64);
            let key_base = self.key_base(bh, row_base);
            let mat_base = b.mulc(row_base, d);
            let cb = b.gep(f32t, c_p, key_base);
            let h = Head {
                bh,
                qb: b.gep(i16t, q_p, mat_base),
                dob: b.gep(i16t, do_p, mat_base),
                cb,
                lb: b.gep(f32t, lse_p, row_base),
                ddb: b.gep(f32t, dd_p, row_base),
                stb: b.gep(b.i32t().into(), st_p, b.sext64(b.mul(bh, mt_ir))),
                c_ref: cfg.has_decay.then(|| b.load_f32(b.gep(f32t, cb, b.sext64(j0)))),
            };
            // Every warp is done with the previous head's chunk buffers.
            b.barrier();
            let kt = KeyTile { n, part, rj, tq };
            // The diagonal's chunk keeps the tile unless the queries are fewer or a key bound
            // may lie past it.
            let HeadSums { dk, dv, colsum, capcol } = if self.off.is_none() && !cfg.key_bound {
                self.walk_from(&h, &sm, (q_lo, q_hi), &kt, acc_in)
            } else {
                self.walk_kept(&h, &sm, (q_lo, q_hi), &kt, acc_in)
            };
            self.store_column_sums(&kt, first_part, (row_base, key_base), &colsum, &capcol);
            let gn = b.addc(gi, 1);
            let mut next = vec![gn.into()];
            next.extend(basic(&dk));
            next.extend(basic(&dv));
            (b.icmpc(IntPredicate::SLT, gn, grp), next)
        });

        let acc = floats(&last[1..]);
        let (dk, dv) = acc.split_at(dt * 4);
        self.store_dkv(KeyTile { n, part, rj, tq }, (dkb, dvb), dk, dv);
    }

    /// Adds this thread's share of one query head's column sums to its two keys' entries: the
    /// captured tensors' key-read gradients (`d cap[bh, j] +=`, the dq kernel wrote the rows')
    /// and `dc[bh, j] -= colsum_j` (the dq kernel wrote the row sums there; a key before the
    /// first query's position has no row: `dc = -colsum`). Lane 0 of each quad stores, in the
    /// block of the first head-dim part only.
    fn store_column_sums(
        &self,
        kt: &KeyTile<'ctx>,
        first_part: Option<IntValue<'ctx>>,
        (row_base, key_base): (IntValue<'ctx>, IntValue<'ctx>),
        colsum: &[FloatValue<'ctx>; 2],
        capcol: &[FloatValue<'ctx>],
    ) {
        let (b, cfg) = (self.b, self.cfg);
        let (rj, tq, t_len) = (kt.rj, kt.tq, self.t_len);
        let f32t = b.f32t().into();
        let dc_p = b.param_ptr(DKV.dc);
        // d cap[bh, j] += the column sums of its key reads (the dq kernel wrote the rows').
        for (s, slot) in self.regions.slots(true).into_iter().enumerate() {
            let gb = b.gep(f32t, b.param_ptr(self.tail.at(BwdTailParam::Grad(slot))), row_base);
            for r in 0..2 {
                let mut v = capcol[2 * s + r];
                v = b.fadd(v, b.shfl_xor(v, 1));
                v = b.fadd(v, b.shfl_xor(v, 2));
                let mut ok = b.and(b.icmp(IntPredicate::SLT, rj[r], t_len), b.icmpc(IntPredicate::EQ, tq, 0));
                if let Some(f) = first_part {
                    ok = b.and(ok, f);
                }
                b.if_then(ok, |b| {
                    let p = b.gep(f32t, gb, b.sext64(rj[r]));
                    b.store(p, b.fadd(b.load_f32(p), v));
                });
            }
        }
        // dc[bh, j] -= colsum_j (the dq kernel wrote the row sums there; a key before the
        // first query's position has no row: dc = -colsum).
        if cfg.has_decay {
            let dcb = b.gep(f32t, dc_p, key_base);
            for r in 0..2 {
                let mut s = colsum[r];
                s = b.fadd(s, b.shfl_xor(s, 1));
                s = b.fadd(s, b.shfl_xor(s, 2));
                let mut ok =
                    b.and(b.icmp(IntPredicate::SLT, rj[r], self.k_len), b.icmpc(IntPredicate::EQ, tq, 0));
                if let Some(f) = first_part {
                    ok = b.and(ok, f);
                }
                b.if_then(ok, |b| {
                    let p = b.gep(f32t, dcb, b.sext64(rj[r]));
                    let rows = match self.off {
                        Some(off) => {
                            let has_row = b.icmp(IntPredicate::SGE, rj[r], off);
                            b.select_f(has_row, b.load_f32(p), b.f32(0.0))
                        }
                        None => b.load_f32(p),
                    };
                    b.store(p, b.fsub(rows, s));
                });
            }
        }
    }

    /// Writes this thread's dK (times the scale) and dV of its two keys, as pairs in the
    /// gradients' dtype.
    fn store_dkv(
        &self,
        kt: KeyTile<'ctx>,
        (dkb, dvb): (PointerValue<'ctx>, PointerValue<'ctx>),
        dk: &[FloatValue<'ctx>],
        dv: &[FloatValue<'ctx>],
    ) {
        let (b, cfg) = (self.b, self.cfg);
        let (rj, tq, part) = (kt.rj, kt.tq, kt.part);
        let d = cfg.head_dim as i64;
        let dt = (cfg.part_dim() / 8) as usize;
        let sc = b.f32(cfg.scale as f64);
        let mut t2 = b.mulc(tq, 2);
        if let Some(p) = part {
            t2 = b.add(t2, b.mulc(p, cfg.part_dim() as i64));
        }
        for r in 0..2 {
            b.if_then(b.icmp(IntPredicate::SLT, rj[r], self.k_len), |b| {
                let rowoff = b.mulc(rj[r], d);
                for dtile in 0..dt {
                    let idx = b.sext64(b.add(rowoff, b.addc(t2, 8 * dtile as i64)));
                    let (k0, k1) = (dk[dtile * 4 + 2 * r], dk[dtile * 4 + 2 * r + 1]);
                    self.store_grad_pair(dkb, idx, b.fmul(k0, sc), b.fmul(k1, sc));
                    let (v0, v1) = (dv[dtile * 4 + 2 * r], dv[dtile * 4 + 2 * r + 1]);
                    self.store_grad_pair(dvb, idx, v0, v1);
                }
            });
        }
    }

    /// The walk over one query head's chunks `[lo, hi)`, chunk `lo` kept: it loads chunk `lo`
    /// and stores its row terms in buffer 0, then [`Self::walk`].
    fn walk_from(
        &self,
        h: &Head<'ctx>,
        sm: &Smem<'ctx>,
        (lo, hi): (IntValue<'ctx>, IntValue<'ctx>),
        kt: &KeyTile<'ctx>,
        acc_in: Vec<FloatValue<'ctx>>,
    ) -> HeadSums<'ctx> {
        self.load_chunk(h, lo, sm, 0);
        self.b.cp_async_commit();
        self.store_row_terms(h, lo, sm.rows[0]);
        self.walk(h, sm, (lo, hi), kt, acc_in)
    }

    /// [`Self::walk_from`] where the first chunk that can see key tile `n` need not keep it:
    /// with queries fewer than keys, a key of the cache (before the first query's position) is
    /// seen by every chunk, and pruning may drop it from the first ones; under a key bound,
    /// every row of a chunk may start past the tile (a later packed sequence, or rows before a
    /// left padding's start). Then it may be dropped from all (nothing is walked: dK and dV as
    /// they were, no column sums).
    fn walk_kept(
        &self,
        h: &Head<'ctx>,
        sm: &Smem<'ctx>,
        (lo, hi): (IntValue<'ctx>, IntValue<'ctx>),
        kt: &KeyTile<'ctx>,
        acc_in: Vec<FloatValue<'ctx>>,
    ) -> HeadSums<'ctx> {
        let b = self.b;
        let dt = (self.cfg.part_dim() / 8) as usize;
        let ncap = 2 * self.regions.slots(true).len();
        let lo = if self.cfg.uses_start() { self.next_chunk(h, b.addc(lo, -1), hi, kt.n) } else { lo };
        let zero = b.f32(0.0);
        let mut carried: Vec<(&str, BasicValueEnum)> = acc_in.iter().map(|v| ("acc", (*v).into())).collect();
        carried.extend((0..2 + ncap).map(|_| ("colsum", zero.into())));
        let any = b.icmp(IntPredicate::SLT, lo, hi);
        let out = b.if_then_carry(any, ("kept", "kept_done"), &carried, |_| {
            self.walk_from(h, sm, (lo, hi), kt, acc_in.clone()).flat()
        });
        HeadSums::unflat(&out, dt)
    }

    /// The walk over one query head's kept chunks `[lo, hi)` (chunk `lo` loaded and its row
    /// terms stored in buffer 0 by the caller), accumulating onto `acc_in` (dK, then dV).
    fn walk(
        &self,
        h: &Head<'ctx>,
        sm: &Smem<'ctx>,
        (lo, hi): (IntValue<'ctx>, IntValue<'ctx>),
        kt: &KeyTile<'ctx>,
        acc_in: Vec<FloatValue<'ctx>>,
    ) -> HeadSums<'ctx> {
        let KeyTile { n, part, rj, tq } = *kt;
        let (b, cfg) = (self.b, self.cfg);
        let bq = cfg.bq() as i64;
        let dt = (cfg.part_dim() / 8) as usize;
        let f32t = b.f32t().into();
        let kmax = b.addc(self.k_len, -1);
        let warp = b.lshrc(self.tid, 5);
        let wrow0 = b.mulc(warp, 16);
        let jw0 = b.add(b.mulc(n, cfg.bn as i64), wrow0);
        let l2e = b.f32(LOG2E);
        // Key terms (c_ref - c_j) log2 e of this thread's two keys.
        let kc = h.c_ref.map(|cr| {
            rj.map(|j| {
                let cj = b.load_f32(b.gep(f32t, h.cb, b.sext64(b.smin(j, kmax))));
                b.fmul(b.fsub(cr, cj), l2e)
            })
        });
        let zero = b.f32(0.0);
        // The chunk after `lo` is known before the loop; each iteration finds the one after
        // its prefetch from a `start` value loaded at its top (global latencies overlap the
        // matrix work instead of stalling every chunk).
        let nxt0 = self.next_chunk(h, lo, hi, n);
        let mut carried: Vec<(&str, BasicValueEnum)> =
            vec![("chunk", lo.into()), ("next", nxt0.into()), ("parity", b.i32(0).into())];
        carried.extend(acc_in.iter().map(|v| ("acc", (*v).into())));
        carried.extend([("colsum", zero.into()), ("colsum", zero.into())]);
        let a0 = 3;
        let ncap = 2 * self.regions.slots(true).len();
        let c0 = a0 + 2 + 2 * dt * 4;
        carried.extend((0..ncap).map(|_| ("capcol", zero.into())));
        let last = b.do_while(("chunk", "chunks_done"), &carried, |b, vals| {
            let cur = vals[0].into_int_value();
            let nxt = vals[1].into_int_value();
            let par = vals[2].into_int_value();
            let acc = floats(&vals[a0..a0 + 2 * dt * 4]);
            let cs_in =
                [vals[a0 + 2 * dt * 4].into_float_value(), vals[a0 + 1 + 2 * dt * 4].into_float_value()];
            b.cp_async_wait(0);
            self.fence_proxy();
            b.barrier();
            let more = b.icmp(IntPredicate::SLT, nxt, hi);
            let is0 = b.icmpc(IntPredicate::EQ, par, 0);
            b.if_then(more, |b| {
                self.load_chunk_to(
                    h,
                    nxt,
                    b.select_i(is0, sm.q[1], sm.q[0]),
                    b.select_i(is0, sm.dout[1], sm.dout[0]),
                );
            });
            b.cp_async_commit();
            // Loads whose values are used only at the end of the iteration.
            let row_terms = self.load_row_terms(h, nxt);
            let after = b.addc(nxt, 1);
            let st_after = self.cfg.uses_start().then(|| self.start_of(h, after, hi));
            let qcur = b.select_i(is0, sm.q[0], sm.q[1]);
            let docur = b.select_i(is0, sm.dout[0], sm.dout[1]);
            let rcur = b.select_i(is0, sm.rows[0], sm.rows[1]);
            let i0c = b.mulc(cur, bq);
            let (st, dpt) = self.dkv_products(sm, wrow0, part, (qcur, docur));
            let rterm = self.load_pairs(rcur, tq, cfg.bq());
            let dterm = self.load_pairs(b.addc(rcur, bq * 4), tq, cfg.bq());
            let col0 = b.add(i0c, b.mulc(tq, 2));
            // Element e of n-tile it: key rj[e / 2], query col0 + 8 it + (e & 1).
            let pos: PosFn = &|it, e| (b.addc(col0, (8 * it + (e & 1)) as i64), rj[e / 2]);
            let term: ElemFn = &|it, e| {
                let r = rterm[it * 2 + (e & 1)];
                match kc {
                    Some(k) => b.fadd(r, k[e / 2]),
                    None => r,
                }
            };
            let need = self.dkv_needs_mask(jw0, i0c);
            let (p, xs) = self.probs(&st, term, pos, need, h.bh);
            let (dk_in, dv_in) = acc.split_at(dt * 4);
            // wgmma: dV += P^T dO runs on the tensor cores while dS is computed.
            let dv_pending = self.wg.then(|| {
                let pa = self.wg_pack(&p);
                self.wg_fence();
                let dv = self.wg_acc(dv_in.to_vec(), &pa, docur, cfg.bq());
                self.wg_commit();
                dv
            });
            let ddf: ElemFn = &|it, e| dterm[it * 2 + (e & 1)];
            let (ds, dx) = self.dscores(&p, &dpt, ddf, &xs, pos, h.bh);
            let mut cs = cs_in;
            for (k, v) in ds.iter().enumerate() {
                let r = (k % 4) / 2;
                cs[r] = b.fadd(cs[r], *v);
            }
            let mut capcs = floats(&vals[c0..c0 + ncap]);
            for (s, terms) in self.capture_terms(&p, &ds, &xs, pos, h.bh, true).iter().enumerate() {
                for (k, v) in terms.iter().enumerate() {
                    let r = 2 * s + (k % 4) / 2;
                    capcs[r] = b.fadd(capcs[r], *v);
                }
            }
            let (dk, dv) = match dv_pending {
                Some(dv) => {
                    let xa = self.wg_pack(&dx);
                    self.wg_fence();
                    let dk = self.wg_acc(dk_in.to_vec(), &xa, qcur, cfg.bq());
                    let mut r = self.wg_commit_wait(&[&dk, &dv]);
                    let dv = r.pop().unwrap_or_default();
                    (r.pop().unwrap_or_default(), dv)
                }
                None => {
                    // The block's part: 16-byte chunks from part * part_dim / 8.
                    let ch0 = part.map(|p| b.mulc(p, (cfg.part_dim() / 8) as i64));
                    let dv = self.mma_acc(dv_in.to_vec(), &p, (docur, ch0), cfg.bq());
                    (self.mma_acc(dk_in.to_vec(), &dx, (qcur, ch0), cfg.bq()), dv)
                }
            };
            b.if_then(more, |b| {
                // The other row-term buffer was last read before this iteration's barrier.
                self.put_row_terms(&row_terms, b.select_i(is0, sm.rows[1], sm.rows[0]));
            });
            // The chunk after `nxt`: `nxt + 1` when it keeps tile n (the usual case: the kept
            // chunks of a key tile are contiguous), else the scan from there.
            let nxt2 = self.chunk_after(h, (after, hi, n), more, st_after);
            let mut next = vec![nxt.into(), nxt2.into(), b.xorc(par, 1).into()];
            next.extend(basic(&dk));
            next.extend(basic(&dv));
            next.extend(basic(&cs));
            next.extend(basic(&capcs));
            (more, next)
        });
        // The carried values after the chunk's three counters are the sums in their flat order.
        HeadSums::unflat(&last[a0..c0 + ncap], dt)
    }

    /// `S^T = K Q^T` and `dP^T = V dO^T` for this warp's 16 keys (wgmma: its warpgroup's 64),
    /// against the chunk's Q and dO at `qcur`, `docur`.
    #[allow(clippy::type_complexity)]
    fn dkv_products(
        &self,
        sm: &Smem<'ctx>,
        wrow0: IntValue<'ctx>,
        part: Option<IntValue<'ctx>>,
        (qcur, docur): (IntValue<'ctx>, IntValue<'ctx>),
    ) -> (Vec<[FloatValue<'ctx>; 4]>, Vec<[FloatValue<'ctx>; 4]>) {
        let (b, cfg) = (self.b, self.cfg);
        // S^T = K Q^T and dP^T = V dO^T for this warp's 16 keys (wgmma: its warpgroup's 64).
        if self.wg {
            let a_row = b.mulc(b.andc(wrow0, !(WG_ROWS as i64 - 1)), 128);
            let (ka, va) = ((b.add(sm.k, a_row), cfg.bn), (b.add(sm.v, a_row), cfg.bn));
            let mut r = self.wg_abt_batch(&[(ka, (qcur, cfg.bq())), (va, (docur, cfg.bq()))]);
            let dpt = r.pop().unwrap_or_default();
            (r.pop().unwrap_or_default(), dpt)
        } else if part.is_some() {
            // A split head dim: the K and V fragments per k-step (64 registers each).
            let st = self.mma_abt_smem((sm.k, wrow0), qcur, cfg.bq());
            (st, self.mma_abt_smem((sm.v, wrow0), docur, cfg.bq()))
        } else {
            let kf = self.a_frags(sm.k, wrow0);
            let st = self.mma_abt(&kf, qcur, cfg.bq());
            let vf = self.a_frags(sm.v, wrow0);
            (st, self.mma_abt(&vf, docur, cfg.bq()))
        }
    }

    /// Whether the chunk at query `i0c` needs the element mask for the warp's keys from `jw0`:
    /// it crosses the diagonal (causal) or the score region has a mask, it runs past T, or part
    /// of it lies outside the window.
    fn dkv_needs_mask(&self, jw0: IntValue<'ctx>, i0c: IntValue<'ctx>) -> IntValue<'ctx> {
        let (b, cfg) = (self.b, self.cfg);
        let bq = cfg.bq() as i64;
        let ilast = b.addc(i0c, bq - 1);
        let mut need = if cfg.causal {
            b.icmp(IntPredicate::SGT, b.addc(jw0, 15), self.pos(i0c))
        } else {
            // An expression mask: the condition on every element (no mask: rows past T).
            b.bool(self.regions.score.has_mask())
        };
        need = b.or(need, b.icmp(IntPredicate::SGE, ilast, self.t_len));
        if let Some(w) = cfg.window {
            need = b.or(need, b.icmpc(IntPredicate::SGE, b.sub(self.pos(ilast), jw0), w as i64));
        }
        need
    }

    /// The chunk after `after - 1`: `after` when it keeps key tile `n` (the usual case: the kept
    /// chunks of a key tile are contiguous) or is past `hi`, else the scan from there.
    fn chunk_after(
        &self,
        h: &Head<'ctx>,
        (after, hi, n): (IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>),
        more: IntValue<'ctx>,
        st_after: Option<IntValue<'ctx>>,
    ) -> IntValue<'ctx> {
        let b = self.b;
        match st_after {
            None => after,
            Some(st) => {
                let kept = b.or(b.icmp(IntPredicate::SGE, after, hi), b.icmp(IntPredicate::SLE, st, n));
                let skip = b.and(more, b.not(kept));
                let r = b.if_then_carry(skip, ("scan", "scanned"), &[("n2", after.into())], |_| {
                    vec![self.next_chunk(h, after, hi, n).into()]
                });
                r[0].into_int_value()
            }
        }
    }

    /// The first chunk after `cur` (below `hi`) that keeps key tile `n`: its IR tile's
    /// `start <= n` (every chunk without a start scratch), or `hi` when none does. Each warp
    /// tests 32 chunks a step (lane `l` the chunk `c + l`, a ballot of "keeps or past `hi`"):
    /// past a key tile's last keeping chunk the scan runs to `hi`, which one load at a time
    /// cost a dependent load per chunk for every key tile (the packed batch's dkv kernel took
    /// 2.6x the dq kernel's time). Uniform over the block.
    fn next_chunk(
        &self,
        h: &Head<'ctx>,
        cur: IntValue<'ctx>,
        hi: IntValue<'ctx>,
        n: IntValue<'ctx>,
    ) -> IntValue<'ctx> {
        let b = self.b;
        let first = b.addc(cur, 1);
        if !self.cfg.uses_start() {
            return first;
        }
        let bq = self.cfg.bq() as i64;
        let bm = self.cfg.bm as i64;
        let out =
            b.do_while(("skip", "skip_done"), &[("c", first.into()), ("stop", b.i32(0).into())], |b, v| {
                let c = v[0].into_int_value();
                let cl = b.add(c, self.lane);
                let inr = b.icmp(IntPredicate::SLT, cl, hi);
                // Out of range: stop there without reading (the index is clamped for the load).
                let m = b.sdivc(b.mulc(b.smin(cl, b.addc(hi, -1)), bq), bm);
                let st = b.load(b.i32t().into(), b.gep(b.i32t().into(), h.stb, b.sext64(m))).into_int_value();
                let stop = b.vote_ballot(b.or(b.not(inr), b.icmp(IntPredicate::SLE, st, n)));
                (b.icmpc(IntPredicate::EQ, stop, 0), vec![b.addc(c, 32).into(), stop.into()])
            });
        // The lanes are consecutive chunks: the first stopping lane is the answer (`hi` itself
        // when no chunk before it keeps the tile).
        let (c, stop) = (out[0].into_int_value(), out[1].into_int_value());
        b.add(b.addc(c, -32), b.cttz(stop))
    }

    /// cp.async of query chunk `c` of Q and dO into buffer `buf` (0 or 1).
    fn load_chunk(&self, h: &Head<'ctx>, c: IntValue<'ctx>, sm: &Smem<'ctx>, buf: usize) {
        self.load_chunk_to(h, c, sm.q[buf], sm.dout[buf]);
    }

    fn load_chunk_to(
        &self,
        h: &Head<'ctx>,
        c: IntValue<'ctx>,
        q_off: IntValue<'ctx>,
        do_off: IntValue<'ctx>,
    ) {
        let r0 = (self.b.mulc(c, self.cfg.bq() as i64), self.t_len);
        self.load_tile(h.qb, r0, self.cfg.bq(), q_off);
        self.load_tile(h.dob, r0, self.cfg.bq(), do_off);
    }

    /// `start` of the IR tile of chunk `c` (clamped below `hi`: read only when `c < hi`).
    fn start_of(&self, h: &Head<'ctx>, c: IntValue<'ctx>, hi: IntValue<'ctx>) -> IntValue<'ctx> {
        let b = self.b;
        let m = b.sdivc(b.mulc(b.smin(c, b.addc(hi, -1)), self.cfg.bq() as i64), self.cfg.bm as i64);
        b.load(b.i32t().into(), b.gep(b.i32t().into(), h.stb, b.sext64(m))).into_int_value()
    }

    /// [`Bwd::load_row_terms`] of chunk `c`, stored at `off`.
    fn store_row_terms(&self, h: &Head<'ctx>, c: IntValue<'ctx>, off: IntValue<'ctx>) {
        let t = self.load_row_terms(h, c);
        self.put_row_terms(&t, off);
    }

    /// For the rows this thread writes (row `tid + k threads` of chunk `c`, below `bq`):
    /// `(c_i - c_ref - lse_i) log2 e` (-inf for an empty row) and `D_i`. Rows past T read row
    /// T-1 (masked). Every thread loads (clamped), [`Bwd::put_row_terms`] stores the rows < bq.
    fn load_row_terms(&self, h: &Head<'ctx>, c: IntValue<'ctx>) -> Vec<(FloatValue<'ctx>, FloatValue<'ctx>)> {
        let b = self.b;
        let bq = self.cfg.bq();
        let f32t = b.f32t().into();
        let ninf = b.f32(f64::NEG_INFINITY);
        let tmax = b.addc(self.t_len, -1);
        (0..bq.div_ceil(self.threads))
            .map(|it| {
                let r = b.addc(self.tid, (it * self.threads) as i64);
                let i32i = b.smin(b.add(b.mulc(c, bq as i64), r), tmax);
                let i = b.sext64(i32i);
                // c at the row's key position.
                let pc = self.pos_index(i32i, i);
                let li = b.load_f32(b.gep(f32t, h.lb, i));
                let cterm = match h.c_ref {
                    Some(cr) => b.fsub(b.load_f32(b.gep(f32t, h.cb, pc)), cr),
                    None => b.f32(0.0),
                };
                let empty = b.fcmp(FloatPredicate::OEQ, li, ninf);
                let v = b.select_f(empty, ninf, b.fmul(b.fsub(cterm, li), b.f32(LOG2E)));
                (v, b.load_f32(b.gep(f32t, h.ddb, i)))
            })
            .collect()
    }

    /// Stores what [`Bwd::load_row_terms`] loaded: the term at `off + 4 r`, `D` at
    /// `off + 4 (bq + r)`, for this thread's rows `r < bq`.
    fn put_row_terms(&self, t: &[(FloatValue<'ctx>, FloatValue<'ctx>)], off: IntValue<'ctx>) {
        let b = self.b;
        let bq = self.cfg.bq();
        for (it, &(v, dd)) in t.iter().enumerate() {
            let r = b.addc(self.tid, (it as u32 * self.threads) as i64);
            let emit = |b: &KernelBuilder<'a, 'ctx>| {
                b.store(b.smem_at(self.smem, b.add(off, b.mulc(r, 4))), v);
                b.store(b.smem_at(self.smem, b.add(off, b.addc(b.mulc(r, 4), bq as i64 * 4))), dd);
            };
            if (it as u32 + 1) * self.threads <= bq {
                emit(b);
            } else {
                b.if_then(b.icmpc(IntPredicate::SLT, r, bq as i64), emit);
            }
        }
    }
}
