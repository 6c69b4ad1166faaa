//! Which kernel runs each live node of a graph: a fused kernel ([`Kind`]) where the node is one
//! and its operands fit, plain loops ([`super::generic`]) otherwise.

use super::kernels::{AttnKernel, Kind};
use super::load_map::Operand;
use super::{backward, emit, generic, region, shape, CpuError, Spec, SpecKind};
use foxc_ir::{BinaryOp, DType, Dim, Graph, Op, Value, ValueId};
use std::collections::{BTreeMap, HashMap, HashSet};

/// The kernels of the values `outputs` need (empty: the graph's output), in topological order.
pub(super) fn plan(
    g: &Graph,
    dims: &BTreeMap<String, u64>,
    outputs: &[Value],
) -> Result<Vec<Spec>, CpuError> {
    let order = g.topo_order();
    let num: HashMap<ValueId, usize> = order.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    let outputs = checked_outputs(g, &num, outputs)?;
    let out_nodes: HashSet<ValueId> = outputs.iter().map(|o| o.node).collect();
    // Only values the outputs depend on get kernels (passes may leave dead values behind);
    // `used` holds every result that an output is or a live node reads.
    let mut live = HashSet::new();
    let mut used: HashSet<Value> = outputs.iter().copied().collect();
    let mut stack: Vec<ValueId> = outputs.iter().map(|o| o.node).collect();
    while let Some(x) = stack.pop() {
        if live.insert(x) {
            let ov = g.operand_values(x);
            stack.extend(ov.iter().map(|v| v.node));
            used.extend(ov);
        }
    }
    // Scalar subgraphs (`rsqrt(dim D)`) fold to constants at compile time: dims are concrete.
    let mut consts: HashMap<ValueId, f64> = HashMap::new();
    let mut specs = vec![];
    let is_output = |x: ValueId| out_nodes.contains(&x);
    for &n in &order {
        if crate::loop_plan::loaded_through(g, n) && is_output(n) {
            return Err(CpuError::Invalid(format!(
                "the output %{} is a load_map, which only its readers compute",
                num[&n]
            )));
        }
        // A product that a `sum {contract}` reads through, an inline value or a load map has no
        // kernel.
        if !live.contains(&n) || crate::loop_plan::unbuffered(g, n, &is_output) {
            continue;
        }
        let op = g.op(n);
        if g.ty(n).rank() == 0 && !out_nodes.contains(&n) {
            if let Some(c) = foxc_ir::fold::scalar_value(g, n, dims) {
                consts.insert(n, c);
                continue;
            }
        }
        let cx = NodeCx { g, dims, num: &num, n, v: num[&n], op };
        // Every live node's shape is bound (parameters' too).
        cx.sh(n)?;
        // Plain loops for every op without a fused kernel or outside a fast path's conditions.
        let generic = || -> Result<SpecKind, CpuError> {
            let gcx = generic::Ctx { g, dims, consts: &consts, num: &num };
            Ok(SpecKind::Generic(generic::plan(&gcx, n)?))
        };
        // A node reading a value its loop computes in place takes the generic loop.
        let fused = if crate::loop_plan::reads_unbuffered(g, n, &is_output) {
            None
        } else {
            cx.fused(&consts, &used)?
        };
        let Some(kind) = fused else {
            if matches!(op, Op::Param { .. }) {
                continue;
            }
            specs.push(cx.spec(generic()?));
            continue;
        };
        specs.push(cx.spec(SpecKind::Fused(kind)));
    }
    Ok(specs)
}

