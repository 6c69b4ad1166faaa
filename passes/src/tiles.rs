//! Tile shapes per target, and the `tiles` pass that writes them on every attention (dense
//! too): backends obey the attribute and never choose tiles themselves. With the tiles, which
//! tiles a kernel may skip under an expression mask (`keys_from`, [`crate::key_bound`]).

use crate::{PassContext, PassError, PassOptions, Target};
use foxc_ir::attention::{AttnKernel, KvLoads, WsGrid, WsTurns};
use foxc_ir::{Attention, Dim, Graph, Mask, Op, Tiles, ValueId};
use std::collections::BTreeMap;

/// Head dims the warp-specialized kernel is chosen for: at D = 128 (with 128-key tiles) it is
/// faster than the standard kernel on the H200; at D = 64 the standard kernel with 64x128 tiles
/// stays faster than every warp-specialized layout tried (three consumers, two consumers, free
/// running, persistent grid; BENCHMARKS.md and docs/GPU_KERNEL.md).
pub const WS_HEAD_DIMS: [u64; 1] = [128];

/// Head dims the warp-specialized kernel builds for (codegen's `attention_ws::HEAD_DIMS`): what
/// `--attn-kernel warp-specialized` may run it at.
pub const WS_BUILDS: [u64; 2] = [64, 128];

/// A forward kernel asked for on the command line (`--attn-kernel`), over the pass's own
/// choice: the A/B of the two kernels at the same tiles in one binary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForwardKernel {
    Standard,
    /// Where the kernel runs (target, mask, tiles; head dims [`WS_BUILDS`]), else the standard one.
    WarpSpecialized,
}

/// How the warp-specialized kernel fills its K/V ring unless `--ws-loads` says otherwise: TMA
/// (`loads = tma`): outputs bitwise equal to `cp.async`'s, and faster on the H200 (one thread
/// issues the copies, the producer's address math leaves the other threads).
pub const WS_LOADS: KvLoads = KvLoads::Tma;

/// The warp-specialized kernel's grid unless `--ws-grid` says otherwise: one block per query
/// tile and head. The persistent grid stays opt-in until the device shows it faster at every
/// standard shape (level at D = 128 so far).
pub const WS_GRID: WsGrid = WsGrid::Tiles;

/// Whether the warp-specialized kernel's consumers take turns at the tensor cores unless
/// `--ws-turns` says otherwise: the ring (pingpong). Free-running consumers (`none`) collide on
/// the tensor cores and were slower at D = 128 and D = 64.
pub const WS_TURNS: WsTurns = WsTurns::Ring;

/// Head dims that get 128-key tiles on sm_90a for a forward (64-row query tiles either way):
/// faster at D = 128 (warp-specialized kernel: a larger GEMM per turn hides more of the other
/// consumer's softmax) and at D = 64 (standard kernel), for about 0.2-1 point more kept work.
pub const WIDE_KEY_HEAD_DIMS: [u64; 2] = [64, 128];

/// The `bm x bn` tiles for `target`. `head_dim` is `D` when the signature or the caller's
/// bound sizes fix it; `gradient` says the graph will be differentiated.
///
/// GPUs: 64-row query tiles (faster than 128-row ones on the H200 with the standard kernel, and
/// fewer kept tiles), 64-key tiles; on sm_90a with D = 64 or 128 known, for a forward, 128-key
/// tiles ([`WIDE_KEY_HEAD_DIMS`]). Not when the head dim is unknown (D = 256 runs the standard
/// kernel, whose 128-key tiles do not fit in shared memory), and not for a graph that is
/// differentiated: the backward kernels share the forward's tiles, and forward + backward ran
/// 2-8% slower with 128-key tiles.
pub fn tiles_for(target: Target, head_dim: Option<u64>, gradient: bool) -> Tiles {
    match target {
        Target::Sm90a if !gradient && head_dim.is_some_and(|d| WIDE_KEY_HEAD_DIMS.contains(&d)) => {
            Tiles { bm: 64, bn: 128 }
        }
        _ => Tiles { bm: 64, bn: 64 },
    }
}

