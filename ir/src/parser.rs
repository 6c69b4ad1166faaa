//! Recursive-descent parser: tokens to [`ast::Program`].
//!
//! ```text
//! program := "attention" IDENT "(" [param ("," param)* [","]] ")" "->" type "{" stmt* "return" IDENT [";"] "}"
//! param   := IDENT ":" type ["in" "[" bound "," bound "]"]
//! type    := DTYPE ["[" dim ("," dim)* "]"]        DTYPE is bf16 | f16 | f32; dim is IDENT | INTEGER
//! bound   := ["-"] (NUMBER | "inf")
//! stmt    := IDENT ["[" IDENT ("," IDENT)* "]"] "=" expr [";"]
//! expr    := sum [("<" | "<=" | ">" | ">=" | "==" | "!=") sum]
//! sum     := prod (("+" | "-") prod)*
//! prod    := unary (("*" | "/") unary)*
//! unary   := "-" unary | primary
//! primary := NUMBER | "inf" | IDENT | IDENT "[" sub ("," sub)* "]" | IDENT "(" [expr ("," expr)*] ")" | "(" expr ")"
//! sub     := sum                                  a subscript: `i`, `i - j`, `t + 1`, `h / (H / G)`
//! ```
//! `inf` in an expression is the literal +infinity (`-inf` is its negation); it is not a name.
//! A subscript is parsed as an arithmetic expression; the lowering checks that it is an index
//! expression (affine in index variables, integer constants, one floor division by a dim).
//! Newlines are insignificant: a statement ends where its expression cannot continue.
//! The parser stops at the first error. Nesting and expression height are bounded
//! ([`MAX_NESTING`], [`MAX_HEIGHT`]) so that no input can overflow the stack here or in any
//! later recursive walk of the AST.

use crate::ast::*;
use crate::diag::Diagnostic;
use crate::lexer::{Tok, Token};
use crate::types::{DType, Span};

/// Deepest nesting of parentheses, calls and unary minus.
pub const MAX_NESTING: u32 = 100;
/// Tallest expression tree (a chain `a + a + ... + a` of n terms has height n).
pub const MAX_HEIGHT: u32 = 128;

/// Binary operators by precedence, loosest first; operators of one level associate to the left.
const BINARY_LEVELS: [&[(Tok, BinOp)]; 5] = [
    &[(Tok::Or, BinOp::Or)],
    &[(Tok::And, BinOp::And)],
    &[
        (Tok::Lt, BinOp::Lt),
        (Tok::Le, BinOp::Le),
        (Tok::Gt, BinOp::Gt),
        (Tok::Ge, BinOp::Ge),
        (Tok::EqEq, BinOp::Eq),
        (Tok::Ne, BinOp::Ne),
    ],
    &[(Tok::Plus, BinOp::Add), (Tok::Minus, BinOp::Sub)],
    &[(Tok::Star, BinOp::Mul), (Tok::Slash, BinOp::Div)],
];

/// The level of `+` and `-` in [`BINARY_LEVELS`]: an index subscript is a sum, never a
/// comparison.
const SUM_LEVEL: usize = 3;

type PResult<T> = Result<T, Diagnostic>;

pub struct Parser<'t> {
    src: &'t str,
    toks: &'t [Token],
    pos: usize,
    nesting: u32,
}

/// Parse a token stream (ending in [`Tok::Eof`], as [`crate::lexer::lex`] makes it) of `src`
/// (used for line:column references in hints).
pub fn parse_tokens(toks: &[Token], src: &str) -> PResult<Program> {
    if toks.is_empty() {
        return Err(Diagnostic::new("empty input", Span::default(), "expected `attention`")
            .with_hint("a program starts with `attention name(params) -> type { ... }`"));
    }
    let mut p = Parser { src, toks, pos: 0, nesting: 0 };
    p.program()
}

impl<'t> Parser<'t> {
    /// `line:col` of a span's start.
    fn at(&self, span: Span) -> String {
        let (l, c) = crate::lower::line_col(self.src, span.start);
        format!("{l}:{c}")
    }

    fn peek(&self) -> &Tok {
        &self.toks[self.pos.min(self.toks.len() - 1)].tok
    }

    fn span(&self) -> Span {
        self.toks[self.pos.min(self.toks.len() - 1)].span
    }

