//! The operations of the graph IR and the attributes of the fused attention ops.
//!
//! Operand conventions are documented per variant: operand `k` of a node is the source of
//! the incoming edge whose weight is `k`. Elementwise ops broadcast by axis *name*.

pub use crate::attention::{
    Attention, AttnOperands, IndexVar, Mask, Prelude, Prune, RId, RNode, Region, Scale, ScoreBound,
};
use crate::index::IndexExpr;
use crate::types::{DType, Dim};
use std::fmt;

pub use crate::unary::UnaryOp;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Min,
    Max,
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
}

impl BinaryOp {
    pub fn is_comparison(self) -> bool {
        matches!(
            self,
            BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge | BinaryOp::Eq | BinaryOp::Ne
        )
    }

    /// The comparison with its operands swapped: `b OP' a` holds where `a OP b` does (`a < b`
    /// is `b > a`); `None` for an op that is not a comparison.
    pub fn swapped(self) -> Option<BinaryOp> {
        Some(match self {
            BinaryOp::Lt => BinaryOp::Gt,
            BinaryOp::Le => BinaryOp::Ge,
            BinaryOp::Gt => BinaryOp::Lt,
            BinaryOp::Ge => BinaryOp::Le,
            BinaryOp::Eq | BinaryOp::Ne => self,
            _ => return None,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceKind {
    Sum,
    Max,
}

/// How the per-token log forget gate is obtained from the gate input of `gate_cumsum`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GateKind {
    /// The input holds gate logits `z`; `log f = logsigmoid(z)`.
    Logits,
    /// The input holds `log f` directly (must be <= 0).
    LogGate,
    /// The input is a per-head slope `m >= 0` of shape `[H]`; `log f = -m` (ALiBi).
    Slope,
}

/// The safe threshold rule `threshold` computes: a name and a formula over named statistics
/// (`crate::prune_rule`; the table of rules is `foxc_passes::rules`, docs/RULES.md).
pub use crate::prune_rule::PruneRule;

/// Where the bound on `max |q_i|` and `max |k_j|` comes from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum NormBound {
    /// Known without reading the data (QK-norm: `max|w| * sqrt(D)`).
    Static { q_max: f64, k_max: f64 },
    /// A reduction over the data of each (b, h).
    Data,
}

/// Tile shape of ACP: `bm` query rows by `bn` key columns. Chosen per target by a pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tiles {
    pub bm: u32,
    pub bn: u32,
}

/// How a GPU backend launches a `threshold` (a pass decision: `fuse-threshold`). The deltas are
/// the same either way; the interpreter and the CPU backend ignore it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ThresholdPlan {
    /// The tile norms, then the deltas in a second launch, one block per query tile (which may
    /// read the tile's rows: any formula).
    #[default]
    NormsThenDelta,
    /// One launch: the tile norms, then each head's last block evaluates the formula from the
    /// norms alone. Only for formulas of tile norms only ([`crate::PruneRule::norms_only`] under
    /// a data bound). Printed `plan = one_launch`.
    OneLaunch,
}

