//! foxc-codegen: the backends. [`cpu`] emits Cranelift machine code (JIT) for the fused ops;
//! [`nvptx`] emits LLVM IR through inkwell and PTX through LLVM's NVPTX target. Both obey the
//! IR's attributes (tiles, rule, threshold); neither depends on the runtime that runs them.

pub mod capture_index;
pub mod cpu;
pub mod loop_plan;
pub mod nvptx;
