//! The CPU `threshold` kernel: for one (b, h) per task, `delta` of every query tile from the
//! rule's formula. The formula is rendered by the one walk over it (`RuleExpr::emit`) with
//! Cranelift f64 instructions; this file only computes the statistics the formula reads. They
//! are computed in f64 in the interpreter's order (`foxc_ir::prune_rule::threshold`: row norms
//! as `row_norm` sums the squares, NaN-keeping maxima from 0, the tile's minimum over rows), so
//! that delta equals the interpreter's bit for bit before the f32 store. A q read through a load
//! map is computed where it is loaded, in f32 (the interpreter keeps its f64 value: the two differ
//! in rounding).

use super::emit::{Fx, F32, F32X4, F64};
use super::load_map::{Operand, Row};
use super::region::CaptureCode;
use cranelift_codegen::ir::types::{F64X2, I8X16};
use cranelift_codegen::ir::{ConstantData, Endianness, InstBuilder, MemFlagsData, Value};
use foxc_ir::prune_rule::{RuleEmitter, Stat, NORM_LANES};
use foxc_ir::{DType, NormBound, PruneRule, ScoreBound};

/// The kernel's compile-time parameters (`kernels::Kind::Threshold`).
pub struct Params<'a> {
    pub q: Operand,
    pub k: Operand,
    /// Query rows and key rows (`t <= tk`: query row `i` sits at key position `i + tk - t`).
    pub t: u64,
    pub tk: u64,
    pub d: u64,
    /// Query heads and kv heads.
    pub h: u64,
    pub hk: u64,
    pub rule: &'a PruneRule,
    pub log_eps: f64,
    pub bound: NormBound,
    pub score: ScoreBound,
    pub scale: f64,
    pub bm: u64,
}

/// Renders the formula's operations as Cranelift f64 instructions, with the statistics
/// computed beforehand.
struct Clif<'a, 'b> {
    fx: &'a mut Fx<'b>,
    stats: [Option<Value>; Stat::ALL.len()],
}

impl RuleEmitter for Clif<'_, '_> {
    type V = Value;
    fn stat(&mut self, s: Stat) -> Value {
        // Every statistic of the formula was computed (`RuleExpr::stats`).
        self.stats[s as usize].expect("statistic computed before the formula")
    }
    fn constant(&mut self, c: f64) -> Value {
        self.fx.f64c(c)
    }
    fn add(&mut self, a: Value, b: Value) -> Value {
        self.fx.b.ins().fadd(a, b)
    }
    fn sub(&mut self, a: Value, b: Value) -> Value {
        self.fx.b.ins().fsub(a, b)
    }
    fn mul(&mut self, a: Value, b: Value) -> Value {
        self.fx.b.ins().fmul(a, b)
    }
}

/// One of q, k as the kernel reads it: the operand, its buffer, the captures its map reads,
/// and the task's `(b, h)`, computed when it has a map (q's; k is read as it is).
#[derive(Clone, Copy)]
struct Src<'a> {
    op: &'a Operand,
    p: Value,
    caps: &'a [(Value, CaptureCode)],
    bh: Option<(Value, Value)>,
}

impl Src<'_> {
    /// Row `i` of the head whose row 0 is element `head`.
    fn row(&self, fx: &mut Fx, head: Value, i: Value, d: u64) -> Row {
        let off = fx.b.ins().imul_imm_s(i, d as i64);
        let base = fx.b.ins().iadd(head, off);
        self.row_at(i, base)
    }

    /// Row `i`, whose first element is `base`.
    fn row_at(&self, i: Value, base: Value) -> Row {
        self.op.row(base, self.bh.map(|(b, h)| (b, h, i)))
    }
}

