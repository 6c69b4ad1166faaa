//! Where a query tile's walk over key tiles stops: the window bound and the in-kernel pruning
//! search for `start[m]` (a 32-ary search per warp, no separate launch).

use super::Attn;
use crate::nvptx::builder::KernelBuilder;
use inkwell::values::{IntValue, PointerValue};
use inkwell::{FloatPredicate, IntPredicate};

impl<'k, 'a, 'ctx> Attn<'k, 'a, 'ctx> {
    /// The first key tile this block computes: 0, raised by the window (tiles wholly before the
    /// first row's window) and by pruning (`start` of the IR tile holding row `i0`). With split
    /// keys, `slice` is the block's tiles `[first, last]`: the search looks at those only, so a
    /// block learns in one round whether its slice holds a kept tile (`last + 1` if none).
    pub(crate) fn start_tile(
        &self,
        cb: PointerValue<'ctx>,
        delta_p: PointerValue<'ctx>,
        bh: IntValue<'ctx>,
        i0: IntValue<'ctx>,
        slice: Option<(IntValue<'ctx>, IntValue<'ctx>)>,
    ) -> IntValue<'ctx> {
        let b = self.b;
        let bn = self.cfg.bn as i64;
        let mut n_start = b.i32(0);
        if let Some(w) = self.cfg.window {
            // A tile is outside every row's window iff i0 - jend(n) >= w: keep the first tile whose
            // end reaches the first row's window start.
            let x = b.addc(self.pos(i0), 1 - w as i64);
            let x = b.smax(x, b.i32(0));
            n_start = b.sdivc(x, bn);
        }
        if self.cfg.prune {
            // The IR tile holding this block (the same block when block_rows == bm).
            let bm = self.cfg.bm as i64;
            let m_ir = b.named(b.udivc(i0, bm), "m_ir");
            let i0_ir = b.mulc(m_ir, bm);
            let ps = self.prune_search(cb, delta_p, bh, m_ir, i0_ir, slice);
            if self.cfg.debug_starts {
                self.write_debug_start(bh, m_ir, b.icmp(IntPredicate::EQ, i0, i0_ir), ps);
            }
            n_start = b.smax(n_start, ps);
        }
        n_start
    }

    /// Debug (`cfg.debug_starts`): thread 0 of the block holding IR tile `m`'s first row
    /// (`first`) stores the start it found at `starts[bh, m]`, the parameter after the score
    /// hook's.
    fn write_debug_start(
        &self,
        bh: IntValue<'ctx>,
        m: IntValue<'ctx>,
        first: IntValue<'ctx>,
        ps: IntValue<'ctx>,
    ) {
        let b = self.b;
        let tail = super::params::FwdTail::of(self.cfg, self.score.params().len());
        let p = b.param_ptr(tail.at(super::params::Tail::DebugStarts));
        let bm = self.cfg.bm as i64;
        let mt = b.sdivc(b.addc(self.t_len, bm - 1), bm);
        let t0 = b.icmpc(IntPredicate::EQ, self.tid, 0);
        b.if_then(b.and(first, t0), |b| {
            let at = b.add(b.mul(b.sext64(bh), b.sext64(mt)), b.sext64(m));
            b.store(b.gep(b.i32t().into(), p, at), ps);
        });
    }

    /// start[m] of IR tile `m` (first row `i0`): [`search_start`] with this kernel's tiles,
    /// within `slice` where given.
    fn prune_search(
        &self,
        cb: PointerValue<'ctx>,
        delta_p: PointerValue<'ctx>,
        bh: IntValue<'ctx>,
        m: IntValue<'ctx>,
        i0: IntValue<'ctx>,
        slice: Option<(IntValue<'ctx>, IntValue<'ctx>)>,
    ) -> IntValue<'ctx> {
        let (p0, t_len, k_len) = (self.pos(i0), self.t_len, self.k_len);
        let at = SearchAt { cb, delta_p, bh, m, p0, t_len, k_len, lane: self.lane, slice };
        search_start(self.b, self.cfg.bm, self.cfg.bn, &at)
    }
}