/// An IR operation.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// Tensor parameter number `index` of the graph (positional axes).
    Param {
        name: String,
        index: usize,
    },
    /// A numeric constant (a scalar f32).
    Const(f64),
    /// The runtime size of a symbolic dimension, as a scalar f32 (`sqrt(D)`).
    DimSize(Dim),
    /// The value of an index variable along axis `axis`: `0, 1, ..., n-1` (`i - j` in ALiBi).
    Iota {
        axis: String,
    },
    /// Operand 0 is positional; rename its axes, in order, to `axes` (`c[b, h, i]`).
    Bind {
        axes: Vec<String>,
    },
    /// Read operand 0 (positional, rank `index.len()`) at computed subscripts: element
    /// `[v1, .., vn]` of the result (named axes `axes`, the index variables in order of first use)
    /// is `x[index[0](v), .., index[r-1](v)]` (`rel[h, i - j]`, `k[b, h / (H / G), j, d]`).
    /// A subscript outside `[0, size)` reads NaN (the front end admits such reads only where a
    /// mask removes them; docs/SEMANTICS.md). The result keeps the operand's dtype; its axes'
    /// sizes are the variables' sizes, carried on the node (they do not follow from the operand).
    Gather {
        index: Vec<IndexExpr>,
        axes: Vec<String>,
    },
    /// Reorder operand 0's named axes to `axes` and make the result positional
    /// (the left-hand side of a statement).
    Store {
        axes: Vec<String>,
    },
    Unary(UnaryOp),
    Binary(BinaryOp),
    /// `select(cond, a, b)`: operands cond, a, b.
    Select,
    /// Reduce operand 0 over the named axis.
    Reduce {
        kind: ReduceKind,
        axis: String,
        /// A `sum` whose operand is a `mul` that it alone uses: the sum of the products of the
        /// mul's operands, which a backend reads directly, never materializing the product
        /// (`sum(d, q * k)` costs `T*T` values, not `T*T*D`). The `contract` pass's decision
        /// (CPU target); printed `{axis = d, contract}` (docs/SEMANTICS.md, "sum {contract}").
        contract: bool,
    },
    /// Inclusive prefix sum of operand 0 along the named axis; `reverse`: the inclusive suffix
    /// sum `r_t = sum_{s >= t} x_s` (the gradient of a cumsum, without the cancellation of
    /// `total - prefix + x` where the prefix nears the total). Printed `{axis = t, reverse}`.
    Cumsum {
        axis: String,
        reverse: bool,
    },
    /// Softmax of operand 0 along the named axis (entries of -inf get weight 0).
    Softmax {
        axis: String,
    },
    /// Operand 0 where `j <= i`, -inf elsewhere.
    Causal {
        i: String,
        j: String,
    },
    /// Operand 0 where `j <= i && i - j < size`, -inf elsewhere.
    Window {
        i: String,
        j: String,
        size: u64,
    },
    /// `x * rsqrt(mean_axis(x^2) + eps) * w`: operands x and w (w indexed by `axis` alone).
    RmsNorm {
        axis: String,
        eps: f64,
    },
    /// Convert operand 0 to the node's dtype.
    Cast,

    // ---- Fused ops inserted by passes. All operands and results are positional. ----
    /// `c[b, h, t] = sum_{l <= t} log f[b, h, l]`, with `log f` clamped below at
    /// [`LOG_F_FLOOR`] so that a hard reset (`log f = -inf`) stays finite.
    /// Operand: the gate input (see [`GateKind`]). Result: f32 `[B, H, T]`.
    GateCumsum {
        kind: GateKind,
        /// Scan each row in segments, a block each (a pass's choice for long rows on a GPU, whose
        /// one-block-per-row scan leaves most of the chip idle when rows are few). The value is
        /// the op's: each segment starts from the compensated sum of the ones before it, another
        /// grouping of the same sums (docs/SEMANTICS.md).
        split_rows: bool,
    },
    /// The part of `gate_cumsum`'s exact value that its f32 result cannot hold:
    /// `lo[t] = round_f32(c64[t] - round_f32(c64[t]))`, `c64` the same f64 accumulation as
    /// `gate_cumsum` with the same operand. An attention with a `decay(pair)` reads it beside `c`
    /// so that `c_i - c_j` keeps f64 accuracy when `|c|` is large (docs/SEMANTICS.md).
    /// Operand and result as `gate_cumsum`.
    GateCumsumLo {
        kind: GateKind,
    },
    /// The per-query-tile pruning threshold delta of an attention. Operands: q `[B, H, T, D]`,
    /// k `[B, Hk, T, D]` (kv head of query head h: `h / (H / Hk)`). Result: f32 `[B, H, T/bm]`.
    /// `U = score.u(|scale| Qmax Kmax)` bounds the attention's region (docs/SEMANTICS.md).
    Threshold {
        rule: PruneRule,
        log_eps: f64,
        bound: NormBound,
        score: ScoreBound,
        scale: Scale,
        bm: u32,
        /// How a GPU backend launches it (a pass decision, [`ThresholdPlan`]).
        plan: ThresholdPlan,
    },
    /// The first kept key tile of every query tile (the block-sparse mask).
    /// Operands: c `[B, H, T]`, delta `[B, H, T/bm]`. Result: i32 `[B, H, T/bm]`.
    BlockBoundary(Tiles),
    /// The generic fused attention ([`Attention`], docs/SEMANTICS.md "attention"). Operands
    /// q, k, v, then c if `decay`, c_lo if `decay(pair)`, start or delta if pruned, then the
    /// captured tensors (read them through [`Attention::operands`]). Results: `out`
    /// `[B, H, T, Dv]` in `out_dtype` and `lse` f32 `[B, H, T]`.
    Attention(Attention),
    /// The vector-Jacobian product of an `attention` with these attributes (docs/SEMANTICS.md,
    /// "attention_backward"). Operands: the forward's operands, then `out` (f32), `lse`, `dout`.
    /// Results (f32): dq, dk, dv, then dc if `decay`, then one gradient per float capture
    /// ([`Attention::backward_result_types`]).
    AttentionBackward(Attention),
    /// A `[B, H, T, D]` tensor that its readers compute where they load it, never stored: the
    /// `fuse-load-maps` pass's decision for a q made by an elementwise statement (RoPE's
    /// rotation). Element `[b, h, i, d]` is `f` with `x` = operand 0 at `[b, h, i, d]` (`i` the
    /// row, `j` the column, printed `d`) and capture `k` = operand `k + 1`, rounded to the
    /// node's dtype as the statement's store was. Only an attention's or a threshold's q reads
    /// it (docs/SEMANTICS.md, "load_map").
    LoadMap {
        f: Region,
    },
}

