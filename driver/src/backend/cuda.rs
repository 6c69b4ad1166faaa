//! CUDA backend glue: compile an optimized graph with the NVPTX backend (`foxc_codegen::nvptx`),
//! turn its launch plan into the runtime's concrete launches once the input shapes bind the
//! dimensions, and run it with the CUDA runtime (`foxc_runtime::cuda`), which never links LLVM.

use crate::timing::Summary;
use crate::{target, Error, Target};
use foxc_codegen::nvptx::{self as cg, CodegenError, KernelArg, NvptxArtifact, NvptxSpec, NvptxTarget};
use foxc_ir::shapes::DimBindings;
use foxc_ir::{Graph, Value};
use foxc_runtime::cuda::{
    ArgDesc, BufferDesc, BufferInit, CudaError, CudaErrorKind, CudaRuntime, DeviceInfo, ExternalModule,
    LaunchDesc, Program,
};
use foxc_runtime::tensor_map::{TensorMapArg, TmaSwizzle};
use foxc_runtime::{HostTensor, TensorMap};
use std::collections::BTreeMap;

/// What `emit` returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Emit {
    Llvm,
    Ptx,
}

/// The result of one GPU run.
#[derive(Clone, Debug)]
pub struct CudaRun {
    pub out: HostTensor,
    /// Time of all launches of the forward pass, CUDA events (module load and copies excluded).
    pub kernel_ms: f64,
    /// The GPU's name.
    pub device: String,
}

/// How [`run_outputs`] treats the results.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunOptions {
    /// Accept NaN in the outputs. Off by default: every buffer is poisoned with NaN before the
    /// run and the inputs hold none, so a NaN is an element no kernel wrote (or a fault). Only a
    /// program that can make NaN from finite inputs (a `gather` out of range) turns it on.
    pub allow_nan: bool,
}

fn codegen_err(e: CodegenError) -> Error {
    match e {
        CodegenError::User(_) | CodegenError::Unsupported { .. } | CodegenError::NotYet { .. } => {
            Error::user(format!("error: {e}"))
        }
        CodegenError::Internal(_) => Error::internal(format!("internal error: {e}")),
    }
}

fn cuda_err(e: CudaError) -> Error {
    match e.kind {
        CudaErrorKind::NoDriver | CudaErrorKind::NoDevice => Error::user(format!("error: {e}")),
        CudaErrorKind::Invalid | CudaErrorKind::Driver => Error::internal(format!("internal error: {e}")),
    }
}

/// The NVPTX architecture of `t`; the CPU is not one (a user error).
fn nvptx_target(t: Target) -> Result<NvptxTarget, Error> {
    target::nvptx(t).ok_or_else(|| {
        Error::user(format!("error: unknown GPU target `{}` (expected sm_90a or sm_80)", target::name(t)))
    })
}

/// Compiles `g` for the GPU `target` with the compile-time `dims` (at least `D`).
pub fn compile(g: &Graph, dims: &BTreeMap<String, u64>, target: Target) -> Result<NvptxArtifact, Error> {
    compile_outputs(g, &[], dims, target)
}

/// [`compile`] for the values `outputs` (empty: the graph's output).
pub fn compile_outputs(
    g: &Graph,
    outputs: &[Value],
    dims: &BTreeMap<String, u64>,
    target: Target,
) -> Result<NvptxArtifact, Error> {
    compile_spec(g, outputs, dims, target, false, None)
}

/// [`compile_outputs`], optionally with the debug buffer of in-kernel block starts, for a
/// device with `sms` multiprocessors when known (sizes persistent grids, `NvptxSpec::sms`).
fn compile_spec(
    g: &Graph,
    outputs: &[Value],
    dims: &BTreeMap<String, u64>,
    target: Target,
    debug_starts: bool,
    sms: Option<u32>,
) -> Result<NvptxArtifact, Error> {
    let spec = NvptxSpec {
        target: nvptx_target(target)?,
        dims: dims.clone(),
        outputs: outputs.to_vec(),
        debug_starts,
        sms,
    };
    // The `fuse-loops` decision for exactly these outputs (as the CPU glue's `contracted`):
    // a gradient program is built after the pipeline, and a run may read back more than the
    // output. Only attributes change: the node ids the kernels name are `g`'s.
    let mut g = g.clone();
    foxc_passes::fuse_loops::mark(&mut g, outputs);
    cg::compile(&g, &spec).map_err(codegen_err)
}

