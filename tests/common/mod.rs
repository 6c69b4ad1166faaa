//! What the end-to-end tests of the `foxc` binary share: running it and reading what it said.
#![allow(dead_code)] // each test crate uses its own subset

use std::path::PathBuf;
use std::process::{Command, Output};

/// `foxc ARGS` from the repository root (so `examples/...` paths resolve).
pub fn foxc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_foxc"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("foxc runs")
}

/// Standard output then standard error, as text.
pub fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// A path named `name` in a scratch folder of this test process (`tag` keeps test crates apart).
pub fn tmp(tag: &str, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("foxc-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// `foxc inputs EXAMPLE --shape SHAPE -o PATH`, which must succeed (seeded random inputs).
pub fn write_inputs(example: &str, shape: &str, path: &std::path::Path) {
    let o = foxc(&["inputs", example, "--shape", shape, "-o", path.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
}

/// `foxc mask EXAMPLE --inputs INPUT --png PNG EXTRA...`: the pruning map of `example` on
/// `input`, drawn to `png`.
pub fn mask_png(example: &str, input: &std::path::Path, png: &std::path::Path, extra: &[&str]) -> Output {
    let mut args = vec!["mask", example, "--inputs", input.to_str().unwrap(), "--png", png.to_str().unwrap()];
    args.extend_from_slice(extra);
    foxc(&args)
}

/// Whether a CUDA GPU is here. Without one, the calling GPU test reports itself skipped: on
/// stderr, and as a line of `$FOXC_SKIP_LOG` when set (scripts/test.sh counts and prints them,
/// since cargo hides a passing test's output).
pub fn gpu_or_skip(test: &str) -> bool {
    if foxc_runtime::cuda::driver_present() && foxc_driver::cuda_backend::device_info(0).is_ok() {
        return true;
    }
    let line = format!("SKIPPED {test}: no CUDA GPU here");
    eprintln!("{line}");
    if let Some(path) = std::env::var_os("FOXC_SKIP_LOG") {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = writeln!(f, "{line}");
        }
    }
    false
}

/// Write program `src` to a fresh temporary file (under `tag`) and return its path.
pub fn write_program(tag: &str, name: &str, src: &str) -> String {
    let p = tmp(tag, name);
    std::fs::write(&p, src).unwrap();
    p.to_str().unwrap().to_string()
}

/// Run the CLI: its exit code and its stdout and stderr together.
pub fn run_cli(args: &[&str]) -> (Option<i32>, String) {
    let o = foxc(args);
    (o.status.code(), text(&o))
}

/// `foxc check FILE` must refuse the program (exit 1): its diagnostics.
pub fn refused_at_check(file: &str) -> String {
    let (code, t) = run_cli(&["check", file]);
    assert_eq!(code, Some(1), "{file}: {t}");
    t
}

/// A fresh input seed (printed, so that a failure can be replayed), as a CLI argument.
pub fn fresh_seed() -> String {
    let s =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos() % 100_000;
    println!("seed {s}");
    s.to_string()
}

/// `foxc CMD FILE --backend cpu --check --shape SHAPE --seed SEED`, with `--no-prune` unless
/// `prune`: asserts exit 0 and `check: ok`, returns the output.
pub fn cpu_check(cmd: &str, file: &str, shape: &str, seed: &str, prune: bool) -> String {
    let mut args = vec![cmd, file, "--backend", "cpu", "--check", "--shape", shape, "--seed", seed];
    if !prune {
        args.push("--no-prune");
    }
    let (code, t) = run_cli(&args);
    assert_eq!(code, Some(0), "{cmd} {shape} prune={prune}: {t}");
    assert!(t.contains("check: ok"), "{cmd} {shape} prune={prune}: {t}");
    t
}

/// `foxc compile FILE --emit ptx` for sm_90a (D = 128) and sm_80 (D = 64): each must emit a pruned
/// attention kernel (`_prune` in its name) that ptxas assembles where it is found (always in CI).
pub fn pruned_ptx_assembles(file: &str) {
    use foxc_codegen::nvptx::ptxas;
    for (target, shape) in [("sm_90a", "D=128"), ("sm_80", "D=64")] {
        let (code, ptx) = run_cli(&["compile", file, "--emit", "ptx", "--target", target, "--shape", shape]);
        assert_eq!(code, Some(0), "{file} {target}: {ptx}");
        assert!(ptx.contains("_prune"), "{file} {target}: no pruned kernel");
        if let Some(p) = ptxas::find() {
            ptxas::assemble(&p, &ptx, target).unwrap_or_else(|log| panic!("{file} {target}: ptxas: {log}"));
        }
    }
}