    fn prev_span(&self) -> Span {
        if self.pos == 0 {
            Span::default()
        } else {
            self.toks[(self.pos - 1).min(self.toks.len() - 1)].span
        }
    }

    fn bump(&mut self) -> Token {
        let t = self.toks[self.pos.min(self.toks.len() - 1)].clone();
        if self.pos < self.toks.len() - 1 {
            self.pos += 1;
        }
        t
    }

    fn error_here(&self, expected: &str, hint: &str) -> Diagnostic {
        let found = self.peek().to_string();
        Diagnostic::new(
            format!("expected {expected}, found {found}"),
            self.span(),
            format!("expected {expected}"),
        )
        .with_hint(hint)
    }

    fn expect(&mut self, t: Tok, expected: &str, hint: &str) -> PResult<Span> {
        if *self.peek() == t {
            Ok(self.bump().span)
        } else {
            Err(self.error_here(expected, hint))
        }
    }

    fn ident(&mut self, expected: &str, hint: &str) -> PResult<Ident> {
        match self.peek().clone() {
            Tok::Ident(name) => {
                let span = self.bump().span;
                Ok(Ident { name, span })
            }
            _ => Err(self.error_here(expected, hint)),
        }
    }

    fn program(&mut self) -> PResult<Program> {
        if *self.peek() == Tok::Eof {
            return Err(Diagnostic::new("empty program", self.span(), "expected `attention`")
                .with_hint("a program starts with `attention name(params) -> type { ... }`"));
        }
        let start = self.span();
        match self.peek() {
            Tok::Ident(s) if s == "attention" => {
                self.bump();
            }
            _ => {
                return Err(self.error_here(
                    "`attention`",
                    "a program starts with `attention name(params) -> type { ... }`",
                ))
            }
        }
        let name = self.ident("the attention's name", "write `attention fox(...) -> ... { ... }`")?;
        self.expect(
            Tok::LParen,
            "`(`",
            "the parameter list follows the name: `attention fox(q: bf16[B, H, T, D], ...)`",
        )?;
        let mut params = Vec::new();
        while *self.peek() != Tok::RParen {
            params.push(self.param()?);
            match self.peek() {
                Tok::Comma => {
                    self.bump();
                }
                Tok::RParen => {}
                _ => return Err(self.error_here("`,` or `)`", "separate parameters with commas")),
            }
        }
        self.bump();
        self.expect(Tok::Arrow, "`->`", "declare the result type: `) -> bf16[B, H, T, D] {`")?;
        let ret = self.type_expr()?;
        self.expect(Tok::LBrace, "`{`", "the body is a block: `{ statements... return name }`")?;
        let mut stmts = Vec::new();
        loop {
            match self.peek() {
                Tok::Ident(s) if s == "return" => break,
                Tok::Ident(_) => stmts.push(self.stmt()?),
                Tok::Semi => {
                    self.bump();
                }
                Tok::RBrace | Tok::Eof => {
                    return Err(Diagnostic::new(
                        "missing `return`",
                        self.span(),
                        "the body ends without `return`",
                    )
                    .with_hint("end the body with `return name`, naming the result statement"))
                }
                _ => {
                    return Err(self.error_here(
                        "a statement",
                        "statements look like `name[i, j] = expression`; the body ends with `return name`",
                    ))
                }
            }
        }
        self.bump();
        let result = self.ident("the name of the result", "write `return out`, naming a statement")?;
        if *self.peek() == Tok::Semi {
            self.bump();
        }
        if *self.peek() != Tok::RBrace {
            return Err(
                self.error_here("`}` after `return`", "`return` must be the last statement of the body")
            );
        }
        let end = self.bump().span;
        if *self.peek() != Tok::Eof {
            return Err(self.error_here(
                "end of file",
                "a file holds exactly one `attention` definition; remove what follows it",
            ));
        }
        Ok(Program { name, params, ret, stmts, result, span: start.join(end) })
    }

