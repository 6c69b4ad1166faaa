//! The NVPTX `threshold` kernels: per-tile norms, then `delta` of every query tile from the
//! rule's formula. The formula is rendered by the one walk over it (`RuleExpr::emit`) with LLVM
//! f32 instructions; this file only computes the statistics the formula reads.
//!
//! - [`build_threshold_norms`]: `norms [BH, Mt, 2]`, the largest squared norm of q and of k
//!   over the rows of each query tile (no atomics: one block per tile).
//! - [`build_threshold_delta`]: one block per (tile m, head); head statistics (`q_max`,
//!   `k_max`) and `k_causal` (keys of tiles `0..=m`) are block maxima over the norms buffer,
//!   `q_tile` is tile m's entry, the row statistics (`q_i`, `s_ii`) come from the rows.
//!
//! The attention's q may be `s q'` with `s` folded away (`module.rs`, `resolve_q`): the kernels
//! read q', so data statistics of q are multiplied by `|s|` and `s_ii` by `s` here; a static
//! bound is already a bound on `s q'`.

use super::builder::{KernelBuilder, ParamTy};
use super::kernels::{lane_warp, load_row, ROW_THREADS};
use inkwell::context::Context;
use inkwell::module::Module;
use inkwell::values::{FloatValue, FunctionValue, IntValue};
use inkwell::IntPredicate;

use foxc_ir::prune_rule::{RuleEmitter, Stat};
use foxc_ir::{DType, PruneRule, ScoreBound};

type R<T> = Result<T, String>;
type Kb<'a, 'ctx> = KernelBuilder<'a, 'ctx>;

const WARPS: u32 = ROW_THREADS / 32;
/// Rows each warp of the norms kernel loads at once: about 1 KB of q and k rows per lane
/// group (8 rows at D = 128, bf16), between 2 and 16 rows.
fn norm_rows(d: u32) -> u32 {
    (1024 / d.max(1)).clamp(2, 16)
}

/// Tiles of the head's norms each thread of the delta kernel loads at once.
const FOLD_TILES: u32 = 4;

/// Renders the formula's operations as LLVM f32 instructions over precomputed statistics.
struct Llvm<'a, 'b, 'ctx> {
    k: &'a Kb<'b, 'ctx>,
    stats: [Option<FloatValue<'ctx>>; Stat::ALL.len()],
}

impl<'ctx> RuleEmitter for Llvm<'_, '_, 'ctx> {
    type V = FloatValue<'ctx>;
    fn stat(&mut self, s: Stat) -> FloatValue<'ctx> {
        match self.stats[s as usize] {
            Some(v) => v,
            None => {
                // Every statistic of the formula is computed first (`RuleExpr::stats`).
                self.k.fail(format!("threshold: statistic {} not computed", s.name()));
                self.k.f32(f64::NAN)
            }
        }
    }
    fn constant(&mut self, c: f64) -> FloatValue<'ctx> {
        self.k.f32(c)
    }
    fn add(&mut self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> FloatValue<'ctx> {
        self.k.fadd(a, b)
    }
    fn sub(&mut self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> FloatValue<'ctx> {
        self.k.fsub(a, b)
    }
    fn mul(&mut self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> FloatValue<'ctx> {
        self.k.fmul(a, b)
    }
}

/// First row of the keys that query head `bh` reads, `(bh / kv_group) T` (64-bit): key/value
/// head `h / kv_group` of batch `b` is flat head `(b H + h) / kv_group` since `kv_group`
/// divides `H`.
pub(super) fn kv_rows<'ctx>(
    k: &Kb<'_, 'ctx>,
    bh: IntValue<'ctx>,
    t_len: IntValue<'ctx>,
    kv_group: u32,
) -> IntValue<'ctx> {
    let kvh = if kv_group == 1 { bh } else { k.udivc(bh, kv_group as i64) };
    k.mul(k.sext64(kvh), k.sext64(t_len))
}

