//! The rule's formula as LLVM f32 instructions: the statistics it may read, as values, and the
//! emitter that `RuleExpr::emit` (the one walk over a formula) calls.

use super::{DeltaSpec, Kb};
use foxc_ir::prune_rule::{RuleEmitter, Stat};
use inkwell::values::{FloatValue, IntValue};
use inkwell::IntPredicate;

/// The formula's statistics as LLVM values, indexed by [`Stat`] (None: not computed).
pub(super) type Stats<'ctx> = [Option<FloatValue<'ctx>>; Stat::ALL.len()];

/// Renders the formula's operations as LLVM f32 instructions over precomputed statistics.
pub(super) struct Llvm<'a, 'b, 'ctx> {
    pub k: &'a Kb<'b, 'ctx>,
    pub stats: Stats<'ctx>,
}

impl<'ctx> RuleEmitter for Llvm<'_, '_, 'ctx> {
    type V = FloatValue<'ctx>;
    fn stat(&mut self, s: Stat) -> FloatValue<'ctx> {
        match self.stats[s as usize] {
            Some(v) => v,
            None => {
                // Every statistic of the formula is computed first (`RuleExpr::stats`).
                self.k.fail(format!("threshold: statistic {} not computed", s.name()));
                self.k.f32(f64::NAN)
            }
        }
    }
    fn constant(&mut self, c: f64) -> FloatValue<'ctx> {
        self.k.f32(c)
    }
    fn add(&mut self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> FloatValue<'ctx> {
        self.k.fadd(a, b)
    }
    fn sub(&mut self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> FloatValue<'ctx> {
        self.k.fsub(a, b)
    }
    fn mul(&mut self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> FloatValue<'ctx> {
        self.k.fmul(a, b)
    }
}

/// The statistics every formula may read that do not come from the data.
pub(super) fn constant_stats<'ctx>(k: &Kb<'_, 'ctx>, s: &DeltaSpec, ln_t: FloatValue<'ctx>) -> Stats<'ctx> {
    let mut st: Stats<'ctx> = [None; Stat::ALL.len()];
    st[Stat::LnEps as usize] = Some(k.f32(s.log_eps));
    st[Stat::LnT as usize] = Some(ln_t);
    st[Stat::Scale as usize] = Some(k.f32(s.scale.abs()));
    st
}

/// Sets the norm statistics from maxima of squared norms (over the head: q, k; over the keys of
/// tiles `<= m`: k; over tile m: q). q' norms are scaled by the folded factor `|qscale|`.
pub(super) fn set_norm_stats<'ctx>(
    k: &Kb<'_, 'ctx>,
    st: &mut Stats<'ctx>,
    s: &DeltaSpec,
    (q_max, k_max, k_causal, q_tile): (
        FloatValue<'ctx>,
        FloatValue<'ctx>,
        FloatValue<'ctx>,
        FloatValue<'ctx>,
    ),
) {
    let aqs = k.f32(s.qscale.abs());
    st[Stat::QMax as usize] = Some(k.fmul(aqs, k.sqrt(q_max)));
    st[Stat::KMax as usize] = Some(k.sqrt(k_max));
    st[Stat::KCausal as usize] = Some(k.sqrt(k_causal));
    st[Stat::QTile as usize] = Some(k.fmul(aqs, k.sqrt(q_tile)));
}

/// Sets the given threshold of head `bh` (`b * H + h`) when the formula reads it: entry `h` of
/// the rule's per-head table, `H` its length (the driver refuses a program of another head
/// count before any launch), as a chain of selects over the f32 constants.
pub(super) fn set_given_stat<'ctx>(
    k: &Kb<'_, 'ctx>,
    st: &mut Stats<'ctx>,
    s: &DeltaSpec,
    bh: IntValue<'ctx>,
) {
    let table = &s.rule.given;
    if !s.rule.reads_given() || table.is_empty() {
        return;
    }
    let head = k.uremc(bh, table.len() as i64);
    let mut v = k.f32(table[0]);
    for (i, d) in table.iter().enumerate().skip(1) {
        v = k.select_f(k.icmpc(IntPredicate::EQ, head, i as i64), k.f32(*d), v);
    }
    st[Stat::Given as usize] = Some(v);
}
