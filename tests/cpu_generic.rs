//! The generic CPU kernels (plain loops for non-fused ops) on unoptimized programs, against the
//! f64 interpreter, with fresh random inputs and result buffers poisoned with NaN. Each program
//! targets one semantic corner: `-inf` and NaN in `reduce_max`, cumsum along an outer axis,
//! softmax of fully masked rows, `select` with broadcast, index arithmetic, rmsnorm on a middle
//! axis, a contraction, casts.

use foxc_codegen::cpu::{self, CpuOptions};
use foxc_driver::cpu_backend;
use foxc_ir::interp::{self, Tensor};
use foxc_ir::Graph;
use foxc_runtime::cpu::ExecOptions;
use foxc_runtime::{HostTensor, TensorMap};
use std::collections::BTreeMap;

fn program(src: &str) -> Graph {
    foxc_ir::frontend::compile("t.attn", src.as_bytes()).unwrap_or_else(|e| panic!("{e:?}")).graph
}

struct Rng(u64);

impl Rng {
    fn fresh() -> Rng {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
        let seed = t.as_nanos() as u64 | 1;
        eprintln!("cpu_generic: seed {seed}");
        Rng(seed)
    }

    /// Uniform in [-2, 2), never exactly 0.
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        let u = (self.0 >> 11) as f64 / (1u64 << 53) as f64;
        let x = 4.0 * u - 2.0;
        if x == 0.0 {
            0.5
        } else {
            x
        }
    }
}

/// Run `src` (no passes) on `inputs` with the CPU backend (the runtime's executor, every result
/// buffer poisoned with NaN) and compare every element with the interpreter: equal infinities,
/// both NaN, or within `tol` relative to the output's scale.
fn check(src: &str, inputs: BTreeMap<String, Tensor>, tol: f64) -> Vec<f64> {
    let g = program(src);
    let host: TensorMap = g
        .params
        .iter()
        .map(|p| {
            let t = &inputs[&p.name];
            let vals: Vec<f32> = t.data.iter().map(|&x| x as f32).collect();
            (p.name.clone(), HostTensor::from_f32_as(p.ty.dtype, &t.shape, &vals))
        })
        .collect();
    let run = cpu_backend::run_with(&g, &host, ExecOptions { threads: 2, poison: true }).unwrap();
    let got = run.out.to_f64_vec();
    let want = interp::run(&g, &inputs).unwrap().output.data;
    assert_eq!(got.len(), want.len());
    let scale = want.iter().filter(|x| x.is_finite()).fold(1e-30f64, |a, x| a.max(x.abs()));
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        let ok = if b.is_nan() {
            a.is_nan()
        } else if b.is_infinite() {
            a == b
        } else {
            (a - b).abs() <= tol * scale
        };
        assert!(ok, "element {i}: cpu {a}, interpreter {b}\n{src}");
    }
    want
}

fn random(rng: &mut Rng, shape: &[usize]) -> Tensor {
    Tensor::from_fn(shape, |_| rng.next())
}

#[test]
fn reduce_max_with_neg_inf_and_nan() {
    // Inputs are finite (the executor checks them): the program makes its own -inf and NaN.
    // Row 1: all -inf; row 2: one -inf (at n = 0); row 3: sqrt of a negative is NaN.
    let src = "attention m(x: f32[A, N]) -> f32[A] {
  y[a, n] = select(a == 1, -inf, select(10 * a + n == 20, -inf, select(a == 3, sqrt(x[a, n]), x[a, n])))
  m[a] = max(n, y[a, n])
  return m
}";
    let mut rng = Rng::fresh();
    let mut x = random(&mut rng, &[4, 6]);
    x.data[19] = -1.0;
    let want = check(src, [("x".to_string(), x)].into(), 1e-7);
    assert_eq!(want[1], f64::NEG_INFINITY);
    assert!(want[3].is_nan());
}

#[test]
fn cumsum_along_an_outer_axis() {
    let src = "attention c(x: f32[T, N]) -> f32[T, N] {\n  c[t, n] = cumsum(t, x[t, n] * 2)\n  return c\n}";
    let mut rng = Rng::fresh();
    let x = random(&mut rng, &[37, 5]);
    check(src, [("x".to_string(), x)].into(), 1e-6);
}

#[test]
fn cumsum_sums_large_negative_terms_and_floors_neg_inf() {
    // Terms far below LOG_F_FLOOR (-100) are summed as they are; only a -inf term (made by
    // the program: inputs must be finite) counts as the floor, as in the interpreter.
    let src = "attention c(x: f32[T, N]) -> f32[T, N] {
  c[t, n] = cumsum(t, select(t == 3, -inf, x[t, n] * 300))
  return c
}";
    let mut rng = Rng::fresh();
    let x = random(&mut rng, &[29, 3]);
    let want = check(src, [("x".to_string(), x)].into(), 1e-6);
    assert!(want.iter().all(|c| c.is_finite()));
}

