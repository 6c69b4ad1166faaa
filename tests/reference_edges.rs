//! The f64 reference on legal infinities (issue 26, item 3): a hard reset `log f = -inf` in
//! `fox_loggate.attn` (declared `in [-inf, 0]`) and an ALiBi slope of `inf` (declared
//! `[0, inf]`). The reference used to give NaN there (`-inf - -inf`, `inf * 0`), so `--check`
//! and `verify` failed outputs that are right. Both now follow the kernels' limits
//! (docs/SEMANTICS.md, "the reference at infinities"): a cumsum term of -inf is the floor, a
//! count of zero times an infinity is 0.

mod common;

use common::{foxc, text, tmp, write_inputs};
use foxc_ir::DType;
use foxc_runtime::{io, HostTensor};

/// Replace f32 elements of tensor `name` in the safetensors file at `path`.
fn poke_f32(path: &std::path::Path, name: &str, at: &[usize], value: f32) {
    let mut m = io::read_safetensors(path).unwrap();
    let t: &mut HostTensor = m.get_mut(name).unwrap();
    assert_eq!(t.dtype, DType::F32);
    for &l in at {
        t.data[4 * l..4 * l + 4].copy_from_slice(&value.to_le_bytes());
    }
    io::write_safetensors(path, &m).unwrap();
}

