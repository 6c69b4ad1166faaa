//! CPU backend glue (owned by the CPU backend work).
