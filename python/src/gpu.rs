//! The GPU path: validate tensor metadata (names, dtypes, shapes; no data is read), compile the
//! program's kernels once per (device, head dims), and launch them on memory and a stream that
//! the caller owns (torch tensors, torch's current stream).

use crate::errors::{to_py, value_error};
use crate::program::{KernelKey, Loaded, Specialization};
use crate::registry::{KERNEL_BUILDS, KERNEL_HITS};
use foxc_codegen::nvptx::BufferKind;
use foxc_driver::cuda_backend::{self, ExternalKernels};
use foxc_driver::grad::GradKind;
use foxc_driver::Target;
use foxc_ir::{Dim, Graph, Value};
use foxc_passes::fuse_out::split_rows_bounds;
use foxc_passes::tiles::split_keys_dims;
use foxc_runtime::cuda::LaunchDesc;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// The launches of one program for one set of shapes on one device, and the buffers the
/// caller provides: `roles[n]` says what buffer `n` is: `("input", i)` the tensor of the
/// program's i-th parameter, `("output", j)` the tensor of output j (`outputs[j]`: name, dtype,
/// shape), `("scratch", 0)` workspace of `sizes[n]` bytes, `("zeroed", 0)` workspace of
/// `sizes[n]` bytes that must be zero when the plan is launched (counters the kernels leave
/// zero).
///
/// A forward plan has the outputs `out` and, when the output is a fused attention's, `lse` (its
/// row log-sum-exp `[B, H, T]` f32, what the backward reads); a gradient plan has
/// `grad_<param>` for every float parameter of the forward.
#[pyclass(frozen, module = "foxc._foxc")]
pub struct GpuPlan {
    kernels: Arc<ExternalKernels>,
    launches: Vec<LaunchDesc>,
    #[pyo3(get)]
    sizes: Vec<usize>,
    #[pyo3(get)]
    roles: Vec<(String, usize)>,
    #[pyo3(get)]
    outputs: Vec<(String, String, Vec<usize>)>,
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
    let bind = foxc_ir::shapes::bind_dims(g, &shapes).map_err(|e| value_error(e.to_string()))?;
    // Per-head thresholds (`thresholds=`): one per query head, before any kernel is built.
    foxc_driver::validate::check_given_heads(g, &bind).map_err(|e| value_error(e.to_string()))?;
    Ok(bind)
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

/// Kernels of `g` (optimized for `spec`) computing `outputs` for `device`, built once per
/// (device, static dims, specialization) in `cache`.
fn kernels_for(
    py: Python<'_>,
    cache: &Mutex<HashMap<KernelKey, Arc<ExternalKernels>>>,
    (g, spec): (&Graph, &Specialization),
    outputs: &[Value],
    bind: &foxc_ir::shapes::DimBindings,
    device: usize,
) -> PyResult<Arc<ExternalKernels>> {
    let sd = static_dims(g, bind);
    let key = (device, sd.iter().map(|(k, v)| (k.clone(), *v)).collect::<Vec<_>>(), spec.clone());
    if let Some(k) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        KERNEL_HITS.fetch_add(1, Ordering::Relaxed);
        return Ok(k.clone());
    }
    // Compile without the GIL and without the lock (a thread waiting for the lock while holding
    // the GIL would deadlock with this one re-taking the GIL); a racing build of the same key
    // is dropped for the first one stored.
    let k =
        py.detach(|| cuda_backend::load_external_outputs(g, outputs, &sd, bind, device)).map_err(to_py)?;
    KERNEL_BUILDS.fetch_add(1, Ordering::Relaxed);
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    Ok(cache.entry(key).or_insert_with(|| Arc::new(k)).clone())
}

/// The GPU target of `device`.
fn target_of(device: usize) -> PyResult<(Target, String)> {
    let info = cuda_backend::device_info(device).map_err(to_py)?;
    Ok((cuda_backend::target_for(&info).map_err(to_py)?, info.name))
}