/// The forward kernel for an attention on `target` with these tiles: the warp-specialized one
/// on sm_90a for a causal or window mask (both kernels skip the key tiles below a key bound),
/// tiles it runs (64- or 128-row query tiles: each of its two consumer warpgroups
/// owns 64 rows; key tiles a multiple of 16 up to 128) and a head dim it is chosen for, or a
/// symbolic one (the attribute then names the head dims it holds for, and code generation, which
/// knows the size, reads it: [`AttnKernel::runs_warp_specialized`]); the standard kernel otherwise.
/// `pick` (`--attn-kernel`) overrides the head-dim choice: `Standard` always, `WarpSpecialized`
/// wherever the kernel runs at all (head dims [`WS_BUILDS`]).
pub fn kernel_for(
    target: Target,
    head_dim: Option<u64>,
    a: &Attention,
    tiles: Tiles,
    ws: WsOptions,
    pick: Option<ForwardKernel>,
) -> AttnKernel {
    let head_dims: &[u64] = match pick {
        None => &WS_HEAD_DIMS,
        Some(ForwardKernel::WarpSpecialized) => &WS_BUILDS,
        Some(ForwardKernel::Standard) => &[],
    };
    let runs_ws = target == Target::Sm90a
        && !head_dims.is_empty()
        && head_dim.is_none_or(|d| head_dims.contains(&d))
        && matches!(a.mask, Mask::Causal | Mask::Window(_))
        && matches!(tiles.bm, 64 | 128)
        && tiles.bn.is_multiple_of(16)
        && (16..=128).contains(&tiles.bn);
    if runs_ws {
        AttnKernel::WarpSpecialized {
            head_dims: head_dims.to_vec(),
            loads: ws.loads,
            grid: ws.grid,
            turns: ws.turns,
        }
    } else {
        AttnKernel::Standard
    }
}

/// How a warp-specialized kernel runs: its K/V loads, grid and turns (they change how the work
/// is loaded, laid out and scheduled, not which kernel computes it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WsOptions {
    pub loads: KvLoads,
    pub grid: WsGrid,
    pub turns: WsTurns,
}

impl WsOptions {
    /// `--ws-loads`, `--ws-grid` and `--ws-turns` where given, else [`WS_LOADS`], [`WS_GRID`]
    /// and [`WS_TURNS`].
    pub fn of(opts: &PassOptions) -> WsOptions {
        WsOptions {
            loads: opts.ws_loads.unwrap_or(WS_LOADS),
            grid: opts.ws_grid.unwrap_or(WS_GRID),
            turns: opts.ws_turns.unwrap_or(WS_TURNS),
        }
    }
}

/// The CPU's query tile for `tq` queries against `tk` keys when both are bound and the queries
/// are fewer than a 64-row tile and than the keys (a decode step, a short prefill against a
/// cache): their own count rounded up to a power of two, where a 64-row tile would compute 64
/// rows for each (BENCHMARKS.md, CPU: a decode step). The CPU kernel's register blocks are of
/// up to 4 rows, so a tile of 1 or 2 rows computes only those.
pub fn few_queries_rows(target: Target, tq: Option<u64>, tk: Option<u64>) -> Option<u32> {
    match (target, tq, tk) {
        (Target::Cpu, Some(tq), Some(tk)) if tq < tk && tq < 64 => Some(tq.next_power_of_two() as u32),
        _ => None,
    }
}

/// Keys per block of the split-keys kernel ([`AttnKernel::SplitKeys`]) unless `--split-key-tiles`
/// says otherwise: 2048 (16 tiles at bn = 128, 32 at bn = 64; 1 MiB of bf16 K and V at D = 128),
/// so a decode step of 16 heads against 128k keys runs 1024 blocks, about eight per
/// multiprocessor of an H100. Counted in keys, not tiles, so the tiles do not change how much
/// one block streams.
pub const SPLIT_KEYS_PER_BLOCK: u32 = 2048;

/// Query rows up to which a GPU attention of fewer queries than keys splits its keys: one
/// 64-row block of queries (a decode step, a few speculative tokens).
pub const SPLIT_KEYS_ROWS: u64 = 64;

/// The tiles of a split-keys attention unless `--tiles` says otherwise: 64x64, whose block needs
/// 82 KB of shared memory at D = 128 (148 KB with 128-key tiles), so two blocks share a
/// multiprocessor and one's search and first loads overlap the other's stream. Measured on the
/// H100 (BENCHMARKS.md, "Decode"): 8% faster than 64x128 at 128k keys, B = 1, 6% at B = 8, and
/// 7% slower at 32k keys, B = 1.
pub const SPLIT_KEYS_TILES: Tiles = Tiles { bm: 64, bn: 64 };

/// Whether an attention of `rows` queries fewer than its keys splits its keys on `target`: on a
/// GPU when the rows are known to fit one block ([`SPLIT_KEYS_ROWS`]).
pub fn splits_keys(target: Target, rows: Option<u64>) -> bool {
    target.is_gpu() && rows.is_some_and(|r| r <= SPLIT_KEYS_ROWS)
}

