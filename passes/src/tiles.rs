//! Tile shapes of ACP per target. Backends obey the chosen tiles (they are IR attributes).

use crate::Target;
use foxc_ir::Tiles;

/// The `bm x bn` tiles for `target`. `head_dim` is `D` when the signature fixes it.
pub fn tiles_for(target: Target, head_dim: Option<u64>) -> Tiles {
    let _ = head_dim;
    match target {
        Target::Cpu => Tiles { bm: 64, bn: 64 },
        Target::Sm90a | Target::Sm80 => Tiles { bm: 128, bn: 64 },
    }
}
