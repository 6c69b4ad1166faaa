//! The generic fused attention op (`Op::Attention`), its score region and its named operands.
//!
//! One op covers every attention variant foxc fuses (docs/SEMANTICS.md, "attention"):
//!
//! ```text
//! scores  E_ij = R(x_ij, b, h, i, j) + (c_p - c_j if decay)      x_ij = scale * q_i . k_j
//! kept    K(i) = { j : mask(i, j) } ∩ { j >= start[floor(i / bm)] * bn  if pruned }
//! out_i   = sum_{j in K(i)} softmax_j(E_ij) v_j                 (result 0, dtype out_dtype)
//! lse_i   = log sum_{j in K(i)} exp(E_ij)                       (result 1, f32 [B, H, Tq])
//! ```
//!
//! Queries are aligned to the end of the keys: q has `Tq` rows, k and v `Tk >= Tq`, and query row
//! `i` sits at key position `p = i + Tk - Tq` (a prefill against a cache, a decode step; `p = i`
//! when square). The causal and window masks are relative to `p`, and `c` (`[B, H, Tk]`) is read
//! there. The offset is a function of the operand shapes, not an attribute.
//!
//! `R` is a [`Region`]: a small expression over the scaled product `x`, the indices, dims and
//! captured tensors. The decay `c_i - c_j` is not part of it (it is the decay operand, which is
//! what ACP prunes on). Key/value heads are shared by `kv_group` consecutive query heads (GQA).
//!
//! Operands, in the positional order that only [`Attention::operands`] and
//! [`AttnOperands::to_vec`] know: `q, k, v, [c], [c_lo], [start | delta], captures...`.

use crate::graph::{Graph, Value, ValueId};
use crate::index::IndexExpr;
use crate::ops::{BinaryOp, Op, Tiles, UnaryOp};
use crate::types::{DType, Dim};
use std::fmt;

/// The factor of `q . k`: `factor / sqrt(inv_sqrt)` (just `factor` without a dim), times `q`
/// when present.
///
/// The usual `1/sqrt(D)` stays symbolic (`factor = 1, inv_sqrt = Some(D)`) because `D` may be bound
/// only at run time; [`Scale::value`] is the one evaluation every backend uses.
///
/// `q` is a factor the `fold-q-scale` pass (GPU targets) took out of the op's q operand: the op
/// reads `x` where the program gave it `x * s` (or `s * x`, or `x / s`, then the factor is
/// `1 / s`) with a compile-time scalar `s`, so that no kernel materializes the product. It is a
/// scalar [`Region`] (constants, dims, unary and non-comparison binary ops only: see
/// [`Scale::malformed`]) evaluated with the interpreter's f64 arithmetic, as
/// `foxc_ir::fold::scalar_value` evaluates the subgraph it came from. It is kept apart from
/// `factor` so that the evaluation is the one the unfolded program would give, and because a
/// threshold reads it apart (its data statistics of `x` are scaled by `|q|`). Printed
/// `1/sqrt(D) * q_factor(1 / dim(D))`.
#[derive(Clone, Debug, PartialEq)]
pub struct Scale {
    pub factor: f64,
    pub inv_sqrt: Option<Dim>,
    pub q: Option<Region>,
}

impl Scale {
    /// A numeric scale.
    pub fn constant(factor: f64) -> Scale {
        Scale { factor, inv_sqrt: None, q: None }
    }

    /// `factor / sqrt(dim)`.
    pub fn inv_sqrt(factor: f64, dim: Dim) -> Scale {
        Scale { factor, inv_sqrt: Some(dim), q: None }
    }

    /// The number, given the sizes of the symbolic dims (`None` if a dim is unbound): the
    /// [`Scale::base_value`] times the [`Scale::q_value`], in f64 in that order.
    pub fn value(&self, bind: &dyn Fn(&str) -> Option<u64>) -> Option<f64> {
        // Without a q factor that factor is 1, and `base * 1` is `base` exactly.
        Some(self.base_value(bind)? * self.q_value(bind)?)
    }

    /// `factor / sqrt(inv_sqrt)`, without the factor folded out of q.
    pub fn base_value(&self, bind: &dyn Fn(&str) -> Option<u64>) -> Option<f64> {
        match &self.inv_sqrt {
            None => Some(self.factor),
            Some(d) => d.eval(bind).map(|n| self.factor / (n as f64).sqrt()),
        }
    }

    /// The factor folded out of q (1 without one).
    pub fn q_value(&self, bind: &dyn Fn(&str) -> Option<u64>) -> Option<f64> {
        match &self.q {
            None => Some(1.0),
            Some(r) => r.scalar_value(bind),
        }
    }

    /// The number when it does not depend on any symbolic dim.
    pub fn constant_value(&self) -> Option<f64> {
        self.value(&|_| None)
    }

    /// What makes the attribute invalid: a NaN factor, or a q factor that is not a well-formed
    /// scalar region. `None` when valid.
    pub fn malformed(&self) -> Option<String> {
        if self.factor.is_nan() {
            return Some("the scale is NaN".into());
        }
        let r = self.q.as_ref()?;
        if let Some(e) = r.malformed() {
            return Some(format!("the scale's q factor: {e}"));
        }
        let scalar = |n: &RNode| match n {
            RNode::Const(_) | RNode::Dim(_) | RNode::Unary(..) => true,
            RNode::Binary(b, ..) => !b.is_comparison(),
            _ => false,
        };
        r.nodes
            .iter()
            .find(|n| !scalar(n))
            .map(|n| format!("the scale's q factor is not a scalar of constants and dims ({n:?})"))
    }
}

impl fmt::Display for Scale {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inv_sqrt {
            None => f.write_str(&fmt_num(self.factor))?,
            Some(d) if self.factor == 1.0 => write!(f, "1/sqrt({d})")?,
            Some(d) => write!(f, "{}/sqrt({d})", fmt_num(self.factor))?,
        }
        match &self.q {
            None => Ok(()),
            Some(r) => write!(f, " * q_factor({})", r.display_with(&|k| format!("${k}"))),
        }
    }
}

/// An index variable of the score: batch, head, query row, key column.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IndexVar {
    B,
    H,
    I,
    J,
}