/// The plan of `g` computing the named `outputs`, tensors of `metas` on `device`.
fn build(
    py: Python<'_>,
    cache: &Mutex<HashMap<KernelKey, Arc<ExternalKernels>>>,
    (g, spec): (&Graph, &Specialization),
    outputs: &[(String, Value)],
    metas: &BTreeMap<String, (String, Vec<usize>)>,
    device: usize,
    device_name: String,
) -> PyResult<GpuPlan> {
    let bind = check_metas(g, metas)?;
    let values: Vec<Value> = outputs.iter().map(|(_, v)| *v).collect();
    let kernels = kernels_for(py, cache, (g, spec), &values, &bind, device)?;
    let art = &kernels.artifact;
    if art.outputs.len() != outputs.len() {
        return Err(PyRuntimeError::new_err(format!(
            "foxc: the GPU module has {} outputs, {} were asked for",
            art.outputs.len(),
            outputs.len()
        )));
    }
    let (buffers, launches) = cuda_backend::plan(art, &bind).map_err(to_py)?;
    let mut roles = Vec::with_capacity(buffers.len());
    for (n, b) in art.buffers.iter().enumerate() {
        roles.push(match (&b.kind, art.outputs.iter().position(|&o| o == n)) {
            (BufferKind::Param { name, .. }, Some(_)) => {
                // An output that is a parameter's own buffer: nothing would write the caller's
                // output tensor.
                return Err(PyRuntimeError::new_err(format!("foxc: an output is the input `{name}` itself")));
            }
            (BufferKind::Param { index, .. }, None) => ("input".to_string(), *index),
            (_, Some(j)) => ("output".to_string(), j),
            (BufferKind::Counters(_), None) => ("zeroed".to_string(), 0),
            _ => ("scratch".to_string(), 0),
        });
    }
    let mut outs = Vec::with_capacity(outputs.len());
    for (name, v) in outputs {
        let ty = g.value_ty(*v);
        let shape = ty
            .dims()
            .map(|d| bind.eval(d).map(|x| x as usize))
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| value_error(format!("the shape of `{name}` has an unbound dimension")))?;
        outs.push((name.clone(), ty.dtype.name().to_string(), shape));
    }
    Ok(GpuPlan {
        sizes: buffers.iter().map(|b| b.bytes).collect(),
        launches,
        roles,
        outputs: outs,
        device_name,
        kernels: kernels.clone(),
    })
}

/// What the GPU graph of `loaded` for tensors bound as `bind` is optimized for: the head dims
/// bound (the tiles the CLI picks at that D), and whether it is differentiated (`gradient`: the
/// training forward and the backward, whose kernels share the forward's tiles).
fn specialization(loaded: &Loaded, bind: &foxc_ir::shapes::DimBindings, gradient: bool) -> Specialization {
    let dims = static_dims(&loaded.graph, bind).into_iter().collect();
    Specialization { dims, at_least: Vec::new(), gradient }
}

/// The forward: `out`, and `lse` when the output is a fused attention's (the backward's input);
/// with `train` also the attention's unrounded `out_f32` (`crate::grad::forward`). Optimized for
/// the head dims, with the training forward's tiles under `train`, and for rows longer than one
/// gate-scan segment where these are (one plan per class of T: the CLI, which binds T, picks
/// per shape).
pub fn plan(
    py: Python<'_>,
    loaded: &Arc<Loaded>,
    metas: BTreeMap<String, (String, Vec<usize>)>,
    device: usize,
    train: bool,
) -> PyResult<GpuPlan> {
    let bind = check_metas(&loaded.graph, &metas)?;
    let (target, device_name) = target_of(device)?;
    let spec = specialization(loaded, &bind, train);
    let plain = loaded.optimized_for(target, &spec)?;
    // A decode step's query count, bound where it fits one block: its plan splits the keys
    // (`foxc_passes::tiles::split_keys_dims`; one plan per such count).
    let mut dims = spec.dims.clone();
    dims.extend(split_keys_dims(&plain, &|s| bind.get(s)));
    dims.sort();
    dims.dedup();
    let spec = Specialization {
        at_least: split_rows_bounds(&plain, &|s| bind.get(s)).into_iter().collect(),
        dims,
        ..spec
    };
    let f = crate::grad::forward(loaded, target, train, &spec)?;
    let cache = if train { &loaded.train_kernels } else { &loaded.kernels };
    build(py, cache, (&f.0, &spec), &f.1, &metas, device, device_name)
}

/// The backward, of the GPU graph optimized as the training forward's (its tiles): the
/// saved-forward gradient program (`passes::grad::gradient_from_saved`; `metas` name the
/// forward's tensors plus `dout`, `out` (f32) and `lse`), or the one that recomputes the forward
/// (`passes::grad::gradient`; the forward's tensors plus `dout`).
pub fn grad_plan(
    py: Python<'_>,
    loaded: &Arc<Loaded>,
    metas: BTreeMap<String, (String, Vec<usize>)>,
    device: usize,
    kind: GradKind,
) -> PyResult<GpuPlan> {
    let (target, device_name) = target_of(device)?;
    // The gradient program's signature (and so the binding) is the same for every
    // specialization: bind with the plain one's.
    let plain = crate::grad::program(loaded, target, kind, &Specialization::default())?;
    let bind = check_metas(&plain.graph, &metas)?;
    let spec = specialization(loaded, &bind, true);
    let gp = crate::grad::program(loaded, target, kind, &spec)?;
    let cache = match kind {
        GradKind::Saved => &loaded.grad_kernels,
        GradKind::Recomputed => &loaded.recomputed_grad_kernels,
    };
    build(py, cache, (&gp.graph, &spec), &gp.outputs, &metas, device, device_name)
}
