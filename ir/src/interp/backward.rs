//! `attention_backward` in f64: dense loops over the forward's kept set (docs/SEMANTICS.md,
//! "attention_backward"). This is THE reference of the backward: every kernel is checked
//! against it, and it is checked against finite differences of the forward.
//!
//! Work is split over (batch, kv head): one task owns the `kv_group` query heads that share a
//! kv head, so `dk`/`dv` of that kv head are summed in one fixed order (query heads ascending,
//! rows ascending) by one thread. Capture gradients, which several tasks may touch, are summed
//! per task and then added in task order: the result does not depend on the number of threads.

use super::binary;
use crate::attention::{Attention, IndexVar, Mask, RNode, Region};
use crate::attention_grad::RegionGrad;
use crate::index::IndexExpr;
use crate::types::Dim;

/// A captured tensor: its concrete shape and data.
pub struct CaptureIn<'a> {
    pub shape: Vec<usize>,
    pub data: &'a [f64],
    /// Whether a gradient is wanted (float captures).
    pub float: bool,
}

/// The operands of one `attention_backward` node, as flat head-first slices.
pub struct BackwardArgs<'a> {
    pub attn: &'a Attention,
    pub scale: f64,
    pub b: usize,
    /// Query heads.
    pub h: usize,
    /// Query heads per kv head.
    pub group: usize,
    pub t: usize,
    pub d: usize,
    pub dv: usize,
    pub q: &'a [f64],
    pub k: &'a [f64],
    pub v: &'a [f64],
    pub c: Option<&'a [f64]>,
    /// `start [B, H, ceil(T / bm)]` of a pruned attention (derived by the block_boundary rule
    /// when the boundary is fused), with `bm`, `bn`.
    pub start: Option<(&'a [f64], usize, usize)>,
    pub out: &'a [f64],
    pub lse: &'a [f64],
    pub dout: &'a [f64],
    pub captures: Vec<CaptureIn<'a>>,
    pub dim: &'a (dyn Fn(&Dim) -> Option<u64> + Sync),
}

/// The results, flat: dq `[B, H, T, D]`, dk `[B, H/G, T, D]`, dv `[B, H/G, T, Dv]`, dc
/// `[B, H, T]` when decay, and one gradient per float capture (shaped like it).
pub struct BackwardResult {
    pub dq: Vec<f64>,
    pub dk: Vec<f64>,
    pub dv: Vec<f64>,
    pub dc: Option<Vec<f64>>,
    pub dcaps: Vec<Vec<f64>>,
}

/// Per-entry evaluation of the regions, with a reusable scratch buffer.
struct Regions<'a> {
    args: &'a BackwardArgs<'a>,
    score: &'a Region,
    grad: RegionGrad,
    mask: Option<&'a Region>,
    buf: Vec<f64>,
}

impl Regions<'_> {
    /// The linear index of capture `k` read at `index` for entry `vars`.
    fn capture_at(&self, k: usize, index: &[IndexExpr], vars: [i64; 4]) -> Result<usize, String> {
        let cap = self.args.captures.get(k).ok_or_else(|| format!("capture {k} is not an operand"))?;
        if index.len() != cap.shape.len() {
            return Err(format!("capture {k} read with {} subscripts, has rank {}", index.len(), cap.shape.len()));
        }
        let var = |v: &str| IndexVar::from_name(v).map(|iv| vars[iv as usize]);
        let dim = |d: &Dim| (self.args.dim)(d);
        let mut lin = 0usize;
        for (e, &n) in index.iter().zip(&cap.shape) {
            let x = crate::attention::eval_index(e, &var, &dim)
                .ok_or_else(|| format!("capture {k}: index {} cannot be evaluated", crate::attention::fmt_index(e)))?;
            if x < 0 || x as usize >= n {
                return Err(format!("capture {k}: index {x} out of bounds (size {n}) at (b, h, i, j) = {vars:?}"));
            }
            lin = lin * n + x as usize;
        }
        Ok(lin)
    }

    /// Evaluate `r` at entry `vars` with score `x` into `self.buf`; returns the root's value.
    fn eval(&mut self, which: Which, x: f64, vars: [i64; 4]) -> Result<f64, String> {
        let r: &Region = match which {
            Which::Score => self.score,
            Which::Dx => &self.grad.dx,
            Which::Cap(n) => &self.grad.captures[n].1,
            Which::Mask => self.mask.expect("mask region"),
        };
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        for node in &r.nodes {
            let v = match node {
                RNode::Score => x,
                RNode::Index(iv) => vars[*iv as usize] as f64,
                RNode::Dim(d) => (self.args.dim)(d).ok_or_else(|| format!("dim {d} is not bound"))? as f64,
                RNode::Const(c) => *c,
                RNode::Capture { k, index } => self.args.captures[*k].data[self.capture_at(*k, index, vars)?],
                RNode::Unary(u, a) => super::unary(*u, buf[*a as usize]),
                RNode::Binary(op, a, b) => binary(*op, buf[*a as usize], buf[*b as usize]),
                RNode::Select(c, a, b) => {
                    if buf[*c as usize] != 0.0 {
                        buf[*a as usize]
                    } else {
                        buf[*b as usize]
                    }
                }
            };
            buf.push(v);
        }
        let v = buf[r.root as usize];
        self.buf = buf;
        Ok(v)
    }
}

