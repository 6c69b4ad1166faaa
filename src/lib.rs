//! foxc: a compiler for decay-gated softmax attention with Adaptive Computation Pruning.
//!
//! This crate is the public facade and the CLI. The stages live in their own crates:
//! [`foxc_ir`] (front end, graph IR, reference interpreter), [`foxc_passes`] (recognition and
//! ACP insertion), [`foxc_codegen`] (Cranelift and NVPTX backends) and [`foxc_runtime`]
//! (tensors, CPU executor, CUDA runtime). The backend glue modules below connect a backend's
//! compiled artifact to the runtime that runs it (the runtime never links LLVM).

pub mod acp_stats;
pub mod check;
pub mod cli;
pub mod commands;
pub mod cpu_backend;
pub mod cuda_backend;
pub mod error;
pub mod pipeline;
pub mod starts_check;
pub mod tensors;
pub mod timing;

pub use error::{Error, ErrorKind};
