//! The attention backward kernels (FlashAttention-2 style, deterministic: no float atomics),
//! emitted as LLVM IR for NVPTX. They compute `attention_backward` (docs/SEMANTICS.md): from
//! q, k, v, the gate cumsum c, the forward's out and lse, and dout, the gradients dq, dk, dv and
//! dc = (row sums - column sums of dS), recomputing `P = exp(E - lse)` tile by tile.
//!
//! Three launches, in order:
//!
//! 1. [`pre`] `D_i = sum_d dout_id out_id`, one warp per row (f32 `[BH, T]` scratch).
//! 2. [`dq`] one block of 64 query rows (4 warps, 16 rows each, like the forward) walks the SAME
//!    kept key tiles as the forward, from the diagonal tile down to `start[m]` (found by the
//!    forward's own search, [`crate::nvptx::attention::prune::search_start`], raised to the
//!    first tile of the rows' key bound ([`crate::nvptx::attention::key_bound`]), and written
//!    to a scratch `[BH, ceil(T/bm)]` for launch 3): `S = Q K^T`, `dP = dO V^T` (Q and dO fragments
//!    held in registers), `dS = P (dP - D)`, `dx = dS R'(x)` (the region's derivative),
//!    `dQ += dx K`; the row sums of dS are written to dc.
//! 3. [`dkv`] one block per key tile of `bn` keys and kv head (`bn / 16` warps, 16 keys each)
//!    walks, for each query head of its GQA group (ascending), the query chunks of `bq` rows that
//!    keep it (the chunks from the diagonal on whose IR tile has `start <= n`; an O(T / bq) scan
//!    of the start scratch): the forward's structure with roles swapped, `S^T = K Q^T`,
//!    `dP^T = V dO^T`, `dV += P^T dO`, `dK += dx^T Q`; per query head, the column sums of dS are
//!    subtracted from dc (each (head, key) is owned by one block: no atomics).
//!
//! Matrix products: on sm_90a with D = 64 or 128 ([`BwdConfig::uses_wgmma`]) `wgmma.mma_async`
//! ([`wg`]: one warpgroup per 64 rows; the four GEMM shapes map onto the forward's `S = Q K^T`
//! and `O += P V`), otherwise `mma.sync.m16n8k16` bf16 -> f32 ([`frag`]), correct on sm_80 and
//! sm_90 alike. Q, K, V and dO tiles are staged in shared memory with `cp.async`
//! (double-buffered along the walk) in the forward's XOR-swizzled row layout (the wgmma
//! 64-column panel layout on the wgmma path). Scores use the forward's conventions ([`probs`]): log2 units, the
//! decay term relative to a reference `c_ref` of the block, masks only on tiles that need them.
//!
//! # Kernel parameters
//!
//! `pre`: `out` (f32 or bf16 `[BH, T, D]`), `dout` (same), `dd` (f32 `[BH, T]`), `rows` (i32 = BH T).
//!
//! `dq`: `q, k, v` (bf16; k, v of kv head `bh / kv_group`), `c` (f32 `[BH, T]`), `delta`
//! (f32 `[BH, Mt]`, read when pruned), `dout` (bf16), `lse` (f32 `[BH, T]`), `dd` (launch 1),
//! `dq` (out: f32, or [`BwdConfig::grads`]), `dc` (f32 out, the row sums; written when decay), `start` (i32 `[BH, Mt]`
//! scratch, written when [`BwdConfig::uses_start`]), `T` (i32).
//!
//! `dkv`: `q, k, v, c, dout, lse, dd, start` (as above, start read), `dk`, `dv` (`[BHk, T, D]`
//! out, as dq), `dc` (read-modify-write when decay), `T`.
//!
//! Pointer parameters a configuration does not read may be any valid buffer.

pub(crate) mod dkv;
pub(crate) mod dq;
mod frag;
pub(crate) mod pre;
mod probs;
mod wg;

use super::attention::params::{BwdTail, BwdTailParam};
use super::attention::region::RegionMod;
use super::attention::score::ScoreMod;
use super::builder::{Half, KernelBuilder, ParamTy};
use inkwell::context::Context;
use inkwell::module::Module;
use inkwell::types::BasicTypeEnum;
use inkwell::values::{FloatValue, FunctionValue, IntValue, PointerValue};