/// The LLVM IR or PTX of the program computing `outputs` (empty: the graph's output).
pub fn emit(
    g: &Graph,
    outputs: &[Value],
    dims: &BTreeMap<String, u64>,
    target: Target,
    what: Emit,
) -> Result<String, Error> {
    let a = compile_outputs(g, outputs, dims, target)?;
    Ok(match what {
        Emit::Llvm => a.llvm_ir,
        Emit::Ptx => a.ptx,
    })
}

/// The runtime program for the artifact with the dimensions bound.
pub fn program(a: &NvptxArtifact, bind: &DimBindings) -> Result<Program, Error> {
    let (buffers, launches) = plan(a, bind)?;
    Ok(Program { ptx: a.ptx.clone(), buffers, launches, outputs: a.outputs.clone() })
}

/// The artifact's buffers and launches with the dimensions bound (no PTX copy).
pub fn plan(a: &NvptxArtifact, bind: &DimBindings) -> Result<(Vec<BufferDesc>, Vec<LaunchDesc>), Error> {
    let lookup = |s: &str| bind.get(s);
    let too_big =
        |what: &str| Error::user(format!("error: {what} does not fit the GPU kernels' 32-bit indices"));
    let mut buffers = Vec::with_capacity(a.buffers.len());
    for (i, b) in a.buffers.iter().enumerate() {
        let bytes = b.bytes(&lookup).map_err(codegen_err)?;
        let bytes = usize::try_from(bytes).map_err(|_| too_big("a tensor"))?;
        let (init, label) = match &b.kind {
            cg::BufferKind::Param { index, name } => (BufferInit::Input(*index), format!("input `{name}`")),
            cg::BufferKind::Value(v) => {
                (BufferInit::Poison, format!("value %{}#{}", v.node.index(), v.result))
            }
            cg::BufferKind::Scratch(s) => (BufferInit::Poison, format!("scratch {i}: {s}")),
            cg::BufferKind::Counters(s) => (BufferInit::Zero, format!("counters {i}: {s}")),
        };
        buffers.push(BufferDesc { bytes, init, label });
    }
    let mut launches = Vec::with_capacity(a.kernels.len());
    for k in &a.kernels {
        let geo = k.geometry(&lookup).map_err(codegen_err)?;
        let mut args = Vec::with_capacity(k.args.len());
        for arg in &k.args {
            args.push(match arg {
                KernelArg::Buffer(n) => ArgDesc::Buffer(*n),
                KernelArg::I32(d) => {
                    let v = cg::eval_product(d, &lookup).map_err(codegen_err)?;
                    ArgDesc::I32(i32::try_from(v).map_err(|_| too_big("a dimension"))?)
                }
                KernelArg::I64(d) => {
                    let v = cg::eval_product(d, &lookup).map_err(codegen_err)?;
                    ArgDesc::I64(i64::try_from(v).map_err(|_| too_big("a tensor"))?)
                }
                KernelArg::LnF32(d) => {
                    let v = cg::eval_product(d, &lookup).map_err(codegen_err)?;
                    ArgDesc::F32((v as f64).ln() as f32)
                }
                KernelArg::TensorMap(m) => ArgDesc::TensorMap(tensor_map(m, &lookup)?),
            });
        }
        launches.push(LaunchDesc {
            kernel: k.name.clone(),
            grid: geo.grid,
            block: geo.block,
            shared_bytes: geo.shared_bytes,
            args,
            zero_first: k.zero_first.clone(),
            deps: k.deps.clone(),
        });
    }
    Ok((buffers, launches))
}

