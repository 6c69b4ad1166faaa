//! Lowering of `attention` onto the flash-attention kernel: a score region, captured tensors
//! included (emitted by the kernel's score hook; captures and their sizes are kernel arguments
//! after `T`), causal, window, no mask or an expression mask (its condition compiled per element
//! by the same hook), grouped-query heads with a static group, dense or with the boundary fused
//! (`delta` operand); with the `split_keys` kernel attribute, a second launch merging the
//! partials of the key slices.

use super::attention::params::{FwdParams, FwdTail, Tail};
use super::attention::region::RegionMod;
use super::attention::{self, AttnKernelConfig};
use super::attention_ws;
use super::builder::Half;
use super::module::{build_attention, user, Assembler};
use super::{CodegenError, GridDim, KernelArg, Launch};
use foxc_ir::attention::{AttnOperands, KvLoads, WsGrid, WsTurns};
use foxc_ir::{Attention, DType, Dim, Mask, Prune, Region, Value, ValueId};

/// The sizes an attention launch is built from (q after its scale is folded into the kernel).
struct Geometry {
    /// The q operand the kernel reads.
    q: ValueId,
    /// `[B, H]` of q.
    bh: Vec<Dim>,
    /// Query rows.
    t: Dim,
    /// Keys (`t` or more: the queries sit at the end of them).
    tk: Dim,
    /// The head dim, and its bound value.
    dd: Dim,
    d: u32,
}

/// The buffers the forward kernel reads and writes.
struct KernelBuffers {
    qkv: [usize; 3],
    c: usize,
    delta: usize,
    out: usize,
    lse: usize,
}

impl<'a, 'ctx> Assembler<'a, 'ctx> {
    pub(super) fn attention(&mut self, n: ValueId, res: usize, a: &Attention) -> Result<(), CodegenError> {
        let o = Attention::operands(self.g, n).map_err(CodegenError::Internal)?;
        let (geo, cfg, mask) = self.attention_config(n, a, &o)?;
        // Keys per split block (the partial planes are `ceil(Tk / keys)`).
        let split_keys = cfg.split_tiles.map(|s| s * cfg.bn);
        // Split keys: the merge launch writes the output, so it applies the epilogue; the
        // partials are of the attention alone.
        let (kernel_epilogue, merge_epilogue) = match split_keys {
            Some(_) => (None, a.epilogue.as_ref()),
            None => (a.epilogue.as_ref(), None),
        };
        let q_map = self.load_map(geo.q);
        let score = self.score_region(n, a, &o, (mask, kernel_epilogue), &geo)?;
        // A q loaded through its map: the kernel reads the map's x where it would read q.
        let q_read = q_map.as_ref().map_or(geo.q, |m| m.x);
        let qkv = self.half_operands(n, [q_read, o.k, o.v], cfg.dtype_in)?;
        if let Some(c) = o.decay {
            if self.ty(c).dtype != DType::F32 {
                return Err(user(format!("the gate cumsum c must be f32, got {}", self.ty(c).dtype)));
            }
        }
        let delta = match o.delta {
            Some(dl) => Some(self.buf(dl)?),
            None => None,
        };
        let name =
            build_attention(self.ctx, self.module, &cfg, &score)?.get_name().to_string_lossy().into_owned();
        // Result 1, f32 [B, H, T]: the kernel writes it on every run.
        let lse = self.buf(Value { node: n, result: Attention::LSE })?;
        // Split keys: the kernel writes its partials to scratch planes [Z, B, H, T, ...]. An
        // output dtype the kernel does not write (f16 from bf16 operands, or the reverse): f32
        // into a scratch, cast after.
        let partials = split_keys.map(|keys| self.split_partials(n, keys, &geo));
        let recast = (partials.is_none() && !cfg.out_half && a.out_dtype != DType::F32).then(|| {
            let shape: Vec<Dim> = self.ty(n).dims().cloned().collect();
            (self.scratch(DType::F32, shape.clone(), format!("f32 output of %{}", n.index())), shape)
        });
        let (out, lse_out) = partials.unwrap_or((recast.as_ref().map_or(res, |r| r.0), lse));
        // Unused pointer parameters get any valid buffer (the kernel does not read them).
        let c = match o.decay {
            Some(c) => self.buf(c)?,
            None => qkv[0],
        };
        let bufs = KernelBuffers { qkv, c, delta: delta.unwrap_or(c), out, lse: lse_out };
        let (args, zero_first) = self.attention_args(n, &cfg, &geo, &o, &score, &bufs)?;
        let sms = self.spec.sms;
        let launch = Launch::Attention { cfg, t: geo.t.clone(), tk: geo.tk.clone(), bh: geo.bh.clone(), sms };
        self.push(n, name, args, launch, zero_first);
        if let Some((f32_out, shape)) = recast {
            let name = self.name(n, &format!("attn_out_to_{}", a.out_dtype));
            self.cast_buffer(n, name, (f32_out, DType::F32, shape), res, a.out_dtype, None)?;
        }
        if let (Some(keys), Some((part_o, part_lse))) = (split_keys, partials) {
            let epilogue = merge_epilogue.map(|e| (e, self.kernel_captures(&o)));
            self.split_merge(n, keys, geo, (a.out_dtype, epilogue), [part_o, part_lse, res, lse])?;
        }
        Ok(())
    }