#[derive(Clone, Copy)]
enum Which {
    Score,
    Dx,
    Cap(usize),
    Mask,
}

/// The outputs of one task (one batch, one kv head).
struct TaskOut {
    dq: Vec<f64>,
    dk: Vec<f64>,
    dv: Vec<f64>,
    dc: Vec<f64>,
    dcaps: Vec<Vec<f64>>,
}

impl BackwardArgs<'_> {
    /// Whether `(i, j)` of head `bh` is in the forward's kept set K(i).
    fn kept(&self, regions: &mut Regions, bh: usize, i: usize, j: usize) -> Result<bool, String> {
        let in_mask = match &self.attn.mask {
            Mask::None => true,
            Mask::Causal => j <= i,
            Mask::Window(w) => j <= i && ((i - j) as u64) < *w,
            Mask::Expr(_) => {
                let vars = [(bh / self.h) as i64, (bh % self.h) as i64, i as i64, j as i64];
                regions.eval(Which::Mask, 0.0, vars)? != 0.0
            }
        };
        if !in_mask {
            return Ok(false);
        }
        Ok(match self.start {
            None => true,
            Some((st, bm, bn)) => {
                let mt = self.t.div_ceil(bm);
                let sm = st[bh * mt + i / bm];
                // As the forward: NaN or negative keeps everything.
                let sm = if sm.is_nan() || sm < 0.0 { 0.0 } else { sm };
                (j as f64) >= sm * bn as f64
            }
        })
    }

    /// Task `task` = b * (H / G) + kv head.
    fn task(&self, task: usize) -> Result<TaskOut, String> {
        let (t, d, dv, g) = (self.t, self.d, self.dv, self.group);
        let hk = self.h / g;
        let (bi, kh) = (task / hk, task % hk);
        let mut regions = Regions {
            args: self,
            score: &self.attn.score,
            grad: self.attn.score.grad(),
            mask: match &self.attn.mask {
                Mask::Expr(r) => Some(r),
                _ => None,
            },
            buf: Vec::new(),
        };
        let cap_nodes: Vec<(usize, usize)> = regions
            .grad
            .captures
            .iter()
            .enumerate()
            .filter_map(|(n, (id, _))| match &self.attn.score.nodes[*id as usize] {
                RNode::Capture { k, .. } if self.captures[*k].float => Some((n, *k)),
                _ => None,
            })
            .collect();
        let mut out = TaskOut {
            dq: vec![0.0; g * t * d],
            dk: vec![0.0; t * d],
            dv: vec![0.0; t * dv],
            dc: vec![0.0; g * t],
            dcaps: self.captures.iter().map(|c| vec![0.0; if c.float { c.data.len() } else { 0 }]).collect(),
        };
        let kvh = bi * hk + kh;
        let kr = |j: usize| &self.k[(kvh * t + j) * d..(kvh * t + j + 1) * d];
        let vr = |j: usize| &self.v[(kvh * t + j) * dv..(kvh * t + j + 1) * dv];
        for gi in 0..g {
            let hq = kh * g + gi;
            let bh = bi * self.h + hq;
            let qr = |i: usize| &self.q[(bh * t + i) * d..(bh * t + i + 1) * d];
            for i in 0..t {
                let lse = self.lse[bh * t + i];
                if lse == f64::NEG_INFINITY {
                    continue; // empty row: P = 0, no gradient
                }
                let dout = &self.dout[(bh * t + i) * dv..(bh * t + i + 1) * dv];
                let o = &self.out[(bh * t + i) * dv..(bh * t + i + 1) * dv];
                let delta: f64 = dout.iter().zip(o).map(|(a, b)| a * b).sum();
                let qi = qr(i);
                for j in 0..t {
                    if !self.kept(&mut regions, bh, i, j)? {
                        continue;
                    }
                    let kj = kr(j);
                    let x = self.scale * qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f64>();
                    let vars = [bi as i64, hq as i64, i as i64, j as i64];
                    let bias = self.c.map_or(0.0, |c| c[bh * t + i] - c[bh * t + j]);
                    let e = regions.eval(Which::Score, x, vars)? + bias;
                    let p = (e - lse).exp();
                    let vj = vr(j);
                    let dp: f64 = dout.iter().zip(vj).map(|(a, b)| a * b).sum();
                    let ds = p * (dp - delta);
                    for (acc, &go) in out.dv[j * dv..(j + 1) * dv].iter_mut().zip(dout) {
                        *acc += p * go;
                    }
                    let dx = ds * regions.eval(Which::Dx, x, vars)?;
                    for (acc, &kv) in out.dq[(gi * t + i) * d..(gi * t + i + 1) * d].iter_mut().zip(kj) {
                        *acc += self.scale * dx * kv;
                    }
                    for (acc, &qv) in out.dk[j * d..(j + 1) * d].iter_mut().zip(qi) {
                        *acc += self.scale * dx * qv;
                    }
                    out.dc[gi * t + i] += ds;
                    out.dc[gi * t + j] -= ds;
                    for &(n, k) in &cap_nodes {
                        let local = regions.eval(Which::Cap(n), x, vars)?;
                        let id = regions.grad.captures[n].0;
                        let RNode::Capture { index, .. } = &self.attn.score.nodes[id as usize] else {
                            unreachable!("capture node")
                        };
                        let at = regions.capture_at(k, index, vars)?;
                        out.dcaps[k][at] += ds * local;
                    }
                }
            }
        }
        Ok(out)
    }
}

