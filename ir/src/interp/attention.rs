//! `attention` in f64, row by row (docs/SEMANTICS.md, "attention"): THE reference of the op.
//!
//! [`AttnArgs::row`] computes one query row (its output, lse and pruned mass) and is the
//! row-sampled entry point for shapes too large to run whole; [`AttnArgs::run`] runs every row,
//! heads spread over the cores (the result does not depend on the split).

use super::nan_max;
use super::region::{Capture, RegionEval};
use crate::attention::{Attention, Mask};
use crate::types::Dim;

/// The operands of one attention node, as flat head-first slices, with the bound sizes.
pub struct AttnArgs<'a> {
    pub attn: &'a Attention,
    /// The scale's value for the bound dims.
    pub scale: f64,
    pub b: usize,
    /// Query heads.
    pub h: usize,
    /// Query heads per kv head (`kv_group` bound): k and v have `h / group` heads.
    pub group: usize,
    /// Query rows `Tq` and key rows `Tk` (`Tq <= Tk` under a causal mask or a decay: query row
    /// `i` sits at key position `i + Tk - Tq`, docs/SEMANTICS.md).
    pub t: usize,
    pub tk: usize,
    pub d: usize,
    pub dv: usize,
    pub q: &'a [f64],
    pub k: &'a [f64],
    pub v: &'a [f64],
    /// The decay values `c_t` (`[B, H, Tk]`) of the bias `c_{i + offset} - c_j` ([`pair_decay`] with
    /// a `decay(pair)`).
    pub c: Option<&'a [f64]>,
    /// `start [B, H, ceil(T / bm)]` as values (for `Prune::Boundary` derived with
    /// [`block_start`]), with `bm` and `bn`.
    pub start: Option<(&'a [f64], usize, usize)>,
    pub captures: Vec<Capture<'a>>,
    pub dim: &'a (dyn Fn(&Dim) -> Option<u64> + Sync),
}

/// The decay values of a `decay(pair)` attention: `c~_t = round_f32(c_t) + lo_t`, `c` read at its
/// declared dtype (f32; this interpreter holds it unrounded) and `lo` the `gate_cumsum_lo`
/// residual, so `c~` is the f64 cumsum again (to `|c| 2^-48`) and so is the bias `c~_i - c~_j`.
pub fn pair_decay(c: &[f64], lo: &[f64]) -> Vec<f64> {
    c.iter().zip(lo).map(|(&c, &l)| c as f32 as f64 + l).collect()
}

/// One computed row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Row {
    /// `log sum_{j in K(i)} exp(E_ij)`; `-inf` when no entry is kept.
    pub lse: f64,
    /// The dense softmax weight of the mask-kept entries that pruning skipped (0 when dense).
    pub pruned_mass: f64,
}

/// Kept and total tiles and the largest pruned mass, summed over heads.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HeadStats {
    pub kept_tiles: u64,
    pub total_tiles: u64,
    pub max_pruned_mass: f64,
}

/// The `block_boundary` rule for one query tile whose first row sits at key position `p0`
/// (`i0 + Tk - Tq`): the first key tile `n` with `c[p0] - c[jend(n)] >= delta` (a NaN
/// comparison keeps the tile), at most `floor(p0 / bn)`.
pub fn block_start(c: &[f64], delta: f64, p0: usize, bn: usize) -> usize {
    let t = c.len();
    let diag = p0 / bn;
    (0..diag)
        .find(|&n| {
            // A NaN comparison is false: the tile is kept.
            let skipped = c[p0] - c[(n * bn + bn - 1).min(t - 1)] < delta;
            !skipped
        })
        .unwrap_or(diag)
}

/// The region evaluators of one worker (score and, for an expression mask, mask; the
/// epilogue's).
pub struct Evals<'a> {
    score: RegionEval<'a>,
    mask: Option<RegionEval<'a>>,
    epilogue: Option<RegionEval<'a>>,
    /// `E_ij` of the current row (scratch).
    e: Vec<f64>,
    keep: Vec<bool>,
}

