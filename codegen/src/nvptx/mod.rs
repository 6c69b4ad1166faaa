//! NVPTX backend: LLVM IR through inkwell, lowered to PTX by LLVM's NVPTX target.
//!
//! [`compile`] turns an optimized graph (fused ops after the passes) into one PTX module with one
//! kernel per node, plus a *launch plan*: the device buffers the program needs and, in order, the
//! kernels with their arguments and launch geometry as functions of the symbolic dimensions.
//! The runtime crate never sees this type (it does not link LLVM); the facade's glue converts
//! an [`NvptxArtifact`] into the runtime's launch descriptions once the dimensions are bound.
//!
//! Kernel per node:
//! - `gate_cumsum`: a block scan per (b, h) (`Logits`, `LogGate`) or a closed form (`Slope`);
//! - `rmsnorm` over a static last axis, float-to-float `cast`: row / elementwise kernels;
//! - `threshold` (`module_threshold.rs`): for a formula of tile norms only, one kernel (norms,
//!   then each head's last block evaluates its deltas); with row statistics, a norms kernel then
//!   a per-tile delta kernel; for a static bound, the delta kernel alone. Under an attention
//!   with `prelude = joint` (a pass decision), the one kernel also scans that attention's gate:
//!   one launch for two nodes ([`KernelInfo::also`]);
//! - `block_boundary`: no launch: the attention kernel finds `start[m]` itself by a search over
//!   `c` and `delta` (SEMANTICS.md allows this), so the plan passes `delta` to attention;
//! - `attention`: [`attention::build_attention_kernel`], writing both results (`out`, and the
//!   row log-sum-exp `lse`, result 1);
//! - `attention_backward`: the backward kernels (`module_bwd.rs`);
//! - every other op (elementwise math, select, masks, iota, dims, bind/store, gather, casts,
//!   sum/max, cumsum, softmax, other rmsnorms): one plain loop kernel with run-time sizes
//!   (`generic`).
//!
//! Buffers are per (node, result). [`NvptxSpec::outputs`] names the values to compute (a
//! gradient program has several); only what they need is lowered.

pub mod attention;
pub mod attention_bwd;
pub mod attention_ws;
mod block_reduce;
pub(crate) mod builder;
mod generic;
mod heads;
pub mod kernels;
pub mod module;
mod module_attention;
mod module_bwd;
mod module_threshold;
pub mod ptxas;
pub mod target;
pub mod threshold;

use foxc_ir::{DType, Dim, Value, ValueId};
use std::collections::BTreeMap;

pub use attention::{AttnKernelConfig, LaunchGeometry};
pub use module::compile;
pub use target::NvptxTarget;

/// What to compile for.
#[derive(Clone, Debug)]
pub struct NvptxSpec {
    pub target: NvptxTarget,
    /// Dimensions fixed at compile time; at least the head dimension `D` (kernels are
    /// specialized on it). Other dimensions (B, H, T) stay runtime values.
    pub dims: BTreeMap<String, u64>,
    /// The values to compute, in order (empty: the graph's output). Only what they need is
    /// lowered; [`NvptxArtifact::outputs`] names their buffers in the same order.
    pub outputs: Vec<Value>,
    /// Debug: a pruned attention kernel also writes the block starts it found in-kernel to a
    /// buffer ([`NvptxArtifact::debug_starts`]), to be compared with the reference's. Off by
    /// default; when off no code or parameter is added.
    pub debug_starts: bool,
    /// Multiprocessors of the device the program will run on: sizes persistent grids (the
    /// warp-specialized attention with `grid = persistent` runs one block per SM). `None`
    /// (compiling without a device): one block per work item, which the same kernel runs too.
    pub sms: Option<u32>,
}

impl NvptxSpec {
    /// A spec for the graph's output alone.
    pub fn new(target: NvptxTarget, dims: BTreeMap<String, u64>) -> NvptxSpec {
        NvptxSpec { target, dims, outputs: vec![], debug_starts: false, sms: None }
    }
}

/// Errors of the NVPTX backend.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CodegenError {
    /// The graph holds an op this backend has no kernel for (an unoptimized graph's, or one no
    /// pass lowers for the GPU).
    #[error(
        "the NVPTX backend cannot lower op `{op}` (value %{node}); run the passes first or use --backend cpu"
    )]
    Unsupported { op: String, node: usize },
    /// An attention whose construct the GPU kernels do not take yet (the CPU backend runs it).
    #[error("the GPU backend cannot yet run an attention with {what} (value %{node}); the CPU backend (--backend cpu) runs it")]
    NotYet { what: String, node: usize },
    /// A configuration the user can change (a head dimension, a missing `--shape D=...`).
    #[error("{0}")]
    User(String),
    /// A bug in foxc or an LLVM failure.
    #[error("internal NVPTX codegen error: {0}")]
    Internal(String),
}

