//! placeholder

pub mod nvptx;