/// `|x|` of row `row` of `d` elements, in f64, bit for bit
/// [`foxc_ir::prune_rule::row_norm`]: partial sums of squares `s[j % 4]` in two f64x2
/// accumulators (`(s0, s1)`, `(s2, s3)`; each group of four elements loaded as one f32x4 and
/// promoted exactly), the tail's elements added to their own lane, then
/// `sqrt((s0 + s1) + (s2 + s3))`.
fn norm(fx: &mut Fx, src: &Src, row: &Row, d: u64) -> Value {
    let lanes = NORM_LANES as u64;
    let zero = fx.f64c(0.0);
    let zero2 = fx.b.ins().splat(F64X2, zero);
    let (mut s01, mut s23) = (zero2, zero2);
    // Bytes 8..16 of an f32x4 (lanes 2, 3) moved to bytes 0..8, for the low-lane promote.
    let high_half: Vec<u8> = (8..16).chain(8..16).collect();
    let high_half = fx.b.func.dfg.immediates.push(ConstantData::from(high_half));
    let bytes = MemFlagsData::new().with_endianness(Endianness::Little);
    for g in 0..d / lanes {
        let x = src.op.lanes(fx, src.p, src.caps, row, g * lanes, d);
        let lo = fx.b.ins().fvpromote_low(x);
        let xb = fx.b.ins().bitcast(I8X16, bytes, x);
        let hb = fx.b.ins().shuffle(xb, xb, high_half);
        let hx = fx.b.ins().bitcast(F32X4, bytes, hb);
        let hi = fx.b.ins().fvpromote_low(hx);
        let lo2 = fx.b.ins().fmul(lo, lo);
        let hi2 = fx.b.ins().fmul(hi, hi);
        s01 = fx.b.ins().fadd(s01, lo2);
        s23 = fx.b.ins().fadd(s23, hi2);
    }
    let mut s: Vec<Value> = vec![
        fx.b.ins().extractlane(s01, 0),
        fx.b.ins().extractlane(s01, 1),
        fx.b.ins().extractlane(s23, 0),
        fx.b.ins().extractlane(s23, 1),
    ];
    for j in d / lanes * lanes..d {
        let v = element_f64(fx, src, row, j);
        let sq = fx.b.ins().fmul(v, v);
        let lane = (j % lanes) as usize;
        s[lane] = fx.b.ins().fadd(s[lane], sq);
    }
    let a = fx.b.ins().fadd(s[0], s[1]);
    let b = fx.b.ins().fadd(s[2], s[3]);
    let ss = fx.b.ins().fadd(a, b);
    fx.b.ins().sqrt(ss)
}

/// Element `j` of `row`, widened to f64.
fn element_f64(fx: &mut Fx, src: &Src, row: &Row, j: u64) -> Value {
    let x = match src.op.map {
        None => {
            let idx = fx.b.ins().iadd_imm_s(row.base, j as i64);
            fx.load_f32(src.op.dtype, src.p, idx)
        }
        Some(_) => {
            let jv = fx.ic(j as i64);
            src.op.element(fx, src.p, src.caps, row, jv)
        }
    };
    fx.b.ins().fpromote(F64, x)
}

/// Fold `max(acc, |x_j|)` over rows `lo..hi` of the head at element `head` into variable `acc`
/// (Cranelift's `fmax` keeps a NaN, as the interpreter's `nan_max`).
fn fold_max_norm(
    fx: &mut Fx,
    src: &Src,
    head: Value,
    (lo, hi): (Value, Value),
    d: u64,
    acc: cranelift_frontend::Variable,
) {
    fx.for_range(lo, hi, 1, |fx, j| {
        let row = src.row(fx, head, j, d);
        let n = norm(fx, src, &row, d);
        let m = fx.b.use_var(acc);
        let m = fx.b.ins().fmax(m, n);
        fx.b.def_var(acc, m);
    });
}

/// `max |x_j|` over rows `lo..hi` (from 0).
fn max_norm(fx: &mut Fx, src: &Src, head: Value, range: (Value, Value), d: u64) -> Value {
    let acc = fx.b.declare_var(F64);
    let z = fx.f64c(0.0);
    fx.b.def_var(acc, z);
    fold_max_norm(fx, src, head, range, d, acc);
    fx.b.use_var(acc)
}

