//! A compiled program: the checked graph, the pass options, the optimized graph per target
//! (made on first use) and the GPU kernels per (head dims, device).

use crate::errors::{compile_error, to_py, value_error};
use crate::registry::{self, Key};
use crate::tensors::{f32_bytes, f64_bytes, host_inputs, Wire};
use foxc_driver::grad::GradKind;
use foxc_driver::pipeline::{self, Source};
use foxc_driver::{tensors as ftensors, BackendKind, PruneOptions, RunOptions, Target};
use foxc_ir::{Graph, PruneRule, Tiles};
use foxc_passes::grad::GradProgram;
use foxc_passes::PassOptions;
use foxc_runtime::TensorMap;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

/// GPU kernels are built per (device ordinal, compile-time dims such as `D`, the graph's
/// [`Specialization`]).
pub type KernelKey = (usize, Vec<(String, u64)>, Specialization);

/// What a GPU graph is optimized for besides its target (`PassOptions`): the head dims its
/// kernels are compiled for (`dims`: the tiles pass picks by them, as the CLI does with every
/// dim bound), lower bounds of the dims left unbound (`dims_at_least`, from
/// `fuse_out::split_rows_bounds`: long rows get the split prelude), and whether it will be
/// differentiated (`gradient`: the training forward and the backward share their tiles). The
/// default (nothing known, a forward) is the CPU's and `foxc.Program.ir`'s.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Specialization {
    pub dims: Vec<(String, u64)>,
    pub at_least: Vec<(String, u64)>,
    pub gradient: bool,
}

/// Everything a load produced (shared by every `Program` handle of the same key).
pub struct Loaded {
    pub id: usize,
    pub name: String,
    pub source: String,
    pub graph: Graph,
    pub opts: PassOptions,
    /// The optimized graph of each (target, specialization), made on first use.
    pub(crate) optimized: Mutex<HashMap<(Target, Specialization), Arc<Graph>>>,
    /// GPU kernels by (device ordinal, compile-time dims, specialization).
    pub kernels: Mutex<HashMap<KernelKey, Arc<foxc_driver::cuda_backend::ExternalKernels>>>,
    /// The gradient programs per (target, kind, specialization), made on first use.
    pub(crate) gradients: Mutex<HashMap<(Target, GradKind, Specialization), Arc<GradProgram>>>,
    /// The forwards per (target, train, specialization) (`crate::grad::forward`).
    pub(crate) forwards: Mutex<HashMap<(Target, bool, Specialization), Arc<crate::grad::Forward>>>,
    /// GPU kernels of the training forward (`out_f32` too), as `kernels`.
    pub train_kernels: Mutex<HashMap<KernelKey, Arc<foxc_driver::cuda_backend::ExternalKernels>>>,
    /// GPU kernels of the saved-forward gradient program, as `kernels`.
    pub grad_kernels: Mutex<HashMap<KernelKey, Arc<foxc_driver::cuda_backend::ExternalKernels>>>,
    /// GPU kernels of the recomputing gradient program (the backward of a program whose output
    /// is not an attention's own), as `kernels`.
    pub recomputed_grad_kernels: Mutex<HashMap<KernelKey, Arc<foxc_driver::cuda_backend::ExternalKernels>>>,
    /// Explanations of the CPU pipeline (why attention was or was not pruned).
    pub(crate) explanations: Vec<String>,
}

impl Loaded {
    /// The optimized graph for `target` (the pass options of the load, this target).
    pub fn optimized(&self, target: Target) -> PyResult<Arc<Graph>> {
        self.optimized_for(target, &Specialization::default())
    }