/// Where a device buffer's contents come from.
#[derive(Clone, Debug, PartialEq)]
pub enum BufferKind {
    /// Graph parameter number `index` (uploaded from the user's tensor `name`).
    Param { index: usize, name: String },
    /// A result of a graph node (`%n#r`; attention's log-sum-exp is its result 1).
    Value(Value),
    /// Kernel-private scratch (norms of the threshold, bf16 copies).
    Scratch(String),
    /// i32 counters that must be zero before the plan's first launch; the kernels that use
    /// them leave them zero (the threshold's per-head arrivals), so they need no clearing
    /// between runs.
    Counters(String),
}

/// One device buffer of the plan: a dense tensor of `shape` (resolved with the bound dims).
#[derive(Clone, Debug, PartialEq)]
pub struct BufferInfo {
    pub dtype: DType,
    pub shape: Vec<Dim>,
    pub kind: BufferKind,
}

/// A kernel argument.
#[derive(Clone, Debug, PartialEq)]
pub enum KernelArg {
    /// Device pointer of buffer number `n` of [`NvptxArtifact::buffers`].
    Buffer(usize),
    /// The product of the dims, as i32.
    I32(Vec<Dim>),
    /// The product of the dims, as i64.
    I64(Vec<Dim>),
    /// `ln` of the product of the dims, as f32 (the threshold's `ln T`).
    LnF32(Vec<Dim>),
    /// A TMA tensor map over a buffer, passed by value (the kernel parameter is
    /// [`builder::ParamTy::TensorMap`]).
    TensorMap(TmaMap),
}

/// A tiled tensor map over a contiguous bf16 buffer, for `cp.async.bulk.tensor` copies: the
/// runtime encodes it per launch (`cuTensorMapEncodeTiled`) from the buffer's pointer.
/// Elements of a box outside the tensor arrive as zeros.
#[derive(Clone, Debug, PartialEq)]
pub struct TmaMap {
    /// Buffer number of [`NvptxArtifact::buffers`].
    pub buffer: usize,
    /// Elements along each dimension, innermost (contiguous) first; each the product of its dims.
    pub dims: Vec<Vec<Dim>>,
    /// Elements one copy moves along each dimension.
    pub box_dims: Vec<u32>,
    /// Shared-memory swizzle of each box row: 128 (the 128-byte swizzle wgmma reads) or 0 (none).
    pub swizzle_bytes: u32,
}

/// One grid extent: a constant, or `ceil(product of dims / n)`.
#[derive(Clone, Debug, PartialEq)]
pub enum GridDim {
    Const(u32),
    Ceil(Vec<Dim>, u32),
    /// The sum of extents (blocks of several kinds in one grid).
    Sum(Vec<GridDim>),
}

/// How a kernel is launched.
#[derive(Clone, Debug, PartialEq)]
pub enum Launch {
    /// Geometry from [`attention::launch_geometry`] for `t` queries against `tk` keys and `bh`
    /// heads (a persistent kernel's grid from the device's `sms`, [`NvptxSpec::sms`]).
    Attention { cfg: AttnKernelConfig, t: Dim, tk: Dim, bh: Vec<Dim>, sms: Option<u32> },
    /// A plain grid with static shared memory.
    Grid { x: GridDim, y: GridDim, block: u32 },
    /// A plain grid whose kernel takes `shared` bytes of dynamic shared memory (the attention
    /// backward's kernels).
    GridShared { x: GridDim, y: GridDim, block: u32, shared: u32 },
}

/// One kernel launch of the plan, in execution order.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelInfo {
    /// The graph node this kernel computes (a part of).
    pub node: ValueId,
    /// Other nodes whose results this launch computes with `node`'s (the gate scan of a joint
    /// prelude, `prelude = joint`); empty for most.
    pub also: Vec<ValueId>,
    /// The PTX entry name.
    pub name: String,
    pub args: Vec<KernelArg>,
    pub launch: Launch,
    /// Buffers to zero right before this launch (the atomicMax targets).
    pub zero_first: Vec<usize>,
    /// The earlier launches (indices into [`NvptxArtifact::kernels`]) this one must follow:
    /// the previous launch of its own node and the last launch of each node it reads, from the
    /// graph's data flow. Launches that do not depend on each other may run concurrently.
    pub deps: Vec<usize>,
}

