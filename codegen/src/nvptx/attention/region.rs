//! The score hook of a generic attention region (docs/SEMANTICS.md, "attention"): the
//! [`Region`] emitted node by node on one score element, in f32. The f64 interpreter
//! (`foxc_ir::interp::region`) is the definition; the CPU backend's `cpu/region.rs` is the same
//! translation in Cranelift. Transcendentals use the PTX approximations (`ex2`, `lg2`), whose
//! errors (about 2^-22) are far below the bf16 inputs' (2^-8); where a formula would lose
//! that accuracy by cancellation (`log(1 + e)` for small `e`) a short series takes over.
//! Captured tensors (`kb[b, h, j]`, `rel[h, i - j]`) are read through their index expressions on
//! each element (each lane knows its `i` and `j`): a kernel parameter per tensor and per axis
//! size ([`ScoreArg`]); a subscript outside its axis reads NaN, as in the interpreter, without
//! touching memory (the front end proves that only entries the mask drops do that).

use super::score::{ScoreMod, ScorePos, FIRST_PARAM};
use crate::capture_index::{contiguous_in_j, SubConsts};
use crate::nvptx::builder::{KernelBuilder, ParamTy};
use foxc_ir::attention::{IndexVar, RNode, Region};
use foxc_ir::index::IndexExpr;
use foxc_ir::{BinaryOp, DType, Dim, UnaryOp};
use inkwell::values::{BasicValueEnum, FloatValue, IntValue};
use inkwell::{FloatPredicate, IntPredicate};

const LOG2E: f64 = std::f64::consts::LOG2_E;
const LN2: f64 = std::f64::consts::LN_2;

/// One kernel argument a region needs beyond the attention kernel's own, in parameter order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ScoreArg {
    /// The query head count `H` (i32), to split the flat `bh` into `b` and `h`; only when the
    /// region reads `b` or `h` and `H` is not static.
    Heads,
    /// The device pointer of captured tensor `k` (operand `captures[k]`).
    Capture(usize),
    /// The size of axis `a` of captured tensor `k` (i32).
    CaptureDim(usize, usize),
    /// Dim number `n` of [`RegionMod::dims`] (i32), one that is not static: a region's
    /// `RNode::Dim` or a dim term of a capture subscript (`T - 1 - i`), bound at launch.
    Dim(usize),
}

/// A captured tensor as the kernel reads it: element type and rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CaptureTy {
    pub dtype: DType,
    pub rank: usize,
    /// The size of the last axis where the bound dims give it (reads along it may be vectors:
    /// [`RegionMod::capture_lanes`]).
    pub last: Option<u64>,
}

/// One region with its dims resolved: the score region, or an expression mask's condition.
#[derive(Clone, Debug)]
struct Resolved {
    region: Region,
    /// The value of each `RNode::Dim`, by node position (0 elsewhere): a number when static,
    /// else a kernel argument.
    dims: Vec<DimValue>,
    /// Per capture node (by node position), each subscript as the kernel computes it.
    subs: Vec<Vec<KernelSub>>,
}

/// A capture subscript: its static offset and divisor, plus its dim terms that are kernel
/// arguments (`(n of ScoreArg::Dim(n), coefficient)`).
#[derive(Clone, Debug)]
struct KernelSub {
    consts: SubConsts,
    args: Vec<(usize, i64)>,
}

/// A dim of a region as the kernel has it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum DimValue {
    Static(f64),
    /// `ScoreArg::Dim(n)`.
    Arg(usize),
}

/// A score region (and the attention's expression mask, if any) with its dims resolved and its
/// kernel parameters laid out: the two regions share the captured tensors' parameters.
#[derive(Clone, Debug)]
pub(crate) struct RegionMod {
    region: Resolved,
    /// The condition of an expression mask (`Mask::Expr`): non-zero (NaN included, as in the
    /// interpreter) keeps the element.
    mask: Option<Resolved>,
    /// The attention's `keys_from` bound `E(b, h, i)`: keys `j < E` are masked on row `i`.
    keys_from: Option<Resolved>,
    /// The attention's epilogue `F(o, b, h, i, d)` (its `x` the output, its `j` the column).
    epilogue: Option<Resolved>,
    /// The load map of the attention's q `M(x, b, h, i, d)` (docs/SEMANTICS.md, "load_map"; its
    /// `x` the element of q's tensor, its `j` the column `d`): the kernel computes it where it
    /// loads the Q tile.
    q_map: Option<Resolved>,
    /// Heads per batch (`H`), to split the kernel's flat `bh` into `b` and `h`, when static.
    heads: Option<u64>,
    /// The extra kernel arguments, in parameter order.
    args: Vec<ScoreArg>,
    /// The captured tensors the region reads, by capture number.
    caps: Vec<Option<CaptureTy>>,
    /// The dims the regions read that are not static, in [`ScoreArg::Dim`] order.
    dims: Vec<Dim>,
    /// The kernel parameter of the first argument ([`FIRST_PARAM`] in the forward kernel;
    /// the backward kernels' own count there, [`RegionMod::with_first_param`]).
    first_param: u32,
}

impl RegionMod {
    /// [`RegionMod::with_captures`] of a region that reads no captured tensor.
    // (The kernels build theirs with `with_mask` / `sharing_params`; the tests with these.)
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn new(
        r: &Region,
        dim: &dyn Fn(&Dim) -> Option<u64>,
        heads: Option<u64>,
    ) -> Result<RegionMod, String> {
        RegionMod::with_captures(r, dim, heads, &[])
    }

