//! The q and k of the attention and threshold kernels read through a load map
//! (docs/SEMANTICS.md, "load_map"): where a kernel loads four columns of a row it computes the
//! map's function there, instead of reading a tensor a loop wrote.

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

/// A row of an operand: the map's `b`, `h` (the tensor's own head: a kv head of k) and row `i`,
/// and the row's first element in the buffer.
#[derive(Clone, Copy)]
pub struct Row {
    pub b: Value,
    pub h: Value,
    pub i: Value,
    pub base: Value,
}

impl Operand {
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
        match &self.map {
            None => x,
            Some(rc) => {
                let j0 = fx.ic(j as i64);
                region::emit(
                    fx,
                    rc,
                    caps,
                    &Lanes { b: row.b, h: row.h, i: row.i, j0, aligned: j.is_multiple_of(4) },
                    x,
                )
            }
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
        match &self.map {
            None => x,
            Some(rc) => {
                let xv = fx.splat(x);
                let at = Lanes { b: row.b, h: row.h, i: row.i, j0: j, aligned: false };
                let y = region::emit(fx, rc, caps, &at, xv);
                fx.b.ins().extractlane(y, 0)
            }
        }
    }
}
