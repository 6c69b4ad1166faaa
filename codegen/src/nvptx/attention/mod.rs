//! The pruned FoX forward attention kernel (FlashAttention-2 style), emitted as LLVM IR for NVPTX.
//!
//! One thread block owns one query tile of `bm` rows (`bm / 16` warps, 16 rows per warp) and walks
//! its kept key tiles only, from the diagonal tile down to `start[m]`:
//!
//! * `start[m]` is found inside the kernel (no separate launch): a 32-ary search by each warp over
//!   the key-tile ends (`c` is non-increasing, so "tile kept" is monotone in the tile index); two or
//!   three rounds of one load per lane instead of a chain of dependent loads ([`prune`]).
//! * sm_90 with `bm = 64` (the default; one warpgroup per block) and `D` a multiple of 64:
//!   `S = Q K^T` with `wgmma.mma_async m64n{bn}k16` (Q and K from shared-memory descriptors,
//!   K-major, 128-byte swizzle) and `O += P V` with `wgmma m64n{D}k16` (P from registers, V as the
//!   transposed, MN-major B operand). Otherwise (sm_80, `bm = 128`, or `D` = 32 or 96):
//!   `mma.sync.m16n8k16` bf16 for both, Q fragments kept in registers, K and V read with
//!   `ldmatrix` (`.trans` for V) ([`mma`]).
//! * K and V tiles are staged in shared memory with `cp.async` (double buffered: tile n-1 is in
//!   flight while tile n is computed; `fence.proxy.async` before wgmma reads them). Rows are 16-byte
//!   chunks XOR-swizzled by the row (the wgmma layout splits rows into 64-column panels of
//!   128 bytes, the hardware's 128B swizzle), so no `ldmatrix` phase has bank conflicts
//!   ([`tile_io`]).
//! * Scores `s = scale * q.k + (c_i - c_j)`, modified by the [`score::ScoreMod`] hook; online
//!   softmax with `ex2.approx` (log2 e folded into one FMA per element); the causal / tail /
//!   window mask runs only on tiles that need it ([`softmax`]).
//! * Query tiles are scheduled longest first (`blockIdx.x` reversed), so blocks with few kept
//!   tiles fill in behind the long ones.
//!
//! # Kernel parameters, in order
//!
//! 1. `q`: bf16 `[BH, T, D]` (global pointer)
//! 2. `k`: bf16 `[BH, T, D]`
//! 3. `v`: bf16 `[BH, T, D]`
//! 4. `c`: f32 `[BH, T]`, the gate cumsum (read only when `has_decay`; pass any valid pointer otherwise)
//! 5. `delta`: f32 `[BH, Mt]`, `Mt = ceil(T / bm)`, per query tile (read only when `prune`)
//! 6. `out`: `[BH, T, D]`, **f32**, or **bf16** (round to nearest even) when `out_half` is set
//!    (the backend sets it when the attention's only user is a cast to bf16, so no cast pass runs)
//! 7. `lse`: f32 `[BH, T]`, natural-log log-sum-exp of the (kept) scores of each row
//! 8. `T`: i32, the sequence length (any T >= 1; tails are masked)
//! 9. and on: the score modification's parameters ([`score::ScoreMod::params`]; a region's
//!    captured tensors, each a pointer and its axis sizes as i32, see [`region::ScoreArg`])
//!
//! Launch with [`launch_geometry`]; the kernel needs `shared_bytes` of dynamic shared memory
//! (above 48 KiB, so the launcher must raise `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`).
//!
//! Supported: `head_dim` 32, 64, 96, 128 or 256 (64 and 128 are the tuned ones), `bm` 64 or 128,
//! `bn` a multiple of 16 up to 128, bf16 inputs, sm_80 (mma.sync) and sm_90 (wgmma when bm = 64
//! and D is a multiple of 64; the PTX then needs `sm_90a`). Measured on the H200:
//! docs/GPU_KERNEL.md.

pub(crate) mod key_bound;
pub(crate) mod mma;
pub(crate) mod params;
pub(crate) mod prune;
pub(crate) mod region;
pub(crate) mod score;
mod softmax;
pub mod split_merge;
mod tile_io;

use super::builder::control::{basic, floats};
use super::builder::{Half, KernelBuilder, ParamTy};
use crate::nvptx::heads;
use inkwell::context::Context;
use inkwell::module::Module;
use inkwell::values::{BasicValueEnum, FloatValue, FunctionValue, IntValue, PointerValue};
use inkwell::IntPredicate;
use score::{Identity, ScoreMod};

/// The head dimensions the kernel is built for.
pub const HEAD_DIMS: [u32; 5] = [32, 64, 96, 128, 256];

/// Most dynamic shared memory one block may use: 227 KiB on sm_90, 163 KiB on sm_80.
fn max_shared_bytes(sm: u32) -> u32 {
    if sm >= 90 {
        232_448
    } else {
        166_912
    }
}

