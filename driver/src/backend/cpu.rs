//! CPU backend glue: compile an optimized graph with Cranelift (`foxc_codegen::cpu`) and run it
//! with the runtime's CPU executor (`foxc_runtime::cpu`), which receives the kernels as raw
//! entry points (the runtime never links a compiler).

use crate::timing::Summary;
use crate::Error;
use foxc_codegen::cpu::{self as cg, CpuError, CpuProgram};
use foxc_ir::{Graph, Value};
use foxc_runtime::cpu::{self as rt, BufferDesc, BufferRole, CpuPlan, ExecError, Launch};
use foxc_runtime::{HostTensor, TensorMap};
use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

/// The result of one CPU run.
#[derive(Clone, Debug)]
pub struct CpuRun {
    pub out: HostTensor,
    pub compile_ms: f64,
    pub run_ms: f64,
}

fn cg_err(e: CpuError) -> Error {
    match e {
        CpuError::Invalid(_) => Error::user(format!("error: {e}")),
        CpuError::Cranelift(_) => Error::internal(format!("internal error: {e}")),
    }
}

fn rt_err(e: ExecError) -> Error {
    match e {
        ExecError::Input(m) => Error::user(format!("error: {m}")),
        ExecError::Internal(m) => Error::internal(format!("internal error: {m}")),
    }
}

/// Validate the inputs (names, dtypes, shapes, NaN) and bind the graph's dims.
fn bind(g: &Graph, inputs: &TensorMap) -> Result<BTreeMap<String, u64>, Error> {
    let dims = crate::validate::check_inputs(g, inputs).map_err(|e| Error::user(format!("error: {e}")))?;
    Ok(dims.0)
}

/// The runtime's plan of `p` (compiled from `g` for `p.dims`) and the buffers of `outputs`: a
/// buffer per parameter (in the graph's order) and per result a launch writes, each with its
/// dtype and concrete shape, so that the executor reads no IR. A launch's rank-0 operand that no
/// parameter or earlier launch provides was folded into its kernel (no buffer).
fn plan(g: &Graph, p: &CpuProgram, outputs: &[Value]) -> Result<(CpuPlan, Vec<usize>), Error> {
    let shape = |ty: &foxc_ir::ValueType| -> Result<Vec<usize>, Error> {
        ty.dims()
            .map(|d| {
                d.eval(&|s| p.dims.get(s).copied()).map(|x| x as usize).ok_or_else(|| {
                    rt_err(ExecError::Input(format!("dimension `{d}` is not bound to a size")))
                })
            })
            .collect()
    };
    let mut plan = CpuPlan::default();
    let mut at: HashMap<Value, usize> = HashMap::new();
    for prm in &g.params {
        let role = BufferRole::Input { name: prm.name.clone(), declared: prm.ty.to_string() };
        at.insert(Value::of(prm.node), plan.buffers.len());
        plan.buffers.push(BufferDesc { dtype: prm.ty.dtype, shape: shape(&prm.ty)?, role });
    }
    let label = |n: foxc_ir::ValueId| format!("{} ({})", n.index(), g.op(n).mnemonic());
    for k in &p.kernels {
        let mut operands = vec![];
        for o in &k.operands {
            operands.push(match at.get(o) {
                Some(&b) => Some(b),
                None if o.result == 0 && g.ty(o.node).rank() == 0 => None,
                None => {
                    return Err(rt_err(ExecError::Internal(format!(
                        "operand {}#{} of {} is not computed before use",
                        o.node.index(),
                        o.result,
                        g.op(k.node).mnemonic()
                    ))))
                }
            });
        }
        let mut results = vec![];
        for &r in &k.results {
            let ty = g.result_ty(k.node, r).ok_or_else(|| {
                rt_err(ExecError::Internal(format!("node {} has no result {r}", k.node.index())))
            })?;
            at.insert(Value { node: k.node, result: r }, plan.buffers.len());
            results.push(plan.buffers.len());
            plan.buffers.push(BufferDesc { dtype: ty.dtype, shape: shape(ty)?, role: BufferRole::Computed });
        }
        plan.launches.push(Launch {
            label: label(k.node),
            operands,
            results,
            entry: k.entry,
            tasks: k.tasks.count,
            chunk: k.tasks.chunk,
            scratch_bytes: k.scratch_bytes,
            temp_bytes: k.temp_bytes,
            finish: k.finish,
        });
    }
    let outs = outputs
        .iter()
        .map(|o| {
            at.get(o).copied().ok_or_else(|| {
                rt_err(ExecError::Internal(format!(
                    "output {}#{} is not computed by a kernel",
                    o.node.index(),
                    o.result
                )))
            })
        })
        .collect::<Result<_, _>>()?;
    Ok((plan, outs))
}