    /// Resolves the dims of `r` whose captured tensors have types `caps` (by capture number);
    /// `Err` says what the GPU kernel cannot evaluate.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn with_captures(
        r: &Region,
        dim: &dyn Fn(&Dim) -> Option<u64>,
        heads: Option<u64>,
        caps: &[CaptureTy],
    ) -> Result<RegionMod, String> {
        RegionMod::with_mask(r, None, None, dim, heads, caps)
    }

    /// [`RegionMod::with_captures`] of score region `r`, the condition `mask` of an expression
    /// mask (a region of the indices, dims and captures; it must not read `x`) and the key
    /// bound `keys_from` a pass proved for it (a region of `b, h, i`, dims and captures).
    pub(crate) fn with_mask(
        r: &Region,
        mask: Option<&Region>,
        keys_from: Option<&Region>,
        dim: &dyn Fn(&Dim) -> Option<u64>,
        heads: Option<u64>,
        caps: &[CaptureTy],
    ) -> Result<RegionMod, String> {
        let heads = heads.filter(|h| *h > 0);
        let mut read = vec![None; caps.len()];
        let mut reads_bh = false;
        let mut dyn_dims = vec![];
        let region = resolve(r, dim, caps, &mut read, &mut reads_bh, &mut dyn_dims)?;
        let mask = match mask {
            Some(m) if m.uses_score() => return Err("an expression mask that reads the score".into()),
            Some(m) => Some(resolve(m, dim, caps, &mut read, &mut reads_bh, &mut dyn_dims)?),
            None => None,
        };
        let keys_from = match keys_from {
            Some(e) if e.uses_score() => return Err("a keys_from bound that reads the score".into()),
            Some(e) => Some(resolve(e, dim, caps, &mut read, &mut reads_bh, &mut dyn_dims)?),
            None => None,
        };
        let args = layout(&read, reads_bh && heads.is_none(), dyn_dims.len());
        Ok(RegionMod {
            region,
            mask,
            keys_from,
            epilogue: None,
            q_map: None,
            heads,
            args,
            caps: read,
            dims: dyn_dims,
            first_param: FIRST_PARAM,
        })
    }

    /// The same regions and the forward kernel's epilogue `e` (if any), whose captured tensors
    /// and dims join the kernel's arguments.
    pub(crate) fn with_epilogue(
        mut self,
        e: Option<&Region>,
        dim: &dyn Fn(&Dim) -> Option<u64>,
        caps: &[CaptureTy],
    ) -> Result<RegionMod, String> {
        self.epilogue = e.map(|e| self.join(e, dim, caps)).transpose()?;
        Ok(self)
    }

    /// The same regions and the load map `m` of q (if any; its captures numbered after the
    /// attention's, [`Region::shift_captures`]), whose captured tensors and dims join the
    /// kernel's arguments.
    pub(crate) fn with_q_map(
        mut self,
        m: Option<&Region>,
        dim: &dyn Fn(&Dim) -> Option<u64>,
        caps: &[CaptureTy],
    ) -> Result<RegionMod, String> {
        self.q_map = m.map(|m| self.join(m, dim, caps)).transpose()?;
        Ok(self)
    }

    /// Resolves region `r` of the same kernel, adding the captures, dims and head count it reads
    /// to the kernel's arguments.
    fn join(
        &mut self,
        r: &Region,
        dim: &dyn Fn(&Dim) -> Option<u64>,
        caps: &[CaptureTy],
    ) -> Result<Resolved, String> {
        let mut read = self.caps.clone();
        read.resize(caps.len().max(read.len()), None);
        let mut reads_bh = self.args.contains(&ScoreArg::Heads);
        let mut dyn_dims = self.dims.clone();
        let resolved = resolve(r, dim, caps, &mut read, &mut reads_bh, &mut dyn_dims)?;
        self.args = layout(&read, reads_bh && self.heads.is_none(), dyn_dims.len());
        self.caps = read;
        self.dims = dyn_dims;
        Ok(resolved)
    }

    /// The same region with its arguments from kernel parameter `first` on.
    pub(crate) fn with_first_param(mut self, first: u32) -> RegionMod {
        self.first_param = first;
        self
    }

    /// Region `r` (a derivative of `base`'s score region) reading through `base`'s kernel
    /// parameters, so that both are emitted in one kernel; `Err` when `r` reads a captured
    /// tensor or the head count that `base` has no parameter for.
    pub(crate) fn sharing_params(
        r: &Region,
        base: &RegionMod,
        dim: &dyn Fn(&Dim) -> Option<u64>,
        caps: &[CaptureTy],
    ) -> Result<RegionMod, String> {
        let mut read = vec![None; caps.len()];
        let mut reads_bh = false;
        // The derivative's dims must be among the base's (it reads through the base's
        // parameters): start from the base's list and see whether it grew.
        let mut dyn_dims = base.dims.clone();
        let region = resolve(r, dim, caps, &mut read, &mut reads_bh, &mut dyn_dims)?;
        let missing_dim = dyn_dims.len() > base.dims.len();
        let missing_cap = read
            .iter()
            .enumerate()
            .any(|(k, t)| t.is_some() && base.caps.get(k).copied().flatten().is_none());
        let missing_heads = reads_bh && base.heads.is_none() && !base.args.contains(&ScoreArg::Heads);
        if missing_cap || missing_heads || missing_dim {
            return Err("a derivative region reads what its score region does not".into());
        }
        Ok(RegionMod { region, mask: None, keys_from: None, epilogue: None, q_map: None, ..base.clone() })
    }

    /// The region on the elements `xs` at the consecutive columns `at.j + e` (`at.j` a multiple
    /// of their count) of one row: [`ScoreMod::emit`] of each, its captures read along `j` in
    /// 16-byte loads where they can be.
    pub(crate) fn emit_lanes<'ctx>(
        &self,
        b: &KernelBuilder<'_, 'ctx>,
        xs: &[FloatValue<'ctx>],
        at: ScorePos<'ctx>,
    ) -> Vec<FloatValue<'ctx>> {
        self.eval_lanes(&self.region, b, xs, at)
    }

    /// The kernel arguments the region adds after the attention kernel's own, in order.
    pub(crate) fn args(&self) -> &[ScoreArg] {
        &self.args
    }

    /// The dim of argument [`ScoreArg::Dim`]`(n)`.
    pub(crate) fn dim_arg(&self, n: usize) -> Option<&Dim> {
        self.dims.get(n)
    }

    /// The parameter number of argument `a`.
    fn param(&self, a: ScoreArg) -> u32 {
        // A missing argument is a bug: the builder reports the missing parameter.
        self.args.iter().position(|x| *x == a).map_or(u32::MAX, |p| self.first_param + p as u32)
    }

    /// `(b, h)` of the flat batch-head index `bh`.
    fn split_bh<'ctx>(
        &self,
        b: &KernelBuilder<'_, 'ctx>,
        bh: IntValue<'ctx>,
    ) -> (IntValue<'ctx>, IntValue<'ctx>) {
        let bi = match self.heads {
            Some(h) => b.sdivc(bh, h as i64),
            None => b.sdiv(bh, b.param_int(self.param(ScoreArg::Heads))),
        };
        let h = match self.heads {
            Some(h) => b.sub(bh, b.mulc(bi, h as i64)),
            None => b.sub(bh, b.mul(bi, b.param_int(self.param(ScoreArg::Heads)))),
        };
        (bi, h)
    }

    /// Captured tensor `k` at `index` (its resolved numbers `subs`): the element, widened to f32, or
    /// NaN when a subscript is outside its axis (no memory is read then: the index is clamped
    /// to 0 and the value replaced).
    fn capture<'ctx>(
        &self,
        b: &KernelBuilder<'_, 'ctx>,
        k: usize,
        index: &[IndexExpr],
        subs: &[KernelSub],
        at: ScorePos<'ctx>,
    ) -> FloatValue<'ctx> {
        let Some((ty, ok, off)) = self.capture_at(b, k, index, subs, at) else {
            return b.f32(f64::NAN);
        };
        let v = b.load_f(ty.dtype, b.param_ptr(self.param(ScoreArg::Capture(k))), off);
        b.select_f(ok, v, b.f32(f64::NAN))
    }

    /// Where captured tensor `k` is read at `index`: its type, whether every subscript is inside
    /// its axis (i1), and the element offset (0 where one is not). `None` (reported to the
    /// builder) when the kernel has no parameter for it.
    fn capture_at<'ctx>(
        &self,
        b: &KernelBuilder<'_, 'ctx>,
        k: usize,
        index: &[IndexExpr],
        subs: &[KernelSub],
        at: ScorePos<'ctx>,
    ) -> Option<(CaptureTy, IntValue<'ctx>, IntValue<'ctx>)> {
        let Some(ty) = self.caps.get(k).copied().flatten() else {
            b.fail(format!("capture {k} has no kernel parameter"));
            return None;
        };
        let (bi, hi) = self.split_bh(b, at.bh);
        let var = |v: &str| match IndexVar::from_name(v) {
            Some(IndexVar::B) => bi,
            Some(IndexVar::H) => hi,
            Some(IndexVar::I) => at.i,
            Some(IndexVar::J) => at.j,
            None => {
                b.fail(format!("capture index variable `{v}`"));
                at.i
            }
        };
        let mut ok = b.bool(true);
        let mut off = b.i64(0);
        for (a, (e, KernelSub { consts: sc, args: dyn_terms })) in index.iter().zip(subs).enumerate() {
            let mut p = b.i32(sc.offset);
            for (v, c) in &e.terms {
                p = b.add(p, b.mulc(var(v), *c));
            }
            for &(n, c) in dyn_terms {
                p = b.add(p, b.mulc(b.param_int(self.param(ScoreArg::Dim(n))), c));
            }
            if let Some(d) = &sc.div {
                // Floor division (the subscript may be negative): round toward -inf first.
                let neg = b.icmpc(IntPredicate::SLT, p, 0);
                p = b.sdivc(b.select_i(neg, b.addc(p, 1 - d), p), *d);
            }
            for &(kind, c) in &sc.clamps {
                p = match kind {
                    foxc_ir::index::ClampKind::Min => b.smin(p, b.i32(c)),
                    foxc_ir::index::ClampKind::Max => b.smax(p, b.i32(c)),
                };
            }
            let n = b.param_int(self.param(ScoreArg::CaptureDim(k, a)));
            let inside = b.and(b.icmpc(IntPredicate::SGE, p, 0), b.icmp(IntPredicate::SLT, p, n));
            ok = b.and(ok, inside);
            let p = b.select_i(inside, p, b.i32(0));
            off = b.add(b.mul(off, b.sext64(n)), b.sext64(p));
        }
        Some((ty, ok, off))
    }
}

