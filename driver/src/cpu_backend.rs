//! CPU backend glue: compile an optimized graph with Cranelift (`foxc_codegen::cpu`) and run it
//! with the runtime's CPU executor (`foxc_runtime::cpu`), which receives the kernels as raw
//! entry points (the runtime never links a compiler).

use crate::Error;
use foxc_codegen::cpu::{self as cg, CpuError, CpuProgram};
use foxc_ir::{Graph, Value};
use foxc_runtime::cpu::{self as rt, ExecError, Launch};
use foxc_runtime::{HostTensor, TensorMap};
use std::collections::BTreeMap;
use std::time::Instant;

/// The result of one CPU run.
#[derive(Clone, Debug)]
pub struct CpuRun {
    pub out: HostTensor,
    pub compile_ms: f64,
    pub run_ms: f64,
}

/// Timing of repeated runs of one compiled program (compilation excluded).
#[derive(Clone, Debug)]
pub struct BenchStats {
    pub median_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
    pub iters: usize,
    pub compile_ms: f64,
    pub threads: usize,
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

fn launches(p: &CpuProgram) -> Vec<Launch> {
    p.kernels
        .iter()
        .map(|k| Launch {
            node: k.node,
            operands: k.operands.clone(),
            results: k.results.clone(),
            entry: k.entry,
            tasks: k.tasks.count,
            chunk: k.tasks.chunk,
            scratch_bytes: k.scratch_bytes,
            temp_bytes: k.temp_bytes,
            finish: k.finish,
        })
        .collect()
}

fn compile(g: &Graph, dims: &BTreeMap<String, u64>) -> Result<(CpuProgram, f64), Error> {
    compile_outputs(g, dims, &[])
}

fn compile_outputs(
    g: &Graph,
    dims: &BTreeMap<String, u64>,
    outputs: &[Value],
) -> Result<(CpuProgram, f64), Error> {
    let t0 = Instant::now();
    let g = contracted(g, outputs);
    let p = cg::compile_outputs(&g, dims, outputs, cg::CpuOptions::default()).map_err(cg_err)?;
    Ok((p, t0.elapsed().as_secs_f64() * 1e3))
}

/// `g` with the `contract` pass's decision for exactly the values `outputs` (empty: the
/// output): which sums read their products through. The pipeline made it for the output of a
/// forward graph; a gradient program is built after the pipeline, and a run may read back
/// more than the output. Only attributes change: the node ids the kernels name are `g`'s.
fn contracted(g: &Graph, outputs: &[Value]) -> Graph {
    let mut g = g.clone();
    foxc_passes::contract::mark(&mut g, outputs);
    g
}

fn execute_outputs(
    g: &Graph,
    p: &CpuProgram,
    inputs: &TensorMap,
    outputs: &[(String, Value)],
    opts: rt::ExecOptions,
) -> Result<TensorMap, Error> {
    let ls = launches(p);
    let vals: Vec<Value> = outputs.iter().map(|(_, v)| *v).collect();
    let inputs = crate::validate::as_read(g, inputs);
    // SAFETY: the launches come from `p`, compiled for this graph and these dims, alive here.
    let ts = unsafe { rt::execute_outputs(g, &p.dims, &ls, &inputs, &vals, opts) }.map_err(rt_err)?;
    Ok(outputs.iter().map(|(n, _)| n.clone()).zip(ts).collect())
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
    let (p, compile_ms) = compile_outputs(g, &dims, &vals)?;
    let t0 = Instant::now();
    let outputs = execute_outputs(g, &p, inputs, outputs, opts)?;
    Ok(CpuRuns { outputs, compile_ms, run_ms: t0.elapsed().as_secs_f64() * 1e3 })
}

/// [`run_outputs`] timed: compile once, run once to warm up, then time `iters` runs of the
/// whole program (every output).
pub fn bench_outputs(
    g: &Graph,
    outputs: &[(String, Value)],
    inputs: &TensorMap,
    iters: usize,
) -> Result<BenchStats, Error> {
    let dims = bind(g, inputs)?;
    let vals: Vec<Value> = outputs.iter().map(|(_, v)| *v).collect();
    let (p, compile_ms) = compile_outputs(g, &dims, &vals)?;
    let opts = rt::ExecOptions { threads: rt::default_threads(), poison: false };
    time_runs(iters, compile_ms, || execute_outputs(g, &p, inputs, outputs, opts).map(drop))
}

/// Run once to warm up, then time `iters` runs.
fn time_runs(
    iters: usize,
    compile_ms: f64,
    mut run: impl FnMut() -> Result<(), Error>,
) -> Result<BenchStats, Error> {
    run()?;
    let mut ts = vec![];
    for _ in 0..iters.max(1) {
        let t0 = Instant::now();
        run()?;
        ts.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    let s = crate::timing::summarize(&mut ts);
    Ok(BenchStats {
        median_ms: s.median_ms,
        min_ms: s.min_ms,
        max_ms: s.max_ms,
        iters: ts.len(),
        compile_ms,
        threads: rt::default_threads(),
    })
}

fn execute(g: &Graph, p: &CpuProgram, inputs: &TensorMap) -> Result<HostTensor, Error> {
    execute_with(g, p, inputs, rt::ExecOptions { threads: rt::default_threads(), poison: false })
}

fn execute_with(
    g: &Graph,
    p: &CpuProgram,
    inputs: &TensorMap,
    opts: rt::ExecOptions,
) -> Result<HostTensor, Error> {
    let ls = launches(p);
    let inputs = crate::validate::as_read(g, inputs);
    // SAFETY: the launches come from `p`, compiled for this graph and these dims, alive here.
    unsafe { rt::execute_with(g, &p.dims, &ls, &inputs, opts) }.map_err(rt_err)
}

/// Compile `g` (an optimized graph) for the shapes of `inputs` and run it on all cores.
pub fn run(g: &Graph, inputs: &TensorMap) -> Result<CpuRun, Error> {
    run_with(g, inputs, rt::ExecOptions { threads: rt::default_threads(), poison: false })
}

/// [`run`] with executor options (tests poison every buffer with NaN before its kernel runs).
pub fn run_with(g: &Graph, inputs: &TensorMap, opts: rt::ExecOptions) -> Result<CpuRun, Error> {
    let dims = bind(g, inputs)?;
    let (p, compile_ms) = compile(g, &dims)?;
    let t0 = Instant::now();
    let out = execute_with(g, &p, inputs, opts)?;
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
pub fn bench(g: &Graph, inputs: &TensorMap, iters: usize) -> Result<BenchStats, Error> {
    let dims = bind(g, inputs)?;
    let (p, compile_ms) = compile(g, &dims)?;
    time_runs(iters, compile_ms, || execute(g, &p, inputs).map(drop))
}
