//! The warp-specialized forward attention kernel for sm_90a (issue 11).
//!
//! Selected per attention by the tiles pass (`kernel = warp_specialized(D = 128)`: the head dims
//! the choice holds for, `AttnKernel::runs_warp_specialized`; D = 64 builds, with three
//! consumers per block ([`residency`]), and runs under `--attn-kernel warp-specialized`); every
//! other attention keeps the kernel of [`super::attention`]. It computes the same function with
//! the same pieces (the wgmma steps, the score hook and masks, the online softmax, the in-kernel
//! start search, the epilogue), arranged differently (the figures below are D = 128's;
//! [`residency`] has them per head dim):
//!
//! * A block owns 128 query rows: three warpgroups, `384` threads (D = 64: 192 rows, four
//!   warpgroups, 512 threads). Warpgroup 0 is the **producer**: it drops to 56 registers
//!   (`setmaxnreg.dec`) and streams the K and V tiles (and the tile's gate cumsum `c_j`) into a
//!   ring of `stages` shared-memory slots: through the tensor memory accelerator (`loads = tma`,
//!   the tiles pass's default: one thread issues `cp.async.bulk.tensor` copies, [`tma`]) or with
//!   `cp.async` from all 128 threads (`loads = cp_async`). The other warpgroups are the
//!   **consumers**: each raises its limit (224 registers) and owns 64 query rows (its own Q
//!   tile), like one block of the old kernel, but all read the same K/V slot, so each K/V byte
//!   is loaded once per block.
//! * Inside a consumer ([`consumer`]), tile n's `Q K^T` and tile n+1's `P V` are issued together
//!   and tile n's softmax runs while the `P V` is on the tensor cores; the consumers take turns
//!   issuing their GEMMs (pingpong, a ring of named barriers), or (`turns = none`,
//!   `cfg.free_running`) issue them as soon as their operands are ready.
//! * The ring is guarded by mbarriers. `full[s]` completes when the slot's copies have landed
//!   (with TMA: one `arrive.expect_tx` of the tile's bytes, completed by the copies; with
//!   cp.async: 128 `cp.async.mbarrier.arrive.noinc`, one per producer thread) and its `c_j` are
//!   stored (128 plain arrivals, release); `empty[s]` completes when every consumer is done with
//!   the slot (128 arrivals per consumer after its wgmmas have waited). Fill `f` of the walk uses
//!   slot `f % stages` in round `f / stages`: consumers wait on `full` with parity `round & 1`,
//!   the producer on `empty` with `(round & 1) ^ 1` (a fresh barrier passes that at once).
//! * The walk over key tiles goes from the diagonal tile of the block's last row (`hi`, no search
//!   needed) down to the smallest of the consumers' start tiles (`lo`); each consumer computes
//!   the tiles in its own range `[start_w, end_w]` (its own IR query tile's `start`) and only
//!   releases the others. Each warpgroup finds every start itself (warps 0-1 search consumer 0's
//!   (and 2's), warps 2-3 consumer 1's, results exchanged in shared memory behind a barrier of
//!   the warpgroup), after its first loads are out: the producer's first fill (tile `hi`, slot 0)
//!   and the consumers' Q tiles land while the searches' dependent loads run.
//! * bf16 output goes through shared memory (the consumer's Q tile, free at the end), written
//!   to global memory with 16-byte coalesced stores ([`epilogue`]).
//! * Grid `(ceil(T / rows), B H)`, block index reversed so the longest query tiles start first;
//!   or (`grid = persistent`, `cfg.persistent`, two consumers only) one block per multiprocessor
//!   looping over the same `(head, query tile)` items in the same order, handed out by a counter
//!   ([`persist`]).
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

use super::attention::params::FwdTail;
use super::attention::score::ScoreMod;
use super::attention::{AttnKernelConfig, LaunchGeometry};
use super::builder::KernelBuilder;
use inkwell::context::Context;
use inkwell::module::Module;
use inkwell::values::FunctionValue;

/// Head dimensions of this kernel (one or two 64-column wgmma panels).
pub const HEAD_DIMS: [u32; 2] = [64, 128];

/// Threads per block with two consumer warpgroups (D = 128): the producer warpgroup and the
/// consumers ([`Residency::threads`] in general).
pub const THREADS: u32 = 384;

/// Query rows per block with two consumers (64 per consumer warpgroup; [`Residency::rows`]).
pub const BLOCK_ROWS: u32 = 128;

