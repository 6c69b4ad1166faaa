//! Lowering of `threshold` onto the threshold kernels ([`super::threshold`]): one kernel for a
//! formula of tile norms only, norms then delta otherwise, delta alone for a static bound.
//! Under an attention with `prelude = joint` (the `fuse-prelude` pass), the one kernel also
//! scans the attention's gate: one launch computes `delta` and `c`.

use super::module::{user, Assembler};
use super::threshold::params::{DeltaParams, FusedParams, GateScan, NormsParams};
use super::{threshold, CodegenError, GridDim, KernelArg, Launch};
use foxc_ir::{Attention, DType, Dim, GateKind, NormBound, Op, Prelude, ThresholdPlan, ValueId};

/// The buffers and sizes a threshold's launches read.
struct Geometry {
    /// q's buffer (its load map's x where q is one).
    qb: usize,
    /// The arguments of q's load map, after each kernel's own.
    q_map_args: Vec<KernelArg>,
    kb: usize,
    /// `[B, H]` of q.
    bh: Vec<Dim>,
    /// Query rows and keys (`tk >= t`).
    t: Dim,
    tk: Dim,
}

fn norms_what(n: ValueId) -> String {
    format!("per-tile max squared norms of q, k for %{}", n.index())
}

/// The gate scan and the threshold that an attention's `prelude = joint` computes in one launch.
#[derive(Clone, Copy, Debug)]
pub(super) struct JointPrelude {
    pub gate: ValueId,
    pub threshold: ValueId,
    /// `prelude = joint(split rows)`: a scan block per segment of a long row.
    pub split_rows: bool,
}

impl<'a, 'ctx> Assembler<'a, 'ctx> {
    /// The joint prelude that node `n` is part of (its gate scan or its threshold), if any.
    pub(super) fn joint_prelude(&self, n: ValueId) -> Option<JointPrelude> {
        self.g.users(n).into_iter().find_map(|u| {
            let Op::Attention(a) = self.g.op(u) else { return None };
            if !a.prelude.is_joint() {
                return None;
            }
            let ops = Attention::operands(self.g, u).ok()?;
            let (gate, threshold) = (ops.decay?, ops.delta?);
            let split_rows = a.prelude == Prelude::JointSplitRows;
            (gate == n || threshold == n).then_some(JointPrelude { gate, threshold, split_rows })
        })
    }

    /// The launches of `threshold` node `n` writing `res`; with `joint = (its joint prelude, the
    /// gate scan's buffer)`, the one launch that also scans the gate.
    pub(super) fn threshold(
        &mut self,
        n: ValueId,
        res: usize,
        joint: Option<(JointPrelude, usize)>,
    ) -> Result<(), CodegenError> {
        let (spec, geo, plan) = self.delta_spec(n)?;
        if plan == ThresholdPlan::OneLaunch {
            return self.threshold_one_launch(n, res, joint, &spec, geo);
        }
        if joint.is_some() {
            return Err(CodegenError::Internal(format!(
                "prelude = joint on a threshold that is not one kernel (%{}: {})",
                n.index(),
                spec.rule.name
            )));
        }
        self.threshold_norms_then_delta(n, res, &spec, geo)
    }

