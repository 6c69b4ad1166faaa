//! `load_map` in f64 (docs/SEMANTICS.md, "load_map"): the reference its readers' kernels
//! compute where they load the tensor.

use super::region::{Capture, RegionEval};
use super::{cast, Evaluator, InterpError};
use crate::graph::{Value, ValueId};
use crate::ops::Op;
use crate::types::{DType, Dim};

impl Evaluator<'_> {
    /// The elements of `load_map` node `id` (`shape` `[B, H, T, D]`, row-major): its function
    /// at every `[b, h, i, d]` with `x` operand 0 there and the captures the later operands,
    /// rounded to a 16-bit dtype (f32 values keep f64, as a stored f32 statement's do).
    pub(super) fn load_map(
        &self,
        id: ValueId,
        ops: &[Value],
        shape: &[usize],
    ) -> Result<Vec<f64>, InterpError> {
        let Op::LoadMap { f } = self.g.op(id) else {
            return Err(self.err(id, "not a load_map node"));
        };
        let Some((&x, caps)) = ops.split_first() else {
            return Err(self.err(id, "a load_map without operands"));
        };
        let x = self.positional(id, x, 4, "x")?;
        if x.shape != shape {
            return Err(self.err(id, format!("operand x has shape {:?}, the map {shape:?}", x.shape)));
        }
        let mut captured = Vec::with_capacity(caps.len());
        for &c in caps {
            let v = self.val(c, id)?;
            captured.push(Capture { shape: &v.shape, data: &v.data });
        }
        let dims = &self.dims;
        let dim = move |d: &Dim| dims.eval(d);
        let mut ev = RegionEval::new(f, &captured, &dim).map_err(|m| self.err(id, m))?;
        let dt = self.g.ty(id).dtype;
        let [_, h, t, d] = [shape[0], shape[1], shape[2], shape[3]];
        Ok(x.data
            .iter()
            .enumerate()
            .map(|(e, &xv)| {
                let (j, r) = (e % d, e / d);
                let (i, r) = (r % t, r / t);
                let v = ev.eval(xv, [r / h, r % h, i, j]);
                // As the statement it replaces: an f32 store keeps the reference's f64 value, a
                // cast to a 16-bit type rounds.
                if dt == DType::F32 {
                    v
                } else {
                    cast(dt, v)
                }
            })
            .collect())
    }
}
