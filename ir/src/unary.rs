//! The unary built-ins, one row each: the name, the f64 math, the derivative and the interval
//! facts. The front end, the interpreter and the passes read these rows; only an op's machine
//! code lives elsewhere, one `unary` function per backend.
//!
//! A new built-in is a variant of [`UnaryOp`] at the end (an op's position is its code where a
//! backend passes ops as numbers), its row in [`ROWS`] and, for a DSL function, its name in
//! `crate::lower::FUNCTIONS` (the list the "did you mean" hint prints, in its order).

use crate::ops::BinaryOp;
use std::fmt;
use std::str::FromStr;
use Arg::{Step as S, X, Y};
use BinaryOp::{Add as ADD, Div as DIV, Gt as GT, Lt as LT, Mul as MUL, Sub as SUB};

/// A unary elementwise op. The derived order (declaration order) is how users that sort ops
/// (the e-graph's nodes) order them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UnaryOp {
    Neg,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Sigmoid,
    /// `log(sigmoid(x))`, computed stably.
    LogSigmoid,
    /// `log(1 + exp(x))`, computed stably.
    Softplus,
    Relu,
    Tanh,
    Abs,
    /// `2^x`.
    Exp2,
    /// `log2(x)` (`-inf` at 0, NaN below).
    Log2,
    /// `x * sigmoid(x)`.
    Silu,
}

/// Everything the compiler knows about one unary op apart from its machine code.
pub struct UnaryDef {
    pub op: UnaryOp,
    /// The IR mnemonic and the e-graph node's name; also the DSL function's name when `dsl`.
    pub name: &'static str,
    /// Callable from the DSL as `name(x)` (`neg` is spelled `-x`).
    pub dsl: bool,
    /// The f64 definition: the interpreter's math and the CPU generic loops' (through a JIT helper).
    pub eval: fn(f64) -> f64,
    /// `dx` from `dy`, as data that the score-region and the gradient-program builders interpret.
    pub derivative: Derivative,
    /// A sound interval of `op(x)` for `x` in `[lo, hi]` (bounds may be infinite).
    pub interval: fn(f64, f64) -> (f64, f64),
    /// Which constant operands the e-graph analysis folds through `eval`.
    pub folds: Fold,
}

/// The constant operands an op is folded at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fold {
    Never,
    Always,
    NonNegative,
    Positive,
}

impl Fold {
    pub fn admits(self, x: f64) -> bool {
        match self {
            Fold::Never => false,
            Fold::Always => true,
            Fold::NonNegative => x >= 0.0,
            Fold::Positive => x > 0.0,
        }
    }
}

/// An operand of a derivative step: the op's input `x`, its output `y`, or an earlier step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arg {
    X,
    Y,
    Step(usize),
}

/// One node of a derivative, built in order by the interpreting builder.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Step {
    Const(f64),
    Unary(UnaryOp, Arg),
    Binary(BinaryOp, Arg, Arg),
}

/// How the incoming gradient `dy` meets the steps' values. The score region multiplies `dy` by
/// the local derivative each form stands for; gradient programs build the form itself (a division
/// or a select, never a multiply by `1 / s` or by a 0/1 mask, so that `dy = inf` stays exact).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Chain {
    /// `dy * s`.
    Scale(Arg),
    /// `dy / s` (local derivative `1 / s`).
    Divide(Arg),
    /// `-dy` (local derivative `-1`).
    Negate,
    /// `dy` where `cond` is 1, else `zero` (local derivative `cond`).
    Where { cond: Arg, zero: Arg },
    /// `dy` where `pos`, `-dy` where `neg`, else `zero` (local derivative `pos - neg`).
    Sign { pos: Arg, neg: Arg, zero: Arg },
}

/// The derivative of an op: `steps` evaluated in order, combined with `dy` by `chain`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Derivative {
    pub steps: &'static [Step],
    pub chain: Chain,
}

/// What a derivative's steps are built with: the score region's builder and the gradient
/// program's each implement it, so that [`Derivative::steps`] is interpreted in one place.
pub trait StepBuilder {
    type Value: Copy;
    type Error;
    fn step_const(&mut self, c: f64) -> Result<Self::Value, Self::Error>;
    fn step_unary(&mut self, op: UnaryOp, x: Self::Value) -> Result<Self::Value, Self::Error>;
    fn step_binary(
        &mut self,
        op: BinaryOp,
        x: Self::Value,
        y: Self::Value,
    ) -> Result<Self::Value, Self::Error>;
}