impl IndexVar {
    pub const ALL: [IndexVar; 4] = [IndexVar::B, IndexVar::H, IndexVar::I, IndexVar::J];

    /// The name used in regions and in [`IndexExpr`] terms: `b`, `h`, `i`, `j`.
    pub fn name(self) -> &'static str {
        match self {
            IndexVar::B => "b",
            IndexVar::H => "h",
            IndexVar::I => "i",
            IndexVar::J => "j",
        }
    }

    pub fn from_name(s: &str) -> Option<IndexVar> {
        IndexVar::ALL.into_iter().find(|v| v.name() == s)
    }
}

/// Index of a node inside its [`Region`].
pub type RId = u32;

/// One node of a region. Operands refer to earlier nodes (the arena is topologically ordered).
#[derive(Clone, Debug, PartialEq)]
pub enum RNode {
    /// `x_ij = scale * q_i . k_j`, the scaled raw product.
    Score,
    /// The value of an index variable, as a number.
    Index(IndexVar),
    /// The size of a dim, as a number.
    Dim(Dim),
    Const(f64),
    /// Captured tensor number `k` (operand `captures[k]`), read at `index` (one expression per
    /// axis of the tensor, in the variables `b, h, i, j`).
    Capture {
        k: usize,
        index: Vec<IndexExpr>,
    },
    Unary(UnaryOp, RId),
    /// Arithmetic or a comparison (comparisons give 1 or 0).
    Binary(BinaryOp, RId, RId),
    /// `select(c, a, b)`: `a` where `c` is non-zero.
    Select(RId, RId, RId),
}

/// A small expression, evaluated once per score entry `(b, h, i, j)`.
///
/// `nodes` is an arena in topological order (every operand id is smaller than its user's);
/// `root` is the value. The identity region (`E = x`) is `[Score]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Region {
    pub nodes: Vec<RNode>,
    pub root: RId,
}

impl Region {
    /// `R = x`.
    pub fn identity() -> Region {
        Region { nodes: vec![RNode::Score], root: 0 }
    }

    /// An empty region to build with [`Region::push`]; set `root` when done (it starts at 0).
    pub fn new() -> Region {
        Region { nodes: vec![], root: 0 }
    }

    /// Append a node, returning its id (and making it the root).
    pub fn push(&mut self, n: RNode) -> RId {
        self.nodes.push(n);
        self.root = (self.nodes.len() - 1) as RId;
        self.root
    }

    /// Append `other`'s nodes after these (its ids shifted past them), returning the id of its
    /// root here; this region's root is unchanged.
    pub fn append(&mut self, other: &Region) -> RId {
        let (root, base) = (self.root, self.nodes.len() as RId);
        let m = |x: &RId| x + base;
        self.nodes.extend(other.nodes.iter().map(|n| match n {
            RNode::Unary(u, x) => RNode::Unary(*u, m(x)),
            RNode::Binary(op, x, y) => RNode::Binary(*op, m(x), m(y)),
            RNode::Select(c, x, y) => RNode::Select(m(c), m(x), m(y)),
            other => other.clone(),
        }));
        self.root = root;
        other.root + base
    }

    pub fn is_identity(&self) -> bool {
        matches!(self.nodes.get(self.root as usize), Some(RNode::Score))
    }

    /// Whether the value depends on `x` (a mask region must not).
    pub fn uses_score(&self) -> bool {
        self.nodes.iter().any(|n| matches!(n, RNode::Score))
    }

    /// The capture numbers that appear, sorted, each once.
    pub fn captures(&self) -> Vec<usize> {
        let mut ks: Vec<usize> = self
            .nodes
            .iter()
            .filter_map(|n| if let RNode::Capture { k, .. } = n { Some(*k) } else { None })
            .collect();
        ks.sort_unstable();
        ks.dedup();
        ks
    }

    /// The same region reading capture `k + by` wherever it read capture `k`: a region whose
    /// captures join another's list after that one's `by` tensors.
    pub fn shift_captures(&self, by: usize) -> Region {
        let nodes = self
            .nodes
            .iter()
            .map(|n| match n {
                RNode::Capture { k, index } => RNode::Capture { k: k + by, index: index.clone() },
                other => other.clone(),
            })
            .collect();
        Region { nodes, root: self.root }
    }

    /// The value of a region of constants, dims, unary and binary ops (a [`Scale`]'s q factor),
    /// with the interpreter's f64 arithmetic, node by node as `foxc_ir::fold::scalar_value`
    /// folds the graph's scalars (so no count rule: `x * 0` is NaN for an infinite `x`). `None`
    /// when a dim is unbound or a node is anything else (a comparison, an index, `x`).
    pub fn scalar_value(&self, bind: &dyn Fn(&str) -> Option<u64>) -> Option<f64> {
        let mut vals: Vec<Option<f64>> = Vec::with_capacity(self.nodes.len());
        for n in &self.nodes {
            let at = |k: &RId| vals.get(*k as usize).copied().flatten();
            let v = match n {
                RNode::Const(c) => Some(*c),
                RNode::Dim(d) => d.eval(bind).map(|x| x as f64),
                RNode::Unary(u, a) => at(a).map(|a| crate::interp::unary(*u, a)),
                RNode::Binary(b, x, y) if !b.is_comparison() => match (at(x), at(y)) {
                    (Some(x), Some(y)) => Some(crate::interp::binary(*b, x, y)),
                    _ => None,
                },
                _ => None,
            };
            vals.push(v);
        }
        vals.get(self.root as usize).copied().flatten()
    }

    /// Which nodes are counts: exact integers made from indices, dims and integer constants by
    /// `+ - * min max neg` (as the interpreter's graph rule; docs/SEMANTICS.md, "The reference
    /// at infinities"). `x * n` with a count `n` is 0 where `n = 0`, even for an infinite `x`.
    pub fn counts(&self) -> Vec<bool> {
        let mut c = vec![false; self.nodes.len()];
        for (n, node) in self.nodes.iter().enumerate() {
            let of = |k: &RId| c.get(*k as usize).copied().unwrap_or(false);
            c[n] = match node {
                RNode::Index(_) | RNode::Dim(_) => true,
                RNode::Const(x) => crate::interp::is_count_const(*x),
                RNode::Unary(UnaryOp::Neg, a) => of(a),
                RNode::Binary(op, a, b) if crate::interp::keeps_counts(*op) => of(a) && of(b),
                _ => false,
            };
        }
        c
    }

