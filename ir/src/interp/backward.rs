//! `attention_backward` in f64: dense loops over the forward's kept set (docs/SEMANTICS.md,
//! "attention_backward"). This is THE reference of the backward: every kernel is checked
//! against it, and it is checked against finite differences of the forward.
//!
//! The forward's operands come as the forward's own [`AttnArgs`] (same kept set, same score
//! region evaluator); the derivatives of the score region are regions too ([`Region::grad`]),
//! evaluated by the same [`RegionEval`].
//!
//! Work is split over (batch, kv head): one task owns the `kv_group` query heads that share a
//! kv head, so `dk`/`dv` of that kv head are summed in one fixed order (query heads ascending,
//! rows ascending) by one thread. Capture gradients, which several tasks may touch, are summed
//! per task and then added in task order: the result does not depend on the number of threads.

use super::attention::AttnArgs;
use super::region::{CaptureRead, RegionEval};
use crate::attention::{Mask, RNode, Region};
use crate::attention_grad::RegionGrad;

/// The operands of one `attention_backward` node.
pub struct BackwardArgs<'a> {
    /// The forward's operands (q, k, v, c, start, captures) and sizes.
    pub fwd: AttnArgs<'a>,
    /// `out [B, H, T, Dv]`, `lse [B, H, T]`, `dout [B, H, T, Dv]`.
    pub out: &'a [f64],
    pub lse: &'a [f64],
    pub dout: &'a [f64],
    /// Which captures get a gradient (the float ones).
    pub float_captures: Vec<bool>,
}

/// The results, flat: dq `[B, H, Tq, D]`, dk `[B, H/G, Tk, D]`, dv `[B, H/G, Tk, Dv]`, dc
/// `[B, H, Tk]` when decay, and one gradient per float capture (shaped like it).
pub struct BackwardResult {
    pub dq: Vec<f64>,
    pub dk: Vec<f64>,
    pub dv: Vec<f64>,
    pub dc: Option<Vec<f64>>,
    pub dcaps: Vec<Vec<f64>>,
}

/// The outputs of one task (one batch, one kv head).
struct TaskOut {
    dq: Vec<f64>,
    dk: Vec<f64>,
    dv: Vec<f64>,
    dc: Vec<f64>,
    /// Per capture (empty for the ones without a gradient).
    dcaps: Vec<Vec<f64>>,
}