/// A derivative's steps as built, with the op's input and output: what its [`Chain`] reads.
pub struct Built<V> {
    x: V,
    y: V,
    steps: Vec<V>,
}

impl<V: Copy> Built<V> {
    /// The value an [`Arg`] names.
    pub fn arg(&self, a: Arg) -> V {
        match a {
            Arg::X => self.x,
            Arg::Y => self.y,
            Arg::Step(k) => self.steps[k],
        }
    }
}

impl Derivative {
    /// Builds the steps in order with `b`, from the op's input `x` and output `y`.
    pub fn build<B: StepBuilder>(
        &self,
        b: &mut B,
        x: B::Value,
        y: B::Value,
    ) -> Result<Built<B::Value>, B::Error> {
        let mut built = Built { x, y, steps: Vec::with_capacity(self.steps.len()) };
        for s in self.steps {
            let v = match *s {
                Step::Const(c) => b.step_const(c)?,
                Step::Unary(op, a) => b.step_unary(op, built.arg(a))?,
                Step::Binary(op, a, c) => b.step_binary(op, built.arg(a), built.arg(c))?,
            };
            built.steps.push(v);
        }
        Ok(built)
    }
}

/// `1 / (1 + exp(-x))`, without overflow for either sign of `x`.
pub fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// `log(sigmoid(z))`, stable for large |z|.
pub fn logsigmoid(z: f64) -> f64 {
    if z.is_nan() {
        return z;
    }
    z.min(0.0) - (-z.abs()).exp().ln_1p()
}

/// `log(1 + exp(x))`, stable for large |x|.
pub fn softplus(x: f64) -> f64 {
    -logsigmoid(-x)
}

/// An interval end that is NaN (the math of an infinite end) as the widest lower end.
pub fn nan_lo(x: f64) -> f64 {
    if x.is_nan() {
        f64::NEG_INFINITY
    } else {
        x
    }
}

/// An interval end that is NaN as the widest upper end.
pub fn nan_hi(x: f64) -> f64 {
    if x.is_nan() {
        f64::INFINITY
    } else {
        x
    }
}

const FULL: (f64, f64) = (f64::NEG_INFINITY, f64::INFINITY);
const LN_2: f64 = std::f64::consts::LN_2;

/// `dy * s` where `s` is the last of `steps`.
const fn scale(steps: &'static [Step]) -> Derivative {
    Derivative { steps, chain: Chain::Scale(S(steps.len() - 1)) }
}

