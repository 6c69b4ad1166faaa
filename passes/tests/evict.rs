//! Safe KV eviction (`foxc_ir::evict`) against exact f64 softmax, for every rule of the table.
//!
//! A decode of T steps is simulated: after step p (keys 0..=p cached) the cache drops the blocks
//! before `first_kept_block`; every later row p' must then give the dropped keys a total softmax
//! weight below eps in the attention over ALL keys 0..=p' (the no-eviction run). Inputs are fresh
//! random decays, queries and keys inside the horizon's norm bounds.

use foxc_ir::attention::ScoreBound;
use foxc_ir::evict::{first_kept_block, threshold, Horizon};
use foxc_passes::rules::RULES;
use proptest::prelude::*;

/// One head of a decode: per-token query and key rows and log-gates (`log f <= 0`).
#[derive(Debug)]
struct Decode {
    d: usize,
    q: Vec<f64>,
    k: Vec<f64>,
    log_f: Vec<f64>,
    scale: f64,
}

impl Decode {
    fn t(&self) -> usize {
        self.log_f.len()
    }

    fn c(&self) -> Vec<f64> {
        self.log_f
            .iter()
            .scan(0.0, |acc, x| {
                *acc += x;
                Some(*acc)
            })
            .collect()
    }

    /// The largest softmax weight row `p` gives one of the keys `0..n`, among keys `0..=p`
    /// (exact, in f64).
    fn max_weight_before(&self, c: &[f64], p: usize, n: usize) -> f64 {
        let logit = |j: usize| {
            let dot: f64 = (0..self.d).map(|x| self.q[p * self.d + x] * self.k[j * self.d + x]).sum();
            self.scale * dot + c[p] - c[j]
        };
        let l: Vec<f64> = (0..=p).map(logit).collect();
        let m = l.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = l.iter().map(|x| (x - m).exp()).sum();
        l[..n.min(p + 1)].iter().map(|x| (x - m).exp() / z).fold(0.0, f64::max)
    }

    /// `(row, dropped keys, weight)` of every later row that gives one dropped key a weight of
    /// `eps / max_keys` or more (what every rule promises of a skipped entry: at most
    /// `max_keys` of them, so their total stays below eps), for eviction at threshold `delta`
    /// in blocks of `bn`; and the keys dropped in the end.
    fn violations(
        &self,
        delta: f64,
        bn: usize,
        eps: f64,
        max_keys: usize,
    ) -> (Vec<(usize, usize, f64)>, usize) {
        let c = self.c();
        let mut dropped = 0;
        let mut bad = vec![];
        for p in 0..self.t() {
            // The row of step p reads what the cache kept after step p - 1.
            let w = self.max_weight_before(&c, p, dropped);
            if w >= eps / max_keys as f64 {
                bad.push((p, dropped, w));
            }
            dropped = dropped.max(first_kept_block(&c[..=p], delta, bn) * bn);
        }
        (bad, dropped)
    }
}

/// A random row of norm at most `bound`.
fn row(d: usize, bound: f64) -> impl Strategy<Value = Vec<f64>> {
    (prop::collection::vec(-1.0f64..1.0, d), 0.0f64..=1.0).prop_map(move |(x, r)| {
        let n = x.iter().map(|v| v * v).sum::<f64>().sqrt().max(1e-12);
        x.iter().map(|v| v / n * r * bound).collect()
    })
}

/// Rows drawn inside the bounds, or (`aligned`) the bounds' worst case: every query along one
/// direction at full norm and every key along it or against it, so a row's logits are +-U and
/// an old key can outweigh the row's own by 2U, the margin every rule leaves.
fn rows(d: usize, t: usize, qb: f64, kb: f64, aligned: bool) -> BoxedStrategy<(Vec<f64>, Vec<f64>)> {
    if aligned {
        (row(d, 1.0), prop::collection::vec(any::<bool>(), t))
            .prop_map(move |(u, signs)| {
                let n = u.iter().map(|v| v * v).sum::<f64>().sqrt().max(1e-12);
                let u: Vec<f64> = u.iter().map(|v| v / n).collect();
                let q = (0..t).flat_map(|_| u.iter().map(|x| x * qb)).collect();
                let k = signs
                    .iter()
                    .flat_map(|&s| u.iter().map(move |x| if s { x * kb } else { -x * kb }))
                    .collect();
                (q, k)
            })
            .boxed()
    } else {
        (prop::collection::vec(row(d, qb), t), prop::collection::vec(row(d, kb), t))
            .prop_map(|(q, k)| (q.concat(), k.concat()))
            .boxed()
    }
}