/// The compiled program: LLVM IR and PTX of one module, and its launch plan.
#[derive(Clone, Debug)]
pub struct NvptxArtifact {
    pub target: NvptxTarget,
    /// Optimized LLVM IR of the whole module.
    pub llvm_ir: String,
    pub ptx: String,
    pub buffers: Vec<BufferInfo>,
    pub kernels: Vec<KernelInfo>,
    /// The buffer of each output of [`NvptxSpec::outputs`] (of the graph's output when that
    /// was empty), in order.
    pub outputs: Vec<usize>,
    /// With [`NvptxSpec::debug_starts`]: the buffer (i32 `[B, H, ceil(T / bm)]`) where the first
    /// pruned attention kernel writes its in-kernel block starts.
    pub debug_starts: Option<usize>,
}

/// Product of `dims` resolved by `bind`.
pub fn eval_product(dims: &[Dim], bind: &dyn Fn(&str) -> Option<u64>) -> Result<u64, CodegenError> {
    let mut p: u64 = 1;
    for d in dims {
        let v = d.eval(bind).ok_or_else(|| CodegenError::User(format!("dimension {d} is not bound")))?;
        p = p.checked_mul(v).ok_or_else(|| CodegenError::User("tensor size overflows u64".into()))?;
    }
    Ok(p)
}

impl GridDim {
    pub fn eval(&self, bind: &dyn Fn(&str) -> Option<u64>) -> Result<u64, CodegenError> {
        Ok(match self {
            GridDim::Const(c) => *c as u64,
            GridDim::Ceil(dims, n) => eval_product(dims, bind)?.div_ceil(*n as u64),
            GridDim::Sum(parts) => parts.iter().map(|g| g.eval(bind)).sum::<Result<u64, _>>()?,
        })
    }
}

impl KernelInfo {
    /// Grid, block and dynamic shared memory once the dims are bound. Errors (user errors) when
    /// a grid extent exceeds what CUDA allows.
    pub fn geometry(&self, bind: &dyn Fn(&str) -> Option<u64>) -> Result<LaunchGeometry, CodegenError> {
        let (gx, gy, gz, block, shared) = match &self.launch {
            Launch::Attention { cfg, t, tk, bh, sms } => {
                let t = eval_product(std::slice::from_ref(t), bind)?;
                let tk = eval_product(std::slice::from_ref(tk), bind)?;
                let bh = eval_product(bh, bind)?;
                let g = attention::launch_geometry(cfg, t, tk, bh, *sms);
                // The kernel's own grid (a block may own less than a `bm` tile); bh is checked
                // here before the builder's u32 conversion could wrap.
                if bh > 65535 {
                    return Err(CodegenError::User(format!(
                        "kernel {}: {bh} batch x heads exceed CUDA's grid limit (65535)",
                        self.name
                    )));
                }
                (g.grid.0 as u64, g.grid.1 as u64, g.grid.2 as u64, g.block, g.shared_bytes)
            }
            Launch::Grid { x, y, block } => (x.eval(bind)?, y.eval(bind)?, 1, (*block, 1, 1), 0),
            Launch::GridShared { x, y, block, shared } => {
                (x.eval(bind)?, y.eval(bind)?, 1, (*block, 1, 1), *shared)
            }
        };
        if gx == 0 || gy == 0 {
            return Err(CodegenError::User(format!(
                "kernel {} has an empty grid (a dimension is 0)",
                self.name
            )));
        }
        if gx > i32::MAX as u64 || gy > 65535 || gz > 65535 {
            return Err(CodegenError::User(format!(
                "kernel {}: grid ({gx}, {gy}, {gz}) exceeds CUDA's limits (x < 2^31, y and z <= 65535); use fewer batch x heads or keys",
                self.name
            )));
        }
        Ok(LaunchGeometry { grid: (gx as u32, gy as u32, gz as u32), block, shared_bytes: shared })
    }
}

impl BufferInfo {
    /// Size in bytes once the dims are bound.
    pub fn bytes(&self, bind: &dyn Fn(&str) -> Option<u64>) -> Result<u64, CodegenError> {
        let n = eval_product(&self.shape, bind)?;
        n.checked_mul(self.dtype.size_bytes() as u64)
            .ok_or_else(|| CodegenError::User("tensor size overflows u64".into()))
    }
}
