//! End-to-end tests of the `foxc` binary: the CLI contract of DESIGN.md section 4.

use std::path::{Path, PathBuf};
mod common;
use common::{foxc, mask_png, text, write_inputs};
use std::process::Command;

fn tmp(name: &str) -> PathBuf {
    common::tmp("cli", name)
}

fn examples() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "attn"))
        .collect();
    v.sort();
    v
}

#[test]
fn every_example_checks_and_prints_ir() {
    for ex in examples() {
        let p = ex.to_str().unwrap();
        let o = foxc(&["check", p]);
        assert!(o.status.success(), "{p}: {}", text(&o));
        let o = foxc(&["compile", p, "--emit", "ir"]);
        assert!(o.status.success(), "{p}: {}", text(&o));
        assert!(text(&o).contains("graph @"), "{p}: {}", text(&o));
        let o = foxc(&["compile", p, "--emit", "opt"]);
        assert!(o.status.success(), "{p}: {}", text(&o));
    }
}

#[test]
fn fox_inputs_then_reference_run_with_check() {
    let input = tmp("in.safetensors");
    let out = tmp("out.safetensors");
    write_inputs("examples/fox.attn", "B=1,H=2,T=64,D=16", &input);
    let o = foxc(&[
        "run",
        "examples/fox.attn",
        "--backend",
        "reference",
        "--inputs",
        input.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--check",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("check: ok"), "{}", text(&o));
    let bytes = std::fs::read(&out).unwrap();
    assert!(bytes.len() > 2 * 64 * 16 * 2, "output file too small");
}

#[test]
fn fox_runs_on_the_cpu_backend_and_checks() {
    for extra in [&[][..], &["--no-prune"][..], &["--prune-rule", "tight"][..]] {
        let mut args =
            vec!["run", "examples/fox.attn", "--backend", "cpu", "--shape", "B=1,H=3,T=200,D=32", "--check"];
        args.extend_from_slice(extra);
        let o = foxc(&args);
        assert!(o.status.success(), "{extra:?}: {}", text(&o));
        assert!(text(&o).contains("check: ok"), "{}", text(&o));
    }
}

#[test]
fn user_errors_exit_1_with_a_message() {
    let bad = tmp("bad.attn");
    std::fs::write(
        &bad,
        "attention f(q: bf16[T, D]) -> bf16[T, D] {\n  out[i, d] = q[i, d] + nope[i]\n  return out\n}\n",
    )
    .unwrap();
    let o = foxc(&["check", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("bad.attn:2:"), "diagnostic is positioned: {}", text(&o));

    let o = foxc(&["check", "does/not/exist.attn"]);
    assert_eq!(o.status.code(), Some(1));

    let o = foxc(&["run", "examples/fox.attn", "--backend", "cpu", "--shape", "B=1,H=2,T=x,D=16"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));

    let o = foxc(&["run", "examples/fox.attn", "--backend", "cpu", "--shape", "B=1,H=2,T=8"]);
    assert_eq!(o.status.code(), Some(1), "missing D: {}", text(&o));
    assert!(text(&o).contains('D'), "{}", text(&o));
}

#[test]
fn mismatched_inputs_are_rejected_before_any_work() {
    let input = tmp("mismatch.safetensors");
    write_inputs("examples/causal.attn", "B=1,H=2,T=16,D=8", &input);
    // fox.attn also needs `fgate`: the file lacks it.
    let o = foxc(&["run", "examples/fox.attn", "--backend", "cpu", "--inputs", input.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("fgate"), "names the missing tensor: {}", text(&o));
}

#[test]
fn cuda_backend_without_a_gpu_is_a_clean_user_error() {
    if std::path::Path::new("/dev/nvidia0").exists() {
        return; // a machine with a GPU runs the real thing elsewhere
    }
    let o = foxc(&["run", "examples/fox.attn", "--backend", "cuda", "--shape", "B=1,H=2,T=64,D=64"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(!text(&o).contains("panicked"), "{}", text(&o));
}

#[test]
fn mask_png_is_written() {
    let input = tmp("mask-in.safetensors");
    let png = tmp("mask.png");
    write_inputs("examples/fox.attn", "B=1,H=4,T=1024,D=16", &input);
    let o = mask_png("examples/fox.attn", &input, &png, &[]);
    assert!(o.status.success(), "{}", text(&o));
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[1..4], b"PNG");
}

#[test]
fn usage_errors_exit_1_internal_errors_exit_2() {
    // clap's own usage errors (clap would exit 2 by itself).
    for args in [
        &["run", "examples/fox.attn", "--backend", "gpu", "--shape", "B=1,H=1,T=8,D=8"][..],
        &["run", "examples/fox.attn", "--tiles", "7x7", "--shape", "B=1,H=1,T=8,D=8"][..],
        &["run", "examples/fox.attn", "--no-such-flag"][..],
        &["no-such-command"][..],
        &["compile"][..],
    ] {
        let o = foxc(args);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", text(&o));
        assert!(!text(&o).is_empty(), "{args:?} says why");
    }
    // Our own usage errors.
    let o = foxc(&["run", "examples/fox.attn", "--shape", "B=1,H=0,T=8,D=8"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let o = foxc(&["run", "examples/fox.attn", "--log-eps", "0.5", "--shape", "B=1,H=1,T=8,D=8"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    // eps = exp(-800) underflows to 0 (every --check would fail): refused with its range.
    let o = foxc(&["run", "examples/fox.attn", "--log-eps", "-800", "--shape", "B=1,H=1,T=8,D=8"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("[-708, 0)"), "{}", text(&o));
    // Inputs larger than the machine: a budget error before allocating, not an abort.
    let big = tmp("big.safetensors");
    let o = foxc(&[
        "inputs",
        "examples/fox.attn",
        "--shape",
        "B=1,H=1,T=33554432,D=64",
        "-o",
        big.to_str().unwrap(),
    ]);
    if foxc_runtime::memory::available_bytes().is_some_and(|a| a < 30 << 30) {
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        assert!(text(&o).contains("of host memory needed"), "{}", text(&o));
    } else {
        println!("SKIPPED the memory budget case: this machine has 30 GiB or more available");
    }
    // Flags that nothing on this target would read, and code for another target than named.
    for args in [
        &["run", "examples/fox.attn", "--shape", "B=1,H=1,T=64,D=16", "--ws-loads", "tma"][..],
        &["run", "examples/fox.attn", "--shape", "B=1,H=1,T=64,D=16", "--attn-kernel", "standard"][..],
        &["compile", "examples/fox.attn", "--emit", "ptx", "--target", "cpu"][..],
        &["compile", "examples/fox.attn", "--emit", "clif", "--target", "sm_90a"][..],
    ] {
        let o = foxc(args);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", text(&o));
    }
    // `return q`: refused by check as by run.
    let ret = tmp("return_param.attn");
    std::fs::write(&ret, "attention r(q: f32[B, H, T, D]) -> f32[B, H, T, D] {\n    return q\n}\n").unwrap();
    let o = foxc(&["check", ret.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("nothing to compute"), "{}", text(&o));
    // A constant divisor of 0.
    let div0 = tmp("div0.attn");
    let src = std::fs::read_to_string("examples/causal.attn").unwrap().replace("/ sqrt(D)", "/ 0");
    assert!(src.contains("/ 0"));
    std::fs::write(&div0, src).unwrap();
    let o = foxc(&["check", div0.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("division by zero"), "{}", text(&o));
    // --help and --version are not errors.
    assert_eq!(foxc(&["--help"]).status.code(), Some(0));
    assert_eq!(foxc(&["--version"]).status.code(), Some(0));
    // A panic (a bug) is an internal error: exit 2 with a message, not Rust's 101.
    let o = Command::new(env!("CARGO_BIN_EXE_foxc"))
        .args(["check", "examples/fox.attn"])
        .env("FOXC_TEST_PANIC", "1")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("internal error"), "{}", text(&o));
}

/// `foxc verify` passes foxc's own output and fails a corrupted copy (exit 1): the check can fail.
#[test]
fn verify_passes_a_good_output_and_fails_a_corrupted_one() {
    let input = tmp("verify-in.safetensors");
    let out = tmp("verify-out.safetensors");
    let bad = tmp("verify-bad.safetensors");
    let shape = "B=1,H=2,T=96,D=16";
    write_inputs("examples/fox.attn", shape, &input);
    let o = foxc(&[
        "run",
        "examples/fox.attn",
        "--backend",
        "cpu",
        "--inputs",
        input.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let verify = |file: &Path, extra: &[&str]| {
        let mut args = vec![
            "verify",
            "examples/fox.attn",
            "--inputs",
            input.to_str().unwrap(),
            "--output",
            file.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        foxc(&args)
    };
    let o = verify(&out, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("check: ok") && text(&o).contains("tol 1.0e-2"), "{}", text(&o));
    // The example: 0.0176 off everywhere used to pass the old OR criterion.
    let mut m = foxc_driver::tensors::read(&out).unwrap();
    let t = m["out"].clone();
    let shifted: Vec<f32> = t.to_f32_vec().iter().map(|x| x + 0.0176).collect();
    m.insert("out".into(), foxc_runtime::HostTensor::from_f32_as_bf16(&t.shape, &shifted));
    foxc_driver::tensors::write(&bad, &m).unwrap();
    let o = verify(&bad, &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("relative L2 error"), "{}", text(&o));
    // One element off by 0.05: still caught.
    let mut one = t.to_f32_vec();
    one[77] += 0.05;
    m.insert("out".into(), foxc_runtime::HostTensor::from_f32_as_bf16(&t.shape, &one));
    foxc_driver::tensors::write(&bad, &m).unwrap();
    assert_eq!(verify(&bad, &[]).status.code(), Some(1));
    // A bad --tol is a usage error.
    assert_eq!(verify(&out, &["--tol", "-1"]).status.code(), Some(1));
    // Against the dense reference (--no-prune) the pruned output is still within tolerance.
    let o = verify(&out, &["--no-prune"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

/// Beyond the full-interpreter size the check samples rows through the interpreter's row entry
/// point; it runs, passes on the CPU's output and says what it covered.
#[test]
fn check_samples_rows_of_large_shapes() {
    let o =
        foxc(&["run", "examples/fox.attn", "--backend", "cpu", "--shape", "B=1,H=1,T=1100,D=16", "--check"]);
    assert!(o.status.success(), "{}", text(&o));
    let t = text(&o);
    assert!(t.contains("sampled rows") && t.contains("check: ok"), "{t}");
    assert!(t.contains("kept set") && t.contains("CPU kernels' block starts"), "{t}");
}

#[test]
fn rules_lists_every_rule_with_formula_and_soundness() {
    let o = foxc(&["rules"]);
    assert!(o.status.success(), "{}", text(&o));
    let t = text(&o);
    for r in foxc_passes::rules::RULES {
        assert!(t.contains(&r.rule().to_string()), "{}: {t}", r.name);
    }
    assert!(t.contains("safe because"), "{t}");
}

/// `foxc mask --rules paper,tight`: both rules side by side, each with its kept fraction and its
/// largest pruned mass; tight never keeps more than paper.
#[test]
fn mask_draws_rules_side_by_side() {
    let input = tmp("mask-rules-in.safetensors");
    let png = tmp("mask-rules.png");
    write_inputs("examples/fox.attn", "B=1,H=2,T=512,D=16", &input);
    let o = mask_png("examples/fox.attn", &input, &png, &["--rules", "paper,tight"]);
    assert!(o.status.success(), "{}", text(&o));
    let t = text(&o);
    let kept = |rule: &str| -> f64 {
        let line =
            t.lines().find(|l| l.trim_start().starts_with(rule)).unwrap_or_else(|| panic!("{rule}: {t}"));
        assert!(line.contains("max pruned mass"), "{line}");
        line.split("kept ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap()
    };
    assert!(kept("tight") <= kept("paper"), "{t}");
    assert_eq!(&std::fs::read(&png).unwrap()[1..4], b"PNG");
}

/// `foxc compile examples/fox.attn --target sm_90a --shape D=<d> --emit <emit> <extra>`, which
/// must succeed: its output.
fn fox_sm90a(d: &str, emit: &str, extra: &[&str]) -> String {
    let shape = format!("D={d}");
    let args = ["compile", "examples/fox.attn", "--target", "sm_90a", "--shape", &shape, "--emit", emit];
    let o = foxc(&[&args[..], extra].concat());
    assert!(o.status.success(), "{extra:?}: {}", text(&o));
    text(&o)
}

/// `--ws-loads tma` reaches the tiles pass: the warp-specialized attribute says so; cp-async
/// is not printed; without the flag the pass's default (`WS_LOADS`); an unknown value is a
/// usage error.
#[test]
fn ws_loads_flag_reaches_the_kernel_attribute() {
    let args = ["compile", "examples/fox.attn", "--target", "sm_90a", "--shape", "D=128", "--emit", "opt"];
    let with = |extra: &[&str]| fox_sm90a("128", "opt", extra);
    let tma = with(&["--ws-loads", "tma"]);
    assert!(tma.contains("kernel = warp_specialized(D = 128, loads = tma)"), "{tma}");
    let cp = with(&["--ws-loads", "cp-async"]);
    assert!(cp.contains("kernel = warp_specialized(D = 128)"), "{cp}");
    let default = match foxc_passes::tiles::WS_LOADS {
        foxc_ir::attention::KvLoads::Tma => &tma,
        foxc_ir::attention::KvLoads::CpAsync => &cp,
    };
    assert_eq!(&with(&[]), default);
    assert_eq!(foxc(&[&args[..], &["--ws-loads", "bulk"]].concat()).status.code(), Some(1));
}

/// `--attn-kernel` reaches the tiles pass: `warp-specialized` puts the kernel on a D = 64
/// attention (which the pass's own choice keeps on the standard kernel), `standard` takes it off
/// a D = 128 one; an unknown value is a usage error.
#[test]
fn attn_kernel_flag_overrides_the_pass_choice() {
    let opt = |d: &str, extra: &[&str]| fox_sm90a(d, "opt", extra);
    assert!(!opt("64", &[]).contains("warp_specialized"));
    let ws64 = opt("64", &["--attn-kernel", "warp-specialized"]);
    assert!(ws64.contains("kernel = warp_specialized(D = 64 | 128"), "{ws64}");
    assert!(opt("128", &[]).contains("warp_specialized"));
    assert!(!opt("128", &["--attn-kernel", "standard"]).contains("warp_specialized"));
    let bad = ["compile", "examples/fox.attn", "--attn-kernel", "fast"];
    assert_eq!(foxc(&bad).status.code(), Some(1));
}

/// `--ws-grid` reaches the kernel attribute: `persistent` is printed with it, `tiles` (the
/// tiles pass's default) is not; an unknown value is a usage error.
#[test]
fn ws_grid_flag_reaches_the_kernel_attribute() {
    let args = ["compile", "examples/fox.attn", "--target", "sm_90a", "--shape", "D=128", "--emit", "opt"];
    let with = |extra: &[&str]| fox_sm90a("128", "opt", extra);
    let persistent = with(&["--ws-grid", "persistent"]);
    assert!(persistent.contains("loads = tma, grid = persistent)"), "{persistent}");
    let tiles = with(&["--ws-grid", "tiles"]);
    assert!(!tiles.contains("grid = persistent") && tiles.contains("kernel = warp_specialized"), "{tiles}");
    let default = match foxc_passes::tiles::WS_GRID {
        foxc_ir::attention::WsGrid::Persistent => &persistent,
        foxc_ir::attention::WsGrid::Tiles => &tiles,
    };
    assert_eq!(&with(&[]), default);
    assert_eq!(foxc(&[&args[..], &["--ws-grid", "blocks"]].concat()).status.code(), Some(1));
    // D = 64's three-consumer block (64-key tiles) was not run with it: a usage error (exit 1)
    // naming the way out; its two-consumer block (128-key tiles) takes it.
    let d64 = ["compile", "examples/fox.attn", "--target", "sm_90a", "--shape", "D=64", "--emit", "ptx"];
    let ws = ["--attn-kernel", "warp-specialized", "--ws-grid", "persistent"];
    let o = foxc(&[&d64[..], &ws[..], &["--tiles", "64x64"]].concat());
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("--ws-grid tiles"), "{}", text(&o));
    let o = foxc(&[&d64[..], &ws[..], &["--tiles", "64x128"]].concat());
    assert!(o.status.success() && text(&o).contains("_persist_"), "{}", text(&o));
}

/// `--ws-turns` reaches the kernel attribute and the kernel: `none` is printed with it and
/// builds the free-running kernel (`_free_`, no turn barrier: no `bar.arrive`), `ring` (the
/// tiles pass's default) is not printed and keeps the turns; an unknown value is a usage error.
#[test]
fn ws_turns_flag_reaches_the_kernel() {
    let ws = ["--attn-kernel", "warp-specialized"];
    let with = |d: &str, emit: &str, extra: &[&str]| fox_sm90a(d, emit, &[&ws[..], extra].concat());
    for d in ["64", "128"] {
        let none = with(d, "opt", &["--ws-turns", "none"]);
        assert!(none.contains(", turns = none)"), "{none}");
        let ring = with(d, "opt", &["--ws-turns", "ring"]);
        assert!(!ring.contains("turns = none") && ring.contains("kernel = warp_specialized"), "{ring}");
        let default = match foxc_passes::tiles::WS_TURNS {
            foxc_ir::attention::WsTurns::None => &none,
            foxc_ir::attention::WsTurns::Ring => &ring,
        };
        assert_eq!(&with(d, "opt", &[]), default);
        let ptx_none = with(d, "ptx", &["--ws-turns", "none"]);
        assert!(ptx_none.contains("foxc_attn_fwd_ws_tma_free_"), "D={d}");
        assert!(!ptx_none.contains("bar.arrive"), "D={d}: a turn hand-over in the free-running kernel");
        assert!(
            with(d, "ptx", &["--ws-turns", "ring"]).contains("bar.arrive"),
            "D={d}: no turns in the ring"
        );
    }
    // The standard kernel takes no turns: the option leaves it as it is.
    let std = ["compile", "examples/fox.attn", "--target", "sm_90a", "--shape", "D=64", "--emit", "ptx"];
    let (a, b) = (foxc(&std), foxc(&[&std[..], &["--ws-turns", "none"]].concat()));
    assert!(a.status.success() && b.status.success());
    assert_eq!(text(&a), text(&b));
    let bad =
        ["compile", "examples/fox.attn", "--target", "sm_90a", "--shape", "D=128", "--ws-turns", "pingpong"];
    let o = foxc(&[&bad[..], &ws[..]].concat());
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("possible values: ring, none"), "{}", text(&o));
}

/// `--target` and `--backend` take the driver's names: a wrong one is a usage error (exit 1)
/// listing them, the right ones run.
#[test]
fn targets_and_backends_are_the_drivers_names() {
    let o = foxc(&["compile", "examples/fox.attn", "--target", "sm90a"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("possible values: cpu, sm_90a, sm_80") && text(&o).contains("'sm_90a'"),
        "{}",
        text(&o)
    );
    let o = foxc(&["run", "examples/fox.attn", "--backend", "gpu", "--shape", "B=1,H=1,T=8,D=4"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("possible values: reference, cpu, cuda"), "{}", text(&o));
    for t in ["cpu", "sm_90a", "sm_80"] {
        let o = foxc(&["compile", "examples/fox.attn", "--target", t]);
        assert!(o.status.success(), "{t}: {}", text(&o));
    }
    let o = foxc(&["run", "examples/fox.attn", "--backend", "reference", "--shape", "B=1,H=1,T=8,D=4"]);
    assert!(o.status.success(), "{}", text(&o));
}

/// `--emit grad-ptx` is the PTX of the gradient program: the forward kernel and the three
/// backward kernels `foxc grad --backend cuda` launches; `--emit ptx` has the forward only.
#[test]
fn emit_grad_ptx_has_the_backward_kernels() {
    let grad = fox_sm90a("128", "grad-ptx", &[]);
    for k in ["foxc_attn_fwd_", "foxc_attn_bwd_pre_d128", "foxc_attn_bwd_dq_d128", "foxc_attn_bwd_dkv_d128"] {
        assert!(grad.contains(&format!(".entry {k}")), "{k}");
    }
    let fwd = fox_sm90a("128", "ptx", &[]);
    assert!(fwd.contains(".entry foxc_attn_fwd_") && !fwd.contains("foxc_attn_bwd_"));
    let o = foxc(&["compile", "examples/fox.attn", "--emit", "grad-ptx", "--target", "cpu"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("generate GPU code"), "{}", text(&o));
}
