//! The GPU path: validate tensor metadata (names, dtypes, shapes; no data is read), compile the
//! program's kernels once per (device, head dims), and launch them on memory and a stream that
//! the caller owns (torch tensors, torch's current stream).

use crate::errors::{to_py, value_error};
use crate::program::Loaded;
use crate::registry::{KERNEL_BUILDS, KERNEL_HITS};
use foxc::cuda_backend::{self, ExternalKernels};
use foxc_codegen::nvptx::BufferKind;
use foxc_ir::{Dim, Graph};
use foxc_passes::Target;
use foxc_runtime::cuda::LaunchDesc;
use pyo3::prelude::*;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The launches of one program for one set of shapes on one device, and the buffers the
/// caller provides: `roles[n]` says what buffer `n` is: `("input", i)` the i-th parameter's
/// tensor, `("output", 0)` the output tensor, `("lse", 0)` the row log-sum-exp `[B, H, T]` f32,
/// `("scratch", 0)` workspace of `sizes[n]` bytes.
#[pyclass(frozen, module = "foxc._foxc")]
pub struct GpuPlan {
    kernels: Arc<ExternalKernels>,
    launches: Vec<LaunchDesc>,
    #[pyo3(get)]
    sizes: Vec<usize>,
    #[pyo3(get)]
    roles: Vec<(String, usize)>,
    #[pyo3(get)]
    out_shape: Vec<usize>,
    #[pyo3(get)]
    out_dtype: String,
    /// `[B, H, T]` when the plan has a log-sum-exp buffer (the attention kernel writes one).
    #[pyo3(get)]
    lse_shape: Option<Vec<usize>>,
    #[pyo3(get)]
    device_name: String,
}

#[pymethods]
impl GpuPlan {
    /// Enqueue every kernel on `stream` (a CUstream as an int; 0 is the legacy default stream)
    /// with buffer `n` at device address `ptrs[n]`. Returns at once: no host synchronization.
    ///
    /// The caller (foxc's Python package) guarantees that the pointers are live tensors of the
    /// plan's sizes on the plan's device; this checks what it can: one pointer per buffer, none
    /// null.
    fn launch(&self, ptrs: Vec<u64>, stream: u64) -> PyResult<()> {
        if ptrs.len() != self.sizes.len() {
            return Err(value_error(format!(
                "{} buffer pointers for a plan of {}",
                ptrs.len(),
                self.sizes.len()
            )));
        }
        if let Some(n) = ptrs.iter().position(|&p| p == 0) {
            return Err(value_error(format!("buffer {n} ({:?}) has a null device pointer", self.roles[n])));
        }
        // SAFETY: see the contract above; sizes and launches come from the same plan.
        unsafe { self.kernels.enqueue(&self.launches, &ptrs, &self.sizes, stream) }.map_err(to_py)
    }

    /// The PTX of the plan's module.
    #[getter]
    fn ptx(&self) -> String {
        self.kernels.artifact.ptx.clone()
    }
}

/// Names, dtypes and shapes against the declared signature; the bound dims.
fn check_metas(
    g: &Graph,
    metas: &BTreeMap<String, (String, Vec<usize>)>,
) -> PyResult<foxc_ir::shapes::DimBindings> {
    let expected: Vec<String> = g.params.iter().map(|p| format!("{}: {}", p.name, p.ty)).collect();
    for p in &g.params {
        let Some((dtype, _)) = metas.get(&p.name) else {
            return Err(value_error(format!(
                "missing input tensor `{}`: `{}` takes {}",
                p.name,
                g.name,
                expected.join(", ")
            )));
        };
        if dtype != p.ty.dtype.name() {
            return Err(value_error(format!(
                "input `{}` has dtype {dtype}, but `{}` declares {} (the GPU path takes the declared dtype, no conversion)",
                p.name, g.name, p.ty
            )));
        }
    }
    if let Some(extra) = metas.keys().find(|k| g.param(k).is_none()) {
        return Err(value_error(format!(
            "unexpected input tensor `{extra}`: `{}` takes {}",
            g.name,
            expected.join(", ")
        )));
    }
    let shapes: Vec<(String, Vec<usize>)> = metas.iter().map(|(k, (_, s))| (k.clone(), s.clone())).collect();
    foxc_ir::shapes::bind_dims(g, &shapes).map_err(|e| value_error(e.to_string()))
}