/// Combine per-thread values `vals` over the block with `op` (max or min): warp reduction,
/// then every thread reads the warps' results from shared memory (so all threads hold them).
fn block_reduce<'ctx>(
    k: &Kb<'_, 'ctx>,
    name: &str,
    vals: &[FloatValue<'ctx>],
    (lane, warp): (IntValue<'ctx>, IntValue<'ctx>),
    min: bool,
) -> Vec<FloatValue<'ctx>> {
    let op = |a, b| if min { k.fmin(a, b) } else { k.fmax(a, b) };
    let sh = k.shared_f32(name, WARPS * vals.len() as u32);
    let wr: Vec<FloatValue<'ctx>> = vals
        .iter()
        .map(|&v| {
            let mut v = v;
            for m in [16, 8, 4, 2, 1] {
                v = op(v, k.shfl_xor(v, m));
            }
            v
        })
        .collect();
    let is0 = k.icmpc(IntPredicate::EQ, lane, 0);
    k.if_then(is0, |k| {
        for (s, v) in wr.iter().enumerate() {
            let at = k.addc(warp, (s as u32 * WARPS) as i64);
            k.store(k.shared_at(sh, at), *v);
        }
    });
    k.barrier();
    (0..vals.len())
        .map(|s| {
            let mut v = k.load_f32(k.shared_at(sh, k.i32((s as u32 * WARPS) as i64)));
            for w in 1..WARPS {
                v = op(v, k.load_f32(k.shared_at(sh, k.i32((s as u32 * WARPS + w) as i64))));
            }
            v
        })
        .collect()
}

/// Per-tile maxima of squared norms: params `(q, k, norms: f32 [BH, Mt, 2], T: i32)`.
/// Grid `(Mt, BH)`, block [`ROW_THREADS`]: each warp loads [`norm_rows`] rows at a time, one
/// row spread over the warp (each row's sum in the same order as before: bit-identical norms).
pub fn build_threshold_norms<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    name: &str,
    d: u32,
    kv_group: u32,
    (q_dt, k_dt): (DType, DType),
    bm: u32,
) -> R<FunctionValue<'ctx>> {
    let params = [("q", ParamTy::Ptr), ("k", ParamTy::Ptr), ("norms", ParamTy::Ptr), ("T", ParamTy::I32)];
    let k = Kb::kernel(ctx, module, name, &params)?;
    let (q, kk, norms, t_len) = (k.param_ptr(0), k.param_ptr(1), k.param_ptr(2), k.param_int(3));
    let qm = k.declare_var(k.f32(0.0).into());
    let km = k.declare_var(k.f32(0.0).into());
    let tid = k.sreg("tid.x");
    let lw = lane_warp(&k, tid);
    let (lane, warp) = lw;
    let m = k.sreg("ctaid.x");
    let bh = k.sreg("ctaid.y");
    let mt = k.sreg("nctaid.x");
    let i0 = k.mulc(m, bm as i64);
    let last = k.smin(k.addc(i0, bm as i64), t_len);
    let bh_base = k.mul(k.sext64(bh), k.sext64(t_len));
    let kbh_base = kv_rows(&k, bh, t_len, kv_group);
    // norm_rows(d) rows per warp and step, all their loads issued before any arithmetic: the
    // kernel is bound by the bytes in flight (one row at a time left the memory system idle).
    // A row past the tile repeats the tile's last row (its norms are already in the maxima).
    let nrows = norm_rows(d);
    let step = k.i32((WARPS * nrows) as i64);
    k.for_range(k.add(i0, warp), last, step, |k, i| {
        let rows: Vec<_> = (0..nrows)
            .map(|r| {
                let row = k.smin(k.addc(i, (r * WARPS) as i64), k.addc(last, -1));
                let base = k.mul(k.add(bh_base, k.sext64(row)), k.i64(d as i64));
                let kbase = k.mul(k.add(kbh_base, k.sext64(row)), k.i64(d as i64));
                (load_row(k, q_dt, q, base, lane, d), load_row(k, k_dt, kk, kbase, lane, d))
            })
            .collect();
        for (qv, kv) in &rows {
            let (mut sq, mut sk) = (k.f32(0.0), k.f32(0.0));
            for (a, b) in qv.iter().zip(kv) {
                sq = k.fma(*a, *a, sq);
                sk = k.fma(*b, *b, sk);
            }
            k.def_var(qm, k.fmax(k.use_f(qm), k.warp_sum(sq)));
            k.def_var(km, k.fmax(k.use_f(km), k.warp_sum(sk)));
        }
    });
    let r = block_reduce(&k, &format!("{name}_max"), &[k.use_f(qm), k.use_f(km)], lw, false);
    let t0 = k.icmpc(IntPredicate::EQ, tid, 0);
    k.if_then(t0, |k| {
        let tile = k.add(k.mul(k.sext64(bh), k.sext64(mt)), k.sext64(m));
        for (slot, v) in r.iter().enumerate() {
            k.store_f(DType::F32, norms, k.addc(k.mulc(tile, 2), slot as i64), *v);
        }
    });
    k.finish()
}