    /// The optimized graph for `target` and `spec`.
    pub fn optimized_for(&self, target: Target, spec: &Specialization) -> PyResult<Arc<Graph>> {
        let mut m = self.optimized.lock().unwrap_or_else(|e| e.into_inner());
        let key = (target, spec.clone());
        if let Some(g) = m.get(&key) {
            return Ok(g.clone());
        }
        let opts = PassOptions {
            target,
            dims: spec.dims.iter().cloned().collect(),
            dims_at_least: spec.at_least.iter().cloned().collect(),
            gradient: spec.gradient,
            ..self.opts.clone()
        };
        let (g, _) = pipeline::optimize(&self.graph, &opts).map_err(to_py)?;
        let g = Arc::new(g);
        m.insert(key, g.clone());
        Ok(g)
    }

    /// The saved-forward gradient program for `target` and `spec` (the backward of the torch
    /// op).
    pub fn saved_gradient(&self, target: Target, spec: &Specialization) -> PyResult<Arc<GradProgram>> {
        crate::grad::program(self, target, GradKind::Saved, spec)
    }
}

/// A compiled attention program (see `foxc.load`).
#[pyclass(frozen, module = "foxc._foxc")]
pub struct Program {
    pub inner: Arc<Loaded>,
}

/// A rule of the table (`foxc rules`), or a ValueError listing the names.
fn parse_rule(rule: &str) -> PyResult<PruneRule> {
    foxc_passes::rules::by_name(rule).map_err(|e| value_error(format!("prune_rule: {e}")))
}

/// Compile `source` (DSL text; `name` is what diagnostics call it) once per (text, options).
#[pyfunction]
#[pyo3(signature = (source, name, prune_rule = foxc_driver::DEFAULT_PRUNE_RULE, log_eps = foxc_driver::DEFAULT_LOG_EPS, no_prune = false, tiles = None, norm_bounds = None, thresholds = None))]
#[allow(clippy::too_many_arguments)] // the keyword arguments of `foxc.load`
pub fn load(
    py: Python<'_>,
    source: &str,
    name: &str,
    prune_rule: &str,
    log_eps: f64,
    no_prune: bool,
    tiles: Option<(u32, u32)>,
    norm_bounds: Option<(f64, f64)>,
    thresholds: Option<Vec<f64>>,
) -> PyResult<Program> {
    // Per-head thresholds given by the user replace the rule (not a safety proof).
    let rule = match &thresholds {
        None => parse_rule(prune_rule)?,
        Some(_) if prune_rule != foxc_driver::DEFAULT_PRUNE_RULE => {
            return Err(value_error(format!(
                "thresholds= replaces the pruning rule; prune_rule=`{prune_rule}` cannot be given with it"
            )))
        }
        Some(v) => PruneRule::given_thresholds(v).map_err(|e| value_error(format!("thresholds: {e}")))?,
    };
    let tiles = tiles.map(|(m, n)| foxc_driver::options::tiles(m, n)).transpose().map_err(value_error)?;
    let rule_key = rule.to_string();
    let prune =
        PruneOptions { no_prune, log_eps, prune_rule: rule, tiles, norm_bounds, ..PruneOptions::default() };
    // The CPU's options: the GPU graphs take them with their target and specialization.
    let opts = pipeline::pass_options(&prune, Target::Cpu, false).map_err(to_py)?;
    let key = Key {
        name: name.to_string(),
        source: source.as_bytes().to_vec(),
        prune: opts.prune,
        log_eps_bits: log_eps.to_bits(),
        // The rule as printed: a given rule's values too (two tables are two programs).
        rule: rule_key,
        tiles: tiles.map(|t: Tiles| (t.bm, t.bn)),
        norm_bounds: norm_bounds.map(|(q, k)| (q.to_bits(), k.to_bits())),
    };
    let src = Source { name: name.to_string(), bytes: source.as_bytes().to_vec() };
    let inner = registry::get_or_insert(key, |id| {
        py.detach(|| -> PyResult<Loaded> {
            let c = src.compile().map_err(compile_error)?;
            // Run the CPU pipeline now: bad options and pass failures surface at load time.
            let (cpu, report) = pipeline::optimize(&c.graph, &opts).map_err(to_py)?;
            let explanations = report.explanations.iter().map(|e| e.message.clone()).collect();
            let mut optimized = HashMap::new();
            optimized.insert((Target::Cpu, Specialization::default()), Arc::new(cpu));
            Ok(Loaded {
                id,
                name: src.name.clone(),
                source: String::from_utf8_lossy(&src.bytes).into_owned(),
                graph: c.graph,
                opts: opts.clone(),
                optimized: Mutex::new(optimized),
                kernels: Mutex::new(HashMap::new()),
                gradients: Mutex::new(HashMap::new()),
                grad_kernels: Mutex::new(HashMap::new()),
                recomputed_grad_kernels: Mutex::new(HashMap::new()),
                forwards: Mutex::new(HashMap::new()),
                train_kernels: Mutex::new(HashMap::new()),
                explanations,
            })
        })
    })?;
    Ok(Program { inner })
}

