//! Module assembly: walks the graph, builds the kernels of each node (one launch for the two
//! nodes of a joint prelude) into a single LLVM module and records the launch plan (buffers,
//! arguments, geometry) that goes with it.

use super::attention::region::{CaptureTy, RegionMod, ScoreArg};
use super::attention::{self, AttnKernelConfig};
use super::generic;
use super::kernels::{self, ScanTerm, ELEM_THREADS, ROW_THREADS, SCAN_THREADS};
use super::target;
use super::{
    BufferInfo, BufferKind, CodegenError, GridDim, KernelArg, KernelInfo, Launch, NvptxArtifact, NvptxSpec,
};
use foxc_ir::{BinaryOp, DType, Dim, GateKind, Graph, Op, Region, Value, ValueId, ValueType};
use inkwell::context::Context;
use inkwell::module::Module;
use inkwell::values::FunctionValue;
use std::collections::{BTreeMap, HashSet};

/// A `load_map` as its reading kernels take it ([`Assembler::load_map`]).
pub(super) struct LoadMapOf<'g> {
    /// The tensor the kernels load (the map's operand 0).
    pub x: ValueId,
    /// The function, captures numbered from 0.
    pub f: &'g Region,
    pub captures: Vec<ValueId>,
}

/// The one place the attention kernel builder is called (H5b's flash-attention kernel).
/// `score` is the region's hook (the identity keeps the fused FMA).
pub(super) fn build_attention<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    cfg: &AttnKernelConfig,
    score: &RegionMod,
) -> Result<FunctionValue<'ctx>, CodegenError> {
    cfg.validate().map_err(CodegenError::User)?;
    attention::build_attention_kernel_with(ctx, module, cfg, score).map_err(CodegenError::Internal)
}

/// Compiles `g` (after the passes) for `spec.target`.
pub fn compile(g: &Graph, spec: &NvptxSpec) -> Result<NvptxArtifact, CodegenError> {
    let tm = target::target_machine(spec.target).map_err(CodegenError::Internal)?;
    let ctx = Context::create();
    let module = ctx.create_module(&format!("foxc_{}", g.name));
    target::prepare_module(&module, &tm);
    let mut asm = Assembler {
        g,
        spec,
        ctx: &ctx,
        module: &module,
        buffers: vec![],
        kernels: vec![],
        buf_of: BTreeMap::new(),
        outputs: vec![],
        debug_starts: None,
        joint_waiting: HashSet::new(),
    };
    let outputs = asm.run()?;
    let (llvm_ir, ptx) = target::finish(&module, &tm).map_err(CodegenError::Internal)?;
    Ok(NvptxArtifact {
        target: spec.target,
        llvm_ir,
        ptx,
        buffers: asm.buffers,
        kernels: asm.kernels,
        outputs,
        debug_starts: asm.debug_starts,
    })
}

/// The state of one module assembly. Other files of the backend add lowerings with their own
/// `impl Assembler` blocks (the attention backward in `module_bwd.rs`), through the methods
/// marked `pub(super)`: [`Assembler::buf`] (the buffer of an operand or result),
/// [`Assembler::scratch`], [`Assembler::name`], [`Assembler::push`] and the dim helpers.
pub(super) struct Assembler<'a, 'ctx> {
    pub(super) g: &'a Graph,
    pub(super) spec: &'a NvptxSpec,
    pub(super) ctx: &'ctx Context,
    pub(super) module: &'a Module<'ctx>,
    buffers: Vec<BufferInfo>,
    kernels: Vec<KernelInfo>,
    /// The buffer of each (node, result) computed so far; every result of a lowered node has one.
    buf_of: BTreeMap<Value, usize>,
    /// The values the caller reads back (never folded away).
    outputs: Vec<Value>,
    /// The debug buffer of in-kernel block starts ([`NvptxSpec::debug_starts`]).
    pub(super) debug_starts: Option<usize>,
    /// The half of a joint prelude lowered first, until its partner comes
    /// ([`Assembler::joint_prelude`]).
    joint_waiting: HashSet<ValueId>,
}

pub(super) fn user(msg: impl Into<String>) -> CodegenError {
    CodegenError::User(msg.into())
}

