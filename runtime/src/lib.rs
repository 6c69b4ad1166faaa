//! foxc-runtime: host tensors and safetensors I/O, the CPU executor and a thin CUDA runtime.
//! It never links LLVM: compiled kernels arrive as data (PTX text, function pointers).

pub mod cpu;
pub mod cuda;
pub mod io;
pub mod lanes;
pub mod memory;
pub mod tensor;
pub mod tensor_map;

pub use tensor::{HostTensor, TensorMap};
