//! Name resolution, type and shape checking, and lowering of an [`ast::Program`] to a [`Graph`].
//!
//! Checking and lowering are one walk: every IR node is built through [`crate::check::infer`],
//! and each DSL rule is checked first with a positioned [`Diagnostic`].
//!
//! Rules of the DSL:
//! - Names: parameters, symbolic dimensions (from the parameter types) and statement results
//!   share one namespace; a name is defined once and used only after its definition.
//! - Index variables are local to a statement. An index's size is fixed by its first use in an
//!   access `x[.., i, ..]` (in source order, anywhere in the statement); a later use with another
//!   size is an error. An index variable must not be a declared name.
//! - `x[i, j]` of a parameter or statement lowers to `bind [i, j]`; its rank must match.
//!   A rank-0 parameter or statement is used by its bare name.
//! - A subscript may be an index expression: affine in index variables with integer
//!   coefficients and constants (`rel[h, i - j]`, `x[b, h, t + 1]`, `2 * t`), then optionally
//!   floor-divided, as its outermost operation, by a dimension expression: a dimension, a positive
//!   integer, or an exact quotient of those (`k[b, h / (H / G), j, d]`; that `G` divides `H` is
//!   checked when dims are bound). Such an access lowers to `gather`. Its index variables take their
//!   sizes from plain uses (`q[b, h, i, d]`) elsewhere in the statement; a constant subscript
//!   alone (`x[0]`) is not supported.
//! - Out-of-range subscripts: every subscript must stay inside its axis, `[0, size)`, for all
//!   values of its index variables (each `v` of size `S` ranges over `[0, S - 1]`) and all values
//!   of the dims; this is proven at check time or the program is rejected. One exception: a
//!   subscript that is in range wherever `j <= i`, for two of its variables `i` and `j` of one
//!   size, is accepted when every use of the accessed value is masked over `(i, j)` before it is
//!   reduced over `i` or `j`, read by anything but elementwise ops, or returned: by
//!   `causal(i, j, ...)`, `window(i, j, W, ...)` or `select(j <= i, ..., -inf)` (the mask may sit in
//!   a later statement; the axes are followed through it). The entries the mask removes are never
//!   read; the interpreter reads NaN there, so a wrong acceptance would be visible.
//! - `inf` in an expression is the literal infinity (`-inf` its negation: `select(j <= i, s, -inf)`);
//!   it cannot be declared as a name.
//! - A bare name is, in order: a scalar parameter or statement, a dimension (its runtime size as a
//!   number, `sqrt(D)`), or an index variable (its position `0, 1, ..`, as in ALiBi's `i - j`);
//!   such an index must also index some tensor in the statement, which gives its size.
//! - `sum(i, e)`, `cumsum(i, e)`, `softmax(i, e)`: `i` must be an index of `e`.
//!   `max(a, b)` is a reduction over `a` when `a` is a bare identifier that is neither a declared
//!   name nor an index of the statement's left-hand side; otherwise it is the elementwise maximum.
//!   `min` is always elementwise.
//! - `causal(i, j, e)` keeps `j <= i`; `window(i, j, W, e)` also needs `i - j < W`, W an integer
//!   literal >= 1; `i` and `j` must be indices of `e`.
//! - `rmsnorm(x, w)` normalizes x over the single index of w (eps = 1e-6).
//! - The free indices of the right-hand side must be exactly those of the left-hand side; the
//!   statement lowers to `store [lhs indices]` (f32, positional, named after the statement).
//! - `bind` keeps the parameter's dtype (a bf16 input stays bf16 until its first operation);
//!   arithmetic computes in f32; comparisons give `bool`, which only `select` consumes.
//! - `return x`: x's dims must equal the declared ones; a `cast` is added when dtypes differ.

use crate::ast::{self, BinOp, Expr, ExprKind, Ident, Program, UnOp};
use crate::check::infer;
use crate::diag::{Diagnostic, Diagnostics};
use crate::graph::{Graph, SubscriptBound, ValueId};
use crate::index::{Clamp, ClampKind, IndexExpr};
use crate::index_range;
use crate::mask_flow::check_masked;
use crate::ops::{BinaryOp, Op, ReduceKind, UnaryOp};
use crate::types::{Axis, DType, Dim, Span, ValueType};
use std::collections::{HashMap, HashSet};

/// Epsilon of `rmsnorm` in the DSL.
pub const RMSNORM_EPS: f64 = 1e-6;

/// Every function name of the DSL ("did you mean" hints; the fuzz tests' vocabulary), in the
/// order the hint lists them. The unary built-ins are the rows of `crate::unary` with `dsl`.
pub const FUNCTIONS: [&str; 23] = [
    "exp",
    "log",
    "tanh",
    "abs",
    "exp2",
    "log2",
    "sqrt",
    "rsqrt",
    "sigmoid",
    "logsigmoid",
    "softplus",
    "relu",
    "silu",
    "min",
    "max",
    "select",
    "sum",
    "cumsum",
    "softmax",
    "causal",
    "window",
    "rmsnorm",
    "float",
];

type LResult<T> = Result<T, Diagnostic>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Param,
    Stmt,
    Dim,
}

#[derive(Clone, Debug)]
struct Entry {
    kind: Kind,
    /// The node of a parameter or statement (none for a dimension).
    node: Option<ValueId>,
    dtype: DType,
    dims: Vec<Dim>,
    span: Span,
}

/// Line and column (1-based, in chars) of a byte offset.
pub fn line_col(src: &str, off: u32) -> (usize, usize) {
    let mut off = (off as usize).min(src.len());
    while off > 0 && !src.is_char_boundary(off) {
        off -= 1;
    }
    let line_start = src[..off].rfind('\n').map(|p| p + 1).unwrap_or(0);
    (src[..line_start].matches('\n').count() + 1, src[line_start..off].chars().count() + 1)
}

/// Edit distance where swapping two adjacent characters counts as one edit (`tahn` -> `tanh`).
fn edit_distance(a: &str, b: &str) -> usize {
    strsim::osa_distance(a, b)
}

/// The closest candidate within a small edit distance (a third of the name's length, at least 1
/// for names of two or more characters), or one that differs only in case.
fn suggest<'a>(name: &str, cands: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let n = name.chars().count();
    let limit = if n >= 2 { (n / 3).max(1) } else { 0 };
    cands
        .into_iter()
        .map(|c| (if c.eq_ignore_ascii_case(name) { 0 } else { edit_distance(name, c) }, c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, c)| (*d, *c))
        .map(|(_, c)| c)
}

fn fmt_dims(dims: &[Dim]) -> String {
    let d: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
    format!("[{}]", d.join(", "))
}

/// `inf` is the literal infinity in expressions, so it cannot name anything.
fn reserved_name(id: &Ident) -> LResult<()> {
    if id.name == "inf" {
        return Err(Diagnostic::new("`inf` cannot be declared", id.span, "reserved").with_hint(
            "`inf` is the literal infinity in expressions (`-inf` masks a score); pick another name",
        ));
    }
    Ok(())
}

/// `k * x` of an undivided index expression.
fn scale(x: IndexExpr, k: i64) -> IndexExpr {
    let terms = x.terms.into_iter().map(|(v, c)| (v, c * k)).collect();
    let dim_terms = x.dim_terms.into_iter().map(|(d, c)| (d, c * k)).collect();
    normalize(IndexExpr { terms, dim_terms, constant: x.constant * k, div: None, clamps: vec![] })
}

/// One term per variable and per dim (first-appearance order), zero coefficients dropped.
fn normalize(x: IndexExpr) -> IndexExpr {
    let mut terms: Vec<(String, i64)> = Vec::new();
    for (v, c) in x.terms {
        match terms.iter_mut().find(|(w, _)| *w == v) {
            Some(t) => t.1 += c,
            None => terms.push((v, c)),
        }
    }
    terms.retain(|(_, c)| *c != 0);
    let mut dim_terms: Vec<(Dim, i64)> = Vec::new();
    for (d, c) in x.dim_terms {
        match dim_terms.iter_mut().find(|(e, _)| *e == d) {
            Some(t) => t.1 += c,
            None => dim_terms.push((d, c)),
        }
    }
    dim_terms.retain(|(_, c)| *c != 0);
    IndexExpr { terms, dim_terms, ..x }
}

/// `is 1 - T at i = 0, j = T - 1`.
fn describe_outside(ie: &IndexExpr, size: &Dim, out: &index_range::OutOfRange) -> String {
    // A constant subscript has no corner to name.
    let at = if ie.vars().is_empty() { "every entry".to_string() } else { out.corner() };
    let num = match &ie.div {
        None => out.value.to_string(),
        Some(d) => format!(
            "({}) / {}",
            out.value,
            if matches!(d, Dim::Div(..)) { format!("({d})") } else { d.to_string() }
        ),
    };
    if out.below {
        format!("it is {num} at {at}, below 0")
    } else if out.unprovable {
        let d = ie.div.as_ref().map(|d| d.to_string()).unwrap_or_default();
        format!("cannot prove it stays below {size}: that needs the numerator below ({d}) * {size}, which is not a sum of dims")
    } else if ie.div.is_some() {
        format!("it is {num} at {at}, not provably below {size}")
    } else {
        format!("it is {num} at {at}, past the last index {size} - 1")
    }
}