    /// For a `Mul` node with a count operand ([`Region::counts`]) that may be 0: `(x, n)`, the
    /// other operand and the count (the right one when both are). A non-zero constant or a dim
    /// (a size, at least 1 wherever the region is evaluated) never is, so `20 * tanh(x / 20)`
    /// is a plain product.
    pub fn count_product(&self, node: &RNode, counts: &[bool]) -> Option<(RId, RId)> {
        let RNode::Binary(BinaryOp::Mul, a, b) = node else { return None };
        let nonzero = |k: &RId| match self.nodes.get(*k as usize) {
            Some(RNode::Const(c)) => *c != 0.0,
            Some(RNode::Dim(_)) => true,
            _ => false,
        };
        let is = |k: &RId| counts.get(*k as usize).copied().unwrap_or(false) && !nonzero(k);
        if is(b) {
            Some((*a, *b))
        } else if is(a) {
            Some((*b, *a))
        } else {
            None
        }
    }

    /// Operand ids of node `n`.
    pub fn args(n: &RNode) -> Vec<RId> {
        match n {
            RNode::Unary(_, a) => vec![*a],
            RNode::Binary(_, a, b) => vec![*a, *b],
            RNode::Select(c, a, b) => vec![*c, *a, *b],
            _ => vec![],
        }
    }

    /// Structural problems: an empty arena, a root or operand out of order, an index expression
    /// over a variable other than `b, h, i, j`. `None` when well formed.
    pub fn malformed(&self) -> Option<String> {
        if self.nodes.is_empty() {
            return Some("the region is empty".into());
        }
        if self.root as usize >= self.nodes.len() {
            return Some(format!("root %{} is not a node of the region", self.root));
        }
        for (n, node) in self.nodes.iter().enumerate() {
            for a in Region::args(node) {
                if a as usize >= n {
                    return Some(format!("node %{n} uses %{a}, which does not come before it"));
                }
            }
            if let RNode::Capture { index, .. } = node {
                for e in index {
                    if let Some((v, _)) = e.terms.iter().find(|(v, _)| IndexVar::from_name(v).is_none()) {
                        return Some(format!("capture index uses `{v}`, not one of b, h, i, j"));
                    }
                }
            }
            if let RNode::Const(c) = node {
                if c.is_nan() {
                    return Some("a region constant is NaN".into());
                }
            }
        }
        None
    }

    /// Readable infix form; `capture(k)` names captured tensor `k` (the printer passes `%N`).
    ///
    /// An operation the value uses more than once (a region of `a2 = a1 + a1, a3 = a2 * a2, ...`)
    /// is printed once, named after its node: `let t1 = x + x, t2 = t1 * t1 in t2 + t2`, so that
    /// the text is as long as the region, not as its tree.
    pub fn display_with(&self, capture: &dyn Fn(usize) -> String) -> String {
        self.display_named(&Names { capture, x: "x", j: "j" })
    }

    /// [`Region::display_with`] of an epilogue ([`Attention::epilogue`]): its `x` is the output
    /// `o` and its `j` the output column `d`, and it prints so.
    pub fn display_epilogue(&self, capture: &dyn Fn(usize) -> String) -> String {
        self.display_named(&Names { capture, x: "o", j: "d" })
    }

    /// [`Region::display_with`] of a load map ([`crate::Op::LoadMap`]): its `j` is the column
    /// `d`, and it prints so.
    pub fn display_load_map(&self, capture: &dyn Fn(usize) -> String) -> String {
        self.display_named(&Names { capture, x: "x", j: "d" })
    }

    fn display_named(&self, names: &Names) -> String {
        let shared = self.shared();
        let lets: Vec<String> = (0..self.nodes.len())
            .filter(|&n| shared[n])
            .map(|n| format!("t{n} = {}", self.expr_of(n as RId, names, 0, &shared)))
            .collect();
        let body = self.expr(self.root, names, 0, &shared);
        if lets.is_empty() {
            body
        } else {
            format!("let {} in {body}", lets.join(", "))
        }
    }

    /// The operations (not leaves) that the root reaches by more than one path of uses.
    fn shared(&self) -> Vec<bool> {
        let len = self.nodes.len();
        let mut reached = vec![false; len];
        let mut uses = vec![0u32; len];
        if let Some(r) = reached.get_mut(self.root as usize) {
            *r = true;
        }
        for n in (0..len).rev() {
            if reached[n] {
                for a in Region::args(&self.nodes[n]) {
                    if let Some(r) = reached.get_mut(a as usize) {
                        *r = true;
                        uses[a as usize] += 1;
                    }
                }
            }
        }
        (0..len).map(|n| uses[n] > 1 && !Region::args(&self.nodes[n]).is_empty()).collect()
    }

    /// Infix rendering of node `id` inside a context of binding power `ctx` (parenthesized
    /// when the node binds less tightly); a shared node is its name.
    fn expr(&self, id: RId, cap: &Names, ctx: u8, shared: &[bool]) -> String {
        if shared.get(id as usize).copied().unwrap_or(false) {
            return format!("t{id}");
        }
        self.expr_of(id, cap, ctx, shared)
    }