/// Where the threshold kernel gets the norm statistics.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BoundSrc {
    /// Bounds on `|q|` (the attention's q, scale folded or not) and `|k|`.
    Static { q_max: f64, k_max: f64 },
    /// From the `norms` buffer of [`build_threshold_norms`].
    Norms,
}

/// What the delta kernel renders.
pub struct DeltaSpec<'a> {
    pub d: u32,
    pub kv_group: u32,
    pub dts: (DType, DType),
    pub rule: &'a PruneRule,
    pub score: ScoreBound,
    pub log_eps: f64,
    /// The attention's scale (signed).
    pub scale: f64,
    /// The factor folded out of q (`q = qscale q'`; 1 when none).
    pub qscale: f64,
    pub bm: u32,
    pub bound: BoundSrc,
}

/// Whether the delta kernel reads the norms buffer (a data bound and a norm statistic that the
/// formula renders under the score bound).
pub fn needs_norms(rule: &PruneRule, score: &ScoreBound, bound: BoundSrc) -> bool {
    let reads = rule.formula.stats_under(score);
    bound == BoundSrc::Norms
        && [Stat::QMax, Stat::KMax, Stat::QTile, Stat::KCausal].iter().any(|s| reads.contains(s))
}

/// Per-query-tile delta: params `(q, k, norms: f32 [BH, Mt, 2], delta: f32 [BH, Mt], T: i32,
/// lnT: f32)`. Grid `(Mt, BH)`, block [`ROW_THREADS`]. `norms` is read only when
/// [`needs_norms`] (pass any valid pointer otherwise).
pub fn build_threshold_delta<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    name: &str,
    s: &DeltaSpec,
) -> R<FunctionValue<'ctx>> {
    let params = [
        ("q", ParamTy::Ptr),
        ("k", ParamTy::Ptr),
        ("norms", ParamTy::Ptr),
        ("delta", ParamTy::Ptr),
        ("T", ParamTy::I32),
        ("lnT", ParamTy::F32),
    ];
    let k = Kb::kernel(ctx, module, name, &params)?;
    let (q, kk, norms, delta) = (k.param_ptr(0), k.param_ptr(1), k.param_ptr(2), k.param_ptr(3));
    let (t_len, ln_t) = (k.param_int(4), k.param_f32(5));
    let f = &s.rule.formula;
    let tid = k.sreg("tid.x");
    let lw = lane_warp(&k, tid);
    let (lane, warp) = lw;
    let m = k.sreg("ctaid.x");
    let bh = k.sreg("ctaid.y");
    let mt = k.sreg("nctaid.x");
    let aqs = k.f32(s.qscale.abs());
    let mut st: [Option<FloatValue<'ctx>>; Stat::ALL.len()] = [None; Stat::ALL.len()];
    st[Stat::LnEps as usize] = Some(k.f32(s.log_eps));
    st[Stat::LnT as usize] = Some(ln_t);
    st[Stat::Scale as usize] = Some(k.f32(s.scale.abs()));
    match s.bound {
        BoundSrc::Static { q_max, k_max } => {
            for (x, v) in
                [(Stat::QMax, q_max), (Stat::QTile, q_max), (Stat::KMax, k_max), (Stat::KCausal, k_max)]
            {
                st[x as usize] = Some(k.f32(v));
            }
        }
        BoundSrc::Norms if needs_norms(s.rule, &s.score, s.bound) => {
            // Every thread folds a stride of the head's tiles: all (q, k) and k of tiles <= m,
            // FOLD_TILES tiles per step with their loads issued together. A tile index past the
            // head repeats its last tile (maxima: a repeat changes nothing; it counts for k of
            // tiles <= m only when the last tile itself does).
            let acc: Vec<_> = (0..3).map(|_| k.declare_var(k.f32(0.0).into())).collect();
            let row = k.mul(k.sext64(bh), k.sext64(mt));
            let step = k.i32((ROW_THREADS * FOLD_TILES) as i64);
            k.for_range(tid, mt, step, |k, j0| {
                let tiles: Vec<_> = (0..FOLD_TILES)
                    .map(|u| {
                        let j = k.smin(k.addc(j0, (u * ROW_THREADS) as i64), k.addc(mt, -1));
                        let at = k.mulc(k.add(row, k.sext64(j)), 2);
                        (j, k.load_f(DType::F32, norms, at), k.load_f(DType::F32, norms, k.addc(at, 1)))
                    })
                    .collect();
                for (j, nq, nk) in tiles {
                    k.def_var(acc[0], k.fmax(k.use_f(acc[0]), nq));
                    k.def_var(acc[1], k.fmax(k.use_f(acc[1]), nk));
                    let seen = k.icmp(IntPredicate::SLE, j, m);
                    k.def_var(acc[2], k.select_f(seen, k.fmax(k.use_f(acc[2]), nk), k.use_f(acc[2])));
                }
            });
            let vals: Vec<_> = acc.iter().map(|v| k.use_f(*v)).collect();
            let r = block_reduce(&k, &format!("{name}_norms"), &vals, lw, false);
            let q_tile = k.load_f(DType::F32, norms, k.mulc(k.add(row, k.sext64(m)), 2));
            st[Stat::QMax as usize] = Some(k.fmul(aqs, k.sqrt(r[0])));
            st[Stat::KMax as usize] = Some(k.sqrt(r[1]));
            st[Stat::KCausal as usize] = Some(k.sqrt(r[2]));
            st[Stat::QTile as usize] = Some(k.fmul(aqs, k.sqrt(q_tile)));
        }
        BoundSrc::Norms => {}
    }
    let out_idx = k.add(k.mul(k.sext64(bh), k.sext64(mt)), k.sext64(m));
    if !f.stats_under(&s.score).iter().any(|x| x.per_row()) {
        let t0 = k.icmpc(IntPredicate::EQ, tid, 0);
        k.if_then(t0, |k| {
            let v = f.emit(&s.score, &mut Llvm { k, stats: st });
            k.store_f(DType::F32, delta, out_idx, v);
        });
        return k.finish();
    }
    // Row statistics, one warp per row; the tile's minimum over its rows.
    let wmin = k.declare_var(k.f32(f64::INFINITY).into());
    let i0 = k.mulc(m, s.bm as i64);
    let last = k.smin(k.addc(i0, s.bm as i64), t_len);
    let bh_base = k.mul(k.sext64(bh), k.sext64(t_len));
    let kbh_base = kv_rows(&k, bh, t_len, s.kv_group);
    let sqk = k.f32(s.scale * s.qscale);
    k.for_range(k.add(i0, warp), last, k.i32(WARPS as i64), |k, i| {
        let base = k.mul(k.add(bh_base, k.sext64(i)), k.i64(s.d as i64));
        let kbase = k.mul(k.add(kbh_base, k.sext64(i)), k.i64(s.d as i64));
        let qv = load_row(k, s.dts.0, q, base, lane, s.d);
        let kv = load_row(k, s.dts.1, kk, kbase, lane, s.d);
        let (mut qq, mut qk) = (k.f32(0.0), k.f32(0.0));
        for (a, b) in qv.iter().zip(&kv) {
            qq = k.fma(*a, *a, qq);
            qk = k.fma(*a, *b, qk);
        }
        let mut st = st;
        st[Stat::QRow as usize] = Some(k.fmul(aqs, k.sqrt(k.warp_sum(qq))));
        st[Stat::Sii as usize] = Some(k.fmul(sqk, k.warp_sum(qk)));
        let v = f.emit(&s.score, &mut Llvm { k, stats: st });
        k.def_var(wmin, k.fmin(k.use_f(wmin), v));
    });
    let r = block_reduce(&k, &format!("{name}_min"), &[k.use_f(wmin)], lw, true);
    let t0 = k.icmpc(IntPredicate::EQ, tid, 0);
    k.if_then(t0, |k| k.store_f(DType::F32, delta, out_idx, r[0]));
    k.finish()
}
