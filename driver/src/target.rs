//! The code generation target: one type from the front ends (`--target`, the device present,
//! Python's `target=`) through the passes (which pick tiles by it) to code generation.
//!
//! The type is the passes' own ([`foxc_passes::Target`]): the passes must know it and sit below
//! this crate. Its spellings and its NVPTX architecture are defined here, once.

use foxc_codegen::nvptx::NvptxTarget;
pub use foxc_passes::Target;

/// Every target with the name the CLI and Python spell it with.
pub const TARGETS: [(Target, &str); 3] =
    [(Target::Cpu, "cpu"), (Target::Sm90a, "sm_90a"), (Target::Sm80, "sm_80")];

/// The GPU target when no device says otherwise (what `--emit ptx` compiles for by default).
pub const DEFAULT_GPU: Target = Target::Sm90a;

/// `cpu`, `sm_90a` or `sm_80`.
pub fn name(t: Target) -> &'static str {
    TARGETS.iter().find(|(x, _)| *x == t).map_or("?", |(_, n)| n)
}

/// The target named `s` (see [`TARGETS`]).
pub fn parse(s: &str) -> Option<Target> {
    TARGETS.iter().find(|(_, n)| *n == s).map(|(t, _)| *t)
}

/// The NVPTX architecture of a GPU target; `None` for the CPU.
pub fn nvptx(t: Target) -> Option<NvptxTarget> {
    match t {
        Target::Cpu => None,
        Target::Sm90a => Some(NvptxTarget::Sm90a),
        Target::Sm80 => Some(NvptxTarget::Sm80),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every target's name parses back to it, and the GPU targets are those with an NVPTX
    /// architecture (what the passes' `is_gpu` and the glue must agree on).
    #[test]
    fn names_round_trip_and_gpus_have_an_architecture() {
        for (t, n) in TARGETS {
            assert_eq!(parse(n), Some(t));
            assert_eq!(name(t), n);
            assert_eq!(nvptx(t).is_some(), t.is_gpu(), "{n}");
        }
        assert_eq!(parse("sm90a"), None);
    }
}