    /// [`Region::expr`] of node `id` itself (its operation, even when shared).
    fn expr_of(&self, id: RId, cap: &Names, ctx: u8, shared: &[bool]) -> String {
        let Some(n) = self.nodes.get(id as usize) else { return format!("<bad %{id}>") };
        let (s, power) = match n {
            RNode::Score => (cap.x.to_string(), 9),
            RNode::Index(IndexVar::J) => (cap.j.to_string(), 9),
            RNode::Index(v) => (v.name().to_string(), 9),
            RNode::Dim(d) => (format!("dim({d})"), 9),
            RNode::Const(c) => (fmt_num(*c), if *c < 0.0 { 5 } else { 9 }),
            RNode::Capture { k, index } => {
                let ix: Vec<String> = index.iter().map(|e| cap.index(e)).collect();
                (format!("{}[{}]", (cap.capture)(*k), ix.join(", ")), 9)
            }
            RNode::Unary(UnaryOp::Neg, a) => (format!("-{}", self.expr(*a, cap, 6, shared)), 5),
            RNode::Unary(u, a) => {
                (format!("{}({})", Op::Unary(*u).mnemonic(), self.expr(*a, cap, 0, shared)), 9)
            }
            RNode::Binary(b, x, y) => match infix(*b) {
                Some((sym, p)) => {
                    // Left-associative: the right operand needs one more level.
                    (
                        format!(
                            "{} {sym} {}",
                            self.expr(*x, cap, p, shared),
                            self.expr(*y, cap, p + 1, shared)
                        ),
                        p,
                    )
                }
                None => {
                    let name = Op::Binary(*b).mnemonic();
                    (
                        format!(
                            "{name}({}, {})",
                            self.expr(*x, cap, 0, shared),
                            self.expr(*y, cap, 0, shared)
                        ),
                        9,
                    )
                }
            },
            RNode::Select(c, a, b) => (
                format!(
                    "select({}, {}, {})",
                    self.expr(*c, cap, 0, shared),
                    self.expr(*a, cap, 0, shared),
                    self.expr(*b, cap, 0, shared)
                ),
                9,
            ),
        };
        if power < ctx {
            format!("({s})")
        } else {
            s
        }
    }
}

/// How [`Region::display_named`] names the captures, the score and the fourth index.
struct Names<'c> {
    capture: &'c dyn Fn(usize) -> String,
    x: &'static str,
    j: &'static str,
}

impl Names<'_> {
    /// A capture subscript, its `j` renamed.
    fn index(&self, e: &IndexExpr) -> String {
        let renamed = e.rename_vars(|v| Ok::<_, ()>(if v == "j" { self.j } else { v }.to_string()));
        renamed.unwrap_or_else(|()| e.clone()).to_string()
    }
}

impl Default for Region {
    fn default() -> Self {
        Region::identity()
    }
}

/// Infix symbol and binding power of the binary ops printed infix.
fn infix(b: BinaryOp) -> Option<(&'static str, u8)> {
    Some(match b {
        BinaryOp::Lt => ("<", 1),
        BinaryOp::Le => ("<=", 1),
        BinaryOp::Gt => (">", 1),
        BinaryOp::Ge => (">=", 1),
        BinaryOp::Eq => ("==", 1),
        BinaryOp::Ne => ("!=", 1),
        BinaryOp::Add => ("+", 2),
        BinaryOp::Sub => ("-", 2),
        BinaryOp::Mul => ("*", 3),
        BinaryOp::Div => ("/", 3),
        BinaryOp::Min | BinaryOp::Max => return None,
    })
}

/// The value of an index expression ([`IndexExpr::eval`], the one definition): `var` gives the
/// variables, `dim` the dims; `None` when a variable or dim is unknown or the divisor is 0.
pub fn eval_index(
    e: &IndexExpr,
    var: &dyn Fn(&str) -> Option<i64>,
    dim: &dyn Fn(&Dim) -> Option<u64>,
) -> Option<i64> {
    let vals = e.vars().into_iter().map(|v| Some((v, var(v)?))).collect::<Option<Vec<_>>>()?;
    let value = |v: &str| vals.iter().find(|(w, _)| *w == v).map_or(0, |(_, x)| *x);
    e.eval(&value, &|s| dim(&Dim::sym(s)))
}

/// Whether `q` (`[B, H, Tq, D]`) has another length than `k` (queries aligned to the end of
/// longer keys), as the types say: dims that may be equal once bound count as different.
pub fn fewer_queries(g: &Graph, q: ValueId, k: ValueId) -> bool {
    g.ty(q).dims().nth(2) != g.ty(k).dims().nth(2)
}

/// Which entries `(i, j)` take part, before pruning.
#[derive(Clone, Debug, PartialEq)]
pub enum Mask {
    /// Every key (bidirectional attention).
    None,
    /// `j <= p`, the query's key position `p = i + Tk - Tq` (`i` when square).
    Causal,
    /// `j <= p && p - j < w` (w >= 1).
    Window(u64),
    /// A region of `b, h, i, j`, dims and captures (no `x`): non-zero keeps the entry.
    Expr(Region),
}

impl Mask {
    /// Whether the mask alone (no captures, no data) keeps `(i, j)`; `None` for [`Mask::Expr`].
    pub fn keeps_static(&self, i: u64, j: u64) -> Option<bool> {
        match self {
            Mask::None => Some(true),
            Mask::Causal => Some(j <= i),
            Mask::Window(w) => Some(j <= i && i - j < *w),
            Mask::Expr(_) => None,
        }
    }

    /// True for the masks under which row i sees only `j <= i` (ACP's tile rule assumes it).
    pub fn is_causal(&self) -> bool {
        matches!(self, Mask::Causal | Mask::Window(_))
    }
}

/// How (and whether) key tiles are pruned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Prune {
    /// Every entry of the mask is computed (tiles entirely outside a window may still be
    /// skipped: that is exact).
    Dense,
    /// Operand `start` (i32 `[B, H, ceil(T/bm)]`, a `block_boundary` result): query tile `m`
    /// skips every key tile before `start[m]`.
    Start,
    /// Operand `delta` (f32 `[B, H, ceil(T/bm)]`, a `threshold` result): the kernel derives
    /// `start[m]` itself from `c` and `delta` by the `block_boundary` rule (a pass fused the
    /// boundary node into the attention; the value is identical).
    Boundary,
}

/// Which forward kernel a GPU backend runs for an attention: a pass decision (the tiles pass
/// chooses per target, head dim and mask); backends obey it and never choose themselves.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum AttnKernel {
    /// The general kernel (every target, head dim and variant the backend supports).
    #[default]
    Standard,
    /// sm_90a: producer and consumer warpgroups sharing a K/V ring (128 query rows per block;
    /// codegen `nvptx::attention_ws`) where the head dim bound at code generation is one of
    /// `head_dims`, the standard kernel elsewhere. The pass states the condition with the
    /// choice because it may not know the head dim (a program compiled once for every size).
    WarpSpecialized { head_dims: Vec<u64>, loads: KvLoads, grid: WsGrid, turns: WsTurns },
    /// The standard kernel with the keys split across blocks: block `z` of a query tile walks
    /// the kept key tiles among `z * tiles ..= z * tiles + tiles - 1` only and writes its
    /// unnormalized partial (its rows' output and log-sum-exp), and a second launch merges the
    /// partials of each row. For queries fewer than one tile against many keys (a decode step),
    /// where one block per head would leave the machine idle and pruning would shorten only
    /// the heads that forget, not the step. Printed `kernel = split_keys(tiles = N)`.
    SplitKeys { tiles: u32 },
}

