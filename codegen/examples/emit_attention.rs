//! Prints the PTX of one attention kernel configuration (for the device loop and `ptxas -v`).
//!
//! `cargo run -p foxc-codegen --example emit_attention -- D=128 bm=64 bn=64 decay=1 prune=1 window=0 sm=90`
//! (also `obf16=1` for the bf16 epilogue, `scalebits=3e000000` for a scale given by its f32 bits in hex)

use foxc_codegen::nvptx::attention::{build_attention_kernel, AttnKernelConfig};
use inkwell::context::Context;
use inkwell::targets::{CodeModel, FileType, InitializationConfig, RelocMode, Target, TargetTriple};
use inkwell::OptimizationLevel;

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let mut cfg = AttnKernelConfig::new(128, true, true);
    let mut emit_ll = false;
    let mut scale_bits = None;
    for a in std::env::args().skip(1) {
        let (k, v) = a.split_once('=').ok_or_else(|| format!("expected key=value, got {a}"))?;
        let num = || v.parse::<u32>().map_err(|e| format!("{k}: {e}"));
        match k {
            "D" => cfg.head_dim = num()?,
            "bm" => cfg.bm = num()?,
            "bn" => cfg.bn = num()?,
            "decay" => cfg.has_decay = num()? != 0,
            "prune" => cfg.prune = num()? != 0,
            "window" => cfg.window = Some(num()?).filter(|w| *w > 0),
            "sm" => cfg.sm = num()?,
            "obf16" => cfg.out_half = num()? != 0,
            "scalebits" => scale_bits = Some(u32::from_str_radix(v, 16).map_err(|e| format!("{k}: {e}"))?),
            "ll" => emit_ll = num()? != 0,
            _ => return Err(format!("unknown key {k}")),
        }
    }
    cfg.scale = match scale_bits {
        Some(b) => f32::from_bits(b),
        None => 1.0 / (cfg.head_dim as f32).sqrt(),
    };
    let ctx = Context::create();
    let module = ctx.create_module("foxc_attention");
    let triple = TargetTriple::create("nvptx64-nvidia-cuda");
    module.set_triple(&triple);
    build_attention_kernel(&ctx, &module, &cfg)?;
    if emit_ll {
        print!("{}", module.print_to_string().to_string());
        return Ok(());
    }
    Target::initialize_nvptx(&InitializationConfig::default());
    let target = Target::from_triple(&triple).map_err(|e| e.to_string())?;
    let cpu = if cfg.sm == 90 { "sm_90a" } else { "sm_80" };
    let tm = target
        .create_target_machine(
            &triple,
            cpu,
            "+ptx80",
            OptimizationLevel::Aggressive,
            RelocMode::Default,
            CodeModel::Default,
        )
        .ok_or("cannot create the NVPTX target machine")?;
    module.set_data_layout(&tm.get_target_data().get_data_layout());
    module
        .run_passes("default<O3>", &tm, inkwell::passes::PassBuilderOptions::create())
        .map_err(|e| e.to_string())?;
    let buf = tm.write_to_memory_buffer(&module, FileType::Assembly).map_err(|e| e.to_string())?;
    print!("{}", String::from_utf8_lossy(buf.as_slice()));
    eprintln!("kernel: {}", cfg.kernel_name());
    Ok(())
}
