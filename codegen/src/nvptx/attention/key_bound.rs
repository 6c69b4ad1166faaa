//! Tile skipping under an expression mask with a proven key bound (`keys_from`, set by the
//! tiles pass for masks `j >= E(b, h, i)`): every key `j < E_i` of row `i` is masked, so a key
//! tile whose last key lies below `min_i E_i` over the block's rows holds nothing any row keeps.
//! The kernel starts its walk at the first tile that reaches the minimum; the mask is still
//! evaluated on every visited element, so the kept set is exactly the interpreter's.

use super::score::ScorePos;
use super::Attn;
use inkwell::values::IntValue;
use inkwell::FloatPredicate;

impl<'k, 'a, 'ctx> Attn<'k, 'a, 'ctx> {
    /// `n_start` raised to the first key tile that reaches `min E_i` over the block's rows
    /// (never past `n_end`: the walk visits at least one tile), or unchanged without a bound.
    /// Each warp computes the minimum itself (lane `l` takes rows `i0 + l + 32 r`), so no
    /// shared memory or barrier is needed. A NaN `E_i` (`j >= NaN` keeps nothing) is left
    /// out of the minimum; rows past `T` only lower it (a smaller start is still sound).
    pub(crate) fn key_bound_start(
        &self,
        n_start: IntValue<'ctx>,
        n_end: IntValue<'ctx>,
        bh: IntValue<'ctx>,
        i0: IntValue<'ctx>,
    ) -> IntValue<'ctx> {
        let b = self.b;
        let rows = self.cfg.block_rows();
        let mut e_min = b.f32(f64::INFINITY);
        for r in 0..rows.div_ceil(32) {
            let i = b.add(i0, b.addc(self.lane, 32 * r as i64));
            let at = ScorePos { i, j: b.i32(0), bh };
            let Some(e) = self.score.keys_from(b, at) else { return n_start };
            // minnum: a NaN operand gives the other one.
            e_min = b.fmin(e_min, e);
        }
        for s in [16, 8, 4, 2, 1] {
            e_min = b.fmin(e_min, b.shfl_xor(e_min, s));
        }
        // Clamp to [0, T] before the conversion (all rows NaN leaves +inf: nothing is kept).
        let pos = b.fcmp(FloatPredicate::OGT, e_min, b.f32(0.0));
        let e = b.select_f(pos, e_min, b.f32(0.0));
        let e = b.fmin(e, b.sitofp(self.k_len));
        // Key tile floor(floor(e) / bn) (e >= 0: truncation floors): every key before it is
        // below floor(e) <= e.
        let kt = b.sdivc(b.fptosi(e), self.cfg.bn as i64);
        b.smin(b.smax(n_start, kt), n_end)
    }
}
