//! The command line (DESIGN.md section 4 is the contract).

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Args, Parser, Subcommand, ValueEnum};
use foxc_driver::{BackendKind, PruneOptions, Target};
use foxc_ir::attention::{KvLoads, WsGrid, WsTurns};
use foxc_passes::fuse_load_map::QMap;
use foxc_passes::tiles::ForwardKernel;
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "foxc",
    version,
    about = "A compiler for decay-gated softmax attention with Adaptive Computation Pruning",
    after_help = "Examples:\n  foxc check examples/fox.attn\n  foxc compile examples/fox.attn --emit opt\n  foxc inputs examples/fox.attn --shape B=1,H=2,T=64,D=16 -o in.safetensors\n  foxc run examples/fox.attn --backend cpu --inputs in.safetensors --check\n  foxc run            (the embedded default: FoX on the CPU, B=1,H=8,T=4096,D=64)"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Parse and type-check; print diagnostics only.
    #[command(after_help = "Example:\n  foxc check examples/fox.attn")]
    Check { file: PathBuf },

    /// Compile and print one stage: the AST, the IR, the optimized IR or generated code.
    #[command(
        after_help = "Examples:\n  foxc compile examples/fox.attn --emit ir\n  foxc compile examples/fox.attn --emit opt --print-after-all\n  foxc compile examples/fox.attn --emit ptx --target sm_90a --shape D=128 -o fox.ptx\n  foxc compile examples/refuse_noncausal.attn --emit opt --explain"
    )]
    Compile(CompileArgs),

    /// Write the standard synthetic workload (bench/WORKLOAD.md) as safetensors.
    #[command(
        after_help = "Example:\n  foxc inputs examples/fox.attn --shape B=1,H=2,T=64,D=16 --seed 0 -o in.safetensors"
    )]
    Inputs {
        file: PathBuf,
        #[arg(long)]
        shape: String,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[arg(short, long)]
        o: PathBuf,
    },

    /// Run a program on a backend; with no FILE, the embedded default (FoX, CPU, B=1,H=8,T=4096,D=64).
    #[command(
        after_help = "Examples:\n  foxc run\n  foxc run examples/fox.attn --backend reference --inputs in.safetensors -o out.safetensors --check\n  foxc run examples/fox.attn --backend cuda --shape B=2,H=16,T=16384,D=128 --check"
    )]
    Run(RunArgs),

    /// Time the compiled program (median of repeated runs) on generated inputs.
    #[command(
        after_help = "On the GPU each run is one launch of the plan captured as a CUDA graph (FOXC_CUDA_GRAPH=0: launch by\nlaunch), timed by CUDA events around it after a 200 ms warm-up.\n\nExample:\n  foxc bench examples/fox.attn --backend cpu --shape B=1,H=8,T=4096,D=64 --format csv"
    )]
    Bench(BenchArgs),

    /// The forward output and the gradient of every float parameter (`grad_<name>`).
    #[command(
        after_help = "Example:\n  foxc grad examples/fox.attn --backend reference --shape B=1,H=2,T=64,D=16 -o grads.safetensors --check"
    )]
    Grad(GradArgs),

    /// Check an output file (any implementation's) against the f64 reference; exit 1 beyond
    /// tolerance.
    #[command(
        after_help = "Example:\n  foxc verify examples/fox.attn --inputs in.safetensors --output out.safetensors --tol 1e-2"
    )]
    Verify(VerifyArgs),

    /// List the pruning rules: name, threshold formula, why it is safe (docs/RULES.md).
    Rules,

    /// Draw the pruning map (kept key tiles per query tile), one panel per head, as a PNG.
    #[command(after_help = "Example:\n  foxc mask examples/fox.attn --inputs in.safetensors --png mask.png")]
    Mask {
        file: PathBuf,
        #[arg(long)]
        inputs: PathBuf,
        #[arg(long)]
        png: PathBuf,
        #[command(flatten)]
        prune: PruneArgs,
        #[arg(long, value_parser = target_arg(), default_value = "sm_90a")]
        target: Target,
        /// Draw these rules side by side (one column of panels each), e.g. --rules paper,tight;
        /// each with its kept fraction and max pruned mass (default: --prune-rule alone).
        #[arg(long, value_parser = parse_rule, value_delimiter = ',')]
        rules: Vec<foxc_ir::PruneRule>,
    },
}

