//! Lowering of `attention_backward` (docs/SEMANTICS.md) onto the backward kernels
//! ([`super::attention_bwd`]): three launches, `pre` (D = rowsum(dout out)), `dq` (dq, the
//! row sums of dS into dc, the start scratch) and `dkv` (dk, dv, dc -= column sums). Masks as
//! the forward's: causal, window, none or an expression mask (every tile visited, the
//! condition per element). Refused: captured tensors (the backward has no parameters for them
//! yet, nor their gradients), a separate `block_boundary`, a decay pair. A head dim above
//! [`attention_bwd::BWD_PART_DIM`] runs `d_parts` blocks per tile and head (grid y).

use super::attention::params::{BwdTailParam, DkvParams, DqParams};
use super::attention::region::{RegionMod, ScoreArg};
use super::attention_bwd::{
    self, BwdConfig, BwdKernel, CaptureRead, Regions, DQ_ROWS, FIRST_BWD_PARAM, PRE_ROWS,
};
use super::builder::Half;
use super::module::{user, Assembler};
use super::{CodegenError, GridDim, KernelArg, Launch};
use foxc_ir::attention::{AttnOperands, RId, RNode, Region};
use foxc_ir::index::IndexExpr;
use foxc_ir::{Attention, DType, Dim, Prune, Value, ValueId};

/// The buffers (assembler buffer numbers) the backward's kernels read and write.
#[derive(Clone, Debug)]
struct BwdBuffers {
    q: usize,
    k: usize,
    v: usize,
    c: usize,
    delta: usize,
    dout: usize,
    out: usize,
    lse: usize,
    dq: usize,
    dk: usize,
    dv: usize,
    dc: usize,
    dd: usize,
    start: usize,
    /// The captured tensors' gradients.
    caps: Vec<usize>,
}