/// One attention kernel configuration (tile sizes and rule come from the IR attributes).
#[derive(Debug, Clone, PartialEq)]
pub struct AttnKernelConfig {
    pub head_dim: u32,
    pub bm: u32,
    pub bn: u32,
    pub scale: f32,
    pub has_decay: bool,
    pub window: Option<u32>,
    /// Keys after the query row are masked and their tiles never visited (causal and window
    /// masks); false for no mask and expression masks: every key tile up to `T` is visited.
    pub causal: bool,
    /// Start each query tile at `start[m]` found from `delta` by an in-kernel search.
    pub prune: bool,
    /// The 16-bit type of q, k, v (and of P in `O += P V`).
    pub dtype_in: Half,
    /// 80 or 90 (the same code; recorded for the kernel name).
    pub sm: u32,
    /// Write O in `dtype_in` instead of f32 (the output cast fused into the epilogue). The LSE
    /// stays f32.
    pub out_half: bool,
    /// Query heads per key/value head (grouped-query attention): K and V are
    /// `[B, H / kv_group, T, D]` and query head `h` reads key/value head `h / kv_group`.
    pub kv_group: u32,
    /// Run the warp-specialized sm_90a kernel ([`crate::nvptx::attention_ws`]) instead: set
    /// from the attention's `kernel` attribute (a pass decision).
    pub ws: bool,
    /// With `ws`: the producer loads K and V through the tensor memory accelerator (two tensor
    /// map parameters last; [`crate::nvptx::attention_ws`]'s `tma` module), from the
    /// attention's `kernel` attribute (`loads = tma`).
    pub tma: bool,
    /// With `ws`: one block per multiprocessor looping over `(head, query tile)` work items
    /// from a counter ([`crate::nvptx::attention_ws`]'s `persist` module; two parameters more:
    /// `BH` and the counter), from the attention's `kernel` attribute (`grid = persistent`).
    pub persistent: bool,
    /// With `ws`: the consumer warpgroups issue their GEMMs as soon as their operands are ready,
    /// without the ring of turns (no turn barriers), from the attention's `kernel` attribute
    /// (`turns = none`).
    pub free_running: bool,
    /// Debug: also write each query tile's in-kernel `start` to an extra pointer parameter
    /// after the score hook's (i32 `[B, H, ceil(T / bm)]`; standard kernel only).
    pub debug_starts: bool,
    /// K, V and c have their own length `Tk >= T` (the last parameter, `Tk`): the `T` queries
    /// sit at the end of the keys, row `i` at key position `i + Tk - T` (its causal diagonal and
    /// its `c`).
    pub fewer_queries: bool,
    /// Split keys (the attention's `kernel = split_keys(tiles = S)`): block `z` (`ctaid.z`) walks
    /// the kept tiles among `z S ..= z S + S - 1` only and writes its partial, the rows' output
    /// normalized by its own sum and their log-sum-exp, at plane `z` of `out` (f32
    /// `[Z, BH, T, D]`) and `lse` (`[Z, BH, T]`); [`split_merge`] combines the planes. A block
    /// with no kept tile writes zeros and `-inf`. Standard kernel, f32 output only.
    pub split_tiles: Option<u32>,
}

impl AttnKernelConfig {
    /// The standard configuration for a head dimension: bm = 64 (4 warps, two blocks per SM;
    /// measured faster than bm = 128 on the H200, docs/GPU_KERNEL.md), bn = 64.
    pub fn new(head_dim: u32, has_decay: bool, prune: bool) -> Self {
        AttnKernelConfig {
            head_dim,
            bm: 64,
            bn: 64,
            scale: 1.0 / (head_dim as f32).sqrt(),
            has_decay,
            window: None,
            causal: true,
            prune,
            dtype_in: Half::Bf16,
            sm: 90,
            out_half: false,
            kv_group: 1,
            ws: false,
            tma: false,
            persistent: false,
            free_running: false,
            debug_starts: false,
            fewer_queries: false,
            split_tiles: None,
        }
    }

    /// Kernel symbol name; distinct for every configuration so several fit in one module.
    pub fn kernel_name(&self) -> String {
        format!(
            "foxc_attn_fwd{}{}{}_d{}_bm{}_bn{}{}{}{}{}{}{}{}{}{}{}{}_s{:08x}_sm{}",
            match (self.ws, self.tma) {
                (true, true) => "_ws_tma",
                (true, false) => "_ws",
                (false, _) => "",
            },
            if self.ws && self.persistent { "_persist" } else { "" },
            if self.ws && self.free_running { "_free" } else { "" },
            self.head_dim,
            self.bm,
            self.bn,
            if self.block_rows() != self.bm { format!("_k{}", self.block_rows()) } else { String::new() },
            if self.causal { "" } else { "_bidir" },
            if self.has_decay { "_decay" } else { "" },
            if self.prune { "_prune" } else { "" },
            match self.window {
                Some(w) => format!("_w{w}"),
                None => String::new(),
            },
            match (self.out_half, self.dtype_in) {
                (false, _) => "",
                (true, Half::Bf16) => "_obf16",
                (true, Half::F16) => "_of16",
            },
            if self.kv_group != 1 { format!("_g{}", self.kv_group) } else { String::new() },
            if self.debug_starts { "_dbgstart" } else { "" },
            if self.fewer_queries { "_fq" } else { "" },
            match self.split_tiles {
                Some(s) => format!("_sk{s}"),
                None => String::new(),
            },
            // Operands other than bf16 (whose kernels keep their names).
            if self.dtype_in == Half::Bf16 { "" } else { "_f16" },
            self.scale.to_bits(),
            self.sm
        )
    }

    /// Query rows per thread block. `bm` is the pruning tile of the IR (delta and start are per
    /// bm rows); on sm_90 the kernel always works in 64-row blocks (one warpgroup, two blocks per
    /// SM) and a 128-row tile is covered by two blocks that share its `start` (the search uses the
    /// tile's first row and its delta, so the kept set is exactly the tile's). On sm_80 the block
    /// is the whole tile, except at D = 256, where a 128-row block's shared memory (Q and two
    /// K/V buffers) exceeds the 163 KiB an sm_80 block may have.
    pub fn block_rows(&self) -> u32 {
        if (self.sm == 90 || self.head_dim > 128) && self.bm.is_multiple_of(64) {
            64
        } else {
            self.bm
        }
    }

