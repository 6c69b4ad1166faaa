//! foxc-driver: the one library both front ends (the `foxc` CLI and the Python extension) call.
//!
//! It owns the pipeline above the compiler crates: source -> checked graph ([`pipeline`]) ->
//! optimized graph (pass options from [`options`], one [`Target`]) -> a [`Backend`] (CPU,
//! CUDA, the f64 reference) that compiles, plans and runs it -> the comparison with the
//! reference ([`check`]). Option types are plain Rust: the CLI maps its flags onto them, the
//! Python extension its keyword arguments, and every default is defined here once.
//!
//! Layering: this crate sits above `foxc-ir`, `foxc-passes`, `foxc-codegen` and `foxc-runtime`;
//! none of them depends on it. The backend glue modules connect a backend's compiled artifact
//! to the runtime that runs it (the runtime never links LLVM).
//!
//! One caller goes around the [`Backend`] trait on purpose: the Python extension's GPU path.
//! The trait runs host tensors on memory and a stream it owns; torch tensors live in torch's
//! allocator and run on torch's current stream, with no copy and no synchronization. So the
//! extension takes the CUDA glue's two steps for callers that own memory and stream,
//! [`cuda_backend::load_external_outputs`] (compile and load) and [`cuda_backend::plan`]
//! (buffers and launches at the bound sizes), and launches them itself. It compiles and plans
//! exactly what the trait's CUDA backend runs.

pub mod acp_stats;
pub mod backend;
pub mod check;
pub mod error;
pub mod grad;
pub mod options;
pub mod pipeline;
pub mod starts_check;
pub mod support;
pub mod target;
pub mod tensors;
pub mod timing;
pub mod validate;
pub mod workload;

pub use backend::{backend, Backend, BackendKind, RunOptions, RunResult, Timing};
// The glue modules by their long-standing names (the CLI and the Python extension use them).
pub use backend::{cpu as cpu_backend, cuda as cuda_backend};
pub use error::{Error, ErrorKind};
pub use options::{PruneOptions, DEFAULT_LOG_EPS, DEFAULT_PRUNE_RULE};
pub use target::Target;
