//! foxc: a compiler for decay-gated softmax attention with Adaptive Computation Pruning.
//!
//! This crate is the command line: clap parsing ([`cli`]), the flags mapped onto the driver's
//! options, one function per command ([`commands`]) and the printing. Everything a command
//! does besides parsing and printing is [`foxc_driver`]'s (pipeline, backends, `--check`); the
//! stages below it are [`foxc_ir`], [`foxc_passes`], [`foxc_codegen`] and [`foxc_runtime`].

pub mod cli;
pub mod commands;

pub use foxc_driver as driver;
pub use foxc_driver::{Error, ErrorKind};