/// Whether the warp-specialized kernel's consumer warpgroups take turns at the tensor cores (a
/// pass decision, like the grid: `--ws-turns`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WsTurns {
    /// Pingpong: the consumers issue their GEMMs in a ring of named barriers, one turn per key
    /// tile each, so one consumer's softmax runs while another's GEMMs do.
    #[default]
    Ring,
    /// Free-running: each consumer issues its GEMMs as soon as its operands are ready (the warp
    /// schedulers interleave the consumers, as they do independent blocks).
    None,
}

/// How the warp-specialized kernel's blocks are laid out over the work (a pass decision, like
/// the loads: `--ws-grid`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WsGrid {
    /// One block per 128-row query tile and head, `(ceil(T / 128), B H)`, the longest query
    /// tile of a head first.
    #[default]
    Tiles,
    /// One block per multiprocessor, looping over `(head, query tile)` work items handed out by
    /// a counter in the same order (head-major, longest query tile first), so the next item's
    /// first loads and start search overlap the current item's last tiles and epilogue.
    Persistent,
}

/// How the warp-specialized kernel's producer fills its K/V ring (a pass decision, like the
/// kernel: `--ws-loads`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KvLoads {
    /// `cp.async` 16-byte copies issued by all 128 producer threads.
    #[default]
    CpAsync,
    /// One thread issues tensor-memory-accelerator copies (`cp.async.bulk.tensor`) of whole
    /// boxes; the kernel takes a tensor map of K and of V.
    Tma,
}

impl AttnKernel {
    /// Whether this attribute runs the warp-specialized kernel at head dim `head_dim`.
    pub fn runs_warp_specialized(&self, head_dim: u64) -> bool {
        matches!(self, AttnKernel::WarpSpecialized { head_dims, .. } if head_dims.contains(&head_dim))
    }

    /// The key tiles per block of a split-keys kernel ([`AttnKernel::SplitKeys`]).
    pub fn split_key_tiles(&self) -> Option<u32> {
        match self {
            AttnKernel::SplitKeys { tiles } => Some(*tiles),
            _ => None,
        }
    }

    /// How a warp-specialized kernel loads K and V (`cp.async` for the standard kernel).
    pub fn kv_loads(&self) -> KvLoads {
        match self {
            AttnKernel::WarpSpecialized { loads, .. } => *loads,
            AttnKernel::Standard | AttnKernel::SplitKeys { .. } => KvLoads::CpAsync,
        }
    }

    /// The grid of a warp-specialized kernel (`tiles` for the standard kernel).
    pub fn ws_grid(&self) -> WsGrid {
        match self {
            AttnKernel::WarpSpecialized { grid, .. } => *grid,
            AttnKernel::Standard | AttnKernel::SplitKeys { .. } => WsGrid::Tiles,
        }
    }

    /// The consumers' turns of a warp-specialized kernel (`ring` for the standard kernel, which
    /// has none to take).
    pub fn ws_turns(&self) -> WsTurns {
        match self {
            AttnKernel::WarpSpecialized { turns, .. } => *turns,
            AttnKernel::Standard | AttnKernel::SplitKeys { .. } => WsTurns::Ring,
        }
    }
}

/// How a GPU backend launches the producers of a pruned attention's `c` and `delta` (a pass
/// decision: `fuse-prelude`). The values are the same either way.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Prelude {
    /// One launch per producer: the gate scan and the threshold run side by side and the
    /// attention waits for both (a fork and a join).
    #[default]
    Launches,
    /// One launch computes both: `c` (a `gate_cumsum` of a gate, read by this attention only)
    /// and `delta` (a `threshold` whose formula reads tile norms only, read by this attention
    /// only), one kernel whose blocks do either. The plan is then a chain of two launches, as
    /// the dense attention's. Printed `prelude = joint`.
    Joint,
    /// As `Joint`, but a row of the gate longer than one segment of the scan is scanned by a
    /// block per segment, each first summing the segments before its own: for long rows, whose
    /// segments one block would otherwise walk one after another. Printed `prelude =
    /// joint(split rows)`.
    JointSplitRows,
}

impl Prelude {
    /// One launch computes `c` and `delta` (`Joint` or `JointSplitRows`).
    pub fn is_joint(self) -> bool {
        matches!(self, Prelude::Joint | Prelude::JointSplitRows)
    }
}