impl<'a, 'ctx> Assembler<'a, 'ctx> {
    /// The launches of `attention_backward` node `n` (its result buffers exist already).
    pub(super) fn attention_backward(&mut self, n: ValueId, a: &Attention) -> Result<(), CodegenError> {
        let g = self.g;
        let vals = g.operand_values(n);
        if vals.len() < a.fixed_operands() + 3 {
            return Err(CodegenError::Internal(format!(
                "attention_backward %{} has too few operands",
                n.index()
            )));
        }
        let (fwd, rest) = vals.split_at(vals.len() - 3);
        let fwd_ids: Vec<ValueId> = fwd.iter().map(|v| v.node).collect();
        let o = AttnOperands::from_positional(a, &fwd_ids).map_err(CodegenError::Internal)?;
        let (out, lse, dout) = (rest[0], rest[1], rest[2]);
        let (window, causal, mask) = super::module_attention::mask_parts(&a.mask)?;
        if a.prune == Prune::Start {
            return Err(Self::not_yet(n, "a separate block_boundary (the fuse-boundary pass did not apply)"));
        }
        let tiles = a.tiles.ok_or_else(|| {
            CodegenError::Internal("attention_backward without tiles (the tiles pass did not run)".into())
        })?;
        let (bh, t, dd) = self.bhtd(o.q, "attention_backward's q")?;
        // Keys of their own length: the queries sit at the end of them (the kernels' `Tk`).
        let (bhk, tk, _) = self.bhtd(o.k, "attention_backward's k")?;
        let half = self.kernel_half(&[o.q, o.k, o.v]);
        let cfg = BwdConfig {
            head_dim: self.static_dim(&dd, "the head dimension")?,
            bm: tiles.bm,
            bn: tiles.bn,
            scale: self.scale_value(&a.scale)? as f32,
            has_decay: a.decay,
            window,
            causal,
            prune: a.prune == Prune::Boundary,
            key_bound: a.keys_from.is_some(),
            sm: self.spec.target.sm(),
            kv_group: self.static_dim(&a.kv_group, "the query heads per key/value head")?,
            dtype: half,
            fewer_queries: tk != t,
            grads: Half::of(a.grad_dtype),
        };
        cfg.validate().map_err(|e| Self::not_yet(n, &e))?;
        if o.decay_lo.is_some() {
            // The compensate-decay pass gives the pair to the CPU target only.
            return Err(Self::not_yet(n, "a decay pair (c, c_lo)"));
        }
        // The region and its derivative, specialized like the forward's.
        let heads = self.bound_heads(o.q);
        let dim = |d: &Dim| d.eval(&|s| self.spec.dims.get(s).copied());
        // Captured tensors: read by the regions through kernel parameters after the fixed
        // ones (as the forward's score hook reads them).
        let caps = self.capture_tys(&o.captures);
        // The key bound rides on the score region as the forward's does (`cfg.key_bound`).
        let score = RegionMod::with_mask(&a.score, mask, a.keys_from.as_ref(), &dim, heads, &caps)
            .map_err(|e| Self::not_yet(n, &e))?
            .with_first_param(FIRST_BWD_PARAM);
        let grad = a.score.grad();
        let dx = if a.score.is_identity() {
            None
        } else {
            Some(RegionMod::sharing_params(&grad.dx, &score, &dim, &caps).map_err(|e| Self::not_yet(n, &e))?)
        };
        let (cap_reads, grad_caps) = self.capture_reads(n, a, &o.captures, &grad.captures, (&bh, &t))?;
        if cfg.fewer_queries && !grad_caps.is_empty() {
            // The kernels sum a capture's gradient per query row or per key of a square head.
            return Err(Self::not_yet(n, "gradients of captured tensors with queries fewer than keys"));
        }
        let locals: Vec<RegionMod> = cap_reads
            .iter()
            .map(|(_, _, r)| RegionMod::sharing_params(r, &score, &dim, &caps))
            .collect::<Result<_, _>>()
            .map_err(|e| Self::not_yet(n, &e))?;
        let reads = cap_reads
            .iter()
            .zip(&locals)
            .map(|(&(by_key, slot, _), local)| CaptureRead { by_key, local, slot })
            .collect();
        let regions = Regions::new(&score, dx.as_ref(), reads, grad_caps.len());

        let bufs = self.bwd_buffers(n, a, &o, [out, lse, dout], (&bh, &t), grad_caps.len(), &cfg)?;
        let build = |kind: BwdKernel| -> Result<String, CodegenError> {
            let f = attention_bwd::build_bwd_kernel(self.ctx, self.module, &cfg, kind, &regions)
                .map_err(CodegenError::Internal)?;
            Ok(f.get_name().to_string_lossy().into_owned())
        };
        let names = [build(BwdKernel::Pre)?, build(BwdKernel::Dq)?, build(BwdKernel::Dkv)?];
        // After T: the regions' arguments (head count, captures and their sizes), then the tail:
        // the captured tensors' gradients (results after dc) and `Tk`.
        let mut extra = vec![];
        for arg in score.args() {
            extra.push(match *arg {
                ScoreArg::Heads => KernelArg::I32(vec![bh[1].clone()]),
                ScoreArg::Capture(k) => KernelArg::Buffer(self.buf(Value::of(o.captures[k]))?),
                ScoreArg::CaptureDim(k, ax) => {
                    KernelArg::I32(self.ty(o.captures[k]).dims().nth(ax).cloned().into_iter().collect())
                }
                ScoreArg::Dim(n) => KernelArg::I32(score.dim_arg(n).cloned().into_iter().collect()),
            });
        }
        extra.extend(regions.tail(cfg.fewer_queries).params().iter().map(|p| match *p {
            BwdTailParam::Grad(s) => KernelArg::Buffer(bufs.caps[s]),
            BwdTailParam::Tk => KernelArg::I32(vec![tk.clone()]),
        }));
        self.push_bwd_launches(n, &cfg, names, &bufs, extra, [bh, bhk], [t, tk]);
        Ok(())
    }