/// The split-keys kernel of an attention that [`splits_keys`]: `split_tiles` key tiles of `bn`
/// keys a block (default [`SPLIT_KEYS_PER_BLOCK`] keys).
pub fn split_keys_kernel(split_tiles: Option<u32>, bn: u32) -> AttnKernel {
    AttnKernel::SplitKeys { tiles: split_tiles.unwrap_or((SPLIT_KEYS_PER_BLOCK / bn.max(1)).max(1)) }
}

/// The query dims a caller that compiles once per class of shapes (the Python op) binds so
/// that the attention [`splits_keys`]: each symbolic query-row dim of an attention
/// of fewer queries than keys that `len` puts at most [`SPLIT_KEYS_ROWS`], with its size.
pub fn split_keys_dims(g: &Graph, len: &dyn Fn(&str) -> Option<u64>) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for n in g.find(|op| matches!(op, Op::Attention(_))) {
        let (q, k) = (g.operands(n)[0], g.operands(n)[1]);
        if !foxc_ir::attention::fewer_queries(g, q, k) {
            continue;
        }
        if let Some(Dim::Sym(t)) = g.ty(q).axes.get(2).map(|ax| &ax.dim) {
            if let Some(v) = len(t).filter(|&v| v <= SPLIT_KEYS_ROWS) {
                out.insert(t.clone(), v);
            }
        }
    }
    out
}