/// The kernel arguments for the captures `read` (in capture order, each with its axis sizes),
/// after the head count when `heads` (it is not static and a region reads `b` or `h`).
fn layout(read: &[Option<CaptureTy>], heads: bool, dims: usize) -> Vec<ScoreArg> {
    let mut args = vec![];
    if heads {
        args.push(ScoreArg::Heads);
    }
    args.extend((0..dims).map(ScoreArg::Dim));
    for (k, ty) in read.iter().enumerate() {
        if let Some(ty) = ty {
            args.push(ScoreArg::Capture(k));
            args.extend((0..ty.rank).map(|a| ScoreArg::CaptureDim(k, a)));
        }
    }
    args
}

/// Resolves the dims of region `r` (captured tensors of types `caps`), marking in `read` the
/// captures it reads and in `reads_bh` whether it needs `b` or `h`.
fn resolve(
    r: &Region,
    dim: &dyn Fn(&Dim) -> Option<u64>,
    caps: &[CaptureTy],
    read: &mut [Option<CaptureTy>],
    reads_bh: &mut bool,
    dyn_dims: &mut Vec<Dim>,
) -> Result<Resolved, String> {
    if let Some(m) = r.malformed() {
        return Err(m);
    }
    let mut arg_of = |d: &Dim| match dyn_dims.iter().position(|x| x == d) {
        Some(n) => n,
        None => {
            dyn_dims.push(d.clone());
            dyn_dims.len() - 1
        }
    };
    let mut dims = vec![DimValue::Static(0.0); r.nodes.len()];
    let mut subs = vec![vec![]; r.nodes.len()];
    for (n, node) in r.nodes.iter().enumerate() {
        match node {
            RNode::Dim(d) => {
                dims[n] = match dim(d) {
                    Some(v) => DimValue::Static(v as f64),
                    None => DimValue::Arg(arg_of(d)),
                }
            }
            RNode::Index(IndexVar::B | IndexVar::H) => *reads_bh = true,
            RNode::Capture { k, index } => {
                let ty = *caps.get(*k).ok_or_else(|| {
                    format!("the score region reads capture {k}, which the attention does not have")
                })?;
                if !matches!(ty.dtype, DType::F32 | DType::BF16 | DType::F16 | DType::I32) {
                    return Err(format!(
                        "a captured tensor of dtype {} in the score region (float or i32 tensors only)",
                        ty.dtype
                    ));
                }
                if index.len() != ty.rank {
                    return Err(format!("capture {k} has rank {} but {} subscripts", ty.rank, index.len()));
                }
                for e in index {
                    *reads_bh |= e.vars().iter().any(|v| *v == "b" || *v == "h");
                    let (sc, rest) = SubConsts::resolve_partly(e, dim)?;
                    subs[n].push(KernelSub {
                        consts: sc,
                        args: rest.iter().map(|(d, k)| (arg_of(d), *k)).collect(),
                    });
                }
                read[*k] = Some(ty);
            }
            _ => {}
        }
    }
    Ok(Resolved { region: r.clone(), dims, subs })
}

impl Resolved {
    /// The value of node `n` when it is a constant or a resolved dim.
    fn constant(&self, n: u32) -> Option<f64> {
        match self.region.nodes.get(n as usize)? {
            RNode::Const(c) => Some(*c),
            RNode::Dim(_) => match self.dims[n as usize] {
                DimValue::Static(v) => Some(v),
                DimValue::Arg(_) => None,
            },
            _ => None,
        }
    }
}

/// FNV-1a, 64 bits: a stable hash for the kernel name (the same region gives the same name in
/// every build, so PTX snapshots are stable).
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, c| (h ^ c as u64).wrapping_mul(0x0100_0000_01b3))
}

