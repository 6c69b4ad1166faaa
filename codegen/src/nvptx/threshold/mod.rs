//! The NVPTX `threshold` kernels: per-tile norms, then `delta` of every query tile from the
//! rule's formula. The formula is rendered by the one walk over it (`RuleExpr::emit`) with LLVM
//! f32 instructions; this module only computes the statistics the formula reads
//! ([`tile_norms`], [`block`]; the formula's values: [`formula`]).
//!
//! - [`build_threshold_norms`]: `norms [BH, Mt, 2]`, the largest squared norm of q and of k
//!   over the rows of each query tile (one block per tile).
//! - [`build_threshold_delta`]: one block per (tile m, head); head statistics (`q_max`,
//!   `k_max`) and `k_causal` (keys of tiles `0..=m`) are block maxima over the norms buffer,
//!   `q_tile` is tile m's entry, the row statistics (`q_i`, `s_ii`) come from the rows.
//! - [`build_threshold_fused`], for a threshold with `plan = one_launch` (the `fuse-threshold`
//!   pass's decision, for formulas of norm statistics without row statistics: [`fuses_delta`]
//!   checks it again): the norms kernel, whose last block of each head (a per-head arrival
//!   counter) then evaluates `delta` of all the head's tiles. One launch instead of two: the
//!   threshold is on the way to the attention beside the gate scan, and at small shapes the
//!   second launch made it the longer of the two.
//!
//! The threshold's q may be `s q'` with `s` folded into its scale attribute as the q factor (the
//! `fold-q-scale` pass, [`foxc_ir::Scale::q`]): the kernels read q', so data statistics of q are
//! multiplied by `|s|` and `s_ii` by `s` here; a static bound is already a bound on `s q'`.
//!
//! Where q is a load map, every kernel computes it on the q elements it loads ([`q_map`]); its
//! arguments follow each kernel's own.

mod formula;
pub(crate) mod params;
mod q_map;
mod tile_norms;

pub use q_map::QMap;
pub use tile_norms::NORM_THREADS;

use super::builder::KernelBuilder;
use super::heads::kv_rows;
use super::kernels::{
    lane_warp, load_row, row_prefix, scan_gate_row, GateRow, RowPart, ScanScratch, ScanShape, ScanTerm,
    ROW_THREADS,
};
use crate::nvptx::block_reduce::{block_reduce, block_scan_max};
use formula::{constant_stats, set_given_stat, set_norm_stats, Llvm};
use inkwell::context::Context;
use inkwell::module::Module;
use inkwell::values::{FloatValue, FunctionValue, IntValue, PointerValue};
use inkwell::IntPredicate;
use q_map::load_q_row;
use tile_norms::{store_norms, tile_norms};

use foxc_ir::prune_rule::Stat;
use foxc_ir::{DType, GateKind, PruneRule, ScoreBound};

type R<T> = Result<T, String>;
type Kb<'a, 'ctx> = KernelBuilder<'a, 'ctx>;

const WARPS: u32 = ROW_THREADS / 32;
/// Warps of the one-kernel threshold's blocks (its last block evaluates the head's deltas).
const NORM_WARPS: u32 = NORM_THREADS / 32;

/// Tiles of the head's norms each thread of the delta kernel loads at once.
const FOLD_TILES: u32 = 4;

