//! Tile skipping under an expression mask with a proven key bound (`keys_from`, set by the
//! tiles pass for masks `j >= E(b, h, i)`): every key `j < E_i` of row `i` is masked, so a key
//! tile whose last key lies below `min_i E_i` over a block's rows holds nothing any row keeps.
//! The forward and the backward's dq kernel start their walks at the first tile that reaches
//! the minimum; the dq kernel also writes it into the start scratch, from which the dkv kernel
//! skips the query chunks that keep nothing of its key tile. The mask is still evaluated on
//! every visited element, so the kept set is exactly the interpreter's.

use super::score::{ScoreMod, ScorePos};
use super::Attn;
use crate::nvptx::builder::KernelBuilder;
use inkwell::values::IntValue;
use inkwell::FloatPredicate;

/// The rows a key bound is taken over, and where their keys are.
pub(crate) struct BoundRows<'ctx> {
    /// The flat batch-head index and the first row.
    pub bh: IntValue<'ctx>,
    pub i0: IntValue<'ctx>,
    /// How many rows (a multiple of 32 or less than 32).
    pub rows: u32,
    /// The thread's lane.
    pub lane: IntValue<'ctx>,
    /// The keys' length `Tk` (the bound is clamped to it) and the key tile.
    pub k_len: IntValue<'ctx>,
    pub bn: u32,
}

/// The first key tile `floor(min E_i / bn)` any of the rows may keep, or `None` when `score`
/// has no key bound. Each warp computes the minimum itself (lane `l` takes rows `i0 + l + 32
/// r`), so no shared memory or barrier is needed; the value is uniform over the warp. A NaN
/// `E_i` (`j >= NaN` keeps nothing) is left out of the minimum; rows past `T` only lower it (a
/// smaller start is still sound). The bound is clamped to `Tk` (all rows NaN: nothing is kept,
/// and the tile is `Tk / bn`, past the last key's tile when `bn` divides `Tk`): callers clamp
/// it to their own last tile.
pub(crate) fn first_key_tile<'a, 'ctx, S: ScoreMod + ?Sized>(
    b: &KernelBuilder<'a, 'ctx>,
    score: &S,
    at: &BoundRows<'ctx>,
) -> Option<IntValue<'ctx>> {
    let mut e_min = b.f32(f64::INFINITY);
    for r in 0..at.rows.div_ceil(32) {
        let i = b.add(at.i0, b.addc(at.lane, 32 * r as i64));
        let e = score.keys_from(b, ScorePos { i, j: b.i32(0), bh: at.bh })?;
        // minnum: a NaN operand gives the other one.
        e_min = b.fmin(e_min, e);
    }
    for s in [16, 8, 4, 2, 1] {
        e_min = b.fmin(e_min, b.shfl_xor(e_min, s));
    }
    // Clamp to [0, Tk] before the conversion (all rows NaN leaves +inf: nothing is kept).
    let pos = b.fcmp(FloatPredicate::OGT, e_min, b.f32(0.0));
    let e = b.select_f(pos, e_min, b.f32(0.0));
    let e = b.fmin(e, b.sitofp(at.k_len));
    // Key tile floor(floor(e) / bn) (e >= 0: truncation floors): every key before it is
    // below floor(e) <= e.
    Some(b.sdivc(b.fptosi(e), at.bn as i64))
}

impl<'k, 'a, 'ctx> Attn<'k, 'a, 'ctx> {
    /// `n_start` raised to the first key tile that reaches `min E_i` over the `rows` rows from
    /// `i0` (a block's, or a warp-specialized consumer's 64), never past `n_end` (the walk
    /// visits at least one tile); unchanged without a bound.
    pub(crate) fn key_bound_start(
        &self,
        (n_start, n_end): (IntValue<'ctx>, IntValue<'ctx>),
        (bh, i0, rows): (IntValue<'ctx>, IntValue<'ctx>, u32),
    ) -> IntValue<'ctx> {
        let b = self.b;
        let at = BoundRows { bh, i0, rows, lane: self.lane, k_len: self.k_len, bn: self.cfg.bn };
        match first_key_tile(b, self.score, &at) {
            Some(kt) => b.smin(b.smax(n_start, kt), n_end),
            None => n_start,
        }
    }
}