/// The runtime's tensor map for the plan's `m` with the dimensions bound; a shape the copy
/// engine cannot describe is a user error (e.g. a dimension past 2^32 elements).
fn tensor_map(m: &cg::TmaMap, lookup: &dyn Fn(&str) -> Option<u64>) -> Result<TensorMapArg, Error> {
    let dims = m.dims.iter().map(|d| cg::eval_product(d, lookup)).collect::<Result<Vec<u64>, _>>();
    let swizzle = match m.swizzle_bytes {
        0 => TmaSwizzle::None,
        128 => TmaSwizzle::B128,
        s => return Err(Error::internal(format!("internal error: a tensor map with a {s}-byte swizzle"))),
    };
    let arg = TensorMapArg::contiguous(m.buffer, &dims.map_err(codegen_err)?, &m.box_dims, swizzle);
    arg.check().map_err(|e| Error::user(format!("error: {e}")))?;
    Ok(arg)
}

/// The kernels index with i32 within one (b, h) slice and i64 across: reject what overflows.
fn check_sizes(g: &Graph, bind: &DimBindings) -> Result<(), Error> {
    for p in &g.params {
        let n: u64 = p.ty.dims().map(|d| bind.eval(d).unwrap_or(0)).product();
        if n > (1u64 << 40) {
            return Err(Error::user(format!(
                "error: input `{}` has {n} elements, too many for the GPU",
                p.name
            )));
        }
    }
    Ok(())
}

/// The device's multiprocessor count, when the driver reported one.
fn sm_count(info: &DeviceInfo) -> Option<u32> {
    u32::try_from(info.multiprocessors).ok().filter(|n| *n > 0)
}

/// The NVPTX target of a device: sm_90a on compute capability 9.x, sm_80 on 8.x.
pub fn target_for(info: &DeviceInfo) -> Result<Target, Error> {
    match info.compute_capability {
        (9, _) => Ok(Target::Sm90a),
        (8, _) => Ok(Target::Sm80),
        (ma, mi) => Err(Error::user(format!(
            "error: the GPU {} has compute capability {ma}.{mi}; foxc's kernels need 8.x (sm_80) or 9.x (sm_90a)",
            info.name
        ))),
    }
}

/// The target of the GPU a run would use (device 0); [`target::DEFAULT_GPU`] when no device
/// answers or foxc has no kernels for it (the run itself then reports why it cannot start).
pub fn device_target() -> Target {
    device_info(0).and_then(|info| target_for(&info)).unwrap_or(target::DEFAULT_GPU)
}

/// Validated inputs, the program and its runtime, ready to upload.
struct Prepared {
    program: Program,
    /// Name, dtype and shape of each output, in the program's order.
    outs: Vec<(String, foxc_ir::DType, Vec<usize>)>,
    rt: CudaRuntime,
    inputs: Vec<Vec<u8>>,
}

/// `[(name, value)]` of the graph's single output (named `out`).
fn single_output(g: &Graph) -> Result<Vec<(String, Value)>, Error> {
    let out = g.output.ok_or_else(|| Error::user(format!("error: graph `{}` has no output", g.name)))?;
    Ok(vec![("out".to_string(), Value::of(out))])
}

fn prepare(g: &Graph, outputs: &[(String, Value)], inputs: &TensorMap) -> Result<Prepared, Error> {
    prepare_with(g, outputs, inputs, false)
}

/// [`prepare`]; with `debug_starts` the pruned attention kernel also writes its in-kernel block
/// starts, read back as the extra output `debug_starts` (i32 `[B, H, ceil(T / bm)]`).
fn prepare_with(
    g: &Graph,
    outputs: &[(String, Value)],
    inputs: &TensorMap,
    debug_starts: bool,
) -> Result<Prepared, Error> {
    // Shapes, dtypes and values are checked before anything touches the GPU.
    let bind = crate::validate::check_inputs(g, inputs).map_err(|e| Error::user(format!("error: {e}")))?;
    check_sizes(g, &bind)?;
    if outputs.is_empty() {
        return Err(Error::user("error: no outputs requested"));
    }
    let mut outs = Vec::with_capacity(outputs.len());
    for (name, v) in outputs {
        let ty = g.result_ty(v.node, v.result).ok_or_else(|| {
            Error::internal(format!(
                "internal error: output `{name}` names %{}#{}, which the graph lacks",
                v.node.index(),
                v.result
            ))
        })?;
        let shape =
            ty.dims().map(|d| bind.eval(d).map(|x| x as usize)).collect::<Option<Vec<usize>>>().ok_or_else(
                || Error::user(format!("error: the shape of output `{name}` has an unbound dimension")),
            )?;
        outs.push((name.clone(), ty.dtype, shape));
    }
    let rt = CudaRuntime::new().map_err(cuda_err)?;
    let info = rt.device_info().map_err(cuda_err)?;
    let target = target_for(&info)?;
    let values: Vec<Value> = outputs.iter().map(|(_, v)| *v).collect();
    let art = compile_spec(g, &values, &bind.0, target, debug_starts, sm_count(&info))?;
    let mut program = program(&art, &bind)?;
    if debug_starts {
        let buf = art
            .debug_starts
            .ok_or_else(|| Error::user("error: no pruned attention on the GPU: no in-kernel block starts"))?;
        let shape = art.buffers[buf]
            .shape
            .iter()
            .map(|d| bind.eval(d).map(|x| x as usize))
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| Error::internal("internal error: the debug starts buffer has an unbound dim"))?;
        outs.push(("debug_starts".to_string(), foxc_ir::DType::I32, shape));
        program.outputs.push(buf);
    }
    let inputs = crate::validate::as_read(g, inputs);
    let mut ins = Vec::with_capacity(g.params.len());
    for p in &g.params {
        ins.push(inputs[&p.name].data.clone());
    }
    Ok(Prepared { program, outs, rt, inputs: ins })
}

