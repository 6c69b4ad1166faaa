//! foxc-passes: the pass pipeline that turns a lowered attention graph into fused,
//! pruned attention.
//!
//! Passes, in order (the verifier runs after each):
//! 1. `recognize-attention` ([`recognize`]): egg-based recognition of decay-gated softmax
//!    attention in any of its spellings; the output statement becomes one `attention` node
//!    (docs/SEMANTICS.md) whose score region, mask, scale (`1/sqrt(D)` stays symbolic in the
//!    attribute) and decay operand (a `gate_cumsum`) say what the source said.
//! 2. `monotonicity` ([`monotone`]): proves `c` non-increasing (the decay bias `c_i - c_j <= 0`
//!    for `j <= i`). Changes nothing in the IR; an unproven gate gets an [`Explanation`].
//! 3. `tiles` ([`tiles`]): the target's `bm x bn` (or `--tiles`) on every attention, dense too.
//! 4. `acp` ([`acp`]): Adaptive Computation Pruning — `threshold`, `block_boundary` and a pruned
//!    `attention` for every proven dense `attention` whose score region has a bound.
//! 5. `fuse-output-cast`, `fuse-boundary` ([`fuse_out`]): the output cast becomes the attention's
//!    `out_dtype`; on GPU targets the kernel derives the block boundary itself.
//! 6. `fuse-threshold` ([`fuse_out`], GPU targets): a threshold of tile norms only is one
//!    launch.
//! 7. `fuse-prelude` ([`fuse_out`], GPU targets): the gate scan and a one-launch threshold
//!    that only feed one attention become one launch.
//! 8. `compensate-decay` ([`compensate`], CPU target): the decay `c` travels as an f32 pair
//!    `(c, c_lo)` so that `c_i - c_j` keeps f64 accuracy when `|c|` is large.
//! 9. `fold-q-scale` ([`fold_scale`], GPU targets): an attention or threshold whose q is a
//!    product `x * s` with a compile-time scalar `s` reads `x`, `s` in its scale attribute.
//! 10. `contract` ([`contract`], CPU target): a `sum` of a `mul` that only it uses reads the
//!     mul's operands (`sum {contract}`); the product is never written.
//! 11. `fuse-loops` ([`fuse_loops`]): an elementwise value that its users can compute in their
//!     own loops becomes `inline` (no buffer, no loop of its own).
//!
//! A gradient program ([`grad`], made from an optimized graph) has its own step for GPU
//! targets, `fuse-gradient-casts` ([`fuse_grad::optimize_gradient`]): the backward writes its
//! dq, dk, dv in the dtype they are cast to.

pub mod acp;
pub mod compensate;
mod cone;
pub mod contract;
pub mod fold_scale;
pub mod fuse_epilogue;
pub mod fuse_grad;
pub mod fuse_load_map;
pub mod fuse_loops;
pub mod fuse_out;
pub mod grad;
pub mod half_operands;
pub mod key_bound;
pub mod lang;
pub mod monotone;
pub mod recognize;
pub mod rules;
pub mod tiles;

use foxc_ir::print::print_graph;
pub use foxc_ir::PruneRule;
use foxc_ir::{Graph, Span, ValueId};
use std::collections::BTreeMap;
pub use tiles::tiles_for;

/// The code generation target (selects tile sizes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    Cpu,
    Sm90a,
    Sm80,
}

impl Target {
    /// A GPU target: the passes that shape work for GPU kernels (the fused threshold and
    /// boundary, the folded scale, contractions read through, split keys) run for it.
    pub fn is_gpu(self) -> bool {
        self != Target::Cpu
    }
}

