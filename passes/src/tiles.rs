//! Tile shapes per target, and the `tiles` pass that writes them on every attention (dense
//! too): backends obey the attribute and never choose tiles themselves. With the tiles, which
//! tiles a kernel may skip under an expression mask (`keys_from`, [`crate::key_bound`]).

use crate::{PassContext, PassError, PassOptions, Target};
use foxc_ir::attention::{AttnKernel, KvLoads, WsGrid};
use foxc_ir::{Attention, Graph, Mask, Op, Tiles};

/// Head dims the warp-specialized kernel is chosen for: measured 0.75x the standard kernel's
/// time at D = 128 (with 128-key tiles), 1.4x slower at D = 64, which keeps the standard kernel
/// (docs/GPU_KERNEL.md, run 8).
pub const WS_HEAD_DIMS: [u64; 1] = [128];

/// How the warp-specialized kernel fills its K/V ring unless `--ws-loads` says otherwise: TMA
/// (`loads = tma`), measured correct (outputs bitwise equal to `cp.async`'s) and faster on the
/// H200: 1.316 vs 1.381 ms at 4x16x8192x128, 3.373 vs 3.550 at 1x16x32768x128 (docs/GPU_KERNEL.md,
/// run 11).
pub const WS_LOADS: KvLoads = KvLoads::Tma;

/// The warp-specialized kernel's grid unless `--ws-grid` says otherwise: one block per query
/// tile and head. The persistent grid (docs/GPU_KERNEL.md, run 14) stays opt-in until the
/// device shows it faster at every standard shape.
pub const WS_GRID: WsGrid = WsGrid::Tiles;

/// The `bm x bn` tiles for `target`. `head_dim` is `D` when the signature or the caller's
/// bound sizes fix it; `gradient` says the graph will be differentiated.
///
/// GPUs: 64-row query tiles (measured 7% (D = 128) to 30% (D = 64) faster than 128-row ones on
/// the H200 with the standard kernel, and fewer kept tiles; docs/GPU_KERNEL.md, run 3), 64-key
/// tiles; on sm_90a with D = 128 known, for a forward, 128-key tiles: the warp-specialized
/// kernel ran 1x16x32768x128 in 3.34 ms with them against 4.02 ms with 64 (the standard
/// kernel: 4.43), keeping 40.2% of the tiles instead of 40.0% (run 8). Not when the head dim
/// is unknown (D = 256 runs the standard kernel, whose 128-key tiles do not fit in shared
/// memory), and not for a graph that is differentiated: the backward kernels share the
/// forward's tiles, and forward + backward at 1x16x32768x128 took 19.41 / 19.44 ms with
/// 128-key tiles against 18.73-19.09 with 64 (8x16x4096x128: 5.34 against 4.96), with the
/// sm_90a wgmma backward (docs/GPU_KERNEL.md, "The sm_90a wgmma backward"; with the earlier
/// mma.sync backward: 30.17 against 25.78).
pub fn tiles_for(target: Target, head_dim: Option<u64>, gradient: bool) -> Tiles {
    match target {
        Target::Sm90a if !gradient && head_dim.is_some_and(|d| WS_HEAD_DIMS.contains(&d)) => {
            Tiles { bm: 64, bn: 128 }
        }
        Target::Cpu | Target::Sm80 | Target::Sm90a => Tiles { bm: 64, bn: 64 },
    }
}

/// The forward kernel for an attention on `target` with these tiles: the warp-specialized one
/// on sm_90a for a causal or window mask without a key bound (only the standard kernel skips
/// below one), tiles it runs (64- or 128-row query tiles: each of its two consumer warpgroups
/// owns 64 rows; key tiles a multiple of 16 up to 128) and a head dim it is chosen for, or a
/// symbolic one (the attribute then names the head dims it holds for, and code generation, which
/// knows the size, reads it: [`AttnKernel::runs_warp_specialized`]); the standard kernel otherwise.
pub fn kernel_for(
    target: Target,
    head_dim: Option<u64>,
    a: &Attention,
    tiles: Tiles,
    loads: KvLoads,
    grid: WsGrid,
) -> AttnKernel {
    let ws = target == Target::Sm90a
        && head_dim.is_none_or(|d| WS_HEAD_DIMS.contains(&d))
        && matches!(a.mask, Mask::Causal | Mask::Window(_))
        // A key bound is skipped by the standard kernel only (worth more than the kernel).
        && a.keys_from.is_none()
        && matches!(tiles.bm, 64 | 128)
        && tiles.bn.is_multiple_of(16)
        && (16..=128).contains(&tiles.bn);
    if ws {
        AttnKernel::WarpSpecialized { head_dims: WS_HEAD_DIMS.to_vec(), loads, grid }
    } else {
        AttnKernel::Standard
    }
}