/// Head dimensions of the backward kernels. At D = 256 the accumulators of a warp's 16 rows
/// (dQ, or dK and dV: 128 / 256 f32 registers per thread) do not fit the register file with
/// the rest, so both kernels split the head dim in [`BwdConfig::d_parts`] halves: a block per
/// (tile, half) recomputes S and dP over the whole D and accumulates only its half.
pub const BWD_HEAD_DIMS: [u32; 5] = [32, 64, 96, 128, 256];

/// The widest head-dim slice one block accumulates (dQ, dK, dV columns).
pub const BWD_PART_DIM: u32 = 128;

/// Query rows of one dq block (and the forward's block on sm_90).
pub const DQ_ROWS: u32 = 64;

/// One backward configuration (tiles and mask from the IR attributes, like the forward's).
#[derive(Debug, Clone, PartialEq)]
pub struct BwdConfig {
    pub head_dim: u32,
    /// The IR tiles: `start` is per `bm` query rows, in units of `bn` keys.
    pub bm: u32,
    pub bn: u32,
    pub scale: f32,
    pub has_decay: bool,
    pub window: Option<u32>,
    /// Keys after the query row are masked and their tiles never visited (causal, window);
    /// `false` (no mask, or an expression mask: its condition evaluated on every element by
    /// [`Regions`]' score region, as the forward's `_bidir` kernels do): every tile is visited.
    pub causal: bool,
    /// `start[m]` from `delta` and `c` by the forward's in-kernel search.
    pub prune: bool,
    /// The score region has a proven key bound `E_i` (`keys_from`: every key `j < E_i` of row
    /// `i` is masked, as in packed sequences): the dq kernel starts each block's walk at its
    /// rows' first key tile and raises the start scratch to the IR tile's, so the dkv kernel
    /// skips the query chunks that keep nothing of its key tile.
    pub key_bound: bool,
    /// 80 or 90 (the same code; recorded in the kernel names).
    pub sm: u32,
    pub kv_group: u32,
    /// The 16-bit type of q, k, v and dout (and of P and dS in the second products).
    pub dtype: Half,
    /// K, V, c and dc have their own length `Tk > T` (the last parameter, `Tk`): the `T`
    /// queries sit at the end of the keys, row `i` at key position `i + Tk - T` (its causal
    /// diagonal, its window and its `c`; dc's row sum lands there), as the forward's `_fq`
    /// kernel.
    pub fewer_queries: bool,
    /// The 16-bit type dq, dk and dv are written in (rounded to nearest even, as a `cast`
    /// rounds: the IR's `grads = DTYPE`), or `None` for f32.
    pub grads: Option<Half>,
}

/// Which of the three kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BwdKernel {
    Pre,
    Dq,
    Dkv,
}

impl BwdConfig {
    /// Kernel symbol name of `kind` (with the region's tag appended by the builders).
    pub fn kernel_name(&self, kind: BwdKernel) -> String {
        let k = match kind {
            BwdKernel::Pre => return format!("foxc_attn_bwd_pre_d{}{}", self.head_dim, self.half_tag()),
            BwdKernel::Dq => "dq",
            BwdKernel::Dkv => "dkv",
        };
        format!(
            "foxc_attn_bwd_{k}_d{}_bm{}_bn{}{}{}{}{}{}{}{}{}{}_s{:08x}_sm{}",
            self.head_dim,
            self.bm,
            self.bn,
            if self.has_decay { "_decay" } else { "" },
            if self.prune { "_prune" } else { "" },
            if self.key_bound { "_kb" } else { "" },
            self.window.map_or(String::new(), |w| format!("_w{w}")),
            if self.kv_group != 1 { format!("_g{}", self.kv_group) } else { String::new() },
            if self.causal { "" } else { "_bidir" },
            self.half_tag(),
            if self.fewer_queries { "_fq" } else { "" },
            self.grads.map_or(String::new(), |h| format!("_g{}", h.ptx())),
            self.scale.to_bits(),
            self.sm
        )
    }