    /// The Hopper tensor-core path (wgmma): one warpgroup per 64 query rows, and a head
    /// dimension of whole 64-column panels (the 128-byte swizzle atom of the V operand).
    pub fn uses_wgmma(&self) -> bool {
        self.sm == 90 && self.block_rows() == 64 && self.head_dim.is_multiple_of(64)
    }

    fn threads(&self) -> u32 {
        self.block_rows() / 16 * 32
    }

    /// Dynamic shared memory: Q tile, two buffers each of K and V, two buffers of the per-column
    /// bias `(c_ref - c_j) * log2 e` (decay only).
    fn shared_bytes(&self) -> u32 {
        (self.block_rows() + 4 * self.bn) * self.head_dim * 2
            + if self.has_decay { 2 * self.bn * 4 } else { 0 }
    }

    /// Errors for configurations this kernel does not implement.
    pub fn validate(&self) -> Result<(), String> {
        if !HEAD_DIMS.contains(&self.head_dim) {
            return Err(format!(
                "GPU attention supports head_dim 32, 64, 96, 128 and 256, got {}",
                self.head_dim
            ));
        }
        if self.bm != 64 && self.bm != 128 {
            return Err(format!("GPU attention needs bm = 64 or 128, got {}", self.bm));
        }
        if self.bn == 0 || !self.bn.is_multiple_of(16) || self.bn > 128 {
            return Err(format!("GPU attention needs bn a multiple of 16 up to 128, got {}", self.bn));
        }
        let chunks = self.bn * self.head_dim / 8;
        if !chunks.is_multiple_of(self.threads()) {
            return Err(format!(
                "GPU attention: a {}x{} K tile does not split evenly over {} threads",
                self.bn,
                self.head_dim,
                self.threads()
            ));
        }
        if self.sm != 80 && self.sm != 90 {
            return Err(format!("GPU attention targets sm_80 or sm_90, got sm_{}", self.sm));
        }
        if self.shared_bytes() > max_shared_bytes(self.sm) {
            return Err(format!(
                "GPU attention: tiles {}x{} at head_dim {} need {} bytes of shared memory, more than sm_{} has ({}); use smaller tiles (--tiles)",
                self.bm,
                self.bn,
                self.head_dim,
                self.shared_bytes(),
                self.sm,
                max_shared_bytes(self.sm)
            ));
        }
        if !self.scale.is_finite() {
            return Err("GPU attention: scale must be finite".into());
        }
        if self.kv_group == 0 {
            return Err("GPU attention: kv_group must be at least 1".into());
        }
        if self.window == Some(0) {
            return Err("GPU attention: window must be at least 1".into());
        }
        if self.split_tiles.is_some() && (self.ws || self.out_half || self.debug_starts) {
            return Err(
                "GPU attention: split keys run on the standard kernel with an f32 partial output".into()
            );
        }
        if self.split_tiles == Some(0) {
            return Err("GPU attention: split keys need at least one key tile per block".into());
        }
        if !self.causal && (self.window.is_some() || self.prune || self.ws) {
            return Err("GPU attention: a non-causal mask runs on the standard kernel, unpruned".into());
        }
        Ok(())
    }
}

/// Grid, block and dynamic shared memory of one launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchGeometry {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub shared_bytes: u32,
}

/// Launch geometry for `t` queries against `tk` keys and `bh` = batch x heads:
/// grid (Mt, BH, 1), one block per query tile, or (Mt, BH, Z) with split keys, `Z` =
/// [`split_planes`] (a persistent kernel: one block per SM of the `sms` the device has,
/// [`crate::nvptx::attention_ws::launch_geometry`]).
pub fn launch_geometry(cfg: &AttnKernelConfig, t: u64, tk: u64, bh: u64, sms: Option<u32>) -> LaunchGeometry {
    if cfg.ws {
        return crate::nvptx::attention_ws::launch_geometry(cfg, t, bh, sms);
    }
    let mt = t.div_ceil(cfg.block_rows().max(1) as u64);
    let z = cfg.split_tiles.map_or(1, |s| split_planes(tk, s * cfg.bn));
    LaunchGeometry {
        grid: (mt as u32, bh as u32, z as u32),
        block: (cfg.threads(), 1, 1),
        shared_bytes: cfg.shared_bytes(),
    }
}

/// The partial planes of a split-keys launch over `tk` keys, `keys` to a block.
pub fn split_planes(tk: u64, keys: u32) -> u64 {
    tk.div_ceil(keys.max(1) as u64).max(1)
}

/// The forward kernels' fixed parameters (the standard and the warp-specialized kernel alike), in
/// order; the score region's own follow from [`score::FIRST_PARAM`] on.
pub(crate) fn fixed_params() -> Vec<(&'static str, ParamTy)> {
    params::fwd_signature()
}

/// Adds the kernel for `cfg` to `module` (named [`AttnKernelConfig::kernel_name`]) and returns it.
/// If the module already holds it, returns the existing function.
pub fn build_attention_kernel<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    cfg: &AttnKernelConfig,
) -> Result<FunctionValue<'ctx>, String> {
    build_attention_kernel_with(ctx, module, cfg, &Identity)
}

