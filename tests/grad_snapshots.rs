//! The gradient program of every example (`foxc compile --emit grad`, the pipeline's real
//! output: the optimized forward, the gradient pass, the gradient program's own steps) for the
//! CPU and for sm_90a, one snapshot per example. Refused examples snapshot their message.

use std::path::Path;
use std::process::Command;

fn emit_grad(file: &Path, target: &str) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_foxc"))
        .args(["compile", "--emit", "grad", "--target", target])
        .arg(file)
        .output()
        .unwrap();
    let text = if o.status.success() { o.stdout } else { o.stderr };
    String::from_utf8(text).unwrap()
}

#[test]
fn gradient_program_of_every_example() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files: Vec<_> = std::fs::read_dir(root.join("examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "attn"))
        .collect();
    files.sort();
    assert!(files.len() > 10, "the examples are found");
    for f in files {
        let name = f.file_stem().unwrap().to_string_lossy().into_owned();
        let rel = f.strip_prefix(root).unwrap();
        let mut text = String::new();
        for target in ["cpu", "sm_90a"] {
            text.push_str(&format!("// ---- foxc compile --emit grad --target {target} {}\n", rel.display()));
            text.push_str(&emit_grad(rel, target));
        }
        insta::assert_snapshot!(format!("grad_{name}"), text);
    }
}