#[derive(Args, Debug, Clone)]
pub struct PruneArgs {
    /// Keep dense attention (no ACP).
    #[arg(long)]
    pub no_prune: bool,
    /// ln(eps): the pruned attention mass per row stays below eps.
    #[arg(long, default_value_t = foxc_driver::DEFAULT_LOG_EPS, allow_hyphen_values = true)]
    pub log_eps: f64,
    /// The safe threshold rule: a name from `foxc rules` (the table in passes/src/rules.rs).
    #[arg(long, value_parser = parse_rule, default_value = foxc_driver::DEFAULT_PRUNE_RULE)]
    pub prune_rule: foxc_ir::PruneRule,
    /// Per-head thresholds instead of a rule: `d0,d1,...`, one per query head, each <= 0 (`-inf`
    /// never prunes the head); tile n of query tile m is skipped when c[i0] - c[jend(n)] < d_h.
    /// The user's choice, NOT a safety proof (docs/RULES.md, "Given thresholds").
    #[arg(long, value_parser = foxc_driver::options::parse_thresholds, allow_hyphen_values = true, conflicts_with = "prune_rule")]
    pub thresholds: Option<foxc_ir::PruneRule>,
    /// ACP tile shape BMxBN (default: the target's choice: 64x64; 64x128 on sm_90a for a forward with D = 64 or 128,
    /// except a decode step's split-keys attention, 64x64).
    #[arg(long, value_parser = foxc_driver::options::parse_tiles)]
    pub tiles: Option<foxc_ir::Tiles>,
    /// How the sm_90a warp-specialized forward loads K and V: `tma` (one thread issues tensor
    /// memory accelerator copies) or `cp-async` (128 threads). Default: the tiles pass's choice.
    #[arg(long, value_enum)]
    pub ws_loads: Option<WsLoadsArg>,
    /// The sm_90a warp-specialized forward's grid: `tiles` (one block per 128-row query tile and
    /// head) or `persistent` (one block per multiprocessor taking (head, query tile) items from
    /// a counter, longest tile of a head first). Default: the tiles pass's choice.
    #[arg(long, value_enum)]
    pub ws_grid: Option<WsGridArg>,
    /// Whether the sm_90a warp-specialized forward's consumer warpgroups take turns at the
    /// tensor cores: `ring` (pingpong: each waits for its turn before issuing a tile's GEMMs) or
    /// `none` (each issues them as soon as its operands are ready). Default: the tiles pass's
    /// choice.
    #[arg(long, value_enum)]
    pub ws_turns: Option<WsTurnsArg>,
    /// The sm_90a forward kernel: `standard` or `warp-specialized` (at every head dim it builds
    /// for, D = 64 too, where its mask and tiles allow). Default: the tiles pass's choice.
    #[arg(long, value_enum)]
    pub attn_kernel: Option<AttnKernelArg>,
    /// Where q's elementwise statement (RoPE's rotation) is computed: `loop` (a pass over
    /// memory writes the rotated q, the kernels read it) or `kernel` (the attention and threshold
    /// kernels compute it where they load q). Default: `kernel` on the CPU, `loop` on a GPU (each
    /// measured faster there: BENCHMARKS.md).
    #[arg(long, value_enum)]
    pub q_map: Option<QMapArg>,
    /// Key tiles per block of a GPU decode step's split-keys kernel (queries fewer than keys,
    /// at most 64 of them): each block walks this many key tiles, a merge launch combines the
    /// blocks. Default: the tiles pass's choice (2048 keys a block: 16 tiles of 128 keys, 32 of
    /// 64).
    #[arg(long)]
    pub split_key_tiles: Option<u32>,
}

