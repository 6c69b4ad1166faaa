//! `threshold` and `block_boundary` in f64 (docs/SEMANTICS.md): the ACP nodes' reference.

use super::attention::block_start;
use super::{Evaluator, InterpError};
use crate::graph::{Value, ValueId};
use crate::ops::Op;
use crate::prune_rule::{threshold, ThresholdArgs};

impl Evaluator<'_> {
    /// `delta [B, H, ceil(T / bm)]` of a `threshold` node.
    pub(super) fn threshold(
        &self,
        id: ValueId,
        ops: &[Value],
        shape: &[usize],
    ) -> Result<Vec<f64>, InterpError> {
        let Op::Threshold { rule, log_eps, bound, score, scale, bm, .. } = self.g.op(id) else {
            return Err(self.err(id, "not a threshold node"));
        };
        let q = self.positional(id, ops[0], 4, "q")?;
        let k = self.positional(id, ops[1], 4, "k")?;
        let (b, h, t, d) = (q.shape[0], q.shape[1], q.shape[2], q.shape[3]);
        let (hk, tk) = (k.shape[1], k.shape[2]);
        if k.shape[0] != b || k.shape[3] != d || t > tk || hk == 0 || h % hk != 0 {
            return Err(self.err(
                id,
                format!(
                    "k {:?} does not fit q {:?} (kv heads must divide heads, queries be at most keys)",
                    k.shape, q.shape
                ),
            ));
        }
        // A rule of per-head thresholds has one per query head of the program.
        rule.check_heads(h).map_err(InterpError::Refused)?;
        let group = h / hk;
        let bm = *bm as usize;
        if bm == 0 {
            return Err(self.err(id, "bm = 0"));
        }
        let mt = t.div_ceil(bm);
        if shape != [b, h, mt] {
            return Err(self.err(id, format!("result {shape:?}, expected {:?}", [b, h, mt])));
        }
        let bind = |s: &str| self.dims.get(s);
        let unbound = || self.err(id, "the scale's dim is not bound");
        let base = scale.base_value(&bind).ok_or_else(unbound)?;
        // A q factor `s` (the fold-q-scale pass): the statistics are those of the q the program
        // gave, `s q` (a static bound already bounds it), with the scale without `s`.
        let scaled: Option<Vec<f64>> = match scale.q {
            None => None,
            Some(_) => {
                let s = scale.q_value(&bind).ok_or_else(unbound)?;
                Some(q.data.iter().map(|x| s * x).collect())
            }
        };
        // The rule's formula over the statistics: the one evaluation (prune_rule::threshold).
        let args = ThresholdArgs {
            q: scaled.as_deref().unwrap_or(&q.data),
            k: &k.data,
            heads: b * h,
            kv_head: &|bh| (bh / h) * hk + (bh % h) / group,
            t,
            tk,
            d,
            bm,
            log_eps: *log_eps,
            scale: base,
            bound: *bound,
            score: *score,
            whole: None,
            given: &rule.given,
        };
        let out = threshold(&rule.formula, &args);
        Ok(out)
    }

    /// `start [B, H, ceil(T / bm)]` of a `block_boundary` node.
    pub(super) fn block_boundary(
        &self,
        id: ValueId,
        ops: &[Value],
        shape: &[usize],
    ) -> Result<Vec<f64>, InterpError> {
        let Op::BlockBoundary(tiles) = self.g.op(id) else {
            return Err(self.err(id, "not a block_boundary node"));
        };
        let c = self.positional(id, ops[0], 3, "c")?;
        let delta = self.positional(id, ops[1], 3, "delta")?;
        let (b, h, tk) = (c.shape[0], c.shape[1], c.shape[2]);
        let (bm, bn) = (tiles.bm as usize, tiles.bn as usize);
        if bm == 0 || bn == 0 {
            return Err(self.err(id, "zero tile size"));
        }
        // The queries' length, from delta's type `[B, H, ceil(Tq / bm)]` (c's own without one).
        let tq = match crate::check::query_rows(self.g.value_ty(ops[1]), tiles.bm) {
            Some(rows) => {
                self.dims.eval(&rows).ok_or_else(|| self.err(id, "the query count is not bound"))? as usize
            }
            None => tk,
        };
        let mt = tq.div_ceil(bm);
        if tq > tk || delta.shape != [b, h, mt] || shape != [b, h, mt] {
            return Err(self.err(
                id,
                format!(
                    "delta {:?} / result {shape:?}, expected {:?} with {tq} <= {tk}",
                    delta.shape,
                    [b, h, mt]
                ),
            ));
        }
        Ok(boundary(&c.data, &delta.data, b * h, tq, bm, bn))
    }
}

/// `start` for every (head, query tile) from `c [BH, Tk]` and `delta [BH, ceil(Tq / bm)]`; `tq`
/// queries (at most `Tk`) sit at the end of the keys, row `i` at key position `i + Tk - Tq`.
pub fn boundary(c: &[f64], delta: &[f64], heads: usize, tq: usize, bm: usize, bn: usize) -> Vec<f64> {
    let mt = tq.div_ceil(bm);
    let tk = c.len().checked_div(heads).unwrap_or(0);
    let offset = tk.saturating_sub(tq);
    let mut out = Vec::with_capacity(heads * mt);
    for bh in 0..heads {
        let cr = &c[bh * tk..(bh + 1) * tk];
        for m in 0..mt {
            out.push(block_start(cr, delta[bh * mt + m], m * bm + offset, bn) as f64);
        }
    }
    out
}
