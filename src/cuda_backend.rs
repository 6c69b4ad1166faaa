//! CUDA backend glue: compile an optimized graph with the NVPTX backend (`foxc_codegen::nvptx`),
//! turn its launch plan into the runtime's concrete launches once the input shapes bind the
//! dimensions, and run it with the CUDA runtime (`foxc_runtime::cuda`), which never links LLVM.

use crate::Error;
use foxc_codegen::nvptx::{self as cg, CodegenError, KernelArg, NvptxArtifact, NvptxSpec, NvptxTarget};
use foxc_ir::shapes::DimBindings;
use foxc_ir::Graph;
use foxc_runtime::cuda::{
    ArgDesc, BufferDesc, BufferInit, CudaError, CudaErrorKind, CudaRuntime, DeviceInfo, ExternalModule,
    LaunchDesc, Program,
};
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

/// Timing of repeated forward passes (events around the whole forward, per iteration).
#[derive(Clone, Debug)]
pub struct BenchStats {
    pub median_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
    pub iters: usize,
}

fn codegen_err(e: CodegenError) -> Error {
    match e {
        CodegenError::User(_) | CodegenError::Unsupported { .. } => Error::user(format!("error: {e}")),
        CodegenError::Internal(_) => Error::internal(format!("internal error: {e}")),
    }
}

fn cuda_err(e: CudaError) -> Error {
    match e.kind {
        CudaErrorKind::NoDriver | CudaErrorKind::NoDevice => Error::user(format!("error: {e}")),
        CudaErrorKind::Invalid | CudaErrorKind::Driver => Error::internal(format!("internal error: {e}")),
    }
}

fn parse_target(target: &str) -> Result<NvptxTarget, Error> {
    NvptxTarget::parse(target).ok_or_else(|| {
        Error::user(format!("error: unknown GPU target `{target}` (expected sm_90a or sm_80)"))
    })
}

/// Compiles `g` for `target` ("sm_90a" | "sm_80") with the compile-time `dims` (at least `D`).
pub fn compile(g: &Graph, dims: &BTreeMap<String, u64>, target: &str) -> Result<NvptxArtifact, Error> {
    let spec = NvptxSpec { target: parse_target(target)?, dims: dims.clone() };
    cg::compile(g, &spec).map_err(codegen_err)
}

/// The LLVM IR or PTX of the whole program.
pub fn emit(g: &Graph, dims: &BTreeMap<String, u64>, target: &str, what: Emit) -> Result<String, Error> {
    let a = compile(g, dims, target)?;
    Ok(match what {
        Emit::Llvm => a.llvm_ir,
        Emit::Ptx => a.ptx,
    })
}

/// The runtime program for the artifact with the dimensions bound.
pub fn program(a: &NvptxArtifact, bind: &DimBindings) -> Result<Program, Error> {
    let (buffers, launches) = plan(a, bind)?;
    Ok(Program { ptx: a.ptx.clone(), buffers, launches, output: a.output })
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
            cg::BufferKind::Value(v) => (BufferInit::Poison, format!("value %{}", v.index())),
            cg::BufferKind::Scratch(s) => (BufferInit::Poison, format!("scratch {i}: {s}")),
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
            });
        }
        launches.push(LaunchDesc {
            kernel: k.name.clone(),
            grid: geo.grid,
            block: geo.block,
            shared_bytes: geo.shared_bytes,
            args,
            zero_first: k.zero_first.clone(),
        });
    }
    Ok((buffers, launches))
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

/// The NVPTX target of a device: sm_90a on compute capability 9.x, sm_80 on 8.x.
pub fn target_for(info: &DeviceInfo) -> Result<&'static str, Error> {
    match info.compute_capability {
        (9, _) => Ok("sm_90a"),
        (8, _) => Ok("sm_80"),
        (ma, mi) => Err(Error::user(format!(
            "error: the GPU {} has compute capability {ma}.{mi}; foxc's kernels need 8.x (sm_80) or 9.x (sm_90a)",
            info.name
        ))),
    }
}

/// Validated inputs, the program and its runtime, ready to upload.
struct Prepared {
    program: Program,
    out_shape: Vec<usize>,
    out_dtype: foxc_ir::DType,
    rt: CudaRuntime,
    inputs: Vec<Vec<u8>>,
}