impl PruneArgs {
    /// The driver's options of these flags (the defaults are the driver's).
    pub fn options(&self) -> PruneOptions {
        PruneOptions {
            no_prune: self.no_prune,
            log_eps: self.log_eps,
            prune_rule: self.thresholds.clone().unwrap_or_else(|| self.prune_rule.clone()),
            tiles: self.tiles,
            ws_loads: self.ws_loads.map(|l| match l {
                WsLoadsArg::Tma => KvLoads::Tma,
                WsLoadsArg::CpAsync => KvLoads::CpAsync,
            }),
            ws_grid: self.ws_grid.map(|g| match g {
                WsGridArg::Tiles => WsGrid::Tiles,
                WsGridArg::Persistent => WsGrid::Persistent,
            }),
            ws_turns: self.ws_turns.map(|t| match t {
                WsTurnsArg::Ring => WsTurns::Ring,
                WsTurnsArg::None => WsTurns::None,
            }),
            attn_kernel: self.attn_kernel.map(|k| match k {
                AttnKernelArg::Standard => ForwardKernel::Standard,
                AttnKernelArg::WarpSpecialized => ForwardKernel::WarpSpecialized,
            }),
            q_map: self.q_map.map(|m| match m {
                QMapArg::Loop => QMap::Loop,
                QMapArg::Kernel => QMap::Kernel,
            }),
            split_key_tiles: self.split_key_tiles,
            // The CLI reads the norms from the data; a decode's cache promises them (Python).
            norm_bounds: None,
        }
    }
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum QMapArg {
    Loop,
    Kernel,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum WsGridArg {
    Tiles,
    Persistent,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum WsTurnsArg {
    Ring,
    None,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnKernelArg {
    Standard,
    WarpSpecialized,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum WsLoadsArg {
    Tma,
    CpAsync,
}

#[derive(Args, Debug)]
pub struct CompileArgs {
    pub file: PathBuf,
    #[arg(long, value_enum, default_value_t = EmitArg::Opt)]
    pub emit: EmitArg,
    /// The target the passes optimize for (default: the CPU, or sm_90a for `--emit llvm|ptx`);
    /// `--emit clif` needs the CPU, `--emit llvm|ptx` a GPU target.
    #[arg(long, value_parser = target_arg())]
    pub target: Option<Target>,
    #[command(flatten)]
    pub prune: PruneArgs,
    /// Print the IR after every pass (to stderr).
    #[arg(long)]
    pub print_after_all: bool,
    /// Explain why attention was or was not recognized and pruned.
    #[arg(long)]
    pub explain: bool,
    /// Print Graphviz DOT instead of text (with --emit ir or opt).
    #[arg(long)]
    pub dot: bool,
    /// Concrete dims for code generation, e.g. D=128 (default D=64).
    #[arg(long)]
    pub shape: Option<String>,
    #[arg(short, long)]
    pub o: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    pub file: Option<PathBuf>,
    #[arg(long, value_parser = backend_arg(), default_value = "cpu")]
    pub backend: BackendKind,
    #[arg(long, conflicts_with = "shape")]
    pub inputs: Option<PathBuf>,
    #[arg(long)]
    pub shape: Option<String>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[arg(short, long)]
    pub o: Option<PathBuf>,
    /// Compare with the f64 reference interpreter; exit 1 beyond tolerance.
    #[arg(long)]
    pub check: bool,
    /// With --backend cuda: run a debug build of the attention kernel that writes the block
    /// starts it finds in-kernel, and compare them with the reference's (exit 1 on a mismatch
    /// that is not a near tie of the f32 threshold). Off by default: no cost when off.
    #[arg(long)]
    pub check_starts: bool,
    #[command(flatten)]
    pub prune: PruneArgs,
}

#[derive(Args, Debug)]
pub struct GradArgs {
    pub file: PathBuf,
    #[arg(long, value_parser = backend_arg(), default_value = "reference")]
    pub backend: BackendKind,
    #[arg(long, conflicts_with = "shape")]
    pub inputs: Option<PathBuf>,
    #[arg(long)]
    pub shape: Option<String>,
    /// The upstream gradient: a safetensors file with a tensor `dout` shaped like the output
    /// (default: seeded N(0, 1)).
    #[arg(long)]
    pub dout: Option<PathBuf>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[arg(short, long)]
    pub o: Option<PathBuf>,
    /// Compare every gradient with the f64 reference interpreter; exit 1 beyond tolerance.
    #[arg(long)]
    pub check: bool,
    #[command(flatten)]
    pub prune: PruneArgs,
}

#[derive(Args, Debug)]
pub struct VerifyArgs {
    pub file: PathBuf,
    #[arg(long)]
    pub inputs: PathBuf,
    /// A safetensors file holding the output as a tensor named `out`.
    #[arg(long)]
    pub output: PathBuf,
    /// Relative L2 tolerance (default: 1e-5 for f32 outputs, 1e-2 for bf16 and f16).
    #[arg(long)]
    pub tol: Option<f64>,
    #[command(flatten)]
    pub prune: PruneArgs,
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    pub file: PathBuf,
    #[arg(long, value_parser = backend_arg(), default_value = "cpu")]
    pub backend: BackendKind,
    /// The standard workload at these sizes.
    #[arg(long, required_unless_present = "inputs")]
    pub shape: Option<String>,
    /// Time these inputs instead (a safetensors file, as `foxc run --inputs`; its sizes bind
    /// the dims): a packed batch's own sequence starts, say.
    #[arg(long, conflicts_with = "shape")]
    pub inputs: Option<PathBuf>,
    /// The standard workload's seed, and `dout`'s with `--grad`.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[arg(long, value_enum, default_value_t = FormatArg::Table)]
    pub format: FormatArg,
    #[arg(long, default_value_t = 10)]
    pub iters: usize,
    /// Time forward plus backward: the whole gradient program (`foxc grad`), every gradient
    /// included, with the upstream gradient `dout` seeded N(0, 1).
    #[arg(long)]
    pub grad: bool,
    #[command(flatten)]
    pub prune: PruneArgs,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmitArg {
    Ast,
    Ir,
    Opt,
    /// The gradient program of the optimized IR (`foxc grad`).
    Grad,
    Clif,
    Llvm,
    Ptx,
    /// The PTX of the gradient program: the forward and backward kernels `foxc grad --backend
    /// cuda` runs.
    GradPtx,
}

/// `--target NAME`: a target of the driver's table (`cpu`, `sm_90a`, `sm_80`).
fn target_arg() -> impl TypedValueParser<Value = Target> {
    let names = foxc_driver::target::TARGETS.map(|(_, n)| n);
    PossibleValuesParser::new(names).map(|n| foxc_driver::target::parse(&n).expect("a listed target"))
}

/// `--backend NAME`: a backend of the driver's list (`reference`, `cpu`, `cuda`).
fn backend_arg() -> impl TypedValueParser<Value = BackendKind> {
    let names = BackendKind::ALL.map(BackendKind::name);
    PossibleValuesParser::new(names).map(|n| BackendKind::parse(&n).expect("a listed backend"))
}

/// `--prune-rule NAME`: an entry of the rule table; a usage error lists the names otherwise.
fn parse_rule(name: &str) -> Result<foxc_ir::PruneRule, String> {
    foxc_passes::rules::by_name(name)
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum FormatArg {
    Table,
    Csv,
    Json,
}
