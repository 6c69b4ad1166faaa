//! The NVPTX `threshold` kernels: per-tile norms, then `delta` of every query tile from the
//! rule's formula. The formula is rendered by the one walk over it (`RuleExpr::emit`) with LLVM
//! f32 instructions; this file only computes the statistics the formula reads.
//!
//! - [`build_threshold_norms`]: `norms [BH, Mt, 2]`, the largest squared norm of q and of k
//!   over the rows of each query tile (one block per tile).
//! - [`build_threshold_delta`]: one block per (tile m, head); head statistics (`q_max`,
//!   `k_max`) and `k_causal` (keys of tiles `0..=m`) are block maxima over the norms buffer,
//!   `q_tile` is tile m's entry, the row statistics (`q_i`, `s_ii`) come from the rows.
//! - [`build_threshold_fused`], for a formula of norm statistics without row statistics
//!   ([`fuses_delta`]): the norms kernel, whose last block of each head (a per-head arrival
//!   counter) then evaluates `delta` of all the head's tiles. One launch instead of two: the
//!   threshold is on the way to the attention beside the gate scan, and at small shapes the
//!   second launch made it the longer of the two (docs/GPU_KERNEL.md, run 16).
//!
//! The attention's q may be `s q'` with `s` folded away (`module.rs`, `resolve_q`): the kernels
//! read q', so data statistics of q are multiplied by `|s|` and `s_ii` by `s` here; a static
//! bound is already a bound on `s q'`.

use super::builder::control::Var;
use super::builder::{KernelBuilder, ParamTy};
use super::kernels::{lane_warp, load_row, ROW_THREADS};
use inkwell::context::Context;
use inkwell::module::Module;
use inkwell::values::{FloatValue, FunctionValue, IntValue, PointerValue};
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

/// Threads per block of the norms kernels: 8 warps, so that one step of 16-byte loads covers a
/// 128-row tile at D = 128 (device call B: the 128-thread kernel took four steps, 6.5-7.1 us
/// at 1x1x2048x128, longer than the gate scan beside it), at ~90 registers two blocks per SM.
pub const NORM_THREADS: u32 = 256;
const NORM_WARPS: u32 = NORM_THREADS / 32;
/// Rows per lane group and step of [`vector_rows`] at most (64 registers of loads in flight
/// per lane, as [`norm_rows`] has).
const MAX_SLOTS: u32 = 8;

/// Tiles of the head's norms each thread of the delta kernel loads at once.
const FOLD_TILES: u32 = 4;

/// The formula's statistics as LLVM values, indexed by [`Stat`] (None: not computed).
type Stats<'ctx> = [Option<FloatValue<'ctx>>; Stat::ALL.len()];

/// Renders the formula's operations as LLVM f32 instructions over precomputed statistics.
struct Llvm<'a, 'b, 'ctx> {
    k: &'a Kb<'b, 'ctx>,
    stats: Stats<'ctx>,
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

/// Combine per-thread values `vals` over a block of `warps` warps with `op` (max or min): warp
/// reduction, then every thread reads the warps' results from shared memory (so all threads
/// hold them).
fn block_reduce<'ctx>(
    k: &Kb<'_, 'ctx>,
    name: &str,
    vals: &[FloatValue<'ctx>],
    (lane, warp): (IntValue<'ctx>, IntValue<'ctx>),
    warps: u32,
    min: bool,
) -> Vec<FloatValue<'ctx>> {
    let op = |a, b| if min { k.fmin(a, b) } else { k.fmax(a, b) };
    let sh = k.shared_f32(name, warps * vals.len() as u32);
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
            let at = k.addc(warp, (s as u32 * warps) as i64);
            k.store(k.shared_at(sh, at), *v);
        }
    });
    k.barrier();
    (0..vals.len())
        .map(|s| {
            let mut v = k.load_f32(k.shared_at(sh, k.i32((s as u32 * warps) as i64)));
            for w in 1..warps {
                v = op(v, k.load_f32(k.shared_at(sh, k.i32((s as u32 * warps + w) as i64))));
            }
            v
        })
        .collect()
}