/// The condition of a `select`: lowered comparisons joined by `and` / `or`.
enum Condition {
    Compare(ValueId),
    And(Box<Condition>, Box<Condition>),
    Or(Box<Condition>, Box<Condition>),
}

struct Lowerer<'a> {
    src: &'a str,
    g: Graph,
    names: HashMap<String, Entry>,
    /// Declaration order of names, for hints.
    order: Vec<String>,
    /// Statements that failed to check.
    poisoned: HashSet<String>,
    /// Gathers that are in range only under a mask, checked once the program is lowered.
    masked: Vec<NeedsMask>,
    /// What the enclosing select branches know about index variables (innermost last): see
    /// [`Guard`].
    guards: Vec<Guard>,
    /// Inside an operand of a comparison, integers add and subtract (`j < start[b] + 4`).
    comparing: bool,
    /// The sums of integers, indices, dims and integer constants lowered so far (as f32 values
    /// of their integer parameters' casts: exact below 2^24, as the comparisons are).
    integer_sums: HashSet<ValueId>,
}

/// A bound on an index variable that holds wherever a select branch is taken: in
/// `select(t >= 1, x[t - 1], 0)` the read `x[t - 1]` is evaluated only where `t >= 1`, so its
/// subscript need be in range only there (a "guarded read"). Bounds are inclusive forms of the
/// dims; the branch's value elsewhere is not taken, so reading NaN there changes nothing.
#[derive(Clone, Debug)]
struct Guard {
    var: String,
    lo: Option<index_range::Lin>,
    hi: Option<index_range::Lin>,
}

/// A `gather` whose subscript is in range only where `j <= i`.
struct NeedsMask {
    node: ValueId,
    i: String,
    j: String,
    /// The subscript, the accessed tensor and where the subscript was written.
    text: String,
    tensor: String,
    span: Span,
    /// Where it leaves its axis without the mask (for the hint).
    outside: String,
    /// The check of the subscript at bound sizes that stands in for a missing mask (a pair of
    /// different sizes whose subscript is in range at some sizes).
    fallback: Option<SubscriptBound>,
    /// `size(j) - size(i)` where the sizes differ (`M - N`: queries at the end of the keys).
    shift: Option<String>,
}

impl NeedsMask {
    /// The last key the mask keeps for query `i`.
    fn diagonal(&self) -> String {
        match &self.shift {
            None => self.i.clone(),
            Some(s) => format!("{} + {s}", self.i),
        }
    }

    /// The masks that keep the read's range, as the hint writes them.
    fn masks(&self) -> String {
        let (i, j) = (&self.i, &self.j);
        match &self.shift {
            None => format!(
                "`causal({i}, {j}, ...)`, `window({i}, {j}, W, ...)` or `select({j} <= {i}, ..., -inf)`"
            ),
            Some(_) => format!("`select({j} <= {}, ..., -inf)`", self.diagonal()),
        }
    }
}

/// Per-statement state.
struct StmtCtx<'s> {
    name: &'s str,
    lhs: &'s [Ident],
    /// Size of each index variable and where it was first used.
    sizes: HashMap<String, (Dim, Span)>,
}

/// Whether `e` uses `name` as a value (outside subscripts).
fn names_value(e: &Expr, name: &str) -> bool {
    match &e.kind {
        ExprKind::Name(ix) => ix.name == name,
        ExprKind::Access { .. } => false,
        _ => e.children().into_iter().any(|c| names_value(c, name)),
    }
}

/// Every tensor access in `e`: its name and subscripts.
fn accesses<'e>(e: &'e Expr, out: &mut Vec<(&'e Ident, &'e [Expr])>) {
    if let ExprKind::Access { name, indices } = &e.kind {
        out.push((name, indices));
    }
    e.children().into_iter().for_each(|c| accesses(c, out));
}

/// Message of the internal diagnostic that stands for "uses a statement that already failed":
/// it is dropped, so that one mistake is reported once and not again at every later use.
const POISONED: &str = "\u{0}poisoned";

/// At most this many diagnostics are reported for one program.
pub const MAX_DIAGNOSTICS: usize = 20;

/// Check `prog` and lower it to a graph (not yet verified).
///
/// Errors in the signature stop at once. A statement with an error is reported and skipped, and
/// later statements are still checked (uses of the failed statement are not reported again).
pub fn lower(prog: &Program, src: &str) -> Result<Graph, Diagnostics> {
    let mut l = Lowerer {
        src,
        g: Graph::new(&prog.name.name),
        names: HashMap::new(),
        order: vec![],
        poisoned: HashSet::new(),
        masked: vec![],
        guards: vec![],
        comparing: false,
        integer_sums: HashSet::new(),
    };
    l.params(prog)?;
    let mut diags = Diagnostics::new();
    for (n, s) in prog.stmts.iter().enumerate() {
        if let Err(d) = l.stmt(s, &prog.stmts[n + 1..]) {
            if !l.names.contains_key(&s.name.name) {
                l.poisoned.insert(s.name.name.clone());
            }
            if d.message != POISONED {
                diags.push(d);
            }
            if diags.len() >= MAX_DIAGNOSTICS {
                // Enough to act on; checking on would only cost time on a pathological input.
                return Err(diags);
            }
        }
    }
    if let Err(d) = l.ret(prog) {
        if d.message != POISONED && diags.len() < MAX_DIAGNOSTICS {
            diags.push(d);
        }
    }
    if diags.is_empty() {
        for m in std::mem::take(&mut l.masked) {
            if let Err(esc) = check_masked(&l.g, m.node, &m.i, &m.j) {
                match m.fallback {
                    Some(bound) => l.g.bind_checks.push(bound),
                    None => diags.push(l.unmasked(&m, &esc.reason, esc.span)),
                }
            }
        }
    }
    if diags.is_empty() {
        Ok(l.g)
    } else {
        Err(diags)
    }
}

impl<'a> Lowerer<'a> {
    fn at(&self, span: Span) -> String {
        let (l, c) = line_col(self.src, span.start);
        format!("{l}:{c}")
    }