/// Options of the pass pipeline (`foxc compile` flags).
#[derive(Clone, Debug, PartialEq)]
pub struct PassOptions {
    /// Insert ACP (`--no-prune` sets false: `decay_attention` stays dense).
    pub prune: bool,
    /// Natural log of the pruned-mass bound eps (`--log-eps`, default -10).
    pub log_eps: f64,
    /// Threshold rule (`--prune-rule NAME`, an entry of [`rules::RULES`]).
    pub rule: PruneRule,
    pub target: Target,
    /// Record the IR after every pass in [`PassReport::dumps`].
    pub print_after_all: bool,
    /// Tile shape requested by the user (`--tiles BMxBN`); `None`: the target's choice
    /// ([`tiles_for`]).
    pub tiles: Option<foxc_ir::Tiles>,
    /// Sizes the caller has already bound (`--shape`, input files), by dim name. Passes may
    /// specialize on them (the tiles pass reads the head dim); empty: everything symbolic.
    pub dims: std::collections::BTreeMap<String, u64>,
    /// Lower bounds the caller guarantees for dims it leaves unbound, by name: passes may pick
    /// a faster form by them, never a different result. The Python op compiles one GPU plan for
    /// rows above [`fuse_out::SPLIT_ROWS_ABOVE`] and one for the rest
    /// ([`fuse_out::split_rows_bounds`]); empty: nothing known.
    pub dims_at_least: std::collections::BTreeMap<String, u64>,
    /// The optimized graph will be differentiated (`foxc grad`, `bench --grad`): the tiles
    /// pass picks the tiles the backward kernels run best with.
    pub gradient: bool,
    /// How the warp-specialized kernel loads K and V (`--ws-loads`); `None`: the tiles pass's
    /// choice ([`tiles::WS_LOADS`]).
    pub ws_loads: Option<foxc_ir::attention::KvLoads>,
    /// The warp-specialized kernel's grid (`--ws-grid`); `None`: the tiles pass's choice
    /// ([`tiles::WS_GRID`]).
    pub ws_grid: Option<foxc_ir::attention::WsGrid>,
    /// Whether the warp-specialized kernel's consumers take turns at the tensor cores
    /// (`--ws-turns`); `None`: the tiles pass's choice ([`tiles::WS_TURNS`]).
    pub ws_turns: Option<foxc_ir::attention::WsTurns>,
    /// The forward kernel asked for (`--attn-kernel`); `None`: the tiles pass's choice
    /// ([`tiles::kernel_for`]).
    pub attn_kernel: Option<tiles::ForwardKernel>,
    /// Where q's elementwise statement is computed (`--q-map`); `None`: the target's choice
    /// ([`fuse_load_map::GPU_Q_MAP`] on a GPU, the kernels on the CPU).
    pub q_map: Option<fuse_load_map::QMap>,
    /// Key tiles per block of a GPU split-keys kernel (`--split-key-tiles`, a decode step's);
    /// `None`: [`tiles::SPLIT_KEYS_PER_BLOCK`] keys.
    pub split_key_tiles: Option<u32>,
    /// Bounds `(q_max, k_max)` the caller guarantees on the Euclidean norm of every query and
    /// key row the attention reads: ACP's threshold takes them as a static bound (as QK-norm's)
    /// instead of reading the norms from the data, so no pass over K runs per call (a decode
    /// step's prelude). A promise, not a check: `foxc.KVCache` checks it on every row it passes.
    pub norm_bounds: Option<(f64, f64)>,
}

/// ln(eps) of the pruning unless the user says otherwise (the paper's value). The one
/// definition: the driver, the CLI and the Python extension use this constant.
pub const DEFAULT_LOG_EPS: f64 = -10.0;

impl Default for PassOptions {
    fn default() -> Self {
        PassOptions {
            prune: true,
            log_eps: DEFAULT_LOG_EPS,
            rule: rules::default_rule(),
            target: Target::Cpu,
            print_after_all: false,
            tiles: None,
            dims: Default::default(),
            dims_at_least: Default::default(),
            gradient: false,
            ws_loads: None,
            ws_grid: None,
            ws_turns: None,
            attn_kernel: None,
            q_map: None,
            split_key_tiles: None,
            norm_bounds: None,
        }
    }
}

/// Why something was not fused or not pruned, pointing at the source (`foxc compile --explain`).
#[derive(Clone, Debug, PartialEq)]
pub struct Explanation {
    pub message: String,
    pub span: Span,
    pub hint: Option<String>,
}

/// What the pipeline did.
#[derive(Clone, Debug, Default)]
pub struct PassReport {
    /// `(pass name, IR text after it)` for every pass, when `print_after_all` is set.
    pub dumps: Vec<(String, String)>,
    pub explanations: Vec<Explanation>,
}

#[derive(Debug, thiserror::Error)]
pub enum PassError {
    #[error("the IR after pass `{pass}` does not verify: {error}")]
    Verify { pass: String, error: foxc_ir::verify::VerifyError },
    #[error("invalid pass option: {0}")]
    InvalidOption(String),
    #[error("internal error in the passes: {0}")]
    Internal(String),
}

/// What one pass proved, for the passes after it.
#[derive(Default)]
pub struct PassContext {
    /// Monotonicity verdict per `decay_attention` node.
    pub verdicts: BTreeMap<ValueId, monotone::Verdict>,
    pub explanations: Vec<Explanation>,
    /// Source span of each score-region node, per attention node recognition built (ACP points
    /// at the term that has no bound).
    pub region_spans: BTreeMap<ValueId, Vec<foxc_ir::Span>>,
}