/// The rows, in [`UnaryOp`] declaration order (`ROWS[op as usize].op == op`).
pub const ROWS: &[UnaryDef] = &[
    UnaryDef {
        op: UnaryOp::Neg,
        name: "neg",
        dsl: false,
        eval: |x| -x,
        derivative: Derivative { steps: &[], chain: Chain::Negate },
        interval: |lo, hi| (-hi, -lo),
        folds: Fold::Always,
    },
    UnaryDef {
        op: UnaryOp::Exp,
        name: "exp",
        dsl: true,
        eval: f64::exp,
        derivative: Derivative { steps: &[], chain: Chain::Scale(Y) },
        interval: |lo, hi| (lo.exp(), hi.exp()),
        folds: Fold::Always,
    },
    UnaryDef {
        op: UnaryOp::Log,
        name: "log",
        dsl: true,
        eval: f64::ln,
        derivative: Derivative { steps: &[], chain: Chain::Divide(X) },
        // log(0) = -inf is how the DSL spells the masked value.
        interval: |lo, hi| if lo >= 0.0 { (lo.ln(), hi.ln()) } else { FULL },
        folds: Fold::NonNegative,
    },
    UnaryDef {
        op: UnaryOp::Sqrt,
        name: "sqrt",
        dsl: true,
        eval: f64::sqrt,
        // 1 / (2 sqrt(x)).
        derivative: scale(&[Step::Const(0.5), Step::Binary(DIV, S(0), Y)]),
        interval: |lo, hi| if lo >= 0.0 { (lo.sqrt(), hi.sqrt()) } else { (0.0, nan_hi(hi.sqrt())) },
        folds: Fold::NonNegative,
    },
    UnaryDef {
        op: UnaryOp::Rsqrt,
        name: "rsqrt",
        dsl: true,
        eval: |x| 1.0 / x.sqrt(),
        // d x^(-1/2) = -1/2 x^(-3/2) = -1/2 y^3.
        derivative: scale(&[
            Step::Binary(MUL, Y, Y),
            Step::Binary(MUL, S(0), Y),
            Step::Const(-0.5),
            Step::Binary(MUL, S(2), S(1)),
        ]),
        interval: |lo, hi| if lo > 0.0 { (1.0 / hi.sqrt(), 1.0 / lo.sqrt()) } else { (0.0, f64::INFINITY) },
        folds: Fold::Positive,
    },
    UnaryDef {
        op: UnaryOp::Sigmoid,
        name: "sigmoid",
        dsl: true,
        eval: sigmoid,
        // y (1 - y).
        derivative: scale(&[Step::Const(1.0), Step::Binary(SUB, S(0), Y), Step::Binary(MUL, Y, S(1))]),
        interval: |_, _| (0.0, 1.0),
        folds: Fold::Never,
    },
    UnaryDef {
        op: UnaryOp::LogSigmoid,
        name: "logsigmoid",
        dsl: true,
        eval: logsigmoid,
        // sigmoid(-x).
        derivative: scale(&[Step::Unary(UnaryOp::Neg, X), Step::Unary(UnaryOp::Sigmoid, S(0))]),
        interval: |lo, hi| (nan_lo(logsigmoid(lo)), nan_hi(logsigmoid(hi)).min(0.0)),
        folds: Fold::Never,
    },
    UnaryDef {
        op: UnaryOp::Softplus,
        name: "softplus",
        dsl: true,
        eval: softplus,
        derivative: scale(&[Step::Unary(UnaryOp::Sigmoid, X)]),
        interval: |lo, hi| (nan_lo(softplus(lo)).max(0.0), nan_hi(softplus(hi))),
        folds: Fold::Never,
    },
    UnaryDef {
        op: UnaryOp::Relu,
        name: "relu",
        dsl: true,
        eval: |x| if x.is_nan() { x } else { x.max(0.0) },
        derivative: Derivative {
            steps: &[Step::Const(0.0), Step::Binary(GT, X, S(0))],
            chain: Chain::Where { cond: S(1), zero: S(0) },
        },
        interval: |lo, hi| (lo.max(0.0), hi.max(0.0)),
        folds: Fold::Never,
    },
    UnaryDef {
        op: UnaryOp::Tanh,
        name: "tanh",
        dsl: true,
        eval: f64::tanh,
        // 1 - y^2.
        derivative: scale(&[Step::Const(1.0), Step::Binary(MUL, Y, Y), Step::Binary(SUB, S(0), S(1))]),
        interval: |lo, hi| (nan_lo(lo.tanh()), nan_hi(hi.tanh())),
        folds: Fold::Always,
    },
    UnaryDef {
        op: UnaryOp::Abs,
        name: "abs",
        dsl: true,
        eval: f64::abs,
        // sign(x), 0 at 0.
        derivative: Derivative {
            steps: &[Step::Const(0.0), Step::Binary(GT, X, S(0)), Step::Binary(LT, X, S(0))],
            chain: Chain::Sign { pos: S(1), neg: S(2), zero: S(0) },
        },
        interval: |lo, hi| {
            if lo >= 0.0 {
                (lo, hi)
            } else if hi <= 0.0 {
                (-hi, -lo)
            } else {
                (0.0, nan_hi((-lo).max(hi)))
            }
        },
        folds: Fold::Always,
    },
    UnaryDef {
        op: UnaryOp::Exp2,
        name: "exp2",
        dsl: true,
        eval: f64::exp2,
        // y ln 2.
        derivative: scale(&[Step::Const(LN_2), Step::Binary(MUL, Y, S(0))]),
        interval: |lo, hi| (nan_lo(lo.exp2()), nan_hi(hi.exp2())),
        folds: Fold::Always,
    },
    UnaryDef {
        op: UnaryOp::Log2,
        name: "log2",
        dsl: true,
        eval: f64::log2,
        // 1 / (x ln 2).
        derivative: Derivative {
            steps: &[Step::Const(LN_2), Step::Binary(MUL, X, S(0))],
            chain: Chain::Divide(S(1)),
        },
        interval: |lo, hi| if lo >= 0.0 { (lo.log2(), hi.log2()) } else { FULL },
        folds: Fold::NonNegative,
    },
    UnaryDef {
        op: UnaryOp::Silu,
        name: "silu",
        dsl: true,
        eval: |x| x * sigmoid(x),
        // s (1 + x (1 - s)) with s = sigmoid(x): bounded factors, no overflow for any x.
        derivative: scale(&[
            Step::Unary(UnaryOp::Sigmoid, X),
            Step::Const(1.0),
            Step::Binary(SUB, S(1), S(0)),
            Step::Binary(MUL, X, S(2)),
            Step::Binary(ADD, S(1), S(3)),
            Step::Binary(MUL, S(0), S(4)),
        ]),
        // Falls to its minimum at SILU_ARGMIN, then rises: the maximum is at an end.
        interval: |lo, hi| {
            let end = |x: f64| if x == f64::NEG_INFINITY { 0.0 } else { x * sigmoid(x) };
            let (a, b) = (end(lo), end(hi));
            let min = if lo <= SILU_ARGMIN && SILU_ARGMIN <= hi { SILU_MIN } else { a.min(b) };
            (min, a.max(b))
        },
        folds: Fold::Always,
    },
];