/// The dims the kernels are specialized on: the last axis of every rank-4 parameter (the head
/// dimension); batch, heads and sequence stay runtime values.
fn static_dims(g: &Graph, bind: &foxc_ir::shapes::DimBindings) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for p in &g.params {
        let dims: Vec<&Dim> = p.ty.dims().collect();
        if let (4, Some(Dim::Sym(s))) = (dims.len(), dims.last()) {
            if let Some(v) = bind.get(s) {
                out.insert(s.clone(), v);
            }
        }
    }
    out
}

fn kernels_for(
    py: Python<'_>,
    loaded: &Loaded,
    g: &Graph,
    bind: &foxc_ir::shapes::DimBindings,
    device: usize,
) -> PyResult<Arc<ExternalKernels>> {
    let sd = static_dims(g, bind);
    let key = (device, sd.iter().map(|(k, v)| (k.clone(), *v)).collect::<Vec<_>>());
    if let Some(k) = loaded.kernels.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        KERNEL_HITS.fetch_add(1, Ordering::Relaxed);
        return Ok(k.clone());
    }
    // Compile without the GIL and without the lock (a thread waiting for the lock while holding
    // the GIL would deadlock with this one re-taking the GIL); a racing build of the same key
    // is dropped for the first one stored.
    let k = py.detach(|| cuda_backend::load_external(g, &sd, bind, device)).map_err(to_py)?;
    KERNEL_BUILDS.fetch_add(1, Ordering::Relaxed);
    let mut cache = loaded.kernels.lock().unwrap_or_else(|e| e.into_inner());
    Ok(cache.entry(key).or_insert_with(|| Arc::new(k)).clone())
}

pub fn plan(
    py: Python<'_>,
    loaded: &Arc<Loaded>,
    metas: BTreeMap<String, (String, Vec<usize>)>,
    device: usize,
) -> PyResult<GpuPlan> {
    let bind = check_metas(&loaded.graph, &metas)?;
    let info = cuda_backend::device_info(device).map_err(to_py)?;
    let target = match cuda_backend::target_for(&info).map_err(to_py)? {
        "sm_80" => Target::Sm80,
        _ => Target::Sm90a,
    };
    let g = loaded.optimized(target)?;
    let kernels = kernels_for(py, loaded, &g, &bind, device)?;
    let art = &kernels.artifact;
    let (buffers, launches) = cuda_backend::plan(art, &bind).map_err(to_py)?;
    let mut roles = Vec::with_capacity(buffers.len());
    let mut lse_shape = None;
    for (n, b) in art.buffers.iter().enumerate() {
        roles.push(match &b.kind {
            BufferKind::Param { index, .. } => ("input".to_string(), *index),
            _ if n == art.output => ("output".to_string(), 0),
            // The attention kernel's row log-sum-exp (the backward's input). Until the attention
            // op has it as a second result, the NVPTX plan names it as this scratch buffer.
            BufferKind::Scratch(what) if what.starts_with("log-sum-exp") && lse_shape.is_none() => {
                lse_shape = Some(
                    b.shape
                        .iter()
                        .map(|d| bind.eval(d).map(|v| v as usize))
                        .collect::<Option<Vec<usize>>>()
                        .ok_or_else(|| value_error("the log-sum-exp shape has an unbound dimension"))?,
                );
                ("lse".to_string(), 0)
            }
            _ => ("scratch".to_string(), 0),
        });
    }
    let out = g.output.ok_or_else(|| value_error(format!("`{}` has no output", g.name)))?;
    let out_shape = g
        .ty(out)
        .dims()
        .map(|d| bind.eval(d).map(|v| v as usize))
        .collect::<Option<Vec<usize>>>()
        .ok_or_else(|| value_error("the output shape has an unbound dimension"))?;
    Ok(GpuPlan {
        sizes: buffers.iter().map(|b| b.bytes).collect(),
        launches,
        roles,
        out_shape,
        out_dtype: g.ty(out).dtype.name().to_string(),
        lse_shape,
        device_name: info.name,
        kernels,
    })
}
