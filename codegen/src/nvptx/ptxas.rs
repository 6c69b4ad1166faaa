//! NVIDIA's `ptxas` as the check that generated PTX is valid for its target: the tests and CI
//! assemble every kernel with it (no GPU needed). One place finds it and runs it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// `ptxas`: `$PTXAS` if set, else the copy `scripts/setup.sh` installs in the repository's
/// `.tools/` (pip's `nvidia-cuda-nvcc`). `None` when neither exists, so that a plain `cargo test`
/// may skip (callers print that they did); but under `FOXC_REQUIRE_PTXAS=1` (set by
/// scripts/test.sh, so CI) a missing ptxas panics: a skipped assembly check there would pass
/// untested PTX.
pub fn find() -> Option<PathBuf> {
    let repo_copy = concat!(env!("CARGO_MANIFEST_DIR"), "/../.tools/nvcc/nvidia/cu13/bin/ptxas");
    let found = [std::env::var_os("PTXAS").map(PathBuf::from), Some(PathBuf::from(repo_copy))]
        .into_iter()
        .flatten()
        .find(|p| p.is_file());
    if found.is_none() && std::env::var_os("FOXC_REQUIRE_PTXAS").is_some_and(|v| v == "1") {
        panic!(
            "FOXC_REQUIRE_PTXAS=1 but no ptxas at $PTXAS ({:?}) or {repo_copy}",
            std::env::var_os("PTXAS")
        );
    }
    found
}

/// Assembles `ptx` for `arch` (e.g. `sm_90a`) with `ptxas -v`. `Ok(report)`: ptxas' report
/// (registers, shared memory, spills per kernel); `Err(report)` when it rejects the PTX.
pub fn assemble(ptxas: &Path, ptx: &str, arch: &str) -> Result<String, String> {
    // A file per call: tests assemble in parallel threads and processes.
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("foxc_ptxas_{}_{n}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let src = dir.join("k.ptx");
    std::fs::write(&src, ptx).map_err(|e| format!("{}: {e}", src.display()))?;
    let out = Command::new(ptxas)
        .arg(format!("-arch={arch}"))
        .arg("-v")
        .arg(&src)
        .arg("-o")
        .arg(dir.join("k.cubin"))
        .output()
        .map_err(|e| format!("{} does not run: {e}", ptxas.display()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = out?;
    let report = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.success() {
        Ok(report)
    } else {
        Err(report)
    }
}

/// Bytes of spill stores over all kernels of a [`assemble`] report.
pub fn spill_stores(report: &str) -> u32 {
    report
        .lines()
        .filter_map(|l| l.find(" bytes spill stores").map(|at| &l[..at]))
        .filter_map(|head| head.rsplit(|c: char| !c.is_ascii_digit()).next()?.parse::<u32>().ok())
        .sum()
}

/// The registers of each kernel of an [`assemble`] report, `(entry name, registers)` in order.
/// A block's threads share 65536 of them, or its launch fails with "too many resources
/// requested" (seen: 72 registers at 1024 threads).
pub fn registers(report: &str) -> Vec<(String, u32)> {
    let mut out = vec![];
    let mut kernel = None;
    for l in report.lines() {
        if let Some(at) = l.find("Compiling entry function '") {
            kernel = l[at + 26..].split('\'').next().map(str::to_string);
        }
        let regs = l.split("Used ").nth(1).and_then(|r| r.split(' ').next()?.parse().ok());
        if let (Some(k), Some(r)) = (&kernel, regs) {
            out.push((k.clone(), r));
            kernel = None;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn registers_by_kernel() {
        let report = "ptxas info    : Compiling entry function 'a_k' for 'sm_90a'\nptxas info    : Used 56 registers, used 1 barriers\nptxas info    : Compiling entry function 'b_k' for 'sm_90a'\nptxas info    : Used 210 registers";
        assert_eq!(super::registers(report), vec![("a_k".to_string(), 56), ("b_k".to_string(), 210)]);
        assert!(super::registers("").is_empty());
    }

    #[test]
    fn spill_stores_sums_every_kernel() {
        let report = "ptxas info    : Used 168 registers\n    32 bytes stack frame, 28 bytes spill stores, 36 bytes spill loads\n    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads";
        assert_eq!(super::spill_stores(report), 32);
        assert_eq!(super::spill_stores(""), 0);
    }

    /// Rejected PTX comes back as `Err` with ptxas' message (the check can fail).
    #[test]
    fn bad_ptx_is_an_error() {
        let Some(p) = super::find() else { return };
        let e = super::assemble(&p, ".version 8.0\n.target sm_90a\nthis is not ptx", "sm_90a").unwrap_err();
        assert!(!e.is_empty());
    }
}
