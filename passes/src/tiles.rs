//! Tile shapes per target, and the `tiles` pass that writes them on every attention (dense
//! too): backends obey the attribute and never choose tiles themselves.

use crate::{PassContext, PassError, PassOptions, Target};
use foxc_ir::{Dim, Graph, Op, Tiles};

/// The `bm x bn` tiles for `target`. `head_dim` is `D` when the signature fixes it.
///
/// GPUs: 64 x 64. The sm_90a kernel runs one 64-row warpgroup per query tile (2 blocks per SM
/// at D = 128, 3 at D = 64); 64-row tiles measured 7% (D = 128) to 30% (D = 64) faster than
/// 128-row ones on the H200 and keep fewer tiles (docs/GPU_KERNEL.md, run 3).
pub fn tiles_for(target: Target, head_dim: Option<u64>) -> Tiles {
    let _ = head_dim;
    match target {
        Target::Cpu => Tiles { bm: 64, bn: 64 },
        Target::Sm90a | Target::Sm80 => Tiles { bm: 64, bn: 64 },
    }
}

/// The tiles pass: `--tiles` if given, else the target's choice, on every attention without tiles.
pub fn run(g: &mut Graph, opts: &PassOptions, _cx: &mut PassContext) -> Result<(), PassError> {
    for n in g.find(|op| matches!(op, Op::Attention(a) if a.tiles.is_none())) {
        let head_dim = match g.ty(g.operands(n)[0]).axes.get(3).map(|a| &a.dim) {
            Some(Dim::Const(d)) => Some(*d),
            _ => None,
        };
        let tiles = opts.tiles.unwrap_or_else(|| tiles_for(opts.target, head_dim));
        if let Op::Attention(a) = &mut g.node_mut(n).op {
            a.tiles = Some(tiles);
        }
    }
    Ok(())
}