/// A compiled program with its runtime plan: what one compilation runs any number of times.
struct Compiled {
    /// Never read: it owns the JIT memory the plan's entry points lie in (freed on drop).
    _program: CpuProgram,
    plan: CpuPlan,
    outputs: Vec<usize>,
}

impl Compiled {
    /// Run the plan on `inputs` (read as the graph reads them): the buffers of its outputs.
    fn run(&self, g: &Graph, inputs: &TensorMap, opts: rt::ExecOptions) -> Result<Vec<HostTensor>, Error> {
        let inputs = crate::validate::as_read(g, inputs);
        // SAFETY: the plan's entries come from `self._program`, compiled for these buffers, alive
        // while `self` is borrowed.
        unsafe { rt::execute(&self.plan, &inputs, &self.outputs, opts) }.map_err(rt_err)
    }
}

fn compile(g: &Graph, dims: &BTreeMap<String, u64>) -> Result<(Compiled, f64), Error> {
    let out = g.output.ok_or_else(|| Error::internal("internal error: graph has no output"))?;
    compile_outputs(g, dims, &[Value::of(out)], &[])
}

/// Compile the kernels of `outputs` (`kernels_for`: the values the kernels are chosen for, empty
/// for the graph's output) and plan their run.
fn compile_outputs(
    g: &Graph,
    dims: &BTreeMap<String, u64>,
    outputs: &[Value],
    kernels_for: &[Value],
) -> Result<(Compiled, f64), Error> {
    let t0 = Instant::now();
    let cg_graph = contracted(g, kernels_for);
    let program =
        cg::compile_outputs(&cg_graph, dims, kernels_for, cg::CpuOptions::default()).map_err(cg_err)?;
    let (plan, outputs) = plan(g, &program, outputs)?;
    Ok((Compiled { _program: program, plan, outputs }, t0.elapsed().as_secs_f64() * 1e3))
}

/// `g` with the `contract` and `fuse-loops` passes' decisions for exactly the values
/// `outputs` (empty: the output): which sums read their products through, which values their
/// users compute. The pipeline made them for the output of a forward graph; a gradient program
/// is built after the pipeline, and a run may read back more than the output. Only attributes
/// change: the node ids the kernels name are `g`'s.
fn contracted(g: &Graph, outputs: &[Value]) -> Graph {
    let mut g = g.clone();
    foxc_passes::contract::mark(&mut g, outputs);
    foxc_passes::fuse_loops::mark(&mut g, outputs);
    g
}

/// The named results of one CPU run.
#[derive(Clone, Debug)]
pub struct CpuRuns {
    pub outputs: TensorMap,
    pub compile_ms: f64,
    pub run_ms: f64,
}

/// Compile the kernels that the named `outputs` need (and only those) for the shapes of
/// `inputs`, run them, and return every output by name.
pub fn run_outputs(
    g: &Graph,
    outputs: &[(String, Value)],
    inputs: &TensorMap,
    opts: rt::ExecOptions,
) -> Result<TensorMap, Error> {
    Ok(run_outputs_timed(g, outputs, inputs, opts)?.outputs)
}

/// [`run_outputs`] with the compile and run times.
pub fn run_outputs_timed(
    g: &Graph,
    outputs: &[(String, Value)],
    inputs: &TensorMap,
    opts: rt::ExecOptions,
) -> Result<CpuRuns, Error> {
    let dims = bind(g, inputs)?;
    let vals: Vec<Value> = outputs.iter().map(|(_, v)| *v).collect();
    let (c, compile_ms) = compile_outputs(g, &dims, &vals, &vals)?;
    let t0 = Instant::now();
    let ts = c.run(g, inputs, opts)?;
    let outputs = outputs.iter().map(|(n, _)| n.clone()).zip(ts).collect();
    Ok(CpuRuns { outputs, compile_ms, run_ms: t0.elapsed().as_secs_f64() * 1e3 })
}