    fn param(&mut self) -> PResult<ParamDecl> {
        let name = self.ident("a parameter name", "parameters look like `q: bf16[B, H, T, D]`")?;
        self.expect(Tok::Colon, "`:`", "give the parameter a type: `q: bf16[B, H, T, D]`")?;
        let ty = self.type_expr()?;
        let mut range = None;
        if matches!(self.peek(), Tok::Ident(s) if s == "in") {
            let in_span = self.bump().span;
            self.expect(Tok::LBracket, "`[`", "a range looks like `in [-inf, 0]`")?;
            let lo = self.bound()?;
            self.expect(Tok::Comma, "`,`", "a range looks like `in [-inf, 0]`")?;
            let hi = self.bound()?;
            let close = self.expect(Tok::RBracket, "`]`", "a range looks like `in [-inf, 0]`")?;
            if lo > hi || lo == f64::INFINITY || hi == f64::NEG_INFINITY {
                return Err(Diagnostic::new(
                    "empty value range",
                    in_span.join(close),
                    "no value lies in this range",
                )
                .with_hint("write the lower bound first: `in [lo, hi]` with lo <= hi"));
            }
            range = Some((lo, hi));
        }
        let mut nonincreasing = None;
        if matches!(self.peek(), Tok::Ident(s) if s == "nonincreasing") {
            const HINT: &str = "a monotone parameter looks like `c: f32[B, H, T] nonincreasing along T`";
            self.bump();
            match self.peek() {
                Tok::Ident(s) if s == "along" => {
                    self.bump();
                }
                _ => return Err(self.error_here("`along`", HINT)),
            }
            nonincreasing = Some(self.ident("the dim of an axis of the parameter's type", HINT)?);
        }
        let span = name.span.join(self.prev_span());
        Ok(ParamDecl { name, ty, range, nonincreasing, span })
    }

    fn bound(&mut self) -> PResult<f64> {
        let neg = if *self.peek() == Tok::Minus {
            self.bump();
            true
        } else {
            false
        };
        let v = match self.peek().clone() {
            Tok::Num { value, .. } => {
                self.bump();
                value
            }
            Tok::Ident(s) if s == "inf" => {
                self.bump();
                f64::INFINITY
            }
            _ => return Err(self.error_here("a number or `inf`", "a range looks like `in [-inf, 0]`")),
        };
        Ok(if neg { -v } else { v })
    }

    fn type_expr(&mut self) -> PResult<TypeExpr> {
        let dt = self.ident("a dtype", "dtypes are bf16, f16, f32, i32 and i64, e.g. `bf16[B, H, T, D]`")?;
        let dtype = match DType::from_name(&dt.name) {
            Some(d @ (DType::BF16 | DType::F16 | DType::F32 | DType::I32 | DType::I64)) => d,
            Some(d) => {
                return Err(Diagnostic::new(
                    format!("dtype `{d}` cannot be declared"),
                    dt.span,
                    "not a number dtype",
                )
                .with_hint("parameters are bf16, f16, f32, i32 or i64 (results are floating point); a mask is a condition, `select(cond, s, -inf)`"))
            }
            None => {
                let hint = match dt.name.as_str() {
                    "float" | "float32" | "fp32" => "write `f32`".to_string(),
                    "half" | "float16" | "fp16" => "write `f16`".to_string(),
                    "bfloat16" => "write `bf16`".to_string(),
                    "int" | "int32" => "write `i32`".to_string(),
                    "int64" | "long" => "write `i64`".to_string(),
                    _ => "dtypes are bf16, f16, f32, i32 and i64".to_string(),
                };
                return Err(Diagnostic::new(format!("unknown dtype `{}`", dt.name), dt.span, "not a dtype")
                    .with_hint(hint));
            }
        };
        let mut dims = Vec::new();
        let mut span = dt.span;
        if *self.peek() == Tok::LBracket {
            self.bump();
            loop {
                match self.peek().clone() {
                    Tok::Ident(name) => {
                        let s = self.bump().span;
                        dims.push(DimExpr::Sym(Ident { name, span: s }));
                    }
                    Tok::Num { value, int: true, .. } if (1.0..9.0e15).contains(&value) => {
                        let s = self.bump().span;
                        dims.push(DimExpr::Const(value as u64, s));
                    }
                    Tok::Num { .. } => {
                        return Err(Diagnostic::new(
                            "invalid dimension",
                            self.span(),
                            "not a positive integer",
                        )
                        .with_hint("a dimension is a symbol like `T` or a positive integer like `64`"))
                    }
                    Tok::RBracket if dims.is_empty() => {
                        return Err(Diagnostic::new("empty dimension list", self.span(), "no dimensions")
                            .with_hint("write a scalar as just the dtype (`f32`), without brackets"))
                    }
                    _ => {
                        return Err(self.error_here(
                            "a dimension",
                            "a dimension is a symbol like `T` or a positive integer like `64`",
                        ))
                    }
                }
                match self.peek() {
                    Tok::Comma => {
                        self.bump();
                    }
                    Tok::RBracket => {
                        span = span.join(self.bump().span);
                        break;
                    }
                    _ => return Err(self.error_here("`,` or `]`", "separate dimensions with commas")),
                }
            }
        }
        Ok(TypeExpr { dtype, dims, span })
    }