/// Runs a prepared program twice (the second time on poisoned buffers): the second run's
/// outputs by name and kernel time, and the device name.
fn run_prepared(p: Prepared, opts: RunOptions) -> Result<(TensorMap, f64, String), Error> {
    let device = p.rt.device_info().map_err(cuda_err)?.name;
    let mut s = p.rt.load(&p.program).map_err(cuda_err)?;
    let refs: Vec<&[u8]> = p.inputs.iter().map(|v| v.as_slice()).collect();
    s.upload(&refs).map_err(cuda_err)?;
    s.timed_run().map_err(cuda_err)?;
    // The outputs are the second run's, on buffers poisoned again: kernels that keep state for
    // the next launch (counters they must leave zero) fail here, not in someone's training.
    s.repoison().map_err(cuda_err)?;
    let kernel_ms = s.timed_run().map_err(cuda_err)?;
    let datas = s.download_outputs().map_err(cuda_err)?;
    let mut out = TensorMap::new();
    for ((name, dtype, shape), data) in p.outs.into_iter().zip(datas) {
        let t = HostTensor { dtype, shape, data };
        if !opts.allow_nan {
            let nan = t.to_f32_vec().iter().filter(|x| x.is_nan()).count();
            if nan > 0 {
                return Err(Error::internal(format!(
                    "internal error: {nan} of {} elements of output `{name}` are NaN after the GPU run (unwritten by the kernels, or a kernel fault)",
                    t.numel()
                )));
            }
        }
        out.insert(name, t);
    }
    Ok((out, kernel_ms, device))
}

/// Interface I1: compiles for the GPU present the values `outputs` (each under its name), runs
/// them twice (kernels that keep state must give the same result again) and returns them. Every
/// buffer is poisoned (NaN) before each run; a NaN left in an output is an error unless
/// `opts.allow_nan`.
pub fn run_outputs(
    g: &Graph,
    outputs: &[(String, Value)],
    inputs: &TensorMap,
    opts: RunOptions,
) -> Result<TensorMap, Error> {
    Ok(run_prepared(prepare(g, outputs, inputs)?, opts)?.0)
}

/// [`run_outputs`] with the kernel time (CUDA events); empty `outputs`: the graph's output as
/// `out`.
pub fn run_timed(
    g: &Graph,
    outputs: &[(String, Value)],
    inputs: &TensorMap,
    opts: RunOptions,
) -> Result<(TensorMap, f64), Error> {
    let single;
    let outputs = if outputs.is_empty() {
        single = single_output(g)?;
        &single[..]
    } else {
        outputs
    };
    let (m, kernel_ms, _) = run_prepared(prepare(g, outputs, inputs)?, opts)?;
    Ok((m, kernel_ms))
}