/// [`build_attention_kernel`] with the score modified by `score` (the kernel name gets its tag).
pub(crate) fn build_attention_kernel_with<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    cfg: &AttnKernelConfig,
    score: &dyn ScoreMod,
) -> Result<FunctionValue<'ctx>, String> {
    cfg.validate()?;
    let tag = score.tag();
    let name = if tag.is_empty() { cfg.kernel_name() } else { format!("{}_{tag}", cfg.kernel_name()) };
    if cfg.ws {
        return crate::nvptx::attention_ws::build(ctx, module, cfg, score, &name);
    }
    if let Some(f) = module.get_function(&name) {
        return Ok(f);
    }
    let mut params = fixed_params();
    // The score modification's own parameters (captured tensors) follow T, then the tail.
    let extra = score.params();
    params.extend(extra.iter().map(|(n, t)| (n.as_str(), *t)));
    let tail = params::FwdTail::of(cfg, extra.len());
    params.extend(tail.signature());
    // Dynamic shared memory: one extern array per kernel name (PTX aliases them anyway); 1024:
    // the wgmma 128-byte swizzle atom is 8 rows x 128 B.
    let b = KernelBuilder::kernel(ctx, module, &name, &params)?;
    let smem = b.dyn_shared(&format!("{name}_smem"), 1024);
    let tid = b.sreg("tid.x");
    let lane = b.named(b.andc(tid, 31), "lane");
    let t_len = b.param_int(params::FWD.t);
    let (k_len, off) = if cfg.fewer_queries {
        let k_len = b.param_int(tail.at(params::Tail::Tk));
        (k_len, Some(b.named(b.sub(k_len, t_len), "qoff")))
    } else {
        (t_len, None)
    };
    let a = Attn { b: &b, cfg, smem, tid, lane, t_len, k_len, off, wg: cfg.uses_wgmma(), score };
    a.emit();
    b.finish()
}

pub(crate) const LOG2E: f64 = std::f64::consts::LOG2_E;
const LN2: f64 = std::f64::consts::LN_2;

/// The kernel being emitted: the builder, the configuration, and per-thread values used by
/// every part (the parts live in the submodules, one concern each).
pub(crate) struct Attn<'k, 'a, 'ctx> {
    pub(crate) b: &'k KernelBuilder<'a, 'ctx>,
    pub(crate) cfg: &'k AttnKernelConfig,
    /// The dynamic shared memory (byte-addressed with `smem_at`).
    pub(crate) smem: PointerValue<'ctx>,
    pub(crate) tid: IntValue<'ctx>,
    pub(crate) lane: IntValue<'ctx>,
    /// Query rows `T`, and key rows `Tk` (`T` unless `cfg.fewer_queries`).
    pub(crate) t_len: IntValue<'ctx>,
    pub(crate) k_len: IntValue<'ctx>,
    /// `Tk - T` with `cfg.fewer_queries`: query row `i` sits at key position `i + off`.
    pub(crate) off: Option<IntValue<'ctx>>,
    /// The wgmma path (see [`AttnKernelConfig::uses_wgmma`]).
    pub(crate) wg: bool,
    pub(crate) score: &'k dyn ScoreMod,
}