    fn index_list(&mut self) -> PResult<Vec<Ident>> {
        // At `[`.
        self.bump();
        let mut ix = Vec::new();
        loop {
            match self.peek() {
                Tok::Ident(_) => ix.push(self.ident("an index variable", "")?),
                Tok::RBracket if ix.is_empty() => {
                    return Err(Diagnostic::new("empty index list", self.span(), "no indices")
                        .with_hint("a scalar is written without brackets"))
                }
                Tok::Num { .. } => {
                    return Err(Diagnostic::new("constant index", self.span(), "indices are variables")
                        .with_hint(
                            "index with variables (`x[b, h, i]`); constant indices are not supported",
                        ))
                }
                _ => return Err(self.error_here("an index variable", "indices are names, e.g. `x[b, h, i]`")),
            }
            match self.peek() {
                Tok::Comma => {
                    self.bump();
                }
                Tok::RBracket => {
                    self.bump();
                    return Ok(ix);
                }
                _ => {
                    return Err(self.error_here(
                        "`,` or `]`",
                        "indices are names separated by commas; compute expressions in a separate statement",
                    ))
                }
            }
        }
    }

    /// The subscripts of an access `x[...]`: expressions, each checked by the lowering.
    fn subscript_list(&mut self) -> PResult<Vec<Expr>> {
        // At `[`.
        self.bump();
        let mut ix = Vec::new();
        loop {
            match self.peek() {
                Tok::RBracket if ix.is_empty() => {
                    return Err(Diagnostic::new("empty index list", self.span(), "no indices")
                        .with_hint("a scalar is written without brackets"))
                }
                _ => {}
            }
            self.enter()?;
            let e = self.binary_level(SUM_LEVEL);
            self.nesting -= 1;
            ix.push(e?);
            match self.peek() {
                Tok::Comma => {
                    self.bump();
                }
                Tok::RBracket => {
                    self.bump();
                    return Ok(ix);
                }
                _ => {
                    return Err(self.error_here(
                        "`,` or `]`",
                        "subscripts are index expressions separated by commas, e.g. `x[b, h, i - j]`",
                    ))
                }
            }
        }
    }

    fn stmt(&mut self) -> PResult<Stmt> {
        let name = self.ident("a statement", "")?;
        let indices = if *self.peek() == Tok::LBracket { self.index_list()? } else { vec![] };
        if *self.peek() != Tok::Assign {
            let hint = if *self.peek() == Tok::EqEq {
                "a definition uses a single `=`"
            } else {
                "statements look like `name[i, j] = expression`"
            };
            return Err(self.error_here("`=`", hint));
        }
        self.bump();
        let value = self.expr()?;
        let span = name.span.join(value.span);
        if *self.peek() == Tok::Semi {
            self.bump();
        } else if *self.peek() == Tok::Assign {
            // `a = x +` NEWLINE `p[i] = ...`: the next statement's name was taken as an operand.
            return Err(Diagnostic::new(
                format!("unexpected {}: the expression before it is unfinished", self.peek()),
                self.span(),
                "a new statement cannot start inside an expression",
            )
            .with_hint(format!(
                "the statement `{}` (at {}) seems to end with a dangling operator; complete or remove it",
                name.name,
                self.at(name.span)
            )));
        } else if !matches!(self.peek(), Tok::Ident(_) | Tok::RBrace) {
            return Err(self.error_here(
                "an operator or the next statement",
                "an expression continues with an operator; a new statement starts with a name",
            ));
        }
        Ok(Stmt { name, indices, value, span })
    }

    fn enter(&mut self) -> PResult<()> {
        self.nesting += 1;
        if self.nesting > MAX_NESTING {
            return Err(Diagnostic::new(
                "expression nested too deeply",
                self.span(),
                "nesting limit reached here",
            )
            .with_hint(format!(
                "at most {MAX_NESTING} nested parentheses, calls or negations; split it into statements"
            )));
        }
        Ok(())
    }