/// [`run_outputs`] plus the block starts the pruned attention kernel found in-kernel, as the
/// output `debug_starts` (i32 `[B, H, ceil(T / bm)]`): a debug build of the kernel
/// (`NvptxSpec::debug_starts`) that `foxc run --check-starts` compares with the reference's.
pub fn run_debug_starts(
    g: &Graph,
    outputs: &[(String, Value)],
    inputs: &TensorMap,
    opts: RunOptions,
) -> Result<TensorMap, Error> {
    Ok(run_prepared(prepare_with(g, outputs, inputs, true)?, opts)?.0)
}

/// Compiles for the GPU present, runs and returns the graph's output (see [`run_outputs`]).
pub fn run(g: &Graph, inputs: &TensorMap) -> Result<CudaRun, Error> {
    let outputs = single_output(g)?;
    let (mut m, kernel_ms, device) = run_prepared(prepare(g, &outputs, inputs)?, RunOptions::default())?;
    let out = m.remove("out").ok_or_else(|| Error::internal("internal error: the run lost its output"))?;
    Ok(CudaRun { out, kernel_ms, device })
}

/// The least wall time of untimed runs before [`bench_outputs`] times any.
const WARMUP: std::time::Duration = std::time::Duration::from_millis(200);

/// Interface I1: median and minimum time of `iters` runs of the program computing `outputs`
/// after at least `warmup` untimed ones lasting 200 ms together, each timed by CUDA events
/// around all of its launches.
pub fn bench_outputs(
    g: &Graph,
    outputs: &[(String, Value)],
    inputs: &TensorMap,
    _opts: RunOptions,
    warmup: usize,
    iters: usize,
) -> Result<Summary, Error> {
    if iters == 0 {
        return Err(Error::user("error: bench needs at least one iteration"));
    }
    let p = prepare(g, outputs, inputs)?;
    let mut s = p.rt.load(&p.program).map_err(cuda_err)?;
    let refs: Vec<&[u8]> = p.inputs.iter().map(|v| v.as_slice()).collect();
    s.upload(&refs).map_err(cuda_err)?;
    // Warm up by count and by time: the clocks of an idle GPU must ramp up before timing (ten
    // runs of a 3.7 ms program were not enough on the H200: the median of 50 sat 11% above the
    // minimum, while the peers' do_bench warms up for 50 ms and times 300 ms).
    let start = std::time::Instant::now();
    let mut runs = 0;
    while runs < warmup || start.elapsed() < WARMUP {
        s.enqueue().map_err(cuda_err)?;
        s.synchronize().map_err(cuda_err)?;
        runs += 1;
    }
    let mut times = Vec::with_capacity(iters);
    for _ in 0..iters {
        times.push(s.timed_run().map_err(cuda_err)?);
    }
    Ok(crate::timing::summarize(&mut times))
}

/// [`bench_outputs`] of the graph's output.
pub fn bench(g: &Graph, inputs: &TensorMap, warmup: usize, iters: usize) -> Result<Summary, Error> {
    bench_outputs(g, &single_output(g)?, inputs, RunOptions::default(), warmup, iters)
}

/// A program's kernels compiled for one device and loaded there, for callers that own the
/// memory and the stream (the Python package launches on torch's tensors and current stream).
pub struct ExternalKernels {
    pub artifact: NvptxArtifact,
    pub device: DeviceInfo,
    module: ExternalModule,
}

/// The device of GPU `ordinal` (its name and compute capability).
pub fn device_info(ordinal: usize) -> Result<DeviceInfo, Error> {
    foxc_runtime::cuda::device_info_of(ordinal).map_err(cuda_err)
}

/// Compiles `g` (optimized for the GPU) with the compile-time `static_dims` for GPU `ordinal`
/// and loads it there; `bind` (all dims of a first call) sizes the kernels' shared memory.
pub fn load_external(
    g: &Graph,
    static_dims: &BTreeMap<String, u64>,
    bind: &DimBindings,
    ordinal: usize,
) -> Result<ExternalKernels, Error> {
    load_external_outputs(g, &[], static_dims, bind, ordinal)
}

