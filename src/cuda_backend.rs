//! CUDA backend glue (owned by the GPU work).