/// Per-tile maxima of squared norms: params `(q, k, norms: f32 [BH, Mt, 2], T: i32)`.
/// Grid `(Mt, BH)`, block [`NORM_THREADS`]. With `fewer_queries`, `T` is the keys' length, the
/// tiles are the keys' and a last parameter `Tq: i32` gives the queries' (q's norms of a tile
/// past them are of its last row: [`tile_norms`]). q's load map's arguments follow.
#[allow(clippy::too_many_arguments)]
pub fn build_threshold_norms<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    name: &str,
    d: u32,
    kv_group: u32,
    dts: (DType, DType),
    bm: u32,
    fewer_queries: bool,
    q_map: Option<&QMap>,
) -> R<FunctionValue<'ctx>> {
    let own = params::norms_signature(fewer_queries);
    let q_map = q_map.map(|m| m.reading_from(own.len()));
    let k = kernel(ctx, module, name, &QMap::signature(q_map.as_ref(), own))?;
    let p = params::NormsParams::numbers(fewer_queries);
    let (q, kk, norms, t_len) =
        (k.param_ptr(p.q), k.param_ptr(p.k), k.param_ptr(p.norms), k.param_int(p.rows));
    let tq = p.tq.map(|n| k.param_int(n));
    let tid = k.sreg("tid.x");
    let lw = lane_warp(&k, tid);
    let (m, bh, mt) = (k.sreg("ctaid.x"), k.sreg("ctaid.y"), k.sreg("nctaid.x"));
    let n = tile_norms(&k, name, (q, kk, q_map.as_ref()), dts, (d, kv_group, bm), (m, bh, t_len), tq, lw);
    k.if_then(k.icmpc(IntPredicate::EQ, tid, 0), |k| store_norms(k, norms, (m, bh, mt), &n));
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
    /// The attention's scale without its q factor (signed).
    pub scale: f64,
    /// The scale's q factor (`q = qscale q'`; 1 when none).
    pub qscale: f64,
    pub bm: u32,
    pub bound: BoundSrc,
    /// Queries fewer than keys (the delta kernel's last parameter `Tk`; its `T` is the
    /// queries', `lnT` the keys'): the norms buffer holds the keys' tiles
    /// ([`build_threshold_norms`]) and row `i`'s diagonal key is `i + Tk - T`. Not for a formula
    /// reading `k_causal`, whose key tiles would not end at a query tile's last position.
    pub fewer_queries: bool,
    /// q's load map, when the threshold's q is one: every kernel computes it on q's elements.
    pub q_map: Option<QMap>,
}

/// Whether the delta kernel reads the norms buffer ([`PruneRule::reads_norms`]).
pub fn needs_norms(rule: &PruneRule, score: &ScoreBound, bound: BoundSrc) -> bool {
    rule.reads_norms(score, bound == BoundSrc::Norms)
}