/// The tiles pass: `--tiles` if given, else the target's choice, on every attention without
/// tiles; the key bound `E` below which tiles need no visit, under an expression mask
/// `j >= E` or a score region `select(j >= E, X, -inf)` ([`crate::key_bound`]); and the forward
/// kernel that goes with them ([`kernel_for`]; `--attn-kernel` if given; how a
/// warp-specialized one runs: [`WsOptions::of`]).
pub fn run(g: &mut Graph, opts: &PassOptions, _cx: &mut PassContext) -> Result<(), PassError> {
    for n in g.find(|op| matches!(op, Op::Attention(a) if a.tiles.is_none())) {
        let bound = |v: ValueId, axis: usize| {
            g.ty(v).axes.get(axis).and_then(|a| a.dim.eval(&|s| opts.dims.get(s).copied()))
        };
        let (q, k) = (g.operands(n)[0], g.operands(n)[1]);
        let fewer_queries = foxc_ir::attention::fewer_queries(g, q, k);
        let head_dim = bound(q, 3);
        let rows = bound(q, 2);
        let splits = fewer_queries && splits_keys(opts.target, rows);
        let tiles = opts.tiles.unwrap_or_else(|| {
            if splits {
                return SPLIT_KEYS_TILES;
            }
            let t = tiles_for(opts.target, head_dim, opts.gradient);
            match few_queries_rows(opts.target, rows, bound(k, 2)) {
                Some(bm) => Tiles { bm, ..t },
                None => t,
            }
        });
        if let Op::Attention(a) = &mut g.node_mut(n).op {
            a.tiles = Some(tiles);
            a.keys_from = match &a.mask {
                Mask::Expr(m) => crate::key_bound::keys_from(m),
                _ => None,
            }
            .or_else(|| crate::key_bound::keys_from_score(&a.score));
            // More queries get the kernel a square attention would (the queries sit at the end
            // of the keys in either).
            a.kernel = if splits {
                split_keys_kernel(opts.split_key_tiles, tiles.bn)
            } else {
                kernel_for(opts.target, head_dim, a, tiles, WsOptions::of(opts), opts.attn_kernel)
            };
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use foxc_ir::Scale;

    /// `cp.async` loads, the tiles grid, the turns ring.
    const CP_ASYNC: WsOptions =
        WsOptions { loads: KvLoads::CpAsync, grid: WsGrid::Tiles, turns: WsTurns::Ring };
    const TMA: WsOptions = WsOptions { loads: KvLoads::Tma, ..CP_ASYNC };

    /// The choice with `cp.async` loads.
    fn kernel_for(target: Target, head_dim: Option<u64>, a: &Attention, tiles: Tiles) -> AttnKernel {
        super::kernel_for(target, head_dim, a, tiles, CP_ASYNC, None)
    }

    fn attn(mask: Mask) -> Attention {
        Attention::new(Scale::constant(0.125), mask, true)
    }

    /// A few queries against more keys get a query tile of their own size on the CPU only.
    #[test]
    fn few_queries_get_a_small_query_tile() {
        assert_eq!(few_queries_rows(Target::Cpu, Some(1), Some(4096)), Some(1));
        assert_eq!(few_queries_rows(Target::Cpu, Some(3), Some(4096)), Some(4));
        assert_eq!(few_queries_rows(Target::Cpu, Some(9), Some(4096)), Some(16));
        assert_eq!(few_queries_rows(Target::Cpu, Some(63), Some(64)), Some(64));
        assert_eq!(few_queries_rows(Target::Cpu, Some(64), Some(4096)), None);
        assert_eq!(few_queries_rows(Target::Cpu, Some(5), Some(5)), None);
        assert_eq!(few_queries_rows(Target::Cpu, None, Some(4096)), None);
        assert_eq!(few_queries_rows(Target::Sm90a, Some(1), Some(4096)), None);
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
            turns: WsTurns::Ring,
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
        let tma = AttnKernel::WarpSpecialized {
            head_dims: vec![128],
            loads: KvLoads::Tma,
            grid: WsGrid::Tiles,
            turns: WsTurns::Ring,
        };
        assert_eq!(super::kernel_for(Target::Sm90a, Some(128), &attn(Mask::Causal), t, TMA, None), tma);
        assert_eq!(super::kernel_for(Target::Sm80, Some(128), &attn(Mask::Causal), t, TMA, None), std);
        // The attribute's rule at code generation: D = 128 only.
        assert!(ws.runs_warp_specialized(128));
        assert!(!ws.runs_warp_specialized(64));
        assert!(!std.runs_warp_specialized(128));
    }

    /// `--attn-kernel`: the standard kernel wherever asked; the warp-specialized one at every
    /// head dim it builds for (D = 64 too), but still only where it runs (target, mask, tiles).
    #[test]
    fn attn_kernel_option_overrides_the_head_dim_choice() {
        let t = Tiles { bm: 64, bn: 64 };
        let pick = |target, d, mask, tiles, k| super::kernel_for(target, d, &attn(mask), tiles, TMA, Some(k));
        let ws = AttnKernel::WarpSpecialized {
            head_dims: vec![64, 128],
            loads: KvLoads::Tma,
            grid: WsGrid::Tiles,
            turns: WsTurns::Ring,
        };
        let f = ForwardKernel::WarpSpecialized;
        assert_eq!(pick(Target::Sm90a, Some(64), Mask::Causal, t, f), ws);
        assert!(pick(Target::Sm90a, Some(64), Mask::Causal, t, f).runs_warp_specialized(64));
        assert_eq!(pick(Target::Sm90a, None, Mask::Window(100), t, f), ws);
        assert_eq!(pick(Target::Sm90a, Some(96), Mask::Causal, t, f), AttnKernel::Standard);
        assert_eq!(pick(Target::Sm80, Some(64), Mask::Causal, t, f), AttnKernel::Standard);
        assert_eq!(pick(Target::Sm90a, Some(64), Mask::None, t, f), AttnKernel::Standard);
        assert_eq!(
            pick(Target::Sm90a, Some(64), Mask::Causal, Tiles { bm: 32, bn: 64 }, f),
            AttnKernel::Standard
        );
        let s = ForwardKernel::Standard;
        assert_eq!(
            pick(Target::Sm90a, Some(128), Mask::Causal, Tiles { bm: 64, bn: 128 }, s),
            AttnKernel::Standard
        );
        assert_eq!(pick(Target::Sm90a, None, Mask::Causal, t, s), AttnKernel::Standard);
    }

    /// `--ws-loads`, `--ws-grid` and `--ws-turns` reach a warp-specialized attribute only; the
    /// defaults are [`WS_LOADS`], [`WS_GRID`] and [`WS_TURNS`].
    #[test]
    fn ws_options_choice() {
        let defaults = WsOptions::of(&PassOptions::default());
        assert_eq!(defaults, WsOptions { loads: WS_LOADS, grid: WS_GRID, turns: WS_TURNS });
        let asked = PassOptions {
            ws_loads: Some(KvLoads::CpAsync),
            ws_grid: Some(WsGrid::Persistent),
            ws_turns: Some(WsTurns::None),
            ..PassOptions::default()
        };
        let ws = WsOptions::of(&asked);
        assert_eq!(ws, WsOptions { loads: KvLoads::CpAsync, grid: WsGrid::Persistent, turns: WsTurns::None });
        let t = Tiles { bm: 64, bn: 128 };
        let k = super::kernel_for(Target::Sm90a, Some(128), &attn(Mask::Causal), t, ws, None);
        assert_eq!(
            k,
            AttnKernel::WarpSpecialized {
                head_dims: vec![128],
                loads: KvLoads::CpAsync,
                grid: WsGrid::Persistent,
                turns: WsTurns::None
            }
        );
        assert_eq!((k.ws_grid(), k.ws_turns()), (WsGrid::Persistent, WsTurns::None));
        let std = super::kernel_for(Target::Sm80, Some(128), &attn(Mask::Causal), t, ws, None);
        assert_eq!(std, AttnKernel::Standard);
        assert_eq!((std.ws_grid(), std.ws_turns()), (WsGrid::Tiles, WsTurns::Ring));
    }
}
