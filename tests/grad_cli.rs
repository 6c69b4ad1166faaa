//! `foxc grad` and `foxc compile --emit grad` end to end.

use std::path::PathBuf;
mod common;
use common::{foxc, text};

fn tmp(name: &str) -> PathBuf {
    common::tmp("grad-cli", name)
}

#[test]
fn grad_writes_out_and_every_float_parameter_gradient_in_its_dtype() {
    let o = tmp("fox_grads.safetensors");
    let r = foxc(&[
        "grad",
        "examples/fox_qknorm.attn",
        "--backend",
        "reference",
        "--shape",
        "B=1,H=2,T=40,D=8",
        "-o",
        o.to_str().unwrap(),
        "--check",
    ]);
    assert!(r.status.success(), "{}", text(&r));
    assert!(text(&r).contains("check: ok"), "{}", text(&r));
    let m = foxc_runtime::io::read_safetensors(&o).unwrap();
    let names: Vec<&str> = m.keys().map(String::as_str).collect();
    assert_eq!(names, ["grad_fgate", "grad_k", "grad_q", "grad_v", "grad_wk", "grad_wq", "out"]);
    assert_eq!(m["grad_q"].dtype, foxc_ir::DType::BF16);
    assert_eq!(m["grad_fgate"].dtype, foxc_ir::DType::F32);
    assert_eq!(m["grad_wq"].shape, vec![8]);
    // Gradients are not zero and not NaN.
    for (n, t) in &m {
        let v = t.to_f64_vec();
        assert!(v.iter().all(|x| x.is_finite()), "{n} has a non-finite value");
        assert!(v.iter().any(|&x| x != 0.0), "{n} is all zeros");
    }
}

#[test]
fn grad_is_deterministic_and_reads_dout() {
    let a = tmp("a.safetensors");
    let b = tmp("b.safetensors");
    for p in [&a, &b] {
        let r =
            foxc(&["grad", "examples/fox.attn", "--shape", "B=1,H=2,T=33,D=4", "-o", p.to_str().unwrap()]);
        assert!(r.status.success(), "{}", text(&r));
    }
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap(), "two runs differ");
    // An explicit dout of zeros gives zero gradients.
    let m = foxc_runtime::io::read_safetensors(&a).unwrap();
    let out = &m["out"];
    let mut z = foxc_runtime::TensorMap::new();
    z.insert("dout".into(), foxc_runtime::HostTensor::zeros(out.dtype, &out.shape));
    let zp = tmp("zeros.safetensors");
    foxc_runtime::io::write_safetensors(&zp, &z).unwrap();
    let g = tmp("g0.safetensors");
    let r = foxc(&[
        "grad",
        "examples/fox.attn",
        "--shape",
        "B=1,H=2,T=33,D=4",
        "--dout",
        zp.to_str().unwrap(),
        "-o",
        g.to_str().unwrap(),
    ]);
    assert!(r.status.success(), "{}", text(&r));
    let m0 = foxc_runtime::io::read_safetensors(&g).unwrap();
    assert!(m0["grad_q"].to_f64_vec().iter().all(|&x| x == 0.0));
    // A dout of the wrong shape is a user error.
    let mut bad = foxc_runtime::TensorMap::new();
    bad.insert("dout".into(), foxc_runtime::HostTensor::zeros(out.dtype, &[1, 2, 3]));
    foxc_runtime::io::write_safetensors(&zp, &bad).unwrap();
    let r =
        foxc(&["grad", "examples/fox.attn", "--shape", "B=1,H=2,T=33,D=4", "--dout", zp.to_str().unwrap()]);
    assert_eq!(r.status.code(), Some(1), "{}", text(&r));
    assert!(text(&r).contains("dout"), "{}", text(&r));
}