    /// Whether the dq kernel writes each IR tile's first key tile into the start scratch (the
    /// pruning search's, raised to the key bound's) and the dkv kernel skips the query chunks
    /// whose start lies past its key tile.
    pub fn uses_start(&self) -> bool {
        self.prune || self.key_bound
    }

    /// The kernel-name tag of the operand type (none for bf16, whose kernels keep their names).
    fn half_tag(&self) -> &'static str {
        match self.dtype {
            Half::Bf16 => "",
            Half::F16 => "_f16",
        }
    }

    /// Query rows per chunk of the dkv walk: a divisor of `bm` (so a chunk lies in one IR tile
    /// and is kept or skipped whole); 32 above D = 64 to leave registers for dK and dV, 16 at
    /// D = 256 (the half of dK and dV a block holds is as large as D = 128's whole; 32-row
    /// chunks spilled up to 92 bytes with GQA on sm_80).
    pub fn bq(&self) -> u32 {
        if self.head_dim > 128 {
            16
        } else if self.head_dim > 64 {
            32
        } else {
            64
        }
    }

    /// The sm_90a wgmma path: head dims of whole 64-column panels (the 128-byte swizzle atom
    /// of the MN-major B operand), and a dkv block of whole warpgroups (64 keys each). Not
    /// for a head dim split in parts (D = 256 runs mma.sync on both targets).
    pub fn uses_wgmma(&self) -> bool {
        self.sm == 90
            && self.head_dim.is_multiple_of(64)
            && self.d_parts() == 1
            && self.bn.is_multiple_of(wg::WG_ROWS)
    }

    /// Head-dim slices of [`BWD_PART_DIM`] columns: blocks per (tile, head) of both the dq
    /// and the dkv kernel (grid y = heads x parts, part = y mod parts). 1 up to D = 128.
    pub fn d_parts(&self) -> u32 {
        self.head_dim.div_ceil(BWD_PART_DIM)
    }

    /// The head-dim columns one block accumulates.
    pub fn part_dim(&self) -> u32 {
        self.head_dim / self.d_parts()
    }

    /// K and V buffers of the dq kernel: 2 (prefetch along the walk), 1 when the head dim is
    /// split (D = 256: two 64-key buffers of K and V would not fit sm_80's shared memory).
    pub fn dq_kv_buffers(&self) -> u32 {
        if self.d_parts() == 1 {
            2
        } else {
            1
        }
    }

    pub fn dq_threads(&self) -> u32 {
        DQ_ROWS / 16 * 32
    }

    pub fn dkv_threads(&self) -> u32 {
        self.bn / 16 * 32
    }

    /// dq: Q and dO tiles, [`BwdConfig::dq_kv_buffers`] buffers each of K and V, two of the
    /// column bias (decay).
    pub fn dq_shared_bytes(&self) -> u32 {
        (2 * DQ_ROWS + 2 * self.dq_kv_buffers() * self.bn) * self.head_dim * 2
            + if self.has_decay { 2 * self.bn * 4 } else { 0 }
    }

    /// dkv: K and V tiles, two buffers each of the Q and dO chunks, two of the per-row terms
    /// (`(c_i - c_ref - lse_i) log2 e` and `D_i`).
    pub fn dkv_shared_bytes(&self) -> u32 {
        (2 * self.bn + 4 * self.bq()) * self.head_dim * 2 + 2 * 2 * self.bq() * 4
    }

    /// Errors for configurations these kernels do not implement (said as user errors).
    pub fn validate(&self) -> Result<(), String> {
        if !BWD_HEAD_DIMS.contains(&self.head_dim) {
            return Err(format!(
                "the GPU attention backward supports head_dim 32, 64, 96, 128 and 256, got {}",
                self.head_dim
            ));
        }
        if self.bm != 64 && self.bm != 128 {
            return Err(format!("the GPU attention backward needs bm = 64 or 128, got {}", self.bm));
        }
        if self.bn == 0 || !self.bn.is_multiple_of(16) || self.bn > 128 {
            return Err(format!(
                "the GPU attention backward needs bn a multiple of 16 up to 128, got {}",
                self.bn
            ));
        }
        if self.sm != 80 && self.sm != 90 {
            return Err(format!("the GPU attention backward targets sm_80 or sm_90, got sm_{}", self.sm));
        }
        let max = if self.sm >= 90 { 232_448 } else { 166_912 };
        let need = self.dq_shared_bytes().max(self.dkv_shared_bytes());
        if need > max {
            return Err(format!(
                "the GPU attention backward: tiles {}x{} at head_dim {} need {need} bytes of shared memory, more than sm_{} has ({max}); use smaller tiles (--tiles)",
                self.bm, self.bn, self.head_dim, self.sm
            ));
        }
        if !self.scale.is_finite() {
            return Err("the GPU attention backward: scale must be finite".into());
        }
        if self.kv_group == 0 {
            return Err("the GPU attention backward: kv_group must be at least 1".into());
        }
        if self.window == Some(0) {
            return Err("the GPU attention backward: window must be at least 1".into());
        }
        if self.prune && !self.has_decay {
            return Err("the GPU attention backward: pruning needs the decay operand c".into());
        }
        if !self.causal && (self.prune || self.window.is_some()) {
            return Err(
                "the GPU attention backward: a non-causal mask runs unpruned, without a window".into()
            );
        }
        Ok(())
    }
}