    /// The delta kernels' specification of threshold `n`, its sizes and its launch plan.
    fn delta_spec(
        &self,
        n: ValueId,
    ) -> Result<(threshold::DeltaSpec<'a>, Geometry, ThresholdPlan), CodegenError> {
        let ie = CodegenError::Internal;
        let Op::Threshold { rule, log_eps, bound, score, scale, bm, plan } = self.g.op(n) else {
            return Err(ie(format!("%{} is not a threshold", n.index())));
        };
        let ops = self.g.operands(n);
        // The scale's q factor (the fold-q-scale pass) scales the statistics of q (threshold/).
        let (q, k) = (ops[0], ops[1]);
        if *bm == 0 {
            return Err(user("threshold bm must be positive"));
        }
        let kv_group = self.kv_group(q, k)?;
        let (bh, t, dd) = self.bhtd(q, "threshold's q")?;
        let d = self.static_dim(&dd, "the head dimension")?;
        // Queries fewer than keys: the norms are of the keys' tiles (q's clamped to its rows).
        let (_, tk, _) = self.bhtd(k, "threshold's k")?;
        let fewer_queries = tk != t;
        if fewer_queries && *plan == ThresholdPlan::OneLaunch {
            return Err(ie("a one-launch threshold of queries fewer than keys".into()));
        }
        let (scale, qscale) = self.scale_parts(scale)?;
        // A q loaded through its map: the kernels load its x and compute the map.
        let map = self.load_map(q);
        let q_read = map.as_ref().map_or(q, |m| m.x);
        let q_map = match &map {
            Some(m) => {
                let dim = |d: &Dim| d.eval(&|s| self.spec.dims.get(s).copied());
                let caps = self.capture_tys(&m.captures);
                let qm = threshold::QMap::new(m.f, &dim, self.bound_heads(q), &caps, self.ty(q).dtype)
                    .map_err(|e| {
                        user(format!("the threshold's q map: {e} (the GPU backend cannot yet run it)"))
                    })?;
                Some(qm)
            }
            None => None,
        };
        let mut q_map_args = vec![];
        if let (Some(m), Some(qm)) = (&map, &q_map) {
            for arg in qm.args() {
                q_map_args.push(self.region_arg(*arg, &m.captures, &bh[1], &|n| qm.dim_arg(n).cloned())?);
            }
        }
        let spec = threshold::DeltaSpec {
            d,
            kv_group,
            dts: (self.ty(q_read).dtype, self.ty(k).dtype),
            rule,
            score: *score,
            log_eps: *log_eps,
            scale,
            qscale,
            bm: *bm,
            bound: match bound {
                NormBound::Static { q_max, k_max } => {
                    threshold::BoundSrc::Static { q_max: *q_max, k_max: *k_max }
                }
                NormBound::Data => threshold::BoundSrc::Norms,
            },
            fewer_queries,
            q_map,
        };
        let geo = Geometry { qb: self.buf(q_read)?, q_map_args, kb: self.buf(k)?, bh, t, tk };
        Ok((spec, geo, *plan))
    }

    /// One launch: the norms, then each head's last block evaluates its deltas; under a joint
    /// prelude the same launch scans the gate ahead of the tiles.
    fn threshold_one_launch(
        &mut self,
        n: ValueId,
        res: usize,
        joint: Option<(JointPrelude, usize)>,
        spec: &threshold::DeltaSpec<'_>,
        geo: Geometry,
    ) -> Result<(), CodegenError> {
        let ie = CodegenError::Internal;
        let Geometry { qb, kb, bh, t, q_map_args, .. } = geo;
        let bm = spec.bm;
        let mut norms_shape = bh.clone();
        norms_shape.push(Dim::Tiles(Box::new(t.clone()), bm));
        norms_shape.push(Dim::Const(2));
        let nb = self.scratch(DType::F32, norms_shape, norms_what(n));
        let arrived = self.counters(bh.clone(), format!("blocks of each head done with %{}", n.index()));
        let args = |scan: Option<GateScan<KernelArg>>| {
            FusedParams {
                q: KernelArg::Buffer(qb),
                k: KernelArg::Buffer(kb),
                norms: KernelArg::Buffer(nb),
                delta: KernelArg::Buffer(res),
                arrived: KernelArg::Buffer(arrived),
                t: KernelArg::I32(vec![t.clone()]),
                ln_t: KernelArg::LnF32(vec![t.clone()]),
                scan,
            }
            .into_vec()
            .into_iter()
            .chain(q_map_args.iter().cloned())
            .collect::<Vec<_>>()
        };
        let Some((JointPrelude { gate, split_rows, .. }, c)) = joint else {
            let name = self.name(n, "threshold_norms_delta");
            threshold::build_threshold_fused(self.ctx, self.module, &name, spec).map_err(ie)?;
            let args = args(None);
            let launch = Launch::Grid {
                x: GridDim::Ceil(vec![t], bm),
                y: GridDim::Ceil(bh, 1),
                block: threshold::NORM_THREADS,
            };
            self.push(n, name, args, launch, vec![]);
            return Ok(());
        };
        // The gate's scan in the same launch, ahead of the tiles: a block per row, or per
        // segment of each row when the rows are split.
        let (kind, x) = self.scanned_gate(gate)?;
        let (name, scans) = if split_rows {
            let segments = GridDim::Ceil(vec![t.clone()], threshold::SPLIT_SEGMENT as u32);
            (self.name(n, "threshold_with_split_scan"), segments)
        } else {
            (self.name(n, "threshold_with_scan"), GridDim::Const(1))
        };
        threshold::build_threshold_with_scan(
            self.ctx,
            self.module,
            &name,
            spec,
            (kind, self.ty(x).dtype),
            split_rows,
        )
        .map_err(ie)?;
        let args = args(Some(GateScan { gate: KernelArg::Buffer(self.buf(x)?), c: KernelArg::Buffer(c) }));
        let launch = Launch::Grid {
            x: GridDim::Sum(vec![scans, GridDim::Ceil(vec![t], bm)]),
            y: GridDim::Ceil(bh, 1),
            block: threshold::NORM_THREADS,
        };
        self.push_joint(n, vec![gate], name, args, launch, vec![]);
        Ok(())
    }

