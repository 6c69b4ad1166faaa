//! The attention and threshold kernels' q read through a load map (docs/SEMANTICS.md,
//! "load_map"): where a kernel loads four columns of a row it computes the map's function there,
//! instead of reading a tensor a loop wrote. k is an [`Operand`] without a map.

use super::emit::Fx;
use super::region::{self, CaptureCode, Lanes, RegionCode};
use cranelift_codegen::ir::{InstBuilder, Value};
use foxc_ir::DType;

/// How a kernel reads one of q, k: the dtype of the buffer it loads, and the map's code (its
/// captures numbered in the kernel's capture list) when the operand is a load map's.
#[derive(Clone, Debug)]
pub struct Operand {
    pub dtype: DType,
    pub map: Option<RegionCode>,
}

/// A row of an operand: its first element in the buffer, and where the map reads it (`b`, `h`,
/// row `i`; [`Operand::row`]).
#[derive(Clone, Copy)]
pub struct Row {
    pub base: Value,
    at: Option<(Value, Value, Value)>,
}

impl Operand {
    /// The row whose first element is `base`, read by the map (if any) at `at`'s `(b, h, i)`;
    /// a caller computes `at` only for an operand with a map.
    pub fn row(&self, base: Value, at: Option<(Value, Value, Value)>) -> Row {
        Row { base, at: at.filter(|_| self.map.is_some()) }
    }

    /// Columns `j .. j + 4` of `row` of the buffer `p` as f32x4, through the map if there is
    /// one; lanes at or past `d` are read as 0 (never past the row) and their value is the
    /// caller's to drop.
    pub fn lanes(
        &self,
        fx: &mut Fx,
        p: Value,
        caps: &[(Value, CaptureCode)],
        row: &Row,
        j: u64,
        d: u64,
    ) -> Value {
        let x = if j + 4 <= d {
            let idx = fx.b.ins().iadd_imm_s(row.base, j as i64);
            fx.load4_f32(self.dtype, p, idx)
        } else {
            let mut x = fx.splat_c(0.0);
            for l in 0..d.saturating_sub(j).min(4) {
                let idx = fx.b.ins().iadd_imm_s(row.base, (j + l) as i64);
                let e = fx.load_f32(self.dtype, p, idx);
                x = fx.b.ins().insertlane(x, e, l as u8);
            }
            x
        };
        match (&self.map, row.at) {
            (Some(rc), Some((b, h, i))) => {
                let j0 = fx.ic(j as i64);
                region::emit(fx, rc, caps, &Lanes { b, h, i, j0, aligned: j.is_multiple_of(4) }, x)
            }
            _ => x,
        }
    }

    /// Column `j` (a value) of `row` as f32, through the map if there is one.
    pub fn element(
        &self,
        fx: &mut Fx,
        p: Value,
        caps: &[(Value, CaptureCode)],
        row: &Row,
        j: Value,
    ) -> Value {
        let idx = fx.b.ins().iadd(row.base, j);
        let x = fx.load_f32(self.dtype, p, idx);
        match (&self.map, row.at) {
            (Some(rc), Some((b, h, i))) => {
                let xv = fx.splat(x);
                let y = region::emit(fx, rc, caps, &Lanes { b, h, i, j0: j, aligned: false }, xv);
                fx.b.ins().extractlane(y, 0)
            }
            _ => x,
        }
    }
}