/// Inclusive running maximum of `v` over the threads of a block of `warps` warps, in thread
/// order, and the block's maximum: a warp scan (`shfl.up`; a lane below the distance keeps its
/// own value, which max leaves unchanged), then the maxima of the warps before this one from
/// shared memory. Ends with a barrier, so the caller may call it again in a loop.
fn block_scan_max<'ctx>(
    k: &Kb<'_, 'ctx>,
    name: &str,
    v: FloatValue<'ctx>,
    (lane, warp): (IntValue<'ctx>, IntValue<'ctx>),
    warps: u32,
) -> (FloatValue<'ctx>, FloatValue<'ctx>) {
    let mut x = v;
    for dist in [1, 2, 4, 8, 16] {
        x = k.fmax(x, k.shfl_up(x, dist));
    }
    let sh = k.shared_f32(name, warps);
    k.if_then(k.icmpc(IntPredicate::EQ, lane, 31), |k| k.store(k.shared_at(sh, warp), x));
    k.barrier();
    let (mut before, mut total) = (x, x);
    for w in 0..warps {
        let m = k.load_f32(k.shared_at(sh, k.i32(w as i64)));
        let earlier = k.icmpc(IntPredicate::UGT, warp, w as i64);
        before = k.select_f(earlier, k.fmax(before, m), before);
        total = k.fmax(total, m);
    }
    k.barrier();
    (before, total)
}

/// The largest squared norms of q and k over the rows of a query tile (every thread gets them).
struct TileNorms<'ctx> {
    q: FloatValue<'ctx>,
    k: FloatValue<'ctx>,
}

/// Where the norms kernels read: q and k (their dtypes), the first query row of the head,
/// the first key row of its kv head, the tile's rows `[i0, last)`, the head dim.
#[derive(Clone, Copy)]
struct Rows<'ctx> {
    q: PointerValue<'ctx>,
    k: PointerValue<'ctx>,
    dts: (DType, DType),
    q_base: IntValue<'ctx>,
    k_base: IntValue<'ctx>,
    i0: IntValue<'ctx>,
    last: IntValue<'ctx>,
    d: u32,
}

/// The running maxima of a thread's squared row norms.
#[derive(Clone, Copy)]
struct Maxima<'ctx> {
    q: Var<'ctx>,
    k: Var<'ctx>,
}

impl<'ctx> Maxima<'ctx> {
    fn add(&self, k: &Kb<'_, 'ctx>, sq: FloatValue<'ctx>, sk: FloatValue<'ctx>) {
        k.def_var(self.q, k.fmax(k.use_f(self.q), sq));
        k.def_var(self.k, k.fmax(k.use_f(self.k), sk));
    }
}

/// The lane layout of 16-byte row loads: each lane loads `elems` elements of a row, `lanes`
/// lanes cover a row, a warp covers `rows` rows at once. For q and k of one dtype whose rows
/// split into 16-byte pieces over a power-of-two number of lanes (bf16 D = 8 .. 256).
#[derive(Clone, Copy)]
struct VecRows {
    elems: u32,
    lanes: u32,
    rows: u32,
}

impl VecRows {
    fn of(d: u32, (q_dt, k_dt): (DType, DType)) -> Option<VecRows> {
        if q_dt != k_dt || !q_dt.is_float() {
            return None;
        }
        let elems = (16 / q_dt.size_bytes()) as u32;
        let lanes = d / elems;
        if !d.is_multiple_of(elems) || !(1..=32).contains(&lanes) || !32u32.is_multiple_of(lanes) {
            return None;
        }
        Some(VecRows { elems, lanes, rows: 32 / lanes })
    }
}