    /// Build an expression node; `at` is where to point if the tree gets too tall.
    fn node(&self, kind: ExprKind, span: Span, depth: u32, at: Span) -> PResult<Expr> {
        if depth > MAX_HEIGHT {
            return Err(Diagnostic::new("expression too large", at, "height limit reached here").with_hint(
                format!("at most {MAX_HEIGHT} levels of operators; split it into several statements"),
            ));
        }
        Ok(Expr { kind, span, depth })
    }

    pub fn expr(&mut self) -> PResult<Expr> {
        self.enter()?;
        let r = self.binary_level(0);
        self.nesting -= 1;
        r
    }

    fn binary(&self, op: BinOp, a: Expr, b: Expr) -> PResult<Expr> {
        let span = a.span.join(b.span);
        let depth = a.depth.max(b.depth) + 1;
        let at = b.span;
        self.node(ExprKind::Binary(op, Box::new(a), Box::new(b)), span, depth, at)
    }

    /// The binary operators at precedence `level` (see [`BINARY_LEVELS`]) and tighter: each
    /// level is left-associative over the next one; past the last level come unary operators.
    fn binary_level(&mut self, level: usize) -> PResult<Expr> {
        let Some(ops) = BINARY_LEVELS.get(level) else { return self.unary() };
        let mut a = self.binary_level(level + 1)?;
        while let Some(&(_, op)) = ops.iter().find(|(t, _)| t == self.peek()) {
            self.bump();
            let b = self.binary_level(level + 1)?;
            a = self.binary(op, a, b)?;
        }
        Ok(a)
    }

    fn unary(&mut self) -> PResult<Expr> {
        if *self.peek() == Tok::Minus {
            let start = self.bump().span;
            self.enter()?;
            let e = self.unary();
            self.nesting -= 1;
            let e = e?;
            let span = start.join(e.span);
            let depth = e.depth + 1;
            return self.node(ExprKind::Unary(UnOp::Neg, Box::new(e)), span, depth, start);
        }
        self.primary()
    }

    fn primary(&mut self) -> PResult<Expr> {
        match self.peek().clone() {
            Tok::Num { value, int, text } => {
                let span = self.bump().span;
                self.node(ExprKind::Num { value, int, text }, span, 1, span)
            }
            Tok::Ident(_) => {
                let name = self.ident("a name", "")?;
                match self.peek() {
                    Tok::LBracket => {
                        let indices = self.subscript_list()?;
                        let span = name.span.join(self.prev_span());
                        let depth = indices.iter().map(|e| e.depth).max().unwrap_or(1);
                        self.node(ExprKind::Access { name, indices }, span, depth, span)
                    }
                    Tok::LParen => {
                        self.bump();
                        let mut args = Vec::new();
                        let mut depth = 1;
                        while *self.peek() != Tok::RParen {
                            let a = self.expr()?;
                            depth = depth.max(a.depth + 1);
                            args.push(a);
                            match self.peek() {
                                Tok::Comma => {
                                    self.bump();
                                }
                                Tok::RParen => {}
                                _ => {
                                    let hint = format!(
                                        "separate the arguments with commas, and close the `(` of `{}` (at {}) with `)`",
                                        name.name,
                                        self.at(name.span)
                                    );
                                    return Err(self.error_here("`,` or `)`", &hint));
                                }
                            }
                        }
                        let close = self.bump().span;
                        let span = name.span.join(close);
                        let at = name.span;
                        self.node(ExprKind::Call { func: name, args }, span, depth, at)
                    }
                    _ if name.name == "inf" => {
                        let kind = ExprKind::Num { value: f64::INFINITY, int: false, text: "inf".into() };
                        self.node(kind, name.span, 1, name.span)
                    }
                    _ => {
                        let span = name.span;
                        self.node(ExprKind::Name(name), span, 1, span)
                    }
                }
            }
            Tok::LParen => {
                let open = self.bump().span;
                let mut e = self.expr()?;
                if *self.peek() != Tok::RParen {
                    let mut d = self.error_here("`)`", "");
                    d.hint =
                        Some(format!("the `(` at byte {} is not closed; check the parentheses", open.start));
                    return Err(d);
                }
                let close = self.bump().span;
                e.span = open.join(close);
                Ok(e)
            }
            _ => Err(self.error_here(
                "an expression",
                "an expression is a number, a name, an access `x[i, j]`, a call `f(...)` or `( ... )`",
            )),
        }
    }
}