/// The backward of one attention node.
pub fn attention_backward(a: &BackwardArgs) -> Result<BackwardResult, String> {
    let (b, h, g, t, d, dv) = (a.b, a.h, a.group, a.t, a.d, a.dv);
    if g == 0 || h % g != 0 {
        return Err(format!("kv_group {g} does not divide H = {h}"));
    }
    let hk = h / g;
    let tasks = b * hk;
    let mut res = BackwardResult {
        dq: vec![0.0; b * h * t * d],
        dk: vec![0.0; tasks * t * d],
        dv: vec![0.0; tasks * t * dv],
        dc: a.c.map(|_| vec![0.0; b * h * t]),
        dcaps: a.captures.iter().filter(|c| c.float).map(|c| vec![0.0; c.data.len()]).collect(),
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, tasks.max(1));
    // Waves of `threads` tasks; results are merged in task order.
    let mut next = 0;
    while next < tasks {
        let wave: Vec<usize> = (next..(next + threads).min(tasks)).collect();
        next += wave.len();
        let outs: Vec<Result<TaskOut, String>> = std::thread::scope(|sc| {
            let hs: Vec<_> = wave.iter().map(|&tk| sc.spawn(move || a.task(tk))).collect();
            hs.into_iter().map(|hd| hd.join().unwrap_or_else(|_| Err("backward task panicked".into()))).collect()
        });
        for (&tk, o) in wave.iter().zip(outs) {
            let o = o?;
            let (bi, kh) = (tk / hk, tk % hk);
            let h0 = bi * h + kh * g;
            res.dq[h0 * t * d..(h0 + g) * t * d].copy_from_slice(&o.dq);
            res.dk[tk * t * d..(tk + 1) * t * d].copy_from_slice(&o.dk);
            res.dv[tk * t * dv..(tk + 1) * t * dv].copy_from_slice(&o.dv);
            if let Some(dc) = res.dc.as_mut() {
                dc[h0 * t..(h0 + g) * t].copy_from_slice(&o.dc);
            }
            let mut fl = 0;
            for (k, cap) in a.captures.iter().enumerate() {
                if cap.float {
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