/// Floor applied to `log f` by `gate_cumsum`: `exp(-100)` is 4e-44, a reset in all but name,
/// and the cumsum stays finite so `c_i - c_j` never becomes `-inf - -inf`.
pub const LOG_F_FLOOR: f64 = -100.0;

impl Op {
    /// An op whose element at a point depends only on its operands at that point (by axis name)
    /// or on a read of a buffer there: it can be computed inside a user's loop ([`Node::inline`](crate::graph::Node::inline)).
    pub fn is_elementwise(&self) -> bool {
        matches!(
            self,
            Op::Bind { .. }
                | Op::Gather { .. }
                | Op::Iota { .. }
                | Op::Unary(_)
                | Op::Binary(_)
                | Op::Select
                | Op::Cast
        )
    }

    /// Whether this op reads operand `pos` element by element by axis name, in a loop over
    /// its own iteration space (the result's axes and a reduced or line axis), so that an
    /// elementwise operand can be computed there instead of read from a buffer. Positional
    /// reads (`bind`, `gather`), a norm's weight and every fused op read buffers.
    pub fn reads_by_name(&self, pos: usize) -> bool {
        match self {
            Op::Store { .. }
            | Op::Cast
            | Op::Unary(_)
            | Op::Binary(_)
            | Op::Select
            | Op::Reduce { .. }
            | Op::Cumsum { .. }
            | Op::Softmax { .. }
            | Op::Causal { .. }
            | Op::Window { .. } => true,
            Op::RmsNorm { .. } => pos == 0,
            _ => false,
        }
    }

    /// The mnemonic used by the printer.
    pub fn mnemonic(&self) -> &'static str {
        match self {
            Op::Param { .. } => "param",
            Op::Const(_) => "const",
            Op::DimSize(_) => "dim",
            Op::Iota { .. } => "iota",
            Op::Bind { .. } => "bind",
            Op::Gather { .. } => "gather",
            Op::Store { .. } => "store",
            Op::Unary(u) => u.name(),
            Op::Binary(b) => match b {
                BinaryOp::Add => "add",
                BinaryOp::Sub => "sub",
                BinaryOp::Mul => "mul",
                BinaryOp::Div => "div",
                BinaryOp::Min => "min",
                BinaryOp::Max => "max",
                BinaryOp::Lt => "lt",
                BinaryOp::Le => "le",
                BinaryOp::Gt => "gt",
                BinaryOp::Ge => "ge",
                BinaryOp::Eq => "eq",
                BinaryOp::Ne => "ne",
            },
            Op::Select => "select",
            Op::Reduce { kind: ReduceKind::Sum, .. } => "sum",
            Op::Reduce { kind: ReduceKind::Max, .. } => "reduce_max",
            Op::Cumsum { .. } => "cumsum",
            Op::Softmax { .. } => "softmax",
            Op::Causal { .. } => "causal",
            Op::Window { .. } => "window",
            Op::RmsNorm { .. } => "rmsnorm",
            Op::Cast => "cast",
            Op::GateCumsum { .. } => "gate_cumsum",
            Op::GateCumsumLo { .. } => "gate_cumsum_lo",
            Op::Threshold { .. } => "threshold",
            Op::BlockBoundary(_) => "block_boundary",
            Op::Attention(_) => "attention",
            Op::AttentionBackward(_) => "attention_backward",
            Op::LoadMap { .. } => "load_map",
        }
    }

    /// Number of operands the op takes, or `None` when it varies (decay attention).
    pub fn arity(&self) -> Option<usize> {
        Some(match self {
            Op::Param { .. } | Op::Const(_) | Op::DimSize(_) | Op::Iota { .. } => 0,
            Op::Bind { .. } | Op::Store { .. } | Op::Unary(_) | Op::Cast | Op::Gather { .. } => 1,
            Op::Reduce { .. } | Op::Cumsum { .. } | Op::Softmax { .. } => 1,
            Op::Causal { .. } | Op::Window { .. } | Op::GateCumsum { .. } | Op::GateCumsumLo { .. } => 1,
            Op::Binary(_) | Op::RmsNorm { .. } | Op::Threshold { .. } | Op::BlockBoundary(_) => 2,
            Op::Select => 3,
            Op::Attention(_) | Op::AttentionBackward(_) | Op::LoadMap { .. } => return None,
        })
    }

    /// True for the ops that passes insert and backends lower as kernels.
    pub fn is_fused(&self) -> bool {
        matches!(
            self,
            Op::GateCumsum { .. }
                | Op::GateCumsumLo { .. }
                | Op::Threshold { .. }
                | Op::BlockBoundary(_)
                | Op::Attention(_)
                | Op::AttentionBackward(_)
        )
    }
}