impl<'a, 'ctx> Assembler<'a, 'ctx> {
    /// Lowers what the outputs need; returns the buffer of each output, in order.
    fn run(&mut self) -> Result<Vec<usize>, CodegenError> {
        let g = self.g;
        self.outputs = if self.spec.outputs.is_empty() {
            vec![Value::of(g.output.ok_or_else(|| user(format!("graph `{}` has no output", g.name)))?)]
        } else {
            self.spec.outputs.clone()
        };
        for o in &self.outputs {
            if !g.g.contains_node(o.node) || g.result_ty(o.node, o.result).is_none() {
                return Err(user(format!(
                    "graph `{}` has no value %{}#{} to output",
                    g.name,
                    o.node.index(),
                    o.result
                )));
            }
        }
        // Only what the outputs need is lowered (dead nodes may remain after the passes).
        let mut live = HashSet::new();
        let mut stack: Vec<ValueId> = self.outputs.iter().map(|o| o.node).collect();
        while let Some(n) = stack.pop() {
            if live.insert(n) {
                stack.extend(g.operands(n));
            }
        }
        for p in &g.params {
            let id = self.add_buffer(
                p.ty.dtype,
                &p.ty,
                BufferKind::Param { index: self.param_index(p.node)?, name: p.name.clone() },
            );
            self.buf_of.insert(Value::of(p.node), id);
        }
        for n in g.topo_order() {
            if !live.contains(&n) || matches!(g.op(n), Op::Param { .. }) {
                continue;
            }
            // A product that a `sum {contract}` reads through, or an inline value, has no
            // kernel, unless read back.
            if (crate::loop_plan::read_through(g, n) || crate::loop_plan::inlined(g, n)) && !self.is_output(n)
            {
                continue;
            }
            self.lower(n)?;
        }
        let outputs = self.outputs.clone();
        outputs.iter().map(|&o| self.buf(o)).collect()
    }

    /// Whether some result of node `n` is read back by the caller.
    fn is_output(&self, n: ValueId) -> bool {
        self.outputs.iter().any(|o| o.node == n)
    }

    fn param_index(&self, node: ValueId) -> Result<usize, CodegenError> {
        match self.g.op(node) {
            Op::Param { index, .. } => Ok(*index),
            _ => Err(CodegenError::Internal("parameter node is not a param op".into())),
        }
    }

    fn add_buffer(&mut self, dtype: DType, ty: &ValueType, kind: BufferKind) -> usize {
        self.buffers.push(BufferInfo { dtype, shape: ty.dims().cloned().collect(), kind });
        self.buffers.len() - 1
    }

    /// A buffer for every result of node `n` (kind `Value`, the result's type); returns result
    /// 0's. Kernels write all results of their node, read back or not.
    pub(super) fn result_buffers(&mut self, n: ValueId) -> usize {
        let g = self.g;
        for (r, ty) in g.result_types(n).into_iter().enumerate() {
            let v = Value { node: n, result: r as u32 };
            let b = self.add_buffer(ty.dtype, ty, BufferKind::Value(v));
            self.buf_of.insert(v, b);
        }
        self.buf_of[&Value::of(n)]
    }

    /// A kernel-private buffer (not a value of the graph).
    pub(super) fn scratch(&mut self, dtype: DType, shape: Vec<Dim>, what: String) -> usize {
        self.buffers.push(BufferInfo { dtype, shape, kind: BufferKind::Scratch(what) });
        self.buffers.len() - 1
    }

    /// Kernel-private i32 counters, zero before the first launch and left zero by every kernel
    /// that uses them ([`BufferKind::Counters`]).
    pub(super) fn counters(&mut self, shape: Vec<Dim>, what: String) -> usize {
        self.buffers.push(BufferInfo { dtype: DType::I32, shape, kind: BufferKind::Counters(what) });
        self.buffers.len() - 1
    }

    /// The buffer of value `v` (a node's result 0 when given a `ValueId`): an operand lowered
    /// before, or a result of the node being lowered.
    pub(super) fn buf(&self, v: impl Into<Value>) -> Result<usize, CodegenError> {
        let v = v.into();
        self.buf_of.get(&v).copied().ok_or_else(|| {
            CodegenError::Internal(format!("value %{}#{} has no buffer", v.node.index(), v.result))
        })
    }

