//! Shared helpers of the CPU backend tests: fused graphs built with the graph API, a seeded
//! RNG, a sequential executor over the kernel ABI (codegen must not depend on the runtime) and a
//! naive f64 reference of the fused ops.
#![allow(dead_code, clippy::needless_range_loop)]

use foxc_codegen::cpu::{self, CpuProgram};
use foxc_ir::*;
use std::collections::{BTreeMap, HashMap};

pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn normal(&mut self) -> f64 {
        let u1 = self.uniform().max(1e-300);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

pub fn bf16_round(x: f32) -> f32 {
    let b = x.to_bits();
    if x.is_nan() {
        return x;
    }
    let r = b.wrapping_add(0x7fff + ((b >> 16) & 1)) & 0xffff_0000;
    f32::from_bits(r)
}

/// A tensor as the tests hold it: dtype, shape, values (already representable in the dtype).
#[derive(Clone, Debug)]
pub struct Tensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub vals: Vec<f32>,
}

impl Tensor {
    pub fn random(rng: &mut Rng, dtype: DType, shape: &[usize], mean: f64, std: f64) -> Tensor {
        let n: usize = shape.iter().product();
        let vals = (0..n)
            .map(|_| {
                let x = (mean + std * rng.normal()) as f32;
                if dtype == DType::BF16 {
                    bf16_round(x)
                } else {
                    x
                }
            })
            .collect();
        Tensor { dtype, shape: shape.to_vec(), vals }
    }

    pub fn bytes(&self) -> Vec<u8> {
        match self.dtype {
            DType::BF16 => {
                self.vals.iter().flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes()).collect()
            }
            DType::I32 => self.vals.iter().flat_map(|v| (*v as i32).to_le_bytes()).collect(),
            _ => self.vals.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }

    pub fn from_bytes(dtype: DType, shape: &[usize], b: &[u8]) -> Tensor {
        let vals = match dtype {
            DType::BF16 => b
                .chunks_exact(2)
                .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16))
                .collect(),
            DType::I32 => {
                b.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32).collect()
            }
            _ => b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        };
        Tensor { dtype, shape: shape.to_vec(), vals }
    }
}

/// Description of a fused FoX-style graph.
#[derive(Clone, Debug)]
pub struct Cfg {
    pub dtype: DType,
    pub gate: Option<GateKind>,
    pub window: Option<u64>,
    /// `Some` builds threshold + block_boundary + pruned attention.
    pub prune: Option<(PruneRule, NormBound, Tiles)>,
    pub log_eps: f64,
    pub qk_norm: bool,
    pub out: DType,
}

impl Cfg {
    pub fn fox(dtype: DType) -> Cfg {
        Cfg {
            dtype,
            gate: Some(GateKind::Logits),
            window: None,
            prune: None,
            log_eps: -10.0,
            qk_norm: false,
            out: DType::F32,
        }
    }
}

fn dims4() -> Vec<Dim> {
    ["B", "H", "T", "D"].iter().map(|s| Dim::sym(s)).collect()
}

fn dims3() -> Vec<Dim> {
    ["B", "H", "T"].iter().map(|s| Dim::sym(s)).collect()
}

pub struct Built {
    pub g: Graph,
    pub start: Option<ValueId>,
    pub delta: Option<ValueId>,
    pub attn: ValueId,
}