impl BackwardArgs<'_> {
    /// The first key of row `i` of head `bh` that pruning keeps: the rule of the forward
    /// (`start[m] * bn`, NaN or negative keeps everything, beyond the row keeps nothing).
    fn kstart(&self, bh: usize, i: usize) -> usize {
        let f = &self.fwd;
        match f.start {
            Some((st, bm, bn)) => {
                let mt = f.t.div_ceil(bm);
                let sm = st[bh * mt + i / bm];
                let sm = if sm.is_nan() || sm < 0.0 { 0.0 } else { sm };
                (sm * bn as f64).min(f.tk as f64) as usize
            }
            None => 0,
        }
    }

    /// Task `task` = b * (H / G) + kv head.
    fn task(&self, task: usize, grad: &RegionGrad) -> Result<TaskOut, String> {
        let f = &self.fwd;
        let (t, tk, d, dv, g) = (f.t, f.tk, f.d, f.dv, f.group);
        let offset = f.offset();
        let hk = f.h / g;
        let (bi, kh) = (task / hk, task % hk);
        let mut score = RegionEval::new(&f.attn.score, &f.captures, f.dim)?;
        let mut dx_eval = RegionEval::new(&grad.dx, &f.captures, f.dim)?;
        let mut mask = match &f.attn.mask {
            Mask::Expr(r) => Some(RegionEval::new(r, &f.captures, f.dim)?),
            _ => None,
        };
        // (capture number, its index expressions, the evaluator of d R / d(that read)).
        let mut cap_evals: Vec<(usize, CaptureRead, RegionEval)> = vec![];
        for (id, r) in &grad.captures {
            if let RNode::Capture { k, index } = &f.attn.score.nodes[*id as usize] {
                if self.float_captures.get(*k).copied().unwrap_or(false) {
                    cap_evals.push((
                        *k,
                        CaptureRead::new(index, f.dim),
                        RegionEval::new(r, &f.captures, f.dim)?,
                    ));
                }
            }
        }
        let mut out = TaskOut {
            dq: vec![0.0; g * t * d],
            dk: vec![0.0; tk * d],
            dv: vec![0.0; tk * dv],
            dc: vec![0.0; g * tk],
            dcaps: f
                .captures
                .iter()
                .zip(&self.float_captures)
                .map(|(c, &fl)| vec![0.0; if fl { c.data.len() } else { 0 }])
                .collect(),
        };
        let kvh = bi * hk + kh;
        let kr = |j: usize| &f.k[(kvh * tk + j) * d..(kvh * tk + j + 1) * d];
        let vr = |j: usize| &f.v[(kvh * tk + j) * dv..(kvh * tk + j + 1) * dv];
        for gi in 0..g {
            let hq = kh * g + gi;
            let bh = bi * f.h + hq;
            for i in 0..t {
                let lse = self.lse[bh * t + i];
                if lse == f64::NEG_INFINITY {
                    continue; // no kept entry: P = 0, no gradient
                }
                // The mask's key range of row i (as the forward: its key position p), then
                // pruning's first key.
                let p = i + offset;
                let (jlo, jhi) = match f.attn.mask {
                    Mask::Causal => (0, p + 1),
                    Mask::Window(w) => ((p + 1).saturating_sub(w as usize), p + 1),
                    Mask::None | Mask::Expr(_) => (0, tk),
                };
                let jlo = jlo.max(self.kstart(bh, i));
                let row = |w: usize| (bh * t + i) * w..(bh * t + i + 1) * w;
                let dout = &self.dout[row(dv)];
                let o = &self.out[row(dv)];
                let delta: f64 = dout.iter().zip(o).map(|(a, b)| a * b).sum();
                let qi = &f.q[(bh * t + i) * d..(bh * t + i + 1) * d];
                for j in jlo..jhi {
                    let at = [bi, hq, i, j];
                    if let Some(m) = mask.as_mut() {
                        if m.eval(0.0, at) == 0.0 {
                            continue;
                        }
                    }
                    let kj = kr(j);
                    let x = f.scale * qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f64>();
                    let bias = f.c.map_or(0.0, |c| c[bh * tk + p] - c[bh * tk + j]);
                    let prob = (score.eval(x, at) + bias - lse).exp();
                    let vj = vr(j);
                    let dp: f64 = dout.iter().zip(vj).map(|(a, b)| a * b).sum();
                    let ds = prob * (dp - delta);
                    for (acc, &go) in out.dv[j * dv..(j + 1) * dv].iter_mut().zip(dout) {
                        *acc += prob * go;
                    }
                    let dx = ds * dx_eval.eval(x, at);
                    for (acc, &kv) in out.dq[(gi * t + i) * d..(gi * t + i + 1) * d].iter_mut().zip(kj) {
                        *acc += f.scale * dx * kv;
                    }
                    for (acc, &qv) in out.dk[j * d..(j + 1) * d].iter_mut().zip(qi) {
                        *acc += f.scale * dx * qv;
                    }
                    out.dc[gi * tk + p] += ds;
                    out.dc[gi * tk + j] -= ds;
                    for (k, read, ev) in cap_evals.iter_mut() {
                        let local = ev.eval(x, at);
                        // A read outside the tensor evaluated to NaN in the forward: nothing to add.
                        if let Some(off) = read.offset(&f.captures[*k], at) {
                            out.dcaps[*k][off] += ds * local;
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// Every gradient of the node.
    pub fn run(&self) -> Result<BackwardResult, String> {
        let f = &self.fwd;
        let (b, h, g, t, tk, d, dv) = (f.b, f.h, f.group, f.t, f.tk, f.d, f.dv);
        if g == 0 || h % g != 0 {
            return Err(format!("kv_group {g} does not divide H = {h}"));
        }
        let hk = h / g;
        let tasks = b * hk;
        let grad: RegionGrad = Region::grad(&f.attn.score);
        let mut res = BackwardResult {
            dq: vec![0.0; b * h * t * d],
            dk: vec![0.0; tasks * tk * d],
            dv: vec![0.0; tasks * tk * dv],
            dc: f.c.map(|_| vec![0.0; b * h * tk]),
            dcaps: f
                .captures
                .iter()
                .zip(&self.float_captures)
                .filter(|(_, &fl)| fl)
                .map(|(c, _)| vec![0.0; c.data.len()])
                .collect(),
        };
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, tasks.max(1));
        // Waves of `threads` tasks; results are merged in task order.
        let mut next = 0;
        while next < tasks {
            let wave: Vec<usize> = (next..(next + threads).min(tasks)).collect();
            next += wave.len();
            let grad = &grad;
            let outs: Vec<Result<TaskOut, String>> = std::thread::scope(|sc| {
                let hs: Vec<_> = wave.iter().map(|&task| sc.spawn(move || self.task(task, grad))).collect();
                hs.into_iter()
                    .map(|hd| hd.join().unwrap_or_else(|_| Err("a backward worker panicked".into())))
                    .collect()
            });
            for (&task, o) in wave.iter().zip(outs) {
                let o = o?;
                let (bi, kh) = (task / hk, task % hk);
                let h0 = bi * h + kh * g;
                res.dq[h0 * t * d..(h0 + g) * t * d].copy_from_slice(&o.dq);
                res.dk[task * tk * d..(task + 1) * tk * d].copy_from_slice(&o.dk);
                res.dv[task * tk * dv..(task + 1) * tk * dv].copy_from_slice(&o.dv);
                if let Some(dc) = res.dc.as_mut() {
                    dc[h0 * tk..(h0 + g) * tk].copy_from_slice(&o.dc);
                }
                let mut fl = 0;
                for (k, &float) in self.float_captures.iter().enumerate() {
                    if float {
                        for (acc, x) in res.dcaps[fl].iter_mut().zip(&o.dcaps[k]) {
                            *acc += x;
                        }
                        fl += 1;
                    }
                }
            }
        }
        Ok(res)
    }
}

impl super::Evaluator<'_> {
    /// Every result of `attention_backward` node `id`, in result order.
    pub(super) fn attention_backward_node(
        &mut self,
        id: crate::graph::ValueId,
    ) -> Result<Vec<super::Val>, super::InterpError> {
        use crate::attention::AttnOperands;
        use std::rc::Rc;
        let g = self.g;
        let crate::ops::Op::AttentionBackward(a) = g.op(id) else {
            return Err(self.err(id, "not attention_backward"));
        };
        let vals = g.operand_values(id);
        if vals.len() < a.fixed_operands() + 3 {
            return Err(self.err(id, "too few operands"));
        }
        let (fwd_vals, rest) = vals.split_at(vals.len() - 3);
        let fwd_ids: Vec<_> = fwd_vals.iter().map(|v| v.node).collect();
        let o = AttnOperands::from_positional(a, &fwd_ids).map_err(|e| self.err(id, e))?;
        let float_captures: Vec<bool> = o.captures.iter().map(|&c| g.ty(c).dtype.is_float()).collect();
        let out = self.value(rest[0], id)?;
        let lse = self.value(rest[1], id)?;
        let dout = self.value(rest[2], id)?;
        let r = self.with_attn_args(id, a, &o, |fwd| {
            let (b, h, t, dv) = (fwd.b, fwd.h, fwd.t, fwd.dv);
            if out.shape != [b, h, t, dv] || dout.shape != [b, h, t, dv] || lse.shape != [b, h, t] {
                return Err(self.err(
                    id,
                    format!(
                        "out {:?}, lse {:?}, dout {:?} do not fit [B, H, T, Dv] = {:?}",
                        out.shape,
                        lse.shape,
                        dout.shape,
                        [b, h, t, dv]
                    ),
                ));
            }
            let args = BackwardArgs { fwd, out: &out.data, lse: &lse.data, dout: &dout.data, float_captures };
            args.run().map_err(|e| self.err(id, e))
        })?;
        let mut results = vec![r.dq, r.dk, r.dv];
        results.extend(r.dc);
        results.extend(r.dcaps);
        let tys = g.result_types(id);
        if tys.len() != results.len() {
            return Err(self.err(id, format!("{} result types for {} results", tys.len(), results.len())));
        }
        let mut vals_out = vec![];
        for (ty, mut data) in tys.into_iter().zip(results) {
            // A result narrower than f32 (`grad_dtype`) is rounded as a `cast` rounds.
            if ty.dtype != crate::types::DType::F32 {
                data.iter_mut().for_each(|x| *x = super::cast(ty.dtype, *x));
            }
            let shape = crate::shapes::concrete_shape(ty, &self.dims)?;
            if shape.iter().product::<usize>() != data.len() {
                return Err(self.err(id, format!("a result of shape {shape:?} got {} values", data.len())));
            }
            let axes = ty.axes.iter().map(|x| x.name.clone()).collect();
            vals_out.push(super::Val { axes, shape, data: Rc::new(data) });
        }
        Ok(vals_out)
    }
}
