//! The pruning rules: one table, each rule a name, a threshold formula over named statistics
//! (`foxc_ir::prune_rule`), and the argument that it is safe (docs/RULES.md has the full proofs).
//!
//! Every rule guarantees the same thing: with `delta[m]` from the formula, a key tile `n` of
//! query tile `m` with `c[i0] - c[jend(n)] < delta[m]` holds entries whose total softmax weight
//! in any row of the tile is below `eps` (at most `T` entries per row are pruned, each with
//! weight below `eps / T`). `foxc rules` prints this table and `--prune-rule NAME` picks an
//! entry; the `threshold` op carries the rule, and the interpreter and both backends render its
//! formula through `RuleExpr::emit` (docs/RULES.md, "How a formula runs").

use foxc_ir::prune_rule::build::*;
use foxc_ir::prune_rule::{PruneRule, RuleExpr, Stat};

/// One entry of the table.
pub struct RuleDef {
    pub name: &'static str,
    /// A one-line summary.
    pub summary: &'static str,
    /// Why it is safe, one paragraph (the long form is in docs/RULES.md).
    pub soundness: &'static str,
    pub formula: fn() -> RuleExpr,
}

impl RuleDef {
    /// The rule as the IR carries it.
    pub fn rule(&self) -> PruneRule {
        PruneRule { name: self.name.to_string(), formula: (self.formula)(), given: vec![] }
    }
}

/// `ln eps - ln T`: the share of eps each of at most T pruned entries may take.
fn budget() -> RuleExpr {
    sub(s(Stat::LnEps), s(Stat::LnT))
}

fn paper() -> RuleExpr {
    sub(budget(), mul(c(2.0), bound(mul(s(Stat::Scale), mul(s(Stat::QMax), s(Stat::KMax))))))
}

fn tight() -> RuleExpr {
    add(sub(budget(), mul(s(Stat::Scale), mul(s(Stat::QRow), s(Stat::KMax)))), s(Stat::Sii))
}

fn local() -> RuleExpr {
    sub(budget(), mul(c(2.0), bound(mul(s(Stat::Scale), mul(s(Stat::QTile), s(Stat::KCausal))))))
}

fn tight_causal() -> RuleExpr {
    add(sub(budget(), mul(s(Stat::Scale), mul(s(Stat::QRow), s(Stat::KCausal)))), s(Stat::Sii))
}

/// The table. The first entry is the default (`--prune-rule` not given).
pub const RULES: &[RuleDef] = &[
    RuleDef {
        name: "paper",
        summary: "the published rule: one threshold per head from the global norm bound",
        soundness: "U(scale q_max k_max) bounds |E_ij - D_ij| for every entry, so the row's \
            denominator is at least exp(E_ii) >= exp(-U) (D_ii = 0) and a pruned entry has weight \
            below exp(U + D_ij + U) < exp(delta + 2U) = eps / T; at most T entries of a row are \
            pruned.",
        formula: paper,
    },
    RuleDef {
        name: "tight",
        summary: "the row's own diagonal logit as the denominator bound (identity score only)",
        soundness: "The denominator of row i is at least exp(s_ii) (D_ii = 0); a pruned entry has \
            s_ij <= scale |q_i| k_max + D_ij by Cauchy-Schwarz, so its weight is below \
            exp(scale |q_i| k_max + D_ij - s_ii) < eps / T for every row of the tile, because delta \
            is the minimum of the formula over the tile's rows.",
        formula: tight,
    },
    RuleDef {
        name: "local",
        summary: "the paper's rule with norms local to the query tile: max |q| over the tile, \
            max |k| over the keys it can see",
        soundness: "A row i of query tile m sees only keys j <= i <= last(m), and both i and j lie \
            in [0, last(m)]: |scale q_i . k_j| <= scale q_tile k_causal, so U(scale q_tile k_causal) \
            bounds every entry the row reads, including j = i. The paper's argument then holds \
            tile by tile: denominator >= exp(-U_m), pruned weight < exp(delta + 2 U_m) = eps / T. \
            Never looser than paper (q_tile <= q_max, k_causal <= k_max).",
        formula: local,
    },
    RuleDef {
        name: "tight-causal",
        summary: "tight with max |k| over the keys the tile can see instead of the whole sequence",
        soundness: "As tight: row i reads keys j <= i <= last(m), so |k_j| <= k_causal and \
            s_ij <= scale |q_i| k_causal + D_ij; the denominator is at least exp(s_ii). Never \
            looser than tight (k_causal <= k_max).",
        formula: tight_causal,
    },
];

/// What `foxc rules` says of the user's thresholds (`PruneRule::given_thresholds`: not an
/// entry of the table, which holds the rules with a safety argument; listed after it).
pub const GIVEN_SUMMARY: &str = "the user's choice: delta[b, h, m] = d_h, one number <= 0 per query head \
    (--thresholds d0,d1,...; -inf never prunes the head)";
/// Why it is not safe (docs/RULES.md, "Given thresholds").
pub const GIVEN_NOTE: &str = "nothing bounds the pruned weight. A tile is skipped \
    when its largest decay c[i0] - c[jend(n)] is below d_h, whatever q and k are; the run is \
    deterministic and the diagonal tile is still never skipped, but the pruned mass per row is \
    whatever the data make it (--check reports it).";

/// The default rule (the paper's).
pub fn default_rule() -> PruneRule {
    RULES[0].rule()
}

/// The rule named `name`, or an error listing the names.
pub fn by_name(name: &str) -> Result<PruneRule, String> {
    RULES.iter().find(|r| r.name == name).map(RuleDef::rule).ok_or_else(|| {
        let names: Vec<&str> = RULES.iter().map(|r| r.name).collect();
        format!("unknown pruning rule `{name}`; the rules are: {}", names.join(", "))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_found() {
        for (k, r) in RULES.iter().enumerate() {
            assert!(RULES[k + 1..].iter().all(|o| o.name != r.name), "{} twice", r.name);
            assert_eq!(by_name(r.name).unwrap().formula, (r.formula)());
        }
        assert!(by_name("nope").unwrap_err().contains("paper, tight"));
    }

    #[test]
    fn the_formulas_read_as_documented() {
        assert_eq!(
            by_name("paper").unwrap().to_string(),
            "paper: ln_eps - ln_T - 2 * U(scale * (q_max * k_max))"
        );
        assert_eq!(
            by_name("tight").unwrap().to_string(),
            "tight: min_i(ln_eps - ln_T - scale * (q_i * k_max) + s_ii)"
        );
    }

    /// Every rule bounds later queries' thresholds (`foxc_ir::evict`): its formula is monotone
    /// in each statistic, under every kind of score bound it fits.
    #[test]
    fn every_rule_can_evict() {
        use foxc_ir::attention::ScoreBound;
        use foxc_ir::evict::{threshold, Horizon};
        let h = Horizon { max_keys: 4096, q_norm: 8.0, k_norm: 8.0 };
        let scores =
            [ScoreBound::IDENTITY, ScoreBound::Data { gain: 2.0, extra: 1.5 }, ScoreBound::Static(30.0)];
        for r in RULES {
            for score in scores.iter().filter(|s| r.rule().fits(s)) {
                let d = threshold(&(r.formula)(), score, -10.0, 0.125, &h);
                assert!(d.as_ref().is_ok_and(|d| d.is_finite()), "{} under {score}: {d:?}", r.name);
            }
        }
    }
}