/// How a block of this kernel is made up at a head dim and how many share an SM: the one table
/// of the per-head-dim figures (consumer warpgroups, registers at entry and after `setmaxnreg`,
/// shared memory, and with it the ring's depth through [`layout`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Residency {
    /// Consumer warpgroups per block (64 query rows each), beside the one producer warpgroup.
    pub consumers: u32,
    /// Blocks per SM the kernel is built for (`.minnctapersm`).
    pub blocks_per_sm: u32,
    /// Registers per thread at entry: the SM's 65 536 over `blocks_per_sm` blocks of
    /// [`Self::threads`], rounded down to the allocation unit of 8. Each block's `setmaxnreg`
    /// pool is `threads * entry_regs` (the pool is per block).
    pub entry_regs: u32,
    /// The producer's limit after `setmaxnreg.dec`.
    pub producer_regs: u32,
    /// Each consumer's limit after `setmaxnreg.inc`: the 128 producer threads and all consumer
    /// threads must fit in the block's pool (`inc` waits for free registers: more would hang).
    pub consumer_regs: u32,
    /// Dynamic shared memory one block may use: the SM's 228 KB over the blocks, less the 1 KB
    /// the hardware reserves per block.
    pub max_shared: u32,
}

impl Residency {
    /// Threads per block: the producer warpgroup and the consumers.
    pub fn threads(&self) -> u32 {
        128 * (1 + self.consumers)
    }

    /// Query rows per block.
    pub fn rows(&self) -> u32 {
        64 * self.consumers
    }
}

/// The residency at head dim `d` with `bn`-key tiles:
/// * D = 128, and D = 64 with 128-key tiles: one block of two consumers per SM, 168 registers
///   at entry, 56 / 224 after `setmaxnreg` (56 x 128 + 224 x 256 = 64 512; at 40 the producer
///   spilled a register), up to 227 KB of shared memory (three slots of 128-key tiles at
///   D = 128). At D = 64 three consumers of 128-key tiles spill at 160 registers (the SASS shows
///   the tile width, not the ring, is what the standard kernel's instruction count needs), so
///   128-key tiles take two consumers with 224.
/// * D = 64 with 64-key tiles: one block of three consumers per SM (192 query rows, 512
///   threads), as FlashAttention-3 does at D = 64: two consumers per SM measured 1.4x slower
///   than the standard kernel's three 64-row blocks, and two blocks of two consumers per SM
///   leave each consumer 104 registers (a pool of 384 x 80 per block), where ptxas spills and
///   serializes the wgmmas. 128 registers at entry; producer 32 (at 24 the `cp.async` producer
///   spilled 8 bytes), consumers 160 (32 x 128 + 160 x 384 = 65 536, the whole pool).
pub fn residency(d: u32, bn: u32) -> Residency {
    let consumers = if d <= 64 && bn <= 64 { 3 } else { 2 };
    let blocks_per_sm = 1;
    let threads = 128 * (1 + consumers);
    let entry_regs = 65_536 / (blocks_per_sm * threads) / 8 * 8;
    let (producer_regs, consumer_regs) = if consumers == 2 { (56, 224) } else { (32, 160) };
    debug_assert!(128 * producer_regs + 128 * consumers * consumer_regs <= threads * entry_regs);
    let max_shared = SM_SHARED / blocks_per_sm - BLOCK_RESERVED_SHARED;
    Residency { consumers, blocks_per_sm, entry_regs, producer_regs, consumer_regs, max_shared }
}

/// Most slots of the K/V ring (more buys nothing once loads are hidden; fewer saves memory).
const MAX_STAGES: u32 = 4;