/// Rows of the tile in 16-byte pieces ([`VecRows`]): `slots` rows per lane group and step, all
/// their loads issued before any arithmetic, each row's sum over its lanes by butterflies
/// inside the group. A row past the tile repeats the tile's last row.
fn vector_rows<'ctx>(
    k: &Kb<'_, 'ctx>,
    v: VecRows,
    r: &Rows<'ctx>,
    acc: Maxima<'ctx>,
    (lane, warp): (IntValue<'ctx>, IntValue<'ctx>),
    (warps, bm): (u32, u32),
) {
    let slots = bm.div_ceil(warps * v.rows).clamp(1, MAX_SLOTS);
    let per_warp = slots * v.rows;
    let (sub, col) = (k.udivc(lane, v.lanes as i64), k.uremc(lane, v.lanes as i64));
    let col_off = k.sext64(k.mulc(col, v.elems as i64));
    let load = |k: &Kb<'_, 'ctx>, dt: DType, p: PointerValue<'ctx>, base: IntValue<'ctx>, row| {
        let at = k.add(k.mul(k.add(base, k.sext64(row)), k.i64(r.d as i64)), col_off);
        let ty = k.elem_type(dt).into_float_type().vec_type(v.elems);
        let x = k.load_aligned(ty.into(), k.gep_dt(dt, p, at), 16).into_vector_value();
        (0..v.elems as i64)
            .map(|e| {
                let x = k.extract_f(x, e);
                if dt == DType::F32 {
                    x
                } else {
                    k.fpext(x)
                }
            })
            .collect::<Vec<_>>()
    };
    let start = k.add(r.i0, k.mulc(warp, per_warp as i64));
    k.for_range(start, r.last, k.i32((warps * per_warp) as i64), |k, i| {
        let rows: Vec<_> = (0..slots)
            .map(|s| {
                let row = k.smin(k.add(k.addc(i, (s * v.rows) as i64), sub), k.addc(r.last, -1));
                (load(k, r.dts.0, r.q, r.q_base, row), load(k, r.dts.1, r.k, r.k_base, row))
            })
            .collect();
        for (qv, kv) in &rows {
            let (mut sq, mut sk) = (k.f32(0.0), k.f32(0.0));
            for (a, b) in qv.iter().zip(kv) {
                sq = k.fma(*a, *a, sq);
                sk = k.fma(*b, *b, sk);
            }
            let mut m = v.lanes / 2;
            while m > 0 {
                sq = k.fadd(sq, k.shfl_xor(sq, m as i64));
                sk = k.fadd(sk, k.shfl_xor(sk, m as i64));
                m /= 2;
            }
            acc.add(k, sq, sk);
        }
    });
}

/// Rows of the tile one per warp at a time, element by element ([`load_row`]; any dtype and
/// head dim): [`norm_rows`] rows per warp and step, all their loads issued before any
/// arithmetic (the kernel is bound by the bytes in flight). A row past the tile repeats the
/// tile's last row (its norms are already in the maxima).
fn scalar_rows<'ctx>(
    k: &Kb<'_, 'ctx>,
    r: &Rows<'ctx>,
    acc: Maxima<'ctx>,
    (lane, warp): (IntValue<'ctx>, IntValue<'ctx>),
    warps: u32,
) {
    let nrows = norm_rows(r.d);
    let step = k.i32((warps * nrows) as i64);
    k.for_range(k.add(r.i0, warp), r.last, step, |k, i| {
        let rows: Vec<_> = (0..nrows)
            .map(|n| {
                let row = k.smin(k.addc(i, (n * warps) as i64), k.addc(r.last, -1));
                let base = k.mul(k.add(r.q_base, k.sext64(row)), k.i64(r.d as i64));
                let kbase = k.mul(k.add(r.k_base, k.sext64(row)), k.i64(r.d as i64));
                (load_row(k, r.dts.0, r.q, base, lane, r.d), load_row(k, r.dts.1, r.k, kbase, lane, r.d))
            })
            .collect();
        for (qv, kv) in &rows {
            let (mut sq, mut sk) = (k.f32(0.0), k.f32(0.0));
            for (a, b) in qv.iter().zip(kv) {
                sq = k.fma(*a, *a, sq);
                sk = k.fma(*b, *b, sk);
            }
            acc.add(k, k.warp_sum(sq), k.warp_sum(sk));
        }
    });
}

