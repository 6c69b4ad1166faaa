//! Diagnostics: errors of the front end as values, rendered as plain text.
//!
//! ```text
//! error: unknown name `qq`
//!  --> fox.attn:3:21
//!   |
//! 3 |     s[b, h, i, j] = qq[b, h, i, d]
//!   |                     ^^ not declared
//!   |
//!   = hint: declared names: q, k, v, fgate, c
//! ```
//! The renderer is hand-rolled (no colors, no terminal probing) so that the output is byte-for-byte
//! stable: snapshot tests and the CLI's exit-1 path both depend on it.

use crate::types::Span;
use std::fmt;

/// One error: a message, where it is, a short label under the caret and an optional hint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    pub message: String,
    pub span: Span,
    pub label: String,
    pub hint: Option<String>,
}

impl Diagnostic {
    pub fn new(message: impl Into<String>, span: Span, label: impl Into<String>) -> Diagnostic {
        Diagnostic { message: message.into(), span, label: label.into(), hint: None }
    }

    pub fn with_hint(mut self, hint: impl Into<String>) -> Diagnostic {
        self.hint = Some(hint.into());
        self
    }
}

/// A non-empty list of diagnostics (the error type of [`crate::frontend`]).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Diagnostics {
    pub list: Vec<Diagnostic>,
}

impl From<Diagnostic> for Diagnostics {
    fn from(d: Diagnostic) -> Diagnostics {
        Diagnostics { list: vec![d] }
    }
}

impl Diagnostics {
    pub fn new() -> Diagnostics {
        Diagnostics { list: vec![] }
    }

    pub fn push(&mut self, d: Diagnostic) {
        self.list.push(d);
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Diagnostic> {
        self.list.iter()
    }

    /// True when a diagnostic reports a bug in foxc rather than in the program (its message starts
    /// with `internal error`): the CLI exits 2 for these, 1 otherwise.
    pub fn is_internal(&self) -> bool {
        self.list.iter().any(|d| d.message.starts_with("internal error"))
    }

    /// Render every diagnostic against the source text, separated by blank lines.
    pub fn render(&self, file_name: &str, src: &str) -> String {
        let mut out = String::new();
        for (n, d) in self.list.iter().enumerate() {
            if n > 0 {
                out.push('\n');
            }
            render_one(&mut out, d, file_name, src);
        }
        out
    }

    /// As [`Diagnostics::render`], for raw bytes that may not be UTF-8 (invalid sequences are
    /// shown as U+FFFD; spans before the first invalid byte keep their positions).
    pub fn render_bytes(&self, file_name: &str, bytes: &[u8]) -> String {
        self.render(file_name, &String::from_utf8_lossy(bytes))
    }
}

/// Without the source: one `file-less` line per diagnostic (`error: msg (at bytes a..b)`).
impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (n, d) in self.list.iter().enumerate() {
            if n > 0 {
                f.write_str("\n")?;
            }
            write!(f, "error: {} (at bytes {}..{})", d.message, d.span.start, d.span.end)?;
        }
        Ok(())
    }
}

impl std::error::Error for Diagnostics {}

/// Tabs are shown as 4 spaces and control characters as U+FFFD, so that the caret line lines up
/// and a binary file cannot emit terminal escapes.
fn display_char(c: char) -> (String, usize) {
    if c == '\t' {
        ("    ".to_string(), 4)
    } else if c.is_control() {
        ("\u{FFFD}".to_string(), 1)
    } else {
        (c.to_string(), 1)
    }
}