impl RegionMod {
    /// Region `rs` (the score's or the mask's) on one element, node by node, in f32.
    fn eval<'a, 'ctx>(
        &self,
        rs: &Resolved,
        b: &KernelBuilder<'a, 'ctx>,
        x: FloatValue<'ctx>,
        at: ScorePos<'ctx>,
    ) -> FloatValue<'ctx> {
        let mut vals: Vec<FloatValue<'ctx>> = Vec::with_capacity(rs.region.nodes.len());
        let counts = rs.region.counts();
        for n in 0..rs.region.nodes.len() {
            let val = self.node_value(rs, b, (n, &counts), &|k| vals[k as usize], x, at);
            vals.push(val);
        }
        vals[rs.region.root as usize]
    }

    /// Region `rs` on the `xs.len()` consecutive columns `at.j + e` of one row (`at.j` a
    /// multiple of their count), node by node and lane by lane, except that a captured tensor
    /// read along `j` ([`RegionMod::capture_lanes`]) is read for all lanes at once.
    fn eval_lanes<'a, 'ctx>(
        &self,
        rs: &Resolved,
        b: &KernelBuilder<'a, 'ctx>,
        xs: &[FloatValue<'ctx>],
        at: ScorePos<'ctx>,
    ) -> Vec<FloatValue<'ctx>> {
        let lanes = xs.len();
        let at_lane: Vec<_> = (0..lanes).map(|e| ScorePos { j: b.addc(at.j, e as i64), ..at }).collect();
        let mut vals: Vec<Vec<FloatValue<'ctx>>> = Vec::with_capacity(rs.region.nodes.len());
        let counts = rs.region.counts();
        for (n, node) in rs.region.nodes.iter().enumerate() {
            let read = match node {
                RNode::Capture { k, index } => self.capture_lanes(b, *k, index, &rs.subs[n], at, lanes),
                _ => None,
            };
            let val = read.unwrap_or_else(|| {
                (0..lanes)
                    .map(|e| {
                        self.node_value(rs, b, (n, &counts), &|k| vals[k as usize][e], xs[e], at_lane[e])
                    })
                    .collect()
            });
            vals.push(val);
        }
        vals.swap_remove(rs.region.root as usize)
    }

    /// Node `n` of region `rs` on one element (`counts`: the region's count nodes), its
    /// operands' values from `v`.
    fn node_value<'a, 'ctx>(
        &self,
        rs: &Resolved,
        b: &KernelBuilder<'a, 'ctx>,
        (n, counts): (usize, &[bool]),
        v: &dyn Fn(u32) -> FloatValue<'ctx>,
        x: FloatValue<'ctx>,
        at: ScorePos<'ctx>,
    ) -> FloatValue<'ctx> {
        let node = &rs.region.nodes[n];
        let count_product = rs.region.count_product(node, counts);
        match node {
            RNode::Score => x,
            RNode::Index(var) => {
                let ix = match var {
                    IndexVar::B => self.split_bh(b, at.bh).0,
                    IndexVar::H => self.split_bh(b, at.bh).1,
                    IndexVar::I => at.i,
                    IndexVar::J => at.j,
                };
                b.index_f32(ix)
            }
            RNode::Dim(_) => match rs.dims[n] {
                DimValue::Static(v) => b.f32(v),
                DimValue::Arg(k) => b.sitofp(b.param_int(self.param(ScoreArg::Dim(k)))),
            },
            RNode::Const(c) => b.f32(*c),
            RNode::Capture { k, index } => self.capture(b, *k, index, &rs.subs[n], at),
            RNode::Unary(u, a) => unary(b, *u, v(*a)),
            // Division by a constant (softcap's x / U): a product with the reciprocal,
            // within 1.5 ulp of the quotient, no division in the score loop.
            RNode::Binary(BinaryOp::Div, a, c) if rs.constant(*c).is_some_and(|k| k != 0.0) => {
                b.fmul(v(*a), b.f32(1.0 / rs.constant(*c).unwrap_or(1.0)))
            }
            // `x * n` with a count n: 0 where n = 0 even for an infinite x (the interpreter's
            // rule, docs/SEMANTICS.md).
            RNode::Binary(..) if count_product.is_some() => {
                let (xk, nk) = count_product.unwrap_or_default();
                let (xv, nv) = (v(xk), v(nk));
                let inf0 = b.and(
                    b.fcmp(FloatPredicate::OEQ, b.fabs(xv), b.f32(f64::INFINITY)),
                    b.fcmp(FloatPredicate::OEQ, nv, b.f32(0.0)),
                );
                b.select_f(inf0, b.f32(0.0), b.fmul(xv, nv))
            }
            RNode::Binary(op, a, c) => binary(b, *op, v(*a), v(*c)),
            RNode::Select(c, a, e) => {
                // NaN counts as non-zero, as in the interpreter (`c != 0`).
                let nz = b.fcmp(FloatPredicate::UNE, v(*c), b.f32(0.0));
                b.select_f(nz, v(*a), v(*e))
            }
        }
    }

    /// Captured tensor `k` at `index` on `lanes` consecutive columns `at.j + e` (`at.j` a
    /// multiple of `lanes`) in 16-byte loads, when `j` is read only by the last subscript, as
    /// `j + c` with `c` and the last axis' static size multiples of `lanes` (then the lanes'
    /// elements are adjacent and all inside the axis or all outside, NaN as [`RegionMod::capture`]
    /// reads them) and the lanes' bytes are whole 16-byte pieces. A tensor whose address is not
    /// 16-byte aligned is read element by element (foxc's torch layer refuses such inputs, but
    /// the runtime's own callers may pass any address). `None` where the read is not of that
    /// form.
    fn capture_lanes<'ctx>(
        &self,
        b: &KernelBuilder<'_, 'ctx>,
        k: usize,
        index: &[IndexExpr],
        subs: &[KernelSub],
        at: ScorePos<'ctx>,
        lanes: usize,
    ) -> Option<Vec<FloatValue<'ctx>>> {
        let ty = self.caps.get(k).copied().flatten()?;
        // Dim terms of the last subscript bound at launch (`args`) would make its alignment
        // unknown.
        let consts: Vec<SubConsts> = subs.iter().map(|s| s.consts.clone()).collect();
        let along_j = subs.last().is_some_and(|s| s.args.is_empty())
            && ty.last.is_some_and(|l| contiguous_in_j(index, &consts, l, lanes as u64));
        if !(along_j && ty.dtype.is_float() && (lanes * ty.dtype.size_bytes()).is_multiple_of(16)) {
            return None;
        }
        let n = lanes as i64;
        let (_, ok, off) = self.capture_at(b, k, index, subs, at)?;
        let base = b.param_ptr(self.param(ScoreArg::Capture(k)));
        let aligned = b.icmpc(IntPredicate::EQ, b.andc(b.ptr_to_i64(base), 15), 0);
        let per_piece = 16 / ty.dtype.size_bytes();
        let vals = b.if_else(
            aligned,
            "capture_lanes",
            |b| {
                let mut out: Vec<BasicValueEnum<'ctx>> = vec![];
                for piece in 0..lanes / per_piece {
                    let p = b.gep_dt(ty.dtype, base, b.add(off, b.i64((piece * per_piece) as i64)));
                    out.extend(b.load_16_bytes_f(ty.dtype, p).into_iter().map(BasicValueEnum::from));
                }
                out
            },
            |b| (0..n).map(|e| b.load_f(ty.dtype, base, b.add(off, b.i64(e))).into()).collect(),
        );
        let nan = b.f32(f64::NAN);
        Some(vals.into_iter().map(|v| b.select_f(ok, v.into_float_value(), nan)).collect())
    }
}

