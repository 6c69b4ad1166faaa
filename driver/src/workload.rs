//! The standard synthetic workload (BENCHMARKS.md, "How to reproduce"), deterministic by seed.
//!
//! The generator is our own (splitmix64 seeding a xoshiro256** stream, Box–Muller normals) so the
//! tensors never change with a crate version. Each parameter draws from its own stream, seeded by
//! the workload seed and the parameter's name, so adding a parameter leaves the others unchanged.
//!
//! Roles (decided from the declared type, the name and the declared range; see [`Role`]):
//!
//! | parameter | role | values |
//! |---|---|---|
//! | rank 4 `[B,H,T,D]` (or 3, `[B,T,D]`: multi-query) named `q` or `k` | [`Role::QkNormalized`] | N(0,1), then RMS-normalized over D (|x| = sqrt(D)) |
//! | rank 3 named `v` (multi-query) | [`Role::Normal`] | N(0,1) |
//! | any other rank 4 (`v`, ...) | [`Role::Normal`] | N(0,1) |
//! | declared `nonincreasing along` an axis (`c`) | [`Role::DecayCumsum`] | the cumsum along that axis of the log gates below |
//! | rank 3 `[B,H,T]`, range with hi <= 0 (`logf`) | [`Role::LogGate`] | logsigmoid of the gate logits below |
//! | any other rank 3 (`fgate`) | [`Role::GateLogits`] | `logit(exp(-a_h)) + N(0,1)`, `a_h = 10^(-4 + 4h/(H-1))` |
//! | rank 1 over the head dim, range lo >= 0 | [`Role::AlibiSlopes`] | `2^(-8(h+1)/H)` |
//! | rank 1 over the feature dim D | [`Role::NormWeights`] | `1 + 0.1 N(0,1)` |
//! | dtype i32 (`start`, `len`) | [`Role::Integers`] | uniform integers in the declared range (`[0, 8]` without one) |
//! | anything else | [`Role::Normal`] | N(0,1) |
//!
//! The head dim is axis 1 and the feature dim axis 3 of the first rank-4 parameter (`H`, `D`
//! when there is none). With a single head, `a_0 = 1e-4`. Every value is finally clamped to the
//! parameter's declared range, if any, and written in the declared dtype.

use foxc_ir::shapes::{concrete_shape, DimBindings, ShapeError};
use foxc_ir::unary::logsigmoid;
use foxc_ir::{Dim, Graph, Param};
use foxc_runtime::{HostTensor, TensorMap};

/// Largest tensor the generator makes (elements): 2^32, i.e. 16 GiB of f32.
const MAX_ELEMENTS: usize = 1 << 32;

#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error(transparent)]
    Shape(#[from] ShapeError),
    #[error("parameter `{tensor}` would have shape {shape:?}, too large for the workload generator; use a smaller shape")]
    TooLarge { tensor: String, shape: Vec<usize> },
    #[error("the standard inputs at this shape: {0}; use a smaller shape")]
    OverBudget(#[from] foxc_runtime::memory::OverBudget),
}

/// How the standard workload fills a parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    QkNormalized,
    Normal,
    GateLogits,
    LogGate,
    /// A decay cumsum given as a parameter: the cumsum of [`Role::LogGate`]'s values along the
    /// declared axis (non-increasing, and still so after rounding to any dtype).
    DecayCumsum,
    AlibiSlopes,
    NormWeights,
    Integers,
}

/// The values of an integer parameter without a declared range.
const DEFAULT_INTEGERS: (f64, f64) = (0.0, 8.0);

/// The deterministic generator: xoshiro256** seeded through splitmix64.
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
    spare: Option<f64>,
}