impl PassContext {
    /// Records what `--explain` says of the source at `span` (why a pass left something as it
    /// was), with a `hint` of what to write instead.
    pub fn explain(&mut self, message: String, span: foxc_ir::Span, hint: Option<String>) {
        self.explanations.push(Explanation { message, span, hint });
    }
}

type PassFn = fn(&mut Graph, &PassOptions, &mut PassContext) -> Result<(), PassError>;

/// The targets a pass runs for: a decision that shapes work for one kind of backend is made
/// for that kind only, here, not by a test inside the pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Runs {
    Always,
    /// GPU targets ([`Target::is_gpu`]).
    Gpu,
    Cpu,
}

impl Runs {
    pub fn on(self, target: Target) -> bool {
        match self {
            Runs::Always => true,
            Runs::Gpu => target.is_gpu(),
            Runs::Cpu => !target.is_gpu(),
        }
    }
}

/// One entry of [`PASSES`].
pub struct Pass {
    pub name: &'static str,
    pub runs: Runs,
    pub run: PassFn,
}

const fn pass(name: &'static str, runs: Runs, run: PassFn) -> Pass {
    Pass { name, runs, run }
}

/// The passes in order, with the targets each runs for.
pub const PASSES: &[Pass] = &[
    pass("recognize-attention", Runs::Always, |g, _, cx| recognize::recognize(g, cx).map(|_| ())),
    pass("monotonicity", Runs::Always, monotone::run),
    pass("tiles", Runs::Always, tiles::run),
    pass("acp", Runs::Always, acp::run),
    // Before half-operands: a q scaled in f32 is folded into the scale, not cast.
    pass("fold-q-scale", Runs::Gpu, fold_scale::run),
    pass("half-operands", Runs::Gpu, half_operands::run),
    pass("fuse-output-cast", Runs::Always, fuse_out::output_cast),
    pass("fuse-boundary", Runs::Gpu, fuse_out::boundary),
    pass("fuse-threshold", Runs::Gpu, fuse_out::threshold),
    pass("fuse-prelude", Runs::Gpu, fuse_out::prelude),
    pass("fuse-epilogue", Runs::Always, fuse_epilogue::run),
    pass("fuse-load-maps", Runs::Always, fuse_load_map::run),
    pass("compensate-decay", Runs::Cpu, compensate::run),
    pass("contract", Runs::Cpu, contract::run),
    pass("fuse-loops", Runs::Always, fuse_loops::run),
];

/// Runs the pass `name` of [`PASSES`] on `g` if it runs for `opts.target` (one-pass tests);
/// whether it ran. An unknown name is an [`PassError::InvalidOption`].
pub fn run_pass(
    name: &str,
    g: &mut Graph,
    opts: &PassOptions,
    cx: &mut PassContext,
) -> Result<bool, PassError> {
    let p = PASSES
        .iter()
        .find(|p| p.name == name)
        .ok_or_else(|| PassError::InvalidOption(format!("no pass is named `{name}`")))?;
    if !p.runs.on(opts.target) {
        return Ok(false);
    }
    (p.run)(g, opts, cx)?;
    Ok(true)
}

/// The smallest `log_eps` accepted: `exp(-708)` is about 3e-308, just above the smallest normal
/// f64; below about -745 eps is 0 and every bound that multiplies by it (the check's ACP bound)
/// would be 0 too.
pub const MIN_LOG_EPS: f64 = -708.0;

/// Run the pipeline on `g` in place: the passes of [`PASSES`] that run for `opts.target`,
/// verifying after each (and, with `print_after_all`, recording the IR after each).
pub fn optimize(g: &mut Graph, opts: &PassOptions) -> Result<PassReport, PassError> {
    if !(opts.log_eps >= MIN_LOG_EPS && opts.log_eps < 0.0) {
        return Err(PassError::InvalidOption(format!(
            "log_eps must be in [{MIN_LOG_EPS}, 0) (ln of an eps below 1 that f64 holds as a normal number), got {}",
            opts.log_eps
        )));
    }
    let mut cx = PassContext::default();
    let mut report = PassReport::default();
    for p in PASSES.iter().filter(|p| p.runs.on(opts.target)) {
        (p.run)(g, opts, &mut cx)?;
        foxc_ir::verify::verify(g).map_err(|error| PassError::Verify { pass: p.name.to_string(), error })?;
        if opts.print_after_all {
            report.dumps.push((p.name.to_string(), print_graph(g)));
        }
    }
    report.explanations = cx.explanations;
    Ok(report)
}