    /// The kernel configuration of attention `n`, the sizes it is built for and its mask's
    /// expression condition, if any.
    fn attention_config<'g>(
        &self,
        n: ValueId,
        a: &'g Attention,
        o: &AttnOperands,
    ) -> Result<(Geometry, AttnKernelConfig, Option<&'g Region>), CodegenError> {
        if o.decay_lo.is_some() {
            // The compensate-decay pass gives the pair to the CPU target only.
            return Err(Self::not_yet(n, "a decay pair (c, c_lo)"));
        }
        let (window, causal, mask) = mask_parts(&a.mask)?;
        if a.prune == Prune::Start {
            return Err(Self::not_yet(n, "a separate block_boundary (the fuse-boundary pass did not apply)"));
        }
        let q = o.q;
        let half = self.kernel_half(&[q, o.k, o.v]);
        // An output in the other 16-bit type leaves as f32 and is cast ([`Self::attention`]).
        let out_half = a.out_dtype == half.dtype();
        let tiles = a.tiles.ok_or_else(|| {
            CodegenError::Internal("attention without tiles (the tiles pass did not run)".into())
        })?;
        let (bh, t, dd) = self.bhtd(q, "attention's q")?;
        let d = self.static_dim(&dd, "the head dimension")?;
        // Keys of their own length: the queries sit at the end of them (the kernel's `Tk`).
        let (_, tk, _) = self.bhtd(o.k, "attention's k")?;
        let mut cfg = AttnKernelConfig::new(d, a.decay, a.prune == Prune::Boundary);
        cfg.fewer_queries = tk != t;
        cfg.scale = self.scale_value(&a.scale)? as f32;
        cfg.sm = self.spec.target.sm();
        cfg.dtype_in = half;
        cfg.out_half = out_half;
        cfg.window = window;
        cfg.causal = causal;
        cfg.bm = tiles.bm;
        cfg.bn = tiles.bn;
        cfg.kv_group = self.static_dim(&a.kv_group, "the query heads per key/value head")?;
        // The attribute's own rule at the bound head dim (ir AttnKernel::runs_warp_specialized).
        cfg.ws = a.kernel.runs_warp_specialized(d as u64);
        // Debug starts (NvptxSpec::debug_starts): the standard kernel writes them (the
        // warp-specialized one has no such parameter), for the first pruned attention only.
        if self.spec.debug_starts && cfg.prune && self.debug_starts.is_none() {
            cfg.debug_starts = true;
            cfg.ws = false;
        }
        // Split keys (the attention's kernel attribute): f32 partials, merged by a second
        // launch that also rounds to the output dtype. A debug-starts run keeps one launch.
        let split = a.kernel.split_key_tiles().filter(|_| !cfg.debug_starts);
        if split.is_some() {
            cfg.split_tiles = split;
            cfg.out_half = false;
        }
        cfg.tma = cfg.ws && a.kernel.kv_loads() == KvLoads::Tma;
        cfg.persistent = cfg.ws && a.kernel.ws_grid() == WsGrid::Persistent;
        cfg.free_running = cfg.ws && a.kernel.ws_turns() == WsTurns::None;
        attention_ws::check_persistent(&cfg).map_err(user)?;
        Ok((Geometry { q, bh, t, tk, dd, d }, cfg, mask))
    }

    /// The score region of attention `n` as the kernel's score hook compiles it: captured
    /// tensors are read through their index expressions, the mask's condition per element.
    fn score_region(
        &self,
        n: ValueId,
        a: &Attention,
        o: &AttnOperands,
        (mask, epilogue): (Option<&Region>, Option<&Region>),
        geo: &Geometry,
    ) -> Result<RegionMod, CodegenError> {
        // The region's dims are specialized like the head dim; `b`, `h` need the head count.
        let heads = self.bound_heads(geo.q);
        let dim = |d: &Dim| d.eval(&|s| self.spec.dims.get(s).copied());
        let caps = self.capture_tys(&self.kernel_captures(o));
        // q's load map reads its captures after the attention's.
        let q_map = self.load_map(geo.q).map(|m| m.f.shift_captures(o.captures.len()));
        RegionMod::with_mask(&a.score, mask, a.keys_from.as_ref(), &dim, heads, &caps)
            .and_then(|r| r.with_epilogue(epilogue, &dim, &caps))
            .and_then(|r| r.with_q_map(q_map.as_ref(), &dim, &caps))
            .map_err(|e| Self::not_yet(n, &e))
    }

    /// The tensors the kernel's regions capture, by capture number: the attention's, then those
    /// of q's load map (if any).
    fn kernel_captures(&self, o: &AttnOperands) -> Vec<ValueId> {
        let map = self.load_map(o.q).map(|m| m.captures).unwrap_or_default();
        o.captures.iter().copied().chain(map).collect()
    }

    /// The 16-bit type the attention kernels read q, k, v in: the operands' own, which the
    /// `half-operands` pass made one 16-bit type (`passes::half_operands::kernel_half`).
    pub(super) fn kernel_half(&self, operands: &[ValueId]) -> Half {
        if operands.iter().any(|&v| self.ty(v).dtype == DType::F16) {
            Half::F16
        } else {
            Half::Bf16
        }
    }

    /// The buffers of q, k, v, each in `half` (the `half-operands` pass casts others in the IR).
    fn half_operands(&self, n: ValueId, vs: [ValueId; 3], half: Half) -> Result<[usize; 3], CodegenError> {
        let mut qkv = [0; 3];
        for (i, &v) in vs.iter().enumerate() {
            if self.ty(v).dtype != half.dtype() {
                return Err(CodegenError::Internal(format!(
                    "operand {i} of attention %{} is {}, not {} (the half-operands pass did not run)",
                    n.index(),
                    self.ty(v).dtype,
                    half.dtype()
                )));
            }
            qkv[i] = self.buf(v)?;
        }
        Ok(qkv)
    }

    /// Scratch planes for the partial outputs and LSEs of `keys`-key slices: `(out, lse)`.
    fn split_partials(&mut self, n: ValueId, keys: u32, geo: &Geometry) -> (usize, usize) {
        let mut rows = vec![Dim::Tiles(Box::new(geo.tk.clone()), keys)];
        rows.extend(geo.bh.iter().cloned());
        rows.push(geo.t.clone());
        let what = |x: &str| format!("split-keys partial {x} of %{}", n.index());
        let lse = self.scratch(DType::F32, rows.clone(), what("LSE"));
        rows.push(geo.dd.clone());
        (self.scratch(DType::F32, rows, what("output")), lse)
    }

    /// The forward kernel's arguments in its parameter order (`FwdParams`, then the score hook's,
    /// the tensor maps, the debug starts, `Tk`, the persistent grid's), and the buffers to zero
    /// before every launch.
    fn attention_args(
        &mut self,
        n: ValueId,
        cfg: &AttnKernelConfig,
        geo: &Geometry,
        o: &AttnOperands,
        score: &RegionMod,
        bufs: &KernelBuffers,
    ) -> Result<(Vec<KernelArg>, Vec<usize>), CodegenError> {
        let buf = KernelArg::Buffer;
        let mut args = FwdParams {
            q: buf(bufs.qkv[0]),
            k: buf(bufs.qkv[1]),
            v: buf(bufs.qkv[2]),
            c: buf(bufs.c),
            delta: buf(bufs.delta),
            out: buf(bufs.out),
            lse: buf(bufs.lse),
            t: KernelArg::I32(vec![geo.t.clone()]),
        }
        .into_vec();
        // The score hook's parameters (region.rs, ScoreArg): head count, captures and their sizes.
        let captures = self.kernel_captures(o);
        for arg in score.args() {
            args.push(self.region_arg(*arg, &captures, &geo.bh[1], &|n| score.dim_arg(n).cloned())?);
        }
        // The tail after the score hook's, in the kernel's own order (`FwdTail`).
        let mut zero_first = vec![];
        let tail = FwdTail::of(cfg, score.args().len());
        let maps = if cfg.tma {
            // Tensor maps of K and V over their [B, H_kv, Tk, D] buffers (attention_ws::tma).
            let (kv_heads, _, _) = self.bhtd(o.k, "attention's k")?;
            Some(attention_ws::tma::args(cfg, bufs.qkv[1], bufs.qkv[2], &geo.tk, &kv_heads))
        } else {
            None
        };
        for &p in tail.params() {
            args.push(match p {
                Tail::KMap | Tail::VMap => {
                    let maps = maps.as_ref().expect("tensor maps with `loads = tma`");
                    maps[(p == Tail::VMap) as usize].clone()
                }
                Tail::DebugStarts => {
                    let mut shape = geo.bh.clone();
                    shape.push(Dim::Tiles(Box::new(geo.t.clone()), cfg.bm));
                    let what = format!("debug: in-kernel block starts of %{}", n.index());
                    let dbg = self.scratch(DType::I32, shape, what);
                    self.debug_starts = Some(dbg);
                    KernelArg::Buffer(dbg)
                }
                Tail::Tk => KernelArg::I32(vec![geo.tk.clone()]),
                // The persistent kernel: the head count and its work-item counter, zeroed right
                // before every launch (attention_ws::persist).
                Tail::Heads => KernelArg::I32(geo.bh.clone()),
                Tail::Work => {
                    let work =
                        self.scratch(DType::I32, vec![], format!("work-item counter of %{}", n.index()));
                    zero_first.push(work);
                    KernelArg::Buffer(work)
                }
            });
        }
        Ok((args, zero_first))
    }

    /// The launch merging the split partials `[part_out, part_lse]` into `[out, lse]` by LSE,
    /// rounding to `out_dtype`.
    fn split_merge(
        &mut self,
        n: ValueId,
        keys: u32,
        geo: Geometry,
        (out_dtype, epilogue): (DType, Option<(&Region, Vec<ValueId>)>),
        [part_o, part_lse, out, lse]: [usize; 4],
    ) -> Result<(), CodegenError> {
        let name = self.name(n, &format!("split_merge_k{keys}"));
        // The epilogue as the merge evaluates it: the region of its own kernel, reading the
        // attention's captures through parameters after the merge's.
        let heads = self.bound_heads(geo.q);
        let dim = |d: &Dim| d.eval(&|s| self.spec.dims.get(s).copied());
        let merge_epilogue = match &epilogue {
            Some((e, captures)) => Some(
                RegionMod::with_captures(e, &dim, heads, &self.capture_tys(captures))
                    .map_err(|why| Self::not_yet(n, &why))?
                    .with_first_param(attention::split_merge::merge_epilogue_first_param()),
            ),
            None => None,
        };
        attention::split_merge::build_split_merge(
            self.ctx,
            self.module,
            &name,
            (geo.d, keys),
            out_dtype,
            merge_epilogue.as_ref(),
        )
        .map_err(CodegenError::Internal)?;
        let mut rows = geo.bh.clone();
        rows.push(geo.t.clone());
        let mut args = vec![
            KernelArg::Buffer(part_o),
            KernelArg::Buffer(part_lse),
            KernelArg::Buffer(out),
            KernelArg::Buffer(lse),
            KernelArg::I32(rows.clone()),
            KernelArg::I32(vec![geo.tk.clone()]),
        ];
        if let (Some(m), Some((_, captures))) = (&merge_epilogue, &epilogue) {
            args.push(KernelArg::I32(vec![geo.t.clone()]));
            for arg in m.args() {
                args.push(self.region_arg(*arg, captures, &geo.bh[1], &|k| m.dim_arg(k).cloned())?);
            }
        }
        // One block per row.
        let launch = Launch::Grid {
            x: GridDim::Ceil(rows, 1),
            y: GridDim::Const(1),
            block: attention::split_merge::MERGE_THREADS,
        };
        self.push(n, name, args, launch, vec![]);
        Ok(())
    }
}

/// An attention mask as the kernels take it: (window, causal, expression condition). Without a
/// causal mask every key tile is visited and an expression's condition is evaluated per element
/// (by the score region's hook), in the forward and the backward alike.
pub(super) fn mask_parts(mask: &Mask) -> Result<(Option<u32>, bool, Option<&Region>), CodegenError> {
    Ok(match mask {
        Mask::Causal => (None, true, None),
        Mask::Window(w) => {
            (Some(u32::try_from(*w).map_err(|_| user(format!("window {w} is too large")))?), true, None)
        }
        Mask::None => (None, false, None),
        Mask::Expr(r) => (None, false, Some(r)),
    })
}