/// The norms of tile `m` of head `bh`, over a block of [`NORM_THREADS`]: 16-byte loads
/// ([`vector_rows`]) where the layout allows and q and k are 16-byte aligned (a runtime test:
/// a torch view may start anywhere), element loads ([`scalar_rows`]) otherwise.
#[allow(clippy::too_many_arguments)]
fn tile_norms<'ctx>(
    k: &Kb<'_, 'ctx>,
    name: &str,
    (q, kk): (PointerValue<'ctx>, PointerValue<'ctx>),
    dts: (DType, DType),
    (d, kv_group, bm): (u32, u32, u32),
    (m, bh, t_len): (IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>),
    lw: (IntValue<'ctx>, IntValue<'ctx>),
) -> TileNorms<'ctx> {
    let acc = Maxima { q: k.declare_var(k.f32(0.0).into()), k: k.declare_var(k.f32(0.0).into()) };
    let i0 = k.mulc(m, bm as i64);
    let r = Rows {
        q,
        k: kk,
        dts,
        q_base: k.mul(k.sext64(bh), k.sext64(t_len)),
        k_base: kv_rows(k, bh, t_len, kv_group),
        i0,
        last: k.smin(k.addc(i0, bm as i64), t_len),
        d,
    };
    match VecRows::of(d, dts) {
        Some(v) => {
            let addr_bits = k.or(k.ptr_to_i64(q), k.ptr_to_i64(kk));
            let aligned = k.icmpc(IntPredicate::EQ, k.andc(addr_bits, 15), 0);
            k.if_then(aligned, |k| vector_rows(k, v, &r, acc, lw, (NORM_WARPS, bm)));
            k.if_then(k.not(aligned), |k| scalar_rows(k, &r, acc, lw, NORM_WARPS));
        }
        None => scalar_rows(k, &r, acc, lw, NORM_WARPS),
    }
    let vals = [k.use_f(acc.q), k.use_f(acc.k)];
    let r = block_reduce(k, &format!("{name}_max"), &vals, lw, NORM_WARPS, false);
    TileNorms { q: r[0], k: r[1] }
}

/// Per-tile maxima of squared norms: params `(q, k, norms: f32 [BH, Mt, 2], T: i32)`.
/// Grid `(Mt, BH)`, block [`NORM_THREADS`].
pub fn build_threshold_norms<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    name: &str,
    d: u32,
    kv_group: u32,
    dts: (DType, DType),
    bm: u32,
) -> R<FunctionValue<'ctx>> {
    let params = [("q", ParamTy::Ptr), ("k", ParamTy::Ptr), ("norms", ParamTy::Ptr), ("T", ParamTy::I32)];
    let k = Kb::kernel(ctx, module, name, &params)?;
    let (q, kk, norms, t_len) = (k.param_ptr(0), k.param_ptr(1), k.param_ptr(2), k.param_int(3));
    let tid = k.sreg("tid.x");
    let lw = lane_warp(&k, tid);
    let (m, bh, mt) = (k.sreg("ctaid.x"), k.sreg("ctaid.y"), k.sreg("nctaid.x"));
    let n = tile_norms(&k, name, (q, kk), dts, (d, kv_group, bm), (m, bh, t_len), lw);
    k.if_then(k.icmpc(IntPredicate::EQ, tid, 0), |k| store_norms(k, norms, (m, bh, mt), &n));
    k.finish()
}

/// Tile `m`'s entry of the norms buffer `[BH, Mt, 2]`.
fn store_norms<'ctx>(
    k: &Kb<'_, 'ctx>,
    norms: PointerValue<'ctx>,
    (m, bh, mt): (IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>),
    n: &TileNorms<'ctx>,
) {
    let tile = k.add(k.mul(k.sext64(bh), k.sext64(mt)), k.sext64(m));
    k.store_f(DType::F32, norms, k.mulc(tile, 2), n.q);
    k.store_f(DType::F32, norms, k.addc(k.mulc(tile, 2), 1), n.k);
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

/// Whether the threshold is one kernel ([`build_threshold_fused`]): the formula reads the norms
/// buffer and no row statistic (a row statistic reads the tile's rows, one block per tile).
pub fn fuses_delta(s: &DeltaSpec) -> bool {
    needs_norms(s.rule, &s.score, s.bound)
        && !s.rule.formula.stats_under(&s.score).iter().any(|x| x.per_row())
}

/// The statistics every formula may read that do not come from the data.
fn constant_stats<'ctx>(k: &Kb<'_, 'ctx>, s: &DeltaSpec, ln_t: FloatValue<'ctx>) -> Stats<'ctx> {
    let mut st: Stats<'ctx> = [None; Stat::ALL.len()];
    st[Stat::LnEps as usize] = Some(k.f32(s.log_eps));
    st[Stat::LnT as usize] = Some(ln_t);
    st[Stat::Scale as usize] = Some(k.f32(s.scale.abs()));
    st
}

