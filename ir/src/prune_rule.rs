//! Pruning rules as data: a rule's threshold formula is a small expression over named
//! statistics of q and k, carried by the `threshold` op ([`PruneRule`]: name + formula).
//!
//! The table of rules (names, formulas, soundness notes) lives in `foxc_passes::rules`; this
//! module defines what a formula is, how it prints, and the one walk over it
//! ([`RuleExpr::emit`]): the interpreter evaluates a formula by walking it with f64 arithmetic
//! ([`threshold`], THE reference), the backends walk it with an emitter of Cranelift / LLVM
//! instructions. Each backend supplies only the statistics and the four arithmetic primitives;
//! the shape of the formula, including the score bound `U`, is decided here once.
//!
//! Semantics (docs/RULES.md): for query tile `m` of head `(b, h)`,
//! `delta[m] = min over rows i of tile m (i < T) of formula(i)`. Statistics that do not depend
//! on the row take the same value for every row of the tile, so a formula without row
//! statistics is one number per tile.

use crate::attention::ScoreBound;
use crate::interp::{nan_max, nan_min};
use crate::ops::NormBound;
use std::fmt;

/// A statistic a threshold formula may read. Norms are Euclidean norms of head-dim rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stat {
    /// `ln eps` (the `--log-eps` option).
    LnEps,
    /// `ln T`, T the runtime sequence length.
    LnT,
    /// `|scale|`, the factor of `q . k`.
    Scale,
    /// `|q_i|` of the row (always from the data).
    QRow,
    /// `max_i |q_i|` over the whole sequence of the head (or the static QK-norm bound).
    QMax,
    /// `max |q_i|` over the rows of the query tile (or the static bound).
    QTile,
    /// `max_j |k_j|` over the whole sequence of the (kv) head (or the static bound).
    KMax,
    /// `max |k_j|` over the keys a row of the query tile can see causally: `j <= last row of
    /// the tile` (or the static bound).
    KCausal,
    /// The diagonal logit `scale * q_i . k_i` of the row (always from the data). A rule that
    /// reads it is valid only for the identity score region (`E_ii = s_ii`).
    Sii,
    /// The threshold the user gave for the query head (`--thresholds`, Python's `thresholds=`):
    /// entry `h` of the rule's per-head table ([`PruneRule::given`]) for every batch and tile.
    /// Not derived from the data and not a bound of anything: no safety proof.
    Given,
}

impl Stat {
    pub const ALL: [Stat; 10] = [
        Stat::LnEps,
        Stat::LnT,
        Stat::Scale,
        Stat::QRow,
        Stat::QMax,
        Stat::QTile,
        Stat::KMax,
        Stat::KCausal,
        Stat::Sii,
        Stat::Given,
    ];

    /// The name formulas print.
    pub fn name(self) -> &'static str {
        match self {
            Stat::LnEps => "ln_eps",
            Stat::LnT => "ln_T",
            Stat::Scale => "scale",
            Stat::QRow => "q_i",
            Stat::QMax => "q_max",
            Stat::QTile => "q_tile",
            Stat::KMax => "k_max",
            Stat::KCausal => "k_causal",
            Stat::Sii => "s_ii",
            Stat::Given => "d_h",
        }
    }

    /// What it means, one line (for `foxc rules`).
    pub fn meaning(self) -> &'static str {
        match self {
            Stat::LnEps => "ln eps, the pruned-mass bound per row",
            Stat::LnT => "ln T, the sequence length",
            Stat::Scale => "|scale|, the factor of q.k",
            Stat::QRow => "|q_i|, the row's query norm",
            Stat::QMax => "max |q_i| over the sequence (static with QK-norm)",
            Stat::QTile => "max |q_i| over the query tile (static with QK-norm)",
            Stat::KMax => "max |k_j| over the sequence (static with QK-norm)",
            Stat::KCausal => "max |k_j| over j <= the tile's last row (static with QK-norm)",
            Stat::Sii => "s_ii = scale q_i.k_i, the diagonal logit (identity score only)",
            Stat::Given => "d_h, the threshold the user gave for query head h (--thresholds; no proof)",
        }
    }

    /// Whether the value differs between rows of one query tile.
    pub fn per_row(self) -> bool {
        matches!(self, Stat::QRow | Stat::Sii)
    }
}