fn decode() -> impl Strategy<Value = (Decode, Horizon, usize)> {
    let shape =
        (2usize..6, 40usize..160, 0.5f64..4.0, 0.5f64..4.0, prop::sample::select(vec![2usize, 4, 8, 16]));
    (shape, any::<bool>())
        .prop_flat_map(|((d, t, qb, kb, bn), aligned)| {
            (
                rows(d, t, qb, kb, aligned),
                // Gates from nearly 1 (log f ~ -0.001) to strongly forgetting (log f ~ -5).
                prop::collection::vec(-5.0f64..-0.001, t),
                Just((d, qb, kb, bn)),
            )
        })
        .prop_map(|((q, k), log_f, (d, qb, kb, bn))| {
            let t = log_f.len();
            let dec = Decode { d, q, k, log_f, scale: 1.0 / (d as f64).sqrt() };
            (dec, Horizon { max_keys: t, q_norm: qb, k_norm: kb }, bn)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Every rule of the table, at every eps: no later row gives an evicted key eps / max_keys of
    /// its weight.
    #[test]
    fn evicted_keys_stay_negligible_for_every_later_query((dec, h, bn) in decode(), log_eps in -12.0f64..-1.0) {
        for r in RULES {
            let rule = r.rule();
            let delta = threshold(&rule.formula, &ScoreBound::IDENTITY, log_eps, dec.scale, &h).unwrap();
            let (bad, _) = dec.violations(delta, bn, log_eps.exp(), h.max_keys);
            prop_assert!(bad.is_empty(), "rule {}: rows (row, dropped, weight) {:?}", r.name, &bad[..bad.len().min(4)]);
        }
    }
}

/// The check above can fail: keys longer than the horizon says break the premise, and the
/// simulation finds a later row that still needs an evicted key.
#[test]
fn an_understated_key_bound_is_caught() {
    // One head, D = 1: key 0 is huge and aligned with every query, the rest are small; the
    // gates forget one nat per token. Eviction believes |k| <= 0.01.
    let t = 64;
    let mut k = vec![0.01; t];
    k[0] = 100.0;
    let dec = Decode { d: 1, q: vec![1.0; t], k, log_f: vec![-1.0; t], scale: 1.0 };
    let h = Horizon { max_keys: t, q_norm: 1.0, k_norm: 0.01 };
    let delta = threshold(&RULES[0].rule().formula, &ScoreBound::IDENTITY, -10.0, 1.0, &h).unwrap();
    let (bad, dropped) = dec.violations(delta, 4, (-10.0f64).exp(), t);
    assert!(dropped > 0, "nothing was evicted: the case shows nothing");
    assert!(!bad.is_empty(), "key 0 was evicted while it dominated later rows, and no row noticed");
    // With the true bound nothing breaks (and key 0 is kept longer).
    let h = Horizon { k_norm: 100.0, ..h };
    let delta = threshold(&RULES[0].rule().formula, &ScoreBound::IDENTITY, -10.0, 1.0, &h).unwrap();
    assert!(dec.violations(delta, 4, (-10.0f64).exp(), t).0.is_empty());
}

/// Eviction evicts: on a steadily forgetting head with bounded rows, the cache stays short.
#[test]
fn a_forgetting_head_keeps_a_bounded_window() {
    let t = 2000;
    let dec = Decode { d: 1, q: vec![1.0; t], k: vec![1.0; t], log_f: vec![-0.5; t], scale: 1.0 };
    let h = Horizon { max_keys: t, q_norm: 1.0, k_norm: 1.0 };
    let delta = threshold(&RULES[0].rule().formula, &ScoreBound::IDENTITY, -10.0, 1.0, &h).unwrap();
    let (bad, dropped) = dec.violations(delta, 16, (-10.0f64).exp(), t);
    assert!(bad.is_empty());
    // delta = -10 - ln 2000 - 2 = -19.6: keys beyond 40 tokens are evictable, one block of slack.
    assert!(dropped >= t - 40 - 2 * 16, "kept {} of {t} keys", t - dropped);
}
