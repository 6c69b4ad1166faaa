//! Provably safe KV eviction: ACP's tile rule turned into a statement about every later query
//! of a decode (docs/RULES.md, "Eviction").
//!
//! A decode appends one key per step, and the query of step `p'` reads the keys `0..=p'`.
//! ACP skips key tile `n` of a query at key position `p` when `c[p] - c[end(n)] < delta`
//! (`c` the decay cumsum along the keys, `end(n)` the tile's last key). Two facts make that
//! skip permanent:
//!
//! 1. `c` is non-increasing along the keys (every gate in `(0, 1]`: `log f <= 0`; the
//!    recognizer proves it of every pruned program), so a later query `p' > p` has
//!    `c[p'] - c[end(n)] <= c[p] - c[end(n)]`: the tile's decay only grows.
//! 2. `delta` is a formula over statistics of q and k ([`crate::prune_rule`]). If every later
//!    query and key lies within a [`Horizon`] (at most `max_keys` keys per row, `|q| <= q_norm`,
//!    `|k| <= k_norm`), the formula evaluated at the horizon's worst corner (largest `ln T` and
//!    norms, smallest diagonal logit) is a lower bound of every later row's own `delta`,
//!    provided the formula is non-increasing in `ln T` and the norms and non-decreasing in
//!    `s_ii`. [`threshold`] checks that monotonicity on the formula itself, so a new rule in the
//!    table cannot make eviction silently unsafe.
//!
//! Together: a tile skipped under the horizon's threshold at the latest key position is skipped
//! by every later query's own rule, so its total softmax weight in every later row is below
//! `eps` (the rule's guarantee), and dropping it from the cache changes no later output by more
//! than ACP already allows. [`first_kept_block`] applies the boundary rule of the interpreter
//! ([`crate::interp::attention::block_start`]) at that position.

use crate::attention::ScoreBound;
use crate::interp::attention::block_start;
use crate::prune_rule::{RuleExpr, Stat};

/// What every later query of the decode stays within: the premises of [`threshold`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Horizon {
    /// The most keys any later row reads (the longest sequence the decode may reach).
    pub max_keys: usize,
    /// A bound on `|q_i|` of every later query row (after any normalization the score applies).
    pub q_norm: f64,
    /// A bound on `|k_j|` of every key, the cached ones and those still to come.
    pub k_norm: f64,
}

/// How a formula moves when one statistic grows (weakly; `Const` is both ways).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dir {
    Const,
    Up,
    Down,
    Unknown,
}

impl Dir {
    fn flip(self) -> Dir {
        match self {
            Dir::Up => Dir::Down,
            Dir::Down => Dir::Up,
            d => d,
        }
    }

    fn join(self, o: Dir) -> Dir {
        match (self, o) {
            (Dir::Const, d) | (d, Dir::Const) => d,
            (a, b) if a == b => a,
            _ => Dir::Unknown,
        }
    }
}

/// The sign of a formula's value over the whole box of statistics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sign {
    NonNeg,
    NonPos,
    Unknown,
}

impl Sign {
    fn of(x: f64) -> Sign {
        if x >= 0.0 {
            Sign::NonNeg
        } else if x <= 0.0 {
            Sign::NonPos
        } else {
            Sign::Unknown
        }
    }

    fn neg(self) -> Sign {
        match self {
            Sign::NonNeg => Sign::NonPos,
            Sign::NonPos => Sign::NonNeg,
            Sign::Unknown => Sign::Unknown,
        }
    }

    fn add(self, o: Sign) -> Sign {
        if self == o {
            self
        } else {
            Sign::Unknown
        }
    }

    fn mul(self, o: Sign) -> Sign {
        match (self, o) {
            (Sign::Unknown, _) | (_, Sign::Unknown) => Sign::Unknown,
            (a, b) if a == b => Sign::NonNeg,
            _ => Sign::NonPos,
        }
    }
}

/// The statistics' own signs: lengths, scales and norms are never negative.
fn stat_sign(s: Stat) -> Sign {
    match s {
        Stat::LnEps | Stat::Sii => Sign::Unknown,
        // <= 0 (`PruneRule::given_thresholds` refuses others).
        Stat::Given => Sign::NonPos,
        Stat::LnT | Stat::Scale | Stat::QRow | Stat::QMax | Stat::QTile | Stat::KMax | Stat::KCausal => {
            Sign::NonNeg
        }
    }
}

fn sign(e: &RuleExpr, score: &ScoreBound) -> Sign {
    match e {
        RuleExpr::Stat(s) => stat_sign(*s),
        RuleExpr::Const(c) => Sign::of(*c),
        RuleExpr::Add(a, b) => sign(a, score).add(sign(b, score)),
        RuleExpr::Sub(a, b) => sign(a, score).add(sign(b, score).neg()),
        RuleExpr::Mul(a, b) => sign(a, score).mul(sign(b, score)),
        RuleExpr::Bound(x) => match *score {
            ScoreBound::Static(u) => Sign::of(u),
            ScoreBound::Data { gain, extra } => Sign::of(gain).mul(sign(x, score)).add(Sign::of(extra)),
        },
    }
}

