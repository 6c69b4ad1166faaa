//! One interface to every backend: the f64 reference interpreter, the CPU (Cranelift kernels on
//! the runtime's executor) and CUDA (NVPTX kernels on the CUDA runtime). A front end picks a
//! [`BackendKind`], optimizes for its [`Backend::target`], then runs, times and checks through
//! the trait, so that no front end knows which glue module a backend uses.

// Each backend's glue, from its compiled artifact to its runtime: a new backend is a module
// here, its `BackendKind` and its arm of [`backend`].
pub mod cpu;
pub mod cuda;

use crate::timing::Summary;
use crate::{check, cpu_backend, cuda_backend, tensors, Error, Target};
use foxc_ir::interp::{self, Tensor};
use foxc_ir::{DType, Graph, Value};
use foxc_runtime::TensorMap;
use std::collections::BTreeMap;
use std::time::Instant;

/// The backends, as the CLI's `--backend` names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackendKind {
    Reference,
    Cpu,
    Cuda,
}

impl BackendKind {
    /// Every backend, in the order front ends list them.
    pub const ALL: [BackendKind; 3] = [BackendKind::Reference, BackendKind::Cpu, BackendKind::Cuda];

    /// `reference`, `cpu` or `cuda`.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Reference => "reference",
            BackendKind::Cpu => "cpu",
            BackendKind::Cuda => "cuda",
        }
    }

    /// The backend named `s` (see [`Self::name`]).
    pub fn parse(s: &str) -> Option<BackendKind> {
        Self::ALL.into_iter().find(|k| k.name() == s)
    }
}

/// How a run's time was measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Timing {
    /// The wall time of the whole call (the reference interpreter).
    Wall,
    /// The compiled kernels' run, after `compile_ms` of compiling them (the CPU).
    Kernels { compile_ms: f64 },
    /// CUDA events around the launches (module load and copies excluded).
    GpuEvents,
}

/// The outputs of one run, by name, and its time.
#[derive(Clone, Debug)]
pub struct RunResult {
    pub outputs: TensorMap,
    pub ms: f64,
    pub timing: Timing,
}

/// How a run treats its buffers and results.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunOptions {
    /// The CPU poisons every buffer with NaN before its kernel runs, so that an element no
    /// kernel writes shows up (the GPU always does).
    pub poison: bool,
    /// Accept NaN in the GPU's outputs ([`cuda_backend::RunOptions::allow_nan`]).
    pub allow_nan: bool,
}

/// A backend. `outputs` names the values a run computes; empty means the graph's output,
/// named `out` (the program as the user wrote it, compiled whole).
pub trait Backend {
    fn kind(&self) -> BackendKind;

    /// The target the passes optimize for when this backend runs the graph.
    fn target(&self) -> Target;

    /// Compile `g` (optimized for [`Backend::target`]) for the shapes of `inputs`, run it and
    /// return the outputs.
    fn run(
        &self,
        g: &Graph,
        outputs: &[(String, Value)],
        inputs: &TensorMap,
        opts: RunOptions,
    ) -> Result<RunResult, Error>;

    /// The median and minimum of `iters` timed runs (compilation and warm-up excluded).
    fn bench(
        &self,
        _g: &Graph,
        _outputs: &[(String, Value)],
        _inputs: &TensorMap,
        _iters: usize,
    ) -> Result<Summary, Error> {
        Err(Error::user("error: foxc bench times compiled code: use --backend cpu or cuda"))
    }

    /// The block starts (`[B, H, Mt]`) this backend's kernels prune with on `inputs`, when it
    /// reports them; `None`: the reference's stand in.
    fn block_starts(&self, _g: &Graph, _inputs: &TensorMap) -> Result<Option<Tensor>, Error> {
        Ok(None)
    }

    /// The relative L2 tolerance of `--check` for an output of `dtype` of the optimized `g`.
    fn check_tolerance(
        &self,
        _g: &Graph,
        _inputs: &BTreeMap<String, Tensor>,
        dtype: DType,
    ) -> Result<f64, Error> {
        Ok(check::tolerance(self.kind().name(), dtype))
    }
}

/// The backend of `kind`.
pub fn backend(kind: BackendKind) -> Box<dyn Backend> {
    match kind {
        BackendKind::Reference => Box::new(Reference),
        BackendKind::Cpu => Box::new(Cpu),
        BackendKind::Cuda => Box::new(Cuda),
    }
}

/// The f64 interpreter running the optimized graph (pruned as the passes decided).
pub struct Reference;

impl Backend for Reference {
    fn kind(&self) -> BackendKind {
        BackendKind::Reference
    }

    /// The CPU's graph: the interpreter follows what the CPU passes decided.
    fn target(&self) -> Target {
        Target::Cpu
    }