/// A threshold formula.
#[derive(Clone, Debug, PartialEq)]
pub enum RuleExpr {
    Stat(Stat),
    Const(f64),
    Add(Box<RuleExpr>, Box<RuleExpr>),
    Sub(Box<RuleExpr>, Box<RuleExpr>),
    Mul(Box<RuleExpr>, Box<RuleExpr>),
    /// `U(x)`: the attention's score bound applied to `x`, a bound on `|scale q_i . k_j|`
    /// (`ScoreBound::u`; the identity score gives `x`, softcapping a constant).
    Bound(Box<RuleExpr>),
}

/// Builders, so that the rule table reads like the formulas.
pub mod build {
    use super::{RuleExpr, Stat};

    pub fn s(x: Stat) -> RuleExpr {
        RuleExpr::Stat(x)
    }
    pub fn c(x: f64) -> RuleExpr {
        RuleExpr::Const(x)
    }
    pub fn add(a: RuleExpr, b: RuleExpr) -> RuleExpr {
        RuleExpr::Add(Box::new(a), Box::new(b))
    }
    pub fn sub(a: RuleExpr, b: RuleExpr) -> RuleExpr {
        RuleExpr::Sub(Box::new(a), Box::new(b))
    }
    pub fn mul(a: RuleExpr, b: RuleExpr) -> RuleExpr {
        RuleExpr::Mul(Box::new(a), Box::new(b))
    }
    pub fn bound(a: RuleExpr) -> RuleExpr {
        RuleExpr::Bound(Box::new(a))
    }
}

/// What a backend supplies to render a formula: its statistics and four arithmetic primitives
/// ([`RuleExpr::emit`] decides everything else, the score bound included).
pub trait RuleEmitter {
    type V: Copy;
    /// The value of a statistic at the current row / tile / head.
    fn stat(&mut self, s: Stat) -> Self::V;
    fn constant(&mut self, c: f64) -> Self::V;
    fn add(&mut self, a: Self::V, b: Self::V) -> Self::V;
    fn sub(&mut self, a: Self::V, b: Self::V) -> Self::V;
    fn mul(&mut self, a: Self::V, b: Self::V) -> Self::V;
}

/// The f64 emitter: evaluation (the interpreter's arithmetic).
struct F64Eval<'a>(&'a dyn Fn(Stat) -> f64);

impl RuleEmitter for F64Eval<'_> {
    type V = f64;
    fn stat(&mut self, s: Stat) -> f64 {
        (self.0)(s)
    }
    fn constant(&mut self, c: f64) -> f64 {
        c
    }
    fn add(&mut self, a: f64, b: f64) -> f64 {
        a + b
    }
    fn sub(&mut self, a: f64, b: f64) -> f64 {
        a - b
    }
    fn mul(&mut self, a: f64, b: f64) -> f64 {
        a * b
    }
}

impl RuleExpr {
    /// Render the formula with `e`, operation by operation in a fixed order (so an f64 backend
    /// reproduces the interpreter bit for bit). `U(x)` becomes the score bound's own form:
    /// a constant for a static bound (x is not rendered), `gain * x + extra` otherwise, with the
    /// multiplication by 1 and the addition of 0 left out.
    pub fn emit<E: RuleEmitter>(&self, score: &ScoreBound, e: &mut E) -> E::V {
        match self {
            RuleExpr::Stat(s) => e.stat(*s),
            RuleExpr::Const(c) => e.constant(*c),
            RuleExpr::Add(a, b) => {
                let (a, b) = (a.emit(score, e), b.emit(score, e));
                e.add(a, b)
            }
            RuleExpr::Sub(a, b) => {
                let (a, b) = (a.emit(score, e), b.emit(score, e));
                e.sub(a, b)
            }
            RuleExpr::Mul(a, b) => {
                let (a, b) = (a.emit(score, e), b.emit(score, e));
                e.mul(a, b)
            }
            RuleExpr::Bound(a) => match *score {
                ScoreBound::Static(u) => e.constant(u),
                ScoreBound::Data { gain, extra } => {
                    let mut x = a.emit(score, e);
                    if gain != 1.0 {
                        let g = e.constant(gain);
                        x = e.mul(g, x);
                    }
                    if extra != 0.0 {
                        let c = e.constant(extra);
                        x = e.add(x, c);
                    }
                    x
                }
            },
        }
    }

