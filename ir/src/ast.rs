//! The abstract syntax tree of an attention program, with source spans.
//!
//! `Display` for [`Program`] is the stable pretty form of `foxc compile --emit ast`: one statement
//! per line, every sub-expression fully parenthesized so that the parse is visible, spans as
//! `@start..end` byte ranges on declarations and statements.

use crate::types::{DType, Span};
use std::fmt;

/// An identifier and where it was written.
#[derive(Clone, Debug, PartialEq)]
pub struct Ident {
    pub name: String,
    pub span: Span,
}

/// One dimension of a declared tensor type.
#[derive(Clone, Debug, PartialEq)]
pub enum DimExpr {
    /// A symbolic dimension (`T`).
    Sym(Ident),
    /// A constant size (`64`).
    Const(u64, Span),
}

impl DimExpr {
    pub fn span(&self) -> Span {
        match self {
            DimExpr::Sym(i) => i.span,
            DimExpr::Const(_, s) => *s,
        }
    }
}

/// `bf16[B, H, T, D]`, or a scalar `f32` (no brackets: `dims` is empty).
#[derive(Clone, Debug, PartialEq)]
pub struct TypeExpr {
    pub dtype: DType,
    pub dims: Vec<DimExpr>,
    pub span: Span,
}

/// `name: type [in [lo, hi]] [nonincreasing along DIM]`.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamDecl {
    pub name: Ident,
    pub ty: TypeExpr,
    /// The declared value range, `-inf`/`inf` allowed.
    pub range: Option<(f64, f64)>,
    /// `nonincreasing along DIM`: the values never grow along the axis of that dim (a decay
    /// cumsum a cache keeps, `c: f32[B, H, M] nonincreasing along M`).
    pub nonincreasing: Option<Ident>,
    pub span: Span,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnOp {
    Neg,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
    /// `and` / `or` of two conditions (only in the condition of a `select`).
    And,
    Or,
}

impl BinOp {
    pub fn symbol(self) -> &'static str {
        match self {
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::Lt => "<",
            BinOp::Le => "<=",
            BinOp::Gt => ">",
            BinOp::Ge => ">=",
            BinOp::Eq => "==",
            BinOp::Ne => "!=",
            BinOp::And => "and",
            BinOp::Or => "or",
        }
    }

    pub fn is_comparison(self) -> bool {
        matches!(self, BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge | BinOp::Eq | BinOp::Ne)
    }

    /// The comparison with its operands swapped: `a < b` is `b > a`.
    pub fn flipped(self) -> BinOp {
        match self {
            BinOp::Lt => BinOp::Gt,
            BinOp::Le => BinOp::Ge,
            BinOp::Gt => BinOp::Lt,
            BinOp::Ge => BinOp::Le,
            other => other,
        }
    }

    /// The comparison that holds exactly where this one fails (operands never NaN: index
    /// values and dims); `None` for an operator that is not a comparison.
    pub fn negated(self) -> Option<BinOp> {
        Some(match self {
            BinOp::Lt => BinOp::Ge,
            BinOp::Le => BinOp::Gt,
            BinOp::Gt => BinOp::Le,
            BinOp::Ge => BinOp::Lt,
            BinOp::Eq => BinOp::Ne,
            BinOp::Ne => BinOp::Eq,
            _ => return None,
        })
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum ExprKind {
    /// A numeric literal; `int` when written without `.` or exponent; `text` as written
    /// (`inf` is the literal +infinity).
    Num {
        value: f64,
        int: bool,
        text: String,
    },
    /// A bare name: a scalar parameter or statement, a dimension (`D`), or an index variable.
    Name(Ident),
    /// `x[i, j, ...]`; each subscript is an expression (a bare name `i` is a plain index;
    /// `i - j`, `h / (H / G)` are index expressions, checked by the lowering).
    Access {
        name: Ident,
        indices: Vec<Expr>,
    },
    Unary(UnOp, Box<Expr>),
    Binary(BinOp, Box<Expr>, Box<Expr>),
    /// `f(args...)`: builtins, reductions (`sum(d, e)`), masks (`causal(i, j, e)`).
    Call {
        func: Ident,
        args: Vec<Expr>,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Expr {
    pub kind: ExprKind,
    pub span: Span,
    /// Height of this expression tree (a leaf is 1). The parser bounds it, so every recursive
    /// walk of the AST has bounded stack depth.
    pub depth: u32,
}

impl Expr {
    /// The expressions directly inside this one: an access's subscripts, an operator's
    /// operands, a call's arguments.
    pub fn children(&self) -> Vec<&Expr> {
        match &self.kind {
            ExprKind::Access { indices, .. } => indices.iter().collect(),
            ExprKind::Unary(_, a) => vec![a],
            ExprKind::Binary(_, a, b) => vec![a, b],
            ExprKind::Call { args, .. } => args.iter().collect(),
            ExprKind::Num { .. } | ExprKind::Name(_) => vec![],
        }
    }
}

/// `name[i, j, ...] = value`.
#[derive(Clone, Debug, PartialEq)]
pub struct Stmt {
    pub name: Ident,
    pub indices: Vec<Ident>,
    pub value: Expr,
    pub span: Span,
}

/// `attention name(params) -> ret { stmts return result }`.
#[derive(Clone, Debug, PartialEq)]
pub struct Program {
    pub name: Ident,
    pub params: Vec<ParamDecl>,
    pub ret: TypeExpr,
    pub stmts: Vec<Stmt>,
    pub result: Ident,
    pub span: Span,
}

fn fmt_bound(x: f64) -> String {
    if x == f64::INFINITY {
        "inf".into()
    } else if x == f64::NEG_INFINITY {
        "-inf".into()
    } else {
        format!("{x}")
    }
}

impl fmt::Display for DimExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DimExpr::Sym(i) => f.write_str(&i.name),
            DimExpr::Const(c, _) => write!(f, "{c}"),
        }
    }
}

