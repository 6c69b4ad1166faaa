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
mod attention;
mod backward;
mod emit;
pub mod generic;
mod kernels;
mod load_map;
mod plan;
mod region;
mod region_math;
mod threshold;

use cranelift_codegen::ir::{types, AbiParam, UserFuncName};
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::FunctionBuilderContext;
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{default_libcall_names, FuncId, Linkage, Module};
use foxc_ir::{Dim, Graph, Value, ValueId};
use kernels::Kind;
use std::collections::{BTreeMap, HashMap};

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
    /// a `sum {contract}` reads its `mul`'s operands, see [`generic`]).
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
    let specs = plan::plan(g, dims, outputs)?;
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
    let specs = plan::plan(g, dims, outputs)?;
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