pub fn build(cfg: &Cfg, d: u64) -> Built {
    let mut g = Graph::new("fox");
    let sp = Span::default();
    let t4 = ValueType::tensor(cfg.dtype, dims4());
    let mut q = g.add_param("q", t4.clone(), sp);
    let mut k = g.add_param("k", t4.clone(), sp);
    let v = g.add_param("v", t4.clone(), sp);
    let c = cfg.gate.map(|kind| {
        let gt = if kind == GateKind::Slope {
            ValueType::tensor(DType::F32, [Dim::sym("H")])
        } else {
            ValueType::tensor(DType::F32, dims3())
        };
        let gp = g.add_param("fgate", gt, sp);
        g.add(Op::GateCumsum { kind }, ValueType::tensor(DType::F32, dims3()), &[gp], sp)
    });
    if cfg.qk_norm {
        let wt = ValueType::tensor(DType::F32, [Dim::sym("D")]);
        let wq = g.add_param("wq", wt.clone(), sp);
        let wk = g.add_param("wk", wt, sp);
        let f4 = ValueType::tensor(DType::F32, dims4());
        q = g.add(Op::RmsNorm { axis: "3".into(), eps: 1e-6 }, f4.clone(), &[q, wq], sp);
        k = g.add(Op::RmsNorm { axis: "3".into(), eps: 1e-6 }, f4, &[k, wk], sp);
    }
    let mut attrs = Attention::new(
        Scale::constant(1.0 / (d as f64).sqrt()),
        cfg.window.map_or(Mask::Causal, Mask::Window),
        c.is_some(),
    );
    attrs.tiles = Some(cfg.prune.as_ref().map_or(Tiles { bm: 64, bn: 64 }, |p| p.2));
    let mut ops = vec![q, k, v];
    ops.extend(c);
    let add_attn = |g: &mut Graph, a: Attention, ops: &[ValueId]| {
        let tys: Vec<ValueType> = ops.iter().map(|&o| g.ty(o).clone()).collect();
        let refs: Vec<&ValueType> = tys.iter().collect();
        let rt = a.result_types(&refs).unwrap();
        let vals: Vec<Value> = ops.iter().map(|&o| Value::of(o)).collect();
        g.add_multi(Op::Attention(a), rt, &vals, sp)
    };
    let (attn, start, delta) = match cfg.prune.clone() {
        None => (add_attn(&mut g, attrs, &ops), None, None),
        Some((rule, bound, tiles)) => {
            let mt = || vec![Dim::sym("B"), Dim::sym("H"), Dim::Tiles(Box::new(Dim::sym("T")), tiles.bm)];
            let delta = g.add(
                Op::Threshold {
                    rule,
                    log_eps: cfg.log_eps,
                    bound,
                    score: ScoreBound::IDENTITY,
                    scale: attrs.scale.clone(),
                    bm: tiles.bm,
                },
                ValueType::tensor(DType::F32, mt()),
                &[q, k],
                sp,
            );
            let start = g.add(
                Op::BlockBoundary(tiles),
                ValueType::tensor(DType::I32, mt()),
                &[c.expect("pruning needs a decay"), delta],
                sp,
            );
            ops.push(start);
            attrs.prune = Prune::Start;
            (add_attn(&mut g, attrs, &ops), Some(start), Some(delta))
        }
    };
    let out = if cfg.out != DType::F32 {
        g.add(Op::Cast, ValueType::tensor(cfg.out, dims4()), &[attn], sp)
    } else {
        attn
    };
    g.output = Some(out);
    Built { g, start, delta, attn }
}