/// `outputs`, or the graph's output when empty, each checked to be a value of `g`.
fn checked_outputs(
    g: &Graph,
    num: &HashMap<ValueId, usize>,
    outputs: &[Value],
) -> Result<Vec<Value>, CpuError> {
    let outputs: Vec<Value> = if outputs.is_empty() {
        let Some(output) = g.output else {
            return Err(CpuError::Invalid("the graph has no output".into()));
        };
        if matches!(g.op(output), Op::Param { .. }) {
            return Err(CpuError::Invalid(
                "the graph's output is a parameter: there is nothing to compute".into(),
            ));
        }
        vec![Value::of(output)]
    } else {
        outputs.to_vec()
    };
    for o in &outputs {
        if !num.contains_key(&o.node) || g.result_ty(o.node, o.result).is_none() {
            return Err(CpuError::Invalid(format!(
                "output {}#{} is not a value of the graph",
                o.node.index(),
                o.result
            )));
        }
    }
    Ok(outputs)
}

/// One node being planned, with the helpers that check its operands (errors name the node by
/// its number `%v` in topological order and its mnemonic).
struct NodeCx<'a> {
    g: &'a Graph,
    dims: &'a BTreeMap<String, u64>,
    num: &'a HashMap<ValueId, usize>,
    n: ValueId,
    v: usize,
    op: &'a Op,
}