pub(crate) use super::attention::params::FIRST_BWD_PARAM;

/// A read of a captured tensor in the score region whose gradient the kernels sum
/// (`d cap = sum dS dR/d(read)` over the entries reading it): by query row (`kb[b, h, i]`: the
/// dq kernel's row sums) or by key (`kb[b, h, j]`: the dkv kernel's column sums, per query
/// head, as dc's). Other index forms are refused by the lowering.
pub(crate) struct CaptureRead<'r> {
    pub by_key: bool,
    /// `dR / d(this read)`, reading through the score region's parameters.
    pub local: &'r RegionMod,
    /// The capture's gradient output: its place among [`Regions::grads`].
    pub slot: usize,
}

/// The score region and its derivatives as the kernels emit them; they read captured tensors
/// (and a head count not fixed at compile time) through the score region's kernel parameters,
/// after the [`FIRST_BWD_PARAM`], followed by the `grads` gradient outputs.
/// An expression mask's condition rides on `score` ([`RegionMod::with_mask`], no `keys_from`:
/// the backward visits every tile of a non-causal mask and evaluates the condition on each
/// element, so it keeps exactly the forward's entries and skips no tile the forward visited).
pub(crate) struct Regions<'r> {
    pub score: &'r RegionMod,
    /// `dR/dx`; `None` when it is the constant 1 (the identity region: `dx = dS`).
    pub dx: Option<&'r RegionMod>,
    pub reads: Vec<CaptureRead<'r>>,
    /// Gradient outputs of captured tensors (f32 `[B, H, T]` each, in capture order): the dq
    /// kernel writes every one (its row sums; 0 without a query read), the dkv kernel then adds
    /// its column sums.
    pub grads: usize,
}

impl<'r> Regions<'r> {
    /// `score` and `dx` must read through parameters from [`FIRST_BWD_PARAM`] on
    /// ([`RegionMod::with_first_param`], [`RegionMod::sharing_params`]).
    pub(crate) fn new(
        score: &'r RegionMod,
        dx: Option<&'r RegionMod>,
        reads: Vec<CaptureRead<'r>>,
        grads: usize,
    ) -> Regions<'r> {
        Regions { score, dx, reads, grads }
    }

    /// The kernel parameters after the score region's: the gradients, then `Tk` with
    /// `fewer_queries`.
    pub(crate) fn tail(&self, fewer_queries: bool) -> BwdTail {
        BwdTail::of(fewer_queries, self.score.args().len(), self.grads)
    }

    /// The gradient slots that have reads `by_key` (or by query row when false).
    fn slots(&self, by_key: bool) -> Vec<usize> {
        let mut s: Vec<usize> = self.reads.iter().filter(|r| r.by_key == by_key).map(|r| r.slot).collect();
        // Each slot once (its reads are summed per element by `capture_terms`).
        s.sort_unstable();
        s.dedup();
        s
    }

    /// The score region's tag (empty for the identity); `dx` is derived from it.
    fn tag(&self) -> String {
        self.score.tag()
    }
}