    /// The value in f64, given the statistics and the score bound.
    pub fn eval(&self, stat: &dyn Fn(Stat) -> f64, score: &ScoreBound) -> f64 {
        self.emit(score, &mut F64Eval(stat))
    }

    /// Every statistic read, sorted, each once.
    pub fn stats(&self) -> Vec<Stat> {
        fn walk(e: &RuleExpr, out: &mut Vec<Stat>) {
            match e {
                RuleExpr::Stat(s) => out.push(*s),
                RuleExpr::Const(_) => {}
                RuleExpr::Add(a, b) | RuleExpr::Sub(a, b) | RuleExpr::Mul(a, b) => {
                    walk(a, out);
                    walk(b, out);
                }
                RuleExpr::Bound(a) => walk(a, out),
            }
        }
        let mut v = vec![];
        walk(self, &mut v);
        v.sort();
        v.dedup();
        v
    }

    /// The statistics a backend must compute to render the formula under `score`: those
    /// [`Self::emit`] asks for (a static score bound renders no statistic inside `U`).
    pub fn stats_under(&self, score: &ScoreBound) -> Vec<Stat> {
        struct Reads(Vec<Stat>);
        impl RuleEmitter for Reads {
            type V = ();
            fn stat(&mut self, s: Stat) {
                self.0.push(s)
            }
            fn constant(&mut self, _: f64) {}
            fn add(&mut self, _: (), _: ()) {}
            fn sub(&mut self, _: (), _: ()) {}
            fn mul(&mut self, _: (), _: ()) {}
        }
        let mut r = Reads(vec![]);
        self.emit(score, &mut r);
        r.0.sort();
        r.0.dedup();
        r.0
    }

    pub fn uses(&self, s: Stat) -> bool {
        self.stats().contains(&s)
    }

    /// Whether the formula differs between rows of a tile (then `delta` is a minimum over rows).
    pub fn per_row(&self) -> bool {
        self.stats().iter().any(|s| s.per_row())
    }

    /// Binding power for the printer: sums 1, products 2, atoms 3.
    fn power(&self) -> u8 {
        match self {
            RuleExpr::Add(..) | RuleExpr::Sub(..) => 1,
            RuleExpr::Mul(..) => 2,
            RuleExpr::Const(c) if *c < 0.0 => 1,
            _ => 3,
        }
    }

    fn fmt_in(&self, f: &mut fmt::Formatter<'_>, ctx: u8) -> fmt::Result {
        let paren = self.power() < ctx;
        if paren {
            f.write_str("(")?;
        }
        match self {
            RuleExpr::Stat(s) => f.write_str(s.name())?,
            RuleExpr::Const(c) => write!(f, "{c}")?,
            RuleExpr::Add(a, b) => {
                a.fmt_in(f, 1)?;
                f.write_str(" + ")?;
                b.fmt_in(f, 2)?;
            }
            RuleExpr::Sub(a, b) => {
                a.fmt_in(f, 1)?;
                f.write_str(" - ")?;
                b.fmt_in(f, 2)?;
            }
            RuleExpr::Mul(a, b) => {
                a.fmt_in(f, 2)?;
                f.write_str(" * ")?;
                b.fmt_in(f, 3)?;
            }
            RuleExpr::Bound(a) => {
                f.write_str("U(")?;
                a.fmt_in(f, 0)?;
                f.write_str(")")?;
            }
        }
        if paren {
            f.write_str(")")?;
        }
        Ok(())
    }
}

impl fmt::Display for RuleExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.fmt_in(f, 0)
    }
}

/// A pruning rule as the IR carries it: its name (for people) and its formula (the meaning).
#[derive(Clone, Debug, PartialEq)]
pub struct PruneRule {
    pub name: String,
    pub formula: RuleExpr,
    /// The per-head table that [`Stat::Given`] reads: entry `h` is query head `h`'s threshold
    /// (every batch, every tile). Empty for the rules of the table, which read no such thing.
    pub given: Vec<f64>,
}

/// The name of the rule of user-given per-head thresholds ([`PruneRule::given_thresholds`]).
pub const GIVEN: &str = "given";

impl PruneRule {
    /// The rule `delta[b, h, m] = d_h`: a threshold per query head, given by the user. Each
    /// value must be `<= 0` (`-inf`: never prune the head); NaN and positive values are
    /// refused. Not a safety proof (docs/RULES.md, "Given thresholds").
    pub fn given_thresholds(values: &[f64]) -> Result<PruneRule, String> {
        check_given(values)?;
        Ok(PruneRule {
            name: GIVEN.to_string(),
            formula: RuleExpr::Stat(Stat::Given),
            given: values.to_vec(),
        })
    }