/// Where [`search_start`] searches: the gate cumsum `cb` and threshold `delta_p` of flat head
/// `bh`, IR query tile `m` whose first row sits at key position `p0` (the row itself when
/// queries and keys are one), the query and key counts, this thread's lane, and the tiles
/// `[first, last]` of a split-keys block (`None`: every tile up to the diagonal).
#[derive(Clone, Copy)]
pub(crate) struct SearchAt<'ctx> {
    pub cb: PointerValue<'ctx>,
    pub delta_p: PointerValue<'ctx>,
    pub bh: IntValue<'ctx>,
    pub m: IntValue<'ctx>,
    pub p0: IntValue<'ctx>,
    pub t_len: IntValue<'ctx>,
    pub k_len: IntValue<'ctx>,
    pub lane: IntValue<'ctx>,
    pub slice: Option<(IntValue<'ctx>, IntValue<'ctx>)>,
}

/// start[m] by a 32-ary search per warp: the first key tile n in [0, floor(p0/bn)] with
/// `c[p0] - c[jend(n)] >= delta[m]` (unordered counts as kept), capped at floor(p0/bn).
/// `m` is the IR tile's index (tiles of `bm` rows), `p0` its first row's key position. Called by every lane
/// of a warp (a ballot); the forward and the backward kernels (attention_bwd) both use it, so
/// they keep the same tiles.
///
/// With a slice `[first, last]` the search starts at `first` and ends at the cap or at
/// `last + 1`, whichever is lower: "kept" is monotone in the tile (`c` is non-increasing), so
/// the answer is `max(start[m], first)` when the slice holds a kept tile and `last + 1` when it
/// holds none, in one round for a slice of at most 32 tiles.
pub(crate) fn search_start<'ctx>(
    b: &KernelBuilder<'_, 'ctx>,
    bm: u32,
    bn: u32,
    at: &SearchAt<'ctx>,
) -> IntValue<'ctx> {
    let SearchAt { cb, delta_p, bh, m, p0: i0, t_len, k_len, lane, slice } = *at;
    let (bn, bm) = (bn as i64, bm as i64);
    let f32t = b.f32t().into();
    let tmax = b.addc(k_len, -1);
    let mt = b.named(b.sdivc(b.addc(t_len, bm - 1), bm), "mt");
    let didx = b.add(b.mul(bh, mt), m);
    let dl = b.load_f32(b.gep(f32t, delta_p, b.sext64(didx)));
    let ci0 = b.load_f32(b.gep(f32t, cb, b.sext64(i0)));
    let cap = b.named(b.sdivc(i0, bn), "cap");
    let (lo0, hi0) = match slice {
        None => (b.i32(0), cap),
        Some((first, last)) => (first, b.smin(cap, b.addc(last, 1))),
    };
    let out = b.while_loop(
        ("search", "search_step", "search_done"),
        &[("lo", lo0.into()), ("hi", hi0.into())],
        |b, v| b.icmp(IntPredicate::SLT, v[0].into_int_value(), v[1].into_int_value()),
        |b, v| {
            let (lo, hi) = (v[0].into_int_value(), v[1].into_int_value());
            // Lane l probes tile lo + l * stride (the range split in 32 parts).
            let len = b.sub(hi, lo);
            let stride = b.lshrc(b.addc(len, 31), 5);
            let nl = b.add(lo, b.mul(lane, stride));
            let inr = b.icmp(IntPredicate::SLT, nl, hi);
            let nn = b.smin(nl, b.addc(hi, -1));
            let jend = b.smin(b.addc(b.mulc(nn, bn), bn - 1), tmax);
            let cj = b.load_f32(b.gep(f32t, cb, b.sext64(jend)));
            let diff = b.fsub(ci0, cj);
            let keep = b.fcmp(FloatPredicate::UGE, diff, dl);
            let not_in = b.not(inr);
            let pred = b.or(keep, not_in);
            let mask = b.vote_ballot(pred);
            let fz = b.cttz(mask);
            let none = b.icmpc(IntPredicate::EQ, mask, 0);
            // mask == 0: all 32 probes dropped; the answer lies past the last probe.
            let lo_none = b.addc(b.add(lo, b.mulc(stride, 31)), 1);
            let nf = b.add(lo, b.mul(fz, stride));
            let hi_some = b.smin(nf, hi);
            let f0 = b.icmpc(IntPredicate::EQ, fz, 0);
            let prev = b.addc(b.add(lo, b.mul(b.addc(fz, -1), stride)), 1);
            let lo_some = b.select_i(f0, lo, prev);
            let lo2 = b.select_i(none, lo_none, lo_some);
            let hi2 = b.select_i(none, hi, hi_some);
            vec![lo2.into(), hi2.into()]
        },
    );
    out[0].into_int_value()
}
