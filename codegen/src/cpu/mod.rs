//! The CPU backend: Cranelift machine code for the fused ops of an optimized graph.
//!
//! [`compile`] turns a graph, with its symbolic dims bound to concrete sizes, into one JIT-compiled
//! kernel per non-parameter node (see [`abi`] for the calling convention). The runtime's executor
//! (`foxc_runtime::cpu`) allocates the buffers and runs the kernels in topological order, in
//! parallel over each kernel's task space. [`clif_text`] gives the Cranelift IR for
//! `foxc compile --emit clif`.
//!
//! Fused kernels ([`kernels`]): `gate_cumsum`, `threshold`, `block_boundary` and `attention`,
//! exactly as docs/SEMANTICS.md states them, plus fast paths for
//! `cast` (f32/bf16/i32 to f32/bf16), a positional tensor combined with a folded scalar, and
//! `rmsnorm` over the last axis. Every other op (and those three outside their fast path) gets
//! plain loops from [`generic`]; nothing falls back to the interpreter.

pub mod abi;
mod backward;
mod emit;
pub mod generic;
mod kernels;
mod region;
mod region_math;
mod threshold;

use cranelift_codegen::ir::{types, AbiParam, UserFuncName};
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::FunctionBuilderContext;
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{default_libcall_names, FuncId, Linkage, Module};
use foxc_ir::{BinaryOp, DType, Dim, Graph, Op, Value, ValueId};
use kernels::{AttnKernel, Kind};
use std::collections::{BTreeMap, HashMap, HashSet};

#[derive(Debug, thiserror::Error)]
pub enum CpuError {
    /// Shapes, dtypes or dims that the kernels do not accept.
    #[error("{0}")]
    Invalid(String),
    /// Cranelift refused the generated code (a foxc bug).
    #[error("cranelift: {0}")]
    Cranelift(String),
}

/// Options of code generation.
#[derive(Clone, Copy, Debug)]
pub struct CpuOptions {
    /// Emit `fma` (the host has fused multiply-add); otherwise `fmul` + `fadd`.
    pub fma: bool,
}

impl Default for CpuOptions {
    fn default() -> Self {
        CpuOptions { fma: host_has_fma() }
    }
}

fn host_has_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        true
    }
}

/// The tasks of one kernel: `0..count`, handed out `chunk` at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskSpace {
    pub count: u64,
    pub chunk: u64,
}

/// One compiled kernel: computes results of node `node`.
#[derive(Debug)]
pub struct CpuKernel {
    pub node: ValueId,
    /// The values whose buffers the kernel reads, in `args` order (usually the node's operands;
    /// a `sum` that contracts its `mul` reads the mul's operands, see [`generic`]).
    pub operands: Vec<Value>,
    /// The results of `node` it writes, in `args` order after the operands.
    pub results: Vec<u32>,
    /// `k<value>_<op>`, as in the CLIF text.
    pub name: String,
    /// Entry point, an [`abi::KernelFn`]; valid while the owning [`CpuProgram`] lives.
    pub entry: *const u8,
    pub tasks: TaskSpace,
    /// Per-thread scratch the kernel needs ([`abi::SCRATCH_ALIGN`]-aligned).
    pub scratch_bytes: usize,
    /// A buffer shared by the kernel's tasks (0: none), the argument after the results.
    pub temp_bytes: usize,
    /// Run once after all tasks (tasks `0..1`), same arguments: see [`abi`].
    pub finish: Option<*const u8>,
}

/// A compiled graph: kernels in topological order, owning their machine code.
pub struct CpuProgram {
    pub kernels: Vec<CpuKernel>,
    /// The Cranelift IR of every kernel, before optimization.
    pub clif: String,
    /// The dims the program was compiled for.
    pub dims: BTreeMap<String, u64>,
    module: Option<JITModule>,
}

impl std::fmt::Debug for CpuProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuProgram").field("kernels", &self.kernels).field("dims", &self.dims).finish()
    }
}

impl Drop for CpuProgram {
    fn drop(&mut self) {
        if let Some(m) = self.module.take() {
            // SAFETY: the entry points die with the program; callers hold `&CpuProgram` while running.
            unsafe { m.free_memory() };
        }
    }
}