/// Sets the norm statistics from maxima of squared norms (over the head: q, k; over the keys of
/// tiles `<= m`: k; over tile m: q). q' norms are scaled by the folded factor `|qscale|`.
fn set_norm_stats<'ctx>(
    k: &Kb<'_, 'ctx>,
    st: &mut Stats<'ctx>,
    s: &DeltaSpec,
    (q_max, k_max, k_causal, q_tile): (
        FloatValue<'ctx>,
        FloatValue<'ctx>,
        FloatValue<'ctx>,
        FloatValue<'ctx>,
    ),
) {
    let aqs = k.f32(s.qscale.abs());
    st[Stat::QMax as usize] = Some(k.fmul(aqs, k.sqrt(q_max)));
    st[Stat::KMax as usize] = Some(k.sqrt(k_max));
    st[Stat::KCausal as usize] = Some(k.sqrt(k_causal));
    st[Stat::QTile as usize] = Some(k.fmul(aqs, k.sqrt(q_tile)));
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
    let mut st = constant_stats(&k, s, ln_t);
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
            let r = block_reduce(&k, &format!("{name}_norms"), &vals, lw, WARPS, false);
            let q_tile = k.load_f(DType::F32, norms, k.mulc(k.add(row, k.sext64(m)), 2));
            set_norm_stats(&k, &mut st, s, (r[0], r[1], r[2], q_tile));
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
    let r = block_reduce(&k, &format!("{name}_min"), &[k.use_f(wmin)], lw, WARPS, true);
    let t0 = k.icmpc(IntPredicate::EQ, tid, 0);
    k.if_then(t0, |k| k.store_f(DType::F32, delta, out_idx, r[0]));
    k.finish()
}

/// The threshold in one kernel, for [`fuses_delta`] formulas: params `(q, k, norms: f32
/// [BH, Mt, 2], delta: f32 [BH, Mt], arrived: i32 [BH], T: i32, lnT: f32)`. Grid `(Mt, BH)`,
/// block [`NORM_THREADS`]. `arrived` must be zero at the first launch; the kernel leaves it zero.
///
/// Each block writes its tile's norms (as [`build_threshold_norms`]) and counts itself in at
/// its head's `arrived`; the block that arrives last, which sees every norm of the head, resets
/// the counter and evaluates `delta` of all the head's tiles (as [`build_threshold_delta`], the
/// same maxima: bit-identical deltas).
pub fn build_threshold_fused<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    name: &str,
    s: &DeltaSpec,
) -> R<FunctionValue<'ctx>> {
    if !fuses_delta(s) {
        return Err(format!("{name}: the formula is not one of norm statistics only"));
    }
    let params = [
        ("q", ParamTy::Ptr),
        ("k", ParamTy::Ptr),
        ("norms", ParamTy::Ptr),
        ("delta", ParamTy::Ptr),
        ("arrived", ParamTy::Ptr),
        ("T", ParamTy::I32),
        ("lnT", ParamTy::F32),
    ];
    let k = Kb::kernel(ctx, module, name, &params)?;
    let (q, kk, norms, delta, arrived) =
        (k.param_ptr(0), k.param_ptr(1), k.param_ptr(2), k.param_ptr(3), k.param_ptr(4));
    let (t_len, ln_t) = (k.param_int(5), k.param_f32(6));
    let tid = k.sreg("tid.x");
    let lw = lane_warp(&k, tid);
    let (m, bh, mt) = (k.sreg("ctaid.x"), k.sreg("ctaid.y"), k.sreg("nctaid.x"));
    let n = tile_norms(&k, name, (q, kk), s.dts, (s.d, s.kv_group, s.bm), (m, bh, t_len), lw);

    // Thread 0 writes the norms, then releases them and counts the block in; the last block's
    // thread 0 acquires every other block's norms and hands them on to its block through the
    // barrier. (The counter is reset by the last block: nothing else touches it in this launch.)
    let last = k.declare_var(k.bool(false).into());
    k.if_then(k.icmpc(IntPredicate::EQ, tid, 0), |k| {
        store_norms(k, norms, (m, bh, mt), &n);
        k.fence_acq_rel_gpu();
        let counter = k.gep_dt(DType::I32, arrived, k.sext64(bh));
        let before = k.atomic_add_i32(counter, k.i32(1));
        let is_last = k.icmp(IntPredicate::EQ, before, k.addc(mt, -1));
        k.if_then(is_last, |k| {
            k.store(counter, k.i32(0));
            k.fence_acq_rel_gpu();
        });
        k.def_var(last, is_last);
    });
    let last = k.barrier_any(k.use_var(last).into_int_value());
    k.if_then(last, |k| head_delta(k, name, s, (norms, delta), (bh, mt, ln_t), (tid, lw)));
    k.finish()
}