/// How `e` moves when statistic `s` grows, the others held.
fn dir(e: &RuleExpr, s: Stat, score: &ScoreBound) -> Dir {
    match e {
        RuleExpr::Stat(x) if *x == s => Dir::Up,
        RuleExpr::Stat(_) | RuleExpr::Const(_) => Dir::Const,
        RuleExpr::Add(a, b) => dir(a, s, score).join(dir(b, s, score)),
        RuleExpr::Sub(a, b) => dir(a, s, score).join(dir(b, s, score).flip()),
        RuleExpr::Mul(a, b) => {
            let (da, db) = (dir(a, s, score), dir(b, s, score));
            let by_sign = |d: Dir, other: Sign| match other {
                Sign::NonNeg => d,
                Sign::NonPos => d.flip(),
                Sign::Unknown => Dir::Unknown,
            };
            match (da, db) {
                (Dir::Const, d) => by_sign(d, sign(a, score)),
                (d, Dir::Const) => by_sign(d, sign(b, score)),
                // Both factors move: a product of non-negative factors moving alike moves so too.
                (x, y) if x == y && sign(a, score) == Sign::NonNeg && sign(b, score) == Sign::NonNeg => x,
                _ => Dir::Unknown,
            }
        }
        RuleExpr::Bound(x) => match *score {
            ScoreBound::Static(_) => Dir::Const,
            ScoreBound::Data { gain, .. } => match Sign::of(gain) {
                Sign::NonNeg => dir(x, s, score),
                Sign::NonPos => dir(x, s, score).flip(),
                Sign::Unknown => Dir::Unknown,
            },
        },
    }
}

/// The direction the formula must not move in as each varying statistic grows, and the
/// statistic's worst value under a horizon: the sequence length and the norms only grow the
/// bound on a later row's logits, the diagonal logit only shrinks it.
fn worst(s: Stat, h: &Horizon, scale: f64, score: &ScoreBound) -> Option<(f64, Dir)> {
    let (q, k) = (h.q_norm, h.k_norm);
    match s {
        Stat::LnEps | Stat::Scale | Stat::Given => None,
        Stat::LnT => Some(((h.max_keys as f64).ln(), Dir::Up)),
        Stat::QRow | Stat::QMax | Stat::QTile => Some((q, Dir::Up)),
        Stat::KMax | Stat::KCausal => Some((k, Dir::Up)),
        // `s_ii = scale q_i . k_i >= -|scale| |q_i| |k_i|`; a rule reading it fits the identity
        // score only (`PruneRule::fits`), whose bound `U(x) = x` is that product.
        Stat::Sii => Some((-score.u(scale.abs() * q * k), Dir::Down)),
    }
}

/// Eviction's refusal of thresholds given per head by the user ([`Stat::Given`]): a constant
/// threshold would be monotone in time, but it bounds no weight, so eviction's guarantee
/// (every dropped key below `eps / max_keys` in every later row) has no premise.
pub fn refuses_given(rule: &RuleExpr) -> Result<(), String> {
    if rule.uses(Stat::Given) {
        return Err(format!(
            "the rule `{rule}` reads thresholds given per head by the user, which bound no attention weight: eviction drops keys only under a proven rule (load without thresholds=, or evict=False)"
        ));
    }
    Ok(())
}

/// The threshold that every later query's own threshold is at least, under `horizon`: `rule`
/// evaluated at the horizon's worst statistics. An error when the formula is not monotone in a
/// statistic it reads (then no corner of the horizon bounds it) or the horizon is not finite.
pub fn threshold(
    rule: &RuleExpr,
    score: &ScoreBound,
    log_eps: f64,
    scale: f64,
    horizon: &Horizon,
) -> Result<f64, String> {
    let Horizon { max_keys, q_norm, k_norm } = *horizon;
    refuses_given(rule)?;
    if max_keys == 0 || !(q_norm.is_finite() && q_norm >= 0.0 && k_norm.is_finite() && k_norm >= 0.0) {
        return Err(format!(
            "eviction needs max_keys >= 1 and finite norm bounds >= 0 (got max_keys {max_keys}, |q| <= {q_norm}, |k| <= {k_norm})"
        ));
    }
    for s in rule.stats_under(score) {
        let Some((_, grows_bound)) = worst(s, horizon, scale, score) else { continue };
        let d = dir(rule, s, score);
        if d != Dir::Const && d != grows_bound.flip() {
            return Err(format!(
                "the rule `{rule}` is not provably {} in {}: no bound on later queries' thresholds, so no key can be evicted",
                if grows_bound == Dir::Up { "non-increasing" } else { "non-decreasing" },
                s.name()
            ));
        }
    }
    let at = |s: Stat| match s {
        Stat::LnEps => log_eps,
        Stat::Scale => scale.abs(),
        Stat::Given => f64::NAN,
        other => worst(other, horizon, scale, score).expect("every varying statistic has a worst value").0,
    };
    Ok(rule.eval(&at, score))
}