#[test]
fn softmax_of_fully_masked_rows_is_zero() {
    // Row i keeps keys j <= i - 2: rows 0 and 1 are fully masked.
    let src = "attention p(x: f32[T, T]) -> f32[T, T] {\n  p[i, j] = softmax(j, select(j + 2 <= i, x[i, j], -inf))\n  return p\n}";
    let src = if foxc_ir::frontend::compile("t.attn", src.as_bytes()).is_ok() {
        src.to_string()
    } else {
        // Before `-inf` literals: log(0) is -inf.
        src.replace("-inf", "log(0)")
    };
    let mut rng = Rng::fresh();
    let x = random(&mut rng, &[9, 9]);
    let want = check(&src, [("x".to_string(), x)].into(), 1e-6);
    assert!(want[..18].iter().all(|&v| v == 0.0));
}

#[test]
fn softmax_over_the_query_axis_of_a_causal_mask() {
    let src = "attention p(x: f32[T, T]) -> f32[T, T] {\n  p[i, j] = softmax(i, causal(i, j, x[i, j]))\n  return p\n}";
    let mut rng = Rng::fresh();
    let x = random(&mut rng, &[11, 11]);
    check(src, [("x".to_string(), x)].into(), 1e-6);
}

#[test]
fn select_with_broadcast() {
    let src = "attention s(a: f32[M, N], u: f32[M], w: f32[N]) -> f32[M, N] {\n  s[m, n] = select(u[m] < w[n], a[m, n], w[n] * 3)\n  return s\n}";
    let mut rng = Rng::fresh();
    let inputs = [
        ("a".to_string(), random(&mut rng, &[5, 7])),
        ("u".to_string(), random(&mut rng, &[5])),
        ("w".to_string(), random(&mut rng, &[7])),
    ]
    .into();
    check(src, inputs, 1e-7);
}

#[test]
fn iota_arithmetic() {
    let src = "attention r(x: f32[T, T]) -> f32[T, T] {\n  r[i, j] = x[i, j] * (i - j) / 2 + min(i, j) + sqrt(T)\n  return r\n}";
    let mut rng = Rng::fresh();
    let x = random(&mut rng, &[13, 13]);
    check(src, [("x".to_string(), x)].into(), 1e-6);
}

#[test]
fn rmsnorm_on_a_middle_axis_and_unary_math() {
    let src = "attention r(x: f32[A, D, C], w: f32[D]) -> f32[A, D, C] {\n  r[a, d, c] = rmsnorm(x[a, d, c], w[d]) + sigmoid(x[a, d, c]) - softplus(x[a, d, c]) * exp(x[a, d, c])\n  return r\n}";
    let mut rng = Rng::fresh();
    let inputs =
        [("x".to_string(), random(&mut rng, &[3, 6, 4])), ("w".to_string(), random(&mut rng, &[6]))].into();
    check(src, inputs, 1e-6);
}

#[test]
fn contraction_and_bf16_output() {
    let src = "attention o(p: f32[T, T], v: bf16[T, D]) -> bf16[T, D] {\n  o[i, d] = sum(j, p[i, j] * v[j, d])\n  return o\n}";
    let mut rng = Rng::fresh();
    let v = Tensor::from_fn(&[10, 4], |_| (rng.next() as f32).to_bits() as f64);
    let v = Tensor::from_fn(&[10, 4], |k| f32::from_bits((v.data[k] as u32) & 0xffff_0000) as f64);
    let inputs = [("p".to_string(), random(&mut rng, &[10, 10])), ("v".to_string(), v)].into();
    let mut g = program(src);
    let dims: BTreeMap<String, u64> = [("T".to_string(), 10), ("D".to_string(), 4)].into();
    let muls = |g: &Graph| {
        cpu::compile(g, &dims).unwrap().kernels.iter().filter(|k| k.name.ends_with("_mul")).count()
    };
    // The backend does not decide: without the `contract` pass's mark the product is a kernel.
    assert_eq!(muls(&g), 1);
    // Marked, the mul is read by the sum directly: no kernel materializes [T, T, D].
    foxc_passes::contract::mark(&mut g, &[]);
    assert_eq!(muls(&g), 0);
    check(src, inputs, 1e-2);
}

/// `foxc compile --emit clif` shows the generic kernels: a masked softmax over a bound
/// parameter, stored back (bind, causal, softmax, store: four loop nests, one helper import).
#[test]
fn clif_of_a_masked_softmax() {
    let src = "attention p(x: f32[T, T]) -> f32[T, T] {\n  p[i, j] = softmax(j, causal(i, j, x[i, j]))\n  return p\n}";
    let g = program(src);
    let dims: BTreeMap<String, u64> = [("T".to_string(), 4)].into();
    let text = cpu::clif_text(&g, &dims, CpuOptions { fma: false }).unwrap();
    insta::assert_snapshot!("generic_masked_softmax", text);
}
