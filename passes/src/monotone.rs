//! Monotonicity analysis: is the log-decay cumsum `c` of an `attention` non-increasing?
//!
//! Only then is the bias `c_i - c_j <= 0` for `j <= i` and falls with distance, which is what
//! the ACP block rule relies on. The proof uses the interval part of the e-graph analysis
//! ([`crate::lang::AttnAnalysis`]) on the gate term after saturation with the spelling rules:
//! - `gate_cumsum {Logits}`: `logsigmoid(z) <= 0` always;
//! - `gate_cumsum {LogGate}` of `x`: needs `hi(x) <= 0` (logsigmoid, log of a value in (0, 1],
//!   `-softplus`, `-relu`, `-exp`, `min(x, 0)`, a parameter declared `in [lo, hi]` with
//!   `hi <= 0`, ...);
//! - `gate_cumsum {Slope}` of `m`: needs `lo(m) >= 0` (ALiBi: `-m (i - j)` with `m >= 0`);
//! - a parameter declared `nonincreasing along` its key axis (the decay cumsum a KV cache
//!   keeps, read in place or through a copy that keeps its axes): the declaration, which the
//!   driver checks on host inputs;
//! - a sum of such terms stored as `c` (a cache's declared `c` beside an ALiBi ramp: each term
//!   never grows along the key axis);
//! - any other `c`: not proven.

use crate::lang::AttnGraph;
use crate::recognize::Builder;
use crate::{PassContext, PassError, PassOptions};
use foxc_ir::{Attention, BinaryOp, GateKind, Graph, Op, Span, UnaryOp, ValueId};

/// What the analysis concluded for one attention node.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// `c` is non-increasing; the string says why (for tests and `--explain`).
    Decay(String),
    /// No decay bias: plain causal (or windowed) attention.
    NoDecay,
    /// Not proven: why, and where.
    Unproven(String, Span),
}

/// Interval `(lo, hi)` of the positional value `n` (named axes are irrelevant for bounds).
pub(crate) fn interval(g: &Graph, n: ValueId) -> Option<(f64, f64)> {
    let mut b = Builder::new(g);
    let axes: Vec<String> = (0..g.ty(n).rank()).map(|k| format!("x{k}")).collect();
    let id = b.positional(n, &axes, g.node(n).span).ok()?;
    let eg: AttnGraph = std::mem::take(&mut b.eg);
    let runner = crate::lang::runner(8, 10_000).with_egraph(eg).run(&crate::lang::rules());
    let d = &runner.egraph[runner.egraph.find(id)].data;
    Some((d.lo, d.hi))
}

/// The source span that best shows the gate term of `n`.
/// `c` is the `gate_cumsum` reading it: a bare parameter is shown where the cumsum reads it.
fn gate_span(g: &Graph, n: ValueId, c: ValueId) -> Span {
    match g.op(n) {
        Op::Store { .. } => g.node(g.operands(n)[0]).span,
        Op::Param { .. } => g.node(c).span,
        _ => g.node(n).span,
    }
}

fn fmt_iv((lo, hi): (f64, f64)) -> String {
    format!("[{lo}, {hi}]")
}

/// The verdict for the `c` operand of an attention node.
pub fn verdict(g: &Graph, attn: ValueId) -> Verdict {
    let c = match g.op(attn) {
        Op::Attention(_) => match Attention::operands(g, attn) {
            Ok(o) => o.decay,
            Err(e) => return Verdict::Unproven(e, g.node(attn).span),
        },
        _ => return Verdict::Unproven("not an attention node".into(), g.node(attn).span),
    };
    let Some(c) = c else { return Verdict::NoDecay };
    if let Some(name) = declared_nonincreasing(g, c) {
        return Verdict::Decay(format!("`{name}` is declared nonincreasing along its key axis"));
    }
    match g.op(c) {
        Op::GateCumsum { kind: GateKind::Logits, .. } => Verdict::Decay("log f = logsigmoid(z) <= 0".into()),
        Op::GateCumsum { kind: GateKind::LogGate, .. } => {
            let x = g.operands(c)[0];
            match interval(g, x) {
                Some((lo, hi)) if hi <= 0.0 => Verdict::Decay(format!("log f in {} <= 0", fmt_iv((lo, hi)))),
                Some(iv) => Verdict::Unproven(
                    format!(
                        "cannot prove the log forget gate is <= 0 (it is only known to lie in {}): \
                         the decay bias c[i] - c[j] may grow with distance",
                        fmt_iv(iv)
                    ),
                    gate_span(g, x, c),
                ),
                None => Verdict::Unproven("the log forget gate is not analyzable".into(), gate_span(g, x, c)),
            }
        }
        Op::GateCumsum { kind: GateKind::Slope, .. } => {
            let m = g.operands(c)[0];
            match interval(g, m) {
                Some((lo, hi)) if lo >= 0.0 => {
                    Verdict::Decay(format!("ALiBi slope in {} >= 0", fmt_iv((lo, hi))))
                }
                Some(iv) => Verdict::Unproven(
                    format!(
                        "cannot prove the ALiBi slope is >= 0 (it is only known to lie in {}): \
                         the bias -slope * (i - j) may grow with distance",
                        fmt_iv(iv)
                    ),
                    gate_span(g, m, c),
                ),
                None => Verdict::Unproven("the ALiBi slope is not analyzable".into(), gate_span(g, m, c)),
            }
        }
        _ if stored_falls(g, c) => {
            Verdict::Decay("a sum of terms that each never grow along the key axis".into())
        }
        _ => Verdict::Unproven(
            "the decay bias c[i] - c[j] is not a cumsum of log forget gates nor an ALiBi ramp, \
             so it cannot be proven to fall with distance"
                .into(),
            gate_span(g, c, c),
        ),
    }
}

