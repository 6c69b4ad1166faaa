//! Tile shapes per target, and the `tiles` pass that writes them on every attention (dense
//! too): backends obey the attribute and never choose tiles themselves.

use crate::{PassContext, PassError, PassOptions, Target};
use foxc_ir::attention::AttnKernel;
use foxc_ir::{Attention, Dim, Graph, Mask, Op, Tiles};

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

/// The forward kernel for an attention on `target` with these tiles: the warp-specialized one
/// on sm_90a for a causal or window mask, tiles it runs (64- or 128-row query tiles: each of
/// its two consumer warpgroups owns 64 rows; key tiles a multiple of 16 up to 128) and a head
/// dim it is chosen for, or a symbolic one (the sizes are bound only at code generation, where
/// [`AttnKernel::runs_warp_specialized`] completes the choice); the standard kernel otherwise.
pub fn kernel_for(target: Target, head_dim: Option<u64>, a: &Attention, tiles: Tiles) -> AttnKernel {
    let ws = target == Target::Sm90a
        && head_dim.is_none_or(|d| AttnKernel::WS_HEAD_DIMS.contains(&d))
        && matches!(a.mask, Mask::Causal | Mask::Window(_))
        && matches!(tiles.bm, 64 | 128)
        && tiles.bn % 16 == 0
        && (16..=128).contains(&tiles.bn);
    if ws {
        AttnKernel::WarpSpecialized
    } else {
        AttnKernel::Standard
    }
}

/// The tiles pass: `--tiles` if given, else the target's choice, on every attention without
/// tiles; and the forward kernel that goes with them ([`kernel_for`]).
pub fn run(g: &mut Graph, opts: &PassOptions, _cx: &mut PassContext) -> Result<(), PassError> {
    for n in g.find(|op| matches!(op, Op::Attention(a) if a.tiles.is_none())) {
        let head_dim = match g.ty(g.operands(n)[0]).axes.get(3).map(|a| &a.dim) {
            Some(Dim::Const(d)) => Some(*d),
            _ => None,
        };
        let tiles = opts.tiles.unwrap_or_else(|| tiles_for(opts.target, head_dim));
        if let Op::Attention(a) = &mut g.node_mut(n).op {
            a.tiles = Some(tiles);
            a.kernel = kernel_for(opts.target, head_dim, a, tiles);
        }
    }
    Ok(())
}