/// `{name: (shape, little-endian bytes)}`.
type NamedBytes<'py> = BTreeMap<String, (Vec<usize>, Bound<'py, PyBytes>)>;

fn f32_outs(py: Python<'_>, r: TensorMap) -> NamedBytes<'_> {
    r.into_iter()
        .map(|(n, t)| (n, (t.shape.clone(), PyBytes::new(py, &f32_bytes(&t.to_f32_vec())))))
        .collect()
}

fn parse_target(target: &str) -> PyResult<Target> {
    foxc_driver::target::parse(target)
        .ok_or_else(|| value_error(format!("target must be cpu, sm_90a or sm_80, got {target:?}")))
}

fn dims_text(ty: &foxc_ir::ValueType) -> Vec<String> {
    ty.dims().map(|d| d.to_string()).collect()
}

#[pymethods]
impl Program {
    /// The registry id (what the torch op carries).
    #[getter]
    fn id(&self) -> usize {
        self.inner.id
    }

    /// The attention's name in the DSL.
    #[getter]
    fn name(&self) -> String {
        self.inner.graph.name.clone()
    }

    #[getter]
    fn file(&self) -> String {
        self.inner.name.clone()
    }

    #[getter]
    fn source(&self) -> String {
        self.inner.source.clone()
    }

    /// `[(name, dtype, [dim, ...]), ...]` in declaration order.
    #[getter]
    fn params(&self) -> Vec<(String, String, Vec<String>)> {
        self.inner
            .graph
            .params
            .iter()
            .map(|p| (p.name.clone(), p.stored().name().to_string(), dims_text(&p.ty)))
            .collect()
    }

    /// `(dtype, [dim, ...])` of the output.
    #[getter]
    fn output(&self) -> PyResult<(String, Vec<String>)> {
        let g = &self.inner.graph;
        let o = g.output.ok_or_else(|| value_error(format!("`{}` has no output", g.name)))?;
        Ok((g.ty(o).dtype.name().to_string(), dims_text(g.ty(o))))
    }

    /// `(prune, log_eps, rule)` of the load.
    #[getter]
    fn options(&self) -> (bool, f64, String) {
        let o = &self.inner.opts;
        (o.prune, o.log_eps, o.rule.name.to_string())
    }

    /// The keyword arguments of the load after `source` and `name`: `(prune_rule, log_eps,
    /// no_prune, tiles, norm_bounds, thresholds)` (what loading a variant of this program
    /// repeats; with given thresholds the rule name is the default, as that load's).
    #[allow(clippy::type_complexity)]
    #[getter]
    fn load_args(&self) -> (String, f64, bool, Option<(u32, u32)>, Option<(f64, f64)>, Option<Vec<f64>>) {
        let o = &self.inner.opts;
        let (name, given) = match o.rule.reads_given() {
            true => (foxc_driver::DEFAULT_PRUNE_RULE.to_string(), Some(o.rule.given.clone())),
            false => (o.rule.name.to_string(), None),
        };
        (name, o.log_eps, !o.prune, o.tiles.map(|t| (t.bm, t.bn)), o.norm_bounds, given)
    }

    /// The IR text: `stage` "ir" (as lowered) or "opt" (after the passes for `target`, with the
    /// sizes in `dims` bound, as a call with tensors of those sizes optimizes it).
    #[pyo3(signature = (stage = "opt", target = "cpu", dims = None))]
    fn ir(&self, stage: &str, target: &str, dims: Option<BTreeMap<String, u64>>) -> PyResult<String> {
        let target = parse_target(target)?;
        let spec =
            Specialization { dims: dims.unwrap_or_default().into_iter().collect(), ..Default::default() };
        match stage {
            "ir" => Ok(foxc_ir::print::print_graph(&self.inner.graph)),
            "opt" => Ok(foxc_ir::print::print_graph(&*self.inner.optimized_for(target, &spec)?)),
            s => Err(value_error(format!("stage must be \"ir\" or \"opt\", got {s:?}"))),
        }
    }

    /// Why attention was or was not recognized and pruned (one line each; empty: nothing to say).
    fn explain(&self) -> Vec<String> {
        self.inner.explanations.clone()
    }

    /// Run on the CPU backend: `{name: (dtype, shape, bytes)}` -> `(shape, f32 bytes)`.
    fn run_cpu<'py>(
        &self,
        py: Python<'py>,
        inputs: BTreeMap<String, Wire>,
    ) -> PyResult<(Vec<usize>, Bound<'py, PyBytes>)> {
        let g = self.inner.optimized(Target::Cpu)?;
        let host = host_inputs(&g, inputs)?;
        let cpu = || foxc_driver::backend(BackendKind::Cpu).run(&g, &[], &host, RunOptions::default());
        let mut run = py.detach(cpu).map_err(to_py)?;
        let out = run
            .outputs
            .remove("out")
            .ok_or_else(|| PyRuntimeError::new_err("foxc: the CPU run lost its output"))?;
        Ok((out.shape.clone(), PyBytes::new(py, &f32_bytes(&out.to_f32_vec()))))
    }

    /// The f64 reference interpreter on the same inputs (rounded to the declared dtypes as the
    /// backends see them): the program as written (`pruned=False`, dense) or after the CPU
    /// passes (`pruned=True`). Returns `(shape, f64 bytes)`.
    #[pyo3(signature = (inputs, pruned = false))]
    fn reference<'py>(
        &self,
        py: Python<'py>,
        inputs: BTreeMap<String, Wire>,
        pruned: bool,
    ) -> PyResult<(Vec<usize>, Bound<'py, PyBytes>)> {
        let g = if pruned { self.inner.optimized(Target::Cpu)? } else { Arc::new(self.inner.graph.clone()) };
        let host = host_inputs(&g, inputs)?;
        ftensors::validate(&g, &host).map_err(to_py)?;
        let interp_inputs = ftensors::to_interp(&host);
        let r = py
            .detach(|| foxc_ir::interp::run(&g, &interp_inputs))
            .map_err(|e| value_error(format!("reference interpreter: {e}")))?;
        Ok((r.output.shape, PyBytes::new(py, &f64_bytes(&r.output.data))))
    }

    /// The CPU forward with its row log-sum-exp: `{"out": (shape, f32 bytes), "lse": ...}`
    /// (`lse` only when the output is a fused attention's); `train=True` adds `out_f32`, the
    /// attention's unrounded output (what the saved-forward gradient program reads).
    #[pyo3(signature = (inputs, train = false))]
    fn forward_cpu<'py>(
        &self,
        py: Python<'py>,
        inputs: BTreeMap<String, Wire>,
        train: bool,
    ) -> PyResult<NamedBytes<'py>> {
        let r = crate::grad::forward_cpu(py, &self.inner, inputs, train)?;
        Ok(f32_outs(py, r))
    }

    /// The gradient program on the CPU backend: `saved=False` takes the forward's inputs and
    /// `dout` and returns `out` and `grad_<param>` (`passes::grad::gradient`); `saved=True`
    /// also takes the forward's `out` (f32) and `lse` and returns only the gradients
    /// (`gradient_from_saved`, what torch autograd runs). `{name: (shape, f32 bytes)}`.
    #[pyo3(signature = (inputs, saved = false))]
    fn grad_cpu<'py>(
        &self,
        py: Python<'py>,
        inputs: BTreeMap<String, Wire>,
        saved: bool,
    ) -> PyResult<NamedBytes<'py>> {
        let r = crate::grad::grad_cpu(py, &self.inner, inputs, crate::grad::kind_of(saved))?;
        Ok(f32_outs(py, r))
    }

    /// `grad_cpu`'s program through the f64 interpreter: `{name: (shape, f64 bytes)}`.
    #[pyo3(signature = (inputs, saved = false))]
    fn grad_reference<'py>(
        &self,
        py: Python<'py>,
        inputs: BTreeMap<String, Wire>,
        saved: bool,
    ) -> PyResult<NamedBytes<'py>> {
        let r = crate::grad::grad_reference(py, &self.inner, inputs, crate::grad::kind_of(saved))?;
        Ok(r.into_iter().map(|(n, t)| (n, (t.shape, PyBytes::new(py, &f64_bytes(&t.data))))).collect())
    }

    /// The parameters of the saved-forward gradient program for `target`, in order:
    /// `[(name, dtype, [dims])]` (the forward's, then `dout`, `out`, `lse`).
    #[pyo3(signature = (target = "cpu"))]
    fn grad_params(&self, target: &str) -> PyResult<Vec<(String, String, Vec<String>)>> {
        let p = self.inner.saved_gradient(parse_target(target)?, &Specialization::default())?;
        Ok(p.graph
            .params
            .iter()
            .map(|p| (p.name.clone(), p.stored().name().to_string(), dims_text(&p.ty)))
            .collect())
    }

    /// GPU plan of a gradient program for tensors of these dtypes and shapes on GPU `device`:
    /// `saved=True` the saved-forward one (the torch op's backward), whose tensors are the
    /// forward's, `dout`, `out` (f32) and `lse`; `saved=False` the one that recomputes the
    /// forward (the backward of a program whose output is not an attention's own), whose tensors
    /// are the forward's and `dout`, and which writes `out` and `grad_<param>`.
    #[pyo3(signature = (metas, device, saved = true))]
    fn cuda_grad_plan(
        &self,
        py: Python<'_>,
        metas: BTreeMap<String, (String, Vec<usize>)>,
        device: usize,
        saved: bool,
    ) -> PyResult<crate::gpu::GpuPlan> {
        crate::gpu::grad_plan(py, &self.inner, metas, device, crate::grad::kind_of(saved))
    }

    /// Whether the program's output is a fused attention's own (or its cast): then the torch
    /// op returns its row log-sum-exp and its backward reads the saved forward; otherwise (an
    /// epilogue, a layout copy) the torch path runs the program as it is and differentiates it
    /// by recomputing the forward.
    #[getter]
    fn output_is_attention(&self) -> PyResult<bool> {
        let g = self.inner.optimized_for(Target::Cpu, &Specialization::default())?;
        Ok(foxc_passes::grad::forward_for_saved(&g).is_ok())
    }

    /// GPU plan for tensors of these dtypes and shapes on GPU `device` (see `GpuPlan`);
    /// `train=True`: the forward that also writes `out_f32` (see `forward_cpu`).
    #[pyo3(signature = (metas, device, train = false))]
    fn cuda_plan(
        &self,
        py: Python<'_>,
        metas: BTreeMap<String, (String, Vec<usize>)>,
        device: usize,
        train: bool,
    ) -> PyResult<crate::gpu::GpuPlan> {
        crate::gpu::plan(py, &self.inner, metas, device, train)
    }

    fn __repr__(&self) -> String {
        let o = &self.inner.opts;
        format!(
            "<foxc program {} ({}) prune={} log_eps={} rule={:?}>",
            self.inner.graph.name, self.inner.name, o.prune, o.log_eps, o.rule
        )
    }
}