/// Bytes of each warpgroup's share of the start exchange: one i32 per consumer, rounded up to 8.
pub(crate) fn xch_stride(consumers: u32) -> u32 {
    (4 * consumers).div_ceil(8) * 8
}

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
    /// The start tiles each warpgroup's search halves hand each other: warpgroup `wg`'s i32
    /// start of consumer `w` at `xch0 + wg xch_stride + 4 w` ([`xch_stride`]).
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
    let r = residency(d, cfg.bn);
    let max_shared = r.max_shared;
    let q_bytes = 64 * d * 2;
    // Two i32 per warpgroup with two consumers (32 bytes, as before), more with three.
    let xch_bytes = (xch_stride(r.consumers) * (1 + r.consumers)).max(32);
    let kv_bytes = cfg.bn * d * 2;
    let kv0 = r.consumers * q_bytes;
    let per_stage = 2 * kv_bytes + 4 * cfg.bn + 16;
    let item_bytes = if cfg.persistent { ITEM_BYTES } else { 0 };
    let stages = (max_shared.saturating_sub(kv0 + xch_bytes + item_bytes) / per_stage).min(MAX_STAGES);
    if stages < 2 {
        return Err(format!(
            "warp-specialized attention: tiles {}x{} at head_dim {d} leave room for {stages} K/V slots (needs 2)",
            r.rows(),
            cfg.bn
        ));
    }
    let c0 = kv0 + stages * 2 * kv_bytes;
    let bar0 = c0 + stages * 4 * cfg.bn;
    let xch0 = bar0 + 16 * stages;
    let item0 = xch0 + xch_bytes;
    Ok(WsLayout { q_bytes, kv_bytes, stages, kv0, c0, bar0, xch0, item0, total: item0 + item_bytes })
}

/// The persistent grid runs blocks of two consumer warpgroups only: the three consumers of
/// D = 64 with 64-key tiles were not run with it. A usage error: the grid is asked for.
pub fn check_persistent(cfg: &AttnKernelConfig) -> Result<(), String> {
    let consumers = residency(cfg.head_dim, cfg.bn).consumers;
    if cfg.persistent && consumers != 2 {
        return Err(format!(
            "--ws-grid persistent runs the warp-specialized attention with two consumer warpgroups; at head_dim {} with {}-key tiles it has {consumers}, not run with the persistent grid: use --ws-grid tiles or 128-key tiles",
            cfg.head_dim, cfg.bn
        ));
    }
    Ok(())
}

/// Errors for configurations this kernel does not implement.
pub fn validate(cfg: &AttnKernelConfig) -> Result<(), String> {
    if !HEAD_DIMS.contains(&cfg.head_dim) {
        return Err(format!("warp-specialized attention supports head_dim 64 and 128, got {}", cfg.head_dim));
    }
    if cfg.sm != 90 {
        return Err(format!("warp-specialized attention needs sm_90a, got sm_{}", cfg.sm));
    }
    check_persistent(cfg)?;
    // The consumers run the old kernel's 64-row wgmma steps: its own checks hold for them.
    consumer_view(cfg).validate()?;
    layout(cfg).map(|_| ())
}

/// The configuration each consumer warpgroup computes with: the old kernel's 64-row wgmma
/// block (128 threads), same tiles, scale, mask and rule.
pub(crate) fn consumer_view(cfg: &AttnKernelConfig) -> AttnKernelConfig {
    AttnKernelConfig { ws: false, ..cfg.clone() }
}

/// Grid `(ceil(T / rows), BH)`, the residency's rows and threads, the layout's shared memory.
/// The persistent kernel: as many blocks as the `sms` multiprocessors hold at once (one per SM,
/// [`residency`]), never more blocks than work items; without a device count one block per
/// item (the same kernel: each block then runs its own item and finds the counter past the
/// end).
pub fn launch_geometry(cfg: &AttnKernelConfig, t: u64, bh: u64, sms: Option<u32>) -> LaunchGeometry {
    let shared_bytes = layout(cfg).map(|l| l.total).unwrap_or(0);
    let r = residency(cfg.head_dim, cfg.bn);
    let tiles = t.div_ceil(r.rows() as u64);
    let grid = if cfg.persistent {
        let items = tiles * bh;
        let resident = sms.map(|s| s.max(1) as u64 * r.blocks_per_sm as u64);
        let blocks = resident.map_or(items, |n| items.min(n));
        (blocks.min(i32::MAX as u64) as u32, 1, 1)
    } else {
        (tiles as u32, bh as u32, 1)
    };
    LaunchGeometry { grid, block: (r.threads(), 1, 1), shared_bytes }
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
    params.extend(FwdTail::of(cfg, extra.len()).signature());
    let lay = layout(cfg)?;
    let view = consumer_view(cfg);
    let b = KernelBuilder::kernel(ctx, module, name, &params)?;
    roles::emit(&b, cfg, &view, &lay, score, name);
    // setmaxnreg needs a register cap at entry: the residency's threads and blocks per SM.
    let r = residency(cfg.head_dim, cfg.bn);
    b.launch_bounds(r.threads(), r.blocks_per_sm);
    b.finish()
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod turns_tests;
