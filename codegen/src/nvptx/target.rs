//! The NVPTX target: LLVM target machine setup, the optimization pipeline and PTX emission.

use inkwell::module::Module;
use inkwell::passes::PassBuilderOptions;
use inkwell::targets::{
    CodeModel, FileType, InitializationConfig, RelocMode, Target, TargetMachine, TargetTriple,
};
use inkwell::OptimizationLevel;
use std::sync::Once;

/// The GPU architectures foxc emits PTX for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NvptxTarget {
    /// Hopper with the architecture-specific features (H100, H200).
    Sm90a,
    /// Ampere (A100); the same kernels use only sm_80 instructions.
    Sm80,
}

impl NvptxTarget {
    /// Parses the `--target` spelling (`sm_90a`, `sm_80`).
    pub fn parse(s: &str) -> Option<NvptxTarget> {
        match s {
            "sm_90a" => Some(NvptxTarget::Sm90a),
            "sm_80" => Some(NvptxTarget::Sm80),
            _ => None,
        }
    }

    /// The LLVM CPU name, also the PTX `.target`.
    pub fn cpu(self) -> &'static str {
        match self {
            NvptxTarget::Sm90a => "sm_90a",
            NvptxTarget::Sm80 => "sm_80",
        }
    }

    /// The compute capability major*10 + minor.
    pub fn sm(self) -> u32 {
        match self {
            NvptxTarget::Sm90a => 90,
            NvptxTarget::Sm80 => 80,
        }
    }
}

pub const TRIPLE: &str = "nvptx64-nvidia-cuda";
/// PTX ISA 8.0: the oldest that knows sm_90a, and what the H200's driver (CUDA 13) loads (seen).
pub const FEATURES: &str = "+ptx80";

static INIT: Once = Once::new();

/// A target machine for `t`.
pub fn target_machine(t: NvptxTarget) -> Result<TargetMachine, String> {
    INIT.call_once(|| Target::initialize_nvptx(&InitializationConfig::default()));
    let triple = TargetTriple::create(TRIPLE);
    let target = Target::from_triple(&triple).map_err(|e| format!("NVPTX target: {e}"))?;
    target
        .create_target_machine(
            &triple,
            t.cpu(),
            FEATURES,
            OptimizationLevel::Aggressive,
            RelocMode::Default,
            CodeModel::Default,
        )
        .ok_or_else(|| format!("LLVM could not create an NVPTX target machine for {}", t.cpu()))
}

/// Sets the module's triple and data layout for `tm` (before any code is built into it).
pub fn prepare_module(module: &Module<'_>, tm: &TargetMachine) {
    module.set_triple(&TargetTriple::create(TRIPLE));
    module.set_data_layout(&tm.get_target_data().get_data_layout());
}

/// Verifies, optimizes (O3) and lowers `module`; returns (optimized LLVM IR, PTX).
pub fn finish(module: &Module<'_>, tm: &TargetMachine) -> Result<(String, String), String> {
    module.verify().map_err(|e| format!("invalid LLVM IR: {}", e.to_string()))?;
    module
        .run_passes("default<O3>", tm, PassBuilderOptions::create())
        .map_err(|e| format!("LLVM optimization: {}", e.to_string()))?;
    let ir = module.print_to_string().to_string();
    let buf = tm
        .write_to_memory_buffer(module, FileType::Assembly)
        .map_err(|e| format!("PTX emission: {}", e.to_string()))?;
    let ptx = String::from_utf8(buf.as_slice().to_vec()).map_err(|_| "PTX is not UTF-8".to_string())?;
    // A call to a name LLVM does not know as an intrinsic becomes an undefined external
    // function, which ptxas and the driver reject much later with a less useful message.
    if let Some(pos) = ptx.find(".extern .func") {
        let line = ptx[pos..].lines().next().unwrap_or_default();
        return Err(format!("the PTX calls an undefined function ({line}): an intrinsic unknown to LLVM 22"));
    }
    Ok((ir, ptx))
}