/// [`run_outputs`] timed: compile once, run once to warm up, then time `iters` runs of the
/// whole program (every output).
pub fn bench_outputs(
    g: &Graph,
    outputs: &[(String, Value)],
    inputs: &TensorMap,
    iters: usize,
) -> Result<Summary, Error> {
    let dims = bind(g, inputs)?;
    let vals: Vec<Value> = outputs.iter().map(|(_, v)| *v).collect();
    let (c, _) = compile_outputs(g, &dims, &vals, &vals)?;
    let opts = rt::ExecOptions { threads: rt::default_threads(), poison: false };
    time_runs(iters, || c.run(g, inputs, opts).map(drop))
}

/// Run once to warm up, then time `iters` runs.
fn time_runs(iters: usize, mut run: impl FnMut() -> Result<(), Error>) -> Result<Summary, Error> {
    run()?;
    let mut ts = vec![];
    for _ in 0..iters.max(1) {
        let t0 = Instant::now();
        run()?;
        ts.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    Ok(crate::timing::summarize(&mut ts))
}

/// Compile `g` (an optimized graph) for the shapes of `inputs` and run it on all cores.
pub fn run(g: &Graph, inputs: &TensorMap) -> Result<CpuRun, Error> {
    run_with(g, inputs, rt::ExecOptions { threads: rt::default_threads(), poison: false })
}

/// [`run`] with executor options (tests poison every buffer with NaN before its kernel runs).
pub fn run_with(g: &Graph, inputs: &TensorMap, opts: rt::ExecOptions) -> Result<CpuRun, Error> {
    let dims = bind(g, inputs)?;
    let (c, compile_ms) = compile(g, &dims)?;
    let t0 = Instant::now();
    let out = c.run(g, inputs, opts)?.pop().ok_or_else(|| Error::internal("internal error: no output"))?;
    Ok(CpuRun { out, compile_ms, run_ms: t0.elapsed().as_secs_f64() * 1e3 })
}

/// The block starts (`[B, H, Mt]`, as f64) that the CPU kernels compute for the attention of `g`
/// on `inputs`, or `None` when it is not pruned: the program's own threshold and boundary
/// kernels, compiled and run up to the boundary node (deterministic: any task split gives the
/// same bits, so these are the starts the full run used).
pub fn block_starts(g: &Graph, inputs: &TensorMap) -> Result<Option<foxc_ir::interp::Tensor>, Error> {
    let Some(n) = crate::acp_stats::attention_node(g) else { return Ok(None) };
    let foxc_ir::Op::Attention(a) = g.op(n) else { return Ok(None) };
    let ops = foxc_ir::Attention::operands(g, n).map_err(Error::internal)?;
    let Some(start) = ops.start.filter(|_| a.prune == foxc_ir::Prune::Start) else { return Ok(None) };
    let mut sub = g.clone();
    sub.output = Some(start);
    sub.remove_dead();
    let r = run(&sub, inputs)?;
    Ok(Some(foxc_ir::interp::Tensor { shape: r.out.shape.clone(), data: r.out.to_f64_vec() }))
}

/// The Cranelift IR of every kernel of `g`. Kernels are specialized to concrete dims; dims not
/// given default to 128 (the text does not depend on them beyond constants).
pub fn emit_clif(g: &Graph, dims: &BTreeMap<String, u64>) -> Result<String, Error> {
    emit_clif_outputs(g, dims, &[])
}

/// [`emit_clif`] for the kernels that `outputs` need (a gradient program's named outputs).
pub fn emit_clif_outputs(
    g: &Graph,
    dims: &BTreeMap<String, u64>,
    outputs: &[Value],
) -> Result<String, Error> {
    let mut d = dims.clone();
    let mut defaulted = vec![];
    for name in &g.dims {
        if !d.contains_key(name) {
            d.insert(name.clone(), 128);
            defaulted.push(name.clone());
        }
    }
    let text = cg::clif_text_outputs(&contracted(g, outputs), &d, outputs, cg::CpuOptions::default())
        .map_err(cg_err)?;
    let shown: Vec<String> = d.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let mut head = format!("; foxc CPU kernels for @{} specialized to {}", g.name, shown.join(","));
    if !defaulted.is_empty() {
        head.push_str(&format!(" ({} not given: defaulted)", defaulted.join(",")));
    }
    Ok(format!("{head}\n{text}"))
}

/// Compile once, run once to warm up, then time `iters` runs.
pub fn bench(g: &Graph, inputs: &TensorMap, iters: usize) -> Result<Summary, Error> {
    let dims = bind(g, inputs)?;
    let (c, _) = compile(g, &dims)?;
    let opts = rt::ExecOptions { threads: rt::default_threads(), poison: false };
    time_runs(iters, || c.run(g, inputs, opts).map(drop))
}
