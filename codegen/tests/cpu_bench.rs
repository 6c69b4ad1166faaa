//! Timing of the CPU kernels on the workload (B=1, H=8, T=4096, D=64, bf16), pruned vs
//! dense. Not a test of correctness: run with
//! `cargo test -p foxc-codegen --test cpu_bench -- --ignored --nocapture`.

mod cpu_common;

use cpu_common::*;
use foxc_codegen::cpu;
use foxc_ir::*;
use std::collections::HashMap;
use std::time::Instant;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

/// Inputs like the runtime's standard workload: RMS-normalized q, k; per-head decay rates
/// 10^(-4 .. 0) with N(0, 1) noise on the logits.
fn workload(b: usize, h: usize, t: usize, d: usize) -> HashMap<String, Tensor> {
    let mut rng = Rng::new(7);
    let mut m = HashMap::new();
    for n in ["q", "k", "v"] {
        let mut x = Tensor::random(&mut rng, DType::BF16, &[b, h, t, d], 0.0, 1.0);
        if n != "v" {
            for row in x.vals.chunks_mut(d) {
                let rms = (row.iter().map(|v| (v * v) as f64).sum::<f64>() / d as f64).sqrt() as f32;
                row.iter_mut().for_each(|v| *v = bf16_round(*v / rms));
            }
        }
        m.insert(n.to_string(), x);
    }
    let mut z = Tensor::random(&mut rng, DType::F32, &[b, h, t], 0.0, 1.0);
    for (i, x) in z.vals.iter_mut().enumerate() {
        let head = (i / t) % h;
        let a = 10f64.powf(-4.0 + 4.0 * head as f64 / (h - 1).max(1) as f64);
        *x += (-a - (-(-a).exp_m1()).ln()) as f32;
    }
    m.insert("fgate".into(), z);
    m
}

#[test]
#[ignore]
fn bench_fox_cpu() {
    let (b, h, t, d) = (1, env("FOXC_H", 8), env("FOXC_T", 4096), env("FOXC_D", 64));
    let iters = env("FOXC_ITERS", 5);
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let inp = workload(b, h, t, d);
    let dm = dims(b as u64, h as u64, t as u64, d as u64);
    let mut times = vec![];
    for pruned in [false, true] {
        let mut cfg = Cfg::fox(DType::BF16);
        if pruned {
            cfg.prune = Some((
                foxc_passes::rules::by_name("paper").unwrap(),
                NormBound::Data,
                Tiles { bm: 64, bn: 64 },
            ));
        }
        let built = build(&cfg, d as u64);
        let t0 = Instant::now();
        let prog = cpu::compile(&built.g, &dm).unwrap();
        let compile_ms = t0.elapsed().as_secs_f64() * 1e3;
        let ib: HashMap<ValueId, Vec<u8>> =
            built.g.params.iter().map(|p| (p.node, inp[&p.name].bytes())).collect();
        let mut ts = vec![];
        let mut kept = 1.0;
        for _ in 0..iters + 1 {
            let t0 = Instant::now();
            let res = execute_parallel(&built.g, &prog, &ib, threads);
            ts.push(t0.elapsed().as_secs_f64() * 1e3);
            if let Some(s) = built.start {
                let st: Vec<i32> = res[&s]
                    .iter()
                    .flat_map(|w| w.to_le_bytes())
                    .collect::<Vec<u8>>()
                    .chunks_exact(4)
                    .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                let mt = t.div_ceil(64);
                let (mut k, mut tot) = (0usize, 0usize);
                for (i, s) in st.iter().take(b * h * mt).enumerate() {
                    let m = i % mt;
                    let diag = (m * 64 + 63).min(t - 1) / 64;
                    k += diag + 1 - (*s as usize).min(diag);
                    tot += diag + 1;
                }
                kept = k as f64 / tot as f64;
            }
        }
        ts.remove(0);
        ts.sort_by(|a, b| a.total_cmp(b));
        let med = ts[ts.len() / 2];
        // Causal FLOPs (2 matmuls, 2 flops per multiply-add) over kept tiles.
        let dense_flops = 4.0 * (b * h) as f64 * d as f64 * (t as f64 * (t as f64 + 1.0) / 2.0);
        let flops = dense_flops * kept;
        println!(
            "{}: B={b} H={h} T={t} D={d} threads={threads}: median {med:.2} ms (min {:.2}), compile {compile_ms:.0} ms, kept {kept:.3}, {:.1} GFLOP/s on kept work",
            if pruned { "pruned" } else { "dense " },
            ts[0],
            flops / med / 1e6
        );
        times.push((med, kept));
    }
    let (dense, _) = times[0];
    let (pr, kept) = times[1];
    println!(
        "pruned/dense time = {:.3}, kept fraction = {kept:.3}, ratio/kept = {:.3}",
        pr / dense,
        pr / dense / kept
    );
}