/// The tiles pass: `--tiles` if given, else the target's choice, on every attention without
/// tiles; the key bound `E` below which tiles need no visit, under an expression mask
/// `j >= E` or a score region `select(j >= E, X, -inf)` ([`crate::key_bound`]); and the forward
/// kernel that goes with them ([`kernel_for`]; its K/V loads: `--ws-loads`, else [`WS_LOADS`];
/// its grid: `--ws-grid`, else [`WS_GRID`]).
pub fn run(g: &mut Graph, opts: &PassOptions, _cx: &mut PassContext) -> Result<(), PassError> {
    for n in g.find(|op| matches!(op, Op::Attention(a) if a.tiles.is_none())) {
        let head_dim =
            g.ty(g.operands(n)[0]).axes.get(3).and_then(|a| a.dim.eval(&|s| opts.dims.get(s).copied()));
        let tiles = opts.tiles.unwrap_or_else(|| tiles_for(opts.target, head_dim, opts.gradient));
        if let Op::Attention(a) = &mut g.node_mut(n).op {
            a.tiles = Some(tiles);
            a.keys_from = match &a.mask {
                Mask::Expr(m) => crate::key_bound::keys_from(m),
                _ => None,
            }
            .or_else(|| crate::key_bound::keys_from_score(&a.score));
            let (loads, grid) = (opts.ws_loads.unwrap_or(WS_LOADS), opts.ws_grid.unwrap_or(WS_GRID));
            a.kernel = kernel_for(opts.target, head_dim, a, tiles, loads, grid);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use foxc_ir::Scale;

    /// The choice with the default loads.
    fn kernel_for(target: Target, head_dim: Option<u64>, a: &Attention, tiles: Tiles) -> AttnKernel {
        super::kernel_for(target, head_dim, a, tiles, KvLoads::CpAsync, WsGrid::Tiles)
    }

    fn attn(mask: Mask) -> Attention {
        Attention::new(Scale::constant(0.125), mask, true)
    }

    /// The warp-specialized kernel is chosen on sm_90a for the masks, tiles and head dims it
    /// runs fast (D = 128 or not yet known), nowhere else.
    #[test]
    fn kernel_choice() {
        let t = Tiles { bm: 64, bn: 128 };
        let ws = AttnKernel::WarpSpecialized {
            head_dims: vec![128],
            loads: KvLoads::CpAsync,
            grid: WsGrid::Tiles,
        };
        assert_eq!(kernel_for(Target::Sm90a, None, &attn(Mask::Causal), t), ws);
        assert_eq!(kernel_for(Target::Sm90a, Some(128), &attn(Mask::Window(256)), t), ws);
        assert_eq!(kernel_for(Target::Sm90a, Some(128), &attn(Mask::Causal), Tiles { bm: 128, bn: 64 }), ws);
        let std = AttnKernel::Standard;
        assert_eq!(kernel_for(Target::Sm90a, Some(64), &attn(Mask::Causal), t), std);
        assert_eq!(kernel_for(Target::Sm80, Some(128), &attn(Mask::Causal), t), std);
        assert_eq!(kernel_for(Target::Cpu, Some(128), &attn(Mask::Causal), t), std);
        assert_eq!(kernel_for(Target::Sm90a, Some(128), &attn(Mask::None), t), std);
        // An expression mask runs on the standard kernel (its non-causal form visits every tile).
        let expr = Mask::Expr(foxc_ir::Region::identity());
        assert_eq!(kernel_for(Target::Sm90a, Some(128), &attn(expr), t), std);
        assert_eq!(kernel_for(Target::Sm90a, Some(128), &attn(Mask::Causal), Tiles { bm: 32, bn: 64 }), std);
        assert_eq!(kernel_for(Target::Sm90a, Some(128), &attn(Mask::Causal), Tiles { bm: 64, bn: 256 }), std);
        // The loads asked for are the attribute's (`--ws-loads tma`).
        let tma =
            AttnKernel::WarpSpecialized { head_dims: vec![128], loads: KvLoads::Tma, grid: WsGrid::Tiles };
        let (loads, grid) = (KvLoads::Tma, WsGrid::Tiles);
        assert_eq!(super::kernel_for(Target::Sm90a, Some(128), &attn(Mask::Causal), t, loads, grid), tma);
        assert_eq!(super::kernel_for(Target::Sm80, Some(128), &attn(Mask::Causal), t, loads, grid), std);
        // And the grid asked for (`--ws-grid persistent`).
        let persistent =
            AttnKernel::WarpSpecialized { head_dims: vec![128], loads, grid: WsGrid::Persistent };
        let p =
            super::kernel_for(Target::Sm90a, Some(128), &attn(Mask::Causal), t, loads, WsGrid::Persistent);
        assert_eq!(p, persistent);
        assert_eq!(p.ws_grid(), WsGrid::Persistent);
        assert_eq!(std.ws_grid(), WsGrid::Tiles);
        // The attribute's rule at code generation: D = 128 only.
        assert!(ws.runs_warp_specialized(128));
        assert!(!ws.runs_warp_specialized(64));
        assert!(!std.runs_warp_specialized(128));
    }
}