    /// The per-tile norms (when the formula reads them), then the deltas: two launches.
    fn threshold_norms_then_delta(
        &mut self,
        n: ValueId,
        res: usize,
        spec: &threshold::DeltaSpec<'_>,
        geo: Geometry,
    ) -> Result<(), CodegenError> {
        let ie = CodegenError::Internal;
        let Geometry { qb, kb, bh, t, tk, q_map_args } = geo;
        let (bm, fewer_queries) = (spec.bm, spec.fewer_queries);
        let norms = if threshold::needs_norms(spec.rule, &spec.score, spec.bound) {
            let name = self.name(n, "threshold_norms");
            threshold::build_threshold_norms(
                self.ctx,
                self.module,
                &name,
                spec.d,
                spec.kv_group,
                spec.dts,
                bm,
                fewer_queries,
                spec.q_map.as_ref(),
            )
            .map_err(ie)?;
            // The norms' tiles: the queries' (one per delta block), or the keys' when fewer.
            let rows = if fewer_queries { &tk } else { &t };
            let mut shape = bh.clone();
            shape.extend([Dim::Tiles(Box::new(rows.clone()), bm), Dim::Const(2)]);
            let nb = self.scratch(DType::F32, shape, norms_what(n));
            let args = NormsParams {
                q: KernelArg::Buffer(qb),
                k: KernelArg::Buffer(kb),
                norms: KernelArg::Buffer(nb),
                rows: KernelArg::I32(vec![rows.clone()]),
                tq: fewer_queries.then(|| KernelArg::I32(vec![t.clone()])),
            }
            .into_vec()
            .into_iter()
            .chain(q_map_args.iter().cloned())
            .collect();
            let x = GridDim::Ceil(vec![rows.clone()], bm);
            let launch = Launch::Grid { x, y: GridDim::Ceil(bh.clone(), 1), block: threshold::NORM_THREADS };
            self.push(n, name, args, launch, vec![]);
            nb
        } else {
            res
        };
        let name = self.name(n, "threshold_delta");
        threshold::build_threshold_delta(self.ctx, self.module, &name, spec).map_err(ie)?;
        let args = DeltaParams {
            q: KernelArg::Buffer(qb),
            k: KernelArg::Buffer(kb),
            norms: KernelArg::Buffer(norms),
            delta: KernelArg::Buffer(res),
            t: KernelArg::I32(vec![t.clone()]),
            // ln of the keys a row may see.
            ln_t: KernelArg::LnF32(vec![tk.clone()]),
            tk: fewer_queries.then(|| KernelArg::I32(vec![tk])),
        }
        .into_vec()
        .into_iter()
        .chain(q_map_args)
        .collect();
        let launch = Launch::Grid {
            x: GridDim::Ceil(vec![t], bm),
            y: GridDim::Ceil(bh, 1),
            block: super::kernels::ROW_THREADS,
        };
        self.push(n, name, args, launch, vec![]);
        Ok(())
    }

    /// The gate kind and input of a `gate_cumsum` a joint prelude scans.
    fn scanned_gate(&self, gate: ValueId) -> Result<(GateKind, ValueId), CodegenError> {
        match self.g.op(gate) {
            Op::GateCumsum { kind: kind @ (GateKind::Logits | GateKind::LogGate), .. } => {
                // The kernel scans the rows of the threshold's q; the attention's rule makes
                // them the gate's [B, H, T].
                self.gate_dims(gate)?;
                Ok((*kind, self.g.operands(gate)[0]))
            }
            other => Err(CodegenError::Internal(format!(
                "prelude = joint needs a gate scan for c, got {} (%{})",
                other.mnemonic(),
                gate.index()
            ))),
        }
    }
}