fn fmt_f64(x: f64) -> String {
    if x == x.trunc() && x.abs() < 1e15 {
        format!("{x:.1}")
    } else {
        format!("{x}")
    }
}

/// Attribute list as printed after the mnemonic (`{axis = t}`), empty when none.
impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.mnemonic())?;
        match self {
            Op::Param { name, index } => write!(f, " \"{name}\" #{index}"),
            Op::Const(c) => write!(f, " {}", fmt_f64(*c)),
            Op::DimSize(d) => write!(f, " {d}"),
            Op::Iota { axis } => write!(f, " {{axis = {axis}}}"),
            Op::Bind { axes } | Op::Store { axes } => write!(f, " [{}]", axes.join(", ")),
            Op::Gather { index, axes } => {
                let ix: Vec<String> = index.iter().map(|e| e.to_string()).collect();
                write!(f, " [{}] {{axes = [{}]}}", ix.join(", "), axes.join(", "))
            }
            Op::Reduce { axis, contract: true, .. } => write!(f, " {{axis = {axis}, contract}}"),
            Op::Cumsum { axis, reverse: true } => write!(f, " {{axis = {axis}, reverse}}"),
            Op::Reduce { axis, .. } | Op::Cumsum { axis, .. } | Op::Softmax { axis } => {
                write!(f, " {{axis = {axis}}}")
            }
            Op::Causal { i, j } => write!(f, " {{i = {i}, j = {j}}}"),
            Op::Window { i, j, size } => write!(f, " {{i = {i}, j = {j}, size = {size}}}"),
            Op::RmsNorm { axis, eps } => write!(f, " {{axis = {axis}, eps = {eps:e}}}"),
            Op::GateCumsum { kind, split_rows: true } => write!(f, " {{gate = {kind:?}, split rows}}"),
            Op::GateCumsum { kind, .. } | Op::GateCumsumLo { kind } => write!(f, " {{gate = {kind:?}}}"),
            Op::Threshold { rule, log_eps, bound, score, scale, bm, plan } => {
                let b = match bound {
                    NormBound::Static { q_max, k_max } => {
                        format!("static(q_max = {}, k_max = {})", fmt_f64(*q_max), fmt_f64(*k_max))
                    }
                    NormBound::Data => "data".to_string(),
                };
                let u = if *score == ScoreBound::IDENTITY { String::new() } else { format!(", u = {score}") };
                let p = if *plan == ThresholdPlan::OneLaunch { ", plan = one_launch" } else { "" };
                write!(
                    f,
                    " {{rule = {rule}, log_eps = {}, bound = {b}{u}, scale = {scale}, bm = {bm}{p}}}",
                    fmt_f64(*log_eps)
                )
            }
            Op::BlockBoundary(t) => write!(f, " {{bm = {}, bn = {}}}", t.bm, t.bn),
            Op::Attention(a) | Op::AttentionBackward(a) => write!(f, " {{{a}}}"),
            // Captures print as `$k` here; the graph printer names them by their values.
            Op::LoadMap { f: r } => write!(f, " {{f = {}}}", r.display_load_map(&|k| format!("${k}"))),
            _ => Ok(()),
        }
    }
}

/// The dtype a fused op produces.
pub fn fused_result_dtype(op: &Op) -> Option<DType> {
    match op {
        Op::BlockBoundary(_) => Some(DType::I32),
        Op::GateCumsum { .. } | Op::GateCumsumLo { .. } | Op::Threshold { .. } => Some(DType::F32),
        Op::Attention(a) => Some(a.out_dtype),
        Op::AttentionBackward(_) => Some(DType::F32),
        _ => None,
    }
}