/// [`load_external`] of the program computing `outputs` (empty: the graph's output); the
/// artifact's `outputs` names their buffers in order.
pub fn load_external_outputs(
    g: &Graph,
    outputs: &[Value],
    static_dims: &BTreeMap<String, u64>,
    bind: &DimBindings,
    ordinal: usize,
) -> Result<ExternalKernels, Error> {
    let device = device_info(ordinal)?;
    let artifact = compile_spec(g, outputs, static_dims, target_for(&device)?, false, sm_count(&device))?;
    let (_, launches) = plan(&artifact, bind)?;
    let module = ExternalModule::load(ordinal, &artifact.ptx, &launches).map_err(cuda_err)?;
    Ok(ExternalKernels { artifact, device, module })
}

impl ExternalKernels {
    /// Enqueues `launches` (from [`plan`] of this artifact) on `stream` with buffer `n` at
    /// `ptrs[n]`. Asynchronous, no host synchronization.
    ///
    /// # Safety
    /// Every pointer must be live device memory on this device of at least the plan's size
    /// of its buffer, and `stream` a stream of this device.
    pub unsafe fn enqueue(
        &self,
        launches: &[LaunchDesc],
        ptrs: &[u64],
        sizes: &[usize],
        stream: u64,
    ) -> Result<(), Error> {
        // SAFETY: forwarded from the caller's contract.
        unsafe { self.module.enqueue(launches, ptrs, sizes, stream) }.map_err(cuda_err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_is_not_a_gpu_target() {
        let g = Graph::new("empty");
        let e = emit(&g, &[], &BTreeMap::new(), Target::Cpu, Emit::Ptx).unwrap_err();
        assert_eq!(e.kind, crate::ErrorKind::User);
        assert!(e.message.contains("`cpu`"));
    }

    /// `--ws-loads tma`: the warp-specialized attention takes tensor maps of its K and V buffers
    /// last, bound to `(D, T, B G)` (row-major byte strides), `(64, bn, 1)` boxes, 128-byte
    /// swizzle; the cp.async kernel takes none.
    #[test]
    fn tma_attention_gets_tensor_maps_of_k_and_v() {
        let src = crate::pipeline::Source {
            name: "fox_gqa.attn".into(),
            bytes: include_bytes!("../../../examples/fox_gqa.attn").to_vec(),
        };
        let g = src.compile().unwrap().graph;
        let sizes = [("B", 2), ("H", 4), ("G", 2), ("T", 1000), ("D", 128)];
        let dims: BTreeMap<String, u64> = sizes.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        let attention_args = |loads| {
            let opts = foxc_passes::PassOptions {
                target: foxc_passes::Target::Sm90a,
                dims: dims.clone(),
                ws_loads: Some(loads),
                ..Default::default()
            };
            let (opt, _) = crate::pipeline::optimize(&g, &opts).unwrap();
            let a = compile(&opt, &dims, Target::Sm90a).unwrap();
            let (_, launches) = plan(&a, &foxc_ir::shapes::DimBindings(dims.clone())).unwrap();
            let l = launches.into_iter().find(|l| l.kernel.starts_with("foxc_attn_fwd_ws")).unwrap();
            (l.kernel, l.args)
        };
        let (name, args) = attention_args(foxc_ir::attention::KvLoads::Tma);
        assert!(name.starts_with("foxc_attn_fwd_ws_tma_d128_bm64_bn128_"), "{name}");
        let maps: Vec<TensorMapArg> = args
            .iter()
            .filter_map(|a| match a {
                ArgDesc::TensorMap(m) => Some(*m),
                _ => None,
            })
            .collect();
        assert_eq!(maps.len(), 2);
        for (m, operand) in maps.iter().zip([1, 2]) {
            assert_eq!(args[operand], ArgDesc::Buffer(m.buffer), "map over operand {operand}");
            assert_eq!(
                (m.rank, &m.dims[..3], &m.strides[..2]),
                (3, &[128, 1000, 4][..], &[256, 256_000][..])
            );
            assert_eq!((&m.box_dims[..3], m.swizzle), (&[64, 128, 1][..], TmaSwizzle::B128));
        }
        assert!(matches!(args[args.len() - 2..], [ArgDesc::TensorMap(_), ArgDesc::TensorMap(_)]));
        let (name, args) = attention_args(foxc_ir::attention::KvLoads::CpAsync);
        assert!(name.starts_with("foxc_attn_fwd_ws_d128_"), "{name}");
        assert!(!args.iter().any(|a| matches!(a, ArgDesc::TensorMap(_))));
    }
}