    /// Whether the formula reads the per-head table.
    pub fn reads_given(&self) -> bool {
        self.formula.uses(Stat::Given)
    }

    /// Whether the rule fits a program of `heads` query heads: a rule that reads the per-head
    /// table needs one entry per head (an error naming both counts otherwise).
    pub fn check_heads(&self, heads: usize) -> Result<(), String> {
        if self.reads_given() && self.given.len() != heads {
            return Err(format!(
                "the rule `{}` gives {} per-head threshold{}, but the program has H = {heads} query head{}: give one threshold per head",
                self.name,
                self.given.len(),
                if self.given.len() == 1 { "" } else { "s" },
                if heads == 1 { "" } else { "s" },
            ));
        }
        Ok(())
    }

    /// Whether the rule is valid for an attention whose score region has bound `score`: a rule
    /// that reads `s_ii` assumes `E_ii = s_ii` (the identity region).
    pub fn fits(&self, score: &ScoreBound) -> bool {
        !self.formula.uses(Stat::Sii) || *score == ScoreBound::IDENTITY
    }

    /// Whether `delta` reads per-tile norms of the data: a `data` bound (`NormBound::Data`)
    /// and a formula that renders a norm statistic under `score`.
    pub fn reads_norms(&self, score: &ScoreBound, data_bound: bool) -> bool {
        let reads = self.formula.stats_under(score);
        data_bound && [Stat::QMax, Stat::KMax, Stat::QTile, Stat::KCausal].iter().any(|s| reads.contains(s))
    }

    /// Whether `delta` reads the tile norms and nothing of the rows ([`Stat::per_row`]): then
    /// one pass over q and k gives every statistic, and a GPU backend computes the threshold
    /// in one kernel whose last block per head evaluates the formula.
    pub fn norms_only(&self, score: &ScoreBound, data_bound: bool) -> bool {
        self.reads_norms(score, data_bound) && !self.formula.stats_under(score).iter().any(|s| s.per_row())
    }
}

/// Per-head thresholds must be `<= 0` or `-inf`, at least one.
pub fn check_given(values: &[f64]) -> Result<(), String> {
    if values.is_empty() {
        return Err("per-head thresholds: give at least one (one per query head)".into());
    }
    if let Some((h, v)) = values.iter().enumerate().find(|(_, v)| v.is_nan() || **v > 0.0) {
        return Err(format!(
            "per-head threshold {h} is {v}: a threshold must be a number <= 0, or -inf to never prune the head"
        ));
    }
    Ok(())
}

impl fmt::Display for PruneRule {
    /// `tight: min_i(ln_eps - ln_T - ...)`, the form the IR printer shows; a rule of given
    /// thresholds shows them: `given[-8, -12]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.given.is_empty() {
            let v: Vec<String> = self.given.iter().map(|x| x.to_string()).collect();
            write!(f, "{}[{}]", self.name, v.join(", "))?;
            return match self.formula {
                RuleExpr::Stat(Stat::Given) => Ok(()),
                _ => write!(f, ": {}", self.formula),
            };
        }
        if self.formula.per_row() {
            write!(f, "{}: min_i({})", self.name, self.formula)
        } else {
            write!(f, "{}: {}", self.name, self.formula)
        }
    }
}

/// The inputs of [`threshold`]: q and k as flat head-first f64 rows.
pub struct ThresholdArgs<'a> {
    pub q: &'a [f64],
    pub k: &'a [f64],
    /// Query heads `B * H` and the kv head that query head `bh` reads.
    pub heads: usize,
    pub kv_head: &'a dyn Fn(usize) -> usize,
    /// Query rows and key rows (`t <= tk`: query row `i` sits at key position `i + tk - t`,
    /// whose key is its diagonal `s_ii`).
    pub t: usize,
    pub tk: usize,
    pub d: usize,
    pub bm: usize,
    pub log_eps: f64,
    /// The signed scale (`s_ii` keeps its sign; `Stat::Scale` is its absolute value).
    pub scale: f64,
    pub bound: NormBound,
    pub score: ScoreBound,
    /// `None`: q and k are whole sequences. `Some`: they are one chunk of the rows of a longer
    /// square sequence (a context-parallel rank's), with the statistics that span it.
    pub whole: Option<Whole<'a>>,
    /// The rule's per-head table ([`PruneRule::given`]): query head `bh` reads entry
    /// `bh % given.len()`, its head `h` when the table has one entry per head (the caller
    /// checks that: [`PruneRule::check_heads`]). Empty: a [`Stat::Given`] reads NaN (every tile
    /// kept).
    pub given: &'a [f64],
}

