//! The warp-specialized forward attention kernel for sm_90a (issue 11).
//!
//! Selected per attention by the tiles pass (`kernel = warp_specialized(D = 128)`: the head dims
//! the choice holds for, `AttnKernel::runs_warp_specialized`; D = 64 builds and is checked, but was
//! measured slower than the standard kernel); every other attention keeps the kernel of
//! [`super::attention`]. Measured in docs/GPU_KERNEL.md, runs 8-11. It computes the same function with
//! the same pieces (the wgmma steps, the score hook and masks, the online softmax, the in-kernel
//! start search, the epilogue), arranged differently:
//!
//! * A block owns 128 query rows: three warpgroups, `384` threads. Warpgroup 0 is the
//!   **producer**: it drops to 56 registers (`setmaxnreg.dec`) and streams the K and V tiles
//!   (and the tile's gate cumsum `c_j`) into a ring of `stages` shared-memory slots: through the
//!   tensor memory accelerator (`loads = tma`, the tiles pass's default since run 11: one thread
//!   issues `cp.async.bulk.tensor` copies, [`tma`]) or with `cp.async` from all 128 threads
//!   (`loads = cp_async`). Warpgroups 1 and 2 are the **consumers**: each raises its limit to 224
//!   registers and owns 64 query rows (its own Q tile), like one block of the old kernel, but
//!   both read the same K/V slot, so each K/V byte is loaded once per 128 rows.
//! * Inside a consumer ([`consumer`]), tile n's `Q K^T` and tile n+1's `P V` are issued together
//!   and tile n's softmax runs while the `P V` is on the tensor cores; the two consumers take
//!   turns issuing their GEMMs (pingpong on two named barriers).
//! * The ring is guarded by mbarriers. `full[s]` completes when the slot's copies have landed
//!   (with TMA: one `arrive.expect_tx` of the tile's bytes, completed by the copies; with
//!   cp.async: 128 `cp.async.mbarrier.arrive.noinc`, one per producer thread) and its `c_j` are
//!   stored (128 plain arrivals, release); `empty[s]` completes when both consumers are done with the
//!   slot (256 arrivals after their wgmmas have waited). Fill `f` of the walk uses slot
//!   `f % stages` in round `f / stages`: consumers wait on `full` with parity `round & 1`, the
//!   producer on `empty` with `(round & 1) ^ 1` (a fresh barrier passes that at once).
//! * The walk over key tiles goes from the diagonal tile of the block's last row (`hi`, no search
//!   needed) down to the smaller of the two consumers' start tiles (`lo`); each consumer computes
//!   the tiles in its own range `[start_w, end_w]` (its own IR query tile's `start`) and only
//!   releases the others. Each warpgroup finds both starts itself (warps 0-1 search one, warps
//!   2-3 the other, results exchanged in shared memory behind a barrier of the warpgroup), after
//!   its first loads are out: the producer's first fill (tile `hi`, slot 0) and the consumers'
//!   Q tiles land while the searches' dependent loads run (run 10).
//! * bf16 output goes through shared memory (the consumer's Q tile, free at the end), written
//!   to global memory with 16-byte coalesced stores ([`epilogue`]).
//! * Grid `(ceil(T / 128), B H)`, block index reversed so the longest query tiles start first;
//!   or (`grid = persistent`, `cfg.persistent`) one block per multiprocessor looping over the
//!   same `(head, query tile)` items in the same order, handed out by a counter ([`persist`]).
//!
//! Kernel parameters are those of the old kernel (module docs of [`super::attention`]), in the
//! same order, followed by the score modification's, with `loads = tma` (`cfg.tma`) the
//! tensor maps of K and V ([`tma`]), and with `cfg.persistent` the head count and the work
//! counter ([`persist`]). Launch with [`launch_geometry`].

mod consumer;
mod epilogue;
mod persist;
mod roles;
mod sync;
pub(crate) mod tma;

use super::attention::score::ScoreMod;
use super::attention::{AttnKernelConfig, LaunchGeometry};
use super::builder::KernelBuilder;
use inkwell::attributes::AttributeLoc;
use inkwell::context::Context;
use inkwell::module::Module;
use inkwell::values::FunctionValue;

/// Head dimensions of this kernel (one or two 64-column wgmma panels).
pub const HEAD_DIMS: [u32; 2] = [64, 128];

/// Threads per block: the producer warpgroup and two consumer warpgroups.
pub const THREADS: u32 = 384;

/// Query rows per block (64 per consumer warpgroup).
pub const BLOCK_ROWS: u32 = 128;

/// Register limits after `setmaxnreg`: 56 x 128 + 224 x 256 = 64 512 of the SM's 65 536 (at 40
/// the producer spilled a register).
pub(crate) const PRODUCER_REGS: u32 = 56;
pub(crate) const CONSUMER_REGS: u32 = 224;

/// Most slots of the K/V ring (more buys nothing once loads are hidden; fewer saves memory).
const MAX_STAGES: u32 = 4;

/// Bytes of the start exchange (two i32 per warpgroup, rounded up).
const XCH_BYTES: u32 = 32;

/// Bytes of the persistent kernel's work-item ring ([`persist`]): two `item_full` and two
/// `item_empty` mbarriers, two entries of four i32, the producer's two next-item words.
const ITEM_BYTES: u32 = 72;

/// Dynamic shared memory an sm_90 block may have.
const MAX_SHARED: u32 = 232_448;