/// Adds kernel `kind` for `cfg` (and the regions) to `module`, or returns the one already there.
pub(crate) fn build_bwd_kernel<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    cfg: &BwdConfig,
    kind: BwdKernel,
    regions: &Regions,
) -> Result<FunctionValue<'ctx>, String> {
    cfg.validate()?;
    let tag = if kind == BwdKernel::Pre { String::new() } else { regions.tag() };
    let base = cfg.kernel_name(kind);
    let name = if tag.is_empty() { base } else { format!("{base}_{tag}") };
    if let Some(f) = module.get_function(&name) {
        return Ok(f);
    }
    match kind {
        BwdKernel::Pre => pre::build(ctx, module, &name, cfg.head_dim, cfg.dtype),
        BwdKernel::Dq => dq::build(ctx, module, &name, cfg, regions),
        BwdKernel::Dkv => dkv::build(ctx, module, &name, cfg, regions),
    }
}

const LOG2E: f64 = std::f64::consts::LOG2_E;

/// A backward kernel being emitted: the builder, the configuration, per-thread values.
pub(crate) struct Bwd<'k, 'a, 'ctx> {
    b: &'k KernelBuilder<'a, 'ctx>,
    cfg: &'k BwdConfig,
    regions: &'k Regions<'k>,
    /// The parameters after the score region's (gradient outputs, `Tk`).
    tail: &'k BwdTail,
    /// The dynamic shared memory (byte-addressed with `smem_at`).
    smem: PointerValue<'ctx>,
    tid: IntValue<'ctx>,
    lane: IntValue<'ctx>,
    /// Query rows `T`, and key rows `Tk` (`T` unless `cfg.fewer_queries`).
    t_len: IntValue<'ctx>,
    k_len: IntValue<'ctx>,
    /// `Tk - T` with `cfg.fewer_queries`: query row `i` sits at key position `i + off`.
    off: Option<IntValue<'ctx>>,
    /// Threads of the block.
    threads: u32,
    /// The wgmma path ([`BwdConfig::uses_wgmma`]).
    wg: bool,
}

impl<'k, 'a, 'ctx> Bwd<'k, 'a, 'ctx> {
    /// Declares kernel `name` with the `fixed` parameters (`T` last of them), the regions'
    /// and, with fewer queries than keys, `Tk` last; sets up the per-thread values every
    /// backward kernel uses and emits the body with them.
    fn build(
        ctx: &'ctx Context,
        module: &'a Module<'ctx>,
        (name, fixed): (&str, &[(&str, ParamTy)]),
        (cfg, regions): (&BwdConfig, &Regions),
        threads: u32,
        body: impl FnOnce(&Bwd<'_, 'a, 'ctx>),
    ) -> Result<FunctionValue<'ctx>, String> {
        if fixed.len() != FIRST_BWD_PARAM as usize {
            return Err(format!("{name}: {} fixed parameters, not {FIRST_BWD_PARAM}", fixed.len()));
        }
        let tail = regions.tail(cfg.fewer_queries);
        let extra: Vec<(String, ParamTy)> =
            regions.score.params().into_iter().chain(tail.signature()).collect();
        let mut params = fixed.to_vec();
        params.extend(extra.iter().map(|(n, t)| (n.as_str(), *t)));
        let b = KernelBuilder::kernel(ctx, module, name, &params)?;
        // 1024: the wgmma 128-byte swizzle atom is 8 rows x 128 B.
        let wg = cfg.uses_wgmma();
        let smem = b.dyn_shared(&format!("{name}_smem"), if wg { 1024 } else { 128 });
        let tid = b.sreg("tid.x");
        let lane = b.andc(tid, 31);
        // The dq and dkv kernels both take T last of their fixed parameters.
        let t_len = b.param_int(crate::nvptx::attention::params::DQ.t);
        let (k_len, off) = if cfg.fewer_queries {
            let k_len = b.param_int(tail.at(BwdTailParam::Tk));
            (k_len, Some(b.sub(k_len, t_len)))
        } else {
            (t_len, None)
        };
        body(&Bwd { b: &b, cfg, regions, tail: &tail, smem, tid, lane, t_len, k_len, off, threads, wg });
        b.finish()
    }
}