    /// The type of result 0 of `v`.
    pub(super) fn ty(&self, v: ValueId) -> &'a ValueType {
        &self.g.node(v).ty
    }

    /// The compile-time value of a dimension (the head dimension).
    pub(super) fn static_dim(&self, d: &Dim, what: &str) -> Result<u32, CodegenError> {
        let v = d.eval(&|s| self.spec.dims.get(s).copied()).ok_or_else(|| {
            user(format!("the GPU kernels are specialized on {what} ({d}); give it at compile time, e.g. --shape {d}=128"))
        })?;
        u32::try_from(v).ok().filter(|v| *v > 0).ok_or_else(|| user(format!("{what} = {v} is out of range")))
    }

    /// Query heads per key/value head of q `[B, H, T, D]` and k `[B, Hk, T, D]`: 1 when the
    /// head dims are the same dim, else `H / Hk` with both static (the kernels are specialized
    /// on it).
    pub(super) fn kv_group(&self, q: ValueId, k: ValueId) -> Result<u32, CodegenError> {
        let head = |v: ValueId| self.ty(v).axes.get(1).map(|a| a.dim.clone());
        let (h, hk) = match (head(q), head(k)) {
            (Some(h), Some(hk)) if h == hk => return Ok(1),
            (Some(h), Some(hk)) => (h, hk),
            _ => return Err(user("threshold's q and k must be [B, H, T, D] tensors")),
        };
        let (h, hk) = (self.static_dim(&h, "the query heads")?, self.static_dim(&hk, "the key/value heads")?);
        if h % hk != 0 {
            return Err(user(format!("the key/value heads ({hk}) must divide the query heads ({h})")));
        }
        Ok(h / hk)
    }

    /// `[B, H, T, D]` of a rank-4 operand: (bh dims, T, D).
    pub(super) fn bhtd(&self, v: ValueId, what: &str) -> Result<(Vec<Dim>, Dim, Dim), CodegenError> {
        let d: Vec<Dim> = self.ty(v).dims().cloned().collect();
        if d.len() != 4 {
            return Err(user(format!("{what} must be a [B, H, T, D] tensor, got {}", self.ty(v))));
        }
        Ok((vec![d[0].clone(), d[1].clone()], d[2].clone(), d[3].clone()))
    }

    /// `([B, H], T)` of `gate_cumsum` node `c`'s result.
    pub(super) fn gate_dims(&self, c: ValueId) -> Result<(Vec<Dim>, Dim), CodegenError> {
        match self.ty(c).dims().cloned().collect::<Vec<Dim>>()[..] {
            [ref b, ref h, ref t] => Ok((vec![b.clone(), h.clone()], t.clone())),
            _ => Err(user(format!("gate_cumsum result must be [B, H, T], got {}", self.ty(c)))),
        }
    }

    /// The PTX entry name of kernel `op` of node `n` (unique per node and op).
    pub(super) fn name(&self, n: ValueId, op: &str) -> String {
        format!(
            "foxc_{}_{}_n{}",
            self.g.name.replace(|c: char| !c.is_ascii_alphanumeric(), "_"),
            op,
            n.index()
        )
    }

    /// Appends a launch to the plan, after the launches it depends on ([`Assembler::deps_of`]).
    pub(super) fn push(
        &mut self,
        node: ValueId,
        name: String,
        args: Vec<KernelArg>,
        launch: Launch,
        zero_first: Vec<usize>,
    ) {
        self.push_joint(node, vec![], name, args, launch, zero_first);
    }

    /// [`Assembler::push`] of a launch that also computes the results of the nodes `also`.
    pub(super) fn push_joint(
        &mut self,
        node: ValueId,
        also: Vec<ValueId>,
        name: String,
        args: Vec<KernelArg>,
        launch: Launch,
        zero_first: Vec<usize>,
    ) {
        let mut deps: Vec<usize> =
            std::iter::once(node).chain(also.iter().copied()).flat_map(|m| self.deps_of(m)).collect();
        deps.sort_unstable();
        deps.dedup();
        self.kernels.push(KernelInfo { node, also, name, args, launch, zero_first, deps });
    }

    /// What a new launch of node `n` must follow, from the data flow alone: the previous launch
    /// of `n` (a node's own launches run in order) and the last launch of each operand's node
    /// (its launches are chained the same way), looking through nodes that have no launch
    /// (folded scalars, products read through by a contracting sum) to their operands.
    fn deps_of(&self, n: ValueId) -> Vec<usize> {
        let last_of = |m: ValueId| self.kernels.iter().rposition(|k| k.node == m || k.also.contains(&m));
        let mut deps: Vec<usize> = last_of(n).into_iter().collect();
        let mut seen = HashSet::new();
        let mut stack = self.g.operands(n);
        while let Some(m) = stack.pop() {
            if !seen.insert(m) {
                continue;
            }
            match last_of(m) {
                Some(i) => deps.push(i),
                None => stack.extend(self.g.operands(m)),
            }
        }
        deps.sort_unstable();
        deps.dedup();
        deps
    }

    /// The value of a rank-0 node computable at compile time (`1 / sqrt(D)` and the like).
    fn scalar(&self, v: ValueId) -> Option<f64> {
        foxc_ir::fold::scalar_value(self.g, v, &self.spec.dims)
    }

    /// `x * s` or `x / s` with a compile-time scalar `s`: (x, s), the operands of the flat
    /// "scale" kernel (a cast that multiplies). Only where `x` has the result's axes, names
    /// included (the scaled copy is flat; a product that also transposes or broadcasts is a
    /// generic loop). The kernel of one `mul` or `div`: whether a product is computed at all is
    /// the `fold-q-scale` pass's decision (an attention or threshold that reads `x` with the
    /// factor in its scale attribute).
    fn as_scaled(&self, n: ValueId) -> Option<(ValueId, f64)> {
        let ops = self.g.operands(n);
        if ops.len() != 2 || self.ty(n).rank() == 0 || self.reads_later_results(n) || self.reads_inline(n) {
            return None;
        }
        match self.g.op(n) {
            Op::Binary(BinaryOp::Mul) => match (self.scalar(ops[0]), self.scalar(ops[1])) {
                (None, Some(s)) if self.ty(ops[0]).axes == self.ty(n).axes => Some((ops[0], s)),
                (Some(s), None) if self.ty(ops[1]).axes == self.ty(n).axes => Some((ops[1], s)),
                _ => None,
            },
            Op::Binary(BinaryOp::Div) => match (self.scalar(ops[0]), self.scalar(ops[1])) {
                (None, Some(s)) if self.ty(ops[0]).axes == self.ty(n).axes => Some((ops[0], 1.0 / s)),
                _ => None,
            },
            _ => None,
        }
    }

    /// [`crate::loop_plan::reads_unbuffered`] with this module's outputs.
    fn reads_inline(&self, n: ValueId) -> bool {
        crate::loop_plan::reads_unbuffered(self.g, n, &|x| self.is_output(x))
    }

    /// Whether node `n` reads a result other than the first of some node (a backward's dk, a
    /// forward's lse): the fast kernels take whole nodes' buffers, the generic loops any result.
    fn reads_later_results(&self, n: ValueId) -> bool {
        self.g.operand_values(n).iter().any(|v| v.result != 0)
    }

    fn lower(&mut self, n: ValueId) -> Result<(), CodegenError> {
        let g = self.g;
        let node = g.node(n);
        let joint = match node.op {
            Op::GateCumsum { .. } | Op::Threshold { .. } => self.joint_prelude(n),
            _ => None,
        };
        if let Some(jp) = joint {
            // One launch computes both, emitted at the later of the two in the order of
            // lowering, when the operands of both have their buffers.
            let partner = if n == jp.gate { jp.threshold } else { jp.gate };
            if !self.joint_waiting.remove(&partner) {
                self.joint_waiting.insert(n);
                return Ok(());
            }
            let c = self.result_buffers(jp.gate);
            let delta = self.result_buffers(jp.threshold);
            return self.threshold(jp.threshold, delta, Some((jp, c)));
        }
        let ops = g.operands(n);
        let ie = CodegenError::Internal;
        if !self.is_output(n) && self.scalar(n).is_some() {
            // Compile-time scalars are folded into the kernels that use them.
            return Ok(());
        }
        if let Some((x, s)) = self.as_scaled(n) {
            if self.ty(x).dtype.is_float() && node.ty.dtype.is_float() {
                let res = self.result_buffers(n);
                let name = self.name(n, "scale");
                return self.cast(n, name, x, self.buf(x)?, res, node.ty.dtype, Some(s));
            }
            // Otherwise the generic kernel of the mul.
        }
        match &node.op {
            Op::BlockBoundary(_) => {
                // The fuse-boundary pass moves it into the attention kernel; one left over has no
                // kernel of its own on the GPU.
                return Err(CodegenError::Unsupported {
                    op: "block_boundary outside the attention kernel (the fuse-boundary pass did not apply)"
                        .into(),
                    node: n.index(),
                });
            }
            // Its readers (the attention and threshold kernels of its q) compute it where they
            // load q ([`Self::load_map`]); it has no kernel or buffer of its own.
            Op::LoadMap { .. } => return Ok(()),
            Op::GateCumsum { .. } | Op::Threshold { .. } | Op::Attention(_)
                if self.reads_later_results(n) =>
            {
                return Err(ie(format!("{} reads a later result of a node", node.op.mnemonic())));
            }
            Op::GateCumsum { .. } | Op::Threshold { .. } | Op::Attention(_) => {}
            // The row kernel for the last axis of a static size, in any float dtype.
            Op::RmsNorm { axis, .. }
                if !self.reads_later_results(n)
                    && !self.reads_inline(n)
                    && self.last_static_axis(ops[0], axis) => {}
            // Float to float in the same layout: the flat cast kernel (of any result); the rest:
            // a generic loop.
            Op::Cast
                if !self.reads_inline(n)
                    && g.value_ty(g.operand_values(n)[0]).dtype.is_float()
                    && node.ty.dtype.is_float()
                    && g.value_ty(g.operand_values(n)[0]).axes == node.ty.axes => {}
            Op::AttentionBackward(a) => {
                let a = a.clone();
                self.result_buffers(n);
                return self.attention_backward(n, &a);
            }
            // An f32 prefix (or suffix) sum along the last axis of a buffered float tensor (the
            // gradient of a gate cumsum reads the suffix sums of dc): the gate scan's launches,
            // each row split in segments, its elements summed as they are (`ScanTerm::Plain`),
            // not a loop of one thread per row.
            Op::Cumsum { axis, reverse } if self.scans_rows(n, axis) => {
                let res = self.result_buffers(n);
                let dims: Vec<Dim> = node.ty.dims().cloned().collect();
                let (t, rows) = dims.split_last().ok_or_else(|| ie("a cumsum of rank 0".into()))?;
                let x = g.operand_values(n)[0];
                let scan = (ScanTerm::Plain, *reverse);
                return self.split_gate_scan(n, scan, x, res, (rows.to_vec(), t.clone()));
            }
            op if generic::handles(op) => {
                let res = self.result_buffers(n);
                return self.generic(n, res);
            }
            other => {
                return Err(CodegenError::Unsupported { op: other.mnemonic().to_string(), node: n.index() })
            }
        }
        let res = self.result_buffers(n);
        let arity_ok = node.op.arity().is_none_or(|a| a == ops.len());
        if !arity_ok {
            return Err(ie(format!("{} has {} operands", node.op.mnemonic(), ops.len())));
        }
        match &node.op {
            Op::GateCumsum { kind, split_rows } => self.gate_cumsum(n, (*kind, *split_rows), ops[0], res)?,
            Op::RmsNorm { axis, eps } => self.rmsnorm(n, axis, *eps, (ops[0], ops[1]), res)?,
            Op::Cast => {
                let x = g.operand_values(n)[0];
                let name = self.name(n, "cast");
                self.cast(n, name, x, self.buf(x)?, res, node.ty.dtype, None)?;
            }
            Op::Threshold { .. } => self.threshold(n, res, None)?,
            Op::Attention(a) => self.attention(n, res, a)?,
            _ => unreachable!("filtered above"),
        }
        Ok(())
    }

    /// The `gate_cumsum` launch: one block per row scans it (gate logits or log gates), or
    /// with `split_rows` two launches of a block per segment ([`Self::split_gate_scan`]), or one
    /// thread per element of an ALiBi slope row.
    fn gate_cumsum(
        &mut self,
        n: ValueId,
        (kind, split_rows): (GateKind, bool),
        x: ValueId,
        res: usize,
    ) -> Result<(), CodegenError> {
        let ie = CodegenError::Internal;
        let xdt = self.ty(x).dtype;
        let (bh, t) = self.gate_dims(n)?;
        if split_rows && kind != GateKind::Slope {
            return self.split_gate_scan(n, (ScanTerm::Gate(kind), false), x, res, (bh, t));
        }
        let name = self.name(n, "gate_cumsum");
        match kind {
            GateKind::Logits | GateKind::LogGate => {
                kernels::build_gate_scan(self.ctx, self.module, &name, kind, xdt).map_err(ie)?;
                let args =
                    vec![KernelArg::Buffer(self.buf(x)?), KernelArg::Buffer(res), KernelArg::I32(vec![t])];
                let launch =
                    Launch::Grid { x: GridDim::Ceil(bh, 1), y: GridDim::Const(1), block: SCAN_THREADS };
                self.push(n, name, args, launch, vec![]);
            }
            GateKind::Slope => {
                kernels::build_gate_slope(self.ctx, self.module, &name, xdt).map_err(ie)?;
                let h = bh[1].clone();
                let args = vec![
                    KernelArg::Buffer(self.buf(x)?),
                    KernelArg::Buffer(res),
                    KernelArg::I32(vec![t.clone()]),
                    KernelArg::I32(vec![h]),
                ];
                let launch = Launch::Grid {
                    x: GridDim::Ceil(vec![t], ELEM_THREADS),
                    y: GridDim::Ceil(bh, 1),
                    block: ELEM_THREADS,
                };
                self.push(n, name, args, launch, vec![]);
            }
        }
        Ok(())
    }

    /// The `rmsnorm` row kernel over the last axis (of a static size).
    fn rmsnorm(
        &mut self,
        n: ValueId,
        axis: &str,
        eps: f64,
        (x, w): (ValueId, ValueId),
        res: usize,
    ) -> Result<(), CodegenError> {
        let ie = CodegenError::Internal;
        let xd: Vec<Dim> = self.ty(x).dims().cloned().collect();
        if xd.is_empty() || (axis != "3" && *axis != (xd.len() - 1).to_string()) {
            return Err(CodegenError::Unsupported {
                op: format!("rmsnorm over axis {axis} (only the last axis)"),
                node: n.index(),
            });
        }
        let d = self.static_dim(xd.last().ok_or_else(|| ie("rank 0".into()))?, "the normalized axis")?;
        let rows = xd[..xd.len() - 1].to_vec();
        let name = self.name(n, "rmsnorm");
        kernels::build_rmsnorm(
            self.ctx,
            self.module,
            &name,
            d,
            eps,
            (self.ty(x).dtype, self.ty(w).dtype, self.ty(n).dtype),
        )
        .map_err(ie)?;
        let args = vec![
            KernelArg::Buffer(self.buf(x)?),
            KernelArg::Buffer(self.buf(w)?),
            KernelArg::Buffer(res),
            KernelArg::I32(rows.clone()),
        ];
        let launch = Launch::Grid {
            x: GridDim::Ceil(rows, ROW_THREADS / 32),
            y: GridDim::Const(1),
            block: ROW_THREADS,
        };
        self.push(n, name, args, launch, vec![]);
        Ok(())
    }

    /// Whether `cumsum` node `n` along `axis` runs as the row scan: its operand has a buffer, a
    /// float dtype and the result's axes, `axis` is the last of them, and the result is f32.
    fn scans_rows(&self, n: ValueId, axis: &str) -> bool {
        let x = self.g.operand_values(n)[0];
        let (xt, nt) = (self.g.value_ty(x), self.ty(n));
        !self.reads_inline(n)
            && xt.dtype.is_float()
            && nt.dtype == DType::F32
            && xt.axes == nt.axes
            && nt.axes.last().is_some_and(|a| a.name == axis)
    }

    /// Whether `axis` is the last axis of `x` and its size is static (what the rmsnorm row
    /// kernel needs; other rmsnorms run in a generic loop).
    fn last_static_axis(&self, x: ValueId, axis: &str) -> bool {
        let ax = &self.ty(x).axes;
        ax.last().is_some_and(|a| {
            a.name == axis && a.dim.eval(&|s| self.spec.dims.get(s).copied()).is_some_and(|d| d > 0)
        })
    }

    /// The generic loop kernel of node `n` (`nvptx::generic`) writing buffer `res`.
    fn generic(&mut self, n: ValueId, res: usize) -> Result<(), CodegenError> {
        // An operand without a buffer is a compile-time scalar folded into its users.
        let folded = |v: Value| {
            if v.result == 0 && !self.buf_of.contains_key(&v) {
                self.scalar(v.node)
            } else {
                None
            }
        };
        let p = generic::plan(self.g, n, &folded)?;
        let name = self.name(n, self.g.op(n).mnemonic());
        generic::build(self.ctx, self.module, &name, &p.kernel).map_err(CodegenError::Internal)?;
        let mut args = Vec::with_capacity(p.operands.len() + 1 + p.scalars.len());
        for &v in &p.operands {
            args.push(KernelArg::Buffer(self.buf(v)?));
        }
        args.push(KernelArg::Buffer(res));
        args.extend(p.scalars.iter().map(|d| KernelArg::I64(d.clone())));
        let launch = match p.kernel.body {
            generic::Body::Map => Launch::Grid {
                x: GridDim::Ceil(p.sizes.clone(), generic::MAP_THREADS * generic::MAP_ELEMS),
                y: GridDim::Const(1),
                block: generic::MAP_THREADS,
            },
            _ => Launch::Grid {
                x: GridDim::Ceil(p.sizes[..p.sizes.len() - 1].to_vec(), p.kernel.lines_per_block()),
                y: GridDim::Const(1),
                block: generic::LINE_THREADS,
            },
        };
        self.push(n, name, args, launch, vec![]);
        Ok(())
    }

    /// A cast kernel from buffer `src` (value `x`'s dtype) into buffer `dst` of dtype `to`,
    /// multiplying by `mul` on the way if given.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn cast(
        &mut self,
        n: ValueId,
        name: String,
        x: impl Into<Value>,
        src: usize,
        dst: usize,
        to: DType,
        mul: Option<f64>,
    ) -> Result<(), CodegenError> {
        let xt = self.g.value_ty(x.into());
        let dims: Vec<Dim> = xt.dims().cloned().collect();
        self.cast_buffer(n, name, (src, xt.dtype, dims), dst, to, mul)
    }

    /// [`Self::cast`] of buffer `src` of dtype `from` and shape `dims` (a scratch of no node's
    /// type: a kernel's f32 output on its way to the node's dtype).
    pub(super) fn cast_buffer(
        &mut self,
        n: ValueId,
        name: String,
        (src, from, dims): (usize, DType, Vec<Dim>),
        dst: usize,
        to: DType,
        mul: Option<f64>,
    ) -> Result<(), CodegenError> {
        if !from.is_float() || !to.is_float() {
            return Err(CodegenError::Unsupported { op: format!("cast {from} -> {to}"), node: n.index() });
        }
        kernels::build_cast(self.ctx, self.module, &name, from, to, mul).map_err(CodegenError::Internal)?;
        let args = vec![KernelArg::Buffer(src), KernelArg::Buffer(dst), KernelArg::I64(dims.clone())];
        let launch = Launch::Grid {
            x: GridDim::Ceil(dims, ELEM_THREADS * kernels::CAST_ELEMS),
            y: GridDim::Const(1),
            block: ELEM_THREADS,
        };
        self.push(n, name, args, launch, vec![]);
        Ok(())
    }

    /// `gate_cumsum` with split rows, or a generic `cumsum` (`ScanTerm::Plain`; `reverse`: the
    /// suffix sum): the segments' sums into a scratch `[BH, S, 2]`, then a block per segment
    /// scans it from the sum of the segments before it.
    fn split_gate_scan(
        &mut self,
        n: ValueId,
        (term, reverse): (ScanTerm, bool),
        x: impl Into<Value>,
        res: usize,
        (bh, t): (Vec<Dim>, Dim),
    ) -> Result<(), CodegenError> {
        let ie = CodegenError::Internal;
        let x = x.into();
        let xdt = self.g.value_ty(x).dtype;
        let segments = GridDim::Ceil(vec![t.clone()], kernels::SCAN_SEGMENT);
        let mut shape = bh.clone();
        shape.extend([Dim::Tiles(Box::new(t.clone()), kernels::SCAN_SEGMENT), Dim::Const(2)]);
        let totals = self.scratch(DType::F32, shape, format!("segment sums of %{}", n.index()));
        let launch =
            Launch::Grid { x: segments, y: GridDim::Ceil(bh, 1), block: kernels::SPLIT_SCAN_THREADS };
        let sums = self.name(n, "gate_segment_sums");
        kernels::build_gate_segment_sums(self.ctx, self.module, &sums, (term, xdt), reverse).map_err(ie)?;
        let xb = self.buf(x)?;
        let args = vec![KernelArg::Buffer(xb), KernelArg::Buffer(totals), KernelArg::I32(vec![t.clone()])];
        self.push(n, sums, args, launch.clone(), vec![]);
        let scan = self.name(n, "gate_scan_segments");
        kernels::build_gate_scan_segments(self.ctx, self.module, &scan, (term, xdt), reverse).map_err(ie)?;
        let args = vec![
            KernelArg::Buffer(xb),
            KernelArg::Buffer(totals),
            KernelArg::Buffer(res),
            KernelArg::I32(vec![t]),
        ];
        self.push(n, scan, args, launch, vec![]);
        Ok(())
    }

    /// The value of a scale attribute (its dims must be static, like the head dim): the
    /// kernels' factor of `q . k`, the q factor included.
    pub(super) fn scale_value(&self, s: &foxc_ir::Scale) -> Result<f64, CodegenError> {
        // `q` is 1 without a q factor, and `base * 1` is `base` exactly.
        let (base, q) = self.scale_parts(s)?;
        Ok(base * q)
    }

    /// A scale attribute as `(factor / sqrt(dim), q factor)` (the q factor 1 without one): the
    /// threshold scales its statistics of q by the second apart (`threshold::DeltaSpec`).
    pub(super) fn scale_parts(&self, s: &foxc_ir::Scale) -> Result<(f64, f64), CodegenError> {
        let base = match &s.inv_sqrt {
            None => s.factor,
            Some(d) => s.factor / (self.static_dim(d, "the dim of the scale")? as f64).sqrt(),
        };
        let q = s.q_value(&|x| self.spec.dims.get(x).copied()).ok_or_else(|| {
            user(format!(
                "the GPU kernels are specialized on the scale's q factor ({s}); give its dims at compile time, e.g. --shape D=128"
            ))
        })?;
        Ok((base, q))
    }

    /// The captured tensors' dtypes and ranks, as a score region's hook reads them.
    pub(super) fn capture_tys(&self, captures: &[ValueId]) -> Vec<CaptureTy> {
        let bound = |d: &Dim| d.eval(&|s| self.spec.dims.get(s).copied());
        captures
            .iter()
            .map(|&c| {
                let ty = self.ty(c);
                CaptureTy { dtype: ty.dtype, rank: ty.rank(), last: ty.dims().last().and_then(bound) }
            })
            .collect()
    }

    /// The load map that `q` is, if it is one (docs/SEMANTICS.md, "load_map"): its `x`, its
    /// function and its captured tensors (the verifier admits one only as a q).
    pub(super) fn load_map(&self, q: ValueId) -> Option<LoadMapOf<'a>> {
        let g: &'a Graph = self.g;
        let Op::LoadMap { f } = g.op(q) else { return None };
        let ops = g.operands(q);
        Some(LoadMapOf { x: ops[0], f, captures: ops[1..].to_vec() })
    }

    /// The argument of a region's kernel parameter `arg` (region.rs, [`ScoreArg`]): the head
    /// count `heads`, a tensor of `captures` (by capture number) or its size, or the dim of
    /// `dim_arg`.
    pub(super) fn region_arg(
        &self,
        arg: ScoreArg,
        captures: &[ValueId],
        heads: &Dim,
        dim_arg: &dyn Fn(usize) -> Option<Dim>,
    ) -> Result<KernelArg, CodegenError> {
        Ok(match arg {
            ScoreArg::Heads => KernelArg::I32(vec![heads.clone()]),
            ScoreArg::Capture(k) => KernelArg::Buffer(self.buf(captures[k])?),
            ScoreArg::CaptureDim(k, ax) => {
                KernelArg::I32(self.ty(captures[k]).dims().nth(ax).cloned().into_iter().collect())
            }
            ScoreArg::Dim(n) => KernelArg::I32(dim_arg(n).into_iter().collect()),
        })
    }

    /// The head count of `q` (its axis 1) where the bound dims give it: a score region's `b`
    /// and `h` need it.
    pub(super) fn bound_heads(&self, q: ValueId) -> Option<u64> {
        self.ty(q).axes.get(1).and_then(|ax| ax.dim.eval(&|s| self.spec.dims.get(s).copied()))
    }

    /// "the GPU backend cannot yet run <construct>", before any launch.
    pub(super) fn not_yet(n: ValueId, what: &str) -> CodegenError {
        CodegenError::NotYet { what: what.to_string(), node: n.index() }
    }
}
