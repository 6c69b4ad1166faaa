//! The warp-specialized forward attention kernel for sm_90a (issue 11).
//!
//! Selected per attention by the tiles pass (`kernel = warp_specialized(D = 128)`: the head dims
//! the choice holds for, `AttnKernel::runs_warp_specialized`; D = 64 builds, two blocks per SM with
//! 64-key tiles ([`residency`]), and runs under `--attn-kernel warp-specialized`; run 8 measured it
//! slower than the standard kernel at one block per SM); every other attention keeps the kernel of
//! [`super::attention`]. Measured in docs/GPU_KERNEL.md, runs 8-11. It computes the same function with
//! the same pieces (the wgmma steps, the score hook and masks, the online softmax, the in-kernel
//! start search, the epilogue), arranged differently:
//!
//! * A block owns 128 query rows: three warpgroups, `384` threads. Warpgroup 0 is the
//!   **producer**: it drops to 56 registers (`setmaxnreg.dec`; the figures per head dim are
//!   [`residency`]'s) and streams the K and V tiles
//!   (and the tile's gate cumsum `c_j`) into a ring of `stages` shared-memory slots: through the
//!   tensor memory accelerator (`loads = tma`, the tiles pass's default since run 11: one thread
//!   issues `cp.async.bulk.tensor` copies, [`tma`]) or with `cp.async` from all 128 threads
//!   (`loads = cp_async`). Warpgroups 1 and 2 are the **consumers**: each raises its limit (224
//!   registers) and owns 64 query rows (its own Q tile), like one block of the old kernel, but
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

/// How many blocks of this kernel share an SM at a head dim, and what that leaves each block:
/// the one table of the per-head-dim figures (registers at entry and after `setmaxnreg`, shared
/// memory, and with it the ring's depth through [`layout`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Residency {
    /// Blocks per SM the kernel is built for (`.minnctapersm`).
    pub blocks_per_sm: u32,
    /// Registers per thread at entry: the SM's 65 536 over `blocks_per_sm` blocks of [`THREADS`],
    /// rounded down to the allocation unit of 8. Each block's `setmaxnreg` pool is
    /// `THREADS * entry_regs`.
    pub entry_regs: u32,
    /// The producer's limit after `setmaxnreg.dec`.
    pub producer_regs: u32,
    /// Each consumer's limit after `setmaxnreg.inc`: 128 producer threads and 256 consumer
    /// threads must fit in the block's pool (`inc` waits for free registers: more would hang).
    pub consumer_regs: u32,
    /// Dynamic shared memory one block may use: the SM's 228 KB over the blocks, less the 1 KB
    /// the hardware reserves per block.
    pub max_shared: u32,
    /// A consumer runs tile n's softmax while tile n+1's `P V` is on the tensor cores (it then
    /// holds two tiles of P and the O being written: [`consumer`]); without, it waits for both
    /// GEMMs of its turn before the softmax (the other consumers' GEMMs still overlap it).
    pub overlap: bool,
}