/// The attributes of `Op::Attention`.
#[derive(Clone, Debug, PartialEq)]
pub struct Attention {
    pub scale: Scale,
    /// `R` of the scores; [`Region::identity`] for plain (decay) attention.
    pub score: Region,
    pub mask: Mask,
    /// Operand `c` (`[B, H, Tk]`, a `gate_cumsum` result) adds `c_p - c_j` to the scores (`p` the
    /// query's key position).
    pub decay: bool,
    /// With `decay`: operand `c_lo` (a `gate_cumsum_lo` result) follows `c`, and the decay is
    /// `(c_i - c_j) + (lo_i - lo_j)`: `c` keeps f64 accuracy as an f32 pair (the
    /// `compensate-decay` pass sets it where the target computes scores in f32; printed
    /// `decay(pair)`).
    pub decay_lo: bool,
    /// Query heads per key/value head: the kv head of query head `h` is `h / kv_group`.
    /// `Dim::Const(1)` without grouped-query attention.
    pub kv_group: Dim,
    /// The dtype of result 0 (a pass fuses a following cast into it).
    pub out_dtype: DType,
    /// In `attention_backward`, the dtype of `dq`, `dk` and `dv` (f32 unless the
    /// `fuse-gradient-casts` step fused their casts into it; printed `grads = DTYPE`). The
    /// forward ignores it.
    pub grad_dtype: DType,
    /// `bm x bn` tiles, chosen by the tiles pass for every attention (backends never choose).
    pub tiles: Option<Tiles>,
    pub prune: Prune,
    /// The GPU forward kernel (set with the tiles; `Standard` until then).
    pub kernel: AttnKernel,
    /// `E(b, h, i)` (a region of `b`, `h`, `i`, dims and captures, neither `j` nor `x`) below
    /// which every key of row `i` is dropped (masked, or scored `-inf`), as the tiles pass
    /// proves from an expression mask `j >= E` or a score region `select(j >= E, X, -inf)`.
    /// A kernel may skip the key tiles that lie below `E` on every row of its query tile; the
    /// value is unchanged. Printed `keys_from = E`.
    pub keys_from: Option<Region>,
    /// An elementwise function of the output, applied where the kernel stores it:
    /// `out[b, h, i, d] = F(o, b, h, i, d)` with `o` the normalized output (0 on a row without
    /// kept keys), rounded to `out_dtype` after `F`. A [`Region`] read with the output in place
    /// of the score: its `x` is `o` and its fourth index `j` is the output column `d` (captures
    /// are read at `b, h, i, d`: an output gate `o * sigmoid(g[b, h, i, d])`). `lse` stays the
    /// attention's own. Set by the `fuse-epilogue` pass, so that the output makes one trip to
    /// memory instead of an f32 write, a read and a write; printed `epilogue = F` (with `o`
    /// and `d`).
    pub epilogue: Option<Region>,
    /// How the launches of `c` and `delta` are grouped on a GPU ([`Prelude`]).
    pub prelude: Prelude,
}

impl Graph {
    /// Adds attention `a` over `operands` (in [`Attention::operands`] order), its results typed
    /// by the op's rule ([`Attention::result_types`]); the rule's message when they do not fit.
    pub fn add_attention(
        &mut self,
        a: Attention,
        operands: &[ValueId],
        span: crate::types::Span,
    ) -> Result<ValueId, String> {
        let tys: Vec<&crate::types::ValueType> = operands.iter().map(|&o| self.ty(o)).collect();
        let rt = a.result_types(&tys)?;
        let vals: Vec<Value> = operands.iter().map(|&o| Value::of(o)).collect();
        Ok(self.add_multi(Op::Attention(a), rt, &vals, span))
    }
}

impl Attention {
    /// Dense attention with the identity score and f32 output, as recognition first emits it.
    pub fn new(scale: Scale, mask: Mask, decay: bool) -> Attention {
        Attention {
            scale,
            score: Region::identity(),
            mask,
            decay,
            decay_lo: false,
            kv_group: Dim::Const(1),
            out_dtype: DType::F32,
            grad_dtype: DType::F32,
            tiles: None,
            prune: Prune::Dense,
            kernel: AttnKernel::Standard,
            keys_from: None,
            epilogue: None,
            prelude: Prelude::Launches,
        }
    }

    /// Whether the queries' key positions play a part (a decay read at them, or a causal or
    /// window mask relative to them): then `Tq <= Tk` must hold when the dims are bound.
    pub fn positions_queries(&self) -> bool {
        self.decay || self.mask.is_causal()
    }

    /// Operands before the captures.
    pub fn fixed_operands(&self) -> usize {
        3 + self.decay as usize + self.has_decay_lo() as usize + (self.prune != Prune::Dense) as usize
    }

    /// Whether operand `c_lo` is present (`decay_lo` only counts with `decay`).
    pub fn has_decay_lo(&self) -> bool {
        self.decay && self.decay_lo
    }

    /// The named operands of attention node `node` of `g`.
    pub fn operands(g: &Graph, node: ValueId) -> Result<AttnOperands, String> {
        let Op::Attention(a) = g.op(node) else {
            return Err(format!("{} is not an attention node", g.op(node).mnemonic()));
        };
        AttnOperands::from_positional(a, &g.operands(node))
    }

    /// The ids of the results: `out` (0) and `lse` (1).
    pub const OUT: u32 = 0;
    pub const LSE: u32 = 1;

    /// Whether the tiles are known and the op is one a tiled kernel can run.
    pub fn tiles_or_err(&self) -> Result<Tiles, String> {
        self.tiles.ok_or_else(|| "the attention has no tiles (the tiles pass did not run)".to_string())
    }
}

/// The operands of one attention node, by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttnOperands {
    pub q: ValueId,
    pub k: ValueId,
    pub v: ValueId,
    /// `c`, present iff `decay`.
    pub decay: Option<ValueId>,
    /// `c_lo`, present iff `decay` and `decay_lo`.
    pub decay_lo: Option<ValueId>,
    /// Present iff `prune == Start`.
    pub start: Option<ValueId>,
    /// Present iff `prune == Boundary`.
    pub delta: Option<ValueId>,
    /// Captured tensors, `captures[k]` for `RNode::Capture { k, .. }`.
    pub captures: Vec<ValueId>,
}

impl AttnOperands {
    /// Split a positional operand list (the one place that knows the order).
    pub fn from_positional(a: &Attention, ops: &[ValueId]) -> Result<AttnOperands, String> {
        let fixed = a.fixed_operands();
        if ops.len() < fixed {
            return Err(format!("attention takes at least {fixed} operands, has {}", ops.len()));
        }
        let mut p = 3;
        let mut next = |on: bool| {
            on.then(|| {
                p += 1;
                ops[p - 1]
            })
        };
        let decay = next(a.decay);
        let decay_lo = next(a.has_decay_lo());
        let start = next(a.prune == Prune::Start);
        let delta = next(a.prune == Prune::Boundary);
        Ok(AttnOperands {
            q: ops[0],
            k: ops[1],
            v: ops[2],
            decay,
            decay_lo,
            start,
            delta,
            captures: ops[fixed..].to_vec(),
        })
    }

    /// Whether q has another length than k ([`fewer_queries`]).
    pub fn fewer_queries(&self, g: &Graph) -> bool {
        fewer_queries(g, self.q, self.k)
    }

    /// The positional operand list of a node built from these operands.
    pub fn to_vec(&self) -> Vec<ValueId> {
        let mut v = vec![self.q, self.k, self.v];
        v.extend(self.decay);
        v.extend(self.decay_lo);
        v.extend(self.start);
        v.extend(self.delta);
        v.extend(self.captures.iter().copied());
        v
    }
}