    fn run(
        &self,
        g: &Graph,
        outputs: &[(String, Value)],
        inputs: &TensorMap,
        _opts: RunOptions,
    ) -> Result<RunResult, Error> {
        let t0 = Instant::now();
        crate::validate::check_positions_of(g, inputs).map_err(|e| Error::user(format!("error: {e}")))?;
        let x = tensors::to_interp(inputs);
        let err = |e: interp::InterpError| Error::user(format!("error: reference interpreter: {e}"));
        let mut out = TensorMap::new();
        if outputs.is_empty() {
            let r = interp::run(g, &x).map_err(err)?;
            let dtype = g.output.map(|o| g.ty(o).dtype).unwrap_or(DType::F32);
            out.insert("out".to_string(), tensors::from_interp(&r.output, dtype));
        } else {
            // By value: an output may be a result > 0 of its node (a capture's gradient is one).
            let targets: Vec<Value> = outputs.iter().map(|(_, v)| *v).collect();
            let vals = interp::eval_values(g, &x, &targets).map_err(err)?;
            for (name, v) in outputs {
                let t = vals
                    .get(v)
                    .ok_or_else(|| Error::internal(format!("error: output {name} was not computed")))?;
                out.insert(name.clone(), tensors::from_interp(t, g.value_ty(*v).dtype));
            }
        }
        Ok(RunResult { outputs: out, ms: t0.elapsed().as_secs_f64() * 1e3, timing: Timing::Wall })
    }

    fn check_tolerance(
        &self,
        g: &Graph,
        inputs: &BTreeMap<String, Tensor>,
        dtype: DType,
    ) -> Result<f64, Error> {
        check::reference_tolerance(g, inputs, dtype)
    }
}

/// Cranelift kernels on all cores.
pub struct Cpu;

impl Backend for Cpu {
    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }

    fn target(&self) -> Target {
        Target::Cpu
    }

    fn run(
        &self,
        g: &Graph,
        outputs: &[(String, Value)],
        inputs: &TensorMap,
        opts: RunOptions,
    ) -> Result<RunResult, Error> {
        let exec = foxc_runtime::cpu::ExecOptions {
            threads: foxc_runtime::cpu::default_threads(),
            poison: opts.poison,
        };
        let r = if outputs.is_empty() {
            let r = cpu_backend::run_with(g, inputs, exec)?;
            cpu_backend::CpuRuns {
                outputs: TensorMap::from([("out".to_string(), r.out)]),
                compile_ms: r.compile_ms,
                run_ms: r.run_ms,
            }
        } else {
            cpu_backend::run_outputs_timed(g, outputs, inputs, exec)?
        };
        Ok(RunResult {
            outputs: r.outputs,
            ms: r.run_ms,
            timing: Timing::Kernels { compile_ms: r.compile_ms },
        })
    }

    fn bench(
        &self,
        g: &Graph,
        outputs: &[(String, Value)],
        inputs: &TensorMap,
        iters: usize,
    ) -> Result<Summary, Error> {
        if outputs.is_empty() {
            cpu_backend::bench(g, inputs, iters)
        } else {
            cpu_backend::bench_outputs(g, outputs, inputs, iters)
        }
    }

    fn block_starts(&self, g: &Graph, inputs: &TensorMap) -> Result<Option<Tensor>, Error> {
        cpu_backend::block_starts(g, inputs)
    }
}

/// NVPTX kernels on GPU 0.
pub struct Cuda;

/// Untimed runs before the GPU's timed ones (besides the warm-up time).
const GPU_WARMUP_RUNS: usize = 10;

impl Backend for Cuda {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    /// The GPU present's target, so that the passes pick the tiles of the kernels it runs.
    fn target(&self) -> Target {
        cuda_backend::device_target()
    }

    fn run(
        &self,
        g: &Graph,
        outputs: &[(String, Value)],
        inputs: &TensorMap,
        opts: RunOptions,
    ) -> Result<RunResult, Error> {
        let opts = cuda_backend::RunOptions { allow_nan: opts.allow_nan };
        let (outputs, kernel_ms) = cuda_backend::run_timed(g, outputs, inputs, opts)?;
        Ok(RunResult { outputs, ms: kernel_ms, timing: Timing::GpuEvents })
    }

    fn bench(
        &self,
        g: &Graph,
        outputs: &[(String, Value)],
        inputs: &TensorMap,
        iters: usize,
    ) -> Result<Summary, Error> {
        if outputs.is_empty() {
            cuda_backend::bench(g, inputs, GPU_WARMUP_RUNS, iters)
        } else {
            let opts = cuda_backend::RunOptions::default();
            cuda_backend::bench_outputs(g, outputs, inputs, opts, GPU_WARMUP_RUNS, iters)
        }
    }
}

#[cfg(test)]
mod kind_tests {
    use super::*;

    /// Every backend's name parses back to it (the CLI's `--backend` values are these names).
    #[test]
    fn names_round_trip() {
        for k in BackendKind::ALL {
            assert_eq!(BackendKind::parse(k.name()), Some(k));
        }
        assert_eq!(BackendKind::parse("gpu"), None);
    }
}