/// The residency at head dim `d` with `bn`-key tiles:
/// * D = 128 (and D = 64 with 128-key tiles): one block per SM, 168 registers at entry, 56 /
///   224 after `setmaxnreg` (56 x 128 + 224 x 256 = 64 512; at 40 the producer spilled a
///   register, run 8), up to 227 KB of shared memory (three slots of 128-key tiles at D = 128).
/// * D = 64 with 64-key tiles: two blocks per SM (run 8: one block of two consumers per SM ran
///   1.4x slower than the standard kernel's three 64-row blocks), so 80 registers at entry
///   (65 536 / 768 = 85, rounded down to 8) and a pool of 384 x 80 = 30 720 per block: producer
///   24 (the least `setmaxnreg` takes), consumers 104 (24 x 128 + 104 x 256 = 29 696; 112 would
///   need 31 744); 113 KB of shared memory per block (4 slots). The consumers do not overlap
///   their own softmax with their `P V` there: with the overlap ptxas spilled 68 bytes and
///   serialized their wgmmas at 104 registers (C7512; it needs about 128); without it, see
///   [`consumer`]'s tests. With 128-key tiles (S of 64 registers) ptxas could not fit a wgmma
///   under the cap of 80 at entry (C7602), hence one block per SM there.
pub fn residency(d: u32, bn: u32) -> Residency {
    let blocks_per_sm = if d <= 64 && bn <= 64 { 2 } else { 1 };
    let entry_regs = 65_536 / (blocks_per_sm * THREADS) / 8 * 8;
    let (producer_regs, consumer_regs) = if blocks_per_sm == 1 { (56, 224) } else { (24, 104) };
    debug_assert!(128 * producer_regs + 256 * consumer_regs <= THREADS * entry_regs);
    let max_shared = SM_SHARED / blocks_per_sm - BLOCK_RESERVED_SHARED;
    let overlap = blocks_per_sm == 1;
    Residency { blocks_per_sm, entry_regs, producer_regs, consumer_regs, max_shared, overlap }
}

/// Most slots of the K/V ring (more buys nothing once loads are hidden; fewer saves memory).
const MAX_STAGES: u32 = 4;

/// Bytes of the start exchange (two i32 per warpgroup, rounded up).
const XCH_BYTES: u32 = 32;

/// Bytes of the persistent kernel's work-item ring ([`persist`]): two `item_full` and two
/// `item_empty` mbarriers, two entries of four i32, the producer's two next-item words.
const ITEM_BYTES: u32 = 72;

/// Shared memory of an sm_90 SM (228 KB) and what the hardware reserves of it per block.
const SM_SHARED: u32 = 233_472;
const BLOCK_RESERVED_SHARED: u32 = 1024;

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

/// The layout for `cfg` (the deepest ring up to [`MAX_STAGES`] that fits in the shared memory
/// of its [`residency`]), or why none fits.
pub fn layout(cfg: &AttnKernelConfig) -> Result<WsLayout, String> {
    let d = cfg.head_dim;
    let max_shared = residency(d, cfg.bn).max_shared;
    let q_bytes = 64 * d * 2;
    let kv_bytes = cfg.bn * d * 2;
    let kv0 = 2 * q_bytes;
    let per_stage = 2 * kv_bytes + 4 * cfg.bn + 16;
    let item_bytes = if cfg.persistent { ITEM_BYTES } else { 0 };
    let stages = (max_shared.saturating_sub(kv0 + XCH_BYTES + item_bytes) / per_stage).min(MAX_STAGES);
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
/// persistent kernel: as many blocks as the `sms` multiprocessors hold at once (one per SM at
/// D = 128, [`residency`]), never more blocks than work items; without a device count one block per item (the
/// same kernel: each block then runs its own item and finds the counter past the end).
pub fn launch_geometry(cfg: &AttnKernelConfig, t: u64, bh: u64, sms: Option<u32>) -> LaunchGeometry {
    let shared_bytes = layout(cfg).map(|l| l.total).unwrap_or(0);
    let tiles = t.div_ceil(BLOCK_ROWS as u64);
    let grid = if cfg.persistent {
        let items = tiles * bh;
        // Blocks resident at once: the SMs times the blocks one SM holds (residency).
        let resident = sms.map(|s| s.max(1) as u64 * residency(cfg.head_dim, cfg.bn).blocks_per_sm as u64);
        let blocks = resident.map_or(items, |r| items.min(r));
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
    // setmaxnreg needs a register cap at entry: 384 threads, the residency's blocks per SM.
    let blocks = residency(cfg.head_dim, cfg.bn).blocks_per_sm.to_string();
    for (k, v) in [("nvvm.maxntid", THREADS.to_string()), ("nvvm.minctasm", blocks)] {
        f.add_attribute(AttributeLoc::Function, ctx.create_string_attribute(k, &v));
    }
    Ok(f)
}

#[cfg(test)]
mod tests;
