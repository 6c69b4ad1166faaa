//! The calling convention between Cranelift-compiled CPU kernels and the runtime's executor.
//!
//! `foxc-runtime` mirrors this file (it must not depend on codegen); change both together and
//! bump [`ABI_VERSION`].
//!
//! Every kernel is
//!
//! ```text
//! extern "C" fn(args: *const u64, task_begin: u64, task_end: u64, scratch: *mut u8)
//! ```
//!
//! - `args[k]` for `k < n` is the address of operand `k` of the kernel's node (in operand order, see
//!   `Graph::operands`), a dense row-major buffer of the operand's dtype and concrete shape;
//!   `args[n]` is the address of the node's result buffer (its dtype, its shape).
//!   Buffers need no alignment beyond their element size. An operand that the compiler folded
//!   to a constant (a scalar such as `rsqrt(dim D)`) has no buffer: its slot holds 0 and the
//!   kernel never reads it.
//! - The kernel runs tasks `task_begin..task_end` of its task space ([`super::TaskSpace`]).
//!   Distinct tasks write disjoint parts of the result and read nothing that another task of the
//!   same launch writes, so any partition of `0..count` over threads gives the same bits.
//! - `scratch` is private to the calling thread, at least `scratch_bytes` long and 64-byte aligned;
//!   its contents on entry are arbitrary.
//! - All dims are compile-time constants: a program is compiled for one binding of the graph's
//!   symbolic dims.

/// Version of the convention above.
pub const ABI_VERSION: u32 = 1;

/// Alignment the executor guarantees for `scratch`.
pub const SCRATCH_ALIGN: usize = 64;

/// The Rust type of a kernel entry point.
pub type KernelFn = unsafe extern "C" fn(args: *const u64, task_begin: u64, task_end: u64, scratch: *mut u8);