/// Byte offsets of the shared-memory regions (every K/V tile 1024-aligned for the swizzle).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WsLayout {
    /// Bytes of one consumer's Q tile (64 rows); consumer `w` has its Q at `w * q_bytes`.
    pub q_bytes: u32,
    /// Bytes of one K (or V) tile.
    pub kv_bytes: u32,
    pub stages: u32,
    /// Slot 0's K tile; slot `s` has K at `kv0 + 2 s kv_bytes` and V right after it.
    pub kv0: u32,
    /// Slot 0's `c_j` (f32 per key column); slot `s` at `c0 + s * 4 bn`.
    pub c0: u32,
    /// `full[s]` at `bar0 + 8 s`, `empty[s]` at `bar0 + 8 (stages + s)`.
    pub bar0: u32,
    /// The start tiles each warpgroup's search halves hand each other: warpgroup `wg`'s pair
    /// (i32 start of consumer 0, of consumer 1) at `xch0 + 8 wg`.
    pub xch0: u32,
    /// The persistent kernel's work-item ring (`cfg.persistent`; [`persist`]): `item_full[e]`
    /// at `item0 + 8 e`, `item_empty[e]` at `item0 + 16 + 8 e`, entry `e` (i32 item, the two
    /// consumers' start tiles) at `item0 + 32 + 16 e`, the producer's next item `k` at
    /// `item0 + 64 + 4 (k % 2)`; `ITEM_BYTES` (0 without).
    pub item0: u32,
    pub total: u32,
}

/// The layout for `cfg` (the deepest ring up to [`MAX_STAGES`] that fits), or why none fits.
pub fn layout(cfg: &AttnKernelConfig) -> Result<WsLayout, String> {
    let d = cfg.head_dim;
    let q_bytes = 64 * d * 2;
    let kv_bytes = cfg.bn * d * 2;
    let kv0 = 2 * q_bytes;
    let per_stage = 2 * kv_bytes + 4 * cfg.bn + 16;
    let item_bytes = if cfg.persistent { ITEM_BYTES } else { 0 };
    let stages = (MAX_SHARED.saturating_sub(kv0 + XCH_BYTES + item_bytes) / per_stage).min(MAX_STAGES);
    if stages < 2 {
        return Err(format!(
            "warp-specialized attention: tiles 128x{} at head_dim {d} leave room for {stages} K/V slots (needs 2)",
            cfg.bn
        ));
    }
    let c0 = kv0 + stages * 2 * kv_bytes;
    let bar0 = c0 + stages * 4 * cfg.bn;
    let xch0 = bar0 + 16 * stages;
    let item0 = xch0 + XCH_BYTES;
    Ok(WsLayout { q_bytes, kv_bytes, stages, kv0, c0, bar0, xch0, item0, total: item0 + item_bytes })
}

/// Errors for configurations this kernel does not implement.
pub fn validate(cfg: &AttnKernelConfig) -> Result<(), String> {
    if !HEAD_DIMS.contains(&cfg.head_dim) {
        return Err(format!("warp-specialized attention supports head_dim 64 and 128, got {}", cfg.head_dim));
    }
    if cfg.sm != 90 {
        return Err(format!("warp-specialized attention needs sm_90a, got sm_{}", cfg.sm));
    }
    // The consumers run the old kernel's 64-row wgmma steps: its own checks hold for them.
    consumer_view(cfg).validate()?;
    layout(cfg).map(|_| ())
}

/// The configuration each consumer warpgroup computes with: the old kernel's 64-row wgmma
/// block (128 threads), same tiles, scale, mask and rule.
pub(crate) fn consumer_view(cfg: &AttnKernelConfig) -> AttnKernelConfig {
    AttnKernelConfig { ws: false, ..cfg.clone() }
}

/// Grid `(ceil(T / 128), BH)`, [`THREADS`] threads, the layout's shared memory. The
/// persistent kernel: one block per multiprocessor (`sms`; shared memory and registers allow
/// one), never more blocks than work items; without a device count one block per item (the
/// same kernel: each block then runs its own item and finds the counter past the end).
pub fn launch_geometry(cfg: &AttnKernelConfig, t: u64, bh: u64, sms: Option<u32>) -> LaunchGeometry {
    let shared_bytes = layout(cfg).map(|l| l.total).unwrap_or(0);
    let tiles = t.div_ceil(BLOCK_ROWS as u64);
    let grid = if cfg.persistent {
        let items = tiles * bh;
        let blocks = sms.map_or(items, |s| items.min(s.max(1) as u64));
        (blocks.min(i32::MAX as u64) as u32, 1, 1)
    } else {
        (tiles as u32, bh as u32, 1)
    };
    LaunchGeometry { grid, block: (THREADS, 1, 1), shared_bytes }
}

/// Adds the warp-specialized kernel for `cfg` (named `kernel_name`, which carries `_ws`) with
/// the score modification `score`; returns the existing function if the module has it.
pub(crate) fn build<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    cfg: &AttnKernelConfig,
    score: &dyn ScoreMod,
    name: &str,
) -> Result<FunctionValue<'ctx>, String> {
    validate(cfg)?;
    if let Some(f) = module.get_function(name) {
        return Ok(f);
    }
    let mut params = super::attention::fixed_params();
    let extra = score.params();
    params.extend(extra.iter().map(|(n, t)| (n.as_str(), *t)));
    if cfg.tma {
        params.extend(tma::PARAMS);
    }
    if cfg.persistent {
        params.extend(persist::PARAMS);
    }
    let lay = layout(cfg)?;
    let view = consumer_view(cfg);
    let b = KernelBuilder::kernel(ctx, module, name, &params)?;
    roles::emit(&b, cfg, &view, &lay, score, name);
    let f = b.finish()?;
    // setmaxnreg needs a register cap at entry: 384 threads, one block per SM (168 registers).
    for (k, v) in [("nvvm.maxntid", THREADS.to_string()), ("nvvm.minctasm", "1".to_string())] {
        f.add_attribute(AttributeLoc::Function, ctx.create_string_attribute(k, &v));
    }
    Ok(f)
}

#[cfg(test)]
mod tests;