impl<'ctx> Bwd<'_, '_, 'ctx> {
    /// Stores `x0, x1` as elements `idx, idx + 1` (i64, even) of a gradient (dq, dk or dv) in
    /// its dtype ([`BwdConfig::grads`]): one 8-byte f32 pair, or one 4-byte 16-bit pair.
    fn store_grad_pair(
        &self,
        p: PointerValue<'ctx>,
        idx: IntValue<'ctx>,
        x0: FloatValue<'ctx>,
        x1: FloatValue<'ctx>,
    ) {
        let b = self.b;
        let at = b.gep(self.grad_elem(), p, idx);
        match self.cfg.grads {
            None => b.store_aligned(at, b.vec2_f32(x0, x1), 8),
            Some(h) => b.store_aligned(at, b.pack_half2(h, x0, x1), 4),
        }
    }

    /// The element type of dq, dk and dv ([`BwdConfig::grads`]).
    fn grad_elem(&self) -> BasicTypeEnum<'ctx> {
        match self.cfg.grads {
            None => self.b.f32t().into(),
            Some(h) => h.float_type(self.b.ctx).into(),
        }
    }

    /// The key position of query row `i`: `i + Tk - T` (`i` itself when queries and keys are
    /// one).
    fn pos(&self, i: IntValue<'ctx>) -> IntValue<'ctx> {
        match self.off {
            Some(off) => self.b.add(i, off),
            None => i,
        }
    }

    /// The i64 index of query row `i`'s key position, `ix` being `i` as i64 (reused as it is
    /// when queries and keys are one, so that square kernels emit nothing more).
    fn pos_index(&self, i: IntValue<'ctx>, ix: IntValue<'ctx>) -> IntValue<'ctx> {
        match self.off {
            Some(_) => self.b.sext64(self.pos(i)),
            None => ix,
        }
    }

    /// Where flat head `bh`'s row 0 of a per-key buffer (`c`, `dc`: `[B, H, Tk]`) starts: `bh
    /// Tk`, or `row_base` (`bh T`, as i64) when queries and keys are one.
    fn key_base(&self, bh: IntValue<'ctx>, row_base: IntValue<'ctx>) -> IntValue<'ctx> {
        match self.off {
            Some(_) => self.b.mul(self.b.sext64(bh), self.b.sext64(self.k_len)),
            None => row_base,
        }
    }

    /// The block's head (`ctaid.y / parts`) and head-dim part (`ctaid.y mod parts`; `None`
    /// when the head dim is not split).
    fn head_and_part(&self) -> (IntValue<'ctx>, Option<IntValue<'ctx>>) {
        let y = self.b.sreg("ctaid.y");
        let parts = self.cfg.d_parts() as i64;
        if parts == 1 {
            return (y, None);
        }
        (self.b.udivc(y, parts), Some(self.b.uremc(y, parts)))
    }

    /// Whether this block writes what every part computes alike (dc, the start scratch):
    /// part 0 only.
    fn first_part(&self, part: Option<IntValue<'ctx>>) -> Option<IntValue<'ctx>> {
        part.map(|p| self.b.icmpc(inkwell::IntPredicate::EQ, p, 0))
    }
}

/// Grid of the dq kernel: (ceil(T / 64), BH x parts).
pub fn dq_grid(cfg: &BwdConfig, t: u64, bh: u64) -> (u64, u64) {
    (t.div_ceil(DQ_ROWS as u64), bh * cfg.d_parts() as u64)
}

/// Grid of the dkv kernel: (ceil(Tk / bn), BH / kv_group x parts).
pub fn dkv_grid(cfg: &BwdConfig, tk: u64, bh_kv: u64) -> (u64, u64) {
    (tk.div_ceil(cfg.bn as u64), bh_kv * cfg.d_parts() as u64)
}

/// Rows of the pre kernel per block (one warp each).
pub const PRE_ROWS: u32 = 8;

#[cfg(test)]
mod tests;
