//! q's load map in the threshold kernels (docs/SEMANTICS.md, "load_map"): where the attention's
//! q is a map (the `fuse-load-maps` pass), the threshold reads the same q, so its kernels compute
//! the map on every element of q they load, as the attention kernel does on its Q tile; the norms
//! and `s_ii` are then of the values the attention multiplies. The map is the attention's region
//! evaluator ([`RegionMod`], the map as its region: `x` the loaded element, `j` its column `d`),
//! its captured tensors and sizes kernel parameters after the kernel's own.

use crate::nvptx::attention::region::{CaptureTy, RegionMod, ScoreArg};
use crate::nvptx::attention::score::{ScoreMod, ScorePos};
use crate::nvptx::builder::{KernelBuilder, ParamTy};
use crate::nvptx::kernels::load_row;
use foxc_ir::{DType, Dim, Region};
use inkwell::values::{FloatValue, IntValue, PointerValue};
use inkwell::IntPredicate;

/// q's load map as a threshold kernel computes it.
#[derive(Clone, Debug)]
pub struct QMap {
    map: RegionMod,
    /// The map's dtype: its values are rounded to it, as the attention's Q tile holds them.
    dtype: DType,
}

impl QMap {
    /// The map `f` (its captures of types `caps`) of dtype `dtype`; `Err` says what the kernel
    /// cannot evaluate.
    pub(crate) fn new(
        f: &Region,
        dim: &dyn Fn(&Dim) -> Option<u64>,
        heads: Option<u64>,
        caps: &[CaptureTy],
        dtype: DType,
    ) -> Result<QMap, String> {
        Ok(QMap { map: RegionMod::with_captures(f, dim, heads, caps)?, dtype })
    }

    /// The kernel arguments the map reads, in parameter order after the kernel's own.
    pub(crate) fn args(&self) -> &[ScoreArg] {
        self.map.args()
    }

    /// The dim of argument [`ScoreArg::Dim`]`(n)`.
    pub(crate) fn dim_arg(&self, n: usize) -> Option<&Dim> {
        self.map.dim_arg(n)
    }

    /// The same map reading its arguments from kernel parameter `first` on (the kernel's own
    /// parameter count).
    pub(super) fn reading_from(&self, first: usize) -> QMap {
        QMap { map: self.map.clone().with_first_param(first as u32), dtype: self.dtype }
    }

    /// `own` (a kernel's own parameters) followed by the map's.
    pub(super) fn signature(map: Option<&QMap>, own: Vec<(&'static str, ParamTy)>) -> Vec<(String, ParamTy)> {
        let mut params: Vec<(String, ParamTy)> = own.into_iter().map(|(n, t)| (n.to_string(), t)).collect();
        params.extend(map.into_iter().flat_map(|m| m.map.params()));
        params
    }

    /// Element `x` of q's tensor at row `i`, column `d` of head `bh` through the map, rounded
    /// to its dtype.
    pub(super) fn apply<'ctx>(
        &self,
        k: &KernelBuilder<'_, 'ctx>,
        x: FloatValue<'ctx>,
        (i, d, bh): (IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>),
    ) -> FloatValue<'ctx> {
        self.round(k, self.map.emit(k, x, ScorePos { i, j: d, bh }))
    }

    /// The elements `xs` of q's tensor at row `i`, columns `d0 + e` (`d0` a multiple of their
    /// count) of head `bh` through the map ([`RegionMod::emit_lanes`]), rounded to its dtype.
    pub(super) fn apply_lanes<'ctx>(
        &self,
        k: &KernelBuilder<'_, 'ctx>,
        xs: &[FloatValue<'ctx>],
        (i, d0, bh): (IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>),
    ) -> Vec<FloatValue<'ctx>> {
        let vs = self.map.emit_lanes(k, xs, ScorePos { i, j: d0, bh });
        vs.into_iter().map(|v| self.round(k, v)).collect()
    }

    fn round<'ctx>(&self, k: &KernelBuilder<'_, 'ctx>, v: FloatValue<'ctx>) -> FloatValue<'ctx> {
        match self.dtype {
            DType::BF16 | DType::F16 => k.fpext(k.fptrunc(v, k.elem_type(self.dtype).into_float_type())),
            _ => v,
        }
    }
}

/// [`load_row`] of q's row `i` of head `bh` (elements `lane + 32 r`, 0 past `d`), through the
/// map when there is one.
#[allow(clippy::too_many_arguments)]
pub(super) fn load_q_row<'ctx>(
    k: &KernelBuilder<'_, 'ctx>,
    map: Option<&QMap>,
    dt: DType,
    q: PointerValue<'ctx>,
    row_base: IntValue<'ctx>,
    lane: IntValue<'ctx>,
    d: u32,
    (i, bh): (IntValue<'ctx>, IntValue<'ctx>),
) -> Vec<FloatValue<'ctx>> {
    let xs = load_row(k, dt, q, row_base, lane, d);
    let Some(map) = map else { return xs };
    xs.into_iter()
        .enumerate()
        .map(|(r, x)| {
            let e = k.addc(lane, 32 * r as i64);
            let v = map.apply(k, x, (i, k.smin(e, k.i32(d as i64 - 1)), bh));
            if (r as u32 + 1) * 32 <= d {
                v
            } else {
                k.select_f(k.icmpc(IntPredicate::SLT, e, d as i64), v, k.f32(0.0))
            }
        })
        .collect()
}