impl fmt::Display for TypeExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.dtype)?;
        if !self.dims.is_empty() {
            let d: Vec<String> = self.dims.iter().map(|d| d.to_string()).collect();
            write!(f, "[{}]", d.join(", "))?;
        }
        Ok(())
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            ExprKind::Num { text, .. } => f.write_str(text),
            ExprKind::Name(i) => f.write_str(&i.name),
            ExprKind::Access { name, indices } => {
                let ix: Vec<String> = indices.iter().map(|i| i.to_string()).collect();
                write!(f, "{}[{}]", name.name, ix.join(", "))
            }
            ExprKind::Unary(UnOp::Neg, e) => write!(f, "(-{e})"),
            ExprKind::Binary(op, a, b) => write!(f, "({a} {} {b})", op.symbol()),
            ExprKind::Call { func, args } => {
                write!(f, "{}(", func.name)?;
                for (n, a) in args.iter().enumerate() {
                    if n > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{a}")?;
                }
                f.write_str(")")
            }
        }
    }
}

impl fmt::Display for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sp = |s: Span| format!("@{}..{}", s.start, s.end);
        writeln!(f, "attention {} {}", self.name.name, sp(self.span))?;
        for p in &self.params {
            write!(f, "  param {}: {}", p.name.name, p.ty)?;
            if let Some((lo, hi)) = p.range {
                write!(f, " in [{}, {}]", fmt_bound(lo), fmt_bound(hi))?;
            }
            if let Some(d) = &p.nonincreasing {
                write!(f, " nonincreasing along {}", d.name)?;
            }
            writeln!(f, "  {}", sp(p.span))?;
        }
        writeln!(f, "  returns {}  {}", self.ret, sp(self.ret.span))?;
        for s in &self.stmts {
            write!(f, "  let {}", s.name.name)?;
            if !s.indices.is_empty() {
                let ix: Vec<&str> = s.indices.iter().map(|i| i.name.as_str()).collect();
                write!(f, "[{}]", ix.join(", "))?;
            }
            writeln!(f, " = {}  {}", s.value, sp(s.span))?;
        }
        writeln!(f, "  return {}  {}", self.result.name, sp(self.result.span))
    }
}