impl ScoreMod for RegionMod {
    fn is_identity(&self) -> bool {
        self.region.region.is_identity()
    }

    fn has_mask(&self) -> bool {
        self.mask.is_some()
    }

    /// Empty for the identity without a mask (its kernel keeps the plain name), else a hash of
    /// the region (and of the mask's condition).
    fn tag(&self) -> String {
        let Resolved { region, dims, .. } = &self.region;
        // The captures' dtypes and ranks, written as they always were (stable kernel names);
        // their static last sizes matter to q's map only ([`RegionMod::capture_lanes`]).
        let caps: Vec<String> = self
            .caps
            .iter()
            .map(|c| match c {
                Some(c) => format!("Some(CaptureTy {{ dtype: {:?}, rank: {} }})", c.dtype, c.rank),
                None => "None".into(),
            })
            .collect();
        let mut key = format!("{region:?}{dims:?}{:?}{:?}[{}]", self.heads, self.args, caps.join(", "));
        match &self.mask {
            None if self.is_identity() && self.epilogue.is_none() && self.q_map.is_none() => {
                return String::new()
            }
            None => {}
            Some(m) => key.push_str(&format!("mask{:?}{:?}", m.region, m.dims)),
        }
        if let Some(e) = &self.keys_from {
            key.push_str(&format!("keys_from{:?}{:?}", e.region, e.dims));
        }
        if let Some(e) = &self.epilogue {
            key.push_str(&format!("epilogue{:?}{:?}", e.region, e.dims));
        }
        if let Some(m) = &self.q_map {
            let lasts: Vec<_> = self.caps.iter().map(|c| c.and_then(|c| c.last)).collect();
            key.push_str(&format!("q_map{:?}{:?}{lasts:?}", m.region, m.dims));
        }
        format!("r{:016x}", fnv1a(&key))
    }

    fn params(&self) -> Vec<(String, ParamTy)> {
        self.args
            .iter()
            .map(|a| match *a {
                ScoreArg::Heads => ("H".to_string(), ParamTy::I32),
                ScoreArg::Capture(k) => (format!("capture{k}"), ParamTy::Ptr),
                ScoreArg::CaptureDim(k, ax) => (format!("capture{k}_n{ax}"), ParamTy::I32),
                ScoreArg::Dim(n) => (format!("dim{n}"), ParamTy::I32),
            })
            .collect()
    }

    fn emit<'a, 'ctx>(
        &self,
        b: &KernelBuilder<'a, 'ctx>,
        x: FloatValue<'ctx>,
        at: ScorePos<'ctx>,
    ) -> FloatValue<'ctx> {
        self.eval(&self.region, b, x, at)
    }

    fn keys_from<'a, 'ctx>(
        &self,
        b: &KernelBuilder<'a, 'ctx>,
        at: ScorePos<'ctx>,
    ) -> Option<FloatValue<'ctx>> {
        Some(self.eval(self.keys_from.as_ref()?, b, b.f32(0.0), at))
    }

    fn has_epilogue(&self) -> bool {
        self.epilogue.is_some()
    }

    fn epilogue<'a, 'ctx>(
        &self,
        b: &KernelBuilder<'a, 'ctx>,
        o: FloatValue<'ctx>,
        at: ScorePos<'ctx>,
    ) -> FloatValue<'ctx> {
        match &self.epilogue {
            Some(e) => self.eval(e, b, o, at),
            None => o,
        }
    }

    fn has_q_map(&self) -> bool {
        self.q_map.is_some()
    }

    fn q_map<'a, 'ctx>(
        &self,
        b: &KernelBuilder<'a, 'ctx>,
        xs: &[FloatValue<'ctx>],
        at: ScorePos<'ctx>,
    ) -> Vec<FloatValue<'ctx>> {
        match &self.q_map {
            Some(m) => self.eval_lanes(m, b, xs, at),
            None => xs.to_vec(),
        }
    }

    fn prefetch_epilogue<'a, 'ctx>(&self, b: &KernelBuilder<'a, 'ctx>, at: ScorePos<'ctx>) {
        let Some(e) = &self.epilogue else { return };
        let mut seen = vec![];
        for (n, node) in e.region.nodes.iter().enumerate() {
            let RNode::Capture { k, index } = node else { continue };
            if seen.contains(&(k, index)) {
                continue;
            }
            seen.push((k, index));
            if let Some((ty, _, off)) = self.capture_at(b, *k, index, &e.subs[n], at) {
                let p = b.gep_dt(ty.dtype, b.param_ptr(self.param(ScoreArg::Capture(*k))), off);
                // Inline PTX: LLVM 22 selects its `prefetch.global.L2` intrinsic on sm_90 only.
                b.asm("prefetch.global.L2 [$0];", "l", None, &[p.into()]);
            }
        }
    }

    /// The mask's condition is evaluated with `x = 0` (it does not read it), as the
    /// interpreter does; a NaN condition keeps the element (`c != 0`).
    fn keeps<'a, 'ctx>(&self, b: &KernelBuilder<'a, 'ctx>, at: ScorePos<'ctx>) -> Option<IntValue<'ctx>> {
        let m = self.mask.as_ref()?;
        let c = self.eval(m, b, b.f32(0.0), at);
        Some(b.fcmp(FloatPredicate::UNE, c, b.f32(0.0)))
    }
}

/// `tanh a` in one MUFU operation (`tanh.approx.f32`, sm_75 and later): relative error about
/// 2^-11 (PTX ISA), odd, `tanh(+-0) = +-0`, `+-1` at `+-inf`, NaN stays NaN. Softcapping
/// `U tanh(x / U)` then errs by at most `U 2^-11` in the logit (0.01 at U = 20, near saturation;
/// `|x| 2^-11` for small scores), the size of the bf16 rounding of the probabilities fed to
/// `P V` (2^-9 relative); the formula `1 - 2 / (e^(2a) + 1)` it replaces took two MUFU
/// operations (`ex2`, `rcp`) and about ten ALU ones per score element.
fn tanh<'ctx>(b: &KernelBuilder<'_, 'ctx>, a: FloatValue<'ctx>) -> FloatValue<'ctx> {
    match b.asm("tanh.approx.f32 $0, $1;", "=f,f", Some(b.f32t().into()), &[a.into()]) {
        Some(inkwell::values::BasicValueEnum::FloatValue(t)) => t,
        _ => {
            b.fail("tanh.approx.f32 returned no f32");
            a
        }
    }
}

/// `e^a` as `2^(a log2 e)`.
fn exp<'ctx>(b: &KernelBuilder<'_, 'ctx>, a: FloatValue<'ctx>) -> FloatValue<'ctx> {
    b.ex2(b.fmul(a, b.f32(LOG2E)))
}