/// The first key block of `bn` keys that a head must keep: every block before it is skipped by
/// every later query whose threshold is at least `delta` (from [`threshold`]). `c` is the decay
/// cumsum of the head's cached keys, in order; the block of the last key is always kept (the
/// latest query reads it undecayed), and a NaN keeps everything from its block on.
pub fn first_kept_block(c: &[f64], delta: f64, bn: usize) -> usize {
    match c.len() {
        0 => 0,
        l => block_start(c, delta, l - 1, bn.max(1)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prune_rule::build::*;

    const H: Horizon = Horizon { max_keys: 1024, q_norm: 4.0, k_norm: 3.0 };

    fn paper() -> RuleExpr {
        sub(
            sub(s(Stat::LnEps), s(Stat::LnT)),
            mul(c(2.0), bound(mul(s(Stat::Scale), mul(s(Stat::QMax), s(Stat::KMax))))),
        )
    }

    #[test]
    fn the_paper_rule_at_the_horizon() {
        let d = threshold(&paper(), &ScoreBound::IDENTITY, -10.0, -0.5, &H).unwrap();
        assert_eq!(d, -10.0 - 1024f64.ln() - 2.0 * (0.5 * 12.0));
    }

    #[test]
    fn the_diagonal_logit_takes_its_lowest_value() {
        let tight =
            add(sub(s(Stat::LnEps), mul(s(Stat::Scale), mul(s(Stat::QRow), s(Stat::KMax)))), s(Stat::Sii));
        let d = threshold(&tight, &ScoreBound::IDENTITY, -10.0, 0.5, &H).unwrap();
        assert_eq!(d, -10.0 - 6.0 - 6.0);
    }

    #[test]
    fn a_formula_that_grows_with_a_norm_is_refused() {
        let e = add(s(Stat::LnEps), s(Stat::KMax));
        let err = threshold(&e, &ScoreBound::IDENTITY, -10.0, 1.0, &H).unwrap_err();
        assert!(err.contains("non-increasing in k_max"), "{err}");
        // A product with a factor of unknown sign: no direction either.
        let e = sub(s(Stat::LnEps), mul(s(Stat::Sii), s(Stat::QRow)));
        assert!(threshold(&e, &ScoreBound::IDENTITY, -10.0, 1.0, &H).is_err());
        let e = sub(s(Stat::LnEps), s(Stat::Sii));
        assert!(threshold(&e, &ScoreBound::IDENTITY, -10.0, 1.0, &H)
            .unwrap_err()
            .contains("non-decreasing in s_ii"));
    }

    #[test]
    fn given_thresholds_are_refused() {
        let err = threshold(&s(Stat::Given), &ScoreBound::IDENTITY, -10.0, 1.0, &H).unwrap_err();
        assert!(err.contains("given per head by the user"), "{err}");
        let e = add(paper(), s(Stat::Given));
        assert!(threshold(&e, &ScoreBound::IDENTITY, -10.0, 1.0, &H).is_err());
    }

    #[test]
    fn a_static_score_bound_reads_no_norm() {
        let d = threshold(&paper(), &ScoreBound::Static(30.0), -10.0, 1.0, &H).unwrap();
        assert_eq!(d, -10.0 - 1024f64.ln() - 60.0);
    }

    #[test]
    fn a_horizon_without_bounds_is_refused() {
        let h = Horizon { q_norm: f64::INFINITY, ..H };
        assert!(threshold(&paper(), &ScoreBound::IDENTITY, -10.0, 1.0, &h).is_err());
        assert!(
            threshold(&paper(), &ScoreBound::IDENTITY, -10.0, 1.0, &Horizon { max_keys: 0, ..H }).is_err()
        );
    }

    #[test]
    fn the_last_block_is_kept() {
        // A steep decay: every earlier block is skipped, never the latest key's.
        let c: Vec<f64> = (0..10).map(|t| -100.0 * t as f64).collect();
        assert_eq!(first_kept_block(&c, -50.0, 4), 2);
        assert_eq!(first_kept_block(&c, -1e9, 4), 0);
        assert_eq!(first_kept_block(&c[..1], -50.0, 4), 0);
        assert_eq!(first_kept_block(&[], -50.0, 4), 0);
        let mut nan = c.clone();
        nan[3] = f64::NAN;
        assert_eq!(first_kept_block(&nan, -50.0, 4), 0);
    }
}