    /// The backward's buffers: q, k, v, dout in the kernels' 16-bit type and out in f32 (cast
    /// copies of other dtypes first), lse, c and delta (or a stand-in that is not read), the
    /// results, and the scratch of `rowsum(dout * out)` and of the first key tile per query tile.
    #[allow(clippy::too_many_arguments)]
    fn bwd_buffers(
        &mut self,
        n: ValueId,
        a: &Attention,
        o: &AttnOperands,
        [out, lse, dout]: [Value; 3],
        (bh, t): (&[Dim], &Dim),
        grad_caps: usize,
        cfg: &BwdConfig,
    ) -> Result<BwdBuffers, CodegenError> {
        let (uses_start, bm, half) = (cfg.uses_start(), cfg.bm, cfg.dtype.dtype());
        let mut conv = |v: Value, to: DType, what: &str| -> Result<usize, CodegenError> {
            let b = self.buf(v)?;
            let ty = self.g.result_ty(v.node, v.result).ok_or_else(|| {
                CodegenError::Internal(format!("attention_backward operand %{} has no type", v.node.index()))
            })?;
            if ty.dtype == to {
                return Ok(b);
            }
            let shape: Vec<Dim> = ty.dims().cloned().collect();
            let s = self.scratch(to, shape, format!("{to} copy of {what} of %{}", n.index()));
            let name = self.name(n, &format!("bwd_{what}_to_{to}"));
            self.cast(n, name, v.node, b, s, to, None)?;
            Ok(s)
        };
        let q = conv(Value::of(o.q), half, "q")?;
        let k = conv(Value::of(o.k), half, "k")?;
        let v = conv(Value::of(o.v), half, "v")?;
        let dout = conv(dout, half, "dout")?;
        let out = conv(out, DType::F32, "out")?;
        let lse = self.buf(lse)?;
        if let Some(c) = o.decay {
            if self.ty(c).dtype != DType::F32 {
                return Err(user(format!("the gate cumsum c must be f32, got {}", self.ty(c).dtype)));
            }
        }
        let c = match o.decay {
            Some(c) => self.buf(c)?,
            None => q, // not read
        };
        let delta = match o.delta {
            Some(d) => self.buf(d)?,
            None => c, // not read
        };
        let res = |r: u32| self.buf(Value { node: n, result: r });
        let (dq, dk, dv) = (res(0)?, res(1)?, res(2)?);
        let dc = if a.decay { res(3)? } else { dq }; // not touched without decay
                                                     // The captured tensors' gradients: the results after dc.
        let first_grad = 3 + u32::from(a.decay);
        let cap_bufs: Vec<usize> =
            (0..grad_caps as u32).map(|s| res(first_grad + s)).collect::<Result<_, _>>()?;

        let bht: Vec<Dim> = bh.iter().cloned().chain([t.clone()]).collect();
        let dd_buf = self.scratch(DType::F32, bht.clone(), format!("rowsum(dout * out) of %{}", n.index()));
        let start = if uses_start {
            let shape = bh.iter().cloned().chain([Dim::Tiles(Box::new(t.clone()), bm)]).collect();
            self.scratch(DType::I32, shape, format!("start of each query tile of %{}", n.index()))
        } else {
            dd_buf // not read
        };

        Ok(BwdBuffers {
            q,
            k,
            v,
            c,
            delta,
            dout,
            out,
            lse,
            dq,
            dk,
            dv,
            dc,
            dd: dd_buf,
            start,
            caps: cap_bufs,
        })
    }

    /// The three launches: the row sums `D = rowsum(dout * out)`, then the dq kernel (query
    /// tiles), then the dkv kernel (key tiles), each with the regions' arguments and the tail `extra`
    /// after T.
    #[allow(clippy::too_many_arguments)]
    fn push_bwd_launches(
        &mut self,
        n: ValueId,
        cfg: &BwdConfig,
        [pre, dqk, dkvk]: [String; 3],
        bufs: &BwdBuffers,
        extra: Vec<KernelArg>,
        [bh, bhk]: [Vec<Dim>; 2],
        [t, tk]: [Dim; 2],
    ) {
        let BwdBuffers { q, k, v, c, delta, dout, out, lse, dq, dk, dv, dc, dd: dd_buf, start, .. } = *bufs;
        let bht: Vec<Dim> = bh.iter().cloned().chain([t.clone()]).collect();
        // Grid y: the heads, times the head-dim parts when the head dim is split.
        let parts = cfg.d_parts();
        let with_parts = |heads: Vec<Dim>| -> Vec<Dim> {
            if parts == 1 {
                heads
            } else {
                heads.into_iter().chain([Dim::Const(parts as u64)]).collect()
            }
        };
        let buf = KernelArg::Buffer;
        let t_arg = KernelArg::I32(vec![t.clone()]);
        self.push(
            n,
            pre,
            vec![buf(out), buf(dout), buf(dd_buf), KernelArg::I32(bht.clone())],
            Launch::Grid { x: GridDim::Ceil(bht, PRE_ROWS), y: GridDim::Const(1), block: PRE_ROWS * 32 },
            vec![],
        );
        self.push(
            n,
            dqk,
            DqParams {
                q: buf(q),
                k: buf(k),
                v: buf(v),
                c: buf(c),
                delta: buf(delta),
                dout: buf(dout),
                lse: buf(lse),
                dd: buf(dd_buf),
                dq: buf(dq),
                dc: buf(dc),
                start: buf(start),
                t: t_arg.clone(),
            }
            .into_vec()
            .into_iter()
            .chain(extra.iter().cloned())
            .collect(),
            Launch::GridShared {
                x: GridDim::Ceil(vec![t.clone()], DQ_ROWS),
                y: GridDim::Ceil(with_parts(bh), 1),
                block: cfg.dq_threads(),
                shared: cfg.dq_shared_bytes(),
            },
            vec![],
        );
        self.push(
            n,
            dkvk,
            DkvParams {
                q: buf(q),
                k: buf(k),
                v: buf(v),
                c: buf(c),
                dout: buf(dout),
                lse: buf(lse),
                dd: buf(dd_buf),
                start: buf(start),
                dk: buf(dk),
                dv: buf(dv),
                dc: buf(dc),
                t: t_arg,
            }
            .into_vec()
            .into_iter()
            .chain(extra)
            .collect(),
            Launch::GridShared {
                x: GridDim::Ceil(vec![tk], cfg.bn),
                y: GridDim::Ceil(with_parts(bhk), 1),
                block: cfg.dkv_threads(),
                shared: cfg.dkv_shared_bytes(),
            },
            vec![],
        );
    }