/// `foxc run FILE --inputs IN --check` (every backend), then `foxc verify` of the CPU output.
fn check_everywhere(example: &str, inputs: &std::path::Path, tag: &str) {
    for backend in ["reference", "cpu"] {
        for prune in [&[][..], &["--no-prune"][..]] {
            let mut args = vec!["run", example, "--backend", backend, "--inputs", inputs.to_str().unwrap()];
            args.extend_from_slice(prune);
            args.push("--check");
            let o = foxc(&args);
            assert_eq!(o.status.code(), Some(0), "{tag}: {args:?}\n{}", text(&o));
        }
    }
    let out = tmp("inf", &format!("{tag}_out.safetensors"));
    let o = foxc(&[
        "run",
        example,
        "--backend",
        "cpu",
        "--inputs",
        inputs.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{tag}: run -o\n{}", text(&o));
    let o =
        foxc(&["verify", example, "--inputs", inputs.to_str().unwrap(), "--output", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{tag}: verify\n{}", text(&o));
    let said = text(&o);
    assert!(!said.contains("NaN") && !said.contains(" inf"), "{tag}: verify said {said}");
}

#[test]
fn hard_reset_log_gate_of_minus_infinity() {
    let inputs = tmp("inf", "loggate.safetensors");
    write_inputs("examples/fox_loggate.attn", "B=1,H=2,T=96,D=16", &inputs);
    // Head 0 resets at t = 17 and t = 60; head 1 at its first token.
    poke_f32(&inputs, "logf", &[17, 60, 96], f32::NEG_INFINITY);
    check_everywhere("examples/fox_loggate.attn", &inputs, "loggate");
}

#[test]
fn alibi_slope_of_infinity() {
    let inputs = tmp("inf", "alibi.safetensors");
    write_inputs("examples/alibi.attn", "B=1,H=3,T=80,D=16", &inputs);
    // Head 1 sees only its diagonal (every other key has bias -inf).
    poke_f32(&inputs, "slope", &[1], f32::INFINITY);
    check_everywhere("examples/alibi.attn", &inputs, "alibi");
}

/// Multiply the f32 tensor `name` in the file at `path` by `factor`.
fn scale_f32(path: &std::path::Path, name: &str, factor: f32) {
    let mut m = io::read_safetensors(path).unwrap();
    let t: &mut HostTensor = m.get_mut(name).unwrap();
    assert_eq!(t.dtype, DType::F32);
    for b in t.data.chunks_mut(4) {
        let x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]) * factor;
        b.copy_from_slice(&x.to_le_bytes());
    }
    io::write_safetensors(path, &m).unwrap();
}

/// q and k with norms near 1e3 (logits near 1e5 after the 1/sqrt(D) scale), f32 output (so the
/// reference backend's own tolerance applies, not bf16 rounding): the reference backend (the
/// pipeline's graph on the interpreter) against the program as written. Both are f64, but a
/// logit of size L carries an absolute rounding of about L 2^-53, which the softmax turns into
/// a relative error of the weights: the tolerance follows that (driver/src/check.rs).
#[test]
fn reference_backend_at_large_logits() {
    for example in ["fox", "causal"] {
        let src = std::fs::read_to_string(format!("examples/{example}.attn")).unwrap().replace("bf16", "f32");
        let program = tmp("inf", &format!("{example}_f32.attn"));
        std::fs::write(&program, src).unwrap();
        let program = program.to_str().unwrap();
        let inputs = tmp("inf", &format!("{example}_large.safetensors"));
        write_inputs(program, "B=1,H=2,T=512,D=64", &inputs);
        scale_f32(&inputs, "q", 128.0);
        scale_f32(&inputs, "k", 128.0);
        for prune in [&[][..], &["--no-prune"][..]] {
            let mut args =
                vec!["run", program, "--backend", "reference", "--inputs", inputs.to_str().unwrap()];
            args.extend_from_slice(prune);
            args.push("--check");
            let o = foxc(&args);
            assert_eq!(o.status.code(), Some(0), "{args:?}\n{}", text(&o));
        }
    }
}

/// Finite inputs whose products overflow f32 (q, k near 1e20): the CPU output is NaN, and the
/// run says so with exit 1 instead of writing it (issue 26, item 6).
#[test]
fn an_overflowing_run_is_an_error_not_a_nan_output() {
    let src = std::fs::read_to_string("examples/causal.attn").unwrap().replace("bf16", "f32");
    let program = tmp("inf", "overflow_f32.attn");
    std::fs::write(&program, src).unwrap();
    let program = program.to_str().unwrap();
    let inputs = tmp("inf", "overflow.safetensors");
    write_inputs(program, "B=1,H=1,T=64,D=16", &inputs);
    scale_f32(&inputs, "q", 1e20);
    scale_f32(&inputs, "k", 1e20);
    let out = tmp("inf", "overflow_out.safetensors");
    let o = foxc(&["run", program, "--inputs", inputs.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("overflowed"), "{}", text(&o));
    assert!(!out.exists(), "a NaN output was written");
}

/// A count times an infinity inside a fused score region (found by the fuzzer,
/// passes/tests/fuzz_programs.rs). `-inf * i` is 0 on row 0 and `-inf` below it, so row 0 keeps
/// its keys and every other row has none (output 0); `inf * (i - j)` is 0 on the diagonal (the
/// only entry at T = 1). The region evaluators (the interpreter's, the CPU's and the GPU's) used
/// to compute `inf * 0 = NaN` while the reference of the source takes the limit, and recognition
/// distributed `inf * (i - j)` into a decay `inf * i - inf * j` (NaN on the diagonal): the fused
/// run's `--check` failed with "rel L2 inf".
#[test]
fn count_times_infinity_in_a_fused_region() {
    for (tag, term, region, shape) in [
        ("inf_row", "-inf * i", "score = x + -inf * i", "B=1,H=2,T=70,D=8"),
        ("inf_diag", "inf * (i - j)", "score = x + inf * (i - j)", "B=1,H=2,T=1,D=8"),
    ] {
        let src = format!(
            "attention {tag}(q: f32[B, H, T, D], k: f32[B, H, T, D], v: f32[B, H, T, D], fgate: f32[B, H, T]) -> f32[B, H, T, D] {{
    c[b, h, t] = cumsum(t, logsigmoid(fgate[b, h, t]))
    s[b, h, i, j] = sum(d, q[b, h, i, d] * k[b, h, j, d]) / sqrt(D) + c[b, h, i] - c[b, h, j] + 0.01 * ({term})
    p[b, h, i, j] = softmax(j, causal(i, j, s[b, h, i, j]))
    out[b, h, i, d] = sum(j, p[b, h, i, j] * v[b, h, j, d])
    return out
}}
"
        );
        let file = common::write_program("inf", &format!("{tag}.attn"), &src);
        let o = foxc(&["compile", &file, "--emit", "opt"]);
        assert!(text(&o).contains(region), "{tag}: the term is not in the fused region:\n{}", text(&o));
        let inputs = tmp("inf", &format!("{tag}.safetensors"));
        write_inputs(&file, shape, &inputs);
        check_everywhere(&file, &inputs, tag);
    }
}