/// Compile `g` for the concrete `dims` with the host's default options.
pub fn compile(g: &Graph, dims: &BTreeMap<String, u64>) -> Result<CpuProgram, CpuError> {
    compile_with(g, dims, CpuOptions::default())
}

/// Compile the kernels of the graph's output.
pub fn compile_with(
    g: &Graph,
    dims: &BTreeMap<String, u64>,
    opts: CpuOptions,
) -> Result<CpuProgram, CpuError> {
    compile_outputs(g, dims, &[], opts)
}

/// Compile the kernels that the values `outputs` need (empty: the graph's output), and only
/// those; every result of a node that something reads or that is an output gets a buffer.
pub fn compile_outputs(
    g: &Graph,
    dims: &BTreeMap<String, u64>,
    outputs: &[Value],
    opts: CpuOptions,
) -> Result<CpuProgram, CpuError> {
    let specs = plan(g, dims, outputs)?;
    let (mut module, built, clif) = build(&specs, opts)?;
    module.finalize_definitions().map_err(|e| CpuError::Cranelift(e.to_string()))?;
    let kernels = specs
        .iter()
        .zip(built)
        .map(|(s, (id, fin))| {
            let (count, chunk, scratch_bytes) = s.kind.tasks();
            if std::env::var_os("FOXC_CPU_DISASM").is_some() {
                eprintln!("; {} entry {:p}", s.name, module.get_finalized_function(id));
            }
            CpuKernel {
                node: s.node,
                operands: s.operands.clone(),
                results: s.results.clone(),
                name: s.name.clone(),
                entry: module.get_finalized_function(id),
                tasks: TaskSpace { count, chunk },
                scratch_bytes,
                temp_bytes: s.kind.temp_bytes(),
                finish: fin.map(|f| module.get_finalized_function(f)),
            }
        })
        .collect();
    Ok(CpuProgram { kernels, clif, dims: dims.clone(), module: Some(module) })
}

/// The Cranelift IR of every kernel of `g` (for `foxc compile --emit clif`).
pub fn clif_text(g: &Graph, dims: &BTreeMap<String, u64>, opts: CpuOptions) -> Result<String, CpuError> {
    clif_text_outputs(g, dims, &[], opts)
}

/// The Cranelift IR of the kernels that `outputs` need (empty: the graph's output).
pub fn clif_text_outputs(
    g: &Graph,
    dims: &BTreeMap<String, u64>,
    outputs: &[Value],
    opts: CpuOptions,
) -> Result<String, CpuError> {
    let specs = plan(g, dims, outputs)?;
    let (module, _, clif) = build(&specs, opts)?;
    // SAFETY: nothing was finalized, so no code from this module is reachable.
    unsafe { module.free_memory() };
    Ok(clif)
}

/// One kernel to generate.
struct Spec {
    node: ValueId,
    operands: Vec<Value>,
    results: Vec<u32>,
    name: String,
    kind: SpecKind,
}

enum SpecKind {
    Fused(Kind),
    Generic(generic::Planned),
}

impl SpecKind {
    fn tasks(&self) -> (u64, u64, usize) {
        match self {
            SpecKind::Fused(k) => k.tasks(),
            SpecKind::Generic(p) => p.kernel.tasks(),
        }
    }

    fn temp_bytes(&self) -> usize {
        match self {
            SpecKind::Fused(k) => k.temp_bytes(),
            SpecKind::Generic(_) => 0,
        }
    }
}

/// Concrete shape of a value.
fn shape(
    g: &Graph,
    id: ValueId,
    dims: &BTreeMap<String, u64>,
    num: &HashMap<ValueId, usize>,
) -> Result<Vec<u64>, CpuError> {
    g.ty(id)
        .dims()
        .map(|d| {
            d.eval(&|s| dims.get(s).copied()).ok_or_else(|| {
                let unbound = unbound_sym(d).unwrap_or_default();
                CpuError::Invalid(format!(
                    "dimension `{unbound}` of value %{} is not bound to a size",
                    num[&id]
                ))
            })
        })
        .collect()
}

fn unbound_sym(d: &Dim) -> Option<String> {
    match d {
        Dim::Sym(s) => Some(s.clone()),
        Dim::Const(_) => None,
        Dim::Tiles(b, _) => unbound_sym(b),
        Dim::Div(a, b) => unbound_sym(a).or_else(|| unbound_sym(b)),
    }
}