#[test]
fn emit_grad_prints_the_backward_program() {
    let r = foxc(&["compile", "examples/fox.attn", "--emit", "grad"]);
    assert!(r.status.success(), "{}", text(&r));
    let t = text(&r);
    assert!(t.contains("attention_backward"), "{t}");
    assert!(t.contains("param \"dout\""), "{t}");
    assert!(t.contains("// output grad_fgate"), "{t}");
}

/// `--backend cpu`: the same files as the reference (out and every gradient in its
/// parameter's dtype), checked against the interpreter, the same bytes on two runs.
#[test]
fn grad_on_the_cpu_writes_every_gradient_and_checks() {
    let mut files = vec![];
    for (i, backend) in ["cpu", "cpu", "reference"].iter().enumerate() {
        let o = tmp(&format!("cpu_{i}.safetensors"));
        let r = foxc(&[
            "grad",
            "examples/fox_qknorm.attn",
            "--backend",
            backend,
            "--shape",
            "B=1,H=2,T=70,D=8",
            "--tiles",
            "8x16",
            "-o",
            o.to_str().unwrap(),
            "--check",
        ]);
        assert!(r.status.success(), "{}", text(&r));
        assert!(text(&r).contains("check: ok"), "{}", text(&r));
        files.push(foxc_runtime::io::read_safetensors(&o).unwrap());
    }
    let (cpu, again, reference) = (&files[0], &files[1], &files[2]);
    assert_eq!(cpu.keys().collect::<Vec<_>>(), reference.keys().collect::<Vec<_>>());
    for (n, t) in cpu {
        assert_eq!((t.dtype, &t.shape), (reference[n].dtype, &reference[n].shape), "{n}");
        assert_eq!(t.data, again[n].data, "{n}: two cpu runs differ");
    }
}

/// Captures' gradients are results > 0 of the backward node: `--check` compares them with the
/// interpreter's value of that result (it read result 0, dq, once the `+ 0` copies were gone:
/// grad_ts failed at rel L2 1.0). `ts` is read only by the mask, so its gradient is 0, and the
/// key bias `kb` of fox_keybias gets a real one; the reference backend writes them too.
#[test]
fn capture_gradients_check_against_their_own_result() {
    let cases = [
        ("codegen/tests/programs/time_window.attn", "grad_ts", vec![2, 40]),
        ("examples/fox_keybias.attn", "grad_kb", vec![2, 2, 40]),
    ];
    for (prog, capture, shape) in cases {
        let mut files = vec![];
        for backend in ["cpu", "reference"] {
            let o = tmp(&format!("cap_{backend}_{capture}.safetensors"));
            let r = foxc(&[
                "grad",
                prog,
                "--backend",
                backend,
                "--shape",
                "B=2,H=2,T=40,D=8",
                "-o",
                o.to_str().unwrap(),
                "--check",
            ]);
            assert!(r.status.success() && text(&r).contains("check: ok"), "{prog} {backend}: {}", text(&r));
            files.push(foxc_runtime::io::read_safetensors(&o).unwrap());
        }
        let (cpu, reference) = (&files[0][capture], &files[1][capture]);
        assert_eq!((&cpu.shape, &reference.shape), (&shape, &shape), "{prog}");
    }
}

/// `foxc bench --grad` times the gradient program (pruned and dense) and says so.
#[test]
fn bench_grad_times_forward_plus_backward_on_the_cpu() {
    let r = foxc(&[
        "bench",
        "examples/fox.attn",
        "--backend",
        "cpu",
        "--shape",
        "B=1,H=2,T=128,D=16",
        "--iters",
        "1",
        "--grad",
        "--format",
        "csv",
    ]);
    assert!(r.status.success(), "{}", text(&r));
    let t = text(&r);
    let rows: Vec<&str> = t.lines().filter(|l| l.contains(",forward+backward,cpu,")).collect();
    assert_eq!(rows.len(), 2, "{t}");
    assert!(rows[0].contains(",pruned,") && rows[1].contains(",dense,"), "{t}");
}