/// Byte offsets of the shared-memory regions.
struct Layout<'ctx> {
    q: IntValue<'ctx>,
    k: [IntValue<'ctx>; 2],
    v: [IntValue<'ctx>; 2],
    /// The two buffers of the per-column bias (decay only).
    colb: [IntValue<'ctx>; 2],
}

/// The mma.sync path's operands: Q fragments (per k-step) and the ldmatrix byte offsets in a
/// K tile (`k[jp][s]`: n-tile pair, k-step) and a V tile (`v[kk][dp]`: key step, d pair).
pub(crate) struct Frags<'ctx> {
    q: Vec<[IntValue<'ctx>; 4]>,
    k: Vec<Vec<IntValue<'ctx>>>,
    v: Vec<Vec<IntValue<'ctx>>>,
}

/// The loop invariants of the walk over the kept key tiles.
struct TileWalk<'w, 'ctx> {
    /// The first kept tile (the walk goes down from the diagonal to it).
    n_start: IntValue<'ctx>,
    lay: &'w Layout<'ctx>,
    /// K, V and c of the head (pointers at its row 0).
    kb: PointerValue<'ctx>,
    vb: PointerValue<'ctx>,
    cb: PointerValue<'ctx>,
    c_ref: Option<FloatValue<'ctx>>,
    frag: Option<&'w Frags<'ctx>>,
    rows: &'w Rows<'ctx>,
    bh: IntValue<'ctx>,
}

/// What this thread owns of its warp's 16 query rows (the mma C-fragment rows `g` and `g + 8`).
pub(crate) struct Rows<'ctx> {
    /// First query row of the warp.
    pub(crate) iw0: IntValue<'ctx>,
    /// This thread's two rows.
    pub(crate) i: [IntValue<'ctx>; 2],
    /// The key positions of `iw0` and of the two rows (the rows themselves unless queries are
    /// fewer than keys): the causal diagonal and the window are relative to them.
    pub(crate) pw0: IntValue<'ctx>,
    pub(crate) p: [IntValue<'ctx>; 2],
    /// `t = lane & 3`: this thread's column pair within each 8-column n-tile.
    pub(crate) tq: IntValue<'ctx>,
}

impl<'k, 'a, 'ctx> Attn<'k, 'a, 'ctx> {
    /// The key position of query row `i`: `i + Tk - T` (`i` itself when queries and keys are one).
    pub(crate) fn pos(&self, i: IntValue<'ctx>) -> IntValue<'ctx> {
        match self.off {
            Some(off) => self.b.add(i, off),
            None => i,
        }
    }

    fn emit(&self) {
        let (b, cfg) = (self.b, self.cfg);
        let d = cfg.head_dim as i64;
        let bm = cfg.block_rows() as i64; // rows of this block (the IR tile is cfg.bm)
        let bn = cfg.bn as i64;
        let dt = (cfg.head_dim / 8) as usize; // n-tiles of 8 dims in O
        let t_len = self.t_len;
        let p = params::FWD;
        let (q_p, k_p, v_p, c_p) = (b.param_ptr(p.q), b.param_ptr(p.k), b.param_ptr(p.v), b.param_ptr(p.c));
        let (delta_p, out_p, lse_p) = (b.param_ptr(p.delta), b.param_ptr(p.out), b.param_ptr(p.lse));

        let warp = b.named(b.lshrc(self.tid, 5), "warp");
        let bx = b.sreg("ctaid.x");
        let nbx = b.sreg("nctaid.x");
        let bh = b.sreg("ctaid.y");
        // Longest first: blockIdx.x = 0 takes the last query tile.
        let m = b.sub(b.addc(nbx, -1), bx);
        let i0 = b.mulc(m, bm);
        let tmax = b.addc(t_len, -1);
        let i_last = b.smin(b.addc(i0, bm - 1), tmax);
        // The last key tile: the diagonal's under a causal mask, else the sequence's.
        let j_last = if cfg.causal { self.pos(i_last) } else { b.addc(self.k_len, -1) };
        let n_end = b.named(b.sdivc(j_last, bn), "n_end");
        // Split keys: this block's slice of the key tiles ends at the slice's last tile.
        let split = cfg.split_tiles.map(|s| {
            let z = b.sreg("ctaid.z");
            let first = b.named(b.mulc(z, s as i64), "slice0");
            (z, first, b.named(b.smin(n_end, b.addc(first, s as i64 - 1)), "slice_end"))
        });
        let n_hi = split.map_or(n_end, |(_, _, hi)| hi);

        // Per-(b,h) base pointers (64-bit offsets).
        let bh64 = b.sext64(bh);
        let t64 = b.sext64(t_len);
        let row_base = b.mul(bh64, t64); // bh*T
                                         // c is per key position: [B, H, Tk].
        let c_base = if self.off.is_some() { b.mul(bh64, b.sext64(self.k_len)) } else { row_base };
        let mat_base = b.mulc(row_base, d); // bh*T*D
        let i16t = b.i16t().into();
        let f32t = b.f32t().into();
        let qb = b.gep(i16t, q_p, mat_base);
        // K and V of the key/value head (GQA).
        let kv_base = b.mulc(heads::kv_rows(b, bh, self.k_len, cfg.kv_group), d);
        let kb = b.gep(i16t, k_p, kv_base);
        let vb = b.gep(i16t, v_p, kv_base);
        // O element type: f32, or bf16 (stored as i16 bit patterns) with the cast fused.
        let o_elt = if cfg.out_half { i16t } else { f32t };
        // Split keys: the output and LSE planes of slice z, [Z, BH, T, ...].
        let out_rows = match split {
            Some((z, _, _)) => b.mul(b.sext64(b.add(b.mul(z, b.sreg("nctaid.y")), bh)), t64),
            None => row_base,
        };
        let ob = b.gep(o_elt, out_p, b.mulc(out_rows, d));
        let cb = b.gep(f32t, c_p, c_base);
        let lb = b.gep(f32t, lse_p, out_rows);

        // ---- Q load (its own cp.async group) and first K/V tile ----
        let kv_bytes = bn * d * 2;
        let lay = Layout {
            q: b.i32(0),
            k: [b.i32(bm * d * 2), b.i32(bm * d * 2 + 2 * kv_bytes)],
            v: [b.i32(bm * d * 2 + kv_bytes), b.i32(bm * d * 2 + 3 * kv_bytes)],
            colb: [b.i32(bm * d * 2 + 4 * kv_bytes), b.i32(bm * d * 2 + 4 * kv_bytes + bn * 4)],
        };
        self.load_q_tile(qb, (i0, bm as u32), lay.q, t_len, bh);
        b.cp_async_commit();
        self.prefetch_epilogue_rows((i0, bm as u32), (self.tid, cfg.threads()), bh);
        let j_end0 = b.mulc(n_hi, bn);
        let load_first_tile = |_: &KernelBuilder<'a, 'ctx>| {
            self.load_tile(kb, j_end0, cfg.bn, lay.k[0], self.k_len);
            self.load_tile(vb, j_end0, cfg.bn, lay.v[0], self.k_len);
        };
        // The first tile (the diagonal's, always kept) flies while the block searches its start;
        // a split-keys block's may be pruned, so it waits for the search (below).
        if split.is_none() {
            load_first_tile(b);
            b.cp_async_commit();
        }

        // Per-column bias in log2 units relative to c_ref = c[i0]: b_j = (c_ref - c_j) * log2 e.
        // Kept keys have |c_ref - c_j| bounded by |delta| + the tile span, so the relative value
        // keeps its precision, and the row term (c_i - c_ref) cancels in the softmax (it returns
        // only in the LSE). One thread per column writes it to shared memory once per tile.
        let l2e = b.f32(LOG2E);
        let c_ref = cfg.has_decay.then(|| {
            let cr = b.load_f32(b.gep(f32t, cb, b.sext64(self.pos(i0))));
            let cj = self.load_col_c(cb, n_hi);
            self.store_colb(cr, cj, lay.colb[0]);
            cr
        });

        // ---- start tile: window bound and the in-kernel pruning search ----
        let n_start = self.start_tile(cb, delta_p, bh, i0, split.map(|(_, first, last)| (first, last)));
        // Under an expression mask with a proven key bound: no tile below the block's bound.
        let n_start = self.key_bound_start((n_start, n_end), (bh, i0, cfg.block_rows()));
        // Split keys: no tile before the slice's first; a slice may hold no kept tile (below the
        // pruning start, or past the diagonal), and then loads none of its keys (most blocks of
        // a long decode step: the copies were 23% more bytes than the kept tiles').
        let n_start = split.map_or(n_start, |(_, first, _)| b.named(b.smax(n_start, first), "n_lo"));
        let any = split.map(|_| b.named(b.icmp(IntPredicate::SGE, n_hi, n_start), "slice_kept"));
        if let Some(any) = any {
            b.if_then(any, load_first_tile);
            b.cp_async_commit();
        }

        // Q fragments: wait for the Q group only (K/V of the first tile may still fly).
        b.cp_async_wait(1);
        if self.wg {
            b.asm_stmt("fence.proxy.async.shared::cta;");
        }
        b.barrier();
        let g = b.named(b.lshrc(self.lane, 2), "g");
        let tq = b.named(b.andc(self.lane, 3), "t");
        let lanes = (!self.wg).then(|| self.lane_parts());
        let wrow0 = b.mulc(warp, 16); // first row of this warp in the tile
        let qf = lanes.as_ref().map(|l| self.q_fragments(l, wrow0));
        // Rows of this thread: i0 + warp*16 + g and + 8.
        let iw0 = b.add(i0, wrow0);
        let i = [b.add(iw0, g), b.addc(b.add(iw0, g), 8)];
        let rows = Rows { iw0, i, pw0: self.pos(iw0), p: i.map(|i| self.pos(i)), tq };
        // Row term (c_i - c_ref) * log2 e, needed only for the LSE.
        let cir = match c_ref {
            Some(cr) => rows.i.map(|i| {
                let ci = b.load_f32(b.gep(f32t, cb, b.sext64(self.pos(b.smin(i, tmax)))));
                b.fmul(b.fsub(ci, cr), l2e)
            }),
            None => [b.f32(0.0); 2],
        };
        // mma.sync path: Q fragments and the ldmatrix offsets of K and V.
        let frag = qf.zip(lanes.as_ref().map(|l| self.kv_offsets(l))).map(|(q, (k, v))| Frags { q, k, v });

        // ---- main loop over kept key tiles, diagonal first ----
        let zero = b.f32(0.0);
        let ninf = b.f32(f64::NEG_INFINITY);
        let mut carried: Vec<(&str, BasicValueEnum)> = vec![("n", n_hi.into()), ("parity", b.i32(0).into())];
        carried.extend((0..dt * 4).map(|_| ("o", zero.into())));
        carried.extend([("m", ninf.into()), ("m", ninf.into()), ("l", zero.into()), ("l", zero.into())]);
        let walk = TileWalk { n_start, lay: &lay, kb, vb, cb, c_ref, frag: frag.as_ref(), rows: &rows, bh };
        let walk_tiles = |b: &KernelBuilder<'a, 'ctx>| {
            b.do_while(("tile", "epilogue"), &carried, |_, vals| self.tile_step(&walk, vals))
        };
        let last = match any {
            None => walk_tiles(b),
            // A slice with no kept tile writes the empty row's partial (zeros, LSE -inf).
            Some(any) => b.if_then_carry(any, ("slice", "slice_done"), &carried, walk_tiles),
        };

        // ---- epilogue: O / l and LSE ----
        let o: Vec<FloatValue> = floats(&last[2..2 + dt * 4]);
        let m_new = [last[2 + dt * 4].into_float_value(), last[3 + dt * 4].into_float_value()];
        let l_new = [last[4 + dt * 4].into_float_value(), last[5 + dt * 4].into_float_value()];
        let (inv, lse) = self.finalize(m_new, l_new, cir);
        self.store_output(&o, inv, lse, &rows, (ob, o_elt, lb), bh);
    }

    /// One kept key tile `n` (carried: `n, parity, o..., m x2, l x2`): prefetch tile `n - 1`,
    /// `S = Q K^T`, the scores (region, decay, masks), the online softmax, `O = alpha O + P V`;
    /// the carried values of the next iteration, and whether there is one.
    fn tile_step(
        &self,
        w: &TileWalk<'_, 'ctx>,
        vals: &[BasicValueEnum<'ctx>],
    ) -> (IntValue<'ctx>, Vec<BasicValueEnum<'ctx>>) {
        let (b, cfg) = (self.b, self.cfg);
        let bn = cfg.bn as i64;
        let dt = (cfg.head_dim / 8) as usize;
        let n = vals[0].into_int_value();
        let par = vals[1].into_int_value();
        let o_in = floats(&vals[2..2 + dt * 4]);
        let m_old = [vals[2 + dt * 4].into_float_value(), vals[3 + dt * 4].into_float_value()];
        let l_old = [vals[4 + dt * 4].into_float_value(), vals[5 + dt * 4].into_float_value()];
        b.cp_async_wait(0);
        if self.wg {
            // cp.async wrote K through the generic proxy; wgmma reads it through the async proxy.
            b.asm_stmt("fence.proxy.async.shared::cta;");
        }
        b.barrier();
        // Prefetch tile n-1 into the other buffer (read last in the previous iteration, which
        // every thread has finished: the barrier above).
        let more = b.icmp(IntPredicate::SGT, n, w.n_start);
        b.if_then_named(more, ("prefetch", "compute"), |b| {
            let is0 = b.icmpc(IntPredicate::EQ, par, 0);
            let ko = b.select_i(is0, w.lay.k[1], w.lay.k[0]);
            let vo = b.select_i(is0, w.lay.v[1], w.lay.v[0]);
            let jn = b.mulc(b.addc(n, -1), bn);
            self.load_tile(w.kb, jn, cfg.bn, ko, self.k_len);
            self.load_tile(w.vb, jn, cfg.bn, vo, self.k_len);
        });
        b.cp_async_commit();
        let is0 = b.icmpc(IntPredicate::EQ, par, 0);
        let kcur = b.select_i(is0, w.lay.k[0], w.lay.k[1]);
        let vcur = b.select_i(is0, w.lay.v[0], w.lay.v[1]);
        let j0 = b.mulc(n, bn);
        // Column of this thread's first score element: keys j0 + 8*jt + 2t + {0,1}.
        let col0 = b.add(j0, b.mulc(w.rows.tq, 2));
        // Column bias of this thread's columns, and c of tile n-1 (written to the other
        // bias buffer at the end of this iteration).
        let (c_col, c_next) = if cfg.has_decay {
            let cbuf = b.select_i(is0, w.lay.colb[0], w.lay.colb[1]);
            let c_col = self.load_colb(cbuf, w.rows.tq);
            let nprev = b.smax(b.addc(n, -1), b.i32(0));
            (c_col, Some(self.load_col_c(w.cb, nprev)))
        } else {
            (vec![], None)
        };
        let s_acc = self.qk(kcur, w.frag);
        let s2 = self.scores(&s_acc, &c_col, w.rows, j0, col0, w.bh);
        let st = self.online_softmax(&s2, m_old, l_old);
        let o = self.rescale(&o_in, st.alpha);
        let o = self.pv(o, &st.p, vcur, w.frag);
        if let (Some(cr), Some(cn)) = (w.c_ref, c_next) {
            // The other bias buffer was last read in the previous iteration (before this
            // iteration's barrier); the next iteration reads it after its own barrier.
            let other = b.select_i(is0, w.lay.colb[1], w.lay.colb[0]);
            self.store_colb(cr, cn, other);
        }
        let n_next = b.addc(n, -1);
        let par_next = b.xorc(par, 1);
        let again = b.icmp(IntPredicate::SGE, n_next, w.n_start);
        let mut next = vec![n_next.into(), par_next.into()];
        next.extend(basic(&o));
        next.extend(basic(&st.m_new));
        next.extend(basic(&st.l_new));
        (again, next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_unsupported_head_dim() {
        let cfg = AttnKernelConfig::new(80, true, true);
        let ctx = Context::create();
        let m = ctx.create_module("t");
        let e = build_attention_kernel(&ctx, &m, &cfg).unwrap_err();
        assert!(e.contains("head_dim"), "{e}");
    }

    #[test]
    fn builds_and_verifies_all_variants() {
        let ctx = Context::create();
        let m = ctx.create_module("t");
        for d in HEAD_DIMS {
            for sm in [90, 80] {
                for (decay, prune, window) in
                    [(true, true, None), (true, false, None), (false, false, Some(256))]
                {
                    let mut cfg = AttnKernelConfig::new(d, decay, prune);
                    cfg.window = window;
                    cfg.sm = sm;
                    let f = build_attention_kernel(&ctx, &m, &cfg).unwrap();
                    assert_eq!(f.count_params(), 8);
                }
            }
        }
        assert!(m.verify().is_ok());
    }

    #[test]
    fn hopper_path_uses_wgmma_and_ampere_path_mma_sync() {
        let ctx = Context::create();
        let m = ctx.create_module("t");
        let mut cfg = AttnKernelConfig::new(128, true, true);
        build_attention_kernel(&ctx, &m, &cfg).unwrap();
        cfg.sm = 80;
        build_attention_kernel(&ctx, &m, &cfg).unwrap();
        let ir = m.print_to_string().to_string();
        assert!(ir.contains("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16"));
        assert!(ir.contains("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16"));
        assert!(ir.contains("llvm.nvvm.mma.m16n8k16.row.col.bf16"));
        assert!(ir.contains("llvm.nvvm.cp.async.cg.shared.global.16"));
    }

    /// D = 32 and 96 are not whole 64-column panels: sm_90 runs them on the mma.sync path.
    #[test]
    fn odd_head_dims_take_mma_sync_on_hopper() {
        for (d, wg) in [(32, false), (64, true), (96, false), (128, true), (256, true)] {
            let cfg = AttnKernelConfig::new(d, true, true);
            assert_eq!(cfg.uses_wgmma(), wg, "D={d}");
            let ctx = Context::create();
            let m = ctx.create_module("t");
            let f = build_attention_kernel(&ctx, &m, &cfg).unwrap();
            let ir = inkwell::values::AnyValue::print_to_string(&f).to_string();
            assert_eq!(ir.contains("wgmma.mma_async"), wg, "D={d}");
            assert_eq!(ir.contains("llvm.nvvm.mma.m16n8k16"), !wg, "D={d}");
        }
    }

    #[test]
    fn shared_memory_limits() {
        let mut cfg = AttnKernelConfig::new(256, true, true);
        cfg.sm = 80;
        cfg.bm = 128;
        // D = 256 on sm_80: a 128-row tile runs as two 64-row blocks (164 352 bytes).
        assert_eq!(cfg.block_rows(), 64);
        assert!(cfg.validate().is_ok());
        cfg.bn = 128;
        let e = cfg.validate().unwrap_err();
        assert!(e.contains("shared memory"), "{e}");
    }

    #[test]
    fn bf16_output_variant_coexists_and_packs_on_both_paths() {
        let ctx = Context::create();
        let m = ctx.create_module("t");
        for sm in [90, 80] {
            let mut cfg = AttnKernelConfig::new(64, true, true);
            cfg.sm = sm;
            let f32_name = build_attention_kernel(&ctx, &m, &cfg).unwrap().get_name().to_owned();
            cfg.out_half = true;
            let f = build_attention_kernel(&ctx, &m, &cfg).unwrap();
            assert_ne!(f.get_name(), f32_name.as_c_str());
            assert!(cfg.kernel_name().contains("_obf16_"));
            let ir = inkwell::values::AnyValue::print_to_string(&f).to_string();
            // The epilogue stores packed bf16 pairs, no f32 pairs.
            assert!(ir.contains("store i32"), "{sm}");
            assert!(!ir.contains("store <2 x float>"), "{sm}");
        }
        assert!(m.verify().is_ok());
    }

    /// f16 operands: the same kernels with IEEE-half products (mma.sync's f32.f16.f16.f32 on
    /// either target, wgmma's .f16.f16 on sm_90a), P packed to f16 pairs, an f16 output; named
    /// apart from the bf16 kernels (whose names do not change), and no bf16 anywhere.
    #[test]
    fn f16_operands_build_f16_products_and_no_bf16() {
        let ctx = Context::create();
        let m = ctx.create_module("t");
        for (d, sm, wg) in [(64, 90, true), (128, 90, true), (96, 90, false), (64, 80, false)] {
            let mut cfg = AttnKernelConfig::new(d, true, true);
            (cfg.sm, cfg.dtype_in, cfg.out_half) = (sm, Half::F16, true);
            let name = cfg.kernel_name();
            assert!(name.contains("_of16_") && name.contains("_f16_"), "{name}");
            let f = build_attention_kernel(&ctx, &m, &cfg).unwrap();
            let ir = inkwell::values::AnyValue::print_to_string(&f).to_string();
            assert!(!ir.contains("bf16") && !ir.contains("bfloat"), "D={d} sm={sm}");
            assert_eq!(ir.contains(&format!("m64n{}k16.f32.f16.f16", cfg.bn)), wg, "D={d} sm={sm}");
            assert_eq!(ir.contains("llvm.nvvm.mma.m16n8k16.row.col.f32.f32"), !wg, "D={d} sm={sm}");
            // P and the output are packed to f16 pairs (cvt.rn.f16x2.f32).
            assert!(ir.contains("fptrunc <2 x float> %") && ir.contains("to <2 x half>"), "D={d} sm={sm}");
            cfg.dtype_in = Half::Bf16;
            assert!(cfg.kernel_name().contains("_obf16_") && !cfg.kernel_name().contains("_f16"));
        }
        assert!(m.verify().is_ok());
    }

    /// A score hook is emitted on every fragment element, and names its kernel.
    #[test]
    fn score_hook_is_emitted_and_tagged() {
        struct Cap;
        impl ScoreMod for Cap {
            fn tag(&self) -> String {
                "cap".into()
            }
            fn emit<'a, 'ctx>(
                &self,
                b: &KernelBuilder<'a, 'ctx>,
                x: FloatValue<'ctx>,
                _: score::ScorePos<'ctx>,
            ) -> FloatValue<'ctx> {
                b.fmin(x, b.f32(7.25))
            }
        }
        let ctx = Context::create();
        let m = ctx.create_module("t");
        let cfg = AttnKernelConfig::new(64, true, true);
        let f = build_attention_kernel_with(&ctx, &m, &cfg, &Cap).unwrap();
        assert!(f.get_name().to_string_lossy().ends_with("_cap"));
        let ir = inkwell::values::AnyValue::print_to_string(&f).to_string();
        let n = ir.matches("float 7.250000e+00").count();
        assert_eq!(n, 64 / 8 * 4, "one hook per fragment element");
    }

    #[test]
    fn geometry() {
        let mut cfg = AttnKernelConfig::new(128, true, true);
        cfg.bm = 128;
        // sm_90 covers a 128-row pruning tile with two 64-row blocks.
        let g = launch_geometry(&cfg, 1000, 1000, 6, None);
        assert_eq!(g.grid, (16, 6, 1));
        assert_eq!(g.block, (128, 1, 1));
        assert!(cfg.kernel_name().contains("_bm128_bn64_k64_"));
        cfg.sm = 80;
        let g = launch_geometry(&cfg, 1000, 1000, 6, None);
        assert_eq!(g.grid, (8, 6, 1));
        assert_eq!(g.block, (256, 1, 1));
        assert_eq!(g.shared_bytes, (128 + 4 * 64) * 128 * 2 + 2 * 64 * 4);
    }
}
