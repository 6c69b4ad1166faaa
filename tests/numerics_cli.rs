//! The CPU's f32 contract (relative L2 <= 1e-5 of the f64 reference, DESIGN.md section 5) when
//! the decay cumsum is large: f32 FoX with bursty forget gates drives `|c|` past 1e3, where an
//! f32 `c` alone put `c_i - c_j` off by `ulp(|c|)` and `--check --no-prune` failed (relative L2
//! 2.6e-5 to 3.4e-5; issue 12, item 5). Fresh random inputs on every run (the seed is printed).

mod common;

use common::{foxc, text, tmp};
use foxc_driver::cpu_backend;
use foxc_ir::{Op, Value};
use foxc_passes::{optimize, PassOptions};
use foxc_runtime::cpu::ExecOptions;
use foxc_runtime::{io, HostTensor, TensorMap};

fn fresh_seed() -> u64 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    t.as_nanos() as u64 ^ 0x2545_f491_4f6c_dd1d
}

/// xorshift64*: a small deterministic stream of uniforms in [0, 1).
struct Rng(u64);

impl Rng {
    fn uniform(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Gate logits `[B, H, T]`: remembering (logit +8, log f = -3.4e-4) with bursts of 16 tokens of
/// strong forgetting (logit about -4, log f about -4); head h starts a burst at a token with
/// probability 2^-(h + 2), so every head's cumsum ends between about -2e3 and -7e3 at T = 2048.
fn bursty_gates(shape: &[usize], rng: &mut Rng) -> Vec<f32> {
    let (b, h, t) = (shape[0], shape[1], shape[2]);
    let mut z = Vec::with_capacity(b * h * t);
    for _ in 0..b {
        for hi in 0..h {
            let p = 0.5f64.powi(hi as i32 + 2);
            let mut left = 0u32;
            for _ in 0..t {
                if left == 0 && rng.uniform() < p {
                    left = 16;
                }
                z.push(if left > 0 { -4.0 - rng.uniform() as f32 } else { 8.0 });
                left = left.saturating_sub(1);
            }
        }
    }
    z
}

/// The most negative inclusive cumsum of `logsigmoid(z)` over each head.
fn min_cumsum(z: &[f32], t: usize) -> f64 {
    let logsigmoid = |x: f64| x.min(0.0) - (-x.abs()).exp().ln_1p();
    z.chunks(t).map(|head| head.iter().map(|&x| logsigmoid(x as f64)).sum::<f64>()).fold(0.0, f64::min)
}

#[test]
fn f32_fox_with_a_cumsum_past_1e3_passes_its_dense_check() {
    let seed = fresh_seed();
    // examples/fox.attn with every tensor in f32 (the CPU contract of 1e-5 is for f32 programs).
    let src = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/fox.attn")).unwrap();
    let prog = tmp("numerics", "fox_f32.attn");
    std::fs::write(&prog, src.replace("bf16[", "f32[")).unwrap();
    let inputs = tmp("numerics", "bursty.safetensors");
    let (p, i) = (prog.to_str().unwrap(), inputs.to_str().unwrap());
    let o =
        foxc(&["inputs", p, "--shape", "B=1,H=4,T=2048,D=32", "--seed", &(seed % 1000).to_string(), "-o", i]);
    assert!(o.status.success(), "{}", text(&o));
    let mut t = io::read_safetensors(&inputs).unwrap();
    let shape = t["fgate"].shape.clone();
    let z = bursty_gates(&shape, &mut Rng(seed | 1));
    let c_min = min_cumsum(&z, shape[2]);
    assert!(c_min <= -1e3, "seed {seed}: the gates must drive |c| past 1e3, min c = {c_min}");
    t.insert("fgate".into(), HostTensor::from_f32(&shape, &z));
    io::write_safetensors(&inputs, &t).unwrap();

    let o = foxc(&["run", p, "--backend", "cpu", "--inputs", i, "--check", "--no-prune"]);
    let out = text(&o);
    assert!(out.contains("tol 1.0e-5"), "seed {seed}: the dense f32 check applies 1e-5:\n{out}");
    assert!(o.status.success(), "seed {seed}, min c = {c_min}: the f32 output misses 1e-5:\n{out}");
}

/// The CPU's pair `(c, c_lo)` holds the f64 cumsum: `c + lo` is within `|c| 2^-45` of the f64 sum
/// of the same `log f` (the interpreter's `logsigmoid`), where `c` alone is off by up to
/// `ulp(|c|) / 2` (checked too, so the comparison can tell the two apart).
#[test]
fn the_cpu_decay_pair_holds_the_f64_cumsum() {
    let seed = fresh_seed();
    let src = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/fox.attn")).unwrap();
    let mut g = foxc_ir::frontend::compile("fox.attn", src.as_bytes()).unwrap().graph;
    optimize(&mut g, &PassOptions::default()).unwrap();
    let lo = g.find(|op| matches!(op, Op::GateCumsumLo { .. }));
    let c = g.find(|op| matches!(op, Op::GateCumsum { .. }));
    assert_eq!((lo.len(), c.len()), (1, 1), "compensate-decay gives the CPU attention a pair");
    let (b, h, t, d) = (1, 4, 2048, 8);
    let z = bursty_gates(&[b, h, t], &mut Rng(seed | 1));
    let mut inputs = TensorMap::new();
    inputs.insert("fgate".into(), HostTensor::from_f32(&[b, h, t], &z));
    let mut rng = Rng(seed ^ 0x5bd1_e995);
    for name in ["q", "k", "v"] {
        let x: Vec<f32> = (0..b * h * t * d).map(|_| rng.uniform() as f32 - 0.5).collect();
        inputs.insert(name.into(), HostTensor::from_f32_as_bf16(&[b, h, t, d], &x));
    }
    let outs = vec![("c".to_string(), Value::of(c[0])), ("lo".to_string(), Value::of(lo[0]))];
    let got = cpu_backend::run_outputs(&g, &outs, &inputs, ExecOptions { threads: 2, poison: true }).unwrap();
    let (cv, lv) = (got["c"].to_f64_vec(), got["lo"].to_f64_vec());
    let logsigmoid = foxc_ir::interp::logsigmoid;
    let (mut worst_pair, mut worst_single, mut c_min) = (0.0f64, 0.0f64, 0.0f64);
    for (head, zs) in z.chunks(t).enumerate() {
        let mut acc = 0.0f64;
        for (k, &zk) in zs.iter().enumerate() {
            acc += logsigmoid(zk as f64).max(foxc_ir::LOG_F_FLOOR);
            let i = head * t + k;
            let scale = acc.abs().max(1.0);
            worst_pair = worst_pair.max((cv[i] + lv[i] - acc).abs() / scale);
            worst_single = worst_single.max((cv[i] - acc).abs() / scale);
            c_min = c_min.min(acc);
        }
    }
    assert!(c_min <= -1e3, "seed {seed}: min c = {c_min}");
    assert!(worst_pair <= 2f64.powi(-45), "seed {seed}: c + lo is {worst_pair:e} |c| from the f64 cumsum");
    assert!(
        worst_single > 2f64.powi(-30),
        "seed {seed}: c alone is {worst_single:e} |c| off: no residual to test"
    );
}
