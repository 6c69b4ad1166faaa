//! NVPTX backend (LLVM IR through inkwell). Minimal module list; the backend owner (H5a) merges.

pub mod attention;