impl<'a> AttnArgs<'a> {
    /// Evaluators for one worker thread.
    pub fn evals<'s>(&'s self) -> Result<Evals<'s>, String> {
        let score = RegionEval::new(&self.attn.score, &self.captures, self.dim)?;
        let mask = match &self.attn.mask {
            Mask::Expr(r) => Some(RegionEval::new(r, &self.captures, self.dim)?),
            _ => None,
        };
        let epilogue = match &self.attn.epilogue {
            Some(r) => Some(RegionEval::new(r, &self.captures, self.dim)?),
            None => None,
        };
        Ok(Evals { score, mask, epilogue, e: vec![0.0; self.tk], keep: vec![false; self.tk] })
    }

    /// The key position of query row 0: queries are aligned to the end of the keys.
    pub fn offset(&self) -> usize {
        self.tk.saturating_sub(self.t)
    }

    /// The first kept key of row `i` of head `bh` by pruning (0 when dense).
    fn kstart(&self, bh: usize, i: usize) -> usize {
        match self.start {
            Some((st, bm, bn)) => {
                let mt = self.t.div_ceil(bm);
                let sm = st[bh * mt + i / bm];
                let sm = if sm.is_nan() || sm < 0.0 { 0.0 } else { sm };
                // Beyond the row: nothing kept (saturate rather than overflow).
                (sm * bn as f64).min(self.tk as f64) as usize
            }
            None => 0,
        }
    }

    /// Row `i` of head `bh` (= b * H + h) into `o` (`[Dv]`, overwritten), the epilogue applied.
    pub fn row(&self, ev: &mut Evals, bh: usize, i: usize, o: &mut [f64]) -> Row {
        let row = self.attend(ev, bh, i, o);
        if let Some(f) = ev.epilogue.as_mut() {
            // The epilogue's `x` is the output and its fourth index the column d.
            let (bi, hi) = (bh / self.h, bh % self.h);
            for (d, x) in o.iter_mut().enumerate() {
                *x = f.eval(*x, [bi, hi, i, d]);
            }
        }
        row
    }

    /// [`AttnArgs::row`] before the epilogue: the normalized output.
    fn attend(&self, ev: &mut Evals, bh: usize, i: usize, o: &mut [f64]) -> Row {
        let (t, tk, d, dv) = (self.t, self.tk, self.d, self.dv);
        let (bi, hi) = (bh / self.h, bh % self.h);
        let kvh = bi * (self.h / self.group) + hi / self.group;
        // The row's key position: the causal diagonal and its decay c_p.
        let p = i + self.offset();
        let (lo, hi_j) = match self.attn.mask {
            Mask::Causal => (0, p + 1),
            Mask::Window(w) => ((p + 1).saturating_sub(w as usize), p + 1),
            Mask::None | Mask::Expr(_) => (0, tk),
        };
        let qi = &self.q[(bh * t + i) * d..(bh * t + i + 1) * d];
        let kstart = self.kstart(bh, i);
        let mut dense_max = f64::NEG_INFINITY;
        let mut kept_max = f64::NEG_INFINITY;
        for j in lo..hi_j {
            let at = [bi, hi, i, j];
            let keep = match ev.mask.as_mut() {
                Some(m) => m.eval(0.0, at) != 0.0,
                None => true,
            };
            ev.keep[j] = keep;
            if !keep {
                continue;
            }
            let kj = &self.k[(kvh * tk + j) * d..(kvh * tk + j + 1) * d];
            let dot: f64 = qi.iter().zip(kj).map(|(a, b)| a * b).sum();
            let bias = self.c.map_or(0.0, |c| c[bh * tk + p] - c[bh * tk + j]);
            let e = ev.score.eval(self.scale * dot, at) + bias;
            ev.e[j] = e;
            dense_max = dense_max.max(e);
            if j >= kstart {
                kept_max = kept_max.max(e);
            }
        }
        let kept = |j: usize| ev.keep[j] && j >= kstart;
        // Pruned mass: the dense weight of what pruning skipped.
        let mut pruned_mass = 0.0;
        if self.start.is_some() && kstart > lo && dense_max != f64::NEG_INFINITY {
            let (mut z, mut skipped) = (0.0, 0.0);
            for j in lo..hi_j {
                if ev.keep[j] {
                    let p = (ev.e[j] - dense_max).exp();
                    z += p;
                    if j < kstart {
                        skipped += p;
                    }
                }
            }
            pruned_mass = skipped / z;
        }
        o.iter_mut().for_each(|x| *x = 0.0);
        let any_nan = (lo..hi_j).any(|j| kept(j) && ev.e[j].is_nan());
        if kept_max == f64::NEG_INFINITY && !any_nan {
            // No kept entry (or all -inf): output 0, lse -inf.
            return Row { lse: f64::NEG_INFINITY, pruned_mass };
        }
        let mut z = 0.0;
        for j in (lo..hi_j).filter(|&j| kept(j)) {
            let p = (ev.e[j] - kept_max).exp();
            z += p;
            let vj = &self.v[(kvh * tk + j) * dv..(kvh * tk + j + 1) * dv];
            for (oe, ve) in o.iter_mut().zip(vj) {
                *oe += p * ve;
            }
        }
        o.iter_mut().for_each(|x| *x /= z);
        Row { lse: kept_max + z.ln(), pruned_mass }
    }

    /// Tile counts of head `bh` (kept, total causal tiles) when pruned.
    fn tile_counts(&self, bh: usize) -> (u64, u64) {
        let Some((st, bm, bn)) = self.start else { return (0, 0) };
        let (t, mt) = (self.t, self.t.div_ceil(bm));
        let (mut kept, mut total) = (0, 0);
        for m in 0..mt {
            let diag = (((m * bm + bm - 1).min(t - 1) + self.offset()) / bn) as u64;
            let sm = st[bh * mt + m];
            let sm = if sm.is_nan() || sm < 0.0 { 0 } else { sm as u64 };
            total += diag + 1;
            kept += (diag + 1).saturating_sub(sm);
        }
        (kept, total)
    }

    /// Every row: `out [B, H, T, Dv]`, `lse [B, H, T]` and the statistics.
    pub fn run(&self) -> Result<(Vec<f64>, Vec<f64>, HeadStats), String> {
        let (t, dv) = (self.t, self.dv);
        let heads = self.b * self.h;
        let mut out = vec![0.0; heads * t * dv];
        let mut lse = vec![0.0; heads * t];
        if heads == 0 || t == 0 {
            return Ok((out, lse, HeadStats::default()));
        }
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(heads).max(1);
        let per = heads.div_ceil(threads);
        let parts: Vec<Result<HeadStats, String>> = std::thread::scope(|sc| {
            let handles: Vec<_> = out
                .chunks_mut(per * t * dv.max(1))
                .zip(lse.chunks_mut(per * t))
                .enumerate()
                .map(|(n, (o, l))| {
                    sc.spawn(move || {
                        let mut ev = self.evals()?;
                        let mut s = HeadStats::default();
                        for (kh, l) in l.chunks_mut(t).enumerate() {
                            let bh = n * per + kh;
                            let (kept, total) = self.tile_counts(bh);
                            s.kept_tiles += kept;
                            s.total_tiles += total;
                            for (i, li) in l.iter_mut().enumerate() {
                                let oi = &mut o[(kh * t + i) * dv..(kh * t + i + 1) * dv];
                                let r = self.row(&mut ev, bh, i, oi);
                                *li = r.lse;
                                s.max_pruned_mass = nan_max(s.max_pruned_mass, r.pruned_mass);
                            }
                        }
                        Ok(s)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err("an attention worker panicked".into())))
                .collect()
        });
        let mut stats = HeadStats::default();
        for p in parts {
            let p = p?;
            stats.kept_tiles += p.kept_tiles;
            stats.total_tiles += p.total_tiles;
            stats.max_pruned_mass = nan_max(stats.max_pruned_mass, p.max_pruned_mass);
        }
        Ok((out, lse, stats))
    }
}

impl super::Evaluator<'_> {
    /// `out` (rounded to `out_dtype`) and `lse` of attention node `id`; records its pruning
    /// statistics when pruned.
    pub(super) fn attention_node(
        &mut self,
        id: crate::graph::ValueId,
    ) -> Result<(super::Val, super::Val), super::InterpError> {
        use crate::attention::Prune;
        use std::rc::Rc;
        let g = self.g;
        let crate::ops::Op::Attention(a) = g.op(id) else {
            return Err(self.err(id, "not an attention node"));
        };
        let o = crate::attention::Attention::operands(g, id).map_err(|e| self.err(id, e))?;
        let (mut out, lse, stats) =
            self.with_attn_args(id, a, &o, |args| args.run().map_err(|e| self.err(id, e)))?;
        if a.out_dtype != crate::types::DType::F32 {
            out.iter_mut().for_each(|x| *x = super::cast(a.out_dtype, *x));
        }
        if a.prune != Prune::Dense {
            self.prune.push(super::PruneStats {
                node: id,
                kept_tiles: stats.kept_tiles,
                total_tiles: stats.total_tiles,
                max_pruned_mass: stats.max_pruned_mass,
            });
        }
        let (axes, shape) = self.node_layout(id)?;
        let lse_ty = g.result_ty(id, 1).ok_or_else(|| self.err(id, "attention without an lse result"))?;
        let lse_shape = crate::shapes::concrete_shape(lse_ty, &self.dims)?;
        let lse_axes = lse_ty.axes.iter().map(|x| x.name.clone()).collect();
        Ok((
            super::Val { axes, shape, data: Rc::new(out) },
            super::Val { axes: lse_axes, shape: lse_shape, data: Rc::new(lse) },
        ))
    }

    /// The arguments of attention (or `attention_backward`) node `id`, read from its forward
    /// operands `o`: the one place that checks their shapes, binds the scale and derives the kept
    /// set (so the backward walks exactly the forward's tiles); `f` runs on them.
    pub(super) fn with_attn_args<R>(
        &self,
        id: crate::graph::ValueId,
        a: &Attention,
        o: &crate::attention::AttnOperands,
        f: impl FnOnce(AttnArgs<'_>) -> Result<R, super::InterpError>,
    ) -> Result<R, super::InterpError> {
        use crate::attention::Prune;
        let q = self.positional(id, o.q, 4, "q")?;
        let k = self.positional(id, o.k, 4, "k")?;
        let v = self.positional(id, o.v, 4, "v")?;
        let (b, h, t, d) = (q.shape[0], q.shape[1], q.shape[2], q.shape[3]);
        let (hk, dv) = (k.shape[1], v.shape[3]);
        let group =
            self.dims.eval(&a.kv_group).ok_or_else(|| self.err(id, "kv_group's dim is not bound"))? as usize;
        if group == 0 || hk * group != h {
            return Err(self.err(
                id,
                format!("q has {h} heads, k {hk}: that is not kv_group = {group} query heads per kv head"),
            ));
        }
        let tk = k.shape[2];
        if k.shape != [b, hk, tk, d] || v.shape[..3] != [b, hk, tk] {
            return Err(self.err(id, format!("q {:?}, k {:?}, v {:?} disagree", q.shape, k.shape, v.shape)));
        }
        if t > tk && a.positions_queries() {
            return Err(
                self.err(id, format!("{t} queries but {tk} keys: queries sit at the end of the keys"))
            );
        }
        let c = match o.decay {
            Some(c) => {
                let c = self.positional(id, c, 3, "c")?;
                if c.shape != [b, h, tk] {
                    return Err(self.err(id, format!("c has shape {:?}, expected {:?}", c.shape, [b, h, tk])));
                }
                Some(c.data.as_slice())
            }
            None => None,
        };
        let paired = match (c, o.decay_lo) {
            (Some(c), Some(lo)) => {
                let lo = self.positional(id, lo, 3, "c_lo")?;
                if lo.data.len() != c.len() {
                    return Err(
                        self.err(id, format!("c_lo has shape {:?}, expected {:?}", lo.shape, [b, h, tk]))
                    );
                }
                Some(pair_decay(c, &lo.data))
            }
            _ => None,
        };
        let derived;
        let start = match (a.prune, a.tiles) {
            (Prune::Dense, _) => None,
            (_, None) => return Err(self.err(id, "a pruned attention without tiles")),
            (p, Some(tl)) => {
                let (bm, bn) = (tl.bm as usize, tl.bn as usize);
                let mt = t.div_ceil(bm.max(1));
                let x = self.positional(
                    id,
                    if p == Prune::Start { o.start } else { o.delta }.unwrap_or(o.q),
                    3,
                    "start",
                )?;
                if x.shape != [b, h, mt] || bm == 0 || bn == 0 {
                    return Err(self
                        .err(id, format!("start/delta has shape {:?}, expected {:?}", x.shape, [b, h, mt])));
                }
                if p == Prune::Start {
                    Some((x.data.as_slice(), bm, bn))
                } else {
                    let c = c.ok_or_else(|| self.err(id, "a pruned attention without c"))?;
                    derived = super::acp::boundary(c, &x.data, b * h, t, bm, bn);
                    Some((derived.as_slice(), bm, bn))
                }
            }
        };
        let mut caps = vec![];
        for &cid in &o.captures {
            let cv = self.val(cid, id)?;
            caps.push(Capture { shape: &cv.shape, data: &cv.data });
        }
        let scale = a
            .scale
            .value(&|s| self.dims.get(s))
            .ok_or_else(|| self.err(id, "the scale's dim is not bound"))?;
        let dims = &self.dims;
        let dim = move |x: &Dim| dims.eval(x);
        let args = AttnArgs {
            attn: a,
            scale,
            b,
            h,
            group,
            t,
            tk,
            d,
            dv,
            q: &q.data,
            k: &k.data,
            v: &v.data,
            c: paired.as_deref().or(c),
            start,
            captures: caps,
            dim: &dim,
        };
        f(args)
    }
}

/// One reference row of [`sample_rows`].
#[derive(Clone, Debug, PartialEq)]
pub struct SampledRow {
    /// The dense output row (the node's mask, no pruning), `[Dv]`, in f64 (no output rounding).
    pub dense: Vec<f64>,
    /// The dense row's log-sum-exp.
    pub lse: f64,
    /// The dense weight of what the node's pruning skips in this row (0 when dense).
    pub pruned_mass: f64,
    /// The node's own row: over the keys its pruning keeps (equal to `dense` when dense), `[Dv]`.
    pub kept: Vec<f64>,
}

/// Reference rows `(bh, i)` (`bh = b * H + h`) of attention node `node` of `g`, for checks of
/// shapes too large to run whole: evaluates only the node's operands, then those rows.
pub fn sample_rows(
    g: &crate::graph::Graph,
    inputs: &std::collections::BTreeMap<String, super::Tensor>,
    node: crate::graph::ValueId,
    rows: &[(usize, usize)],
) -> Result<Vec<SampledRow>, super::InterpError> {
    use crate::attention::Prune;
    let bad = |w: String| super::malformed(g, node, w);
    let crate::ops::Op::Attention(a) = g.op(node) else { return Err(bad("not an attention node".into())) };
    let o = Attention::operands(g, node).map_err(bad)?;
    let mut want = vec![o.q, o.k, o.v];
    want.extend(o.decay);
    want.extend(o.decay_lo);
    want.extend(o.start);
    want.extend(o.delta);
    want.extend(o.captures.iter().copied());
    let vals = super::eval(g, inputs, &want)?;
    let shapes: Vec<(String, Vec<usize>)> =
        inputs.iter().map(|(k, t)| (k.clone(), t.shape.clone())).collect();
    let dims = crate::shapes::bind_dims_partial(g, &shapes)?;
    let (q, k, v) = (&vals[&o.q], &vals[&o.k], &vals[&o.v]);
    let (b, h, t, d) = (q.shape[0], q.shape[1], q.shape[2], q.shape[3]);
    let (hk, tk, dv) = (k.shape[1], k.shape[2], v.shape[3]);
    if hk == 0 || h % hk != 0 {
        return Err(bad(format!("q has {h} heads, k {hk}")));
    }
    if t > tk && a.positions_queries() {
        return Err(bad(format!("{t} queries but {tk} keys: queries sit at the end of the keys")));
    }
    let c = o.decay.map(|c| vals[&c].data.as_slice());
    let paired = c.zip(o.decay_lo).map(|(c, lo)| pair_decay(c, &vals[&lo].data));
    let derived;
    let start = match (a.prune, a.tiles) {
        (Prune::Dense, _) | (_, None) => None,
        (Prune::Start, Some(tl)) => {
            o.start.map(|s| (vals[&s].data.as_slice(), tl.bm as usize, tl.bn as usize))
        }
        (Prune::Boundary, Some(tl)) => match (o.delta, c) {
            (Some(dl), Some(c)) => {
                derived = super::acp::boundary(c, &vals[&dl].data, b * h, t, tl.bm as usize, tl.bn as usize);
                Some((derived.as_slice(), tl.bm as usize, tl.bn as usize))
            }
            _ => None,
        },
    };
    let captures: Vec<Capture> =
        o.captures.iter().map(|cid| Capture { shape: &vals[cid].shape, data: &vals[cid].data }).collect();
    let scale = a.scale.value(&|s| dims.get(s)).ok_or_else(|| bad("the scale's dim is not bound".into()))?;
    let dim = |x: &Dim| dims.eval(x);
    let dense = AttnArgs {
        attn: a,
        scale,
        b,
        h,
        group: h / hk,
        t,
        tk,
        d,
        dv,
        q: &q.data,
        k: &k.data,
        v: &v.data,
        c: paired.as_deref().or(c),
        start: None,
        captures,
        dim: &dim,
    };
    let pruned = AttnArgs { start, captures: dense.captures.clone(), ..dense };
    let (mut ed, mut ep) = (dense.evals().map_err(bad)?, pruned.evals().map_err(bad)?);
    let mut scratch = vec![0.0; dv];
    let mut out = vec![];
    for &(bh, i) in rows {
        if bh >= b * h || i >= t {
            return Err(bad(format!("row ({bh}, {i}) is out of range")));
        }
        let mut row = vec![0.0; dv];
        let r = dense.row(&mut ed, bh, i, &mut row);
        let mass = pruned.row(&mut ep, bh, i, &mut scratch).pruned_mass;
        out.push(SampledRow { dense: row, lse: r.lse, pruned_mass: mass, kept: scratch.clone() });
    }
    Ok(out)
}