fn splitmix64(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut x = seed;
        Rng {
            s: [splitmix64(&mut x), splitmix64(&mut x), splitmix64(&mut x), splitmix64(&mut x)],
            spare: None,
        }
    }

    /// The stream of parameter `name` under workload seed `seed`.
    pub fn for_param(seed: u64, name: &str) -> Rng {
        // FNV-1a of the name, mixed with the seed.
        let h =
            name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
        let mut x = seed ^ h.rotate_left(17);
        Rng::new(splitmix64(&mut x))
    }

    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in the open interval (0, 1).
    pub fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) * (1.0 / (1u64 << 53) as f64)
    }

    /// Standard normal (Box–Muller; the second value of each pair is kept for the next call).
    pub fn normal(&mut self) -> f64 {
        if let Some(z) = self.spare.take() {
            return z;
        }
        let (u1, u2) = (self.uniform(), self.uniform());
        let r = (-2.0 * u1.ln()).sqrt();
        let th = 2.0 * std::f64::consts::PI * u2;
        self.spare = Some(r * th.sin());
        r * th.cos()
    }
}

/// Target mean decay per token of head `h` of `nh`.
fn head_decay(h: usize, nh: usize) -> f64 {
    let frac = if nh > 1 { h as f64 / (nh - 1) as f64 } else { 0.0 };
    10f64.powf(-4.0 + 4.0 * frac)
}

/// `logit(exp(-a))`, stable for small `a`: `-a - ln(1 - exp(-a))`.
fn logit_of_decay(a: f64) -> f64 {
    -a - (-(-a).exp_m1()).ln()
}

fn head_and_feature_dims(g: &Graph) -> (Dim, Dim) {
    match g.params.iter().find(|p| p.ty.rank() == 4) {
        Some(p) => (p.ty.axes[1].dim.clone(), p.ty.axes[3].dim.clone()),
        None => (Dim::sym("H"), Dim::sym("D")),
    }
}

/// The role of parameter `p` of `g` in the standard workload.
pub fn role(g: &Graph, p: &Param) -> Role {
    let (head, feat) = head_and_feature_dims(g);
    if p.ty.dtype == foxc_ir::DType::I32 {
        return Role::Integers;
    }
    if p.nonincreasing.is_some() {
        return Role::DecayCumsum;
    }
    match p.ty.rank() {
        4 if p.name == "q" || p.name == "k" => Role::QkNormalized,
        // Multi-query keys and values `[B, T, D]` (no head axis).
        3 if p.name == "q" || p.name == "k" => Role::QkNormalized,
        3 if p.name == "v" => Role::Normal,
        3 => match p.range {
            Some((_, hi)) if hi <= 0.0 => Role::LogGate,
            _ => Role::GateLogits,
        },
        1 if p.ty.axes[0].dim == head && p.range.is_some_and(|(lo, _)| lo >= 0.0) => Role::AlibiSlopes,
        1 if p.ty.axes[0].dim == feat => Role::NormWeights,
        _ => Role::Normal,
    }
}