pub fn dims(b: u64, h: u64, t: u64, d: u64) -> BTreeMap<String, u64> {
    [("B", b), ("H", h), ("T", t), ("D", d)].iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

fn shape_of(g: &Graph, id: ValueId, dims: &BTreeMap<String, u64>) -> Vec<usize> {
    g.ty(id).dims().map(|d| d.eval(&|s| dims.get(s).copied()).unwrap() as usize).collect()
}

/// Run a compiled program sequentially (tasks in reverse order, to show independence) and
/// return every computed value.
pub fn execute(g: &Graph, p: &CpuProgram, inputs: &HashMap<String, Tensor>) -> HashMap<ValueId, Tensor> {
    let mut bufs: HashMap<ValueId, Vec<u64>> = HashMap::new();
    let mut input_bytes: HashMap<ValueId, Vec<u8>> = HashMap::new();
    for prm in &g.params {
        input_bytes.insert(prm.node, inputs[&prm.name].bytes());
    }
    let mut res = HashMap::new();
    for k in &p.kernels {
        let mut args: Vec<u64> = g
            .operands(k.node)
            .iter()
            .map(|o| match input_bytes.get(o) {
                Some(b) => b.as_ptr() as u64,
                None => bufs.get(o).map_or(0, |b| b.as_ptr() as u64),
            })
            .collect();
        let shape = shape_of(g, k.node, &p.dims);
        let dt = g.ty(k.node).dtype;
        let bytes = shape.iter().product::<usize>() * dt.size_bytes();
        let mut out = vec![0xffff_ffff_ffff_ffffu64; bytes.div_ceil(8).max(1)]; // poison: NaN
        args.push(out.as_mut_ptr() as u64);
        let mut scratch = vec![0x7fu8; k.scratch_bytes + 64];
        let off = scratch.as_ptr().align_offset(64);
        let f: cpu::abi::KernelFn = unsafe { std::mem::transmute(k.entry) };
        let (n, ch) = (k.tasks.count, k.tasks.chunk);
        let mut s = 0;
        let mut ranges = vec![];
        while s < n {
            ranges.push((s, (s + ch).min(n)));
            s += ch;
        }
        for (a, b) in ranges.into_iter().rev() {
            unsafe { f(args.as_ptr(), a, b, scratch.as_mut_ptr().add(off)) };
        }
        let raw: Vec<u8> = out.iter().flat_map(|w| w.to_le_bytes()).take(bytes).collect();
        res.insert(k.node, Tensor::from_bytes(dt, &shape, &raw));
        bufs.insert(k.node, out);
    }
    res
}

pub fn random_inputs(
    rng: &mut Rng,
    cfg: &Cfg,
    b: usize,
    h: usize,
    t: usize,
    d: usize,
) -> HashMap<String, Tensor> {
    let mut m = HashMap::new();
    for n in ["q", "k", "v"] {
        m.insert(n.to_string(), Tensor::random(rng, cfg.dtype, &[b, h, t, d], 0.0, 1.0));
    }
    match cfg.gate {
        Some(GateKind::Slope) => {
            let vals = (0..h).map(|i| 0.05 + 0.5 * i as f32 / h as f32).collect();
            m.insert("fgate".into(), Tensor { dtype: DType::F32, shape: vec![h], vals });
        }
        Some(GateKind::LogGate) => {
            let mut g = Tensor::random(rng, DType::F32, &[b, h, t], 0.0, 1.0);
            for x in g.vals.iter_mut() {
                *x = -(x.abs() * 0.5);
            }
            m.insert("fgate".into(), g);
        }
        Some(GateKind::Logits) => {
            // Heads alternate between fast forgetting (logits near -1) and slow (near 4).
            let mut g = Tensor::random(rng, DType::F32, &[b, h, t], 0.0, 1.0);
            for (i, x) in g.vals.iter_mut().enumerate() {
                let head = (i / t) % h;
                *x += if head.is_multiple_of(2) { -1.0 } else { 4.0 };
            }
            m.insert("fgate".into(), g);
        }
        None => {}
    }
    if cfg.qk_norm {
        for n in ["wq", "wk"] {
            m.insert(n.to_string(), Tensor::random(rng, DType::F32, &[d], 1.0, 0.2));
        }
    }
    m
}

/// f64 reference of the fused ops: c, q/k after rmsnorm, and attention with an optional
/// per-(b,h,m) start tile.
pub struct Reference {
    pub c: Vec<f64>,
    pub q: Vec<f64>,
    pub k: Vec<f64>,
}

pub fn reference_prep(
    cfg: &Cfg,
    inp: &HashMap<String, Tensor>,
    b: usize,
    h: usize,
    t: usize,
    d: usize,
) -> Reference {
    let mut c = vec![0.0f64; b * h * t];
    if let Some(kind) = cfg.gate {
        let gv = &inp["fgate"].vals;
        for bh in 0..b * h {
            let mut acc = 0.0f64;
            for tt in 0..t {
                let lf = match kind {
                    GateKind::Logits => {
                        let z = gv[bh * t + tt] as f64;
                        z.min(0.0) - (-z.abs()).exp().ln_1p()
                    }
                    GateKind::LogGate => gv[bh * t + tt] as f64,
                    GateKind::Slope => -(gv[bh % h] as f64),
                };
                let lf = lf.max(LOG_F_FLOOR);
                acc += lf;
                c[bh * t + tt] = if kind == GateKind::Slope { lf * (tt + 1) as f64 } else { acc };
            }
        }
    }
    let norm = |x: &[f32], w: Option<&Vec<f32>>| -> Vec<f64> {
        let mut y: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        if let Some(w) = w {
            for row in y.chunks_mut(d) {
                let ms = row.iter().map(|v| v * v).sum::<f64>() / d as f64;
                let r = 1.0 / (ms + 1e-6).sqrt();
                for (j, v) in row.iter_mut().enumerate() {
                    *v = *v * r * w[j] as f64;
                }
            }
        }
        y
    };
    let (wq, wk) = if cfg.qk_norm { (Some(&inp["wq"].vals), Some(&inp["wk"].vals)) } else { (None, None) };
    Reference { c, q: norm(&inp["q"].vals, wq), k: norm(&inp["k"].vals, wk) }
}

/// Attention output `[B,H,T,D]` in f64. `start` (per (bh, m), in key tiles of `bn`) restricts keys.
#[allow(clippy::too_many_arguments)]
pub fn reference_attention(
    r: &Reference,
    v: &[f32],
    b: usize,
    h: usize,
    t: usize,
    d: usize,
    has_decay: bool,
    window: Option<u64>,
    start: Option<(&[f32], usize, usize)>,
) -> Vec<f64> {
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = vec![0.0f64; b * h * t * d];
    let mut s = vec![0.0f64; t];
    for bh in 0..b * h {
        for i in 0..t {
            let mut jlo = 0usize;
            if let Some(w) = window {
                jlo = (i + 1).saturating_sub(w as usize);
            }
            if let Some((st, bm, bn)) = start {
                let mt = t.div_ceil(bm);
                jlo = jlo.max(st[bh * mt + i / bm] as usize * bn);
            }
            let mut mx = f64::NEG_INFINITY;
            for j in jlo..=i {
                let mut dot = 0.0;
                for e in 0..d {
                    dot += r.q[(bh * t + i) * d + e] * r.k[(bh * t + j) * d + e];
                }
                s[j] = scale * dot
                    + if has_decay {
                        r.c[bh * t + i] as f32 as f64 - r.c[bh * t + j] as f32 as f64
                    } else {
                        0.0
                    };
                mx = mx.max(s[j]);
            }
            let mut l = 0.0;
            for j in jlo..=i {
                s[j] = (s[j] - mx).exp();
                l += s[j];
            }
            for j in jlo..=i {
                for e in 0..d {
                    out[(bh * t + i) * d + e] += s[j] / l * v[(bh * t + j) * d + e] as f64;
                }
            }
        }
    }
    out
}

pub fn rel_l2(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let num: f64 = a.iter().zip(b).map(|(x, y)| (*x as f64 - y).powi(2)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    (num / den.max(1e-300)).sqrt()
}

/// Run a compiled program on `threads` threads (tasks from a shared counter, as the runtime
/// does) with inputs already in bytes; returns the output bytes of every kernel's node.
pub fn execute_parallel(
    g: &Graph,
    p: &CpuProgram,
    input_bytes: &HashMap<ValueId, Vec<u8>>,
    threads: usize,
) -> HashMap<ValueId, Vec<u64>> {
    use std::sync::atomic::{AtomicU64, Ordering};
    let mut bufs: HashMap<ValueId, Vec<u64>> = HashMap::new();
    for k in &p.kernels {
        let mut args: Vec<u64> = g
            .operands(k.node)
            .iter()
            .map(|o| match input_bytes.get(o) {
                Some(b) => b.as_ptr() as u64,
                None => bufs.get(o).map_or(0, |b| b.as_ptr() as u64),
            })
            .collect();
        let shape = shape_of(g, k.node, &p.dims);
        let bytes = shape.iter().product::<usize>() * g.ty(k.node).dtype.size_bytes();
        let mut out = vec![0u64; bytes.div_ceil(8).max(1)];
        args.push(out.as_mut_ptr() as u64);
        let f: cpu::abi::KernelFn = unsafe { std::mem::transmute(k.entry) };
        let counter = AtomicU64::new(0);
        let (n, ch, sb) = (k.tasks.count, k.tasks.chunk, k.scratch_bytes);
        let a = args.as_ptr() as usize;
        let work = || {
            let mut scratch = vec![0u8; sb + 64];
            let off = scratch.as_ptr().align_offset(64);
            loop {
                let s = counter.fetch_add(ch, Ordering::Relaxed);
                if s >= n {
                    break;
                }
                unsafe { f(a as *const u64, s, (s + ch).min(n), scratch.as_mut_ptr().add(off)) };
            }
        };
        std::thread::scope(|sc| {
            for _ in 1..threads {
                sc.spawn(work);
            }
            work();
        });
        bufs.insert(k.node, out);
    }
    bufs
}