/// Whether the threshold is one kernel ([`build_threshold_fused`]): the formula reads the norms
/// and no row statistic ([`PruneRule::norms_only`]; a row statistic reads the tile's rows, one
/// block per tile).
pub fn fuses_delta(s: &DeltaSpec) -> bool {
    s.rule.norms_only(&s.score, s.bound == BoundSrc::Norms)
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
    let f = &s.rule.formula;
    if s.fewer_queries && f.stats_under(&s.score).contains(&Stat::KCausal) {
        return Err(format!("{name}: k_causal with queries fewer than keys"));
    }
    let own = params::delta_signature(s.fewer_queries);
    let q_map = s.q_map.as_ref().map(|m| m.reading_from(own.len()));
    let k = kernel(ctx, module, name, &QMap::signature(q_map.as_ref(), own))?;
    let p = params::DeltaParams::numbers(s.fewer_queries);
    let (q, kk, norms, delta) =
        (k.param_ptr(p.q), k.param_ptr(p.k), k.param_ptr(p.norms), k.param_ptr(p.delta));
    let (t_len, ln_t) = (k.param_int(p.t), k.param_f32(p.ln_t));
    let k_len = p.tk.map_or(t_len, |n| k.param_int(n));
    let tid = k.sreg("tid.x");
    let lw = lane_warp(&k, tid);
    let (lane, warp) = lw;
    let m = k.sreg("ctaid.x");
    let bh = k.sreg("ctaid.y");
    let mt = k.sreg("nctaid.x");
    // The norms' tiles: the queries' (one block each), or the keys' when queries are fewer.
    let nt = if s.fewer_queries { k.sdivc(k.addc(k_len, s.bm as i64 - 1), s.bm as i64) } else { mt };
    let aqs = k.f32(s.qscale.abs());
    let mut st = constant_stats(&k, s, ln_t);
    set_given_stat(&k, &mut st, s, bh);
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
            let row = k.mul(k.sext64(bh), k.sext64(nt));
            let step = k.i32((ROW_THREADS * FOLD_TILES) as i64);
            k.for_range(tid, nt, step, |k, j0| {
                let tiles: Vec<_> = (0..FOLD_TILES)
                    .map(|u| {
                        let j = k.smin(k.addc(j0, (u * ROW_THREADS) as i64), k.addc(nt, -1));
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
    // The row's diagonal key: row i of the keys (i + Tk - T when queries are fewer).
    let kbh_base = kv_rows(&k, bh, k_len, s.kv_group);
    let kbh_base = if s.fewer_queries { k.add(kbh_base, k.sext64(k.sub(k_len, t_len))) } else { kbh_base };
    let sqk = k.f32(s.scale * s.qscale);
    k.for_range(k.add(i0, warp), last, k.i32(WARPS as i64), |k, i| {
        let base = k.mul(k.add(bh_base, k.sext64(i)), k.i64(s.d as i64));
        let kbase = k.mul(k.add(kbh_base, k.sext64(i)), k.i64(s.d as i64));
        let qv = load_q_row(k, q_map.as_ref(), s.dts.0, q, base, lane, s.d, (i, bh));
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
/// One `norms_then_delta` per block.
pub fn build_threshold_fused<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    name: &str,
    s: &DeltaSpec,
) -> R<FunctionValue<'ctx>> {
    if !fuses_delta(s) {
        return Err(format!("{name}: the formula is not one of norm statistics only"));
    }
    let own = params::fused_signature(false);
    let q_map = s.q_map.as_ref().map(|m| m.reading_from(own.len()));
    let k = kernel(ctx, module, name, &QMap::signature(q_map.as_ref(), own))?;
    let io = FusedIo::params(&k, q_map);
    let (m, bh, mt) = (k.sreg("ctaid.x"), k.sreg("ctaid.y"), k.sreg("nctaid.x"));
    norms_then_delta(&k, name, s, &io, (m, bh, mt));
    k.finish()
}

/// The gate scan and the one-kernel threshold in one launch (an attention's `prelude =
/// joint`): params [`build_threshold_fused`]'s, then `(gate: [BH, T], c: f32 [BH, T])`. Block
/// [`NORM_THREADS`]; the first blocks in linear order scan the gate into `c`, the others are
/// the threshold's blocks of the tiles in order (`Mt` per head). Without `split` (grid
/// `(1 + Mt, BH)`) a block scans a whole row (segments of 8192 elements, as the scan kernel's;
/// a row of at most 4096 in one segment of 4096). With `split` (`prelude = joint(split rows)`,
/// grid `(S + Mt, BH)`, `S = ceil(T / SPLIT_SEGMENT)`) a row longer than 4096 takes a block per
/// 8192-element segment, each summing the segments before its own first.
pub fn build_threshold_with_scan<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    name: &str,
    s: &DeltaSpec,
    (kind, gate_dt): (GateKind, DType),
    split: bool,
) -> R<FunctionValue<'ctx>> {
    if !fuses_delta(s) {
        return Err(format!("{name}: the formula is not one of norm statistics only"));
    }
    let own = params::fused_signature(true);
    let q_map = s.q_map.as_ref().map(|m| m.reading_from(own.len()));
    let k = kernel(ctx, module, name, &QMap::signature(q_map.as_ref(), own))?;
    let io = FusedIo::params(&k, q_map);
    k.launch_bounds(NORM_THREADS, JOINT_BLOCKS);
    scans_then_tiles(&k, name, s, &io, (kind, gate_dt), split);
    k.finish()
}

/// [`build_threshold_with_scan`]'s blocks: the scans (a block per row, or with `split` per
/// segment of each row), then the tiles.
fn scans_then_tiles<'ctx>(
    k: &Kb<'_, 'ctx>,
    name: &str,
    s: &DeltaSpec,
    io: &FusedIo<'ctx>,
    (kind, gate_dt): (GateKind, DType),
    split: bool,
) {
    // In the order blocks are dispatched (linear, x fastest): the scans first, so that all
    // start in the first wave (a scan is a chain of segments: one dispatched with the last
    // head's tiles would run on alone after them), then the tiles, head by head. Split, a
    // row's segments run on as many blocks, each first summing the segments before its own
    // (row_prefix): the 256-thread block walks a whole row's segments one after another, slower
    // than the 1024-thread scan kernel; the last segments of all rows (the longest prefixes)
    // come first.
    let (nx, nbh) = (k.sreg("nctaid.x"), k.sreg("nctaid.y"));
    let lin = k.add(k.sreg("ctaid.x"), k.mul(k.sreg("ctaid.y"), nx));
    let nseg = split.then(|| k.sdivc(k.addc(io.t_len, SPLIT_SEGMENT - 1), SPLIT_SEGMENT));
    let nscan = nseg.map_or(nbh, |nseg| k.mul(nbh, nseg));
    k.if_else(
        k.icmp(IntPredicate::ULT, lin, nscan),
        "prelude",
        |k| {
            let scan = params::FusedParams::numbers(true).scan.expect("the joint prelude's parameters");
            let (gate, c) = (k.param_ptr(scan.gate), k.param_ptr(scan.c));
            let whole_row = GateRow { gate, c, t_len: io.t_len, bh: lin, reverse: false };
            let term = ScanTerm::Gate(kind);
            // Both shapes share one scratch (the longer's).
            let scratch = ScanScratch::new(k, name, PRELUDE_SCAN);
            // A row of at most SHORT_ROW elements (one segment) takes 16-element runs
            // (segments of 4096: less padding to scan), a longer one 32 (fewer segments).
            let short = k.icmpc(IntPredicate::SLE, io.t_len, SHORT_ROW);
            k.if_else(
                short,
                "scan",
                |k| {
                    scan_gate_row(k, scratch, (term, gate_dt), SHORT_SCAN, whole_row, None);
                    vec![]
                },
                |k| {
                    let Some(nseg) = nseg else {
                        scan_gate_row(k, scratch, (term, gate_dt), PRELUDE_SCAN, whole_row, None);
                        return vec![];
                    };
                    let (bh, seg) = row_segment(k, lin, nbh, nseg);
                    let row = GateRow { bh, ..whole_row };
                    // The first segment has no prefix: a row of one segment runs the scan
                    // alone, without the reduction's two barriers.
                    let zero = k.f32(0.0);
                    let carry = k.if_then_carry(
                        k.icmpc(IntPredicate::SGT, seg, 0),
                        ("prefix", "scan"),
                        &[("carry_hi", zero.into()), ("carry_lo", zero.into())],
                        |k| {
                            let (hi, lo) =
                                row_prefix(k, scratch, (term, gate_dt), PRELUDE_SCAN, row, (k.i32(0), seg));
                            vec![hi.into(), lo.into()]
                        },
                    );
                    let carry = (carry[0].into_float_value(), carry[1].into_float_value());
                    let part = RowPart { first: seg, end: k.addc(seg, 1), carry };
                    scan_gate_row(k, scratch, (term, gate_dt), PRELUDE_SCAN, row, Some(part));
                    vec![]
                },
            );
            vec![]
        },
        |k| {
            let (j, mt) = match nseg {
                None => (k.sub(lin, nbh), k.addc(nx, -1)),
                Some(nseg) => (k.sub(lin, nscan), k.sub(nx, nseg)),
            };
            let (m, bh) = (k.urem(j, mt), k.udiv(j, mt));
            norms_then_delta(k, name, s, io, (m, bh, mt));
            vec![]
        },
    );
}

/// The row and segment of scan block `lin` (`lin < nbh * nseg`; the last segments of all rows
/// first): `(lin mod nbh, nseg - 1 - lin / nbh)`. The quotient is at most `nseg - 1`, so it is
/// counted by subtraction (ptxas has no uniform divide; the SASS keeps the row's index in
/// per-thread registers all the same).
fn row_segment<'ctx>(
    k: &Kb<'_, 'ctx>,
    lin: IntValue<'ctx>,
    nbh: IntValue<'ctx>,
    nseg: IntValue<'ctx>,
) -> (IntValue<'ctx>, IntValue<'ctx>) {
    let out = k.while_loop(
        ("row_of", "next_row", "row_found"),
        &[("row", lin.into()), ("from_last", k.i32(0).into())],
        |k, v| k.icmp(IntPredicate::UGE, v[0].into_int_value(), nbh),
        |k, v| vec![k.sub(v[0].into_int_value(), nbh).into(), k.addc(v[1].into_int_value(), 1).into()],
    );
    let (bh, from_last) = (out[0].into_int_value(), out[1].into_int_value());
    (bh, k.sub(k.addc(nseg, -1), from_last))
}

/// Blocks of the joint kernel per multiprocessor that ptxas must allow (128 registers), as many
/// as the one-kernel threshold's 86 registers allow.
const JOINT_BLOCKS: u32 = 2;
/// The joint kernel's scan: [`NORM_THREADS`] threads owning 32 elements each, the same 8192
/// elements per segment as the scan kernel's 1024 x 8 (as many segments: their chain is what
/// the scan's time grows with).
const PRELUDE_SCAN: ScanShape = ScanShape { threads: NORM_THREADS, elems: 32 };
/// Rows up to this long are scanned in segments of 4096 ([`SHORT_SCAN`]): less padding to
/// load and scan in the row's one segment (measured faster at one head up to T = 4096). Longer
/// rows keep 8192: a shorter segment adds a link to the chain the scan's time grows with.
const SHORT_ROW: i64 = 4096;
const SHORT_SCAN: ScanShape = ScanShape { threads: NORM_THREADS, elems: 16 };
/// Elements of a row per scan block of the split joint kernel: one [`PRELUDE_SCAN`] segment (a
/// row of at most [`SHORT_ROW`] is one block too). Its launch's x extent is `ceil(T / bm)` tiles
/// plus `ceil(T / SPLIT_SEGMENT)` scan blocks per head.
pub const SPLIT_SEGMENT: i64 = (PRELUDE_SCAN.threads * PRELUDE_SCAN.elems) as i64;

/// The one-kernel threshold's buffers and sizes ([`params::FusedParams`]), and q's load map
/// reading its arguments after them.
#[derive(Clone)]
struct FusedIo<'ctx> {
    q: PointerValue<'ctx>,
    k: PointerValue<'ctx>,
    norms: PointerValue<'ctx>,
    delta: PointerValue<'ctx>,
    arrived: PointerValue<'ctx>,
    t_len: IntValue<'ctx>,
    ln_t: FloatValue<'ctx>,
    q_map: Option<QMap>,
}