fn plan(g: &Graph, dims: &BTreeMap<String, u64>, outputs: &[Value]) -> Result<Vec<Spec>, CpuError> {
    let order = g.topo_order();
    let num: HashMap<ValueId, usize> = order.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    let outputs: Vec<Value> = if outputs.is_empty() {
        let Some(output) = g.output else {
            return Err(CpuError::Invalid("the graph has no output".into()));
        };
        if matches!(g.op(output), Op::Param { .. }) {
            return Err(CpuError::Invalid(
                "the graph's output is a parameter: there is nothing to compute".into(),
            ));
        }
        vec![Value::of(output)]
    } else {
        outputs.to_vec()
    };
    for o in &outputs {
        if !num.contains_key(&o.node) || g.result_ty(o.node, o.result).is_none() {
            return Err(CpuError::Invalid(format!(
                "output {}#{} is not a value of the graph",
                o.node.index(),
                o.result
            )));
        }
    }
    let out_nodes: HashSet<ValueId> = outputs.iter().map(|o| o.node).collect();
    // Only values the outputs depend on get kernels (passes may leave dead values behind);
    // `used` holds every result that an output is or a live node reads.
    let mut live = HashSet::new();
    let mut used: HashSet<Value> = outputs.iter().copied().collect();
    let mut stack: Vec<ValueId> = outputs.iter().map(|o| o.node).collect();
    while let Some(x) = stack.pop() {
        if live.insert(x) {
            let ov = g.operand_values(x);
            stack.extend(ov.iter().map(|v| v.node));
            used.extend(ov);
        }
    }
    // Scalar subgraphs (`rsqrt(dim D)`) fold to constants at compile time: dims are concrete.
    let mut consts: HashMap<ValueId, f64> = HashMap::new();
    let contracted = crate::loop_plan::contracted_muls(g, &live, &out_nodes);
    let mut specs = vec![];
    for &n in &order {
        if !live.contains(&n) || contracted.contains(&n) {
            continue;
        }
        let op = g.op(n);
        if g.ty(n).rank() == 0 && !out_nodes.contains(&n) {
            if let Some(c) = foxc_ir::fold::scalar_value(g, n, dims) {
                consts.insert(n, c);
                continue;
            }
        }
        let v = num[&n];
        let ops = g.operands(n);
        let invalid = |msg: String| CpuError::Invalid(format!("value %{v} ({}): {msg}", op.mnemonic()));
        let sh = |id: ValueId| shape(g, id, dims, &num);
        let dt = |id: ValueId| g.ty(id).dtype;
        let float_in = |id: ValueId| -> Result<DType, CpuError> {
            match dt(id) {
                d if emit::is_cpu_float(d) => Ok(d),
                d => Err(invalid(format!(
                    "operand %{} has dtype {d}; the CPU kernels read f32, bf16 or f16",
                    num[&id]
                ))),
            }
        };
        let out_shape = sh(n)?;
        let rank4 = |id: ValueId| -> Result<[u64; 4], CpuError> {
            let s = sh(id)?;
            <[u64; 4]>::try_from(s.as_slice())
                .map_err(|_| invalid(format!("operand %{} must be [B, H, T, D]", num[&id])))
        };
        let expect = |id: ValueId, want: &[u64], what: &str| -> Result<(), CpuError> {
            let s = sh(id)?;
            if s != want {
                return Err(invalid(format!(
                    "operand %{} ({what}) has shape {s:?}, expected {want:?}",
                    num[&id]
                )));
            }
            Ok(())
        };
        // Plain loops for every op without a fused kernel or outside a fast path's conditions.
        let generic = |consts: &HashMap<ValueId, f64>| -> Result<SpecKind, CpuError> {
            let cx = generic::Ctx { g, dims, consts, num: &num };
            Ok(SpecKind::Generic(generic::plan(&cx, n, &contracted)?))
        };
        // The fast kernels check their operands' types by node (result 0); a node reading a
        // later result of another (a backward's dk) takes the generic loop, which reads any.
        let later = g.operand_values(n).iter().any(|v| v.result != 0);
        let kind = match op {
            Op::Param { .. } => continue,
            Op::Binary(_) | Op::Cast | Op::RmsNorm { .. } if later => generic(&consts)?,
            Op::Binary(bop)
                if ops.len() == 2 && (consts.contains_key(&ops[0]) ^ consts.contains_key(&ops[1])) =>
            {
                let tensor_first = consts.contains_key(&ops[1]);
                let (t, c) = if tensor_first { (ops[0], ops[1]) } else { (ops[1], ops[0]) };
                let arith = matches!(
                    bop,
                    BinaryOp::Add
                        | BinaryOp::Sub
                        | BinaryOp::Mul
                        | BinaryOp::Div
                        | BinaryOp::Min
                        | BinaryOp::Max
                );
                let dst = g.ty(n).dtype;
                let fast = arith
                    && sh(t)? == out_shape
                    && g.ty(n).is_positional()
                    && g.ty(t).is_positional()
                    && emit::is_cpu_float(dst)
                    && emit::is_cpu_float(dt(t));
                if !fast {
                    generic(&consts)?
                } else {
                    SpecKind::Fused(Kind::ScalarOp {
                        src: float_in(t)?,
                        dst,
                        op: *bop,
                        c: consts[&c],
                        tensor_first,
                        n: out_shape.iter().product(),
                    })
                }
            }
            Op::Cast => {
                let (src, dst) = (dt(ops[0]), g.ty(n).dtype);
                let fast = (emit::is_cpu_float(src) || src == DType::I32)
                    && emit::is_cpu_float(dst)
                    && g.ty(n).is_positional()
                    && g.ty(ops[0]).is_positional();
                if !fast {
                    generic(&consts)?
                } else {
                    SpecKind::Fused(Kind::Cast { src, dst, n: out_shape.iter().product() })
                }
            }
            Op::RmsNorm { axis, eps } => {
                let xs = sh(ops[0])?;
                let out = g.ty(n).dtype;
                let fast = !xs.is_empty()
                    && *axis == (xs.len() - 1).to_string()
                    && g.ty(n).is_positional()
                    && sh(ops[1])? == xs[xs.len() - 1..]
                    && emit::is_cpu_float(out)
                    && emit::is_cpu_float(dt(ops[0]))
                    && emit::is_cpu_float(dt(ops[1]));
                if !fast {
                    generic(&consts)?
                } else {
                    let d = xs[xs.len() - 1];
                    SpecKind::Fused(Kind::RmsNorm {
                        x: float_in(ops[0])?,
                        w: float_in(ops[1])?,
                        out,
                        rows: xs.iter().product::<u64>() / d.max(1),
                        d,
                        eps: *eps,
                    })
                }
            }
            Op::GateCumsum { kind } | Op::GateCumsumLo { kind } => {
                let [b, h, t] = <[u64; 3]>::try_from(out_shape.as_slice())
                    .map_err(|_| invalid("result must be [B, H, T]".into()))?;
                if *kind == foxc_ir::GateKind::Slope {
                    expect(ops[0], &[h], "slopes [H]")?;
                } else {
                    expect(ops[0], &[b, h, t], "gates [B, H, T]")?;
                }
                let lo = matches!(op, Op::GateCumsumLo { .. });
                SpecKind::Fused(Kind::GateCumsum { kind: *kind, src: float_in(ops[0])?, b, h, t, lo })
            }
            Op::Threshold { rule, log_eps, bound, score, scale, bm, .. } => {
                let [b, h, t, d] = rank4(ops[0])?;
                let ks = sh(ops[1])?;
                let hk = ks.get(1).copied().unwrap_or(0);
                expect(ops[1], &[b, hk, t, d], "k")?;
                if hk == 0 || h % hk != 0 {
                    return Err(invalid(format!("k has {hk} heads, which do not divide q's {h}")));
                }
                if *bm == 0 {
                    return Err(invalid("bm = 0".into()));
                }
                let scale = scale
                    .value(&|x| dims.get(x).copied())
                    .ok_or_else(|| invalid("the scale's dim is not bound".into()))?;
                SpecKind::Fused(Kind::Threshold {
                    q: float_in(ops[0])?,
                    k: float_in(ops[1])?,
                    bh: b * h,
                    t,
                    d,
                    h,
                    hk,
                    rule: rule.clone(),
                    log_eps: *log_eps,
                    bound: *bound,
                    score: *score,
                    scale,
                    bm: *bm as u64,
                })
            }
            Op::BlockBoundary(tiles) => {
                let cs = sh(ops[0])?;
                let [b, h, t] =
                    <[u64; 3]>::try_from(cs.as_slice()).map_err(|_| invalid("c must be [B, H, T]".into()))?;
                if tiles.bm == 0 || tiles.bn == 0 {
                    return Err(invalid("zero tile size".into()));
                }
                let mt = t.div_ceil(tiles.bm as u64);
                expect(ops[1], &[b, h, mt], "delta")?;
                SpecKind::Fused(Kind::BlockBoundary {
                    c: float_in(ops[0])?,
                    delta: float_in(ops[1])?,
                    bh: b * h,
                    t,
                    bm: tiles.bm as u64,
                    bn: tiles.bn as u64,
                })
            }
            Op::Attention(attn) | Op::AttentionBackward(attn) => {
                let backward = matches!(op, Op::AttentionBackward(_));
                // The backward's operands are the forward's, then out, lse, dout.
                let fwd_ops = &ops[..ops.len() - if backward { 3.min(ops.len()) } else { 0 }];
                let ao = foxc_ir::AttnOperands::from_positional(attn, fwd_ops).map_err(invalid)?;
                let tiles = attn
                    .tiles
                    .ok_or_else(|| invalid("the attention has no tiles (run the tiles pass)".into()))?;
                let pruned = match attn.prune {
                    foxc_ir::Prune::Dense => false,
                    foxc_ir::Prune::Start => true,
                    foxc_ir::Prune::Boundary => {
                        return Err(invalid(
                            "the attention derives its block boundary in-kernel (a GPU pass); compile for the CPU target".into(),
                        ))
                    }
                };
                let [b, h, t, d] = rank4(ao.q)?;
                let ks = sh(ao.k)?;
                let hk = ks.get(1).copied().unwrap_or(0);
                let group = attn
                    .kv_group
                    .eval(&|x| dims.get(x).copied())
                    .ok_or_else(|| invalid("kv_group's dim is not bound".into()))?;
                if hk == 0 || hk * group != h {
                    return Err(invalid(format!("k has {hk} heads: not {h} query heads / kv_group {group}")));
                }
                expect(ao.k, &[b, hk, t, d], "k")?;
                expect(ao.v, &[b, hk, t, d], "v")?;
                let mut c = None;
                if let Some(cv) = ao.decay {
                    expect(cv, &[b, h, t], "c")?;
                    c = Some(float_in(cv)?);
                }
                if let Some(lv) = ao.decay_lo {
                    expect(lv, &[b, h, t], "c_lo")?;
                    if dt(lv) != DType::F32 {
                        return Err(invalid(format!("c_lo operand %{} must be f32", num[&lv])));
                    }
                }
                if let Some(s) = ao.start {
                    if dt(s) != DType::I32 {
                        return Err(invalid(format!("start operand %{} must be i32", num[&s])));
                    }
                    expect(s, &[b, h, t.div_ceil(tiles.bm.max(1) as u64)], "start")?;
                }
                if tiles.bm == 0 || tiles.bn == 0 {
                    return Err(invalid("zero tile size".into()));
                }
                if !emit::is_cpu_float(attn.out_dtype) {
                    return Err(invalid(format!(
                        "the CPU attention writes f32, bf16 or f16, not {}",
                        attn.out_dtype
                    )));
                }
                if t == 0 || d == 0 {
                    return Err(invalid("T and D must be at least 1".into()));
                }
                let dim = |x: &Dim| x.eval(&|s| dims.get(s).copied());
                let score = if attn.score.is_identity() {
                    None
                } else {
                    Some(region::RegionCode::new(&attn.score, &dim).map_err(invalid)?)
                };
                let (causal, window, mask) = match &attn.mask {
                    foxc_ir::Mask::None => (false, None, None),
                    foxc_ir::Mask::Causal => (true, None, None),
                    foxc_ir::Mask::Window(w) => (true, Some(*w), None),
                    foxc_ir::Mask::Expr(r) => {
                        (false, None, Some(region::RegionCode::new(r, &dim).map_err(invalid)?))
                    }
                };
                let mut captures = vec![];
                for &cv in &ao.captures {
                    let cd = dt(cv);
                    if !(emit::is_cpu_float(cd) || cd == DType::I32) {
                        return Err(invalid(format!(
                            "captured tensor %{} has dtype {cd}; the CPU kernel reads f32, bf16, f16 or i32",
                            num[&cv]
                        )));
                    }
                    captures.push(region::CaptureCode { dtype: cd, shape: sh(cv)? });
                }
                let scale = attn
                    .scale
                    .value(&|x| dims.get(x).copied())
                    .ok_or_else(|| invalid("the scale's dim is not bound".into()))?;
                let kernel = AttnKernel {
                    q: float_in(ao.q)?,
                    k: float_in(ao.k)?,
                    v: float_in(ao.v)?,
                    c,
                    c_lo: ao.decay_lo.is_some(),
                    pruned,
                    bh: b * h,
                    h,
                    hk,
                    t,
                    d,
                    bm: tiles.bm as u64,
                    bn: tiles.bn as u64,
                    scale,
                    causal,
                    window,
                    score,
                    mask,
                    captures,
                    out: attn.out_dtype,
                    lse: !backward && used.contains(&Value { node: n, result: 1 }),
                };
                if backward {
                    let bwd = backward::plan(g, n, attn, kernel, &dim, &invalid)?;
                    SpecKind::Fused(Kind::AttentionBackward(Box::new(bwd)))
                } else {
                    SpecKind::Fused(Kind::Attention(kernel))
                }
            }
            _ => generic(&consts)?,
        };
        let operands = match &kind {
            SpecKind::Generic(p) => p.operands.clone(),
            SpecKind::Fused(_) => g.operand_values(n),
        };
        let results = match &kind {
            SpecKind::Fused(k) => k.results(),
            SpecKind::Generic(_) => vec![0],
        };
        specs.push(Spec { node: n, operands, results, name: format!("k{v}_{}", op.mnemonic()), kind });
    }
    Ok(specs)
}

