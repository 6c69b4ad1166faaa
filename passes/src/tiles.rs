//! Tile shapes of ACP per target. Backends obey the chosen tiles (they are IR attributes).

use crate::Target;
use foxc_ir::Tiles;

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