impl<'ctx> FusedIo<'ctx> {
    fn params(k: &Kb<'_, 'ctx>, q_map: Option<QMap>) -> FusedIo<'ctx> {
        let p = params::FusedParams::numbers(false);
        FusedIo {
            q: k.param_ptr(p.q),
            k: k.param_ptr(p.k),
            norms: k.param_ptr(p.norms),
            delta: k.param_ptr(p.delta),
            arrived: k.param_ptr(p.arrived),
            t_len: k.param_int(p.t),
            ln_t: k.param_f32(p.ln_t),
            q_map,
        }
    }
}

/// The block of tile `m` of head `bh` (of `mt` tiles) writes its tile's norms (as
/// [`build_threshold_norms`]) and counts itself in at its head's `arrived`; the block that
/// arrives last, which sees every norm of the head, resets the counter and evaluates `delta` of
/// all the head's tiles (as [`build_threshold_delta`], the same maxima: bit-identical deltas).
fn norms_then_delta<'ctx>(
    k: &Kb<'_, 'ctx>,
    name: &str,
    s: &DeltaSpec,
    io: &FusedIo<'ctx>,
    (m, bh, mt): (IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>),
) {
    let tid = k.sreg("tid.x");
    let lw = lane_warp(k, tid);
    let qs = (io.q, io.k, io.q_map.as_ref());
    let n = tile_norms(k, name, qs, s.dts, (s.d, s.kv_group, s.bm), (m, bh, io.t_len), None, lw);

    // Thread 0 writes the norms, then releases them and counts the block in; the last block's
    // thread 0 acquires every other block's norms and hands them on to its block through the
    // barrier. (The counter is reset by the last block: nothing else touches it in this launch.)
    let last = k.declare_var(k.bool(false).into());
    k.if_then(k.icmpc(IntPredicate::EQ, tid, 0), |k| {
        store_norms(k, io.norms, (m, bh, mt), &n);
        k.fence_acq_rel_gpu();
        let counter = k.gep_dt(DType::I32, io.arrived, k.sext64(bh));
        let before = k.atomic_add_i32(counter, k.i32(1));
        let is_last = k.icmp(IntPredicate::EQ, before, k.addc(mt, -1));
        k.if_then(is_last, |k| {
            k.store(counter, k.i32(0));
            k.fence_acq_rel_gpu();
        });
        k.def_var(last, is_last);
    });
    let last = k.barrier_any(k.use_var(last).into_int_value());
    k.if_then(last, |k| head_delta(k, name, s, (io.norms, io.delta), (bh, mt, io.ln_t), (tid, lw)));
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
        set_given_stat(k, &mut st, s, bh);
        set_norm_stats(k, &mut st, s, (head[0], head[1], k_causal, q_tile));
        let v = s.rule.formula.emit(&s.score, &mut Llvm { k, stats: st });
        k.if_then(k.icmp(IntPredicate::SLT, j, mt), |k| {
            k.store_f(DType::F32, delta, k.add(row, k.sext64(j)), v);
        });
    });
}

/// A kernel of parameters `params` (names owned: q's load map adds its own).
fn kernel<'a, 'ctx>(
    ctx: &'ctx Context,
    module: &'a Module<'ctx>,
    name: &str,
    params: &[(String, super::builder::ParamTy)],
) -> R<Kb<'a, 'ctx>> {
    let named: Vec<_> = params.iter().map(|(n, t)| (n.as_str(), *t)).collect();
    Kb::kernel(ctx, module, name, &named)
}
