//! placeholder

pub mod nvptx;
pub mod cpu;