/// What the `threshold` node assumes about the region: `U >= max |R(x, ...)|` over all entries.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ScoreBound {
    /// `U` is this number, whatever q and k are (softcapping `a tanh(x / a)` gives `a`).
    Static(f64),
    /// `U = gain * X + extra` with `X = |scale| Qmax Kmax` (Qmax, Kmax from the norm bound):
    /// the identity region is `gain = 1, extra = 0`; `x + bias[j]` with `bias in [lo, hi]` adds
    /// `max(|lo|, |hi|)` to `extra`.
    Data { gain: f64, extra: f64 },
}

impl ScoreBound {
    /// The bound of the identity region.
    pub const IDENTITY: ScoreBound = ScoreBound::Data { gain: 1.0, extra: 0.0 };

    /// `U` given `X = |scale| Qmax Kmax`.
    pub fn u(&self, x: f64) -> f64 {
        match *self {
            ScoreBound::Static(u) => u,
            ScoreBound::Data { gain, extra } => gain * x + extra,
        }
    }
}

impl fmt::Display for ScoreBound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ScoreBound::Static(u) => write!(f, "static({})", fmt_num(u)),
            ScoreBound::Data { gain, extra } if gain == 1.0 && extra == 0.0 => f.write_str("x"),
            ScoreBound::Data { gain, extra } => {
                let gx = if gain == 1.0 { "x".to_string() } else { format!("{} * x", fmt_num(gain)) };
                if extra == 0.0 {
                    f.write_str(&gx)
                } else {
                    write!(f, "{gx} + {}", fmt_num(extra))
                }
            }
        }
    }
}

/// Numbers as the IR text prints them (`20`, `0.5`, `-inf`).
pub fn fmt_num(x: f64) -> String {
    if x.is_infinite() {
        if x > 0.0 { "inf" } else { "-inf" }.to_string()
    } else {
        format!("{x}")
    }
}

impl fmt::Display for Attention {
    /// The attribute list: `scale = 1/sqrt(D), score = 20 * tanh(x / 20), mask = causal, ...`
    /// (captures are named `$k`; the graph printer names them by their values instead).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.attrs_with(&|k| format!("${k}")))
    }
}