    /// The captured tensors' reads whose gradients the kernels sum, from the region's
    /// derivatives `reads` (capture node of the score region, `dR/d(read)`): `(by_key, slot,
    /// dR/d(read))` for each read of a float capture, and the float captures (gradient slots, in
    /// capture order). The kernels own a gradient entry per (batch-head, row) in the dq kernel
    /// and per (batch-head, key) in the dkv kernel, so a float capture must be shaped like the
    /// rows, `[B, H, T]`, and every read of it be `x[b, h, i]` (row sums) or `x[b, h, j]`
    /// (column sums); other forms (`rel[h, i - j]`, `kb[h, j]`, a float tensor read only by
    /// the mask at another shape) are refused with that said.
    #[allow(clippy::type_complexity)]
    fn capture_reads(
        &self,
        n: ValueId,
        a: &Attention,
        captures: &[ValueId],
        reads: &[(RId, Region)],
        (bh, t): (&[Dim], &Dim),
    ) -> Result<(Vec<(bool, usize, Region)>, Vec<usize>), CodegenError> {
        let grads: Vec<usize> =
            (0..captures.len()).filter(|&k| self.ty(captures[k]).dtype.is_float()).collect();
        let same = |x: &Dim, y: &Dim| {
            let ev = |d: &Dim| d.eval(&|s| self.spec.dims.get(s).copied());
            x == y || ev(x).is_some_and(|v| Some(v) == ev(y))
        };
        let rows: Vec<&Dim> = bh.iter().chain([t]).collect();
        for &k in &grads {
            let dims: Vec<&Dim> = self.ty(captures[k]).dims().collect();
            if dims.len() != rows.len() || dims.iter().zip(&rows).any(|(x, y)| !same(x, y)) {
                return Err(Self::not_yet(
                    n,
                    &format!(
                        "the gradient of captured tensor %{} shaped [{}] (the GPU backward computes those shaped [B, H, T] only, read as x[b, h, i] or x[b, h, j])",
                        captures[k].index(),
                        dims.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")
                    ),
                ));
            }
        }
        let (vb, vh) = (IndexExpr::var("b"), IndexExpr::var("h"));
        let mut out = vec![];
        for (rid, local) in reads {
            let Some(RNode::Capture { k, index }) = a.score.nodes.get(*rid as usize) else {
                return Err(CodegenError::Internal(format!(
                    "capture derivative of node {rid}, not a capture"
                )));
            };
            let Some(slot) = grads.iter().position(|g| g == k) else { continue };
            let by_key = match index.as_slice() {
                [b, h, x] if *b == vb && *h == vh && *x == IndexExpr::var("i") => false,
                [b, h, x] if *b == vb && *h == vh && *x == IndexExpr::var("j") => true,
                _ => {
                    return Err(Self::not_yet(
                        n,
                        &format!(
                            "the gradient of a captured tensor read at [{}] (the GPU backward sums those read as x[b, h, i] or x[b, h, j] only)",
                            index.iter().map(|e| e.to_string()).collect::<Vec<_>>().join(", ")
                        ),
                    ))
                }
            };
            out.push((by_key, slot, local.clone()));
        }
        Ok((out, grads))
    }
}