fn prepare(g: &Graph, inputs: &TensorMap) -> Result<Prepared, Error> {
    // Shapes, dtypes and values are checked before anything touches the GPU.
    let bind =
        foxc_runtime::validate::check_inputs(g, inputs).map_err(|e| Error::user(format!("error: {e}")))?;
    check_sizes(g, &bind)?;
    let rt = CudaRuntime::new().map_err(cuda_err)?;
    let info = rt.device_info().map_err(cuda_err)?;
    let target = target_for(&info)?;
    let art = compile(g, &bind.0, target)?;
    let program = program(&art, &bind)?;
    let out = g.output.ok_or_else(|| Error::user(format!("error: graph `{}` has no output", g.name)))?;
    let out_ty = g.ty(out);
    let out_shape = out_ty
        .dims()
        .map(|d| bind.eval(d).map(|v| v as usize))
        .collect::<Option<Vec<usize>>>()
        .ok_or_else(|| Error::user("error: the output shape has an unbound dimension"))?;
    let mut ins = Vec::with_capacity(g.params.len());
    for p in &g.params {
        ins.push(inputs[&p.name].data.clone());
    }
    Ok(Prepared { program, out_shape, out_dtype: out_ty.dtype, rt, inputs: ins })
}

/// Compiles for the GPU present, runs once and returns the output. Output buffers are poisoned
/// (NaN) first; a NaN left in the output is an error (inputs were checked to hold none).
pub fn run(g: &Graph, inputs: &TensorMap) -> Result<CudaRun, Error> {
    let p = prepare(g, inputs)?;
    let device = p.rt.device_info().map_err(cuda_err)?.name;
    let mut s = p.rt.load(&p.program).map_err(cuda_err)?;
    let refs: Vec<&[u8]> = p.inputs.iter().map(|v| v.as_slice()).collect();
    s.upload(&refs).map_err(cuda_err)?;
    let kernel_ms = s.timed_run().map_err(cuda_err)?;
    let data = s.download_output().map_err(cuda_err)?;
    let out = HostTensor { dtype: p.out_dtype, shape: p.out_shape, data };
    let nan = out.to_f32_vec().iter().filter(|x| x.is_nan()).count();
    if nan > 0 {
        return Err(Error::internal(format!(
            "internal error: {nan} of {} output elements are NaN after the GPU run (unwritten by the kernels, or a kernel fault)",
            out.numel()
        )));
    }
    Ok(CudaRun { out, kernel_ms, device })
}

/// Median and minimum time of `iters` forward passes after `warmup` untimed ones, each timed by
/// CUDA events around all of its launches.
pub fn bench(g: &Graph, inputs: &TensorMap, warmup: usize, iters: usize) -> Result<BenchStats, Error> {
    if iters == 0 {
        return Err(Error::user("error: bench needs at least one iteration"));
    }
    let p = prepare(g, inputs)?;
    let mut s = p.rt.load(&p.program).map_err(cuda_err)?;
    let refs: Vec<&[u8]> = p.inputs.iter().map(|v| v.as_slice()).collect();
    s.upload(&refs).map_err(cuda_err)?;
    for _ in 0..warmup {
        s.enqueue().map_err(cuda_err)?;
    }
    s.synchronize().map_err(cuda_err)?;
    let mut times = Vec::with_capacity(iters);
    for _ in 0..iters {
        times.push(s.timed_run().map_err(cuda_err)?);
    }
    times.sort_by(f64::total_cmp);
    let median_ms =
        if iters % 2 == 1 { times[iters / 2] } else { 0.5 * (times[iters / 2 - 1] + times[iters / 2]) };
    Ok(BenchStats { median_ms, min_ms: times[0], max_ms: times[iters - 1], iters })
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
    let device = device_info(ordinal)?;
    let artifact = compile(g, static_dims, target_for(&device)?)?;
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
    fn unknown_target_is_a_user_error() {
        let g = Graph::new("empty");
        let e = emit(&g, &BTreeMap::new(), "sm_75", Emit::Ptx).unwrap_err();
        assert_eq!(e.kind, crate::ErrorKind::User);
        assert!(e.message.contains("sm_75"));
    }
}