/// A chunk's view of the square sequence it is part of ([`ThresholdArgs::whole`]).
pub struct Whole<'a> {
    /// The sequence's length (a row sees at most this many keys: `ln T`).
    pub len: usize,
    /// Per query head `bh`: `(max |q_i|, max |k_j|)` over the whole sequence and `max |k_j|`
    /// over the keys before the chunk, `[q_max, k_max, k_before]`.
    pub stats: &'a dyn Fn(usize) -> [f64; 3],
}

/// Lanes of [`row_norm`]'s partial sums.
pub const NORM_LANES: usize = 4;

/// `|x|` in f64, in the order the CPU threshold kernel reproduces bit for bit with two f64x2
/// accumulators: element `j` is added to partial sum `j % 4` (each from 0, in order of `j`), and
/// `|x| = sqrt((s0 + s1) + (s2 + s3))`. Every threshold's row norms are this one.
pub fn row_norm(x: &[f64]) -> f64 {
    let mut s = [0.0f64; NORM_LANES];
    for (j, v) in x.iter().enumerate() {
        s[j % NORM_LANES] += v * v;
    }
    ((s[0] + s[1]) + (s[2] + s[3])).sqrt()
}

/// `delta [heads, ceil(T / bm)]` of `rule` (docs/RULES.md): the reference every backend matches.
/// NaN in q or k propagates into delta (and a NaN delta keeps every tile).
pub fn threshold(rule: &RuleExpr, a: &ThresholdArgs) -> Vec<f64> {
    let (t, tk, d, bm) = (a.t, a.tk, a.d, a.bm.max(1));
    let off = tk.saturating_sub(t);
    let mt = t.div_ceil(bm);
    // A row sees at most Tk keys (the whole sequence's, for a chunk).
    let ln_t = (a.whole.as_ref().map_or(tk, |w| w.len) as f64).ln();
    let per_row = rule.per_row();
    let mut out = Vec::with_capacity(a.heads * mt);
    for bh in 0..a.heads {
        let kvh = (a.kv_head)(bh);
        let qn: Vec<f64> = (0..t).map(|i| row_norm(&a.q[(bh * t + i) * d..(bh * t + i + 1) * d])).collect();
        let kn: Vec<f64> =
            (0..tk).map(|j| row_norm(&a.k[(kvh * tk + j) * d..(kvh * tk + j + 1) * d])).collect();
        // The maxima over the sequence, and over the keys before these rows (none but a
        // chunk's).
        let [seq_q, seq_k, k_before] = match &a.whole {
            Some(w) => (w.stats)(bh),
            None => [qn.iter().copied().fold(0.0, nan_max), kn.iter().copied().fold(0.0, nan_max), 0.0],
        };
        let (q_max, k_max) = match a.bound {
            NormBound::Static { q_max, k_max } => (q_max, k_max),
            NormBound::Data => (seq_q, seq_k),
        };
        for m in 0..mt {
            let (lo, hi) = (m * bm, (m * bm + bm).min(t));
            let (q_tile, k_causal) = match a.bound {
                NormBound::Static { q_max, k_max } => (q_max, k_max),
                NormBound::Data => (
                    qn[lo..hi].iter().copied().fold(0.0, nan_max),
                    kn[..(hi + off).min(tk)].iter().copied().fold(k_before, nan_max),
                ),
            };
            let qn = &qn;
            let at = |i: usize| {
                move |s: Stat| match s {
                    Stat::LnEps => a.log_eps,
                    Stat::LnT => ln_t,
                    Stat::Scale => a.scale.abs(),
                    Stat::QRow => qn[i],
                    Stat::QMax => q_max,
                    Stat::QTile => q_tile,
                    Stat::KMax => k_max,
                    Stat::KCausal => k_causal,
                    Stat::Sii => {
                        let qi = &a.q[(bh * t + i) * d..(bh * t + i + 1) * d];
                        let p = kvh * tk + i + off;
                        let ki = &a.k[p * d..(p + 1) * d];
                        a.scale * qi.iter().zip(ki).map(|(x, y)| x * y).sum::<f64>()
                    }
                    Stat::Given => a.given.get(bh % a.given.len().max(1)).copied().unwrap_or(f64::NAN),
                }
            };
            let delta = if per_row {
                (lo..hi).map(|i| rule.eval(&at(i), &a.score)).fold(f64::INFINITY, nan_min)
            } else {
                rule.eval(&at(lo), &a.score)
            };
            out.push(delta);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::build::*;
    use super::*;

    #[test]
    fn prints_with_the_fewest_parentheses() {
        let e =
            sub(sub(s(Stat::LnEps), s(Stat::LnT)), mul(c(2.0), bound(mul(s(Stat::Scale), s(Stat::QMax)))));
        assert_eq!(e.to_string(), "ln_eps - ln_T - 2 * U(scale * q_max)");
        let e = sub(s(Stat::LnEps), sub(s(Stat::LnT), s(Stat::Sii)));
        assert_eq!(e.to_string(), "ln_eps - (ln_T - s_ii)");
        let r = PruneRule { name: "x".into(), formula: add(s(Stat::Sii), c(-1.0)), given: vec![] };
        assert_eq!(r.to_string(), "x: min_i(s_ii + (-1))");
    }

    #[test]
    fn given_thresholds_print_check_and_evaluate() {
        let r = PruneRule::given_thresholds(&[-8.0, -12.5, f64::NEG_INFINITY]).unwrap();
        assert_eq!(r.to_string(), "given[-8, -12.5, -inf]");
        assert_eq!(r.formula.to_string(), "d_h");
        assert!(!r.formula.per_row());
        assert!(r.check_heads(3).is_ok());
        let e = r.check_heads(4).unwrap_err();
        assert!(e.contains("3 per-head thresholds") && e.contains("H = 4"), "{e}");
        assert!(PruneRule::given_thresholds(&[]).is_err());
        for bad in [f64::NAN, 0.5, f64::INFINITY] {
            let e = PruneRule::given_thresholds(&[-1.0, bad]).unwrap_err();
            assert!(e.contains("threshold 1 is") && e.contains("<= 0"), "{e}");
        }
        assert!(PruneRule::given_thresholds(&[0.0, -0.0]).is_ok());
        // delta[b, h, m] = d_h: B = 2, H = 3, two tiles per head; the data do not matter.
        let (t, d) = (4, 2);
        let q: Vec<f64> = (0..2 * 3 * t * d).map(|x| x as f64 * 0.01).collect();
        let args = ThresholdArgs {
            q: &q,
            k: &q,
            heads: 6,
            kv_head: &|bh| bh,
            t,
            tk: t,
            d,
            bm: 2,
            log_eps: -10.0,
            scale: 0.5,
            bound: NormBound::Data,
            score: ScoreBound::IDENTITY,
            whole: None,
            given: &r.given,
        };
        let delta = threshold(&r.formula, &args);
        let inf = f64::NEG_INFINITY;
        assert_eq!(delta, [-8.0, -8.0, -12.5, -12.5, inf, inf, -8.0, -8.0, -12.5, -12.5, inf, inf]);
    }

    #[test]
    fn evaluates_and_lists_statistics() {
        let e = sub(s(Stat::LnEps), mul(c(2.0), bound(s(Stat::KMax))));
        let st = |s| if s == Stat::LnEps { -10.0 } else { 3.0 };
        assert_eq!(e.eval(&st, &ScoreBound::Data { gain: 1.0, extra: 1.0 }), -18.0);
        assert_eq!(e.eval(&st, &ScoreBound::Data { gain: 2.0, extra: 0.0 }), -22.0);
        assert_eq!(e.eval(&st, &ScoreBound::Static(5.0)), -20.0);
        assert_eq!(e.stats(), vec![Stat::LnEps, Stat::KMax]);
        assert_eq!(e.stats_under(&ScoreBound::IDENTITY), vec![Stat::LnEps, Stat::KMax]);
        assert_eq!(e.stats_under(&ScoreBound::Static(1.0)), vec![Stat::LnEps]);
        assert!(!e.per_row());
        assert!(add(e, s(Stat::QRow)).per_row());
    }
}