extern "C" fn foxc_log1p_exp_neg_abs(z: f64) -> f64 {
    (-z.abs()).exp().ln_1p()
}

extern "C" fn foxc_ln(z: f64) -> f64 {
    z.ln()
}

const LOG1P_SYM: &str = "foxc_log1p_exp_neg_abs";
const LN_SYM: &str = "foxc_ln";

/// Each spec's function and, when it has one, its finishing function.
type Built = Vec<(FuncId, Option<FuncId>)>;

fn build(specs: &[Spec], opts: CpuOptions) -> Result<(JITModule, Built, String), CpuError> {
    let cl = |e: &dyn std::fmt::Display| CpuError::Cranelift(e.to_string());
    let mut flags = settings::builder();
    for (k, v) in [("opt_level", "none"), ("is_pic", "false"), ("use_colocated_libcalls", "false")] {
        flags.set(k, v).map_err(|e| cl(&e))?;
    }
    let isa = cranelift_native::builder()
        .map_err(|e| CpuError::Cranelift(format!("host ISA: {e}")))?
        .finish(settings::Flags::new(flags))
        .map_err(|e| cl(&e))?;
    let mut jb = JITBuilder::with_isa(isa, default_libcall_names());
    jb.symbol(LOG1P_SYM, foxc_log1p_exp_neg_abs as *const u8);
    jb.symbol(LN_SYM, foxc_ln as *const u8);
    for h in generic::math::Helper::ALL {
        jb.symbol(h.symbol(), h.address());
    }
    let mut module = JITModule::new(jb);
    let ptr = types::I64;
    let mut helper_sig = module.make_signature();
    helper_sig.params.push(AbiParam::new(types::F64));
    helper_sig.returns.push(AbiParam::new(types::F64));
    let helper = module.declare_function(LOG1P_SYM, Linkage::Import, &helper_sig).map_err(|e| cl(&e))?;
    let generic_helpers = generic_helper_imports(&mut module)?;
    let ln_helper = module.declare_function(LN_SYM, Linkage::Import, &helper_sig).map_err(|e| cl(&e))?;

    let mut ctx = module.make_context();
    let mut fbc = FunctionBuilderContext::new();
    let mut ids: Built = vec![];
    let mut text = String::new();
    let parts = specs.iter().flat_map(|s| {
        let fin = matches!(&s.kind, SpecKind::Fused(k) if k.has_finish());
        std::iter::once((s, false)).chain(fin.then_some((s, true)))
    });
    for (s, finish) in parts {
        let mut sig = module.make_signature();
        for _ in 0..4 {
            sig.params.push(AbiParam::new(ptr));
        }
        let name = if finish { format!("{}_finish", s.name) } else { s.name.clone() };
        let id = module.declare_function(&name, Linkage::Local, &sig).map_err(|e| cl(&e))?;
        ctx.func.signature = sig;
        ctx.func.name = UserFuncName::testcase(&name);
        let log1p = match &s.kind {
            SpecKind::Fused(Kind::GateCumsum { kind: foxc_ir::GateKind::Logits, .. }) => {
                Some(module.declare_func_in_func(helper, &mut ctx.func))
            }
            _ => None,
        };
        let ln = match &s.kind {
            SpecKind::Fused(Kind::Attention(a)) if a.lse && !finish => {
                Some(module.declare_func_in_func(ln_helper, &mut ctx.func))
            }
            _ => None,
        };
        // A generic kernel declares only the helpers it calls (the CLIF text stays short).
        let mut gh = [None; 4];
        if let SpecKind::Generic(p) = &s.kind {
            for (i, used) in p.kernel.helpers().into_iter().enumerate() {
                if used {
                    gh[i] = Some(module.declare_func_in_func(generic_helpers[i], &mut ctx.func));
                }
            }
        }
        let tcfg = module.target_config();
        {
            let b = cranelift_frontend::FunctionBuilder::new(&mut ctx.func, &mut fbc);
            let mut fx = emit::Fx { b, fma: opts.fma };
            let entry = fx.b.create_block();
            fx.b.append_block_params_for_function_params(entry);
            fx.b.switch_to_block(entry);
            let p = fx.b.block_params(entry).to_vec();
            match &s.kind {
                SpecKind::Fused(kind) => {
                    let frame = kernels::Frame { args: p[0], begin: p[1], end: p[2], scratch: p[3] };
                    let helpers = kernels::Helpers { log1p_exp_neg_abs: log1p, ln };
                    if finish {
                        kernels::emit_finish(&mut fx, kind, &frame);
                    } else {
                        kernels::emit(&mut fx, kind, &frame, &helpers);
                    }
                }
                SpecKind::Generic(g) => generic::emit(&mut fx, &g.kernel, p[0], p[1], p[2], &gh),
            }
            use cranelift_codegen::ir::InstBuilder;
            fx.b.ins().return_(&[]);
            fx.b.seal_all_blocks();
            fx.b.finalize(tcfg);
        }
        text.push_str(&format!("; {name}\n{}\n", ctx.func.display()));
        module.define_function(id, &mut ctx).map_err(|e| CpuError::Cranelift(format!("{name}: {e:?}")))?;
        // FOXC_CPU_DISASM=1 writes each kernel's machine code to the temp dir (for objdump).
        if std::env::var_os("FOXC_CPU_DISASM").is_some() {
            if let Some(c) = ctx.compiled_code() {
                let path = std::env::temp_dir().join(format!("foxc_{name}.bin"));
                let _ = std::fs::write(&path, c.code_buffer());
                eprintln!("; {name} machine code: {} bytes in {}", c.code_buffer().len(), path.display());
            }
        }
        module.clear_context(&mut ctx);
        if finish {
            if let Some(last) = ids.last_mut() {
                last.1 = Some(id);
            }
        } else {
            ids.push((id, None));
        }
    }
    Ok((module, ids, text))
}

/// Declare the generic kernels' helpers ([`generic::math::Helper::ALL`] order) as imports.
fn generic_helper_imports(module: &mut JITModule) -> Result<Vec<FuncId>, CpuError> {
    use generic::math::Helper;
    let mut ids = vec![];
    for h in Helper::ALL {
        let mut sig = module.make_signature();
        let (params, ret): (&[types::Type], types::Type) = match h {
            Helper::Unary | Helper::Cast => (&[types::I64, types::F64], types::F64),
            Helper::F16ToF64 => (&[types::I32], types::F64),
            Helper::F64ToF16 => (&[types::F64], types::I32),
        };
        sig.params.extend(params.iter().map(|&t| AbiParam::new(t)));
        sig.returns.push(AbiParam::new(ret));
        ids.push(
            module
                .declare_function(h.symbol(), Linkage::Import, &sig)
                .map_err(|e| CpuError::Cranelift(e.to_string()))?,
        );
    }
    Ok(ids)
}
