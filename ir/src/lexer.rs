//! The lexer: source text to tokens with byte spans. Whitespace (newlines included) and `#` line
//! comments separate tokens and are otherwise insignificant.

use crate::diag::Diagnostic;
use crate::types::Span;
use std::fmt;

#[derive(Clone, Debug, PartialEq)]
pub enum Tok {
    Ident(String),
    /// The keywords `and` and `or`, which combine the conditions of a `select`.
    And,
    Or,
    /// A numeric literal: its value, whether it was written as an integer, and its text.
    Num {
        value: f64,
        int: bool,
        text: String,
    },
    LParen,
    RParen,
    LBracket,
    RBracket,
    LBrace,
    RBrace,
    Comma,
    Colon,
    Semi,
    Arrow,
    Assign,
    Plus,
    Minus,
    Star,
    Slash,
    Lt,
    Le,
    Gt,
    Ge,
    EqEq,
    Ne,
    Eof,
}

impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Tok::Ident(s) => return write!(f, "`{s}`"),
            Tok::And => "`and`",
            Tok::Or => "`or`",
            Tok::Num { text, .. } => return write!(f, "number `{text}`"),
            Tok::LParen => "`(`",
            Tok::RParen => "`)`",
            Tok::LBracket => "`[`",
            Tok::RBracket => "`]`",
            Tok::LBrace => "`{`",
            Tok::RBrace => "`}`",
            Tok::Comma => "`,`",
            Tok::Colon => "`:`",
            Tok::Semi => "`;`",
            Tok::Arrow => "`->`",
            Tok::Assign => "`=`",
            Tok::Plus => "`+`",
            Tok::Minus => "`-`",
            Tok::Star => "`*`",
            Tok::Slash => "`/`",
            Tok::Lt => "`<`",
            Tok::Le => "`<=`",
            Tok::Gt => "`>`",
            Tok::Ge => "`>=`",
            Tok::EqEq => "`==`",
            Tok::Ne => "`!=`",
            Tok::Eof => "end of file",
        };
        f.write_str(s)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Token {
    pub tok: Tok,
    pub span: Span,
}

/// Longest identifier or number accepted; longer ones are almost certainly not a program.
const MAX_TOKEN_LEN: usize = 256;

/// Split `src` into tokens, ending with [`Tok::Eof`]. Stops at the first lexical error.
pub fn lex(src: &str) -> Result<Vec<Token>, Diagnostic> {
    let b = src.as_bytes();
    let mut toks = Vec::new();
    let mut i = 0usize;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if c == b'#' {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
            continue;
        }
        let start = i;
        if c.is_ascii_alphabetic() || c == b'_' {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            if i - start > MAX_TOKEN_LEN {
                return Err(Diagnostic::new(
                    format!("identifier longer than {MAX_TOKEN_LEN} characters"),
                    Span::new(start, start + 1),
                    "this identifier",
                )
                .with_hint("use a shorter name"));
            }
            let tok = match &src[start..i] {
                "and" => Tok::And,
                "or" => Tok::Or,
                word => Tok::Ident(word.to_string()),
            };
            toks.push(Token { tok, span: Span::new(start, i) });
            continue;
        }
        if c.is_ascii_digit() || (c == b'.' && b.get(i + 1).is_some_and(|d| d.is_ascii_digit())) {
            toks.push(lex_number(src, &mut i)?);
            continue;
        }
        let two = if i + 1 < b.len() { Some((c, b[i + 1])) } else { None };
        let (tok, len) = match two {
            Some((b'-', b'>')) => (Tok::Arrow, 2),
            Some((b'<', b'=')) => (Tok::Le, 2),
            Some((b'>', b'=')) => (Tok::Ge, 2),
            Some((b'=', b'=')) => (Tok::EqEq, 2),
            Some((b'!', b'=')) => (Tok::Ne, 2),
            _ => match c {
                b'(' => (Tok::LParen, 1),
                b')' => (Tok::RParen, 1),
                b'[' => (Tok::LBracket, 1),
                b']' => (Tok::RBracket, 1),
                b'{' => (Tok::LBrace, 1),
                b'}' => (Tok::RBrace, 1),
                b',' => (Tok::Comma, 1),
                b':' => (Tok::Colon, 1),
                b';' => (Tok::Semi, 1),
                b'=' => (Tok::Assign, 1),
                b'+' => (Tok::Plus, 1),
                b'-' => (Tok::Minus, 1),
                b'*' => (Tok::Star, 1),
                b'/' => (Tok::Slash, 1),
                b'<' => (Tok::Lt, 1),
                b'>' => (Tok::Gt, 1),
                _ => {
                    let ch = src[i..].chars().next().unwrap_or('?');
                    let hint = match ch {
                        '!' => "`!` only appears in `!=`; there is no boolean negation (swap the comparison)",
                        '^' => "there is no power operator; write `x * x` or use exp/log",
                        '%' => "there is no remainder operator",
                        _ => "tokens are identifiers, numbers, ( ) [ ] { } , : ; = -> + - * / < <= > >= == != and # comments",
                    };
                    let shown = if ch.is_control() || ch.is_whitespace() {
                        format!("{:?}", ch)
                    } else {
                        format!("`{ch}`")
                    };
                    return Err(Diagnostic::new(
                        format!("unexpected character {shown}"),
                        Span::new(i, i + ch.len_utf8()),
                        "not part of the language",
                    )
                    .with_hint(hint));
                }
            },
        };
        toks.push(Token { tok, span: Span::new(i, i + len) });
        i += len;
    }
    toks.push(Token { tok: Tok::Eof, span: Span::new(b.len(), b.len()) });
    Ok(toks)
}