impl NodeCx<'_> {
    fn invalid(&self, msg: String) -> CpuError {
        CpuError::Invalid(format!("value %{} ({}): {msg}", self.v, self.op.mnemonic()))
    }

    fn sh(&self, id: ValueId) -> Result<Vec<u64>, CpuError> {
        shape(self.g, id, self.dims, self.num)
    }

    fn dt(&self, id: ValueId) -> DType {
        self.g.ty(id).dtype
    }

    /// The dtype of a float operand the CPU kernels read.
    fn float_in(&self, id: ValueId) -> Result<DType, CpuError> {
        match self.dt(id) {
            d if emit::is_cpu_float(d) => Ok(d),
            d => Err(self.invalid(format!(
                "operand %{} has dtype {d}; the CPU kernels read f32, bf16 or f16",
                self.num[&id]
            ))),
        }
    }

    fn rank4(&self, id: ValueId) -> Result<[u64; 4], CpuError> {
        let s = self.sh(id)?;
        <[u64; 4]>::try_from(s.as_slice())
            .map_err(|_| self.invalid(format!("operand %{} must be [B, H, T, D]", self.num[&id])))
    }

    fn expect(&self, id: ValueId, want: &[u64], what: &str) -> Result<(), CpuError> {
        let s = self.sh(id)?;
        if s != want {
            return Err(self
                .invalid(format!("operand %{} ({what}) has shape {s:?}, expected {want:?}", self.num[&id])));
        }
        Ok(())
    }

    fn dim(&self, x: &Dim) -> Option<u64> {
        x.eval(&|s| self.dims.get(s).copied())
    }

    fn spec(&self, kind: SpecKind) -> Spec {
        let operands = match &kind {
            SpecKind::Generic(p) => p.operands.clone(),
            SpecKind::Fused(_) => fused_operands(self.g, self.n),
        };
        let results = match &kind {
            SpecKind::Fused(k) => k.results(),
            SpecKind::Generic(_) => vec![0],
        };
        Spec { node: self.n, operands, results, name: format!("k{}_{}", self.v, self.op.mnemonic()), kind }
    }

    /// The fused kernel of the node, `None` for plain loops (a parameter needs neither).
    fn fused(&self, consts: &HashMap<ValueId, f64>, used: &HashSet<Value>) -> Result<Option<Kind>, CpuError> {
        let ops = self.g.operands(self.n);
        // The fast kernels check their operands' types by node (result 0); a node reading a
        // later result of another (a backward's dk) takes the generic loop, which reads any.
        let later = self.g.operand_values(self.n).iter().any(|v| v.result != 0);
        match self.op {
            Op::Param { .. } => Ok(None),
            Op::Binary(_) | Op::Cast | Op::RmsNorm { .. } if later => Ok(None),
            Op::Binary(bop)
                if ops.len() == 2 && (consts.contains_key(&ops[0]) ^ consts.contains_key(&ops[1])) =>
            {
                self.scalar_op(*bop, &ops, consts)
            }
            Op::Cast => self.cast(ops[0]),
            Op::RmsNorm { axis, eps } => self.rmsnorm(axis, *eps, &ops),
            Op::GateCumsum { kind, .. } | Op::GateCumsumLo { kind } => {
                let [b, h, t] = <[u64; 3]>::try_from(self.sh(self.n)?.as_slice())
                    .map_err(|_| self.invalid("result must be [B, H, T]".into()))?;
                if *kind == foxc_ir::GateKind::Slope {
                    self.expect(ops[0], &[h], "slopes [H]")?;
                } else {
                    self.expect(ops[0], &[b, h, t], "gates [B, H, T]")?;
                }
                let lo = matches!(self.op, Op::GateCumsumLo { .. });
                Ok(Some(Kind::GateCumsum { kind: *kind, src: self.float_in(ops[0])?, b, h, t, lo }))
            }
            Op::Threshold { .. } => self.threshold(&ops).map(Some),
            Op::BlockBoundary(tiles) => {
                let cs = self.sh(ops[0])?;
                let [b, h, tk] = <[u64; 3]>::try_from(cs.as_slice())
                    .map_err(|_| self.invalid("c must be [B, H, T]".into()))?;
                if tiles.bm == 0 || tiles.bn == 0 {
                    return Err(self.invalid("zero tile size".into()));
                }
                // The queries' length from delta's type `[B, H, ceil(Tq / bm)]` (c's without one).
                let t = match foxc_ir::check::query_rows(self.g.ty(ops[1]), tiles.bm) {
                    Some(rows) => {
                        self.dim(&rows).ok_or_else(|| self.invalid("the query count is not bound".into()))?
                    }
                    None => tk,
                };
                if t > tk {
                    return Err(self.invalid(format!("{t} queries but {tk} keys")));
                }
                let mt = t.div_ceil(tiles.bm as u64);
                self.expect(ops[1], &[b, h, mt], "delta")?;
                Ok(Some(Kind::BlockBoundary {
                    c: self.float_in(ops[0])?,
                    delta: self.float_in(ops[1])?,
                    bh: b * h,
                    t,
                    tk,
                    bm: tiles.bm as u64,
                    bn: tiles.bn as u64,
                }))
            }
            Op::Attention(attn) | Op::AttentionBackward(attn) => self.attention(attn, &ops, used).map(Some),
            _ => Ok(None),
        }
    }

    /// `x op c` with `c` a folded scalar: the fast path for arithmetic on positional floats of
    /// the result's shape.
    fn scalar_op(
        &self,
        bop: BinaryOp,
        ops: &[ValueId],
        consts: &HashMap<ValueId, f64>,
    ) -> Result<Option<Kind>, CpuError> {
        let tensor_first = consts.contains_key(&ops[1]);
        let (t, c) = if tensor_first { (ops[0], ops[1]) } else { (ops[1], ops[0]) };
        let arith = matches!(
            bop,
            BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div | BinaryOp::Min | BinaryOp::Max
        );
        let dst = self.g.ty(self.n).dtype;
        let out_shape = self.sh(self.n)?;
        let fast = arith
            && self.sh(t)? == out_shape
            && self.g.ty(self.n).is_positional()
            && self.g.ty(t).is_positional()
            && emit::is_cpu_float(dst)
            && emit::is_cpu_float(self.dt(t));
        if !fast {
            return Ok(None);
        }
        Ok(Some(Kind::ScalarOp {
            src: self.float_in(t)?,
            dst,
            op: bop,
            c: consts[&c],
            tensor_first,
            n: out_shape.iter().product(),
        }))
    }

    fn cast(&self, x: ValueId) -> Result<Option<Kind>, CpuError> {
        let (src, dst) = (self.dt(x), self.g.ty(self.n).dtype);
        let out_shape = self.sh(self.n)?;
        let fast = (emit::is_cpu_float(src) || src == DType::I32)
            && emit::is_cpu_float(dst)
            && self.g.ty(self.n).is_positional()
            && self.g.ty(x).is_positional();
        Ok(fast.then(|| Kind::Cast { src, dst, n: out_shape.iter().product() }))
    }

    fn rmsnorm(&self, axis: &str, eps: f64, ops: &[ValueId]) -> Result<Option<Kind>, CpuError> {
        let xs = self.sh(ops[0])?;
        let out = self.g.ty(self.n).dtype;
        let fast = !xs.is_empty()
            && axis == (xs.len() - 1).to_string()
            && self.g.ty(self.n).is_positional()
            && self.sh(ops[1])? == xs[xs.len() - 1..]
            && emit::is_cpu_float(out)
            && emit::is_cpu_float(self.dt(ops[0]))
            && emit::is_cpu_float(self.dt(ops[1]));
        if !fast {
            return Ok(None);
        }
        let d = xs[xs.len() - 1];
        Ok(Some(Kind::RmsNorm {
            x: self.float_in(ops[0])?,
            w: self.float_in(ops[1])?,
            out,
            rows: xs.iter().product::<u64>() / d.max(1),
            d,
            eps,
        }))
    }

    fn threshold(&self, ops: &[ValueId]) -> Result<Kind, CpuError> {
        let Op::Threshold { rule, log_eps, bound, score, scale, bm, .. } = self.op else {
            unreachable!("threshold() is called on threshold nodes")
        };
        let mut mapped = vec![];
        let q = self.through_map(ops[0], 0, &mut mapped)?;
        let [b, h, t, d] = self.rank4(ops[0])?;
        let ks = self.sh(ops[1])?;
        let (hk, tk) = (ks.get(1).copied().unwrap_or(0), ks.get(2).copied().unwrap_or(0));
        self.expect(ops[1], &[b, hk, tk, d], "k")?;
        if t > tk {
            return Err(self.invalid(format!("{t} queries but {tk} keys")));
        }
        if hk == 0 || h % hk != 0 {
            return Err(self.invalid(format!("k has {hk} heads, which do not divide q's {h}")));
        }
        if *bm == 0 {
            return Err(self.invalid("bm = 0".into()));
        }
        // The kernel reads entry h of a given rule's per-head table for query head h.
        rule.check_heads(h as usize).map_err(|e| self.invalid(e))?;
        if scale.q.is_some() {
            // Its statistics of q would be scaled by the factor (docs/SEMANTICS.md): the kernel
            // has no such input, and the fold-q-scale pass folds for the GPU targets only.
            return Err(self.invalid("a threshold whose scale has a q factor".into()));
        }
        let scale = scale
            .value(&|x| self.dims.get(x).copied())
            .ok_or_else(|| self.invalid("the scale's dim is not bound".into()))?;
        Ok(Kind::Threshold {
            q: q.dtype,
            k: self.float_in(ops[1])?,
            q_map: q.map.map(Box::new),
            captures: self.captures(&mapped)?,
            bh: b * h,
            t,
            tk,
            d,
            h,
            hk,
            rule: rule.clone(),
            log_eps: *log_eps,
            bound: *bound,
            score: *score,
            scale,
            bm: *bm as u64,
        })
    }

    /// The forward attention kernel, or the backward's (which takes the forward's
    /// configuration).
    fn attention(
        &self,
        attn: &foxc_ir::Attention,
        ops: &[ValueId],
        used: &HashSet<Value>,
    ) -> Result<Kind, CpuError> {
        let backward = matches!(self.op, Op::AttentionBackward(_));
        if backward && attn.grad_dtype != foxc_ir::DType::F32 {
            // `fuse-gradient-casts` runs for GPU targets only.
            return Err(self.invalid(format!(
                "the CPU backward writes f32 gradients, not {} (compile the gradient program for the CPU target)",
                attn.grad_dtype
            )));
        }
        // The backward's operands are the forward's, then out, lse, dout.
        let fwd_ops = &ops[..ops.len() - if backward { 3.min(ops.len()) } else { 0 }];
        let ao = foxc_ir::AttnOperands::from_positional(attn, fwd_ops).map_err(|m| self.invalid(m))?;
        let tiles = attn
            .tiles
            .ok_or_else(|| self.invalid("the attention has no tiles (run the tiles pass)".into()))?;
        let pruned = match attn.prune {
            foxc_ir::Prune::Dense => false,
            foxc_ir::Prune::Start => true,
            foxc_ir::Prune::Boundary => return Err(self.invalid(
                "the attention derives its block boundary in-kernel (a GPU pass); compile for the CPU target"
                    .into(),
            )),
        };
        let [b, h, t, d] = self.rank4(ao.q)?;
        let hk = self.sh(ao.k)?.get(1).copied().unwrap_or(0);
        let group =
            self.dim(&attn.kv_group).ok_or_else(|| self.invalid("kv_group's dim is not bound".into()))?;
        if hk == 0 || hk * group != h {
            return Err(self.invalid(format!("k has {hk} heads: not {h} query heads / kv_group {group}")));
        }
        let tk = self.sh(ao.k)?.get(2).copied().unwrap_or(0);
        self.expect(ao.k, &[b, hk, tk, d], "k")?;
        self.expect(ao.v, &[b, hk, tk, d], "v")?;
        if t > tk && attn.positions_queries() {
            return Err(
                self.invalid(format!("{t} queries but {tk} keys: queries sit at the end of the keys"))
            );
        }
        let mut c = None;
        if let Some(cv) = ao.decay {
            self.expect(cv, &[b, h, tk], "c")?;
            c = Some(self.float_in(cv)?);
        }
        if let Some(lv) = ao.decay_lo {
            self.expect(lv, &[b, h, tk], "c_lo")?;
            if self.dt(lv) != DType::F32 {
                return Err(self.invalid(format!("c_lo operand %{} must be f32", self.num[&lv])));
            }
        }
        if let Some(s) = ao.start {
            if self.dt(s) != DType::I32 {
                return Err(self.invalid(format!("start operand %{} must be i32", self.num[&s])));
            }
            self.expect(s, &[b, h, t.div_ceil(tiles.bm.max(1) as u64)], "start")?;
        }
        if tiles.bm == 0 || tiles.bn == 0 {
            return Err(self.invalid("zero tile size".into()));
        }
        if !emit::is_cpu_float(attn.out_dtype) {
            return Err(
                self.invalid(format!("the CPU attention writes f32, bf16 or f16, not {}", attn.out_dtype))
            );
        }
        if t == 0 || tk == 0 || d == 0 {
            return Err(self.invalid("T and D must be at least 1".into()));
        }
        let (score, causal, window, mask) = self.regions(attn)?;
        let dim = |x: &Dim| self.dim(x);
        let code = |r: Option<&foxc_ir::attention::Region>| {
            r.map(|e| region::RegionCode::new(e, &dim)).transpose().map_err(|m| self.invalid(m))
        };
        let keys_from = code(attn.keys_from.as_ref())?;
        let epilogue = code(attn.epilogue.as_ref())?;
        // A q read through a load map: its captures after the attention's own.
        let mut captured = ao.captures.clone();
        let q = self.through_map(ao.q, captured.len(), &mut captured)?;
        let captures = self.captures(&captured)?;
        let scale = attn
            .scale
            .value(&|x| self.dims.get(x).copied())
            .ok_or_else(|| self.invalid("the scale's dim is not bound".into()))?;
        let kernel = AttnKernel {
            q: q.dtype,
            k: self.float_in(ao.k)?,
            q_map: q.map,
            v: self.float_in(ao.v)?,
            c,
            c_lo: ao.decay_lo.is_some(),
            pruned,
            bh: b * h,
            h,
            hk,
            t,
            tk,
            d,
            bm: tiles.bm as u64,
            bn: tiles.bn as u64,
            scale,
            causal,
            window,
            score,
            mask,
            keys_from,
            epilogue,
            captures,
            out: attn.out_dtype,
            lse: !backward && used.contains(&Value { node: self.n, result: 1 }),
        };
        if backward {
            let dim = |x: &Dim| self.dim(x);
            let bwd = backward::plan(self.g, self.n, attn, kernel, &dim, &|m| self.invalid(m))?;
            Ok(Kind::AttentionBackward(Box::new(bwd)))
        } else {
            Ok(Kind::Attention(Box::new(kernel)))
        }
    }

    /// The score region's code, the mask as `(causal, window, expression mask)`.
    #[allow(clippy::type_complexity)]
    fn regions(
        &self,
        attn: &foxc_ir::Attention,
    ) -> Result<(Option<region::RegionCode>, bool, Option<u64>, Option<region::RegionCode>), CpuError> {
        let dim = |x: &Dim| self.dim(x);
        let score = if attn.score.is_identity() {
            None
        } else {
            Some(region::RegionCode::new(&attn.score, &dim).map_err(|m| self.invalid(m))?)
        };
        let (causal, window, mask) = match &attn.mask {
            foxc_ir::Mask::None => (false, None, None),
            foxc_ir::Mask::Causal => (true, None, None),
            foxc_ir::Mask::Window(w) => (true, Some(*w), None),
            foxc_ir::Mask::Expr(r) => {
                (false, None, Some(region::RegionCode::new(r, &dim).map_err(|m| self.invalid(m))?))
            }
        };
        Ok((score, causal, window, mask))
    }

    /// How a kernel reads its q `v`: a load map's `x` with the map's code, its captures
    /// (appended to `captured`) numbered from `first` in the kernel's list; else `v` itself.
    fn through_map(
        &self,
        v: ValueId,
        first: usize,
        captured: &mut Vec<ValueId>,
    ) -> Result<Operand, CpuError> {
        let Op::LoadMap { f } = self.g.op(v) else {
            return Ok(Operand { dtype: self.float_in(v)?, map: None });
        };
        if self.dt(v) != DType::F32 {
            return Err(
                self.invalid(format!("the CPU kernels compute a load map in f32, not {}", self.dt(v)))
            );
        }
        let ops = self.g.operands(v);
        let f = f.shift_captures(first);
        captured.extend(&ops[1..]);
        let dim = |x: &Dim| self.dim(x);
        let map = region::RegionCode::new(&f, &dim).map_err(|m| self.invalid(m))?;
        Ok(Operand { dtype: self.float_in(ops[0])?, map: Some(map) })
    }

    /// How the kernel reads each captured tensor (f32, bf16, f16 or i32).
    fn captures(&self, caps: &[ValueId]) -> Result<Vec<region::CaptureCode>, CpuError> {
        caps.iter()
            .map(|&cv| {
                let cd = self.dt(cv);
                if !(emit::is_cpu_float(cd) || cd == DType::I32) {
                    return Err(self.invalid(format!(
                        "captured tensor %{} has dtype {cd}; the CPU kernel reads f32, bf16, f16 or i32",
                        self.num[&cv]
                    )));
                }
                Ok(region::CaptureCode { dtype: cd, shape: self.sh(cv)? })
            })
            .collect()
    }
}

/// The buffers a fused kernel of `n` reads, in `args` order: its operands, where an attention's
/// or a threshold's q is a load map its `x` instead and the map's captures after the rest
/// (`NodeCx::through_map` numbers them so).
fn fused_operands(g: &Graph, n: ValueId) -> Vec<Value> {
    let mut ops = g.operand_values(n);
    let reads_q = matches!(g.op(n), Op::Attention(_) | Op::Threshold { .. });
    if let Some(q) = ops.first().copied().filter(|q| reads_q && crate::loop_plan::loaded_through(g, q.node)) {
        let map = g.operand_values(q.node);
        ops[0] = map[0];
        ops.extend_from_slice(&map[1..]);
    }
    ops
}