impl Attention {
    /// The attribute list with captured tensor `k` printed as `capture(k)`.
    pub fn attrs_with(&self, capture: &dyn Fn(usize) -> String) -> String {
        let mut s = format!("scale = {}", self.scale);
        if !self.score.is_identity() {
            s.push_str(&format!(", score = {}", self.score.display_with(capture)));
        }
        match &self.mask {
            Mask::None => s.push_str(", mask = none"),
            Mask::Causal => s.push_str(", mask = causal"),
            Mask::Window(w) => s.push_str(&format!(", mask = window({w})")),
            Mask::Expr(r) => s.push_str(&format!(", mask = {}", r.display_with(capture))),
        }
        if let Some(e) = &self.keys_from {
            s.push_str(&format!(", keys_from = {}", e.display_with(capture)));
        }
        if let Some(e) = &self.epilogue {
            s.push_str(&format!(", epilogue = {}", e.display_epilogue(capture)));
        }
        if self.has_decay_lo() {
            s.push_str(", decay(pair)");
        } else if self.decay {
            s.push_str(", decay");
        }
        if self.kv_group != Dim::Const(1) {
            s.push_str(&format!(", kv_group = {}", self.kv_group));
        }
        if self.out_dtype != DType::F32 {
            s.push_str(&format!(", out = {}", self.out_dtype));
        }
        if self.grad_dtype != DType::F32 {
            s.push_str(&format!(", grads = {}", self.grad_dtype));
        }
        if let Some(t) = self.tiles {
            s.push_str(&format!(", bm = {}, bn = {}", t.bm, t.bn));
        }
        match self.prune {
            Prune::Dense => {}
            Prune::Start => s.push_str(", pruned"),
            Prune::Boundary => s.push_str(", pruned(fused boundary)"),
        }
        match self.prelude {
            Prelude::Launches => {}
            Prelude::Joint => s.push_str(", prelude = joint"),
            Prelude::JointSplitRows => s.push_str(", prelude = joint(split rows)"),
        }
        if let AttnKernel::WarpSpecialized { head_dims, loads, grid, turns } = &self.kernel {
            let dims: Vec<String> = head_dims.iter().map(|d| d.to_string()).collect();
            let loads = if *loads == KvLoads::Tma { ", loads = tma" } else { "" };
            let grid = if *grid == WsGrid::Persistent { ", grid = persistent" } else { "" };
            let turns = if *turns == WsTurns::None { ", turns = none" } else { "" };
            s.push_str(&format!(", kernel = warp_specialized(D = {}{loads}{grid}{turns})", dims.join(" | ")));
        }
        if let AttnKernel::SplitKeys { tiles } = self.kernel {
            s.push_str(&format!(", kernel = split_keys(tiles = {tiles})"));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Products guarded by the count rule: a count that may be 0 (an index, a difference of
    /// indices) times anything; not a non-zero constant or a dim, not a product of non-counts.
    #[test]
    fn count_products() {
        let mut r = Region::new();
        let x = r.push(RNode::Score);
        let i = r.push(RNode::Index(IndexVar::I));
        let j = r.push(RNode::Index(IndexVar::J));
        let dist = r.push(RNode::Binary(BinaryOp::Sub, i, j));
        let inf = r.push(RNode::Const(f64::NEG_INFINITY));
        let twenty = r.push(RNode::Const(20.0));
        let dim = r.push(RNode::Dim(Dim::sym("D")));
        let half = r.push(RNode::Const(0.5));
        let by_dist = r.push(RNode::Binary(BinaryOp::Mul, inf, dist));
        let dist_first = r.push(RNode::Binary(BinaryOp::Mul, dist, x));
        let by_const = r.push(RNode::Binary(BinaryOp::Mul, x, twenty));
        let by_dim = r.push(RNode::Binary(BinaryOp::Mul, dim, x));
        let by_half = r.push(RNode::Binary(BinaryOp::Mul, half, dist));
        let plain = r.push(RNode::Binary(BinaryOp::Mul, x, inf));
        let c = r.counts();
        assert!(c[i as usize] && c[dist as usize] && c[twenty as usize] && c[dim as usize]);
        assert!(!c[inf as usize] && !c[half as usize] && !c[x as usize] && !c[by_half as usize]);
        let cp = |n: RId| r.count_product(&r.nodes[n as usize], &c);
        assert_eq!(cp(by_dist), Some((inf, dist)));
        assert_eq!(cp(dist_first), Some((x, dist)));
        assert_eq!(cp(by_half), Some((half, dist)));
        assert_eq!(cp(by_const), None);
        assert_eq!(cp(by_dim), None);
        assert_eq!(cp(plain), None);
    }

    fn softcap_plus_bias() -> Region {
        let mut r = Region::new();
        let x = r.push(RNode::Score);
        let a = r.push(RNode::Const(20.0));
        let d = r.push(RNode::Binary(BinaryOp::Div, x, a));
        let t = r.push(RNode::Unary(UnaryOp::Sigmoid, d));
        let m = r.push(RNode::Binary(BinaryOp::Mul, a, t));
        let iv = |v: &str| IndexExpr {
            terms: vec![(v.to_string(), 1)],
            dim_terms: vec![],
            constant: 0,
            div: None,
            clamps: vec![],
        };
        let kb = r.push(RNode::Capture { k: 0, index: vec![iv("b"), iv("h"), iv("j")] });
        r.push(RNode::Binary(BinaryOp::Add, m, kb));
        r
    }

    #[test]
    fn region_prints_readably() {
        let r = softcap_plus_bias();
        assert_eq!(r.display_with(&|_| "kb".into()), "20 * sigmoid(x / 20) + kb[b, h, j]");
        assert!(r.malformed().is_none());
        assert_eq!(r.captures(), vec![0]);
        assert!(!r.is_identity() && Region::identity().is_identity());
        // (x - 1) * 2 keeps its parentheses; x - (1 - 2) too.
        let mut r = Region::new();
        let x = r.push(RNode::Score);
        let one = r.push(RNode::Const(1.0));
        let two = r.push(RNode::Const(2.0));
        let s = r.push(RNode::Binary(BinaryOp::Sub, x, one));
        r.push(RNode::Binary(BinaryOp::Mul, s, two));
        assert_eq!(r.display_with(&|_| String::new()), "(x - 1) * 2");
        let s2 = r.push(RNode::Binary(BinaryOp::Sub, one, two));
        r.push(RNode::Binary(BinaryOp::Sub, x, s2));
        assert_eq!(r.display_with(&|_| String::new()), "x - (1 - 2)");
    }

    #[test]
    fn malformed_regions_are_named() {
        let mut r = Region::new();
        assert!(r.malformed().unwrap().contains("empty"));
        r.nodes.push(RNode::Unary(UnaryOp::Neg, 0));
        assert!(r.malformed().unwrap().contains("does not come before"));
        let r = Region {
            nodes: vec![RNode::Capture {
                k: 0,
                index: vec![IndexExpr {
                    terms: vec![("d".into(), 1)],
                    dim_terms: vec![],
                    constant: 0,
                    div: None,
                    clamps: vec![],
                }],
            }],
            root: 0,
        };
        assert!(r.malformed().unwrap().contains("`d`"));
        let r = Region { nodes: vec![RNode::Score], root: 3 };
        assert!(r.malformed().unwrap().contains("root"));
    }

    #[test]
    fn index_expressions_evaluate_and_print() {
        let gqa = IndexExpr {
            terms: vec![("h".into(), 1)],
            dim_terms: vec![],
            constant: 0,
            div: Some(Dim::sym("G")),
            clamps: vec![],
        };
        let var = |v: &str| Some(if v == "h" { 7 } else { 0 });
        assert_eq!(eval_index(&gqa, &var, &|_| Some(4)), Some(1));
        assert_eq!(eval_index(&gqa, &var, &|_| Some(0)), None);
        assert_eq!(gqa.to_string(), "h / G");
        let rel = IndexExpr {
            terms: vec![("i".into(), 1), ("j".into(), -1)],
            dim_terms: vec![],
            constant: 3,
            div: None,
            clamps: vec![],
        };
        assert_eq!(rel.to_string(), "i - j + 3");
        let v2 = |v: &str| Some(if v == "i" { 2 } else { 9 });
        assert_eq!(eval_index(&rel, &v2, &|_| None), Some(-4));
        // Floor division rounds toward -inf.
        let neg = IndexExpr {
            terms: vec![("i".into(), -1)],
            dim_terms: vec![],
            constant: 0,
            div: Some(Dim::Const(2)),
            clamps: vec![],
        };
        assert_eq!(eval_index(&neg, &|_| Some(1), &|d| d.eval(&|_| None)), Some(-1));
    }

    #[test]
    fn operand_view_round_trips() {
        use petgraph::stable_graph::NodeIndex;
        let ids: Vec<ValueId> = (0..7).map(NodeIndex::new).collect();
        let mut a = Attention::new(Scale::inv_sqrt(1.0, Dim::sym("D")), Mask::Causal, true);
        a.prune = Prune::Start;
        let o = AttnOperands::from_positional(&a, &ids).unwrap();
        assert_eq!((o.decay, o.start, o.delta), (Some(ids[3]), Some(ids[4]), None));
        assert_eq!(o.captures, ids[5..].to_vec());
        assert_eq!(o.to_vec(), ids);
        a.prune = Prune::Boundary;
        a.decay = true;
        let o = AttnOperands::from_positional(&a, &ids[..5]).unwrap();
        assert_eq!((o.start, o.delta), (None, Some(ids[4])));
        assert!(AttnOperands::from_positional(&a, &ids[..4]).is_err());
        // decay(pair): c_lo right after c.
        a.decay_lo = true;
        let o = AttnOperands::from_positional(&a, &ids[..6]).unwrap();
        assert_eq!((o.decay, o.decay_lo, o.delta), (Some(ids[3]), Some(ids[4]), Some(ids[5])));
        assert_eq!(o.to_vec(), ids[..6].to_vec());
        assert!(a.to_string().contains("decay(pair)"));
        assert_eq!(a.scale.value(&|_| Some(64)), Some(0.125));
        assert_eq!(a.scale.to_string(), "1/sqrt(D)");
    }
}
