//! P and dS of one score fragment, shared by the dq and dkv kernels (which hold the fragment
//! with queries as rows, or transposed with keys as rows; the callers say where each element
//! sits). With `x = scale q.k` and the forward's score `E = R(x) + c_i - c_j`:
//!
//! * `P = 2^(R(x) log2 e + term)`, `term = (c_i - lse_i - c_j) log2 e` split into a row and a
//!   column part relative to the block's `c_ref` (so both keep their precision, as in the
//!   forward), `-inf` for a row whose lse is `-inf` (nothing kept: P = 0); masked elements
//!   (key after the query's key position, query past T, outside the window; without a causal
//!   mask: key past Tk, and an expression mask's condition false, as the forward's softmax)
//!   are `-inf` on the tiles that need it;
//! * `dS = P (dP - D_i)`, `dx = dS R'(x)` (0 where P = 0, so a derivative that is infinite on a
//!   masked element cannot leak a NaN).

use super::{Bwd, LOG2E};
use crate::nvptx::attention::score::{ScoreMod, ScorePos};
use crate::nvptx::builder::control::{basic, floats};
use inkwell::values::{FloatValue, IntValue};
use inkwell::{FloatPredicate, IntPredicate};

/// Where the elements of a fragment sit: query row and key column of element `e` of n-tile `jt`.
pub(super) type PosFn<'r, 'ctx> = &'r dyn Fn(usize, usize) -> (IntValue<'ctx>, IntValue<'ctx>);
/// A per-element f32 (the log2-unit term of P, or `D_i`).
pub(super) type ElemFn<'r, 'ctx> = &'r dyn Fn(usize, usize) -> FloatValue<'ctx>;

impl<'k, 'a, 'ctx> Bwd<'k, 'a, 'ctx> {
    /// P of the fragment `s` (raw `q.k` accumulators) and, for a non-identity region, the
    /// scaled scores `x` (for `R'(x)`). `need`: whether this fragment needs the mask.
    pub(super) fn probs(
        &self,
        s: &[[FloatValue<'ctx>; 4]],
        term: ElemFn<'_, 'ctx>,
        pos: PosFn<'_, 'ctx>,
        need: IntValue<'ctx>,
        bh: IntValue<'ctx>,
    ) -> (Vec<FloatValue<'ctx>>, Vec<FloatValue<'ctx>>) {
        let b = self.b;
        let cfg = self.cfg;
        let score = self.regions.score;
        let mut s2 = Vec::with_capacity(s.len() * 4);
        let mut xs = Vec::new();
        for (jt, acc) in s.iter().enumerate() {
            for (e, &v) in acc.iter().enumerate() {
                let t = term(jt, e);
                let y = if score.is_identity() {
                    b.fma(v, b.f32(cfg.scale as f64 * LOG2E), t)
                } else {
                    let x = b.fmul(v, b.f32(cfg.scale as f64));
                    xs.push(x);
                    let (i, j) = pos(jt, e);
                    let r = score.emit(b, x, ScorePos { i, j, bh });
                    b.fma(r, b.f32(LOG2E), t)
                };
                s2.push(y);
            }
        }
        let ninf = b.f32(f64::NEG_INFINITY);
        let carried: Vec<(&str, _)> = s2.iter().map(|v| ("s", (*v).into())).collect();
        let masked = b.if_then_carry(need, ("mask", "masked"), &carried, |b| {
            let mut out = Vec::with_capacity(s2.len());
            for jt in 0..s.len() {
                for e in 0..4 {
                    // Row i at key position p (the causal diagonal and the window's origin).
                    let (i, j) = pos(jt, e);
                    let p = self.pos(i);
                    let mut ok = if cfg.causal {
                        b.icmp(IntPredicate::SLE, j, p)
                    } else {
                        b.icmp(IntPredicate::SLT, j, self.k_len)
                    };
                    ok = b.and(ok, b.icmp(IntPredicate::SLT, i, self.t_len));
                    if let Some(w) = cfg.window {
                        ok = b.and(ok, b.icmpc(IntPredicate::SLT, b.sub(p, j), w as i64));
                    }
                    // A NaN condition keeps the element (`c != 0`), as in the forward.
                    if let Some(keep) = score.keeps(b, ScorePos { i, j, bh }) {
                        ok = b.and(ok, keep);
                    }
                    out.push(b.select_f(ok, s2[jt * 4 + e], ninf));
                }
            }
            basic(&out)
        });
        let p = floats(&masked).into_iter().map(|v| b.ex2(v)).collect();
        (p, xs)
    }

    /// `dS = P (dP - D)` and `dx = dS R'(x)` per element (dx is dS for the identity region).
    pub(super) fn dscores(
        &self,
        p: &[FloatValue<'ctx>],
        dp: &[[FloatValue<'ctx>; 4]],
        dd: ElemFn<'_, 'ctx>,
        xs: &[FloatValue<'ctx>],
        pos: PosFn<'_, 'ctx>,
        bh: IntValue<'ctx>,
    ) -> (Vec<FloatValue<'ctx>>, Vec<FloatValue<'ctx>>) {
        let b = self.b;
        let zero = b.f32(0.0);
        let mut ds = Vec::with_capacity(p.len());
        let mut dx = Vec::with_capacity(p.len());
        for (jt, acc) in dp.iter().enumerate() {
            for (e, &v) in acc.iter().enumerate() {
                let k = jt * 4 + e;
                let d = b.fmul(p[k], b.fsub(v, dd(jt, e)));
                ds.push(d);
                dx.push(match self.regions.dx {
                    None => d,
                    Some(r) => {
                        let (i, j) = pos(jt, e);
                        let g = r.emit(b, xs[k], ScorePos { i, j, bh });
                        let z = b.fcmp(FloatPredicate::OEQ, p[k], zero);
                        b.select_f(z, zero, b.fmul(d, g))
                    }
                });
            }
        }
        (ds, dx)
    }
}

impl<'k, 'a, 'ctx> Bwd<'k, 'a, 'ctx> {
    /// The captured-tensor terms of a fragment: for each gradient slot with reads `by_key`
    /// (by query row when false), in [`super::Regions::slots`] order, `dS dR/d(read)` per
    /// element, summed over the slot's reads; 0 where `P = 0` (as `dx`: a derivative that is
    /// not finite on a masked element cannot leak a NaN).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn capture_terms(
        &self,
        p: &[FloatValue<'ctx>],
        ds: &[FloatValue<'ctx>],
        xs: &[FloatValue<'ctx>],
        pos: PosFn<'_, 'ctx>,
        bh: IntValue<'ctx>,
        by_key: bool,
    ) -> Vec<Vec<FloatValue<'ctx>>> {
        let b = self.b;
        let zero = b.f32(0.0);
        let regions = self.regions;
        regions
            .slots(by_key)
            .into_iter()
            .map(|slot| {
                (0..ds.len())
                    .map(|k| {
                        let (i, j) = pos(k / 4, k % 4);
                        let mut sum = zero;
                        for r in regions.reads.iter().filter(|r| r.by_key == by_key && r.slot == slot) {
                            // xs is empty only for the identity region, which reads no capture.
                            let x = xs.get(k).copied().unwrap_or(zero);
                            sum = b.fadd(sum, r.local.emit(b, x, ScorePos { i, j, bh }));
                        }
                        let z = b.fcmp(FloatPredicate::OEQ, p[k], zero);
                        b.select_f(z, zero, b.fmul(ds[k], sum))
                    })
                    .collect()
            })
            .collect()
    }
}