/// Values of parameter `p` (shape `shape`) in f64, their storage reserved fallibly (the budget
/// check of [`standard_inputs`] cannot see what other processes take meanwhile).
fn values(
    g: &Graph,
    p: &Param,
    shape: &[usize],
    seed: u64,
) -> Result<Vec<f64>, foxc_runtime::memory::OverBudget> {
    let mut rng = Rng::for_param(seed, &p.name);
    let n: usize = shape.iter().product();
    let mut v: Vec<f64> = match role(g, p) {
        Role::Normal => foxc_runtime::memory::try_collect(n, |_| rng.normal())?,
        Role::QkNormalized => {
            let mut v = foxc_runtime::memory::try_collect(n, |_| rng.normal())?;
            let d = shape.last().copied().unwrap_or(0);
            if d > 0 {
                for row in v.chunks_mut(d) {
                    let rms = (row.iter().map(|x| x * x).sum::<f64>() / d as f64).sqrt();
                    if rms > 0.0 {
                        row.iter_mut().for_each(|x| *x /= rms);
                    }
                }
            }
            v
        }
        Role::DecayCumsum => {
            let axis = p.nonincreasing.unwrap_or(0);
            let (len, stride) = (shape[axis], shape[axis + 1..].iter().product::<usize>());
            // Heads along axis 1 where there is one (`[B, H, T]`), as the gates'.
            let (nh, hstride) = match shape.get(1) {
                Some(&nh) if axis != 1 => (nh, shape[2..].iter().product::<usize>()),
                _ => (1, 1),
            };
            let mut v = foxc_runtime::memory::try_collect(n, |i| {
                let h = (i / hstride.max(1)) % nh.max(1);
                logsigmoid(logit_of_decay(head_decay(h, nh)) + rng.normal())
            })?;
            for l in 0..n {
                if (l / stride.max(1)) % len.max(1) > 0 {
                    v[l] += v[l - stride];
                }
            }
            v
        }
        role @ (Role::GateLogits | Role::LogGate) => {
            let (nh, t) = (shape[1], shape[2]);
            foxc_runtime::memory::try_collect(n, |i| {
                let h = (i / t.max(1)) % nh.max(1);
                let z = logit_of_decay(head_decay(h, nh)) + rng.normal();
                if role == Role::LogGate {
                    logsigmoid(z)
                } else {
                    z
                }
            })?
        }
        Role::AlibiSlopes => {
            foxc_runtime::memory::try_collect(n, |h| 2f64.powf(-8.0 * (h + 1) as f64 / n as f64))?
        }
        Role::NormWeights => foxc_runtime::memory::try_collect(n, |_| 1.0 + 0.1 * rng.normal())?,
        Role::Integers => {
            let (lo, hi) = p.range.unwrap_or(DEFAULT_INTEGERS);
            let lo = lo.ceil().clamp(i32::MIN as f64, i32::MAX as f64);
            let hi = hi.floor().clamp(i32::MIN as f64, i32::MAX as f64);
            let span = (hi - lo).max(0.0) + 1.0;
            foxc_runtime::memory::try_collect(n, |_| (lo + (rng.uniform() * span).floor()).min(hi.max(lo)))?
        }
    };
    if let Some((lo, hi)) = p.range {
        if lo <= hi {
            v.iter_mut().for_each(|x| *x = x.clamp(lo, hi));
        }
    }
    Ok(v)
}