/// `1 / a` approximately (`rcp.approx.ftz.f32`, within an ulp; `1 / inf = 0`): the
/// denominators it serves are at least 1, so flushing subnormals changes nothing, and it
/// avoids the IEEE division's slow path in the score loop.
fn rcp<'ctx>(b: &KernelBuilder<'_, 'ctx>, a: FloatValue<'ctx>) -> FloatValue<'ctx> {
    b.call_f("llvm.nvvm.rcp.approx.ftz.f", &[a.into()])
}

/// `ln a` as `log2(a) ln 2` (`-inf` at 0, NaN below, like `f64::ln`).
fn ln<'ctx>(b: &KernelBuilder<'_, 'ctx>, a: FloatValue<'ctx>) -> FloatValue<'ctx> {
    b.fmul(b.lg2(a), b.f32(LN2))
}

/// `ln(1 + e)` for `e` in `[0, 1]`: below 1/64 the series `e - e^2/2 + e^3/3 - e^4/4`
/// (truncation below 2^-30 relative), where `1 + e` would round `e` away; above, `ln(1 + e)`.
fn ln1p_unit<'ctx>(b: &KernelBuilder<'_, 'ctx>, e: FloatValue<'ctx>) -> FloatValue<'ctx> {
    let big = ln(b, b.fadd(e, b.f32(1.0)));
    let mut s = b.f32(-0.25);
    for c in [1.0 / 3.0, -0.5, 1.0] {
        s = b.fma(s, e, b.f32(c));
    }
    let small = b.fmul(s, e);
    let is_small = b.fcmp(FloatPredicate::OLT, e, b.f32(1.0 / 64.0));
    b.select_f(is_small, small, big)
}

/// `log(sigmoid(a)) = min(a, 0) - ln(1 + e^-|a|)`, stable for large `|a|` (NaN stays NaN).
fn logsigmoid<'ctx>(b: &KernelBuilder<'_, 'ctx>, a: FloatValue<'ctx>) -> FloatValue<'ctx> {
    let e = exp(b, b.fneg(b.fabs(a)));
    let m = b.select_f(b.fcmp(FloatPredicate::OLT, a, b.f32(0.0)), a, b.f32(0.0));
    let r = b.fsub(m, ln1p_unit(b, e));
    nan_through(b, a, r)
}

/// `r`, or `a` where `a` is NaN.
fn nan_through<'ctx>(
    b: &KernelBuilder<'_, 'ctx>,
    a: FloatValue<'ctx>,
    r: FloatValue<'ctx>,
) -> FloatValue<'ctx> {
    b.select_f(b.fcmp(FloatPredicate::UNO, a, a), a, r)
}

pub(crate) fn unary<'ctx>(b: &KernelBuilder<'_, 'ctx>, u: UnaryOp, a: FloatValue<'ctx>) -> FloatValue<'ctx> {
    let one = b.f32(1.0);
    match u {
        UnaryOp::Neg => b.fneg(a),
        UnaryOp::Abs => b.fabs(a),
        UnaryOp::Sqrt => b.sqrt(a),
        UnaryOp::Rsqrt => b.fdiv(one, b.sqrt(a)),
        UnaryOp::Exp => exp(b, a),
        UnaryOp::Log => ln(b, a),
        UnaryOp::Exp2 => b.ex2(a),
        UnaryOp::Log2 => b.lg2(a),
        UnaryOp::Tanh => tanh(b, a),
        // 1 / (1 + e^-a): e^-a = inf gives 0, e^-a = 0 gives 1.
        UnaryOp::Sigmoid => {
            let r = rcp(b, b.fadd(one, exp(b, b.fneg(a))));
            nan_through(b, a, r)
        }
        UnaryOp::LogSigmoid => logsigmoid(b, a),
        UnaryOp::Softplus => b.fneg(logsigmoid(b, b.fneg(a))),
        // max(a, 0) keeping NaN (maxnum would drop it).
        UnaryOp::Relu => b.select_f(b.fcmp(FloatPredicate::OLT, a, b.f32(0.0)), b.f32(0.0), a),
        UnaryOp::Silu => b.fmul(a, unary(b, UnaryOp::Sigmoid, a)),
    }
}