    fn kind_word(k: Kind) -> &'static str {
        match k {
            Kind::Param => "parameter",
            Kind::Stmt => "statement",
            Kind::Dim => "dimension",
        }
    }

    fn declared_hint(&self) -> String {
        let shown: Vec<&str> = self.order.iter().map(|s| s.as_str()).collect();
        if shown.is_empty() {
            "nothing is declared yet".into()
        } else {
            format!("declared names: {}", shown.join(", "))
        }
    }

    fn add(&mut self, op: Op, operands: &[ValueId], span: Span) -> LResult<(ValueId, ValueType)> {
        let tys: Vec<&ValueType> = operands.iter().map(|&o| self.g.ty(o)).collect();
        match infer(&op, &tys) {
            Ok(Some(ty)) => Ok((self.g.add(op, ty.clone(), operands, span), ty)),
            Ok(None) => Err(Diagnostic::new("internal error: untyped op in lowering", span, "here")
                .with_hint("this is a bug in foxc")),
            Err(m) => Err(Diagnostic::new(format!("type error: {m}"), span, "in this expression")
                .with_hint("check the indices and dtypes of the operands")),
        }
    }

    fn params(&mut self, prog: &Program) -> LResult<()> {
        for p in &prog.params {
            reserved_name(&p.name)?;
            if let Some(prev) = self.names.get(&p.name.name) {
                let what = Self::kind_word(prev.kind);
                return Err(Diagnostic::new(
                    format!("duplicate parameter `{}`", p.name.name),
                    p.name.span,
                    "declared again here",
                )
                .with_hint(format!(
                    "`{}` is already a {what} (at {}); rename one of them",
                    p.name.name,
                    self.at(prev.span)
                )));
            }
            let mut dims = Vec::new();
            for d in &p.ty.dims {
                dims.push(self.dim(d, Some(&p.name.name))?);
            }
            // An i64 parameter is stored as i64 and read as i32 (`Param::stored`).
            let dtype = if p.ty.dtype == DType::I64 { DType::I32 } else { p.ty.dtype };
            let ty = ValueType::tensor(dtype, dims.clone());
            let node = match p.range {
                Some(r) => self.g.add_param_in(&p.name.name, ty, r, p.span),
                None => self.g.add_param(&p.name.name, ty, p.span),
            };
            if dtype != p.ty.dtype {
                self.g.params.last_mut().expect("just added").storage = Some(p.ty.dtype);
            }
            if let Some(along) = &p.nonincreasing {
                let axis = Self::monotone_axis(p, along, &dims)?;
                self.g.params.last_mut().expect("just added").nonincreasing = Some(axis);
            }
            self.names.insert(
                p.name.name.clone(),
                Entry { kind: Kind::Param, node: Some(node), dtype, dims, span: p.name.span },
            );
            self.order.push(p.name.name.clone());
        }
        Ok(())
    }

    /// The axis of `nonincreasing along DIM` on parameter `p` of lowered dims `dims`: the one
    /// axis of that dim, on a float parameter.
    fn monotone_axis(p: &ast::ParamDecl, along: &ast::Ident, dims: &[Dim]) -> LResult<usize> {
        const HINT: &str =
            "name a dim that appears once in the parameter's type: `c: f32[B, H, T] nonincreasing along T`";
        if !p.ty.dtype.is_float() {
            return Err(Diagnostic::new(
                format!(
                    "`{}` is {}: only a float parameter can be declared nonincreasing",
                    p.name.name, p.ty.dtype
                ),
                along.span,
                "declared here",
            )
            .with_hint("a nonincreasing parameter is a float tensor (a decay cumsum): declare it f32"));
        }
        let axes: Vec<usize> =
            (0..dims.len()).filter(|&k| matches!(&dims[k], Dim::Sym(s) if *s == along.name)).collect();
        match axes[..] {
            [axis] => Ok(axis),
            [] => Err(Diagnostic::new(
                format!("`{}` is not a dim of `{}`'s type {}", along.name, p.name.name, p.ty),
                along.span,
                "not an axis of this parameter",
            )
            .with_hint(HINT)),
            _ => Err(Diagnostic::new(
                format!("`{}` names {} axes of `{}`'s type {}", along.name, axes.len(), p.name.name, p.ty),
                along.span,
                "ambiguous axis",
            )
            .with_hint(HINT)),
        }
    }

    /// A dimension of a declared type; `param` is the parameter it belongs to (none: the result).
    fn dim(&mut self, d: &ast::DimExpr, param: Option<&str>) -> LResult<Dim> {
        match d {
            ast::DimExpr::Const(c, _) => Ok(Dim::Const(*c)),
            ast::DimExpr::Sym(id) => {
                match self.names.get(&id.name) {
                    Some(e) if e.kind == Kind::Dim => return Ok(Dim::Sym(id.name.clone())),
                    Some(e) => {
                        return Err(Diagnostic::new(
                            format!("`{}` is a {}, not a dimension", id.name, Self::kind_word(e.kind)),
                            id.span,
                            "used as a dimension",
                        )
                        .with_hint("dimension names must differ from parameter names (e.g. `T` for a dimension, `t` for a parameter)"))
                    }
                    None => {}
                }
                if param.is_none() {
                    let dims: Vec<&str> = self.g.dims.iter().map(|s| s.as_str()).collect();
                    let hint = match suggest(&id.name, dims.iter().copied()) {
                        Some(s) => format!("did you mean `{s}`? the result's dimensions must appear among the parameters' ({})", dims.join(", ")),
                        None => format!("the result's dimensions must appear among the parameters' ({})", dims.join(", ")),
                    };
                    return Err(Diagnostic::new(
                        format!("unknown dimension `{}` in the result type", id.name),
                        id.span,
                        "no parameter has this dimension",
                    )
                    .with_hint(hint));
                }
                self.g.dims.push(id.name.clone());
                self.names.insert(
                    id.name.clone(),
                    Entry { kind: Kind::Dim, node: None, dtype: DType::F32, dims: vec![], span: id.span },
                );
                self.order.push(id.name.clone());
                Ok(Dim::Sym(id.name.clone()))
            }
        }
    }

    /// Lower statement `s`; `later` are the statements after it (where an index of its left
    /// side that no access of its own sizes may get its size: [`Lowerer::size_from_uses`]).
    fn stmt(&mut self, s: &ast::Stmt, later: &[ast::Stmt]) -> LResult<()> {
        reserved_name(&s.name)?;
        if let Some(prev) = self.names.get(&s.name.name) {
            let what = Self::kind_word(prev.kind);
            return Err(Diagnostic::new(
                format!("redefinition of `{}`", s.name.name),
                s.name.span,
                "defined again here",
            )
            .with_hint(format!(
                "`{}` is already a {what} (at {}); every name is defined once, so pick a new name",
                s.name.name,
                self.at(prev.span)
            )));
        }
        for (n, ix) in s.indices.iter().enumerate() {
            if let Some(first) = s.indices[..n].iter().find(|p| p.name == ix.name) {
                return Err(Diagnostic::new(
                    format!("index `{}` appears twice on the left-hand side", ix.name),
                    ix.span,
                    "repeated index",
                )
                .with_hint(format!(
                    "first written at {}; each axis of the result needs its own index",
                    self.at(first.span)
                )));
            }
            self.check_index_name(ix)?;
        }
        let mut cx = StmtCtx { name: &s.name.name, lhs: &s.indices, sizes: HashMap::new() };
        self.collect_sizes(&s.value, &mut cx)?;
        for (p, ix) in s.indices.iter().enumerate() {
            if !cx.sizes.contains_key(&ix.name) && names_value(&s.value, &ix.name) {
                if let Some(d) = self.size_from_uses(&s.name.name, p, later) {
                    cx.sizes.insert(ix.name.clone(), (d, ix.span));
                }
            }
        }
        let (v, ty) = self.expr(&s.value, &cx)?;
        // LHS indices must be exactly the free indices of the value.
        for ix in &s.indices {
            if ty.axis(&ix.name).is_none() {
                let hint = if cx.sizes.contains_key(&ix.name) {
                    format!("`{}` is reduced away on the right-hand side; remove it from the left, or do not reduce over it", ix.name)
                } else {
                    format!("every index on the left must be an index of the right-hand side; use `{}` to index a tensor there, or remove it", ix.name)
                };
                return Err(Diagnostic::new(
                    format!("unbound index `{}` on the left-hand side", ix.name),
                    ix.span,
                    "does not occur in the value",
                )
                .with_hint(hint));
            }
        }
        for a in &ty.axes {
            if !s.indices.iter().any(|ix| ix.name == a.name) {
                let mut lhs: Vec<&str> = s.indices.iter().map(|i| i.name.as_str()).collect();
                lhs.push(&a.name);
                return Err(Diagnostic::new(
                    format!("index `{}` is free on the right-hand side but missing from the left", a.name),
                    s.value.span,
                    format!("this value has index `{}`", a.name),
                )
                .with_hint(format!(
                    "add it to the left (`{}[{}]`) or reduce over it (`sum({}, ...)`)",
                    s.name.name,
                    lhs.join(", "),
                    a.name
                )));
            }
        }
        if self.g.ty(v).dtype == DType::I32 {
            return Err(Diagnostic::new(
                format!("statement `{}` holds integers", s.name.name),
                s.value.span,
                "an i32 value",
            )
            .with_hint("statements hold floating-point values: compare the integers (`j >= start[b]`) or convert them with `float(x)`"));
        }
        let axes: Vec<String> = s.indices.iter().map(|i| i.name.clone()).collect();
        let (node, sty) = self.add(Op::Store { axes }, &[v], s.span)?;
        self.g.node_mut(node).name = Some(s.name.name.clone());
        self.names.insert(
            s.name.name.clone(),
            Entry {
                kind: Kind::Stmt,
                node: Some(node),
                dtype: sty.dtype,
                dims: sty.dims().cloned().collect(),
                span: s.name.span,
            },
        );
        self.order.push(s.name.name.clone());
        Ok(())
    }

    /// An index variable must not shadow a declared name.
    fn check_index_name(&self, ix: &Ident) -> LResult<()> {
        if let Some(e) = self.names.get(&ix.name) {
            return Err(Diagnostic::new(
                format!("`{}` is a {}, not an index variable", ix.name, Self::kind_word(e.kind)),
                ix.span,
                "used as an index",
            )
            .with_hint(format!(
                "index variables must differ from declared names (declared at {}); use a lowercase letter such as `t`",
                self.at(e.span)
            )));
        }
        Ok(())
    }

    fn resolve_tensor(&self, name: &Ident, cx: &StmtCtx) -> LResult<Entry> {
        match self.names.get(&name.name) {
            Some(e) if e.kind == Kind::Dim => Err(Diagnostic::new(
                format!("`{}` is a dimension and cannot be indexed", name.name),
                name.span,
                "a dimension",
            )
            .with_hint(format!("use `{}` without brackets for its size as a number", name.name))),
            Some(e) => Ok(e.clone()),
            None if name.name == cx.name => Err(Diagnostic::new(
                format!("`{}` is used in its own definition", name.name),
                name.span,
                "not defined yet",
            )
            .with_hint("a statement can only use parameters and earlier statements")),
            None => Err(self.unknown_name(name)),
        }
    }

    fn unknown_name(&self, name: &Ident) -> Diagnostic {
        if self.poisoned.contains(&name.name) {
            return Diagnostic::new(POISONED, name.span, "");
        }
        let hint = match suggest(&name.name, self.order.iter().map(|s| s.as_str())) {
            Some(s) => format!("did you mean `{s}`? {}", self.declared_hint()),
            None => self.declared_hint(),
        };
        Diagnostic::new(format!("unknown name `{}`", name.name), name.span, "not declared").with_hint(hint)
    }

    /// The size of axis `p` of the tensor `name` that a later statement reads it with: an access
    /// `name[.., x, ..]` with a plain index `x` there that an access to a parameter or an
    /// earlier statement of that statement sizes (`sl[h] = exp2(-8 * (h + 1) / H)` read as
    /// `sl[h]` beside `q[b, h, i, d]`: `H`). The first such use decides; one that disagrees
    /// is then an error of its own statement, as any access of the wrong size.
    fn size_from_uses(&self, name: &str, p: usize, later: &[ast::Stmt]) -> Option<Dim> {
        for s in later {
            let mut reads = vec![];
            accesses(&s.value, &mut reads);
            let mut sizes: HashMap<&str, &Dim> = HashMap::new();
            for (t, subs) in &reads {
                let Some(ent) = self.names.get(&t.name).filter(|e| e.kind != Kind::Dim) else { continue };
                for (sub, d) in subs.iter().zip(&ent.dims) {
                    if let ExprKind::Name(ix) = &sub.kind {
                        sizes.entry(ix.name.as_str()).or_insert(d);
                    }
                }
            }
            let found =
                reads.iter().filter(|(t, _)| t.name == name).find_map(|(_, subs)| match &subs.get(p)?.kind {
                    ExprKind::Name(ix) => sizes.get(ix.name.as_str()).map(|d| (*d).clone()),
                    _ => None,
                });
            if found.is_some() {
                return found;
            }
        }
        None
    }

    /// First pass over a statement: every access fixes the sizes of its index variables.
    fn collect_sizes(&self, e: &Expr, cx: &mut StmtCtx) -> LResult<()> {
        match &e.kind {
            ExprKind::Access { name, indices } => {
                let ent = self.resolve_tensor(name, cx)?;
                if ent.dims.is_empty() {
                    return Err(Diagnostic::new(
                        format!("scalar `{}` cannot be indexed", name.name),
                        e.span,
                        "indexed here",
                    )
                    .with_hint(format!("`{}` has no axes; write just `{}`", name.name, name.name)));
                }
                if ent.dims.len() != indices.len() {
                    let example: Vec<&str> = ["b", "h", "i", "d", "e", "f", "g", "k"]
                        .iter()
                        .copied()
                        .take(ent.dims.len())
                        .collect();
                    return Err(Diagnostic::new(
                        format!(
                            "`{}` has rank {} but is accessed with {} ind{}",
                            name.name,
                            ent.dims.len(),
                            indices.len(),
                            if indices.len() == 1 { "ex" } else { "ices" }
                        ),
                        e.span,
                        format!("expected {} indices", ent.dims.len()),
                    )
                    .with_hint(format!(
                        "`{}` is {}{}; write one index per axis, e.g. `{}[{}]`",
                        name.name,
                        ent.dtype,
                        fmt_dims(&ent.dims),
                        name.name,
                        example.join(", ")
                    )));
                }
                for (n, sub) in indices.iter().enumerate() {
                    let ExprKind::Name(ix) = &sub.kind else {
                        // An index expression (a constant too): its variables are sized by plain
                        // uses; checked here for what it is.
                        self.index_expr(sub)?;
                        continue;
                    };
                    self.check_index_name(ix)?;
                    if indices[..n].iter().any(|p| matches!(&p.kind, ExprKind::Name(p) if p.name == ix.name))
                    {
                        return Err(Diagnostic::new(
                            format!("index `{}` appears twice in one access", ix.name),
                            ix.span,
                            "repeated index",
                        )
                        .with_hint("diagonal access is not supported; use distinct indices"));
                    }
                    let d = &ent.dims[n];
                    match cx.sizes.get(&ix.name) {
                        Some((d0, s0)) if d0 != d => {
                            return Err(Diagnostic::new(
                                format!("index `{}` has size {} here but size {} at its first use", ix.name, d, d0),
                                ix.span,
                                format!("axis {n} of `{}` has size {d}", name.name),
                            )
                            .with_hint(format!(
                                "`{}` was first used at {} with size {d0}; an index has one size per statement, so use another index name",
                                ix.name,
                                self.at(*s0)
                            )))
                        }
                        Some(_) => {}
                        None => {
                            cx.sizes.insert(ix.name.clone(), (d.clone(), ix.span));
                        }
                    }
                }
                Ok(())
            }
            ExprKind::Unary(_, a) => self.collect_sizes(a, cx),
            ExprKind::Binary(_, a, b) => {
                self.collect_sizes(a, cx)?;
                self.collect_sizes(b, cx)
            }
            ExprKind::Call { args, .. } => {
                for a in args {
                    self.collect_sizes(a, cx)?;
                }
                Ok(())
            }
            ExprKind::Num { .. } | ExprKind::Name(_) => Ok(()),
        }
    }

    fn expr(&mut self, e: &Expr, cx: &StmtCtx) -> LResult<(ValueId, ValueType)> {
        match &e.kind {
            ExprKind::Num { value, .. } => self.add(Op::Const(*value), &[], e.span),
            ExprKind::Name(id) => self.name_value(id, cx),
            ExprKind::Access { name, indices } => {
                let ent = self.resolve_tensor(name, cx)?;
                let node = ent.node.ok_or_else(|| self.unknown_name(name))?;
                let plain: Option<Vec<String>> = indices
                    .iter()
                    .map(|i| match &i.kind {
                        ExprKind::Name(id) => Some(id.name.clone()),
                        _ => None,
                    })
                    .collect();
                match plain {
                    Some(axes) => self.add(Op::Bind { axes }, &[node], e.span),
                    None => self.gather(e, name, &ent, node, indices, cx),
                }
            }
            ExprKind::Unary(UnOp::Neg, a) if matches!(&a.kind, ExprKind::Num { value, .. } if value.is_infinite()) =>
            {
                // `-inf`: one constant, as masks are recognized.
                self.add(Op::Const(f64::NEG_INFINITY), &[], e.span)
            }
            ExprKind::Unary(UnOp::Neg, a) => {
                let (v, t) = self.expr(a, cx)?;
                self.need_float(&t, a.span, "`-`")?;
                self.add(Op::Unary(UnaryOp::Neg), &[v], e.span)
            }
            ExprKind::Binary(op @ (BinOp::And | BinOp::Or), ..) => Err(Diagnostic::new(
                format!("`{}` outside the condition of a `select`", op.symbol()),
                e.span,
                "conditions combined here",
            )
            .with_hint("`and` and `or` combine the conditions of a select: `select(j >= start[b] and j <= i, s[b, h, i, j], -inf)`")),
            ExprKind::Binary(op, a, b) => {
                let outer = self.comparing;
                self.comparing |= op.is_comparison();
                let operands = self.expr(a, cx).and_then(|x| Ok((x, self.expr(b, cx)?)));
                self.comparing = outer;
                let ((va, ta), (vb, tb)) = operands?;
                let what = format!("`{}`", op.symbol());
                if op.is_comparison() {
                    // Integers compare with numbers as their values; they never enter float math.
                    self.need_number(&ta, a.span, &what)?;
                    self.need_number(&tb, b.span, &what)?;
                } else if let Some(sum) = self.integer_sum(*op, (va, &ta), (vb, &tb), e.span) {
                    return Ok(sum);
                } else {
                    // A sum of integers is one too: other arithmetic needs `float` of it.
                    for (v, t, span) in [(va, &ta, a.span), (vb, &tb, b.span)] {
                        if self.integer_sums.contains(&v) {
                            return Err(Self::integer_in_float_math(span, &what));
                        }
                        self.need_float(t, span, &what)?;
                    }
                }
                if *op == BinOp::Div && matches!(self.g.op(vb), Op::Const(c) if *c == 0.0) {
                    return Err(Diagnostic::new("division by zero", b.span, "this divisor is 0").with_hint(
                        "every entry would be inf or NaN; divide by a non-zero constant or an expression",
                    ));
                }
                let bop = match op {
                    BinOp::Add => BinaryOp::Add,
                    BinOp::Sub => BinaryOp::Sub,
                    BinOp::Mul => BinaryOp::Mul,
                    BinOp::Div => BinaryOp::Div,
                    BinOp::Lt => BinaryOp::Lt,
                    BinOp::Le => BinaryOp::Le,
                    BinOp::Gt => BinaryOp::Gt,
                    BinOp::Ge => BinaryOp::Ge,
                    BinOp::Eq => BinaryOp::Eq,
                    BinOp::Ne => BinaryOp::Ne,
                    BinOp::And | BinOp::Or => unreachable!("matched above"),
                };
                self.add(Op::Binary(bop), &[va, vb], e.span)
            }
            ExprKind::Call { func, args } => self.call(e, func, args, cx),
        }
    }

    /// The comparisons of a select's condition, lowered left to right, and how `and` / `or`
    /// join them.
    fn condition(&mut self, cond: &Expr, cx: &StmtCtx) -> LResult<Condition> {
        match &cond.kind {
            ExprKind::Binary(op @ (BinOp::And | BinOp::Or), c, d) => {
                let (c, d) = (Box::new(self.condition(c, cx)?), Box::new(self.condition(d, cx)?));
                Ok(if *op == BinOp::And { Condition::And(c, d) } else { Condition::Or(c, d) })
            }
            _ => {
                let (vc, tc) = self.expr(cond, cx)?;
                if tc.dtype != DType::Bool {
                    return Err(Diagnostic::new(
                        "the condition of `select` must be a comparison",
                        cond.span,
                        format!("this is {}, not bool", tc.dtype),
                    )
                    .with_hint(
                        "write a comparison such as `x[i] > 0` as the first argument, or comparisons joined by `and` / `or`",
                    ));
                }
                Ok(Condition::Compare(vc))
            }
        }
    }

    /// Run `f` with the bounds that `cond` gives its index variables where it is `holds`
    /// pushed as guards ([`Guard`]).
    fn guarded<R>(&mut self, cond: &Expr, holds: bool, f: impl FnOnce(&mut Self) -> R) -> R {
        let facts = self.facts(cond, holds);
        let n = facts.len();
        self.guards.extend(facts);
        let r = f(self);
        self.guards.truncate(self.guards.len() - n);
        r
    }

    /// The bounds on index variables that hold where `cond` is `holds`: from comparisons of an
    /// index variable with a subscript of dims and constants (`t >= 1`, `d < D / 2`), joined by
    /// `and` (where it holds) or `or` (where it fails); nothing from anything else.
    fn facts(&self, cond: &Expr, holds: bool) -> Vec<Guard> {
        use index_range::Lin;
        match &cond.kind {
            ExprKind::Binary(BinOp::And, c, d) if holds => {
                [self.facts(c, true), self.facts(d, true)].concat()
            }
            ExprKind::Binary(BinOp::Or, c, d) if !holds => {
                [self.facts(c, false), self.facts(d, false)].concat()
            }
            ExprKind::Binary(op, a, b) if op.is_comparison() => {
                let var = |e: &Expr| match &e.kind {
                    ExprKind::Name(id) if !self.names.contains_key(&id.name) => Some(id.name.clone()),
                    _ => None,
                };
                let bound = |e: &Expr| {
                    let x = self.index_expr(e).ok()?;
                    (x.terms.is_empty() && x.div.is_none()).then(|| Lin::of_dims(&x.dim_terms, x.constant))
                };
                // `v op x`, or `x op v` turned around; then negated where it fails.
                let (v, op, x) = match (var(a), bound(b), var(b), bound(a)) {
                    (Some(v), Some(x), _, _) => (v, *op, x),
                    (_, _, Some(v), Some(x)) => (v, op.flipped(), x),
                    _ => return vec![],
                };
                let op = if holds { Some(op) } else { op.negated() };
                let one = Lin::konst(1);
                let (lo, hi) = match op {
                    Some(BinOp::Ge) => (Some(x), None),
                    Some(BinOp::Gt) => (Some(x.minus(&one.scaled(-1))), None), // x + 1
                    Some(BinOp::Le) => (None, Some(x)),
                    Some(BinOp::Lt) => (None, Some(x.minus(&one))),
                    Some(BinOp::Eq) => (Some(x.clone()), Some(x)),
                    _ => return vec![],
                };
                vec![Guard { var: v, lo, hi }]
            }
            _ => vec![],
        }
    }

    /// `select(cond, a, b)`: `and` / `or` become nested selects over the same two values,
    /// `select(c and d, a, b) = select(c, select(d, a, b), b)` and `select(c or d, a, b) =
    /// select(c, a, select(d, a, b))`, so that every select has one comparison: the masks
    /// recognition knows (`j <= i`, `j >= start[b]`) stay visible in it.
    fn select(
        &mut self,
        cond: &Condition,
        (a, b): (ValueId, ValueId),
        span: Span,
    ) -> LResult<(ValueId, ValueType)> {
        match cond {
            Condition::Compare(c) => self.add(Op::Select, &[*c, a, b], span),
            Condition::And(c, d) => {
                let (inner, _) = self.select(d, (a, b), span)?;
                self.select(c, (inner, b), span)
            }
            Condition::Or(c, d) => {
                let (inner, _) = self.select(d, (a, b), span)?;
                self.select(c, (a, inner), span)
            }
        }
    }

    /// An access with index-expression subscripts: a `gather`, after the range rule.
    fn gather(
        &mut self,
        e: &Expr,
        name: &Ident,
        ent: &Entry,
        node: ValueId,
        subs: &[Expr],
        cx: &StmtCtx,
    ) -> LResult<(ValueId, ValueType)> {
        let mut index = Vec::new();
        let mut axes: Vec<Axis> = Vec::new();
        for sub in subs {
            let ie = self.index_expr(sub)?;
            for v in ie.vars() {
                if axes.iter().any(|a| a.name == v) {
                    continue;
                }
                match cx.sizes.get(v) {
                    Some((d, _)) => axes.push(Axis::new(v, d.clone())),
                    None => {
                        return Err(Diagnostic::new(
                            format!("cannot infer the size of index `{v}`"),
                            sub.span,
                            format!("`{v}` is used only in index expressions"),
                        )
                        .with_hint(format!(
                            "an index gets its size from a plain subscript; use `{v}` alone to index a tensor in this statement (e.g. `q[b, h, {v}, d]`)"
                        )))
                    }
                }
            }
            index.push(ie);
        }
        let size_of = |v: &str| cx.sizes.get(v).map(|(d, _)| d.clone()).unwrap_or(Dim::Const(1));
        let mut needs = Vec::new();
        for (p, (ie, sub)) in index.iter().zip(subs).enumerate() {
            if ie.is_plain_var().is_some() {
                continue; // sized by this very axis
            }
            let size = &ent.dims[p];
            let Err(out) = index_range::check(ie, size, &size_of, None) else { continue };
            if self.in_range_where_guarded(ie, size, &size_of) {
                continue;
            }
            let vars = ie.vars();
            // A pair (i, j) whose mask `j <= i + size(j) - size(i)` keeps it in range: of equal
            // sizes (the causal mask) first, then queries at the end of longer keys.
            let pairs =
                || vars.iter().flat_map(|a| vars.iter().map(move |b| (*a, *b))).filter(|(a, b)| a != b);
            let in_range_under =
                |(a, b): &(&str, &str)| index_range::check(ie, size, &size_of, Some((a, b))).is_ok();
            let pair = pairs()
                .filter(|(a, b)| size_of(a) == size_of(b))
                .find(in_range_under)
                .or_else(|| pairs().filter(|(a, b)| size_of(a) != size_of(b)).find(in_range_under));
            let outside = describe_outside(ie, size, &out);
            // In range for some sizes of the dims: checked when they are bound. (A division
            // whose bound is not a sum of dims stays an error: `h / G` into an axis of G is
            // in range only by accident of the sizes, and means `h / (H / G)`.)
            let bound = (!out.certain && !out.unprovable).then(|| SubscriptBound {
                tensor: name.name.clone(),
                axis: p,
                size: size.clone(),
                index: ie.clone(),
                vars: vars.iter().map(|v| (v.to_string(), size_of(v))).collect(),
                span: sub.span,
            });
            match (pair, bound) {
                (Some((i, j)), bound) => {
                    // A prefill's mask may be missing where the sizes keep the subscript in
                    // range anyway (a decode step): then the sizes are checked when bound.
                    let shift = (size_of(i) != size_of(j))
                        .then(|| index_range::Lin::dim(&size_of(j)).minus(&index_range::Lin::dim(&size_of(i))).to_string());
                    let fallback = bound.filter(|_| shift.is_some());
                    needs.push((i.to_string(), j.to_string(), ie.to_string(), sub.span, outside, (fallback, shift)))
                }
                (None, Some(bound)) => self.g.bind_checks.push(bound),
                (None, None) => {
                    return Err(Diagnostic::new(
                        format!("subscript `{ie}` of `{}` can be out of range", name.name),
                        sub.span,
                        outside,
                    )
                    .with_hint(format!(
                        "axis {p} of `{}` has size {size}; a subscript must stay in [0, {size}) for every value of its indices \
                         (or be in range where j <= i and masked by causal(i, j, ...))",
                        name.name
                    )))
                }
            }
        }
        let axis_names: Vec<String> = axes.iter().map(|a| a.name.clone()).collect();
        let ty = ValueType { dtype: ent.dtype, axes };
        let v = self.g.add(Op::Gather { index, axes: axis_names }, ty.clone(), &[node], e.span);
        for (i, j, text, span, outside, (fallback, shift)) in needs {
            let tensor = name.name.clone();
            self.masked.push(NeedsMask { node: v, i, j, text, tensor, span, outside, fallback, shift });
        }
        Ok((v, ty))
    }

    /// Whether `ie` stays in `[0, size)` wherever the enclosing select branches are taken: each
    /// variable between its axis and the guards' bounds (any one bound per side may be the
    /// one that proves it).
    fn in_range_where_guarded(&self, ie: &IndexExpr, size: &Dim, size_of: &dyn Fn(&str) -> Dim) -> bool {
        use index_range::Lin;
        let vars: Vec<&str> = ie.vars();
        let guarded: Vec<&str> =
            vars.iter().copied().filter(|v| self.guards.iter().any(|g| g.var == *v)).collect();
        if guarded.is_empty() {
            return false;
        }
        // Candidate bounds per guarded variable: the axis' own, then every guard's.
        let choices = |v: &str| {
            let top = Lin::dim(&size_of(v)).minus(&Lin::konst(1));
            let mut los = vec![Lin::konst(0)];
            let mut his = vec![top];
            for g in self.guards.iter().filter(|g| g.var == v) {
                los.extend(g.lo.clone());
                his.extend(g.hi.clone());
            }
            let mut out = vec![];
            for lo in &los {
                for hi in &his {
                    out.push((lo.clone(), hi.clone()));
                }
            }
            out
        };
        let mut picks: Vec<Vec<(String, (Lin, Lin))>> = vec![vec![]];
        for v in &guarded {
            picks = picks
                .into_iter()
                .flat_map(|p| {
                    choices(v).into_iter().map(move |c| {
                        let mut p = p.clone();
                        p.push((v.to_string(), c));
                        p
                    })
                })
                .collect();
            if picks.len() > 256 {
                return false; // too many guards to try: say not proven
            }
        }
        picks.iter().any(|p| {
            let bounds = |v: &str| match p.iter().find(|(w, _)| w == v) {
                Some((_, b)) => b.clone(),
                None => (Lin::konst(0), Lin::dim(&size_of(v)).minus(&Lin::konst(1))),
            };
            index_range::check_within(ie, size, &bounds, size_of, None).is_ok()
        })
    }

    /// The diagnostic of a masked-only subscript whose value escapes the mask.
    fn unmasked(&self, m: &NeedsMask, reason: &str, at: Span) -> Diagnostic {
        Diagnostic::new(
            format!("subscript `{}` of `{}` can be out of range", m.text, m.tensor),
            m.span,
            format!("in range only where {} <= {}; {}", m.j, m.diagonal(), m.outside),
        )
        .with_hint(format!(
            "mask the value with {} before anything else reads it; here {reason} (at {})",
            m.masks(),
            self.at(at),
        ))
    }

    /// A subscript as an [`IndexExpr`], with a diagnostic for anything that is not one.
    fn index_expr(&self, e: &Expr) -> LResult<IndexExpr> {
        let not_index = |what: &str| {
            Diagnostic::new(format!("{what} in a subscript"), e.span, "not an index expression").with_hint(
                "a subscript is an index variable, or an index expression: integer constants, index \
                 variables and dims combined with + - *, optionally divided by a dimension \
                 (`i - j`, `t + 1`, `i + M - N`, `h / (H / G)`)",
            )
        };
        let whole = |x: &IndexExpr, span: Span| -> LResult<()> {
            if !x.clamps.is_empty() {
                return Err(Diagnostic::new("`min` / `max` inside a subscript", span, "clamped here").with_hint(
                    "a clamp must be the outermost operation of a subscript: write `min(i - j + 1, 128)`, not `min(i - j, 127) + 1`",
                ));
            }
            match &x.div {
                Some(_) => Err(Diagnostic::new(
                    "floor division inside a subscript",
                    span,
                    "divided here",
                )
                .with_hint("the division must be the outermost operation of a subscript: write `(i + j) / 2`, not `i + j / 2`")),
                None => Ok(()),
            }
        };
        Ok(match &e.kind {
            ExprKind::Num { value, int: true, .. } if *value < 9.0e15 => IndexExpr::constant(*value as i64),
            ExprKind::Num { text, int: true, .. } => {
                return Err(Diagnostic::new(
                    format!("integer constant `{text}` in a subscript is too large"),
                    e.span,
                    "at least 9e15",
                )
                .with_hint("subscript constants must be below 9e15 (exact in f64); no tensor is that long"))
            }
            ExprKind::Num { text, .. } => {
                return Err(Diagnostic::new(
                    format!("non-integer constant `{text}` in a subscript"),
                    e.span,
                    "not an integer",
                )
                .with_hint("subscripts use integer constants, e.g. `t + 1`"))
            }
            ExprKind::Name(id) => {
                if let Some(ent) = self.names.get(&id.name) {
                    if ent.kind == Kind::Dim {
                        // A dim is a number in a subscript: `i + M - N`, `d + D / 2`.
                        return Ok(IndexExpr {
                            dim_terms: vec![(Dim::Sym(id.name.clone()), 1)],
                            ..IndexExpr::constant(0)
                        });
                    }
                    self.check_index_name(id)?;
                }
                IndexExpr::var(&id.name)
            }
            ExprKind::Unary(UnOp::Neg, a) => {
                let x = self.index_expr(a)?;
                whole(&x, a.span)?;
                scale(x, -1)
            }
            ExprKind::Binary(op @ (BinOp::Add | BinOp::Sub), a, b) => {
                let (x, y) = (self.index_expr(a)?, self.index_expr(b)?);
                whole(&x, a.span)?;
                whole(&y, b.span)?;
                let y = if *op == BinOp::Sub { scale(y, -1) } else { y };
                let mut terms = x.terms;
                terms.extend(y.terms);
                let mut dim_terms = x.dim_terms;
                dim_terms.extend(y.dim_terms);
                normalize(IndexExpr {
                    terms,
                    dim_terms,
                    constant: x.constant + y.constant,
                    div: None,
                    clamps: vec![],
                })
            }
            ExprKind::Binary(BinOp::Mul, a, b) => {
                for side in [a, b] {
                    if let ExprKind::Num { text, int: false, .. } = &side.kind {
                        return Err(Diagnostic::new(
                            format!("non-integer coefficient `{text}` in a subscript"),
                            side.span,
                            "not an integer",
                        )
                        .with_hint("coefficients of index variables are integers; to scale down, divide the whole subscript: `t / 2`"));
                    }
                }
                let (x, y) = (self.index_expr(a)?, self.index_expr(b)?);
                whole(&x, a.span)?;
                whole(&y, b.span)?;
                match (x.is_constant(), y.is_constant()) {
                    (true, _) => scale(y, x.constant),
                    (_, true) => scale(x, y.constant),
                    _ => return Err(Diagnostic::new(
                        "product of index variables or dims in a subscript",
                        e.span,
                        "not affine",
                    )
                    .with_hint(
                        "a subscript is affine: integer constants times index variables and dims, e.g. `2 * t + 1` or `i + M - N`",
                    )),
                }
            }
            ExprKind::Binary(BinOp::Div, a, b) => {
                let x = self.index_expr(a)?;
                whole(&x, a.span)?;
                let d = self.divisor(b)?;
                // (`whole` refused a clamp inside; `min(x, c) / 2` would need one here.)
                match (x.terms.is_empty(), x.constant, x.dim_terms.as_slice()) {
                    // A dim divided, `D / 2`: an exact quotient, itself a dim term (checked to
                    // divide when the dims are bound), so that `d + D / 2` stays affine.
                    (true, 0, [(n, 1)]) => IndexExpr {
                        dim_terms: vec![(Dim::quotient(n.clone(), d), 1)],
                        ..IndexExpr::constant(0)
                    },
                    _ => IndexExpr { div: Some(d), ..x },
                }
            }
            ExprKind::Binary(op @ (BinOp::And | BinOp::Or), ..) => {
                return Err(not_index(&format!("condition `{}`", op.symbol())))
            }
            ExprKind::Binary(op, ..) => return Err(not_index(&format!("comparison `{}`", op.symbol()))),
            ExprKind::Access { name, .. } => {
                return Err(not_index(&format!("access `{}[...]`", name.name))
                    .with_hint("subscripts are computed from index variables, not read from tensors"))
            }
            ExprKind::Call { func, args }
                if (func.name == "min" || func.name == "max") && args.len() == 2 =>
            {
                // `min(x, bound)` / `max(x, bound)` (either order): the bound is dims and
                // constants, the other argument any subscript; the clamp applies last.
                let (a, b) = (self.index_expr(&args[0])?, self.index_expr(&args[1])?);
                let is_bound = |x: &IndexExpr| x.terms.is_empty() && x.div.is_none() && x.clamps.is_empty();
                let (mut x, bound) = match (is_bound(&a), is_bound(&b)) {
                    (_, true) => (a, b),
                    (true, false) => (b, a),
                    (false, false) => {
                        return Err(Diagnostic::new(
                            format!("`{}` of two index expressions in a subscript", func.name),
                            e.span,
                            "neither argument is a bound",
                        )
                        .with_hint("clamp a subscript with a number or a sum of dims: `min(i - j, 128)`, `max(t - 1, 0)`, `min(i, M - 1)`"))
                    }
                };
                let kind = if func.name == "min" { ClampKind::Min } else { ClampKind::Max };
                x.clamps.push(Clamp { kind, dim_terms: bound.dim_terms, constant: bound.constant });
                x
            }
            ExprKind::Call { func, .. } => return Err(not_index(&format!("call of `{}`", func.name))),
        })
    }

    /// The divisor of a subscript: a dimension, a positive integer, or an exact quotient of those.
    fn divisor(&self, e: &Expr) -> LResult<Dim> {
        let hint =
            "divide a subscript by a dimension (`G`), a positive integer, or a quotient of those (`H / G`)";
        match &e.kind {
            ExprKind::Name(id) => match self.names.get(&id.name) {
                Some(ent) if ent.kind == Kind::Dim => Ok(Dim::Sym(id.name.clone())),
                Some(ent) => Err(Diagnostic::new(
                    format!("division of a subscript by the {} `{}`", Self::kind_word(ent.kind), id.name),
                    e.span,
                    "not a dimension",
                )
                .with_hint(hint)),
                None => Err(Diagnostic::new(
                    format!("division of a subscript by `{}`, which is not a dimension", id.name),
                    e.span,
                    "not a dimension",
                )
                .with_hint(match suggest(&id.name, self.g.dims.iter().map(|s| s.as_str())) {
                    Some(s) => format!("did you mean the dimension `{s}`? {hint}"),
                    None => hint.to_string(),
                })),
            },
            ExprKind::Num { value, int: true, .. } if *value >= 1.0 && *value < 9.0e15 => {
                Ok(Dim::Const(*value as u64))
            }
            ExprKind::Num { text, .. } => Err(Diagnostic::new(
                format!("division of a subscript by `{text}`"),
                e.span,
                "not a positive integer",
            )
            .with_hint(hint)),
            ExprKind::Binary(BinOp::Div, a, b) => Ok(Dim::quotient(self.divisor(a)?, self.divisor(b)?)),
            _ => Err(Diagnostic::new(
                "division of a subscript by a non-dimension",
                e.span,
                "not a dimension expression",
            )
            .with_hint(hint)),
        }
    }

    fn need_float(&self, t: &ValueType, span: Span, what: &str) -> LResult<()> {
        if t.dtype == DType::I32 {
            return Err(Self::integer_in_float_math(span, what));
        }
        self.need_number(t, span, what)
    }

    /// The error of an integer (or a sum of integers) in float arithmetic.
    fn integer_in_float_math(span: Span, what: &str) -> Diagnostic {
        Diagnostic::new(
            format!("{what} needs a floating-point number, found an integer (i32)"),
            span,
            "this is an i32",
        )
        .with_hint(
            "integers compare (`j >= start[b]`) and, inside a comparison, add and subtract with integers, \
             indices, dims and integer constants (`j < start[b] + 4`); for other arithmetic convert them \
             explicitly: `float(start[b])`",
        )
    }

    /// `a + b` or `a - b` inside a comparison where one side is an integer (or such a sum) and
    /// each is an integer, an index, a dim, an integer constant or such a sum: the sum of their
    /// values (the integers cast to f32, as `float` does, exact below 2^24). `None` elsewhere: integers do
    /// not enter other arithmetic without `float`.
    fn integer_sum(
        &mut self,
        op: BinOp,
        (va, ta): (ValueId, &ValueType),
        (vb, tb): (ValueId, &ValueType),
        span: Span,
    ) -> Option<(ValueId, ValueType)> {
        let integer = |v: ValueId, t: &ValueType| t.dtype == DType::I32 || self.integer_sums.contains(&v);
        let integral = |v: ValueId, t: &ValueType| {
            integer(v, t)
                || match self.g.op(v) {
                    Op::Iota { .. } | Op::DimSize(_) => true,
                    Op::Const(c) => c.fract() == 0.0,
                    _ => false,
                }
        };
        let bop = match op {
            BinOp::Add => BinaryOp::Add,
            BinOp::Sub => BinaryOp::Sub,
            _ => return None,
        };
        if !self.comparing || !(integer(va, ta) || integer(vb, tb)) || !integral(va, ta) || !integral(vb, tb)
        {
            return None;
        }
        let mut value = |v: ValueId, t: &ValueType| match t.dtype {
            DType::I32 => {
                self.g.add(Op::Cast, ValueType { dtype: DType::F32, axes: t.axes.clone() }, &[v], span)
            }
            _ => v,
        };
        let (a, b) = (value(va, ta), value(vb, tb));
        let sum = self.add(Op::Binary(bop), &[a, b], span).ok()?;
        self.integer_sums.insert(sum.0);
        Some(sum)
    }

    /// A number of any dtype (a float or an integer), not a comparison result.
    fn need_number(&self, t: &ValueType, span: Span, what: &str) -> LResult<()> {
        if t.dtype == DType::Bool {
            return Err(Diagnostic::new(
                format!("{what} needs a number, found a comparison result (bool)"),
                span,
                "this is a bool",
            )
            .with_hint("turn a condition into numbers with `select(cond, a, b)`"));
        }
        Ok(())
    }

    fn name_value(&mut self, id: &Ident, cx: &StmtCtx) -> LResult<(ValueId, ValueType)> {
        if let Some(ent) = self.names.get(&id.name).cloned() {
            return match ent.kind {
                Kind::Dim => self.add(Op::DimSize(Dim::Sym(id.name.clone())), &[], id.span),
                Kind::Param | Kind::Stmt if ent.dims.is_empty() => {
                    let node = ent.node.ok_or_else(|| self.unknown_name(id))?;
                    Ok((node, self.g.ty(node).clone()))
                }
                _ => {
                    let example: Vec<&str> = ["b", "h", "i", "d", "e", "f", "g", "k"]
                        .iter()
                        .copied()
                        .take(ent.dims.len())
                        .collect();
                    Err(Diagnostic::new(
                        format!("`{}` has rank {} but is used without indices", id.name, ent.dims.len()),
                        id.span,
                        "needs indices",
                    )
                    .with_hint(format!(
                        "`{}` is {}{}; access it with one index per axis, e.g. `{}[{}]`",
                        id.name,
                        ent.dtype,
                        fmt_dims(&ent.dims),
                        id.name,
                        example.join(", ")
                    )))
                }
            };
        }
        if id.name == cx.name {
            return Err(Diagnostic::new(
                format!("`{}` is used in its own definition", id.name),
                id.span,
                "not defined yet",
            )
            .with_hint("a statement can only use parameters and earlier statements"));
        }
        if let Some((d, _)) = cx.sizes.get(&id.name) {
            let ty = ValueType { dtype: DType::F32, axes: vec![Axis::new(&id.name, d.clone())] };
            let v = self.g.add(Op::Iota { axis: id.name.clone() }, ty.clone(), &[], id.span);
            return Ok((v, ty));
        }
        if cx.lhs.iter().any(|i| i.name == id.name) {
            return Err(Diagnostic::new(
                format!("cannot infer the size of index `{}`", id.name),
                id.span,
                "used as a value",
            )
            .with_hint(format!(
                "an index gets its size from an access: use `{0}` to index a tensor in this statement, \
                 or read `{1}` later with `{0}` beside an access that sizes it, or write the \
                 expression inline where `{0}` indexes a tensor",
                id.name, cx.name
            )));
        }
        Err(self.unknown_name(id))
    }

    /// The index argument of a reduction, scan or mask: a bare identifier, not a declared name.
    fn index_arg<'e>(&self, f: &Ident, arg: &'e Expr, what: &str) -> LResult<&'e Ident> {
        match &arg.kind {
            ExprKind::Name(id) => {
                self.check_index_name(id)?;
                Ok(id)
            }
            _ => Err(Diagnostic::new(
                format!("the {what} of `{}` must be an index variable", f.name),
                arg.span,
                "not an index variable",
            )
            .with_hint(format!("write the index name alone, e.g. `{}`", Self::call_example(&f.name)))),
        }
    }

    fn call_example(f: &str) -> String {
        match f {
            "sum" => "sum(d, q[b, h, i, d] * k[b, h, j, d])",
            "max" => "max(j, s[b, h, i, j])",
            "cumsum" => "cumsum(t, x[b, h, t])",
            "softmax" => "softmax(j, s[b, h, i, j])",
            "causal" => "causal(i, j, s[b, h, i, j])",
            "window" => "window(i, j, 256, s[b, h, i, j])",
            "rmsnorm" => "rmsnorm(q[b, h, i, d], wq[d])",
            "select" => "select(x[i] > 0, x[i], 0)",
            "min" => "min(x[i], 0)",
            "float" => "float(start[b])",
            _ => return format!("{f}(x[i])"),
        }
        .to_string()
    }

    fn arity(&self, e: &Expr, f: &Ident, args: &[Expr], n: usize) -> LResult<()> {
        if args.len() != n {
            return Err(Diagnostic::new(
                format!(
                    "`{}` takes {n} argument{}, found {}",
                    f.name,
                    if n == 1 { "" } else { "s" },
                    args.len()
                ),
                e.span,
                "wrong number of arguments",
            )
            .with_hint(format!("for example `{}`", Self::call_example(&f.name))));
        }
        Ok(())
    }

    /// `axis` must be an index of the operand of `f`.
    fn need_axis(&self, f: &Ident, ix: &Ident, t: &ValueType, operand: Span) -> LResult<()> {
        if t.axis(&ix.name).is_none() {
            let have: Vec<&str> = t.axes.iter().map(|a| a.name.as_str()).collect();
            let have = if have.is_empty() { "none".to_string() } else { have.join(", ") };
            return Err(Diagnostic::new(
                format!("`{}` over index `{}`, which its operand does not have", f.name, ix.name),
                ix.span,
                "not an index of the operand",
            )
            .with_hint(if f.name == "max" {
                let dym = match suggest(&ix.name, self.order.iter().map(|s| s.as_str())) {
                    Some(s) => format!("did you mean `{s}`? "),
                    None => String::new(),
                };
                format!(
                    "{dym}`max` with an undeclared bare name first is a reduction over that index; the operand (at {}) has indices: {have}",
                    self.at(operand)
                )
            } else {
                format!("the operand (at {}) has indices: {have}", self.at(operand))
            }));
        }
        Ok(())
    }

    fn call(&mut self, e: &Expr, f: &Ident, args: &[Expr], cx: &StmtCtx) -> LResult<(ValueId, ValueType)> {
        let name = f.name.as_str();
        if let Some(u) = UnaryOp::from_dsl(name) {
            self.arity(e, f, args, 1)?;
            let (v, t) = self.expr(&args[0], cx)?;
            self.need_float(&t, args[0].span, &format!("`{name}`"))?;
            return self.add(Op::Unary(u), &[v], e.span);
        }
        match name {
            "float" => {
                self.arity(e, f, args, 1)?;
                let (v, t) = self.expr(&args[0], cx)?;
                self.need_number(&t, args[0].span, "`float`")?;
                let ty = ValueType { dtype: DType::F32, axes: t.axes.clone() };
                Ok((self.g.add(Op::Cast, ty.clone(), &[v], e.span), ty))
            }
            "min" | "max" => {
                self.arity(e, f, args, 2)?;
                let reduction = name == "max"
                    && matches!(&args[0].kind, ExprKind::Name(id)
                        if !self.names.contains_key(&id.name) && !self.poisoned.contains(&id.name) && !cx.lhs.iter().any(|l| l.name == id.name));
                if reduction {
                    return self.reduce_like(e, f, args, cx);
                }
                let (va, ta) = self.expr(&args[0], cx)?;
                let (vb, tb) = self.expr(&args[1], cx)?;
                self.need_float(&ta, args[0].span, &format!("`{name}`"))?;
                self.need_float(&tb, args[1].span, &format!("`{name}`"))?;
                let op = if name == "min" { BinaryOp::Min } else { BinaryOp::Max };
                self.add(Op::Binary(op), &[va, vb], e.span)
            }
            "select" => {
                self.arity(e, f, args, 3)?;
                // The condition first: the values keep the order of the source.
                let cond = self.condition(&args[0], cx)?;
                let (va, ta) = self.guarded(&args[0], true, |me| me.expr(&args[1], cx))?;
                let (vb, tb) = self.guarded(&args[0], false, |me| me.expr(&args[2], cx))?;
                self.need_float(&ta, args[1].span, "`select`")?;
                self.need_float(&tb, args[2].span, "`select`")?;
                self.select(&cond, (va, vb), e.span)
            }
            "sum" | "cumsum" | "softmax" => self.reduce_like(e, f, args, cx),
            "causal" | "window" => {
                let n = if name == "causal" { 3 } else { 4 };
                self.arity(e, f, args, n)?;
                let i = self.index_arg(f, &args[0], "first argument")?;
                let j = self.index_arg(f, &args[1], "second argument")?;
                if i.name == j.name {
                    return Err(Diagnostic::new(
                        format!("`{name}` needs two different indices"),
                        args[0].span.join(args[1].span),
                        "the same index twice",
                    )
                    .with_hint(format!(
                        "the query index comes first, the key index second: `{}`",
                        Self::call_example(name)
                    )));
                }
                let size = if name == "window" {
                    match &args[2].kind {
                        ExprKind::Num { value, int: true, .. } if *value >= 1.0 && *value < 9.0e15 => {
                            *value as u64
                        }
                        _ => {
                            return Err(Diagnostic::new(
                                "the window size must be a positive integer literal",
                                args[2].span,
                                "not a positive integer",
                            )
                            .with_hint(
                                "write the size as a number, e.g. `window(i, j, 256, s[b, h, i, j])`",
                            ))
                        }
                    }
                } else {
                    0
                };
                let body = &args[n - 1];
                let (v, t) = self.expr(body, cx)?;
                self.need_float(&t, body.span, &format!("`{name}`"))?;
                self.need_axis(f, i, &t, body.span)?;
                self.need_axis(f, j, &t, body.span)?;
                let op = if name == "causal" {
                    Op::Causal { i: i.name.clone(), j: j.name.clone() }
                } else {
                    Op::Window { i: i.name.clone(), j: j.name.clone(), size }
                };
                self.add(op, &[v], e.span)
            }
            "rmsnorm" => {
                self.arity(e, f, args, 2)?;
                let (vx, tx) = self.expr(&args[0], cx)?;
                let (vw, tw) = self.expr(&args[1], cx)?;
                self.need_float(&tx, args[0].span, "`rmsnorm`")?;
                self.need_float(&tw, args[1].span, "`rmsnorm`")?;
                if tw.rank() != 1 {
                    return Err(Diagnostic::new(
                        format!("the weight of `rmsnorm` must have exactly one index, found {}", tw.rank()),
                        args[1].span,
                        "the weight",
                    )
                    .with_hint("index the weight by the normalized index alone, e.g. `rmsnorm(q[b, h, i, d], wq[d])`"));
                }
                let axis = tw.axes[0].name.clone();
                if tx.axis(&axis).is_none() {
                    return Err(Diagnostic::new(
                        format!("`rmsnorm` normalizes over `{axis}`, which its input does not have"),
                        args[1].span,
                        format!("indexed by `{axis}`"),
                    )
                    .with_hint("the weight's index names the normalized axis of the input; use one of the input's indices"));
                }
                self.add(Op::RmsNorm { axis, eps: RMSNORM_EPS }, &[vx, vw], e.span)
            }
            _ => {
                let hint = match suggest(name, FUNCTIONS.iter().copied()) {
                    Some(s) => format!("did you mean `{s}`? functions: {}", FUNCTIONS.join(", ")),
                    None if self.names.contains_key(name) => {
                        format!("`{name}` is not a function; index tensors with brackets: `{name}[...]`")
                    }
                    None => format!("functions: {}", FUNCTIONS.join(", ")),
                };
                Err(Diagnostic::new(format!("unknown function `{name}`"), f.span, "not a function")
                    .with_hint(hint))
            }
        }
    }

    /// `sum(i, e)`, `max(i, e)`, `cumsum(i, e)`, `softmax(i, e)`.
    fn reduce_like(
        &mut self,
        e: &Expr,
        f: &Ident,
        args: &[Expr],
        cx: &StmtCtx,
    ) -> LResult<(ValueId, ValueType)> {
        self.arity(e, f, args, 2)?;
        let ix = self.index_arg(f, &args[0], "first argument")?;
        let (v, t) = self.expr(&args[1], cx)?;
        self.need_float(&t, args[1].span, &format!("`{}`", f.name))?;
        self.need_axis(f, ix, &t, args[1].span)?;
        let axis = ix.name.clone();
        let op = match f.name.as_str() {
            "sum" => Op::Reduce { kind: ReduceKind::Sum, axis, contract: false },
            "max" => Op::Reduce { kind: ReduceKind::Max, axis, contract: false },
            "cumsum" => Op::Cumsum { axis, reverse: false },
            _ => Op::Softmax { axis },
        };
        if matches!(op, Op::Reduce { .. }) && cx.lhs.iter().any(|l| l.name == ix.name) {
            return Err(Diagnostic::new(
                format!("`{}` reduces over `{}`, an index of the left-hand side", f.name, ix.name),
                ix.span,
                "reduced here",
            )
            .with_hint(format!(
                "the result has no index `{}` after the reduction; remove it from the left, or do not reduce over it",
                ix.name
            )));
        }
        self.add(op, &[v], e.span)
    }

    fn ret(&mut self, prog: &Program) -> LResult<()> {
        let r = &prog.result;
        if !prog.ret.dtype.is_float() {
            return Err(Diagnostic::new(
                format!("the result cannot be {}", prog.ret.dtype),
                prog.ret.span,
                "not a floating-point dtype",
            )
            .with_hint(
                "results are bf16, f16 or f32; integers (i32) are for parameters: starts, lengths, positions",
            ));
        }
        if self.poisoned.contains(&r.name) {
            return Err(Diagnostic::new(POISONED, r.span, ""));
        }
        let ent = match self.names.get(&r.name) {
            Some(e) if e.kind != Kind::Dim => e.clone(),
            Some(_) => {
                return Err(Diagnostic::new(
                    format!("cannot return the dimension `{}`", r.name),
                    r.span,
                    "a dimension",
                )
                .with_hint("return the name of a statement"))
            }
            None => {
                let stmts: Vec<&str> = prog.stmts.iter().map(|s| s.name.name.as_str()).collect();
                let hint = match suggest(&r.name, stmts.iter().copied()) {
                    Some(s) => format!("did you mean `{s}`?"),
                    None if stmts.is_empty() => "define the result in a statement before `return`".into(),
                    None => format!("statements: {}", stmts.join(", ")),
                };
                return Err(Diagnostic::new(
                    format!("return of unknown name `{}`", r.name),
                    r.span,
                    "not defined",
                )
                .with_hint(hint));
            }
        };
        let mut want = Vec::new();
        for d in &prog.ret.dims {
            want.push(self.dim(d, None)?);
        }
        let node = ent.node.ok_or_else(|| self.unknown_name(r))?;
        if ent.dims != want {
            return Err(Diagnostic::new(
                format!(
                    "return shape mismatch: `{}` is {} but the result is declared {}",
                    r.name,
                    fmt_dims(&ent.dims),
                    fmt_dims(&want)
                ),
                r.span,
                format!("has shape {}", fmt_dims(&ent.dims)),
            )
            .with_hint(format!(
                "declared at {}: make the last statement's left-hand side produce {}",
                self.at(prog.ret.span),
                fmt_dims(&want)
            )));
        }
        if ent.dtype == DType::Bool {
            return Err(Diagnostic::new(
                format!("cannot return `{}`: it is a comparison result (bool)", r.name),
                r.span,
                "bool",
            )
            .with_hint("turn it into numbers with `select(cond, 1, 0)`"));
        }
        if matches!(self.g.op(node), Op::Param { .. }) && ent.dtype == prog.ret.dtype {
            // No backend runs an empty program; say so here, where `check` sees it too.
            return Err(Diagnostic::new(
                format!("`return {}` returns a parameter unchanged: there is nothing to compute", r.name),
                r.span,
                "a parameter",
            )
            .with_hint("return a statement that computes something from the parameters"));
        }
        let out = if ent.dtype != prog.ret.dtype {
            let ty = ValueType::tensor(prog.ret.dtype, want);
            self.g.add(Op::Cast, ty, &[node], r.span)
        } else {
            node
        };
        self.g.output = Some(out);
        Ok(())
    }
}