/// The kernel body: tasks `begin..end` are flat heads; q, k, out are the buffers, `caps` the
/// tensors q's load map reads.
pub fn emit(
    fx: &mut Fx,
    p: &Params,
    (q, k, out): (Value, Value, Value),
    caps: &[(Value, CaptureCode)],
    (begin, end): (Value, Value),
) {
    let (t, tk, d, bm) = (p.t, p.tk, p.d, p.bm);
    let off = tk - t;
    let formula = &p.rule.formula;
    // The statistics the walk renders (none inside a static score bound).
    let reads = formula.stats_under(&p.score);
    let uses = |s: Stat| reads.contains(&s);
    let per_row = reads.iter().any(|s| s.per_row());
    let mt = t.div_ceil(bm);
    fx.for_range(begin, end, 1, |fx, bh| {
        let bhbase = fx.b.ins().imul_imm_s(bh, (t * d) as i64);
        let obase = fx.b.ins().imul_imm_s(bh, mt as i64);
        // The kv head of (b, h): b * hk + h / (H / hk) (itself without grouped-query heads).
        let kbase = if p.hk == p.h && off == 0 {
            bhbase
        } else if p.hk == p.h {
            fx.b.ins().imul_imm_s(bh, (tk * d) as i64)
        } else {
            let bi = fx.b.ins().udiv_imm_s(bh, p.h as i64);
            let hi = fx.b.ins().urem_imm_s(bh, p.h as i64);
            let kvh = fx.b.ins().udiv_imm_s(hi, (p.h / p.hk.max(1)).max(1) as i64);
            let kvb = fx.b.ins().imul_imm_s(bi, p.hk as i64);
            let kvh = fx.b.ins().iadd(kvb, kvh);
            fx.b.ins().imul_imm_s(kvh, (tk * d) as i64)
        };
        // q's map reads the row's b and h.
        let qbh =
            p.q.map
                .is_some()
                .then(|| (fx.b.ins().udiv_imm_s(bh, p.h as i64), fx.b.ins().urem_imm_s(bh, p.h as i64)));
        let qs = Src { op: &p.q, p: q, caps, bh: qbh };
        let ks = Src { op: &p.k, p: k, caps, bh: None };
        let mut stats: [Option<Value>; Stat::ALL.len()] = [None; Stat::ALL.len()];
        // Global and per-head statistics.
        if uses(Stat::LnEps) {
            stats[Stat::LnEps as usize] = Some(fx.f64c(p.log_eps));
        }
        if uses(Stat::LnT) {
            // A row sees at most Tk keys.
            stats[Stat::LnT as usize] = Some(fx.f64c((tk as f64).ln()));
        }
        if uses(Stat::Scale) {
            stats[Stat::Scale as usize] = Some(fx.f64c(p.scale.abs()));
        }
        if uses(Stat::Given) {
            stats[Stat::Given as usize] = Some(given(fx, &p.rule.given, bh, p.h));
        }
        let whole = (fx.ic(0), fx.ic(t as i64));
        let keys = if off == 0 { whole } else { (whole.0, fx.ic(tk as i64)) };
        for (s, src, head, whole) in [(Stat::QMax, &qs, bhbase, whole), (Stat::KMax, &ks, kbase, keys)] {
            if uses(s) {
                stats[s as usize] = Some(match p.bound {
                    NormBound::Static { q_max, k_max } => {
                        fx.f64c(if s == Stat::QMax { q_max } else { k_max })
                    }
                    NormBound::Data => max_norm(fx, src, head, whole, d),
                });
            }
        }
        // k_causal: a running maximum over the keys of tiles 0..=m.
        let k_causal = fx.b.declare_var(F64);
        let z = fx.f64c(0.0);
        fx.b.def_var(k_causal, z);
        let causal_keys = matches!(p.bound, NormBound::Data) && uses(Stat::KCausal);
        if off > 0 && causal_keys {
            // The keys before the first query's position: every tile's rows see them.
            let before = (fx.ic(0), fx.ic(off as i64));
            fold_max_norm(fx, &ks, kbase, before, d, k_causal);
        }
        fx.for_n(0, mt as i64, 1, |fx, m| {
            let mut stats = stats;
            let i0 = fx.b.ins().imul_imm_s(m, bm as i64);
            let i1 = fx.b.ins().iadd_imm_s(i0, bm as i64);
            let tv = fx.ic(t as i64);
            let i1 = fx.imin(i1, tv);
            match p.bound {
                NormBound::Static { q_max, k_max } => {
                    stats[Stat::QTile as usize] = Some(fx.f64c(q_max));
                    stats[Stat::KCausal as usize] = Some(fx.f64c(k_max));
                }
                NormBound::Data => {
                    if uses(Stat::QTile) {
                        stats[Stat::QTile as usize] = Some(max_norm(fx, &qs, bhbase, (i0, i1), d));
                    }
                    if uses(Stat::KCausal) {
                        let keys = if off == 0 {
                            (i0, i1)
                        } else {
                            (fx.b.ins().iadd_imm_s(i0, off as i64), fx.b.ins().iadd_imm_s(i1, off as i64))
                        };
                        fold_max_norm(fx, &ks, kbase, keys, d, k_causal);
                        stats[Stat::KCausal as usize] = Some(fx.b.use_var(k_causal));
                    }
                }
            }
            let delta = if per_row {
                let dmin = fx.b.declare_var(F64);
                let inf = fx.f64c(f64::INFINITY);
                fx.b.def_var(dmin, inf);
                fx.for_range(i0, i1, 1, |fx, i| {
                    let mut stats = stats;
                    row_stats(
                        fx,
                        p,
                        (&qs, &ks),
                        (bhbase, kbase),
                        i,
                        (uses(Stat::QRow), uses(Stat::Sii)),
                        &mut stats,
                    );
                    let v = formula.emit(&p.score, &mut Clif { fx, stats });
                    let cur = fx.b.use_var(dmin);
                    let nv = fx.b.ins().fmin(cur, v);
                    fx.b.def_var(dmin, nv);
                });
                fx.b.use_var(dmin)
            } else {
                formula.emit(&p.score, &mut Clif { fx, stats })
            };
            let delta = fx.b.ins().fdemote(F32, delta);
            let idx = fx.b.ins().iadd(obase, m);
            fx.store_f32(DType::F32, out, idx, delta);
        });
    });
}