/// Largest char boundary of `s` at or below `i`.
fn floor_boundary(s: &str, i: usize) -> usize {
    let mut i = i.min(s.len());
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Longest source line shown whole, and the context kept around the caret in longer ones.
const MAX_LINE: usize = 120;
const CONTEXT: usize = 40;

fn render_one(out: &mut String, d: &Diagnostic, file_name: &str, src: &str) {
    use std::fmt::Write;
    let start = floor_boundary(src, d.span.start as usize);
    let end = floor_boundary(src, (d.span.end as usize).max(start));
    // The line holding `start`.
    let line_start = src[..start].rfind('\n').map(|p| p + 1).unwrap_or(0);
    let line_end = src[start..].find('\n').map(|p| start + p).unwrap_or(src.len());
    let line_no = src[..line_start].matches('\n').count() + 1;
    let col = src[line_start..start].chars().count() + 1;
    let _ = writeln!(out, "error: {}", d.message);
    let gutter = line_no.to_string().len();
    let pad = " ".repeat(gutter);
    let _ = writeln!(out, "{pad}--> {file_name}:{line_no}:{col}");
    let _ = writeln!(out, "{pad} |");
    // Source line, and the caret line under it (the span is clipped to this line).
    let line = src[line_start..line_end].trim_end_matches('\r');
    let mut shown = String::new();
    let mut caret_off = 0usize;
    let mut caret_len = 0usize;
    let mut pos = line_start;
    for c in line.chars() {
        let (text, w) = display_char(c);
        if pos < start {
            caret_off += w;
        } else if pos < end {
            caret_len += w;
        }
        shown.push_str(&text);
        pos += c.len_utf8();
    }
    let caret_len = caret_len.max(1);
    // Long lines (generated or minified input) are cut to a window around the caret.
    let chars: Vec<char> = shown.trim_end().chars().collect();
    let (mut from, mut to) = (0usize, chars.len());
    if chars.len() > MAX_LINE {
        from = caret_off.saturating_sub(CONTEXT);
        to = (caret_off + caret_len.min(MAX_LINE - 2 * CONTEXT) + CONTEXT).min(chars.len());
    }
    let mut text: String = chars[from.min(to)..to].iter().collect();
    let mut caret_off = caret_off - from;
    let caret_len = if chars.len() > MAX_LINE { caret_len.min(MAX_LINE - 2 * CONTEXT) } else { caret_len };
    if from > 0 {
        text.insert_str(0, "...");
        caret_off += 3;
    }
    if to < chars.len() {
        text.push_str("...");
    }
    let _ = writeln!(out, "{line_no} |{}", if text.is_empty() { String::new() } else { format!(" {text}") });
    let label = if d.label.is_empty() { String::new() } else { format!(" {}", d.label) };
    let _ = writeln!(out, "{pad} | {}{}{}", " ".repeat(caret_off), "^".repeat(caret_len), label);
    if let Some(h) = &d.hint {
        let _ = writeln!(out, "{pad} |");
        let _ = writeln!(out, "{pad} = hint: {h}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caret_under_span() {
        let src = "ab\n  xyz = 1\n";
        let d = Diagnostic::new("bad", Span::new(5, 8), "here").with_hint("fix it");
        let r = Diagnostics::from(d).render("f.attn", src);
        assert_eq!(
            r,
            "error: bad\n --> f.attn:2:3\n  |\n2 |   xyz = 1\n  |   ^^^ here\n  |\n  = hint: fix it\n"
        );
    }

    #[test]
    fn span_at_eof_and_out_of_range() {
        let src = "abc";
        let d = Diagnostic::new("eof", Span::new(3, 3), "");
        let r = Diagnostics::from(d.clone()).render("f", src);
        assert!(r.contains("f:1:4"), "{r}");
        let d = Diagnostic::new("far", Span::new(100, 200), "x");
        let r = Diagnostics::from(d).render("f", src);
        assert!(r.contains("f:1:4"), "{r}");
        let r = Diagnostics::from(Diagnostic::new("e", Span::new(0, 0), "")).render("f", "");
        assert!(r.contains("f:1:1"), "{r}");
    }
}

#[cfg(test)]
mod long_line_tests {
    use super::*;

    #[test]
    fn long_lines_are_windowed() {
        let src = format!("{}XYZ{}", "a ".repeat(500), " b".repeat(500));
        let d = Diagnostic::new("m", Span::new(1000, 1003), "here");
        let r = Diagnostics::from(d).render("f", &src);
        let lines: Vec<&str> = r.lines().collect();
        assert!(lines[3].len() < 140, "{r}");
        let src_col = lines[3].find("XYZ").unwrap();
        let caret_col = lines[4].find('^').unwrap();
        assert_eq!(src_col, caret_col, "{r}");
        assert!(lines[4].contains("^^^ here"));
    }
}