/// How a value moves along one named axis.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Along {
    /// It does not read the axis.
    Constant,
    /// It never grows along it.
    Falls,
    /// It never falls along it.
    Rises,
}

impl Along {
    fn flip(self) -> Along {
        match self {
            Along::Falls => Along::Rises,
            Along::Rises => Along::Falls,
            Along::Constant => Along::Constant,
        }
    }
    /// The direction of a sum of two terms, where one is known.
    fn add(self, o: Along) -> Option<Along> {
        match (self, o) {
            (Along::Constant, x) | (x, Along::Constant) => Some(x),
            (x, y) if x == y => Some(x),
            _ => None,
        }
    }
}

/// Whether `c`, a stored `[B, H, Tk]` decay (`store [b, h, t] e`), never grows along its key
/// axis `t`: `e` a sum of terms each of which never grows along `t`, as a cache's `c` declared
/// nonincreasing beside an ALiBi ramp `-m[h] * t` with `m >= 0`, which the recognizer stores as
/// one sum (`c[b, h, t] - m[h] * t`). The float arithmetic of the sum is monotone too (rounding
/// never reverses the order of two sums of ordered terms).
fn stored_falls(g: &Graph, c: ValueId) -> bool {
    let Op::Store { axes } = g.op(c) else { return false };
    let Some(key) = axes.last() else { return false };
    along(g, g.operands(c)[0], key) == Some(Along::Falls)
}

/// How node `n` moves along axis `axis`, where the form proves it: binds of a parameter
/// declared nonincreasing along the axis it binds `axis` to, the axis's iota (rising), sums,
/// differences, negations, and products with a factor of known sign that does not read the
/// axis; any value without the axis is constant.
fn along(g: &Graph, n: ValueId, axis: &str) -> Option<Along> {
    if g.ty(n).axis(axis).is_none() {
        return Some(Along::Constant);
    }
    let ops = g.operands(n);
    match g.op(n) {
        Op::Iota { axis: a } if a == axis => Some(Along::Rises),
        Op::Bind { axes } => {
            let p = g.params.iter().find(|p| p.node == ops[0])?;
            let declared = p.nonincreasing?;
            (axes.get(declared).map(|a| a.as_str()) == Some(axis)).then_some(Along::Falls)
        }
        Op::Unary(UnaryOp::Neg) => along(g, ops[0], axis).map(Along::flip),
        Op::Binary(BinaryOp::Add) => along(g, ops[0], axis)?.add(along(g, ops[1], axis)?),
        Op::Binary(BinaryOp::Sub) => along(g, ops[0], axis)?.add(along(g, ops[1], axis)?.flip()),
        Op::Binary(BinaryOp::Mul) => {
            // A factor without the axis, of one sign, times a term that moves one way.
            let (x, y) = (ops[0], ops[1]);
            let (k, t) = if g.ty(x).axis(axis).is_none() { (x, y) } else { (y, x) };
            if g.ty(k).axis(axis).is_some() {
                return None;
            }
            // (A bind only names the axes of its operand: the operand's interval.)
            let k = match g.op(k) {
                Op::Bind { .. } => g.operands(k)[0],
                _ => k,
            };
            let (lo, hi) = interval(g, k)?;
            let d = along(g, t, axis)?;
            if lo >= 0.0 {
                Some(d)
            } else if hi <= 0.0 {
                Some(d.flip())
            } else {
                None
            }
        }
        _ => None,
    }
}

/// The parameter `c` is, or copies with its axes kept (`store [a..] (bind [a..] p)`), when that
/// parameter is declared nonincreasing along its last axis (the decay's key axis).
fn declared_nonincreasing(g: &Graph, c: ValueId) -> Option<String> {
    let mut n = c;
    if let Op::Store { axes: stored } = g.op(n) {
        let b = g.operands(n)[0];
        match g.op(b) {
            Op::Bind { axes: bound } if bound == stored => n = g.operands(b)[0],
            _ => return None,
        }
    }
    let p = g.params.iter().find(|p| p.node == n)?;
    (p.nonincreasing? + 1 == p.ty.rank()).then(|| p.name.clone())
}

/// The monotonicity pass: a verdict for every `attention` node.
pub fn run(g: &mut Graph, _opts: &PassOptions, cx: &mut PassContext) -> Result<(), PassError> {
    for n in g.find(|op| matches!(op, Op::Attention(_))) {
        let v = verdict(g, n);
        if let Verdict::Unproven(msg, span) = &v {
            cx.explain(
                format!("not pruned: {msg}"),
                *span,
                Some(
                    "write the gate as logsigmoid(z), -softplus(z), min(x, 0), ..., or declare the parameter's range, \
                     e.g. `logf: f32[B, H, T] in [-inf, 0]`"
                        .into(),
                ),
            );
        }
        cx.verdicts.insert(n, v);
    }
    Ok(())
}