/// `delta` of every tile of head `bh` from the head's tile norms (run by one whole block):
/// the head maxima by a strided fold and a block reduction, `k_causal` of tile `m` (the keys of
/// tiles `<= m`) by a running maximum over the tiles in order, one tile per thread and round.
fn head_delta<'ctx>(
    k: &Kb<'_, 'ctx>,
    name: &str,
    s: &DeltaSpec,
    (norms, delta): (PointerValue<'ctx>, PointerValue<'ctx>),
    (bh, mt, ln_t): (IntValue<'ctx>, IntValue<'ctx>, FloatValue<'ctx>),
    (tid, lw): (IntValue<'ctx>, (IntValue<'ctx>, IntValue<'ctx>)),
) {
    let threads = NORM_THREADS;
    let row = k.mul(k.sext64(bh), k.sext64(mt));
    let entry = |k: &Kb<'_, 'ctx>, j: IntValue<'ctx>, slot: i64| {
        k.load_f(DType::F32, norms, k.addc(k.mulc(k.add(row, k.sext64(j)), 2), slot))
    };
    let acc: Vec<_> = (0..2).map(|_| k.declare_var(k.f32(0.0).into())).collect();
    k.for_range(tid, mt, k.i32(threads as i64), |k, j| {
        k.def_var(acc[0], k.fmax(k.use_f(acc[0]), entry(k, j, 0)));
        k.def_var(acc[1], k.fmax(k.use_f(acc[1]), entry(k, j, 1)));
    });
    let vals: Vec<_> = acc.iter().map(|v| k.use_f(*v)).collect();
    let head = block_reduce(k, &format!("{name}_head"), &vals, lw, NORM_WARPS, false);
    // Tiles in rounds of one per thread; `seen` carries the keys' maximum of earlier rounds
    // (0: squared norms are not negative, as the delta kernel's fold starts).
    let reads_causal = s.rule.formula.stats_under(&s.score).contains(&Stat::KCausal);
    let seen = k.declare_var(k.f32(0.0).into());
    k.for_range(k.i32(0), mt, k.i32(threads as i64), |k, j0| {
        let j = k.add(j0, tid);
        let jc = k.smin(j, k.addc(mt, -1));
        let (q_tile, k_tile) = (entry(k, jc, 0), entry(k, jc, 1));
        // (Only a formula that reads k_causal pays for the scan and its barriers.)
        let k_causal = if reads_causal {
            let (upto, round) = block_scan_max(k, &format!("{name}_causal"), k_tile, lw, NORM_WARPS);
            let before = k.use_f(seen);
            k.def_var(seen, k.fmax(before, round));
            k.fmax(before, upto)
        } else {
            head[1]
        };
        let mut st = constant_stats(k, s, ln_t);
        set_norm_stats(k, &mut st, s, (head[0], head[1], k_causal, q_tile));
        let v = s.rule.formula.emit(&s.score, &mut Llvm { k, stats: st });
        k.if_then(k.icmp(IntPredicate::SLT, j, mt), |k| {
            k.store_f(DType::F32, delta, k.add(row, k.sext64(j)), v);
        });
    });
}

#[cfg(test)]
mod tests {
    use super::VecRows;
    use foxc_ir::DType;

    /// 16-byte pieces over a power-of-two number of lanes, for q and k of one dtype only.
    #[test]
    fn vector_rows_cover_a_row_with_whole_16_byte_pieces() {
        let of = |d, dts| VecRows::of(d, dts).map(|v| (v.elems, v.lanes, v.rows));
        let bf = (DType::BF16, DType::BF16);
        assert_eq!(of(128, bf), Some((8, 16, 2)));
        assert_eq!(of(64, bf), Some((8, 8, 4)));
        assert_eq!(of(256, bf), Some((8, 32, 1)));
        assert_eq!(of(64, (DType::F32, DType::F32)), Some((4, 16, 2)));
        assert_eq!(of(96, bf), None, "12 lanes do not divide a warp");
        assert_eq!(of(512, bf), None, "64 lanes per row");
        assert_eq!(of(36, bf), None, "72-byte rows");
        assert_eq!(of(128, (DType::BF16, DType::F32)), None, "two dtypes");
    }
}