/// Where `silu` is least (`1 + x (1 - sigmoid(x)) = 0`), and a value just below that least value
/// (`SILU_ARGMIN + 1`, rounded down).
const SILU_ARGMIN: f64 = -1.278464542761074;
const SILU_MIN: f64 = -0.2784645427611;

impl UnaryOp {
    /// Every unary op, in declaration order (tests and backends that enumerate them use this list).
    pub const ALL: [UnaryOp; ROWS.len()] = {
        let mut all = [UnaryOp::Neg; ROWS.len()];
        let mut k = 0;
        while k < ROWS.len() {
            all[k] = ROWS[k].op;
            k += 1;
        }
        all
    };

    /// This op's row.
    pub fn def(self) -> &'static UnaryDef {
        &ROWS[self as usize]
    }

    /// The IR mnemonic (and e-graph node name).
    pub fn name(self) -> &'static str {
        self.def().name
    }

    /// `op(x)` in f64: the definition every backend is checked against.
    pub fn eval(self, x: f64) -> f64 {
        (self.def().eval)(x)
    }

    /// The op a DSL function name calls, if it is a unary built-in.
    pub fn from_dsl(name: &str) -> Option<UnaryOp> {
        ROWS.iter().find(|r| r.dsl && r.name == name).map(|r| r.op)
    }
}

impl fmt::Display for UnaryOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for UnaryOp {
    type Err = ();
    /// By mnemonic (`neg` included), as the e-graph's patterns spell the ops.
    fn from_str(s: &str) -> Result<UnaryOp, ()> {
        ROWS.iter().find(|r| r.name == s).map(|r| r.op).ok_or(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_follow_the_declaration_order() {
        for (k, r) in ROWS.iter().enumerate() {
            assert_eq!(r.op as usize, k, "row {k} is {:?}", r.op);
            assert_eq!(r.name.parse::<UnaryOp>(), Ok(r.op));
        }
    }

    #[test]
    fn every_dsl_row_is_a_listed_function() {
        for r in ROWS.iter().filter(|r| r.dsl) {
            assert!(
                crate::lower::FUNCTIONS.contains(&r.name),
                "`{}` is missing from lower::FUNCTIONS",
                r.name
            );
        }
    }

    #[test]
    fn derivative_steps_refer_backwards() {
        for r in ROWS {
            let ok = |a: &Arg, k: usize| !matches!(a, Arg::Step(s) if *s >= k);
            for (k, s) in r.derivative.steps.iter().enumerate() {
                match s {
                    Step::Const(_) => {}
                    Step::Unary(_, a) => assert!(ok(a, k), "{}", r.name),
                    Step::Binary(_, a, b) => assert!(ok(a, k) && ok(b, k), "{}", r.name),
                }
            }
            let n = r.derivative.steps.len();
            let args = match r.derivative.chain {
                Chain::Scale(a) | Chain::Divide(a) => vec![a],
                Chain::Negate => vec![],
                Chain::Where { cond, zero } => vec![cond, zero],
                Chain::Sign { pos, neg, zero } => vec![pos, neg, zero],
            };
            assert!(args.iter().all(|a| ok(a, n)), "{}", r.name);
        }
    }
}
