//! Outputs are written whole or not at all (issue 26, item 5): a write cut short (here by a file
//! size limit, as a full disk would) leaves an existing output as it was and no temporary file.

mod common;

use common::{text, tmp, write_inputs};
use std::process::Command;

/// `foxc ARGS` under a file size limit of 64 KiB, with SIGXFSZ ignored so that the cut write is
/// an error (EFBIG) the process sees, as ENOSPC on a full disk.
fn foxc_with_small_disk(args: &[&str]) -> std::process::Output {
    let bin = env!("CARGO_BIN_EXE_foxc");
    Command::new("bash")
        .arg("-c")
        .arg(r#"trap '' XFSZ; ulimit -f 64; exec "$@""#)
        .arg("bash")
        .arg(bin)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("bash runs")
}

fn leftovers(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect()
}

#[test]
fn a_cut_write_leaves_the_existing_output_whole() {
    let out = tmp("atomic", "out.safetensors");
    write_inputs("examples/fox.attn", "B=1,H=1,T=16,D=16", &out);
    let before = std::fs::read(&out).unwrap();
    // About 400 KB of tensors: more than the limit allows.
    let o = foxc_with_small_disk(&[
        "inputs",
        "examples/fox.attn",
        "--shape",
        "B=1,H=2,T=512,D=64",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("cannot write"), "{}", text(&o));
    assert!(std::fs::read(&out).unwrap() == before, "the existing output changed");
    assert_eq!(leftovers(out.parent().unwrap()), Vec::<String>::new());

    let ptx = tmp("atomic", "fox.ptx");
    std::fs::write(&ptx, "previous").unwrap();
    let o = foxc_with_small_disk(&[
        "compile",
        "examples/fox.attn",
        "--emit",
        "clif",
        "--shape",
        "B=1,H=2,T=512,D=64",
        "-o",
        ptx.to_str().unwrap(),
    ]);
    // CLIF of the fused kernels is far above 64 KiB.
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert_eq!(std::fs::read_to_string(&ptx).unwrap(), "previous");
    assert_eq!(leftovers(ptx.parent().unwrap()), Vec::<String>::new());

    // A write that succeeds leaves the mode `File::create` would (not the 0600 of a temporary).
    let o = common::foxc(&["compile", "examples/fox.attn", "--emit", "ir", "-o", ptx.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let fresh = tmp("atomic", "fresh.ir");
        let o =
            common::foxc(&["compile", "examples/fox.attn", "--emit", "ir", "-o", fresh.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        let mode = std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o777;
        assert!(mode & 0o044 != 0 || mode == 0o600 && umask_is_077(), "mode {mode:o}");
    }
}

/// Whether this process's umask hides files from group and others (then 0600 is right).
#[cfg(unix)]
fn umask_is_077() -> bool {
    let probe = tmp("atomic", "probe");
    std::fs::write(&probe, "").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(&probe).unwrap().permissions().mode() & 0o077 == 0
}
