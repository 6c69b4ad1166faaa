//! Value types: an element dtype plus an ordered list of named axes with symbolic sizes.
//!
//! Every IR value is a dense tensor. Its axes carry a *name* and a *size*:
//! - tensors that come straight from a parameter, a statement result or a fused op are
//!   *positional*: their axes are named `"0"`, `"1"`, ... (see [`Axis::positional`]);
//! - inside an index-notation expression, axes are named after the DSL index variables
//!   (`q[b, h, i, d]` gives axes `b:B, h:H, i:T, d:D`), and elementwise ops broadcast by name.

use std::fmt;

/// Element type of a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    BF16,
    F16,
    F32,
    /// 32-bit signed integers (tile indices produced by `block_boundary`).
    I32,
    /// 64-bit signed integers: only as the storage of a parameter (what callers pass, e.g.
    /// torch's default `int64`); inside a graph its values are `I32` ([`crate::Param::stored`]).
    I64,
    /// Results of comparisons; only `select` consumes them.
    Bool,
}

impl DType {
    pub fn name(self) -> &'static str {
        match self {
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::F32 => "f32",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::Bool => "bool",
        }
    }

    pub fn from_name(s: &str) -> Option<DType> {
        Some(match s {
            "bf16" => DType::BF16,
            "f16" => DType::F16,
            "f32" => DType::F32,
            "i32" => DType::I32,
            "i64" => DType::I64,
            "bool" => DType::Bool,
            _ => return None,
        })
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::BF16 | DType::F16 | DType::F32)
    }

    /// Bytes per element in memory.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::BF16 | DType::F16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::I64 => 8,
            DType::Bool => 1,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The size of one axis: a symbolic dimension (`T`), a constant, a tile count
/// `ceil(dim / tile)` (the query-tile axis of ACP nodes), or an exact quotient `H / G` (the
/// divisor of a grouped-query subscript `h / (H / G)`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dim {
    Sym(String),
    Const(u64),
    /// `ceil(base / tile)`: number of tiles of size `tile` covering `base`.
    Tiles(Box<Dim>, u32),
    /// `a / b`, defined only when `b` divides `a` (checked when dims are bound).
    Div(Box<Dim>, Box<Dim>),
}

impl Dim {
    pub fn sym(s: &str) -> Dim {
        Dim::Sym(s.to_string())
    }

    /// Resolve to a concrete size given the bindings of symbolic dims.
    pub fn eval(&self, bind: &dyn Fn(&str) -> Option<u64>) -> Option<u64> {
        match self {
            Dim::Sym(s) => bind(s),
            Dim::Const(c) => Some(*c),
            Dim::Tiles(base, t) => base.eval(bind).map(|b| b.div_ceil(*t as u64)),
            Dim::Div(a, b) => {
                let (a, b) = (a.eval(bind)?, b.eval(bind)?);
                (b != 0 && a % b == 0).then(|| a / b)
            }
        }
    }

    /// `a / b` as an exact quotient.
    pub fn quotient(a: Dim, b: Dim) -> Dim {
        Dim::Div(Box::new(a), Box::new(b))
    }

    /// The first exact quotient in `self` that does not divide under `bind` (its operands'
    /// values), so that a caller can say which division failed; `None` when all divide or an
    /// operand is unbound.
    pub fn failed_division(&self, bind: &dyn Fn(&str) -> Option<u64>) -> Option<(&Dim, u64, &Dim, u64)> {
        match self {
            Dim::Sym(_) | Dim::Const(_) => None,
            Dim::Tiles(base, _) => base.failed_division(bind),
            Dim::Div(a, b) => {
                if let Some(f) = a.failed_division(bind).or_else(|| b.failed_division(bind)) {
                    return Some(f);
                }
                let (x, y) = (a.eval(bind)?, b.eval(bind)?);
                (y == 0 || x % y != 0).then_some((&**a, x, &**b, y))
            }
        }
    }

    /// The symbolic dims `self` mentions, in order.
    pub fn symbols(&self) -> Vec<&str> {
        match self {
            Dim::Sym(s) => vec![s.as_str()],
            Dim::Const(_) => vec![],
            Dim::Tiles(b, _) => b.symbols(),
            Dim::Div(a, b) => {
                let mut v = a.symbols();
                v.extend(b.symbols());
                v
            }
        }
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Sym(s) => f.write_str(s),
            Dim::Const(c) => write!(f, "{c}"),
            Dim::Tiles(b, t) => write!(f, "{b}/{t}"),
            Dim::Div(a, b) => {
                // Operands that are themselves quotients keep their parentheses: `H / (A / B)`.
                let paren =
                    |d: &Dim| if matches!(d, Dim::Div(..)) { format!("({d})") } else { d.to_string() };
                write!(f, "{} / {}", paren(a), paren(b))
            }
        }
    }
}

/// One axis of a value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Axis {
    pub name: String,
    pub dim: Dim,
}

impl Axis {
    pub fn new(name: &str, dim: Dim) -> Axis {
        Axis { name: name.to_string(), dim }
    }

    /// The axis at position `pos` of a positional tensor.
    pub fn positional(pos: usize, dim: Dim) -> Axis {
        Axis { name: pos.to_string(), dim }
    }

    pub fn is_positional(&self) -> bool {
        self.name.bytes().all(|b| b.is_ascii_digit())
    }
}

/// The type of an IR value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ValueType {
    pub dtype: DType,
    pub axes: Vec<Axis>,
}

impl ValueType {
    pub fn scalar(dtype: DType) -> ValueType {
        ValueType { dtype, axes: vec![] }
    }

    /// A positional tensor of the given dims.
    pub fn tensor(dtype: DType, dims: impl IntoIterator<Item = Dim>) -> ValueType {
        ValueType { dtype, axes: dims.into_iter().enumerate().map(|(i, d)| Axis::positional(i, d)).collect() }
    }

    pub fn rank(&self) -> usize {
        self.axes.len()
    }

    pub fn dims(&self) -> impl Iterator<Item = &Dim> {
        self.axes.iter().map(|a| &a.dim)
    }

    pub fn axis(&self, name: &str) -> Option<(usize, &Axis)> {
        self.axes.iter().enumerate().find(|(_, a)| a.name == name)
    }

    pub fn is_positional(&self) -> bool {
        self.axes.iter().enumerate().all(|(i, a)| a.name == i.to_string())
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.dtype)?;
        let positional = self.is_positional();
        for (i, a) in self.axes.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            if positional {
                write!(f, "{}", a.dim)?;
            } else {
                write!(f, "{}:{}", a.name, a.dim)?;
            }
        }
        f.write_str("]")
    }
}

/// A byte range in the source text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Span {
    pub start: u32,
    pub end: u32,
}

impl Span {
    pub fn new(start: usize, end: usize) -> Span {
        Span { start: start as u32, end: end as u32 }
    }

    pub fn join(self, other: Span) -> Span {
        Span { start: self.start.min(other.start), end: self.end.max(other.end) }
    }

    pub fn range(self) -> std::ops::Range<usize> {
        self.start as usize..self.end as usize
    }
}