/// The given threshold of flat head `bh` (`b * H + h`): entry `h` of the rule's per-head table
/// (`plan.rs` checked that it has `H` entries), as a chain of selects over the constants.
fn given(fx: &mut Fx, table: &[f64], bh: Value, h: u64) -> Value {
    use cranelift_codegen::ir::condcodes::IntCC;
    let head = fx.b.ins().urem_imm_s(bh, h.max(1) as i64);
    let mut v = fx.f64c(table.first().copied().unwrap_or(f64::NAN));
    for (i, d) in table.iter().enumerate().skip(1) {
        let is = fx.b.ins().icmp_imm_s(IntCC::Equal, head, i as i64);
        let c = fx.f64c(*d);
        v = fx.b.ins().select(is, c, v);
    }
    v
}

/// `|q_i|` and `s_ii = scale q_i . k_i` of row `i`, those the formula reads.
fn row_stats(
    fx: &mut Fx,
    p: &Params,
    (qs, ks): (&Src, &Src),
    (bhbase, kbase): (Value, Value),
    i: Value,
    (want_q, want_s): (bool, bool),
    stats: &mut [Option<Value>; Stat::ALL.len()],
) {
    let off = fx.b.ins().imul_imm_s(i, p.d as i64);
    let base = fx.b.ins().iadd(bhbase, off);
    let row = qs.row_at(i, base);
    if want_q {
        stats[Stat::QRow as usize] = Some(norm(fx, qs, &row, p.d));
    }
    if !want_s {
        return;
    }
    // The row's diagonal key sits at i + Tk - Tq.
    let kb = fx.b.ins().iadd(kbase, off);
    let kb = if p.tk == p.t { kb } else { fx.b.ins().iadd_imm_s(kb, ((p.tk - p.t) * p.d) as i64) };
    let krow = ks.row_at(i, kb);
    let qk = fx.b.declare_var(F64);
    let z = fx.f64c(0.0);
    fx.b.def_var(qk, z);
    fx.for_n(0, p.d as i64, 1, |fx, j| {
        let a = qs.op.element(fx, qs.p, qs.caps, &row, j);
        let a = fx.b.ins().fpromote(F64, a);
        let b = ks.op.element(fx, ks.p, ks.caps, &krow, j);
        let b = fx.b.ins().fpromote(F64, b);
        let y = fx.b.use_var(qk);
        let ab = fx.b.ins().fmul(a, b);
        let y = fx.b.ins().fadd(y, ab);
        fx.b.def_var(qk, y);
    });
    let sc = fx.f64c(p.scale);
    let qk = fx.b.use_var(qk);
    stats[Stat::Sii as usize] = Some(fx.b.ins().fmul(sc, qk));
}