/// `123`, `1.5`, `.5`, `1e-6`, `2.5E+3`.
fn lex_number(src: &str, i: &mut usize) -> Result<Token, Diagnostic> {
    let b = src.as_bytes();
    let start = *i;
    let mut int = true;
    while *i < b.len() && b[*i].is_ascii_digit() {
        *i += 1;
    }
    if *i < b.len() && b[*i] == b'.' {
        int = false;
        *i += 1;
        while *i < b.len() && b[*i].is_ascii_digit() {
            *i += 1;
        }
    }
    if *i < b.len() && (b[*i] == b'e' || b[*i] == b'E') {
        let save = *i;
        *i += 1;
        if *i < b.len() && (b[*i] == b'+' || b[*i] == b'-') {
            *i += 1;
        }
        if *i < b.len() && b[*i].is_ascii_digit() {
            int = false;
            while *i < b.len() && b[*i].is_ascii_digit() {
                *i += 1;
            }
        } else {
            return Err(Diagnostic::new(
                "malformed number: exponent without digits",
                Span::new(start, *i),
                "expected digits after the exponent",
            )
            .with_hint(format!("write e.g. `{}e-6`", &src[start..save])));
        }
    }
    // An identifier glued to a number (`2x`) is a typo, not two tokens.
    if *i < b.len() && (b[*i].is_ascii_alphabetic() || b[*i] == b'_') {
        let mut j = *i;
        while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
            j += 1;
        }
        return Err(Diagnostic::new(
            "malformed number",
            Span::new(start, j),
            "letters directly after a number",
        )
        .with_hint("separate the number from the name with an operator, e.g. `2 * x`"));
    }
    let text = &src[start..*i];
    if text.len() > MAX_TOKEN_LEN {
        return Err(Diagnostic::new(
            format!("numeric literal longer than {MAX_TOKEN_LEN} characters"),
            Span::new(start, start + 1),
            "this literal",
        )
        .with_hint("write it in exponent form, e.g. `1e30`"));
    }
    let value: f64 = text.parse().map_err(|_| {
        Diagnostic::new("malformed number", Span::new(start, *i), "cannot be read as a number")
            .with_hint("numbers look like `3`, `0.5` or `1e-6`")
    })?;
    if !value.is_finite() {
        return Err(Diagnostic::new("number out of range", Span::new(start, *i), "overflows f64")
            .with_hint("use `inf` in a range declaration, or a smaller constant"));
    }
    Ok(Token { tok: Tok::Num { value, int, text: text.to_string() }, span: Span::new(start, *i) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lexes_operators_and_numbers() {
        let t = lex("a[i] -> <= 1.5e-3 .5 # x\n!=").unwrap();
        let kinds: Vec<String> = t.iter().map(|t| t.tok.to_string()).collect();
        assert_eq!(
            kinds,
            [
                "`a`",
                "`[`",
                "`i`",
                "`]`",
                "`->`",
                "`<=`",
                "number `1.5e-3`",
                "number `.5`",
                "`!=`",
                "end of file"
            ]
        );
    }

    #[test]
    fn errors_are_values() {
        assert!(lex("1e").is_err());
        assert!(lex("2x").is_err());
        assert!(lex("a $ b").is_err());
        assert!(lex("\u{0}").is_err());
        assert!(lex("é").is_err());
    }
}