pub(crate) fn binary<'ctx>(
    b: &KernelBuilder<'_, 'ctx>,
    op: BinaryOp,
    x: FloatValue<'ctx>,
    y: FloatValue<'ctx>,
) -> FloatValue<'ctx> {
    let pred = match op {
        BinaryOp::Add => return b.fadd(x, y),
        BinaryOp::Sub => return b.fsub(x, y),
        BinaryOp::Mul => return b.fmul(x, y),
        BinaryOp::Div => return b.fdiv(x, y),
        // minnum / maxnum drop a NaN operand; the interpreter propagates it.
        BinaryOp::Min | BinaryOp::Max => {
            let r = if op == BinaryOp::Min { b.fmin(x, y) } else { b.fmax(x, y) };
            let nan = b.fcmp(FloatPredicate::UNO, x, y);
            return b.select_f(nan, b.fadd(x, y), r);
        }
        BinaryOp::Lt => FloatPredicate::OLT,
        BinaryOp::Le => FloatPredicate::OLE,
        BinaryOp::Gt => FloatPredicate::OGT,
        BinaryOp::Ge => FloatPredicate::OGE,
        BinaryOp::Eq => FloatPredicate::OEQ,
        BinaryOp::Ne => FloatPredicate::UNE,
    };
    b.select_f(b.fcmp(pred, x, y), b.f32(1.0), b.f32(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use foxc_ir::DType;
    use inkwell::context::Context;

    /// The fixed parameters of the tiny test kernels, `(x, i, j, bh, out, 3 unused)`: as many as
    /// the attention kernel has before a region's own ([`FIRST_PARAM`]).
    fn tiny_kernel_params() -> Vec<(&'static str, ParamTy)> {
        vec![
            ("x", ParamTy::F32),
            ("i", ParamTy::I32),
            ("j", ParamTy::I32),
            ("bh", ParamTy::I32),
            ("out", ParamTy::Ptr),
            ("unused5", ParamTy::I32),
            ("unused6", ParamTy::I32),
            ("unused7", ParamTy::I32),
        ]
    }

    /// `rm` emitted once into a tiny kernel `(x, i, j, bh, out, 3 unused, rm's parameters)`
    /// (its parameters start where the attention kernel's do): its LLVM IR, node by node.
    fn mod_ir(rm: &RegionMod) -> String {
        let ctx = Context::create();
        let m = ctx.create_module("t");
        let mut params = tiny_kernel_params();
        assert_eq!(params.len() as u32, FIRST_PARAM);
        let extra = rm.params();
        params.extend(extra.iter().map(|(n, t)| (n.as_str(), *t)));
        let b = KernelBuilder::kernel(&ctx, &m, "region", &params).unwrap();
        let at = ScorePos { i: b.param_int(1), j: b.param_int(2), bh: b.param_int(3) };
        let y = rm.emit(&b, b.param_f32(0), at);
        b.store_f(DType::F32, b.param_ptr(4), b.i64(0), y);
        let f = b.finish().unwrap();
        inkwell::values::AnyValue::print_to_string(&f).to_string()
    }

    /// [`mod_ir`] of a capture-free region with `H = heads` static.
    fn region_ir(r: &Region, heads: u64) -> String {
        mod_ir(&RegionMod::new(r, &|d| d.eval(&|s| (s == "H").then_some(heads)), Some(heads)).unwrap())
    }

    fn softcap_alibi() -> Region {
        let mut r = Region::new();
        let x = r.push(RNode::Score);
        let c = r.push(RNode::Const(20.0));
        let d = r.push(RNode::Binary(BinaryOp::Div, x, c));
        let t = r.push(RNode::Unary(UnaryOp::Tanh, d));
        let cap = r.push(RNode::Binary(BinaryOp::Mul, c, t));
        let h = r.push(RNode::Index(IndexVar::H));
        let hh = r.push(RNode::Dim(Dim::sym("H")));
        let slope = r.push(RNode::Binary(BinaryOp::Div, h, hh));
        let i = r.push(RNode::Index(IndexVar::I));
        let j = r.push(RNode::Index(IndexVar::J));
        let dist = r.push(RNode::Binary(BinaryOp::Sub, i, j));
        let bias = r.push(RNode::Binary(BinaryOp::Mul, slope, dist));
        r.push(RNode::Binary(BinaryOp::Sub, cap, bias));
        r
    }

    #[test]
    fn softcap_alibi_region_llvm_ir_snapshot() {
        insta::assert_snapshot!("nvptx_region_softcap_alibi", region_ir(&softcap_alibi(), 4));
    }

    /// Every unary and binary op and a select emit (and the module verifies).
    #[test]
    fn every_node_kind_emits() {
        let binaries = [
            BinaryOp::Add,
            BinaryOp::Sub,
            BinaryOp::Mul,
            BinaryOp::Div,
            BinaryOp::Min,
            BinaryOp::Max,
            BinaryOp::Lt,
            BinaryOp::Le,
            BinaryOp::Gt,
            BinaryOp::Ge,
            BinaryOp::Eq,
            BinaryOp::Ne,
        ];
        let mut r = Region::new();
        let mut acc = r.push(RNode::Score);
        for u in UnaryOp::ALL {
            let y = r.push(RNode::Unary(u, acc));
            acc = r.push(RNode::Binary(BinaryOp::Add, acc, y));
        }
        let b = r.push(RNode::Index(IndexVar::B));
        for op in binaries {
            acc = r.push(RNode::Binary(op, acc, b));
        }
        let x = r.push(RNode::Score);
        r.push(RNode::Select(acc, x, b));
        let ir = region_ir(&r, 2);
        for needle in [
            "ex2.approx",
            "lg2.approx",
            "tanh.approx.f32",
            "llvm.sqrt.f32",
            "fcmp une",
            "fcmp uno",
            "minnum",
            "maxnum",
        ] {
            assert!(ir.contains(needle), "{needle} missing:\n{ir}");
        }
    }

    /// A dim that is not static is a kernel argument, in a region (`W`) and in a capture's
    /// subscript (`T - 1 - j`), each once.
    #[test]
    fn dims_that_are_not_static_are_arguments() {
        let mut r = Region::new();
        let w = r.push(RNode::Dim(Dim::sym("W")));
        let mut rev = IndexExpr::var("j");
        rev.terms[0].1 = -1;
        rev.constant = -1;
        rev.dim_terms = vec![(Dim::sym("T"), 1)];
        let x = r.push(RNode::Capture { k: 0, index: vec![rev] });
        let w2 = r.push(RNode::Dim(Dim::sym("W")));
        let s = r.push(RNode::Binary(BinaryOp::Add, w, x));
        r.push(RNode::Binary(BinaryOp::Mul, s, w2));
        let f32_1 = [CaptureTy { dtype: DType::F32, rank: 1, last: None }];
        let m = RegionMod::with_captures(&r, &|_| None, None, &f32_1).unwrap();
        assert_eq!(
            m.args(),
            [ScoreArg::Dim(0), ScoreArg::Dim(1), ScoreArg::Capture(0), ScoreArg::CaptureDim(0, 0)]
        );
        assert_eq!((m.dim_arg(0), m.dim_arg(1)), (Some(&Dim::sym("W")), Some(&Dim::sym("T"))));
        // Static, they fold into the code: no argument.
        let m = RegionMod::with_captures(&r, &|_| Some(8), None, &f32_1).unwrap();
        assert_eq!(m.args(), [ScoreArg::Capture(0), ScoreArg::CaptureDim(0, 0)]);
    }

    #[test]
    fn unresolved_divisors_and_bad_captures_are_refused() {
        let read = |index: Vec<IndexExpr>| {
            let mut r = Region::new();
            r.push(RNode::Capture { k: 0, index });
            r
        };
        let f32_1 = [CaptureTy { dtype: DType::F32, rank: 1, last: None }];
        let e = RegionMod::new(&read(vec![IndexExpr::var("j")]), &|_| None, None).unwrap_err();
        assert!(e.contains("does not have"), "{e}");
        let e = RegionMod::with_captures(&read(vec![]), &|_| None, None, &f32_1).unwrap_err();
        assert!(e.contains("rank 1 but 0 subscripts"), "{e}");
        let bool_1 = [CaptureTy { dtype: DType::Bool, rank: 1, last: None }];
        let e =
            RegionMod::with_captures(&read(vec![IndexExpr::var("j")]), &|_| None, None, &bool_1).unwrap_err();
        assert!(e.contains("float or i32 tensors only"), "{e}");
        // An i32 capture (a start, a length) is read as its value.
        let i32_1 = [CaptureTy { dtype: DType::I32, rank: 1, last: None }];
        RegionMod::with_captures(&read(vec![IndexExpr::var("j")]), &|_| None, None, &i32_1).unwrap();
        let div = IndexExpr {
            terms: vec![("j".into(), 1)],
            dim_terms: vec![],
            constant: 0,
            div: Some(Dim::sym("W")),
            clamps: vec![],
        };
        let e = RegionMod::with_captures(&read(vec![div]), &|_| None, None, &f32_1).unwrap_err();
        assert!(e.contains("divisor W"), "{e}");
    }

    /// `x + kb[b, h, j] + rel[h, (i - j + 1) / 2]` with H not static: the head count and
    /// each capture with its axis sizes become kernel parameters, in that order; subscripts
    /// are bounds-checked (NaN outside, as the interpreter reads) and the divisor floors.
    fn key_bias_rel() -> Region {
        let mut r = Region::new();
        let x = r.push(RNode::Score);
        let kb = r.push(RNode::Capture {
            k: 0,
            index: vec![IndexExpr::var("b"), IndexExpr::var("h"), IndexExpr::var("j")],
        });
        let s = r.push(RNode::Binary(BinaryOp::Add, x, kb));
        let rel = IndexExpr {
            terms: vec![("i".into(), 1), ("j".into(), -1)],
            dim_terms: vec![],
            constant: 1,
            div: Some(Dim::Const(2)),
            clamps: vec![],
        };
        let rb = r.push(RNode::Capture { k: 1, index: vec![IndexExpr::var("h"), rel] });
        r.push(RNode::Binary(BinaryOp::Add, s, rb));
        r
    }

    fn key_bias_rel_mod() -> RegionMod {
        let caps = [
            CaptureTy { dtype: DType::F32, rank: 3, last: None },
            CaptureTy { dtype: DType::BF16, rank: 2, last: None },
        ];
        RegionMod::with_captures(&key_bias_rel(), &|d| d.eval(&|_| None), None, &caps).unwrap()
    }

    #[test]
    fn captures_become_kernel_parameters_in_order() {
        let rm = key_bias_rel_mod();
        use ScoreArg::{Capture, CaptureDim, Heads};
        assert_eq!(
            rm.args(),
            [
                Heads,
                Capture(0),
                CaptureDim(0, 0),
                CaptureDim(0, 1),
                CaptureDim(0, 2),
                Capture(1),
                CaptureDim(1, 0),
                CaptureDim(1, 1)
            ]
        );
        let names: Vec<String> = rm.params().into_iter().map(|(n, _)| n).collect();
        assert_eq!(
            names,
            [
                "H",
                "capture0",
                "capture0_n0",
                "capture0_n1",
                "capture0_n2",
                "capture1",
                "capture1_n0",
                "capture1_n1"
            ]
        );
        // With H static, no head parameter; a capture the region does not read gets none.
        let caps = [
            CaptureTy { dtype: DType::F32, rank: 1, last: None },
            CaptureTy { dtype: DType::F32, rank: 3, last: None },
            CaptureTy { dtype: DType::BF16, rank: 2, last: None },
        ];
        let mut r = key_bias_rel();
        for n in r.nodes.iter_mut() {
            if let RNode::Capture { k, .. } = n {
                *k += 1;
            }
        }
        let rm = RegionMod::with_captures(&r, &|d| d.eval(&|_| None), Some(4), &caps).unwrap();
        assert_eq!(rm.args()[0], Capture(1));
        assert_eq!(rm.args().len(), 7);
        assert_ne!(rm.tag(), key_bias_rel_mod().tag());
    }

    #[test]
    fn capture_region_llvm_ir_snapshot() {
        let ir = mod_ir(&key_bias_rel_mod());
        for needle in
            ["%capture0", "%capture1_n1", "load float", "load bfloat", "sdiv i32", "0x7FF8000000000000"]
        {
            assert!(ir.contains(needle), "{needle} missing:\n{ir}");
        }
        insta::assert_snapshot!("nvptx_region_captures", ir);
    }

    /// The condition `j >= lo[b, h, i]` of an expression mask (the context-parallel partial's).
    fn lo_mask() -> Region {
        let mut r = Region::new();
        let j = r.push(RNode::Index(IndexVar::J));
        let lo = r.push(RNode::Capture {
            k: 1,
            index: vec![IndexExpr::var("b"), IndexExpr::var("h"), IndexExpr::var("i")],
        });
        r.push(RNode::Binary(BinaryOp::Ge, j, lo));
        r
    }

    /// An expression mask shares the captures' parameters with the score region (capture 0 in
    /// the score, capture 1 in the mask: both in order), its condition compiles to an `i1`
    /// (`fcmp une` against 0: NaN keeps, as in the interpreter), and it names its kernel even
    /// when the score is the identity.
    #[test]
    fn mask_condition_reads_its_capture_and_names_the_kernel() {
        let caps = [
            CaptureTy { dtype: DType::F32, rank: 3, last: None },
            CaptureTy { dtype: DType::F32, rank: 3, last: None },
        ];
        let mut score = Region::new();
        let x = score.push(RNode::Score);
        let kb = score.push(RNode::Capture {
            k: 0,
            index: vec![IndexExpr::var("b"), IndexExpr::var("h"), IndexExpr::var("j")],
        });
        score.push(RNode::Binary(BinaryOp::Add, x, kb));
        let dim = |d: &Dim| d.eval(&|_| None);
        let rm = RegionMod::with_mask(&score, Some(&lo_mask()), None, &dim, Some(4), &caps).unwrap();
        use ScoreArg::{Capture, CaptureDim};
        assert_eq!(
            rm.args(),
            [
                Capture(0),
                CaptureDim(0, 0),
                CaptureDim(0, 1),
                CaptureDim(0, 2),
                Capture(1),
                CaptureDim(1, 0),
                CaptureDim(1, 1),
                CaptureDim(1, 2)
            ]
        );
        assert!(rm.has_mask());
        let unmasked = RegionMod::with_captures(&score, &dim, Some(4), &caps).unwrap();
        assert!(!unmasked.has_mask() && unmasked.args().len() == 4);
        assert_ne!(rm.tag(), unmasked.tag());
        // The identity score with a mask gets a tag (a kernel of its own), without one none.
        let id =
            RegionMod::with_mask(&Region::identity(), Some(&lo_mask()), None, &dim, Some(4), &caps).unwrap();
        assert!(id.is_identity() && !id.tag().is_empty());
        // A mask that reads the score is refused.
        let e =
            RegionMod::with_mask(&Region::identity(), Some(&score), None, &dim, Some(4), &caps).unwrap_err();
        assert!(e.contains("reads the score"), "{e}");
        // The condition alone, into a tiny kernel: 1.0 where kept.
        let ctx = Context::create();
        let m = ctx.create_module("t");
        let mut params = tiny_kernel_params();
        let extra = id.params();
        params.extend(extra.iter().map(|(n, t)| (n.as_str(), *t)));
        let b = KernelBuilder::kernel(&ctx, &m, "mask", &params).unwrap();
        let at = ScorePos { i: b.param_int(1), j: b.param_int(2), bh: b.param_int(3) };
        assert!(unmasked.keeps(&b, at).is_none());
        let keep = id.keeps(&b, at).expect("a mask condition");
        b.store_f(DType::F32, b.param_ptr(4), b.i64(0), b.select_f(keep, b.f32(1.0), b.f32(0.0)));
        let ir = inkwell::values::AnyValue::print_to_string(&b.finish().unwrap()).to_string();
        for needle in ["%capture1", "fcmp oge", "fcmp une", "0x7FF8000000000000"] {
            assert!(ir.contains(needle), "{needle} missing:\n{ir}");
        }
        insta::assert_snapshot!("nvptx_region_mask_condition", ir);
    }

    #[test]
    fn identity_keeps_the_plain_kernel_name() {
        let id = RegionMod::new(&Region::identity(), &|_| None, None).unwrap();
        assert!(id.is_identity() && id.tag().is_empty());
        let cap = RegionMod::new(&softcap_alibi(), &|_| Some(4), Some(4)).unwrap();
        assert!(!cap.is_identity());
        assert_eq!(cap.tag().len(), 17);
    }
}
