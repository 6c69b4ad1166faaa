//! A plan captured once as a CUDA graph and replayed with one launch per run.
//!
//! Why: a plan is several launches (a pruned FoX forward with the tight rule: the threshold's
//! two kernels and the gate scan on two lanes, then the attention), and the host submits them
//! one by one. A run that
//! starts on an idle GPU (the CLI's timed runs, a first call) waits for each submission, so a
//! plan with more launches looks slower than its kernels are (issue 11 item 3: pruned against
//! `--no-prune` where nothing is pruned). A graph is one submission; its nodes keep the plan's
//! dependencies (the lanes' fork, waits and join become edges), its memsets and its kernel
//! arguments (tensor maps included, by value), so it is valid as long as the buffers it was
//! captured on live: the [`super::Session`] owns both.

use super::{Ctx, CudaError};
use cudarc::driver::sys;

/// How a session submits its plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Submission {
    /// Every launch (and the lanes' event operations) from the host on each run.
    Launches,
    /// The plan captured on the first run, then one graph launch per run.
    Graph,
}

impl Submission {
    /// [`Submission::Graph`], or launch by launch with `FOXC_CUDA_GRAPH=0` (for A/B timings).
    /// Graph by default: the same kernels and outputs, without the host's per-launch submission
    /// in the time of each run, which made the pruned plan (more launches) slower than
    /// `--no-prune` where nothing is pruned.
    pub fn from_env() -> Submission {
        match std::env::var("FOXC_CUDA_GRAPH").as_deref() {
            Ok("0") => Submission::Launches,
            _ => Submission::Graph,
        }
    }
}

/// A captured, instantiated graph (both destroyed on drop).
pub(super) struct PlanGraph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}

impl PlanGraph {
    /// Captures what `enqueue` puts on `stream` (and on streams that wait for it) into a graph.
    /// `enqueue` must not create streams or events, nor synchronize: make them before.
    pub(super) fn capture(
        stream: sys::CUstream,
        enqueue: impl FnOnce() -> Result<(), CudaError>,
    ) -> Result<PlanGraph, CudaError> {
        // Relaxed: other threads' unrelated driver calls stay legal during the capture.
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: a live stream owned by the caller, not capturing yet.
        unsafe { sys::cuStreamBeginCapture_v2(stream, mode) }
            .result()
            .ctx(|| "starting the capture of the plan".into())?;
        let queued = enqueue();
        let mut graph = std::ptr::null_mut();
        // SAFETY: ends the capture begun above, also after a failed enqueue (which leaves the
        // capture invalidated: the end then fails too and no graph is returned).
        let ended = unsafe { sys::cuStreamEndCapture(stream, &mut graph) }.result();
        queued?;
        ended.ctx(|| "ending the capture of the plan".into())?;
        let mut exec = std::ptr::null_mut();
        // SAFETY: graph is the graph just captured.
        if let Err(e) = unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) }.result() {
            // SAFETY: destroyed once; its instantiation failed.
            let _ = unsafe { sys::cuGraphDestroy(graph) };
            return Err(e).ctx(|| "instantiating the plan's CUDA graph".into());
        }
        Ok(PlanGraph { graph, exec })
    }

    /// One run of the plan on `stream`.
    pub(super) fn launch(&self, stream: sys::CUstream) -> Result<(), CudaError> {
        // SAFETY: an instantiated graph whose buffers its owner keeps alive.
        unsafe { sys::cuGraphLaunch(self.exec, stream) }
            .result()
            .ctx(|| "launching the plan's CUDA graph".into())
    }
}

impl Drop for PlanGraph {
    fn drop(&mut self) {
        // SAFETY: created by `capture` and destroyed once; errors at teardown are ignored.
        unsafe {
            let _ = sys::cuGraphExecDestroy(self.exec);
            let _ = sys::cuGraphDestroy(self.graph);
        }
    }
}
