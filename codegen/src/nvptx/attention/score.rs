//! The score hook: how an attention variant's score modification enters the kernel.
//!
//! The kernel computes `x = scale * q.k` for each element of its score fragment (each lane holds
//! two rows and `bn / 4` columns of a warp's 16 x bn block, see [`super::mma`]). A [`ScoreMod`]
//! receives `x` with the element's query row `i`, key column `j` and the flat `(b, h)` index, and
//! emits the modified score; the kernel then adds the decay bias and runs the online softmax.
//! Masking (causal, window, tails) stays the kernel's: it runs after the hook, on the tiles that
//! need it; an expression mask's condition is the hook's ([`ScoreMod::keeps`]), which the kernel's
//! mask step ANDs with its own on every tile. [`Identity`] (plain FoX) emits nothing and keeps the fused `scale log2 e` FMA.

use crate::nvptx::builder::{KernelBuilder, ParamTy};
use inkwell::values::{FloatValue, IntValue};

/// Index of the first kernel parameter a score modification adds ([`ScoreMod::params`]): they
/// follow the attention kernel's own ([`super::params::FwdParams`]).
pub(crate) const FIRST_PARAM: u32 = super::params::FIRST_FWD_PARAM;

/// Where one score element sits: query row `i`, key column `j` (both `< T` except in tail
/// tiles, whose elements the mask drops afterwards) and the flat batch-head index `bh`.
#[derive(Clone, Copy, Debug)]
#[allow(dead_code)] // read by score hooks other than the identity
pub(crate) struct ScorePos<'ctx> {
    pub i: IntValue<'ctx>,
    pub j: IntValue<'ctx>,
    pub bh: IntValue<'ctx>,
}

/// A score modification emitted on the fragment values.
pub(crate) trait ScoreMod {
    /// True when the modification is the identity (the kernel then emits `x` unchanged, fused
    /// into one FMA with the decay bias).
    fn is_identity(&self) -> bool {
        false
    }
    /// True when the attention has an expression mask ([`ScoreMod::keeps`] gives its condition).
    fn has_mask(&self) -> bool {
        false
    }
    /// A short tag that makes the kernel name unique for this modification (empty for identity).
    fn tag(&self) -> String;
    /// The kernel parameters the modification reads (captured tensors and their sizes),
    /// appended from [`FIRST_PARAM`] on, in this order.
    fn params(&self) -> Vec<(String, ParamTy)> {
        vec![]
    }
    /// Emits the modified score of one element from `x = scale * q.k`.
    fn emit<'a, 'ctx>(
        &self,
        b: &KernelBuilder<'a, 'ctx>,
        x: FloatValue<'ctx>,
        at: ScorePos<'ctx>,
    ) -> FloatValue<'ctx>;
    /// The expression mask's proven key bound `E` at row `at.i` (`at.j` unused): every key
    /// `j < E` of the row is masked; `None` without one.
    fn keys_from<'a, 'ctx>(
        &self,
        _: &KernelBuilder<'a, 'ctx>,
        _: ScorePos<'ctx>,
    ) -> Option<FloatValue<'ctx>> {
        None
    }
    /// Whether the attention has an epilogue ([`ScoreMod::epilogue`] is not the identity).
    fn has_epilogue(&self) -> bool {
        false
    }
    /// The epilogue `F(o, b, h, i, d)` on output element `o` at row `at.i`, column `at.j`
    /// (the attention's `epilogue`); `o` itself without one.
    fn epilogue<'a, 'ctx>(
        &self,
        _: &KernelBuilder<'a, 'ctx>,
        o: FloatValue<'ctx>,
        _: ScorePos<'ctx>,
    ) -> FloatValue<'ctx> {
        o
    }
    /// Whether q is loaded through a map ([`ScoreMod::q_map`] is not the identity).
    fn has_q_map(&self) -> bool {
        false
    }
    /// q's load map `M(x, b, h, i, d)` on the elements `xs` of q's tensor at row `at.i`,
    /// columns `at.j + e` (`at.j` a multiple of their count; docs/SEMANTICS.md, "load_map"), in
    /// f32; `xs` themselves without one.
    fn q_map<'a, 'ctx>(
        &self,
        _: &KernelBuilder<'a, 'ctx>,
        xs: &[FloatValue<'ctx>],
        _: ScorePos<'ctx>,
    ) -> Vec<FloatValue<'ctx>> {
        xs.to_vec()
    }
    /// Whether an expression mask keeps the element at `at` (i1); `None` without one.
    fn keeps<'a, 'ctx>(&self, _: &KernelBuilder<'a, 'ctx>, _: ScorePos<'ctx>) -> Option<IntValue<'ctx>> {
        None
    }
    /// Asks L2 for the line of every tensor the epilogue reads at output element `at` (a hint:
    /// no value is read, an index outside its axis asks for the tensor's first line).
    fn prefetch_epilogue<'a, 'ctx>(&self, _: &KernelBuilder<'a, 'ctx>, _: ScorePos<'ctx>) {}
}

/// The unmodified score (FoX as written today).
pub(crate) struct Identity;

impl ScoreMod for Identity {
    fn is_identity(&self) -> bool {
        true
    }
    fn tag(&self) -> String {
        String::new()
    }
    fn emit<'a, 'ctx>(
        &self,
        _: &KernelBuilder<'a, 'ctx>,
        x: FloatValue<'ctx>,
        _: ScorePos<'ctx>,
    ) -> FloatValue<'ctx> {
        x
    }
}
