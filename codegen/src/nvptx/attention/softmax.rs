//! Scores and the online softmax of the attention kernel: `s2 = score(x) log2 e + b_j` per
//! fragment element (`x = scale q.k`, `b_j` the column's decay bias), the mask on the tiles that
//! need one, the running row max / sum with `ex2.approx`, the conditional O rescale, and the
//! final `1 / l` and LSE.

use super::score::ScorePos;
use super::{Attn, Rows, LN2, LOG2E};
use crate::nvptx::builder::control::{basic, floats};
use inkwell::values::{FloatValue, IntValue};
use inkwell::{FloatPredicate, IntPredicate};

/// One tile's softmax step for this thread's two rows.
pub(crate) struct SoftmaxStep<'ctx> {
    /// `2^(m_old - m_new)`: the factor on the old sum and O.
    pub alpha: [FloatValue<'ctx>; 2],
    pub m_new: [FloatValue<'ctx>; 2],
    pub l_new: [FloatValue<'ctx>; 2],
    /// `2^(s2 - m_new)` in the S fragment order.
    pub p: Vec<FloatValue<'ctx>>,
}

impl<'k, 'a, 'ctx> Attn<'k, 'a, 'ctx> {
    /// Scores in log2 units, less the row term: `s2 = score(scale q.k) log2 e + b_j`, masked
    /// (-inf) where the key is after the row (causal masks), past T, outside the window, or
    /// dropped by the expression mask, on the tiles that need it (a warp-uniform branch). `col0` is this thread's first column (`j0 + 2t`).
    pub(crate) fn scores(
        &self,
        s_acc: &[[FloatValue<'ctx>; 4]],
        c_col: &[FloatValue<'ctx>],
        rows: &Rows<'ctx>,
        j0: IntValue<'ctx>,
        col0: IntValue<'ctx>,
        bh: IntValue<'ctx>,
    ) -> Vec<FloatValue<'ctx>> {
        let b = self.b;
        let cfg = self.cfg;
        let bn = cfg.bn as i64;
        let ninf = b.f32(f64::NEG_INFINITY);
        // Key column of element e of n-tile jt.
        let col = |jt: usize, e: usize| b.addc(col0, (8 * jt + (e & 1)) as i64);
        let mut sv: Vec<FloatValue<'ctx>> = Vec::with_capacity(s_acc.len() * 4);
        for (jt, s) in s_acc.iter().enumerate() {
            for (e, &x) in s.iter().enumerate() {
                let v = if self.score.is_identity() {
                    // One FMA: (scale log2 e) q.k + b_j.
                    let sl2 = b.f32(cfg.scale as f64 * LOG2E);
                    if cfg.has_decay {
                        b.fma(x, sl2, c_col[jt * 2 + (e & 1)])
                    } else {
                        b.fmul(x, sl2)
                    }
                } else {
                    let at = ScorePos { i: rows.i[e / 2], j: col(jt, e), bh };
                    let y = self.score.emit(b, b.fmul(x, b.f32(cfg.scale as f64)), at);
                    if cfg.has_decay {
                        b.fma(y, b.f32(LOG2E), c_col[jt * 2 + (e & 1)])
                    } else {
                        b.fmul(y, b.f32(LOG2E))
                    }
                };
                sv.push(v);
            }
        }
        // Does this warp's 16 x bn block need masking? (diagonal, tail, or window edge; every
        // block under an expression mask)
        let jlast = b.addc(j0, bn - 1);
        let diag = cfg.causal.then(|| b.icmp(IntPredicate::SGT, jlast, rows.pw0));
        let tail = b.icmp(IntPredicate::SGE, jlast, self.k_len);
        let mut need = diag.map_or(tail, |d| b.or(d, tail));
        if self.score.has_mask() {
            need = b.bool(true);
        }
        if let Some(w) = cfg.window {
            let wl = b.sub(b.addc(rows.iw0, 15), j0);
            let wc = b.icmpc(IntPredicate::SGE, wl, w as i64);
            need = b.or(need, wc);
        }
        let carried: Vec<(&str, _)> = sv.iter().map(|v| ("s", (*v).into())).collect();
        let s2 = b.if_then_carry(need, ("mask", "softmax"), &carried, |b| {
            let mut sm = Vec::with_capacity(sv.len());
            for jt in 0..s_acc.len() {
                for e in 0..4 {
                    let r = e / 2;
                    let j = col(jt, e);
                    let before = cfg.causal.then(|| b.icmp(IntPredicate::SLE, j, rows.p[r]));
                    let int = b.icmp(IntPredicate::SLT, j, self.k_len);
                    let mut ok = before.map_or(int, |x| b.and(x, int));
                    if let Some(keep) = self.score.keeps(b, ScorePos { i: rows.i[r], j, bh }) {
                        ok = b.and(ok, keep);
                    }
                    if let Some(w) = cfg.window {
                        let dist = b.sub(rows.p[r], j);
                        let inw = b.icmpc(IntPredicate::SLT, dist, w as i64);
                        ok = b.and(ok, inw);
                    }
                    sm.push(b.select_f(ok, sv[jt * 4 + e], ninf));
                }
            }
            basic(&sm)
        });
        floats(&s2)
    }

    /// The online softmax over one tile, two rows per thread (row g: elements 0, 1 of each
    /// n-tile; row g+8: elements 2, 3): new row max (over the 4 lanes of a row), the factor
    /// `alpha` on the old state, the probabilities and the new row sums (this lane's part).
    pub(crate) fn online_softmax(
        &self,
        s2: &[FloatValue<'ctx>],
        m_old: [FloatValue<'ctx>; 2],
        l_old: [FloatValue<'ctx>; 2],
    ) -> SoftmaxStep<'ctx> {
        let b = self.b;
        let nt = s2.len() / 4;
        let zero = b.f32(0.0);
        let ninf = b.f32(f64::NEG_INFINITY);
        let mut alpha = [zero; 2];
        let mut m_new = [zero; 2];
        let mut m_neg = [zero; 2];
        for r in 0..2 {
            let mut mx = ninf;
            for jt in 0..nt {
                for e in 0..2 {
                    mx = b.fmax(mx, s2[jt * 4 + 2 * r + e]);
                }
            }
            mx = b.fmax(mx, b.shfl_xor(mx, 1));
            mx = b.fmax(mx, b.shfl_xor(mx, 2));
            let mn = b.fmax(m_old[r], mx);
            // A row with nothing kept so far keeps max -inf; subtract 0 then (no inf - inf).
            let isinf = b.fcmp(FloatPredicate::OEQ, mn, ninf);
            let mu = b.select_f(isinf, zero, mn);
            let mneg = b.fneg(mu);
            alpha[r] = b.ex2(b.fadd(m_old[r], mneg));
            m_new[r] = mn;
            m_neg[r] = mneg;
        }
        let mut p = vec![zero; s2.len()];
        let mut l_new = [zero; 2];
        for r in 0..2 {
            let mut acc = b.fmul(l_old[r], alpha[r]);
            for jt in 0..nt {
                for e in 0..2 {
                    let i = jt * 4 + 2 * r + e;
                    p[i] = b.ex2(b.fadd(s2[i], m_neg[r]));
                    acc = b.fadd(acc, p[i]);
                }
            }
            l_new[r] = acc;
        }
        SoftmaxStep { alpha, m_new, l_new, p }
    }

    /// `O * alpha` per row, skipped when no row of the warp raised its max (rare after the first
    /// tiles: the diagonal tile, taken first, usually holds the row maximum).
    pub(crate) fn rescale(
        &self,
        o: &[FloatValue<'ctx>],
        alpha: [FloatValue<'ctx>; 2],
    ) -> Vec<FloatValue<'ctx>> {
        let b = self.b;
        let one = b.f32(1.0);
        let a0 = b.fcmp(FloatPredicate::UNE, alpha[0], one);
        let a1 = b.fcmp(FloatPredicate::UNE, alpha[1], one);
        let anyw = b.vote_any(b.or(a0, a1));
        let carried: Vec<(&str, _)> = o.iter().map(|v| ("o_s", (*v).into())).collect();
        let scaled = b.if_then_carry(anyw, ("rescale", "pv"), &carried, |b| {
            let s: Vec<FloatValue> =
                o.iter().enumerate().map(|(i, v)| b.fmul(*v, alpha[(i % 4) / 2])).collect();
            basic(&s)
        });
        floats(&scaled)
    }

    /// After the last tile: `1 / l` (0 for a row with nothing kept) and the natural-log LSE
    /// `(log2 l + m + row term) ln 2` (-inf for an empty row), the row sums reduced over the 4
    /// lanes of each row. `cir`: the row terms `(c_i - c_ref) log2 e`.
    pub(crate) fn finalize(
        &self,
        m: [FloatValue<'ctx>; 2],
        l: [FloatValue<'ctx>; 2],
        cir: [FloatValue<'ctx>; 2],
    ) -> ([FloatValue<'ctx>; 2], [FloatValue<'ctx>; 2]) {
        let b = self.b;
        let zero = b.f32(0.0);
        let ninf = b.f32(f64::NEG_INFINITY);
        let mut inv = [zero; 2];
        let mut lse = [zero; 2];
        for r in 0..2 {
            let mut s = l[r];
            s = b.fadd(s, b.shfl_xor(s, 1));
            s = b.fadd(s, b.shfl_xor(s, 2));
            let pos = b.fcmp(FloatPredicate::OGT, s, zero);
            let rl = b.fdiv(b.f32(1.0), s);
            inv[r] = b.select_f(pos, rl, zero);
            let lg = b.lg2(s);
            let m2 = b.fadd(m[r], cir[r]);
            let x = b.fmul(b.fadd(lg, m2), b.f32(LN2));
            lse[r] = b.select_f(pos, x, ninf);
        }
        (inv, lse)
    }
}