/// The standard inputs of `g` at `dims`, deterministic in `seed`, each in its declared dtype.
pub fn standard_inputs(g: &Graph, dims: &DimBindings, seed: u64) -> Result<TensorMap, WorkloadError> {
    let mut shapes = vec![];
    for p in &g.params {
        let shape = concrete_shape(&p.ty, dims)?;
        let n = shape.iter().try_fold(1usize, |a, &s| a.checked_mul(s));
        match n {
            Some(n) if n <= MAX_ELEMENTS => shapes.push((p, shape, n)),
            _ => return Err(WorkloadError::TooLarge { tensor: p.name.clone(), shape }),
        }
    }
    // What is held at the peak: every tensor in its dtype, plus the f64 values and their f32
    // copy of the largest while it is made.
    let kept: u64 = shapes.iter().map(|(p, _, n)| *n as u64 * p.stored().size_bytes() as u64).sum();
    let largest = shapes.iter().map(|(_, _, n)| *n as u64).max().unwrap_or(0);
    foxc_runtime::memory::fits(kept + 12 * largest)?;
    let mut out = TensorMap::new();
    for (p, shape, n) in shapes {
        let v64 = values(g, p, &shape, seed)?;
        let v = foxc_runtime::memory::try_collect(n, |i| v64[i] as f32)?;
        drop(v64);
        out.insert(p.name.clone(), HostTensor::from_f32_as(p.stored(), &shape, &v));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use foxc_ir::{DType, Span, ValueType};

    fn pos(dt: DType, dims: &[&str]) -> ValueType {
        ValueType::tensor(dt, dims.iter().map(|d| Dim::sym(d)))
    }

    fn graph() -> Graph {
        let sp = Span::default();
        let mut g = Graph::new("w");
        for n in ["q", "k", "v"] {
            g.add_param(n, pos(DType::BF16, &["B", "H", "T", "D"]), sp);
        }
        g.add_param("fgate", pos(DType::F32, &["B", "H", "T"]), sp);
        g.add_param_in("logf", pos(DType::F32, &["B", "H", "T"]), (f64::NEG_INFINITY, 0.0), sp);
        g.add_param_in("slope", pos(DType::F32, &["H"]), (0.0, f64::INFINITY), sp);
        g.add_param("wq", pos(DType::F32, &["D"]), sp);
        g.add_param_in("x", pos(DType::F32, &["T"]), (-0.5, 0.5), sp);
        g
    }

    fn dims() -> DimBindings {
        DimBindings(
            [("B", 2u64), ("H", 4), ("T", 256), ("D", 16)].iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        )
    }

    #[test]
    fn rng_is_pinned() {
        // These numbers must never change: published inputs depend on them.
        let mut r = Rng::new(0);
        assert_eq!(r.next_u64(), 0x99EC_5F36_CB75_F2B4);
        let mut r = Rng::new(42);
        let z: Vec<f64> = (0..2).map(|_| r.normal()).collect();
        let mut r2 = Rng::new(42);
        assert_eq!(z, (0..2).map(|_| r2.normal()).collect::<Vec<_>>());
        // mean and variance of many normals
        let mut r = Rng::new(7);
        let xs: Vec<f64> = (0..200_000).map(|_| r.normal()).collect();
        let m = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / xs.len() as f64;
        assert!(m.abs() < 0.01 && (var - 1.0).abs() < 0.01, "{m} {var}");
    }

    #[test]
    fn roles() {
        let g = graph();
        let r: Vec<Role> = g.params.iter().map(|p| role(&g, p)).collect();
        use Role::*;
        assert_eq!(
            r,
            vec![QkNormalized, QkNormalized, Normal, GateLogits, LogGate, AlibiSlopes, NormWeights, Normal]
        );
    }

    #[test]
    fn deterministic_and_per_role() {
        let g = graph();
        let a = standard_inputs(&g, &dims(), 5).unwrap();
        assert_eq!(a, standard_inputs(&g, &dims(), 5).unwrap());
        assert_ne!(a["v"], standard_inputs(&g, &dims(), 6).unwrap()["v"]);
        assert_eq!(a["q"].dtype, DType::BF16);
        assert_eq!(a["q"].shape, vec![2, 4, 256, 16]);
        // q rows have norm sqrt(D) (up to bf16 rounding)
        let q = a["q"].to_f64_vec();
        for row in q.chunks(16).take(50) {
            let n = row.iter().map(|x| x * x).sum::<f64>().sqrt();
            assert!((n - 4.0).abs() < 0.05, "{n}");
        }
        // slopes
        let s = a["slope"].to_f64_vec();
        assert_eq!(s, vec![0.25, 0.0625, 0.015625, 0.00390625]);
        // log gates are <= 0, and head 3 (a = 1) forgets much faster than head 0 (a = 1e-4)
        let lf = a["logf"].to_f64_vec();
        assert!(lf.iter().all(|&x| x <= 0.0 && x.is_finite()));
        let mean = |h: usize| lf[h * 256..(h + 1) * 256].iter().sum::<f64>() / 256.0;
        assert!(mean(3) < -0.5 && mean(0) > -0.1, "{} {}", mean(0), mean(3));
        let fg = a["fgate"].to_f64_vec();
        assert!(fg[..256].iter().sum::<f64>() / 256.0 > 5.0); // logit(exp(-1e-4)) ~ 9.2
                                                              // weights near 1, the ranged scalar clamped
        assert!(a["wq"].to_f64_vec().iter().all(|w| (w - 1.0).abs() < 0.6));
        assert!(a["x"].to_f64_vec().iter().all(|x| (-0.5..=0.5).contains(x)));
        // adding a parameter does not change the others
        let mut g2 = graph();
        g2.add_param("extra", pos(DType::F32, &["T"]), Span::default());
        assert_eq!(standard_inputs(&g2, &dims(), 5).unwrap()["v"], a["v"]);
    }

    #[test]
    fn unbound_dim_is_an_error() {
        let g = graph();
        let mut d = dims();
        d.0.remove("T");
        let e = standard_inputs(&g, &d, 1).unwrap_err().to_string();
        assert!(e.contains("dimension T is not bound"), "{e}");
    }
}
